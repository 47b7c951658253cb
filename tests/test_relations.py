"""Bitwise relations between launches (gdn_fuzz.properties.relations) against the selected target.

How this file tests, in plain words
-----------------------------------
The oracle tests (test_launch.py) say "close to the float64 math".  The relations here say
"exactly the same bits as another launch that must compute the same thing the same way",
which catches bugs far below any tolerance: a flush row computing y from a rounded
checkpoint, a launch that is not deterministic, an output tensor whose pad rows get
overwritten, a row whose result depends on its batch position or on the slot indirection.

Hypothesis draws a Case (geometry, dtype arm, rows with cursors at the routing edges, pad
rows, a value regime and a seed); each relation materializes it once, launches it as drawn,
launches a transformed copy of the same tensors (another flush_min, a second time, another
output tensor, permuted rows, moved pool slots, rows turned into pads, rotated rings,
strided views) and compares bits.  Pad rows' outputs are never compared (M8: uninitialized).

No test here passes without checking: routing draws its Cases with the routing property's own
strategy (a row that some legal flush_min switches in every Case), and
test_metamorphic[strided_pool] is skipped, with the reason, on a target that refuses
block-strided pools (NotImplementedError, allowed by H16 when the strided mode is off at import:
the reference, the independent target and the released module all refuse); the relation itself
is checked on the mode-on plant (test_strided_pool_relation_runs_when_the_mode_is_on).  A relation
that a Case cannot exercise records a Hypothesis event (test_unexercised_relations_are_recorded).

The second half plants bugs in copies of the reference target (text edits, each applying
exactly once) and requires the matching relation to find each within 300 examples with
hypothesis.find (generation only: no shrinking, to keep the suite fast).  The unmodified
reference passing the first half is the other side of that coin.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, event, find, given, settings
from hypothesis import strategies as st

from gdn_fuzz.properties import base as properties_base
from gdn_fuzz.properties import relations as R
from gdn_fuzz.case import Case, Row
from gdn_fuzz.properties import REGISTRY
from gdn_fuzz.strategies import case_events, cases, geometries_for
from gdn_fuzz.targets import REFERENCE_PATH, get_target

from .planted import Plant, plant


def _draw(target_under_test, data, strategy=cases):
    target, arms, _ = target_under_test
    case = data.draw(strategy(arms=arms, restart=RESTART, geometries=geometries_for(target)), label="case")
    for e in case_events(case):
        event(e)
    return case


def _run_check(target_under_test, verdict, data, check, prop):
    target, _, device = target_under_test
    case = _draw(target_under_test, data)
    verdict(prop, case, check(target, case, device), target.name)
    return case


FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # gdn_verdict spans examples


# ------------------------------------------------------------------ the relations hold

# both cursor conventions: the relations compare committed cursors too (C2)
RESTART = (False, True)


@FIXTURE_OK
@given(data=st.data())
def test_routing_flush_and_verify_rows_bit_identical(target_under_test, gdn_verdict, data):
    """M7, M8: moving flush_min so rows switch route changes only their g appends and pool rows.
    Cases come from the routing property's strategy (R.routing_cases): every one has a row that
    some legal flush_min switches, so every example compares two launches."""
    target, _, device = target_under_test
    case = _draw(target_under_test, data, R.routing_cases)
    f2 = R.alternate_flush_min(case)
    assert f2 is not None, f"routing_cases drew a Case no legal flush_min reroutes: {case.describe()}"
    n = sum((r.hist_len >= case.fmin) != (r.hist_len >= f2) for r in case.rows if not r.pad)
    event(f"routing: {'1' if n == 1 else '2+'} row(s) switch route")
    gdn_verdict("routing", case, R.check_routing(target, case, device), target.name)


@given(case=R.routing_cases(restart=RESTART))
@settings(max_examples=200, database=None)
def test_routing_strategy_always_draws_a_switchable_row(case):
    """The routing strategy's every Case has a live row with 1 <= P <= 16 - T (pure, no launch):
    before it, 56 of 200 Cases drawn from cases() had none and routing compared nothing for them."""
    assert any(not r.pad and 1 <= r.hist_len <= 16 - case.T for r in case.rows), case
    assert R.alternate_flush_min(case) is not None


@FIXTURE_OK
@given(data=st.data())
def test_determinism_same_inputs_same_bits(target_under_test, gdn_verdict, data):
    """R1-R3: two launches of the same inputs give the same bits."""
    _run_check(target_under_test, gdn_verdict, data, R.check_determinism, "determinism")


@given(case=cases())
@settings(max_examples=200)
def test_read_and_write_sets_disjoint(case):
    """R2 (pure): every legal case reads its windows and writes its appends on disjoint slots."""
    assert R.check_rw_disjoint(case) == []


def test_read_write_overlap_is_reported():
    """R2/R3: two rows on one pool slot overlap (one row's appends land in the other's window)."""
    rows = (Row(slot=0, hist_len=8, cache_base=0), Row(slot=0, hist_len=0, cache_base=2))
    case = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=rows, seed=0)
    found = R.check_rw_disjoint(case)
    assert [f.prop for f in found] == ["determinism.rw_disjoint"] and found[0].clause == "R2"


@FIXTURE_OK
@given(data=st.data())
def test_output_inplace_pad_rows_untouched(target_under_test, gdn_verdict, data):
    """M8: in-place output is returned, pad rows keep their bytes, live rows match output=None."""
    _run_check(target_under_test, gdn_verdict, data, R.check_output_inplace, "output_inplace")


@pytest.mark.parametrize("name", sorted(R.METAMORPHIC))
def test_metamorphic(target_under_test, gdn_verdict, name, monkeypatch):
    """R1, M3, M5, M7, H8, H16, table 1.1: the transformations of gdn_fuzz.properties.relations.METAMORPHIC.
    An example the relation cannot exercise (the property records "nothing exercised": strided_pool on
    a target that refuses block-strided pools, H16, or a Case too small for the relation) checks
    nothing; the others are checked, each with one run of the property.  When no example was exercised
    the test skips with the reasons: it must not pass as if the relation had been checked."""
    target, _, device = target_under_test
    real_event, labels = properties_base.event, []
    monkeypatch.setattr(properties_base, "event", lambda label: (labels.append(label), real_event(label)))
    unexercised = f"metamorphic.{name}: nothing exercised"
    checked, skipped = [], []

    @FIXTURE_OK
    @given(data=st.data())
    def examples(data):
        case = _draw(target_under_test, data)
        seen = len(labels)
        found = R.metamorphic_check(name)(target, case, device)
        why = [x for x in labels[seen:] if x.startswith(unexercised)]
        (skipped if why else checked).append(why or case)
        gdn_verdict("metamorphic", case, found, target.name)

    examples()
    if not checked:
        pytest.skip(f"{name} not checked on {target.name} in any of {len(skipped)} examples: {skipped[0][0]}; "
                    "test_strided_pool_relation_runs_when_the_mode_is_on checks strided_pool on a target that "
                    "accepts block-strided pools")


class _Events(list):
    """Collects the labels properties.base.note would give hypothesis.event()."""

    def __call__(self, label):
        self.append(label)


def test_unexercised_relations_are_recorded(monkeypatch):
    """A Case a relation cannot exercise returns no finding AND records an event saying so: routing
    with no switchable row (P = 0 and P = 16), strided_pool on the reference (it refuses, H16), and
    the relations that need two rows or two pool slots on a one-row, one-slot Case."""
    events = _Events()
    monkeypatch.setattr(properties_base, "event", events)
    ref = get_target("reference")
    stuck = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=(Row(0, 0, 0), Row(1, 16, 3)), seed=0)
    assert R.check_routing(ref, stuck, "cpu") == []
    assert [e for e in events if e.startswith("routing: nothing exercised")], events
    one = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 5, 0),), seed=0)  # B = 1, pool = 1
    assert R.check_metamorphic(ref, one, "cpu", only=("batch_perm", "pool_relabel", "isolation")) == []
    two = dataclasses.replace(one, pool=2)  # (a one-slot pool view is contiguous whatever its stride)
    assert R.strided_pool_refusal(ref, two, "cpu") is not None
    assert R.check_metamorphic(ref, two, "cpu", only=("strided_pool",)) == []
    for rel in ("strided_pool", "batch_perm", "pool_relabel", "isolation"):
        assert any(e.startswith(f"metamorphic.{rel}: nothing exercised") for e in events), (rel, events)
    events.clear()
    ok = Case(arm="bf16", T=4, H=1, HV=1, pool=3, rows=(Row(0, 5, 0), Row(2, 13, 7)), seed=0)
    assert R.check_routing(ref, ok, "cpu") == [] and events == []


def test_relations_are_registered():
    """Each relation is a campaign property whose strategy takes the campaign's keyword args."""
    for name in ("routing", "determinism", "output_inplace", "metamorphic"):
        p = REGISTRY[name]
        assert callable(p.check) and p.clauses
        p.strategy(arms=("bf16",), Ts=(4,), geometries=((1, 2),), buckets=(4,))


def test_alternate_flush_min():
    """The switched threshold is legal and switches a row; None when no legal value can."""
    rows = (Row(0, 5, 0), Row(1, 0, 0), Row(-1, 0, 0))
    case = Case(arm="bf16", T=4, H=1, HV=1, pool=2, rows=rows, seed=0)  # fmin 13: row 0 verifies
    f2 = R.alternate_flush_min(case)
    assert 1 <= f2 <= 13 and 5 >= f2
    stuck = dataclasses.replace(case, rows=(Row(0, 0, 0), Row(1, 16, 3)))  # P=0 and P=16 never switch
    assert R.alternate_flush_min(stuck) is None


# ------------------------------------------------------------------ planted bugs

# the relation each plant breaks: (Plant, check, Finding.prop prefix that must appear)
_Y = "    y = torch.stack(ys, 1).to(q.dtype)  # [B, T, HV, V]\n"
RELATION_PLANTS = [
    (Plant("flush_y_from_rounded_fold", "M7", "routing.",
           "    fold = S.to(h0.dtype)\n",
           "    fold = S.to(h0.dtype)\n"
           "    S = torch.where(((P >= flush_min) & live)[:, None, None, None], fold.float(), S)\n",
           "flush rows run the drafts from the STATE-rounded fold, verify rows from the f32 window state"),
     R.check_routing),
    (Plant("nondeterministic_y", "R1", "determinism.y_bits", _Y,
           "    y = (torch.stack(ys, 1) + 1e-3 * torch.rand(B, Tq, HV, V, device=dev)).to(q.dtype)\n",
           "y carries run-to-run noise (a race) of 1e-3"),
     R.check_determinism),
    (Plant("pad_rows_zeroed_in_place", "M8", "output_inplace.pad_rows",
           "        output[live] = y[live]\n",
           "        output[~live] = 0\n        output[live] = y[live]\n",
           "an in-place output gets its pad rows zeroed"),
     R.check_output_inplace),
    (Plant("y_depends_on_batch_position", "R1", "metamorphic.batch_perm", _Y,
           "    y = (torch.stack(ys, 1) * (1 + 1e-2 * torch.arange(B, device=dev)[:, None, None, None]))"
           ".to(q.dtype)\n",
           "y scaled by 1 + 1e-2 * batch row"),
     R.metamorphic_check("batch_perm")),
    (Plant("k_window_by_batch_row", "M3", "metamorphic.slot_move",
           "    kw = k_cache[rows[:, None, None], ",
           "    kw = k_cache[torch.arange(B, device=dev)[:, None, None], ",
           "the window's keys read from k_cache[batch row] instead of k_cache[pool slot]"),
     R.metamorphic_check("slot_move")),
    (Plant("k_window_ignores_base", "M3", "metamorphic.rotation",
           "(hv // G)[None, :, None], slots[:, None, :]]",
           "(hv // G)[None, :, None], lanes[None, None, :]]",
           "the window's keys read at physical slot j instead of (base + j) & 31"),
     R.metamorphic_check("rotation")),
    (Plant("window_len_batch_max", "R1", "metamorphic.isolation",
           "    valid = (lanes[None, :] < P[:, None]) & live[:, None]\n",
           "    valid = (lanes[None, :] < P.max()) & live[:, None]\n",
           "every row loads as many window lanes as the longest window in the batch"),
     R.metamorphic_check("isolation")),
    (Plant("strided_q_ignores_strides", "H16", "metamorphic.strided_qkv",
           "    HK = k.shape[2]\n",
           "    HK = k.shape[2]\n"
           "    q = q if q.is_contiguous() else q.as_strided(q.shape, q.contiguous().stride())\n",
           "a non-contiguous q is read as if it were contiguous"),
     R.metamorphic_check("strided_qkv")),
    (Plant("strided_ab_read_compact", "1.1", "metamorphic.strided_ab",
           "    HK = k.shape[2]\n",
           "    HK = k.shape[2]\n"
           "    a = a if a.is_contiguous() else a.as_strided(a.shape, a.contiguous().stride())\n",
           "a non-contiguous a (gate input) is read with compact strides [B, T, HV]"),
     R.metamorphic_check("strided_ab")),
    (Plant("strided_pool_fold_lost", "H16", "metamorphic.strided_pool",
           "    if not contig:\n",
           "    if not contig:\n        h0 = h0.contiguous()\n    if False:\n",
           "strided pools accepted, but the pool is copied and the fold is written to the copy"),
     R.metamorphic_check("strided_pool")),
]
# not a bug: the strided-pool mode switched on, so the strided_pool relation really runs
STRIDED_MODE_ON = Plant("strided_mode_on", "H16", "", "    if not contig:\n", "    if False:\n",
                        "block-strided pools accepted (the SGLANG_GDN_WY_STRIDED_QKV=1 behaviour)")

FIND = settings(max_examples=300, deadline=None, database=None, phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck))


def test_plants_apply_once():
    """Every planted edit matches the reference exactly once (plant() raises otherwise)."""
    src = REFERENCE_PATH.read_text()
    for p, _ in RELATION_PLANTS:
        assert src.count(p.old) == 1, p.name
    assert src.count(STRIDED_MODE_ON.old) == 1


@pytest.mark.parametrize("p,check", RELATION_PLANTS, ids=[p.name for p, _ in RELATION_PLANTS])
def test_planted_bug_is_found(p, check, tmp_path):
    """Each planted bug is found by its relation (Finding.prop prefix) within 300 examples."""
    t = get_target(str(plant(p, tmp_path)))
    found = find(cases(), lambda c: any(f.prop.startswith(p.prop) for f in check(t, c, "cpu")), settings=FIND)
    findings = check(t, found, "cpu")
    assert any(f.prop.startswith(p.prop) for f in findings), findings


@pytest.fixture(scope="module")
def strided_mode_target(tmp_path_factory):
    return get_target(str(plant(STRIDED_MODE_ON, tmp_path_factory.mktemp("strided"))))


@given(case=cases(arms=("bf16", "bf16-state16-ring16", "fp16")))
def test_strided_pool_relation_runs_when_the_mode_is_on(strided_mode_target, case):
    """H8, H16: with strided pools accepted, block-strided pool/rings give the same bits (the launch
    is accepted, so the relation is really compared)."""
    assert R.strided_pool_refusal(strided_mode_target, case, "cpu") is None
    findings = R.metamorphic_check("strided_pool")(strided_mode_target, case, "cpu")
    assert not findings, "\n".join([case.describe()] + [str(f) for f in findings])
