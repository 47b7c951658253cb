"""The gdn-fuzz command line.

  gdn-fuzz run [--target NAME|PATH] [--arms ...] [--T 4 8] [--device D] [--seconds S | --examples N]
  gdn-fuzz mutants [--budget S] [--only NAME ...] [--json PATH] [--seed N]
  gdn-fuzz drift [--tokens N] [--arms ...] [--T 4 8] [--accept mtp|all|one] [--out DIR]
  gdn-fuzz triton [--kernels triton|interpret|model] [--T 4 8] [--cfgs ...] [--diff] [--json PATH]
  gdn-fuzz replay | report | precision | unguarded | doctor
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gdn_fuzz.arms import ARM_NAMES, get_arm
from gdn_fuzz.targets import TargetUnavailable, default_target_name, get_target

console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def _default_device(target) -> str:
    import torch

    return "cuda" if (target.needs_cuda or torch.cuda.is_available()) and torch.cuda.is_available() else "cpu"


def _parse_arms(values):
    arms = []
    for v in values:
        for name in v.split(","):
            if name.strip():
                get_arm(name.strip())  # raises with the legal names
                arms.append(name.strip())
    return tuple(arms)


def _target_device_arms(args):
    """(target, device, arms) from --target/--device/--arms, or None after saying why not."""
    name = args.target or default_target_name()
    try:
        target = get_target(name)
    except (TargetUnavailable, ValueError) as e:
        console.print(f"[red]target {name!r} unavailable:[/red] {e}")
        return None
    device = args.device or _default_device(target)
    import torch

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        console.print(f"[red]cannot run:[/red] --device {device}: this machine has no usable CUDA device "
                      f"(torch {torch.__version__}, cuda available: False); use --device cpu")
        return None
    why = target.unavailable_reason(device)
    if why:
        console.print(f"[red]cannot run:[/red] {why}")
        return None
    return target, device, (_parse_arms(args.arms) if args.arms else ARM_NAMES)


# exit codes of `gdn-fuzz run` (and replay): documented in the README
EXIT_OK = 0  # nothing new (known bugs may have shown: listed, not failing)
EXIT_NEW = 1  # new findings
EXIT_USAGE = 2  # usage or setup error: bad option, target missing or unloadable, no device
EXIT_KNOWN_ONLY = 3  # only known findings, and --fail-on-known was given
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT: what was found is reported and stored first


class UsageError(ValueError):
    """A bad option value: one line naming the option, its value and the fix (exit 2)."""


def validate_run_args(args) -> None:
    """Every option of `gdn-fuzz run` checked before any work (UsageError, one line)."""
    if args.seconds is not None and not (args.seconds > 0):
        raise UsageError(f"--seconds={args.seconds:g}: give a positive number of seconds")
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples={args.examples}: give at least 1")
    if args.launch_timeout is not None and not (args.launch_timeout > 0):
        raise UsageError(f"--launch-timeout={args.launch_timeout:g}: give a positive number of seconds")
    if args.round_examples < 1:
        raise UsageError(f"--round-examples={args.round_examples}: give at least 1")
    for b in args.buckets:
        if b < 1 or b & (b - 1) or b > 1024:
            raise UsageError(f"--buckets {b}: batch buckets are powers of two in [1, 1024] (e.g. 4 8)")
    if args.arms:
        try:
            _parse_arms(args.arms)
        except ValueError as e:
            raise UsageError(f"--arms {' '.join(args.arms)}: {e}") from None
    if args.property:
        from gdn_fuzz.properties import REGISTRY

        for p in args.property:
            if p not in REGISTRY:
                raise UsageError(f"--property {p}: unknown; use one of {', '.join(REGISTRY)}")


def cmd_run(args) -> int:
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.engine.isolation import SetupError
    from gdn_fuzz.engine.reproducer import explain
    from gdn_fuzz.properties import REGISTRY, get_property
    from gdn_fuzz.strategies import CPU_GEOMETRIES, GPU_GEOMETRIES

    try:
        validate_run_args(args)
    except UsageError as e:
        console.print(f"[red]gdn-fuzz run:[/red] {e}", markup=True)
        return EXIT_USAGE
    if args.gpus:
        from gdn_fuzz.engine import corpus
        from gdn_fuzz.engine.multigpu import run_on_gpus

        try:
            return run_on_gpus(args, None if args.no_corpus else str(args.corpus or corpus.default_dir()), console)
        except ValueError as e:
            console.print(f"[red]{e}[/red]")
            return EXIT_USAGE
    got = _target_device_arms(args)
    if got is None:
        return EXIT_USAGE
    target, device, arms = got
    try:
        for a in arms:
            target.module(a)  # import every arm up front: a module that does not fit fails here, clearly
    except Exception as e:  # noqa: BLE001 - a target that cannot be imported is a setup error
        console.print(f"[red]target {target} cannot be loaded:[/red] {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", markup=True)
        return EXIT_USAGE
    props = [get_property(p) for p in (args.property or list(REGISTRY))]
    geoms = GPU_GEOMETRIES if target.needs_cuda else CPU_GEOMETRIES
    from gdn_fuzz.engine import corpus

    corpus_dir = None if args.no_corpus else (args.corpus or corpus.default_dir())
    if corpus_dir is not None:
        corpus.clean_stale_temps(corpus_dir)
    known = {} if corpus_dir is None else corpus.known_signatures(target.name, corpus_dir)
    camp = Campaign(target=target, device=device, properties=props, arms=arms, Ts=tuple(args.T),
                    geometries=geoms, buckets=tuple(args.buckets), seed=args.seed,
                    round_examples=args.round_examples, isolate=not args.no_isolate, corpus_dir=corpus_dir,
                    record_path=args.record, known=known, launch_timeout_s=args.launch_timeout)
    seconds = args.seconds if args.seconds is not None else (None if args.examples else 60.0)
    console.print(f"gdn-fuzz run: target={target} ({target.path}) device={device} arms={','.join(arms)} "
                  f"T={args.T} properties={','.join(p.name for p in props)} seed={args.seed} "
                  f"budget={'%gs' % seconds if seconds else ''}{' %d examples' % args.examples if args.examples else ''}"
                  f"; {len(known)} known bug signature(s) of this target in the corpus", markup=False)
    with Progress(TextColumn("[bold]fuzzing"), BarColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console, transient=not console.is_terminal) as progress:
        task = progress.add_task("", total=seconds or args.examples)

        def tick():
            s = camp.stats
            progress.update(task, completed=(s.elapsed if seconds else s.examples),
                            description=f"examples {s.examples}  launches {s.launches}  new {len(camp.findings)}  "
                                        f"known {sum(camp.known_hits.values())}  compiles {s.compiles}  "
                                        f"{s.rate:.1f} ex/s")

        def first(sig, prop, case, findings, t, n):
            progress.console.print(f"[red]failure[/red] {sig}  (property {prop}, {t:.1f}s, after {n} examples; "
                                   "shrinking)", markup=True, highlight=False)

        def found(f):
            progress.console.print(f"[red]finding[/red] {f.signature}", markup=True)
            progress.console.print(f"  property {f.prop}; first failing example at {f.first_t:.1f}s after "
                                   f"{f.first_examples} examples; "
                                   + (f"shrunk in {f.shrink_s:.1f}s" if f.shrunk else
                                      f"shrinking stopped after {f.shrink_s:.1f}s (budget or interrupt): best case so far")
                                   + (" (flaky on replay)" if f.flaky else ""), markup=False)
            # the launch as it ran (the property's own changes to the drawn case), and which
            # neighbouring cursors pass when the failing row sits on a routing or ring edge
            progress.console.print(explain(f.prop, f.case, f.findings, f.signature, target, device,
                                           isolate=not args.no_isolate), markup=False)
            for x in f.findings:
                progress.console.print("  " + str(x), markup=False)
            if f.entry_path is not None:
                progress.console.print(f"  corpus: {f.entry_path} ({'new entry' if f.entry_new else 'already in the corpus'})",
                                       markup=False)
            elif f.entry_note:
                progress.console.print(f"  corpus: {f.entry_note}", markup=False)

        try:
            if args.warm_up:
                progress.update(task, description="warm-up: one launch per (arm, T, geometry, bucket)")
                camp.warm_up()
                progress.console.print(f"warm-up: {camp.stats.warmup_s:.1f}s, {camp.stats.warmup_compiles} JIT "
                                       "compiles (outside the budget)")
            camp.run(seconds=seconds, examples=args.examples, on_example=tick, on_finding=found, on_first=first)
        except SetupError as e:  # the machine cannot run checks: not a finding
            progress.stop()
            console.print(f"[red]setup error:[/red] {e}", markup=True)
            return EXIT_USAGE
        tick()
    s = camp.stats
    t = Table(title="gdn-fuzz summary")
    for col in ("target", "device", "examples", "launches", "rounds", "JIT compiles", "new findings",
                "known bugs seen", "time", "examples/s", "warm-up"):
        t.add_column(col)
    t.add_row(str(target), device, str(s.examples), str(s.launches), str(s.rounds), str(s.compiles),
              str(len(camp.findings)), str(len(camp.known_hits)), f"{s.elapsed:.1f}s", f"{s.rate:.1f}",
              f"{s.warmup_s:.1f}s, {s.warmup_compiles} compiles" if args.warm_up else "-")
    console.print(t)
    if camp.findings or camp.known_hits:
        ft = Table(title="findings by signature")
        for col in ("signature", "status", "first at", "examples before", "shrunk", "corpus entry"):
            ft.add_column(col, overflow="fold")
        for f in camp.findings.values():
            ft.add_row(f.signature, "[red]new[/red]", f"{f.first_t:.1f}s", str(f.first_examples),
                       f"{f.shrink_s:.1f}s" if f.shrunk else "stopped early",
                       "-" if f.entry_path is None else os.path.basename(str(f.entry_path)))
        for k in camp.known_summary():
            ft.add_row(k["signature"], f"known ({k['examples']} examples)", "-", "-", "-", k["corpus_entry"] or "-")
        console.print(ft)
    for sig, u in sorted(camp.unconfirmed.items()):
        console.print(f"[yellow]not confirmed[/yellow] (its first failing case did not come back in a fresh worker "
                      f"process: {'passed' if u['reproduced'] is False else 'out of memory or a hang'}; not filed, "
                      f"not shrunk): {sig}", markup=True)
    for sig, n in sorted(camp.env_failures.items()):
        console.print(f"[yellow]failure of the machine, not of the kernel[/yellow] ({n} example(s)): {sig}",
                      markup=True)
    if camp.interrupted:
        console.print("[yellow]interrupted[/yellow]: findings seen so far are listed and stored above")
    if args.json:
        rec = dict(target=str(target), path=str(target.path), device=device, arms=list(arms), T=list(args.T),
                   seed=args.seed, examples=s.examples, launches=s.launches, compiles=s.compiles,
                   cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                   warmup_s=s.warmup_s, warmup_compiles=s.warmup_compiles, budget_s=seconds,
                   budget_examples=args.examples, interrupted=camp.interrupted,
                   seconds=s.elapsed, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   findings=[f.to_record() for f in camp.findings.values()],
                   known=camp.known_summary(), machine_failures=dict(camp.env_failures),
                   unconfirmed=camp.unconfirmed)
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)
    if camp.interrupted:
        return EXIT_INTERRUPTED
    if camp.findings:
        return EXIT_NEW
    if camp.known_hits and args.fail_on_known:
        return EXIT_KNOWN_ONLY
    return EXIT_OK


def cmd_precision(args) -> int:
    from gdn_fuzz.studies.precision import search
    from gdn_fuzz.strategies import CPU_GEOMETRIES, GPU_GEOMETRIES

    targets = [get_target(n) for n in args.targets]
    device = args.device or _default_device(targets[0])
    for t in targets:
        why = t.unavailable_reason(device)
        if why:
            console.print(f"[red]cannot run:[/red] {why}")
            return 2
    arms = _parse_arms(args.arms) if args.arms else ARM_NAMES
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
        from gdn_fuzz.studies.precision import markdown

        with open(args.markdown, "w") as fh:
            fh.write(markdown(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=device,
                           examples=args.examples, seed=args.seed, results=res), fh, indent=1, default=str)
    bad = any(c.get("max_ratio", 0) > 1 for per_arm in res.values() for per_T in per_arm.values()
              for cells in per_T.values() for c in cells.values() if isinstance(c, dict))
    return 1 if bad else 0


def cmd_replay(args) -> int:
    from gdn_fuzz.engine import corpus

    paths = [p for a in (args.entries or [str(corpus.default_dir())]) for p in
             (corpus.entries(a) if os.path.isdir(a) else [a])]
    if args.emit_test:
        from gdn_fuzz.engine.reproducer import emit_test, entry_launch

        if len(paths) != 1:
            console.print(f"[red]gdn-fuzz replay --emit-test:[/red] give exactly one corpus entry file (got "
                          f"{len(paths)})", markup=True)
            return EXIT_USAGE
        try:
            e = corpus.read(paths[0])
            emit_test(e, args.emit_test, target=args.target)
        except (corpus.CorpusError, ValueError, OSError) as err:
            console.print(f"[red]gdn-fuzz replay --emit-test:[/red] {err}", markup=True)
            return EXIT_USAGE
        console.print(f"reproducer written: {args.emit_test} (fails while {e.signature!r} shows on "
                      f"{args.target or e.target}; run it with pytest)", markup=False)
        console.print("the launch that failed:\n" + entry_launch(e).describe(), markup=False)
    t = Table(title="gdn-fuzz replay")
    for col in ("entry", "status", "target", "property", "result", "detail"):
        t.add_column(col, overflow="fold")
    unexpected = 0
    explained = []
    for p in paths:
        try:
            e = corpus.read(p)
        except corpus.CorpusError as err:
            t.add_row(str(p), "-", "-", "-", "[red]unreadable[/red]", str(err))
            unexpected += 1
            continue
        target = args.target or e.target
        try:
            if not args.target:
                corpus.check_replayable(e, args.allow_target_paths or None)
            tgt = get_target(target)
            why = tgt.unavailable_reason(args.device or _default_device(tgt))
        except corpus.CorpusError as err:  # an entry naming a file: refused, not skipped
            t.add_row(str(p), e.status, target, e.prop, "[red]refused[/red]", str(err))
            unexpected += 1
            continue
        except (TargetUnavailable, ValueError) as err:
            why = str(err)
        if why:
            t.add_row(str(p), e.status, target, e.prop, "skipped", why)
            continue
        device = args.device or _default_device(tgt)
        found = corpus.replay(e, target, device, allow_paths=True)
        ok, what = corpus.verdict(e, found)
        if args.explain:
            from gdn_fuzz.engine.reproducer import entry_launch, explain

            text = (explain(e.prop, e.case, found, e.signature, tgt, device, isolate=corpus.is_crash(e))
                    if any(f.launch for f in found) else entry_launch(e).describe())
            explained.append(f"{p}: {e.signature}\n{text}")
        unexpected += not ok
        res = what if ok else f"[red]{what}[/red]"
        t.add_row(str(p), e.status, target, e.prop, res, "; ".join(str(f) for f in found)[:300])
    console.print(t)
    for text in explained:
        console.print(text, markup=False)
    return 1 if unexpected else 0


def cmd_report(args) -> int:
    from gdn_fuzz.engine.report import build

    path = build(args.records, args.campaign, args.out)
    console.print(f"report written: {path} (+ report.html and PNG plots beside it)")
    return 0


def cmd_unguarded(args) -> int:
    from gdn_fuzz.studies.unguarded import run_all

    got = _target_device_arms(args)
    if got is None:
        return 2
    target, device, arms = got
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


def cmd_doctor(args) -> int:
    from gdn_fuzz.engine.doctor import report

    console.print(report(), markup=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gdn-fuzz", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="fuzz a target within a time or example budget")
    r.add_argument("--target", help="reference | production | sm100 | PATH.py (default: production on an SM90+ GPU, else reference)")
    r.add_argument("--kernel-module", dest="target", help="alias of --target PATH.py")
    r.add_argument("--arms", nargs="+", help=f"dtype arms (default: all of {', '.join(ARM_NAMES)})")
    r.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    r.add_argument("--buckets", nargs="+", type=int, default=[4, 8], help="power-of-two batch sizes (pad rows fill them)")
    r.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    r.add_argument("--seconds", type=float, help="time budget (default 60 unless --examples is given)")
    r.add_argument("--examples", type=int, help="example budget")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--property", action="append", help="property to run (repeatable; default: all)")
    r.add_argument("--round-examples", type=int, default=25, help="examples per Hypothesis round")
    r.add_argument("--json", help="write a JSON record of the campaign here")
    r.add_argument("--corpus", help="corpus folder for findings (default: $GDN_FUZZ_CORPUS or ./corpus)")
    r.add_argument("--no-corpus", action="store_true", help="do not write findings to a corpus")
    r.add_argument("--no-isolate", action="store_true", help="launch in this process (no crash isolation)")
    r.add_argument("--record", help="append one JSON line per example here (input of `gdn-fuzz report`)")
    r.add_argument("--warm-up", action="store_true",
                   help="first launch one legal case per (arm, T, geometry, bucket), paying every JIT compile "
                        "outside the budget (reported apart); the budget then measures checking, not compiling")
    r.add_argument("--launch-timeout", type=float,
                   help="seconds after which a launch counts as a hang (isolated runs; default: 20 x the slowest "
                        "check so far, at least 30 s, never past the budget left)")
    r.add_argument("--fail-on-known", action="store_true",
                   help=f"exit {EXIT_KNOWN_ONLY} when the only findings are known bugs (open corpus entries of this "
                        f"target); by default they are listed and the exit code is {EXIT_OK}")
    r.add_argument("--gpus", help="one campaign process per GPU: '0,1' or 'all' (CUDA_VISIBLE_DEVICES per worker, "
                                  "seed + worker index, one shared corpus; --json gets the merged record)")
    r.set_defaults(func=cmd_run)
    p = sub.add_parser("precision", help="steer generation toward the largest error vs the oracle (tolerance evidence)")
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
    rp = sub.add_parser("replay", help="re-run corpus entries against their target (or --target)")
    rp.add_argument("entries", nargs="*", help="entry files or folders (default: the corpus folder)")
    rp.add_argument("--target", help="replay against this target instead of each entry's own")
    rp.add_argument("--device")
    rp.add_argument("--allow-target-paths", action="store_true",
                    help="replay entries whose target is a file path (imports and runs that file; "
                         "never use on entries you did not write)")
    rp.add_argument("--explain", action="store_true",
                    help="after the table, print each entry's launch (the Case as it ran and the transformation of "
                         "its inputs) and, for a launch-property oracle finding on a routing or ring edge, which "
                         "neighbouring cursors (P +/- 1, base +/- 1) pass")
    rp.add_argument("--emit-test", metavar="PATH",
                    help="write a standalone pytest file reproducing the one ENTRY given (its launch as a Case "
                         "literal, the property's check, and an assertion that the entry's signature is gone: it "
                         "fails while the bug is present), then replay it as usual")
    rp.set_defaults(func=cmd_replay)
    rep = sub.add_parser("report", help="Markdown/HTML report with coverage and error plots of a campaign")
    rep.add_argument("records", help="the campaign's --record JSON lines")
    rep.add_argument("--campaign", help="the campaign's --json record (findings, budget, versions)")
    rep.add_argument("--out", default="report", help="output folder")
    rep.set_defaults(func=cmd_report)
    ug = sub.add_parser("unguarded", help="measure what unvalidated inputs do (hist_len > 16, duplicate slots, ...)")
    ug.add_argument("--target")
    ug.add_argument("--arms", nargs="+")
    ug.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    ug.add_argument("--device")
    ug.add_argument("--json")
    ug.set_defaults(func=cmd_unguarded)
    d = sub.add_parser("doctor", help="what this machine can run, and why not")
    d.set_defaults(func=cmd_doctor)
    from gdn_fuzz.studies.mutation_score import add_parser as add_mutants_parser

    add_mutants_parser(sub)
    from gdn_fuzz.studies.drift import add_parser as add_drift_parser

    add_drift_parser(sub)
    from gdn_fuzz.studies.triton_diff import add_parser as add_triton_parser  # the SGLang Triton baseline (issue 9)

    add_triton_parser(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)

