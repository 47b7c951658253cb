"""Checked launches per second, and the framework's overhead over the bare launch.

Three modes (issues 10 and 17).

Per-shape table (default).  For each arm, T and batch size B (all rows real, permuted
slots, cursors drawn legal), on one geometry, after a warm-up launch per shape (JIT
compiles are paid there and reported apart):

  bare         target.launch on ready inputs (the wrapper + kernel; inputs cloned outside
               the timed region), synchronized
  materialize  the Case's tensors from its seed (gdn_fuzz.case.materialize)
  oracle       the float64 launch expectation alone (gdn_fuzz.checks.expectation)
  check        what check_launch does after the launch (gdn_fuzz.checks.check_observed): for a
               passing launch, checks.verdict (the fused oracle with the comparison in its kernel,
               the metrics, the write-set flags), replayed as a CUDA graph per gdn_fuzz.graphs
               (--graphs), and its one transfer to the host
  checked      the whole per-example pipeline: materialize from the seed, snapshot, launch,
               oracle, tolerance and write-set checks (gdn_fuzz.checks.check_launch)

overhead = checked / bare.  --graphs both: each shape measured with GDN_FUZZ_GRAPHS=off and auto
(one row each; the graph's capture is paid before the timing).  Prints a table and writes JSON (rewritten after every row, so
a run cut short keeps what it measured).

Campaign throughput (--campaign SECONDS).  A gdn_fuzz.engine.campaign.Campaign of the `launch`
property (Hypothesis-drawn Cases from strategies/_cases.py, every arm, T in {4, 8}, the
target's default fuzz geometries and buckets, no crash isolation, no corpus) first runs
warm_up() -- one launch per (arm, T, geometry, bucket), every JIT compile paid there --
then fuzzes for SECONDS: checked launches in SECONDS of campaign time, compiles during the
measured time reported apart from the warm-up's.

The product command (--product SECONDS [--processes 1 4]).  For each process count N, N
`gdn-fuzz run --target T --warm-up --seconds SECONDS --property launch --no-corpus --json ...`
processes at once (crash isolation on, --torch-threads = cores / N each, seeds 0..N-1; --pool-scales and
--record-dir DIR pass `--pool-scales` and `--record DIR/nN-pI.jsonl` on, --pipeline `--pipeline`,
--seeds-per-example `--seeds-per-example`): checked
launches in total, per process, warm-up, the ratio to the first process count's total and to the
anchor (the kernel authors' suite: 50 checked launches in 28.7 s on an H200, 52 per 30 s).
--fleet runs the command itself instead: one `gdn-fuzz run --processes N` (its fleet of N campaign
processes and their one driver, `--mps` as given by --mps, default the command's own auto), read from the
merged record's workers (with --record-dir: nN.json and each worker's nN.<worker>.json there, and the
per-example records nN.jsonl.<worker>).

--draws device   Cases draw their bulk tensors (pool, rings, history) on the device
                 (Case.draws "graph" on a CUDA device: every value, by the draw program a CUDA
                 graph replays; the legacy "device" on a CPU); the default "cpu" draws
                 everything on the CPU generator.  --draws cuda / graph: that mode (A/B)
                 (device-independent bits, but a large geometry's pool is a big CPU draw).
--oracle auto|spec|fused|both
                 which float64 oracle checks.expectation uses (GDN_FUZZ_ORACLE, set for the
                 run): auto (default: the fused Triton oracle on a CUDA device where triton
                 imports, else the spec), spec (oracles.ring.launch), fused
                 (gdn_fuzz.fused_oracle), both (table mode only: every shape measured with
                 each, one row per oracle, and the fused rows report `fused_vs_spec`, the
                 largest |fused - spec| / magnitude over y, u and the fold of that shape).
                 The JIT compile of the fused kernel is paid in a warm-up call per shape
                 and oracle (`oracle_warmup_s`), outside the timed region.
--profile [cprofile|torch]
                 after the measurement, one more pass under the profiler (one checked
                 launch per shape, or --profile-seconds of campaign) and print where the
                 time goes: cProfile's top entries by own and cumulative time, or
                 torch.profiler's operator table (CPU and CUDA time).  phases (table mode): each
                 part of one checked launch per shape profiled apart (the draw: materialize and
                 the "before" copy; the launch; the check): its GPU time and its top kernels.

    python benchmarks/throughput.py --target reference --device cpu --H 1 --HV 2 --json out.json
    python benchmarks/throughput.py --target production --device cuda --H 16 --HV 64 --draws device
    python benchmarks/throughput.py --target production --device cuda --H 16 --HV 64 --draws device \
        --B 8 64 256 --T 4 8 --arms bf16 --oracle both --json oracle-both.json
    python benchmarks/throughput.py --target production --device cuda --campaign 30 --draws device
    python benchmarks/throughput.py --target production --device cuda --product 30 --processes 1 4
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import time
from pathlib import Path

import torch

from gdn_fuzz import checks, fused_oracle, graphs
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.checks import check_launch, expectation
from gdn_fuzz.observation import clone_inputs, drawn, observe
from gdn_fuzz.targets import get_target


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _case(arm, T, B, H, HV, seed, draws="cpu"):
    rng = random.Random(seed)
    slots = list(range(B))
    rng.shuffle(slots)
    rows = tuple(Row(s, rng.randint(0, 16), rng.randint(0, 31)) for s in slots)
    return Case(arm=arm, T=T, H=H, HV=HV, pool=B, rows=rows, seed=seed, draws=draws)


def _time(fn, reps, device):
    out = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _use_oracle(name):
    """Select the oracle of checks.expectation for what follows (GDN_FUZZ_ORACLE)."""
    os.environ[fused_oracle.ENV] = name


def _oracle_used(device) -> str:
    """Which oracle checks.expectation runs now on `device`: spec or fused."""
    return "fused" if fused_oracle.oracle_for(torch.device(device)) is fused_oracle.launch else "spec"


def _fused_vs_spec(fused, spec) -> float:
    """max |fused - spec| / magnitude over y, u and the fold (non-finite where either is)."""
    worst = 0.0
    for name, mag in (("y", "y_mag"), ("u_app", "u_mag"), ("fold", "fold_mag")):
        f, s, m = getattr(fused, name), getattr(spec, name), getattr(spec, mag)
        if not bool(torch.equal(torch.isnan(f), torch.isnan(s))):
            return float("inf")
        fin = torch.isfinite(s)
        if bool(fin.any()):
            worst = max(worst, ((f - s).abs()[fin] / m[fin].clamp_min(1e-300)).max().item())
    return worst


def bench(target, arm, T, B, H, HV, device, reps, draws="cpu", oracles=("auto",), graph_modes=("auto",)):
    """One shape: bare and materialize once, then oracle, check and checked per oracle and graphs mode (one row
    each)."""
    case = _case(arm, T, B, H, HV, seed=B * 10 + T, draws=draws)
    compiles0 = target.compile_count(arm)
    t0 = time.perf_counter()
    observe(target, case, device)  # warm-up: JIT for this (arm, T, bucket, geometry)
    _sync(device)
    warm = time.perf_counter() - t0
    base = materialize(case, device)
    clones = [clone_inputs(base) for _ in range(reps)]
    it = iter(clones)
    bare = _time(lambda: target.launch(arm, **next(it)), reps, device)
    del clones, it
    mat = _time(lambda: materialize(case, device), reps, device)
    obs = observe(target, case, device)
    rows, spec_e = [], None
    for name in oracles:
        _use_oracle(name)
        t0 = time.perf_counter()
        e = expectation(obs)  # warm-up: the fused kernel's JIT compile for this shape is paid here
        _sync(device)
        oracle_warm = time.perf_counter() - t0
        used = _oracle_used(device)
        agree = None
        if len(oracles) > 1:
            if used == "spec":
                spec_e = e
            elif spec_e is not None:
                agree = _fused_vs_spec(e, spec_e)
        del e
        oracle = _time(lambda: expectation(obs), reps, device)
        for gmode in graph_modes:
            os.environ[graphs.ENV] = gmode
            graphs.reset()
            for _ in range(graphs.CAPTURE_AT + 1):  # the capture (and the measure variant's JIT) outside the timing
                checks.check_observed(obs)
            check = _time(lambda: checks.check_observed(obs), reps, device)
            checked = _time(lambda: check_launch(target, case, device), reps, device)
            gs = graphs.stats()
            rows.append(dict(arm=arm, T=T, B=B, H=H, HV=HV, draws=draws, oracle=used, graphs=gmode, warmup_s=warm,
                             compiles=target.compile_count(arm) - compiles0, oracle_warmup_s=oracle_warm,
                             bare_ms=bare * 1e3, materialize_ms=mat * 1e3, oracle_ms=oracle * 1e3,
                             check_ms=check * 1e3, checked_ms=checked * 1e3, checked_per_s=1.0 / checked,
                             overhead=checked / bare, fused_vs_spec=agree, graph_stats=gs.as_dict()))
    del obs, spec_e
    return rows


class _Profiler:
    """cProfile or torch.profiler around a block; report() prints the top entries."""

    def __init__(self, kind, device, top=30):
        self.kind, self.device, self.top = kind, device, top

    def __enter__(self):
        if self.kind == "torch":
            acts = [torch.profiler.ProfilerActivity.CPU]
            if str(self.device).startswith("cuda"):
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.p = torch.profiler.profile(activities=acts)
            self.p.__enter__()
        else:
            self.p = cProfile.Profile()
            self.p.enable()
        return self

    def __exit__(self, *exc):
        if self.kind == "torch":
            _sync(self.device)
            self.p.__exit__(*exc)
        else:
            self.p.disable()

    def report(self) -> str:
        if self.kind == "torch":
            ka = self.p.key_averages()
            cuda = str(self.device).startswith("cuda")
            out = [ka.table(sort_by="self_cpu_time_total", row_limit=self.top)]
            if cuda:
                out.append(ka.table(sort_by="self_cuda_time_total", row_limit=self.top))
            return "\n".join(out)
        buf = io.StringIO()
        st = pstats.Stats(self.p, stream=buf).strip_dirs()
        buf.write("---- cProfile: top by own time\n")
        st.sort_stats("tottime").print_stats(self.top)
        buf.write("---- cProfile: top by cumulative time\n")
        st.sort_stats("cumulative").print_stats(self.top)
        return buf.getvalue()


PHASE_TOP = 12


def profile_phases(target, case, device, top=PHASE_TOP) -> str:
    """torch.profiler over each part of one checked launch of `case` apart (the draw: materialize and the "before"
    copy; the launch; check_observed), after unprofiled checked launches of it up to its graphs' capture: per part
    its GPU time (the kernels' and copies' own time) and host time, and its top kernels by GPU time.  The parts are
    the functions check_launch runs, called here one after another as it calls them (observation.drawn, then
    observe(ready=...), which is observe less its draw: the launch stays one from its Case, so its verdict is the
    replayed graph, as in check_launch)."""
    for _ in range(graphs.CAPTURE_AT + 1):  # the compiles and the graphs' captures for this shape, outside the profile
        check_launch(target, case, device)
    _sync(device)
    lines = [f"==== phases: {case.arm} T={case.T} B={case.B} H={case.H} HV={case.HV} draws={case.draws}"]
    state = {}
    parts = (("draw (materialize, before)", lambda: state.update(ready=drawn(case, device))),
             ("launch", lambda: state.update(obs=observe(target, case, device, ready=state["ready"]))),
             ("check", lambda: checks.check_observed(state["obs"])))
    for name, fn in parts:
        with _Profiler("torch", device) as prof:
            t0 = time.perf_counter()
            fn()
            _sync(device)
            host = time.perf_counter() - t0
        # the device's own events (kernels, copies); a CPU op's device time is theirs again (torch's table sums the same)
        evs = [e for e in prof.p.key_averages()
               if e.device_type != torch.autograd.DeviceType.CPU and e.self_device_time_total > 0]
        gpu = sum(e.self_device_time_total for e in evs)
        lines.append(f"-- {name}: wall {host * 1e3:.3f} ms (under the profiler), GPU {gpu / 1e3:.3f} ms in "
                     f"{sum(e.count for e in evs)} kernels and copies")
        for e in sorted(evs, key=lambda e: -e.self_device_time_total)[:top]:
            lines.append(f"   {e.self_device_time_total / 1e3:8.3f} ms {e.count:4d}x  {e.key[:110]}")
    return "\n".join(lines)


def _meta(args, target):
    return dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), target=str(target), device=args.device,
                torch=torch.__version__, python=platform.python_version(), host_threads=torch.get_num_threads(),
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, reps=args.reps,
                draws=args.draws, oracle=args.oracle, triton=_triton_version(),
                triton_interpret=os.environ.get("TRITON_INTERPRET"))


def _triton_version():
    triton, _ = fused_oracle._triton()
    return getattr(triton, "__version__", None)


def run_table(args, target):
    rows = []
    oracles = ("spec", "fused") if args.oracle == "both" else (args.oracle,)
    graph_modes = ("off", "auto") if args.graphs == "both" else (args.graphs,)
    print(f"{'arm':20s} {'T':>2s} {'B':>4s} {'oracle':>6s} {'graphs':>6s} {'bare ms':>9s} {'mat. ms':>9s} "
          f"{'oracle ms':>10s} {'check ms':>9s} {'checked ms':>11s} {'checked/s':>10s} {'overhead':>9s} "
          f"{'warm-up s':>9s} {'JIT':>3s} {'vs spec':>8s}")
    t_start = time.monotonic()
    for arm in args.arms:
        for T in args.T:
            for B in args.B:
                if args.max_seconds and time.monotonic() - t_start > args.max_seconds:
                    print(f"(stopped: --max-seconds {args.max_seconds} spent)")
                    return rows
                for r in bench(target, arm, T, B, args.H, args.HV, args.device, args.reps, args.draws, oracles,
                               graph_modes):
                    rows.append(r)
                    agree = "" if r["fused_vs_spec"] is None else f"{r['fused_vs_spec']:8.1e}"
                    print(f"{arm:20s} {T:2d} {B:4d} {r['oracle']:>6s} {r['graphs']:>6s} {r['bare_ms']:9.2f} "
                          f"{r['materialize_ms']:9.2f} {r['oracle_ms']:10.2f} {r['check_ms']:9.2f} "
                          f"{r['checked_ms']:11.2f} {r['checked_per_s']:10.1f} {r['overhead']:8.1f}x "
                          f"{r['warmup_s']:9.2f} {r['compiles']:3d} {agree:>8s}", flush=True)
                if args.json:
                    with open(args.json, "w") as fh:
                        json.dump(dict(meta=_meta(args, target), rows=rows), fh, indent=1)
    if args.profile == "phases":
        for arm in args.arms:
            for T in args.T:
                for B in args.B:
                    print(profile_phases(target, _case(arm, T, B, args.H, args.HV, seed=B * 10 + T + 1,
                                                       draws=args.draws), args.device))
    elif args.profile:
        with _Profiler(args.profile, args.device) as prof:
            for arm in args.arms:
                for T in args.T:
                    for B in args.B:
                        check_launch(target, _case(arm, T, B, args.H, args.HV, seed=B * 10 + T + 1, draws=args.draws),
                                     args.device)
        print(f"==== profile: one checked launch per shape ({args.profile})")
        print(prof.report())
    return rows


def run_campaign(args, target):
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import BUCKETS, geometries_for

    geoms = geometries_for(target) if not args.geometries else tuple(
        tuple(int(x) for x in g.split("x")) for g in args.geometries)
    buckets = tuple(args.buckets or BUCKETS)

    def make(seed, draws=args.draws):
        return Campaign(target=target, device=args.device, properties=[get_property("launch")], arms=tuple(args.arms),
                        Ts=tuple(args.T), geometries=geoms, buckets=buckets, seed=seed, isolate=False,
                        corpus_dir=None, draws=draws)

    camp = make(args.seed)
    print(f"campaign: target={target} device={args.device} arms={','.join(args.arms)} T={args.T} "
          f"geometries={geoms} buckets={buckets} draws={args.draws}", flush=True)
    camp.warm_up()
    s = camp.stats
    print(f"warm-up: {s.warmup_s:.1f}s, {s.warmup_compiles} JIT compiles "
          f"({len(args.arms) * len(args.T) * len(geoms) * len(buckets)} shapes)", flush=True)
    if args.json:  # kept if the measured run is cut short
        with open(args.json, "w") as fh:
            json.dump(dict(meta=_meta(args, target), warmup_s=s.warmup_s, warmup_compiles=s.warmup_compiles), fh)
    camp.run(seconds=args.campaign)
    _sync(args.device)
    rec = dict(meta=_meta(args, target), geometries=[list(g) for g in geoms], buckets=list(buckets),
               seconds=s.elapsed, examples=s.examples, launches=s.launches, launches_per_s=s.launches / s.elapsed,
               rounds=s.rounds, compiles_measured=s.compiles, warmup_s=s.warmup_s,
               warmup_compiles=s.warmup_compiles, graphs=graphs.stats().as_dict(),
               draw_graphs=graphs.draw_stats().as_dict(),
               findings=[str(f) for cf in camp.findings.values() for f in cf.findings])
    print(f"campaign: {s.launches} checked launches in {s.elapsed:.1f}s of campaign time "
          f"({rec['launches_per_s']:.1f}/s; {s.launches * 30 / s.elapsed:.0f} per 30 s), {s.rounds} rounds, "
          f"{s.compiles} JIT compiles during the measured time, {len(camp.findings)} distinct findings; "
          f"graphs: {rec['graphs']}", flush=True)
    for f in rec["findings"]:
        print("  finding:", f)
    if args.compare_draws:  # same process: every shape is compiled already
        other = "cpu" if args.draws != "cpu" else ("cuda" if torch.device(args.device).type == "cuda" else "device")
        c2 = make(args.seed + 2, other)
        c2.stats.started = time.monotonic()
        c2.run(seconds=args.compare_draws)
        s2 = c2.stats
        rec["compare"] = dict(draws=other, seconds=s2.elapsed, launches=s2.launches,
                              launches_per_s=s2.launches / s2.elapsed, compiles_measured=s2.compiles)
        print(f"campaign with draws={other}: {s2.launches} checked launches in {s2.elapsed:.1f}s "
              f"({s2.launches / s2.elapsed:.1f}/s), {s2.compiles} JIT compiles", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)
    if args.profile:
        prof_camp = make(args.seed + 1)
        prof_camp.stats.started = time.monotonic()
        with _Profiler(args.profile, args.device) as prof:
            prof_camp.run(seconds=args.profile_seconds)
        print(f"==== profile: {prof_camp.stats.launches} launches in {args.profile_seconds:g}s of campaign "
              f"({args.profile})")
        print(prof.report())
    return rec


ANCHOR_PER_30S = 50 * 30 / 28.7  # the kernel authors' suite on an H200: 50 checked launches in 28.7 s


def _product_cmd(args, seed: int, json_path: Path, record: Path | None) -> list[str]:
    """`gdn-fuzz run` as the product command runs it here (--product), with this benchmark's pass-through options."""
    import sys

    return ([sys.executable, "-m", "gdn_fuzz.cli", "run", "--target", args.target, "--device", args.device,
             "--warm-up", "--seconds", str(args.product), "--property", "launch", "--no-corpus", "--seed", str(seed),
             "--arms", *args.arms, "--T", *map(str, args.T), "--json", str(json_path)]
            + (["--pool-scales", *args.pool_scales] if args.pool_scales else [])
            + (["--pipeline", args.pipeline] if args.pipeline else [])
            + (["--seeds-per-example", str(args.seeds_per_example)] if args.seeds_per_example else [])
            + (["--record", str(record)] if record is not None else []))


def _tally(recs: list[dict], n: int, threads: int, codes: list, base) -> dict:
    """One row of --product from the campaigns' JSON records (each worker's own): launches, per 30 s of each one's
    campaign time, per process."""
    per30 = sum(r["launches"] * 30 / r["seconds"] for r in recs if r["seconds"])
    return dict(processes=n, torch_threads=threads, exit_codes=codes, launches=sum(r["launches"] for r in recs),
                per_process=[r["launches"] for r in recs], launches_per_30s=per30,
                warmup_s=[round(r["warmup_s"], 1) for r in recs], ratio_to_first=per30 / base if base else 1.0,
                ratio_to_anchor=per30 / ANCHOR_PER_30S, pipeline=[r.get("pipeline") for r in recs],
                defer_verdicts=[r.get("defer_verdicts") for r in recs],
                seeds_per_example=[r.get("seeds_per_example") for r in recs],
                structures=[r.get("structures") for r in recs], drawn_ahead=[r.get("drawn_ahead") for r in recs])


def run_product(args, target) -> dict:
    """--product: the product command in N processes at once, for each N of --processes (--fleet: one `gdn-fuzz run
    --processes N`, its driver and MPS decision included, read from its merged record's workers)."""
    import os
    import subprocess
    import tempfile

    cores = os.cpu_count() or 1
    out = dict(meta=_meta(args, target), seconds=args.product, anchor_per_30s=ANCHOR_PER_30S, runs=[])
    base = None
    for n in args.processes:
        d = Path(args.record_dir) if args.record_dir else Path(tempfile.mkdtemp(prefix="gdn_fuzz_product_"))
        d.mkdir(parents=True, exist_ok=True)
        threads = max(1, cores // n)
        record = (lambda name: d / name) if args.record_dir else (lambda name: None)
        if args.fleet:
            cmd = _product_cmd(args, 0, d / f"n{n}.json", record(f"n{n}.jsonl")) + ["--processes", str(n)] + (
                ["--mps", args.mps] if args.mps else [])
            with open(d / f"n{n}.log", "w") as log:
                codes = [subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode]
            rec = json.loads((d / f"n{n}.json").read_text()) if (d / f"n{n}.json").is_file() else dict(workers=[])
            run = _tally(rec["workers"], n, threads, codes, base)
            run.update(fleet=True, mps=rec.get("mps"), lost=len(rec.get("lost", [])),
                       mps_left=[w["worker"] for w in rec["workers"] if (w.get("mps") or {}).get("left")])
            what = f"fleet of {n} (MPS {run['mps']}; workers that left it {run['mps_left']})"
        else:
            cmds = [_product_cmd(args, i, d / f"n{n}-p{i}.json", record(f"n{n}-p{i}.jsonl"))
                    + ["--torch-threads", str(threads), "--processes", "1"] for i in range(n)]
            procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for c in cmds]
            codes = [p.wait() for p in procs]
            recs = [json.loads((d / f"n{n}-p{i}.json").read_text()) for i in range(n)
                    if (d / f"n{n}-p{i}.json").is_file()]
            run = _tally(recs, n, threads, codes, base)
            what = f"{n} process(es) x {threads} threads"
        base = run["launches_per_30s"] if base is None else base
        out["runs"].append(run)
        print(f"{what}: {run['launches']} checked launches ({run['launches_per_30s']:.0f} per 30 s; per process "
              f"{run['per_process']}), warm-up {run['warmup_s']} s, {run['ratio_to_first']:.2f}x the first row, "
              f"{run['ratio_to_anchor']:.1f}x the anchor (the production kernel on an H200); exit codes {codes}",
              flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="reference")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arms", nargs="+", default=list(ARM_NAMES))
    ap.add_argument("--T", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--B", nargs="+", type=int, default=[8, 64, 256])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--draws", choices=("cpu", "device", "cuda", "graph"), default="cpu",
                    help="Case.draws: where the random tensors are drawn (default cpu: device-independent bits; device: "
                         "what `gdn-fuzz run` draws on the device; cuda, graph: that mode itself)")
    ap.add_argument("--max-seconds", type=float, help="table mode: stop starting new shapes after this long")
    ap.add_argument("--campaign", type=float, metavar="SECONDS", help="campaign-throughput mode for SECONDS")
    ap.add_argument("--product", type=float, metavar="SECONDS", help="product-command mode: gdn-fuzz run for SECONDS")
    ap.add_argument("--processes", nargs="+", type=int, default=[1], help="product mode: process counts, one row each")
    ap.add_argument("--fleet", action="store_true", help="product mode: run `gdn-fuzz run --processes N` itself (one "
                    "fleet, its driver and MPS decision) instead of N separate single-process runs")
    ap.add_argument("--mps", choices=("auto", "on", "off"), help="product mode with --fleet: `gdn-fuzz run --mps`")
    ap.add_argument("--pool-scales", nargs="+", help="product mode: `gdn-fuzz run --pool-scales` (default: the "
                    "command's own default)")
    ap.add_argument("--pipeline", help="product mode: `gdn-fuzz run --pipeline` (rounds at once per process; default: "
                    "the command's own, auto)")
    ap.add_argument("--seeds-per-example", type=int, help="product mode: `gdn-fuzz run --seeds-per-example K` "
                    "(value seeds checked per drawn structure; default: the command's own, 1)")
    ap.add_argument("--record-dir", help="product mode: each process's `gdn-fuzz run --record` file here "
                    "(nN-pI.jsonl: one line per example, with its time and its check's seconds, check_s; "
                    "benchmarks/record_split.py reads them), and each process's --json record (nN-pI.json)")
    ap.add_argument("--geometries", nargs="+", help="campaign mode: HxHV list (default: the target's fuzz menu)")
    ap.add_argument("--buckets", nargs="+", type=int, help="campaign mode: batch buckets (default 4 8)")
    ap.add_argument("--seed", type=int, default=0, help="campaign mode: campaign seed")
    ap.add_argument("--compare-draws", type=float, metavar="SECONDS",
                    help="campaign mode: then run the other draws mode for SECONDS (same process, no new JIT)")
    ap.add_argument("--profile", nargs="?", const="cprofile", choices=("cprofile", "torch", "phases"),
                    help="after measuring, profile one more pass and print where the time goes (phases: table mode, "
                         "torch.profiler over each part of one checked launch per shape apart)")
    ap.add_argument("--profile-seconds", type=float, default=5.0, help="campaign mode: seconds profiled")
    ap.add_argument("--oracle", choices=("auto", "spec", "fused", "both"), default="auto",
                    help="the float64 oracle of checks.expectation (GDN_FUZZ_ORACLE for the run); both: table mode "
                         "only, every shape with each (default auto: fused on a CUDA device where triton imports)")
    ap.add_argument("--graphs", choices=("auto", "off", "both"), default="auto",
                    help="GDN_FUZZ_GRAPHS for the run: auto (default: the check replayed as a CUDA graph on CUDA), off "
                         "(eager); both: table mode only, every shape with each")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.graphs == "both" and (args.campaign or args.product):
        ap.error("--graphs both measures the per-shape table; campaign and product modes take one mode")
    if args.graphs != "both":
        os.environ[graphs.ENV] = args.graphs  # reaches --product's processes too
    if args.oracle == "both" and (args.campaign or args.product):
        ap.error("--oracle both measures the per-shape table; campaign and product modes take one oracle")
    for name in ("spec", "fused") if args.oracle == "both" else (args.oracle,):
        _use_oracle(name)  # the last one stays set: it also reaches --product's processes
        try:
            fused_oracle.oracle_for(torch.device(args.device))  # fused where it cannot run: say so now
        except RuntimeError as e:
            ap.error(str(e))
    if args.draws == "device":  # Case.draws of the device: "graph" on CUDA (what `gdn-fuzz run` draws there)
        from gdn_fuzz.case import draws_for

        args.draws = "device" if draws_for(args.device) == "cpu" else draws_for(args.device)
    target = get_target(args.target)
    for a in args.arms:
        target.module(a)  # import every arm first: a module that does not fit fails here
    if args.product:
        run_product(args, target)
    elif args.campaign:
        run_campaign(args, target)
    else:
        run_table(args, target)


if __name__ == "__main__":
    main()
