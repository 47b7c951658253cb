"""`gdn-fuzz run --gpus 0,1`: one campaign process per GPU, one shared corpus, one summary.

Each GPU gets its own `gdn-fuzz run` child with CUDA_VISIBLE_DEVICES set to that GPU alone
(so the child's `cuda` device is it, and its JIT cache and crash-isolation worker stay on
it), its own seed (seed + worker index: the workers explore different examples), its own
JSON record and log, and the SAME corpus folder: corpus writes are atomic and named by the
failure's identity (gdn_fuzz.engine.corpus), so two workers finding one bug leave one entry.

The parent waits for every child, then prints per-GPU and total throughput and writes a
merged JSON record (`workers`: each child's record; totals).  Exit status: 1 if any worker
reported a new finding, 2 if a worker failed to run, 3 if only known bugs showed and
--fail-on-known was given, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from gdn_fuzz.engine import corpus


def parse_gpus(spec: str) -> list[str]:
    """'0,1' -> ['0', '1']; 'all' -> every GPU torch sees.  Raises ValueError with the fix."""
    if spec.strip() == "all":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise ValueError("--gpus all: no CUDA device is visible here; run on a GPU host or drop --gpus")
        return [str(i) for i in range(n)]
    gpus = [g.strip() for g in spec.split(",") if g.strip()]
    if not gpus or any(not g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus={spec!r}: give distinct GPU indices separated by commas (e.g. --gpus 0,1) "
                         "or 'all'")
    return gpus


# Every option of `gdn-fuzz run`, by its argparse dest, that child_argv carries to the workers (or,
# for gpus, that the parent consumes).  tests/test_multigpu.py fails when `run` gains an option
# that is not here, so a new option is never silently dropped by --gpus.
HANDLED_RUN_OPTIONS = frozenset({"target", "arms", "T", "buckets", "device", "seconds", "examples", "seed", "property",
                                 "round_examples", "json", "corpus", "no_corpus", "no_isolate", "record", "warm_up",
                                 "fail_on_known", "launch_timeout", "torch_threads", "draws", "gpus"})


def child_argv(args, worker: int, json_path: str, record_path: str | None, corpus_dir: str | None) -> list[str]:
    """The `gdn-fuzz run` command line of one worker (the parent's options, minus --gpus)."""
    argv = [sys.executable, "-m", "gdn_fuzz.cli", "run", "--device", args.device or "cuda",
            "--seed", str(args.seed + worker),
            "--json", json_path, "--round-examples", str(args.round_examples)]
    if args.target:
        argv += ["--target", args.target]
    if args.arms:
        argv += ["--arms", *args.arms]
    argv += ["--T", *map(str, args.T), "--buckets", *map(str, args.buckets)]
    if args.seconds is not None:
        argv += ["--seconds", str(args.seconds)]
    if args.examples is not None:
        argv += ["--examples", str(args.examples)]
    for p in args.property or []:
        argv += ["--property", p]
    if corpus_dir is None:
        argv += ["--no-corpus"]
    else:
        argv += ["--corpus", corpus_dir]
    if args.no_isolate:
        argv += ["--no-isolate"]
    if getattr(args, "warm_up", False):
        argv += ["--warm-up"]
    if getattr(args, "fail_on_known", False):
        argv += ["--fail-on-known"]
    if getattr(args, "launch_timeout", None) is not None:
        argv += ["--launch-timeout", str(args.launch_timeout)]
    if getattr(args, "torch_threads", None) is not None:
        argv += ["--torch-threads", str(args.torch_threads)]
    if getattr(args, "draws", "cpu") != "cpu":
        argv += ["--draws", args.draws]
    if record_path:
        argv += ["--record", record_path]
    return argv


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """The host's cores split between the campaign processes of one machine (at least 1 each).
    Measured on an H200 host with 16 cores (docs/benchmarks.md, issue 17): four processes at 4 threads
    each checked 3.1-3.5x the launches of one process, where torch's default (every core in every
    process) had given no gain; one thread per process was slower than one process at the default."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, workers))


def run_on_gpus(args, corpus_dir: str | None, console) -> int:
    gpus = parse_gpus(args.gpus)
    if getattr(args, "torch_threads", None) is None:  # the workers' share of the cores (not the caller's args)
        args = argparse.Namespace(**{**vars(args), "torch_threads": threads_per_worker(len(gpus))})
    out_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="gdn_fuzz_gpus_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(args.json).stem if args.json else "campaign"
    procs = []
    t0 = time.monotonic()
    for i, g in enumerate(gpus):
        jp = str(out_dir / f"{stem}.gpu{g}.json")
        rp = f"{args.record}.gpu{g}" if args.record else None
        log = open(out_dir / f"{stem}.gpu{g}.log", "w")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=g, PYTHONUNBUFFERED="1")
        procs.append((g, jp, log, subprocess.Popen(child_argv(args, i, jp, rp, corpus_dir), env=env,
                                                   stdout=log, stderr=subprocess.STDOUT)))
    console.print(f"gdn-fuzz run: {len(gpus)} workers on GPUs {','.join(gpus)} (seeds {args.seed}.."
                  f"{args.seed + len(gpus) - 1}), logs in {out_dir}")
    workers, failed = [], []
    for g, jp, log, p in procs:
        rc = p.wait()
        log.close()
        try:
            rec = json.loads(Path(jp).read_text())
        except (OSError, ValueError):
            rec = None
        if rec is None or rc not in (0, 1, 3):
            failed.append(g)
            tail = Path(log.name).read_text()[-1500:]
            console.print(f"[red]worker on GPU {g} failed (exit {rc}); its log ends:[/red]\n{tail}", markup=True)
            continue
        rec["gpu"], rec["exit"] = g, rc
        workers.append(rec)
    wall = time.monotonic() - t0
    from rich.table import Table

    t = Table(title=f"gdn-fuzz on {len(gpus)} GPUs")
    for col in ("GPU", "examples", "launches", "JIT compiles", "findings", "time", "examples/s"):
        t.add_column(col)
    for w in workers:
        t.add_row(w["gpu"], str(w["examples"]), str(w["launches"]), str(w["compiles"]), str(len(w["findings"])),
                  f"{w['seconds']:.1f}s", f"{w['examples'] / max(w['seconds'], 1e-9):.1f}")
    tot = dict(examples=sum(w["examples"] for w in workers), launches=sum(w["launches"] for w in workers),
               compiles=sum(w["compiles"] for w in workers), findings=sum(len(w["findings"]) for w in workers),
               wall_seconds=wall)
    tot["examples_per_s"] = tot["examples"] / wall if wall else 0.0
    t.add_row("total", str(tot["examples"]), str(tot["launches"]), str(tot["compiles"]), str(tot["findings"]),
              f"{wall:.1f}s (wall)", f"{tot['examples_per_s']:.1f}")
    console.print(t)
    if corpus_dir:
        n = len(corpus.entries(corpus_dir)) if os.path.isdir(corpus_dir) else 0
        console.print(f"corpus {corpus_dir}: {n} entries")
        tot["corpus_entries"] = n
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(gpus=gpus, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), totals=tot,
                           failed=failed, workers=workers), fh, indent=1)
    if failed:
        return 2
    if tot["findings"]:
        return 1
    return 3 if any(w["exit"] == 3 for w in workers) else 0
