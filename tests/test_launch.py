"""Single-launch properties against the selected target (reference on CPU, production on a GPU).

Hypothesis draws a Case (geometry, arm, rows with cursors at the routing edges, pad rows,
a value regime and a seed); the tensors come from the seed; the target runs one launch;
checks compare y, the appended k/u/g records and the folded checkpoint with the float64
oracle within the arm's tolerance (gdn_fuzz.compare), and compare bits everywhere the
launch must not write.  The second half plants known bugs in copies of the reference
target and requires the same property to find each one.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, find, given, settings
from hypothesis import strategies as st

from gdn_fuzz.checks import check_launch
from gdn_fuzz.strategies import case_events, cases, geometries_for
from gdn_fuzz.targets import get_target

from .planted import PLANTS, plant


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # gdn_verdict spans all examples on purpose
@given(data=st.data())
def test_launch_matches_oracle_and_write_set(target_under_test, gdn_verdict, data):
    """M1-M8: outputs, appends and fold within tolerance; nothing outside the write set changes."""
    target, arms, device = target_under_test
    case = data.draw(cases(arms=arms, geometries=geometries_for(target)))
    for e in case_events(case):
        event(e)
    gdn_verdict("launch", case, check_launch(target, case, device), target.name)


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_bug_is_found(name, tmp_path):
    """Each planted bug (clause in tests/planted) is found by the launch property within 300 examples."""
    p = PLANTS[name]
    t = get_target(str(plant(name, tmp_path)))
    found = find(cases(), lambda c: any(f.prop.startswith(p.prop) for f in check_launch(t, c)),
                 settings=settings(max_examples=300, deadline=None, database=None,
                                   suppress_health_check=list(HealthCheck)))
    findings = check_launch(t, found)
    assert any(f.clause == p.clause or f.prop.startswith(p.prop) for f in findings), findings


@pytest.mark.parametrize("decay, beta", [("vanishing", "mid"), ("normal", "zero"), ("vanishing", "zero"),
                                         ("strong", "one")])
def test_issue18_value_regimes_pass_on_the_reference(decay, beta):
    """The value regimes where the rounding rules change (issue 18): decays under fp16's subnormals and
    past f32's range, beta exactly 0 and 1 in f32.  The reference computes in f32 like the kernel; with
    beta "zero" on the bf16 arm it gives U = 0 where the float64 oracle has ~1e-52, which failed the
    launch property (relative error 1) until the tolerance table took N1's flush-to-zero floor
    (compare.F32_FTZ); every arm, T = 4 and 8, a flush row, a verify row, a pad row and P = 0."""
    from gdn_fuzz.arms import ARM_NAMES
    from gdn_fuzz.case import Case, Regime, Row

    for arm in ARM_NAMES:
        for T in (4, 8):
            case = Case(arm=arm, T=T, H=1, HV=2, pool=3, seed=T, regime=Regime(decay=decay, beta=beta),
                        rows=(Row(0, 13, 25), Row(1, 5, 20), Row(-1), Row(2, 0, 31)))
            assert check_launch(get_target("reference"), case, "cpu") == [], (arm, T)
