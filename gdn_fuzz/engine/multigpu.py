"""Several campaign processes: `gdn-fuzz run --gpus 0,1` and `--processes N|auto`.

`--gpus G1,G2` starts N `gdn-fuzz run` children per listed GPU, all N of one GPU with
CUDA_VISIBLE_DEVICES set to that GPU alone (so the child's `cuda` device is it, and its JIT cache
and crash-isolation worker stay on it).  Without --gpus, `--processes N` (N > 1) starts N children
on the run's own device (`--device cpu` too; on CUDA the parent's CUDA_VISIBLE_DEVICES is kept).
`--processes auto` (the default; $GDN_FUZZ_PROCESSES sets another) is `auto_processes`: 1 on a CPU
device, on CUDA min(8, max(1, cores per GPU // 2)).  When the total is one child and --gpus is not
given, `gdn-fuzz run` stays the single process it always was (no child).

Each child gets its own seed (seed + its index over all children: they explore different
examples), its own JSON record and log (`<stem>.gpu<G>.p<k>.json`, `.log`; `<stem>.cpu.p<k>` without
--gpus), cores // children torch threads unless --torch-threads is given, and the SAME corpus
folder: corpus writes are atomic and named by the failure's identity (gdn_fuzz.engine.corpus), so
two children finding one bug leave one entry.  Budgets (--seconds, --examples) are per child.

The parent waits for every child, then prints per-child and total throughput and writes a merged
JSON record (`workers`: each child's record; `totals`; `processes_per_device`).  Exit status: 1 if
any child reported a new finding, 2 if a child failed to run, 3 if only known bugs showed and
--fail-on-known was given, else 0; 130 after an interrupt (as one campaign: what was found is
reported and stored first), 143 after SIGTERM.

No orphans: the children run in their own process group, so a Ctrl-C at the terminal reaches the
parent alone, and the parent forwards it: a first SIGINT asks every child to stop (each reports and
stores what it found, exits 130), a second stops them at once, a third kills them.  SIGTERM of the
parent is forwarded as SIGTERM (SIGKILL after 10 s), and the parent waits for every child before it
exits.  On Linux a child also gets SIGTERM when the parent dies any other way (PR_SET_PDEATHSIG, so
kill -9 of the parent leaves no campaign running), and each child's own worker dies with it
(gdn_fuzz.engine.isolation).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.exits import EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from gdn_fuzz.engine.isolation import parent_death_signal

TERM_GRACE_S = 10.0  # after SIGTERM, seconds a child has before SIGKILL


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


def parse_processes(spec) -> int | None:
    """--processes: 'auto' -> None, 'N' (N >= 1) -> N.  Raises ValueError, one line naming the option,
    the value and the fix."""
    s = str(spec).strip()
    if s == "auto":
        return None
    env = " (from $GDN_FUZZ_PROCESSES)" if s and os.environ.get("GDN_FUZZ_PROCESSES", "").strip() == s else ""
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--processes={s}{env}: give processes per device: a whole number >= 1 "
                         "(e.g. --processes 4) or auto")
    return n


def auto_processes(device: str, gpus: int = 1, cores: int | None = None) -> int:
    """`--processes auto`: campaign processes per device.  1 on a CPU device (CPU runs are tests and CI,
    which expect one process and its plain record; --processes 2 checked 1.40x on a 2-core machine:
    docs/benchmarks.md).  On CUDA min(8, max(1, cores_per_gpu // 2)), cores_per_gpu = the host's cores / the
    GPUs used: the campaign is bound by host CPU, not by the GPU, and each process is two (the campaign and
    its crash-isolation worker, which take turns).  Measured on an H200 host with 16 cores, same tree, launch
    only, 30 s (docs/benchmarks.md, issue 17, third session): 1 process 1,565 checked launches, 4 processes
    4,462, 8 processes 5,694 (an earlier run: 1,762, 4,765, 5,525).  So 2 cores per process, at most 8 per
    GPU (16 cores -> 8)."""
    if not str(device).startswith("cuda"):
        return 1
    per_gpu = (cores or os.cpu_count() or 1) // max(1, gpus)
    return min(8, max(1, per_gpu // 2))


# Every option of `gdn-fuzz run`, by its argparse dest, that child_argv carries to the workers (or,
# for gpus and processes, that the parent consumes).  tests/test_multigpu.py fails when `run` gains an
# option that is not here, so a new option is never silently dropped by --gpus / --processes.
HANDLED_RUN_OPTIONS = frozenset({"target", "arms", "T", "buckets", "device", "seconds", "examples", "seed", "property",
                                 "round_examples", "json", "corpus", "no_corpus", "no_isolate", "record", "warm_up",
                                 "fail_on_known", "launch_timeout", "torch_threads", "draws", "gpus", "processes",
                                 "seeds_per_example", "pool_scales"})


def child_argv(args, worker: int, json_path: str, record_path: str | None, corpus_dir: str | None) -> list[str]:
    """The `gdn-fuzz run` command line of one child (the parent's options, minus --gpus; --processes 1)."""
    argv = [sys.executable, "-m", "gdn_fuzz.cli", "run", "--device", args.device or "cuda",
            "--seed", str(args.seed + worker), "--processes", "1",
            "--json", json_path, "--round-examples", str(args.round_examples)]
    if args.target:
        argv += ["--target", args.target]
    if args.arms:
        argv += ["--arms", *args.arms]
    argv += ["--T", *map(str, args.T)]
    if args.buckets:  # None: each child takes its target's default (strategies.buckets_for)
        argv += ["--buckets", *map(str, args.buckets)]
    if args.pool_scales:  # None: each child takes its device's default (strategies.pool_scales_for)
        argv += ["--pool-scales", *args.pool_scales]
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
    if getattr(args, "seeds_per_example", 1) != 1:
        argv += ["--seeds-per-example", str(args.seeds_per_example)]
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
    """--gpus: N children per listed GPU (N from --processes; auto counts the host's cores per GPU)."""
    gpus = parse_gpus(args.gpus)
    device = args.device or "cuda"
    n = parse_processes(getattr(args, "processes", "auto")) or auto_processes(device, len(gpus))
    return run_processes(args, corpus_dir, console, device=device, per_device=n, gpus=gpus)


def _pdeathsig():
    """preexec_fn of a child on Linux: SIGTERM when the parent dies (kill -9 included), else None."""
    arm = parent_death_signal(signal.SIGTERM)
    if arm is None:
        return None
    parent = os.getpid()

    def preexec():
        if not arm(parent):  # the parent died before prctl
            os._exit(EXIT_TERMINATED)
    return preexec


class _Children:
    """The children's signals: Ctrl-C and SIGTERM of the parent are forwarded (see the module doc)."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.sigint = 0
        self.term_at: float | None = None
        self._old: dict = {}

    def send(self, sig) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _on_int(self, signum, frame):
        self.sigint += 1
        self.send(signal.SIGINT if self.sigint <= 2 else signal.SIGKILL)

    def _on_term(self, signum, frame):
        if self.term_at is None:
            self.term_at = time.monotonic()
        self.send(signal.SIGTERM)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig, h in ((signal.SIGINT, self._on_int), (signal.SIGTERM, self._on_term)):
                old = signal.getsignal(sig)
                if old not in (signal.SIG_IGN, None):  # a caller that ignores the signal (an xdist worker) keeps that
                    self._old[sig] = old
                    signal.signal(sig, h)
        return self

    def wait(self, p: subprocess.Popen) -> int:
        while True:
            try:
                return p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if self.term_at is not None and time.monotonic() - self.term_at > TERM_GRACE_S:
                    self.send(signal.SIGKILL)

    def __exit__(self, *exc):
        try:
            if any(p.poll() is None for p in self.procs):  # the parent stops early (an error): no child outlives it
                self.send(signal.SIGTERM)
                deadline = time.monotonic() + TERM_GRACE_S
                for p in self.procs:
                    try:
                        p.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)
        return False


def run_processes(args, corpus_dir: str | None, console, *, device: str, per_device: int,
                  gpus: list[str] | None = None) -> int:
    """per_device children on each GPU of gpus (CUDA_VISIBLE_DEVICES = that GPU), or on `device` itself when
    gpus is None (the environment kept); one summary, one merged record; exit status as the module doc says."""
    slots = [(g, k) for g in (gpus or [None]) for k in range(per_device)]
    where = "".join(c for c in str(device) if c.isalnum())
    labels = [f"gpu{g}.p{k}" if g is not None else f"{where}.p{k}" for g, k in slots]
    threads = getattr(args, "torch_threads", None) or threads_per_worker(len(slots))
    # the children's options (the caller's args are left unchanged)
    args = argparse.Namespace(**{**vars(args), "torch_threads": threads, "device": device})
    out_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="gdn_fuzz_procs_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(args.json).stem if args.json else "campaign"
    runs = []
    t0 = time.monotonic()
    with _Children() as kids:
        for i, ((g, k), label) in enumerate(zip(slots, labels)):
            if kids.sigint or kids.term_at is not None:  # stopped while starting: start no more
                break
            jp = str(out_dir / f"{stem}.{label}.json")
            rp = f"{args.record}.{label}" if args.record else None
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if g is not None:
                env["CUDA_VISIBLE_DEVICES"] = g
            with open(out_dir / f"{stem}.{label}.log", "w") as log:
                kids.procs.append(subprocess.Popen(child_argv(args, i, jp, rp, corpus_dir), env=env, stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                   start_new_session=True, preexec_fn=_pdeathsig()))
            runs.append((g, k, label, jp, out_dir / f"{stem}.{label}.log"))
        on = f"GPUs {','.join(gpus)}" if gpus else f"device {device}"
        console.print(f"gdn-fuzz run: {len(slots)} campaign processes ({per_device} per device) on {on} (seeds "
                      f"{args.seed}..{args.seed + len(slots) - 1}, {threads} torch threads each), logs in {out_dir}",
                      markup=False)
        codes = [kids.wait(p) for p in kids.procs]
    wall = time.monotonic() - t0
    interrupted, terminated = kids.sigint > 0, kids.term_at is not None
    workers, failed = [], []
    for (g, k, label, jp, log), rc in zip(runs, codes):
        try:
            rec = json.loads(Path(jp).read_text())
        except (OSError, ValueError):
            rec = None
        if rec is None or rc not in (EXIT_OK, EXIT_NEW, EXIT_KNOWN_ONLY, EXIT_INTERRUPTED):
            failed.append(label)
            tail = log.read_text()[-1500:] if log.is_file() else ""
            console.print(f"[red]worker {label} failed (exit {rc}); its log ends:[/red]\n{tail}", markup=True)
            continue
        rec.update(gpu=g, process=k, worker=label, exit=rc)
        workers.append(rec)
    from rich.table import Table

    t = Table(title=f"gdn-fuzz: {len(slots)} campaign processes on {on}, {per_device} per device")
    for col in ("GPU" if gpus else "device", "process", "examples", "launches", "JIT compiles", "findings", "time",
                "examples/s"):
        t.add_column(col)
    for w in workers:
        t.add_row(w["gpu"] if gpus else device, str(w["process"]), str(w["examples"]), str(w["launches"]),
                  str(w["compiles"]), str(len(w["findings"])), f"{w['seconds']:.1f}s",
                  f"{w['examples'] / max(w['seconds'], 1e-9):.1f}")
    tot = dict(examples=sum(w["examples"] for w in workers), launches=sum(w["launches"] for w in workers),
               structures=sum(w.get("structures", w["examples"]) for w in workers),
               compiles=sum(w["compiles"] for w in workers), findings=sum(len(w["findings"]) for w in workers),
               wall_seconds=wall)
    tot["examples_per_s"] = tot["examples"] / wall if wall else 0.0
    t.add_row("total", str(len(workers)), str(tot["examples"]), str(tot["launches"]), str(tot["compiles"]),
              str(tot["findings"]), f"{wall:.1f}s (wall)", f"{tot['examples_per_s']:.1f}")
    console.print(t)
    if corpus_dir:
        n = len(corpus.entries(corpus_dir)) if os.path.isdir(corpus_dir) else 0
        console.print(f"corpus {corpus_dir}: {n} entries")
        tot["corpus_entries"] = n
    if terminated or interrupted:
        console.print(f"[yellow]{'terminated' if terminated else 'interrupted'}[/yellow]: every worker was stopped "
                      "and waited for; findings seen so far are listed and stored above", markup=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(gpus=gpus, device=device, processes_per_device=per_device,
                           date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), totals=tot, failed=failed,
                           interrupted=interrupted or terminated, workers=workers), fh, indent=1)
    if terminated:
        return EXIT_TERMINATED
    if interrupted or any(w["exit"] == EXIT_INTERRUPTED for w in workers):
        return EXIT_INTERRUPTED
    if failed:
        return EXIT_USAGE
    if tot["findings"]:
        return EXIT_NEW
    return EXIT_KNOWN_ONLY if any(w["exit"] == EXIT_KNOWN_ONLY for w in workers) else EXIT_OK
