"""A campaign over several workers: the plan, the one corpus writer, the merge (issue 19).

`gdn-fuzz run --processes N` (N > 1), `--gpus G1,G2` and `--ray auto|ADDRESS` are one driver, this
module's Fleet, over one worker implementation (gdn_fuzz.engine.worker.run_worker), on one of two
backends that only start, message and stop workers:

  processes  gdn_fuzz.engine.multigpu: child processes of this host (CUDA_VISIBLE_DEVICES per GPU
             with --gpus); no dependency beyond gdn_fuzz
  ray        gdn_fuzz.engine.raycluster: one Ray actor per GPU of a cluster (CPU actors for a CPU
             device); the optional extra gdn-fuzz[cluster]

The plan (plan_shares): worker k gets seed + k and a share of the arms and the properties, so the
workers search different parts of the space (and each JIT-compiles only its own arms); every (arm,
property) pair is in some share.  Budgets are per worker.

The driver is the one corpus writer.  Workers stream events (worker module doc); the driver
  - files each new signature once, whichever worker found it first (corpus.write: atomic, named by
    the failure's identity), and tells every other worker that it is known now (they go on
    searching for other signatures instead of shrinking it again);
  - keeps each worker's in-flight case and unshrunk first failures: when a worker dies (a crash
    of its own process, a lost node, the out-of-memory killer) they are recorded (`lost` in the
    merged record; a failure it was shrinking is stored with its first failing case, shrunk=false),
    and the worker is restarted (at most `restarts` times per worker, with the budget it had left,
    a new seed, everything found so far as known) after checking that in-flight case again in a
    fresh isolated process first;
  - prints the merged live counts, then the summary: per worker, per signature (who found it),
    known bugs, lost workers; and writes the merged JSON record and each worker's own record.

Exit status: 143 after SIGTERM, 130 after an interrupt, 2 when a worker could not run (or was lost
with no restart left), 1 for new findings, 3 for known bugs only with --fail-on-known, else 0.
Signals: a first Ctrl-C asks every worker to stop cleanly (each sends what it found), a second asks
again (the processes backend: a second SIGINT stops the child's campaign at once), a third kills
them; SIGTERM asks them to stop and kills them after TERM_GRACE_S.  The driver waits for all.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from gdn_fuzz.arms import ARM_NAMES, parse_arms
from gdn_fuzz.case import Case
from gdn_fuzz.prefix_case import load_case
from gdn_fuzz.findings import group_findings, groups_line, groups_record
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.exits import EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from gdn_fuzz.engine.campaign import parse_defer, parse_pipeline
from gdn_fuzz.engine.worker import WorkerSpec
from gdn_fuzz.properties import REGISTRY, for_kernel
from gdn_fuzz.targets import kernel_of

NARROW_COLUMNS = 120  # as gdn_fuzz.cli.run's: below this width the workers' table drops four columns

TERM_GRACE_S = 10.0  # after SIGTERM, seconds the workers have before they are killed
STATUS_EVERY_S = 10.0  # a status line this often when the console is not a terminal
DEFAULT_RESTARTS = 3  # restarts of one lost worker slot


def plan_shares(n: int, arms, props) -> list[tuple[tuple, tuple]]:
    """n (arms, properties) shares covering every (arm, property) pair.

    a = min(n, len(arms)) arm groups and p = min(max(1, n // a), len(props)) property groups (round
    robin, so each group is a spread of the list); worker k gets arm group k mod a and property group
    (k // a) mod p.  The first a * p workers cover every pair; the rest repeat shares (with their own
    seeds).  Arms are split first: a JIT compile is per arm (and T and bucket), so a worker that runs
    fewer arms compiles less."""
    arms, props = tuple(arms), tuple(props)
    if n < 1 or not arms or not props:
        raise ValueError(f"plan_shares(n={n}, {len(arms)} arms, {len(props)} properties): need n >= 1 and "
                         "at least one arm and one property")
    a = min(n, len(arms))
    p = min(max(1, n // a), len(props))
    arm_groups = [arms[i::a] for i in range(a)]
    prop_groups = [props[j::p] for j in range(p)]
    return [(arm_groups[k % a], prop_groups[(k // a) % p]) for k in range(n)]


def plan(args, *, target_name: str, device: str, labels: list[str], gpus: list | None = None,
         torch_threads: int | None = None, known: dict | None = None) -> list[WorkerSpec]:
    """The workers' specs from `gdn-fuzz run`'s options: worker k (labels[k], CUDA_VISIBLE_DEVICES
    gpus[k]) gets seed + k and share k of plan_shares; every other option as given (buckets and
    pool scales left to each worker's default when not given)."""
    arms = parse_arms(args.arms) if getattr(args, "arms", None) else ARM_NAMES
    props = tuple(args.property) if getattr(args, "property", None) else tuple(for_kernel(kernel_of(target_name)))
    shares = plan_shares(len(labels), arms, props)
    g = getattr
    return [WorkerSpec(label=label, target=target_name, device=device, seed=args.seed + k, arms=a, properties=p,
                       Ts=tuple(args.T), buckets=tuple(args.buckets) if g(args, "buckets", None) else None,
                       pool_scales=tuple(args.pool_scales) if g(args, "pool_scales", None) else None,
                       seconds=args.seconds, examples=args.examples, round_examples=args.round_examples,
                       isolate=not g(args, "no_isolate", False), launch_timeout=g(args, "launch_timeout", None),
                       torch_threads=torch_threads or g(args, "torch_threads", None), draws=g(args, "draws", "auto"),
                       seeds_per_example=int(g(args, "seeds_per_example", 1)), warm_up=g(args, "warm_up", False),
                       shrink_grace=float(g(args, "shrink_grace", 0.0)), pipeline=parse_pipeline(g(args, "pipeline", None)),
                       defer=parse_defer(g(args, "defer_verdicts", None)),
                       fail_on_known=g(args, "fail_on_known", False), known=dict(known or {}),
                       record=bool(g(args, "record", None)), slot=k, gpu=None if gpus is None else gpus[k])
            for k, (label, (a, p)) in enumerate(zip(labels, shares))]


class _Slot:
    """One place of the plan: its spec, the attempt running now, what the driver knows of it."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec  # the running attempt's spec
        self.first_spec = spec
        self.state = "starting"  # starting | running | done | failed | lost | stopped
        self.hello: dict | None = None
        self.progress: dict = {}
        self.used_s = 0.0  # campaign seconds of the finished attempts
        self.used_examples = 0
        self.inflight: dict | None = None
        self.pending: dict = {}  # signature -> "first" event not followed by its "finding"
        self.records: list[dict] = []  # each attempt's campaign record, with worker fields
        self.error = ""
        self.done = False  # this attempt sent done or error
        self.exit: int | None = None

    @property
    def label(self) -> str:
        return self.spec.label


class Fleet:
    """The driver: start the workers on a backend, merge their events, restart the lost (module doc)."""

    def __init__(self, backend, specs: list[WorkerSpec], *, target_name: str, corpus_dir, console,
                 json_path=None, record_path=None, known: dict | None = None, restarts: int = DEFAULT_RESTARTS,
                 fail_on_known: bool = False, title: str = "", info: dict | None = None):
        self.backend, self.console = backend, console
        self.slots = {s.label: _Slot(s) for s in specs}
        self.target_name = target_name
        self.corpus_dir = None if corpus_dir is None else Path(corpus_dir)
        self.json_path = None if json_path is None else Path(json_path)
        self.record_path = record_path
        self.known = dict(known or {})  # signature -> entry: the corpus's open entries at the start
        self.restarts, self.fail_on_known = restarts, fail_on_known
        self.title, self.info = title, dict(info or {})
        self.events: queue.Queue = queue.Queue()
        self.findings: dict = {}  # signature -> merged finding record
        self.known_hits: Counter = Counter()  # known signature -> examples that showed it (all workers)
        self.lost: list[dict] = []
        self.corpus_writes: list[dict] = []
        self.sigint = 0
        self.term_at: float | None = None
        self.t0 = time.monotonic()
        self._old_handlers: dict = {}
        self._last_status = 0.0
        self._kill_sent = False

    # ---------------------------------------------------------------- run

    @property
    def stopping(self) -> bool:
        return self.sigint > 0 or self.term_at is not None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> int:
        self.t0 = self._last_status = time.monotonic()
        self._catch_signals()
        try:
            for slot in self.slots.values():
                if self.stopping:  # stopped while starting: start no more
                    slot.state, slot.done = "stopped", True
                    continue
                self.backend.start(slot.spec, self.events)
            self.console.print(self.title, markup=False)
            while not all(s.done and s.state in ("done", "failed", "lost", "stopped") for s in self.slots.values()):
                self._step()
        finally:
            live = [s.label for s in self.slots.values() if s.state in ("starting", "running")]
            if live:  # the driver stops early (an error): no worker outlives it
                for label in live:
                    self.backend.kill(label)
            self.backend.close()
            self._restore_signals()
        return self._finish()

    def _step(self) -> None:
        try:
            label, attempt, ev = self.events.get(timeout=0.25)
        except queue.Empty:
            label = None
        if self.term_at is not None and not self._kill_sent and time.monotonic() - self.term_at > TERM_GRACE_S:
            self._kill_sent = True
            for s in self.slots.values():
                if s.state in ("starting", "running"):
                    self.backend.kill(s.label)
        if label is not None:
            slot = self.slots[label]
            if attempt == slot.spec.attempt:  # events of an attempt that was replaced are dropped
                self._feed(slot, ev)
        now = time.monotonic()
        if now - self._last_status >= STATUS_EVERY_S:
            self._last_status = now
            self.console.print(self.status_line(), markup=False)

    # ---------------------------------------------------------------- events

    def _feed(self, slot: _Slot, ev: dict) -> None:
        kind = ev.get("kind")
        if kind == "inflight":
            slot.inflight = ev
        elif kind == "progress":
            slot.progress = ev
        elif kind == "records":
            if self.record_path:
                with open(f"{self.record_path}.{slot.label}", "a") as fh:
                    fh.write("".join(x + "\n" for x in ev["lines"]))
        elif kind == "hello":
            slot.hello, slot.state = ev, "running"
            gpu = f", GPU {ev['gpu']} (CUDA_VISIBLE_DEVICES={ev.get('cuda_visible_devices')})" if ev.get("gpu") else ""
            self.console.print(f"worker {slot.label} started: pid {ev['pid']} on {ev['host']}{gpu}; arms "
                               f"{','.join(ev['arms'])}; properties {','.join(ev['properties'])}; seed {ev['seed']}"
                               + (f"; attempt {ev['attempt']}" if ev.get("attempt") else ""), markup=False)
            others = {x.hello["sha256"] for x in self.slots.values() if x.hello and x is not slot}
            if others and ev.get("sha256") not in others:
                self.console.print(f"[yellow]warning:[/yellow] worker {slot.label} on {ev['host']} runs {ev['path']} "
                                   f"with SHA-256 {str(ev.get('sha256'))[:12]}, other workers a different file "
                                   f"({', '.join(sorted(str(x)[:12] for x in others))}): install the same target on "
                                   "every host", markup=True)
            if ev.get("pool_note") and slot.spec.slot == 0:
                self.console.print(ev["pool_note"], markup=False)
        elif kind == "first":
            slot.pending[ev["signature"]] = ev
            if ev["signature"] not in self.findings:
                self.console.print(f"[red]failure[/red] {ev['signature']}  (worker {slot.label}, property {ev['prop']}, "
                                   f"{ev['t']:.1f}s, after {ev['examples_before']} examples; shrinking)",
                                   markup=True, highlight=False)
        elif kind == "finding":
            slot.pending.pop(ev["signature"], None)
            self._file(slot.label, ev, ev["record"])
        elif kind == "recheck":
            for rec in self.lost:
                if rec["id"] == ev.get("lost"):
                    rec["checked_again"] = dict(outcome=ev["outcome"], signatures=ev["signatures"], new=ev["new"],
                                                by=slot.label)
        elif kind == "done":
            rec = dict(ev["record"], worker=slot.label, attempt=slot.spec.attempt, exit=ev["exit"],
                       gpu=slot.spec.gpu, process=slot.spec.slot,
                       host=(slot.hello or {}).get("host"), pid=(slot.hello or {}).get("pid"))
            slot.records.append(rec)
            slot.exit, slot.done, slot.state = ev["exit"], True, "done"
            for k in rec.get("known", []):
                if k["signature"] in self.known:
                    self.known_hits[k["signature"]] += k["examples"]
            self._write_worker_record(slot, rec)
        elif kind == "error":
            slot.error, slot.done, slot.state = ev["message"], True, "failed"
            self.console.print(f"[red]worker {slot.label} cannot run:[/red] {ev['message']}", markup=True)
        elif kind == "exit":
            self._exited(slot, ev)

    def _file(self, label: str, payload: dict, record: dict) -> None:
        """A new finding from a worker: stored once (the first), a later shrunk case replaces a lost
        worker's unshrunk one; every other worker is told."""
        sig = payload["signature"]
        if sig in self.known:
            return
        cur = self.findings.get(sig)
        if cur is not None and not (record.get("shrunk") and not cur["shrunk"]):
            cur["found_by"].append(label)
            return
        entry = corpus.from_dict(payload["entry"], where=f"sent by worker {label}")
        path, new, note = None, False, ""
        if self.corpus_dir is not None:
            try:
                path, new = corpus.write(entry, self.corpus_dir, replace=cur is not None)
                self.corpus_writes.append(dict(signature=sig, entry=path.name, worker=label, written=new,
                                               replaced=cur is not None))
            except PermissionError as e:  # a read-only corpus (CI): the finding is still reported
                note = str(e).splitlines()[0]
        merged = dict(record, signature=sig, prop=payload["prop"], worker=label,
                      found_by=(cur["found_by"] if cur else []) + [label], first_s=self.elapsed(),
                      corpus_entry=None if path is None else path.name, entry_new=new, entry_note=note,
                      explain=payload.get("explain", ""), lines=payload["lines"])
        if cur is not None:
            merged["first_s"] = cur["first_s"]
            merged["replaced_unshrunk_from"] = cur["worker"]
        self.findings[sig] = merged
        self._print_finding(merged, path, replaced=cur is not None)
        name = path.name if path is not None else entry.filename()
        for s in self.slots.values():
            if s.label != label and s.state in ("starting", "running"):
                self.backend.tell(s.label, {"known": {sig: name}})

    def _print_finding(self, f: dict, path, replaced: bool) -> None:
        p = self.console.print
        if replaced:
            p(f"[red]finding[/red] {f['signature']}: worker {f['worker']}'s shrunk case replaces the unshrunk one "
              f"stored for lost worker {f['replaced_unshrunk_from']}", markup=True)
        else:
            p(f"[red]finding[/red] {f['signature']}  (worker {f['worker']})", markup=True)
        t = f.get("first_failure_s")
        p(f"  property {f['prop']}; first failing example at {t if t is None else round(t, 1)}s of the worker's "
          f"campaign after {f.get('examples_before')} examples; "
          + (f"shrunk in {f['shrink_s']:.1f}s" if f.get("shrunk") else "not shrunk (best case so far)")
          + (f"; {f['note']}" if f.get("note") else ""), markup=False)
        if f.get("explain"):
            p(f["explain"], markup=False)
        for line in f["lines"]:
            p("  " + line, markup=False)
        if path is not None:
            p(f"  corpus: {path} ({'new entry' if f['entry_new'] or replaced else 'already in the corpus'})", markup=False)
        elif f.get("entry_note"):
            p(f"  corpus: {f['entry_note']}", markup=False)

    def _exited(self, slot: _Slot, ev: dict) -> None:
        """A worker's stream ended.  After done or error that is the end of the attempt; before, the
        worker was lost: record it, keep what it had, restart it if it may."""
        if slot.done:
            return
        if ev.get("failed"):  # the backend could not start it at all (Ray: no resources): no restart
            slot.error, slot.done, slot.state = ev.get("cause") or "could not start", True, "failed"
            self.console.print(f"[red]worker {slot.label} cannot run:[/red] {slot.error}", markup=True)
            return
        p = slot.progress
        slot.used_s += float(p.get("elapsed", 0.0))
        slot.used_examples += int(p.get("examples", 0))
        cause = ev.get("cause") or f"exit status {ev.get('code')}"
        inflight = slot.inflight
        rec = dict(id=f"{slot.label}.a{slot.spec.attempt}", worker=slot.label, attempt=slot.spec.attempt,
                   pid=(slot.hello or {}).get("pid"), host=(slot.hello or {}).get("host"), cause=cause,
                   at_s=round(self.elapsed(), 3), examples=p.get("examples", 0),
                   inflight=None if inflight is None else dict(prop=inflight["prop"], case=inflight["case"]),
                   shrinking=sorted(slot.pending), restarted=False, checked_again=None)
        self.lost.append(rec)
        self.console.print(f"[yellow]worker {slot.label} lost[/yellow] ({cause}) after {p.get('examples', 0)} "
                           f"examples" + ("" if inflight is None else
                                          f"; in flight: property {inflight['prop']}, "
                                          f"{load_case(inflight['case']).describe().splitlines()[0]}"),
                           markup=True)
        for sig, first in sorted(slot.pending.items()):  # it was shrinking these: keep the first failing case
            self._file(slot.label, first, dict(prop=first["prop"], signature=sig, first_failure_s=first["t"],
                                               examples_before=first["examples_before"], shrink_s=None,
                                               shrunk=False, note=f"worker {slot.label} was lost while shrinking it",
                                               case=first["case"]))
        slot.pending = {}
        for k, n in p.get("known_hits", {}).items():
            if k in self.known:
                self.known_hits[k] += n
        if p:  # the attempt's counts stand: a record of what it did before it was lost
            slot.records.append(dict(worker=slot.label, attempt=slot.spec.attempt, exit=None, lost=cause,
                                     gpu=slot.spec.gpu, process=slot.spec.slot, device=slot.spec.device,
                                     seed=slot.spec.seed, examples=p.get("examples", 0),
                                     structures=p.get("structures", 0), launches=p.get("launches", 0),
                                     compiles=p.get("compiles", 0), seconds=p.get("elapsed", 0.0),
                                     findings=[], known=[], host=rec["host"], pid=rec["pid"],
                                     cuda_visible_devices=(slot.hello or {}).get("cuda_visible_devices")))
        restart = self._restart_spec(slot, rec)
        if restart is None:
            slot.done, slot.state = True, ("stopped" if self.stopping else "lost")
            return
        rec["restarted"] = True
        slot.spec, slot.hello, slot.progress, slot.inflight, slot.state = restart, None, {}, None, "starting"
        self.console.print(f"worker {slot.label}: restart {restart.attempt} of {self.restarts} (seed {restart.seed}, "
                           f"{'%.1fs' % restart.seconds if restart.seconds is not None else '%d examples' % restart.examples}"
                           " left" + ("; its in-flight case is checked again first" if restart.recheck else "") + ")",
                           markup=False)
        self.backend.start(restart, self.events)

    def _restart_spec(self, slot: _Slot, lost: dict) -> WorkerSpec | None:
        first = slot.first_spec
        if self.stopping or slot.spec.attempt >= self.restarts:
            return None
        seconds = examples = None
        if first.seconds is not None:
            seconds = first.seconds - slot.used_s
            if seconds <= 0.5:
                return None
        elif first.examples is None:  # the worker's default budget: 60 s
            seconds = 60.0 - slot.used_s
            if seconds <= 0.5:
                return None
        if first.examples is not None:
            examples = first.examples - slot.used_examples
            if examples < 1:
                return None
        known = dict(self.known)
        for sig, f in self.findings.items():
            known[sig] = f["corpus_entry"] or sig
        attempt = slot.spec.attempt + 1
        recheck = () if lost["inflight"] is None else (dict(lost["inflight"], lost=lost["id"]),)
        return dataclasses.replace(slot.spec, attempt=attempt, seed=first.seed + len(self.slots) * attempt,
                                   seconds=seconds, examples=examples, known=known, recheck=recheck)

    # ---------------------------------------------------------------- signals

    def _catch_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, h in ((signal.SIGINT, self._on_int), (signal.SIGTERM, self._on_term)):
            old = signal.getsignal(sig)
            if old not in (signal.SIG_IGN, None):  # a caller that ignores the signal (an xdist worker) keeps that
                self._old_handlers[sig] = old
                signal.signal(sig, h)

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def _live(self) -> list[str]:
        return [s.label for s in self.slots.values() if s.state in ("starting", "running")]

    def _on_int(self, signum, frame) -> None:
        self.sigint += 1
        for label in self._live():
            if self.sigint <= 2:
                self.backend.stop(label)
            else:
                self.backend.kill(label)

    def _on_term(self, signum, frame) -> None:
        if self.term_at is None:
            self.term_at = time.monotonic()
        for label in self._live():
            self.backend.terminate(label)

    # ---------------------------------------------------------------- the end

    def _write_worker_record(self, slot: _Slot, rec: dict) -> None:
        if self.json_path is None:
            return
        a = f".a{slot.spec.attempt}" if slot.spec.attempt else ""
        p = self.json_path.parent / f"{self.json_path.stem}.{slot.label}{a}.json"
        p.write_text(json.dumps(rec, indent=1))

    def workers(self) -> list[dict]:
        return [r for s in self.slots.values() for r in s.records]

    def totals(self) -> dict:
        ws = self.workers()
        wall = self.elapsed()
        live = [s.progress for s in self.slots.values() if not s.done]  # attempts still running (status line)
        tot = dict(examples=sum(w["examples"] for w in ws) + sum(p.get("examples", 0) for p in live),
                   launches=sum(w["launches"] for w in ws) + sum(p.get("launches", 0) for p in live),
                   structures=sum(w.get("structures", w["examples"]) for w in ws),
                   compiles=sum(w["compiles"] for w in ws), findings=len(self.findings), wall_seconds=wall,
                   restarts=sum(1 for x in self.lost if x["restarted"]), lost=len(self.lost))
        tot["examples_per_s"] = tot["examples"] / wall if wall else 0.0
        return tot

    def status_line(self) -> str:
        tot = self.totals()
        states = Counter(s.state for s in self.slots.values())
        known = sum(self.known_hits.values()) + sum(
            n for s in self.slots.values() if not s.done for k, n in s.progress.get("known_hits", {}).items()
            if k in self.known)
        return (f"{self.elapsed():.0f}s  examples {tot['examples']} ({tot['examples_per_s']:.1f}/s)  new "
                f"{len(self.findings)}  known {known}  workers " + ", ".join(f"{n} {k}" for k, n in sorted(states.items()))
                + (f"  restarts {tot['restarts']}" if tot["restarts"] else ""))

    def _finish(self) -> int:
        from rich.table import Table

        ws = self.workers()
        tot = self.totals()
        failed = [s.label for s in self.slots.values() if s.state in ("failed", "lost")]
        t = Table(title=f"gdn-fuzz: {len(self.slots)} campaign workers ({self.backend.name})")
        cols = ("worker", "where", "attempt", "examples", "launches", "JIT compiles", "findings", "time",
                "examples/s", "exit")
        # below NARROW_COLUMNS (an 80-column terminal) the attempt, launches, compiles and rate go (the JSON keeps them)
        keep = (0, 1, 3, 6, 7, 9) if self.console.width < NARROW_COLUMNS else range(len(cols))
        for i in keep:
            t.add_column(cols[i], overflow="fold")
        for w in ws:
            where = w.get("host") or ""
            if w.get("cuda_visible_devices") is not None:
                where += f" GPU {w['cuda_visible_devices']}"
            row = (w["worker"], where.strip(), str(w["attempt"]), str(w["examples"]), str(w["launches"]),
                   str(w["compiles"]), str(len(w["findings"])), f"{w['seconds']:.1f}s",
                   f"{w['examples'] / max(w['seconds'], 1e-9):.1f}", "lost" if w.get("lost") else str(w["exit"]))
            t.add_row(*(row[i] for i in keep))
        row = ("total", "", "", str(tot["examples"]), str(tot["launches"]), str(tot["compiles"]), str(tot["findings"]),
               f"{tot['wall_seconds']:.1f}s (wall)", f"{tot['examples_per_s']:.1f}", "")
        t.add_row(*(row[i] for i in keep))
        self.console.print(t)
        grace = {w["worker"]: w.get("grace_used_s") or 0.0 for w in ws}
        if any(grace.values()):
            self.console.print("shrinking ran past the budget (--shrink-grace): " + ", ".join(
                f"{k} {v:.1f}s" for k, v in grace.items() if v), markup=False)
        groups = group_findings(list(self.findings.values()))
        if self.findings or self.known_hits:
            ft = Table(title="findings by signature, all workers (bug: symptoms that share a shrunk launch)")
            for col in ("bug", "signature", "status", "found by", "shrunk", "corpus entry"):
                ft.add_column(col, overflow="fold")  # every cell folds: 80 columns hold the six
            for n, g in enumerate(groups, 1):
                for f in g["records"]:
                    ft.add_row(str(n), f["signature"], "[red]new[/red]", ", ".join(f["found_by"]),
                               f"{f['shrink_s']:.1f}s" if f.get("shrunk") else "no", f["corpus_entry"] or "-")
            for sig, n in sorted(self.known_hits.items()):
                ft.add_row("-", sig, f"known ({n} examples)", "", "-", self.known.get(sig) or "-")
            self.console.print(ft)
        for x in self.lost:
            again = x["checked_again"]
            self.console.print(
                f"[yellow]lost[/yellow] worker {x['worker']} attempt {x['attempt']} at {x['at_s']:.1f}s: {x['cause']}; "
                + ("nothing in flight" if x["inflight"] is None else
                   f"in flight: property {x['inflight']['prop']}, seed {x['inflight']['case'].get('seed')}; "
                   + ("checked again in a fresh process: " + (again["outcome"] + (
                       f" ({', '.join(again['signatures'])})" if again["signatures"] else "")) if again else
                      "not checked again (no restart)"))
                + ("; restarted" if x["restarted"] else ""), markup=True)
        for s in self.slots.values():
            if s.state == "failed":
                self.console.print(f"[red]worker {s.label} failed:[/red] {s.error}", markup=True)
        if self.corpus_dir is not None:
            n = len(corpus.entries(self.corpus_dir))
            self.console.print(f"corpus {self.corpus_dir}: {n} entries ({sum(w['written'] for w in self.corpus_writes)} "
                               f"written by this run)", markup=False)
            tot["corpus_entries"] = n
        interrupted = self.stopping or any(w.get("exit") == EXIT_INTERRUPTED for w in ws)
        if interrupted:
            self.console.print(f"[yellow]{'terminated' if self.term_at is not None else 'interrupted'}[/yellow]: every "
                               "worker was stopped and waited for; findings seen so far are listed and stored above",
                               markup=True)
        if self.json_path is not None:
            rec = dict(self.info, backend=self.backend.name, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       target=self.target_name, totals=tot, failed=failed, interrupted=interrupted,
                       findings=list(self.findings.values()),
                       groups=groups_record(groups),
                       known=[dict(signature=k, corpus_entry=self.known.get(k), examples=n, known=True)
                              for k, n in sorted(self.known_hits.items())],
                       lost=self.lost, corpus_writes=self.corpus_writes, workers=ws)
            self.json_path.write_text(json.dumps(rec, indent=1))
        if groups:
            self.console.print("new: " + groups_line(groups), markup=False)  # wrapped to the console width
        if self.term_at is not None:
            return EXIT_TERMINATED
        if interrupted:
            return EXIT_INTERRUPTED
        if failed:
            return EXIT_USAGE
        if self.findings:
            return EXIT_NEW
        if self.fail_on_known and self.known_hits:
            return EXIT_KNOWN_ONLY
        return EXIT_OK
