"""Rounds at once (issue 32: Campaign.pipeline, `gdn-fuzz run --pipeline N`).

With pipeline = N > 1 a campaign runs N Hypothesis rounds on threads, so that one round draws its next example
while another round's case is checked (the check itself, in the isolated worker or in this process, takes one
case at a time).  These tests pin: a round checks exactly what it draws alone (the same round seeds and sizes as
one round at a time); two rounds are in flight at once and the checks never overlap; a bug is found, shrunk and
reproduces; a crash in the isolated worker is still the case in flight's; an error or a stop request in one round
ends them all; the option is validated and reaches the campaign from the command line.
On the CPU reference target (or a mutant of it), a few seconds each.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

from gdn_fuzz.engine.campaign import Campaign, MAX_PIPELINE, _leaves, parse_pipeline, pipeline_default
from gdn_fuzz.findings import Findings
from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import CPU_GEOMETRIES
from gdn_fuzz.targets import get_target

SMALL = dict(device="cpu", arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,))


class Seen(Campaign):
    """A Campaign that notes every check as (round seed, case), with checks that take `sleep_s` and pass
    (fake=True, the default) or the target's own checks; .inside_max: the most examples in flight at once, and
    .overlaps: checks that started while another ran (must stay 0)."""

    fake = True
    sleep_s = 0.0

    def _round(self, prop, round_seed, *a, **kw):
        self._tls.seed = round_seed
        return super()._round(prop, round_seed, *a, **kw)

    def _example(self, *a, **kw):
        with self.count_lock:
            self.inside += 1
            self.inside_max = max(self.inside_max, self.inside)
        try:
            return super()._example(*a, **kw)
        finally:
            with self.count_lock:
                self.inside -= 1

    def _check(self, prop, case):
        with self.count_lock:
            self.checking += 1
            self.overlaps += self.checking > 1
        try:
            self.seen.append((self._tls.seed, case))
            if self.sleep_s:
                time.sleep(self.sleep_s)
            if self.fake:
                found = Findings([])
                found.metrics = None
                return found
            return super()._check(prop, case)
        finally:
            with self.count_lock:
                self.checking -= 1


def _campaign(target="reference", props=("launch",), fake=True, sleep_s=0.0, **kw) -> Seen:
    c = Seen(target=get_target(target), properties=[get_property(p) for p in props], **{**SMALL, **kw})
    c.fake, c.sleep_s, c.seen = fake, sleep_s, []
    c.count_lock, c.inside, c.inside_max, c.checking, c.overlaps = threading.Lock(), 0, 0, 0, 0
    return c


def _drawn(round_seed: int, n: int) -> list:
    """What a plain @given test with one round's seed and the campaign's settings draws, in order."""
    strat = get_property("launch").strategy(arms=SMALL["arms"], Ts=SMALL["Ts"], geometries=SMALL["geometries"],
                                            buckets=SMALL["buckets"])
    out = []

    @hseed(round_seed)
    @settings(max_examples=n, deadline=None, database=None, phases=(Phase.generate, Phase.target, Phase.shrink),
              report_multiple_bugs=True, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strat)
    def plain(case):
        out.append(case)

    plain()
    return out


def _round_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("gdn-fuzz-round-")]


def test_the_option_is_validated():
    assert parse_pipeline(None) is None and parse_pipeline("auto") is None and parse_pipeline(" 3 ") == 3
    for bad in ("0", str(MAX_PIPELINE + 1), "two", ""):
        with pytest.raises(ValueError, match="--pipeline"):
            parse_pipeline(bad)
    for bad in (0, MAX_PIPELINE + 1, True, 1.5):
        with pytest.raises(ValueError, match="pipeline"):
            _campaign(pipeline=bad)
    assert pipeline_default("cuda", True) == 2 and pipeline_default("cuda:1", True) == 2
    assert pipeline_default("cuda", False) == 1 and pipeline_default("cpu", True) == 1
    assert _campaign().pipeline == 1 and _campaign(pipeline=3).pipeline == 3


@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_each_round_checks_what_it_draws_alone(pipeline):
    """Every round checks the plain @given sequence of its own seed (a prefix, where the budget cut it), the
    rounds' seeds are 0, 1, 2, ... after the campaign seed's base, and the example budget is exact."""
    c = _campaign(seed=3, round_examples=5, first_round_examples=5, pipeline=pipeline, sleep_s=0.002)
    c.run(examples=23)
    assert c.stats.examples == len(c.seen) == 23
    by_round: dict = {}
    for s, case in c.seen:
        by_round.setdefault(s, []).append(case)
    base = 3 * 1_000_003
    assert sorted(by_round) == list(range(base, base + len(by_round)))
    full = 0
    for s, cases in by_round.items():
        assert cases == _drawn(s, 5)[:len(cases)]
        full += len(cases) == 5
    assert full >= 23 // 5 - (pipeline - 1)  # only the rounds running when the budget ran out are cut short


def test_two_rounds_are_in_flight_and_checks_never_overlap():
    c = _campaign(seed=1, pipeline=2, sleep_s=0.03, round_examples=8)
    c.run(examples=30)
    assert c.inside_max == 2 and c.overlaps == 0
    one = _campaign(seed=1, pipeline=1, sleep_s=0.0)
    one.run(examples=10)
    assert one.inside_max == 1 and one.overlaps == 0
    assert not _round_threads()


def test_a_bug_is_found_shrunk_and_reproduces_with_rounds_at_once():
    """mutant:fold_skipped (the fold is never written: M7) with 2 rounds at once: one finding per signature,
    shrunk to a case that shows it again alone."""
    target = get_target("mutant:fold_skipped")
    c = _campaign("mutant:fold_skipped", fake=False, seed=0, pipeline=2, round_examples=25)
    c.run(examples=300)
    assert "oracle.fold [M7] out of tolerance (flush rows)" in c.findings
    for sig, f in c.findings.items():
        assert f.shrunk and not f.flaky
        assert sum(not r.pad for r in f.case.rows) == 1  # one real row: the flush row
        assert sig in {x.signature() for x in get_property(f.prop).check(target, f.case, "cpu")}
    assert not _round_threads()


def test_an_error_in_one_round_ends_them_all_and_is_raised():
    c = _campaign(seed=2, pipeline=2, sleep_s=0.005)
    calls = []
    check = c._check

    def failing(prop, case):
        calls.append(case)
        if len(calls) == 5:
            raise RuntimeError("a check that broke")
        return check(prop, case)

    c._check = failing
    with pytest.raises(Exception) as got:  # as one round alone raises it: Hypothesis may wrap it (FlakyFailure)
        c.run(examples=200)
    assert any("a check that broke" in str(x) for x in _leaves(got.value))
    # the failing round replays its error (Hypothesis shrinks it, as with one round), the other stops at its next
    # example: the run ends long before its budget, with no round left running
    assert len(calls) < 100 and not _round_threads()


def test_a_stop_request_ends_every_round_and_keeps_what_was_found():
    c = _campaign(seed=2, pipeline=3, sleep_s=0.005)
    check = c._check

    def stopping(prop, case):
        if len(c.seen) == 6:
            c.request_stop()
        return check(prop, case)

    c._check = stopping
    c.run(seconds=60)
    assert c.interrupted and len(c.seen) <= 6 + 3 and not _round_threads()


def test_stop_on_finding_ends_the_other_rounds():
    c = _campaign("mutant:fold_skipped", fake=False, seed=0, pipeline=2, stop_on_finding=True)
    c.run(examples=2000)
    assert c.findings and c.stats.examples < 2000 and not _round_threads()


def test_a_crash_in_the_worker_is_the_case_in_flight(tmp_path):
    """Isolated, 2 rounds at once, over the crashing mutant (SIGSEGV whenever a row has P = 16): the crash is
    filed with a case that has a full window (the case the worker had, not the other round's), shrunk."""
    c = Campaign(target=get_target("mutant:worker_crash"), device="cpu", properties=[get_property("launch")],
                 arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=3, round_examples=40,
                 isolate=True, corpus_dir=tmp_path, stop_on_finding=True, pipeline=2)
    assert c.pipeline == 2
    c.run(examples=400)
    (f,) = c.findings.values()
    assert [x.prop for x in f.findings] == ["crash"]
    assert [r.hist_len for r in f.case.rows if not r.pad] == [16]
    assert not c.unconfirmed and not _round_threads()


def test_the_command_line_option_reaches_the_campaign(tmp_path):
    from gdn_fuzz.cli import main

    out = tmp_path / "r.json"
    assert main(["run", "--target", "reference", "--device", "cpu", "--arms", "bf16", "--property", "launch",
                 "--examples", "6", "--no-corpus", "--no-isolate", "--pipeline", "2", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["pipeline"] == 2 and rec["launches"] == 6



def test_the_switch_interval_is_short_while_rounds_run_at_once_and_put_back():
    """With rounds at once the interpreter hands its lock over every PIPELINE_SWITCH_S (a round whose check came
    back gets it while another draws), and the interval in force before run() is put back when it ends."""
    import sys

    from gdn_fuzz.engine.campaign import PIPELINE_SWITCH_S

    before = sys.getswitchinterval()
    for pipeline, want in ((1, before), (2, min(before, PIPELINE_SWITCH_S))):
        c = _campaign(seed=1, pipeline=pipeline)
        seen = []
        check = c._check
        c._check = lambda prop, case: seen.append(sys.getswitchinterval()) or check(prop, case)
        c.run(examples=4)
        assert seen and all(x == pytest.approx(want, rel=1e-6) for x in seen)  # stored in whole microseconds
        assert sys.getswitchinterval() == before


def test_hypothesis_constants_are_scanned_on_a_thread_before_the_rounds(monkeypatch):
    """Hypothesis' first draw of a constant parses the source of every local module (on the GPU bundle, ~11 s at the
    fifth example, in both rounds at once: run 83).  A campaign starts that scan on a thread when it is made and its
    rounds wait for it: the scan runs once, on that thread, and ends before the first example.  Before: it ran
    inside the rounds' first draws."""
    from hypothesis.internal.conjecture import providers

    from gdn_fuzz.engine import campaign as campaign_mod

    calls, real = [], providers._get_local_constants

    def slow_scan():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            time.sleep(0.5)
        calls.append(time.monotonic())
        return real()

    monkeypatch.setattr(providers, "_get_local_constants", slow_scan)
    campaign_mod._constants_scan.cache_clear()  # as in a fresh process
    try:
        first = []
        c = _campaign(seed=2, pipeline=2)
        c.run(examples=6, on_example=lambda: first.append(time.monotonic()))
        assert calls[0] == "gdn-fuzz-hypothesis-constants"
        assert calls[1] <= first[0]  # the scan ended before the first example
        assert not campaign_mod._constants_scan().is_alive()
    finally:
        campaign_mod._constants_scan.cache_clear()
