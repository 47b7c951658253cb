"""Deferred verdicts (Campaign.defer, `gdn-fuzz run --defer-verdicts on`, issue 32): an isolated campaign sends each
case to its worker without waiting for the verdict, which it reads one example later, so that Hypothesis draws the
next case while the worker checks this one.  A failure read late is shrunk by running its round again: Hypothesis
draws the same cases from the round's seed, the verdicts already known are not checked again, and the failure is
shrunk as in a campaign that waits.  These tests run on the CPU (the worker is a real process); the gain in checks per
second is measured on the GPU (docs/benchmarks.md), not here.
"""

from __future__ import annotations

import io
import json

import pytest

from gdn_fuzz.engine.campaign import DEFER_DEPTH, Campaign
from gdn_fuzz.properties import for_kernel, get_property
from gdn_fuzz.strategies import CPU_GEOMETRIES
from gdn_fuzz.targets import get_target


def _campaign(target: str, defer: bool, props=None, **kw) -> tuple[Campaign, io.StringIO]:
    rec = io.StringIO()
    props = [get_property(p) for p in (props or for_kernel("flush"))]
    kw = dict(dict(isolate=True), **kw)
    return Campaign(target=get_target(target), device="cpu", properties=props, arms=("bf16",), Ts=(4,),
                    geometries=CPU_GEOMETRIES, buckets=(4,), seed=3, corpus_dir=None, defer=defer, record_path=rec,
                    **kw), rec


def _cases(rec: io.StringIO) -> list[str]:
    """Each record line's case and verdict (what does not depend on timing)."""
    return [json.dumps({k: v for k, v in r.items() if k not in ("i", "t", "check_s", "worker_s", "metrics")},
                       sort_keys=True) for r in map(json.loads, rec.getvalue().splitlines())]


def _insertions(small: list, big: list) -> int | None:
    """How many items of `big` must go for the rest to start with `small` less as many items at its end (the same
    example budget): None when no such matching exists (greedy, in order)."""
    j, extra = 0, 0
    for i, x in enumerate(small):
        while j < len(big) and big[j] != x:
            j, extra = j + 1, extra + 1
        if j == len(big):
            return extra if len(small) - i <= extra else None
        j += 1
    return extra


@pytest.mark.parametrize("depth", sorted({1, DEFER_DEPTH}))
def test_deferred_verdicts_find_and_shrink_what_waiting_finds(depth):
    """The same findings, shrunk to the same cases, as the campaign that waits for each verdict; the deferred run
    checks the waiting run's cases in the same order, plus at most defer_depth cases after each first failure (sent
    before its verdict was read), and checks no case of a rerun again.  Fails if the rerun does not replay the
    round's cases (a different draw) or checks them again.  At the default depth and at 1 ($GDN_FUZZ_DEFER_DEPTH)."""
    runs = {}
    for defer in (False, True):
        c, rec = _campaign("mutant:fold_skipped", defer, **({"defer_depth": depth} if defer else {}))
        c.run(examples=300)
        runs[defer] = c, _cases(rec)
    (wait, wait_cases), (late, late_cases) = runs[False], runs[True]
    assert wait.findings and late.defer and not wait.defer and late.pipeline == 1
    assert sorted(wait.findings) == sorted(late.findings)
    for sig, f in wait.findings.items():
        g = late.findings[sig]
        assert g.shrunk and f.shrunk and g.case == f.case and g.prop == f.prop, sig
    # the deferred run's checks are the waiting run's, in order, with at most DEFER_DEPTH cases more after each
    # first failure (the example budget then ends it as many examples earlier in the sequence)
    extra = _insertions(wait_cases, late_cases)
    assert late.defer_depth == depth and extra is not None and 0 < extra <= depth * len(late.findings), extra
    assert late.stats.examples == len(late_cases) == len(wait_cases)


@pytest.mark.parametrize("depth", sorted({1, DEFER_DEPTH}))
def test_a_case_is_sent_before_the_verdict_before_it_is_read(monkeypatch, depth):
    """The overlap itself: in a deferred round, cases n + 1 .. n + defer_depth are in the worker's pipe when the
    verdict of case n is read, so the worker starts the next the moment it answers (Worker.submit / collect).  Fails
    if the round waits, or holds more or fewer cases than its depth."""
    from gdn_fuzz.engine.isolation import Worker

    calls = []
    submit, collect = Worker.submit, Worker.collect
    monkeypatch.setattr(Worker, "submit", lambda self, p, c, tag=None: (calls.append(("send", self.pending)),
                                                                 submit(self, p, c, tag)))
    monkeypatch.setattr(Worker, "collect", lambda self: (calls.append(("read", self.pending)), collect(self))[1])
    c, _ = _campaign("reference", True, props=["launch"], defer_depth=depth)
    c.run(examples=12)
    reads = [n for kind, n in calls if kind == "read"]
    assert len(reads) == 12 == sum(kind == "send" for kind, _ in calls)
    # every read but the last `depth` of each round finds depth + 1 cases sent: the one read, and the next `depth`
    assert max(reads) == depth + 1 and reads.count(depth + 1) >= 12 - depth * c.stats.rounds, calls


def test_a_crash_read_late_is_the_crashing_case_and_is_shrunk(tmp_path):
    """A worker crash read one example late is the case that crashed (not the case sent after it, which is checked
    in the fresh worker), and is shrunk to one full-window row, as without deferral (test_isolation)."""
    c, rec = _campaign("mutant:worker_crash", True, props=["launch"], round_examples=40, stop_on_finding=True)
    c.run(examples=400)
    (f,) = c.findings.values()
    assert [x.prop for x in f.findings] == ["crash"] and f.shrunk
    real = [r for r in f.case.rows if not r.pad]
    assert len(real) == 1 and real[0].hist_len == 16
    assert not c.unconfirmed


def test_a_stop_answers_the_case_still_in_the_worker():
    """A stop (a first Ctrl-C, request_stop) in a deferred round reads the verdict of the case still in the worker,
    so every example counted has its record line."""
    c, rec = _campaign("reference", True, props=["launch"])

    def on_example():
        if c.stats.examples == 7:
            c.request_stop()

    c.run(examples=100, on_example=on_example)
    # without the drain the 7th example, sent and never read, would have no record line
    assert c.interrupted and c.stats.examples == 7 == len(rec.getvalue().splitlines())


def test_deferred_verdicts_need_isolation_and_one_round_at_a_time(monkeypatch):
    """Bad combinations are refused with the option and the fix; the default is $GDN_FUZZ_DEFER_VERDICTS (off when
    unset, never without isolation), and on makes --pipeline auto one round at a time."""
    from gdn_fuzz.engine.campaign import defer_default, parse_defer

    with pytest.raises(ValueError, match=r"with --no-isolate \(isolate=False\)"):
        _campaign("reference", True, isolate=False)
    with pytest.raises(ValueError, match=r"with --pipeline 2 \(pipeline=2\)"):
        _campaign("reference", True, pipeline=2)
    assert parse_defer(None) is None and parse_defer("on") is True and parse_defer("off") is False
    monkeypatch.delenv("GDN_FUZZ_DEFER_VERDICTS", raising=False)
    assert defer_default(True) is False
    monkeypatch.setenv("GDN_FUZZ_DEFER_VERDICTS", "on")
    assert defer_default(True) is True and defer_default(False) is False
    c, _ = _campaign("reference", None)
    assert c.defer and c.pipeline == 1
    c.close()
    monkeypatch.setenv("GDN_FUZZ_DEFER_VERDICTS", "sometimes")
    with pytest.raises(ValueError, match="GDN_FUZZ_DEFER_VERDICTS='sometimes'"):
        defer_default(True)


def test_the_depth_is_the_campaigns_or_the_environments(monkeypatch):
    """defer_depth: the Campaign's own, else $GDN_FUZZ_DEFER_DEPTH (1-4), else DEFER_DEPTH; anything else a
    ValueError naming it, its value and the range."""
    from gdn_fuzz.engine.campaign import MAX_DEFER_DEPTH

    monkeypatch.delenv("GDN_FUZZ_DEFER_DEPTH", raising=False)
    assert _campaign("reference", True)[0].defer_depth == DEFER_DEPTH == 2
    monkeypatch.setenv("GDN_FUZZ_DEFER_DEPTH", "3")
    assert _campaign("reference", True)[0].defer_depth == 3
    assert _campaign("reference", True, defer_depth=1)[0].defer_depth == 1
    for bad in (0, MAX_DEFER_DEPTH + 1, True, 1.5):
        with pytest.raises(ValueError, match=rf"defer_depth={bad!r}: give an int in \[1, {MAX_DEFER_DEPTH}\]"):
            _campaign("reference", True, defer_depth=bad)
    monkeypatch.setenv("GDN_FUZZ_DEFER_DEPTH", "deep")
    with pytest.raises(ValueError, match="GDN_FUZZ_DEFER_DEPTH='deep' is not a legal choice; use one of 1, 2, 3, 4"):
        _campaign("reference", True)


@pytest.mark.parametrize("argv, words", [
    (["--defer-verdicts", "on", "--no-isolate"], "(--defer-verdicts on, $GDN_FUZZ_DEFER_VERDICTS=on, defer=True) "
                                                 "with --no-isolate"),
    (["--defer-verdicts", "on", "--pipeline", "2"], "with --pipeline 2"),
])
def test_the_cli_refuses_deferred_verdicts_it_cannot_run(argv, words, monkeypatch):
    """A one-line usage error naming the options and the fix (the Campaign's own rule, defer_conflict)."""
    from gdn_fuzz.cli import UsageError, build_parser, validate_run_args

    monkeypatch.delenv("GDN_FUZZ_DEFER_VERDICTS", raising=False)
    with pytest.raises(UsageError) as e:
        validate_run_args(build_parser().parse_args(["run", *argv]))
    assert "\n" not in str(e.value) and words in str(e.value)


def test_the_cli_takes_on_or_off(capsys):
    """argparse refuses any other value of --defer-verdicts (exit 2, the choices named)."""
    from gdn_fuzz.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "--defer-verdicts", "yes"])
    assert e.value.code == 2 and "invalid choice: 'yes'" in capsys.readouterr().err
