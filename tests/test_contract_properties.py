"""Host guards, the standalone commit, stored-record precision and extreme gates, against the
selected target (reference on the CPU, production on a GPU with --gdn-target production).

These four properties (gdn_fuzz.mutation: guards H4/H6/H9-H11/H13/H14, commit C2/C3, precision
N3, extremes N2) were written to kill catalogued mutants; here Hypothesis draws the Cases and
each must hold on the target itself.  A failure is recorded to the corpus like any other.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import case_events, geometries_for


@pytest.mark.parametrize("prop", ["guards", "commit", "precision", "extremes"])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_contract_property_holds(target_under_test, gdn_record, prop, data):
    target, arms, device = target_under_test
    p = get_property(prop)
    case = data.draw(p.strategy(arms=arms, geometries=geometries_for(target)))
    for e in case_events(case):
        event(e)
    findings = p.check(target, case, device)
    gdn_record(prop, case, findings, target.name)
    assert not findings, "\n".join([case.describe()] + [str(f) for f in findings])
