"""Hypothesis strategies for calls of the prefix materializer (gdn_fuzz.prefix_case.PrefixCase).

Hypothesis draws structure only: arm, geometry, ring depth (16 or 32), pool, the requests (each src
slot's live window: base and hist; each request's dst and count), how the active list and num_active are
passed, the value regime, a seed.  Tensors come from the seed (gdn_fuzz.prefix_case.materialize_prefix).

Legal calls (what prefix_cases draws; the contract's undefined inputs are left out): destinations are
distinct, and no destination is a slot some processed request reads (PMR2, PMR3); a request's count
is at most its src's live history (PMM4's promise) unless it is skipped; requests may share a src
(PMR4: read-only).  Skipped requests come from every branch of PMS1: negative src, dst or count, and
count > 16.  Counts are drawn from the edges: 0 (the copy, PMS2), 1, 15, 16, any; bases from 0,
R - 1, R - count (the window ends at the wrap), wrapped windows and any int32 (indexing is mod R, PMS8).
The batch B is a power-of-two bucket: the kernel compiles once per ring depth and arm (PMD4) and B is
dynamic, so buckets cost no compile here.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..arms import ARM_NAMES
from ..case import W_RING
from ..prefix_case import ACTIVE_MODES, BITS, PM_DECAYS, RINGS, PrefixCase, PrefixRegime, Request

CPU_GEOMETRIES = ((1, 1), (1, 2), (2, 4))
GPU_GEOMETRIES = ((1, 1), (1, 2), (2, 8), (16, 64))  # (16, 64): Qwen3-Next
BUCKETS = (1, 2, 4, 8)
_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def prefix_regimes(draw, poison=None, bits=None):
    return PrefixRegime(
        state_scale=draw(st.sampled_from((0.1, 1.0, 1e-3, 30.0))),
        v_scale=draw(st.sampled_from((1.0, 1e-2, 8.0))),
        decay=draw(st.sampled_from(tuple(PM_DECAYS))),
        poison=draw(st.booleans()) if poison is None else poison,
        bits=draw(st.sampled_from(BITS)) if bits is None else bits,
    )


def _counts(hist: int):
    """A processed request's count: 0 .. hist, edges first (0 is the copy)."""
    return st.one_of(st.just(min(hist, 1)), st.just(0), st.just(hist), st.integers(0, hist))


def _bases(R: int, hist: int):
    return st.one_of(st.just(0), st.just(R - 1), st.just((R - hist) % R), st.integers(0, R - 1),
                     st.integers(-2**31, 2**31 - 1))


@st.composite
def prefix_cases(draw, *, arms=ARM_NAMES, geometries=CPU_GEOMETRIES, buckets=BUCKETS, rings=RINGS,
                 need: str | None = None, actives=ACTIVE_MODES, poison=None, bits=None, **_):
    """One legal gdn_prefix_materialize call (module docstring).  need="copy": at least one request with
    count == 0 whose src holds every bit pattern (bits="all"); need="fold": at least one with count >= 1.
    Keywords of the flush strategy a campaign passes (Ts, pool_scales) are accepted and ignored."""
    arm = draw(st.sampled_from(tuple(arms)))
    H, HV = draw(st.sampled_from(tuple(geometries)))
    R = draw(st.sampled_from(tuple(rings)))
    B = draw(st.sampled_from(tuple(buckets)))
    n_src = draw(st.integers(1, B))
    # slots: sources first, then destinations, then a few slots nobody uses
    spare = draw(st.integers(0, 2))
    pool = n_src + B + spare
    windows = []
    for s in range(n_src):
        hist = draw(st.one_of(st.just(W_RING), st.integers(0, W_RING)))
        windows.append((s, draw(_bases(R, hist)), hist))
    reqs = []
    for i in range(B):
        s, base, hist = windows[draw(st.integers(0, n_src - 1))] if i >= n_src else windows[i]
        dst = n_src + i
        kind = draw(st.sampled_from(("fold", "fold", "fold", "skip_src", "skip_dst", "skip_count", "over"))) \
            if not (need and i == 0) else "fold"
        count = draw(_counts(hist))
        if need == "copy" and i == 0:
            count = 0
        if need == "fold" and i == 0:
            count = draw(st.integers(1, max(hist, 1)))
            if hist == 0:
                s, base, hist = n_src + B + spare, 0, W_RING  # a source of its own with a full window
                pool += 1
        if kind == "skip_src":
            s, base, hist = -draw(st.integers(1, 2**31)), 0, 0
        elif kind == "skip_dst":
            dst = -draw(st.integers(1, 2**31))
        elif kind == "skip_count":
            count = -draw(st.integers(1, 64))
        elif kind == "over":
            count = draw(st.one_of(st.just(W_RING + 1), st.integers(W_RING + 1, 64)))  # 17: the first skipped
        reqs.append(Request(s, dst, base, count, hist))
    active = draw(st.sampled_from(tuple(actives)))
    order_seed = draw(st.one_of(st.just(0), st.integers(1, 2**31))) if active != "derived" else 0
    slack = draw(st.one_of(st.just(0), st.integers(1, 8))) if active == "device" else 0
    regime = draw(prefix_regimes(poison=poison, bits="all" if need == "copy" else bits))
    return PrefixCase(arm=arm, H=H, HV=HV, pool=pool, ring=R, requests=tuple(reqs), seed=draw(_SEEDS),
                      active=active, order_seed=order_seed, num_active_slack=slack, regime=regime)


def geometries_for(target) -> tuple:
    return GPU_GEOMETRIES if getattr(target, "needs_cuda", False) else CPU_GEOMETRIES


def prefix_events(case: PrefixCase) -> list[str]:
    """Coverage labels of one call (hypothesis.event)."""
    kinds = {case.row_kind(i) for i in range(case.B)}
    return [f"pm arm={case.arm}", f"pm ring={case.ring}", f"pm active={case.active}",
            *(f"pm request kind={k}" for k in sorted(kinds)), f"pm poison={case.regime.poison}"]


def warm_cases(arms, geometries, rings=RINGS, seed: int = 0) -> list[PrefixCase]:
    """One small legal call per (arm, geometry, ring depth): what a campaign's warm_up launches to pay the
    JIT compiles (one per ring depth and arm, PMD4)."""
    out = []
    for arm in arms:
        for H, HV in geometries:
            for R in rings:
                out.append(PrefixCase(arm=arm, H=H, HV=HV, pool=2, ring=R, requests=(Request(0, 1, 0, 1, 1),),
                                      seed=seed))
    return out


__all__ = ["prefix_cases", "prefix_regimes", "prefix_events", "warm_cases", "geometries_for", "CPU_GEOMETRIES",
           "GPU_GEOMETRIES", "BUCKETS"]
