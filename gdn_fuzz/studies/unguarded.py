"""Known unguarded inputs: contract gaps the kernel does not check, with their consequence measured.

Each scenario starts from a legal Case, breaks one thing the wrapper does not validate
(contract 1.3, N2, N5, R3), launches the target, and measures what happened instead of
hiding it: did it raise, are the outputs finite, how far is y from the legal reference
point, did it write outside the legal write set, is it deterministic.  These are reports,
not pass/fail properties: the contract says the behaviour is undefined, and the numbers
tell a serving engineer how bad a violated invariant is.

Scenarios that can crash a process (an index past the pool) run in a worker process.
"""

from __future__ import annotations

import dataclasses

import torch

from gdn_fuzz.case import Case, Regime, Row, materialize
from gdn_fuzz.checks import expectation
from gdn_fuzz.observation import clone_inputs, observe, same_bits
from gdn_fuzz.prefix_case import PrefixCase, Request, materialize_prefix
from gdn_fuzz.compare import relative
from gdn_fuzz.targets import Target


def _base_case(arm: str, T: int, H: int, HV: int) -> Case:
    return Case(arm=arm, T=T, H=H, HV=HV, pool=4, rows=(Row(0, 10, 5), Row(1, 3, 30), Row(2, 0, 0), Row(-1)),
                seed=11, regime=Regime())


def _y_rel(out, want, rows):
    """||y - y_oracle||_F / ||y_oracle||_F over the given rows (gdn_fuzz.compare.relative)."""
    return float(relative(out[rows], want[rows], tuple(range(want[rows].dim()))))


def _outside_writes(before, after, keep_slots):
    """Elements of the rings changed outside the given {(slot_row, ring_slot)} set."""
    n = 0
    for name in ("k_cache", "u_cache", "g_cache"):
        ch = ~same_bits(before[name], after[name])
        while ch.dim() > 3:
            ch = ch.any(-1)
        ch = ch.any(1)  # [pool, 32]
        for r, s in keep_slots:
            ch[r, s] = False
        n += int(ch.sum())
    return n


def scenario_hist_len_above_16(target: Target, arm, T, H, HV, device) -> dict:
    """1.3: hist_len in 17..32-T with restart_hist_on_flush=False is not checked."""
    case = dataclasses.replace(_base_case(arm, T, H, HV), rows=(Row(0, 16, 5), Row(1, 3, 30), Row(-1), Row(-1)))
    legal = observe(target, case, device)
    e = expectation(legal)
    inputs = materialize(case, device)
    P = 32 - T if T == 4 else 20
    inputs["hist_len"][0] = P
    obs = observe(target, case, device, inputs=inputs)
    if obs.error is not None:
        return dict(raised=f"{type(obs.error).__name__}: {obs.error}")
    rel = _y_rel(obs.output, e.y, [0])
    return dict(raised=None, hist_len=P, finite=bool(torch.isfinite(obs.output[0]).all()),
                y_rel_change_vs_P16=rel,
                note="no error; y differs from the 16-row window's y by the relative amount shown")


def scenario_appends_wrap(target: Target, arm, T, H, HV, device) -> dict:
    """R3: hist_len >= 33 - T wraps the appends into the live window (write-after-read race)."""
    case = dataclasses.replace(_base_case(arm, T, H, HV), rows=(Row(0, 16, 0), Row(-1), Row(-1), Row(-1)))
    inputs = materialize(case, device)
    P = 33 - T
    inputs["hist_len"][0] = P
    before = clone_inputs(inputs)
    obs = observe(target, case, device, inputs=inputs)
    if obs.error is not None:
        return dict(raised=f"{type(obs.error).__name__}: {obs.error}")
    window = set(range(16))
    appends = {(P + s) & 31 for s in range(T)}
    clobbered = sorted(window & appends)
    changed = [s for s in clobbered if not bool(same_bits(before["u_cache"][0, :, s], obs.after["u_cache"][0, :, s]).all())]
    return dict(raised=None, hist_len=P, window_slots_overwritten=changed)


def scenario_duplicate_slots(target: Target, arm, T, H, HV, device, repeats: int = 5) -> dict:
    """R3: two rows with the same slot race on appends (and on the fold when both flush)."""
    P = 17 - T  # both rows at the lazy flush threshold: both fold into one pool row
    case = dataclasses.replace(_base_case(arm, T, H, HV), rows=(Row(0, P, 2), Row(0, P, 2), Row(-1), Row(-1)))
    outs = []
    for _ in range(repeats):
        obs = observe(target, case, device)
        if obs.error is not None:
            return dict(raised=f"{type(obs.error).__name__}: {obs.error}")
        outs.append((obs.after["u_cache"].clone(), obs.after["initial_state_source"].clone()))
    det = all(bool(same_bits(outs[0][0], o[0]).all() and same_bits(outs[0][1], o[1]).all()) for o in outs[1:])
    return dict(raised=None, deterministic_over_repeats=det, repeats=repeats)


def scenario_gate_overflow(target: Target, arm, T, H, HV, device) -> dict:
    """N2: a + dt_bias >~ 88.7 gives g = -inf (no softplus threshold): NaN decay differences."""
    case = dataclasses.replace(_base_case(arm, T, H, HV), rows=(Row(0, 5, 0), Row(-1), Row(-1), Row(-1)))
    inputs = materialize(case, device)
    inputs["a"][0, 1, 0] = 100.0
    obs = observe(target, case, device, inputs=inputs)
    if obs.error is not None:
        return dict(raised=f"{type(obs.error).__name__}: {obs.error}")
    return dict(raised=None, y_nonfinite=int((~torch.isfinite(obs.output[0])).sum()),
                g_nonfinite=int((~torch.isfinite(obs.after["g_cache"][0])).sum()),
                note="the float64 oracle stays finite (g = -100 e^{A_log})")


def scenario_stale_A_log(target: Target, arm, T, H, HV, device) -> dict:
    """N5: an fp32 A_log is cast once and cached by id(); mutating it in place goes unseen."""
    case = dataclasses.replace(_base_case(arm, T, H, HV), rows=(Row(0, 0, 0), Row(-1), Row(-1), Row(-1)))
    inputs = materialize(case, device)
    A32 = inputs["A_log"].float().clone()
    first = dict(inputs, A_log=A32)
    obs1 = observe(target, case, device, inputs=dict(first))
    A32.add_(1.0)  # in place: same object, new values
    inputs2 = materialize(case, device)
    inputs2["A_log"] = A32
    obs2 = observe(target, case, device, inputs=inputs2)
    if obs1.error is not None or obs2.error is not None:
        return dict(raised=str(obs1.error or obs2.error))
    stale = bool(same_bits(obs1.output[0], obs2.output[0]).all())
    return dict(raised=None, second_call_used_stale_A_log=stale)


SCENARIOS = {
    "hist_len>16 (restart=False)": scenario_hist_len_above_16,
    "hist_len>=33-T appends wrap": scenario_appends_wrap,
    "duplicate slot indices": scenario_duplicate_slots,
    "a+dt_bias overflow (N2)": scenario_gate_overflow,
    "in-place A_log mutation (N5)": scenario_stale_A_log,
}


def run_all(target: Target, arms, Ts, device, H: int = 1, HV: int = 2) -> list[dict]:
    rows = []
    for arm in arms:
        for T in Ts:
            for name, fn in SCENARIOS.items():
                try:
                    res = fn(target, arm, T, H, HV, device)
                except Exception as e:  # noqa: BLE001 - a crash of the harness is a result too
                    res = dict(harness_error=f"{type(e).__name__}: {e}")
                rows.append(dict(scenario=name, arm=arm, T=T, clause=fn.__doc__.split(":")[0], **res))
    return rows


# ------------------------------------------------------------------ the prefix materializer (issue 31)
#
# gdn_prefix_materialize validates shapes, dtypes and layout (PMH1-PMH19) but not the slot numbers: a dst past
# the pool, two requests with one dst (PMR2), dst == src (PMR1), one request's dst another's src (PMR3).  Each
# scenario takes a legal PrefixCase (two fold requests on their own sources and destinations), breaks one such
# thing and reports what the target did: raised, wrote where, with which bits, deterministically or not.  The
# reference point of every comparison is the target's OWN result for the legal call (bits), so a report says
# "the same bits as the legal call" or counts 16-byte chunks (the kernel's store unit, PMW1: 8 elements).
# They run in an isolated worker (gdn_fuzz.engine.isolation.Worker.measure): a dst far past the pool is an
# illegal address on a GPU, which kills the worker's CUDA context; the report says so and the next scenario
# gets a fresh worker.

PM_GUARD_SLOTS = 2  # pool slots of guard memory after the pool: where a dst just past the pool writes
PM_FAR = 1 << 30  # a dst far past any allocation
CHUNK = 8  # elements of a 16-byte store (bf16 / fp16 states)


def pm_base_case(arm: str, ring: int = 32, H: int = 1, HV: int = 2):
    """Two fold requests: slot 0 -> 2 (count 5 of 7, window from 3) and slot 1 -> 3 (count 9 of 9, window from
    ring - 4: it wraps); slots 4 and 5 untouched."""
    return PrefixCase(arm=arm, H=H, HV=HV, pool=6, ring=ring,
                      requests=(Request(0, 2, 3, 5, 7), Request(1, 3, ring - 4, 9, 9)), seed=23)


def _run(target: Target, case, device, dst: dict | None = None, inputs: dict | None = None):
    """One call of the materializer on case's tensors (or `inputs`), with request i's dst set to dst[i]: (the state
    tensor after it, the exception text or None).  Synchronizes, so that a device fault surfaces here."""
    from gdn_fuzz.properties.materialize import call

    inputs = materialize_prefix(case, device) if inputs is None else inputs
    for i, d in (dst or {}).items():
        inputs["dst_slots"][i] = d
    _, exc = call(target, case, inputs)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return inputs["state"], (None if exc is None else f"{type(exc).__name__}: {exc}")


def _chunks(got: torch.Tensor, *cands: torch.Tensor) -> dict:
    """Of the 16-byte chunks of `got` (one state slot [HV, V, K]): how many equal each candidate's bits, and how
    many none of them (a chunk equal to several counts for the first)."""
    g = got.contiguous().view(torch.int16).reshape(-1, CHUNK)
    left = torch.ones(g.shape[0], dtype=torch.bool, device=g.device)
    out = {}
    for i, c in enumerate(cands):
        eq = (g == c.contiguous().view(torch.int16).reshape(-1, CHUNK)).all(1) & left
        out[f"chunks_from_{'AB'[i]}"] = int(eq.sum())
        left &= ~eq
    out["chunks_from_neither"] = int(left.sum())
    return out


def pm_scenario_dst_past_pool(target: Target, case, device) -> dict:
    """PMH*: dst = pool (one past the last slot) is not checked.  The pool is the head of a larger buffer, so a
    write past it lands in guard slots this study owns."""
    want, err = _run(target, case, device)
    if err:
        return dict(legal_call_raised=err)
    inputs = materialize_prefix(case, device)
    st = inputs["state"]
    big = torch.zeros((st.shape[0] + PM_GUARD_SLOTS, *st.shape[1:]), dtype=st.dtype, device=st.device)
    big[: st.shape[0]] = st
    inputs["state"] = big[: st.shape[0]]  # contiguous, 16-byte aligned: every layout check passes
    before = big.clone()
    _, err = _run(target, case, device, {0: case.pool}, inputs)
    if err:
        return dict(raised=err)
    guard = big[case.pool:]
    changed = [i for i in range(PM_GUARD_SLOTS) if not bool(same_bits(guard[i], before[case.pool + i]).all())]
    pool_changed = sorted(s for s in range(case.pool) if s != case.requests[1].dst
                          and not bool(same_bits(big[s], before[s]).all()))
    return dict(raised=None, guard_slots_written=changed,
                guard_slot_0_is_the_legal_result=bool(same_bits(guard[0], want[case.requests[0].dst]).all()),
                other_pool_slots_changed=pool_changed,
                note="no error: the state was written into the memory right after the pool")


def pm_scenario_dst_far_past_pool(target: Target, case, device) -> dict:
    """PMH*: dst = 2^30, far past every allocation: on a GPU an illegal address (the worker reports it)."""
    _, err = _run(target, case, device, {0: PM_FAR})  # a fault surfaces in _run, in the worker, which dies with it
    return dict(raised=err) if err else dict(raised=None, note="no error and no fault reported")


def pm_scenario_duplicate_dst(target: Target, case, device, repeats: int = 5) -> dict:
    """PMR2: two live requests with one dst store 16-byte chunks in no set order.  Request 1 is sent to request
    0's dst; the result's chunks are compared with each request's legal result (A: request 0's, B: request 1's),
    over `repeats` launches."""
    want, err = _run(target, case, device)
    if err:
        return dict(legal_call_raised=err)
    d0, d1 = case.requests[0].dst, case.requests[1].dst
    runs = []
    for _ in range(repeats):
        got, err = _run(target, case, device, {1: d0})
        if err:
            return dict(raised=err)
        runs.append(_chunks(got[d0], want[d0], want[d1]))
    same = all(r == runs[0] for r in runs)
    return dict(raised=None, chunks=runs[0] if same else runs, same_chunks_every_run=same, repeats=repeats,
                chunks_per_slot=want[d0].numel() // CHUNK)


def pm_scenario_duplicate_identical(target: Target, case, device) -> dict:
    """PMR2: two identical requests (same src, window, count and dst) compute identical bits: the one case of a
    shared dst the contract defines.  Reports whether dst holds the legal result's bits."""
    want, err = _run(target, case, device)
    if err:
        return dict(legal_call_raised=err)
    twin = dataclasses.replace(case, requests=(case.requests[0], case.requests[0], case.requests[1]))
    got, err = _run(target, twin, device)
    if err:
        return dict(raised=err)
    d0 = case.requests[0].dst
    return dict(raised=None, dst_is_the_legal_result=bool(same_bits(got[d0], want[d0]).all()))


def pm_scenario_dst_is_src(target: Target, case, device) -> dict:
    """PMR1: dst == src within one request (in place).  Each K half is loaded before its own store (src), so the
    result should be the out-of-place one; not promised (the docstring says "a separate pool slot")."""
    want, err = _run(target, case, device)
    if err:
        return dict(legal_call_raised=err)
    s0, d0 = case.requests[0].src, case.requests[0].dst
    got, err = _run(target, case, device, {0: s0})
    if err:
        return dict(raised=err)
    return dict(raised=None, in_place_is_the_out_of_place_result=bool(same_bits(got[s0], want[d0]).all()),
                **_chunks(got[s0], want[d0]))


def pm_scenario_dst_is_other_src(target: Target, case, device, repeats: int = 5) -> dict:
    """PMR3: request 0 writes request 1's source while request 1 reads it: a read/write race.  Reports request 1's
    result against its legal one (read before the write) over `repeats` launches."""
    want, err = _run(target, case, device)
    if err:
        return dict(legal_call_raised=err)
    s1, d1 = case.requests[1].src, case.requests[1].dst
    legal1, races = 0, []
    for _ in range(repeats):
        got, err = _run(target, case, device, {0: s1})
        if err:
            return dict(raised=err)
        ok = bool(same_bits(got[d1], want[d1]).all())
        legal1 += ok
        if not ok:
            races.append(_chunks(got[d1], want[d1]))
    return dict(raised=None, runs_with_request_1_legal=legal1, repeats=repeats, other_runs=races[:2])


PM_SCENARIOS = {
    "dst past the pool": pm_scenario_dst_past_pool,
    "dst far past the pool": pm_scenario_dst_far_past_pool,
    "duplicate dst (different requests)": pm_scenario_duplicate_dst,
    "duplicate dst (identical requests)": pm_scenario_duplicate_identical,
    "dst == src": pm_scenario_dst_is_src,
    "dst == another request's src": pm_scenario_dst_is_other_src,
}
PM_CLAUSES = {"dst past the pool": "PMH*", "dst far past the pool": "PMH*", "duplicate dst (different requests)": "PMR2",
              "duplicate dst (identical requests)": "PMR2", "dst == src": "PMR1",
              "dst == another request's src": "PMR3"}


def run_materializer(target_name: str, arms, device, rings=(32,), timeout_s: float = 300.0) -> list[dict]:
    """Every PM scenario per arm and ring depth, each in an isolated worker (a crash or a fatal CUDA error ends
    that worker and is the scenario's result; the next one gets a fresh worker)."""
    from gdn_fuzz.engine.isolation import Worker

    rows = []
    with Worker(target_name, device, timeout_s=timeout_s) as w:
        for arm in arms:
            for R in rings:
                case = pm_base_case(arm, R)
                for name in PM_SCENARIOS:
                    got = w.measure(PM_SCENARIOS[name], case)
                    row = dict(scenario=name, arm=arm, T=f"R={R}", clause=PM_CLAUSES[name])
                    if got.metrics is not None:
                        row.update(got.metrics)
                    else:  # the worker died, hung or the scenario raised: its own words
                        row.update(worker=[f"{f.outcome}: {f.message}" for f in got],
                                   survived_by_the_fuzzer=True)
                    rows.append(row)
    return rows
