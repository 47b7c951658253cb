"""One campaign worker: the single implementation that every way of running campaigns uses.

`gdn-fuzz run` in one process builds its Campaign here (make_campaign) and writes the record made
here (campaign_record).  A fleet (gdn_fuzz.engine.fleet: `--processes N`, `--gpus`, `--ray`) runs
run_worker() in each of its workers, a child process (this module's main(), started by
gdn_fuzz.engine.multigpu) or a Ray actor (gdn_fuzz.engine.raycluster), and reads what it does as a
stream of events.  A worker never writes the corpus: its driver is the one corpus writer.

WorkerSpec is everything a worker is told, as JSON data: target, device, its seed and its share of
the arms and properties, the budget, the known bug signatures (the driver's corpus), and for a
restarted worker the case its lost predecessor had in flight (`recheck`).

Events (dicts, JSON-able; "kind" says which), in the order a worker sends them:

  hello     pid, host, target file and its SHA-256, versions, CUDA_VISIBLE_DEVICES, GPU name
  recheck   a lost predecessor's in-flight case checked again in a fresh isolated process first:
            "passed", or the signatures it failed with (a new one is also sent as a finding)
  inflight  the property and Case about to be checked (before every check: what the driver
            records when this worker dies)
  progress  counts (examples, launches, compiles, new and known signatures, ...), every 0.5 s
  records   per-example JSON lines (`--record`), batched with progress
  first     the first failing example of a new signature, at once, with its corpus entry (the
            driver stores it if this worker dies while shrinking it)
  finding   a new finding after shrinking: its record, its corpus entry, the explanation text
  done      the campaign's record (campaign_record) and the worker's exit status
  error     the worker cannot run here (target, device, setup): one line; exit 2

A driver may tell a running worker (Campaign.learn / request_stop): {"known": {signature: entry}}
for bugs another worker found (treated as known from the next round on), {"stop": true} for a
clean stop (what a first Ctrl-C does: what was found is sent, then done with interrupted=true).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from gdn_fuzz.case import Case, draws_for
from gdn_fuzz.prefix_case import load_case
from gdn_fuzz.findings import group_findings, groups_record
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.campaign import Campaign, CampaignFinding
from gdn_fuzz.engine.exits import EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from gdn_fuzz.engine.isolation import SetupError
from gdn_fuzz.engine.reproducer import explain
from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import buckets_for, geometries_for, pool_scales_for
from gdn_fuzz.targets import TargetUnavailable, get_target

PROGRESS_EVERY_S = 0.5  # a worker's progress (and record lines) reach its driver this often


def resolve_draws(draws: str, device: str) -> str:
    """--draws auto|device -> Case.draws of the device ('cuda' on a CUDA device, else 'cpu'); cpu -> 'cpu'."""
    return "cpu" if draws == "cpu" else draws_for(device)


@dataclass
class WorkerSpec:
    """What one campaign worker is told (JSON data: to_dict / from_dict)."""

    label: str  # the worker's name in logs, tables and file names: "cpu.p0", "gpu1.p3", "ray2"
    target: str
    device: str
    seed: int
    arms: tuple
    properties: tuple
    Ts: tuple = (4, 8)
    buckets: tuple | None = None  # None: strategies.buckets_for(target), decided by the worker
    pool_scales: tuple | None = None  # None: strategies.pool_scales_for(its device), decided by the worker
    seconds: float | None = None
    examples: int | None = None
    round_examples: int = 25
    isolate: bool = True
    launch_timeout: float | None = None
    torch_threads: int | None = None
    draws: str = "auto"
    seeds_per_example: int = 1
    shrink_grace: float = 0.0  # Campaign.shrink_grace_s
    pipeline: int | None = None  # Campaign.pipeline (None: campaign.pipeline_default of its device)
    defer: bool | None = None  # Campaign.defer (None: campaign.defer_default, $GDN_FUZZ_DEFER_VERDICTS)
    warm_up: bool = False
    fail_on_known: bool = False
    known: dict = field(default_factory=dict)  # signature -> corpus entry name (the driver's corpus)
    record: bool = False  # send per-example record lines
    slot: int = 0  # the worker's place in the fleet's plan
    attempt: int = 0  # 0; k after k restarts of this slot
    recheck: tuple = ()  # ({"prop", "case", "lost"}, ...): the in-flight case of a lost predecessor
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES the process backend gives it (None: inherited / Ray's)
    mps_pipe: str | None = None  # the pipe folder of its GPU's MPS daemon (gdn_fuzz.engine.mps; None: none)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "WorkerSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"WorkerSpec: unknown fields {unknown} (driver and worker run different gdn_fuzz "
                             "versions? install the same one on every host)")
        d = dict(d)
        for k in ("arms", "properties", "Ts", "recheck"):
            d[k] = tuple(d[k]) if k in d else d.get(k)
        for k in ("buckets", "pool_scales"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)


def make_campaign(spec: WorkerSpec, target, *, corpus_dir=None, record=None) -> tuple[Campaign, str | None]:
    """The Campaign a spec describes (and the note saying why a pool-scale kind was left out, or None).
    corpus_dir: where the campaign writes its findings itself (a single-process run; a fleet worker
    gets None: its driver writes); record: a path or a writer for the per-example lines."""
    geoms = geometries_for(target)
    if spec.pool_scales is None:
        pool_scales, note = pool_scales_for(spec.device, geoms, spec.arms)
    else:
        pool_scales, note = tuple(k for k in spec.pool_scales if k != "none"), None
    camp = Campaign(target=target, device=spec.device, properties=[get_property(p) for p in spec.properties],
                    arms=tuple(spec.arms), Ts=tuple(spec.Ts), geometries=geoms,
                    buckets=tuple(spec.buckets or buckets_for(target)), seed=spec.seed,
                    round_examples=spec.round_examples, isolate=spec.isolate, corpus_dir=corpus_dir,
                    record_path=record, known=dict(spec.known), launch_timeout_s=spec.launch_timeout,
                    torch_threads=spec.torch_threads, draws=resolve_draws(spec.draws, spec.device),
                    seeds_per_example=spec.seeds_per_example, pool_scales=pool_scales,
                    shrink_grace_s=spec.shrink_grace, pipeline=spec.pipeline, defer=spec.defer,
                    mps_pipe=spec.mps_pipe)
    return camp, note


def campaign_groups(camp: Campaign) -> list[dict]:
    """The campaign's new findings grouped by bug (findings.group_findings of their records)."""
    return group_findings([f.to_record() for f in camp.findings.values()])


def campaign_record(camp: Campaign, spec: WorkerSpec, target, budget_s: float | None,
                    groups: list[dict] | None = None) -> dict:
    """The JSON record of one campaign (`gdn-fuzz run --json`, and each worker of a fleet); groups:
    campaign_groups(camp), where the caller has them."""
    s = camp.stats
    groups = campaign_groups(camp) if groups is None else groups
    return dict(target=str(target), path=str(target.path), device=spec.device, arms=list(camp.arms), T=list(camp.Ts),
                properties=[p.name for p in camp.properties], buckets=list(camp.buckets),
                pool_scales=list(camp.pool_scales), seed=spec.seed, examples=s.examples, launches=s.launches,
                compiles=s.compiles, structures=s.structures, seeds_per_example=spec.seeds_per_example,
                pipeline=camp.pipeline, defer_verdicts=camp.defer, defer_depth=camp.defer_depth if camp.defer else None,
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                warmup_s=s.warmup_s, warmup_compiles=s.warmup_compiles, budget_s=budget_s,
                shrink_grace_s=camp.shrink_grace_s, grace_used_s=s.grace_s, confirm_wait_s=round(s.confirm_wait_s, 3),
                graphs=camp.graph_counts(), drawn_ahead=camp.drawn_ahead(),
                worker_startups=camp.worker_startups(), confirmations=camp.confirmations(),
                confirmations_at_once=camp.confirmations_at_once if camp.isolate else None, mps=camp.mps_summary(),
                budget_examples=spec.examples, interrupted=camp.interrupted, per_property=s.per_property,
                seconds=s.elapsed, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                versions=run_versions(),
                findings=[r for g in groups for r in g["records"]], groups=groups_record(groups),
                known=camp.known_summary(), machine_failures=dict(camp.env_failures),
                unconfirmed=camp.unconfirmed)


def run_versions() -> dict:
    """The versions a campaign ran with (installed distributions' metadata and the interpreter's)."""
    import platform

    from gdn_fuzz.environment import dist_version

    return {"python": platform.python_version(),
            **{d: dist_version(d) for d in ("gdn-fuzz", "torch", "hypothesis", "flashinfer-python", "nvidia-cutlass-dsl",
                                            "triton")}}


def exit_status(camp: Campaign, fail_on_known: bool) -> int:
    """The exit status of one campaign (README: exit codes)."""
    if camp.interrupted:
        return EXIT_INTERRUPTED
    if camp.findings:
        return EXIT_NEW
    if camp.known_hits and fail_on_known:
        return EXIT_KNOWN_ONLY
    return EXIT_OK


def file_sha256(path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def finding_payload(prop: str, case: Case, findings, signature: str, target_name: str) -> dict:
    """A failure as its driver needs it: the corpus entry (made here, with this host's versions), the
    findings as data and as text."""
    entry = corpus.make_entry(prop, case, findings, target_name, signature=signature)
    return dict(signature=signature, prop=prop, case=case.to_dict(), entry=entry.to_dict(),
                findings=[dataclasses.asdict(f) for f in findings], lines=[str(f) for f in findings])


class _RecordLines:
    """Campaign.record_path for a fleet worker: the per-example lines, sent with progress."""

    def __init__(self):
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def write(self, s: str) -> None:
        with self._lock:
            self.lines.extend(x for x in s.splitlines() if x)

    def flush(self) -> None:
        pass

    def take(self) -> list[str]:
        with self._lock:
            out, self.lines = self.lines, []
        return out


def _progress(camp: Campaign) -> dict:
    s = camp.stats
    return dict(kind="progress", examples=s.examples, structures=s.structures, launches=s.launches,
                rounds=s.rounds, compiles=camp._compiles(), elapsed=s.elapsed, warmup_s=s.warmup_s,
                new=sorted(camp.findings), known_hits=dict(camp.known_hits), repeats=dict(camp.repeats))


def run_worker(spec: WorkerSpec, emit, *, on_campaign=lambda camp: None, log=None) -> int:
    """Run the campaign `spec` describes, sending its events to emit(event) (module doc); returns the
    worker's exit status.  on_campaign(camp) is called once the Campaign exists (a control channel
    uses it for request_stop and learn); log(text) gets a human-readable line now and then."""
    log = log or (lambda text: None)
    try:
        target = get_target(spec.target)
    except (TargetUnavailable, ValueError) as e:
        emit(dict(kind="error", message=f"target {spec.target!r} unavailable on {socket.gethostname()}: {e}"))
        return EXIT_USAGE
    import torch

    if str(spec.device).startswith("cuda") and not torch.cuda.is_available():
        emit(dict(kind="error", message=f"--device {spec.device}: {socket.gethostname()} has no usable CUDA device "
                                        f"(torch {torch.__version__}; CUDA_VISIBLE_DEVICES="
                                        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})"))
        return EXIT_USAGE
    why = target.unavailable_reason(spec.device)
    if why:
        emit(dict(kind="error", message=why))
        return EXIT_USAGE
    try:
        for a in spec.arms:
            target.module(a)  # import every arm up front: a module that does not fit fails here, clearly
    except Exception as e:  # noqa: BLE001 - a target that cannot be imported is a setup error
        emit(dict(kind="error", message=f"target {target} cannot be loaded: {type(e).__name__}: "
                                        f"{str(e).splitlines()[0] if str(e) else ''}"))
        return EXIT_USAGE
    records = _RecordLines() if spec.record else None
    camp, pool_note = make_campaign(spec, target, record=records)
    on_campaign(camp)
    gpu = torch.cuda.get_device_name() if str(spec.device).startswith("cuda") else None
    emit(dict(kind="hello", pid=os.getpid(), host=socket.gethostname(), target=str(target), path=str(target.path),
              sha256=file_sha256(target.path), versions=corpus.versions(), gpu=gpu,
              cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), arms=list(camp.arms),
              properties=[p.name for p in camp.properties], seed=spec.seed, attempt=spec.attempt,
              pool_note=pool_note))
    log(f"gdn-fuzz worker {spec.label}: target={target} ({target.path}) device={spec.device} "
        f"arms={','.join(camp.arms)} T={list(camp.Ts)} properties={','.join(p.name for p in camp.properties)} "
        f"seed={spec.seed} attempt={spec.attempt}; {len(camp.known)} known bug signature(s)")
    last = [0.0]

    def tick():
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            send_progress()

    def send_progress():
        emit(_progress(camp))
        if records is not None:
            lines = records.take()
            if lines:
                emit(dict(kind="records", lines=lines))

    def first(sig, prop, case, found, t, n):
        emit(dict(kind="first", t=t, examples_before=n, **finding_payload(prop, case, found, sig, target.name)))
        log(f"failure {sig} (property {prop}, {t:.1f}s, after {n} examples; shrinking)")

    def found(f: CampaignFinding):
        try:
            text = explain(f.prop, f.case, f.findings, f.signature, target, spec.device,
                           check=lambda c: camp.check_aside(f.prop, c))
        except Exception as e:  # noqa: BLE001 - the explanation is a courtesy; the finding stands
            text = f"(the launch could not be explained: {type(e).__name__}: {e})"
        emit(dict(kind="finding", record=f.to_record(), explain=text,
                  **finding_payload(f.prop, f.case, f.findings, f.signature, target.name)))
        log(f"finding {f.signature}")

    seconds = spec.seconds if spec.seconds is not None else (None if spec.examples else 60.0)
    try:
        for item in spec.recheck:
            r = camp.recheck(item["prop"], load_case(item["case"]), on_finding=found)
            emit(dict(kind="recheck", lost=item.get("lost"), prop=item["prop"], **r))
        if spec.warm_up:
            camp.warm_up()
            log(f"warm-up: {camp.stats.warmup_s:.1f}s, {camp.stats.warmup_compiles} JIT compiles (outside the budget)")
        camp.run(seconds=seconds, examples=spec.examples, on_example=tick, on_finding=found, on_first=first,
                 on_check=lambda prop, case: emit(dict(kind="inflight", prop=prop, case=case.to_dict(),
                                                       n=camp.stats.examples)))
    except SetupError as e:  # the machine cannot run checks: not a finding
        camp.close()
        emit(dict(kind="error", message=f"setup error: {e}"))
        return EXIT_USAGE
    except KeyboardInterrupt:  # before or during the warm-up (run() turns its own into a clean stop)
        camp.interrupted = True
        camp.close()
    send_progress()
    rc = exit_status(camp, spec.fail_on_known)
    emit(dict(kind="done", exit=rc, record=campaign_record(camp, spec, target, seconds)))
    log(f"done: {camp.stats.examples} examples in {camp.stats.elapsed:.1f}s, {len(camp.findings)} new finding(s), "
        f"exit {rc}")
    return rc


# ---------------------------------------------------------------- the process backend's child


def main(argv=None) -> int:
    """`python -m gdn_fuzz.engine.worker --events-fd N`: one worker of gdn_fuzz.engine.multigpu.

    The spec is the first line of stdin; later lines are the driver's messages ({"known": ...},
    {"stop": true}).  Events are JSON lines on file descriptor N; stdout and stderr are the log.
    SIGINT (forwarded by the driver) is the Campaign's own clean stop; SIGTERM is one too, and the
    exit status is then 143."""
    ap = argparse.ArgumentParser(prog="python -m gdn_fuzz.engine.worker")
    ap.add_argument("--events-fd", type=int, required=True)
    args = ap.parse_args(argv)
    os.set_inheritable(args.events_fd, False)  # a grandchild holding it would keep the driver from seeing EOF
    out = os.fdopen(args.events_fd, "w", buffering=1)
    lock = threading.Lock()

    def emit(ev: dict) -> None:
        line = json.dumps(ev)
        with lock:
            try:
                out.write(line + "\n")
                out.flush()
            except (BrokenPipeError, OSError):  # the driver is gone: nobody to tell
                pass

    spec = WorkerSpec.from_dict(json.loads(sys.stdin.readline()))
    box: dict = dict(camp=None, stop=False, known={}, term=False)

    def on_campaign(camp):
        box["camp"] = camp
        camp.learn(box["known"])
        if box["stop"]:
            camp.request_stop()

    def control():
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("known"):
                box["known"].update(msg["known"])
                if box["camp"] is not None:
                    box["camp"].learn(msg["known"])
            if msg.get("stop"):
                box["stop"] = True
                if box["camp"] is not None:
                    box["camp"].request_stop()

    threading.Thread(target=control, daemon=True, name="gdn_fuzz-control").start()

    def on_term(signum, frame):
        box["term"] = box["stop"] = True
        if box["camp"] is not None:
            box["camp"].request_stop()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        rc = run_worker(spec, emit, on_campaign=on_campaign, log=lambda text: print(text, flush=True))
    except KeyboardInterrupt:  # stopped before its campaign existed (loading the target): nothing found yet
        rc = EXIT_INTERRUPTED
    out.close()
    return EXIT_TERMINATED if box["term"] else rc


if __name__ == "__main__":
    sys.exit(main())
