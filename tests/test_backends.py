"""The backend argument of flashinfer-python 0.7.4 on an SM90 GPU (H18-H22, M9): what runs is the HMMA kernel.

How this file tests
-------------------
On an SM90 GPU (the H200) backend="auto" finds the UMMA backend unavailable (H19: not an SM100-class
GPU) and runs the HMMA kernel; backend="hmma" runs it without asking.  So for every drawn legal launch
(gdn_fuzz.strategies.cases, every arm, T 4 and 8, pad rows, flush and verify rows) the two calls, each on
its own copy of the same inputs, must give the same bits: the output of every live row, the k/u/g rings,
the pool and the cursors.  The arguments that only UMMA reads (rand_seed, philox_rounds) and the
explicit stochastic_rounding="none" must change nothing either.  A release whose entry point takes no
`backend` (0.7.2.post1) skips with that reason; a machine without an SM90 GPU skips.  The host checks of
these arguments (H18, H20-H22) are tests/test_host_checks.py's, on the CPU and on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gdn_fuzz.case import materialize
from gdn_fuzz.observation import BUFFERS, clone_inputs, same_bits
from gdn_fuzz.strategies import case_events, cases, geometries_for

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                      deadline=None)

VARIANTS = {
    "hmma": dict(backend="hmma"),
    "rounding-args": dict(stochastic_rounding="none", rand_seed="never read on HMMA", philox_rounds=0),
}


def _hmma_target(target_under_test):
    target, arms, device = target_under_test
    if not str(device).startswith("cuda") or torch.cuda.get_device_capability(torch.device(device))[0] != 9:
        pytest.skip(f"needs an SM90 GPU, where backend='auto' resolves to HMMA (device {device})")
    if not target.released or target.model_entry != "flush":
        pytest.skip(f"target {target.name} is not FlashInfer's flush entry point")
    if "backend" not in target.release.release.entry("flush").params:
        pytest.skip(f"target {target.name} is modelled as {target.release.release.version}: no backend argument")
    return target, arms, device


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@FIXTURE_OK
@given(data=st.data())
def test_auto_runs_the_hmma_kernel_bit_identically(target_under_test, variant, data):
    """M9 on SM90: the default backend and the `variant` (backend='hmma'; or the UMMA-only rounding arguments
    given) launch bit-identically: every live row's output, the rings, the pool and the cursors."""
    target, arms, device = _hmma_target(target_under_test)
    case = data.draw(cases(arms=arms, geometries=geometries_for(target)), label="case")
    for e in case_events(case):
        event(e)
    inputs = materialize(case, device)
    a, b = clone_inputs(inputs), dict(clone_inputs(inputs), **VARIANTS[variant])
    ya = target.launch(case.arm, **a)
    yb = target.launch(case.arm, **b)
    live = inputs["initial_state_indices"].long() >= 0
    assert bool(same_bits(ya[live], yb[live]).all()), "y differs between backend='auto' and " + variant
    for name in BUFFERS:
        assert bool(same_bits(a[name], b[name]).all()), f"{name} differs between backend='auto' and {variant}"
