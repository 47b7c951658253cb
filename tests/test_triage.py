"""Triage: failure signatures, known bugs that mask nothing, no heuristic false alarms, budgets, exit codes.

How this file tests
-------------------
A planted target with two bugs in the launch property (tests/planted.two_bugs: A raises on every
T = 8 launch, B skips the fold of flush rows) must give two findings with two signatures and two
corpus entries, and with A recorded as a known bug (an open corpus entry of that target) the
campaign must count A and still find B.  A campaign on a slow failing target must end within its
budget + 10% while a finding is being shrunk, and report when the first failing example was
seen.  The CLI's exit codes are checked on real runs.  The precision false alarm of the H200 run
(a bf16-valued u record on the bf16-ring16 arm, which N3 allows) is replayed on every property
and must pass.  The extremes property must accept both documented outcomes of N2 and still catch
damage outside the overflowing head.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdn_fuzz import cli

from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.campaign import Campaign
from gdn_fuzz.case import Case, Regime, Row
from gdn_fuzz.findings import Finding, raised
from gdn_fuzz.targets.mutants import CATALOGUE, Mutant, materialize_mutant
from gdn_fuzz.properties import REGISTRY, for_kernel, get_property

FLUSH = {n: REGISTRY[n] for n in for_kernel("flush")}  # the flush kernel's properties (the materializer's: test_materialize.py)
from gdn_fuzz.strategies import CPU_GEOMETRIES
from gdn_fuzz.targets import get_target

from .planted import TWO_BUGS_A, TWO_BUGS_B, two_bugs


def _campaign(target, corpus_dir, known=None, **kw):
    opts = dict(target=target, device="cpu", properties=[get_property("launch")], arms=("bf16",), Ts=(4, 8),
                geometries=CPU_GEOMETRIES, buckets=(4,), seed=1, round_examples=20, corpus_dir=corpus_dir,
                known=known or {})
    opts.update(kw)
    return Campaign(**opts)


# ------------------------------------------------------------------ signatures


def test_signature_tells_outcomes_apart_and_ignores_numbers():
    """Check id, clause, outcome class and route family make the signature; numbers in a message do not."""
    a = Finding("output_inplace.strided.launch", "H*", "x", outcome=raised(RuntimeError("stride 4 of dim 1")))
    b = Finding("output_inplace.strided.launch", "H*", "y", outcome=raised(RuntimeError("stride 8 of dim 2")))
    c = Finding("output_inplace.strided.launch", "H*", "x", outcome=raised(ValueError("stride 4 of dim 1")))
    d = Finding("output_inplace.converted.launch", "H*", "x", outcome=raised(RuntimeError("stride 4 of dim 1")))
    assert a.signature() == b.signature()
    assert len({a.signature(), c.signature(), d.signature()}) == 3
    y_f = Finding("oracle.y", "M4", "", outcome="out of tolerance", family="flush")
    y_v = Finding("oracle.y", "M4", "", outcome="out of tolerance", family="verify")
    y_n = Finding("oracle.y", "M4", "", outcome="non-finite", family="flush")
    assert len({y_f.signature(), y_v.signature(), y_n.signature()}) == 3


def test_every_finding_of_the_properties_has_an_outcome_class():
    """No property leaves a finding without its outcome class (the signature would be vague)."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=4, rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)),
                seed=7)
    for name in ("launch", "routing", "commit", "metamorphic"):
        found = REGISTRY[name].check(get_target("mutant:fold_skipped"), case, "cpu")
        assert all(f.outcome for f in found), [(f.prop, f.outcome) for f in found]


# ------------------------------------------------------------------ two bugs, known bugs


def test_two_planted_bugs_in_one_property_are_two_entries(tmp_path):
    """Two bugs in one property: both are found in one campaign and stored as two entries."""
    c = _campaign(get_target(str(two_bugs(tmp_path))), tmp_path / "c")
    c.run(examples=100)
    assert set(c.findings) == {TWO_BUGS_A, TWO_BUGS_B}, list(c.findings)
    stored = {corpus.read(p).signature for p in corpus.entries(tmp_path / "c")}
    assert stored == {TWO_BUGS_A, TWO_BUGS_B}


def test_a_known_signature_does_not_stop_the_search(tmp_path):
    """A as a known bug (open corpus entry of the target): counted, not stored again, and B is found."""
    target = get_target(str(two_bugs(tmp_path)))
    cdir = tmp_path / "c"
    case = Case(arm="bf16", T=8, H=1, HV=1, pool=4, rows=(Row(0),) * 1 + (Row(-1),) * 3, seed=0)
    known_entry = corpus.make_entry("launch", case, [Finding("launch", "H*", "planted A", outcome=raised(
        RuntimeError("planted A: the T = 8 layout is not consistent with the tile")))], target.name)
    assert known_entry.signature == TWO_BUGS_A
    corpus.write(known_entry, cdir)
    known = corpus.known_signatures(target.name, cdir)
    assert list(known) == [TWO_BUGS_A]
    c = _campaign(target, cdir, known=known)
    c.run(examples=100)
    assert list(c.findings) == [TWO_BUGS_B]
    assert c.known_hits[TWO_BUGS_A] > 0
    assert [k["corpus_entry"] for k in c.known_summary()] == [known[TWO_BUGS_A]]
    assert len(corpus.entries(cdir)) == 2


def test_replay_of_an_open_entry_must_show_its_signature(tmp_path):
    """An open entry replays as expected only with its own signature; another failure is not its bug."""
    target = get_target(str(two_bugs(tmp_path)))
    flush_t4 = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 13, 0),), seed=0)
    e_b = corpus.make_entry("launch", flush_t4, get_property("launch").check(target, flush_t4), target.name)
    assert e_b.signature == TWO_BUGS_B
    ok, what = corpus.verdict(e_b, get_property("launch").check(target, flush_t4))
    assert ok, what
    wrong = corpus.Entry(case=flush_t4, prop="launch", findings=[], keys=[], target=target.name,
                         signature=TWO_BUGS_A)  # claims A on a case that shows B
    ok, what = corpus.verdict(wrong, get_property("launch").check(target, flush_t4))
    assert not ok and what.startswith("fails differently")
    ok, what = corpus.verdict(e_b, [])
    assert not ok and "fixed" in what


# ------------------------------------------------------------------ time to finding, budgets


SLOW = '''import time
from pathlib import Path
import os
from gdn_fuzz.targets import import_file
_base = import_file(Path({base!r}), "_gdn_fuzz_slow_" + os.environ.get("GDN_UCACHE_IO_DTYPE", "x"))
RING_SLOTS, W_RING = _base.RING_SLOTS, _base.W_RING
IO_TORCH, ST_TORCH, RING_TORCH = _base.IO_TORCH, _base.ST_TORCH, _base.RING_TORCH


def gated_delta_rule_mtp_ucache_flush(*args, **kw):
    time.sleep({sleep})
    return _base.gated_delta_rule_mtp_ucache_flush(*args, **kw)
'''


def test_budget_is_kept_while_a_finding_is_shrunk(tmp_path):
    """--seconds N ends within N + 10% with a finding in flight; the best case so far is kept and
    the time of the first failing example is recorded apart from the shrinking."""
    base = materialize_mutant(CATALOGUE["fold_skipped"], tmp_path)
    slow = tmp_path / "slow.py"
    slow.write_text(SLOW.format(base=str(base), sleep=0.3))  # shrinking alone would take longer than the budget
    firsts, checks = [], []

    class Timed(Campaign):
        def _check(self, prop, case):
            t0 = time.monotonic()
            try:
                return super()._check(prop, case)
            finally:
                checks.append(time.monotonic() - t0)

    opts = dict(target=get_target(str(slow)), device="cpu", properties=[get_property("launch")], arms=("bf16",),
                Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=1, round_examples=200)
    c = Timed(**opts)
    budget = 5.0
    c.run(seconds=budget, on_first=lambda *a: firsts.append(a))
    # the budget + 10%, plus the one check that was running at the deadline (a launch is not
    # interrupted; on a 60 s budget that is under 1%, on this 5 s one it is not)
    assert c.stats.elapsed <= 1.1 * budget + max(checks), (c.stats.elapsed, max(checks))
    (f,) = c.findings.values()
    assert f.signature == TWO_BUGS_B
    assert len(firsts) == 1 and firsts[0][0] == f.signature
    assert f.first_t == firsts[0][4] and f.first_examples == firsts[0][5]
    assert f.first_t + f.shrink_s <= c.stats.elapsed + 1e-6 and not f.shrunk
    rec = f.to_record()
    for key in ("signature", "known", "first_failure_s", "examples_before", "shrink_s", "shrunk"):
        assert key in rec


# ------------------------------------------------------------------ exit codes


def _run_cli(argv, tmp_path):
    return subprocess.run([sys.executable, "-m", "gdn_fuzz.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.parametrize("argv, says", [
    (["run", "--arms", "nonsense"], "--arms nonsense"),
    (["run", "--seconds", "0"], "--seconds=0"),
    (["run", "--seconds", "-1"], "--seconds=-1"),
    (["run", "--examples", "0"], "--examples=0"),
    (["run", "--buckets", "3"], "--buckets 3"),
    (["run", "--buckets", "0"], "--buckets 0"),
    (["run", "--property", "nope"], "--property nope"),
    (["run", "--target", "/nonexistent/kernel.py"], "/nonexistent/kernel.py"),
])
def test_usage_errors_exit_2_in_one_line(argv, says, tmp_path):
    """Bad options and missing targets: exit 2, one line naming the option, no traceback."""
    p = _run_cli(argv, tmp_path)
    assert p.returncode == cli.EXIT_USAGE, (p.returncode, p.stdout, p.stderr)
    assert says in p.stdout + p.stderr and "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("var", ["GDN_FUZZ_GRAPHS", "GDN_FUZZ_ORACLE", "GDN_FUZZ_SPARE_WORKER",
                                 "GDN_FUZZ_DEFER_VERDICTS", "GDN_FUZZ_CONFIRMATIONS", "GDN_FUZZ_DRAW_AHEAD",
                                 "GDN_FUZZ_DEFER_DEPTH"])
def test_a_bad_switch_in_the_environment_is_a_usage_error(var, tmp_path, monkeypatch):
    """A campaign's environment switches are read before any check: exit 2, one line naming the variable, its value
    and the legal choices.  Before: GDN_FUZZ_GRAPHS=bogus raised inside every check, and the run filed it as a
    'launch raised' finding against the reference target."""
    monkeypatch.setenv(var, "bogus")
    p = _run_cli(["run", "--examples", "3", "--no-corpus"], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == cli.EXIT_USAGE, (p.returncode, out)
    assert f"{var}='bogus' is not a legal choice" in out and "finding" not in out and "Traceback" not in out


@pytest.mark.parametrize("source, says", [
    ("def gated_delta_rule_mtp_ucache_flush(:\n", "SyntaxError"),
    ("def gated_delta_rule_mtp_ucache_flush(**kw):\n    pass\n", "RING_SLOTS"),
])
def test_a_target_that_does_not_load_is_a_setup_error(tmp_path, source, says):
    bad = tmp_path / "broken.py"
    bad.write_text(source)
    p = _run_cli(["run", "--target", str(bad), "--examples", "5", "--no-corpus"], tmp_path)
    assert p.returncode == cli.EXIT_USAGE and says in p.stdout and "Traceback" not in p.stdout + p.stderr


def test_exit_codes_new_known_and_fail_on_known(tmp_path):
    """1 with a new finding; 0 when every finding is a known bug; 3 for that with --fail-on-known."""
    cdir = tmp_path / "c"
    args = ["run", "--target", "mutant:fold_skipped", "--arms", "bf16", "--T", "4", "--buckets", "4",
            "--property", "launch", "--examples", "40", "--no-isolate", "--corpus", str(cdir)]
    p = _run_cli(args + ["--json", str(tmp_path / "a.json")], tmp_path)
    assert p.returncode == cli.EXIT_NEW, p.stdout[-2000:]
    rec = json.loads((tmp_path / "a.json").read_text())
    assert [f["signature"] for f in rec["findings"]] == [TWO_BUGS_B] and not rec["findings"][0]["known"]
    assert corpus.read(corpus.entries(cdir)[0]).signature == TWO_BUGS_B  # open entry: now a known bug
    p = _run_cli(args + ["--json", str(tmp_path / "b.json")], tmp_path)
    assert p.returncode == cli.EXIT_OK, p.stdout[-2000:]
    rec = json.loads((tmp_path / "b.json").read_text())
    assert rec["findings"] == [] and [k["signature"] for k in rec["known"]] == [TWO_BUGS_B]
    p = _run_cli(args + ["--fail-on-known"], tmp_path)
    assert p.returncode == cli.EXIT_KNOWN_ONLY, p.stdout[-2000:]


# ------------------------------------------------------------------ no heuristic false alarms


# The precision false alarm of the H200 run of 2026-11-29 (was the guard entry
# corpus/precision-f2fa41a90427d65a.json): bf16-ring16, T = 4, one verify row with P = 0,
# strong decay, beta near 1: U = Tmat R with Tmat ~ I, so the u records are bf16 values, as N3 allows.
PRECISION_FALSE_ALARM = Case(arm="bf16-ring16", T=4, H=1, HV=1, pool=1,
                             rows=(Row(0, 0, 0), Row(-1), Row(-1), Row(-1)), seed=0,
                             regime=Regime(decay="strong", beta="near1"))


# An implementation that takes N3's rounding points literally for the update: R = V - e^G S k rounded
# to IO and beta (the diagonal of Tmat) rounded to IO, so with beta ~ 1 its u records are bf16 values.
N3_ROUNDING = Mutant(
    "n3_rounding", "N3", "-",
    'U = own * beta[:, t, :, None] * (v[:, t].float() - torch.einsum("bhvk,bhk->bhv", S, k_hat[:, t]))',
    'U = own * beta[:, t, :, None].to(q.dtype).float() * '
    '(v[:, t].float() - torch.einsum("bhvk,bhk->bhv", S, k_hat[:, t])).to(q.dtype).float()',
    "R and Tmat's diagonal rounded to IO before U = Tmat R, as N3 lists them")


def test_the_precision_false_alarm_cannot_come_back(tmp_path):
    """No property judges rounding patterns (the statistical rule is a study now).  The H200 false
    alarm's case passes every property both on the reference and on an implementation that rounds
    R and beta to IO as N3 says, although that one's u records carry the bf16 pattern that the old
    rule called a violation (it needed >= 3/4 of them)."""
    from gdn_fuzz.observation import observe
    from gdn_fuzz.studies.precision import rounding_pattern

    assert "precision" not in REGISTRY
    n3 = get_target(str(materialize_mutant(N3_ROUNDING, tmp_path)))
    for target in (get_target("reference"), n3):
        for name, p in FLUSH.items():
            assert p.check(target, PRECISION_FALSE_ALARM, "cpu") == [], (target.name, name)
    zero, n = rounding_pattern(observe(n3, PRECISION_FALSE_ALARM))["u"]
    assert n >= 128 and zero / n >= 0.75, (zero, n)


def test_rounding_study_still_sees_the_unscored_mutants():
    """u_stored_io (U through bf16 before the fp16 ring) is within tolerance: only the study shows it."""
    from gdn_fuzz.observation import observe
    from gdn_fuzz.studies.precision import rounding_pattern

    case = Case(arm="bf16-state16-ring16", T=4, H=1, HV=2, pool=2, rows=(Row(0, 13, 0), Row(1, 4, 9)), seed=4)
    z_m, n_m = rounding_pattern(observe(get_target("mutant:u_stored_io"), case))["u"]
    z_r, n_r = rounding_pattern(observe(get_target("reference"), case))["u"]
    assert z_m == n_m and z_r / n_r < 0.5
    assert get_property("launch").check(get_target("mutant:u_stored_io"), case) == []


FINITE_GATE = Mutant("finite_gate", "N2", "-", "torch.log1p(torch.exp(x))",
                     "torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))",
                     "softplus with torch's threshold: the gate stays finite past 88.7 (more correct than N2)")
HEAD1_HURT = Mutant("head1_hurt", "N2", "extremes.oracle.y", "    y = torch.stack(ys, 1).to(q.dtype)  # [B, T, HV, V]",
                    "    y = torch.stack(ys, 1).to(q.dtype)  # [B, T, HV, V]\n"
                    "    if bool((a[..., 0].float() > 100).any()) and HV > 1:\n"
                    "        y[:, :, 1] = y[:, :, 1] * 2",
                    "an extreme gate on head 0 damages head 1's output")


def test_extremes_accepts_both_documented_outcomes_and_catches_damage_elsewhere(tmp_path):
    """N2 as containment: the overflowing head may match the oracle (a finite gate) or be
    non-finite (the released kernel); another head damaged by it is a finding."""
    case = Case(arm="bf16", T=4, H=1, HV=2, pool=4, rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)),
                seed=7)
    check = get_property("extremes").check
    assert check(get_target("reference"), case) == []
    finite = get_target(str(materialize_mutant(FINITE_GATE, tmp_path)))
    assert check(finite, case) == []
    src = Path(get_target("reference").path).read_text()
    if HEAD1_HURT.old not in src:
        pytest.fail("the reference target's return statement changed; update HEAD1_HURT")
    hurt = check(get_target(str(materialize_mutant(HEAD1_HURT, tmp_path))), case)
    assert [f.prop for f in hurt] == ["extremes.oracle.y"] and hurt[0].head == 1


INDEPENDENT = Path(__file__).parent / "targets" / "independent_ucache_flush.py"


@pytest.mark.parametrize("target_name", ["reference", str(INDEPENDENT)])
def test_correct_implementations_raise_no_alarm(target_name):
    """Never cry wolf: every property, all five arms, T = 4 and 8, against the reference target and
    against an independent float64 implementation written from the contract (tests/targets):
    nothing is reported.  (The long version, >= 10,000 examples each, is in docs/triage.md.)"""
    from gdn_fuzz.arms import ARM_NAMES

    c = Campaign(target=get_target(target_name), device="cpu", properties=list(FLUSH.values()), arms=ARM_NAMES,
                 Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=(4, 8), seed=3, round_examples=8, shrink=False)
    c.run(examples=8 * len(REGISTRY))
    assert c.stats.examples >= 8 * len(REGISTRY) and not c.findings, [f.signature for f in c.findings.values()]


# ------------------------------------------------------------------ scheduling


def test_every_property_is_reached_in_the_first_tenth_of_an_example_budget():
    """Rounds interleave the properties (sizes 1, 2, 4, ... up to round_examples): with a budget of
    10 examples per property (80 for eight) every property has run within the first tenth (by example
    8 of 80), and every property gets its share (the old rounds of 25 per property reached only four
    properties in 80 examples)."""
    n = len(FLUSH)
    camp = Campaign(target=get_target("reference"), device="cpu", properties=list(FLUSH.values()),
                    arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=3, shrink=False)
    camp.run(examples=10 * n)
    pp = camp.stats.per_property
    assert set(pp) == set(FLUSH), f"properties never run: {sorted(set(FLUSH) - set(pp))}"
    assert max(p["first_example"] for p in pp.values()) < n, pp
    assert sum(p["examples"] for p in pp.values()) == camp.stats.examples == 10 * n
    assert min(p["examples"] for p in pp.values()) >= 10 - 4, pp


# ------------------------------------------------------------------ shrinking past the budget (issue 32)


def _grace_campaign(seed: int, grace: float):
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.properties import get_property
    from gdn_fuzz.strategies.prefix import CPU_GEOMETRIES
    from gdn_fuzz.targets import get_target

    # an edit of the reference materializer that fails almost every call: the budget of one example ends at the
    # first failure, so every step of its shrink happens past the budget
    return Campaign(target=get_target("mutant:pm_ref_num_active_short"), device="cpu",
                    properties=[get_property("pm_launch")], arms=("bf16",), Ts=(4,), geometries=CPU_GEOMETRIES,
                    buckets=(4,), seed=seed, shrink_grace_s=grace)


def test_shrink_grace_finishes_a_shrink_the_budget_cut():
    """A one-example budget ends at the first failing example: without grace the finding is the unshrunk case
    (shrunk=False, as before); with a grace of 60 s the same run shrinks it to the end (shrunk=True), the seconds
    past the budget are counted (stats.grace_s), and no new round starts (the shrink's examples only)."""
    cut = _grace_campaign(0, 0.0).run(examples=1)
    (f0,) = cut.findings.values()
    assert not f0.shrunk and cut.stats.examples == 1 and cut.stats.grace_s == 0.0
    full = _grace_campaign(0, 60.0).run(examples=1)
    f1 = full.findings[f0.signature]
    assert f1.shrunk and full.stats.examples > 1 and 0.0 < full.stats.grace_s < 60.0
    assert full.stats.rounds == 1


def test_shrink_grace_is_bounded():
    """A shrink that needs seconds (seed 2: 81 examples and three signatures in 1.8 s on the 2-core machine) is cut
    at the grace: the time past the budget stays within the grace plus one check (1 s of slack), and what was
    still being shrunk is stored as its best case so far (shrunk=False)."""
    c = _grace_campaign(2, 0.05).run(examples=1)
    assert 0.0 < c.stats.grace_s <= 0.05 + 1.0
    assert c.findings and not all(f.shrunk for f in c.findings.values())


def test_shrink_grace_rejects_a_negative_value():
    with pytest.raises(ValueError, match=r"shrink_grace_s=-1.0: give a number of seconds >= 0"):
        _grace_campaign(0, -1.0)


def test_run_reports_the_grace_it_used(tmp_path):
    """`gdn-fuzz run --shrink-grace` reaches the campaign and the summary says how long shrinking ran past the
    budget; --shrink-grace -1 is a usage error naming the option."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "gdn_fuzz.cli", "run", "--target", "mutant:pm_ref_num_active_short", "--property",
            "pm_launch", "--arms", "bf16", "--examples", "1", "--no-corpus", "--no-isolate", "--processes", "1"]
    r = subprocess.run(base + ["--shrink-grace", "60"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "shrinking ran" in r.stdout and "past the budget (--shrink-grace 60s)" in r.stdout, r.stdout
    bad = subprocess.run(base + ["--shrink-grace", "-1"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "--shrink-grace=-1.0: give a number of seconds >= 0" in bad.stdout, bad.stdout
