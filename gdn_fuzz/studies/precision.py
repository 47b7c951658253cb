"""Precision search: steer generation toward the largest error against the float64 oracle.

For each (arm, T), one Hypothesis run whose examples call `hypothesis.target()` with each
output's worst per-(row, head) error (relative to the magnitude of its terms, the metric
the tolerance table bounds).  Hypothesis' targeted phase then mutates the structure and
the value regime toward larger errors.  The result records, per target, arm, T and output,
the largest error seen, how close it came to the tolerance (ratio) and the Case that
produced it: this is the evidence behind gdn_fuzz.compare.

It also measures the rounding pattern of stored records (rounding_pattern): on arms whose
RING (u records) or STATE (folds) is fp16 under bf16 IO, the share of normal fp16 values whose
low 3 mantissa bits are zero.  A value rounded once from f32 has them zero about 1/8 of the
time in generic cases; a value rounded through bf16 first always does.  This is a measurement,
not a verdict: no single value can show a violation of N3 (U = R exactly, a bf16 value, when
the triangular solve has nothing to subtract; any bf16 value is a legal rounding of some f32),
so it was taken out of the properties (issue 14: it raised false alarms on correct code).

What an example inspects: the oracle errors of y, u, k and g (every example has a live row),
the fold's error only when a row flushes, and the rounding pattern only on the arms that have
an fp16 rounding point under bf16 IO (u: fp16 RING; fold: fp16 STATE and a flush row).  The
search draws with precision_cases (one flush row in every Case), so the fold is measured in
every example; an example that inspects nothing of the rounding pattern or of the fold records
a Hypothesis event saying why (the arm has no such rounding point: bf16 and fp16).
"""

from __future__ import annotations

import math
import time

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, target as htarget

import torch

from gdn_fuzz.arms import get_arm
from gdn_fuzz.checks import oracle_metrics
from gdn_fuzz.observation import observe
from gdn_fuzz.compare import table_for
from gdn_fuzz.properties.base import launch_cases, not_exercised
from gdn_fuzz.properties.relations import append_slots


def _low3_zero(x: torch.Tensor) -> tuple[int, int]:
    """(values whose low 3 mantissa bits are zero, normal values) of an fp16 tensor."""
    x = x.reshape(-1)
    normal = torch.isfinite(x) & (x.abs() >= 2.0**-14)
    low = (x.view(torch.int16) & 7) == 0
    return int((low & normal).sum()), int(normal.sum())


def rounding_pattern(obs) -> dict:
    """{"u": (zero-low-3, normal), "fold": (...)} of the appended u records (fp16 RING under bf16
    IO) and the folded checkpoints (fp16 STATE under bf16 IO) of one launch; absent keys: the
    arm has no such rounding point."""
    arm = get_arm(obs.case.arm)
    out = {}
    if arm.io != torch.bfloat16:
        return out
    idx = obs.before["initial_state_indices"].long()
    live = idx >= 0
    if arm.ring == torch.float16 and bool(live.any()):
        sl = append_slots(obs.before, obs.case.T)[live]
        u = obs.after["u_cache"].permute(0, 2, 1, 3)[idx[live][:, None].expand_as(sl), sl]
        out["u"] = _low3_zero(u)
    flush = live & (obs.before["hist_len"].long() >= obs.case.fmin)
    if arm.state == torch.float16 and bool(flush.any()):
        out["fold"] = _low3_zero(obs.after["initial_state_source"][idx[flush]])
    return out


def precision_cases(**kw):
    """The search's strategy: legal launches without poison, with at least one flush row (the fold
    and its rounding pattern need one)."""
    return launch_cases(poison=False, need="flush", **kw)


def _inspected_nothing(obs, pattern: dict) -> None:
    """Hypothesis events for what this example could not inspect (and why)."""
    arm = get_arm(obs.case.arm)
    if not pattern:
        why = ("the arm has no fp16 RING or STATE under bf16 IO" if arm.io != torch.bfloat16 or
               (arm.ring != torch.float16 and arm.state != torch.float16) else "fp16 STATE only and no flush row")
        not_exercised("precision.rounding", why)
    idx = obs.before["initial_state_indices"].long()
    if not bool(((idx >= 0) & (obs.before["hist_len"].long() >= obs.case.fmin)).any()):
        not_exercised("precision.fold", "no flush row")


def search(targets, device: str, arms, Ts, geometries, buckets, examples: int, seed: int = 0,
           steer: bool = True, on_example=lambda: None) -> dict:
    """Returns {target: {arm: {T: {output: {max_rel, max_ratio, rtol, case, n}}}}}."""
    res: dict = {str(t): {} for t in targets}
    for arm in arms:
        for T in Ts:
            cells = {str(t): {} for t in targets}
            strat = precision_cases(arms=(arm,), Ts=(T,), geometries=geometries, buckets=buckets)
            phases = (Phase.generate, Phase.target) if steer else (Phase.generate,)

            @hseed(seed)
            @settings(max_examples=examples, deadline=None, database=None, phases=phases,
                      suppress_health_check=list(HealthCheck))
            @given(strat)
            def body(case):
                on_example()
                for i, t in enumerate(targets):
                    obs = observe(t, case, device)
                    if obs.error is not None:
                        raise obs.error
                    rp = cells[str(t)].setdefault("rounding", {})
                    pattern = rounding_pattern(obs)
                    if i == 0:
                        _inspected_nothing(obs, pattern)
                    for name, (zero, n) in pattern.items():
                        z0, n0 = rp.get(name, (0, 0))
                        rp[name] = (z0 + zero, n0 + n)
                    for name, m in oracle_metrics(obs).items():
                        if not bool(m.live.any()):
                            continue
                        r, h, ratio, rel = m.worst()
                        c = cells[str(t)].setdefault(name, dict(max_rel=0.0, max_ratio=0.0, n=0, case=None,
                                                                rtol=table_for(arm)[name].rtol))
                        c["n"] += 1
                        if rel > c["max_rel"] or not math.isfinite(rel):
                            c.update(max_rel=rel, max_ratio=ratio, case=case.to_dict(), row=r, head=h)
                        if i == 0 and math.isfinite(rel) and rel > 0:
                            htarget(math.log10(rel), label=name)  # steer by the first target

            t0 = time.monotonic()
            body()
            for t in targets:
                res[str(t)].setdefault(arm, {})[T] = cells[str(t)]
                cells[str(t)]["_seconds"] = time.monotonic() - t0
    return res


def markdown(res: dict, outputs=("y", "u", "k", "g", "fold")) -> str:
    """Table: per target, arm and T, the largest error / magnitude and its ratio to the tolerance."""
    lines = ["| target | arm | T | " + " | ".join(f"{o} (ratio)" for o in outputs) + " |",
             "|---|---|---|" + "---|" * len(outputs)]
    for tname, per_arm in res.items():
        for arm, per_T in per_arm.items():
            for T, cells in per_T.items():
                vals = [f"{cells[o]['max_rel']:.2e} ({cells[o]['max_ratio']:.2f})" if o in cells else "-"
                        for o in outputs]
                lines.append(f"| {tname} | {arm} | {T} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"
