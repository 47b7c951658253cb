"""The pool-scale regime (issue 18): pools of thousands of slots and past 2^31 elements.

A fill="rows" case draws only its rows' slots; the rest of the pool and rings is zero and, on the
CPU, never allocated (case.lazy_zeros).  These tests check what that rests on: the rows' values are
those of the same rows on a small pool, the other slots are zero, observe() re-draws "before" instead
of copying the pool, and check_writes still sees a write to a slot no row uses (it compares only rows
whose pages were mapped: observation.mapped_rows).  Then the planted bug: pool_offset_int32 reads the
checkpoint with 32-bit element offsets, which only a row on a slot past 2^31 / (HV V K) exposes.
Last, check_launch judges such a launch on its rows alone plus the slots no row uses
(observation.observe_rows, checks.rows_outside): it must find what the whole-pool comparison finds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from gdn_fuzz.case import Case, Row, compact, materialize, lazy_zeros
from gdn_fuzz.checks import check_launch, check_observed, check_writes, rows_outside, set_rows
from gdn_fuzz.engine.campaign import Campaign
from gdn_fuzz.observation import Observation, mapped_rows, observe, observe_rows
from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import CPU_GEOMETRIES, POOL_SCALES, cases, int32_slot, pool_scale_of
from gdn_fuzz.targets import get_target
from tests.test_draw_ahead import CASE as SMALL  # a two-row launch on a pool of 4

# H = 4, HV = 8: a slot holds 8 * 128 * 128 = 131,072 elements, so slot 16,384 is the first whose
# element offset (2^31) does not fit an int32.  A pool of 16,385 bf16 slots is 4 GiB (+1.5 GiB rings).
TOP = int32_slot(8)
INT32 = Case(arm="bf16", T=4, H=4, HV=8, pool=TOP + 1, fill="rows", seed=3,
             rows=(Row(TOP, 5, 3), Row(-1), Row(0, 16, 20), Row(-1)))


def _small(case: Case) -> Case:
    """The same rows on a pool of just their slots, in row order (what fill="rows" draws from)."""
    used = case.used_slots()
    rows = tuple(r if r.pad else dataclasses.replace(r, slot=used.index(r.slot)) for r in case.rows)
    return dataclasses.replace(case, pool=len(used), rows=rows, fill="all")


def test_int32_slot_is_the_first_offset_past_2_31():
    assert TOP == 16384 and int32_slot(64) == 2048 and int32_slot(1) == 131072
    assert TOP * 8 * 128 * 128 == 2**31 and (TOP - 1) * 8 * 128 * 128 < 2**31


def test_fill_rows_draws_the_rows_of_the_small_case_and_zeros_elsewhere():
    assert compact(INT32) == _small(INT32)  # what materialize and check_launch draw a fill="rows" case's rows from
    big, small = materialize(INT32, "cpu"), materialize(_small(INT32), "cpu")
    for name in ("initial_state_source", "k_cache", "u_cache", "g_cache"):
        for i, slot in enumerate(INT32.used_slots()):
            assert torch.equal(big[name][slot].float(), small[name][i].float()), (name, slot)
        for slot in (1, 7, TOP - 1):  # slots no row uses
            assert not big[name][slot].float().any(), (name, slot)
    for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "hist_len", "cache_base"):
        assert torch.equal(big[name], small[name]), name
    assert big["initial_state_indices"].tolist() == [TOP, -1, 0, -1]
    assert big["initial_state_source"].shape[0] == TOP + 1


def test_fill_is_stored_only_when_not_the_default():
    assert "fill" not in dataclasses.replace(INT32, fill="all").to_dict()
    assert Case.from_dict(INT32.to_dict()) == INT32
    with pytest.raises(ValueError, match=r"case.fill='sparse' is illegal; legal: one of all, rows"):
        dataclasses.replace(INT32, fill="sparse").validate()
    assert "fill=rows" in INT32.describe()


def test_alloc_bytes_bound_names_the_case():
    huge = dataclasses.replace(INT32, H=16, HV=64, pool=2**18 - 1, rows=(Row(0),))
    with pytest.raises(ValueError, match=r"allocates ~.* GiB of pool and rings; legal: <= 64 GiB"):
        huge.validate()


def test_mapped_rows_sees_written_and_read_rows_only():
    t = lazy_zeros((4096, 64, 128), torch.bfloat16, "cpu")  # 16 KiB rows: 4 pages each
    t[17] = 1.0
    _ = t[3000].sum()  # a read maps a page too
    rows = mapped_rows(t)
    if rows is None:
        pytest.skip("/proc/self/pagemap is not readable here")
    assert rows.nonzero().squeeze(1).tolist() == [17, 3000]


def test_check_writes_sees_a_write_to_a_slot_no_row_uses():
    """A fill="rows" pool is compared only where pages were mapped: a stray write maps its page."""
    before, after = materialize(INT32, "cpu"), materialize(INT32, "cpu")
    obs = Observation(case=INT32, before=before, after=after, output=None, from_case=True)
    assert check_writes(obs) == []
    after["initial_state_source"][9000, 3, 5, 7] = 1.0
    after["u_cache"][TOP - 1, 2, 30, 1] = -2.0
    found = {f.prop: f.message for f in check_writes(obs)}
    assert set(found) == {"writes.outside.initial_state_source", "writes.outside.u_cache"}
    assert "initial_state_source[9000, 3, 5, 7]" in found["writes.outside.initial_state_source"]
    assert f"u_cache[{TOP - 1}, 2, 30, 1]" in found["writes.outside.u_cache"]


def test_reference_passes_the_int32_pool():
    assert check_launch(get_target("reference"), INT32, "cpu") == []


def test_pool_offset_mutant_is_found_past_2_31_elements():
    found = check_launch(get_target("mutant:pool_offset_int32"), INT32, "cpu")
    assert any(f.prop.startswith("oracle.y") for f in found), [str(f) for f in found]


@pytest.mark.parametrize("pool, top", [(4096, 4095), (TOP + 1, TOP - 1)])
def test_pool_offset_mutant_needs_a_slot_past_2_31_elements(pool, top):
    """pool_offset_int32 gives the reference's results on a pool of thousands of slots and on the
    2^31-element pool when no row sits on a slot at or past int32_slot: its kill comes from the
    rows on the top slots of the "int32" pools."""
    case = dataclasses.replace(INT32, pool=pool, rows=(Row(top, 5, 3), Row(-1), Row(0, 16, 20), Row(-1)))
    assert check_launch(get_target("mutant:pool_offset_int32"), case, "cpu") == []


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(cases(geometries=CPU_GEOMETRIES, buckets=(4, 8), pool_scales=POOL_SCALES))
def test_pool_scale_branch_puts_the_rows_on_the_top_slots(case):
    kind = pool_scale_of(case)
    if case.fill == "all":
        assert kind == "small" and case.pool <= 8 + 6
        return
    used = case.used_slots()
    assert sorted(used) == list(range(case.pool - len(used), case.pool))  # the highest slots
    assert kind in POOL_SCALES
    if kind == "int32":
        assert case.pool - 1 >= int32_slot(case.HV) and case.pool_elements() > 2**31
    case.validate()


def test_cases_name_an_unknown_pool_scale():
    with pytest.raises(ValueError, match="pool_scales=.*'huge' is unknown"):
        find(cases(pool_scales=("huge",)), lambda c: True)


def test_campaign_finds_the_planted_int32_offset_bug():
    """The reference-target suite finds pool_offset_int32 on the CPU: a campaign of the launch property
    with the pool-scale kinds cmd_run gives a CPU device (strategies.pool_scales_for), 60 examples."""
    c = Campaign(target=get_target("mutant:pool_offset_int32"), device="cpu", properties=[get_property("launch")],
                 arms=("bf16",), Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=(4, 8), seed=0,
                 round_examples=60, shrink=False, stop_on_finding=True, pool_scales=POOL_SCALES)
    c.run(examples=60)
    assert any(sig.startswith("oracle.") for sig in c.findings), list(c.findings)


# Qwen3-Next (H = 16, HV = 64): a slot holds 2^20 elements, so slot 2,048 is the first past 2^31.  Pool of
# 2,050 slots: 4.3 GB of bf16 state + 1.3 GB of rings.  Row 0 flushes on slot 2,049 with a window that
# wraps; row 2 verifies on slot 2,048 (offset exactly 2^31); row 3 flushes a full window on slot 0.
QWEN3_NEXT = Case(arm="bf16", T=4, H=16, HV=64, pool=int32_slot(64) + 2, fill="rows", seed=11,
                  rows=(Row(2049, 13, 25), Row(-1), Row(2048, 5, 3), Row(0, 16, 20)))


def test_qwen3_next_pool_past_2_31_elements(target_under_test, gdn_verdict):
    """The launch property on a pool past 2^31 elements in the Qwen3-Next geometry, every selected arm:
    the production kernel on a GPU (issue 18), the reference on the CPU.  The contract puts no bound
    on the pool size (D4: the pool is a dynamic dimension)."""
    target, arms, device = target_under_test
    for arm in arms:
        case = dataclasses.replace(QWEN3_NEXT, arm=arm)
        _skip_unless_it_fits(case, device)
        gdn_verdict("launch", case, check_launch(target, case, device), target.name)


def _skip_unless_it_fits(case: Case, device: str) -> None:
    """On a CUDA device, skip (saying how much is needed and free) unless ~3 copies of the case's pool and rings fit."""
    if torch.device(device).type == "cuda":
        free, need = torch.cuda.mem_get_info(torch.device(device))[0], 3 * case.alloc_bytes()
        if need > free:
            pytest.skip(f"a pool past 2^31 elements needs ~{need / 2**30:.1f} GiB on {device}; "
                        f"{free / 2**30:.1f} GiB is free")


def test_a_pool_past_2_31_elements_is_not_kept_reserved_after_its_check(target_under_test):
    """After a fill="rows" launch past EMPTY_CACHE_BYTES, the CUDA caching allocator keeps none of its 5.6 GB
    reserved (checks.release_cache), so processes that share a GPU do not each hold one: since 088c0d9 the cache was
    emptied while the launch's tensors were still referenced, and 8 processes on an 80 GB H100 ran out of memory
    (run 91).  Not run on a GPU yet (written after run 92, with no device time left in that session)."""
    from gdn_fuzz.checks import EMPTY_CACHE_BYTES
    target, arms, device = target_under_test
    if torch.device(device).type != "cuda":
        pytest.skip("the caching allocator's reserve is a CUDA one: on the CPU the pool's pages are mapped lazily "
                    "(test_the_cache_is_released_after_the_launchs_tensors_are_gone holds the order on the CPU)")
    case = dataclasses.replace(QWEN3_NEXT, arm=arms[0])
    _skip_unless_it_fits(case, device)
    assert case.alloc_bytes() > EMPTY_CACHE_BYTES
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # else blocks an earlier test left reserved could hold this launch and hide a leak
    held = torch.cuda.memory_reserved(device)
    check_launch(target, case, device)
    # what may stay: the compact launch's few slots and its verdict graph, far under one pool-scale launch
    assert torch.cuda.memory_reserved(device) - held < EMPTY_CACHE_BYTES


# check_launch judges a fill="rows" launch on its rows alone (observation.observe_rows: "before" is the compact case's
# materialize, the launch's rows are gathered) plus checks.rows_outside for the slots no row uses.  It must give what
# the whole-pool comparison gives (observe() + check_observed: "before" drawn again, every slot compared), whatever
# the kernel wrote where.

class _Stray:
    """The reference target, then one stray write into the launch's tensors (None: none)."""

    def __init__(self, write):
        self.inner, self.write, self.name = get_target("reference"), write, "reference+stray"

    def launch(self, arm, **kw):
        out = self.inner.launch(arm, **kw)
        if self.write is not None:
            name, where, value = self.write
            kw[name][where] = value
        return out


@st.composite
def rows_launches(draw):
    """A fill="rows" case (a drawn small case's rows on drawn slots of a pool of up to 300) and one stray write:
    into a pool buffer at a slot a row uses or not, into the slot indices, a cursor or a read-only input."""
    small = draw(cases(geometries=CPU_GEOMETRIES, buckets=(4, 8), restart=(False, True)))
    pool = draw(st.integers(small.pool + 1, 300))
    slots = draw(st.lists(st.integers(0, pool - 1), min_size=small.pool, max_size=small.pool, unique=True))
    rows = tuple(r if r.pad else dataclasses.replace(r, slot=slots[r.slot]) for r in small.rows)
    case = dataclasses.replace(small, pool=pool, rows=rows, fill="rows")
    kind = draw(st.sampled_from(["initial_state_source", "k_cache", "u_cache", "g_cache", "initial_state_indices",
                                 "hist_len", "q", None]))
    if kind is None:
        return case, None
    shape = {"initial_state_source": (pool, case.HV, case.V, case.K), "k_cache": (pool, case.H, 32, case.K),
             "u_cache": (pool, case.HV, 32, case.V), "g_cache": (pool, case.HV, 32),
             "initial_state_indices": (case.B,), "hist_len": (case.B,), "q": (case.B, case.T, case.H, case.K)}[kind]
    used = case.used_slots()
    first = draw(st.sampled_from(used) | st.integers(0, pool - 1)) if kind.endswith(("source", "cache")) \
        else draw(st.integers(0, shape[0] - 1))
    where = (first, *(draw(st.integers(0, n - 1)) for n in shape[1:]))
    value = draw(st.sampled_from([7, 1]) if kind in ("initial_state_indices", "hist_len")
                 else st.sampled_from([1.0, -0.0, float("nan"), 0.0]))
    return case, (kind, where, value)


def _seen(found) -> tuple:
    return sorted((f.prop, f.message, f.outcome) for f in found), repr(found.metrics)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@settings(max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(launch=rows_launches())
def test_rows_check_is_the_whole_pool_check(device, launch):
    """On CUDA the rows' verdict replays the small shape's CUDA graph (gdn_fuzz.graphs) and the slots no row uses
    are read in 8-byte words; on the CPU only the rows whose pages were mapped are read."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the CUDA half needs a CUDA device (the CPU half runs the same launches)")
    case, write = launch
    target = _Stray(write)
    assert _seen(check_launch(target, case, device)) == _seen(check_observed(observe(target, case, device)))
    if write is None:  # a clean launch raises no flag (else every check would take the evidence's slow path)
        assert not rows_outside(observe_rows(target, case, device)).any()


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.sampled_from([torch.bfloat16, torch.float32, torch.int32, torch.uint8]),
       st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_set_rows_is_any_set_bit_per_row(dtype, shape, data):
    t = torch.zeros(shape, dtype=dtype)
    flat = t.view(-1)
    for i in data.draw(st.lists(st.integers(0, flat.numel() - 1), max_size=3)):
        flat[i] = -0.0 if dtype.is_floating_point and data.draw(st.booleans()) else 3
    sliced = data.draw(st.booleans()) and shape[-1] > 1
    if sliced:  # not contiguous: compared element by element
        t = t[..., 1:]
    want = [bool((row.contiguous().view(-1).view(torch.uint8) != 0).any()) for row in t]
    assert set_rows(t).tolist() == want


# checks.release_cache (torch.cuda.empty_cache after a big fill="rows" case) hands back only the blocks no tensor uses,
# so begin_launch's finish must drop the launch's tensors before it calls it.  It held them (its closures keep the
# observation) from 088c0d9 to this test's commit: every 8-process run of the product command on an 80 GB H100
# (run 91) lost workers to out-of-memory at 4096-slot pools of HV = 64.
@pytest.mark.parametrize("case", [SMALL, dataclasses.replace(SMALL, pool=40, rows=(Row(33, 3, 5), Row(-1, 0, 0)),
                                                             fill="rows")], ids=["all", "rows"])
def test_the_cache_is_released_after_the_launchs_tensors_are_gone(monkeypatch, case):
    import weakref

    from gdn_fuzz import checks
    refs, alive = [], []

    def spy(real, tensors):
        def f(*a, **kw):
            got = real(*a, **kw)
            refs.extend(weakref.ref(t) for t in tensors(got).values() if isinstance(t, torch.Tensor))
            return got
        return f

    monkeypatch.setattr(checks, "observe", spy(checks.observe, lambda obs: obs.after))
    monkeypatch.setattr(checks, "observe_rows", spy(checks.observe_rows, lambda rl: rl.launched))
    monkeypatch.setattr(checks, "release_cache", lambda c, d: alive.append(sum(r() is not None for r in refs)))
    finish = checks.begin_launch(get_target("reference"), case, "cpu")
    assert refs and alive == []  # the launch's tensors, alive until the verdict is read
    assert finish() == []
    assert alive == [0]
    with pytest.raises(RuntimeError, match="already read"):
        finish()
