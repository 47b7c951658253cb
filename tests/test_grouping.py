"""Findings grouped by bug (gdn_fuzz.findings.group_findings, issue 33): which signatures are one group, which
symptom heads it, and what a campaign's summary, JSON record and last line say."""

from __future__ import annotations

import json
import subprocess
import sys

from gdn_fuzz.findings import check_clause, group_findings, groups_line, symptom

ONE_ROW = {"arm": "bf16", "T": 4, "rows": [{"slot": 0, "hist_len": 13, "cache_base": 0}], "seed": 1}
TWO_ROWS = {"arm": "bf16", "T": 4, "rows": [{"slot": 0, "hist_len": 13, "cache_base": 0},
                                            {"slot": 1, "hist_len": 2, "cache_base": 5}], "seed": 1}


def rec(sig, case, shown=None):
    return dict(signature=sig, case=case, launch_signatures=sorted(set(shown or []) | {sig}))


def test_signatures_shown_by_one_shrunk_launch_are_one_group_headed_by_the_most_specific():
    y, u, fold = ("oracle.y [M4] out of tolerance (flush rows)", "oracle.u [M5] out of tolerance (flush rows)",
                  "oracle.fold [M7] out of tolerance (flush rows)")
    recs = [rec(y, dict(TWO_ROWS, seed=2), [y, u, fold]), rec(u, dict(TWO_ROWS, seed=3), [u, fold]),
            rec(fold, ONE_ROW, [fold])]
    (g,) = group_findings(recs)
    assert g["symptoms"] == [fold, u, y]  # fold's launch showed nothing else; then u (one other); then y (two)
    assert g["headline"] == fold and [r["signature"] for r in g["records"]] == g["symptoms"]


def test_unrelated_signatures_stay_apart_and_one_check_on_other_rows_or_failing_otherwise_links():
    a = "oracle.y [M4] out of tolerance (flush rows)"
    b = "oracle.y [M4] out of tolerance (verify rows)"  # the same check on other rows
    c = "oracle.y [M4] non-finite (flush rows)"  # the same check failing otherwise
    d = "oracle.u [M5] out of tolerance (flush rows)"  # another check, no shared launch or case
    e = "metamorphic.strided_pool.launch [H*] raised RuntimeError: x"
    f = "metamorphic.strided_ab.launch [H*] raised RuntimeError: y"  # another exception: apart
    groups = group_findings([rec(x, dict(ONE_ROW, seed=i)) for i, x in enumerate((a, b, c, d, e, f))])
    assert sorted(sorted(g["symptoms"]) for g in groups) == sorted([sorted([a, b, c]), [d], [e], [f]])
    assert check_clause("extremes.oracle.u [M5] non-finite (flush rows)") == "oracle.u [M5]"


def test_one_exception_of_a_legal_launch_under_several_properties_is_one_bug():
    msg = "raised IndexError: index # is out of bounds for dimension # with size #"
    sigs = [f"launch [H*] {msg}", f"determinism.launch [H*] {msg}", f"metamorphic.rotation.launch [H*] {msg}"]
    other = "launch [H*] raised RuntimeError: The stride_order is not consistent with the layout"
    groups = group_findings([rec(x, dict(ONE_ROW, seed=i)) for i, x in enumerate([*sigs, other])])
    assert sorted(sorted(g["symptoms"]) for g in groups) == sorted([sorted(sigs), [other]])


def test_one_shrunk_case_and_one_check_under_two_properties_link():
    a, b = "oracle.g [M6] out of tolerance (verify rows)", "writes.outside.g_cache [M8] bits differ"
    w = "extremes.oracle.g [M6] out of tolerance (verify rows)"
    groups = group_findings([rec(a, ONE_ROW), rec(b, dict(ONE_ROW)), rec(w, TWO_ROWS)])
    assert len(groups) == 1 and len(groups[0]["symptoms"]) == 3
    assert symptom(w) == a and symptom("params_inplace.oracle [N5] out of tolerance") == "oracle [N5] out of tolerance"
    assert symptom("metamorphic.strided_pool.launch [H*] raised RuntimeError: x").startswith("metamorphic.")


def test_a_check_both_shrunk_launches_showed_links_them_even_when_neither_filed_it():
    """anchor_off_by_one's two findings (the CPU grouping study): fold on a flush row and g on a verify row, whose
    shrunk launches both broke oracle.u [M5], on their own rows.  oracle.u was not filed (each launch's first
    signature was), yet it is one check of one clause on both launches: one group.  The rule before (shown=False)
    read two; a launch that showed nothing of the other's stays apart under both."""
    fold, g = "oracle.fold [M7] non-finite (flush rows)", "oracle.g [M6] non-finite (verify rows)"
    u_flush, u_verify = "oracle.u [M5] non-finite (flush rows)", "oracle.u [M5] non-finite (verify rows)"
    other = "oracle.k [M5] out of tolerance (verify rows)"
    recs = [rec(fold, ONE_ROW, [fold, u_flush]), rec(g, dict(ONE_ROW, seed=2), [g, u_verify]),
            rec(other, dict(ONE_ROW, seed=3), [other])]
    assert sorted(sorted(x["symptoms"]) for x in group_findings(recs)) == sorted([[other], sorted([fold, g])])
    assert len(group_findings(recs, shown=False)) == 3
    assert all(len(x["symptoms"]) == 1 for x in group_findings(recs, shown=False))


def test_the_last_line_counts_bugs_and_symptoms():
    y, u = "oracle.y [M4] out of tolerance (flush rows)", "oracle.u [M5] out of tolerance (flush rows)"
    g = "guard.H11 [H11] wrong value"
    line = groups_line(group_findings([rec(y, TWO_ROWS, [y, u]), rec(u, ONE_ROW), rec(g, ONE_ROW | {"seed": 9})]))
    assert line.startswith("2 bugs, 3 symptoms")
    assert f"{u} (+1: {y})" in line and line.endswith(g)
    assert groups_line([]) == ""


def test_a_campaign_on_a_one_edit_mutant_prints_and_records_its_groups(tmp_path):
    """fold_skipped (M7: flush rows never write the fold) on the CPU: its signatures, one group per linked set, in
    the JSON record (groups) and the run's last line."""
    out = tmp_path / "c.json"
    p = subprocess.run([sys.executable, "-m", "gdn_fuzz.cli", "run", "--target", "mutant:fold_skipped", "--examples",
                        "60", "--property", "launch", "--arms", "bf16", "--no-corpus", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    rec_ = json.loads(out.read_text())
    sigs = {f["signature"] for f in rec_["findings"]}
    assert sigs and {s for g in rec_["groups"] for s in g["symptoms"]} == sigs
    assert all(f["launch_signatures"] and f["signature"] in f["launch_signatures"] for f in rec_["findings"])
    n = len(rec_["groups"])
    last = [ln for ln in p.stdout.splitlines() if ln.startswith("new: ")]  # the line, wrapped to the width
    assert last and last[-1].startswith(f"new: {n} bug{'s' if n != 1 else ''}, {len(sigs)} symptom"), p.stdout[-2000:]


def test_the_pair_study_picks_unrelated_one_group_mutants_and_counts_a_merge():
    """studies.grouping --pairs: a pair is two mutants that read as one group alone and share no check and clause;
    a pair's group is merged when it holds a symptom only one mutant showed and one only the other showed."""
    from gdn_fuzz.studies.grouping import judge, pick_pairs

    fold, g, u = ("oracle.fold [M7] out of tolerance (flush rows)", "oracle.g [M6] out of tolerance (flush rows)",
                  "oracle.u [M5] out of tolerance (verify rows)")
    one = lambda name, sig: dict(name=name, signatures=[sig], findings=[rec(sig, ONE_ROW)])  # noqa: E731
    single = [one("a", fold), one("b", g), one("c", fold), one("d", u)]
    assert [(x["name"], y["name"]) for x, y in pick_pairs(single, 5)] == [("a", "b"), ("c", "d")]
    a, b = single[0], single[1]
    apart = [rec(fold, ONE_ROW), rec(g, dict(ONE_ROW, seed=2))]
    joined = [rec(fold, ONE_ROW, [fold, g]), rec(g, dict(ONE_ROW, seed=2))]
    assert judge(apart, a, b, True) | {"headlines": None} == dict(groups=2, merged=0, headlines=None)
    assert judge(joined, a, b, True) | {"headlines": None} == dict(groups=1, merged=1, headlines=None)


def test_a_relations_bit_check_of_a_buffer_is_the_oracle_check_of_its_output():
    """flush_off_by_one (the CPU study): routing.g_cache_bits [M6] (the g ring differs from the twin launch's) and
    oracle.g [M6] (the appended g records against the oracle) say one thing, the appended g wrong: one group.
    determinism's bit checks (a launch against itself: a race) and another clause stay apart; buffers=False reads
    each check as written (the rule before)."""
    g, bits = "oracle.g [M6] out of tolerance (flush rows)", "routing.g_cache_bits [M6] bits differ"
    race, perm = "determinism.g_cache_bits [M6] bits differ", "metamorphic.batch_perm.g_cache_bits [R1] bits differ"
    recs = [rec(x, dict(ONE_ROW, seed=i)) for i, x in enumerate((g, bits, race, perm))]
    assert sorted(sorted(x["symptoms"]) for x in group_findings(recs)) == sorted([sorted([g, bits]), [race], [perm]])
    assert len(group_findings(recs, buffers=False)) == 4
    assert check_clause("routing.initial_state_source_bits [M7] bits differ") == "oracle.fold [M7]"
    assert check_clause(bits, buffers=False) == "routing.g_cache_bits [M6]"
