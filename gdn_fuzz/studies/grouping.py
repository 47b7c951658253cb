"""Findings grouped by bug, over the mutant catalogue (issue 33): how many single-edit mutants read as several
findings, and as how many groups (gdn_fuzz.findings.group_findings).

Each scored mutant of --base gets one campaign, `gdn-fuzz run --target mutant:NAME --seconds S --no-corpus --json`,
in its own process (crash mutants kill theirs), with every property.  A mutant is one edit, hence one bug: its
campaign's new signatures are what a reader saw before grouping, its groups what they see now.

    python -m gdn_fuzz.studies.grouping --seconds 15 --json docs/grouping-cpu.json
    python -m gdn_fuzz.studies.grouping --regroup docs/grouping-cpu.json --json regrouped.json   # a new rule, same runs
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

from gdn_fuzz.findings import group_findings, groups_record
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
    ap.add_argument("extra", nargs="*", help="more `gdn-fuzz run` options (after --)")
    args = ap.parse_args(argv)
    names = args.only or mutants_of(args.base)
    earlier = {}
    if args.regroup:
        old = json.loads(Path(args.regroup).read_text())
        args.seconds, args.base = old["seconds"], old["base"]
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


def _write(args, rows) -> None:
    several = [r for r in rows if len(r.get("signatures", [])) > 1]
    summary = dict(mutants=len(rows), several_signatures=len(several),
                   one_group=sum(1 for r in several if len(r["groups"]) == 1),
                   signatures=sum(len(r.get("signatures", [])) for r in rows),
                   groups=sum(len(r.get("groups", [])) for r in rows))
    tmp = Path(args.json).with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(base=args.base, seconds=args.seconds, date=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                              time.gmtime()),
                                   summary=summary, results=rows), indent=1))
    tmp.replace(args.json)


if __name__ == "__main__":
    sys.exit(main())
