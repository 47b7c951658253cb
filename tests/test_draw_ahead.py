"""A case sent ahead is drawn while the check before it ends (gdn_fuzz.engine.isolation, $GDN_FUZZ_DRAW_AHEAD; issue
32): the isolated worker takes the next message from its pipe once this check's verdict is queued on the device, and
draws that case (the launch property's prepare: materialize and the "before" copy) before it answers this one.  The
launch, the in-flight file and the answers keep their order, so nothing a campaign records may change.  These tests
run on the CPU with the switch set on (it is off by default); the verdict's bits with a draw graph replayed between a
launch and its verdict are held on a GPU (tests/test_graphs.py, test_a_case_drawn_ahead_changes_no_verdict); what it
does to the checks per second is measured there (docs/benchmarks.md, "Issue 32, seventeenth part").
"""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from gdn_fuzz import checks
from gdn_fuzz.case import Case, Row
from gdn_fuzz.engine.isolation import DRAW_AHEAD_ENV, MEASURE, Worker, _draw_ahead, draw_ahead_default
from gdn_fuzz.properties import REGISTRY, Property
from tests.test_deferred import _campaign, _cases


def _run(monkeypatch, mode: str, target: str, examples: int, **kw):
    monkeypatch.setenv(DRAW_AHEAD_ENV, mode)  # read by the campaign's Worker when it is made
    c, rec = _campaign(target, True, props=["launch"], **kw)
    c.run(examples=examples)
    return c, _cases(rec)


def test_drawing_ahead_changes_no_record_or_finding(monkeypatch):
    """A deferred campaign of the launch property on a mutant it catches: with the worker drawing ahead, every record
    line (case and verdict, in order) and every finding (shrunk to the same case) is the one without; and cases were
    drawn ahead (else the comparison says nothing).  Fails if a check used the inputs drawn for another case."""
    off, off_cases = _run(monkeypatch, "off", "mutant:fold_skipped", 120)
    on, on_cases = _run(monkeypatch, "on", "mutant:fold_skipped", 120)
    assert off.findings and on_cases == off_cases
    assert {s: f.case for s, f in on.findings.items()} == {s: f.case for s, f in off.findings.items()}
    assert all(f.shrunk for f in on.findings.values())
    assert off.drawn_ahead() == 0
    # most checks find the next case in the pipe (the worker's check is slower than the draw on this machine); the
    # first of each round and the checks of a rerun, which are not sent ahead, cannot
    assert on.drawn_ahead() >= on.stats.launches // 4, (on.drawn_ahead(), on.stats.launches)


def test_a_crash_with_the_next_case_drawn_is_the_crashing_case(monkeypatch):
    """A worker crash while the next case was drawn ahead is still the case that crashed, shrunk to one full-window
    row (test_deferred's crash test, drawing ahead)."""
    c, _ = _run(monkeypatch, "on", "mutant:worker_crash", 400, round_examples=40, stop_on_finding=True)
    (f,) = c.findings.values()
    assert [x.prop for x in f.findings] == ["crash"] and f.shrunk
    real = [r for r in f.case.rows if not r.pad]
    assert len(real) == 1 and real[0].hist_len == 16
    assert not c.unconfirmed and c.drawn_ahead() > 0


def _msg(prop: str, case: Case) -> tuple:
    return prop, json.dumps(dict(property=prop, case=case.to_dict())), "/nonexistent/inflight.json"


CASE = Case(arm="bf16", T=4, H=1, HV=2, pool=4, rows=(Row(1, 3, 5), Row(-1, 0, 0)), seed=7)


def test_what_is_drawn_ahead(monkeypatch):
    """_draw_ahead: nothing when the pipe is empty; the end (None, or a closed pipe) as an empty message; a
    measurement and a property without prepare taken, not drawn; the launch property's case drawn (prepare_launch's
    tensors); a draw that raises dropped, so that its case is drawn again in its own turn."""
    a, b = mp.Pipe()
    assert _draw_ahead(b, "cpu") is None
    a.send(None)
    assert _draw_ahead(b, "cpu").msg is None
    a.send((f"{MEASURE}mod:fn", "{}", "x"))
    got = _draw_ahead(b, "cpu")
    assert got.msg[0].startswith(MEASURE) and got.case is None and got.ready is None
    a.send(_msg("relations", CASE))
    got = _draw_ahead(b, "cpu")
    assert got.msg[0] == "relations" and got.ready is None
    a.send(_msg("launch", CASE))
    got = _draw_ahead(b, "cpu")
    inputs, before = got.ready
    assert got.case == CASE and got.seconds > 0 and set(inputs) == set(before) and "initial_state_source" in inputs
    monkeypatch.setattr(checks, "drawn", lambda case, device: 1 / 0)
    monkeypatch.setitem(REGISTRY, "launch_boom", Property("launch_boom", "M1", "a launch property whose draw raises",
                                                         check=checks.check_launch, begin=checks.begin_launch,
                                                         prepare=checks.prepare_launch))
    a.send(_msg("launch_boom", CASE))
    got = _draw_ahead(b, "cpu")
    assert got.msg[0] == "launch_boom" and got.case is None and got.ready is None
    a.close()
    assert _draw_ahead(b, "cpu").msg is None


def test_prepare_draws_nothing_for_a_rows_case_or_a_big_one(monkeypatch):
    """prepare_launch leaves a fill="rows" case (observed on its rows alone) and a case past PREPARE_MAX_BYTES to
    begin_launch (a second launch's tensors would be alive beside the one being judged)."""
    assert checks.prepare_launch(CASE, "cpu") is not None
    rows = Case(arm="bf16", T=4, H=1, HV=2, pool=5000, fill="rows", rows=(Row(4000, 3, 5),), seed=1)
    assert checks.prepare_launch(rows, "cpu") is None
    monkeypatch.setattr(checks, "PREPARE_MAX_BYTES", CASE.alloc_bytes() - 1)
    assert checks.prepare_launch(CASE, "cpu") is None


def test_the_switch(monkeypatch):
    """off (unset, the default) or on, whatever the device; anything else a ValueError naming the variable and the
    choices (the CLI's usage error: tests/test_triage.py's bad-switch test).  A Worker reads it when made."""
    monkeypatch.delenv(DRAW_AHEAD_ENV, raising=False)
    assert not draw_ahead_default("cuda") and not draw_ahead_default("cpu")
    assert not Worker("reference", "cpu").draw_ahead
    monkeypatch.setenv(DRAW_AHEAD_ENV, "on")
    assert draw_ahead_default("cpu") and draw_ahead_default("cuda") and Worker("reference", "cpu").draw_ahead
    assert not Worker("reference", "cpu", draw_ahead=False).draw_ahead
    monkeypatch.setenv(DRAW_AHEAD_ENV, "sometimes")
    with pytest.raises(ValueError, match=f"{DRAW_AHEAD_ENV}='sometimes'.*off, on"):
        draw_ahead_default("cuda")
