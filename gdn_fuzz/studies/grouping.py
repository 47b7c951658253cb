"""Findings grouped by bug, over the mutant catalogue (issue 33): how many single-edit mutants read as several
findings, and as how many groups (gdn_fuzz.findings.group_findings).

Each scored mutant of --base gets one campaign, `gdn-fuzz run --target mutant:NAME --seconds S --no-corpus --json`,
in its own process (crash mutants kill theirs), with every property.  A mutant is one edit, hence one bug: its
campaign's new signatures are what a reader saw before grouping, its groups what they see now.

    python -m gdn_fuzz.studies.grouping --seconds 15 --json docs/grouping-cpu.json
    python -m gdn_fuzz.studies.grouping --regroup docs/grouping-cpu.json --json regrouped.json   # a new rule, same runs
    python -m gdn_fuzz.studies.grouping --pairs 12 --pairs-from docs/grouping-cpu.json --json pairs.json
    python -m gdn_fuzz.studies.grouping --regroup pairs.json --pairs-from docs/grouping-cpu.json --json p2.json

The other side (--pairs N): grouping must not read two bugs as one.  N pairs of mutants, each of which read as one
group alone and whose checks and clauses (their findings' and their shrunk launches') share nothing, each pair
planted in one file (target mutant:A+B); a pair's groups are counted, and a group is "merged" when it holds a
symptom only A's run showed and one only B's run showed.  Both rules are counted on the same findings: this tree's
(group_findings) and the one before issue 33's last part (BEFORE: shown=False, buffers=False).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gdn_fuzz.environment import write_atomic
from gdn_fuzz.findings import check_clause, group_findings, groups_record
from gdn_fuzz.studies.mutation_score import mutants_of


def run_one(name: str, seconds: float, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "campaign.json"
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "gdn_fuzz.cli", "run", "--target", f"mutant:{name}", "--seconds",
                            str(seconds), "--no-corpus", "--json", str(out), *extra], capture_output=True, text=True,
                           env=dict(os.environ, COLUMNS="200"))
        wall = time.monotonic() - t0
        if not out.exists():
            return dict(name=name, exit=p.returncode, wall_s=wall, error=(p.stderr or p.stdout)[-2000:])
        rec = json.loads(out.read_text())
    finds = [dict(signature=f["signature"], case=f["case"], launch_signatures=f.get("launch_signatures"))
             for f in rec.get("findings", [])]
    groups = groups_record(group_findings(finds))
    return dict(name=name, exit=p.returncode, wall_s=round(wall, 1), signatures=[f["signature"] for f in finds],
                groups=groups, findings=finds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="reference")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--only", nargs="+", help="these mutants only")
    ap.add_argument("--json")
    ap.add_argument("--regroup", metavar="JSON", help="group the findings of an earlier run of this study (its "
                    "--json) by this tree's rule, without running the campaigns again")
    ap.add_argument("--pairs", type=int, metavar="N", help="run N pairs of one-group mutants planted together "
                    "instead (the module docstring), picked from --pairs-from")
    ap.add_argument("--pairs-from", metavar="JSON", help="an earlier run of this study (its --json): the single "
                    "mutants' findings the pairs are picked and judged by")
    ap.add_argument("extra", nargs="*", help="more `gdn-fuzz run` options (after --)")
    args = ap.parse_args(argv)
    old = json.loads(Path(args.regroup).read_text()) if args.regroup else None
    if old is not None:
        args.seconds, args.base = old["seconds"], old["base"]
    if args.pairs or (old is not None and "pair" in (old["results"] or [{}])[0]):
        if not args.pairs_from:
            ap.error("--pairs (and --regroup of a pairs run) needs --pairs-from JSON (an earlier run of this study: "
                     "the single mutants' findings)")
        return run_pairs(args, None if old is None else old["results"])
    names = args.only or mutants_of(args.base)
    earlier = {}
    if old is not None:
        earlier = {r["name"]: r for r in old["results"]}
        names = list(earlier)
    rows = []
    for name in names:
        if name in earlier:
            r = dict(earlier[name], groups=groups_record(group_findings(earlier[name].get("findings", []))))
        else:
            r = run_one(name, args.seconds, args.extra)
        rows.append(r)
        n_s, n_g = len(r.get("signatures", [])), len(r.get("groups", []))
        print(f"{name:32s} exit {r['exit']}  signatures {n_s:3d}  groups {n_g:3d}"
              + (f"  error: {r['error'][-200:]}" if "error" in r else ""), flush=True)
        if args.json:
            _write(args, rows)
    several = [r for r in rows if len(r.get("signatures", [])) > 1]
    one = [r for r in several if len(r["groups"]) == 1]
    print(f"\n{len(rows)} mutants; {len(several)} showed several signatures (several findings before grouping); "
          f"{len(one)} of them read as one group now; groups of the others: "
          + ", ".join(f"{r['name']} {len(r['signatures'])} -> {len(r['groups'])}" for r in several if r not in one))
    if args.json:
        _write(args, rows)
    return 0


def clauses(record: dict, buffers: bool = True) -> set:
    """Every check and clause a mutant's run showed: its findings' and their shrunk launches' (check_clause)."""
    return {check_clause(x, buffers) for f in record.get("findings", [])
            for x in (f["signature"], *(f.get("launch_signatures") or ()))}


def pick_pairs(results: list[dict], n: int) -> list[tuple[dict, dict]]:
    """Up to n pairs of single mutants that each read as one group and share no check and clause, each mutant in
    one pair at most, in catalogue order."""
    ones = [r for r in results if r.get("signatures") and len(group_findings(r["findings"])) == 1]
    shown = {r["name"]: clauses(r) for r in ones}
    pairs, used = [], set()
    for i, a in enumerate(ones):
        for b in ones[i + 1:]:
            if (len(pairs) < n and a["name"] not in used and b["name"] not in used
                    and not shown[a["name"]] & shown[b["name"]]):
                pairs.append((a, b))
                used |= {a["name"], b["name"]}
    return pairs


BEFORE = dict(shown=False, buffers=False)  # the rule before issue 33's last part (group_findings' docstring)


def judge(findings: list[dict], a: dict, b: dict, shown: bool = True, buffers: bool = True) -> dict:
    """The groups of a pair's findings under one rule: how many, and how many merge the two bugs (a group with a
    symptom of a check and clause only a's run showed and one only b's run showed, read by that rule)."""
    ca, cb = clauses(a, buffers), clauses(b, buffers)
    groups = group_findings(findings, shown, buffers)
    held = [{check_clause(x, buffers) for x in g["symptoms"]} for g in groups]
    merged = sum(1 for h in held if h & (ca - cb) and h & (cb - ca))
    return dict(groups=len(groups), merged=merged, headlines=[g["headline"] for g in groups])


def run_pairs(args, earlier: list[dict] | None = None) -> int:
    """--pairs N: N new pair campaigns; earlier (--regroup of a pairs run): those campaigns' findings judged again."""
    single = {r["name"]: r for r in json.loads(Path(args.pairs_from).read_text())["results"]}
    todo = ([(single[r["pair"][0]], single[r["pair"][1]], r) for r in earlier] if earlier is not None else
            [(a, b, None) for a, b in pick_pairs(list(single.values()), args.pairs)])
    rows = []
    for a, b, r in todo:
        name = f"{a['name']}+{b['name']}"
        r = dict(r) if r is not None else run_one(name, args.seconds, args.extra)
        r.update(pair=[a["name"], b["name"]], rule=judge(r.get("findings", []), a, b),
                 rule_before=judge(r.get("findings", []), a, b, **BEFORE))
        rows.append(r)
        print(f"{name:48s} exit {r['exit']}  signatures {len(r.get('signatures', [])):3d}  groups {r['rule']['groups']}"
              f" (merged {r['rule']['merged']}); the rule before: {r['rule_before']['groups']} (merged "
              f"{r['rule_before']['merged']})" + (f"  error: {r['error'][-200:]}" if "error" in r else ""), flush=True)
        if args.json:
            _write(args, rows, pairs=True)
    print("\n" + _pairs_line(rows))
    if args.json:
        _write(args, rows, pairs=True)
    return 0


def _pairs_summary(rows: list[dict]) -> dict:
    found = [r for r in rows if r.get("signatures")]
    out = dict(pairs=len(rows), with_findings=len(found))
    for key in ("rule", "rule_before"):
        out[key] = dict(two_or_more_groups=sum(1 for r in found if r[key]["groups"] >= 2),
                        merged=sum(1 for r in found if r[key]["merged"]))
    return out


def _pairs_line(rows: list[dict]) -> str:
    s = _pairs_summary(rows)
    return (f"{s['pairs']} pairs, {s['with_findings']} with findings: this rule reads {s['rule']['two_or_more_groups']} as "
            f"two or more groups and merges the two bugs in {s['rule']['merged']}; the rule before: "
            f"{s['rule_before']['two_or_more_groups']} and {s['rule_before']['merged']}")


def _write(args, rows, pairs: bool = False) -> None:
    several = [r for r in rows if len(r.get("signatures", [])) > 1]
    summary = _pairs_summary(rows) if pairs else dict(
        mutants=len(rows), several_signatures=len(several), one_group=sum(1 for r in several if len(r["groups"]) == 1),
        signatures=sum(len(r.get("signatures", [])) for r in rows), groups=sum(len(r.get("groups", [])) for r in rows))
    write_atomic(args.json, json.dumps(dict(base=args.base, seconds=args.seconds, summary=summary, results=rows,
                                            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), indent=1))


if __name__ == "__main__":
    sys.exit(main())
