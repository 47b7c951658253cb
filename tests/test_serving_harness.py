"""Serving harness: the packed varlen adapter between a serving engine and the kernel.

How this file tests, in plain words
-----------------------------------
gdn_fuzz.serving.adapters.PackedAdapter builds what vLLM / SGLang put around the kernel
(shared/docs/replayssm-serving.md): packed token-major activations with query_start_loc
(ragged rows padded to T with a = -inf and zero q/k/v/b, only real outputs gathered back),
a batch padded to a fixed bucket with the engine's NULL block 0 (translated to slot -1,
M8), cursors kept per pool block and gathered into fixed per-row buffers, L GDN layers
sharing one cursor set committed once per model step (C3), and resets on the first decode,
on recycled blocks and on readmission.  The serving engine (gdn_fuzz.serving.engine) plays
the scheduler and keeps, per request and layer, a float64 truth (sequential decode of the
real, accepted tokens only).

Each property below drives the engine on the selected target (reference on CPU in CI,
production on a GPU) through Hypothesis-drawn event scripts aimed at that property.  Each
property is then shown to have power: a planted adapter bug (a subclass overriding one method
with the realistic wrong code) must be found by hypothesis.find with that property's check
alone.  A stateful machine mixes all events and checks; it must pass on the real adapter and
fail on every planted bug.

The CUDA-graph test (capture once, replay with changing inputs/cursors/pad rows/acceptance,
bitwise equal to eager) needs a CUDA device and the production target; it passed on the H200
(docs/h200-results.md, run 4).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, find, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from gdn_fuzz.case import Regime
from gdn_fuzz.serving.adapters import PLANTED, GraphedPackedAdapter, GraphUnavailable, PackedAdapter
from gdn_fuzz.serving.engine import Engine, EngineFailure, Geometry
from gdn_fuzz.serving.machine import HEADS, machine_class, machine_settings, run_script
from gdn_fuzz.targets import get_target

ALL_CHECKS = PackedAdapter.CHECKS


def _short(n: int) -> settings:
    """The active profile, capped at n examples."""
    base = settings.default
    return settings(base, max_examples=min(base.max_examples, n), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


FIND = settings(max_examples=200, deadline=None, database=None, derandomize=True,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))

# ------------------------------------------------------------------ strategies

seeds = st.integers(0, 2**16 - 1)
plans = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(1, 8)), min_size=1, max_size=4)


@st.composite
def geometries(draw, layers=st.integers(1, 3)):
    T = draw(st.sampled_from((4, 8)))
    H, HV = draw(st.sampled_from(HEADS))
    fmin = draw(st.one_of(st.none(), st.integers(1, 17 - T)))
    decay = draw(st.sampled_from(("normal", "weak", "strong")))
    return dict(T=T, H=H, HV=HV, layers=draw(layers), flush_min=fmin, regime=Regime(decay=decay))


def admits(n, chunk=st.booleans()):
    return st.lists(st.tuples(st.just("admit"), st.none(), seeds, chunk), min_size=n[0], max_size=n[1])


def steps(n):
    return st.lists(st.tuples(st.just("step"), seeds, plans), min_size=n[0], max_size=n[1])


@st.composite
def ragged_script(draw):
    """1-3 requests (fewer than the bucket: NULL-block pad rows), 1-3 ragged steps."""
    return draw(admits((1, 3))) + draw(steps((1, 3)))


@st.composite
def multilayer_script(draw):
    """1-4 requests, 1-5 steps: flushes happen with small flush_min or full acceptance."""
    return draw(admits((1, 4), st.just(False))) + draw(steps((1, 5)))


@st.composite
def recycle_script(draw):
    """Requests run, one retires, a new request takes its (recycled) block, steps follow."""
    return (draw(admits((1, 3), st.just(False))) + draw(steps((1, 3)))
            + [("retire", draw(st.integers(0, 3)))] + [("admit", "recycled", draw(seeds), False)]
            + draw(steps((1, 3))))


@st.composite
def chunk_script(draw):
    """A request whose final prompt chunk is one token, routed through the decode kernel."""
    return (draw(admits((0, 2), st.just(False))) + [("admit", None, draw(seeds), True)]
            + draw(steps((2, 4))))


@st.composite
def readmit_script(draw):
    """Requests run, one is preempted and readmitted (same or another block), steps follow."""
    return (draw(admits((1, 3), st.just(False))) + draw(steps((1, 3)))
            + [("preempt", draw(st.integers(0, 3)), draw(st.sampled_from((None, 1, 2, 3, 4, 5))))]
            + draw(steps((1, 3))))


@st.composite
def cases(draw, script, layers=st.integers(1, 3)):
    """(geometry keywords, event script, adapter seed); the arm is drawn by index into the
    selected arms (arm_i mod their number)."""
    geo = draw(geometries(layers))
    geo["arm_i"] = draw(st.integers(0, 4))
    return geo, draw(script()), draw(seeds)


def _run(target_under_test, case, adapter_cls=PackedAdapter, checks=ALL_CHECKS):
    target, arms, device = target_under_test
    geo_kw, events, seed = case
    geo_kw = dict(geo_kw)
    arm = arms[geo_kw.pop("arm_i") % len(arms)]
    geo = Geometry(**geo_kw, blocks=6, B=4)
    return run_script(target, geo, arm, events, device, seed, adapter=adapter_cls, checks=checks)


def _prop(target_under_test, case, checks=ALL_CHECKS):
    """Run a property case; label what it exercised (hypothesis statistics)."""
    eng = _run(target_under_test, case, checks=checks)
    event(f"flushed={eng.flushes > 0}")
    event(f"ragged rows={eng.ragged_rows > 0}")
    event(f"recycled={eng.recycles > 0}")
    event(f"one-token chunk={eng.chunks > 0}")
    event(f"preempted={eng.preempts > 0}")
    return eng


def _fails(adapter_cls, check):
    ref = (get_target("reference"), ("bf16",), "cpu")

    def cond(case):
        try:
            _run(ref, case, adapter_cls, {check})
        except EngineFailure:
            return True
        return False
    return cond


def _find_planted(name, strategy):
    """hypothesis.find must produce a case where the property's check alone fails the bug."""
    cls, check = PLANTED[name]
    geo_kw, events, seed = find(strategy, _fails(cls, check), settings=FIND)
    with pytest.raises(EngineFailure, match=f"serving.{check}"):
        _run((get_target("reference"), ("bf16",), "cpu"), (geo_kw, events, seed), cls, {check})


# ------------------------------------------------------------------ properties


RAGGED_PROPERTIES = {
    "pad_lanes": "M1, M3, M5: for every ragged row and layer, replaying the ring window over the pad lanes' "
                 "appended records gives the same state as stopping at the last real token: a pad lane "
                 "(a = -inf, zero q/k/v/b) is an exact identity update.",
    "null_block": "M8: with fewer requests than the bucket, the NULL-block pad rows (block 0 -> slot -1) write "
                  "nothing: block 0, idle blocks and the pad rows' output rows keep every bit, in every layer.",
    "ragged": "M4, M8: rows with 1..T real tokens packed by query_start_loc; the gathered real outputs equal "
              "the float64 truth on those tokens (compare.y_budget).",
}


@pytest.mark.parametrize("check", sorted(RAGGED_PROPERTIES))
@_short(40)
@given(case=cases(ragged_script))
def test_ragged_rows_property(target_under_test, check, case):
    """Ragged scripts (1-3 requests in a bucket of 4, ragged steps) with ONE check on, per parameter
    (RAGGED_PROPERTIES: pad lanes, NULL-block rows, ragged outputs); the same check alone finds its
    planted bug below (test_planted_adapter_bug_is_found)."""
    _prop(target_under_test, case, {check})


@_short(40)
@given(case=cases(multilayer_script, layers=st.integers(2, 3)))
def test_multilayer_one_shared_commit(target_under_test, case):
    """M3, M6, M7, C3, C4 (harness.trajectory): 2-3 layers on one cursor set, committed once
    per step; every layer's state rebuilt from its checkpoint + window equals its own float64
    truth, and hist_len equals the tokens accepted since the last fold."""
    _prop(target_under_test, case)


@_short(40)
@given(case=cases(recycle_script))
def test_recycled_block_hides_previous_tenant(target_under_test, case):
    """Reset on a recycled block (harness.trajectory): a new request in a block another
    request used never replays the previous tenant's ring (stale cursors reset to (0, 0))."""
    _prop(target_under_test, case)


@_short(40)
@given(case=cases(chunk_script))
def test_one_token_prompt_chunk_kept(target_under_test, case):
    """Reset at the handoff only (harness.trajectory): a one-token final prompt chunk run
    through the decode kernel is appended after the handoff reset and is still part of the
    state after the next decode steps (no second reset)."""
    _prop(target_under_test, case)


@_short(40)
@given(case=cases(readmit_script))
def test_readmission_resets_cursors(target_under_test, case):
    """Reset on readmission (harness.trajectory): a preempted request readmitted with a
    recomputed checkpoint (same or another block) continues its truth exactly."""
    _prop(target_under_test, case)


# ------------------------------------------------------------------ each property has power

PLANTED_CASES = {
    "pad_lanes_zero_a": lambda: cases(ragged_script),
    "null_block_as_slot_zero": lambda: cases(ragged_script),
    "right_aligned_gather": lambda: cases(ragged_script),
    "commit_per_layer": lambda: cases(multilayer_script, layers=st.integers(2, 3)),
    "no_reset_on_recycle": lambda: cases(recycle_script),
    "reset_on_first_spec_decode": lambda: cases(chunk_script),
    "request_keyed_cursors": lambda: cases(readmit_script),
}


@pytest.mark.parametrize("name", sorted(PLANTED_CASES))
def test_planted_adapter_bug_is_found(name):
    """Each planted adapter bug (gdn_fuzz.serving.harness.PLANTED) is found by the
    property aimed at it, with that property's check alone, on the reference target."""
    _find_planted(name, PLANTED_CASES[name]())


# ------------------------------------------------------------------ stateful machine


def test_harness_machine_passes(target_under_test):
    """All checks, every event mixed (admit fresh / recycled / with a one-token chunk,
    retire, preempt + readmit, steps with drawn occupancy, raggedness and acceptance), 1-3 layers."""
    target, arms, device = target_under_test
    m = machine_class(target, arms, device, adapter="packed", checks=ALL_CHECKS, layers=(1, 2, 3),
                      name="ServingHarnessMachine")
    run_state_machine_as_test(m, settings=machine_settings(max_examples=10, steps=25))


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_harness_machine_finds_planted(name):
    """The machine, with every check, fails on every planted adapter bug (generate phase
    only, derandomized)."""
    cls, _ = PLANTED[name]
    m = machine_class(get_target("reference"), ("bf16",), "cpu", adapter=cls, checks=ALL_CHECKS, layers=(1, 2, 3),
                      name=f"Machine_{name}")
    s = settings(max_examples=100, stateful_step_count=20, deadline=None, database=None, derandomize=True,
                 phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    with pytest.raises(EngineFailure):
        run_state_machine_as_test(m, settings=s)


# ------------------------------------------------------------------ CUDA graphs (GPU only)


@pytest.mark.parametrize("T", [4, 8])
def test_cuda_graph_replay_equals_eager(target_under_test, T):
    """CUDA-graph safety: an eager and a graphed packed adapter run one stream side by side (two
    backends of one engine): the graph captures the L launches once and replays them over steps
    with changing inputs, cursors, pad rows (occupancy) and acceptance; every gathered output,
    every buffer and the block cursors must equal the eager adapter's bitwise.  Every selected
    arm, T = 4 and 8.  Needs CUDA and a target without host syncs inside the launch (production)."""
    target, arms, device = target_under_test
    if not (torch.cuda.is_available() and str(device).startswith("cuda")):
        pytest.skip("CUDA graphs need a CUDA device (this test passed on the H200, docs/h200-results.md run 4; "
                    "run it there with --gdn-target production)")
    if target.name == "reference":
        pytest.skip("the reference target syncs with the host inside a launch (bool(flush.any())), so it "
                    "cannot be captured; run with --gdn-target production")
    for arm in arms:
        # flush_min 5 (< 17 - T): rows fold every few steps, so replays cross folds and commits
        geo = Geometry(T=T, H=1, HV=2, layers=2, blocks=6, B=4, flush_min=5)
        eager = PackedAdapter(target, geo, arm, device, 0, name="eager")
        graph = GraphedPackedAdapter(target, geo, arm, device, 0, name="graph")
        eng = Engine(geo, [eager, graph], device, 1, checks=())
        rids = [eng.admit(blk, blk) for blk in (1, 2, 3)]
        for step in range(8):
            live = [r for r in rids if (step + r + 1) % 4]  # occupancy changes: pad rows come and go
            n = [1 + (step + r) % T for r in live]  # ragged rows: 1..T real tokens
            plan = [(r, m, 1 + (step * (r + 1)) % m) for r, m in zip(live, n)]
            rec = eng.step(plan, step)
            for x, y in zip(rec.outs["eager"].y, rec.outs["graph"].y):
                assert torch.equal(x.view(torch.int16), y.view(torch.int16)), f"{arm} T={T} step {step}: outputs differ"
            for key, x in eager.watched().items():
                assert torch.equal(x, graph.watched()[key]), f"{arm} T={T} step {step}: {key} differs"
            assert torch.equal(eager.blk_hist, graph.blk_hist) and torch.equal(eager.blk_base, graph.blk_base)
        assert graph.replays == 8 and graph.graph is not None


def test_graphed_adapter_refuses_cpu():
    """The graph path is guarded: on a CPU device it raises GraphUnavailable at construction
    (it never half-runs); this is all of the graph code that a CPU can exercise."""
    with pytest.raises(GraphUnavailable, match="CUDA"):
        GraphedPackedAdapter(get_target("reference"), Geometry(), "bf16", "cpu", 0)
