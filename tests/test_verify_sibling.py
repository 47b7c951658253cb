"""The verify-only sibling (gated_delta_rule_mtp_ucache, 16-slot flat ring) as a target and a differential
oracle for the fused kernel's verify rows (issue 18; gdn_fuzz.properties.sibling, docs/verify-sibling.md).

CPU (always): the layout map, the flat-ring oracle against the 32-slot oracle at base 0, the properties
on an EMULATION of the sibling (gdn_fuzz.targets.verify_sibling.EmulatedSibling: not the kernel) which
must pass faithful and catch each planted bug, the differential between that emulation and the
reference target (tolerance mode: they are not the same arithmetic), and the real sibling's host checks,
which run before any launch on a CPU-only machine.

GPU (skipped without CUDA, with the reason): the launch property on the real sibling, and the bitwise
differential between the real sibling and the real fused kernel (contract M7), both with Hypothesis.
Run them with (the package installed, `pip install --no-deps -e .`):
    pytest tests/test_verify_sibling.py --gdn-device cuda -p no:cacheprovider -rA
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.findings import BITS_DIFFER
from gdn_fuzz.observation import clone_inputs, same_bits
from gdn_fuzz.oracles import flat_ring
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.properties import sibling as ps
from gdn_fuzz.strategies import GPU_GEOMETRIES
from gdn_fuzz.targets import TargetUnavailable, get_target
from gdn_fuzz.targets import verify_sibling as vs

CPU_GEOMS = ((1, 1), (1, 2), (2, 4))  # small: the emulation runs T matmuls per row on the CPU
CPU_BUCKETS = (4,)
FIND = settings(max_examples=60, deadline=None, database=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))


def _describe(case, findings) -> str:
    return case.describe() + "\n" + "\n".join(str(f) for f in findings)


# ------------------------------------------------------------------ the layout map and the oracle


def test_layout_map_round_trip():
    """flat row j = ring slot j (base 0); mapping back restores slots 0..15 and keeps 16..31."""
    g = torch.Generator().manual_seed(0)
    ring = torch.randn(3, 2, 32, 8, generator=g)
    flat = vs.fused_ring_to_flat(ring)
    assert flat.shape == (3, 2, 16, 8) and flat.is_contiguous()
    assert torch.equal(flat, ring[:, :, :16])
    other = torch.randn(3, 2, 32, 8, generator=g)
    back = vs.flat_to_fused_ring(flat, like=other)
    assert torch.equal(back[:, :, :16], ring[:, :, :16]) and torch.equal(back[:, :, 16:], other[:, :, 16:])
    gring = torch.randn(3, 2, 32, generator=g)
    assert torch.equal(vs.flat_to_fused_ring(vs.fused_ring_to_flat(gring), gring), gring)
    with pytest.raises(ValueError):
        vs.fused_ring_to_flat(flat)
    # pool = heads = 1: the slice counts as contiguous in torch, but the sibling wants the dense strides
    one = vs.fused_ring_to_flat(torch.zeros(1, 1, 32, 128))
    assert one.stride() == (2048, 2048, 128, 1)


def test_sibling_inputs_pads_other_rows_and_drops_fused_arguments():
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=4, rows=(Row(2, 5, 0), Row(1, 3, 7), Row(-1, 0, 0), Row(0, 9, 0)),
                seed=1, flush_min=9)
    assert ps.eligible_rows(case) == [0]  # row 1: base 7; row 3: P = 9 = flush_min (a flush row)
    inp = materialize(case)
    sib = vs.sibling_inputs(inp, ps.eligible_rows(case))
    assert not set(vs.FUSED_ONLY) & set(sib)
    assert sib["initial_state_indices"].tolist() == [2, -1, -1, -1] and sib["hist_len"].tolist() == [5, 0, 0, 0]
    assert sib["k_cache"].shape[2] == sib["u_cache"].shape[2] == sib["g_cache"].shape[2] == 16


def test_flat_oracle_equals_ring_oracle_at_base_0():
    """The flat-ring oracle on the mapped inputs is the 32-slot oracle's verify path at base 0 (same math,
    two layouts): the same y, appended records and slots."""
    case = Case(arm="bf16", T=8, H=1, HV=2, pool=5, rows=(Row(3, 8, 0), Row(0, 0, 0), Row(-1, 0, 0), Row(4, 1, 0)),
                seed=7)
    inp = materialize(case)
    sib = vs.sibling_inputs(inp)
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], a=inp["a"], b=inp["b"], A_log=inp["A_log"],
                  dt_bias=inp["dt_bias"], pool=inp["initial_state_source"], idx=inp["initial_state_indices"],
                  hist_len=inp["hist_len"], scale=case.K ** -0.5)
    e32 = ring_oracle.launch(**common, k_cache=inp["k_cache"], u_cache=inp["u_cache"], g_cache=inp["g_cache"],
                             cache_base=inp["cache_base"], flush_min=17)
    e16 = flat_ring.launch(**common, k_cache=sib["k_cache"], u_cache=sib["u_cache"], g_cache=sib["g_cache"])
    live = ~e16.pad
    assert torch.equal(e16.slots[live], e32.slots[live])
    for f in ("y", "y_mag", "u_app", "u_mag", "k_app", "g_app", "g_mag"):
        assert torch.allclose(getattr(e16, f)[live], getattr(e32, f)[live], rtol=1e-12, atol=0), f
    assert not e16.flush.any()


def test_flat_oracle_refuses_rows_outside_the_domain():
    idx, P = torch.tensor([0, -1]), torch.tensor([13, 40])
    with pytest.raises(ValueError, match="P \\+ T <= 16"):
        flat_ring.check_cursors(idx, P, T=4)  # 13 + 4 > 16; the pad row's 40 is ignored
    flat_ring.check_cursors(idx, torch.tensor([12, 40]), T=4)


# ------------------------------------------------------------------ the properties on the emulation (CPU)


@settings(max_examples=25, deadline=None)
@given(case=ps.sibling_cases(geometries=CPU_GEOMS, buckets=CPU_BUCKETS))
def test_emulation_passes_the_launch_property(case):
    """(a) on the faithful emulation: no finding (the machinery does not cry wolf)."""
    findings = ps.check_sibling_launch(vs.EmulatedSibling(), case)
    assert not findings, _describe(case, findings)


EXPECTED_PROPS = {
    "append_shift": ("sibling.oracle.", "sibling.writes."),
    "state_write": ("sibling.writes.initial_state_source",),
    "g_local": ("sibling.oracle.g",),
}


@pytest.mark.parametrize("bug", sorted(vs.EMULATION_BUGS))
def test_launch_property_catches_planted_bug(bug):
    """(a) finds each planted bug of the emulation, with the finding its bug should give."""
    t = vs.EmulatedSibling(bug)
    case = find(ps.sibling_cases(geometries=CPU_GEOMS, buckets=CPU_BUCKETS),
                lambda c: bool(ps.check_sibling_launch(t, c)), settings=FIND)
    props = [f.prop for f in ps.check_sibling_launch(t, case)]
    assert any(p.startswith(EXPECTED_PROPS[bug]) for p in props), props


@settings(max_examples=20, deadline=None)
@given(case=ps.differential_cases(geometries=CPU_GEOMS, buckets=CPU_BUCKETS))
def test_differential_emulation_vs_reference_within_tolerance(case):
    """(b) in tolerance mode between the two CPU stand-ins (emulated sibling, reference fused kernel):
    no finding.  Not bitwise: they are different float32 computations."""
    findings = ps.check_differential(vs.EmulatedSibling(), get_target("reference"), case, exact=False)
    assert not findings, _describe(case, findings)


@pytest.mark.parametrize("bug", sorted(vs.EMULATION_BUGS))
def test_differential_catches_planted_bug(bug):
    t, ref = vs.EmulatedSibling(bug), get_target("reference")
    case = find(ps.differential_cases(geometries=CPU_GEOMS, buckets=CPU_BUCKETS),
                lambda c: bool(ps.check_differential(t, ref, c, exact=False)), settings=FIND)
    findings = ps.check_differential(t, ref, case, exact=False)
    assert all(f.prop.startswith("sibling.diff.") for f in findings), findings


def test_exact_differential_reports_bits_with_their_size():
    """exact=True flags any bit difference, and says how large it is against twice the tolerance: between
    the two CPU stand-ins y differs in low bits only (well under the bound)."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=3, rows=(Row(1, 6, 0), Row(0, 2, 0)), seed=5)
    findings = ps.check_differential(vs.EmulatedSibling(), get_target("reference"), case, exact=True)
    assert findings and all(f.outcome == BITS_DIFFER and f.clause == "M7" for f in findings)
    assert all(f.value < 1e-3 for f in findings if f.value is not None), findings
    assert not ps.check_differential(vs.EmulatedSibling(), get_target("reference"), case, exact=False)


def test_differential_without_an_eligible_row_checks_nothing():
    case = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 5, 3), Row(1, 13, 0)), seed=0)  # base 3; a flush row
    assert ps.eligible_rows(case) == []
    assert ps.check_differential(vs.EmulatedSibling("append_shift"), get_target("reference"), case) == []


def test_sibling_launch_refuses_cases_outside_its_domain():
    with pytest.raises(ValueError, match="domain"):
        ps.check_sibling_launch(vs.EmulatedSibling(), Case(arm="bf16", T=4, H=1, HV=1, pool=1,
                                                           rows=(Row(0, 2, 5),), seed=0))
    with pytest.raises(ValueError, match="bf16 only"):
        ps.check_sibling_launch(vs.EmulatedSibling(), Case(arm="fp16", T=4, H=1, HV=1, pool=1,
                                                           rows=(Row(0, 2, 0),), seed=0))


def test_doctor_says_what_is_driven(monkeypatch):
    from gdn_fuzz.engine import doctor

    # find_spec of the sibling imports all of flashinfer (seconds); whether it is installed is not the point here
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    line = next(ln for ln in doctor._siblings("cpu") if "driven by gdn_fuzz" in ln and "tests/test_verify_sibling" in ln)
    assert "yes" in line and "tests/test_verify_sibling.py" in line


# ------------------------------------------------------------------ the real sibling's host checks (CPU)


@pytest.fixture(scope="module")
def sibling_module():
    try:
        return vs.get_sibling().module()
    except (TargetUnavailable, ImportError) as e:
        pytest.skip(f"the sibling module does not import here: {e}")


def _valid_call() -> dict:
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=3, rows=(Row(2, 5, 0), Row(0, 0, 0)), seed=2)
    return vs.sibling_inputs(materialize(case))


BROKEN = {
    # name: (how to break the valid call, exception type, message substring or None for a bare assert)
    "ring_32_slots": (lambda kw: kw.update(k_cache=torch.zeros(3, 1, 32, 128, dtype=torch.bfloat16)),
                      AssertionError, "LEGACY 16-deep flat ring"),
    "state_fp32": (lambda kw: kw.update(initial_state_source=kw["initial_state_source"].float()),
                   AssertionError, "initial_state_source must be bf16"),
    "q_fp16": (lambda kw: kw.update(q=kw["q"].half()), AssertionError, "bf16-only"),
    "u_ring_fp16": (lambda kw: kw.update(u_cache=kw["u_cache"].half()), AssertionError, "bf16 u_cache only"),
    "hist_len_int64": (lambda kw: kw.update(hist_len=kw["hist_len"].long()), AssertionError, None),
    "T_6": (lambda kw: kw.update({n: torch.cat([kw[n], kw[n][:, :2]], 1) for n in ("q", "k", "v", "a", "b")}),
            NotImplementedError, "T=6 unsupported"),
    "cache_base": (lambda kw: kw.update(cache_base=torch.zeros(2, dtype=torch.int32)), TypeError, "cache_base"),
}


@pytest.mark.kernel_module
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_real_sibling_host_checks(sibling_module, name):
    """The real sibling's host checks on CPU tensors: the exception type and message of its source (line
    numbers in gdn_fuzz.targets.verify_sibling), and every input left bitwise unchanged."""
    kw = _valid_call()
    breaker, exc, msg = BROKEN[name]
    breaker(kw)
    before = clone_inputs(kw)
    with pytest.raises(exc) as ei:
        getattr(sibling_module, vs.SIBLING_ENTRY)(**kw)
    if msg is None:
        assert str(ei.value) == "", f"expected a bare assert, got {ei.value!r}"
    else:
        assert msg in str(ei.value)
    for n, t in before.items():
        if isinstance(t, torch.Tensor):
            assert bool(same_bits(t, kw[n]).all()), n


@pytest.mark.kernel_module
def test_real_sibling_valid_call_reaches_the_device_check(sibling_module):
    """A valid call passes every host check and stops at the CUDA-only check (H15's counterpart)."""
    kw = _valid_call()
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine CPU tensors may take another path; the GPU tests launch for real")
    with pytest.raises(ValueError, match="require CUDA tensors"):
        getattr(sibling_module, vs.SIBLING_ENTRY)(**kw)
    assert vs.available("cpu") is not None


# ------------------------------------------------------------------ GPU: the real sibling and the real fused kernel

# Bounded examples: every new (T, H, HV, launch-bound bucket of B) is one JIT compile of the sibling and, for
# the differential, one of the fused kernel (~1-2 s each, contract D4; the sibling's wrapper keys its cache the
# same way, lines 2713-2729), and a GPU session's time is short.  Measured on an H200 (2026-12-02): 40 examples
# per test took 14 s and 11 s with a cold kernel store, 250 took 16 s and 13 s with a warm one.  100 covers the
# 2 T x 3 geometries x 2 buckets menu several times over; GDN_FUZZ_SIBLING_EXAMPLES sets another number.
GPU_EXAMPLES = int(os.environ.get("GDN_FUZZ_SIBLING_EXAMPLES", "100"))


@pytest.fixture(scope="module")
def gpu_device(request):
    # the gdn_fuzz plugin's --gdn-device (or $GDN_FUZZ_DEVICE), else cuda where torch sees a GPU
    device = (request.config.getoption("--gdn-device", default=None) or os.environ.get("GDN_FUZZ_DEVICE")
              or ("cuda" if torch.cuda.is_available() else "cpu"))
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        pytest.skip(f"the real sibling launches only on a CUDA GPU (SM90+); device={device!r}, "
                    f"cuda available={torch.cuda.is_available()} (run with --gdn-device cuda on an H200)")
    why = vs.available(device)
    if why:
        pytest.skip(why)
    return device


@pytest.fixture(scope="module")
def fused_target(gpu_device):
    try:
        t = get_target("production")
        t.module("bf16")
    except (TargetUnavailable, ImportError) as e:
        pytest.skip(f"the fused production kernel is unavailable: {e}")
    why = t.unavailable_reason(gpu_device)
    if why:
        pytest.skip(why)
    return t


@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=ps.sibling_cases(geometries=GPU_GEOMETRIES))
def test_gpu_sibling_launch_property(gpu_device, case):
    """(a) on the real sibling: y and the appended records within the bf16 table of the flat-ring float64
    oracle; the pool and every other ring row bitwise untouched."""
    findings = ps.check_sibling_launch(vs.get_sibling(), case, gpu_device)
    assert not findings, _describe(case, findings)


@pytest.mark.gpu
@settings(max_examples=GPU_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=ps.differential_cases(geometries=GPU_GEOMETRIES))
def test_gpu_differential_bitwise(gpu_device, fused_target, case):
    """(b) the real sibling against the real fused kernel's verify rows at base 0: bit-identical (M7).
    A failure names each differing output with its size against twice the bf16 tolerance."""
    findings = ps.check_differential(vs.get_sibling(), fused_target, case, gpu_device, exact=True)
    assert not findings, _describe(case, findings)
