"""The study sub-commands: `gdn-fuzz precision`, `unguarded`, `mutants` (gdn_fuzz.studies.mutation_score) (measurements, not pass/fail campaigns)."""

from __future__ import annotations

import json
import time

from rich.table import Table

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.cli.common import console, default_device, parse_arms, target_device_arms
from gdn_fuzz.targets import get_target
from gdn_fuzz import properties as _P
from gdn_fuzz.strategies import CPU_GEOMETRIES, GPU_GEOMETRIES
from gdn_fuzz.studies.mutation_score import mutants_of, run_mutants, summary
from gdn_fuzz.studies.precision import markdown, search
from gdn_fuzz.studies.unguarded import run_all, run_materializer
from gdn_fuzz.targets.mutants import get_mutant


def cmd_precision(args) -> int:
    targets = [get_target(n) for n in args.targets]
    device = args.device or default_device(targets[0])
    for t in targets:
        why = t.unavailable_reason(device)
        if why:
            console.print(f"[red]cannot run:[/red] {why}")
            return 2
    arms = parse_arms(args.arms) if args.arms else ARM_NAMES
    geoms = GPU_GEOMETRIES if any(t.needs_cuda for t in targets) else CPU_GEOMETRIES
    t0 = time.monotonic()
    res = search(targets, device, arms, tuple(args.T), geoms, tuple(args.buckets), args.examples,
                 seed=args.seed, steer=not args.no_steer)
    tab = Table(title=f"largest error / magnitude vs the float64 oracle ({args.examples} examples per arm and T, "
                      f"{'steered by target()' if not args.no_steer else 'unsteered'}, {time.monotonic() - t0:.0f}s)")
    for col in ("target", "arm", "T", "y", "u", "k", "g", "fold", "worst ratio to tol",
                "fp16 records with low 3 bits 0 (u / fold)"):
        tab.add_column(col)
    for tname, per_arm in res.items():
        for arm, per_T in per_arm.items():
            for T, cells in per_T.items():
                vals = [f"{cells[o]['max_rel']:.2e}" if o in cells else "-" for o in ("y", "u", "k", "g", "fold")]
                worst = max((cells[o]["max_ratio"] for o in ("y", "u", "k", "g", "fold") if o in cells), default=0)
                rp = cells.get("rounding", {})
                pattern = " / ".join(f"{z / n:.0%} of {n}" if n else "-" for z, n in
                                     (rp.get(o, (0, 0)) for o in ("u", "fold")))
                tab.add_row(tname, arm, str(T), *vals, f"{worst:.2f}", pattern)
    console.print(tab)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(markdown(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=device,
                           examples=args.examples, seed=args.seed, results=res), fh, indent=1, default=str)
    bad = any(c.get("max_ratio", 0) > 1 for per_arm in res.values() for per_T in per_arm.values()
              for cells in per_T.values() for c in cells.values() if isinstance(c, dict))
    return 1 if bad else 0


def cmd_unguarded(args) -> int:
    got = target_device_arms(args)
    if got is None:
        return 2
    target, device, arms = got
    if target.kernel == "materialize":  # slot numbers it does not validate, each scenario in an isolated worker
        rows = run_materializer(target.name, arms, device, rings=tuple(args.rings))
    else:
        rows = run_all(target, arms, tuple(args.T), device)
    t = Table(title=f"known unguarded inputs on {target} ({device}): measured consequences")
    for col in ("scenario", "clause", "arm", "T", "result"):
        t.add_column(col, overflow="fold")
    for r in rows:
        rest = {k: v for k, v in r.items() if k not in ("scenario", "clause", "arm", "T")}
        t.add_row(r["scenario"], r["clause"], r["arm"], str(r["T"]), json.dumps(rest))
    console.print(t)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(target=str(target), device=device, rows=rows), fh, indent=1)
    return 0


def _fmt_t(x):
    return "-" if x is None else f"{x:.1f}s"


def cmd_mutants(args) -> int:
    names = args.only or mutants_of(args.base)
    for n in names:
        get_mutant(n)  # unknown names fail before anything runs
    arms = tuple(a for v in (args.arms or []) for a in v.split(",") if a) or ARM_NAMES
    rounds = args.round_examples or (4 if str(args.device).startswith("cuda") else 25)
    console.print(f"gdn-fuzz mutants: {len(names)} mutants, budget {args.budget:g}s each, seed {args.seed}, "
                  f"{rounds} examples per round, "
                  f"device {args.device}, arms {','.join(arms)}, the properties of each mutant's kernel")

    def one(r):
        for b in r.get("base_also_fails") or []:
            console.print(f"  {r['name']}: a {b['prop']} finding also fails on the unmodified {r['base']} "
                          f"(not a kill, ignored): {b['findings'][0][:120]}", markup=False)
        if r["skipped"]:
            console.print(f"  {r['name']}: skipped ({r['skipped']})", markup=False)
        else:
            console.print(f"  {r['name']}: {'killed by ' + r['killed_by'] if r['killed'] else 'SURVIVED'} "
                          f"in {_fmt_t(r['t_detect'] if r['killed'] else r.get('t_run'))}; baseline "
                          + ("- (none for this kernel)" if r['baseline_killed'] is None else
                             'killed' if r['baseline_killed'] else 'survived'), markup=False)

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


def add_mutants_parser(subparsers):
    p = subparsers.add_parser("mutants", help=help_of("mutants"))
    p.add_argument("--budget", type=float, default=60.0, help="campaign seconds per mutant (default 60)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these mutants only (default: every mutant of --base)")
    p.add_argument("--base", choices=("reference", "production", "materialize", "materialize-reference"),
                   default="reference",
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


def add_parser(sub) -> None:
    p = sub.add_parser("precision", help=help_of("precision"))
    p.add_argument("--targets", nargs="+", default=["reference"])
    p.add_argument("--arms", nargs="+")
    p.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    p.add_argument("--buckets", nargs="+", type=int, default=[4, 8])
    p.add_argument("--device")
    p.add_argument("--examples", type=int, default=100, help="examples per (arm, T)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-steer", action="store_true", help="plain random generation (no target() phase)")
    p.add_argument("--json")
    p.add_argument("--markdown", help="write the table as Markdown here")
    p.set_defaults(func=cmd_precision)
    ug = sub.add_parser("unguarded", help=help_of("unguarded"))
    ug.add_argument("--target")
    ug.add_argument("--rings", nargs="+", type=int, default=[16, 32], choices=[16, 32],
                    help="materializer targets: the ring depths to run each scenario at")
    ug.add_argument("--arms", nargs="+")
    ug.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    ug.add_argument("--device")
    ug.add_argument("--json")
    ug.set_defaults(func=cmd_unguarded)
    add_mutants_parser(sub)
