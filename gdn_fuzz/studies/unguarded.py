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
