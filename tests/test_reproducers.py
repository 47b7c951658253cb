"""A finding is its own reproducer: the printed and stored launch is the launch that failed.

How this file tests
-------------------
1. One test per property (launch, routing, determinism, output_inplace, metamorphic, guards,
   commit, extremes).  A planted bug (a catalogued mutant of gdn_fuzz.targets.mutants with the hand-picked
   case of tests/test_mutants.py, or a bug planted here where the catalogue has none: a launch that
   is not deterministic, a softplus clamped at 20) gives a finding.  The target is wrapped so that
   every call it receives is recorded (keyword arguments, shapes, strides and bits, before the call
   writes anything).  The finding is stored as a corpus entry, read back, and from the stored JSON
   alone (reproducer.Launch) the launch is rebuilt: its keyword arguments must be bitwise one of
   the calls that ran, and the property's check run on the stored Case must show the same
   signature and describe the same launch (a check is idempotent on the Case it prints).  Where
   the property judges one launch against the oracle (launch, extremes), the rebuilt launch run as
   a plain call + check_oracle/check_writes shows the signature; for commit, a plain
   target.launch(**materialize(stored case)) shows the wrong cursors (and the case the property
   was given, launched plainly, does not: the old printout was no reproducer).
2. `gdn-fuzz replay ENTRY --emit-test PATH`: the emitted file imports only public modules, holds
   the Case as a literal, fails on the buggy target and passes with the target switched to the
   reference through its environment variable (run by pytest in a fresh process).
3. Units: oracle numbers name the metric and how the bound is made up; bit differences name what
   their number is.  Edges: a shrunk row at P = flush_min names which neighbours pass.
4. The launch survives the worker process and a campaign's corpus entry.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from gdn_fuzz.engine import corpus
from gdn_fuzz.engine import reproducer as R
from gdn_fuzz.case import Case, Regime, Row, materialize
from gdn_fuzz.checks import check_oracle, check_writes
from gdn_fuzz.findings import Finding
from gdn_fuzz.observation import observe, same_bits
from gdn_fuzz.targets.mutants import Mutant, materialize_mutant
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.properties import get_property
from gdn_fuzz.strategies import cases
from gdn_fuzz.targets import REFERENCE_PATH, Target, get_target

REPO = Path(__file__).resolve().parents[1]

# the hand-picked case of tests/test_mutants.py: row 0 flushes at exactly flush_min (13) with a window
# wrapping past slot 31; row 1 verifies at base 20; a pad row; row 3 has P = 0 at base 31
WRAP = Case(arm="bf16", T=4, H=1, HV=2, pool=4, rows=(Row(2, 13, 25), Row(0, 5, 20), Row(-1), Row(1, 0, 31)), seed=7)

NONDET = '''"""Planted: every second launch adds 1 to the first output element (a race, seen as nondeterminism)."""
import os
from pathlib import Path

from gdn_fuzz.targets import import_file

_env = "_".join(os.environ.get(k, "") for k in ("GDN_UCACHE_IO_DTYPE", "GDN_UCACHE_STATE_DTYPE",
                                                "GDN_UCACHE_RING_DTYPE"))
_base = import_file(Path({base!r}), "_gdn_fuzz_planted_nondet_" + _env.replace("-", "_"))
RING_SLOTS, W_RING = _base.RING_SLOTS, _base.W_RING
IO_TORCH, ST_TORCH, RING_TORCH = _base.IO_TORCH, _base.ST_TORCH, _base.RING_TORCH
_calls = [0]


def gated_delta_rule_mtp_ucache_flush(*args, **kw):
    out = _base.gated_delta_rule_mtp_ucache_flush(*args, **kw)
    _calls[0] += 1
    if _calls[0] % 2 == 0:
        out[0, 0, 0, 0] += 1
    return out
'''

# a softplus that returns its threshold for large logits: finite and wrong where a + dt_bias ~ 120,
# invisible on every drawn case (a + dt_bias stays far below 20 there)
SOFTPLUS_CLAMPED = Mutant("softplus_clamped_at_20", "N2", "extremes.oracle",
                          "torch.log1p(torch.exp(x))", "torch.log1p(torch.exp(x.clamp(max=20.0)))",
                          "softplus(x) evaluated at min(x, 20): a finite, wrong gate for large logits")


def _planted(kind: str, tmp_path) -> str:
    if kind == "nondet":
        p = Path(tmp_path) / "nondet.py"
        p.write_text(NONDET.format(base=str(REFERENCE_PATH)))
        return str(p)
    if kind == "softplus":
        return str(materialize_mutant(SOFTPLUS_CLAMPED, Path(tmp_path)))
    return kind


class Recording(Target):
    """A target that records every call it receives (before the call writes anything)."""

    def __init__(self, base: Target):
        super().__init__(base.name, base.path, base.entry, base.needs_cuda, base.min_sm)
        self.calls: list[dict] = []

    def launch(self, arm, **kw):
        rec = {}
        for k, v in kw.items():
            rec[k] = (tuple(v.shape), v.stride(), v.dtype, v.clone()) if isinstance(v, torch.Tensor) else v
        self.calls.append(rec)
        return super().launch(arm, **kw)


def _same_call(rec: dict, kw: dict) -> bool:
    if set(rec) != set(kw):
        return False
    for k, v in kw.items():
        r = rec[k]
        if isinstance(v, torch.Tensor):
            if not isinstance(r, tuple) or (tuple(v.shape), v.stride(), v.dtype) != r[:3]:
                return False
            if not bool(same_bits(v, r[3]).all()):
                return False
        elif isinstance(r, tuple) or r != v:
            return False
    return True


def _stored(tmp_path, prop: str, case: Case, found, target_name: str, sig: str) -> corpus.Entry:
    """The finding as a corpus entry written to disk and read back (the stored form)."""
    path, _ = corpus.write(corpus.make_entry(prop, case, found, target_name, signature=sig), Path(tmp_path) / "c")
    raw = json.loads(path.read_text())
    assert "launch" in raw and raw["launch"]["case"], raw.keys()
    return corpus.read(path)


# property -> (target: catalogued mutant or planted kind, finding prefix expected)
PER_PROPERTY = {
    "launch": ("mutant:fold_skipped", "oracle.fold"),
    "routing": ("mutant:flush_off_by_one", "routing."),
    "determinism": ("nondet", "determinism.y_bits"),
    "output_inplace": ("mutant:pad_output_zeroed", "output_inplace.pad_rows"),
    "metamorphic": ("mutant:b_token_stride_hardcoded", "metamorphic.strided_ab"),
    "guards": ("mutant:guard_T", "guard.H13.T"),
    "commit": ("mutant:commit_pad_exempt", "commit.cursors"),
    "extremes": ("softplus", "extremes.oracle"),
}


@pytest.mark.parametrize("prop", list(PER_PROPERTY))
def test_stored_launch_is_the_launch_that_failed(prop, tmp_path):
    """Rebuilt from the stored JSON alone, the launch is bitwise a call that ran, and the property's
    check on the stored Case shows the same signature with the same launch."""
    tname, prefix = PER_PROPERTY[prop]
    tname = _planted(tname, tmp_path)
    target = Recording(get_target(tname))
    check = get_property(prop).check
    found = check(target, WRAP, "cpu")
    hits = [f for f in found if f.prop.startswith(prefix)]
    assert hits, f"{prop}: no {prefix}* finding on {tname}: {[str(f) for f in found]}"
    f = hits[0]
    sig = f.signature()
    assert all(isinstance(x.launch, dict) for x in found), [x.prop for x in found if not x.launch]
    entry = _stored(tmp_path, prop, WRAP, found, tname, sig)
    launch = R.Launch.from_dict(entry.launch)
    assert launch.to_dict() == R.Launch.from_dict(f.launch).to_dict()

    # 1. the stored launch, rebuilt, is bitwise one of the calls the target received
    kw = R.launch_inputs(launch, "cpu")
    assert any(_same_call(rec, kw) for rec in target.calls), (
        f"{prop}: the stored launch ({launch.transform_text()}) matches none of the {len(target.calls)} calls that ran")

    # 2. the property's check on the stored Case: the same signature, the same launch
    again = check(get_target(tname), launch.case, "cpu")
    same = [x for x in again if x.signature() == sig]
    assert same, f"{prop}: the stored case does not reproduce {sig!r}: {[str(x) for x in again]}"
    back = R.Launch.from_dict(same[0].launch)
    assert (back.case, back.transform, back.params) == (launch.case, launch.transform, launch.params)

    # 3. the printed form says what ran
    text = R.explain(prop, WRAP, found, sig)
    assert launch.case.describe() in text and launch.transform_text() in text
    if prop in ("launch", "extremes"):
        # one launch judged against the oracle: the rebuilt launch, run as a plain call, fails the same way
        obs = observe(get_target(tname), launch.case, "cpu", inputs=R.launch_inputs(launch, "cpu"))
        plain = {x.signature() for x in check_oracle(obs) + check_writes(obs)}
        assert sig.removeprefix("extremes.") in plain, (sig, plain)
    if prop == "extremes":
        assert launch.transform == "extremes.gate" and launch.params == {"v_head": 0, "a": 120.0}
        # the gate is load-bearing: the Case alone, launched plainly, passes
        assert get_property("launch").check(get_target(tname), launch.case, "cpu") == []


def test_commit_plain_launch_of_the_stored_case_shows_the_wrong_cursors(tmp_path):
    """commit: target.launch(**materialize(stored case)) commits the pad row's cursors wrongly; the
    Case the property was given (restart_hist_on_flush=False, pad rows at P = 0, base = 0), even
    with the flag set, does not show it: printing it was no reproducer."""
    tname = "mutant:commit_pad_exempt"
    found = get_property("commit").check(get_target(tname), WRAP, "cpu")
    f = next(x for x in found if x.prop.startswith("commit.cursors"))
    entry = _stored(tmp_path, "commit", WRAP, found, tname, f.signature())
    eff = R.Launch.from_dict(entry.launch).case
    assert eff.restart_hist_on_flush and eff.rows[2].pad and (eff.rows[2].hist_len, eff.rows[2].cache_base) != (0, 0)
    assert eff == R.effective_case("commit", WRAP) == R.effective_case("commit", eff)
    assert "restart_hist_on_flush=True" in str(f) and f"P={eff.rows[2].hist_len}" in str(f)

    def committed(case):
        kw = materialize(case, "cpu")
        want = commits.standalone_commit(kw["hist_len"].clone(), kw["cache_base"].clone(), case.fmin)
        get_target(tname).launch(case.arm, **kw)
        return (kw["hist_len"].tolist(), kw["cache_base"].tolist()), tuple(w.tolist() for w in want)

    got, want = committed(eff)
    assert got != want and got[0][2] != want[0][2]  # the pad row (row 2) is exempted by the mutant
    got, want = committed(dataclasses.replace(WRAP, restart_hist_on_flush=True))
    assert got == want


# ------------------------------------------------------------------ gdn-fuzz replay --emit-test


ALLOWED_IMPORTS = {"os", "pytest", "torch", "gdn_fuzz.case", "gdn_fuzz.targets", "gdn_fuzz.properties",
                   "gdn_fuzz.engine.corpus"}


def _pytest(files, env_extra, cwd):
    env = dict(os.environ)
    env.pop(R.TARGET_ENV, None)
    env.pop(R.DEVICE_ENV, None)
    env.update(env_extra)
    # the repository first, then what the parent had (where flashinfer comes from PYTHONPATH, as on the GPU image)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *map(str, files)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _emit(entry: Path, out: Path) -> Path:
    from gdn_fuzz import cli

    out.parent.mkdir(parents=True, exist_ok=True)
    assert cli.main(["replay", str(entry), "--emit-test", str(out)]) == 0
    return out


def _production_loads() -> str | None:
    """Why the production target cannot load here (flashinfer-python missing), or None."""
    try:
        get_target("production").module("bf16")
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return f"{type(e).__name__}: {e}"
    return None


def test_emitted_test_fails_when_the_target_refused_the_launch(tmp_path):
    """A reproducer never passes without running: the CPU entry of fold_skipped run against the production kernel
    on CPU tensors (which it refuses) no longer shows its signature, but the test fails, saying the target raised
    instead of running the launch (before, it passed: "fixed")."""
    why = _production_loads()
    if why is not None:
        pytest.skip(f"needs the production target importable (flashinfer-python): {why}")
    f = _emit(REPO / "corpus" / "launch-a53525b0cafb73a0.json", tmp_path / "e" / "test_repro.py")
    assert f"DEVICE = os.environ.get({R.DEVICE_ENV!r}) or 'cpu'" in f.read_text()
    res = _pytest([f], {R.TARGET_ENV: "production"}, f.parent)
    assert res.returncode == 1 and "1 failed" in res.stdout, res.stdout[-3000:]
    assert "raised instead of running the launch" in res.stdout, res.stdout[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the emitted GPU reproducer runs (this test "
                    "checks that it skips where there is no CUDA device)")
def test_emitted_gpu_reproducer_skips_without_cuda(tmp_path):
    """An entry of the production kernel defaults to DEVICE cuda; on a machine without CUDA its reproducer skips with
    the reason (before, it ran on the CPU, the kernel refused the tensors, and it passed)."""
    entry = REPO / "corpus" / "metamorphic-45ca9f360f024946.json"
    assert corpus.read(entry).needs_gpu
    f = _emit(entry, tmp_path / "e" / "test_repro_gpu.py")
    assert f"DEVICE = os.environ.get({R.DEVICE_ENV!r}) or 'cuda'" in f.read_text()
    res = _pytest([f], {}, f.parent)
    assert res.returncode == 0 and "1 skipped" in res.stdout, res.stdout[-3000:]
    assert "no CUDA device" in res.stdout, res.stdout[-3000:]


def test_emitted_test_skips_where_the_target_cannot_load(tmp_path):
    """A target that cannot be loaded here (its kernel file is missing) skips the reproducer with the loader's
    reason, instead of failing as if the bug were present."""
    from gdn_fuzz.targets.loading import KERNEL_MODULE_ENV

    f = _emit(REPO / "corpus" / "launch-a53525b0cafb73a0.json", tmp_path / "e" / "test_repro.py")
    res = _pytest([f], {R.TARGET_ENV: "production", KERNEL_MODULE_ENV: str(tmp_path / "missing.py")}, f.parent)
    assert res.returncode == 0 and "1 skipped" in res.stdout, res.stdout[-3000:]
    assert "cannot be loaded here" in res.stdout and "missing.py" in res.stdout, res.stdout[-3000:]


def test_emitted_test_fails_on_the_bug_and_passes_once_fixed(tmp_path):
    """The stored fold_skipped finding and a commit finding, emitted as pytest files by the CLI: they
    fail on the buggy target and pass with the target switched to the reference."""
    from gdn_fuzz import cli

    out = tmp_path / "emitted"
    out.mkdir()
    launch_entry = REPO / "corpus" / "launch-a53525b0cafb73a0.json"
    assert corpus.read(launch_entry).target == "mutant:fold_skipped"
    found = get_property("commit").check(get_target("mutant:commit_pad_exempt"), WRAP, "cpu")
    sig = next(x.signature() for x in found if x.prop.startswith("commit.cursors"))
    commit_path, _ = corpus.write(corpus.make_entry("commit", WRAP, found, "mutant:commit_pad_exempt", signature=sig),
                                  tmp_path / "c")
    files = []
    for entry, name in ((launch_entry, "test_repro_fold.py"), (commit_path, "test_repro_commit.py")):
        assert cli.main(["replay", str(entry), "--emit-test", str(out / name)]) == 0
        files.append(out / name)
    for p in files:
        tree = ast.parse(p.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert mods <= ALLOWED_IMPORTS, mods
        assert "CASE = Case(" in p.read_text() and "Row(slot=" in p.read_text()
    assert "restart_hist_on_flush=True" in files[1].read_text()
    assert "def test_plain_launch_commits_cursors" in files[1].read_text()

    buggy = _pytest(files, {}, out)
    assert buggy.returncode == 1, buggy.stdout[-3000:]
    assert "3 failed" in buggy.stdout, buggy.stdout[-3000:]
    assert "oracle.fold" in buggy.stdout and "commit.cursors" in buggy.stdout
    fixed = _pytest(files, {R.TARGET_ENV: "reference"}, out)
    assert fixed.returncode == 0 and "3 passed" in fixed.stdout, fixed.stdout[-3000:]


def test_emit_test_wants_one_entry(tmp_path, capsys):
    from gdn_fuzz import cli

    assert cli.main(["replay", str(REPO / "corpus"), "--emit-test", str(tmp_path / "t.py")]) == 2
    assert "exactly one" in capsys.readouterr().out


@settings(max_examples=40, deadline=None)
@given(cases(arms=("bf16", "fp16"), restart=(False, True)))
def test_case_literal_round_trips(case):
    """The emitted Case literal evaluates to the very Case (rows, regime and defaults included)."""
    text = R.case_literal(case)
    assert eval(text, {"Case": Case, "Row": Row, "Regime": Regime}) == case
    assert R.effective_case("commit", R.effective_case("commit", case)) == R.effective_case("commit", case)


# ------------------------------------------------------------------ units, edges


def test_oracle_numbers_say_what_they_are():
    f = get_property("launch").check(get_target("mutant:fold_skipped"), WRAP, "cpu")[0]
    s = str(f)
    assert "relative error per (row, head) vs the float64 oracle" in s
    assert "allowed 0.0117 = 3 x u(max(STATE=bfloat16, RING=bfloat16))" in s
    assert "got " not in s
    g = [x for x in get_property("launch").check(get_target("mutant:no_local_g_restart"), WRAP, "cpu")
         if x.prop == "oracle.g"][0]
    assert "summed |g|" in str(g) and "= 2^-16" in str(g)


def test_bit_differences_say_what_their_number_is():
    found = get_property("metamorphic").check(get_target("mutant:b_token_stride_hardcoded"), WRAP, "cpu")
    s = str(next(x for x in found if x.prop.endswith("y_bits")))
    assert "largest absolute difference over the" in s and "equal bits" in s and "expected)" in s
    assert "ran: metamorphic.strided_ab(pad=64)" in s


def test_a_row_at_flush_min_names_the_neighbours_that_pass():
    """flush_off_by_one folds only when P > flush_min: at P = flush_min the fold is missing, and the
    neighbours say P - 1 (verify) and P + 1 (flush) pass: an off-by-one that reads as one."""
    case = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 13, 3), Row(-1)), seed=0)
    target = get_target("mutant:flush_off_by_one")
    found = get_property("launch").check(target, case, "cpu")
    f = next(x for x in found if x.prop == "oracle.fold")
    text = R.edge_neighbours(target, "launch", case, f)
    assert "P = flush_min = 13" in text
    assert "P=12 (verify): passes" in text and "P=14 (flush): passes" in text
    assert "base=2: fails the same way" in text and "base=4: fails the same way" in text
    assert "edge: row 0" in R.explain("launch", case, found, f.signature(), target=target)
    # not on an edge, or not an oracle finding of the launch property: nothing is run
    assert R.edge_neighbours(target, "launch", dataclasses.replace(case, rows=(Row(0, 7, 3), Row(-1))), f) is None
    assert R.edge_neighbours(target, "routing", case, f) is None


def test_a_running_campaign_checks_a_findings_neighbours_in_its_own_worker(monkeypatch, capsys):
    """`gdn-fuzz run` explains a finding at an edge with its neighbours checked in the campaign's own isolated
    worker (Campaign.check_aside), not in a worker process started for them.  That start ran on the round's thread,
    inside the budget: with two campaign processes on this project's CPU machine (mutant beta_no_sigmoid, 30 s)
    each lost 5.6-8.2 s per such finding, and a worker of run 88 (H100) checked nothing for ~13 s.  The
    explanation still names the neighbours."""
    from gdn_fuzz import cli
    from gdn_fuzz.engine import isolation

    names = []
    real = isolation.Worker.__init__

    def init(self, target_name, device, *a, **k):
        names.append(k.get("name"))
        real(self, target_name, device, *a, **k)

    monkeypatch.setattr(isolation.Worker, "__init__", init)
    rc = cli.main(["run", "--target", "mutant:flush_off_by_one", "--arms", "bf16", "--T", "4", "--property", "launch",
                   "--examples", "200", "--seed", "0", "--no-corpus", "--processes", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "edge: row" in out and "moved by one" in out, out[-3000:]
    assert names and "neighbours" not in names, names
    # a fleet's campaign process (gdn_fuzz.engine.worker), whose explanation goes to the driver with the finding
    from gdn_fuzz.engine.worker import WorkerSpec, run_worker

    names.clear()
    events = []
    spec = WorkerSpec(label="cpu.t0", target="mutant:flush_off_by_one", device="cpu", seed=0, arms=("bf16",),
                      properties=("launch",), Ts=(4,), examples=200)
    assert run_worker(spec, events.append, log=lambda line: None) == 1
    texts = [e["explain"] for e in events if e.get("kind") == "finding"]
    assert any("edge: row" in t and "moved by one" in t for t in texts), texts
    assert names and "neighbours" not in names, names


# ------------------------------------------------------------------ transport and storage


def test_the_launch_survives_the_worker_process():
    from gdn_fuzz.engine.isolation import Worker

    w = Worker("mutant:commit_pad_exempt", "cpu", name="t_reproducers")
    try:
        got = w.check("commit", WRAP)
    finally:
        w.close()
    here = get_property("commit").check(get_target("mutant:commit_pad_exempt"), WRAP, "cpu")
    assert [x.launch for x in got] == [x.launch for x in here] and got[0].launch["case"]["restart_hist_on_flush"]


def test_a_campaign_stores_the_launch_it_ran(tmp_path):
    """A campaign's commit finding is stored with the launch that failed, and that launch's Case,
    materialized and launched plainly, commits the cursors wrongly."""
    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.strategies import CPU_GEOMETRIES

    tname = "mutant:commit_pad_exempt"
    c = Campaign(target=get_target(tname), device="cpu", properties=[get_property("commit")], arms=("bf16",),
                 Ts=(4,), geometries=CPU_GEOMETRIES, buckets=(4,), seed=0, round_examples=30, shrink=False,
                 stop_on_finding=True, corpus_dir=tmp_path / "c")
    c.run(examples=60)
    assert c.findings, "commit_pad_exempt survived 60 examples"
    (f,) = c.findings.values()
    text = R.explain(f.prop, f.case, f.findings, f.signature)
    entry = corpus.read(f.entry_path)
    eff = R.entry_launch(entry).case
    assert eff.describe() in text and eff.restart_hist_on_flush and not f.case.restart_hist_on_flush
    kw = materialize(eff, "cpu")
    want = commits.standalone_commit(kw["hist_len"].clone(), kw["cache_base"].clone(), eff.fmin)
    get_target(tname).launch(eff.arm, **kw)
    assert (kw["hist_len"].tolist(), kw["cache_base"].tolist()) != tuple(w.tolist() for w in want)


def test_entries_without_a_launch_still_read_and_bad_launches_are_refused(tmp_path):
    old = REPO / "corpus" / "launch-a53525b0cafb73a0.json"
    e = corpus.read(old)
    assert e.launch is None and "launch" not in e.to_dict()
    assert R.entry_launch(e).case == e.case and R.entry_launch(e).plain
    d = json.loads(old.read_text())
    for bad, words in (({"case": d["case"], "transform": "rm -rf"}, "transform"),
                       ({"case": d["case"], "extra": 1}, "unknown field"),
                       ({"case": dict(d["case"], T=6)}, "case.T")):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(dict(d, launch=bad)))
        with pytest.raises(corpus.CorpusError, match=words):
            corpus.read(p)
    assert isinstance(Finding("x", "M1", "m").launch, type(None))
