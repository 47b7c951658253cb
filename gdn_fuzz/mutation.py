"""Mutation score: how many catalogued bugs (gdn_fuzz.mutants) the suite kills, and how fast.

How this module tests
---------------------
A mutant is the reference target with one small realistic bug (gdn_fuzz.mutants).  For each
mutant, `run_mutants` runs

(a) the suite: a gdn_fuzz Campaign of every registered property (gdn_fuzz.properties, which
    includes those registered here) against `mutant:NAME`, on the CPU reference geometries,
    all five dtype arms, T in {4, 8}, batch buckets {4, 8}, no corpus, in this process
    (isolate=False), until the first finding or the per-mutant budget.  The mutant is
    *killed* when any property reports a finding; it records the time to the first failing
    example (detection), the time until Hypothesis has shrunk it (the campaign records it),
    and the size of the shrunk Case (non-pad rows, length of its JSON).  Mutants whose
    expected property is "crash" kill the process they run in, so they run with
    isolate=True, i.e. in a worker process; workers only know the properties that importing
    gdn_fuzz.properties registers, so those campaigns leave out the three registered here.
(b) the example-based baseline (gdn_fuzz.baseline): a few fixed cases per arm against an
    fp32 sequential reference with FlashInfer's absolute tolerances.  Killed when any of its
    checks fails or a launch raises.

Properties registered here (import this module to register them)
----------------------------------------------------------------
guards      H4, H6, H9-H11, H13, H14: the target is called with illegal inputs (T = 6,
            flush_min = 0 and 18 - T, hist_len 17 and -1 and cache_base 32 and None with
            restart_hist_on_flush=True, q/k/v/a/b in the other IO dtype, an fp32 pool, an fp32
            u ring, int64 hist_len) and must raise the exception type the reference target
            raises for the same call.  Finding prop "guard.<clause>.<scenario>".
commit      C2: with restart_hist_on_flush=True (pad rows given in-range cursors, since the
            host commits them too), the cursors after the call equal
            oracles.commit.standalone_commit of the cursors before, and y and every buffer are
            bitwise those of the same launch with restart_hist_on_flush=False (the commit runs
            after the launch).  Finding prop "commit.cursors.<name>" / "commit.launch_bits.<buffer>".
extremes    N2 as containment: a gate logit a + dt_bias ~ 120 on v-head 0; that head (y, u, g, fold)
            may match the float64 oracle or show the documented non-finite outcome, everything else
            must match the oracle and the write set.  Finding prop "extremes.oracle.<output>" / "extremes.writes.*".

Not a property any more: the rounding-point ("precision") check.  It counted fp16 values whose
low 3 mantissa bits are zero and failed above 3/4.  No single element can show a violation of
N3 (a bf16-valued u record is a legal single rounding of some f32 value; U = R exactly when the
solve has nothing to subtract), so the rule was a statistical hunch and raised false alarms on
correct code (issue 14).  The measurement lives on in `gdn-fuzz precision` (rounding_pattern).

Timings depend on the machine and its load; the CLI prints them as measured.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import subprocess
import sys
import time

import torch

from . import properties as _P
from .arms import ARM_NAMES
from .case import Case, Row, materialize
from .checks import (BITS_DIFFER, WRONG_VALUE, Finding, check_oracle, check_writes, expectation, launch_record,
                     observe, oracle_metrics, raised, same_bits)
from .mutants import CATALOGUE, get_mutant
from .oracles import commit as commits
from .targets import Target, get_target

OWN_PROPERTIES = ("guards", "commit", "extremes")
_OTHER_IO = {torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}


# ------------------------------------------------------------------ helpers


def _clone(inputs: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _call(target: Target, arm: str, kwargs: dict):
    """(returned, exception) of one entry-point call."""
    try:
        return target.launch(arm, **kwargs), None
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return None, e


def _append_slots(inputs: dict, T: int) -> torch.Tensor:
    base, P = inputs["cache_base"].long(), inputs["hist_len"].long()
    return (base[:, None] + P[:, None] + torch.arange(T, device=base.device)[None, :]) & 31


# ------------------------------------------------------------------ guards (H*)


def _guard_scenarios(case: Case, device):
    """(id, description, clause, kwargs) of illegal calls derived from the case (fresh tensors each)."""
    T = case.T
    base = materialize(dataclasses.replace(case, restart_hist_on_flush=False), device)
    io = base["q"].dtype

    def kw(**over):
        d = _clone(base)
        d.update(over)
        return d

    out = []
    t6 = dataclasses.replace(case, T=6, flush_min=None, restart_hist_on_flush=False)
    out.append(("T", "T=6", "H13", materialize(t6, device)))
    out.append(("flush_min_zero", "flush_min=0", "H14", kw(flush_min=0)))
    out.append(("flush_min_cap", f"flush_min={18 - T} (17 - T + 1)", "H14", kw(flush_min=18 - T)))
    for sid, name, val in (("hist_len_high", "hist_len", 17), ("hist_len_negative", "hist_len", -1),
                           ("cache_base_high", "cache_base", 32)):
        d = kw(restart_hist_on_flush=True)
        d[name][0] = val
        out.append((sid, f"{name}[0]={val} with restart_hist_on_flush=True", "H11", d))
    out.append(("cache_base_none", "cache_base=None with restart_hist_on_flush=True", "H11",
                kw(restart_hist_on_flush=True, cache_base=None)))
    for name in ("q", "k", "v", "a", "b"):
        out.append((f"{name}_dtype", f"{name} in {_OTHER_IO[io]} (module IO {io})", "H6",
                    kw(**{name: base[name].to(_OTHER_IO[io])})))
    out.append(("state_dtype", "initial_state_source in float32", "H4",
                kw(initial_state_source=base["initial_state_source"].float())))
    out.append(("u_cache_dtype", "u_cache in float32", "H9", kw(u_cache=base["u_cache"].float())))
    out.append(("hist_len_dtype", "hist_len in int64", "H10", kw(hist_len=base["hist_len"].long())))
    return out


def guard_case(case: Case) -> Case:
    """The Case the guards property's illegal calls start from: the case with
    restart_hist_on_flush=False (each scenario sets what it needs)."""
    return dataclasses.replace(case, restart_hist_on_flush=False)


def guard_inputs(case: Case, scenario: str, device="cpu") -> dict:
    """The keyword arguments of one illegal call of check_guards (transformation "guard" of
    gdn_fuzz.reproducer: {"scenario": id})."""
    for sid, _, _, kwargs in _guard_scenarios(case, device):
        if sid == scenario:
            return kwargs
    raise ValueError(f"guard scenario {scenario!r} is unknown; use one of "
                     f"{', '.join(s for s, *_ in _guard_scenarios(case, device))}")


def check_guards(target: Target, case: Case, device="cpu") -> list[Finding]:
    """H4, H6, H9-H11, H13, H14: every illegal call raises the reference target's exception type.

    The expectation is what the reference target raises for the very same call (a scenario
    the reference accepts is skipped), so the property follows the reference's host checks.
    The contract fixes the exception type and the clause, not the wording: messages are
    reported, never compared.  Check id guard.<clause>.<scenario>.  Each finding carries its
    call (Finding.launch): guard_case(case) and the transformation "guard" {"scenario": id}.
    """
    ref = get_target("reference")
    gcase = guard_case(case)
    out = []
    for sid, name, clause, kwargs in _guard_scenarios(case, device):
        _, want = _call(ref, case.arm, _clone(kwargs))
        if want is None:
            continue
        _, got = _call(target, case.arm, kwargs)
        rec = launch_record(gcase, "guard", {"scenario": sid}, given=case,
                            note=f"the illegal call guard {sid!r}: {name}, on the inputs of the case")
        if got is None:
            out.append(Finding(f"guard.{clause}.{sid}", clause, f"illegal call ({name}) returned normally; the "
                               f"reference raises {type(want).__name__}: {str(want)[:120]}",
                               outcome="returned normally", launch=rec))
        elif type(got) is not type(want):
            out.append(Finding(f"guard.{clause}.{sid}", clause, f"illegal call ({name}) raised {type(got).__name__}: "
                               f"{str(got)[:120]}; the reference raises {type(want).__name__}",
                               outcome=raised(got), launch=rec))
    return out


# ------------------------------------------------------------------ commit (C2)


def _pad_cursors(case: Case) -> list[tuple[int, int]]:
    """(hist_len, cache_base) of every pad row, drawn from the seed: in range, P >= flush_min often."""
    rng = random.Random(f"{case.seed}:commit")
    out = []
    for r in case.rows:
        if r.pad:
            out.append((rng.choice([case.fmin, 16, rng.randint(0, 16)]), rng.randrange(32)))
    return out


def commit_case(case: Case) -> Case:
    """The launch check_commit runs, as a Case: restart_hist_on_flush=True, and pad rows given
    in-range cursors drawn from the seed (the host commits them too, C2; a drawn pad row has
    P = 0, base = 0).  A case that already has restart_hist_on_flush=True runs as written (its
    pad rows' cursors verbatim), so commit_case(commit_case(c)) == commit_case(c) and the Case a
    commit finding prints is one that check_commit runs unchanged.  materialize() uses rows'
    cursors verbatim, so materialize(commit_case(c)) is exactly the launch."""
    if case.restart_hist_on_flush:
        return case
    pads = iter(_pad_cursors(case))
    rows = tuple(Row(r.slot, *next(pads)) if r.pad else r for r in case.rows)
    return dataclasses.replace(case, rows=rows, restart_hist_on_flush=True)


def commit_inputs(case: Case, device="cpu") -> dict:
    """The tensors check_commit launches: materialize(commit_case(case)) with
    restart_hist_on_flush=False (the launch with True adds nothing but that flag)."""
    return materialize(dataclasses.replace(commit_case(case), restart_hist_on_flush=False), device)


def check_commit(target: Target, case: Case, device="cpu") -> list[Finding]:
    """C2: the standalone commit of restart_hist_on_flush=True, pad rows included, and nothing else.

    The launch is commit_case(case) (restart_hist_on_flush=True, pad rows with cursors): its
    committed cursors must equal oracles.commit.standalone_commit of the cursors before; it is
    compared bit for bit with the same inputs launched with restart_hist_on_flush=False.
    Findings carry commit_case(case) as their launch (Finding.launch).
    """
    ccase = commit_case(case)
    inputs = commit_inputs(case, device)
    before = _clone(inputs)
    plain = launch_record(ccase, given=case)
    twin = launch_record(ccase, given=case, note="compared with the same inputs launched with "
                                                 "restart_hist_on_flush=False")
    off = launch_record(ccase, "override", {"restart_hist_on_flush": False}, given=case,
                        note="the same inputs launched with restart_hist_on_flush=False")
    a = observe(target, dataclasses.replace(ccase, restart_hist_on_flush=False), device, inputs=_clone(inputs))
    b = observe(target, ccase, device, inputs=dict(_clone(inputs), restart_hist_on_flush=True))
    for obs, tag, rec in ((a, "restart_hist_on_flush=False", off), (b, "restart_hist_on_flush=True", plain)):
        if obs.error is not None:
            return [Finding("commit.launch", "H*", f"a legal launch ({tag}) raised {type(obs.error).__name__}: "
                            f"{obs.error}", outcome=raised(obs.error), launch=rec)]
    want_len, want_base = commits.standalone_commit(before["hist_len"], before["cache_base"], case.fmin)
    idx = before["initial_state_indices"].long().tolist()
    P0 = before["hist_len"].long().tolist()
    out = []
    for name, want in (("hist_len", want_len), ("cache_base", want_base)):
        got = b.after[name].long()
        bad = (got != want.to(got.device)).nonzero().flatten().tolist()
        if bad:
            r = bad[0]
            kind = "pad" if idx[r] < 0 else ("flush" if P0[r] >= case.fmin else "verify")
            out.append(Finding(f"commit.cursors.{name}", "C2",
                               f"{name} after the in-place commit is {got[r].item()}, expected {int(want[r])} "
                               f"(P={int(before['hist_len'][r])}, base={int(before['cache_base'][r])}, "
                               f"flush_min={case.fmin}, {kind} row; {len(bad)} rows differ)",
                               row=r, outcome=WRONG_VALUE, family=kind, launch=plain))
    live = inputs["initial_state_indices"].long() >= 0
    if isinstance(a.output, torch.Tensor) and isinstance(b.output, torch.Tensor):
        d = ~same_bits(a.output, b.output) & live[:, None, None, None]
        if bool(d.any()):
            out.append(Finding("commit.launch_bits.y", "C2", "y of a live row differs between restart_hist_on_flush "
                               "True and False (the commit must run after the launch)",
                               row=int(d.nonzero()[0, 0]), outcome=BITS_DIFFER, launch=twin))
    for name in ("initial_state_source", "k_cache", "u_cache", "g_cache"):
        if not bool(same_bits(a.after[name], b.after[name]).all()):
            out.append(Finding(f"commit.launch_bits.{name}", "C2", f"{name} after differs between "
                               "restart_hist_on_flush True and False (the commit must touch nothing but the cursors)",
                               outcome=BITS_DIFFER, launch=twin))
    return out


# ------------------------------------------------------------------ extremes (N2)

EXTREME_LOGIT = 120.0  # a on v-head 0: a + dt_bias >> 88.7, where e^x overflows f32
EXTREME_HEAD = 0


def gate_inputs(inputs: dict, params: dict) -> dict:
    """Transformation "extremes.gate": a = params["a"] on v-head params["v_head"], every row and token."""
    inputs["a"][:, :, int(params["v_head"])] = float(params["a"])
    return inputs


def extreme_inputs(case: Case, device="cpu") -> dict:
    """The launch check_extremes runs: the case's tensors with a = 120 on v-head 0, every token."""
    return gate_inputs(materialize(case, device), {"v_head": EXTREME_HEAD, "a": EXTREME_LOGIT})


def check_extremes(target: Target, case: Case, device="cpu") -> list[Finding]:
    """N2, as containment: a gate logit a + dt_bias ~ 120 on v-head 0 (every token) is outside
    what the released kernel computes exactly (no softplus threshold: g = -inf there, then NaN).

    The contract allows either outcome for that head: y, the u and g records and, on flush rows,
    the folded checkpoint of v-head 0 match the float64 oracle within the arm's tolerance, OR
    they are non-finite (the documented overflow; N2 lists the pool row among what a poisoned
    head damages).  Nothing outside that head may suffer: every other head's outputs, records
    and folds, and the k records (N2: the k ring is unaffected), match the oracle, and nothing
    outside the write set changes (M8).  A finite value of head 0 that matches neither is a
    finding, and so is any damage elsewhere.  Check ids extremes.oracle.<output>, extremes.writes.*.
    (The released kernel does write a non-finite fold here: run 9 of docs/h200-results.md.)
    Findings carry the launch: the case and the transformation "extremes.gate" {"v_head": 0, "a": 120}.
    """
    params = {"v_head": EXTREME_HEAD, "a": EXTREME_LOGIT}
    rec = launch_record(case, "extremes.gate", params,
                        note=f"a = {EXTREME_LOGIT:g} on v-head {EXTREME_HEAD} (every row and token) on the case's inputs")
    inputs = gate_inputs(materialize(case, device), params)
    obs = observe(target, case, device, inputs=inputs)
    if obs.error is not None:
        return [Finding("extremes.launch", "H*", f"a launch with a + dt_bias ~ {EXTREME_LOGIT:g} raised "
                        f"{type(obs.error).__name__}: {obs.error}", outcome=raised(obs.error), launch=rec)]
    e = expectation(obs)
    metrics = oracle_metrics(obs, e)
    for name in ("y", "u", "g", "fold"):  # v-head 0: the documented non-finite outcome is allowed (N2)
        m = metrics[name]
        m.ratio[:, 0] = torch.where(torch.isinf(m.rel[:, 0]), torch.zeros_like(m.ratio[:, 0]), m.ratio[:, 0])
    out = []
    for f in check_oracle(obs, e, metrics) + check_writes(obs):
        out.append(dataclasses.replace(f, prop=f"extremes.{f.prop}", message=(
            f"with a + dt_bias ~ {EXTREME_LOGIT:g} on v-head 0: " + f.message), launch=rec))
    return out


def _register() -> None:
    for name, clauses, doc, check in (
        ("guards", "H4,H6,H9-H11,H13,H14", "illegal calls raise the reference target's exception type",
         check_guards),
        ("commit", "C2", "restart_hist_on_flush=True commits cursors as standalone_commit (pad rows included) "
         "and changes nothing else", check_commit),
        ("extremes", "N2", "a + dt_bias ~ 120 on one head: that head matches the oracle or is non-finite (N2); "
         "nothing else changes", check_extremes),
    ):
        _P.register(_P.Property(name=name, clauses=clauses, doc=doc, strategy=_P._cases, check=check))


_register()


# ------------------------------------------------------------------ run_mutants


class _Killed(Exception):
    pass


def _timed_campaign(**kw):
    """A Campaign that notes when the first check failed (before Hypothesis shrinks it).

    gdn_fuzz.campaign is imported here, not at the top, so that gdn_fuzz.properties may import
    this module at its end without an import cycle."""
    from .campaign import Campaign

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


def _baseline_isolated(name: str, arms) -> dict:
    """The baseline in a child process (for mutants that kill their process)."""
    code = ("import json, sys\nfrom gdn_fuzz.baseline import run_baseline\nfrom gdn_fuzz.targets import get_target\n"
            f"r = run_baseline(get_target('mutant:{name}'), arms={tuple(arms)!r})\n"
            "print(json.dumps(dict(killed=r.killed, failures=r.failures[:5])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [""])[-1]
        return dict(killed=True, failures=[f"the baseline's process died (exit {p.returncode}): {last}"])
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_mutants(names=None, budget_s: float = 60.0, seed: int = 0, properties=None, *, device: str = "cpu",
                arms=ARM_NAMES, Ts=(4, 8), buckets=(4, 8), shrink: bool = True, baseline: bool = True,
                round_examples: int = 25, on_result=None) -> list[dict]:
    """Per mutant: the suite's campaign (killed, time to kill, shrunk case size) and the baseline.

    names: mutant names (default: every reference-based mutant of the catalogue); budget_s: the
    campaign budget per mutant (checked between Hypothesis rounds, so a surviving mutant may
    overrun it by one round); properties: property names or Property objects (default: every
    registered property).  Returns one dict per mutant (see the keys below); on_result(dict)
    is called as each finishes.
    """
    from .baseline import run_baseline
    from .strategies import CPU_GEOMETRIES, GPU_GEOMETRIES

    names = list(names) if names else reference_mutants()
    if properties is None:
        props = list(_P.REGISTRY.values())
    else:
        props = [p if isinstance(p, _P.Property) else _P.get_property(p) for p in properties]
    results = []
    for name in names:
        m = get_mutant(name)
        rec = dict(name=name, clause=m.clause, expected=m.prop, doc=m.doc, base=m.base, budget_s=budget_s,
                   seed=seed, skipped=None, killed=False, killed_by=None, finding_props=[], expected_hit=False,
                   t_detect=None, t_kill=None, examples=0, rows=None, case_json_len=None, case=None,
                   baseline_killed=None, baseline_failures=[])
        target = get_target(f"mutant:{name}")
        why = target.unavailable_reason(device)
        if why:
            rec["skipped"] = why
            results.append(rec)
            if on_result:
                on_result(rec)
            continue
        isolate = m.prop == "crash"
        use = [p for p in props if not (isolate and p.name in OWN_PROPERTIES)]
        camp = _timed_campaign(target=target, device=device, properties=use, arms=tuple(arms), Ts=tuple(Ts),
                               geometries=GPU_GEOMETRIES if target.needs_cuda else CPU_GEOMETRIES,
                               buckets=tuple(buckets), seed=seed, round_examples=round_examples, shrink=shrink,
                               isolate=isolate, corpus_dir=None)

        # A kill is a finding that the unmodified base passes on the same case: a property that
        # also fails on the base (a known bug of the released kernel, say) says nothing about the
        # mutant.  Such findings are noted and the campaign goes on.
        base_t = None if isolate else get_target(m.base)
        kills, base_fails = [], []

        def stop(f):
            if base_t is not None:
                try:
                    on_base = [str(x) for x in _P.get_property(f.prop).check(base_t, f.case, device)]
                except Exception as e:  # noqa: BLE001  (the base cannot run it either: not a kill)
                    on_base = [f"{type(e).__name__}: {e}"]
                if on_base:
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
        rec["properties"] = [p.name for p in use]
        rec["isolated"] = isolate
        rec["base_also_fails"] = base_fails
        if kills:
            f, t_found = kills[0]
            rec.update(killed=True, killed_by=f.prop, finding_props=sorted({x.prop for x in f.findings}),
                       t_detect=camp.first_fail if not base_fails else t_found, t_kill=camp.stats.elapsed,
                       rows=sum(not r.pad for r in f.case.rows), case_json_len=len(f.case.to_json()),
                       case=f.case.to_dict(), findings=[str(x) for x in f.findings][:5])
            rec["expected_hit"] = any(p.startswith(m.prop) for p in rec["finding_props"])
        else:
            rec["t_run"] = camp.stats.elapsed
        if baseline:
            if isolate:
                b = _baseline_isolated(name, arms)
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


def _fmt_t(x):
    return "-" if x is None else f"{x:.1f}s"


def cmd_mutants(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    names = args.only or (production_mutants() if args.base == "production" else reference_mutants())
    for n in names:
        get_mutant(n)  # unknown names fail before anything runs
    arms = tuple(a for v in (args.arms or []) for a in v.split(",") if a) or ARM_NAMES
    rounds = args.round_examples or (4 if str(args.device).startswith("cuda") else 25)
    console.print(f"gdn-fuzz mutants: {len(names)} mutants, budget {args.budget:g}s each, seed {args.seed}, "
                  f"{rounds} examples per round, "
                  f"device {args.device}, arms {','.join(arms)}, properties {','.join(_P.REGISTRY)}")

    def one(r):
        for b in r.get("base_also_fails") or []:
            console.print(f"  {r['name']}: a {b['prop']} finding also fails on the unmodified {r['base']} "
                          f"(not a kill, ignored): {b['findings'][0][:120]}", markup=False)
        if r["skipped"]:
            console.print(f"  {r['name']}: skipped ({r['skipped']})", markup=False)
        else:
            console.print(f"  {r['name']}: {'killed by ' + r['killed_by'] if r['killed'] else 'SURVIVED'} "
                          f"in {_fmt_t(r['t_detect'] if r['killed'] else r.get('t_run'))}; baseline "
                          f"{'killed' if r['baseline_killed'] else 'survived'}", markup=False)

    res = run_mutants(names, args.budget, args.seed, device=args.device, arms=arms, on_result=one,
                      round_examples=rounds)
    t = Table(title=f"mutation score (budget {args.budget:g}s per mutant, seed {args.seed}; times are wall "
                    "seconds on this machine)")
    for col in ("mutant", "clause", "expected", "killed", "killed by", "first finding", "time-to-kill",
                "shrunk at", "rows", "case JSON", "baseline"):
        t.add_column(col, no_wrap=col in ("mutant", "expected", "first finding"), overflow="fold")
    for r in res:
        if r["skipped"]:
            t.add_row(r["name"], r["clause"], r["expected"], "skipped", "-", r["skipped"][:40], "-", "-", "-", "-", "-")
            continue
        first = "-" if not r["killed"] else r["finding_props"][0] + ("" if r["expected_hit"] else " (unexpected)")
        t.add_row(r["name"], r["clause"], r["expected"],
                  "[green]yes[/green]" if r["killed"] else "[red]NO[/red]", r["killed_by"] or "-",
                  first, _fmt_t(r["t_detect"]), _fmt_t(r["t_kill"]),
                  "-" if r["rows"] is None else str(r["rows"]),
                  "-" if r["case_json_len"] is None else str(r["case_json_len"]),
                  "-" if r["baseline_killed"] is None else ("killed" if r["baseline_killed"] else "survived"))
    console.print(t)
    s = summary(res)
    bl = "-" if s["baseline_kill_rate"] is None else f"{s['baseline_killed']}/{s['baseline_mutants']} " \
                                                       f"({s['baseline_kill_rate']:.0%})"
    console.print(f"suite: {s['killed']}/{s['mutants']} killed ({s['kill_rate']:.0%}); time-to-kill median "
                  f"{_fmt_t(s['median_t_detect'])}, max {_fmt_t(s['max_t_detect'])} (after shrinking: median "
                  f"{_fmt_t(s['median_t_kill'])}, max {_fmt_t(s['max_t_kill'])}); example-based baseline: {bl}"
                  + (f"; skipped: {', '.join(s['skipped'])}" if s["skipped"] else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), budget_s=args.budget,
                           round_examples=rounds, seed=args.seed, device=args.device, arms=list(arms), summary=s, results=res),
                      fh, indent=1, default=str)
    return 0 if s["mutants"] and s["killed"] == s["mutants"] else 1


def add_parser(subparsers):
    """Add the `mutants` subcommand to the gdn-fuzz CLI (argparse subparsers)."""
    p = subparsers.add_parser("mutants", help="mutation score: run the suite and the example-based baseline "
                                              "against every catalogued mutant")
    p.add_argument("--budget", type=float, default=60.0, help="campaign seconds per mutant (default 60)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these mutants only (default: every mutant of --base)")
    p.add_argument("--base", choices=("reference", "production"), default="reference",
                   help="which catalogue: edits of the reference target (CPU or GPU) or one-line edits of the "
                        "released kernel file (an SM90 GPU; use with --device cuda)")
    p.add_argument("--json", help="write the per-mutant results here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--round-examples", type=int,
                   help="examples per property per Hypothesis round (default 25 on the CPU, 4 on CUDA: on a GPU every "
                        "new shape of a new mutant module JIT-compiles, and with 25 the first H200 run spent a 30 s "
                        "budget on the launch and routing rounds alone, never reaching commit or guards)")
    p.add_argument("--arms", nargs="+", help=f"dtype arms (default: all of {', '.join(ARM_NAMES)})")
    p.set_defaults(func=cmd_mutants)
    return p
