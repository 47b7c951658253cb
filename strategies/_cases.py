"""Hypothesis strategies for single launches (Cases) of the ReplaySSM step.

Hypothesis draws structure only: geometry, arm, batch rows and their cursors, flush_min,
value regime and a seed.  Tensors come from the seed (gdn_fuzz.case.materialize), so a
shrunk example is a short, readable Case.

Cursor values are drawn from the edges the contract cares about, each with its own
branch so the shrinker can walk between them: P = 0, 1, flush_min - 1, flush_min,
flush_min + 1, 16 and any value in [0, 16]; bases 0, 31, 32 - P (window ends exactly at
the wrap), wrapped windows (base + P > 32) and any value in [0, 32).
Batches are padded with pad rows (slot -1) to a power-of-two bucket, so the production
kernel compiles once per (arm, T, bucket, geometry) (contract D4).

A property that needs something of the Case asks for it with need= (one real row that some
legal flush_min switches, for routing; one flush row, for the fold measurements of the
precision study), so that its examples rarely exercise nothing.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from ..arms import ARM_NAMES
from ..case import BETAS, DECAYS, HISTORIES, KEYS, RING_SLOTS, W_RING, Case, Regime, Row, lazy_flush_min


# (H, HV) menus.  The production kernel compiles once per (H, HV) (D4), so campaigns on it
# draw from a short list; CPU targets may use any G = HV / H.
CPU_GEOMETRIES = ((1, 1), (1, 2), (2, 2), (2, 4), (1, 4), (4, 8))
GPU_GEOMETRIES = ((1, 1), (1, 2), (16, 64))  # G = 1, 2, 4; (16, 64) is Qwen3-Next
BUCKETS = (4, 8)
# Buckets above SMALL_BUCKET are the batch-scale branch of cases(): drawn 1 time in SCALE_ODDS (8),
# shrinking toward the small buckets (issue 18).  CPU targets draw them by default; on a GPU each
# bucket is one more JIT compile per (arm, T, geometry) (D4), so large batches there are asked for
# with `gdn-fuzz run --buckets 4 8 16 32 64 128 256` until the warm-up cost is measured.
SMALL_BUCKET = 8
SCALE_ODDS = 8
CPU_BUCKETS = (4, 8, 16, 64)
LARGE_BUCKETS = (16, 32, 64, 128, 256)


# The pool-scale branch of cases(pool_scales=...) (issue 18): taken 1 time in SCALE_ODDS, shrinking to the
# small pool.  A fill="rows" pool (only the rows' slots drawn, the rest zero: gdn_fuzz.case.Case.fill)
# with the real rows on its highest slots, of one of two sizes:
#   "thousands"  POOL_THOUSANDS slots (serving pools hold thousands of requests' states)
#   "int32"      just past 2^31 elements: the top slot's element offset slot * HV * V * K is >= 2^31,
#                where a 32-bit offset wraps (slot 2,048 for Qwen3-Next's HV = 64: > 4 GB of bf16 state)
POOL_SCALES = ("thousands", "int32")
POOL_THOUSANDS = (2048, 4096)
INT32_ELEMENTS = 2**31


def int32_slot(HV: int, V: int = 128, K: int = 128) -> int:
    """The first pool slot whose element offset slot * HV * V * K does not fit an int32."""
    return -(-INT32_ELEMENTS // (HV * V * K))


def pool_scales_for(device, geometries, arms) -> tuple[tuple, str | None]:
    """The pool-scale kinds a campaign on `device` draws (POOL_SCALES), and why one is left out (None:
    none is).  On the CPU a fill="rows" pool costs only its rows' pages, so both kinds are drawn.  On a
    CUDA device the "int32" pool (largest geometry and arm) must fit three times in the free memory
    (the launch's copy, observe()'s "before" and the allocator's slack), else it is left out."""
    import torch

    from ..case import Case, Row

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():  # CPU: lazy zeros; no CUDA: the run fails on its own
        return POOL_SCALES, None
    need = max(Case(arm=a, T=4, H=H, HV=HV, pool=int32_slot(HV) + 3, rows=(Row(0),), seed=0).alloc_bytes()
               for a in arms for H, HV in geometries)
    free = torch.cuda.mem_get_info(dev)[0]
    if 3 * need <= free:
        return POOL_SCALES, None
    return (tuple(k for k in POOL_SCALES if k != "int32"),
            f"pool-scale 'int32' left out: a pool past 2^31 elements needs ~{3 * need / 2**30:.1f} GiB on {dev} "
            f"(3 x {need / 2**30:.1f} GiB), {free / 2**30:.1f} GiB is free")


def geometries_for(target) -> tuple:
    """The (H, HV) menu for a target: the short GPU list where launches JIT-compile (D4)."""
    return GPU_GEOMETRIES if getattr(target, "needs_cuda", False) else CPU_GEOMETRIES


def buckets_for(target) -> tuple:
    """The batch buckets a campaign draws by default: BUCKETS where launches JIT-compile, else CPU_BUCKETS."""
    return BUCKETS if getattr(target, "needs_cuda", False) else CPU_BUCKETS


# Strategy objects are immutable and reusable; the factories below are memoized so that a draw
# does not build (and Hypothesis does not re-validate) fresh strategy objects every example.
# Memoizing changes no drawn value: Hypothesis draws depend on a strategy's structure, not on
# the object's identity.


@lru_cache(maxsize=None)
def _sampled(values: tuple):
    return st.sampled_from(values)


@lru_cache(maxsize=None)
def _ints(lo: int, hi: int):
    return st.integers(lo, hi)


@lru_cache(maxsize=None)
def _perms(n: int):
    return st.permutations(range(n))


@lru_cache(maxsize=None)
def flush_mins(T: int):
    """None (the lazy default 17 - T) or any legal value in [1, 17 - T] (H14)."""
    return st.one_of(st.none(), st.integers(1, lazy_flush_min(T)))


@lru_cache(maxsize=None)
def hist_lens(fmin: int):
    """P in [0, 16], with the routing edges drawn explicitly."""
    edges = sorted({0, 1, max(fmin - 1, 0), fmin, min(fmin + 1, W_RING), W_RING})
    return st.one_of(st.sampled_from(edges), st.integers(0, W_RING))


@lru_cache(maxsize=None)
def cache_bases(P: int):
    """base in [0, 32): 0, 31, exact wrap (32 - P), a wrapped window, or anything."""
    opts = [st.just(0), st.just(RING_SLOTS - 1), st.integers(0, RING_SLOTS - 1)]
    if P > 1:
        opts.insert(2, st.just((RING_SLOTS - P) % RING_SLOTS))
        opts.insert(3, st.integers(RING_SLOTS - P + 1, RING_SLOTS - 1))  # wraps inside the window
    return st.one_of(*opts)


_BOOLS = st.booleans()
# the scale menus of regimes() (the campaign report lists them, gdn_fuzz.engine.report.regime_menus).
# ||k||^2 ~ K qk_scale^2 (K = 128): 128, 1.3e-4, 1.2e5, then the eps-scale regime (M2's eps 1e-6
# dominates the norm): 1.3e-6, 1.2e-7, 1.3e-8, 1.3e-10 (issue 18); shrinks toward 1.0
QK_SCALES = (1.0, 1e-3, 30.0, 1e-4, 3e-5, 1e-5, 1e-6)
V_SCALES = (1.0, 1e-2, 8.0)
STATE_SCALES = (0.1, 1.0, 1e-3)


@st.composite
def regimes(draw, poison=None):
    """Value regimes: norms, decay strength, beta range, key structure, history source."""
    return Regime(
        qk_scale=draw(_sampled(QK_SCALES)),
        v_scale=draw(_sampled(V_SCALES)),
        state_scale=draw(_sampled(STATE_SCALES)),
        decay=draw(_sampled(DECAYS)),
        beta=draw(_sampled(BETAS)),
        keys=draw(_sampled(KEYS)),
        history=draw(_sampled(HISTORIES)),
        poison=draw(_BOOLS) if poison is None else poison,
    )


@lru_cache(maxsize=None)
def switchable_hist_lens(T: int, fmin: int):
    """P in [1, 16 - T]: a row that some legal flush_min in [1, 17 - T] routes the other way
    (P = 0 never flushes, P >= 17 - T always does), with the routing edges drawn explicitly."""
    hi = W_RING - T
    edges = sorted({p for p in (1, fmin - 1, fmin, fmin + 1, hi) if 1 <= p <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(1, hi))


@lru_cache(maxsize=None)
def flush_hist_lens(fmin: int):
    """P in [flush_min, 16]: a flush row (M7), with its edges drawn explicitly."""
    edges = sorted({fmin, min(fmin + 1, W_RING), W_RING})
    return st.one_of(st.sampled_from(edges), st.integers(fmin, W_RING))


# need= of cases()/rows_for(): what the first real row must be (the rows are permuted afterwards)
NEEDS = ("switchable", "flush")


def _needed_hist_lens(need: str, T: int, fmin: int):
    if need == "switchable":
        return switchable_hist_lens(T, fmin)
    if need == "flush":
        return flush_hist_lens(fmin)
    raise ValueError(f"need={need!r} is unknown; use None or one of {', '.join(NEEDS)}")


@st.composite
def rows_for(draw, *, T: int, fmin: int, bucket: int, pool: int, n_real: int, need: str | None = None,
             top: bool = False):
    """n_real rows on distinct, permuted pool slots, padded with pad rows to `bucket`.

    need: None, or what one real row must be: "switchable" (1 <= P <= 16 - T: some legal
    flush_min switches its route) or "flush" (P >= flush_min).  The other rows are free.
    top: the rows sit on the n_real highest slots of the pool (the pool-scale branch)."""
    if top:
        slots = [pool - 1 - i for i in draw(_perms(n_real))]
    else:
        slots = draw(_perms(pool))[:n_real]
    real = []
    for i, s in enumerate(slots):
        P = draw(hist_lens(fmin) if need is None or i else _needed_hist_lens(need, T, fmin))
        real.append(Row(slot=s, hist_len=P, cache_base=draw(cache_bases(P))))
    pads = [Row(slot=-1, hist_len=0, cache_base=0)] * (bucket - n_real)
    order = draw(_perms(bucket))
    allrows = real + pads
    return tuple(allrows[i] for i in order)


@st.composite
def cases(draw, *, arms=ARM_NAMES, Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=BUCKETS,
          restart=(False,), poison=None, max_extra_pool: int = 6, need: str | None = None,
          pool_scales: tuple = ()):
    """One legal launch: every cursor in range, distinct slots, pad rows to a bucket size.

    need: None (default: every row free), "switchable" (at least one real row that some legal
    flush_min routes the other way: routing) or "flush" (at least one flush row: the fold).
    pool_scales: the kinds of the pool-scale branch (POOL_SCALES) it may take; () never takes it.
    Only properties that never copy the whole pool should ask for it (a fill="rows" pool past
    2^31 elements costs its rows' slots, a copy of it costs every page)."""
    if need is not None and need not in NEEDS:
        raise ValueError(f"need={need!r} is unknown; use None or one of {', '.join(NEEDS)}")
    bad = [k for k in pool_scales if k not in POOL_SCALES]
    if bad:
        raise ValueError(f"pool_scales={tuple(pool_scales)!r}: {bad[0]!r} is unknown; use kinds of {POOL_SCALES}")
    arm = draw(_sampled(tuple(arms)))
    T = draw(_sampled(tuple(Ts)))
    H, HV = draw(_sampled(tuple(geometries)))
    bucket = draw(_buckets(tuple(buckets)))
    n_real = draw(_ints(1, bucket))
    big = draw(_pool_scale(tuple(pool_scales), HV)) if pool_scales else None
    if big is None:
        pool, fill = n_real + draw(_ints(0, max_extra_pool)), "all"
    else:
        pool, fill = max(big, n_real), "rows"
    fm = draw(flush_mins(T))
    fmin = fm if fm is not None else lazy_flush_min(T)
    rows = draw(_rows(T, fmin, bucket, pool, n_real, need, big is not None))
    return Case(arm=arm, T=T, H=H, HV=HV, pool=pool, rows=rows, flush_min=fm,
                restart_hist_on_flush=draw(_sampled(tuple(restart))),
                regime=draw(_regimes(poison)), seed=draw(_SEEDS), fill=fill)


@st.composite
def _pool_scale_draw(draw, kinds: tuple, HV: int):
    """None (the small pool), or 1 time in SCALE_ODDS the slots of a pool of one of `kinds`: one of
    POOL_THOUSANDS, or int32_slot(HV) + 1 + [0, 2] (the top slot's offset at or just past 2^31)."""
    if draw(_ints(0, SCALE_ODDS - 1)) != SCALE_ODDS - 1:
        return None
    if draw(_sampled(kinds)) == "thousands":
        return draw(_sampled(POOL_THOUSANDS))
    return int32_slot(HV) + 1 + draw(_ints(0, 2))


@lru_cache(maxsize=None)
def _pool_scale(kinds: tuple, HV: int):
    return _pool_scale_draw(kinds, HV)


_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def _scaled_bucket(draw, small: tuple, large: tuple):
    """A large bucket 1 time in SCALE_ODDS (the branch shrinks to 0: a small bucket), else a small one."""
    if draw(_ints(0, SCALE_ODDS - 1)) == SCALE_ODDS - 1:
        return draw(_sampled(large))
    return draw(_sampled(small))


@lru_cache(maxsize=None)
def _buckets(buckets: tuple):
    """The bucket strategy of a menu: buckets <= SMALL_BUCKET drawn as before; larger ones (the
    batch-scale regime) through _scaled_bucket when both kinds are in the menu."""
    small = tuple(b for b in buckets if b <= SMALL_BUCKET)
    large = tuple(b for b in buckets if b > SMALL_BUCKET)
    if small and large:
        return _scaled_bucket(small, large)
    return _sampled(buckets)


@lru_cache(maxsize=None)
def _rows(T: int, fmin: int, bucket: int, pool: int, n_real: int, need: str | None = None, top: bool = False):
    return rows_for(T=T, fmin=fmin, bucket=bucket, pool=pool, n_real=n_real, need=need, top=top)


@lru_cache(maxsize=None)
def _regimes(poison):
    return regimes(poison=poison)


def case_events(case: Case) -> list[str]:
    """Labels for hypothesis.event(): the coverage the strategy is supposed to reach."""
    ev = [f"arm={case.arm}", f"T={case.T}", f"flush_min={case.fmin}"]
    for r in case.rows:
        if r.pad:
            ev.append("row: pad")
            continue
        P = r.hist_len
        tag = ("P=0" if P == 0 else "P=16" if P == W_RING else "P=flush_min-1" if P == case.fmin - 1
               else "P=flush_min" if P == case.fmin else "P other")
        ev.append(f"row: {tag}")
        if r.cache_base + P > RING_SLOTS:
            ev.append("row: wrapped window")
    if case.pool > sum(not r.pad for r in case.rows):
        ev.append("pool > real rows")
    ev.append(f"bucket={case.B}")
    ev.append(f"pool_scale={pool_scale_of(case)}")
    return sorted(set(ev))


def pool_scale_of(case: Case) -> str:
    """The pool-scale kind a case reached (pool_scale_kind of its pool, HV and row slots)."""
    return pool_scale_kind(case.pool, case.HV, [r.slot for r in case.rows], case.V, case.K)


def pool_scale_kind(pool: int, HV: int, slots, V: int = 128, K: int = 128) -> str:
    """"int32" (a row on a slot whose element offset is >= 2^31), "thousands" (a pool of >= 1,024
    slots), else "small".  Pad rows (negative slots) count for nothing."""
    if any(s >= int32_slot(HV, V, K) for s in slots):
        return "int32"
    return "thousands" if pool >= 1024 else "small"
