"""How many tensor operations one verdict runs, part by part (issue 32): the GPU-time proxy of a small check.

At the campaign's shapes a verdict reads almost nothing, so its GPU time is its kernels' count times a few
microseconds each.  This counts the aten operations checks.verdict dispatches on a CPU observation (the same ops a
CUDA verdict launches, the same graph a capture records), leaving out views and allocations, which launch nothing:
an op counts when it is not a view (OpOverload.is_view) and not one of NO_KERNEL (allocations without a fill,
metadata queries).  The parts are the verdict's own functions (measure, oracle_metrics, summary_tensor, _writes),
counted by wrapping them (nothing re-implemented).  On the CPU `measure` is the spec's path (the whole [V, K] state
work in torch ops); on a GPU it is the fused oracle's preparation, one kernel and a sum: `fused_prepare` counts that
preparation (fused_oracle._prepare, run here on the CPU with its device check waived), so a GPU verdict is about
fused_prepare + 3 + oracle_metrics + summary_tensor + _writes.

    python benchmarks/verdict_ops.py [--n 40] [--seed 0] [--json out.json]

The cases are the launch property's strategy at the GPU campaign's menu (bf16, T 4 and 8, the GPU geometries,
buckets 4 and 8: check_phases.draw_cases), run on the reference target on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

NO_KERNEL = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
             "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default",
             "aten.is_contiguous.default", "aten.lift_fresh.default", "aten._local_scalar_dense.default"}
PARTS = ("measure", "oracle_metrics", "summary_tensor", "_writes")


class Count(TorchDispatchMode):
    """Counts the kernel-launching ops, each under the innermost part running when it was dispatched."""

    def __init__(self):
        super().__init__()
        self.part = ["other"]
        self.n = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and str(func) not in NO_KERNEL:
            self.n[self.part[-1]] += 1
        return func(*args, **(kwargs or {}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import inspect

    from check_phases import draw_cases
    from gdn_fuzz import checks, fused_oracle
    from gdn_fuzz.observation import observe
    from gdn_fuzz.strategies import GPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    target = get_target("reference")
    cases = draw_cases(target, "cpu", args.n, args.seed, ("bf16",), (4, 8), geometries=GPU_GEOMETRIES)
    counter = Count()
    saved = {p: getattr(checks, p) for p in PARTS}

    def wrap(name, fn):
        def part(*a, **k):
            counter.part.append(name)
            try:
                return fn(*a, **k)
            finally:
                counter.part.pop()
        return part

    per_case = []
    wanted = set(inspect.signature(fused_oracle._prepare).parameters)
    unavailable = fused_oracle.unavailable
    fused_oracle.unavailable = lambda device: None  # _prepare's device check: its ops run on any device
    try:
        for p in PARTS:
            setattr(checks, p, wrap(p, saved[p]))
        for c in cases:
            obs = observe(target, c, "cpu")
            if obs.error is not None:
                continue
            counter.n.clear()
            with counter:
                checks.verdict(obs)
            total = sum(counter.n.values())
            inputs = checks._oracle_inputs(obs, None)
            with counter:
                counter.part.append("fused_prepare")
                fused_oracle._prepare(**{k: v for k, v in inputs.items() if k in wanted})
                counter.part.pop()
            per_case.append(dict(counter.n, total=total, B=c.B, T=c.T, H=c.H, HV=c.HV))
    finally:
        for p in PARTS:
            setattr(checks, p, saved[p])
        fused_oracle.unavailable = unavailable
    keys = (*PARTS, "other", "total", "fused_prepare")
    rec = {k: statistics.mean(d.get(k, 0) for d in per_case) for k in keys}
    rec.update(cases=len(per_case), torch=torch.__version__, seed=args.seed)
    print(f"{len(per_case)} verdicts, mean kernel-launching ops: " + ", ".join(f"{k} {rec[k]:.1f}" for k in keys))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rec, per_case=per_case), indent=1))


if __name__ == "__main__":
    main()
