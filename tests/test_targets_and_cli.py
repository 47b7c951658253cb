"""The loader and the command line, end to end on the CPU.

Loader: a module that does not fit the contract is refused with a message that says what is
wrong; the dtype env vars are set only while a module imports; GDN_FUZZ_KERNEL_MODULE picks
the production file; the SM100 variant reports why it is unavailable.
CLI: `run` exits 0 on the reference and 1 on a planted bug, `replay` reproduces a corpus
entry, `report` writes its files and counts each regime and bucket value per property (listing the
values no example reached), `doctor` names every target.
Precision study: its strategy draws a flush row in every Case, and the search records (Hypothesis
event) what an example could not inspect.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from gdn_fuzz import cli
from gdn_fuzz.arms import ENV_VARS, get_arm
from gdn_fuzz.strategies import regimes
from gdn_fuzz.studies.precision import precision_cases
from gdn_fuzz.targets import (REFERENCE_PATH, TargetMismatch, TargetUnavailable, get_target, load_module,
                              resolve_production_path)


def _module(tmp_path, name, text):
    p = tmp_path / f"{name}.py"
    p.write_text(text)
    return p


def test_module_with_a_16_slot_ring_is_refused(tmp_path):
    """D3: RING_SLOTS must be 32 (the old 16-slot ring format is another contract)."""
    src = REFERENCE_PATH.read_text().replace("RING_SLOTS = 32", "RING_SLOTS = 16")
    with pytest.raises(TargetMismatch, match=r"RING_SLOTS=16, expected 32"):
        load_module(_module(tmp_path, "ring16", src), "bf16")


def test_module_without_the_entry_point_is_refused(tmp_path):
    p = _module(tmp_path, "empty", "RING_SLOTS = 32\nW_RING = 16\n")
    with pytest.raises(TargetMismatch, match="defines no callable gated_delta_rule_mtp_ucache_flush"):
        load_module(p, "bf16")


def test_module_that_ignores_the_arm_env_is_refused(tmp_path):
    """D1: a module that does not read GDN_UCACHE_*_DTYPE cannot serve the fp16 arm."""
    src = REFERENCE_PATH.read_text().replace('os.environ.get("GDN_UCACHE_IO_DTYPE", "bf16")', '"bf16"')
    with pytest.raises(TargetMismatch, match=r"IO_TORCH=torch.bfloat16 but arm fp16 needs torch.float16"):
        load_module(_module(tmp_path, "noenv", src), "fp16")


def test_arm_env_is_scoped_to_the_import(monkeypatch):
    """D1: loading every arm leaves the process environment as it was."""
    monkeypatch.setenv("GDN_UCACHE_IO_DTYPE", "sentinel")
    monkeypatch.delenv("GDN_UCACHE_STATE_DTYPE", raising=False)
    t = get_target("reference")
    for arm in ("bf16", "fp16", "bf16-state16-ring16"):
        m = t.module(arm)
        assert (m.IO_TORCH, m.ST_TORCH, m.RING_TORCH) == (get_arm(arm).io, get_arm(arm).state, get_arm(arm).ring)
    assert os.environ["GDN_UCACHE_IO_DTYPE"] == "sentinel" and "GDN_UCACHE_STATE_DTYPE" not in os.environ
    assert set(ENV_VARS) == {"GDN_UCACHE_IO_DTYPE", "GDN_UCACHE_STATE_DTYPE", "GDN_UCACHE_RING_DTYPE"}


def test_kernel_module_env_var_picks_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("GDN_FUZZ_KERNEL_MODULE", str(REFERENCE_PATH))
    assert resolve_production_path() == REFERENCE_PATH.resolve()
    monkeypatch.setenv("GDN_FUZZ_KERNEL_MODULE", str(tmp_path / "missing.py"))
    with pytest.raises(TargetUnavailable, match="is not a file"):
        resolve_production_path()


def test_sm100_variant_reports_why_it_is_unavailable():
    """The SM100 module ships with flashinfer-python 0.7.4 (absent with 0.7.2.post1 installed) and needs an
    SM100-class GPU: the reason says both."""
    try:
        t = get_target("sm100")
    except TargetUnavailable as e:
        assert "0.7.4" in str(e) and "SM100" in str(e)
    else:  # installed: it still cannot launch without an SM100 GPU
        assert t.unavailable_reason("cpu")


def test_unknown_target_names_the_choices():
    with pytest.raises(ValueError, match="neither 'reference', 'production', 'production@VERSION', 'sm100', 'materialize', "
                                         "'materialize-reference', 'mutant:NAME'"):
        get_target("nonsense")


def test_run_exit_codes_and_records(tmp_path):
    """`run`: 0 on the reference, 1 on a planted bug (with one corpus entry); --record feeds `report`."""
    rec, js = tmp_path / "r.jsonl", tmp_path / "r.json"
    assert cli.main(["run", "--examples", "30", "--arms", "bf16", "--no-corpus", "--no-isolate",
                     "--property", "launch", "--record", str(rec), "--json", str(js)]) == 0
    assert len(rec.read_text().splitlines()) >= 30 and json.loads(js.read_text())["findings"] == []
    assert cli.main(["report", str(rec), "--campaign", str(js), "--out", str(tmp_path / "rep")]) == 0
    for f in ("report.md", "report.html", "error_by_arm.png", "error_by_P.png", "error_over_campaign.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 0
    corpus = tmp_path / "corpus"
    assert cli.main(["run", "--target", "mutant:fold_skipped", "--examples", "60", "--arms", "bf16",
                     "--property", "launch", "--no-isolate", "--corpus", str(corpus)]) == 1
    (entry,) = corpus.glob("*.json")
    assert cli.main(["replay", str(entry)]) == 0  # an open bug that still fails is the expected outcome


def _table(md: str, title: str) -> dict:
    """The rows of one report table: first cell -> the other cells."""
    lines = md.split(f"### {title}\n", 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {r[0]: dict(zip(head[1:], r[1:])) for r in ([c.strip() for c in ln.strip("|").split("|")]
                                                        for ln in lines[2:])}


def test_report_counts_every_regime_and_bucket_value_per_property(tmp_path):
    """`report` on a real campaign record (two properties, buckets 4 and 8 of the reference's 4 8 16 64):
    one table per Regime field and one per bucket, a column per property; every menu value is a row,
    its counts are the record's, the menu values no example reached read 0 and are listed as not
    explored (buckets 16 and 64 of a larger menu; in a record cut to 3 examples, at least 4 of the 7
    qk_scales); the pool-scale table counts strategies.pool_scale_of per example."""
    import dataclasses
    from collections import Counter

    from gdn_fuzz.case import Regime
    from gdn_fuzz.engine.report import bucket_menu, menu_tables, record_pool_scale, regime_menus
    from gdn_fuzz.strategies import POOL_SCALES

    rec, js = tmp_path / "r.jsonl", tmp_path / "r.json"
    # the CPU reference, pinned: on a GPU machine the default target is the released kernel, whose
    # params_inplace finding (N5) is new with --no-corpus and makes the run exit 1 (H200, 2026-12-02)
    assert cli.main(["run", "--target", "reference", "--device", "cpu", "--examples", "8", "--arms", "bf16",
                     "--T", "4", "--no-corpus", "--no-isolate",
                     "--property", "launch", "--property", "params_inplace", "--buckets", "4", "8",
                     "--record", str(rec), "--json", str(js)]) == 0
    recs = [json.loads(x) for x in rec.read_text().splitlines()]
    assert {r["prop"] for r in recs} == {"launch", "params_inplace"}
    menus = regime_menus()
    assert set(menus) == {f.name for f in dataclasses.fields(Regime)}, "a Regime field without a report table"
    camp = json.loads(js.read_text())
    assert bucket_menu(camp) == ((4, 8), "the campaign's buckets")  # the run's --buckets, recorded
    assert camp["pool_scales"] == list(POOL_SCALES)  # the CPU default (strategies.pool_scales_for)
    assert cli.main(["report", str(rec), "--campaign", str(js), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()

    def value(r, field):
        return r["B"] if field == "bucket" else record_pool_scale(r) if field == "pool_scale" else r["regime"][field]

    for field in [*menus, "bucket", "pool_scale"]:
        title = field if field in ("bucket", "pool_scale") else f"regime.{field}"
        rows = _table(md, title)
        menu = (4, 8) if field == "bucket" else ("small", *POOL_SCALES) if field == "pool_scale" else menus[field]
        labels = [f"{v:g}" if isinstance(v, float) else str(v) for v in menu]
        assert list(rows) == labels, (title, list(rows))  # every menu value, in menu order, nothing else
        for v, label in zip(menu, labels):
            got = {p: int(rows[label][p]) for p in ("launch", "params_inplace")}
            want = Counter(r["prop"] for r in recs
                           if value(r, field) == v and isinstance(v, bool) == isinstance(value(r, field), bool))
            assert got == {p: want.get(p, 0) for p in got}, (title, label, got, want)
            assert rows[label]["all"] == (str(sum(got.values())) if sum(got.values()) else "**0**")
    assert (tmp_path / "rep" / "report.html").read_text().count("<table") >= len(menus) + 3
    # a larger bucket menu than the run reached: its missing buckets are listed as not explored
    md_more = "\n".join(menu_tables(recs, dict(camp, buckets=[4, 8, 16, 64])))
    missed = md_more.split("- **not explored** (no example): ", 1)[1].splitlines()[0]
    assert "bucket = 16, 64" in missed, missed

    md3 = "\n".join(menu_tables(recs[:3], json.loads(js.read_text())))  # the record cut to 3 examples
    seen = {r["regime"]["qk_scale"] for r in recs[:3]}
    zero = [f"{v:g}" for v in menus["qk_scale"] if v not in seen]
    assert len(zero) >= 4 and all(_table(md3, "regime.qk_scale")[z]["all"] == "**0**" for z in zero)
    missed = md3.split("- **not explored** (no example): ", 1)[1].splitlines()[0]
    assert "qk_scale = " + ", ".join(zero) in missed, missed


@settings(max_examples=60, deadline=None)
@given(regimes())
def test_report_regime_menus_hold_every_drawn_value(reg):
    """The report's regime menus (engine.report.regime_menus) hold every value strategies.regimes draws,
    so a value the strategy adds cannot be missing from the coverage tables."""
    from gdn_fuzz.engine.report import regime_menus

    menus = regime_menus()
    for name, menu in menus.items():
        v = getattr(reg, name)
        assert any(v == m and isinstance(v, bool) == isinstance(m, bool) for m in menu), (name, v, menu)


def test_doctor_names_every_target(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("target reference", "target production", "target sm100"):
        assert name in out
    import importlib.metadata as md

    try:
        assert f"--ray: ray {md.version('ray')} installed" in out
    except md.PackageNotFoundError:
        assert "--ray: ray not installed (pip install 'gdn-fuzz[cluster]')" in out


def test_doctor_lists_the_kernels_around_the_fused_one(monkeypatch):
    """Issue 18: doctor names the verify-only sibling and SGLang's Triton kernels, where they run and which
    gdn_fuzz drives; the sibling's installed/not-installed line follows what importlib finds."""
    import importlib.util

    from gdn_fuzz.engine import doctor

    out = "\n".join(doctor._siblings("cpu"))
    assert "gated_delta_rule_mtp_ucache (verify-only sibling" in out and "driven by gdn_fuzz: yes" in out
    assert "commit_gdn_replayssm_spec: driven" in out
    assert "commit_gdn_replayssm_circular, commit_gdn_replayssm_spec(fold_every_commit=True) and " \
           "commit_gdn_replayssm_fold_all_layers (gdn_replayssm_spec_fold.py): driven" in out
    assert "commit_gdn_replayssm_fold_after_verify: not driven" in out
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == doctor.SIBLING else real(n, *a))
    assert "not installed" in doctor._siblings("cpu")[0]


def test_run_warm_up_is_outside_the_budget(tmp_path):
    """warm_up() launches exactly one case per (arm, T, geometry, bucket) before the clock, counts
    none of them as examples, and `gdn-fuzz run --warm-up` records its time and compiles apart."""
    import json

    from gdn_fuzz.engine.campaign import Campaign
    from gdn_fuzz.cli import main
    from gdn_fuzz.properties import get_property

    shapes = []

    class Counting(Campaign):
        def _check(self, prop, case):
            shapes.append((case.arm, case.T, case.H, case.HV, case.B))
            return super()._check(prop, case)

    geoms, arms, Ts, buckets = ((1, 1), (1, 2)), ("bf16", "fp16"), (4, 8), (4, 8)
    c = Counting(target=get_target("reference"), device="cpu", properties=[get_property("launch")], arms=arms, Ts=Ts,
                 geometries=geoms, buckets=buckets, seed=0, isolate=False)
    c.warm_up()
    assert sorted(shapes) == sorted((a, T, H, HV, b) for a in arms for T in Ts for H, HV in geoms for b in buckets)
    assert c.stats.examples == 0 and c.stats.launches == 0 and c.stats.warmup_s > 0
    assert c.stats.elapsed < c.stats.warmup_s  # the budget's clock starts after the warm-up

    out = tmp_path / "c.json"
    assert main(["run", "--target", "reference", "--device", "cpu", "--arms", "bf16", "--T", "4", "--examples", "3",
                 "--warm-up", "--no-corpus", "--no-isolate", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["warmup_s"] > 0 and rec["warmup_compiles"] == 0  # the reference target never compiles


# ------------------------------------------------------------------ the precision study (gdn-fuzz precision)


@given(case=precision_cases())
@settings(max_examples=200, database=None)
def test_precision_strategy_draws_a_flush_row(case):
    """The precision search's strategy: every Case has a flush row, so the fold's error (and, on the
    fp16-STATE arms, its rounding pattern) is measured in every example; drawn from cases() instead,
    68 of 200 Cases had none.  No poison (the search measures errors of finite values)."""
    assert any(not r.pad and r.hist_len >= case.fmin for r in case.rows), case
    assert not case.regime.poison


def test_precision_search_records_what_it_cannot_inspect(monkeypatch):
    """An example that inspects no rounding point records a Hypothesis event saying why: on the
    bf16 arm (no fp16 RING or STATE) every example does; on bf16-state16 (fp16 STATE, a flush row in
    every Case) none does."""
    from gdn_fuzz.properties import base
    from gdn_fuzz.studies.precision import search

    events = []
    monkeypatch.setattr(base, "event", events.append)
    res = search([get_target("reference")], "cpu", ("bf16",), (4,), ((1, 2),), (4,), examples=3)
    assert events == ["precision.rounding: nothing exercised: the arm has no fp16 RING or STATE under bf16 IO"] * 3
    assert res["reference"]["bf16"][4]["fold"]["n"] == 3
    events.clear()
    res = search([get_target("reference")], "cpu", ("bf16-state16",), (4,), ((1, 2),), (4,), examples=3)
    assert events == [] and res["reference"]["bf16-state16"][4]["rounding"]["fold"][1] > 0


def test_run_draws_device_is_stored_with_the_case(tmp_path):
    """`gdn-fuzz run --draws device` on the CPU: the CPU generator (draws="cpu"); on a CUDA device it
    would be draws="cuda" (test_cuda_drawn_cases_refuse_another_device_and_keep_their_draws).  The
    corpus entry keeps the case as it was drawn, so a replay draws the same way."""
    from gdn_fuzz.cli import main
    from gdn_fuzz.engine import corpus

    cdir = tmp_path / "corpus"
    rc = main(["run", "--target", "mutant:fold_skipped", "--device", "cpu", "--arms", "bf16", "--T", "4",
               "--examples", "40", "--property", "launch", "--no-isolate", "--corpus", str(cdir), "--draws", "device"])
    assert rc == 1
    entries = [corpus.read(p) for p in corpus.entries(cdir)]
    assert entries and all(e.case.draws == "cpu" for e in entries)
    assert all(e.reproduced_by(corpus.replay(e, device="cpu")) for e in entries)


def test_cuda_drawn_cases_refuse_another_device_and_keep_their_draws():
    """Case.draws="cuda" (issue 17: a GPU campaign's default): the bulk tensors come from torch's CUDA
    generator, so on the CPU the same case would be another launch; materialize says so instead of
    silently drawing other values, and the stored case keeps how it was drawn."""
    from gdn_fuzz.case import Case, Row, draws_for, materialize

    case = Case(arm="bf16", T=4, H=1, HV=2, pool=2, rows=(Row(0, 3, 5),), seed=7, draws="cuda")
    with pytest.raises(ValueError, match=r"case.draws='cuda'.*CUDA generator.*--device cuda"):
        materialize(case, "cpu")
    again = Case.from_dict(json.loads(case.to_json()))
    assert again == case and again.draws == "cuda"
    assert "draws" not in Case(**{**case.__dict__, "draws": "cpu"}).to_dict()
    assert (draws_for("cpu"), draws_for("cuda"), draws_for("cuda:1")) == ("cpu", "graph", "graph")
    from gdn_fuzz.engine.worker import resolve_draws

    assert [resolve_draws(d, dev) for d in ("auto", "device", "cpu") for dev in ("cpu", "cuda")] == \
        ["cpu", "graph", "cpu", "graph", "cpu", "cpu"]
    graph = dataclasses.replace(case, draws="graph")  # the GPU campaign's default since issue 32: the same refusal
    with pytest.raises(ValueError, match=r"case.draws='graph'.*CUDA generator.*--device cuda"):
        materialize(graph, "cpu")
    assert Case.from_dict(json.loads(graph.to_json())).draws == "graph"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: draws='cuda' cases materialize "
                    "on CUDA only")
def test_cuda_draws_replay_bit_identically_and_draw_the_tokens_on_the_device():
    """draws="cuda": the same Case materializes to the same bits twice on the same device (a corpus entry
    replays), and q, k, v come from the CUDA generator (other values than draws="cpu" gives), while the
    gates (A_log, dt_bias, a, b) are the first draws of the CPU generator seeded with the case's seed."""
    from gdn_fuzz.case import Case, Row, _beta_logits, decay_params, materialize

    case = Case(arm="bf16", T=4, H=2, HV=4, pool=4, rows=(Row(1, 7, 30), Row(3, 0, 0)), seed=5, draws="cuda")
    one, two = materialize(case, "cuda"), materialize(case, "cuda")
    cpu = materialize(Case(**{**case.__dict__, "draws": "cpu"}), "cuda")
    from gdn_fuzz.observation import same_bits

    for name, x in one.items():
        if isinstance(x, torch.Tensor):
            assert x.device.type == "cuda" and bool(same_bits(x, two[name]).all()), name
    for name in ("q", "k", "v"):
        assert not torch.equal(one[name], cpu[name]), name
    gen = torch.Generator().manual_seed(case.seed)
    A_log, dt_bias, a = decay_params(case.regime, gen, case.B, case.T, case.HV)
    b = _beta_logits(case.regime, gen, (case.B, case.T, case.HV))
    for name, x in dict(A_log=A_log, dt_bias=dt_bias, a=a, b=b).items():
        assert torch.equal(one[name].cpu(), x.to(one[name].dtype)), name


def test_doctor_lists_the_materializer_targets():
    """Issue 31: doctor names the materializer's targets, the arms each imports (its own module state per arm,
    PMD3), where each launches, and what drives it."""
    from gdn_fuzz.engine import doctor
    from gdn_fuzz.targets import releases

    import torch

    out = "\n".join(doctor._materializer(releases.installed_version()))
    here = "cuda" if torch.cuda.is_available() else "cpu"  # doctor says where it launches on this machine
    assert "target materialize-reference:" in out and f"launches on {here}: yes" in out
    line = next(ln for ln in out.splitlines() if "target materialize-reference:" in ln)
    assert "bf16, bf16-state16, bf16-ring16, bf16-state16-ring16, fp16" in line
    assert "tests/test_prefix_serving.py" in out and "gdn-fuzz unguarded --target materialize" in out
    if releases.installed_file("gdn_prefix_materialize.py"):
        assert "its arm with this environment:" in out and "target materialize:" in out


def test_version_names_the_package_and_what_it_drives(capsys):
    """`gdn-fuzz --version` prints this package's version and torch's, hypothesis', flashinfer-python's and
    cutlass-dsl's (from the installed metadata), and exits 0."""
    from importlib import metadata

    from gdn_fuzz import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"gdn-fuzz {metadata.version('gdn-fuzz')} (torch {metadata.version('torch')}"), out
    for dist in ("hypothesis", "flashinfer-python", "nvidia-cutlass-dsl"):
        assert f"{dist} " in out, out


@pytest.mark.parametrize("kind", ["missing", "folder", "truncated", "campaign_as_records", "not_json_campaign",
                                  "foreign_campaign", "materializer"])
def test_report_bad_input_is_one_line_exit_2(tmp_path, capsys, kind):
    """`gdn-fuzz report` on an input it cannot use: one line naming the file (and line) and what to give instead,
    exit 2, nothing written and no traceback."""
    from gdn_fuzz import cli

    good = tmp_path / "rec.jsonl"
    good.write_text(json.dumps(dict(arm="bf16", T=4, flush_min=13, prop="launch", regime={}, rows=[])) + "\n")
    args, want = {
        "missing": ([str(tmp_path / "none.jsonl")], "does not exist"),
        "folder": ([str(tmp_path)], "is a folder"),
        "truncated": ([str(good)], "rec.jsonl:2: not a JSON line"),
        "campaign_as_records": ([str(tmp_path / "camp.json")], "give it as --campaign"),
        "not_json_campaign": ([str(good), "--campaign", str(tmp_path / "cut.json")], "is not JSON"),
        "foreign_campaign": ([str(good), "--campaign", str(tmp_path / "other.json")], "has no findings list"),
        "materializer": ([str(tmp_path / "pm.jsonl")], "prefix-materializer campaign"),
    }[kind]
    if kind == "truncated":
        good.write_text(good.read_text() + '{"arm": "bf1')
    (tmp_path / "camp.json").write_text(json.dumps(dict(findings=[], target="reference")))
    (tmp_path / "cut.json").write_text('{"findings": [')
    (tmp_path / "other.json").write_text(json.dumps(dict(name="something else")))
    (tmp_path / "pm.jsonl").write_text(json.dumps(dict(kind="materialize", arm="bf16", prop="pm_launch")) + "\n")
    out = tmp_path / "rep"
    assert cli.main(["report", *args, "--out", str(out)]) == 2
    text = capsys.readouterr().out
    assert text.startswith("gdn-fuzz report: ") and want in text, text
    assert len(text.strip().splitlines()) == 1, text
    assert "Traceback" not in text and not out.exists()


def test_run_not_on_a_terminal_prints_progress_lines(capsys, monkeypatch):
    """Piped (not a terminal: rich draws no live bar), `gdn-fuzz run` prints a plain progress line every
    PROGRESS_EVERY_S (10 s; 0.2 s here), from a timer, with the examples so far.  A 1 s budget outlasts the
    interval whatever the machine's speed (a 4-example run could end before the first line: CI saw it once)."""
    from gdn_fuzz import cli
    from gdn_fuzz.cli import run as run_cli

    monkeypatch.setattr(run_cli, "PROGRESS_EVERY_S", 0.2)
    assert cli.main(["run", "--target", "reference", "--arms", "bf16", "--T", "4", "--property", "launch",
                     "--seconds", "1", "--no-corpus"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("progress: ")]
    assert lines and "/1s" in lines[0] and "examples " in lines[0], lines


def test_run_summary_fits_80_columns(capsys, monkeypatch):
    """On an 80-column console the summary is one row per field and the findings table drops two columns: no
    line is wider than 80 and no value is cut to an ellipsis (before, 12 columns squeezed the target's name to
    'mutant:fol…')."""
    from gdn_fuzz import cli
    from gdn_fuzz.cli import common

    monkeypatch.setattr(common.console, "width", 80)
    assert cli.main(["run", "--target", "mutant:fold_skipped", "--arms", "bf16", "--T", "4", "--property", "launch",
                     "--examples", "6", "--no-corpus"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 80, max(lines, key=len)
    summary = out[out.index("gdn-fuzz summary"):]
    assert "…" not in summary, summary
    cells = "".join(ch for ch in summary if ch not in "│┃ \n")  # folded cells read back in order
    assert "targetmutant:fold_skipped" in cells, summary
    assert "findings by signature" in out and "oracle.fold" in out


def test_top_level_help_imports_no_sub_command_module():
    """Issue 33: `gdn-fuzz --help`, `--version`, no command and an unknown command are answered from
    gdn_fuzz.cli.commands alone: no torch, no sub-command module (it took 3.6 s on a 2-core CPU machine when every
    sub-command module was imported; docs/robustness.md has the timing)."""
    code = ("import sys\nfrom gdn_fuzz.cli import main\n"
            "for argv in (['--help'], ['--version'], [], ['bogus']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        print('exit', e.code)\n"
            "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('gdn_fuzz.cli.') and "
            "m != 'gdn_fuzz.cli.commands')\nprint('heavy', heavy)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("exit")] == ["exit 0", "exit 0", "exit 2", "exit 2"]
    assert "heavy []" in p.stdout, p.stdout
    assert "fuzz a target within a time or example budget" in p.stdout and "invalid choice: 'bogus'" in p.stderr


def test_the_command_table_is_the_whole_parser():
    """gdn_fuzz.cli.commands.TABLE names every sub-command of the full parser, in its order, with the help the full
    parser shows, and the module that builds it: the light top level cannot drift from the real one."""
    from gdn_fuzz.cli import commands

    ap = cli.build_parser()
    action = next(a for a in ap._actions if a.dest == "cmd")
    assert list(action.choices) == list(commands.TABLE)
    assert {c.dest: c.help for c in action._choices_actions} == {n: h for n, (_, h) in commands.TABLE.items()}
    for name, (mod, _) in commands.TABLE.items():
        src = (Path(cli.__file__).parent / f"{mod}.py").read_text()
        assert f'add_parser("{name}", help=help_of("{name}"))' in src, (name, mod)
    assert cli.light_parser().format_help() == ap.format_help()
