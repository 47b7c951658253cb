"""The processes backend of a fleet: `gdn-fuzz run --gpus 0,1` and `--processes N|auto` on this host.

`--gpus G1,G2` starts N workers per listed GPU, all N of one GPU with CUDA_VISIBLE_DEVICES set to that
GPU alone (so the worker's `cuda` device is it, and its JIT cache and crash-isolation worker stay on
it).  Without --gpus, `--processes N` (N > 1) starts N workers on the run's own device (`--device cpu`
too; on CUDA the parent's CUDA_VISIBLE_DEVICES is kept).  `--processes auto` (the default;
$GDN_FUZZ_PROCESSES sets another) is `auto_processes`: 1 on a CPU device, on CUDA min(8, max(1, cores
per GPU // 2)).  When the total is one worker and --gpus is not given, `gdn-fuzz run` stays the single
process it always was (no child).

The driver, the plan (seeds, shares of arms and properties), the one corpus writer, the merge and the
restarts are gdn_fuzz.engine.fleet's, the same for the Ray backend; each worker is
gdn_fuzz.engine.worker.run_worker in a child process (`python -m gdn_fuzz.engine.worker`): its spec
and the driver's messages on its stdin, its events as JSON lines on a pipe, its log (stdout and
stderr) in `<stem>.<label>.log` beside --json (a temporary folder without it), its record in
`<stem>.<label>.json` (`<stem>.gpu<G>.p<k>` with --gpus, `<stem>.cpu.p<k>` / `.cuda.p<k>` without),
cores // workers torch threads unless --torch-threads is given.

No orphans: the children run in their own process group, so a Ctrl-C at the terminal reaches the
driver alone, which forwards it (gdn_fuzz.engine.fleet: first and second SIGINT forwarded as SIGINT,
a third kills); SIGTERM is forwarded as SIGTERM (SIGKILL after 10 s), and the driver waits for every
child before it exits.  On Linux a child also gets SIGTERM when the driver dies any other way
(PR_SET_PDEATHSIG, so kill -9 of the driver leaves no campaign running), and each child's own
crash-isolation worker dies with it (gdn_fuzz.engine.isolation).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from gdn_fuzz import environment
from gdn_fuzz.engine import corpus, mps
from gdn_fuzz.engine.exits import EXIT_TERMINATED
from gdn_fuzz.engine.fleet import TERM_GRACE_S, Fleet, plan
from gdn_fuzz.engine.isolation import parent_death_signal
from gdn_fuzz.targets import TargetUnavailable, default_target_name, get_target


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
    return environment.count_or_auto(spec, "--processes", "GDN_FUZZ_PROCESSES", "processes per device", example=4)


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


# Every option of `gdn-fuzz run`, by its argparse dest, that fleet.plan carries to the workers (or that
# the driver consumes: gpus, processes, ray, restarts, json, corpus, no_corpus, record).
# tests/test_multigpu.py fails when `run` gains an option that is not here, so a new option is never
# silently dropped by --gpus / --processes / --ray.
HANDLED_RUN_OPTIONS = frozenset({"target", "arms", "T", "buckets", "device", "seconds", "examples", "seed", "property",
                                 "round_examples", "json", "corpus", "no_corpus", "no_isolate", "record", "warm_up",
                                 "fail_on_known", "launch_timeout", "torch_threads", "draws", "gpus", "processes",
                                 "seeds_per_example", "pool_scales", "ray", "restarts", "shrink_grace", "pipeline", "defer_verdicts",
                                 "release", "mps"})  # release: GDN_FUZZ_RELEASE, set by cmd_run, reaches every worker's environment


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


def target_name_of(name: str | None) -> str:
    """The name a target's corpus entries carry (Target.name: a PATH.py target's is its path as given,
    expanded), without loading it; the name itself where it cannot be resolved here (the worker says why)."""
    try:
        return get_target(name or default_target_name()).name
    except (TargetUnavailable, ValueError):
        return name or "reference"


class ProcessBackend:
    """Workers as child processes of this host (module doc)."""

    name = "processes"

    def __init__(self, out_dir: Path, stem: str):
        self.out_dir, self.stem = Path(out_dir), stem
        self.procs: dict[str, subprocess.Popen] = {}
        self._threads: list[threading.Thread] = []

    def log_path(self, label: str) -> Path:
        return self.out_dir / f"{self.stem}.{label}.log"

    def start(self, spec, events) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if spec.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = spec.gpu
        r, w = os.pipe()
        try:
            with open(self.log_path(spec.label), "a") as log:
                p = subprocess.Popen([sys.executable, "-m", "gdn_fuzz.engine.worker", "--events-fd", str(w)],
                                     pass_fds=(w,), env=env, stdin=subprocess.PIPE, stdout=log,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=_pdeathsig())
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.procs[spec.label] = p
        self.tell(spec.label, spec.to_dict())
        t = threading.Thread(target=self._read, args=(r, spec.label, spec.attempt, p, events), daemon=True,
                             name=f"gdn_fuzz-events-{spec.label}")
        t.start()
        self._threads.append(t)

    @staticmethod
    def _read(fd: int, label: str, attempt: int, p: subprocess.Popen, events) -> None:
        with os.fdopen(fd) as fh:
            for line in fh:
                try:
                    events.put((label, attempt, json.loads(line)))
                except ValueError:  # a line cut by a dying child
                    continue
        rc = p.wait()
        cause = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        events.put((label, attempt, dict(kind="exit", code=rc, cause=cause)))

    def tell(self, label: str, msg: dict) -> None:
        p = self.procs.get(label)
        if p is None or p.stdin is None:
            return
        try:
            p.stdin.write(json.dumps(msg) + "\n")
            p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the child is gone
            pass

    def _signal(self, label: str, sig) -> None:
        p = self.procs.get(label)
        if p is not None and p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, label: str) -> None:
        self._signal(label, signal.SIGINT)

    def terminate(self, label: str) -> None:
        self._signal(label, signal.SIGTERM)

    def kill(self, label: str) -> None:
        self._signal(label, signal.SIGKILL)

    def close(self) -> None:
        """Wait for every child (SIGTERM to one still running, SIGKILL after TERM_GRACE_S)."""
        for label, p in self.procs.items():
            if p.poll() is None:
                try:
                    p.wait(timeout=TERM_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.terminate(label)
                    try:
                        p.wait(timeout=TERM_GRACE_S)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            if p.stdin is not None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for t in self._threads:
            t.join(timeout=5)


def start_daemons(mode: str, device: str, per_device: int, gpus: list[str] | None,
                  control: str | None = None) -> tuple[dict, str]:
    """--mps: the MPS daemons of a run ({gpu (None: the run's own device): started mps.Daemon}) and one line saying
    what was decided and why.  mode 'on' raises mps.MpsError where auto would go without (the reason named)."""
    if mode == "off":
        return {}, "off (--mps off)"
    why = mps.why_not(device, per_device, control=control)
    if why is None:
        daemons: dict = {}
        try:
            for g in (gpus or [None]):
                daemons[g] = mps.Daemon(g, control=control).start()
        except mps.MpsError as e:
            for d in daemons.values():
                d.stop()
            why = str(e)
        else:
            return daemons, f"on: a private daemon per GPU ({len(daemons)}), stopped after the run"
    if mode == "on":
        raise mps.MpsError(f"--mps on: {why}")
    return {}, f"not used: {why}"


def run_processes(args, corpus_dir: str | None, console, *, device: str, per_device: int,
                  gpus: list[str] | None = None) -> int:
    """per_device workers on each GPU of gpus (CUDA_VISIBLE_DEVICES = that GPU), or on `device` itself when
    gpus is None (the environment kept): one fleet (gdn_fuzz.engine.fleet), exit status as it says.  --mps: the
    workers of one GPU share its MPS daemon (start_daemons), stopped when the fleet ends."""
    daemons, mps_said = start_daemons(mps.parse_mps(getattr(args, "mps", "auto")), device, per_device, gpus)
    try:
        return _run_processes(args, corpus_dir, console, device=device, per_device=per_device, gpus=gpus,
                              daemons=daemons, mps_said=mps_said)
    finally:
        for d in daemons.values():
            d.stop()
            if d.stopped_by == "killed":
                console.print(f"the MPS daemon of GPU {d.gpu or device} did not quit: its processes were killed")


def _run_processes(args, corpus_dir, console, *, device, per_device, gpus, daemons, mps_said) -> int:
    slots = [(g, k) for g in (gpus or [None]) for k in range(per_device)]
    where = "".join(c for c in str(device) if c.isalnum())
    labels = [f"gpu{g}.p{k}" if g is not None else f"{where}.p{k}" for g, k in slots]
    threads = getattr(args, "torch_threads", None) or threads_per_worker(len(slots))
    out_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="gdn_fuzz_procs_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(args.json).stem if args.json else "campaign"
    target_name = target_name_of(args.target)
    if corpus_dir is not None:
        corpus.clean_stale_temps(corpus_dir)
    known = {} if corpus_dir is None else corpus.known_signatures(target_name, corpus_dir)
    specs = plan(args, target_name=target_name, device=device, labels=labels,
                 gpus=None if gpus is None else [g for g, _ in slots], torch_threads=threads, known=known)
    specs = [dataclasses.replace(s, mps_pipe=daemons[s.gpu].pipe) if s.gpu in daemons else s for s in specs]
    on = f"GPUs {','.join(gpus)}" if gpus else f"device {device}"
    title = (f"gdn-fuzz run: {len(slots)} campaign processes ({per_device} per device) on {on} (seeds "
             f"{args.seed}..{args.seed + len(slots) - 1}, {threads} torch threads each; target {target_name}; "
             f"{len(known)} known bug signature(s); MPS {mps_said}), logs in {out_dir}")
    fleet = Fleet(ProcessBackend(out_dir, stem), specs, target_name=target_name, corpus_dir=corpus_dir,
                  console=console, json_path=args.json, record_path=getattr(args, "record", None), known=known,
                  restarts=getattr(args, "restarts", 3), fail_on_known=getattr(args, "fail_on_known", False),
                  title=title, info=dict(gpus=gpus, device=device, processes_per_device=per_device, mps=mps_said))
    return fleet.run()
