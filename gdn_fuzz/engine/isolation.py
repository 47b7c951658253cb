"""Crash isolation: run property checks in a worker process that may die.

A kernel can kill its process (a segfault), hang, or poison its CUDA context with a sticky
error (illegal address), after which every later launch in that process fails.  So a
campaign with isolation never launches in its own process: it sends (property, case) to a
worker, and the worker writes the case to `<inflight dir>/<pid>-<worker>.json` (pid: the
campaign's) before it launches and removes it when it answers, so that even a crash that takes
the parent down leaves the case on disk (the parent writes it itself when the worker died or
hung without having written it).  When the worker dies, or reports a CUDA error, the check returns a `crash` finding
for that case; when it does not answer within `Worker.timeout_s`, a `hang` finding; either
way the worker is replaced and the campaign goes on; Hypothesis then shrinks the failing
case like any other failure.

Robustness of the fuzzer itself:
  hangs         Worker.timeout_s is settable at any time; derive_timeout() derives it from
                the budget left and the measured launch times (Worker.max_check_s).
  no orphans    the worker asks Linux for SIGKILL when its parent (the forkserver) dies,
                and the forkserver exits when the campaign dies (its "alive" pipe closes);
                the resource tracker exits once its last holder is gone.  A campaign killed
                by SIGTERM or SIGKILL therefore leaves no process behind.
  recycling     the worker is closed and restarted before the next check when its resident
                memory passes max_rss_mb (env GDN_FUZZ_WORKER_MAX_RSS_MB) or after
                max_checks checks.
  environment   an allocation failure is a `resource` finding (never a kernel bug) and
                recycles the worker; a missing device, a worker that cannot start or an
                in-flight file that cannot be written raises SetupError (exit 2).
  files         in-flight files are per process; without inflight_dir a private temporary
                directory is used and removed by close().
  sent ahead    submit() sends a check without waiting and collect() takes the answers, oldest
                first: the worker checks one case at a time, so the next case can be on its way
                (and the campaign drawing the one after) while this one runs.  A crash or a hang is
                the oldest unanswered case's; the cases sent after it never ran, and are sent
                again to the fresh worker.
  drawn ahead   with a case sent ahead, the worker takes it from the pipe as the check before it
                waits for its verdict on the device, and draws it then (Worker.draw_ahead,
                $GDN_FUZZ_DRAW_AHEAD; the launch property's prepare: no code of the target runs).

Workers are started by a forkserver that has imported torch and gdn_fuzz but never touched
CUDA, so a restart costs a fork, not a fresh interpreter (the target module and its JIT
cache are per worker, and are rebuilt after a crash).
"""

from __future__ import annotations

import collections
import importlib
import itertools
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import LEGAL_T, Case
from gdn_fuzz.prefix_case import load_case
from gdn_fuzz import environment, graphs
from gdn_fuzz.environment import write_atomic
from gdn_fuzz.checks import OraclePrep
from gdn_fuzz.findings import Finding, Findings, normalize_message, raised
from gdn_fuzz.properties import get_property
from gdn_fuzz.targets import get_target
from gdn_fuzz.engine import mps

_CTX = None
# (the MPS ones, cudaErrorMps*: "the MPS client has been terminated by the server ... the process must be terminated
# and relaunched", "the MPS server is not ready ...", whichever library's words carry them: gdn_fuzz.engine.mps)
CUDA_FATAL = ("illegal memory access", "an illegal instruction", "unspecified launch failure",
              "misaligned address", "CUDA error", "cudaError", "CUDA_ERROR", "MPS client", "MPS server")
# an allocation failed: the machine, not the kernel (compared case-insensitively)
OUT_OF_MEMORY = ("MemoryError", "OutOfMemoryError", "out of memory", "can't allocate memory", "DefaultCPUAllocator")
# the device is missing or unusable: a setup problem, the run cannot go on (exit 2)
NO_DEVICE = ("Torch not compiled with CUDA enabled", "no CUDA GPUs are available", "Found no NVIDIA driver",
             "CUDA driver version is insufficient", "invalid device ordinal")

MEASURE = "measure:"  # a message naming a measurement (Worker.measure: "measure:MODULE:FUNCTION"), not a property
MAX_RSS_ENV = "GDN_FUZZ_WORKER_MAX_RSS_MB"
DEFAULT_MAX_RSS_MB = 8192.0  # 8 GiB
DEFAULT_MAX_CHECKS = 2000
# A recycle by check count waits until the worker has lived RECYCLE_AMORTIZE times what its own start cost (its
# 'ready' plus its first check): so recycling takes at most 1/RECYCLE_AMORTIZE (2%) of the campaign.  Before, a
# CUDA worker that checked ~110 launches a second hit 2,000 checks every ~18 s and its successor's first check
# took 3.1-4.9 s with no JIT compile counted: 12-19% of a 30 s campaign (H100, runs 80-81).  On the CPU machine a
# worker's start cost ~2.8 s, so a worker of 20 ms checks is recycled after ~140 s instead of ~40 s.  The memory
# limit stays immediate.
RECYCLE_AMORTIZE = 50.0
DEFAULT_TIMEOUT_S = 600.0  # until the campaign derives one from measured launches
DEFAULT_START_TIMEOUT_S = 300.0  # a fresh worker: fork + target lookup (the first forkserver imports torch)
TIMEOUT_FLOOR_S = 30.0
TIMEOUT_FACTOR = 20.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_SOLO_SIGNAL = {signal.SIGKILL: " (gdn_fuzz did not send it: often the kernel's out-of-memory killer)"}


class SetupError(RuntimeError):
    """The environment cannot run checks (no device, a worker that cannot start, a full disk):
    not a finding about the kernel.  The message is one line; callers exit with status 2."""


def derive_timeout(budget_left_s: float | None, measured_s: float | None, floor_s: float = TIMEOUT_FLOOR_S,
                   factor: float = TIMEOUT_FACTOR, first_s: float = DEFAULT_TIMEOUT_S) -> float:
    """The per-launch timeout after which a check is called a hang.

        timeout = max(floor_s, min(budget_left_s, factor * measured_s))

    measured_s   the slowest check measured so far, JIT compiles included (Worker.max_check_s):
                 a later case may compile a new shape, so the slowest check, not the typical
                 one, is what a healthy launch may take.  None (nothing measured yet: the first
                 launch pays the target import and its compile) uses first_s instead of
                 factor * measured_s.
    factor       20: a healthy launch is never 20 times slower than the slowest one seen.
    budget_left_s  a hang never holds the campaign past its budget (None: no cap).
    floor_s      30 s: never less, so a short remaining budget or a fast first launch cannot
                 turn a slow but healthy launch (a compile, a busy GPU) into a false hang.
    """
    base = first_s if measured_s is None else factor * max(float(measured_s), 0.0)
    if budget_left_s is not None:
        base = min(base, float(budget_left_s))
    return max(float(floor_s), base)


# The CUDA errors of a kernel that dereferenced an address it may not, as one outcome class: which of
# them an out-of-bounds access raises depends on where the stray address falls, i.e. on the allocations
# made before the launch, not on the case (seen on an H200: the same corpus entry raised 700, then 717
# after materialize allocated differently; docs/h200-results.md, run 27).
BAD_ADDRESS = ("illegal memory access",  # cudaErrorIllegalAddress (700)
               "operation not supported on global/shared address space")  # cudaErrorInvalidAddressSpace (717)


def fatal_outcome(text: str) -> str:
    """The outcome class of a sticky CUDA error: the error's own words (the first CUDA_FATAL marker
    that names one; every BAD_ADDRESS error is 'illegal memory access'), whichever way it reached the
    parent (a raised exception, or a finding whose message quotes it), else the normalized first line."""
    low = text.lower()
    if any(m in low for m in BAD_ADDRESS):
        return f"crash: fatal CUDA error: {BAD_ADDRESS[0]}"
    for marker in CUDA_FATAL[:4]:  # the markers that name the error
        if marker in low:
            return f"crash: fatal CUDA error: {marker}"
    return f"crash: fatal CUDA error: {normalize_message(text)}"


def classify(text: str) -> str | None:
    """'setup' (no device), 'resource' (out of memory), 'fatal' (a sticky CUDA error) or None."""
    low = text.lower()
    if any(s.lower() in low for s in NO_DEVICE):
        return "setup"
    if any(s.lower() in low for s in OUT_OF_MEMORY):
        return "resource"
    if any(s in text for s in CUDA_FATAL):
        return "fatal"
    return None


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line[:limit]


def _context():
    global _CTX
    if _CTX is None:
        methods = mp.get_all_start_methods()
        _CTX = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        if "forkserver" in methods:
            _CTX.set_forkserver_preload(["torch", "hypothesis", "gdn_fuzz.checks", "gdn_fuzz.properties"])
    return _CTX


def parent_death_signal(sig):
    """On Linux, a function arm(parent_pid) -> bool that asks the kernel to send `sig` to the calling
    process when its parent dies (prctl PR_SET_PDEATHSIG) and says whether `parent_pid` is still its
    parent (False: the parent died before prctl took effect; the caller exits).  None elsewhere or when
    libc has no prctl.  libc is looked up here, so arm() itself is safe in a forked child before exec
    (a subprocess preexec_fn: gdn_fuzz.engine.multigpu)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm(parent_pid: int) -> bool:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        return os.getppid() == parent_pid
    return arm


def _die_with_parent(campaign_pid: int) -> None:
    """SIGKILL this worker when its parent (the forkserver, or the campaign under spawn) dies.

    The forkserver exits when the campaign dies (EOF on its 'alive' pipe), so the worker goes
    too, even in the middle of a hung launch.  A parent that died before prctl took effect is
    caught by the checks after it.
    """
    # A forkserver child inherits the write end of the forkserver's 'alive' pipe (Python keeps
    # it for children that start forkserver processes of their own; this one never does).
    # Holding it would keep the forkserver alive after the campaign dies, and the forkserver
    # keeps this worker alive: close it, so the campaign's death ends both.
    from multiprocessing import forkserver

    alive_fd = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None)
    if alive_fd is not None:
        try:
            os.close(alive_fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None
    arm = parent_death_signal(signal.SIGKILL)
    if arm is not None and not arm(os.getppid()):
        os._exit(0)
    try:
        os.kill(campaign_pid, 0)
    except ProcessLookupError:
        os._exit(0)
    except PermissionError:
        pass


def oracle_to_prepare(target, device: str, arms, Ts) -> tuple[tuple, tuple] | None:
    """(arms, Ts) of the oracle compiles a worker starts when it reports ready (checks.OraclePrep), or None:
    the flush oracle for the arms and T the worker's checks can draw, on CUDA, for a flush-kernel target; nothing
    for a materializer (its oracle is torch: nothing to compile), nor where the target cannot launch."""
    if not str(device).startswith("cuda") or target.kernel != "flush" or target.unavailable_reason(device) is not None:
        return None
    return tuple(arms), tuple(Ts)


def _prep_failed(conn, prep) -> bool:
    """Did the oracle's compile on the worker's thread (checks.OraclePrep) fail?  Then say so and end the worker: a
    sticky CUDA error is the check's crash (the target's launch faulted while the thread compiled: every later GPU
    call of the process fails with it, the thread's included; measured on the H200, run 66); anything else is a
    setup error (no check can be judged without the oracle)."""
    if prep is None or prep.error is None:
        return False
    if classify(prep.error) == "fatal":
        conn.send(("fatal", dict(text=prep.error, outcome="crash"), 0))
        os._exit(3)
    conn.send(("setup", f"the fused oracle's kernel did not compile: {prep.error}", 0))
    return True


def _worker_main(conn, target_name: str, device: str, campaign_pid: int | None = None,
                 torch_threads: int | None = None, oracle_arms=ARM_NAMES, oracle_Ts=LEGAL_T,
                 mps_pipe: str | None = None, ahead_on: bool = False) -> None:
    """Handshake ('ready' | 'setup'), then loop: receive (property, case dict), run the check,
    send (kind, payload, compiles) with kind 'ok' | 'error' | 'fatal' | 'setup' (the oracle did not compile:
    the worker ends).  torch_threads: torch's intra-op threads in this worker (None: torch's default, every
    core); oracle_arms / oracle_Ts: the oracle compiles started at 'ready' on a thread (oracle_to_prepare,
    checks.OraclePrep); mps_pipe: the pipe folder of the run's MPS daemon (gdn_fuzz.engine.mps), set before anything
    starts CUDA in this process (None: the environment as inherited); ahead_on: draw a case sent ahead while the
    check before it ends (Worker.draw_ahead)."""
    _die_with_parent(os.getppid() if campaign_pid is None else campaign_pid)
    if mps_pipe:
        os.environ[mps.PIPE_ENV] = mps_pipe
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    # Ctrl-C reaches the whole process group: the parent stops the campaign and closes this
    # worker; dying here first would look like a crash of the case in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0 = time.monotonic()
    try:
        target = get_target(target_name)
        t1 = time.monotonic()
        to_prepare = oracle_to_prepare(target, device, oracle_arms, oracle_Ts)
        # the oracle's compiles run on a thread while the first check's target compiles; its oracle calls wait
        prep = None if to_prepare is None else OraclePrep(device, *to_prepare)
        if prep is not None:
            prep.gate.on_wait = lambda waiting: conn.send(("oracle-wait" if waiting else "oracle-waited", None, 0))
    except Exception as e:  # noqa: BLE001 - the parent raises SetupError with it
        conn.send(("setup", f"{type(e).__name__}: {e}", 0))
        return
    # at: this process's monotonic clock (CLOCK_MONOTONIC, one clock for every process of the machine), so that the
    # parent's ready_s is the start's, not when it read the message (a spare worker's is read later)
    conn.send(("ready", dict(target_s=round(t1 - t0, 3), at=time.monotonic()), 0))
    arms_seen: set = set()  # compiles are counted over every arm this worker loaded
    cuda = str(device).startswith("cuda")
    ahead = None  # the next message, received while a check ended (_Ahead)
    while True:
        if ahead is not None:
            msg, pre, ahead = ahead.msg, ahead, None
        else:
            try:
                msg = conn.recv()
            except EOFError:
                return
            pre = None
        if msg is None:
            return
        prop_name, text, inflight = msg
        # the worker's own seconds for this check (_itself) count what it drew ahead for it
        t_got = time.perf_counter() - (0.0 if pre is None else pre.seconds)
        try:
            try:
                write_atomic(inflight, text)  # all of the text or no file, before the launch
            except FileNotFoundError:  # its folder was removed since the campaign made it: made again
                os.makedirs(os.path.dirname(inflight), exist_ok=True)
                write_atomic(inflight, text)
        except OSError as e:  # the parent raises SetupError with it
            conn.send(("inflight", f"cannot save the in-flight case to {inflight}: {e}", 0))
            continue
        try:
            case = load_case(json.loads(text)["case"]) if pre is None or pre.case is None else pre.case
            arms_seen.add(case.arm)
            done = None
            if prop_name.startswith(MEASURE):  # a measurement (Worker.measure): no findings, its numbers
                module, _, name = prop_name[len(MEASURE):].partition(":")
                found = Findings()
                found.metrics = getattr(importlib.import_module(module), name)(target, case, device)
            else:
                prop = get_property(prop_name)
                if ahead_on and prop.begin is not None:
                    finish = prop.begin(target, case, device, None if pre is None else pre.ready)
                    done = _event() if cuda else None
                    ahead = _draw_ahead(conn, device)
                    found = finish()
                else:
                    found = prop.check(target, case, device)
            if cuda:
                import torch

                # surface asynchronous kernel faults here, not in the next case: the whole device, or, with the next
                # case drawn ahead (its draw queued behind this check on the stream), everything up to its draw
                if ahead is not None and ahead.ready is not None:
                    done.synchronize()
                else:
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported, and fatal ones end the worker
            said = f"{type(e).__name__}: {e}"
            fatal = classify(said) == "fatal"
            if not fatal and _prep_failed(conn, prep):
                return
            if not fatal:
                Path(inflight).unlink(missing_ok=True)  # answered: a crash or a hang leaves the file
            conn.send(("fatal" if fatal else "error", dict(text=said, outcome=raised(e), **_itself(t_got)), 0))
            if fatal:
                os._exit(3)
            continue
        fatal_in = [f for f in found if classify(f.message) == "fatal"]
        if not fatal_in and _prep_failed(conn, prep):
            return
        if not fatal_in:
            Path(inflight).unlink(missing_ok=True)  # answered: a crash or a hang leaves the file
        conn.send(("fatal" if fatal_in else "ok",
                   dict(findings=[dict(f.__dict__) for f in found], metrics=getattr(found, "metrics", None),
                        graphs=graphs.counts(), oracle=None if prep is None else prep.report(),
                        drawn_ahead=pre is not None and pre.ready is not None, **_itself(t_got)),
                   sum(target.compile_count(a) for a in arms_seen)))
        if fatal_in:
            os._exit(3)


DRAW_AHEAD_ENV = "GDN_FUZZ_DRAW_AHEAD"


def draw_ahead_default(device: str) -> bool:
    """Does an isolated worker draw the next case while the device ends this one's check ($GDN_FUZZ_DRAW_AHEAD)?
    off (default), on.  Only for a property with begin and prepare (the launch property), and only when the next
    case is in the pipe already (sent ahead: deferred verdicts).  Then the worker takes it from the pipe before it
    answers this one, and draws it (prepare: materialize and the "before" copy, no code of the target); the
    in-flight file, the launch and the answers keep their order.  A draw that raises is dropped and made again in the
    case's own turn, so an error (an asynchronous fault of this check's kernel, surfacing in the draw) is the check's
    that caused it.  Off by default: on an H100 (run 90) one deferred process with 4 value seeds per structure
    checked 7,271 and 8,619 per 30 s with it, 7,763 and 7,713 without it and 7,714 and 8,233 in the tree before it
    (the worker then waited for the campaign process ~0.6 ms per example, so a faster worker could not show;
    docs/benchmarks.md, "Issue 32, seventeenth part")."""
    which = environment.choice(DRAW_AHEAD_ENV, ("off", "on"), "off: each case drawn in its own turn; on: an isolated "
                               "worker draws a case sent ahead while the check before it ends")
    return which == "on"


@dataclass
class _Ahead:
    """The next message, taken from the pipe while a check ended: msg None is the end (None sent, or the pipe
    closed); case and ready: its case and prepare's result (None: not drawn ahead); seconds: the draw's."""

    msg: tuple | None
    case: Case | None = None
    ready: object = None
    seconds: float = 0.0


def _event():
    """A CUDA event recorded on the current stream now."""
    import torch

    ev = torch.cuda.Event()
    ev.record()
    return ev


def _draw_ahead(conn, device: str) -> _Ahead | None:
    """The next message if one is in the pipe (None: none is), its case drawn ahead where its property can
    (Property.prepare)."""
    if not conn.poll(0):
        return None
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return _Ahead(None)
    if msg is None or msg[0].startswith(MEASURE):
        return _Ahead(msg)
    t0 = time.perf_counter()
    try:
        prop = get_property(msg[0])
        if prop.prepare is None:
            return _Ahead(msg)
        case = load_case(json.loads(msg[1])["case"])
        return _Ahead(msg, case, prop.prepare(case, device), time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 - drawn again in its own turn, where its error is its own
        return _Ahead(msg)


def _itself(t_got: float) -> dict:
    """What a worker says of itself with each answer: its resident memory (read here, so that the campaign process
    reads no /proc file per check) and its own seconds for the check since it got the message (worker_s)."""
    return dict(rss_mb=_rss_mb(os.getpid()), worker_s=time.perf_counter() - t_got)


def _rss_mb(pid: int) -> float | None:
    """Resident set size of `pid` in MiB from /proc/<pid>/statm (None where unreadable)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            resident = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


def _env_max_rss_mb() -> float:
    raw = os.environ.get(MAX_RSS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_RSS_MB
    try:
        val = float(raw)
    except ValueError:
        raise SetupError(f"{MAX_RSS_ENV}={raw!r} is not a number of MiB") from None
    if not val > 0:
        raise SetupError(f"{MAX_RSS_ENV}={raw!r} must be a positive number of MiB")
    return val


@dataclass
class _Sent:
    """A check for the worker: its in-flight file's text, and when it was sent to the live process (None: not yet,
    or again after that process ended)."""

    prop: str
    case: Case
    text: str
    tag: object = None  # the caller's, returned by collect()
    sent_at: float | None = None


class Worker:
    """One isolated worker for a target on a device; restarts itself after a crash or a hang.

    timeout_s      seconds a check may take before it is a hang (settable at any time, see
                   derive_timeout() and auto_timeout())
    max_rss_mb     recycle the worker (close it, start a fresh one for the next check) once its
                   resident memory passes this many MiB; None: $GDN_FUZZ_WORKER_MAX_RSS_MB,
                   else 8192
    max_checks     recycle the worker after this many checks (None or 0: never), once it has also lived
                   recycle_amortize times its own start's cost (RECYCLE_AMORTIZE; 0: at max_checks)
    inflight_dir   where the in-flight case is written before each launch; None: a private
                   temporary directory, removed by close()
    spare          keep a fresh process starting for reproduces() (see confirmations)
    mps_pipe       the pipe folder of the run's MPS daemon (gdn_fuzz.engine.mps): the worker's processes are its
                   clients until a crash or a hang, after which this Worker leaves MPS for good and checks that
                   case again in a process of its own CUDA context, whose result is the check's (check()); the
                   spare and the confirmations never use it.  None: no MPS of gdn_fuzz's

    Measured: last_check_s, max_check_s, median_check_s (seconds from send to answer of the
    checks that answered, compiles included), last_rss_mb.  Counters: restarts (after a
    crash or a hang), recycles (memory or check count), checks.
    """

    def __init__(self, target_name: str, device: str, inflight_dir: Path | None = None, name: str = "w0",
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_rss_mb: float | None = None,
                 max_checks: int | None = DEFAULT_MAX_CHECKS, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 torch_threads: int | None = None, oracle_arms=ARM_NAMES, oracle_Ts=LEGAL_T, spare: bool = False,
                 recycle_amortize: float = RECYCLE_AMORTIZE, mps_pipe: str | None = None,
                 draw_ahead: bool | None = None):
        self.target_name, self.device, self.name = target_name, device, name
        # the worker draws a case sent ahead while the check before it ends (None: draw_ahead_default, read here)
        self.draw_ahead = draw_ahead_default(device) if draw_ahead is None else bool(draw_ahead)
        self.mps_pipe = mps_pipe or None
        # when and why this Worker left MPS (None: it did not), and each check of a case again in its own context
        self.mps_left: dict | None = None
        self.mps_rechecks: list[dict] = []
        self.recycle_amortize = float(recycle_amortize)
        # spare: keep a second, fresh process starting in the background (from this one's 'ready' on), so that
        # reproduces() finds one ready instead of waiting for a process start (~5-13 s on the H200, run 63)
        self.spare = spare
        self._spare: Worker | None = None
        # reproduces() may run on another thread than check() (the campaign confirms a new failure beside its rounds'
        # checks): taking, starting and closing the spare hold this lock
        self._spare_lock = threading.Lock()
        # the processes of the confirmations running (reproduces, on the campaign's confirmer threads: several at
        # once), for abort_reproduce(); each has a Worker of its own name, so its own in-flight file (_fresh)
        self._repro_procs: set = set()
        self._repro_ids = itertools.count(1)
        self._ready = False  # the process reported 'ready' (spawn() starts one without waiting)
        self._spawned_at = 0.0
        # one entry per reproduces(): spare (a spare process was there), wait_s (until that process was ready),
        # check_s (the check itself), ready_s (the process's start to its 'ready') and at (its start: time.monotonic(),
        # one clock for every process of the machine)
        self.confirmations: list[dict] = []
        self.oracle_arms, self.oracle_Ts = tuple(oracle_arms), tuple(oracle_Ts)  # compiled before 'ready' (CUDA)
        self.torch_threads = torch_threads
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.max_rss_mb = _env_max_rss_mb() if max_rss_mb is None else float(max_rss_mb)
        self.max_checks = max_checks
        self._private_dir = inflight_dir is None
        if self._private_dir:
            self.inflight_dir = Path(tempfile.mkdtemp(prefix="gdn_fuzz_inflight-"))
            # removed by close(), or at interpreter exit when close() was never called
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.inflight_dir), True)
        else:
            self.inflight_dir = Path(inflight_dir)
            self.inflight_dir.mkdir(parents=True, exist_ok=True)
            self._cleanup = None
        self._owner_pid = os.getpid()
        self._inflight_text: str | None = None  # the in-flight file's text of the check last sent
        self.last_worker_s: float | None = None  # the worker's own seconds for the last check (no round trip)
        self.drawn_ahead = 0  # checks answered whose case the worker drew ahead (self.draw_ahead)
        # one entry per worker process started: seconds from the start to 'ready' (ready_s), of which loading the
        # target (target_s); the oracle's compiles on the worker's thread (oracle_s) and how long checks waited
        # for them (oracle_wait_s); the first check's seconds and JIT compiles (first_check_s,
        # first_check_compiles): where a campaign's first seconds go (issue 32)
        self.startups: list[dict] = []
        self.restarts = 0
        self.recycles = 0
        self.last_recycle_reason = ""
        self.compiles = 0  # JIT compiles of every worker so far (finished workers' plus the live one's)
        self._compiles_before = 0  # compiles of the workers that ended (restarts, recycling)
        self._graphs_before: dict = {}  # gdn_fuzz.graphs counts of the workers that ended
        self._graphs_live: dict = {}  # ... and of the live one, as of its last answer
        self.checks = 0
        self.last_check_s: float | None = None
        self.max_check_s: float | None = None
        self._times: collections.deque = collections.deque(maxlen=1001)
        self.last_rss_mb: float | None = None
        self._proc = None
        self._conn = None
        self._checks_in_worker = 0
        self._busy = False  # a check was sent and not answered
        self._last_finished = True
        # checks submitted and not collected, oldest first; the ones sent to the live process come first (_stop
        # marks them unsent: that process will not answer them)
        self._queue: collections.deque[_Sent] = collections.deque()
        self._answered_at = 0.0  # when the last answer came: the next check sent ahead started no earlier

    # ---------------------------------------------------------------- state

    @property
    def inflight_path(self) -> Path:
        return self.inflight_dir / f"{self._owner_pid}-{self.name}.json"

    @property
    def pid(self) -> int | None:
        """The running worker process's pid (None when none runs)."""
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    @property
    def median_check_s(self) -> float | None:
        return statistics.median(self._times) if self._times else None

    def auto_timeout(self, budget_left_s: float | None, floor_s: float = TIMEOUT_FLOOR_S) -> float:
        """Set timeout_s from the budget left and the slowest check measured (derive_timeout)."""
        self.timeout_s = derive_timeout(budget_left_s, self.max_check_s, floor_s=floor_s)
        return self.timeout_s

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- process

    def start(self) -> None:
        """Start the worker process now and wait until it is ready (check() does it when needed); raises
        SetupError when the worker cannot start (the target cannot be loaded, the process dies or stalls).
        A process spawn() started is waited for, not started again."""
        if self._proc is not None and self._proc.is_alive() and self._ready:
            return
        if self._proc is None or not self._proc.is_alive():
            self._stop(kill=True)
            self._make_inflight_dir()
            self.spawn()
        self._await_ready()
        if self.spare:
            self._spawn_spare()

    def spawn(self) -> None:
        """Start the worker process without waiting for it (start() or check() waits for its 'ready')."""
        if self._proc is not None and self._proc.is_alive():
            return
        spawned_at = time.monotonic()
        ctx = _context()
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, self.target_name, self.device, os.getpid(),
                                                      self.torch_threads, self.oracle_arms, self.oracle_Ts,
                                                      self.mps_pipe, self.draw_ahead),
                           daemon=True)
        proc.start()
        child.close()
        self._take(proc, parent, spawned_at)

    def _take(self, proc, conn, spawned_at: float) -> None:
        """This Worker's process is now `proc` (just spawned, or the spare adopted), not yet waited for."""
        self._spawned_at = spawned_at
        self._proc, self._conn = proc, conn
        self._ready = False
        self._compiles_before = self.compiles  # a fresh worker counts its own compiles from 0
        self._graphs_before = graphs.add_counts(self._graphs_before, self._graphs_live)
        self._graphs_live = {}
        self._checks_in_worker = 0
        self._busy = False

    def _await_ready(self) -> None:
        proc, parent = self._proc, self._conn
        deadline = self._spawned_at + self.start_timeout_s
        why = None
        while why is None:
            if parent.poll(0.05):
                try:
                    kind, payload, _ = parent.recv()
                except (EOFError, OSError):  # the process is gone or going
                    proc.join(timeout=5)
                    why = f"died while starting ({self._exit_words(proc)[0]})"
                    continue
                if kind == "ready":
                    self._ready = True
                    payload = dict(payload or {})
                    at = min(payload.pop("at", None) or time.monotonic(), time.monotonic())
                    self.startups.append(dict(ready_s=round(at - self._spawned_at, 3), **payload))
                    return
                why = f"could not load target {self.target_name!r}: {_first_line(payload)}"
            elif not proc.is_alive():
                why = f"died while starting ({self._exit_words(proc)[0]})"
            elif time.monotonic() > deadline:
                why = f"did not start within {self.start_timeout_s:.0f} s"
        self._stop(kill=True)
        raise SetupError(f"the gdn_fuzz worker for target {self.target_name} on {self.device} {why}")

    def _fresh(self) -> "Worker":
        """A Worker of the same target and settings, for one check in a fresh process (reproduces).  Each has a name
        of its own (NAME-reproN), so confirmations that run at once write their own in-flight files."""
        return Worker(self.target_name, self.device, inflight_dir=self.inflight_dir,
                      name=f"{self.name}-repro{next(self._repro_ids)}",
                      timeout_s=self.timeout_s, max_rss_mb=self.max_rss_mb, max_checks=None,
                      start_timeout_s=self.start_timeout_s, torch_threads=self.torch_threads,
                      oracle_arms=self.oracle_arms, oracle_Ts=self.oracle_Ts)

    def _spawn_spare(self) -> None:
        """Start a spare process unless one is there (or a confirmation on another thread started one)."""
        with self._spare_lock:
            if self._spare is None:
                self._spare = self._fresh()
                self._spare.spawn()

    def _take_spare(self) -> "Worker | None":
        """The spare, now no longer this Worker's (None when there is none)."""
        with self._spare_lock:
            sp, self._spare = self._spare, None
        return sp

    def _stop(self, kill: bool = False) -> None:
        """End the worker process: politely when idle, SIGKILL when busy, hung or `kill`."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn = None, None
        self._ready = False
        for q in self._queue:  # that process answers none of them: sent again to the next one
            q.sent_at = None
        if proc is None:
            return
        if not (kill or self._busy):
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        if conn is not None:
            conn.close()
        self._busy = False

    def _recycle(self, why: str) -> None:
        self.recycles += 1
        self.last_recycle_reason = why
        self._stop()

    def close(self) -> None:
        """End the worker; remove the in-flight file when its check finished (and the private
        in-flight directory, if this Worker made one) and its spare."""
        sp = self._take_spare()
        if sp is not None:
            sp.close()
        self._queue.clear()  # submitted and never collected: not checked
        self._stop(kill=self._busy)
        if self._last_finished:
            self.inflight_path.unlink(missing_ok=True)
        if self._cleanup is not None:
            self._cleanup()  # rmtree, once

    # ---------------------------------------------------------------- files

    def _make_inflight_dir(self) -> None:
        """The in-flight directory exists (made again for a process started after close(); a worker whose folder was
        removed while it ran makes it again itself)."""
        if self._private_dir and not self._cleanup.alive:  # used again after close()
            self.inflight_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.inflight_dir), True)
        try:
            self.inflight_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SetupError(f"cannot save the in-flight case to {self.inflight_path}: {e}") from e

    def _inflight_saved(self) -> None:
        """A worker that died or hung before its own write still leaves the case on disk."""
        if self._inflight_text is not None and not self.inflight_path.exists():
            try:
                write_atomic(self.inflight_path, self._inflight_text)
            except OSError as e:
                raise SetupError(f"cannot save the in-flight case to {self.inflight_path}: {e}") from e

    # ---------------------------------------------------------------- findings

    @staticmethod
    def _exit_words(proc) -> tuple[str, str]:
        """(message words, outcome) for a dead worker process."""
        code = proc.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return (f"was killed by signal {name}{_SOLO_SIGNAL.get(-code, '')}",
                    f"crash: killed by signal {name}")
        return f"exited with code {code}", f"crash: exited with code {code}"

    def _died(self, prop: str, why: str, outcome: str) -> list[Finding]:
        self.restarts += 1
        self._stop(kill=True)
        self._last_finished = False
        self._inflight_saved()
        return [Finding("crash", "R*", f"the worker process {why} while checking property {prop!r}; "
                        f"the case was saved before the launch at {self.inflight_path}", outcome=outcome)]

    def _hang(self, prop: str) -> list[Finding]:
        self.restarts += 1
        self._stop(kill=True)
        self._last_finished = False
        self._inflight_saved()
        return [Finding("hang", "R*", f"the check of property {prop!r} did not answer within the "
                        f"{self.timeout_s:.3g} s timeout; the worker was killed (a fresh one takes the next "
                        f"check) and the case was saved before the launch at {self.inflight_path}",
                        outcome="hang")]

    def _resource(self, prop: str, text: str) -> list[Finding]:
        self._recycle("out of memory")
        return [Finding("resource", "-", f"the check of property {prop!r} ran out of memory "
                        f"({_first_line(text, 200)}); not a kernel finding: the worker was recycled",
                        outcome="resource: out of memory")]

    def _setup(self, text: str):
        self._stop(kill=True)
        raise SetupError(f"device {self.device!r} is not usable for target {self.target_name}: {_first_line(text)}")

    def _measured(self, dt: float) -> None:
        if self._checks_in_worker == 0 and self.startups:
            self.startups[-1].update(first_check_s=round(dt, 3), first_check_compiles=self.compiles - self._compiles_before)
        self.last_check_s = dt
        self.max_check_s = dt if self.max_check_s is None else max(self.max_check_s, dt)
        self._times.append(dt)
        self._checks_in_worker += 1
        self.checks += 1
        rss = self.last_rss_mb
        if rss is not None and rss > self.max_rss_mb:
            self._recycle(f"resident memory {rss:.0f} MiB > {self.max_rss_mb:.0f} MiB")
        elif self.max_checks and self._checks_in_worker >= self.max_checks and self._start_paid_for():
            self._recycle(f"{self._checks_in_worker} checks in one worker")

    def _answered(self, payload: dict) -> None:
        """What the worker said of itself with an answer (_itself)."""
        self.last_rss_mb, self.last_worker_s = payload.get("rss_mb"), payload.get("worker_s")
        self.drawn_ahead += bool(payload.get("drawn_ahead"))

    def _start_paid_for(self) -> bool:
        """Has the live worker lived recycle_amortize times what its start cost (ready_s + first_check_s)?"""
        st = self.startups[-1] if self.startups else {}
        cost = (st.get("ready_s") or 0.0) + (st.get("first_check_s") or 0.0)
        return time.monotonic() - self._spawned_at >= self.recycle_amortize * cost

    # ---------------------------------------------------------------- checks

    def check(self, prop: str, case: Case) -> list[Finding]:
        """Run property `prop` on `case` in the worker; the findings (a crash, a hang and an
        allocation failure are findings too).  Raises SetupError when the environment cannot
        run it (no device, a worker that cannot start, an in-flight file that cannot be written).

        Under MPS (mps_pipe) a crash or a hang may be another client's fault delivered to this one, and a worker
        that cannot start may meet a server that refuses clients after such a fault: either way this Worker leaves
        MPS for good and the case is checked again in a process of its own CUDA context, whose findings are returned."""
        return self._mps_guarded(prop, case, lambda: self._check_once(prop, case))

    def submit(self, prop: str, case: Case, tag=None) -> None:
        """Send a check of property `prop` on `case` to the worker without waiting for its answer; collect() returns
        the answers, oldest first, each with its `tag` (the caller's own, e.g. what it counted the check as).  The worker checks one case at a time: a case submitted while another runs waits
        in the pipe, so that the worker starts it the moment it answers the one before, while the caller draws the
        next.  Raises SetupError as check() does (a worker that cannot start)."""
        p = _Sent(prop, case, self._text(prop, case), tag)
        self._queue.append(p)
        try:
            self._send_queued()
        except BaseException:  # not submitted (a worker that cannot start, a Ctrl-C): never sent later by mistake
            if p.sent_at is None:
                self._queue.remove(p)
            raise

    @property
    def pending(self) -> int:
        """Checks submitted and not collected yet."""
        return len(self._queue)

    def collect(self) -> tuple[str, Case, list[Finding], object]:
        """(prop, case, findings, tag) of the oldest check submitted and not collected, waiting for its answer; the
        findings are check()'s for that case (under MPS as well).  A crash or a hang is that case's: the cases
        submitted after it did not run, and go to the fresh worker."""
        if not self._queue:
            raise RuntimeError("Worker.collect(): no check was submitted (submit() one first)")
        p = self._queue.popleft()
        return p.prop, p.case, self._mps_guarded(p.prop, p.case, lambda: self._answer(p)), p.tag

    def _mps_guarded(self, prop: str, case: Case, run) -> list[Finding]:
        """check()'s MPS rule around `run` (the check of `case`)."""
        if self.mps_pipe is None:
            return run()
        try:
            found = run()
        except SetupError as e:  # a real setup error raises again without MPS
            return self._off_mps(prop, case, f"setup: {_first_line(str(e), 200)}")
        bad = sorted({f.outcome for f in found if f.prop in ("crash", "hang")})
        return self._off_mps(prop, case, ", ".join(bad)) if bad else found

    def _off_mps(self, prop: str, case: Case, seen: str) -> list[Finding]:
        """Leave MPS (mps_pipe = None from now on; the live process, if any, is ended) and check the case again in
        a process of its own CUDA context: its findings are the check's.  That process is the spare, when one was
        started (it never used MPS, and has started already: run 87 measured 4.2-6.1 s per check again in a new
        process on an H100); a new spare starts behind it."""
        self.mps_left = dict(after_checks=self.checks, seen=seen)
        self.mps_pipe = None
        self._stop(kill=True)
        t0 = time.monotonic()
        spare = self._adopt_spare()
        found = self._check_once(prop, case)
        self.mps_rechecks.append(dict(seen=seen, spare=spare, s=round(time.monotonic() - t0, 3),
                                      found=sorted({f.signature() for f in found})))
        return found

    def _adopt_spare(self) -> bool:
        """Make the spare's process this Worker's own (no process is started for it); False when there is none."""
        sp = self._take_spare()
        if sp is None or sp._proc is None or not sp._proc.is_alive():
            if sp is not None:
                sp.close()
            return False
        # a spare is only ever spawned (reproduces takes it out before it starts it): its 'ready' is still in the pipe,
        # for this Worker's _await_ready to read
        self._take(sp._proc, sp._conn, sp._spawned_at)
        sp._proc, sp._conn = None, None  # closing the spare's Worker must not end the process it gave away
        sp.close()
        return True

    def _text(self, prop: str, case: Case) -> str:
        # the worker writes it before the launch and removes it when it answers (write_atomic): the
        # campaign process makes no file call per check, each of which gives the interpreter lock to a
        # round drawing beside it (rounds at once) and waits to get it back (benchmarks/roundtrip.py)
        return json.dumps(dict(property=prop, target=self.target_name, case=case.to_dict()))

    def _send(self, p: _Sent) -> bool:
        """Send p to the live process; False when its pipe is closed (the process is gone)."""
        try:
            self._conn.send((p.prop, p.text, str(self.inflight_path)))
        except (BrokenPipeError, OSError):
            return False
        p.sent_at = time.monotonic()
        self._busy = True
        return True

    def _sent_ahead(self) -> bool:
        """Is a queued check sent to the live process (the ones sent come first in the queue)?"""
        return bool(self._queue) and self._queue[0].sent_at is not None

    def _send_queued(self, may_start: bool = True) -> None:
        """Send the submitted checks not sent yet, in order.  The process is started (again) only when no check sent
        to it is unanswered (and may_start: _answer, whose own check is out of the queue, says no): a process that
        died with one is found out when that one's answer is collected."""
        if not self._queue or self._queue[-1].sent_at is not None:
            return
        if may_start and not self._sent_ahead():
            self.start()
        if self._conn is None:
            return
        for q in self._queue:
            if q.sent_at is None and not self._send(q):
                return

    def _check_once(self, prop: str, case: Case) -> list[Finding]:
        if self._sent_ahead():
            raise RuntimeError("Worker.check() while submitted checks are unanswered: collect() them first")
        return self._answer(_Sent(prop, case, self._text(prop, case)))

    def _answer(self, p: _Sent) -> list[Finding]:
        """The findings of check p, taken out of the queue (or never in it: check()): sent first if it was not, with
        the queued checks after it; then its answer waited for."""
        prop = p.prop
        if p.sent_at is None:
            self.start()
        self._inflight_text = p.text
        self._last_finished = False
        if p.sent_at is None and not self._send(p):
            self._proc.join(timeout=5)
            words, outcome = self._exit_words(self._proc)
            return self._died(prop, words, outcome)
        self._send_queued(may_start=False)
        # the worker starts p once it has answered the check before it (sent ahead: submit), not when p was sent
        t0 = max(p.sent_at, self._answered_at)
        deadline = t0 + self.timeout_s
        paused_at, paused_s = None, 0.0  # the check waits for the oracle's compile (worker's thread): not timed
        while True:
            if self._conn.poll(0.05):
                try:
                    kind, payload, compiles = self._conn.recv()
                except (EOFError, OSError):
                    break
                if kind == "oracle-wait":  # the hang timer stops; the compile is bounded as a worker's start is
                    paused_at = time.monotonic()
                    deadline_left, deadline = deadline - paused_at, paused_at + self.start_timeout_s
                    continue
                if kind == "oracle-waited":
                    now = time.monotonic()
                    if paused_at is not None:
                        paused_s += now - paused_at
                        deadline, paused_at = now + deadline_left, None
                    continue
                self._answered_at = time.monotonic()
                dt = self._answered_at - t0 - paused_s
                self._busy = self._sent_ahead()
                self.compiles = self._compiles_before + compiles
                if kind == "inflight":  # the worker could not write the in-flight file: nothing was launched
                    self._last_finished = True
                    raise SetupError(payload)
                if kind == "setup":  # the worker cannot judge any check (its oracle did not compile)
                    self._setup(payload)
                if kind == "fatal":
                    self._proc.join(timeout=10)
                    if "text" in payload:
                        msg = payload["text"]
                    else:
                        msg = next(f["message"] for f in payload["findings"] if classify(f["message"]) == "fatal")
                    return self._died(prop, f"hit a fatal CUDA error ({msg})", fatal_outcome(msg))
                if kind == "error":
                    text = payload["text"]
                    verdict = classify(text)
                    if verdict == "setup":
                        self._setup(text)
                    self._last_finished = True
                    self._answered(payload)
                    if verdict == "resource":
                        return self._resource(prop, text)
                    self._measured(dt)
                    return [Finding("launch", "H*", f"the check raised {text}", outcome=payload["outcome"])]
                if payload.get("oracle") and self.startups:  # the oracle's compile, from the worker's thread
                    self.startups[-1].update(payload["oracle"])
                res = Findings(Finding(**d) for d in payload["findings"])
                res.metrics = payload["metrics"]
                self._graphs_live = payload.get("graphs") or self._graphs_live
                said = "\n".join(f"{f.message} {f.outcome}" for f in res)
                verdict = classify(said) if res else None
                if verdict == "setup":
                    self._setup(next(f.message for f in res if classify(f"{f.message} {f.outcome}") == "setup"))
                self._last_finished = True
                self._answered(payload)
                if verdict == "resource":
                    return self._resource(prop, next(f.message for f in res
                                                     if classify(f"{f.message} {f.outcome}") == "resource"))
                self._measured(dt)
                return res
            if not self._proc.is_alive():
                break
            if time.monotonic() > deadline:
                if paused_at is not None:  # the oracle's compile, not the target, took this long
                    self._stop(kill=True)
                    raise SetupError(f"the gdn_fuzz worker for target {self.target_name} on {self.device}: the fused "
                                     f"oracle's compile did not finish within {self.start_timeout_s:.0f} s")
                return self._hang(prop)
        self._proc.join(timeout=5)
        words, outcome = self._exit_words(self._proc)
        return self._died(prop, words, outcome)

    @property
    def graph_counts(self) -> dict:
        """gdn_fuzz.graphs' counts (replays, eager, captures, capture_s, failed) over every worker so far."""
        return graphs.add_counts(self._graphs_before, self._graphs_live)

    def measure(self, scenario, case: Case) -> Findings:
        """Run a measurement on `case` in the worker: `scenario` is a module-level function (target, case, device) ->
        dict, such as those of gdn_fuzz.studies.unguarded (an unvalidated input: undefined behaviour to report, not
        to judge); the worker imports it by name.  Its numbers come back as .metrics of an empty Findings; when the
        worker dies, hangs or the scenario raises, the Findings say so (crash / hang / launch) and .metrics is
        None.  The worker is replaced after a crash, as for a check."""
        got = self.check(f"{MEASURE}{scenario.__module__}:{scenario.__qualname__}", case)
        if not hasattr(got, "metrics"):
            got = Findings(got)
            got.metrics = None
        return got

    def abort_reproduce(self) -> None:
        """Kill the processes of the confirmations running now (reproduces, on other threads), if any: each check then
        ends as a crash, which the caller that aborted it does not take for an answer (a campaign stopped by a second
        Ctrl-C)."""
        for proc in list(self._repro_procs):
            if proc.is_alive():
                proc.kill()

    def reproduces(self, prop: str, case: Case, signature: str, timeout_s: float | None = None) -> bool | None:
        """Does the finding `signature` come back when `case` runs in a FRESH worker process?

        A new worker is started, runs the one check and is closed (this worker is untouched).  Several may run at
        once, each on its own thread and in its own process.
        True: a finding with that signature came back; False: the check ran and did not give
        it; None: cannot tell (the fresh run ran out of memory, or hung where the signature
        is not a hang).  SetupError propagates.  The campaign files a kernel bug only when
        this is True.
        """
        t0 = time.monotonic()
        w = self._take_spare() or self._fresh()
        had_spare = w._proc is not None
        w.spawn()  # the spare's process is there already; a fresh Worker's starts now
        proc = w._proc
        self._repro_procs.add(proc)
        if self.spare and self._proc is not None:
            # the next confirmation's process starts now, beside this one: a process's start and its oracle's compile
            # (3.4-5.5 s to a first check on an H100, run 87) overlap this check instead of following it, for the
            # confirmations that come in a row (a shrink that meets new failures)
            self._spawn_spare()
        w.timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            w.start()
            t_ready = time.monotonic()
            found = w.check(prop, case)
        finally:
            self._repro_procs.discard(proc)
            w._last_finished = True  # the caller holds the case: no in-flight file left for it
            w.close()
        self.confirmations.append(dict(spare=had_spare, at=round(t0, 3), wait_s=round(t_ready - t0, 3),
                                       check_s=round(time.monotonic() - t_ready, 3),
                                       ready_s=w.startups[-1]["ready_s"] if w.startups else None))
        if any(f.signature() == signature for f in found):
            return True
        if any(f.prop in ("resource", "hang") for f in found):
            return None
        return False
