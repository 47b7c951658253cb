"""--mps: a private MPS daemon per GPU for a fleet's workers, and crash isolation that stays true under it
(gdn_fuzz.engine.mps, gdn_fuzz.engine.isolation.Worker.check).

Under MPS a fatal fault of one client reaches every client.  On this CPU machine that is played by a target that
kills its process whenever the worker is an MPS client (tests/targets/segv_under_mps.py: the case is innocent), and
by the catalogued `worker_crash` mutant (a crash of the case's own).  The daemon's life is played by a stand-in
nvidia-cuda-mps-control written here, which does what the real one's interface promises: `-d` leaves a daemon
running with the caller's environment, `quit` on stdin ends it.  The real daemon and a real GPU fault ran
in `tools/h200_issue30.sh g32fault` (docs/h200-results.md, run 87)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine import mps
from gdn_fuzz.engine.isolation import Worker
from gdn_fuzz.engine.multigpu import start_daemons

SEGV_UNDER_MPS = str(Path(__file__).parent / "targets" / "segv_under_mps.py")
OK = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0),), seed=1)
FULL = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1)  # worker_crash's own crash


def fake_control(tmp_path: Path, *, ignore_quit: bool = False, fail: str | None = None, where: str = "bin") -> str:
    """A stand-in nvidia-cuda-mps-control (in tmp_path / where): -d starts a detached process named like an MPS one,
    with the caller's environment (its pipe folder in it), and makes the pipe's `control`; `quit` ends it (unless
    ignore_quit); fail: -d says this and exits 1."""
    path = tmp_path / where / "nvidia-cuda-mps-control"
    path.parent.mkdir(exist_ok=True)
    quit_cmd = "" if ignore_quit else 'kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/fake.pid")"; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"'
    start = (f'echo "{fail}" >&2; exit 1' if fail else
             '(exec -a nvidia-cuda-mps-server sleep 600) > /dev/null 2>&1 < /dev/null &\n'
             # returns once its process runs under the daemon's name, as the real -d returns with its daemon up
             # (before the exec the child is this script's bash: a pids() right after start missed it, under load)
             '  for i in $(seq 100); do tr "\\0" " " < /proc/$!/cmdline | grep -q mps-server && break; sleep 0.05; done\n'
             '  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/fake.pid"; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0')
    path.write_text(f"""#!/bin/bash
if [ "$1" = -d ]; then
  {start}
fi
read cmd
if [ "$cmd" = quit ]; then {quit_cmd or ':'}; fi
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """Has process `pid` ended (no /proc entry, or a zombie not yet reaped) within wait_s?"""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def seen_pipe(target, case, device) -> dict:
    """A measurement (Worker.measure): the MPS pipe folder the worker process would connect to."""
    return dict(pipe=os.environ.get(mps.PIPE_ENV))


@pytest.fixture(autouse=True)
def _no_mps_of_the_user(monkeypatch, tmp_path):
    """Neither this machine's MPS settings nor its own daemon (a GPU runner may have one at /tmp/nvidia-mps)."""
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE", str(tmp_path / "default-pipe"))


def test_parse_mps_names_the_option_and_the_fix():
    assert [mps.parse_mps(x) for x in ("auto", "ON", " off ", None)] == ["auto", "on", "off", "auto"]
    with pytest.raises(ValueError, match=r"--mps='yes'.*auto, on or off"):
        mps.parse_mps("yes")


@pytest.mark.parametrize("argv, words", [
    (["--mps", "yes"], "--mps='yes' (or $GDN_FUZZ_MPS): give auto, on or off"),
    (["--mps", "on", "--ray", "auto"], "--mps on with --ray auto"),
    (["--mps", "on", "--processes", "2"], "--mps on: the device is cpu, not a GPU"),
    (["--mps", "on", "--processes", "1"], "--mps on: the device is cpu, not a GPU; run --processes N (N > 1)"),
])
def test_bad_mps_is_a_usage_error(argv, words, capsys):
    from gdn_fuzz.cli import main

    assert main(["run", "--device", "cpu", "--target", "reference", "--examples", "1", "--no-corpus", *argv]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert words in out, out


def test_why_not(tmp_path, monkeypatch):
    control = fake_control(tmp_path)
    assert mps.why_not("cuda", 8, env={}, control=control) is None
    assert "not a GPU" in mps.why_not("cpu", 8, env={}, control=control)
    assert "one campaign process per GPU" in mps.why_not("cuda:0", 1, env={}, control=control)
    assert "is set (/x)" in mps.why_not("cuda", 8, env={mps.PIPE_ENV: "/x"}, control=control)
    Path(mps.DEFAULT_PIPE).mkdir()
    (Path(mps.DEFAULT_PIPE) / "control").touch()
    assert f"already listens at {mps.DEFAULT_PIPE}" in mps.why_not("cuda", 8, env={}, control=control)
    (Path(mps.DEFAULT_PIPE) / "control").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert "not on PATH" in mps.why_not("cuda", 8, env={})


def test_a_daemon_is_started_and_ended(tmp_path):
    d = mps.Daemon(control=fake_control(tmp_path)).start()
    root = d.root
    try:
        (pid,) = d.pids()
        assert (Path(d.pipe) / "control").exists() and Path(d.pipe).parent == root
    finally:
        d.stop()
    assert d.stopped_by == "quit" and not root.exists() and gone(pid)


def test_a_daemon_that_ignores_quit_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(mps, "QUIT_TIMEOUT_S", 1.0)
    d = mps.Daemon(control=fake_control(tmp_path, ignore_quit=True)).start()
    (pid,) = d.pids()
    root = d.root
    d.stop()
    assert d.stopped_by == "killed" and d.root is None and not root.exists() and gone(pid)


def test_a_daemon_that_cannot_start_names_why_and_leaves_nothing(tmp_path, monkeypatch):
    d = mps.Daemon(control=fake_control(tmp_path, fail="An instance of this daemon is already running"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # this test's alone (xdist runs others beside it)
    (tmp_path / "tmp").mkdir()
    with pytest.raises(mps.MpsError, match=r"exited with status 1 \(An instance of this daemon is already running\); "
                                           r"run with --mps off"):
        d.start()
    assert d.root is None and list((tmp_path / "tmp").iterdir()) == []


def test_start_daemons_decides_per_mode(tmp_path):
    control = fake_control(tmp_path)
    assert start_daemons("off", "cuda", 8, None, control=control) == ({}, "off (--mps off)")
    assert start_daemons("auto", "cpu", 8, None, control=control) == ({}, "not used: the device is cpu, not a GPU")
    with pytest.raises(mps.MpsError, match="--mps on: the device is cpu, not a GPU"):
        start_daemons("on", "cpu", 8, None, control=control)
    daemons, said = start_daemons("auto", "cuda", 8, ["0", "1"], control=control)
    try:
        assert said.startswith("on: a private daemon per GPU (2)") and set(daemons) == {"0", "1"}
        assert daemons["0"].pipe != daemons["1"].pipe and all(len(d.pids()) == 1 for d in daemons.values())
    finally:
        for d in daemons.values():
            d.stop()
    bad = fake_control(tmp_path, fail="no GPU", where="bad")
    assert start_daemons("auto", "cuda", 8, None, control=bad)[1].startswith("not used: ")
    with pytest.raises(mps.MpsError, match="--mps on: .*no GPU"):
        start_daemons("on", "cuda", 8, None, control=bad)


def test_the_worker_is_a_client_of_its_daemon_and_its_confirmations_are_not(tmp_path):
    pipe = str(tmp_path / "pipe")
    w = Worker("reference", "cpu", inflight_dir=tmp_path, name="t", mps_pipe=pipe, spare=True)
    try:
        assert w.measure(seen_pipe, OK).metrics == dict(pipe=pipe)
        spare = w._spare
        assert spare is not None and spare.mps_pipe is None
        assert spare.measure(seen_pipe, OK).metrics == dict(pipe=None)
        assert w.mps_left is None and w.mps_rechecks == []
    finally:
        w.close()


@pytest.mark.parametrize("spare", [False, True])
def test_a_fault_seen_under_mps_is_checked_again_in_its_own_context(tmp_path, spare):
    """The delivered fault: the check's answer is the own-context process's (no finding), and the Worker leaves
    MPS for good.  With a spare, the spare's process (started without MPS) checks it and becomes the Worker's own,
    and a new spare starts."""
    pipe = str(tmp_path / "pipe")
    w = Worker(SEGV_UNDER_MPS, "cpu", inflight_dir=tmp_path, name="t", mps_pipe=pipe, spare=spare)
    try:
        w.start()
        before = None if w._spare is None else w._spare.pid
        assert w.check("launch", OK) == []
        assert w.mps_pipe is None and w.mps_left == dict(after_checks=0, seen="crash: killed by signal SIGSEGV")
        (again,) = w.mps_rechecks
        assert again["seen"] == "crash: killed by signal SIGSEGV" and again["found"] == [] and again["spare"] is spare
        if spare:
            assert w.pid == before and w._spare is not None and w._spare.pid not in (None, before)
            assert w._spare.mps_pipe is None
        assert w.measure(seen_pipe, OK).metrics == dict(pipe=None)  # every later process: its own context
        assert not w.inflight_path.exists()  # the case was answered
    finally:
        w.close()


def test_a_crash_of_the_case_own_is_still_found_under_mps(tmp_path):
    """worker_crash kills its process on a full window with or without MPS: the own-context check repeats it, and
    that finding (the same as without MPS) is the answer, with the case saved at the Worker's own in-flight path."""
    with Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path / "a", name="t") as plain:
        want = [f.signature() for f in plain.check("launch", FULL)]
    w = Worker("mutant:worker_crash", "cpu", inflight_dir=tmp_path / "b", name="t", mps_pipe=str(tmp_path / "pipe"))
    try:
        assert w.check("launch", OK) == [] and w.mps_pipe is not None
        got = w.check("launch", FULL)
        assert [f.signature() for f in got] == want == ["crash [R*] crash: killed by signal SIGSEGV"]
        assert str(w.inflight_path) in got[0].message and w.inflight_path.exists()
        assert w.mps_left["after_checks"] == 1 and w.mps_rechecks[0]["found"] == want
    finally:
        w.close()


@pytest.mark.parametrize("spare", [False, True])
def test_a_campaign_under_mps_cries_no_wolf_and_still_finds_its_own_crash(tmp_path, spare):
    """The campaign path: every launch of segv_under_mps dies while its worker is an MPS client, so the first check
    sees a crash; the campaign files nothing, and keeps no unconfirmed signature that would hide a real crash of the
    same words later.  Under the same pipe, worker_crash's own crash is found, confirmed and shrunk as without MPS."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    def campaign(target, seed):
        return Campaign(target=get_target(target), device="cpu", properties=[get_property("launch")], arms=("bf16",),
                        Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=seed, round_examples=40, isolate=True,
                        corpus_dir=tmp_path / target.replace("/", "_").replace(":", "_"), stop_on_finding=True,
                        mps_pipe=str(tmp_path / "pipe"), spare_worker=spare)

    c = campaign(SEGV_UNDER_MPS, 3)
    c.run(examples=30)
    assert c.findings == {} and c.unconfirmed == {} and c.stats.examples == 30
    s = c.mps_summary()
    assert s["left"]["seen"] == "crash: killed by signal SIGSEGV" and [r["found"] for r in s["rechecks"]] == [[]]
    assert [r["spare"] for r in s["rechecks"]] == [spare]

    c = campaign("mutant:worker_crash", 3)
    c.run(examples=400)
    (f,) = c.findings.values()
    assert f.signature == "crash [R*] crash: killed by signal SIGSEGV" and not c.unconfirmed
    assert len([r for r in f.case.rows if not r.pad and r.hist_len == 16]) == 1
    assert c.mps_summary()["left"] is not None


@pytest.mark.skipif(sys.platform != "linux", reason="the stand-in daemon is a bash script using /proc")
def test_a_fleet_starts_and_stops_its_daemon(tmp_path, monkeypatch):
    """`gdn-fuzz run --processes 2 --mps on` with the stand-in on PATH: the daemon runs while the fleet does, each
    worker's record names its pipe, and nothing of it is left after the run.  The device is the CPU, which the
    decision refuses; so this drives start_daemons' result through the fleet by a device name check patched to CUDA's
    (only why_not's device test: the workers still run on the CPU)."""
    control = fake_control(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(control).parent}:{os.environ['PATH']}")
    real = mps.why_not
    monkeypatch.setattr(mps, "why_not", lambda device, per_device, env=None, control=None:
                        real("cuda", per_device, env=env, control=control))
    from gdn_fuzz import cli

    out = tmp_path / "run.json"
    code = cli.main(["run", "--target", "reference", "--device", "cpu", "--processes", "2", "--mps", "on",
                     "--examples", "6", "--arms", "bf16", "--T", "4", "--property", "launch", "--no-corpus",
                     "--json", str(out)])
    import json

    rec = json.loads(out.read_text())
    assert code == 0 and rec["mps"].startswith("on: a private daemon per GPU (1)")
    pipes = {w["mps"]["pipe"] for w in rec["workers"]}
    assert len(pipes) == 1 and all(w["mps"]["left"] is None for w in rec["workers"])
    assert not Path(pipes.pop()).exists()


@pytest.mark.parametrize("text", [
    "RuntimeError: Triton Error [CUDA]: the MPS client has been terminated by the server.",
    "RuntimeError: Triton Error [CUDA]: the MPS server is not ready to accept new MPS client requests.",
])
def test_the_mps_errors_are_fatal_in_any_librarys_words(text):
    """cudaErrorMpsClientTerminated (810) and cudaErrorMpsServerNotReady (807) leave a process that must be
    relaunched: fatal, so that under MPS they are checked again in a process of its own context, never a 'launch'
    finding of the case (Triton's words carry no 'CUDA error')."""
    from gdn_fuzz.engine.isolation import classify

    assert classify(text) == "fatal"
