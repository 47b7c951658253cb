"""Robustness of the fuzzer itself: hangs, orphans, worker recycling, environment failures,
in-flight files and case validation (gdn_fuzz.engine.isolation, Case.validate).

Planted targets are small .py files written into tmp_path: each imports the reference
target's module (with the arm's dtype env in force, like any target import) and wraps its
entry point; a launch is "marked" when a row has cache_base == 7, and only marked launches
misbehave (sleep forever, leak memory, raise, exit).  Every test says in its docstring how
the code before this change failed it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gdn_fuzz.engine import isolation
from gdn_fuzz import case as case_mod
from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine.isolation import Worker

MARK = 7  # cache_base of a marked row
OK = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0), Row(-1)), seed=1)
MARKED = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, MARK), Row(-1)), seed=1)

_PLANT = '''\
import os, sys, time
from gdn_fuzz.targets import REFERENCE_PATH, import_file

_ref = import_file(REFERENCE_PATH, __name__ + "_ref")  # this arm's reference module
RING_SLOTS, W_RING = _ref.RING_SLOTS, _ref.W_RING
IO_TORCH, ST_TORCH, RING_TORCH = _ref.IO_TORCH, _ref.ST_TORCH, _ref.RING_TORCH
_LAUNCHES = [0]
_HELD = []


def gated_delta_rule_mtp_ucache_flush(*args, **kw):
    _LAUNCHES[0] += 1
    marked = bool((kw["cache_base"] == {mark}).any())
{body}
    return _ref.gated_delta_rule_mtp_ucache_flush(*args, **kw)
'''


def slow_fresh_processes(tmp_path: Path, seconds: float) -> str:
    """A planted body's opening lines: every process but the first sleeps `seconds` on its first launch (a marker file
    tells the first): a fresh-process confirmation then takes that long, while the campaign's own worker does not."""
    marker = tmp_path / "first-process"
    return ("if _LAUNCHES[0] == 1:\n"
            "    try:\n"
            f"        os.close(os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL))\n"
            "    except FileExistsError:\n"
            f"        time.sleep({seconds})\n")


def plant(tmp_path: Path, name: str, body: str) -> str:
    """A target file whose entry point runs `body` (indented, sees `marked`) before the reference."""
    p = tmp_path / f"{name}.py"
    p.write_text(_PLANT.replace("{mark}", str(MARK)).replace("{body}", "\n".join("    " + ln for ln in body.splitlines())))
    return str(p)


# ------------------------------------------------------------------ hangs


def test_hang_is_one_finding_after_the_settable_timeout(tmp_path):
    """Hangs: a launch past Worker.timeout_s (set after construction) is ONE `hang` finding
    (clause R*, outcome 'hang', the case saved), the hung worker is killed and a fresh one
    takes the next check; the launch times of answered checks are measured.
    Before: the timeout could only be the constructor's (600 s by default) and a hang came
    back as a `crash` finding with no outcome; nothing was measured."""
    target = plant(tmp_path, "hang", "if marked:\n    time.sleep(10**6)")
    w = Worker(target, "cpu", inflight_dir=tmp_path / "inflight", name="h")
    try:
        assert w.check("launch", OK) == []
        assert w.last_check_s is not None and w.max_check_s >= w.last_check_s and w.median_check_s > 0
        w.timeout_s = 2.0
        t0 = time.monotonic()
        (f,) = w.check("launch", MARKED)
        took = time.monotonic() - t0
        assert (f.prop, f.clause, f.outcome) == ("hang", "R*", "hang"), f
        assert f.signature() == "hang [R*] hang"
        assert "2 s timeout" in f.message and "saved" in f.message and str(w.inflight_path) in f.message
        assert 2.0 <= took < 5.0, took
        assert Case.from_dict(json.loads(w.inflight_path.read_text())["case"]) == MARKED
        assert w.pid is None  # killed, not left running
        assert w.check("launch", OK) == [] and w.restarts == 1
    finally:
        w.close()


def test_a_hang_sent_ahead_is_timed_from_the_answer_before_it(tmp_path):
    """Checks sent ahead (Worker.submit, deferred verdicts): a case's hang timer starts when the worker answered the
    case before it (it cannot start earlier), the hang is that case's, and the case sent after it runs in the fresh
    worker.  Before Worker.submit there was no queue to time."""
    target = plant(tmp_path, "hang_ahead", "if marked:\n    time.sleep(10**6)\nelse:\n    time.sleep(0.5)")
    w = Worker(target, "cpu", inflight_dir=tmp_path / "inflight", name="ha")
    try:
        assert w.check("launch", OK) == []  # started, compiled
        w.timeout_s = 2.0
        for c in (OK, MARKED, OK):
            w.submit("launch", c)
        t0 = time.monotonic()
        assert w.collect() == ("launch", OK, [], None)
        t_ok = time.monotonic()
        _, case, (f,), _ = w.collect()
        took = time.monotonic() - t_ok
        assert case == MARKED and f.signature() == "hang [R*] hang", f
        # timed from the first answer (0.5 s after the sends), not from its own send: 2 s after t_ok, not 1.5 s.
        # Bounds: the first check sleeps 0.5 s (0.4: 0.1 s for the clocks); t_ok follows the answer by microseconds
        # and the answer loop polls every 0.05 s, so the hang comes 2.0-2.05 s after it (1.9: 0.1 s for the clocks);
        # 4.5 s bounds the kill and join as the test above bounds them (< 5 s for its 2 s timeout)
        assert t_ok - t0 >= 0.4 and 1.9 <= took < 4.5, (t_ok - t0, took)
        assert Case.from_dict(json.loads(w.inflight_path.read_text())["case"]) == MARKED
        assert w.collect() == ("launch", OK, [], None) and w.restarts == 1 and w.pending == 0
    finally:
        w.close()


def test_derive_timeout_rule():
    """Hangs: derive_timeout = max(floor, min(budget left, 20 x slowest measured check));
    nothing measured yet -> the first-launch allowance (600 s) capped by the budget.
    Before: no such function (AttributeError)."""
    d = isolation.derive_timeout
    assert d(3600, 0.5) == 30.0  # 20 x 0.5 = 10 s < the 30 s floor
    assert d(3600, 4.0) == 80.0  # 20 x the slowest check
    assert d(50, 4.0) == 50.0  # capped by the budget left
    assert d(5, 4.0) == 30.0  # but never under the floor
    assert d(None, 4.0) == 80.0 and d(None, None) == 600.0 and d(100, None) == 100.0
    assert d(3600, 0.1, floor_s=1.0) == 2.0
    w = Worker("reference", "cpu", name="auto")
    try:
        w.max_check_s = 3.0
        assert w.auto_timeout(3600) == 60.0 == w.timeout_s
    finally:
        w.close()


# ------------------------------------------------------------------ no orphans

_CAMPAIGN = '''\
import json, sys
from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine.isolation import Worker

if __name__ == "__main__":
    w = Worker(sys.argv[1], "cpu", inflight_dir=sys.argv[2], name="orphan")
    w.check("launch", Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, 0), Row(-1)), seed=1))
    print(json.dumps(dict(worker=w.pid)), flush=True)
    w.check("launch", Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 3, {mark}), Row(-1)), seed=1))
'''


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process from /proc, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def _descendants(root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st is not None:
                kids.setdefault(st[1], []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")  # a zombie waits for its reaper: it runs nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_campaign_leaves_no_process(tmp_path, sig):
    """No orphans: a campaign killed (kill -9, or SIGTERM) while its worker hangs in a launch
    leaves no process of its tree behind (worker, forkserver, resource tracker) within 5 s.
    Before: the hung worker, whose parent is the forkserver, survived (and slept forever)."""
    target = plant(tmp_path, "hang_forever", "if marked:\n    time.sleep(10**6)")
    script = tmp_path / "campaign.py"
    script.write_text(_CAMPAIGN.replace("{mark}", str(MARK)))
    p = subprocess.Popen([sys.executable, str(script), target, str(tmp_path / "inflight")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    tree: set[int] = set()
    try:
        worker = json.loads(p.stdout.readline())["worker"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the hung launch is under way once the marked case is saved
            saved = list((tmp_path / "inflight").glob("*-orphan.json"))
            if saved and json.loads(saved[0].read_text())["case"]["rows"][0]["cache_base"] == MARK:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        tree = _descendants(p.pid)
        assert worker in tree and len(tree) >= 3, tree  # worker, forkserver, resource tracker
        os.kill(p.pid, sig)
        p.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(q) for q in tree):
            time.sleep(0.05)
        left = {q: Path(f"/proc/{q}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for q in tree if _alive(q)}
        assert not left, f"processes survived the campaign: {left}"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for q in tree:  # never leave what this test started behind a failure
            if _alive(q):
                try:
                    os.kill(q, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# ------------------------------------------------------------------ recycling and environment failures


def test_worker_recycled_when_its_memory_grows(tmp_path, monkeypatch):
    """Recycling: a worker whose resident memory passes max_rss_mb is closed after its check and
    a fresh one runs the next; the limit defaults to $GDN_FUZZ_WORKER_MAX_RSS_MB.
    Before: no such limit (Worker took no max_rss_mb; a leaking target grew without bound)."""
    monkeypatch.setenv(isolation.MAX_RSS_ENV, "1234")
    assert Worker("reference", "cpu", name="env").max_rss_mb == 1234.0
    monkeypatch.delenv(isolation.MAX_RSS_ENV)
    assert Worker("reference", "cpu", name="dflt").max_rss_mb == isolation.DEFAULT_MAX_RSS_MB
    # each marked launch keeps 256 MiB (touched) alive in the worker
    target = plant(tmp_path, "leak", "if marked:\n    buf = bytearray(256 * 2**20)\n"
                                     "    buf[::4096] = bytes(len(buf) // 4096)  # touch every page\n"
                                     "    _HELD.append(buf)")
    w = Worker(target, "cpu", name="leak")
    try:
        assert w.check("launch", OK) == []
        base, pid = w.last_rss_mb, w.pid
        assert base is not None and base > 0
        w.max_rss_mb = base + 128
        assert w.check("launch", MARKED) == []
        assert w.last_rss_mb > base + 200
        assert w.recycles == 1 and "resident memory" in w.last_recycle_reason and w.pid is None
        assert w.check("launch", OK) == [] and w.pid not in (None, pid) and w.restarts == 0
    finally:
        w.close()


def _pids_after_checks(w: Worker, n: int) -> list:
    """n passing checks of OK in w; the worker's pid after each (None: recycled after that check)."""
    pids = []
    for _ in range(n):
        assert w.check("launch", OK) == []
        pids.append(w.pid)
    return pids


def test_worker_recycled_after_max_checks():
    """Recycling: after max_checks checks the worker is closed and the next check runs in a new one.
    Before: Worker took no max_checks (TypeError); one worker ran forever.  (recycle_amortize=0: at max_checks
    whatever the worker's start cost; the next test covers that bound.)"""
    w = Worker("reference", "cpu", name="count", max_checks=2, recycle_amortize=0)
    try:
        pids = _pids_after_checks(w, 3)
        assert pids[0] is not None and pids[1] is None and pids[2] not in (None, pids[0])
        assert w.recycles == 1 and w.checks == 3
    finally:
        w.close()


def test_recycle_by_count_waits_until_the_start_is_paid_for():
    """A recycle by check count waits until the worker has lived recycle_amortize times its own start's cost
    (ready_s + first_check_s): past max_checks a worker whose start is not yet paid for keeps checking in the same
    process, and is recycled after the first check once it is.  Before: recycled at max_checks whatever the cost
    (on a CUDA worker, 3-5 s of every ~18 s)."""
    w = Worker("reference", "cpu", name="amortize", max_checks=2, recycle_amortize=1e9)
    try:
        pids = _pids_after_checks(w, 4)
        assert len(set(pids)) == 1 and pids[0] is not None and w.recycles == 0
        st = w.startups[-1]
        assert st["ready_s"] > 0 and st["first_check_s"] > 0  # what the bound is made of
        w.recycle_amortize = 0.0  # paid for now
        assert w.check("launch", OK) == [] and w.pid is None and w.recycles == 1
        assert "5 checks in one worker" in w.last_recycle_reason
        assert w.check("launch", OK) == [] and w.pid not in (None, pids[0])
    finally:
        w.close()


@pytest.mark.parametrize("raise_", [
    "raise MemoryError()",
    "raise RuntimeError('[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can\\'t allocate memory: "
    "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)')",
])
def test_out_of_memory_is_a_resource_finding(tmp_path, raise_):
    """Environment failures: an allocation failure in the check is ONE `resource` finding (clause -,
    outcome 'resource: out of memory'), never a kernel bug, and the worker is recycled.
    Before: it came back as a `launch` [H*] finding, i.e. filed as a bug of the kernel."""
    target = plant(tmp_path, "oom", f"if marked:\n    {raise_}")
    w = Worker(target, "cpu", name="oom")
    try:
        (f,) = w.check("launch", MARKED)
        assert (f.prop, f.clause, f.outcome) == ("resource", "-", "resource: out of memory"), f
        assert w.recycles == 1 and w.pid is None
        assert w.check("launch", OK) == []
    finally:
        w.close()


@pytest.mark.parametrize("message", ["Torch not compiled with CUDA enabled",
                                     "CUDA error: invalid device ordinal"])
def test_missing_device_raises_setup_error(tmp_path, message):
    """Environment failures: a missing device raises SetupError (one line) from Worker.check, so the
    caller can exit 2; a worker whose target cannot load raises it too.
    Before: SetupError did not exist and the failure was a `launch` or `crash` finding."""
    target = plant(tmp_path, "nodev", f"raise RuntimeError({message!r})")
    w = Worker(target, "cpu", name="nodev")
    try:
        with pytest.raises(isolation.SetupError) as ei:
            w.check("launch", OK)
        assert message in str(ei.value) and "\n" not in str(ei.value)
        assert w.pid is None
    finally:
        w.close()
    w = Worker(str(tmp_path / "missing.py"), "cpu", name="missing")
    try:
        with pytest.raises(isolation.SetupError, match="could not load target"):
            w.check("launch", OK)
    finally:
        w.close()


def test_crash_outcomes_are_stable(tmp_path):
    """Crash findings carry an outcome, so their signatures are stable: 'crash: killed by signal
    SIGSEGV', 'crash: exited with code N', 'crash: fatal CUDA error: <normalized message>' (the
    same for two addresses).  Before: crash findings had no outcome (signature 'wrong value')."""
    w = Worker("mutant:worker_crash", "cpu", name="segv")
    try:
        (f,) = w.check("launch", Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1))
        assert f.signature() == "crash [R*] crash: killed by signal SIGSEGV", f
    finally:
        w.close()
    w = Worker(plant(tmp_path, "exit5", "if marked:\n    os._exit(5)"), "cpu", name="exit")
    try:
        (f,) = w.check("launch", MARKED)
        assert f.outcome == "crash: exited with code 5", f
    finally:
        w.close()
    body = "if marked:\n    raise RuntimeError(f'CUDA error: an illegal memory access was encountered at {hex(id(_HELD))}')"
    w = Worker(plant(tmp_path, "cuda_fatal", body), "cpu", name="fatal")
    try:
        (f1,) = w.check("launch", MARKED)
        (f2,) = w.check("launch", MARKED)
        assert f1.outcome.startswith("crash: fatal CUDA error: ") and "illegal memory access" in f1.outcome, f1
        assert f1.signature() == f2.signature() and w.restarts == 2
    finally:
        w.close()
    # an out-of-bounds access raises 700 or 717 depending on where the address falls: one class
    from gdn_fuzz.engine.isolation import fatal_outcome

    assert {fatal_outcome("AcceleratorError: CUDA error: an illegal memory access was encountered"),
            fatal_outcome("AcceleratorError: CUDA error: operation not supported on global/shared address space")} \
        == {"crash: fatal CUDA error: illegal memory access"}
    assert fatal_outcome("CUDA error: misaligned address") == "crash: fatal CUDA error: misaligned address"


def test_reproduces_runs_in_a_fresh_worker(tmp_path):
    """reproduces(prop, case, signature): True when a FRESH worker gives the same signature, False
    when the failure came from the worker's history (here: the 3rd launch of a process fails).
    Before: Worker had no reproduces (AttributeError)."""
    body = ("if marked:\n    raise ValueError('always on this case')\n"
            "if _LAUNCHES[0] == 3:\n    raise ValueError('state left by earlier launches')")
    w = Worker(plant(tmp_path, "history", body), "cpu", name="repro")
    try:
        assert w.check("launch", OK) == [] and w.check("launch", OK) == []
        (stale,) = w.check("launch", OK)
        (always,) = w.check("launch", MARKED)
        pid = w.pid
        assert w.reproduces("launch", OK, stale.signature()) is False
        assert w.reproduces("launch", MARKED, always.signature()) is True
        assert w.pid == pid  # the campaign's worker is untouched
        assert not list(w.inflight_dir.glob("*repro*"))
    finally:
        w.close()


class _Answering:
    """A worker process stand-in for Worker.check: the test's thread answers on the pipe's other end."""
    pid, exitcode = os.getpid(), None

    def is_alive(self):
        return True

    def join(self, timeout=None):
        pass

    def kill(self):
        pass


def _scripted_worker(monkeypatch, tmp_path, script, **kw):
    """A Worker whose 'process' answers each check with `script(conn)` from a thread."""
    import multiprocessing
    import threading

    w = Worker("reference", "cpu", inflight_dir=tmp_path, name="scripted", **kw)
    parent, child = multiprocessing.Pipe()
    monkeypatch.setattr(w, "start", lambda: None)
    w._proc, w._conn, w._ready = _Answering(), parent, True

    def answer():
        try:
            while child.recv() is not None:
                script(child)
        except (EOFError, OSError):
            pass

    threading.Thread(target=answer, daemon=True).start()
    return w


def test_the_hang_timer_leaves_out_the_wait_for_the_oracle(tmp_path, monkeypatch):
    """A check that waits for the oracle's compile on the worker's thread (checks.OraclePrep) says so on the pipe:
    the hang timer stops for the wait (a 0.5 s --launch-timeout does not call a 1.5 s compile a hang; the oracle's
    compile ran before 'ready', outside every check, until issue 32 moved it beside the first check), the check's
    measured seconds leave it out, and the answer's oracle report reaches startups.  A compile that never ends is
    a setup error after start_timeout_s, not a hang finding of the target; so is a worker that answers 'setup'."""
    oracle = dict(oracle_s=1.4, oracle_wait_s=1.5)

    def waits(conn):
        conn.send(("oracle-wait", None, 0))
        time.sleep(1.5)
        conn.send(("oracle-waited", None, 0))
        conn.send(("ok", dict(findings=[], metrics=None, graphs={}, oracle=oracle), 0))

    w = _scripted_worker(monkeypatch, tmp_path / "a", waits)
    w.startups.append(dict(ready_s=1.0, target_s=0.1))
    w.timeout_s = 0.5
    try:
        assert w.check("launch", OK) == []
        assert w.last_check_s < 0.5 and w.startups[-1]["oracle_s"] == 1.4
    finally:
        w.close()

    w = _scripted_worker(monkeypatch, tmp_path / "b", lambda conn: conn.send(("oracle-wait", None, 0)),
                         start_timeout_s=1.0)
    w.timeout_s = 60
    try:
        with pytest.raises(isolation.SetupError, match="oracle's compile did not finish within 1 s"):
            w.check("launch", OK)
    finally:
        w.close()

    w = _scripted_worker(monkeypatch, tmp_path / "c", lambda conn: conn.send(
        ("setup", "the fused oracle's kernel did not compile: ValueError: x", 0)))
    try:
        with pytest.raises(isolation.SetupError, match="did not compile: ValueError: x"):
            w.check("launch", OK)
    finally:
        w.close()


def test_an_oracle_compile_killed_by_a_sticky_cuda_error_is_the_checks_crash(monkeypatch):
    """isolation._prep_failed: when the oracle's compile on the worker's thread failed with a sticky CUDA error (the
    target's launch faulted while it ran: H200 run 66, where this was reported as a setup error, replay stopped on
    gpu_oob_full_window and the mutant study's shrink became flaky), the worker answers 'fatal' (a crash finding)
    and exits; any other compile failure is 'setup'; no failure, nothing."""
    class Conn:
        def __init__(self):
            self.sent = []

        def send(self, msg):
            self.sent.append(msg)

    class Prep:
        def __init__(self, error):
            self.error = error

    def exits(code):
        raise SystemExit(code)

    monkeypatch.setattr(isolation.os, "_exit", exits)
    conn = Conn()
    assert not isolation._prep_failed(conn, None) and not isolation._prep_failed(conn, Prep(None)) and not conn.sent
    sticky = "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered"
    with pytest.raises(SystemExit):
        isolation._prep_failed(conn, Prep(sticky))
    assert conn.sent == [("fatal", dict(text=sticky, outcome="crash"), 0)]
    assert isolation.fatal_outcome(sticky) == "crash: fatal CUDA error: illegal memory access"
    conn = Conn()
    assert isolation._prep_failed(conn, Prep("ValueError: no compiler"))
    assert conn.sent == [("setup", "the fused oracle's kernel did not compile: ValueError: no compiler", 0)]


def test_a_spare_worker_is_fresh_and_started_before_it_is_needed(tmp_path):
    """Worker(spare=True) (issue 32: a first finding waited for a whole process start in reproduces, 5-13 s on the
    H200): a second process starts when the worker is ready, has run no check when reproduces takes it (the
    failure left by earlier launches still does not come back), the next one starts as each is taken (its start
    overlaps the confirmation's check), every use is recorded in confirmations, and close() ends the spare too."""
    import time

    body = ("if marked:\n    time.sleep(0.5)\n    raise ValueError('always on this case')\n"
            "if _LAUNCHES[0] == 3:\n    raise ValueError('state left by earlier launches')")
    w = Worker(plant(tmp_path, "history_spare", body), "cpu", name="spare", spare=True)
    try:
        assert w.check("launch", OK) == [] and w.check("launch", OK) == []
        spare = w._spare
        assert spare is not None and spare.pid is not None and spare.pid != w.pid
        (stale,) = w.check("launch", OK)
        (always,) = w.check("launch", MARKED)
        deadline = time.monotonic() + 60
        while not spare._conn.poll(0.1) and time.monotonic() < deadline:  # its 'ready' is waiting in the pipe
            pass
        pid = w.pid
        assert w.reproduces("launch", OK, stale.signature()) is False
        assert spare.pid is None and w._spare is not None and w._spare is not spare  # used, closed, replaced
        t0 = time.monotonic()
        assert w.reproduces("launch", MARKED, always.signature()) is True
        assert w.pid == pid
        first, second = w.confirmations
        # the spare after it was started before its check (which slept 0.5 s), not after: 0.25 s, half that sleep,
        # tells the two apart
        assert w._spare._spawned_at - t0 < second["wait_s"] + 0.25 < second["wait_s"] + second["check_s"]
        assert first["spare"] and second["spare"] and first["wait_s"] < first["ready_s"]
        assert first["check_s"] > 0 and second["ready_s"] > 0
        last = w._spare
    finally:
        w.close()
    assert w._spare is None and last.pid is None


# ------------------------------------------------------------------ files


def test_inflight_files_are_per_process_and_private(tmp_path, monkeypatch):
    """Files: the in-flight file is named <pid>-<worker>.json; without inflight_dir it lives in a
    private temporary directory removed by close(); a failed write leaves no temp file; close()
    removes the file of a finished check.  Before: every campaign shared
    /tmp/gdn_fuzz_inflight/w0.json and a failed write left its .tmp file behind."""
    w = Worker("reference", "cpu", name="files")
    private = w.inflight_dir
    try:
        assert private.name.startswith("gdn_fuzz_inflight-") and private != Path(tempfile.gettempdir()) / "gdn_fuzz_inflight"
        assert w.inflight_path == private / f"{os.getpid()}-files.json"
        assert w.check("launch", OK) == [] and not w.inflight_path.exists()
    finally:
        w.close()
    assert not private.exists()

    shared = tmp_path / "shared"
    w = Worker("reference", "cpu", inflight_dir=shared, name="w0")
    try:
        assert w.check("launch", OK) == [] and list(shared.iterdir()) == []
        shared.rmdir()
        shared.write_text("not a directory")  # the worker's write fails (ENOTDIR): a setup error naming the file
        with pytest.raises(isolation.SetupError, match="cannot save the in-flight case to .*w0.json"):
            w.check("launch", OK)
        shared.unlink()  # no folder at all: the worker makes it again
        assert w.check("launch", OK) == [] and list(shared.iterdir()) == []  # the same worker goes on
        isolation.write_atomic(w.inflight_path, "{}")  # as if a check had been sent and answered
        assert w.inflight_path.exists()
    finally:
        w.close()
    assert shared.is_dir() and list(shared.iterdir()) == []  # a given directory stays, empty


# ------------------------------------------------------------------ case validation


def _ok_dict() -> dict:
    return Case(arm="bf16", T=4, H=2, HV=4, pool=3, rows=(Row(0, 16, 31), Row(2, -64, -2**31), Row(-1)),
                seed=2**64 - 1, flush_min=-64).to_dict()


def _set(path: str, value):
    def f(d):
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if k.isdigit() else d[k]
        if value is _DEL:
            del d[last]
        else:
            d[int(last) if last.isdigit() else last] = value
    return f


_DEL = object()


@pytest.mark.parametrize("change, field", [
    (_set("T", 6), "T"), (_set("T", 4.0), "T"), (_set("H", 0), "H"), (_set("HV", 3), "HV"), (_set("K", 64), "K"),
    (_set("V", 256), "V"), (_set("pool", 0), "pool"), (_set("pool", 65537), "pool"),
    (_set("rows", []), "rows"), (_set("rows", [dict(slot=-1, hist_len=0, cache_base=0)] * 1025), "rows"),
    (_set("rows.0.slot", 3), "slot"), (_set("rows.0.hist_len", 65), "hist_len"),
    (_set("rows.0.cache_base", 2**31), "cache_base"), (_set("flush_min", 65), "flush_min"),
    (_set("seed", -1), "seed"), (_set("seed", 2**64), "seed"), (_set("arm", "bf8"), "arm"),
    (_set("regime.decay", "mild"), "decay"), (_set("regime.qk_scale", float("inf")), "qk_scale"),
    (_set("regime.v_scale", 0.0), "v_scale"), (_set("regime.state_scale", 2e6), "state_scale"),
    (_set("draws", "gpu"), "draws"),
    (_set("restart_hist_on_flush", "yes"), "restart_hist_on_flush"),
    (_set("bogus", 1), "bogus"), (_set("regime.colour", "red"), "colour"), (_set("rows.0.extra", 1), "extra"),
    (_set("seed", _DEL), "seed"),
    (lambda d: d.update(pool=65536, HV=64, H=64), "GiB"),
])
def test_case_validation_names_the_field(change, field):
    """Case validation: every field of a stored case is checked against its documented bounds
    before anything is allocated; ValueError in one line naming the field and the legal range
    (unknown keys named too, not a TypeError).  Before: from_dict accepted T=6, pool=0, a slot
    past the pool, a 300 GiB pool... and raised TypeError for unknown keys."""
    Case.from_dict(_ok_dict())  # the edges themselves are legal
    d = json.loads(json.dumps(_ok_dict()))
    change(d)
    with pytest.raises(ValueError, match=field) as ei:
        Case.from_dict(d)
    assert "\n" not in str(ei.value)


def test_every_drawn_and_stored_case_is_valid():
    """Case validation accepts what the fuzzer makes: drawn cases, the repo corpus, and the
    guards property's deliberate T=6 (built with dataclasses.replace, never validated): the
    bounds are not stricter than the fuzzer.  Before: Case had no validate() (AttributeError)."""
    import dataclasses

    from hypothesis import HealthCheck, given, settings

    from gdn_fuzz.strategies import cases

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases())
    def roundtrip(c):
        assert c.validate() is c and Case.from_dict(json.loads(c.to_json())) == c

    roundtrip()
    for p in Path(__file__).parent.parent.joinpath("corpus").glob("*.json"):
        Case.from_dict(json.loads(p.read_text())["case"])
    assert dataclasses.replace(OK, T=6).T == 6
    assert OK.draw_bytes() < case_mod.MAX_CASE_BYTES


# ------------------------------------------------------------------ the corpus is data


def _cli(argv, cwd, **env):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.update(env)
    return subprocess.run([sys.executable, "-m", "gdn_fuzz.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=e)


def _entry_dict(target: str, **case_over) -> dict:
    from gdn_fuzz.engine import corpus
    from gdn_fuzz.findings import Finding

    case = dict(OK.to_dict(), **case_over)
    e = corpus.make_entry("launch", OK, [Finding("launch", "H*", "x", outcome="raised RuntimeError: x")], target)
    d = e.to_dict()
    d["case"] = case
    return d


def test_an_entry_naming_a_file_runs_no_code(tmp_path, monkeypatch):
    """A corpus entry whose target is a path is refused by replay (CLI, corpus.replay and the
    pytest corpus test) unless the person running allows paths; the file is never imported.
    On main `gdn-fuzz replay` imported and ran it, and reported the entry as an expected XFAIL."""
    from gdn_fuzz.engine import corpus

    evil = tmp_path / "evil.py"
    marker = tmp_path / "ran"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\nRING_SLOTS, W_RING = 32, 16\n"
                    "def gated_delta_rule_mtp_ucache_flush(**kw):\n    raise RuntimeError('x')\n")
    cdir = tmp_path / "c"
    cdir.mkdir()
    (cdir / "launch-evil.json").write_text(json.dumps(_entry_dict(str(evil))))
    p = _cli(["replay", str(cdir)], tmp_path)
    assert p.returncode == 1 and "refused" in p.stdout and not marker.exists(), p.stdout  # (the table wraps the reason)
    monkeypatch.delenv(corpus.ALLOW_PATHS_ENV, raising=False)
    with pytest.raises(corpus.CorpusError, match="names a file"):
        corpus.replay(corpus.read(cdir / "launch-evil.json"))
    assert not marker.exists()
    bad_mutant = corpus.read(cdir / "launch-evil.json")
    bad_mutant.target = "mutant:no_such_mutant"
    with pytest.raises(corpus.CorpusError, match="not in the catalogue"):
        corpus.check_replayable(bad_mutant)


@pytest.mark.parametrize("over, field", [
    (dict(T=3), "T"), (dict(H=-1), "H"), (dict(pool=20000 * 1000), "pool"), (dict(HV=3, H=2), "HV"),
])
def test_an_entry_with_illegal_fields_is_refused_before_allocation(tmp_path, over, field):
    """Every field is checked against its bounds when the entry is read: one line naming the file
    and the field, nothing allocated.  On main an entry with T = 3 or a 65 TB pool "reproduced"
    its open bug (any failure passed) after allocating what it could."""
    from gdn_fuzz.engine import corpus

    f = tmp_path / "launch-bad.json"
    f.write_text(json.dumps(_entry_dict("reference", **over)))
    with pytest.raises(corpus.CorpusError) as e:
        corpus.read(f)
    msg = str(e.value)
    assert str(f) in msg and field in msg and "\n" not in msg


def test_stale_temporary_entries_are_not_read_and_are_cleaned(tmp_path):
    """A writer killed mid-write leaves a hidden .tmp-*.partial file: readers never see it and a
    campaign start removes it once it is stale.  On main `.tmp-*.json` files were read as entries."""
    from gdn_fuzz.engine import corpus

    old, new = tmp_path / ".tmp-abc.partial", tmp_path / ".tmp-def.partial"
    old.write_text("")
    new.write_text("{")
    os.utime(old, (time.time() - 2 * corpus.STALE_TEMP_S,) * 2)
    assert corpus.entries(tmp_path) == []
    assert corpus.clean_stale_temps(tmp_path) == 1 and not old.exists() and new.exists()


# ------------------------------------------------------------------ budgets, read-only, devices


def test_example_budget_is_exact_with_shrinking():
    """--examples N checks N examples, shrinking included.  On main 200 examples ran 212."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    c = Campaign(target=get_target("mutant:fold_skipped"), device="cpu", properties=[get_property("launch")],
                 arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=2, round_examples=25)
    c.run(examples=30)
    assert c.stats.examples == 30 and c.findings


def test_readonly_corpus_campaign_reports_and_exits_1(tmp_path):
    """GDN_FUZZ_CORPUS_READONLY=1: the finding is in the summary and the JSON, nothing is written,
    exit 1, no traceback.  On main the first finding ended the run with a PermissionError traceback."""
    cdir = tmp_path / "corpus"
    p = _cli(["run", "--target", "mutant:fold_skipped", "--arms", "bf16", "--T", "4", "--buckets", "4",
              "--property", "launch", "--examples", "30", "--no-isolate", "--json", str(tmp_path / "r.json")],
             tmp_path, GDN_FUZZ_CORPUS_READONLY="1", GDN_FUZZ_CORPUS=str(cdir))
    assert p.returncode == 1 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "read-only" in p.stdout and not cdir.exists()
    rec = json.loads((tmp_path / "r.json").read_text())
    assert [f["signature"] for f in rec["findings"]] == ["oracle.fold [M7] out of tolerance (flush rows)"]
    assert rec["findings"][0]["corpus_entry"] is None


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the behaviour on a machine without CUDA")
def test_cuda_device_without_a_gpu_is_a_setup_error(tmp_path):
    """--device cuda on a machine without CUDA: exit 2 and one line, no findings, no corpus entries.
    On main: 9 findings "Torch not compiled with CUDA enabled" and 9 open entries."""
    p = _cli(["run", "--device", "cuda", "--examples", "5", "--corpus", str(tmp_path / "c")], tmp_path)
    assert p.returncode == 2 and "no usable CUDA device" in p.stdout and "Traceback" not in p.stdout + p.stderr
    assert not (tmp_path / "c").exists()


def test_a_hanging_target_is_a_hang_finding_within_the_budget(tmp_path):
    """A target that sleeps forever on marked launches: the campaign reports a `hang` finding,
    keeps its budget (+ the shrink grace, --shrink-grace's default, + one launch timeout) and exits 1.  On main a 60 s campaign ran 21 minutes
    (600 s per launch, paid again at every shrink step) and reported nothing.  On the CPU: on the H200 (run 64) a
    fresh worker's first check took the whole 12 s (CUDA start-up, the oracle's compiles), so no marked launch ran."""
    target = plant(tmp_path, "hangs", "if bool((kw['hist_len'] > 0).any()):\n    time.sleep(3600)")
    t0 = time.monotonic()
    p = _cli(["run", "--target", target, "--device", "cpu", "--arms", "bf16", "--T", "4", "--buckets", "4",
              "--property", "launch",
              "--seconds", "12", "--launch-timeout", "2", "--corpus", str(tmp_path / "c"),
              "--json", str(tmp_path / "r.json")], tmp_path)
    wall = time.monotonic() - t0
    rec = json.loads((tmp_path / "r.json").read_text())
    assert p.returncode == 1, p.stdout[-3000:]
    assert [f["signature"] for f in rec["findings"]] == ["hang [R*] hang"]
    assert rec["grace_used_s"] <= rec["shrink_grace_s"] + 2, rec["grace_used_s"]  # one 2 s launch timeout past it
    assert rec["seconds"] <= 1.1 * 12 + rec["shrink_grace_s"] + 2, rec["seconds"]
    assert wall < 60, wall  # start-up and the fresh-worker reproduction included


def test_an_interrupt_during_shrinking_keeps_the_finding(tmp_path):
    """Ctrl-C right after the first failing example (before any shrinking): the campaign stops,
    says it was interrupted, and stores the failing case unshrunk.  On main the summary said 0
    findings, nothing was stored and the exit code was 0."""
    from gdn_fuzz.engine import corpus
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    def ctrl_c(*_):
        raise KeyboardInterrupt

    c = Campaign(target=get_target("mutant:fold_skipped"), device="cpu", properties=[get_property("launch")],
                 arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=2, corpus_dir=tmp_path)
    c.run(examples=500, on_first=ctrl_c)
    assert c.interrupted
    (f,) = c.findings.values()
    assert not f.shrunk and f.signature == "oracle.fold [M7] out of tolerance (flush rows)"
    assert [corpus.read(p).signature for p in corpus.entries(tmp_path)] == [f.signature]


def test_a_failure_that_a_fresh_worker_does_not_repeat_is_not_filed(tmp_path):
    """A worker that goes bad after a few launches (a poisoned context, a leak) makes every later
    launch fail; a fresh worker passes the same case.  That is not filed as a kernel bug: it is
    listed as unconfirmed, not shrunk, not stored.  On main it became an open corpus entry."""
    from gdn_fuzz.engine import corpus
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    target = plant(tmp_path, "goes_bad", "if _LAUNCHES[0] > 3:\n    raise RuntimeError('worker state went bad')")
    c = Campaign(target=get_target(target), device="cpu", properties=[get_property("launch")], arms=("bf16",),
                 Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=2, round_examples=10, isolate=True,
                 corpus_dir=tmp_path / "c", launch_timeout_s=30.0)
    c.run(examples=10)
    assert not c.findings and corpus.entries(tmp_path / "c") == []
    assert list(c.unconfirmed) == ["launch [H*] raised RuntimeError: worker state went bad"]
    assert c.unconfirmed["launch [H*] raised RuntimeError: worker state went bad"]["reproduced"] is False


def test_a_confirmation_runs_beside_the_shrink(tmp_path):
    """The fresh-process confirmation of a new failure runs beside the campaign's checks (issue 32: on the GPU it is a
    process's first check, 2.4-5.1 s in run 87, and it used to hold every round's check, so that findings were left
    unshrunk).  A target whose every process sleeps on its first launch makes the confirmation slow: the round
    shrinks the failure meanwhile, and the failure is told (on_first) and filed with the time its confirmation came
    back, shrunk.  Before: no example was checked between the first failing example and on_first."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    slow_s = 3.0
    body = (f"if _LAUNCHES[0] == 1:\n    time.sleep({slow_s})\n"
            "if (kw['cache_base'] >= 5).any():\n    raise ValueError('a late cache base')")
    target = plant(tmp_path, "slow_first", body)
    record = tmp_path / "record.jsonl"
    c = Campaign(target=get_target(target), device="cpu", properties=[get_property("launch")], arms=("bf16",),
                 Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=4, round_examples=200, isolate=True,
                 launch_timeout_s=60.0, pipeline=1, spare_worker=True, record_path=record, shrink_grace_s=20.0)
    told = []
    c.run(examples=200, on_first=lambda sig, prop, case, found, t, n: told.append((sig, t, c.stats.examples)))
    (sig, t_told, _), = told
    (f,) = c.findings.values()
    assert f.signature == sig == "launch [H*] raised ValueError: a late cache base" and f.shrunk
    assert f.first_t == t_told
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    t_fail = next(x["t"] for x in lines if sig in x["signatures"])
    assert t_told - t_fail >= slow_s  # the confirmation's process slept on its first launch
    during = [x for x in lines if t_fail < x["t"] < t_told]
    assert len(during) >= 5  # the shrink went on meanwhile (the inline confirmation checked 0)
    (conf,) = c.confirmations()
    assert conf["spare"] and conf["check_s"] >= slow_s
    assert c._confirmer is None and not c._confirming and c._worker._spare is None  # nothing left running


def test_a_shrink_done_before_the_budget_is_shrunk_when_its_confirmation_ends_after(tmp_path):
    """A round whose shrink ended before the budget waits for its failure's confirmation (_settle) and may read its
    findings after the budget.  They are shrunk: Hypothesis finished with them.  Before, `shrunk` was read after
    the wait, as "the budget is not spent yet", and such findings were filed shrunk=False: on an H100 (run 88,
    2026-12-07) 7 of 16 findings of one 30 s run on an edited kernel, all with grace_used_s 0.0, the two workers having
    waited 16 and 27 s for serial confirmations.  Here every process but the first sleeps confirm_s on its first launch,
    so the one confirmation ends past a budget that the shrink of a simple failure ends well before."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    budget_s, confirm_s = 6.0, 12.0
    body = (slow_fresh_processes(tmp_path, confirm_s) +
            "if (kw['cache_base'] >= 5).any():\n    raise ValueError('a late cache base')")
    record = tmp_path / "record.jsonl"
    # shrink_grace_s=0: no shrinking past the budget, so a finding read after it is shrunk only if its shrink ended
    # before it
    c = Campaign(target=get_target(plant(tmp_path, "slow_confirmation", body)), device="cpu",
                 properties=[get_property("launch")], arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,),
                 seed=4, round_examples=200, isolate=True, launch_timeout_s=120.0, pipeline=1, spare_worker=True,
                 record_path=record, shrink_grace_s=0.0)
    c.run(seconds=budget_s)
    (f,) = c.findings.values()
    assert f.signature == "launch [H*] raised ValueError: a late cache base"
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    failing = [x for x in lines if f.signature in x["signatures"]]
    assert failing[-1]["t"] < budget_s  # the shrink's last failing example came before the budget...
    assert f.first_t > budget_s and c.stats.confirm_wait_s > 0  # ...its confirmation after it, waited for
    assert f.shrunk


@pytest.mark.parametrize("at_once", [1, 2])
def test_confirmations_run_at_once(tmp_path, at_once):
    """Fresh-process confirmations run confirmations_at_once at a time, each in a process and in-flight file of its own.
    On an H100 (run 88) they ran one at a time, 2.6-4.5 s each, and a worker whose edit failed several ways waited
    9-36 s for them.  Here every process but the first sleeps confirm_s on its first launch, and the shrink of the
    first failure (a late cache base with history) meets a second (without history) while the first's confirmation
    sleeps: with two at a time the two confirmations overlap, with one the second starts when the first has ended."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    confirm_s = 5.0
    body = (slow_fresh_processes(tmp_path, confirm_s) +
            "late = kw['cache_base'] >= 5\n"
            "if late.any() and (kw['hist_len'][late] > 0).any():\n    raise ValueError('a late cache base with history')\n"
            "if late.any():\n    raise RuntimeError('a late cache base without history')")
    c = Campaign(target=get_target(plant(tmp_path, "two_confirmations", body)), device="cpu",
                 properties=[get_property("launch")], arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,),
                 seed=4, round_examples=200, isolate=True, launch_timeout_s=120.0, pipeline=1, spare_worker=True,
                 confirmations_at_once=at_once, shrink_grace_s=60.0)
    c.run(examples=200)
    assert sorted(c.findings) == ["launch [H*] raised RuntimeError: a late cache base without history",
                                  "launch [H*] raised ValueError: a late cache base with history"]
    first, second = sorted(c.confirmations(), key=lambda x: x["at"])
    first_end = first["at"] + first["wait_s"] + first["check_s"]
    assert first["check_s"] >= confirm_s and second["check_s"] >= confirm_s  # each in a fresh, sleeping process
    # `at`, wait_s and check_s are each rounded to 1 ms, so first_end is within 3 ms of the first's true end
    if at_once == 2:
        # the second started while the first slept: before its end by more than the rounding (1 s of its 5 s sleep)
        assert second["at"] < first_end - 1.0, (first, second)
    else:
        # one at a time: the second starts after the first's end, its thread handed the task (0.1 s: the rounding
        # and the end of the first's reproduces() after its check, its process closed, are within it)
        assert second["at"] >= first_end - 0.1, (first, second)
    assert c._confirmer is None and not c._worker._repro_procs


def test_confirmations_default(monkeypatch):
    """auto: one confirmation at a time on a CPU; on a CUDA device one per 4 of the process's cores (a fleet process's
    torch_threads), 1 to 3; $GDN_FUZZ_CONFIRMATIONS=N sets N (1 to 4), anything else is an error naming it (and a
    usage error of `gdn-fuzz run`: tests/test_triage.py::test_a_bad_switch_in_the_environment_is_a_usage_error)."""
    from gdn_fuzz.engine.campaign import CONFIRM_ENV, confirmations_default

    monkeypatch.delenv(CONFIRM_ENV, raising=False)
    assert confirmations_default("cpu", None) == 1 and confirmations_default("cpu", 64) == 1
    assert [confirmations_default("cuda", t) for t in (1, 2, 7, 8, 12, 16, 128)] == [1, 1, 1, 2, 3, 3, 3]
    monkeypatch.setenv(CONFIRM_ENV, "2")
    assert confirmations_default("cpu", None) == 2
    for bad in ("0", "5", "many", "-1"):
        monkeypatch.setenv(CONFIRM_ENV, bad)
        with pytest.raises(ValueError, match=f"{CONFIRM_ENV}='{bad}' is not a legal choice; use one of auto, 1, 2, 3, 4"):
            confirmations_default("cuda", None)


def test_a_second_ctrl_c_ends_a_confirmation(tmp_path):
    """A first Ctrl-C lets the confirmation running finish; a second ends it at once (its process is killed) and its
    failure is not filed, nor listed as unconfirmed (there was no answer).  The confirmation here would take 60 s:
    every process but the first sleeps that long on its first launch.  Before: the stop waited for it."""
    import threading

    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    body = (slow_fresh_processes(tmp_path, 60) +
            "if (kw['cache_base'] >= 5).any():\n    raise ValueError('a late cache base')")
    c = Campaign(target=get_target(plant(tmp_path, "slow_confirmation", body)), device="cpu",
                 properties=[get_property("launch")], arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,),
                 seed=4, round_examples=200, isolate=True, launch_timeout_s=120.0, pipeline=1, spare_worker=True)
    told = []

    def press_twice():
        deadline = time.monotonic() + 60
        while not c._worker._repro_procs and time.monotonic() < deadline:  # a confirmation is running
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: the campaign stops at its next example
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGINT)  # the second: while the campaign waits for the confirmation

    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist workers ignore SIGINT
    try:
        presser = threading.Thread(target=press_twice, daemon=True)
        presser.start()
        t0 = time.monotonic()
        c.run(seconds=300, on_first=lambda *a: told.append(a))
        took = time.monotonic() - t0
        presser.join(5)
    finally:
        signal.signal(signal.SIGINT, old)
    assert c.interrupted and c.stats.examples > 1
    assert took < 30, took  # not the confirmation's 60 s
    assert not told and not c.findings and not c.unconfirmed
    assert c._confirmer is None and not c._worker._repro_procs


def test_same_seed_same_findings_and_entries(tmp_path):
    """Determinism (kept): two campaigns with the same seed find the same signatures and write the
    same entries, byte for byte apart from the date they were written."""
    from gdn_fuzz.engine import corpus
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    stored = []
    for run in ("a", "b"):
        c = Campaign(target=get_target("mutant:fold_skipped"), device="cpu", properties=[get_property("launch")],
                     arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=5, round_examples=20,
                     corpus_dir=tmp_path / run)
        c.run(examples=60)
        files = corpus.entries(tmp_path / run)
        stored.append({p.name: {k: v for k, v in json.loads(p.read_text()).items() if k != "date"} for p in files})
        assert list(c.findings) == ["oracle.fold [M7] out of tolerance (flush rows)"]
    assert stored[0] == stored[1] and stored[0]



def test_torch_threads_reach_the_isolated_worker(tmp_path):
    """--torch-threads (Campaign.torch_threads, Worker(torch_threads=)) sets torch's intra-op threads of
    the process that runs the checks: a planted target raises with the count it sees, on a marked case.
    The count asked for is one more than the machine's cores, above torch's default in a fresh process
    (this test process runs at the plugin's one thread), so a worker that ignored it would differ."""
    import os

    threads = (os.cpu_count() or 1) + 1
    target = plant(tmp_path, "threads", "if marked:\n    import torch\n    raise RuntimeError(f'threads={torch.get_num_threads()}')")
    w = Worker(target, "cpu", inflight_dir=tmp_path / "inflight", name="t", torch_threads=threads)
    try:
        found = w.check("launch", MARKED)
    finally:
        w.close()
    assert any(f"threads={threads}" in f.message for f in found), [str(f) for f in found]


def test_default_torch_threads_are_the_cores_other_processes_leave_free():
    """Issue 33: on a CPU a lone campaign process takes the cores that other processes leave free (at least 1), as
    measured at its start (docs/robustness.md: 2 threads 1.5x faster than 1 on an idle 2-core machine, 1 thread 1.6x
    faster than 2 with one core busy)."""
    from gdn_fuzz.environment import default_torch_threads, free_cores

    assert default_torch_threads(lambda: (2, 0.1))[0] == 2
    assert default_torch_threads(lambda: (2, 1.0))[0] == 1
    assert default_torch_threads(lambda: (2, 2.0))[0] == 1  # never 0
    assert default_torch_threads(lambda: (16, 3.4))[0] == 13
    assert default_torch_threads(lambda: None) is None
    got = free_cores(0.2)
    if got is None:
        pytest.skip("no /proc/stat here: the default is torch's own")
    cores, before = got
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        _, busy = free_cores(0.5)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    # every core runs a hog for the whole window, so `busy` is ~cores; the 0.5 core of slack is the scheduler's
    # share of the window that other work (this process's sleep ending, the hogs' start) can take
    assert busy >= cores - 0.5, (cores, before, busy)


def test_write_atomic_leaves_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    """environment.write_atomic (reports, study records, mutated copies): a write that fails before the rename
    leaves the old file whole and no temporary file behind; one that succeeds replaces it."""
    import os

    from gdn_fuzz.environment import write_atomic

    p = tmp_path / "report.html"
    write_atomic(p, "old")
    real = os.replace

    def fail(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(p, "new")
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["report.html"]
    monkeypatch.setattr(os, "replace", real)
    write_atomic(p, "new")
    assert p.read_text() == "new" and sorted(x.name for x in tmp_path.iterdir()) == ["report.html"]


def test_a_run_freezes_what_was_alive_before_it_and_thaws_it_after(monkeypatch):
    """Campaign.run keeps the objects alive at its start out of the cyclic collector's full passes while it runs
    (gc.freeze: a full collection walked the imports too, ~0.1 s each on the CPU machine; FREEZE_GC in
    gdn_fuzz/engine/campaign.py) and hands them back when it ends, also when it stops on an error: a process that
    runs several campaigns (pytest, a notebook) would otherwise keep every cycle made before each run for good.  The
    garbage already made is collected first, not frozen with the rest."""
    import gc
    import weakref

    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    assert gc.get_freeze_count() == 0
    frozen = []

    def make():
        return Campaign(target=get_target("reference"), device="cpu", properties=[get_property("launch")],
                        arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=1, corpus_dir=None,
                        isolate=False)

    class Garbage:  # a cycle nothing else refers to, made before the run: freed by the run's collection, not frozen
        pass

    gc.disable()  # no automatic pass between the cycle's making and the run's start (one would hide the run's own)
    try:
        g = Garbage()
        g.self, gone = g, weakref.ref(g)
        del g
        make().run(examples=3, on_example=lambda: frozen.append((gc.get_freeze_count(), gone() is None)))
    finally:
        gc.enable()
    # the imports alone are ~195,000 objects on the CPU machine (gc.get_freeze_count after a freeze): any count past
    # 1,000 says the run froze them, 0 that it did not
    assert len(frozen) == 3 and min(n for n, _ in frozen) > 1000 and gc.get_freeze_count() == 0
    assert all(freed for _, freed in frozen)

    def boom(*a, **k):
        assert gc.get_freeze_count() > 1000
        raise RuntimeError("a round that fails")

    monkeypatch.setattr(Campaign, "_round", boom)
    with pytest.raises(RuntimeError, match="a round that fails"):
        make().run(examples=3)
    assert gc.get_freeze_count() == 0
