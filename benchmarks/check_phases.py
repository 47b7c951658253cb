"""Where one check's time goes in the worker, phase by phase, on the campaign's default shapes (issue 32).

The launch property's cases are drawn with the campaign's own strategy and settings (the bf16 arm by default, T 4
and 8, the target's geometries, buckets 4 and 8, the device's draw mode), then checked twice in this process: a
first pass compiles and captures what it needs, the second is timed.  The phases are the check's own functions,
timed by wrapping them (nothing of the check is re-implemented here):

  decode       the worker's load_case(json.loads(text)) of the case it is sent
  materialize  observation.materialize (the draw program: a CUDA graph replay and its output clones on a GPU)
  before       observation.clone_inputs (the "before" snapshot)
  launch       Target.launch (the kernel under test, its wrapper's Python included)
  verdict      graphs.run of checks.verdict (the cursor check, the static copies, the replay)
  rest         the rest of check_launch: the verdict's one transfer (which waits for the GPU when the phases are
               not synchronized), reading it, the launch record
  sync         the worker's torch.cuda.synchronize after the check
  answer       the worker's answer: findings, metrics and graph counts, pickled

--sync: a torch.cuda.synchronize before and after each phase, so that each phase holds its own GPU time; without
it each phase is its host time, and the GPU's wait lands in "rest".  --isolated also times N checks through a real
isolated worker (the campaign's path: the in-flight file, the pipe), with the worker's own seconds (worker_s).

    python benchmarks/check_phases.py --target production --device cuda [--n 300] [--sync] [--isolated]
        [--profile cprofile torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from collections import defaultdict

import torch

PHASES = ("decode", "materialize", "before", "launch", "verdict", "rest", "sync", "answer")


def draw_cases(target, device: str, n: int, seed: int, arms, Ts, pool_scales: tuple = (),
               geometries: tuple | None = None) -> list:
    """n launch cases as a campaign round draws them (its strategy, its settings, the device's draw mode).
    pool_scales: the campaign's pool-scale kinds passed to the strategy, and only cases that reached one of
    them kept (strategies.pool_scale_of; the strategy takes that branch 1 time in SCALE_ODDS).  geometries:
    the (H, HV) menu (default: the target's, strategies.geometries_for)."""
    import dataclasses

    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from gdn_fuzz.case import draws_for
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies import BUCKETS, geometries_for, pool_scale_of
    from gdn_fuzz.strategies import SCALE_ODDS

    out: list = []
    kw = dict(pool_scales=tuple(pool_scales)) if pool_scales else {}
    strat = get_property("launch").strategy(arms=tuple(arms), Ts=tuple(Ts), geometries=geometries or geometries_for(target),
                                            buckets=BUCKETS, **kw)
    draws = draws_for(device)

    @hseed(seed)
    @settings(max_examples=n * (4 * SCALE_ODDS if pool_scales else 1), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strat)
    def collect(case):
        if not pool_scales or pool_scale_of(case) in pool_scales:
            out.append(dataclasses.replace(case, draws=draws))

    collect()
    return out[:n]


class Timer:
    def __init__(self, sync: bool, device: str):
        self.sync = sync and torch.device(device).type == "cuda"
        self.t: dict = defaultdict(float)

    def _sync(self):
        if self.sync:
            torch.cuda.synchronize()

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            self._sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._sync()
                self.t[name] += time.perf_counter() - t0
        return timed


def check_once(target, case, device: str, timer: Timer | None = None) -> None:
    """What the worker does for one check (gdn_fuzz.engine.isolation._worker_main), phases timed by `timer`."""
    from gdn_fuzz import graphs
    from gdn_fuzz.prefix_case import load_case
    from gdn_fuzz.properties import get_property

    text = json.dumps(dict(property="launch", target=target.name, case=case.to_dict()))
    t0 = time.perf_counter()
    case = load_case(json.loads(text)["case"])
    t1 = time.perf_counter()
    found = get_property("launch").check(target, case, device)
    t2 = time.perf_counter()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    pickle.dumps(("ok", dict(findings=[dict(f.__dict__) for f in found], metrics=getattr(found, "metrics", None),
                              graphs=graphs.counts()), 0))
    t4 = time.perf_counter()
    if timer is not None:
        timer.t["decode"] += t1 - t0
        timer.t["check"] += t2 - t1
        timer.t["sync"] += t3 - t2
        timer.t["answer"] += t4 - t3
        timer.t["total"] += t4 - t0


def timed_pass(target, cases, device: str, sync: bool) -> dict:
    """Per-check mean milliseconds of each phase over `cases` (see the module doc)."""
    from gdn_fuzz import checks, graphs, observation

    timer = Timer(sync, device)
    saved = (observation.materialize, observation.clone_inputs, graphs.run, target.launch)
    observation.materialize = timer.wrap("materialize", observation.materialize)
    observation.clone_inputs = timer.wrap("before", observation.clone_inputs)
    graphs.run = timer.wrap("verdict", graphs.run)
    target.launch = timer.wrap("launch", target.launch)
    try:
        for c in cases:
            check_once(target, c, device, timer)
    finally:
        observation.materialize, observation.clone_inputs, graphs.run = saved[:3]
        del target.launch  # the instance attribute: the class's method again
        assert checks.graphs.run is saved[2]
    t = timer.t
    t["rest"] = t["check"] - sum(t[k] for k in ("materialize", "before", "launch", "verdict"))
    n = len(cases)
    return {k: 1e3 * t[k] / n for k in (*PHASES, "total")}


def isolated_pass(target_name: str, cases, device: str) -> dict:
    """N checks through an isolated worker: the round trip and the worker's own seconds, median ms."""
    from gdn_fuzz.engine.isolation import Worker

    rt, own = [], []
    with Worker(target_name, device, name="phases") as w:
        for c in cases:  # the first pass: compiles, captures, the oracle's compile
            w.check("launch", c)
        for c in cases:
            t0 = time.perf_counter()
            w.check("launch", c)
            rt.append(time.perf_counter() - t0)
            own.append(w.last_worker_s)
    return dict(round_trip_ms=1e3 * statistics.median(rt), worker_ms=1e3 * statistics.median(own),
                campaign_part_ms=1e3 * statistics.median(a - b for a, b in zip(rt, own)), checks=len(rt))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="production")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arms", nargs="+", default=["bf16"])
    ap.add_argument("--T", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--n", type=int, default=300, help="cases drawn (each checked once to warm up, once timed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sync", action="store_true", help="synchronize around each phase (each holds its GPU time)")
    ap.add_argument("--isolated", action="store_true", help="also time the checks through an isolated worker")
    ap.add_argument("--profile", nargs="*", choices=("cprofile", "torch"), default=(),
                    help="profile one more pass per profiler named and print the top entries")
    ap.add_argument("--pool-scales", nargs="+", default=(), choices=("thousands", "int32"),
                    help="only cases of these pool-scale kinds (the product command draws them 1 time in 8)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from gdn_fuzz.targets import get_target

    target = get_target(args.target)
    t0 = time.perf_counter()
    cases = draw_cases(target, args.device, args.n, args.seed, args.arms, args.T, tuple(args.pool_scales))
    draw_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in cases:
        check_once(target, c, args.device)
    warm_s = time.perf_counter() - t0
    rec = dict(target=args.target, device=args.device, torch=torch.__version__, n=len(cases), draw_s=draw_s,
               pool_scales=list(args.pool_scales),
               warm_s=warm_s, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    print(f"{len(cases)} cases drawn in {draw_s:.1f} s; first pass (compiles, captures) {warm_s:.1f} s", flush=True)
    for sync in ([False, True] if args.sync else [False]):
        ms = timed_pass(target, cases, args.device, sync)
        rec["synced" if sync else "host"] = ms
        print(f"per check, ms ({'each phase synchronized' if sync else 'host time, not synchronized'}): "
              + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()), flush=True)
    if args.isolated:
        rec["isolated"] = isolated_pass(args.target, cases, args.device)
        print("isolated worker, median ms: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                           for k, v in rec["isolated"].items()), flush=True)
    if "cprofile" in args.profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for c in cases:
            check_once(target, c, args.device)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(40)
        print(f"==== cProfile of {len(cases)} checks, by own time\n{buf.getvalue()}")
    if "torch" in args.profile:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.device(args.device).type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as p:
            for c in cases:
                check_once(target, c, args.device)
        print(f"==== torch.profiler over {len(cases)} checks, by own CPU time")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=45))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
