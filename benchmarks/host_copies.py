"""Host time of the copies around a checked launch, old way against new way, interleaved in one process (issue 32).

Three A/B pairs, each timed on the same case, alternating A and B for --reps rounds (the median of each side, in
ms; a synchronize before and after every call):

  materialize   gdn_fuzz.case.materialize with case.send (its small CPU tensors packed into one pinned buffer,
                one non-blocking copy) against the plain `.to(device)` copy of each that it replaced
  snapshot      observation.clone_inputs (empty_like + copy_bits: one multi-tensor copy per element size)
                against one Tensor.clone per tensor
  static load   a CUDA graph's static copies loaded by copy_bits against one copy_ per tensor

The shapes are benchmarks/throughput.py's (all rows real, permuted slots, legal cursors; draws="cuda" on a
CUDA device).  --profile adds torch.profiler's operator table of 5 materialize calls of each side.

    python benchmarks/host_copies.py --device cuda --B 8 64 --H 16 --HV 64 --T 4 --json host_copies.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import gdn_fuzz.case as case_mod  # noqa: E402
from gdn_fuzz import graphs  # noqa: E402
from gdn_fuzz.case import draws_for, materialize  # noqa: E402
from gdn_fuzz.observation import clone_inputs, copy_bits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import _case  # noqa: E402


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def ab(fa, fb, reps, device):
    """Median seconds of fa and fb, called alternately reps times each."""
    ta, tb = [], []
    for _ in range(reps):
        for f, out in ((fa, ta), (fb, tb)):
            _sync(device)
            t0 = time.perf_counter()
            f()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def plain_materialize(case, device):
    real = case_mod.send
    case_mod.send = lambda dev, tensors: {k: t.to(dev) for k, t in tensors.items()}
    try:
        return materialize(case, device)
    finally:
        case_mod.send = real


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--B", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=64)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--arm", default="bf16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = args.device
    rows = []
    print(f"{'B':>4s} {'pair':14s} {'new ms':>8s} {'old ms':>8s} {'old/new':>8s}")
    for B in args.B:
        case = _case(args.arm, args.T, B, args.H, args.HV, seed=B * 10 + args.T, draws=draws_for(dev))
        for _ in range(3):  # warm-up: the history kernel's compile, the allocators' first blocks
            materialize(case, dev)
            plain_materialize(case, dev)
        inputs = materialize(case, dev)
        names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
        static = {k: torch.empty_like(inputs[k]) for k in names}

        def load_new():
            copy_bits([static[k] for k in names], [inputs[k] for k in names])

        def load_old():
            for k in names:
                static[k].copy_(inputs[k])

        pairs = (("materialize", lambda: materialize(case, dev), lambda: plain_materialize(case, dev)),
                 ("snapshot", lambda: clone_inputs(inputs),
                  lambda: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}),
                 ("static load", load_new, load_old))
        for name, new, old in pairs:
            tn, to = ab(new, old, args.reps, dev)
            rows.append(dict(B=B, pair=name, new_ms=tn * 1e3, old_ms=to * 1e3, device=dev, H=args.H, HV=args.HV,
                             T=args.T, arm=args.arm, reps=args.reps, tensors=len(names)))
            print(f"{B:4d} {name:14s} {tn * 1e3:8.3f} {to * 1e3:8.3f} {to / tn:8.2f}", flush=True)
        if args.profile:
            for side, fn in (("new", lambda: materialize(case, dev)), ("old", lambda: plain_materialize(case, dev))):
                acts = [torch.profiler.ProfilerActivity.CPU]
                if dev.startswith("cuda"):
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                with torch.profiler.profile(activities=acts) as p:
                    for _ in range(5):
                        fn()
                    _sync(dev)
                print(f"==== profile B={B} {side}: 5 materialize calls")
                print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    graphs.reset()


if __name__ == "__main__":
    main()
