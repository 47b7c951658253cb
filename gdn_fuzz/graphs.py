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

The draw program (draw()): materialize() of a draws="graph" case (the GPU campaign's default) is
case.graph_program, a function of fixed shapes of the case's seed, rows and regime, with no host round trip.
It is captured per graph_dims (arm, B, T, geometry, the pool rounded up by case.graph_pool_rows, poison) at the
CAPTURE_AT-th sighting, with its own
generator registered with the graph (torch's graph-safe Philox state: a replay after manual_seed(seed) draws
what an eager run from that seed draws), and replayed with the next case's data; its outputs are cloned, so
the caller owns them.  The draw graphs share one memory pool per device and keep at most MAX_DRAW_BYTES of
static outputs (least recently used dropped).  The ~150 small operations of a materialize become one replay
and the clones.

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
MAX_DRAW_GRAPHS = 128  # draw graphs kept (case.materialize of draws="graph"; one per case.graph_dims)
MAX_DRAW_BYTES = 4 << 30  # their static outputs past this: the least recently used dropped (a B = 64 pool at HV = 64
#                           in float32 is ~0.3 GiB; eight processes share one GPU)


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


class _Cache:
    """Graphs by key: a key is captured at its CAPTURE_AT-th sighting, a capture that fails leaves its key eager for
    the rest of the process (stats.failed says why), the most recently used are kept (at most `max_graphs`, and
    for draw graphs at most `max_bytes` of static outputs)."""

    def __init__(self, what: str, max_graphs: int, max_bytes: float = math.inf):
        self.what, self.max_graphs, self.max_bytes = what, max_graphs, max_bytes
        self.stats, self.seen, self.graphs = Stats(), Counter(), OrderedDict()

    def get(self, k, build, eligible=None):
        """The graph of key k (build() captures it), or None: run eagerly.  eligible(): whether a key not yet
        captured may be (asked on a miss only)."""
        if k in self.stats.failed:
            return None
        g = self.graphs.get(k)
        if g is not None:
            self.graphs.move_to_end(k)
            return g
        self.seen[k] += 1
        if self.seen[k] < CAPTURE_AT or (eligible is not None and not eligible()):
            return None
        t0 = time.perf_counter()
        try:
            g = build()
        except Exception as e:  # not capturable here: this key stays eager; the result itself is unaffected
            where = [f for f in traceback.extract_tb(e.__traceback__) if "gdn_fuzz" in f.filename or
                     "oracles" in f.filename]
            at = f" at {Path(where[-1].filename).name}:{where[-1].lineno} ({where[-1].name})" if where else ""
            why = f"{type(e).__name__}{at}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            if not self.stats.failed:
                print(f"gdn-fuzz: a CUDA graph of the {self.what} could not be captured ({why}); that shape runs "
                      f"eagerly (same results, slower; {ENV}=off silences this)", file=sys.stderr)
            self.stats.failed[k] = why
            torch.cuda.synchronize()
            return None
        self.stats.captures += 1
        self.stats.capture_s += time.perf_counter() - t0
        self.graphs[k] = g
        while len(self.graphs) > self.max_graphs or (
                self.max_bytes < math.inf and len(self.graphs) > 1
                and sum(x.nbytes for x in self.graphs.values()) > self.max_bytes):
            self.graphs.popitem(last=False)
        return g


_CHECKS = _Cache("check", MAX_GRAPHS)
_DRAWS = _Cache("draw program", MAX_DRAW_GRAPHS, MAX_DRAW_BYTES)


def stats() -> Stats:
    """The check graphs' counts in this process."""
    return _CHECKS.stats


def draw_stats() -> Stats:
    """The draw graphs' counts in this process (case.materialize of draws="graph" cases)."""
    return _DRAWS.stats


def counts() -> dict:
    """Both caches' numbers (what an isolated worker sends back with each answer): the check's as Stats.counts(),
    the draw program's with a draw_ prefix."""
    return dict(stats().counts(), **{f"draw_{k}": v for k, v in draw_stats().counts().items()})


def reset() -> None:
    """Drop every graph and the counts (tests; a benchmark between modes)."""
    global _CHECKS, _DRAWS
    _CHECKS = _Cache("check", MAX_GRAPHS)
    _DRAWS = _Cache("draw program", MAX_DRAW_GRAPHS, MAX_DRAW_BYTES)


def _by_dtype(*lists: list) -> list[tuple[list, ...]]:
    """The parallel lists cut into groups of one (dtype, device) per list each, the order within a group kept:
    torch's CUDA foreach fast route (a multi-tensor kernel) takes only single-dtype lists
    (ForeachBinaryOpList.cu, foreach_tensor_copy_list_kernel_cuda_; ForeachUtils.h), so a mixed list falls back to
    a launch per tensor."""
    groups: dict = {}
    for row in zip(*lists, strict=True):  # per check, on the host: ~1.2 us a row on the CPU machine, 2.0 before
        key = tuple([(t.dtype, t.get_device()) for t in row])  # get_device: an int, cheaper than .device's object
        cols = groups.get(key)
        if cols is None:
            cols = groups[key] = tuple([] for _ in lists)
        for col, t in zip(cols, row):
            col.append(t)
    return list(groups.values())


def copy_all(dst: list, src: list) -> None:
    """dst[i].copy_(src[i]) for every i, one torch._foreach_copy_ per dtype group (_by_dtype); the same bits.  A
    check's host part copied its tensors one by one: 60 copies per check on the campaign's shapes, most of them here
    (docs/benchmarks.md, issue 32, ninth part).  One call over the whole mixed-dtype list (ae76ae9) changed nothing
    measurable in run 90, and run 91's profile still showed one device copy per tensor (28-29 per copy set): the
    fast route had not been taken.  Grouped (run 93, H100, --profile phases): at B = 8 a copy set is 2 multi-tensor
    kernels, 0.044 ms against 28 copies' 0.064; at B = 64 9-10 kernels, 0.318 ms against 0.281 (buffers of hundreds
    of MB move faster by the copy engine)."""
    for ds, ss in _by_dtype(dst, src):
        torch._foreach_copy_(ds, ss)


def zero_all(ts: list) -> None:
    """t.zero_() for every t, one torch._foreach_zero_ per dtype group (_by_dtype)."""
    for (group,) in _by_dtype(ts):
        torch._foreach_zero_(group)


def clone_all(ts: list) -> list:
    """[t.clone() for t in ts] (the same layouts: empty_like keeps a dense tensor's strides, as clone does), copied by
    copy_all."""
    out = [torch.empty_like(t) for t in ts]
    copy_all(out, list(ts))
    return out


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


def _capture(fn, dev, pool=None, generator=None):
    """(graph, fn()'s result) of fn captured on `dev`, after one warm-up run on a side stream (Triton compiles, the
    allocator's first blocks); pool: the graph's memory pool; generator: a generator fn draws from, registered."""
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn()
    return graph, out


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
        if capture:
            self.graph, self.out = _capture(lambda: fn(self.obs, flush_min=self.flush_min), dev)

    def load(self, obs) -> None:
        n = obs.before["initial_state_source"].shape[0]
        dst, src, stale = [], [], []
        for static, given in ((self.before, obs.before), (self.after, obs.after)):
            for k, v in _tensors(given):
                if _padded(k, v):
                    dst.append(static[k][:n])
                    if n < self.rows:  # the previous launch's rows past this pool: zeros again, before and after
                        stale.append(static[k][n:self.rows])
                else:
                    dst.append(static[k])
                src.append(v)
        if self.output is not None:
            dst.append(self.output)
            src.append(obs.output)
        copy_all(dst, src)
        if stale:
            zero_all(stale)
        self.rows = n
        self.flush_min.fill_(obs.case.fmin)

    def run(self, obs) -> torch.Tensor:
        self.load(obs)
        if self.graph is None:
            return self.fn(self.obs, flush_min=self.flush_min)
        self.graph.replay()
        return self.out


def _eager(fn, obs) -> torch.Tensor:
    _CHECKS.stats.eager += 1
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
    g = _CHECKS.get(key(obs), lambda: _Graph(fn, obs), eligible=lambda: static_bytes(obs) <= MAX_STATIC_BYTES)
    if g is None:
        return _eager(fn, obs)
    if before_replay is not None:
        before_replay(obs)
    _CHECKS.stats.replays += 1
    return g.run(obs)


class _DrawGraph:
    """One captured draw program (case.graph_program) of one shape: its static inputs (rows, regime), its own
    generator, registered with the graph (a replay draws what an eager run from the same seed draws: torch's
    graph-safe Philox state), and its outputs, which run() clones (the next replay overwrites them)."""

    def __init__(self, program, dims: tuple, rows: torch.Tensor, regime: torch.Tensor, dev: torch.device):
        self.rows, self.regime, self.gen = rows.to(dev), regime.to(dev), torch.Generator(device=dev)
        self.graph, self.out = _capture(lambda: program(self.rows, self.regime, self.gen, dims), dev,
                                        pool=_draw_pool(dev), generator=self.gen)
        self.nbytes = sum(t.untyped_storage().nbytes() for t in self.out.values())

    def run(self, rows: torch.Tensor, regime: torch.Tensor, seed: int, pool: int) -> dict:
        self.rows.copy_(rows)
        self.regime.copy_(regime)
        self.gen.manual_seed(seed)
        self.graph.replay()
        return _owned(self.out, pool)


def _owned(out: dict, pool: int) -> dict:
    """The draw program's outputs as the caller's own tensors, the pool-indexed ones cut to `pool` rows."""
    return dict(zip(out, clone_all([v[:pool] if k in POOL_BUFFERS else v for k, v in out.items()])))


_POOLS: dict = {}


def _draw_pool(dev: torch.device):
    """One memory pool for every draw graph of a device: a replay's outputs are cloned before the next replay
    (one stream), so the graphs' intermediates may share blocks."""
    if dev not in _POOLS:
        _POOLS[dev] = torch.cuda.graph_pool_handle()
    return _POOLS[dev]


def draw(program, dims: tuple, rows: torch.Tensor, regime: torch.Tensor, seed: int, dev: torch.device,
         pool: int) -> dict:
    """program(rows, regime, generator seeded with `seed`, dims) on `dev` (case.graph_program: rows and regime are
    its CPU inputs), replayed from a CUDA graph per dims on a CUDA device (GDN_FUZZ_GRAPHS=auto), else run eagerly;
    the pool-indexed outputs cut to their first `pool` rows.  Either way the tensors returned are the caller's own."""
    g = None
    if choice() != "off" and dev.type == "cuda":
        g = _DRAWS.get((dims, str(dev)), lambda: _DrawGraph(program, dims, rows, regime, dev))
    if g is None:
        _DRAWS.stats.eager += 1
        gen = torch.Generator(device=dev).manual_seed(seed)
        return _owned(program(rows.to(dev), regime.to(dev), gen, dims), pool)
    _DRAWS.stats.replays += 1
    return g.run(rows, regime, seed, pool)
