"""pytest plugin (entry point pytest11): gdn_fuzz options, report header, Hypothesis profiles.

Options (group "gdn_fuzz", prefix --gdn-):
  --gdn-target NAME|PATH   target for the property suites (default: production on an SM90+
                           GPU, else reference; env GDN_FUZZ_TARGET)
  --gdn-arms A,B           dtype arms to run (default: all five)
  --gdn-device D           torch device (default: cuda when available, else cpu)
Profiles (--hypothesis-profile NAME or env GDN_FUZZ_PROFILE): ci (deterministic, bounded),
dev (the default outside CI; ci is the default when $CI is set), nightly (many examples, long stateful runs).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None, stateful_step_count=250,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("GDN_FUZZ_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    g = parser.getgroup("gdn_fuzz", "gdn_fuzz property suites")
    g.addoption("--gdn-target", default=os.environ.get("GDN_FUZZ_TARGET"),
                help="reference | production | sm100 | PATH.py (env GDN_FUZZ_TARGET)")
    g.addoption("--gdn-arms", default=os.environ.get("GDN_FUZZ_ARMS"), help="comma-separated dtype arms")
    g.addoption("--gdn-device", default=os.environ.get("GDN_FUZZ_DEVICE"), help="torch device")


def _selection(config):
    from .arms import ARM_NAMES, get_arm
    from .targets import default_target_name

    target = config.getoption("--gdn-target") or default_target_name()
    arms = config.getoption("--gdn-arms")
    arms = tuple(a.strip() for a in arms.split(",")) if arms else ARM_NAMES
    for a in arms:
        get_arm(a)
    import torch

    device = config.getoption("--gdn-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    return target, arms, device


def pytest_report_header(config):
    import torch

    target, arms, device = _selection(config)
    prof = settings._current_profile
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return [f"gdn_fuzz: target={target} arms={','.join(arms)} device={device} gpu={gpu} "
            f"torch={torch.__version__} hypothesis-profile={prof}"]


@pytest.fixture(scope="session")
def gdn_selection(pytestconfig):
    """(target name, arms, device) chosen by the gdn_fuzz options."""
    return _selection(pytestconfig)
