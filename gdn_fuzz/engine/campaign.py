"""Fuzz campaigns: Hypothesis runs in rounds until a time or example budget is spent.

Each round is one Hypothesis run of some examples of one property with its own seed (derived
from the campaign seed).  Rounds interleave the properties in passes: the first pass gives
every property `first_round_examples` (1) example, and each later pass doubles the round size
up to `round_examples` (25), so every property is reached early in any budget (with rounds of
25 from the start, a 60 s CPU campaign often ended before commit or guards ran at all) while
long runs still get rounds long enough for Hypothesis to explore and shrink.  stats.per_property
records, per property, its examples, its seconds and when its first example ran.  Failures are told apart by their signature
(findings.Finding.signature: check id, clause, outcome class, route family), and the test body
raises one exception class per signature, so Hypothesis' own notion of distinct bugs
(exception type + origin) separates them: each is shrunk on its own and reported together
(report_multiple_bugs).

Known bugs are expected outcomes, not blindfolds: a finding whose signature is known (an
`open` corpus entry of this target, or a bug this campaign already found) is counted and
listed, and the body does not raise for it, so the search in that property goes on for other
signatures.  A launch that shows a known and a new signature fails on the new one.

Budgets are kept while a failure is being shrunk: once the time or example budget is spent,
the body raises BudgetSpent (a BaseException, which Hypothesis passes through), which ends the
Hypothesis run at once; each failure first seen in that round is reported with its best case
so far (the latest failing example of its signature: the shrinker's current target).  Each finding records when its first failing
example was seen (campaign seconds, examples before it) and how long shrinking took.

warm_up() (optional, before run()) launches one legal Case per (arm, T, geometry, bucket)
so that every JIT compile is paid outside the measured time; it restarts the clock and
reports its own seconds and compiles (stats.warmup_s, stats.warmup_compiles).
draws="graph" (what `gdn-fuzz run` passes on a CUDA device) makes every drawn Case draw its values
with the CUDA generator, by the draw program a CUDA graph replays (Case.draws: fast on a GPU; such a
case replays on CUDA only); the default "cpu" keeps device-independent bits.

seeds_per_example=K (issue 17): each Hypothesis example draws one structure (geometry, arm,
rows, cursors, regime: the costly part of a draw) and the body checks it with K value seeds,
case.seed first and then value_seed(case.seed, 1..K-1), each one checked launch of its own
(stats.examples and stats.launches count checks; stats.structures counts drawn structures).
The body stops at the first failing seed and raises its failure, so Hypothesis shrinks the
structure with the same K seeds and the case reported and stored is the failing one, with its
own seed (it reproduces alone).  The budget and a stop request are checked before every one of
the K checks, so an example budget stays exact in checked launches.  A round of n examples is
n structures.  K = 1 checks exactly what a campaign without the option checks.  A property with
reseed=False (properties.base.Property) gets one seed per structure whatever K is.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import json
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_futures
from pathlib import Path
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

from gdn_fuzz import environment, graphs
from gdn_fuzz.case import Case, Row
from gdn_fuzz.strategies import prefix as prefix_strategies
from gdn_fuzz.findings import Finding
from gdn_fuzz.properties import Property
from gdn_fuzz.targets import Target
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.isolation import Worker
from gdn_fuzz.properties import get_property


_MASK64 = 2**64 - 1


def value_seed(seed: int, i: int) -> int:
    """The value seed of the i-th check of one drawn structure (Campaign.seeds_per_example).

    i = 0 is `seed` itself (so one seed per structure checks exactly the drawn case).  For i > 0:
    the SplitMix64 output function applied to (seed + i * 0x9E3779B97F4A7C15) mod 2**64, top
    32 bits: every input bit reaches every output bit (consecutive i and nearby seeds give
    unrelated values), deterministic across processes and platforms, and in [0, 2**32) like a
    drawn seed (strategies draw seeds in [0, 2**32); Case.validate allows [0, 2**64))."""
    if i == 0:
        return seed
    z = (seed + i * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 32


# `gdn-fuzz run --shrink-grace`'s default: seconds a round may go on shrinking a new failure past the budget.  The
# shrinks measured on the H200 take 0.6-1.4 s from the first failing example to the shrunk case (run 48, the
# materializer's mutants) and up to tens of seconds for the flush kernel's 60 s campaigns (issue 32: most findings
# were left unshrunk); 10 s bounds a CI job's overrun and covers the first.
DEFAULT_SHRINK_GRACE_S = 10.0


def pipeline_default(device: str, isolate: bool) -> int:
    """Rounds a campaign runs at once (Campaign.pipeline) when not told: 2 for an isolated campaign on a CUDA device,
    where one round's Hypothesis draws (~4.5 ms of host time per example on the H100's host, run 78) overlap the
    other round's check in the worker process (~5.5 ms, most of it host time too); 1 elsewhere: on a CPU the check
    takes the cores the draws would use, and one round at a time keeps a seed's sequence of checks deterministic."""
    return 2 if isolate and str(device).startswith("cuda") else 1


def parse_pipeline(spec) -> int | None:
    """--pipeline: None or 'auto' -> None (pipeline_default), 'N' (1 <= N <= MAX_PIPELINE) -> N.  Raises ValueError,
    one line naming the option, the value and the fix."""
    return environment.count_or_auto(spec, "--pipeline", "GDN_FUZZ_PIPELINE", "the rounds to run at once", MAX_PIPELINE)


DEFER_ENV = "GDN_FUZZ_DEFER_VERDICTS"


def defer_default(isolate: bool) -> bool:
    """Does an isolated campaign defer its verdicts (Campaign.defer) when not told ($GDN_FUZZ_DEFER_VERDICTS)?
    off (default): each example waits for its check; on: isolated campaigns send each case ahead and read its
    verdict one example later (never without isolation).  Off by default: on an H100 (run 88) it gained 31% for one
    process (8,040 against 6,117 checks per 30 s, medians of 3) and nothing for the product command's eight, it runs
    one round at a time, and one worker's 13 s without a check under it (read on the CPU as a finding's explanation
    starting a process of its own, f939acc) is not re-measured (docs/benchmarks.md, "Issue 32, fifteenth part")."""
    which = environment.choice(DEFER_ENV, ("off", "on"), "off: each example waits for its check; on: deferred "
                               "verdicts in isolated campaigns")
    return isolate and which == "on"


def parse_defer(spec) -> bool | None:
    """--defer-verdicts (argparse checks it is on or off): None -> None (defer_default), 'on' -> True, 'off' ->
    False."""
    return None if spec is None else spec == "on"


def defer_conflict(defer: bool, isolate: bool, pipeline: int | None) -> str | None:
    """Why deferred verdicts cannot run so (one line naming the options and the fix; the Campaign's and the CLI's
    error), or None."""
    if not defer:
        return None
    if not isolate:
        return ("deferred verdicts (--defer-verdicts on, $GDN_FUZZ_DEFER_VERDICTS=on, defer=True) with --no-isolate "
                "(isolate=False): they need the isolated worker, which checks while this process draws the next case; "
                "drop --no-isolate or turn deferred verdicts off")
    if pipeline not in (None, 1):
        return (f"deferred verdicts (--defer-verdicts on, $GDN_FUZZ_DEFER_VERDICTS=on, defer=True) with --pipeline "
                f"{pipeline} (pipeline={pipeline}): they run one round at a time, one thread drawing while the worker "
                "checks; give --pipeline 1 or auto, or turn deferred verdicts off")
    return None


SPARE_ENV = "GDN_FUZZ_SPARE_WORKER"


def spare_worker_default(device: str) -> bool:
    """Does an isolated campaign keep a spare worker process for its confirmations ($GDN_FUZZ_SPARE_WORKER)?
    auto (default): on a CUDA device, where a process start is 5-13 s that a first finding waited for (H200, run
    63); not on a CPU, where the spare's start takes a core from the checks (2 cores in CI).  on / off: always /
    never."""
    which = environment.choice(SPARE_ENV, ("auto", "on", "off"),
                               "auto: a spare worker on a CUDA device; on: always; off: never")
    return str(device).startswith("cuda") if which == "auto" else which == "on"


CONFIRM_ENV = "GDN_FUZZ_CONFIRMATIONS"
MAX_CONFIRMATIONS = 4  # Campaign.confirmations_at_once's largest value (and $GDN_FUZZ_CONFIRMATIONS's)


def confirmations_default(device: str, torch_threads: int | None) -> int:
    """Confirmations an isolated campaign runs at once (Campaign.confirmations_at_once) when not told
    ($GDN_FUZZ_CONFIRMATIONS: auto or N).  Each is a fresh worker process: its start, its compiles and one check.  On
    an H100 (run 88) they took 2.6-4.5 s each, one at a time, and a worker whose edit failed several ways waited 9-36 s
    for them at its rounds' ends.  auto: on a CUDA device one per 4 of the cores this process may use (its
    torch_threads when set: a fleet gives each process its share), at least 1, at most 3; on a CPU 1 (a
    confirmation's process takes the cores the checks use: 2 in CI)."""
    which = environment.choice(CONFIRM_ENV, ("auto", *map(str, range(1, MAX_CONFIRMATIONS + 1))),
                               "the fresh-process confirmations a campaign runs at once; auto: 1 on a CPU, on a CUDA "
                               "device one per 4 cores of the process, 1 to 3")
    if which != "auto":
        return int(which)
    if not str(device).startswith("cuda"):
        return 1
    return max(1, min(3, (torch_threads or environment.usable_cores()) // 4))


# FREEZE_GC: Campaign.run moves every object alive when it starts (the imports: torch, Hypothesis, gdn_fuzz; the
# warm-up's) out of the cyclic collector's reach (gc.freeze) until it ends (gc.unfreeze), so that a full collection
# during the run walks only what the run made.  On the CPU machine gc's own callbacks timed the two full collections
# of a 20 s deferred campaign (stand-in 2.5 ms check, 4 seeds) at 99-138 ms each, the worker idle meanwhile; frozen,
# 4 full collections took 41-71 ms in all, the longest 19-29 ms, and the campaign took 3.01 ms per example against
# 3.05-3.09 (two runs each).  In run 90 (H100) the largest gaps between two records were 0.22-0.35 s, twice in each
# 30 s run; with the freeze, in run 91 (H100, the same configuration), 23-31 ms in each of three runs
# (docs/benchmarks.md, "Issue 32", seventeenth and eighteenth parts).  It collects once first (~80 ms on the CPU
# machine with torch and gdn_fuzz imported): what is frozen is never collected until the run ends, so a cycle left by
# the warm-up (a traceback's frames, a tensor among their locals) would otherwise keep its memory, on the device too,
# for the whole run.

MAX_PIPELINE = 8  # Campaign.pipeline's largest value
# The interpreter's thread switch interval while rounds run at once (sys.setswitchinterval; Python's default is 5 ms):
# a round whose check has come back waits for the lock of the interpreter while another round draws, and the
# interpreter hands it over only every switch interval, so at 5 ms the worker stood idle for most of a draw and two
# rounds checked no more than one (H200, run 79: 2,931 and 2,827 per 30 s against 2,975 and 3,237 for one round).
# Measured on the CPU machine with checks of 6 ms that release the lock and ~5 ms draws (the gdn_fuzz strategies):
# 11.1 ms per example with one round; with two, 10.6 ms at 5 ms, 8.1 ms at 0.5 ms, 7.8 ms at 0.2 and at 0.1 ms.
PIPELINE_SWITCH_S = 2e-4

# Hypothesis (6.168.3 on the GPU image, 6.170.27 on the CPU machine) now and then draws a constant found in the
# source of a "local" module: one outside site-packages and outside tests (gdn_fuzz itself, an editable FlashInfer
# or CuTe DSL checkout).  The first draw that wants one parses the source of every such module in sys.modules
# (cached on disk under .hypothesis/constants), on the thread that draws.  That was 0.45 s on this project's CPU
# machine from a cold cache.  With the GPU bundle's FlashInfer and CuTe DSL outside site-packages, both rounds at once
# spent ~11 s in it at their fifth example, inside the budget (run 83, tools/stack_sampler; 0.8 s in the runs after,
# from the cache).  So a campaign starts that scan on a thread when it is made, beside the worker's start and the
# warm-up, and waits for it before its rounds.


@functools.cache
def _constants_scan() -> threading.Thread | None:
    """Hypothesis' scan of the local modules' constants, started on a thread once per process (None: a Hypothesis
    without it, i.e. without its private _get_local_constants)."""
    try:
        from hypothesis.internal.conjecture.providers import _get_local_constants
    except ImportError:
        return None
    t = threading.Thread(target=_get_local_constants, name="gdn-fuzz-hypothesis-constants", daemon=True)
    t.start()
    return t


def _constants_scanned() -> None:
    """Wait for _constants_scan (starting it if need be)."""
    if (t := _constants_scan()) is not None:
        t.join()


@dataclass
class _RoundState:
    """What one running round keeps of its own (Campaign.run: several rounds may run at once)."""

    new: list = field(default_factory=list)  # signatures first seen in this round, in order
    spent_at: float | None = None  # campaign seconds when the budget was found spent while it shrank (the grace's start)


class BudgetSpent(BaseException):
    """Raised from the test body once the budget is spent.  Not an Exception, so Hypothesis does
    not take it for a failure: it ends the run at once (like an interrupt raised from the test
    itself), and the round reports each new failure's best case so far."""


class DeferredFailure(BaseException):
    """Raised from a round's deferred pass when a verdict read one example late is a new failure: like BudgetSpent it
    ends the Hypothesis run at once, and the round is run again to shrink it (Campaign._deferred_pass)."""


# deferred verdicts: cases the worker holds beyond the one it runs (Campaign.defer_depth's default).  Two: in run 93
# (H100, one process, 4 seeds per structure, alternating on one warm machine) depth 2 checked 10,076 and 10,571 per
# 30 s against depth 1's 8,644 and 9,066 (docs/benchmarks.md, "Issue 32, nineteenth part").  One held case left the
# worker waiting on the campaign's pauses of 5 ms to 0.35 s (run 90); what a crash or a stop costs again is at most
# the cases held.  $GDN_FUZZ_DEFER_DEPTH sets another depth for a run (defer_depth_default).
DEFER_DEPTH = 2
MAX_DEFER_DEPTH = 4
DEFER_DEPTH_ENV = "GDN_FUZZ_DEFER_DEPTH"


def defer_depth_default() -> int:
    """Cases a deferred campaign's worker holds beyond the one it runs, when not told ($GDN_FUZZ_DEFER_DEPTH: 1 to
    MAX_DEFER_DEPTH; unset: DEFER_DEPTH)."""
    return int(environment.choice(DEFER_DEPTH_ENV, tuple(str(n) for n in range(1, MAX_DEFER_DEPTH + 1)),
                                  f"the cases a deferred campaign's worker holds beyond the one it runs, default "
                                  f"{DEFER_DEPTH}", default=str(DEFER_DEPTH)))


def _count(name: str, n, hi: int, what: str) -> None:
    """ValueError naming Campaign field `name`, its value and the legal range unless n is an int in [1, hi] (`what`
    it counts)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= hi:
        raise ValueError(f"{name}={n!r}: give an int in [1, {hi}] ({what})")


class PropertyFailed(AssertionError):
    """Raised inside the Hypothesis test body so Hypothesis shrinks the failing Case.

    Each signature gets its own subclass (failure_class), so Hypothesis keeps failures with
    different signatures apart."""

    signature: str = ""

    def __init__(self, case: Case, findings: list[Finding], signature: str = ""):
        self.case, self.findings = case, findings
        self.signature = signature or type(self).signature
        super().__init__("\n".join([f"signature: {self.signature}", case.describe()] + [str(f) for f in findings]))


_FAILURE_CLASSES: dict[str, type] = {}


def failure_class(signature: str) -> type:
    """The PropertyFailed subclass of one signature (one per process, made on first use)."""
    cls = _FAILURE_CLASSES.get(signature)
    if cls is None:
        tag = hashlib.sha256(signature.encode()).hexdigest()[:10]
        cls = type(f"PropertyFailed_{tag}", (PropertyFailed,), {"signature": signature})
        _FAILURE_CLASSES[signature] = cls
    return cls


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside what Hypothesis raised: one, a (nested) group of several, or a Flaky
    group wrapping them; [exc] for an exception that holds none."""
    subs = getattr(exc, "exceptions", None)
    if not subs:
        return [exc]
    return [y for x in subs for y in _leaves(x)]


def _failures(exc: BaseException) -> list[PropertyFailed]:
    """Our failures inside what Hypothesis raised."""
    return [x for x in _leaves(exc) if isinstance(x, PropertyFailed)]


def _foreign(exc: BaseException) -> bool:
    """True when what Hypothesis raised holds an exception that is not one of our failures
    (an error in a check itself): that must surface, not be filed as a finding."""
    return any(not isinstance(x, PropertyFailed) for x in _leaves(exc))


@dataclass
class CampaignFinding:
    prop: str
    case: Case
    findings: list[Finding]
    signature: str = ""
    entry_path: object = None  # corpus file, when written
    entry_new: bool = False  # False: the corpus already held this failure
    first_t: float | None = None  # campaign seconds at the first failing example of this signature
    first_examples: int | None = None  # examples checked before it
    shrink_s: float | None = None  # seconds from the first failing example to the end of its round
    shrunk: bool = True  # False: the budget (or an interrupt) ended shrinking early; best case so far
    flaky: bool = False  # Hypothesis could not reproduce it on replay
    entry_note: str = ""  # why no corpus entry was written (read-only corpus)

    def key(self) -> str:
        return self.signature

    def launch(self) -> dict | None:
        """The launch that ran (findings.Finding.launch of this signature's finding; None for a
        crash or a hang, whose launch is the plain materialize(case))."""
        pick = [x for x in self.findings if x.launch and x.signature() == self.signature]
        pick = pick or [x for x in self.findings if x.launch]
        return pick[0].launch if pick else None

    def to_record(self) -> dict:
        return dict(prop=self.prop, signature=self.signature, known=False, case=self.case.to_dict(),
                    launch=self.launch(),
                    findings=[str(x) for x in self.findings],
                    launch_signatures=sorted({x.signature() for x in self.findings}), first_failure_s=self.first_t,
                    examples_before=self.first_examples, shrink_s=self.shrink_s, shrunk=self.shrunk,
                    flaky=self.flaky,
                    corpus_entry=None if self.entry_path is None else Path(self.entry_path).name)


@dataclass
class CampaignStats:
    examples: int = 0  # checked cases (with seeds_per_example K > 1: up to K per drawn structure)
    structures: int = 0  # structures drawn by Hypothesis and checked at least once
    launches: int = 0
    rounds: int = 0
    compiles: int = 0
    warmup_s: float = 0.0  # warm_up(): outside `elapsed`
    warmup_compiles: int = 0
    grace_s: float = 0.0  # seconds shrinking ran past the budget (Campaign.shrink_grace_s)
    confirm_wait_s: float = 0.0  # seconds rounds' ends waited for fresh-process confirmations still running (_settle)
    started: float = field(default_factory=time.monotonic)
    events: dict = field(default_factory=dict)
    per_property: dict = field(default_factory=dict)  # name -> {"examples", "seconds", "first_s", "first_example"}

    def note_example(self, prop: str) -> None:
        """One example of `prop` starts (stats.examples not yet counted)."""
        p = self.per_property.setdefault(prop, dict(examples=0, seconds=0.0, first_s=None, first_example=None))
        if p["first_s"] is None:
            p["first_s"], p["first_example"] = self.elapsed, self.examples
        p["examples"] += 1

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.examples / max(self.elapsed, 1e-9)


@dataclass
class Campaign:
    target: Target
    device: str
    properties: list[Property]
    arms: tuple[str, ...]
    Ts: tuple[int, ...]
    geometries: tuple
    buckets: tuple[int, ...]
    seed: int = 0
    round_examples: int = 25  # the largest round (examples of one property in one Hypothesis run)
    first_round_examples: int = 1  # the first pass's round size; it doubles every pass up to round_examples
    shrink: bool = True
    isolate: bool = False  # run checks in a worker process (gdn_fuzz.engine.isolation)
    corpus_dir: object = None  # write every finding here (gdn_fuzz.engine.corpus); None: do not write
    record_path: object = None  # JSON lines: one record per example (coverage and errors, for `report`); a path, or
    # an object with write() and flush() (a fleet worker streams the lines to its driver: gdn_fuzz.engine.worker)
    stop_on_finding: bool = False  # end the campaign at its first finding (mutation tests)
    draws: str = "cpu"  # Case.draws of every drawn case ("graph": every value from the CUDA generator)
    known: dict = field(default_factory=dict)  # signature -> corpus entry name: expected outcomes
    launch_timeout_s: float | None = None  # isolated checks: a fixed hang timeout (None: derived, see _check)
    torch_threads: int | None = None  # torch intra-op threads of the process that checks (None: torch's default)
    seeds_per_example: int = 1  # K: value seeds checked per drawn structure (value_seed; 1: the drawn seed only)
    pool_scales: tuple = ()  # pool-scale kinds for properties that take them (strategies.pool_scales_for)
    shrink_grace_s: float = 0.0  # when the budget ends while a new failure of the round is being shrunk, shrinking
    # goes on for up to this many seconds more (no new round starts); 0: it stops with the budget (best case so far)
    # isolated: a spare worker process starts in the background for the fresh-process confirmation of a new failure
    # (Worker.spare); None: $GDN_FUZZ_SPARE_WORKER (spare_worker_default)
    spare_worker: bool | None = None
    # isolated: fresh-process confirmations of new failures run at once, each on its own thread and process (None:
    # confirmations_default)
    confirmations_at_once: int | None = None
    # isolated, on a GPU: the pipe folder of the run's MPS daemon (gdn_fuzz.engine.mps; Worker.mps_pipe); None: none
    mps_pipe: str | None = None
    # rounds run at once, each Hypothesis run on its own thread (run()'s docstring); None: pipeline_default
    pipeline: int | None = None
    # isolated: deferred verdicts (_deferred_pass): each case goes to the worker without waiting for its answer,
    # which the round reads one example later; None: $GDN_FUZZ_DEFER_VERDICTS (defer_default)
    defer: bool | None = None
    # deferred verdicts: cases the worker holds beyond the one it runs; None: defer_depth_default ($GDN_FUZZ_DEFER_DEPTH)
    defer_depth: int | None = None
    stats: CampaignStats = field(default_factory=CampaignStats)
    findings: dict = field(default_factory=dict)  # signature -> CampaignFinding (new ones)
    known_hits: Counter = field(default_factory=Counter)  # known signature -> examples that showed it
    repeats: Counter = field(default_factory=Counter)  # signature found earlier in this run -> examples again
    env_failures: Counter = field(default_factory=Counter)  # failures of the machine (out of memory), not bugs
    unconfirmed: dict = field(default_factory=dict)  # signature -> first case, when a fresh worker did not repeat it
    interrupted: bool = False

    def __post_init__(self):
        k = self.seeds_per_example
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"seeds_per_example={self.seeds_per_example!r}: give an int >= 1")
        if self.defer is None:
            self.defer = defer_default(self.isolate)
        why = defer_conflict(self.defer, self.isolate, self.pipeline)
        if why:
            raise ValueError(why)
        if self.defer_depth is None:
            self.defer_depth = defer_depth_default()
        _count("defer_depth", self.defer_depth, MAX_DEFER_DEPTH, "cases a deferred campaign's worker holds beyond the "
               "one it runs")
        if self.pipeline is None:
            self.pipeline = 1 if self.defer else pipeline_default(self.device, self.isolate)
        _count("pipeline", self.pipeline, MAX_PIPELINE, "rounds at once; 1: one round at a time")
        if self.confirmations_at_once is None:
            self.confirmations_at_once = confirmations_default(self.device, self.torch_threads)
        _count("confirmations_at_once", self.confirmations_at_once, MAX_CONFIRMATIONS,
               "fresh-process confirmations run at once")
        g = self.shrink_grace_s
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < float("inf"):
            raise ValueError(f"shrink_grace_s={g!r}: give a number of seconds >= 0")
        other = [p.name for p in self.properties if p.kernel != self.target.kernel]
        if other:
            raise ValueError(f"properties {', '.join(other)} check another kernel than target {self.target.name}'s "
                             f"({self.target.kernel}); use properties of kernel {self.target.kernel!r} "
                             "(gdn_fuzz.properties.for_kernel)")
        self._worker = None
        if self.record_path is None or hasattr(self.record_path, "write"):
            self._records = self.record_path
        else:
            self._records = open(self.record_path, "a")
        self._deadline = None  # (seconds, examples) of the running budget
        self._first: dict = {}  # signature -> (t, examples, prop) of its first failing example
        self._owner: dict = {}  # signature -> the running round (_RoundState) that is shrinking it
        self._tls = threading.local()  # .round: the _RoundState of the round this thread runs
        self._lock = threading.RLock()  # the campaign's bookkeeping and the callbacks, one round at a time
        self._check_lock = threading.Lock()  # the check (the isolated worker, its spare), one round at a time
        self._halt = False  # stop_on_finding was met: running rounds end as on a spent budget
        self._stop_requested = False  # a Ctrl-C seen by run()'s SIGINT handler
        self._best: dict = {}  # signature -> (prop, case, findings) of its latest failing example
        self._learned: dict = {}  # signature -> entry name, told by another thread (learn()), not yet in known
        self._model_known: dict = {}  # signature -> the release model's word, for known bugs no entry records
        self._on_check = lambda prop, case: None  # run()'s on_check
        # isolated: signature -> Future of its fresh-process confirmation (Worker.reproduces), which runs on the
        # confirmer thread while the round that saw it shrinks it and the other rounds check (_confirm_later)
        self._confirming: dict[str, Future] = {}
        self._confirmer: ThreadPoolExecutor | None = None
        self._confirm_error: BaseException | None = None  # what a confirmation raised, for the rounds to raise
        self._confirm_aborted = False  # a second Ctrl-C ended the confirmations: their answers are not taken
        self._repeated: set = set()  # signatures a fresh process repeated
        _constants_scan()
        if self.isolate:
            # the case in flight is saved beside the corpus, or in a temporary folder where the corpus is not written
            inflight = (None if self.corpus_dir is None or corpus.unwritable(self.corpus_dir) is not None
                        else Path(self.corpus_dir) / ".inflight")
            spare = spare_worker_default(self.device) if self.spare_worker is None else bool(self.spare_worker)
            self._worker = Worker(self.target.name, self.device, inflight_dir=inflight, torch_threads=self.torch_threads,
                                  oracle_arms=self.arms, oracle_Ts=self.Ts,  # compile only the oracles it can draw
                                  spare=spare, mps_pipe=self.mps_pipe)
        elif self.torch_threads:
            import torch

            torch.set_num_threads(self.torch_threads)

    def graph_counts(self) -> dict:
        """How the checks ran (gdn_fuzz.graphs: CUDA-graph replays, eager runs, captures): in the isolated
        workers, or in this process."""
        if self._worker is not None:
            return self._worker.graph_counts
        return graphs.counts()

    def drawn_ahead(self) -> int | None:
        """Checks whose case the isolated worker drew while the check before it ended (Worker.drawn_ahead), or None
        without isolation."""
        return None if self._worker is None else self._worker.drawn_ahead

    def worker_startups(self) -> list[dict]:
        """Worker.startups of the isolated worker (every process it started), or [] without isolation."""
        return [] if self._worker is None else list(self._worker.startups)

    def mps_summary(self) -> dict | None:
        """The isolated worker's MPS story (None without a daemon): its pipe folder, when and why it left MPS, and
        each case checked again in its own context (Worker.mps_left, Worker.mps_rechecks)."""
        if self.mps_pipe is None or self._worker is None:
            return None
        return dict(pipe=self.mps_pipe, left=self._worker.mps_left, rechecks=list(self._worker.mps_rechecks))

    def confirmations(self) -> list[dict]:
        """Worker.confirmations of the isolated worker (every fresh-process check of a new failure), or []; `at`: when
        each started, in seconds of the campaign's clock (stats.elapsed)."""
        if self._worker is None:
            return []
        return [dict(c, at=round(c["at"] - self.stats.started, 3)) for c in self._worker.confirmations]

    def _compiles(self) -> int:
        if self._worker is not None:
            return self._worker.compiles
        return sum(self.target.compile_count(a) for a in self.arms)

    def warm_up(self) -> "Campaign":
        """One launch per compile key (_warm_cases): pays every JIT compile before run()'s clock.

        The launches are legal cases (flush kernel: all rows real, each on its own slot, no window, checked by
        `launch`; materializer: one one-entry fold, checked by `pm_launch`); their findings are not recorded
        (the campaign finds them).
        """

        t0, c0 = time.monotonic(), self._compiles()
        for prop, case in self._warm_cases(random.Random(self.seed)):
            if self._stop_requested:  # request_stop() from another thread (a fleet worker's)
                raise KeyboardInterrupt
            self._check(prop, case)
        _constants_scanned()  # before the clock, like the compiles
        self.stats.warmup_s += time.monotonic() - t0
        self.stats.warmup_compiles += self._compiles() - c0
        self.stats.started = time.monotonic()
        return self

    def _warm_cases(self, rng: random.Random):
        """(property, case) of every warm-up launch: per (arm, T, geometry, bucket) for the flush kernel; per
        (arm, geometry, ring depth) for the materializer (PMD4: its B is dynamic)."""
        if self.target.kernel == "materialize":
            prop = get_property("pm_launch")
            return [(prop, c) for c in prefix_strategies.warm_cases(
                self.arms, prefix_strategies.geometries_for(self.target), seed=rng.randrange(2**32))]
        prop = get_property("launch")
        return [(prop, Case(arm=arm, T=T, H=H, HV=HV, pool=bucket, rows=tuple(Row(s, 0, rng.randrange(32))
                                                                               for s in range(bucket)),
                            seed=rng.randrange(2**32), draws=self.draws))
                for arm in self.arms for T in self.Ts for H, HV in self.geometries for bucket in self.buckets]

    def _check(self, prop: Property, case: Case):
        if self._worker is not None:
            self._set_timeout()
            return self._worker.check(prop.name, case)
        return prop.check(self.target, case, self.device)

    def _set_timeout(self) -> None:
        """The isolated worker's hang timeout for the next check."""
        if self.launch_timeout_s is not None:
            self._worker.timeout_s = self.launch_timeout_s
        else:
            # a hang is called after 20 x the slowest check so far, never past the budget (floor 30 s)
            seconds = None if self._deadline is None else self._deadline[0]
            self._worker.auto_timeout(None if seconds is None else max(seconds - self.stats.elapsed, 0.0))

    def _record(self, f: "CampaignFinding") -> None:
        if self.corpus_dir is None:
            return

        try:
            f.entry_path, f.entry_new = corpus.write(
                corpus.make_entry(f.prop, f.case, f.findings, self.target.name, signature=f.signature), self.corpus_dir)
        except PermissionError as e:  # a read-only corpus (CI): the finding is still reported
            f.entry_note = str(e).splitlines()[0]

    @property
    def _rs(self) -> "_RoundState":
        """The state of the round this thread runs."""
        return self._tls.round

    def _in_grace(self) -> bool:
        """The budget is spent: may this round's shrinking go on?  Yes while a failure first seen in this round is
        being shrunk and less than shrink_grace_s has passed since the budget was found spent (never after
        stop_on_finding was met)."""
        rs = self._rs
        shrinking = any(sig not in self.unconfirmed for sig in rs.new)
        if not (self.shrink and self.shrink_grace_s > 0 and shrinking) or self._stop_requested or self._halt:
            return False
        if rs.spent_at is None:
            rs.spent_at = self.stats.elapsed
        return self.stats.elapsed - rs.spent_at < self.shrink_grace_s

    def _end_grace(self) -> None:
        """The round ended: the seconds it shrank past the budget (with rounds at once, the longest of them: the
        wall time the grace added; one round at a time only the last round can be in grace)."""
        rs = self._rs
        if rs.spent_at is not None:
            with self._lock:
                self.stats.grace_s = max(self.stats.grace_s, self.stats.elapsed - rs.spent_at)
            rs.spent_at = None

    def budget_spent(self) -> bool:
        if self._halt:
            return True
        if self._deadline is None:
            return False
        seconds, examples = self._deadline
        return (seconds is not None and self.stats.elapsed >= seconds) or (
            examples is not None and self.stats.examples >= examples)

    def known_for(self, case: Case | None) -> dict:
        """The known bugs of a launch of `case`: self.known, per the backend the launch runs on
        (corpus.known_on_backend; on an SM100 GPU the released flush kernel routes some launches to UMMA)."""
        if case is None:
            return self.known
        backend = self.target.backend_for_case(case, self.device)
        got = corpus.known_on_backend(self.known, self.target, backend)
        for sig, name in got.items():
            if sig not in self.known:
                self._model_known.setdefault(sig, name)
        return got

    def classify(self, found, case: Case | None = None, known_sigs: dict | None = None) -> tuple[list, list]:
        """(known, new) findings of one launch: known = signature of an open corpus entry of
        this target (for the backend the launch runs on: known_for, or `known_sigs` when the caller
        has it) or of a finding this campaign already reported.  A failure of the machine (the worker
        ran out of memory: prop "resource") is neither: it is counted in env_failures and never filed
        as a kernel bug."""
        known_sigs = self.known_for(case) if known_sigs is None else known_sigs
        known, new = [], []
        for f in found:
            sig = f.signature()
            if f.prop == "resource":
                self.env_failures[sig] += 1
                continue
            (known if sig in known_sigs or sig in self.findings else new).append(f)
        return known, new

    def _round(self, prop: Property, round_seed: int, on_example, on_first, n: int | None = None) -> list[CampaignFinding]:
        kw = dict(pool_scales=self.pool_scales) if prop.pool_scale and self.pool_scales else {}
        strat = prop.strategy(arms=self.arms, Ts=self.Ts, geometries=self.geometries, buckets=self.buckets, **kw)
        if self.draws != "cpu":
            strat = strat.map(lambda c: dataclasses.replace(c, draws=self.draws))
        phases = (Phase.generate, Phase.target, Phase.shrink) if self.shrink else (Phase.generate,)
        round_started = self.stats.elapsed
        k = self.seeds_per_example if prop.reseed else 1

        memo: dict = {}  # deferred verdicts: case -> (signature, findings) of a failure, or None, of its check

        def hypothesis_run(check_one, replay: dict | None = None):
            """The round's Hypothesis run; check_one(prop, case) checks one case: the failure to raise, or None.
            replay: the deferred pass's verdicts (memo), for cases not to check again (empty or None: every case is
            checked, and no case is hashed)."""

            @hseed(round_seed)
            @settings(max_examples=n or self.round_examples, deadline=None, database=None, phases=phases,
                      report_multiple_bugs=True, suppress_health_check=list(HealthCheck), print_blob=False)
            @given(strat)
            def body(case):
                for i in range(k):  # value seeds of this structure: case.seed, then value_seed(case.seed, i)
                    if self._stop_requested:
                        raise KeyboardInterrupt  # a Ctrl-C noted by run()'s handler, raised where Hypothesis expects it
                    if self.budget_spent() and not self._in_grace():
                        raise BudgetSpent  # ends the Hypothesis run at once, shrinking included
                    c = case if i == 0 else dataclasses.replace(case, seed=value_seed(case.seed, i))
                    if replay and c in replay:  # checked in the round's deferred pass: its verdict, not a new example
                        exc = self._remembered(c, replay[c])
                    else:
                        if i == 0:
                            self.stats.structures += 1
                        exc = check_one(prop, c)
                    if exc is not None:
                        raise exc  # the failing seed's case: Hypothesis shrinks the structure, same K seeds

            return body

        rs = self._rs
        if self.defer and not self._deferred_pass(hypothesis_run, memo, on_example, on_first):
            return self._cut_short(prop, {})  # nothing failed ([]), or a stop or the budget came before any did
        body = hypothesis_run(lambda p, c: self._example(p, c, on_example, on_first), replay=memo)

        def run_body():
            # the round's failures are read below from self._first, which their confirmations set: wait for those
            # still running first (a KeyboardInterrupt is run()'s: it waits itself, and files only what was repeated)
            try:
                body()
            except KeyboardInterrupt:
                raise
            except BaseException:
                self._settle(list(rs.new))
                raise
            self._settle(list(rs.new))

        return self._with_unreached(self._run_result(prop, run_body, round_started))

    def _deferred_pass(self, hypothesis_run, memo: dict, on_example, on_first) -> bool:
        """Deferred verdicts (self.defer): the round's Hypothesis run with every check sent ahead, so that Hypothesis
        draws the next case while the worker checks this one; each case's verdict is read one example later (the
        worker holds at most defer_depth cases beyond the one it runs) and kept in `memo`.  Hypothesis needs a
        failure in the example that drew it, to shrink it, so the first new failure ends this pass, the cases still
        in the worker are answered, and the round is run again from its seed (True): Hypothesis draws the same
        cases, the memo gives their verdicts without a check, and the failure is shrunk as in a round without
        deferral (its confirmation already running).  False: nothing failed, or a stop or the budget came first."""
        failed = False

        def remember(case: Case, exc: PropertyFailed | None) -> None:
            nonlocal failed
            memo[case] = None if exc is None else (exc.signature, list(exc.findings))
            failed = failed or exc is not None

        def send(prop: Property, case: Case) -> None:
            self._submit(prop, case, on_example)
            while self._worker.pending > self.defer_depth:
                remember(*self._collect(on_first))
                if failed:
                    raise DeferredFailure
            return None

        try:
            hypothesis_run(send)()
        except (DeferredFailure, BudgetSpent):
            pass
        finally:  # the cases still in the worker are answered (a stop's too: a first Ctrl-C waits for its check)
            while self._worker.pending:
                remember(*self._collect(on_first))
        return failed

    def _remembered(self, case: Case, verdict) -> PropertyFailed | None:
        """The failure to raise again for a case the deferred pass checked (None: it passed, or its signature was
        not repeated by a fresh process since)."""
        if verdict is None or verdict[0] in self.unconfirmed:
            return None
        sig, found = verdict
        return failure_class(sig)(case, list(found), sig)

    def _with_unreached(self, out: list) -> list[CampaignFinding]:
        """A round's findings, and each failure first seen in the round that Hypothesis did not report as it was
        seen (_unshrunk): after a deferred pass, a failure in a case sent after the first one, which the rerun does
        not reach."""
        got = {f.signature for f in out}
        return out + [self._unshrunk(sig) for sig in self._rs.new if sig not in got]

    def _run_result(self, prop: Property, run_body, round_started: float) -> list[CampaignFinding]:
        """Run a round's Hypothesis run (run_body: the round's own, or the rerun after a deferred pass) and read its
        findings."""
        try:
            run_body()
        except BudgetSpent:
            self._end_grace()
            return self._cut_short(prop, {})
        except Exception as e:  # noqa: BLE001 - our failures, possibly grouped by Hypothesis
            fails = _failures(e)
            if not fails or _foreign(e):
                raise
            flaky = not isinstance(e, PropertyFailed) and type(e).__name__.startswith("Flaky")
            # Hypothesis reported its failures, so it finished shrinking them: the budget (or the grace's end) cuts a
            # shrink only by BudgetSpent, raised from the body, which is not an Exception (the branches below).
            # `shrunk` used to ask whether the budget was spent now, after the wait for the round's confirmations
            # (_settle), which can outlast the budget: 36 of 103 findings of run 88 were filed shrunk=False so.
            out = []
            for x in fails:
                t, n, _ = self._first.get(x.signature, (round_started, None, prop.name))
                out.append(CampaignFinding(prop.name, x.case, x.findings, signature=x.signature, first_t=t,
                                           first_examples=n, shrink_s=self.stats.elapsed - t, shrunk=self.shrink,
                                           flaky=flaky))
            self._end_grace()
            return out
        except BaseExceptionGroup as e:
            # The budget or a stop request came while Hypothesis replayed its shrunk failures one
            # by one (its last step): it groups the BudgetSpent or KeyboardInterrupt raised by the
            # body with the failures it had replayed (one failure's replay can take up to
            # seeds_per_example checks).  Before, the group escaped the campaign as a traceback.
            leaves = _leaves(e)
            if any(isinstance(x, KeyboardInterrupt) for x in leaves):
                raise KeyboardInterrupt from e
            if not all(isinstance(x, (PropertyFailed, BudgetSpent)) for x in leaves):
                raise
            self._end_grace()
            return self._cut_short(prop, {x.signature: x for x in leaves if isinstance(x, PropertyFailed)})
        return []

    def _cut_short(self, prop: Property, replayed: dict) -> list[CampaignFinding]:
        """The failures of a round the budget ended: one Hypothesis had shrunk and replayed
        (`replayed`, signature -> PropertyFailed) with that case; any other first seen in this
        round with its best case so far (the latest failing example of its signature: the
        shrinker's current target), shrunk=False."""
        out = []
        for sig in dict.fromkeys([*self._rs.new, *replayed]):
            t, n, _ = self._first[sig]
            if sig in replayed:
                x = replayed[sig]
                out.append(CampaignFinding(prop.name, x.case, x.findings, signature=sig, first_t=t, first_examples=n,
                                           shrink_s=self.stats.elapsed - t, shrunk=self.shrink))
            else:
                out.append(self._unshrunk(sig))
        return out

    def _unshrunk(self, sig: str) -> CampaignFinding:
        """A failure as last seen (its best case so far: the latest failing example of its signature), shrunk=False:
        what a budget's end, a stop or a rerun that did not reach it files."""
        t, n, _ = self._first[sig]
        pname, case, found = self._best[sig]
        return CampaignFinding(pname, case, list(found), signature=sig, first_t=t, first_examples=n,
                               shrink_s=self.stats.elapsed - t, shrunk=False)

    def _example(self, prop: Property, case: Case, on_example, on_first) -> PropertyFailed | None:
        """Check one case; the failure to raise (for its first new signature) or None.  With rounds at once
        (pipeline > 1) the bookkeeping and the callbacks hold self._lock and the check holds self._check_lock (the
        worker checks one case at a time): a round's check overlaps the other rounds' Hypothesis draws."""
        n_before = self._count(prop, on_example)
        with self._check_lock:
            self._on_check(prop.name, case)
            t_check = time.monotonic()
            found = self._check(prop, case)
            check_s = time.monotonic() - t_check
            worker_s = None if self._worker is None else self._worker.last_worker_s
        return self._verdict(prop, case, found, check_s, worker_s, n_before, on_first)

    def _count(self, prop: Property, on_example) -> int:
        """An example is about to be checked: counted (and on_example called); the examples before it."""
        if self._confirm_error is not None:
            raise self._confirm_error
        with self._lock:
            n_before = self.stats.examples
            self.stats.note_example(prop.name)
            self.stats.examples += 1
            self.stats.launches += 1
            on_example()
        return n_before

    def _submit(self, prop: Property, case: Case, on_example) -> None:
        """Deferred verdicts: send one case to the worker without waiting for its answer (_collect takes it)."""
        n_before = self._count(prop, on_example)
        with self._check_lock:
            self._on_check(prop.name, case)
            self._set_timeout()
            self._worker.submit(prop.name, case, tag=(prop, n_before))

    def _collect(self, on_first) -> tuple[Case, PropertyFailed | None]:
        """Deferred verdicts: the oldest case sent and what its check gives (_verdict); its check_s in the record is
        the time this process waited for the answer."""
        with self._check_lock:
            t0 = time.monotonic()
            _, case, found, (prop, n_before) = self._worker.collect()
            check_s = time.monotonic() - t0
            worker_s = self._worker.last_worker_s
        return case, self._verdict(prop, case, found, check_s, worker_s, n_before, on_first)

    def _verdict(self, prop: Property, case: Case, found, check_s: float, worker_s: float | None, n_before: int,
                 on_first) -> PropertyFailed | None:
        """What one check of `case` gave (`found`), taken into the campaign's books: known and repeated signatures
        counted, the record written, a new signature's first sighting noted (and confirmed: _confirm_later).  The
        failure to raise (its first new signature), or None."""
        rs = self._rs
        with self._lock:
            known_sigs = self.known_for(case)
            known, new = self.classify(found, case, known_sigs)
            for f in known:
                sig = f.signature()
                if sig in known_sigs:
                    self.known_hits[sig] += 1
                else:
                    self.repeats[sig] += 1
            if self._records is not None:
                self._records.write(json.dumps(dict(
                    i=n_before + 1, t=round(self.stats.elapsed, 3), check_s=round(check_s, 5),
                    **({} if worker_s is None else dict(worker_s=round(worker_s, 5))), prop=prop.name,
                    **case.record_fields(), metrics=getattr(found, "metrics", None), failed=[f.prop for f in found],
                    signatures=sorted({f.signature() for f in found}),
                    known=sorted({f.signature() for f in known}))) + "\n")
            if not new:
                return None
            sig = min(f.signature() for f in new)  # one signature per failing example, deterministically
            if sig in self.unconfirmed:  # a fresh worker did not repeat it: neither shrunk nor filed
                return None
            if self._owner.get(sig, rs) is not rs:  # another running round is shrinking it: a repeat here
                self.repeats[sig] += 1
                return None
            self._best[sig] = (prop.name, case, found)
            if sig not in self._first:
                t = self.stats.elapsed
                self._first[sig] = (t, n_before, prop.name)
                self._owner[sig] = rs
                rs.new.append(sig)
                if self._worker is None:
                    on_first(sig, prop.name, case, found, t, n_before)
                else:
                    self._confirm_later(prop, case, sig, found, n_before, on_first)
        return failure_class(sig)(case, list(found), sig)

    def _confirm_later(self, prop: Property, case: Case, sig: str, found, n_before: int, on_first) -> None:
        """Start the fresh-process confirmation of a new failure (isolated campaigns; self._lock held).

        A kernel bug is filed only if it comes back in a fresh worker process (not an artefact of a worker poisoned
        by an earlier launch, nor of a flaky machine), checked on its first failing case.  The check runs on the
        confirmer threads (confirmations_at_once of them at a time, the first in the worker's spare process) while the
        round that saw the failure shrinks it and the other rounds go on checking: on the GPU a confirmation is a
        process's first check (2.4-5.1 s on an H100, run 87), and it used to hold every round's check for that long.
        When it comes back, the signature's first time is set and on_first is called; when it does not, the
        signature is unconfirmed: its later failing examples pass (the shrink stops) and it is not filed.  Its
        round's end waits for it (_settle)."""
        if self._confirmer is None:
            self._confirmer = ThreadPoolExecutor(max_workers=self.confirmations_at_once,
                                                 thread_name_prefix="gdn-fuzz-confirm")

        def confirm() -> bool | None:
            try:
                if self._confirm_aborted:
                    return None
                again = self._worker.reproduces(prop.name, case, sig)
                with self._lock:
                    if self._confirm_aborted:  # its process was killed: no answer, the failure is not filed
                        return None
                    if again is not True:
                        self.unconfirmed.setdefault(sig, dict(prop=prop.name, case=case.to_dict(), reproduced=again,
                                                              findings=[str(f) for f in found]))
                        return False
                    t = self.stats.elapsed  # filed from here on: the time a user is told of it, as before
                    self._first[sig] = (t, n_before, prop.name)
                    self._repeated.add(sig)
                    on_first(sig, prop.name, case, found, t, n_before)
                return True
            except BaseException as e:  # a SetupError, or on_first's stop: the rounds raise it (_example, _settle)
                self._confirm_error = e
                raise

        self._confirming[sig] = self._confirmer.submit(confirm)

    def _settle(self, sigs, quiet: bool = False) -> None:
        """Wait for the confirmations of these signatures still running (not holding self._lock: they take it).
        What one raised is raised here, unless quiet (a stop already under way).  A KeyboardInterrupt while waiting
        is a second Ctrl-C (the first only notes a stop): the confirmations are ended (_abort_confirmations), and it
        is raised."""
        t0 = time.monotonic()
        try:
            for sig in sigs:
                fut = self._confirming.get(sig)
                if fut is None:
                    continue
                try:
                    wait_futures([fut])
                except KeyboardInterrupt:
                    self._abort_confirmations()
                    raise
                if not quiet and not fut.cancelled() and fut.exception() is not None:
                    raise fut.exception()
        finally:
            with self._lock:
                self.stats.confirm_wait_s += time.monotonic() - t0

    def _confirmed(self, sig: str) -> bool:
        """Did a fresh process repeat this failure (or need it not: no isolation)?"""
        return sig not in self.unconfirmed and (sig not in self._confirming or sig in self._repeated)

    def _abort_confirmations(self) -> None:
        """A second Ctrl-C: the confirmation running is ended (its process killed) and those waiting never start;
        their failures are not filed (as when the confirmation held the round: the interrupt ended it)."""
        self._confirm_aborted = True
        if self._worker is not None:
            self._worker.abort_reproduce()
        for fut in self._confirming.values():
            fut.cancel()

    def _end_confirmer(self) -> None:
        """Wait for every confirmation still running (before the worker closes), and forget them.  A Ctrl-C during
        the wait ends them (_abort_confirmations) and is raised once they are gone."""
        try:
            if self._confirmer is not None:
                try:
                    self._confirmer.shutdown(wait=True)
                except KeyboardInterrupt:
                    self._abort_confirmations()
                    self._confirmer.shutdown(wait=True, cancel_futures=True)
                    raise
        finally:
            self._confirmer = None
            self._confirming.clear()
            self._confirm_error = None
            self._confirm_aborted = False

    def _keep(self, f: CampaignFinding, on_finding) -> None:
        with self._lock:
            if f.signature in self.findings:
                return
            self.findings[f.signature] = f  # isolated: its first failing case came back in a fresh worker
            self._record(f)
            on_finding(f)

    def check_aside(self, prop_name: str, case: Case) -> list:
        """The findings of property `prop_name` on `case`, checked outside the campaign's examples (not counted,
        not recorded, never filed): what a finding's explanation asks of its neighbours (reproducer.explain's
        check).  In the campaign's own worker when it is isolated, the one every example runs in (started already:
        its compiles paid), else in this process.  It used to start a worker process of its own per finding, on
        the round's thread inside the budget: 5-8 s per finding on the CPU machine (two campaign processes) and
        the ~13 s of run 88's idle worker on an H100 (docs/benchmarks.md, "Issue 32, fifteenth part")."""
        prop = get_property(prop_name)
        with self._check_lock:
            return list(self._check(prop, case))

    def recheck(self, prop_name: str, case: Case, on_finding=lambda f: None) -> dict:
        """Check one case in a fresh isolated worker process (whatever `isolate` says): the case a lost
        fleet worker had in flight (gdn_fuzz.engine.fleet), which may be what killed it.  A new
        signature is filed as a finding (unshrunk: the case is what was in flight) and given to
        on_finding.  Returns {"outcome": "passed" | "failed", "signatures": [...], "new": [...]}."""
        prop = get_property(prop_name)
        with Worker(self.target.name, self.device, name="recheck", torch_threads=self.torch_threads,
                    oracle_arms=self.arms, oracle_Ts=self.Ts) as w:
            if self.launch_timeout_s is not None:
                w.timeout_s = self.launch_timeout_s
            found = w.check(prop.name, case)
        known_sigs = self.known_for(case)
        known, new = self.classify(found, case, known_sigs)
        sigs = sorted({f.signature() for f in found})
        fresh = sorted({f.signature() for f in new})
        for sig in fresh:
            t = self.stats.elapsed
            self._keep(CampaignFinding(prop.name, case, list(found), signature=sig, first_t=t,
                                       first_examples=self.stats.examples, shrink_s=0.0, shrunk=False), on_finding)
        for f in known:
            if f.signature() in known_sigs:
                self.known_hits[f.signature()] += 1
        return dict(outcome="failed" if sigs else "passed", signatures=sigs, new=fresh)

    def request_stop(self) -> None:
        """Ask a running campaign to stop as a first Ctrl-C does (from any thread: a fleet worker's
        control thread): at the next example or between rounds, failures seen so far are kept."""
        self._stop_requested = True

    def learn(self, known: dict) -> None:
        """Signatures found elsewhere (another worker of a fleet: signature -> corpus entry name) to
        treat as known from the next round on (from any thread).  A signature this campaign has seen
        fail itself is left alone: it is being shrunk, or already found, here."""
        self._learned.update(known)

    def _absorb_learned(self) -> None:
        while self._learned:
            sig, name = self._learned.popitem()
            if sig not in self._first and sig not in self.findings:
                self.known.setdefault(sig, name)

    def run(self, *, seconds: float | None = None, examples: int | None = None, on_example=lambda: None,
            on_finding=lambda f: None, on_first=lambda *a: None, on_check=lambda prop, case: None) -> "Campaign":
        """Rounds over all properties until a budget is spent.

        on_first(signature, prop, case, findings, t, examples_before): the first failing example
        of a new signature, at once (before shrinking); on_finding(CampaignFinding): after it is
        shrunk and stored; on_check(prop name, case): right before each check (a fleet worker tells
        its driver the case in flight).  KeyboardInterrupt or request_stop() stops the campaign;
        failures already seen are kept (stored with their best case so far, shrunk=False) and
        `interrupted` is set.

        pipeline = N > 1: N threads each take the next round of the same sequence (the same round seeds, the same
        sizes) and run it as its own Hypothesis run (Hypothesis >= 6.136 runs tests on several threads; a round's
        draws are those it makes alone: tests/test_pipeline.py), so that one round draws its next example while
        another's case is checked: the check (the isolated worker) takes one case at a time, the bookkeeping and
        the callbacks are serialized by a lock.  A signature a running round is shrinking counts as a repeat in
        the others.  The order in which the rounds' checks reach the worker then depends on timing (which
        signatures a round sees as known, the record's order); pipeline = 1 runs the rounds one after another in
        this thread, as before.  The callbacks run on the rounds' threads, one at a time.
        """
        if seconds is None and examples is None:
            raise ValueError("give a budget: seconds=... or examples=... (both may be set; the first reached stops)")
        compiles0 = self._compiles()
        self._deadline = (seconds, examples)
        self._on_check = on_check
        self._halt = False
        _constants_scanned()  # not in each round's first draws at once
        restore = self._catch_sigint()
        plan = self._round_plan()
        switch = sys.getswitchinterval()
        if self.pipeline > 1:  # put back in `finally`
            sys.setswitchinterval(min(switch, PIPELINE_SWITCH_S))
        gc.collect()  # the garbage made so far (the warm-up's cycles, tensors among them) freed, not frozen with it
        gc.freeze()  # undone in `finally` (FREEZE_GC)

        def next_round():
            with self._lock:
                if self._stop_requested:
                    raise KeyboardInterrupt
                if self.budget_spent():
                    return None
                self._absorb_learned()
                return next(plan)

        def run_rounds():
            while (r := next_round()) is not None:
                i, prop, size = r
                self._tls.round = rs = _RoundState()
                t0 = self.stats.elapsed
                found = self._round(prop, self.seed * 1_000_003 + i, on_example, on_first, n=size)
                with self._lock:
                    if prop.name in self.stats.per_property:
                        self.stats.per_property[prop.name]["seconds"] += self.stats.elapsed - t0
                    self.stats.rounds += 1
                    self.stats.compiles = self._compiles() - compiles0
                    for f in sorted(found, key=lambda x: x.signature):
                        if self._confirmed(f.signature):
                            self._keep(f, on_finding)
                    for sig in rs.new:  # kept (or cut short): no longer this round's
                        self._owner.pop(sig, None)
                    if self.stop_on_finding and self.findings:
                        self._halt = True

        try:
            if self.pipeline == 1:
                run_rounds()
            else:
                self._run_threads(run_rounds)
            return self
        except KeyboardInterrupt:
            self.interrupted = True
            try:
                self._settle(list(self._best), quiet=True)  # the confirmations running finish (a first Ctrl-C)
            except KeyboardInterrupt:  # a second one ended them (_settle); their failures are not filed
                pass
            for sig in sorted(self._best):
                if self._confirmed(sig):
                    self._keep(self._unshrunk(sig), on_finding)
            return self
        finally:
            gc.unfreeze()  # what was alive at the start is collectable again (a process that runs several campaigns)
            restore()
            sys.setswitchinterval(switch)
            self._deadline = None
            self._on_check = lambda prop, case: None
            self._stop_requested = False  # this run's stop is spent (a later run() starts afresh)
            self._owner.clear()
            try:
                self._end_confirmer()
            finally:
                self.stats.compiles = self._compiles() - compiles0
                self.close()

    def _round_plan(self):
        """(round index, property, size) of every round of a run, in order: passes over the properties, the size
        doubling each pass from first_round_examples up to round_examples; the index (the round's seed) goes on
        from the rounds of earlier runs."""
        size = max(1, min(self.first_round_examples, self.round_examples))
        i = self.stats.rounds
        while True:
            for prop in self.properties:
                yield i, prop, size
                i += 1
            size = min(2 * size, self.round_examples)

    def _run_threads(self, run_rounds) -> None:
        """run_rounds on `pipeline` threads until each ends; the first error of a thread (a KeyboardInterrupt last)
        is raised here, once every thread has stopped (an error stops the others at their next example)."""
        errors: list = []

        def main():
            try:
                run_rounds()
            except BaseException as e:  # noqa: BLE001 - raised in the calling thread below
                with self._lock:
                    errors.append(e)
                self._stop_requested = True

        threads = [threading.Thread(target=main, name=f"gdn-fuzz-round-{k}", daemon=True)
                   for k in range(self.pipeline)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                try:
                    t.join(0.2)
                except KeyboardInterrupt:  # a second Ctrl-C: every round stops at its next example
                    self._stop_requested = True
        if errors:
            raise next((e for e in errors if not isinstance(e, KeyboardInterrupt)), errors[0])

    def close(self) -> None:
        """Stop the isolated worker (a later check starts a fresh one) and flush the record file.
        run() does this when it ends; a caller whose warm_up() was interrupted does it itself."""
        if self._worker is not None:
            self._worker.close()
        if self._records is not None:
            self._records.flush()

    def _catch_sigint(self):
        """While run() runs: a first SIGINT only sets a flag, turned into KeyboardInterrupt at the
        next example or between rounds (a SIGINT that lands inside Hypothesis' engine, e.g. while
        it sets a round up, broke the engine with an AssertionError instead of stopping cleanly);
        a second SIGINT stops at once.  Returns the function that puts the old handler back."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = signal.getsignal(signal.SIGINT)
        if old in (signal.SIG_IGN, None):  # the caller ignores SIGINT (e.g. an xdist worker): keep that
            return lambda: None

        def on_sigint(signum, frame):
            if self._stop_requested:
                raise KeyboardInterrupt
            self._stop_requested = True

        signal.signal(signal.SIGINT, on_sigint)
        return lambda: signal.signal(signal.SIGINT, old)

    def known_summary(self) -> list[dict]:
        """Known signatures seen in this run: signature, corpus entry, examples that showed it."""
        return [dict(signature=s, corpus_entry=self.known.get(s) or self._model_known.get(s), examples=n, known=True)
                for s, n in sorted(self.known_hits.items())]
