"""The prefix materializer (flashinfer-python 0.7.4's gdn_prefix_materialize; kernel-contract-0.7.4.md, PM*).

How this file tests
-------------------
* The float64 oracle (oracles/prefix.py) against a plain loop of PMM3 written here, and its skip rules
  (PMS1, PMS3-PMS5) against the contract's examples.
* Host checks, on this machine, against FlashInfer's own module (PMD3: loaded inside flashinfer.gdn_kernels,
  one module state per arm): every change of a valid call (hostchecks.PM_CHANGES) on every arm, and
  Hypothesis sets of 1-3 changes, each judged by the release model's order (gdn_fuzz.targets.releases,
  MATERIALIZE_074).  On CPU tensors PMH1-PMH12 are reached and every call that passes them stops at PMH13
  (num_active must be CUDA).  The same on the torch reference, which has no device checks.
* The properties (gdn_fuzz.properties.materialize) on the materializer under test: the reference on a CPU,
  FlashInfer's kernel on a CUDA GPU, over every arm and both ring depths; and that they can fail: each
  catalogued edit of the reference (mutants base "materialize-reference") is killed on a case that exposes it,
  and the kernel edits (base "materialize") on an SM90 GPU.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.engine import corpus
from gdn_fuzz.oracles import prefix as oracle
from gdn_fuzz.prefix_case import PrefixCase, PrefixRegime, Request, load_case, materialize_prefix, processed_rows
from gdn_fuzz.properties import get_property, hostchecks as hc
from gdn_fuzz.properties import materialize as pm
from gdn_fuzz.strategies.prefix import prefix_cases
from gdn_fuzz.targets import TargetUnavailable, get_target, mutants
from gdn_fuzz.targets.releases import get_release

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                      deadline=None)
REL = get_release("0.7.4")
EM = REL.entry("materialize")


def _case(reqs, **kw):
    d = dict(arm="bf16", H=1, HV=2, pool=max([r.src for r in reqs] + [r.dst for r in reqs] + [1]) + 1, ring=32,
             requests=tuple(reqs), seed=3)
    d.update(kw)
    return PrefixCase(**d)


# ------------------------------------------------------------------ the oracle


def _loop_pmm3(inputs, b):
    """PMM3 for request b by a plain loop (float64)."""
    st_, k, u, g = inputs["state"], inputs["k_cache"], inputs["u_cache"], inputs["g_cache"]
    s, base, C = int(inputs["src_slots"][b]), int(inputs["cache_base"][b]), int(inputs["count"][b])
    HV, R, H = st_.shape[1], k.shape[2], k.shape[1]
    out = []
    for hv in range(HV):
        slots = [(base + j) % R for j in range(C)]
        GC = float(g[s, hv, slots[-1]]) if C else 0.0
        S = torch.exp(torch.tensor(GC, dtype=torch.float64)) * st_[s, hv].double()
        for j, sl in enumerate(slots):
            w = torch.exp(torch.tensor(GC - float(g[s, hv, sl]), dtype=torch.float64))
            S = S + w * torch.outer(u[s, hv, sl].double(), k[s, hv // (HV // H), sl].double())
        out.append(S)
    return torch.stack(out)


def test_oracle_is_pmm3():
    case = _case([Request(0, 2, 30, 5, 7), Request(1, 3, -7, 16, 16), Request(0, 4, 30, 0, 7)], H=2, HV=4, ring=32)
    kw = materialize_prefix(case)
    e = oracle.materialize(**kw)
    assert e.rows == [0, 1, 2] and e.dst == [2, 3, 4] and e.copy.tolist() == [False, False, True]
    for i, b in enumerate(e.rows):
        assert torch.allclose(e.S[i], _loop_pmm3(kw, b), rtol=1e-12, atol=1e-12)
    assert torch.equal(e.S[2], kw["state"][0].double())  # count == 0: S0 itself


def test_oracle_skip_rules():
    # PMS1: negative src, dst, count, or count > 16; PMS3: -1 skipped, not a stop; PMS4: num_active caps
    assert oracle.processed([0, -1, 2, 3, 4], [5, 6, -2, 7, 8], [1, 1, 1, -3, 17]) == [0]
    assert oracle.active_entries([0, 0, 0], [-1, 2, 0], None) == [2, 0]
    assert oracle.active_entries([0, 0, 0], [2, 1, 0], 2) == [2, 1]  # too small: row 0 dropped
    assert oracle.active_entries([0, 0, 0], [2, 1, 0], -4) == []
    assert oracle.active_entries([0, -1, 0], None, None) == [0, 2]  # derived: count >= 0 in index order
    # PMS5's pitfall: a tight num_active of live-src rows beside a derived list drops a live row
    assert oracle.processed([-1, 0], [1, 2], [0, 3], None, 1) == []


def test_case_roundtrip_and_errors():
    case = _case([Request(0, 1, 3, 2, 4)], active="device", order_seed=5, num_active_slack=2,
                 regime=PrefixRegime(poison=True, bits="all"))
    d = json.loads(case.to_json())
    assert load_case(d) == case and d["kind"] == "materialize"
    with pytest.raises(ValueError, match="ring=24"):
        load_case(dict(d, ring=24))
    with pytest.raises(ValueError, match=r"requests\[0\].src=9"):
        load_case(dict(d, requests=[dict(src=9, dst=1, base=0, count=0, hist=0)]))
    with pytest.raises(ValueError, match="share its window"):
        _case([Request(0, 1, 3, 2, 4), Request(0, 2, 4, 2, 4)]).validate()


def test_poison_and_all_bits():
    case = _case([Request(0, 1, 30, 3, 4), Request(2, 3, 0, 0, 0)], regime=PrefixRegime(poison=True, bits="all"))
    kw = materialize_prefix(case)
    win = {(30 + j) & 31 for j in range(4)}
    for s in range(32):
        assert bool(torch.isnan(kw["g_cache"][0, :, s]).all()) == (s not in win)
    assert bool(torch.isnan(kw["state"][1].float()).all())  # a destination: poisoned, the kernel overwrites it
    pats = kw["state"][2].reshape(-1).view(torch.int16)
    assert len(set(pats.tolist())) == 2 * 128 * 128  # HV = 2: 32,768 distinct patterns


# ------------------------------------------------------------------ host checks against FlashInfer's module


@pytest.fixture(scope="module")
def released():
    try:
        t = get_target("materialize")
        for a in ARM_NAMES:
            t.module(a)
    except (TargetUnavailable, ImportError) as e:
        pytest.skip(f"flashinfer-python 0.7.4's gdn_prefix_materialize does not import here: {e}")
    return t


def _probe(t, arm, changes, device="cpu"):
    m = t.module(arm)
    return hc.probe(getattr(m, t.entry), m, t.release.release, "materialize", arm, changes, device)


@pytest.mark.parametrize("change", [pytest.param(c, id=c.id) for c in hc.PM_CHANGES.values()])
def test_single_change_released(released, change):
    bad = [(arm, p.problem or p.inputs_changed) for arm in change.arms if not (p := _probe(released, arm, [change])).ok]
    assert not bad, bad


def test_released_binds_each_arm(released):
    """PMD3: one module state per arm, each bound to that arm's flush module (its STATE and RING dtypes)."""
    from gdn_fuzz.arms import get_arm

    for arm in ARM_NAMES:
        m = released.module(arm)
        assert (m.state_ty_torch(), m.ring_ty_torch()) == (get_arm(arm).state, get_arm(arm).ring)


def test_cpu_calls_stop_at_pmh13(released):
    """Every otherwise valid call on CPU tensors ends at PMH13 (the derived num_active lives on the CPU)."""
    p = _probe(released, "bf16", [])
    assert p.expected.check.id == "PMH13" and p.observed.exc == "ValueError" and p.ok


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_change_sets_released(released, data):
    arm = data.draw(st.sampled_from(ARM_NAMES))
    pool = hc.changes_for(EM, arm)
    picked = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique_by=lambda c: c.id)
                       .filter(hc.compatible))
    p = _probe(released, arm, picked)
    assert p.ok, (p.changes, p.problem, p.inputs_changed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_change_sets_reference(data):
    t = get_target("materialize-reference")
    arm = data.draw(st.sampled_from(ARM_NAMES))
    picked = data.draw(st.lists(st.sampled_from(hc.changes_for(EM, arm)), min_size=1, max_size=3,
                                unique_by=lambda c: c.id).filter(hc.compatible))
    p = _probe(t, arm, picked)
    assert p.ok, (p.changes, p.problem, p.inputs_changed)


# ------------------------------------------------------------------ the properties, and that they can fail

PROPS = ("pm_launch", "pm_copy", "pm_relations", "pm_graph", "pm_guards")


def _new(target, found):
    """The findings that are not known bugs of the target's release (PM_KNOWN_BUGS: seen on the H200)."""
    known = set(corpus.known_on_backend({}, target, target.backend_for("bf16", 4, 1, 1)))
    return [f for f in found if f.signature() not in known]


@pytest.mark.parametrize("ring", (16, 32))
@pytest.mark.parametrize("prop", PROPS)
def test_properties_hold(materializer_under_test, prop, ring):
    """Each property on the materializer under test, every arm, one ring depth per test (one compile each); the
    release's known bugs (the count == 0 copy's -0 and NaN bits, PMS2) are expected outcomes."""
    target, arms, device = materializer_under_test
    p = get_property(prop)
    geoms = ((2, 8),) if str(device).startswith("cuda") else ((1, 2), (2, 4))
    strat = p.strategy(arms=arms, geometries=geoms).map(lambda c: dataclasses.replace(c, ring=ring))

    @settings(FIXTURE_OK, max_examples=12 if str(device).startswith("cuda") else 8)
    @given(strat)
    def body(case):
        found = _new(target, p.check(target, case, device))
        assert not found, case.describe() + "\n" + "\n".join(map(str, found))

    body()


def test_qwen_geometry_on_gpu(materializer_under_test):
    """H = 16, HV = 64 (Qwen3-Next) at B = 64 requests, every arm: the oracle and the write set (bits='random':
    the every-pattern copies are pm_copy's)."""
    target, arms, device = materializer_under_test
    if not str(device).startswith("cuda"):
        pytest.skip("the Qwen3-Next geometry is for the GPU (on the CPU the reference loops over requests)")
    p = get_property("pm_launch")

    @settings(FIXTURE_OK, max_examples=3)
    @given(prefix_cases(arms=arms, geometries=((16, 64),), buckets=(64,), bits="random"))
    def body(case):
        found = _new(target, p.check(target, case, device))
        assert not found, case.describe() + "\n" + "\n".join(map(str, found))

    body()


# one case per catalogued edit that exposes it (its doc says how); the unmodified base must pass it
_ALL = PrefixRegime(bits="all")
EXPOSE = {
    "anchor_lane": ("pm_launch", _case([Request(0, 1, 3, 5, 5)])),
    "over_window": ("pm_launch", _case([Request(0, 1, 0, 17, 16)])),
    "copy_arith": ("pm_copy", _case([Request(0, 1, 0, 0, 0)], regime=_ALL)),
    "num_active_short": ("pm_launch", _case([Request(0, 1, 0, 3, 3)])),
    "derived_positive": ("pm_launch", _case([Request(0, 1, 0, 0, 0)])),
    "no_depth_check": ("pm_guards", None),
    "no_wrap": ("pm_launch", _case([Request(0, 1, 12, 8, 8)], ring=16)),
    "skip_over_window": ("pm_launch", _case([Request(0, 1, 0, 17, 16)])),
    "anchor_lane_c": ("pm_launch", _case([Request(0, 1, 3, 5, 5)])),
    "w_mask_off_by_one": ("pm_launch", _case([Request(0, 1, 3, 5, 5)], regime=PrefixRegime(poison=True))),
    "g_ring_mask_32": ("pm_launch", _case([Request(0, 1, 12, 8, 8)], ring=16)),
    "copy_bdec_zero": ("pm_copy", _case([Request(0, 1, 0, 0, 0)])),
    "half0_from_dst": ("pm_launch", _case([Request(0, 1, 0, 3, 3)])),
    "key_head_mod": ("pm_launch", _case([Request(0, 1, 0, 3, 3)], H=2, HV=4)),
    "exp_sign": ("pm_launch", _case([Request(0, 1, 0, 5, 5)])),
}


def _expose(name):
    key = name.removeprefix("pm_ref_").removeprefix("pm_")
    return EXPOSE[key]


def _guard_case(target, arm="bf16"):
    """A pm_guards case whose one drawn change is a ring depth the check must refuse (alone: a later check that
    raises the same ValueError without naming an argument could not be told apart from PMH9)."""
    for seed in range(4000):
        c = _case([Request(0, 1, 0, 1, 1)], seed=seed, arm=arm)
        if [ch.id for ch in pm.guard_changes(target, c)] in (["pm.rings-24-slots"], ["pm.rings-8-slots"]):
            return c
    raise AssertionError("no seed draws a ring-depth change")


def _kills(name, device):
    m = mutants.get_mutant(name)
    prop, case = _expose(name)
    mt, base = get_target(f"mutant:{name}"), get_target(m.base)
    if case is None:
        case = _guard_case(mt)
    p = get_property(prop)
    on_base = p.check(base, case, device)
    assert not on_base, f"the unmodified {m.base} fails the exposing case: {[str(f) for f in on_base]}"
    found = p.check(mt, case, device)
    assert any(f.prop.startswith(m.prop) for f in found), (name, [str(f) for f in found])


@pytest.mark.parametrize("name", [n for n, m in mutants.CATALOGUE.items() if m.base == "materialize-reference"])
def test_reference_edits_killed(name):
    _kills(name, "cpu")


@pytest.mark.parametrize("name", [n for n, m in mutants.CATALOGUE.items() if m.base == "materialize"])
def test_kernel_edits_killed(materializer_under_test, name):
    """Each edit of FlashInfer's file is killed on the GPU (an SM90 GPU compiles the edited kernel)."""
    target, arms, device = materializer_under_test
    if not str(device).startswith("cuda") or not target.released:
        pytest.skip("edits of FlashInfer's gdn_prefix_materialize.py compile and launch on an SM90 GPU only")
    _kills(name, device)


def test_edits_apply_to_the_released_file():
    """Every kernel edit matches the installed file exactly once (a stale edit fails here, on any machine)."""
    try:
        src = mutants.base_path(mutants.get_mutant("pm_exp_sign")).read_text()
    except TargetUnavailable as e:
        pytest.skip(str(e))
    for n, m in mutants.CATALOGUE.items():
        if m.base == "materialize":
            mutants.apply(m, src)
    assert len([m for m in mutants.CATALOGUE.values() if m.base == "materialize"]) >= 8


def test_processed_rows_matches_oracle():
    case = _case([Request(0, 3, 0, 2, 2), Request(1, 4, 0, -1, 0), Request(2, 5, 0, 0, 0)], active="device",
                 order_seed=7, num_active_slack=-1)
    kw = materialize_prefix(case)
    assert processed_rows(case) == oracle.materialize(**kw).rows
