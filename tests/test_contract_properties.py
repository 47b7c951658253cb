"""Host guards, the standalone commit and extreme gates, against the selected target
(reference on the CPU, production on a GPU with --gdn-target production).

These three properties (gdn_fuzz.properties.contract: guards H4/H6/H9-H11/H13/H14, commit C2, extremes N2
as containment) were written to kill catalogued mutants; here Hypothesis draws the Cases and
each must hold on the target itself.  A failure is recorded to the corpus like any other; a
known bug of the target (an open corpus entry) makes the test an xfail naming the entry.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import case_events, geometries_for


@pytest.mark.parametrize("prop", ["guards", "commit", "extremes"])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_contract_property_holds(target_under_test, gdn_verdict, prop, data):
    target, arms, device = target_under_test
    p = get_property(prop)
    case = data.draw(p.strategy(arms=arms, geometries=geometries_for(target)))
    for e in case_events(case):
        event(e)
    gdn_verdict(prop, case, p.check(target, case, device), target.name)
