"""The prefix cache in the serving harness: the flow gdn_prefix_materialize exists for (issue 31).

How this file tests, in plain words
-----------------------------------
A request decodes in the serving engine (gdn_fuzz.serving.engine).  At a drawn token of its window
(its checkpoint plus the first `count` ring entries, 0 <= count <= hist_len) its state is materialized by
the prefix materializer into a free pool block, on the backend's own buffers (Engine.prefix_hit).  A
new request (the prefix-cache hit) starts in that block: its checkpoint is what the materializer wrote,
its cursors reset at its first step, and it decodes the same continuation its source decoded after that
token (teacher-forced from the source's transcript) and then tokens of its own.  The checks:

  at the hit        the materializer's call against the float64 PMM3 oracle on the buffers it read, with
                    every byte outside the destination unchanged (PMM3, PMS2, PMW1-PMW3; the
                    pm_launch check), and the state it wrote against the float64 sequential truth at
                    that token, within the drift budget of a state one fold older than its source
  after every step  the engine's checks on every request, the forks included: each launch vs its
                    oracle, the write set, the cursors, and the state rebuilt from checkpoint + window vs
                    the sequential truth (the fork's truth is its source's truth at that token, advanced
                    over the same tokens)

Targets: --gdn-target names either kernel and the other is FlashInfer's on a CUDA device
(production + materialize), the torch references on the CPU (fixture prefix_serving_under_test).  Each
check is shown to have power: planted prefix-cache adapter bugs (adapters.PREFIX_PLANTED) and edits of
the reference materializer must be found by the machine with the prefix-hit rule.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from gdn_fuzz.serving.adapters import PREFIX_PLANTED, PackedAdapter
from gdn_fuzz.serving.engine import EngineFailure, Geometry
from gdn_fuzz.serving.machine import machine_class, machine_settings, make_engine
from gdn_fuzz.targets import get_target

ALL_CHECKS = PackedAdapter.CHECKS
# derandomized generation, as the harness's planted-bug tests use (tests/test_serving_harness.py)
FIND = settings(max_examples=100, stateful_step_count=20, deadline=None, database=None, derandomize=True,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def _frob_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("adapter", ("direct", "packed"))
def test_fork_decodes_its_sources_continuation(prefix_serving_under_test, adapter):
    """The flow end to end on every arm: two requests decode (flushes, a moved cache_base); request 0's state
    after 3 tokens of its window is materialized into a fresh block and request 0 retires; the fork decodes
    request 0's remaining transcript again, then tokens of its own.  Every check passes at the hit and after
    every step (EngineFailure otherwise); the fork accepted exactly the transcript's tokens, and where it
    caught up its float64 truth is request 0's last truth to 1e-12 relative (the same float64 recurrence over
    the same tokens, batched differently: summation noise of ~1e-15 per operation)."""
    target, mat, arms, device = prefix_serving_under_test
    for arm in arms:
        geo = Geometry(T=4, H=1, HV=2, layers=2 if adapter == "packed" else 1, blocks=6, B=4)
        e = make_engine(target, geo, arm, device, seed=7, adapter=adapter, materializer=mat)
        r0, r1 = e.admit(e.free_blocks[0], 1), e.admit(e.free_blocks[0], 2)
        for s, a in enumerate((4, 4, 4, 4, 2, 3, 2)):  # request 0 folds at its 5th launch (16 >= flush_min 13)
            e.fail(e.step([(r0, 4, a), (r1, 4, 1 + s % 4)], s).findings)
        src = e.requests[r0]
        assert e.flushes > 0 and len(src.prefix) - 1 > 3, "the script must fold and leave a window longer than 3"
        assert e.adapter.cursor(r0, src.block)[1] != 0, "the script must move request 0's window off ring slot 0"
        fid, found = e.prefix_hit(r0, 3, e.free_blocks[0])
        e.fail(found)
        want, left = [S.clone() for S in src.truth], len(src.transcript) - (src.fold_at + 3)
        e.retire(r0)
        fork, steps = e.requests[fid], 0
        while fork.pos < len(fork.follows):
            e.fail(e.step([(r1, 4, 3), (fid, 4, 4)], 100 + steps).findings)
            steps += 1
        assert e.followed == left and steps == -(-left // 4), (e.followed, left, steps)
        for l in range(geo.layers):
            assert _frob_rel(fork.truth[l], want[l]) <= 1e-12
        for s in range(4):  # on its own now
            e.fail(e.step([(r1, 4, 2), (fid, 4, 3)], 200 + s).findings)
        assert 0.0 < e.worst_prefix <= 1.0


def test_prefix_hit_rejects_bad_arguments():
    """Bad input gets a clear error naming the argument: a count past the window, a held block, an engine
    without a materializer, a materializer of the other kernel."""
    ref, mat = get_target("reference"), get_target("materialize-reference")
    geo = Geometry(T=4, H=1, HV=2, blocks=4, B=4)
    e = make_engine(ref, geo, "bf16", materializer=mat)
    r = e.admit(0, 1)
    e.fail(e.step([(r, 4, 2)], 0).findings)
    with pytest.raises(ValueError, match=r"count=3: request 0 has 2 tokens since its checkpoint; legal: 0\.\.2"):
        e.prefix_hit(r, 3, 1)
    with pytest.raises(ValueError, match="block 0 is not free"):
        e.prefix_hit(r, 1, 0)
    with pytest.raises(ValueError, match="no materializer"):
        make_engine(ref, geo, "bf16").prefix_hit(r, 0, 1)
    with pytest.raises(ValueError, match="materializer='reference' is a target of the flush kernel"):
        make_engine(ref, geo, "bf16", materializer=ref)


def test_prefix_machine_passes(prefix_serving_under_test):
    """Every serving event mixed with prefix hits (forks of forks, hits right after admission with count 0,
    recycled destination blocks, forks retired and preempted), every check, the packed adapter, 1-2 layers."""
    target, mat, arms, device = prefix_serving_under_test
    m = machine_class(target, arms, device, adapter="packed", checks=ALL_CHECKS, layers=(1, 2), materializer=mat,
                      name="PrefixServingMachine")
    run_state_machine_as_test(m, settings=machine_settings(max_examples=10, steps=25))


def test_prefix_machine_direct_adapter(prefix_serving_under_test):
    """The same on the direct adapter (C2 or C3 commits, pad rows as slot -1)."""
    target, mat, arms, device = prefix_serving_under_test
    m = machine_class(target, arms, device, materializer=mat, name="PrefixDirectMachine")
    run_state_machine_as_test(m, settings=machine_settings(max_examples=8, steps=25))


@pytest.mark.parametrize("name", sorted(PREFIX_PLANTED))
def test_machine_finds_planted_prefix_bug(name):
    """Each planted prefix-cache adapter bug is found by the machine with its check alone (trajectory: the fork's
    state vs the truth, at the hit and after its steps), on the references."""
    cls, check = PREFIX_PLANTED[name]
    m = machine_class(get_target("reference"), ("bf16",), "cpu", adapter=cls, checks={check}, layers=(1,),
                      materializer=get_target("materialize-reference"), name=f"Prefix_{name}")
    with pytest.raises(EngineFailure, match=r"serving\.(prefix|trajectory)"):
        run_state_machine_as_test(m, settings=FIND)


# edits of the reference materializer a serving flow exposes.  Not here: a count > 16 or a ring depth other than
# 32 cannot occur in serving (pm_ref_over_window, pm_ref_no_depth_check), and pm_ref_no_wrap needs a hit whose
# first count entries straddle the ring's end, which 100 derandomized machine examples did not draw (tried
# 2026-12-03); the property suite kills all three (tests/test_materialize.py).
SERVING_EXPOSED = ("pm_ref_anchor_lane", "pm_ref_num_active_short")


@pytest.mark.parametrize("name", SERVING_EXPOSED)
def test_machine_finds_materializer_edit(name):
    """An edited materializer in the serving flow is found by the machine at the hit, by the call's own check
    (serving.materialize: the PMM3 oracle on the buffers it read; the engine's other checks are off but the
    cursors', which cannot see a materializer)."""
    m = machine_class(get_target("reference"), ("bf16",), "cpu", adapter="packed", checks={"cursors"}, layers=(1,),
                      materializer=get_target(f"mutant:{name}"), name=f"PrefixEdit_{name}")
    with pytest.raises(EngineFailure, match=r"serving\.materialize"):
        run_state_machine_as_test(m, settings=FIND)


# ------------------------------------------------------------------ inputs the materializer does not validate


def _rows(rows, scenario):
    return [r for r in rows if r["scenario"] == scenario]


def test_unvalidated_slots_are_reported(prefix_serving_under_test):
    """dst past the pool, duplicate dst, dst == src, dst == another request's src (PMR1-PMR3): undefined, so
    reported, not judged (gdn_fuzz.studies.unguarded, each scenario in an isolated worker).  What the report must
    hold: every scenario ran, the legal call each starts from did not raise, and the one defined case among them
    (two identical requests compute identical bits, PMR2) holds the legal call's bits."""
    from gdn_fuzz.studies.unguarded import PM_SCENARIOS, run_materializer

    _, mat, arms, device = prefix_serving_under_test
    rows = run_materializer(mat.name, arms[:1], device, rings=(32,))
    assert [r["scenario"] for r in rows] == list(PM_SCENARIOS)
    assert not [r for r in rows if "legal_call_raised" in r], rows
    (twin,) = _rows(rows, "duplicate dst (identical requests)")
    assert twin.get("dst_is_the_legal_result") is True, twin


def test_fuzzer_survives_a_materializer_that_crashes():
    """A materializer that dies on a dst past the pool (SIGSEGV, tests/targets/segv_on_dst_past_pool.py): that
    scenario's report is the worker's death, and every later scenario still runs, in a fresh worker."""
    from pathlib import Path

    from gdn_fuzz.studies.unguarded import PM_SCENARIOS, run_materializer

    path = str(Path(__file__).parent / "targets" / "segv_on_dst_past_pool.py")
    rows = run_materializer(path, ("bf16",), "cpu", rings=(32,))
    (past,) = _rows(rows, "dst past the pool")
    assert past.get("survived_by_the_fuzzer") and any("SIGSEGV" in w for w in past["worker"]), past
    assert len(rows) == len(PM_SCENARIOS)
    (twin,) = _rows(rows, "duplicate dst (identical requests)")
    assert twin.get("dst_is_the_legal_result") is True, twin
