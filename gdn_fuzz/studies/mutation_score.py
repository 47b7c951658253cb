"""Mutation score: how many catalogued bugs (gdn_fuzz.targets.mutants) the suite kills, and how fast.

How this module tests
---------------------
A mutant is the reference target with one small realistic bug (gdn_fuzz.targets.mutants).  For each
mutant, `run_mutants` runs

(a) the suite: a gdn_fuzz Campaign of every property of gdn_fuzz.properties against `mutant:NAME`, on the CPU reference geometries,
    all five dtype arms, T in {4, 8}, the target's batch buckets (strategies.buckets_for), no corpus, in this process
    (isolate=False), until the first finding or the per-mutant budget.  The mutant is
    *killed* when any property reports a finding; it records the time to the first failing
    example (detection), the time until Hypothesis has shrunk it (the campaign records it),
    and the size of the shrunk Case (non-pad rows, length of its JSON).  Mutants whose
    expected property is "crash" kill the process they run in, so they run with
    isolate=True, i.e. in a worker process.
(b) the example-based baseline (gdn_fuzz.studies.baseline): a few fixed cases per arm against an
    fp32 sequential reference with FlashInfer's absolute tolerances.  Killed when any of its
    checks fails or a launch raises.

Timings depend on the machine and its load; the CLI prints them as measured.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

from gdn_fuzz import properties as _P
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.engine.campaign import Campaign
from gdn_fuzz.targets import get_target
from gdn_fuzz.targets.mutants import CATALOGUE, get_mutant
from gdn_fuzz.strategies import buckets_for, geometries_for
from gdn_fuzz.studies.baseline import run_baseline


# ------------------------------------------------------------------ run_mutants


class _Killed(Exception):
    pass


def _timed_campaign(**kw):
    """A Campaign that notes when the first check failed (before Hypothesis shrinks it)."""

    class TimedCampaign(Campaign):
        first_fail = None

        def _check(self, prop, case):
            found = super()._check(prop, case)
            if found and self.first_fail is None:
                self.first_fail = self.stats.elapsed
            return found

    return TimedCampaign(**kw)


def reference_mutants() -> list[str]:
    return [n for n, m in CATALOGUE.items() if m.base == "reference" and m.scored]


def production_mutants() -> list[str]:
    """Edits of the released kernel file (GPU only: the launches JIT-compile for SM90)."""
    return [n for n, m in CATALOGUE.items() if m.base == "production"]


def mutants_of(base: str) -> list[str]:
    """The scored mutants of one base ("reference", "production", "materialize", "materialize-reference")."""
    return [n for n, m in CATALOGUE.items() if m.base == base and m.scored]


def _baseline_isolated(name: str, arms, device: str = "cpu") -> dict:
    """The baseline in a child process (for mutants that kill their process), on `device`."""
    code = ("import json, sys\nfrom gdn_fuzz.studies.baseline import run_baseline\nfrom gdn_fuzz.targets import get_target\n"
            f"r = run_baseline(get_target('mutant:{name}'), arms={tuple(arms)!r}, device={str(device)!r})\n"
            "print(json.dumps(dict(killed=r.killed, failures=r.failures[:5])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [""])[-1]
        return dict(killed=True, failures=[f"the baseline's process died (exit {p.returncode}): {last}"])
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_mutants(names=None, budget_s: float = 60.0, seed: int = 0, properties=None, *, device: str = "cpu",
                arms=ARM_NAMES, Ts=(4, 8), buckets=None, shrink: bool = True, baseline: bool = True,
                round_examples: int = 25, on_result=None) -> list[dict]:
    """Per mutant: the suite's campaign (killed, time to kill, shrunk case size) and the baseline.

    names: mutant names (default: every reference-based mutant of the catalogue); budget_s: the
    campaign budget per mutant (checked between Hypothesis rounds, so a surviving mutant may
    overrun it by one round); properties: property names or Property objects (default: every
    registered property).  Returns one dict per mutant (see the keys below); on_result(dict)
    is called as each finishes.
    """

    names = list(names) if names else reference_mutants()
    if properties is not None:
        props = [p if isinstance(p, _P.Property) else _P.get_property(p) for p in properties]
    results = []
    for name in names:
        m = get_mutant(name)
        rec = dict(name=name, clause=m.clause, expected=m.prop, doc=m.doc, base=m.base, budget_s=budget_s,
                   seed=seed, skipped=None, killed=False, killed_by=None, finding_props=[], expected_hit=False,
                   t_detect=None, t_kill=None, examples=0, rows=None, case_json_len=None, case=None,
                   baseline_killed=None, baseline_failures=[])
        target = get_target(f"mutant:{name}")
        if properties is None:  # the properties of the mutant's kernel (Property.kernel)
            props = [_P.REGISTRY[n] for n in _P.for_kernel(target.kernel)]
        why = target.unavailable_reason(device)
        if why:
            rec["skipped"] = why
            results.append(rec)
            if on_result:
                on_result(rec)
            continue
        isolate = m.prop == "crash"
        camp = _timed_campaign(target=target, device=device, properties=props, arms=tuple(arms), Ts=tuple(Ts),
                               geometries=geometries_for(target),
                               buckets=tuple(buckets or buckets_for(target)), seed=seed, round_examples=round_examples, shrink=shrink,
                               isolate=isolate, corpus_dir=None)

        # A kill is a finding whose signature the unmodified base does not also give on the same case: a
        # failure the base shares (a known bug of the released kernel, say: the materializer's -0 and NaN
        # copies) says nothing about the mutant, but it must not mask one the base does not have (a copy that
        # zeroes every value gives pm.copy beside the base's pm.copy.zero_sign).  Shared ones are noted and
        # the campaign goes on.
        base_t = None if isolate else get_target(m.base)
        kills, base_fails = [], []

        def stop(f):
            if base_t is not None:
                try:
                    got = _P.get_property(f.prop).check(base_t, f.case, device)
                    on_base = [str(x) for x in got]
                    shared = {x.signature() for x in f.findings} <= {x.signature() for x in got}
                except Exception as e:  # noqa: BLE001  (the base cannot run it either: not a kill)
                    on_base, shared = [f"{type(e).__name__}: {e}"], True
                if shared:
                    base_fails.append(dict(prop=f.prop, findings=[str(x) for x in f.findings][:3],
                                           on_base=on_base[:3], case=f.case.to_dict()))
                    return
            kills.append((f, camp.stats.elapsed))
            raise _Killed

        try:
            camp.run(seconds=budget_s, on_finding=stop)
        except _Killed:
            pass
        rec["examples"] = camp.stats.examples
        rec["properties"] = [p.name for p in props]
        rec["isolated"] = isolate
        rec["base_also_fails"] = base_fails
        if kills:
            f, t_found = kills[0]
            rec.update(killed=True, killed_by=f.prop, finding_props=sorted({x.prop for x in f.findings}),
                       t_detect=camp.first_fail if not base_fails else t_found, t_kill=camp.stats.elapsed,
                       rows=f.case.B if target.kernel == "materialize" else sum(not r.pad for r in f.case.rows), case_json_len=len(f.case.to_json()),
                       case=f.case.to_dict(), findings=[str(x) for x in f.findings][:5])
            rec["expected_hit"] = any(p.startswith(m.prop) for p in rec["finding_props"])
        else:
            rec["t_run"] = camp.stats.elapsed
        if baseline and target.kernel == "flush":  # the example-based baseline imitates the flush kernel's tests
            if isolate:
                b = _baseline_isolated(name, arms, device)
                rec["baseline_killed"], rec["baseline_failures"] = b["killed"], b["failures"]
            else:
                b = run_baseline(target, arms=tuple(arms), device=device)
                rec["baseline_killed"], rec["baseline_failures"] = b.killed, b.failures[:5]
        results.append(rec)
        if on_result:
            on_result(rec)
    return results


def summary(results: list[dict]) -> dict:
    ran = [r for r in results if not r["skipped"]]
    killed = [r for r in ran if r["killed"]]
    t = [r["t_detect"] for r in killed if r["t_detect"] is not None]
    tk = [r["t_kill"] for r in killed if r["t_kill"] is not None]
    base = [r for r in ran if r["baseline_killed"] is not None]
    return dict(mutants=len(ran), killed=len(killed), kill_rate=len(killed) / len(ran) if ran else 0.0,
                baseline_mutants=len(base), baseline_killed=sum(bool(r["baseline_killed"]) for r in base),
                baseline_kill_rate=(sum(bool(r["baseline_killed"]) for r in base) / len(base)) if base else None,
                median_t_detect=statistics.median(t) if t else None, max_t_detect=max(t) if t else None,
                median_t_kill=statistics.median(tk) if tk else None, max_t_kill=max(tk) if tk else None,
                skipped=[r["name"] for r in results if r["skipped"]])


# ------------------------------------------------------------------ CLI
