"""Precision search: steer generation toward the largest error against the float64 oracle.

For each (arm, T), one Hypothesis run whose examples call `hypothesis.target()` with each
output's worst per-(row, head) error (relative to the magnitude of its terms, the metric
the tolerance table bounds).  Hypothesis' targeted phase then mutates the structure and
the value regime toward larger errors.  The result records, per target, arm, T and output,
the largest error seen, how close it came to the tolerance (ratio) and the Case that
produced it: this is the evidence behind gdn_fuzz.tolerances.
"""

from __future__ import annotations

import math
import time

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, target as htarget

from .checks import observe, oracle_metrics
from .tolerances import table_for


def search(targets, device: str, arms, Ts, geometries, buckets, examples: int, seed: int = 0,
           steer: bool = True, on_example=lambda: None) -> dict:
    """Returns {target: {arm: {T: {output: {max_rel, max_ratio, rtol, case, n}}}}}."""
    from .strategies import cases

    res: dict = {str(t): {} for t in targets}
    for arm in arms:
        for T in Ts:
            cells = {str(t): {} for t in targets}
            strat = cases(arms=(arm,), Ts=(T,), geometries=geometries, buckets=buckets, poison=False)
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
