"""Value seeds per drawn structure (issue 17: Campaign.seeds_per_example, `gdn-fuzz run
--seeds-per-example K`).

Each Hypothesis example draws a structure; the campaign checks it with K value seeds (the drawn
one, then campaign.value_seed(seed, i)), one checked launch each.  These tests pin: K = 1 checks
exactly what Hypothesis draws (the behaviour before the option); K = 4 checks 4 seeds per
structure, the drawn one first; an example budget counts checked launches; a bug that only some
value draws show is found and its stored case reproduces alone; the option is validated.
All on the CPU reference target (or a mutant or wrapper of it), a few seconds each; in this
process except the last test (crash isolation).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

from gdn_fuzz.case import Case
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.campaign import Campaign, value_seed
from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import CPU_GEOMETRIES
from gdn_fuzz.targets import get_target

SMALL = dict(device="cpu", arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,))


def _campaign(target="reference", props=("launch",), **kw) -> Campaign:
    """A Campaign whose checks are noted in .seen as (property, case, failed, structures drawn), in order."""

    class Seen(Campaign):
        def _check(self, prop, case):
            found = super()._check(prop, case)
            self.seen.append((prop.name, case, bool(found), self.stats.structures))
            return found

    c = Seen(target=get_target(target), properties=[get_property(p) for p in props], **{**SMALL, **kw})
    c.seen = []
    return c


def _structure(case: Case) -> Case:
    return dataclasses.replace(case, seed=0)


def test_value_seed_is_pinned_and_legal():
    """i = 0 is the drawn seed; i > 0 is the documented SplitMix64 mix, top 32 bits (pinned values,
    so the derivation cannot drift and stored reasoning about seeds stays true)."""
    assert value_seed(12345, 0) == 12345 and value_seed(2**64 - 1, 0) == 2**64 - 1
    assert [value_seed(0, i) for i in range(1, 4)] == [3793791033, 1853398634, 113532184]
    for s in (0, 1, 2, 7, 2**31, 2**32 - 1, 2**64 - 1):
        derived = [value_seed(s, i) for i in range(1, 9)]
        assert all(0 <= d < 2**32 for d in derived) and len(set(derived)) == 8
    # small drawn seeds (Hypothesis' favourites) give derived seeds that do not collide across i
    assert not {value_seed(s, 1) for s in range(64)} & {value_seed(s, 2) for s in range(64)}
    with pytest.raises(ValueError, match="seeds_per_example"):
        _campaign(seeds_per_example=0)


def test_k1_checks_exactly_the_drawn_cases():
    """K = 1 (the default) checks one case per Hypothesis example, the drawn case itself: the same
    sequence a plain @given test with the campaign's round seeds and settings draws."""
    c = _campaign(seed=3, round_examples=5, first_round_examples=5)
    assert c.seeds_per_example == 1
    c.run(examples=10)
    strat = get_property("launch").strategy(arms=SMALL["arms"], Ts=SMALL["Ts"], geometries=SMALL["geometries"],
                                            buckets=SMALL["buckets"])
    drawn = []
    for r in range(2):  # two rounds of 5: Campaign.run's round seeds
        @hseed(3 * 1_000_003 + r)
        @settings(max_examples=5, deadline=None, database=None, phases=(Phase.generate, Phase.target, Phase.shrink),
                  report_multiple_bugs=True, suppress_health_check=list(HealthCheck), print_blob=False)
        @given(strat)
        def plain(case):
            drawn.append(case)

        plain()
    assert [case for _, case, *_ in c.seen] == drawn
    assert c.stats.examples == c.stats.launches == c.stats.structures == 10


def test_k4_checks_four_seeds_per_structure_drawn_seed_first():
    """K = 4: four checks per structure, the first with the drawn seed (the K = 1 run's case), then
    value_seed(drawn, 1..3); a reseed=False property (guards) gets one check per structure."""
    one = _campaign(seed=5, round_examples=4, first_round_examples=4)
    one.run(examples=8)
    four = _campaign(seed=5, round_examples=4, first_round_examples=4, seeds_per_example=4)
    four.run(examples=32)
    assert four.stats.examples == four.stats.launches == 32 and four.stats.structures == 8
    cases = [case for _, case, *_ in four.seen]
    groups = [cases[i:i + 4] for i in range(0, 32, 4)]
    assert [g[0] for g in groups] == [case for _, case, *_ in one.seen]  # i = 0: exactly the drawn case
    for g in groups:
        assert len({_structure(x) for x in g}) == 1
        assert [x.seed for x in g] == [value_seed(g[0].seed, i) for i in range(4)]
        for x in g:
            x.validate()

    mixed = _campaign(props=("guards", "launch"), seed=1, round_examples=2, first_round_examples=2,
                      seeds_per_example=3)
    mixed.run(examples=8)
    per = mixed.stats.per_property
    assert not get_property("guards").reseed and get_property("launch").reseed
    assert per["guards"]["examples"] == 2 and per["launch"]["examples"] == 6  # 2 structures each
    assert mixed.stats.structures == 4


@pytest.mark.parametrize("target,n", [("reference", 10), ("mutant:fold_skipped", 30)])
def test_example_budget_counts_checked_launches(target, n):
    """--examples N with K = 4 checks exactly N cases when N is not a multiple of 4 (the budget is
    checked before every seed, shrinking included: fold_skipped fails and is shrunk)."""
    c = _campaign(target, seed=2, seeds_per_example=4)
    c.run(examples=n)
    assert c.stats.examples == c.stats.launches == len(c.seen) == n
    if target == "reference":  # nothing fails: ceil(n / 4) structures, the last one cut short by the budget
        assert c.stats.structures == -(-n // 4)
    assert bool(c.findings) == (target != "reference")


def test_a_stop_request_is_honoured_between_seeds():
    """A Ctrl-C noted after the second check of a structure stops before the third."""
    c = _campaign(seed=2, seeds_per_example=4)

    def on_example():
        if c.stats.examples == 2:
            c._stop_requested = True

    c.run(examples=40, on_example=on_example)
    assert c.interrupted and c.stats.examples == 2 and c.stats.structures == 1


_VALUE_BUG = '''\
from gdn_fuzz.targets import REFERENCE_PATH, import_file

_ref = import_file(REFERENCE_PATH, __name__ + "_ref")  # this arm's reference module
RING_SLOTS, W_RING = _ref.RING_SLOTS, _ref.W_RING
IO_TORCH, ST_TORCH, RING_TORCH = _ref.IO_TORCH, _ref.ST_TORCH, _ref.RING_TORCH


def gated_delta_rule_mtp_ucache_flush(*args, **kw):
    q = kw["q"].float().flatten()
    bad = bool(q[0] > 1.5 * q.std())  # planted: y is off only for some value draws (~7% of seeds)
    y = _ref.gated_delta_rule_mtp_ucache_flush(*args, **kw)
    if bad:
        y.add_(1.0)
    return y
'''


def test_a_value_dependent_bug_is_found_and_its_stored_case_reproduces_alone(tmp_path):
    """A planted bug that shows for ~7% of value seeds, whatever the structure: K = 4 finds it, at
    least one failing check used a derived seed (the drawn one passed), and the case reported and
    stored (the failing seed's, shrunk) fails by itself with the same signature."""
    path = tmp_path / "value_bug.py"
    path.write_text(_VALUE_BUG)
    c = _campaign(str(path), seed=2, seeds_per_example=4, corpus_dir=tmp_path / "c", stop_on_finding=True)
    c.run(examples=200)
    assert c.findings, "the planted bug was not found"
    # the position of each check within its structure (checks of one body call share stats.structures)
    pos, prev = [], None
    for *_, n in c.seen:
        pos.append(0 if n != prev else pos[-1] + 1)
        prev = n
    failing = [(i, case) for i, (_, case, bad, _) in zip(pos, c.seen) if bad]
    assert failing and any(i > 0 for i, _ in failing), "no failing check used a derived seed"
    for k, (i, case) in enumerate(zip(pos, (x[1] for x in c.seen))):
        if i > 0:  # a derived seed: value_seed of the structure's drawn seed (its first check's)
            assert case.seed == value_seed(c.seen[k - i][1].seed, i)
    launch = get_property("launch")
    target = get_target(str(path))
    entries = corpus.entries(tmp_path / "c")
    assert len(entries) == len(c.findings)
    for sig, f in c.findings.items():
        assert (f.case, True) in {(case, bad) for _, case, bad, _ in c.seen}  # a case that failed as checked
        assert sig in {x.signature() for x in launch.check(target, f.case, "cpu")}
    for p in entries:  # the stored case, read back from its file, fails alone with its signature
        e = corpus.read(p)
        assert e.case == Case.from_dict(json.loads(p.read_text())["case"])
        assert e.signature in {x.signature() for x in launch.check(target, e.case, "cpu")}


def test_cli_option_validates_and_reaches_the_campaign(tmp_path, monkeypatch, capsys):
    """--seeds-per-example K (default $GDN_FUZZ_SEEDS_PER_EXAMPLE, else 1): K < 1 is a one-line usage
    error (exit 2) naming the option, the value and the fix; a run reports structures and K in its JSON."""
    from gdn_fuzz.cli import EXIT_USAGE, UsageError, build_parser, main, validate_run_args

    monkeypatch.delenv("GDN_FUZZ_SEEDS_PER_EXAMPLE", raising=False)
    assert build_parser().parse_args(["run"]).seeds_per_example == 1
    with pytest.raises(UsageError) as e:
        validate_run_args(build_parser().parse_args(["run", "--seeds-per-example", "0"]))
    assert "\n" not in str(e.value) and str(e.value).startswith("--seeds-per-example=0: give at least 1")
    assert main(["run", "--seeds-per-example", "0", "--no-corpus"]) == EXIT_USAGE
    out = " ".join(capsys.readouterr().out.split())  # the console wraps at its width
    assert out.startswith("gdn-fuzz run: --seeds-per-example=0: give at least 1"), out
    monkeypatch.setenv("GDN_FUZZ_SEEDS_PER_EXAMPLE", "3")
    assert build_parser().parse_args(["run"]).seeds_per_example == 3
    assert build_parser().parse_args(["run", "--seeds-per-example", "2"]).seeds_per_example == 2
    monkeypatch.setenv("GDN_FUZZ_SEEDS_PER_EXAMPLE", "0")
    assert main(["run", "--no-corpus"]) == EXIT_USAGE
    assert "--seeds-per-example=0" in capsys.readouterr().out
    monkeypatch.setenv("GDN_FUZZ_SEEDS_PER_EXAMPLE", "many")
    with pytest.raises(SystemExit) as e:  # argparse: "invalid int value: 'many'"
        build_parser().parse_args(["run"])
    assert e.value.code == 2
    monkeypatch.delenv("GDN_FUZZ_SEEDS_PER_EXAMPLE")
    rc = main(["run", "--target", "reference", "--device", "cpu", "--arms", "bf16", "--T", "4", "--buckets", "4",
               "--property", "launch", "--examples", "7", "--seeds-per-example", "3", "--no-isolate", "--no-corpus",
               "--json", str(tmp_path / "r.json")])
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and (rec["examples"], rec["launches"], rec["structures"], rec["seeds_per_example"]) == (7, 7, 3, 3)


def test_isolated_campaign_checks_each_seed_in_the_worker(tmp_path):
    """With crash isolation each seed is one check in the worker; a failure is confirmed in a fresh
    worker on the failing seed's case and filed with it; the budget stays exact."""
    c = Campaign(target=get_target("mutant:fold_skipped"), properties=[get_property("launch")], seed=2,
                 seeds_per_example=3, isolate=True, corpus_dir=tmp_path / "c", launch_timeout_s=60.0, **SMALL)
    c.run(examples=11)
    assert c.stats.examples == c.stats.launches == 11 and not c.unconfirmed
    (f,) = c.findings.values()
    (p,) = corpus.entries(tmp_path / "c")
    assert corpus.read(p).case == f.case
    assert f.signature in {x.signature() for x in get_property("launch").check(c.target, f.case, "cpu")}


def _two_signatures(target, case, device):
    """A planted property (no launch): every case with a live row fails, with one of two
    signatures chosen by the structure (first live row's hist_len odd or even)."""
    from gdn_fuzz.findings import Finding

    live = [r for r in case.rows if not r.pad]
    if not live:
        return []
    return [Finding("planted.odd" if live[0].hist_len % 2 else "planted.even", "X", "planted", outcome="wrong value")]


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("seed,n", [(1, 24), (1, 25), (0, 41)])
def test_budget_or_stop_during_hypothesis_final_replay_ends_cleanly(seed, n, k):
    """With two distinct failures Hypothesis replays each shrunk case at the end, one by one; a budget
    spent (or a stop request) between those replays made it raise BaseExceptionGroup([PropertyFailed,
    BudgetSpent]) out of Campaign.run (on main too, K = 1: these seeds and budgets crashed).  A replay
    takes up to K checks, so K > 1 made it likelier.  Now both failures are kept, exactly n checks."""
    from gdn_fuzz.properties import Property

    prop = Property("planted", "X", "two planted signatures", _two_signatures,
                    strategy=get_property("launch").strategy)
    c = Campaign(target=get_target("reference"), properties=[prop], seed=seed, seeds_per_example=k, **SMALL)
    c.run(examples=n)
    assert c.stats.examples == n and not c.interrupted
    assert sorted(c.findings) == ["planted.even [X] wrong value", "planted.odd [X] wrong value"]

    stop = Campaign(target=get_target("reference"), properties=[prop], seed=seed, seeds_per_example=k, **SMALL)

    def on_example():
        if stop.stats.examples == n:
            stop._stop_requested = True

    stop.run(examples=10 * n, on_example=on_example)
    assert stop.interrupted and stop.stats.examples == n and len(stop.findings) == 2
