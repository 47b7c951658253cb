"""Shared fixtures: the target under test (chosen by --gdn-target / GDN_FUZZ_TARGET) and planted modules."""

from __future__ import annotations

import pytest

from gdn_fuzz.targets import TargetMismatch, TargetUnavailable, get_target


@pytest.fixture(scope="session")
def target_under_test(gdn_selection):
    """(Target, arms, device) for the property suites; skips with the reason when it cannot launch."""
    name, arms, device = gdn_selection
    try:
        t = get_target(name)
        for a in arms:
            t.module(a)
    except (TargetUnavailable, TargetMismatch, ImportError) as e:
        pytest.skip(f"target {name!r} unavailable here: {e}")
    why = t.unavailable_reason(device)
    if why:
        pytest.skip(why)
    return t, arms, device


# The thread policy (one torch thread per process) is the gdn_fuzz plugin's, in gdn_fuzz sessions.
