"""Crash isolation: a worker process that dies becomes a finding, and the campaign goes on.

The planted mutant `worker_crash` kills its process with SIGSEGV whenever a row has a full
window (P = 16).  The Worker must turn that into a `crash` finding (the case saved to disk
before the launch), start a new worker, and keep answering; a campaign over that mutant
must find the crash, shrink it to a case with one full-window row, and store it.
"""

from __future__ import annotations

import json

import pytest

from gdn_fuzz.engine import corpus
from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine.isolation import Worker


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
    from gdn_fuzz.engine.campaign import Campaign
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


def test_an_isolated_campaign_records_the_workers_own_seconds(tmp_path):
    """Each record line of an isolated campaign carries worker_s, the worker's own seconds for the check, within
    check_s (the round trip as the campaign process sees it); the worker answers with its resident memory, so the
    campaign process reads no /proc file per check; an in-process campaign has no worker_s (issue 32)."""
    import io

    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    for isolate in (True, False):
        rec = io.StringIO()
        c = Campaign(target=get_target("reference"), device="cpu", properties=[get_property("launch")],
                     arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=5, isolate=isolate,
                     corpus_dir=None, record_path=rec)
        c.run(examples=6)
        lines = [json.loads(x) for x in rec.getvalue().splitlines()]
        assert len(lines) == 6
        if isolate:
            assert all(0 < r["worker_s"] <= r["check_s"] for r in lines), lines
            assert c._worker.last_rss_mb > 0 and round(c._worker.last_worker_s, 5) == lines[-1]["worker_s"]
        else:
            assert not any("worker_s" in r for r in lines)


# The campaign process of test_ctrl_c_*: the real `gdn-fuzz run` (gdn_fuzz.cli.main) with one
# change, Campaign.run's callbacks wrapped so that the process sends itself Ctrl-C (SIGINT to its
# whole process group, the worker included, as a terminal does) at a known point.  (A SIGINT that
# landed inside Hypothesis' engine while it set a round up used to turn into Hypothesis' own
# `assert state._runner is not None`, 1 run in 4; Campaign.run now only notes a first SIGINT and
# stops at its next safe point.  when=outside sends it from the test at whatever moment.)
#   stored: at the first example after a finding was shrunk and stored (inside the next round's
#           Hypothesis test function, before that example's check: the worker is idle)
#   first:  at the first failing example, before shrinking (inside the Hypothesis test function)
_CTRL_C_CLI = """
import os, signal, sys, time

from gdn_fuzz import cli
from gdn_fuzz.engine.campaign import Campaign

WHEN = os.environ["GDN_FUZZ_TEST_CTRL_C"]
SENT = []
_run = Campaign.run


def ctrl_c():
    if not SENT:
        SENT.append(1)
        os.killpg(os.getpgrp(), signal.SIGINT)  # the campaign notes it and stops at its next safe point


def run(self, *, on_example=lambda: None, on_finding=lambda f: None, on_first=lambda *a: None, **kw):
    stored = []

    def example():
        if WHEN == "stored" and stored:
            ctrl_c()
        on_example()

    def finding(f):
        on_finding(f)
        stored.append(f.entry_path)

    def first(*a):
        on_first(*a)
        if WHEN == "first":
            ctrl_c()

    return _run(self, on_example=example, on_finding=finding, on_first=first, **kw)


if __name__ == "__main__":  # the forkserver imports this file as __mp_main__: it must not run the CLI
    Campaign.run = run
    sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("when", ["stored", "first", "outside"])
def test_ctrl_c_stops_cleanly_and_keeps_findings(tmp_path, when):
    """Ctrl-C (SIGINT to the process group) ends `gdn-fuzz run` cleanly with exit code 130 and the
    summary: a finding stored before it stays in the corpus (when=stored), a failure seen but not
    yet shrunk is stored with its case so far (when=first), and the worker's share of the signal is
    not mistaken for a crash.  The signal is sent by the campaign process itself at that point
    (_CTRL_C_CLI), so the outcome does not depend on where a signal from outside happens to land."""
    import os
    import signal
    import subprocess
    import sys

    corpus_dir = tmp_path / "corpus"
    wrapper = tmp_path / "ctrl_c_cli.py"
    wrapper.write_text(_CTRL_C_CLI)
    cmd = [sys.executable, str(wrapper), "run", "--target", "mutant:fold_skipped", "--arms", "bf16",
           "--T", "4", "--seconds", "600", "--corpus", str(corpus_dir), "--property", "launch"]
    env = dict(os.environ, GDN_FUZZ_TEST_CTRL_C=when)
    # xdist workers run with SIGINT ignored and children inherit that (Python then installs no
    # KeyboardInterrupt handler): give the campaign the disposition an interactive shell gives it
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        if when == "outside":  # the original probe: Ctrl-C from the terminal once an entry is stored
            import time

            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not list(corpus_dir.glob("launch-*.json")):
                time.sleep(0.2)
            assert list(corpus_dir.glob("launch-*.json")), "no finding before the deadline"
            os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:  # never leave the campaign running behind a failed test
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 130, out  # 130: interrupted (findings were made and kept)
    sig = "oracle.fold [M7] out of tolerance (flush rows)"
    entries = [corpus.read(f) for f in corpus_dir.glob("*.json")]
    assert [e.signature for e in entries] == [sig], out
    assert [f.name for f in corpus_dir.glob("*.json")] == [f.name for f in corpus_dir.glob("launch-*.json")], out
    assert "gdn-fuzz summary" in out and "interrupted" in out, out
    assert "crash" not in out and "not confirmed" not in out, out
    if when in ("stored", "outside"):
        assert "shrunk in" in out, out  # the entry was stored shrunk, before the interrupt
    else:
        assert "shrinking stopped after" in out, out  # stored by the interrupt, with its case so far


COUNTING_TARGET = '''
"""The reference target with a JIT-cache stand-in: one _CACHE entry per T, per arm's module instance."""
import importlib.util

_spec = importlib.util.spec_from_file_location("_counting_ref_" + str(id(object())), {ref!r})
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
globals().update({{k: v for k, v in vars(_ref).items() if not k.startswith("__")}})
_CACHE = {{}}


def gated_delta_rule_mtp_ucache_flush(**kw):
    _CACHE[kw["q"].shape[1]] = True
    return _ref.gated_delta_rule_mtp_ucache_flush(**kw)
'''


def test_worker_counts_compiles_of_every_arm_and_across_restarts(tmp_path):
    """Worker.compiles: every arm's module the worker loaded (it once reported the checked case's arm
    only, so a warm-up over five arms showed 8 compiles where the H200's kernel store held 40), and
    the compiles of a worker that was replaced are kept."""
    from gdn_fuzz.targets import REFERENCE_PATH

    f = tmp_path / "counting.py"
    f.write_text(COUNTING_TARGET.format(ref=str(REFERENCE_PATH)))
    w = Worker(str(f), "cpu", inflight_dir=tmp_path / "inflight", name="t")
    try:
        for arm in ("bf16", "fp16"):
            for T in (4, 8):
                case = Case(arm=arm, T=T, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
                assert w.check("launch", case) == []
        assert w.compiles == 4
        w.close()  # the next check starts a fresh worker, whose module instances are new
        assert w.check("launch", Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)) == []
        assert w.compiles == 5
    finally:
        w.close()


def test_ctrl_c_outside_the_campaign_loop_is_an_interrupted_run(tmp_path, monkeypatch):
    """A Ctrl-C that lands before Campaign.run installs its handler (start-up, the warm-up) ends
    `gdn-fuzz run` as an interrupted campaign: exit 130, the JSON record written with interrupted=true,
    the worker closed.  Before: a traceback, no record, and a `--processes` parent listed that child as
    failed (seen in CI under load: test_multigpu.py::test_a_stopped_parent_stops_and_reaps_its_children)."""
    from gdn_fuzz import cli
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property

    closed = []
    real_close = Campaign.close

    def interrupted_warm_up(self):  # one isolated check (the worker starts), then Ctrl-C
        self._check(get_property("launch"), Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 0, 0),), seed=1))
        raise KeyboardInterrupt

    def close(self):
        closed.append(self._worker is not None)
        real_close(self)

    monkeypatch.setattr(Campaign, "warm_up", interrupted_warm_up)
    monkeypatch.setattr(Campaign, "close", close)
    jp = tmp_path / "run.json"
    rc = cli.main(["run", "--target", "reference", "--device", "cpu", "--arms", "bf16", "--T", "4", "--warm-up",
                   "--seconds", "30", "--no-corpus", "--json", str(jp)])
    rec = json.loads(jp.read_text())
    assert rc == 130 and rec["interrupted"] and rec["examples"] == 0
    assert closed == [True]  # the isolated worker the warm-up started was closed


def test_a_worker_prepares_only_the_oracles_its_checks_can_draw():
    """Issue 32 (a changed kernel found sooner): an isolated worker compiles the flush oracle (on a thread, from
    its ready on) for the campaign's own arms and T (it compiled every arm and T), and nothing for a
    materializer, whose oracle is torch; nothing off CUDA."""
    from gdn_fuzz.engine.isolation import oracle_to_prepare

    class T:  # a target as the worker sees it
        def __init__(self, kernel):
            self.kernel = kernel

        def unavailable_reason(self, device):
            return None

    assert oracle_to_prepare(T("flush"), "cuda", ("bf16",), (4,)) == (("bf16",), (4,))
    assert oracle_to_prepare(T("materialize"), "cuda", ("bf16",), (4,)) is None
    assert oracle_to_prepare(T("flush"), "cpu", ("bf16",), (4,)) is None
    w = Worker("reference", "cpu", oracle_arms=("fp16",), oracle_Ts=(8,))
    assert (w.oracle_arms, w.oracle_Ts) == (("fp16",), (8,))


def test_worker_reports_how_its_checks_ran_across_restarts(tmp_path):
    """Each answer of an isolated worker carries gdn_fuzz.graphs' counts (on a CPU every check is eager), and
    Worker.graph_counts adds those of a worker that died to its replacement's: what a campaign's JSON record
    reports as `graphs` (on CUDA: how many checks were CUDA-graph replays)."""
    w = Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path, name="t")
    try:
        ok = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
        boom = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1)
        assert w.check("launch", ok) == [] and w.check("launch", ok) == []
        assert (w.graph_counts["eager"], w.graph_counts["replays"]) == (2, 0)
        w.check("launch", boom)  # the worker dies: its counts stay
        assert w.check("launch", ok) == [] and w.restarts == 1
        assert (w.graph_counts["eager"], w.graph_counts["replays"], w.graph_counts["captures"]) == (3, 0, 0)
    finally:
        w.close()


def test_worker_records_where_its_start_went(tmp_path):
    """Worker.startups: one entry per worker process, with the seconds to 'ready' and the part of them spent
    loading the target, then the first check's seconds and compiles (what a campaign's
    JSON record reports as worker_startups: where the seconds before a first finding go).  A restart adds an
    entry of its own."""
    w = Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path, name="t")
    try:
        ok = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
        boom = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1)
        assert w.check("launch", ok) == [] and w.check("launch", ok) == []
        (first,) = w.startups
        # on a CPU no oracle compiles (oracle_s and oracle_wait_s come with the answers of a worker that compiles one)
        assert set(first) == {"ready_s", "target_s", "first_check_s", "first_check_compiles"}
        assert 0 <= first["target_s"] <= first["ready_s"]
        assert first["first_check_s"] > 0 and first["first_check_compiles"] == 0  # a CPU target compiles nothing
        w.check("launch", boom)
        assert w.check("launch", ok) == [] and len(w.startups) == 2 and "first_check_s" in w.startups[1]
    finally:
        w.close()


def test_checks_sent_ahead_are_answered_in_order_and_a_crash_is_the_oldest_cases(tmp_path):
    """Worker.submit/collect (deferred verdicts, issue 32): answers come back oldest first, each with its own case; a
    crash is the case the worker was running (the oldest unanswered, saved in flight), and the case sent after it,
    which never ran, is sent again to the fresh worker and answered.  Worker.check() refuses to jump the queue."""
    w = Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path, name="q")
    try:
        ok1 = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
        ok2 = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(1, 5, 2),), seed=2)
        boom = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1)
        for i, c in enumerate((ok1, boom, ok2)):
            w.submit("launch", c, tag=i)
        assert w.pending == 3
        with pytest.raises(RuntimeError, match="collect"):
            w.check("launch", ok1)
        assert w.collect() == ("launch", ok1, [], 0)
        prop, case, (f,), tag = w.collect()
        assert case == boom and tag == 1 and f.prop == "crash" and "SIGSEGV" in f.message
        assert Case.from_dict(json.loads(w.inflight_path.read_text())["case"]) == boom
        assert w.collect() == ("launch", ok2, [], 2) and w.restarts == 1 and w.pending == 0
        with pytest.raises(RuntimeError, match="submit"):
            w.collect()
        assert w.check("launch", ok1) == []  # the plain check again, nothing queued
    finally:
        w.close()


def test_a_check_that_could_not_be_sent_is_not_sent_later(tmp_path, monkeypatch):
    """Worker.submit that raises (the worker cannot start) leaves nothing queued: the next check gets its own answer,
    not the answer of the case that was never submitted.  Before the fix the case stayed queued, unsent, and went to
    the worker behind the next check."""
    from gdn_fuzz.engine.isolation import SetupError

    w = Worker("reference", "cpu", inflight_dir=tmp_path, name="ns")
    ok = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
    other = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(1, 2, 4),), seed=5)
    try:
        real_start = Worker.start

        def no_start(self):
            raise SetupError("the worker cannot start (test)")

        monkeypatch.setattr(Worker, "start", no_start)
        with pytest.raises(SetupError):
            w.submit("launch", other)
        assert w.pending == 0
        monkeypatch.setattr(Worker, "start", real_start)
        w.submit("launch", ok)
        assert w.collect() == ("launch", ok, [], None) and w.pending == 0
    finally:
        w.close()
