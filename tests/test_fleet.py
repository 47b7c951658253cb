"""The fleet driver's merge, corpus writes and restarts (gdn_fuzz.engine.fleet), on scripted workers.

The backends are tested for real elsewhere (tests/test_multigpu.py: child processes; tests/
test_ray_fleet.py: Ray actors).  Here a scripted backend replays the events a worker would send, in an
order a real run makes hard to force, and the test checks what the driver stores, tells and returns:
a shrunk case from one worker replaces the unshrunk case stored for a lost one; a new signature is
stored once and told to the other workers; a lost worker restarts with its in-flight case to check
again and the budget it had left, and not once its budget is spent; a worker that cannot start is
failed, not restarted (exit 2); a known bug sent as new is not stored.
"""

from __future__ import annotations

import json

from rich.console import Console

from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.campaign import CampaignFinding
from gdn_fuzz.engine.fleet import Fleet
from gdn_fuzz.engine.worker import WorkerSpec, finding_payload
from gdn_fuzz.findings import Finding

SIG = "oracle.fold [M7] out of tolerance (flush rows)"


def _finding() -> Finding:
    return Finding(prop="oracle.fold", clause="M7", message="error above the tolerance", row=0, head=0, value=0.96,
                   tol=0.0117, outcome="out of tolerance", family="flush")


def _case(seed: int, P: int = 13) -> Case:
    return Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, P, 0),), seed=seed)


def _first(case: Case) -> dict:
    return dict(kind="first", t=1.0, examples_before=2, **finding_payload("launch", case, [_finding()], SIG, "reference"))


def _found(case: Case, shrunk: bool = True) -> dict:
    f = CampaignFinding("launch", case, [_finding()], signature=SIG, first_t=1.0, first_examples=2, shrink_s=0.5,
                        shrunk=shrunk)
    return dict(kind="finding", record=f.to_record(), explain="(explained)",
                **finding_payload("launch", case, [_finding()], SIG, "reference"))


def _done(spec: WorkerSpec, findings=(), exit_code=0) -> dict:
    rec = dict(target="reference", device="cpu", seed=spec.seed, examples=10, launches=10, structures=10, compiles=0,
               seconds=2.0, budget_s=spec.seconds, findings=list(findings), known=[], interrupted=False,
               cuda_visible_devices=None)
    return dict(kind="done", exit=exit_code, record=rec)


def _hello(spec: WorkerSpec) -> dict:
    return dict(kind="hello", pid=1000 + spec.slot, host="here", target="reference", path="/r.py", sha256="ab",
                gpu=None, cuda_visible_devices=None, arms=list(spec.arms), properties=list(spec.properties),
                seed=spec.seed, attempt=spec.attempt, pool_note=None)


class Scripted:
    """A backend whose workers send what script(spec) returns, then end their stream."""

    name = "scripted"

    def __init__(self, script):
        self.script, self.started, self.told, self.killed = script, [], [], []

    def start(self, spec, events):
        self.started.append(spec)
        evs = self.script(spec)
        for ev in evs:
            events.put((spec.label, spec.attempt, ev))
        events.put((spec.label, spec.attempt, dict(kind="exit", code=None if evs and evs[-1].get("kind") != "done"
                                                     else 0, cause="killed by SIGKILL")))

    def tell(self, label, msg):
        self.told.append((label, msg))

    def stop(self, label):
        pass

    terminate = stop

    def kill(self, label):
        self.killed.append(label)

    def close(self):
        pass


def _specs(n=2, seconds=30.0):
    return [WorkerSpec(label=f"w{k}", target="reference", device="cpu", seed=7 + k, arms=("bf16",),
                       properties=("launch",), seconds=seconds, slot=k) for k in range(n)]


def _fleet(backend, specs, tmp_path, **kw):
    return Fleet(backend, specs, target_name="reference", corpus_dir=tmp_path / "corpus",
                 console=Console(file=open(tmp_path / "out.txt", "w"), width=200), json_path=tmp_path / "run.json",
                 **kw)


def test_the_workers_tables_fit_80_columns(tmp_path):
    """Issue 33: at 80 columns the workers' table keeps worker, where, examples, findings, time and exit (the JSON
    record keeps the rest) and no line is wider than the console; the findings table folds its cells."""
    shrunk = _case(seed=1)

    def script(spec):
        if spec.label == "w0":
            return [_hello(spec), _first(shrunk), _found(shrunk), _done(spec, [dict(signature=SIG)], 1)]
        return [_hello(spec), _done(spec)]

    out = tmp_path / "narrow.txt"
    fleet = Fleet(Scripted(script), _specs(), target_name="reference", corpus_dir=tmp_path / "corpus",
                  console=Console(file=open(out, "w"), width=80), json_path=tmp_path / "run.json")
    assert fleet.run() == 1
    fleet.console.file.close()
    text = out.read_text()
    assert max(len(ln) for ln in text.splitlines()) <= 80, max(text.splitlines(), key=len)
    table = text[text.index("campaign workers"):text.index("findings by signature")]
    assert "…" not in table and "here" in table and "launches" not in table
    assert "new: 1 bug, 1 symptom" in text


def test_a_shrunk_case_replaces_a_lost_workers_unshrunk_one(tmp_path):
    unshrunk, shrunk = _case(seed=99, P=14), _case(seed=1)

    def script(spec):
        if spec.label == "w0" and spec.attempt == 0:  # lost while shrinking, with a case in flight
            return [dict(_hello(spec), cuda_visible_devices="0"), dict(kind="progress", examples=4, elapsed=12.0),
                    _first(unshrunk),
                    dict(kind="inflight", prop="launch", case=unshrunk.to_dict(), n=4)]
        if spec.label == "w0":  # the restart: checks the in-flight case again first
            assert spec.recheck and spec.recheck[0]["case"] == unshrunk.to_dict() and spec.recheck[0]["lost"] == "w0.a0"
            return [_hello(spec), dict(kind="recheck", lost="w0.a0", prop="launch", outcome="failed",
                                       signatures=[SIG], new=[]), _done(spec)]
        return [_hello(spec), _first(shrunk), _found(shrunk), _done(spec, [dict(signature=SIG)], 1)]

    backend = Scripted(script)
    fleet = _fleet(backend, _specs(), tmp_path)
    assert fleet.run() == 1
    rec = json.loads((tmp_path / "run.json").read_text())
    (f,) = rec["findings"]
    assert f["shrunk"] and f["worker"] == "w1" and f["replaced_unshrunk_from"] == "w0" and f["found_by"] == ["w0", "w1"]
    (e,) = [corpus.read(p) for p in corpus.entries(tmp_path / "corpus")]
    assert e.case == shrunk  # the shrunk case replaced the lost worker's first failing case
    assert [(w["worker"], w["written"], w["replaced"]) for w in rec["corpus_writes"]] == [("w0", True, False),
                                                                                         ("w1", True, True)]
    (lost,) = rec["lost"]
    assert lost["shrinking"] == [SIG] and lost["restarted"] and lost["checked_again"]["outcome"] == "failed"
    restart = [s for s in backend.started if s.attempt == 1][0]
    assert restart.seed == 7 + 2 and restart.seconds == 30.0 - 12.0  # seed + workers x attempt; the budget left
    assert SIG in restart.known  # what the fleet found is known to the new worker
    assert ("w1", {"known": {SIG: e.filename()}}) in backend.told  # told when w0's first failing case was stored
    assert sorted((w["worker"], w["attempt"]) for w in rec["workers"]) == [("w0", 0), ("w0", 1), ("w1", 0)]
    (was,) = [w for w in rec["workers"] if w["attempt"] == 0 and w["worker"] == "w0"]
    assert was["lost"] and was["examples"] == 4 and was["cuda_visible_devices"] == "0"  # its GPU, from its hello


def test_a_new_signature_is_stored_once_and_told_to_the_others(tmp_path):
    case = _case(seed=3)
    hold = {}

    def script(spec):
        if spec.label == "w0":
            return [_hello(spec), _found(case), _done(spec, [dict(signature=SIG)], 1)]
        hold["w1"] = spec
        return [_hello(spec)]  # still running when w0's finding arrives; ends later (exit without done: lost)

    backend = Scripted(script)
    fleet = _fleet(backend, _specs(), tmp_path, restarts=0)
    assert fleet.run() == 2  # w1 was lost with no restart left
    name = corpus.entries(tmp_path / "corpus")[0].name
    assert ("w1", {"known": {SIG: name}}) in backend.told
    assert len(corpus.entries(tmp_path / "corpus")) == 1


def test_no_restart_once_the_budget_is_spent(tmp_path):
    def script(spec):
        return [_hello(spec), dict(kind="progress", examples=50, elapsed=29.8)]  # lost at the end of its budget

    backend = Scripted(script)
    assert _fleet(backend, _specs(1), tmp_path).run() == 2
    assert [s.attempt for s in backend.started] == [0]
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["failed"] == ["w0"] and not rec["lost"][0]["restarted"]
    assert rec["totals"]["examples"] == 50  # the lost attempt's examples stand


def test_a_worker_that_cannot_start_is_failed_not_restarted(tmp_path):
    class Unplaced(Scripted):
        def start(self, spec, events):
            self.started.append(spec)
            events.put((spec.label, spec.attempt, dict(kind="exit", code=None, failed=True,
                                                       cause="the actor sent nothing in 600 s")))

    backend = Unplaced(None)
    assert _fleet(backend, _specs(1), tmp_path).run() == 2
    assert len(backend.started) == 1  # restarts (3 by default) are for lost workers
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["failed"] == ["w0"] and rec["lost"] == []  # nothing ran: no lost record, no in-flight case
    assert "the actor sent nothing in 600 s" in (tmp_path / "out.txt").read_text()


def test_a_known_bug_sent_as_new_is_not_stored(tmp_path):
    def script(spec):
        return [_hello(spec), _found(_case(seed=5)), _done(spec)]

    fleet = _fleet(Scripted(script), _specs(1), tmp_path, known={SIG: "open-entry.json"})
    assert fleet.run() == 0
    assert corpus.entries(tmp_path / "corpus") == [] and fleet.findings == {}
