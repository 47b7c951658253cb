"""Campaign throughput of a fleet: one process, N child processes, N Ray actors (issue 19).

Each configuration is one real `gdn-fuzz run` process (`--seconds S --json ...`, `--warm-up` on
CUDA, crash isolation on, no corpus, `--property launch` unless told; give one arm with `--arms` for
the same mix of launches in every configuration: several workers split the arms between them) whose merged JSON record gives the checked examples of every worker; the
figure is examples per second of campaign time (each worker's examples / its budget, summed), beside
the wall time of the whole command (start-up, Ray, shutdown included).

  single          gdn-fuzz run --processes 1                         (this process checks)
  processes N     gdn-fuzz run --processes N                         (gdn_fuzz.engine.multigpu)
  ray N           gdn-fuzz run --ray ADDRESS --processes N           (gdn_fuzz.engine.raycluster)

The Ray cluster is started here (raycluster.head_node: one node, --cpus logical CPUs, the GPUs Ray
finds) unless --ray ADDRESS names one.  On a CPU device `--processes N` is N actors in all; on CUDA
it is N per GPU.

  python benchmarks/fleet.py --seconds 60 --actors 1 2 4 --target reference --device cpu --arms bf16 --out FILE.json
  python benchmarks/fleet.py --seconds 60 --actors 1 --device cuda --target production --no-processes

Results: docs/fleet.md (with the command, the date and the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(argv: list[str], out_dir: Path, name: str, timeout_s: float) -> dict:
    jp = out_dir / f"{name}.json"
    t0 = time.monotonic()
    env = dict(os.environ)
    env.pop("GDN_FUZZ_PROCESSES", None)
    p = subprocess.run([sys.executable, "-m", "gdn_fuzz.cli", "run", *argv, "--json", str(jp)], env=env,
                       capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    (out_dir / f"{name}.out").write_text(p.stdout + p.stderr)
    if p.returncode not in (0, 1, 3) or not jp.is_file():
        raise SystemExit(f"{name}: exit {p.returncode}; output in {out_dir / (name + '.out')}:\n{p.stdout[-3000:]}")
    rec = json.loads(jp.read_text())
    workers = rec.get("workers") or [rec]
    budget = float(workers[0].get("budget_s") or 0.0)
    examples = sum(w["examples"] for w in workers)
    return dict(config=name, command="gdn-fuzz run " + " ".join(argv), workers=len(workers), examples=examples,
                per_worker=[w["examples"] for w in workers], budget_s=budget,
                examples_per_s=examples / budget if budget else None,
                warmup_s=max(float(w.get("warmup_s") or 0.0) for w in workers), wall_s=wall, exit=p.returncode,
                findings=len(rec.get("findings", [])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4], help="worker counts to measure")
    ap.add_argument("--target", default="reference")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--property", action="append", default=None, help="default: launch (the same mix for every N)")
    ap.add_argument("--arms", nargs="+", default=None)
    ap.add_argument("--ray", help="a running cluster's address (default: start one here)")
    ap.add_argument("--cpus", type=int, default=None, help="logical CPUs of the cluster started here "
                                                          "(default: os.cpu_count())")
    ap.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=None,
                    help="pay the JIT compiles before the budget (default: on CUDA only; the reference target on the "
                         "CPU compiles nothing, and its warm-up launches of 64-row buckets took ~55 s here)")
    ap.add_argument("--no-processes", action="store_true", help="skip the single and processes configurations")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `gdn-fuzz run` options")
    ap.add_argument("--out", help="JSON results (rewritten after every configuration)")
    args = ap.parse_args(argv)
    out_dir = Path(tempfile.mkdtemp(prefix="gdn_fuzz_fleet_bench-"))
    warm = args.warm_up if args.warm_up is not None else args.device.startswith("cuda")
    base = ["--target", args.target, "--device", args.device, "--seconds", str(args.seconds), "--no-corpus"]
    base += ["--warm-up"] if warm else []
    for prop in args.property or ["launch"]:
        base += ["--property", prop]
    if args.arms:
        base += ["--arms", *args.arms]
    base += args.extra
    timeout_s = args.seconds + 600
    rows = []

    def keep(row):
        rows.append(row)
        print(f"{row['config']:<14} workers {row['workers']}  examples {row['examples']:>6}  "
              f"{row['examples_per_s']:.1f}/s  wall {row['wall_s']:.1f}s  per worker {row['per_worker']}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                      cores=os.cpu_count(), rows=rows, logs=str(out_dir)), indent=1))

    if not args.no_processes:
        keep(run(base + ["--processes", "1"], out_dir, "single", timeout_s))
        for n in args.actors:
            if n > 1:
                keep(run(base + ["--processes", str(n)], out_dir, f"processes-{n}", timeout_s))
    from gdn_fuzz.engine.raycluster import head_node

    cpus = args.cpus or os.cpu_count() or 1  # the real cores: actors share them as processes do
    with (contextlib.nullcontext(args.ray) if args.ray else head_node(cpus)) as address:
        for n in args.actors:
            keep(run(base + ["--ray", address, "--processes", str(n)], out_dir, f"ray-{n}", timeout_s))
    print(f"logs: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
