"""Host guards, the standalone commit and extreme gates (gdn_fuzz.properties.contract: guards
H4/H6/H9-H11/H13/H14, commit C2, extremes N2 as containment).

These properties were written to kill catalogued mutants; here Hypothesis draws the Cases and
each must hold.  A failure is recorded to the corpus like any other; a known bug of the target
(an open corpus entry) makes the test an xfail naming the entry.

What each test compares
-----------------------
commit, extremes,  the selected target (reference on the CPU, production on a GPU with
params_inplace     --gdn-target production) against the contract: the standalone commit
                   oracle (C2) and the float64 oracle (N2; N5 with the reloaded weights).
                   test_params_inplace_finds_the_id_cached_cast shows params_inplace kills the
                   catalogued mutant that plants the released wrapper's id()-keyed cast cache.
guards             the guards property holds a target's exception type for each illegal call
                   (and the argument its message names) to the target's *release model*
                   (gdn_fuzz.targets.releases: data, not another implementation), so it can fail
                   on the reference too.  Two rows:
  [selected]       the selected target (the reference on the CPU, modelled as 0.7.4) vs its model;
  [independent]    tests/targets/independent_ucache_flush.py, an independent float64 target
                   written from the 0.7.2.post1 contract (no code shared with the reference), vs
                   the 0.7.2.post1 model it declares.
test_guards_find_planted_guard_bugs shows that each catalogued guard mutant of the reference
(gdn_fuzz.targets.mutants, prop "guard.*"), and a guard bug planted in a copy of the independent
target, are found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gdn_fuzz.case import Case, Row
from gdn_fuzz.properties import get_property
from gdn_fuzz.properties.contract import check_guards
from gdn_fuzz.strategies import case_events, geometries_for
from gdn_fuzz.targets import get_target
from gdn_fuzz.targets.mutants import CATALOGUE

INDEPENDENT = Path(__file__).parent / "targets" / "independent_ucache_flush.py"

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # gdn_verdict spans examples


def _draw(data, prop, target, arms):
    case = data.draw(get_property(prop).strategy(arms=arms, geometries=geometries_for(target)), label="case")
    for e in case_events(case):
        event(e)
    return case


@pytest.mark.parametrize("prop", ["commit", "extremes", "params_inplace"])
@FIXTURE_OK
@given(data=st.data())
def test_contract_property_holds(target_under_test, gdn_verdict, prop, data):
    """commit (C2), extremes (N2) and params_inplace (N5): the selected target against the contract's
    oracles.  params_inplace is expected to fail on the released kernel (its id()-keyed cast cache,
    N5) until the bug is fixed or recorded as an open corpus entry (then this is an xfail)."""
    target, arms, device = target_under_test
    case = _draw(data, prop, target, arms)
    gdn_verdict(prop, case, get_property(prop).check(target, case, device), target.name)


@pytest.mark.parametrize("subject", ["selected", "independent"])
@FIXTURE_OK
@given(data=st.data())
def test_guards_raise_what_the_release_model_says(target_under_test, gdn_verdict, subject, data):
    """guards (H4, H6, H9-H11, H13, H14): for every illegal call of the guards property the target raises
    the exception type of the first check its release model says fires, with a message naming the
    argument where the model says so.  [selected]: the selected target; [independent]: the independent
    float64 target (modelled as 0.7.2.post1, which it declares)."""
    target, arms, device = target_under_test
    if subject == "independent":
        target = get_target(str(INDEPENDENT))
    case = _draw(data, "guards", target, arms)
    gdn_verdict("guards", case, check_guards(target, case, device), target.name)


GUARD_MUTANTS = sorted(n for n, m in CATALOGUE.items() if m.base == "reference" and m.prop.startswith("guard."))
GUARD_CASE = Case(arm="bf16", T=4, H=1, HV=2, pool=4,
                  rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)), seed=7)
# a guard bug planted in a copy of the independent target: the draft-count check written T <= 8
INDEPENDENT_GUARD_T = ("    if n_tok not in (4, 8):\n", "    if n_tok > 8:\n")


@pytest.mark.parametrize("name", GUARD_MUTANTS)
def test_guards_find_planted_guard_bugs(name):
    """The guards property can fail: a catalogued guard mutant of the reference (modelled as the reference
    is, 0.7.4) gives its expected guard.<clause> finding, while the reference and the independent target
    pass on the same case."""
    assert check_guards(get_target("reference"), GUARD_CASE, "cpu") == []
    assert check_guards(get_target(str(INDEPENDENT)), GUARD_CASE, "cpu") == []
    found = check_guards(get_target(f"mutant:{name}"), GUARD_CASE, "cpu")
    want = CATALOGUE[name].prop
    assert any(f.prop.startswith(want) for f in found), (name, want, [str(f) for f in found])


def test_guards_find_a_guard_bug_planted_in_the_independent_target(tmp_path):
    """The independent target with its T check written T <= 8 is found by the guards property against its
    0.7.2.post1 model (guard.H13.T: T = 6 returns normally)."""
    old, new = INDEPENDENT_GUARD_T
    src = INDEPENDENT.read_text()
    assert src.count(old) == 1, "the independent target's T check changed; update INDEPENDENT_GUARD_T"
    planted = tmp_path / "independent_guard_T.py"
    planted.write_text(src.replace(old, new))
    found = check_guards(get_target(str(planted)), GUARD_CASE, "cpu")
    assert [f.prop for f in found] == ["guard.H13.T"], [str(f) for f in found]


PARAMS_CASE = Case(arm="bf16", T=4, H=1, HV=2, pool=4,
                   rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)), seed=0)


def test_params_inplace_finds_the_id_cached_cast():
    """params_inplace (N5) on the mutant with the released wrapper's id()-keyed cast cache: every source
    kind of A_log and of dt_bias that reaches the cache (fp32, fp32 strided, IO strided), beside a
    contiguous IO other, gives the one signature params_inplace.oracle [N5] and the message names the
    stale parameter; contiguous IO sources for both (used directly, no cache) pass on the mutant too.
    The unmutated reference passes every seed."""
    import dataclasses

    from gdn_fuzz.properties.contract import PARAM_SOURCES, params_plan

    want = {("io", "io")} | {(k, "io") for k in PARAM_SOURCES} | {("io", k) for k in PARAM_SOURCES}
    seeds = {}
    for seed in range(200):
        plan = params_plan(dataclasses.replace(PARAMS_CASE, seed=seed))
        seeds.setdefault((plan["A_log"], plan["dt_bias"]), seed)
    assert want <= set(seeds), sorted(want - set(seeds))
    check = get_property("params_inplace").check
    mutant, ref = get_target("mutant:params_cast_cached_by_id"), get_target("reference")
    for kinds in sorted(want):
        case = dataclasses.replace(PARAMS_CASE, seed=seeds[kinds])
        assert check(ref, case, "cpu") == [], kinds
        found = check(mutant, case, "cpu")
        if kinds == ("io", "io"):
            assert found == [], [str(f) for f in found]
            continue
        assert [f.signature() for f in found] == ["params_inplace.oracle [N5] out of tolerance"], (
            kinds, [str(f) for f in found])
        stale = "A_log old" if kinds[0] != "io" else "dt_bias old"
        assert stale in found[0].message and "fresh source objects holding the same new values pass" in (
            found[0].message), found[0].message
