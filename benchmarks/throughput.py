"""Checked launches per second, and the framework's overhead over the bare launch.

For each arm, T and batch size B (all rows real, permuted slots, cursors drawn legal), on
one geometry, after a warm-up launch per shape (JIT compiles are paid there and reported
apart):

  bare      target.launch on ready inputs (the wrapper + kernel; inputs cloned outside the
            timed region), synchronized
  oracle    the float64 launch expectation alone (gdn_fuzz.checks.expectation)
  checked   the whole per-example pipeline: materialize from the seed, snapshot, launch,
            oracle, tolerance and write-set checks (gdn_fuzz.checks.check_launch)

overhead = checked / bare.  Prints a table and writes JSON.

    python benchmarks/throughput.py --target reference --device cpu --H 1 --HV 2 --json out.json
    python benchmarks/throughput.py --target production --device cuda --H 16 --HV 64   # on an H200
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import torch

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.checks import check_launch, expectation, observe
from gdn_fuzz.targets import get_target


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _case(arm, T, B, H, HV, seed):
    rng = random.Random(seed)
    slots = list(range(B))
    rng.shuffle(slots)
    rows = tuple(Row(s, rng.randint(0, 16), rng.randint(0, 31)) for s in slots)
    return Case(arm=arm, T=T, H=H, HV=HV, pool=B, rows=rows, seed=seed)


def _time(fn, reps, device):
    out = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def bench(target, arm, T, B, H, HV, device, reps):
    case = _case(arm, T, B, H, HV, seed=B * 10 + T)
    compiles0 = target.compile_count(arm)
    t0 = time.perf_counter()
    observe(target, case, device)  # warm-up: JIT for this (arm, T, bucket, geometry)
    _sync(device)
    warm = time.perf_counter() - t0
    base = materialize(case, device)
    clones = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in base.items()} for _ in range(reps)]
    it = iter(clones)
    bare = _time(lambda: target.launch(arm, **next(it)), reps, device)
    obs = observe(target, case, device)
    oracle = _time(lambda: expectation(obs), reps, device)
    checked = _time(lambda: check_launch(target, case, device), reps, device)
    return dict(arm=arm, T=T, B=B, H=H, HV=HV, warmup_s=warm, compiles=target.compile_count(arm) - compiles0,
                bare_ms=bare * 1e3, oracle_ms=oracle * 1e3, checked_ms=checked * 1e3,
                checked_per_s=1.0 / checked, overhead=checked / bare)


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
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    target = get_target(args.target)
    rows = []
    print(f"{'arm':22s} {'T':>2s} {'B':>4s} {'bare ms':>9s} {'oracle ms':>10s} {'checked ms':>11s} "
          f"{'checked/s':>10s} {'overhead':>9s} {'warm-up s':>9s}")
    for arm in args.arms:
        for T in args.T:
            for B in args.B:
                r = bench(target, arm, T, B, args.H, args.HV, args.device, args.reps)
                rows.append(r)
                print(f"{arm:22s} {T:2d} {B:4d} {r['bare_ms']:9.2f} {r['oracle_ms']:10.2f} {r['checked_ms']:11.2f} "
                      f"{r['checked_per_s']:10.1f} {r['overhead']:8.1f}x {r['warmup_s']:9.2f}", flush=True)
    if args.json:
        meta = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), target=str(target), device=args.device,
                    torch=torch.__version__, python=platform.python_version(),
                    gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, reps=args.reps)
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
