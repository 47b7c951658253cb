"""The draw program of draws="graph" cases (case.graph_program, issue 32), run eagerly on the CPU.

A GPU campaign's cases draw every value with one program of fixed shapes, which gdn_fuzz.graphs replays from a
CUDA graph (tests/test_graphs.py checks on a GPU that a replay gives the eager run's bits).  Its values are its
own, so these tests check what materialize() promises of any mode, against definitions that are not the program's:

* the same tensors (names, shapes, dtypes) as materialize() of the same case drawn on the CPU;
* the draws do not depend on the rows: changing one row's hist_len changes exactly the ring slots
  (cache_base + j) & 31, j < min(hist_len, 16), of that row's pool row, and a pad row or an empty window writes
  nothing (D3's ring layout);
* with regime.poison, NaN exactly where case._poison (the other modes' code) puts it (R1);
* the regimes: zero_norm keys are zero at tokens 1 and T-1, near_dup keys within 1e-3 of token 0's, the decay's
  A = e^{A_log} inside its range, beta exactly 0 or 1 in float32 for the zero / one regimes;
* a seed gives the same bits twice and another seed other values; graph_data refuses an unknown regime name;
* the pool and rings are drawn at graph_pool_rows(pool) rows, so a case's pool rows are those of the same case on
  a larger pool of the same rounded size (one graph per rounded size).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_fuzz import case as case_mod
from gdn_fuzz import graphs
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import (BETAS, DECAY_DRAWS, DECAYS, KEYS, RING_SLOTS, W_RING, Case, Regime, Row, graph_data,
                           graph_dims, graph_pool_rows, graph_program, materialize)


def run(case: Case, device: str = "cpu") -> dict:
    """graph_program of `case`, eagerly, from a generator on `device` seeded with case.seed."""
    rows, regime = graph_data(case)
    gen = torch.Generator(device=device).manual_seed(case.seed)
    return graphs._owned(graph_program(rows.to(device), regime.to(device), gen, graph_dims(case)), case.pool)


@st.composite
def small_cases(draw, poison=None):
    T = draw(st.sampled_from((4, 8)))
    pool = draw(st.integers(2, 7))
    n = draw(st.integers(1, pool))
    slots = draw(st.permutations(range(pool)))[:n]
    rows = [Row(s, draw(st.integers(0, 20)), draw(st.integers(-40, 40))) for s in slots]
    rows += [Row(-1 - draw(st.integers(0, 3)), draw(st.integers(0, 16)), draw(st.integers(0, 31)))
             for _ in range(draw(st.integers(0, 2)))]
    regime = Regime(decay=draw(st.sampled_from(DECAYS)), beta=draw(st.sampled_from(BETAS)),
                    keys=draw(st.sampled_from(KEYS)), history=draw(st.sampled_from(("consistent", "free"))),
                    poison=draw(st.booleans()) if poison is None else poison,
                    qk_scale=draw(st.sampled_from((1.0, 1e-3))))
    return Case(arm=draw(st.sampled_from(ARM_NAMES)), T=T, H=1, HV=2, pool=pool,
                rows=tuple(draw(st.permutations(rows))), seed=draw(st.integers(0, 2**32 - 1)), draws="graph",
                regime=regime)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


@settings(max_examples=40, deadline=None)
@given(small_cases())
def test_program_gives_materialize_tensors(case):
    got = run(case)
    want = materialize(dataclasses.replace(case, draws="cpu"), "cpu")
    tensors = {k for k, v in want.items() if isinstance(v, torch.Tensor)}
    assert set(got) == tensors
    for k in tensors:
        assert (got[k].shape, got[k].dtype) == (want[k].shape, want[k].dtype), k
    assert got["initial_state_indices"].tolist() == [r.slot for r in case.rows]
    assert got["hist_len"].tolist() == [r.hist_len for r in case.rows]
    assert got["cache_base"].tolist() == [r.cache_base for r in case.rows]
    again = run(case)
    assert all(same_bits(got[k], again[k]) for k in tensors)
    other = run(dataclasses.replace(case, seed=(case.seed + 1) % 2**32))
    assert not torch.equal(got["q"], other["q"])


RING = ("k_cache", "u_cache", "g_cache")


def changed_slots(a: dict, b: dict, pool: int) -> set:
    """(pool row, ring slot) pairs where the rings of a and b differ, and the names of other tensors that differ."""
    out = set()
    for name in RING:
        x, y = a[name], b[name]
        diff = ~((x == y) | (torch.isnan(x) & torch.isnan(y)))
        diff = diff.reshape(pool, x.shape[1], RING_SLOTS, -1).any(-1).any(1)  # [pool, 32]
        out |= {tuple(p) for p in diff.nonzero().tolist()}
    for name, x in a.items():
        if name not in RING + ("hist_len",) and not same_bits(x, b[name]):
            out.add(name)
    return out


@settings(max_examples=60, deadline=None)
@given(small_cases(poison=False), st.data())
def test_a_rows_window_lands_on_its_slots(case, data):
    i = data.draw(st.integers(0, case.B - 1))
    r = case.rows[i]
    P = data.draw(st.integers(0, 20))
    empty = run(dataclasses.replace(case, rows=case.rows[:i] + (Row(r.slot, 0, r.cache_base),) + case.rows[i + 1:]))
    full = run(dataclasses.replace(case, rows=case.rows[:i] + (Row(r.slot, P, r.cache_base),) + case.rows[i + 1:]))
    want = set() if r.pad else {(r.slot, (r.cache_base + j) % RING_SLOTS) for j in range(min(P, W_RING))}
    # a record may equal the garbage under it only by chance (float32 equality of independent draws): never here
    assert changed_slots(empty, full, case.pool) == want


@settings(max_examples=40, deadline=None)
@given(small_cases(poison=True))
def test_poison_where_the_other_modes_put_it(case):
    got = run(case)
    ones = {n: torch.ones(got[n].shape, dtype=torch.float32) for n in ("initial_state_source",) + RING}
    case_mod._poison(case, ones["initial_state_source"], *(ones[n] for n in RING))
    for name, want in ones.items():
        assert torch.equal(torch.isnan(got[name].float()), torch.isnan(want)), name
    clean = run(dataclasses.replace(case, regime=dataclasses.replace(case.regime, poison=False)))
    for name in ones:  # outside the poison, the same values
        keep = ~torch.isnan(ones[name])
        assert same_bits(got[name][keep], clean[name][keep]), name


def test_regimes():
    rows = (Row(0, 5, 3), Row(1, 16, 30))
    base = Case(arm="bf16", T=8, H=1, HV=2, pool=2, rows=rows, seed=5, draws="graph")
    k = run(dataclasses.replace(base, regime=Regime(keys="zero_norm")))["k"]
    assert bool((k[:, 1] == 0).all() and (k[:, -1] == 0).all()) and bool((k[:, 2] != 0).all())
    k = run(dataclasses.replace(base, regime=Regime(keys="near_dup")))["k"]
    # 1e-3 times a unit normal (10 sigma: 1e-2) between the draws, then bf16's rounding of both (2^-8 of |k|);
    # random keys would differ by O(1)
    k = k.double()
    assert bool(((k - k[:, :1]).abs() <= 1e-2 + 2**-8 * k.abs()).all())
    # A_log comes rounded to the IO dtype (bf16 here): |log A_io - log A| <= half an ulp, 2^-8 |log A|, so A_io lies
    # in [lo, hi] widened by that factor at each end
    half_ulp = torch.finfo(torch.bfloat16).eps / 2
    for decay, (lo, hi, _) in DECAY_DRAWS.items():
        A = run(dataclasses.replace(base, regime=Regime(decay=decay)))["A_log"].double().exp()
        low, high = lo * math.exp(-half_ulp * abs(math.log(lo))), hi * math.exp(half_ulp * abs(math.log(hi)))
        assert bool(((A >= low) & (A <= high)).all()), decay
    for beta, want in (("zero", 0.0), ("one", 1.0)):
        b = run(dataclasses.replace(base, regime=Regime(beta=beta)))["b"]
        assert bool((torch.sigmoid(b.float()) == want).all()), beta
    with pytest.raises(ValueError, match=r"case.regime.keys='odd' is illegal; legal: one of random"):
        graph_data(dataclasses.replace(base, regime=Regime(keys="odd")))


@settings(max_examples=20, deadline=None)
@given(small_cases(), st.integers(0, 9))
def test_pools_of_one_rounded_size_draw_the_same_rows(case, more):
    """Every pool of graph_pool_rows(pool) rows shares one draw graph: the first `pool` rows of a larger pool of the
    same rounded size hold the same values (poison apart: a row no real row uses is NaN in both)."""
    big = dataclasses.replace(case, pool=min(case.pool + more, graph_pool_rows(case.pool)))
    assert graph_dims(big) == graph_dims(case)
    a, b = run(case), run(big)
    for name in ("initial_state_source", "k_cache", "u_cache", "g_cache"):
        assert b[name].shape[0] == big.pool
        assert same_bits(a[name], b[name][:case.pool]), name
    assert all(same_bits(a[k], b[k]) for k in a if k not in ("initial_state_source", "k_cache", "u_cache", "g_cache"))
    assert graph_pool_rows(1) == graph_pool_rows(16) == 16 and graph_pool_rows(17) == 24 and graph_pool_rows(70) == 72
