"""`gdn-fuzz run`: a budgeted fuzz campaign against a target (gdn_fuzz.engine.campaign)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.cli.common import EXIT_KNOWN_ONLY, EXIT_OK, EXIT_USAGE, UsageError, console, parse_arms, target_device_arms
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.campaign import (DEFAULT_SHRINK_GRACE_S, defer_conflict, defer_default, parse_defer,
                                     parse_pipeline)
from gdn_fuzz.engine.fleet import DEFAULT_RESTARTS, NARROW_COLUMNS, plan
from gdn_fuzz.engine import mps
from gdn_fuzz.engine.isolation import SetupError
from gdn_fuzz.engine.multigpu import auto_processes, parse_processes, run_on_gpus, run_processes
from gdn_fuzz.engine.raycluster import run_on_ray
from gdn_fuzz.engine.reproducer import explain
from gdn_fuzz.engine.worker import campaign_groups, campaign_record, exit_status, make_campaign
from gdn_fuzz.environment import default_torch_threads
from gdn_fuzz.findings import groups_line
from gdn_fuzz.properties import REGISTRY, for_kernel
from gdn_fuzz.strategies import POOL_SCALES
from gdn_fuzz.targets import kernel_of, releases


def validate_run_args(args) -> None:
    """Every option of `gdn-fuzz run` checked before any work (UsageError, one line)."""
    if args.seconds is not None and not (args.seconds > 0):
        raise UsageError(f"--seconds={args.seconds:g}: give a positive number of seconds")
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples={args.examples}: give at least 1")
    if getattr(args, "release", None) and args.release not in releases.RELEASES:
        raise UsageError(f"--release={args.release!r}: no model for it; use one of {', '.join(releases.RELEASES)}")
    if args.launch_timeout is not None and not (args.launch_timeout > 0):
        raise UsageError(f"--launch-timeout={args.launch_timeout:g}: give a positive number of seconds")
    if args.torch_threads is not None and args.torch_threads < 1:
        raise UsageError(f"--torch-threads={args.torch_threads}: give at least 1")
    if args.seeds_per_example < 1:
        raise UsageError(f"--seeds-per-example={args.seeds_per_example}: give at least 1 (1: one seed per structure; "
                         "default $GDN_FUZZ_SEEDS_PER_EXAMPLE)")
    try:
        parse_processes(getattr(args, "processes", "auto"))
        pipeline = parse_pipeline(getattr(args, "pipeline", None))
        defer = parse_defer(getattr(args, "defer_verdicts", None))
        isolate = not getattr(args, "no_isolate", False)
        if defer is None:
            defer = defer_default(isolate)  # $GDN_FUZZ_DEFER_VERDICTS, checked here
        args.mps = mps.parse_mps(getattr(args, "mps", "auto"))  # normalized once: "auto" | "on" | "off"
    except ValueError as e:
        raise UsageError(str(e)) from None
    why = defer_conflict(defer, isolate, pipeline)
    if why:
        raise UsageError(why)
    if args.restarts < 0:
        raise UsageError(f"--restarts={args.restarts}: give a whole number >= 0 (restarts of one lost worker)")
    if args.ray is not None and args.gpus:
        raise UsageError(f"--ray {args.ray} with --gpus {args.gpus}: choose one (Ray places one worker per GPU of the "
                         "cluster itself; --gpus is this host's GPUs without Ray)")
    if args.ray is not None and args.mps == "on":
        raise UsageError(f"--mps on with --ray {args.ray}: the MPS daemon is started for campaign processes of this "
                         "host (--processes N, --gpus), not for Ray's actors; drop --mps on or --ray")
    if args.ray is not None and not args.ray.strip():
        raise UsageError("--ray '': give auto (the running cluster), local (a new one on this host) or an address "
                         "(HOST:PORT or ray://HOST:10001)")
    if args.round_examples < 1:
        raise UsageError(f"--round-examples={args.round_examples}: give at least 1")
    # the switches a campaign's processes read from the environment: a bad value is a usage error here, not an
    # exception inside every check (GDN_FUZZ_GRAPHS=bogus was a 'launch raised' finding against the target)
    from gdn_fuzz import fused_oracle, graphs
    from gdn_fuzz.engine.campaign import confirmations_default, defer_depth_default, spare_worker_default
    from gdn_fuzz.engine.isolation import draw_ahead_default

    for read in (graphs.choice, fused_oracle.choice, lambda: spare_worker_default("cpu"),
                 lambda: confirmations_default("cpu", None), lambda: draw_ahead_default("cpu"), defer_depth_default):
        try:
            read()
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not 0 <= getattr(args, "shrink_grace", 0.0) < float("inf"):
        raise UsageError(f"--shrink-grace={args.shrink_grace}: give a number of seconds >= 0 (0: no grace)")
    for b in args.buckets or ():
        if b < 1 or b & (b - 1) or b > 1024:
            raise UsageError(f"--buckets {b}: batch buckets are powers of two in [1, 1024] (e.g. 4 8)")
    if args.arms:
        try:
            parse_arms(args.arms)
        except ValueError as e:
            raise UsageError(f"--arms {' '.join(args.arms)}: {e}") from None
    if args.property:
        try:
            kernel = kernel_of(args.target) if getattr(args, "target", None) else None
        except ValueError:
            kernel = None  # an unknown target: reported where the target is resolved
        for p in args.property:
            if p not in REGISTRY:
                raise UsageError(f"--property {p}: unknown; use one of {', '.join(REGISTRY)}")
            if kernel is not None and REGISTRY[p].kernel != kernel:
                raise UsageError(f"--property {p} checks the {REGISTRY[p].kernel} kernel and --target {args.target} is "
                                 f"a {kernel} target; use one of {', '.join(for_kernel(kernel))}")


def cmd_run(args) -> int:
    try:
        validate_run_args(args)
    except UsageError as e:
        console.print(f"[red]gdn-fuzz run:[/red] {e}", markup=True)
        return EXIT_USAGE
    if getattr(args, "release", None):
        # the release model of targets that are no released file, for this run and its worker processes
        os.environ[releases.RELEASE_ENV] = args.release
    if args.ray is not None:
        return run_on_ray(args, None if args.no_corpus else str(args.corpus or corpus.default_dir()), console)
    if args.gpus:
        try:
            return run_on_gpus(args, None if args.no_corpus else str(args.corpus or corpus.default_dir()), console)
        except (ValueError, mps.MpsError) as e:
            console.print(f"[red]{e}[/red]")
            return EXIT_USAGE
    got = target_device_arms(args)
    if got is None:
        return EXIT_USAGE
    target, device, arms = got
    n = parse_processes(getattr(args, "processes", "auto")) or auto_processes(device)
    if n > 1:  # several campaign processes on this device (gdn_fuzz.engine.multigpu); 1: this process runs it
        try:
            return run_processes(args, None if args.no_corpus else str(args.corpus or corpus.default_dir()), console,
                                 device=device, per_device=n)
        except mps.MpsError as e:  # --mps on where no daemon can be started
            console.print(f"[red]{e}[/red]")
            return EXIT_USAGE
    if args.mps == "on":  # one process: nothing to share, no daemon
        console.print(f"[red]--mps on: {mps.why_not(device, 1)}; run --processes N (N > 1) or drop --mps on[/red]")
        return EXIT_USAGE
    try:
        for a in arms:
            target.module(a)  # import every arm up front: a module that does not fit fails here, clearly
    except Exception as e:  # noqa: BLE001 - a target that cannot be imported is a setup error
        console.print(f"[red]target {target} cannot be loaded:[/red] {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", markup=True)
        return EXIT_USAGE
    corpus_dir = None if args.no_corpus else (args.corpus or corpus.default_dir())
    if corpus_dir is not None:
        corpus.clean_stale_temps(corpus_dir)
    known = {} if corpus_dir is None else corpus.known_signatures(target.name, corpus_dir)
    if args.torch_threads is None and str(device).split(":")[0] == "cpu":
        # one campaign process on a CPU: torch's threads on the cores other processes leave free (measured:
        # environment.default_torch_threads); --torch-threads or $GDN_FUZZ_TORCH_THREADS sets them
        got = default_torch_threads()
        if got is not None:
            args.torch_threads = got[0]
            console.print(f"torch threads: {got[0]} ({got[1]}; --torch-threads N to set)", markup=False)
    spec = plan(args, target_name=target.name, device=device, labels=["main"], known=known)[0]  # one worker: all
    camp, pool_note = make_campaign(spec, target, corpus_dir=corpus_dir, record=args.record)
    props = camp.properties
    seconds = args.seconds if args.seconds is not None else (None if args.examples else 60.0)
    # A Ctrl-C outside Campaign.run (which turns one into a clean stop): at start-up, in the warm-up or
    # between them.  It ends the run as an interrupted campaign (summary, record, exit 130), as one
    # inside run() does; before, it escaped as a traceback with no record (a --processes parent then
    # listed the child as failed: seen in CI under load, tests/test_multigpu.py).
    try:
        console.print(f"gdn-fuzz run: target={target} ({target.path}) device={device} arms={','.join(arms)} "
                      f"T={args.T} properties={','.join(p.name for p in props)} seed={args.seed} "
                      f"budget={'%gs' % seconds if seconds else ''}{' %d examples' % args.examples if args.examples else ''}"
                      f"; {len(known)} known bug signature(s) of this target in the corpus", markup=False)
        if pool_note:
            console.print(pool_note, markup=False)
        for why in ([] if corpus_dir is None else corpus.unreadable(corpus_dir)):  # left out of the known bugs
            console.print(f"corpus: skipped (its known bug, if any, is not counted): {why}", markup=False,
                          soft_wrap=True)
        with Progress(TextColumn("[bold]fuzzing"), BarColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), console=console, transient=not console.is_terminal) as progress:
            task = progress.add_task("", total=seconds or args.examples)

            def words():
                s = camp.stats
                return (f"examples {s.examples}  launches {s.launches}  new {len(camp.findings)}  "
                        f"known {sum(camp.known_hits.values())}  compiles {s.compiles}  {s.rate:.1f} ex/s")

            def tick():
                s = camp.stats
                progress.update(task, completed=(s.elapsed if seconds else s.examples), description=words())

            # not a terminal (a pipe, a CI log): rich draws no live bar, so a plain line every PROGRESS_EVERY_S,
            # from a timer thread (an example that compiles for 30 s must not silence it)
            stop_lines = threading.Event()

            def lines():
                of = f"/{seconds:g}s" if seconds else f"/{args.examples} examples"
                while not stop_lines.wait(PROGRESS_EVERY_S):
                    progress.console.print(f"progress: {camp.stats.elapsed:.0f}s{of}  {words()}", markup=False,
                                           highlight=False)

            if not console.is_terminal:
                threading.Thread(target=lines, name="gdn-fuzz-progress", daemon=True).start()

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
                                               check=lambda c: camp.check_aside(f.prop, c)), markup=False)
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
            finally:
                stop_lines.set()
            tick()
    except KeyboardInterrupt:
        camp.interrupted = True
        camp.close()
    s = camp.stats
    narrow = console.width < NARROW_COLUMNS  # an 80-column terminal: tables that fit it
    fields = (("target", str(target)), ("device", device), ("examples", str(s.examples)),
              ("structures", str(s.structures)), ("launches", str(s.launches)), ("rounds", str(s.rounds)),
              ("JIT compiles", str(s.compiles)), ("new findings", str(len(camp.findings))),
              ("known bugs seen", str(len(camp.known_hits))), ("time", f"{s.elapsed:.1f}s"),
              ("examples/s", f"{s.rate:.1f}"),
              ("warm-up", f"{s.warmup_s:.1f}s, {s.warmup_compiles} compiles" if args.warm_up else "-"))
    t = Table(title="gdn-fuzz summary")
    if narrow:  # one row per field
        t.add_column("")
        t.add_column("", overflow="fold")
        for k, v in fields:
            t.add_row(k, v)
    else:
        for k, _ in fields:
            t.add_column(k)
        t.add_row(*(v for _, v in fields))
    console.print(t)
    if s.grace_s > 0:
        console.print(f"shrinking ran {s.grace_s:.1f}s past the budget (--shrink-grace {camp.shrink_grace_s:g}s)",
                      markup=False)
    if s.confirm_wait_s >= 0.05:
        console.print(f"the rounds' ends waited {s.confirm_wait_s:.1f}s for fresh-process confirmations of their "
                      "failures", markup=False)
    pt = Table(title="examples per property (rounds interleave the properties; sizes double from 1 to "
                     f"{args.round_examples})")
    for col in ("property", "examples", "first example at", "seconds"):
        pt.add_column(col)
    for p in props:
        pp = s.per_property.get(p.name)
        if pp is None:
            pt.add_row(p.name, "0", "never", "0.0")
        else:
            pt.add_row(p.name, str(pp["examples"]), f"{pp['first_s']:.1f}s (example {pp['first_example'] + 1})",
                       f"{pp['seconds']:.1f}")
    console.print(pt)
    groups = campaign_groups(camp)
    if camp.findings or camp.known_hits:
        ft = Table(title="findings by signature (bug: symptoms that share a shrunk launch)")
        cols = ("bug", "signature", "status", "first at", "examples before", "shrunk", "corpus entry")
        keep = (0, 1, 2, 5, 6) if narrow else range(len(cols))  # narrow: when and after how many examples go
        for i in keep:
            ft.add_column(cols[i], overflow="fold")
        for n, g in enumerate(groups, 1):
            for sig in g["symptoms"]:
                f = camp.findings[sig]
                row = (str(n), f.signature, "[red]new[/red]", f"{f.first_t:.1f}s", str(f.first_examples),
                       f"{f.shrink_s:.1f}s" if f.shrunk else "stopped early",
                       "-" if f.entry_path is None else os.path.basename(str(f.entry_path)))
                ft.add_row(*(row[i] for i in keep))
        for k in camp.known_summary():
            row = ("-", k["signature"], f"known ({k['examples']} examples)", "-", "-", "-", k["corpus_entry"] or "-")
            ft.add_row(*(row[i] for i in keep))
        console.print(ft)
    unwritten = [f for f in camp.findings.values() if f.entry_path is None and f.entry_note]
    if unwritten:  # a read-only corpus or checkout: say so once, with where the cases are
        why = unwritten[0].entry_note.split("; new entry")[0]
        console.print(f"corpus: {why}: {len(unwritten)} new entr{'y' if len(unwritten) == 1 else 'ies'} not written "
                      "(each case is printed above" + (f" and in {args.json}" if args.json else "; --json FILE keeps them")
                      + ")", markup=False, soft_wrap=True)
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
        rec = campaign_record(camp, spec, target, seconds, groups)
        rec["command"] = shlex.join(["gdn-fuzz", *sys.argv[1:]])
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)
    if groups:
        console.print("new: " + groups_line(groups), markup=False)  # wrapped to the console width
    return exit_status(camp, args.fail_on_known)


PROGRESS_EVERY_S = 10.0  # a plain progress line at most this often when the output is not a terminal


def add_parser(sub) -> None:
    r = sub.add_parser("run", help=help_of("run"))
    r.add_argument("--target", help="reference | production | production@VERSION | sm100 | mutant:NAME | PATH.py "
                   "(default: production on an SM90+ GPU, else reference)")
    r.add_argument("--kernel-module", dest="target", help="alias of --target PATH.py")
    r.add_argument("--release", help="release model (" + ", ".join(releases.RELEASES) + ") of a target that is no "
                   "released file: your kernel, an edited or newer FlashInfer (default: detected; "
                   "gdn_fuzz.targets.releases)")
    r.add_argument("--arms", nargs="+", help=f"dtype arms (default: all of {', '.join(ARM_NAMES)})")
    r.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    r.add_argument("--pool-scales", nargs="+", choices=[*POOL_SCALES, "none"],
                   help="kinds of the pool-scale regime the launch property draws one example in 8: pools of "
                        "thousands of slots, and pools past 2^31 elements with a row on a slot whose element "
                        "offset is >= 2^31 (int32); 'none' for neither.  Default: both, 'int32' left out (with "
                        "the reason printed) on a GPU without the memory for three copies")
    r.add_argument("--buckets", nargs="+", type=int,
                   help="power-of-two batch sizes (pad rows fill them); default 4 8 on a GPU target, 4 8 16 64 "
                        "on a CPU target.  Buckets above 8 are the batch-scale regime, drawn one example in 8 "
                        "(e.g. --buckets 4 8 16 32 64 128 256: each one more JIT compile per arm, T and geometry)")
    r.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    r.add_argument("--seconds", type=float, help="time budget (default 60 unless --examples is given)")
    r.add_argument("--examples", type=int, help="example budget")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--property", action="append", help="property to run (repeatable; default: all)")
    r.add_argument("--round-examples", type=int, default=25, help="examples per Hypothesis round")
    r.add_argument("--shrink-grace", type=float, default=DEFAULT_SHRINK_GRACE_S, metavar="S",
                   help="when the budget ends while a new finding is being shrunk, shrink it for up to S seconds more "
                        f"(no new round starts; default {DEFAULT_SHRINK_GRACE_S:g}; 0: stop with the budget and "
                        "keep the best case so far)"),
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
    r.add_argument("--draws", choices=("auto", "cpu", "device"), default="auto",
                   help="how drawn Cases make their values (Case.draws): auto (default) and device: with torch's "
                        "CUDA generator on a CUDA device, by one program a CUDA graph replays (draws='graph': no CPU "
                        "draw or large copy; such a case replays on a CUDA device only), else the CPU generator; "
                        "cpu: always the CPU generator (the same bits on every device)")
    r.add_argument("--torch-threads", type=int, default=int(os.environ["GDN_FUZZ_TORCH_THREADS"])
                   if os.environ.get("GDN_FUZZ_TORCH_THREADS") else None,
                   help="torch intra-op threads of the process that runs the checks (the isolated worker, or this "
                        "process with --no-isolate); default $GDN_FUZZ_TORCH_THREADS, else on a CPU device the cores "
                        "that other processes leave free (measured at the start; at least 1), on a GPU torch's own. "
                        "Several campaign processes (--processes) get cores / processes each")
    r.add_argument("--seeds-per-example", type=int, default=os.environ.get("GDN_FUZZ_SEEDS_PER_EXAMPLE") or 1,
                   help="value seeds checked per drawn structure (the drawn seed, then seeds derived from it; each one "
                        "checked launch; a failing one is shrunk and stored with its own seed); default "
                        "$GDN_FUZZ_SEEDS_PER_EXAMPLE, else 1")
    r.add_argument("--pipeline", default=os.environ.get("GDN_FUZZ_PIPELINE") or "auto", metavar="N|auto",
                   help="Hypothesis rounds each campaign process runs at once, on threads, so that one round draws its "
                        "next example while another's case is checked (the checks stay one at a time); auto (default; "
                        "$GDN_FUZZ_PIPELINE sets another): 2 for an isolated campaign on a CUDA device, else 1 (one "
                        "round after another: a seed's sequence of checks is deterministic)")
    r.add_argument("--defer-verdicts", default=None, choices=("on", "off"),
                   help="isolated campaigns: send each case to the worker without waiting for its verdict, which is "
                        "read one example later, so that Hypothesis draws the next case while the worker checks this "
                        "one; a failure found so is shrunk by running its round again (the same cases, their verdicts "
                        "remembered, not checked again).  Default $GDN_FUZZ_DEFER_VERDICTS, else off; on runs one "
                        "round at a time (--pipeline auto becomes 1)")
    r.add_argument("--fail-on-known", action="store_true",
                   help=f"exit {EXIT_KNOWN_ONLY} when the only findings are known bugs (open corpus entries of this "
                        f"target); by default they are listed and the exit code is {EXIT_OK}")
    r.add_argument("--gpus", help="campaign processes on these GPUs, --processes per GPU: '0,1' or 'all' "
                                  "(CUDA_VISIBLE_DEVICES per GPU, seed + worker index, one shared corpus; --json gets "
                                  "the merged record)")
    r.add_argument("--processes", default=os.environ.get("GDN_FUZZ_PROCESSES") or "auto", metavar="N|auto",
                   help="campaign processes per device (each GPU of --gpus, else the run's device), each with its own "
                        "seed and cores / processes torch threads, one shared corpus, one summary; auto (default; "
                        "$GDN_FUZZ_PROCESSES sets another): 1 on a CPU device, on CUDA min(8, cores per GPU // 2) "
                        "(the campaign is bound by host CPU); 1 without --gpus: this process alone")
    r.add_argument("--mps", default=os.environ.get(mps.MPS_ENV) or "auto", metavar="auto|on|off",
                   help="several campaign processes on a GPU: their crash-isolation workers share one CUDA context "
                        "through a private NVIDIA MPS daemon per GPU, started for the run and stopped after it (the "
                        "GPU's settings untouched); a crash or hang seen under MPS is checked again in a process of its "
                        "own context before it counts, and that worker leaves MPS.  auto (default; $GDN_FUZZ_MPS sets "
                        "another): when nvidia-cuda-mps-control is on PATH and no MPS daemon of yours is configured; "
                        "on: or stop with the reason; off: never")
    r.add_argument("--ray", metavar="auto|local|ADDRESS",
                   help="run the campaign on a Ray cluster (pip install 'gdn-fuzz[cluster]'): one worker actor per GPU "
                        "of the cluster (--processes N: N per GPU), CPU actors for a CPU device (--processes N in all; "
                        "auto: the cluster's CPUs // 2); this process is the driver and the one corpus writer. auto: "
                        "the running cluster ($RAY_ADDRESS or one started with `ray start`); local: a new cluster on "
                        "this host for this run; or HOST:PORT / ray://HOST:10001.  docs/fleet.md")
    r.add_argument("--restarts", type=int, default=DEFAULT_RESTARTS,
                   help="several workers (--processes N > 1, --gpus, --ray): restarts of a worker that dies (its "
                        "in-flight case is recorded and checked again first), each with the budget it had left; "
                        f"default {DEFAULT_RESTARTS}")
    r.set_defaults(func=cmd_run)
