"""Where a campaign's time went, per example, from its `gdn-fuzz run --record` file (issue 32).

Each record line has `t` (campaign seconds when the example was recorded, after its check) and `check_s` (the
seconds of its check: in an isolated campaign the worker's check and the round trip to it).  An example's time is
the gap between its `t` and the one before; what is not check_s is the campaign process's own work (Hypothesis'
draw and the bookkeeping).  With rounds at once (--pipeline > 1) the gaps of overlapping examples share time, so
the share of time spent checking is the figure to read there, not the split.  Where the lines also carry
`worker_s` (the isolated worker's own seconds for the check), check_s less worker_s is the round trip to the worker
as the campaign process sees it.  Per class of example: small pools against the pool-scale regime (pools of >= 1,024
slots), and the geometry.

    python benchmarks/record_split.py RUN.jsonl [RUN2.jsonl ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def split(path) -> dict:
    lines = [json.loads(x) for x in open(path) if x.strip()]
    if len(lines) < 2:
        raise SystemExit(f"{path}: fewer than 2 records; nothing to split")
    total = lines[-1]["t"] - lines[0]["t"]
    classes: dict = defaultdict(lambda: dict(examples=0, seconds=0.0, check_s=0.0, worker_s=None))
    prev = lines[0]["t"]
    for r in lines[1:]:
        c = classes[("pool>=1024" if r["pool"] >= 1024 else "small", f"{r['H']}x{r['HV']}")]
        c["examples"] += 1
        c["seconds"] += r["t"] - prev
        c["check_s"] += r["check_s"]
        if r.get("worker_s") is not None:
            c["worker_s"] = (c["worker_s"] or 0.0) + r["worker_s"]
        prev = r["t"]
    checked = sum(c["check_s"] for c in classes.values())
    return dict(file=str(path), examples=len(lines), seconds=total, ms_per_example=1e3 * total / len(lines),
                check_share=checked / total if total else None,
                classes=[dict(pool=k[0], geometry=k[1], **v) for k, v in sorted(classes.items())])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = [split(p) for p in args.records]
    for s in out:
        print(f"{s['file']}: {s['examples']} examples in {s['seconds']:.1f} s, {s['ms_per_example']:.2f} ms per "
              f"example, checking {s['check_share']:.0%} of the time")
        for c in s["classes"]:
            n = c["examples"]
            print(f"  {c['pool']:>10s} {c['geometry']:>6s}  n={n:5d}  {1e3 * c['seconds'] / n:7.2f} ms per example, "
                  f"check {1e3 * c['check_s'] / n:7.2f} ms"
                  + ("" if c["worker_s"] is None else f" (in the worker {1e3 * c['worker_s'] / n:6.2f})")
                  + f", the rest {1e3 * (c['seconds'] - c['check_s']) / n:6.2f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
