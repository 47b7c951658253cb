"""Crash isolation: a worker process that dies becomes a finding, and the campaign goes on.

The planted mutant `worker_crash` kills its process with SIGSEGV whenever a row has a full
window (P = 16).  The Worker must turn that into a `crash` finding (the case saved to disk
before the launch), start a new worker, and keep answering; a campaign over that mutant
must find the crash, shrink it to a case with one full-window row, and store it.
"""

from __future__ import annotations

import json

from gdn_fuzz import corpus
from gdn_fuzz.case import Case, Row
from gdn_fuzz.isolation import Worker


def test_worker_survives_a_hard_crash(tmp_path):
    """R*: crash -> finding with the saved case; the next case runs in a fresh worker."""
    w = Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path, name="t")
    try:
        ok = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
        boom = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1)
        assert w.check("launch", ok) == []
        (f,) = w.check("launch", boom)
        assert f.prop == "crash" and "SIGSEGV" in f.message
        saved = json.loads(w.inflight_path.read_text())
        assert Case.from_dict(saved["case"]) == boom
        assert w.check("launch", ok) == [] and w.restarts == 1
    finally:
        w.close()


def test_campaign_with_isolation_records_the_crash(tmp_path):
    """A campaign over the crashing mutant finds, shrinks and stores the crash, then stops on budget."""
    from gdn_fuzz.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    c = Campaign(target=get_target("mutant:worker_crash"), device="cpu", properties=[get_property("launch")],
                 arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=3, round_examples=40,
                 isolate=True, corpus_dir=tmp_path, stop_on_finding=True)
    c.run(examples=400)  # the example budget counts the shrinking launches too
    (f,) = c.findings.values()
    assert [x.prop for x in f.findings] == ["crash"]
    full = [r for r in f.case.rows if not r.pad and r.hist_len == 16]
    assert len(full) == 1 and len([r for r in f.case.rows if not r.pad]) == 1
    assert corpus.read(f.entry_path).signature == "crash [R*] crash: killed by signal SIGSEGV"
    assert not c.unconfirmed  # the crash came back in a fresh worker before it was shrunk and filed


def test_ctrl_c_stops_cleanly_and_keeps_findings(tmp_path):
    """Ctrl-C (SIGINT to the process group) ends `gdn-fuzz run` cleanly: the finding found before it
    stays in the corpus, and the worker's share of the signal is not mistaken for a crash."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "gdn_fuzz.cli", "run", "--target", "mutant:fold_skipped", "--arms", "bf16",
           "--T", "4", "--seconds", "600", "--corpus", str(tmp_path), "--property", "launch"]
    # xdist workers run with SIGINT ignored and children inherit that (Python then installs no
    # KeyboardInterrupt handler): give the campaign the disposition an interactive shell gives it
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not list(tmp_path.glob("launch-*.json")):
            time.sleep(0.5)
        assert list(tmp_path.glob("launch-*.json")), "no finding before the deadline"
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:  # never leave the campaign running behind a failed test
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, out  # 130: interrupted (findings were made and kept)
    entries = [corpus.read(f) for f in tmp_path.glob("*.json")]
    assert [e.signature for e in entries] == ["oracle.fold [M7] out of tolerance (flush rows)"], out
    assert "gdn-fuzz summary" in out
