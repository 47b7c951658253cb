"""A check's device work replayed as a CUDA graph, per launch shape (issue 32).

checks.verdict(obs) -- the fused oracle, the comparison in its kernel, the tolerance metrics, the
write-set bit comparisons and the summary, ~400 small GPU operations -- is a pure function of the
observation's tensors and of a few scalars of its Case, with no host round trip.  On a CUDA device
each of those operations costs ~10-20 us of host time against a 0.7 ms kernel under test
(docs/benchmarks.md), so check_launch was host-bound.  run() captures verdict once per key and then
replays it: the observation's tensors are copied into the graph's own (static) tensors, one replay,
and the caller reads the result.  Only the check is captured, never the target's launch.

The key holds everything verdict reads besides tensor values: the arm (its tolerance table), the scale,
the cursor mode (restart_hist_on_flush), whether the launch returned an output, and every tensor's name,
shape, stride and dtype -- with two exceptions that keep a campaign's shapes to few keys (one per arm,
T, geometry and batch bucket, the shapes its warm-up compiles):
  flush_min   a 0-d device tensor of the graph, copied in before each replay (checks.verdict takes it);
  the pool    the pool-indexed buffers (POOL_BUFFERS, contiguous) of a graph have pool_rows(pool) rows;
              a launch's rows are copied into the first ones, and the rest stay zero in both the
              "before" and the "after" copies: no launch reads them, and the write-set check finds
              them unchanged (its pool size is the tensors').
A key is captured at its CAPTURE_AT-th sighting (a key seen once would pay a capture, ~3 eager checks,
for nothing); the MAX_GRAPHS most recently used graphs are kept, and a launch whose static copies would
pass MAX_STATIC_BYTES (a large bucket at HV = 64: a pool row is 2 MiB in bf16) is checked eagerly.

Only launches materialized from their Case (Observation.from_case) are replayed: their cursors are
validated on the host from the Case's rows (checks._check_case_cursors, run's before_replay),
so verdict has no host synchronization to capture.  A capture that fails leaves its key eager for the
rest of the process (stats().failed names why); the check's result never depends on the graph.

GDN_FUZZ_GRAPHS: auto (default: capture on CUDA devices), off (always eager).  benchmarks/throughput.py
times both.  tests/test_graphs.py checks that a replay gives the eager verdict's bits (on CUDA).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from gdn_fuzz import environment

ENV = "GDN_FUZZ_GRAPHS"
CHOICES = ("auto", "off")
CAPTURE_AT = 2  # the sighting of a key at which it is captured
MAX_GRAPHS = 128  # graphs kept (least recently used dropped): a campaign's default menu has ~60 keys
MAX_STATIC_BYTES = 2 << 30  # a graph's static copies (before + after) past this: the check of that shape runs eagerly
POOL_BUFFERS = ("initial_state_source", "k_cache", "u_cache", "g_cache")
MIN_POOL_ROWS = 16  # the campaign's small pools (a bucket of 4 or 8 rows + up to 6 spare) share one key


def choice() -> str:
    """GDN_FUZZ_GRAPHS, validated: auto (default) or off."""
    return environment.choice(ENV, CHOICES, "auto: replay each check as a CUDA graph on a CUDA device; off: run it "
                              "eagerly")


@dataclass
class Stats:
    """What run() did in this process: replays, eager runs, captures and their seconds, failed keys."""

    replays: int = 0
    eager: int = 0
    captures: int = 0
    capture_s: float = 0.0
    failed: dict = field(default_factory=dict)  # key -> why its capture failed

    def counts(self) -> dict:
        """The numbers only (what an isolated worker sends back with each answer)."""
        return dict(replays=self.replays, eager=self.eager, captures=self.captures, capture_s=self.capture_s,
                    failed=len(self.failed))

    def as_dict(self) -> dict:
        return dict(replays=self.replays, eager=self.eager, captures=self.captures,
                    capture_s=round(self.capture_s, 3), failed=len(self.failed),
                    failed_why=sorted(set(self.failed.values()))[:3])


def add_counts(a: dict, b: dict) -> dict:
    """Stats.counts() of two processes added (a worker and its replacement)."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}


_STATS = Stats()
_SEEN: Counter = Counter()
_GRAPHS: OrderedDict = OrderedDict()


def stats() -> Stats:
    return _STATS


def reset() -> None:
    """Drop every graph and the counts (tests; a benchmark between modes)."""
    global _STATS
    _GRAPHS.clear()
    _SEEN.clear()
    _STATS = Stats()


def _tensors(d: dict):
    return tuple((k, v) for k, v in d.items() if isinstance(v, torch.Tensor))


def pool_rows(pool: int) -> int:
    """Rows of a graph's pool-indexed buffers for a launch's pool of `pool` rows: a power of two, >= 16."""
    return max(MIN_POOL_ROWS, 1 << (int(pool) - 1).bit_length())


def _padded(name: str, t: torch.Tensor) -> bool:
    return name in POOL_BUFFERS and t.is_contiguous() and t.dim() > 0


def _shape(name: str, t: torch.Tensor) -> tuple:
    return ((pool_rows(t.shape[0]),) + tuple(t.shape[1:])) if _padded(name, t) else tuple(t.shape)


def _layout(name: str, t: torch.Tensor) -> tuple:
    stride = None if _padded(name, t) else t.stride()  # contiguous: the same strides for any row count
    return _shape(name, t), stride, t.dtype, str(t.device)


def key(obs) -> tuple:
    """Everything checks.verdict reads of obs besides its tensors' values and flush_min (the module docstring)."""
    c, b = obs.case, obs.before
    return (c.arm, c.K, c.restart_hist_on_flush, b.get("scale"),
            tuple((k, _layout(k, v)) for k, v in _tensors(b)),
            tuple((k, _layout(k, v)) for k, v in _tensors(obs.after)),
            None if obs.output is None else _layout("output", obs.output))


def static_bytes(obs) -> int:
    """Bytes of the static copies a graph of obs would hold (its before, after and output tensors, padded)."""
    n = sum(math.prod(_shape(k, v)) * v.element_size() for d in (obs.before, obs.after) for k, v in _tensors(d))
    return n + (0 if obs.output is None else obs.output.numel() * obs.output.element_size())


def _static_like(name: str, t: torch.Tensor) -> torch.Tensor:
    if _padded(name, t):  # zeros: rows past the launch's pool are equal before and after, and never read
        return torch.zeros(_shape(name, t), dtype=t.dtype, device=t.device)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


class _Graph:
    """One captured verdict: the static observation it reads, the graph, and its output tensor.
    capture=False (tests, on any device): the same static tensors, fn run on them eagerly at each run()."""

    def __init__(self, fn, obs, capture: bool = True):
        dev = obs.before["q"].device
        self.before = {k: (_static_like(k, v) if isinstance(v, torch.Tensor) else v) for k, v in obs.before.items()}
        self.after = {k: (_static_like(k, v) if isinstance(v, torch.Tensor) else v) for k, v in obs.after.items()}
        self.output = None if obs.output is None else _static_like("output", obs.output)
        self.flush_min = torch.zeros((), dtype=torch.int64, device=dev)
        self.obs = replace(obs, before=self.before, after=self.after, output=self.output)
        self.rows = 0  # pool rows of the last launch loaded (rows past it are zeros)
        self.fn, self.graph = fn, None
        self.load(obs)
        if not capture:
            return
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton compiles, the allocator's first blocks
            fn(self.obs, flush_min=self.flush_min)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.out = fn(self.obs, flush_min=self.flush_min)

    def load(self, obs) -> None:
        n = obs.before["initial_state_source"].shape[0]
        for static, src in ((self.before, obs.before), (self.after, obs.after)):
            for k, v in _tensors(src):
                if _padded(k, v):
                    static[k][:n].copy_(v)
                    if n < self.rows:  # the previous launch's rows past this pool: zeros again, before and after
                        static[k][n:self.rows].zero_()
                else:
                    static[k].copy_(v)
        self.rows = n
        if self.output is not None:
            self.output.copy_(obs.output)
        self.flush_min.fill_(obs.case.fmin)

    def run(self, obs) -> torch.Tensor:
        self.load(obs)
        if self.graph is None:
            return self.fn(self.obs, flush_min=self.flush_min)
        self.graph.replay()
        return self.out


def _eager(fn, obs) -> torch.Tensor:
    _STATS.eager += 1
    return fn(obs)


def run(fn, obs, before_replay=None) -> torch.Tensor:
    """fn(obs) (checks.verdict; it takes flush_min as a keyword), replayed from a CUDA graph where this module's
    rules allow (the module docstring), else eagerly.  before_replay(obs): the host work of fn that a replay
    skips (checks passes its cursor validation), called before each replay.  The result is a device tensor:
    read it before the next run() of the same key (a replay overwrites it)."""
    q = obs.before.get("q")
    if (choice() == "off" or not isinstance(q, torch.Tensor) or q.device.type != "cuda" or not obs.from_case
            or getattr(obs.case, "fill", None) == "rows"):
        return _eager(fn, obs)
    k = key(obs)
    if k in _STATS.failed:
        return _eager(fn, obs)
    g = _GRAPHS.get(k)
    if g is None:
        _SEEN[k] += 1
        if _SEEN[k] < CAPTURE_AT or static_bytes(obs) > MAX_STATIC_BYTES:
            return _eager(fn, obs)
        t0 = time.perf_counter()
        try:
            g = _Graph(fn, obs)
        except Exception as e:  # not capturable here: this key stays eager; the check itself is unaffected
            where = [f for f in traceback.extract_tb(e.__traceback__) if "gdn_fuzz" in f.filename or
                     "oracles" in f.filename]
            at = f" at {Path(where[-1].filename).name}:{where[-1].lineno} ({where[-1].name})" if where else ""
            why = f"{type(e).__name__}{at}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            if not _STATS.failed:
                print(f"gdn-fuzz: a CUDA graph of the check could not be captured ({why}); checks of that shape run "
                      f"eagerly (same results, slower; {ENV}=off silences this)", file=sys.stderr)
            _STATS.failed[k] = why
            torch.cuda.synchronize()
            return _eager(fn, obs)
        _STATS.captures += 1
        _STATS.capture_s += time.perf_counter() - t0
        _GRAPHS[k] = g
        while len(_GRAPHS) > MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
    else:
        _GRAPHS.move_to_end(k)
    if before_replay is not None:
        before_replay(obs)
    _STATS.replays += 1
    return g.run(obs)
