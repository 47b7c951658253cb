"""Shared fixtures: the target under test (chosen by --gdn-target / GDN_FUZZ_TARGET) and planted modules."""

from __future__ import annotations

import os

import pytest
import torch

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


def pytest_configure(config):
    # The CPU cases are small ([B <= 8, HV <= 8, 128, 128]): intra-op threads only oversubscribe
    # the cores that xdist workers already share (measured 10-50x slower on a 2-core machine).
    torch.set_num_threads(int(os.environ.get("GDN_FUZZ_TORCH_THREADS", "1")))
