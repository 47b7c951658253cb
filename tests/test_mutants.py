"""The mutant catalogue: no mutant is equivalent, and the suite keeps killing them.

How this file tests
-------------------
1. Non-equivalence (one test per reference-based mutant of gdn_fuzz.targets.mutants.CATALOGUE): each
   mutant has a hand-picked Case and the property expected to kill it (HAND below, chosen
   by reading the mutant's edit, not by a search).  The property must report a finding whose
   prop starts with the mutant's `prop` field on the mutant, and nothing on the reference
   target for the same Case: so the mutant computes something the reference does not, on an
   input written down here.  The crashing mutant (`worker_crash`) runs in an isolated worker
   (gdn_fuzz.engine.isolation) and must die with SIGSEGV on its case and not on a neighbour.
   A new reference mutant without an entry in HAND fails here, by name.
2. Kill-rate regression: every reference mutant (the crashing one aside) is killed by a
   campaign of the property family its `prop` field names within 60 examples, no shrinking.
   The whole suite against the full catalogue at 120 s per mutant, with time-to-kill and the
   baseline beside it, is `gdn-fuzz mutants --budget 120` (minutes, not CI).
"""

from __future__ import annotations

import dataclasses

import pytest

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import Case, Regime, Row
from gdn_fuzz.targets.mutants import CATALOGUE
from gdn_fuzz.properties import get_property
from gdn_fuzz.properties.relations import metamorphic_check
from gdn_fuzz.targets import get_target

CASES = {
    # row 0 flushes at exactly flush_min (13) with a window wrapping past slot 31; row 1 verifies at
    # base 20; a pad row; row 3 has P = 0 at base 31 (its appends wrap).  Slots are permuted.
    "wrap": Case(arm="bf16", T=4, H=1, HV=2, pool=4,
                 rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)), seed=7),
    "gqa": Case(arm="bf16", T=4, H=2, HV=4, pool=2, rows=(Row(1, 6, 3), Row(0, 13, 0)), seed=3),  # H=2, G=2
    "t8": Case(arm="bf16", T=8, H=1, HV=2, pool=2, rows=(Row(1, 9, 28), Row(0, 3, 0)), seed=5),
    "fmin5": Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 8, 0),), flush_min=5, seed=2),
    "ring16": Case(arm="bf16-state16-ring16", T=4, H=1, HV=2, pool=2, rows=(Row(0, 13, 0), Row(1, 4, 9)), seed=4),
    "state16": Case(arm="bf16-state16", T=4, H=1, HV=2, pool=2, rows=(Row(0, 13, 0), Row(1, 4, 9)), seed=4),
    "b64": Case(arm="bf16", T=4, H=1, HV=1, pool=40, seed=8,
                rows=tuple(Row((7 * i) % 40, i % 17, (3 * i) % 32) for i in range(40)) + (Row(-1),) * 24),
    "eps": Case(arm="bf16", T=4, H=1, HV=2, pool=2, rows=(Row(0, 13, 0), Row(1, 4, 9)), seed=4,
                regime=Regime(qk_scale=3e-5)),
    # a fill="rows" pool of 16,385 slots at HV = 8: row 0 sits on slot 16,384, offset 2^31 (tests/test_pool_scale.py)
    "int32": Case(arm="bf16", T=4, H=4, HV=8, pool=16385, fill="rows", seed=3,
                  rows=(Row(16384, 5, 3), Row(-1), Row(0, 16, 20), Row(-1))),
}

# mutant -> (case, property name or "metamorphic:<relation>")
HAND = {
    "fold_skipped": ("wrap", "launch"),
    "no_local_g_restart": ("wrap", "launch"),
    "anchor_off_by_one": ("wrap", "launch"),
    "flush_restart_at_zero": ("wrap", "launch"),
    "pad_rows_write": ("wrap", "launch"),
    "flush_off_by_one": ("wrap", "launch"),  # row 0 has P == flush_min
    "window_mask_15": ("wrap", "launch"),  # windows at base 25 and 20
    "window_wrap_missing": ("wrap", "launch"),  # base 25 + 16 lanes > 32: IndexError
    "append_mask_15": ("wrap", "launch"),
    "window_lane_le": ("wrap", "launch"),
    "append_overlaps_anchor": ("wrap", "launch"),
    "flush_min_ignored": ("fmin5", "launch"),  # flush_min 5 <= P = 8 < 13
    "g_per_token": ("wrap", "launch"),
    "t8_scan_no_carry": ("t8", "launch"),
    "fold_includes_drafts": ("wrap", "launch"),
    "fold_no_bdec": ("wrap", "launch"),
    "pad_output_zeroed": ("wrap", "output_inplace"),
    "g_append_by_batch_row": ("wrap", "launch"),  # row 0 lives on slot 2
    "fold_to_batch_row": ("wrap", "launch"),
    "head_map_mod": ("gqa", "launch"),
    "beta_no_sigmoid": ("wrap", "launch"),
    "q_scale_missing": ("wrap", "launch"),
    "tile32_no_offset": ("b64", "launch"),  # 40 real rows in a bucket of 64: rows 32.. read rows 0..'s slots
    "tiny_norm_as_zero": ("eps", "launch"),  # ||k||^2 ~ 1.2e-7: below the eps, where k_hat is not 0
    "pool_offset_int32": ("int32", "launch"),  # the checkpoint of slot 16,384 read at a wrapped offset
    "params_cast_cached_by_id": ("wrap", "params_inplace"),  # seed 7: dt_bias from an fp32 source
    "commit_base_slides_verify": ("wrap", "commit"),  # row 1 verifies with P = 5
    "commit_pad_exempt": ("wrap", "commit"),  # the pad row gets P >= flush_min
    "guard_T": ("wrap", "guards"),
    "guard_flush_min_zero": ("wrap", "guards"),
    "guard_flush_min_cap": ("wrap", "guards"),
    "guard_hist_len_range": ("wrap", "guards"),
    "guard_ab_dtype": ("wrap", "guards"),
    "guard_cache_base_none": ("wrap", "guards"),
    "b_token_stride_hardcoded": ("wrap", "metamorphic:strided_ab"),
    "paged_pool_as_dense": ("wrap", "metamorphic:strided_pool"),
}
CRASHING = {"worker_crash": (Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 16, 5),), seed=1),
                             Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 15, 5),), seed=1))}

REFERENCE_MUTANTS = [n for n, m in CATALOGUE.items() if m.base == "reference" and m.scored]


def _check(prop: str):
    if prop.startswith("metamorphic:"):
        return metamorphic_check(prop.split(":", 1)[1])
    return get_property(prop).check


def test_catalogue_size():
    assert len(REFERENCE_MUTANTS) >= 20, REFERENCE_MUTANTS


@pytest.mark.parametrize("name", REFERENCE_MUTANTS)
def test_mutant_is_not_equivalent(name):
    """The mutant's expected property finds it on a hand-picked Case; the reference passes that Case."""
    m = CATALOGUE[name]
    if name in CRASHING:
        from gdn_fuzz.engine.isolation import Worker

        boom, fine = CRASHING[name]
        w = Worker(f"mutant:{name}", "cpu", name=f"t_{name}")
        try:
            assert w.check("launch", fine) == []
            (f,) = w.check("launch", boom)
            assert f.prop == m.prop and "SIGSEGV" in f.message
        finally:
            w.close()
        assert get_property("launch").check(get_target("reference"), boom, "cpu") == []
        return
    assert name in HAND, f"mutant {name!r} has no hand-picked killing input: add it to HAND in {__file__}"
    case_key, prop = HAND[name]
    case, check = CASES[case_key], _check(prop)
    found = check(get_target(f"mutant:{name}"), case, "cpu")
    assert any(f.prop.startswith(m.prop) for f in found), (
        f"{name}: expected a {m.prop}* finding from {prop} on case {case_key!r}; got {[str(f) for f in found]}")
    clean = check(get_target("reference"), case, "cpu")
    assert clean == [], f"the reference fails the hand-picked case {case_key!r}: {[str(f) for f in clean]}"


FAMILY = {"oracle": "launch", "writes": "launch", "launch": "launch", "routing": "routing",
          "determinism": "determinism", "output_inplace": "output_inplace", "metamorphic": "metamorphic",
          "guard": "guards", "commit": "commit", "extremes": "extremes", "params_inplace": "params_inplace"}


@pytest.mark.parametrize("name", [n for n in REFERENCE_MUTANTS if n not in CRASHING])
def test_kill_rate_no_regression(name):
    """Kill-rate regression within a CI budget: each mutant is killed by a campaign of the property
    family its `prop` names, within 60 examples (an example budget, not a time budget, so the check
    does not depend on machine load).  The whole suite against the whole catalogue, with shrinking
    and time-to-kill, is `gdn-fuzz mutants --budget 120` (docs: issue notes)."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.strategies import CPU_BUCKETS, CPU_GEOMETRIES, pool_scales_for

    m = CATALOGUE[name]
    prop = get_property(FAMILY[m.prop.split(".")[0]])
    pool_scales, _ = pool_scales_for("cpu", CPU_GEOMETRIES, ARM_NAMES)  # what `gdn-fuzz run` draws on the CPU
    c = Campaign(target=get_target(f"mutant:{name}"), device="cpu", properties=[prop], arms=ARM_NAMES,
                 Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=CPU_BUCKETS, seed=0, round_examples=60,
                 shrink=False, stop_on_finding=True, pool_scales=pool_scales)
    c.run(examples=60)
    assert c.findings, f"mutant {name} ({m.clause}) survived {c.stats.examples} examples of property {prop.name}"


# ------------------------------------------------------------------ mutants of the released kernel file
# One-line edits of flashinfer's gdn_decode_bf16_wy_ucache_flush.py (base="production"), applied to a
# temporary copy at run time.  On the CPU: each edit matches the installed file exactly once and the
# mutated module imports and fits the contract.  On an SM90 GPU: each is found on a hand-picked Case
# and the unmodified kernel passes the same Case (non-equivalence, as for the reference mutants).
PRODUCTION_MUTANTS = [n for n, m in CATALOGUE.items() if m.base == "production" and m.prop != "crash"]
CASES["lazy12"] = Case(arm="bf16", T=4, H=1, HV=2, pool=2, rows=(Row(1, 12, 3), Row(0, 4, 0)), seed=6)
PROD_HAND = {
    "prod_no_local_g_restart": ("wrap", "launch"),  # row 0 flushes with P = 13
    "prod_anchor_lane_p": ("wrap", "launch"),
    "prod_fold_no_bdec": ("wrap", "launch"),
    "prod_g_append_restart": ("wrap", "launch"),  # row 1 (P = 5) appends g inside its window
    "prod_beta_no_sigmoid": ("wrap", "launch"),
    "prod_lazy_flush_min": ("lazy12", "launch"),  # flush_min=None, P = 12 = 16 - T folds early
    "prod_commit_slides_verify": ("wrap", "commit"),
    "prod_commit_pad_exempt": ("wrap", "commit"),
    "prod_guard_hist_len": ("wrap", "guards"),
}


def _production_file_or_skip():
    from gdn_fuzz.targets import TargetUnavailable, resolve_production_path

    try:
        return resolve_production_path()
    except TargetUnavailable as e:
        pytest.skip(f"the released kernel file is not installed here ({e}); install the kernel-cpu extra")


def test_production_catalogue_has_a_handful():
    assert len(PRODUCTION_MUTANTS) >= 5, PRODUCTION_MUTANTS
    assert set(PRODUCTION_MUTANTS) == set(PROD_HAND), "every production mutant needs a hand-picked case"


@pytest.mark.parametrize("name", PRODUCTION_MUTANTS)
def test_production_mutant_applies_and_imports(name):
    """The edit matches the installed kernel file exactly once, and the mutated copy imports and fits."""
    from gdn_fuzz.targets.mutants import apply

    path = _production_file_or_skip()
    src = path.read_text()
    out = apply(CATALOGUE[name], src)
    assert out != src
    mod = get_target(f"mutant:{name}").module("bf16")
    assert mod.RING_SLOTS == 32 and mod.W_RING == 16


@pytest.mark.parametrize("name", PRODUCTION_MUTANTS)
def test_production_mutant_is_not_equivalent(name, gdn_selection):
    """GPU: the mutant's expected property finds it on the hand-picked Case; the released kernel passes it."""
    gdn_device = gdn_selection[2]
    if not str(gdn_device).startswith("cuda"):
        pytest.skip("needs an SM90 GPU (--gdn-device cuda): the released kernel JIT-compiles for SM90 only")
    _production_file_or_skip()
    m = CATALOGUE[name]
    case_key, prop = PROD_HAND[name]
    case, check = CASES[case_key], _check(prop)
    found = check(get_target(f"mutant:{name}"), case, gdn_device)
    assert any(f.prop.startswith(m.prop) for f in found), (
        f"{name}: expected a {m.prop}* finding from {prop} on case {case_key!r}; got {[str(f) for f in found]}")
    clean = check(get_target("production"), case, gdn_device)
    assert clean == [], f"the released kernel fails the hand-picked case {case_key!r}: {[str(f) for f in clean]}"


def test_a_finding_the_base_shares_is_not_a_kill():
    """Mutation score counts only findings the unmodified base passes: a property that fails on the
    base too (a known bug of the released kernel, say) must not credit the suite with a kill."""
    from gdn_fuzz.findings import Finding
    from gdn_fuzz.studies.mutation_score import run_mutants
    from gdn_fuzz.properties import Property

    always = Property(name="launch", clauses="-", doc="fails on every target", strategy=get_property("launch").strategy,
                      check=lambda target, case, device="cpu": [Finding("launch.always", "-", "fails everywhere")])
    import gdn_fuzz.properties as P

    saved = P.REGISTRY["launch"]
    P.REGISTRY["launch"] = always  # the base check looks the property up by name
    try:
        (rec,) = run_mutants(["fold_skipped"], budget_s=2.0, properties=[always], arms=("bf16",), Ts=(4,),
                             baseline=False, round_examples=5)
    finally:
        P.REGISTRY["launch"] = saved
    assert not rec["killed"] and rec["base_also_fails"] and rec["base_also_fails"][0]["prop"] == "launch"


def test_isolated_baseline_runs_on_the_campaigns_device(monkeypatch):
    """The baseline of a mutant that kills its process runs in a child on the study's device.  Before: the
    child ran on the CPU, so on the H200 the production crash mutant's baseline 'killed' it with "GDN CuTe-DSL
    kernels require CUDA tensors, got cpu" (docs/mutation.md, run 26)."""
    import subprocess

    from gdn_fuzz.studies import mutation_score

    seen = []

    def fake_run(argv, **kw):
        seen.append(argv[-1])
        return subprocess.CompletedProcess(argv, 0, stdout='{"killed": false, "failures": []}\n', stderr="")

    monkeypatch.setattr(mutation_score.subprocess, "run", fake_run)
    assert mutation_score._baseline_isolated("gpu_oob_full_window", ("bf16",), "cuda") == dict(killed=False,
                                                                                             failures=[])
    assert "device='cuda'" in seen[0]


@pytest.mark.parametrize("qk_scale", [1.0, 1e-3, 30.0])
def test_eps_scale_mutant_needs_the_eps_regime(qk_scale):
    """tiny_norm_as_zero (issue 18) only shows for ||k||^2 far below 1e-4: at the key scales the
    strategies drew before the eps-scale regime (qk_scale 1.0, 1e-3, 30: ||k||^2 >= 1.3e-4) and with
    exact zero keys it gives the reference's results, so the kill in test_kill_rate_no_regression
    comes from the new regime."""
    for keys in ("random", "zero_norm"):
        case = dataclasses.replace(CASES["eps"], regime=Regime(qk_scale=qk_scale, keys=keys))
        assert get_property("launch").check(get_target("mutant:tiny_norm_as_zero"), case, "cpu") == []


@pytest.mark.parametrize("bucket", [4, 8, 16, 32])
def test_batch_scale_mutant_needs_the_large_buckets(bucket):
    """tile32_no_offset (issue 18) only shows in batches of more than 32 rows: in every bucket the
    strategies drew before the batch-scale regime (4, 8), and up to 32, it gives the reference's
    results, so its kill in test_kill_rate_no_regression comes from the buckets >= 64."""
    case = dataclasses.replace(CASES["b64"], rows=CASES["b64"].rows[:bucket], pool=40)
    assert get_property("launch").check(get_target("mutant:tile32_no_offset"), case, "cpu") == []


def test_two_mutants_planted_in_one_file():
    """mutant:A+B (the grouping study's pairs): both edits applied in turn, the source then differs from the base on
    exactly the two edited lines; two edits of one line, or of two bases, are refused naming the fix."""
    from gdn_fuzz.targets.mutants import apply, base_path, get_mutant

    m = get_mutant("fold_skipped+head_map_mod")
    a, b = CATALOGUE["fold_skipped"], CATALOGUE["head_map_mod"]
    src = base_path(a).read_text()
    out = apply(m, src)
    assert out == src.replace(a.old, a.new).replace(b.old, b.new) and a.new in out and b.new in out
    assert not m.scored and m.clause == f"{a.clause},{b.clause}"
    assert str(get_target("mutant:fold_skipped+head_map_mod").path).endswith(".py")
    with pytest.raises(ValueError, match=r"each of its edits must match .* exactly once.*combine edits that touch"):
        apply(get_mutant("fold_skipped+fold_to_batch_row"), src)  # one line, edited twice
    with pytest.raises(ValueError, match=r"combines edits of different bases"):
        get_mutant("fold_skipped+prod_anchor_lane_p")
    with pytest.raises(ValueError, match=r"mutant='nope' is not in the catalogue.*joined by '\+'"):
        get_mutant("fold_skipped+nope")
