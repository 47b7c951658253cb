"""Property 7: multi-step speculative decoding, driven by a Hypothesis state machine.

How this file tests, in plain words
-----------------------------------
gdn_fuzz.serving.machine drives the serving engine (gdn_fuzz.serving.engine) with the direct
adapter around the target under test: it admits requests into pool slots (prefill -> decode handoff), runs decode steps (one launch for the whole
batch plus pad rows, then the accept and the cursor commit, caller-side C3 or the
wrapper's in-place C2), retires requests, recycles their slots, and preempts and readmits
requests.  After every launch it checks that the launch matches the float64 oracle run on
the target's own buffers (M1-M7), that nothing outside the write set changed (M8, C1),
that the cursors follow the commit model (C2, C3, C4), and that the state rebuilt from the
target's checkpoint + ring window tracks a float64 sequential decode of the accepted tokens
within the measured drift budget (M3, trajectory).

The first test runs the machine against the selected target (reference on CPU, the
production kernel on a GPU) with the active Hypothesis profile: dev/ci run a few examples of
50 steps (under a minute on a CPU), nightly runs 250-step examples.

The second half plants kernel bugs in copies of the reference target that need more than
one step to show, and requires the machine to find each one: once with every invariant, and
once with the trajectory invariant alone (the drift budget must not be so loose that a real
bug hides inside it).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.compare import DRIFT_C
from gdn_fuzz.serving.engine import EngineFailure
from gdn_fuzz.serving.machine import machine_class, machine_settings
from gdn_fuzz.targets import get_target
from gdn_fuzz.targets.mutants import CATALOGUE

from .planted import Plant, plant


def test_serving_machine_tracks_truth(target_under_test):
    """M1-M8, C1-C4, trajectory: the serving machine (gdn_fuzz.serving.machine, direct adapter) over
    admit / step / retire / recycle / preempt sequences, stateful_step_count from the active profile."""
    target, arms, device = target_under_test
    run_state_machine_as_test(machine_class(target, arms, device), settings=machine_settings())


# ----------------------------------------------------------------------------------------
# planted multi-step bugs: each must be found by the machine

# The C2 lines at the end of the reference's entry point (restart_hist_on_flush=True).
_C2_OLD = "        cache_base.copy_((cache_base + hist_len * flushed) & (RING_SLOTS - 1))"
_C2_NEW = "        cache_base.copy_((cache_base + hist_len) & (RING_SLOTS - 1))"

MACHINE_PLANTS = (
    CATALOGUE["no_local_g_restart"],  # multi-step: the fresh window decays from the old checkpoint
    Plant("standalone_commit_slides_verify_rows", "C2", "serving.cursors",
          _C2_OLD, _C2_NEW,
          "the in-place C2 commit slides cache_base by hist_len on every row, verify rows "
          "included: from the second step on a verify row's window points past its records"),
    Plant("appends_ignore_cache_base", "M5", "writes.outside",
          "aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
          "aslots = (P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
          "appends land at slot P + s instead of (base + P + s) & 31: harmless while base = 0 "
          "(every request starts there), wrong from the first launch after a request's first flush"),
)

# Enough to find each bug from a cold start with derandomized generation; no shrinking
# (a found bug is all these tests need, and shrinking a stateful run costs minutes).
PLANTED_SETTINGS = settings(max_examples=12, stateful_step_count=40, deadline=None, database=None,
                            derandomize=True, phases=[Phase.explicit, Phase.generate],
                            report_multiple_bugs=False,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("checks", ["all", "trajectory"])
@pytest.mark.parametrize("p", MACHINE_PLANTS, ids=lambda p: p.name)
def test_planted_multistep_bug_is_found(p, checks, tmp_path):
    """Each planted bug makes run_state_machine_as_test raise within PLANTED_SETTINGS: with every
    invariant the expected property (and clause) reports it; with the trajectory invariant alone
    the drift budget (DRIFT_C) still catches it."""
    t = get_target(str(plant(p, tmp_path)))
    kw = {} if checks == "all" else {"checks": {"trajectory"}}
    with pytest.raises(EngineFailure) as ei:
        run_state_machine_as_test(machine_class(t, ARM_NAMES, "cpu", **kw), settings=PLANTED_SETTINGS)
    msg = str(ei.value)
    if checks == "all":
        assert f"[{p.clause}] {p.prop}" in msg, msg
    else:
        assert "[M3] serving.trajectory" in msg, msg
    print(f"{p.name} ({checks}): found; DRIFT_C={DRIFT_C}\n{msg.splitlines()[0]}")
