"""`gdn-fuzz report`: a Markdown and HTML report of a campaign.

Inputs: the campaign's JSON record (`gdn-fuzz run --json`) and its per-example JSON lines
(`gdn-fuzz run --record`).  Output folder: report.md, report.html and matplotlib PNGs of
the error against the float64 oracle by arm, by hist_len P and over the campaign.
Coverage tables say which parts of the strategy space the campaign reached (P values,
wrapped windows, pad rows, arms, T, flush_min, value regimes).
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

OUTPUTS = ("y", "u", "k", "g", "fold")


def load_records(path) -> list[dict]:
    recs = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON line ({e}); was the campaign interrupted mid-write?") from e
    return recs


def coverage(recs: list[dict]) -> dict[str, Counter]:
    cov = {k: Counter() for k in ("arm", "T", "flush_min", "P", "row kind", "window", "regime.decay",
                                  "regime.beta", "regime.keys", "regime.history", "regime.poison", "property")}
    for r in recs:
        cov["arm"][r["arm"]] += 1
        cov["T"][r["T"]] += 1
        cov["flush_min"][r["flush_min"]] += 1
        cov["property"][r["prop"]] += 1
        for k in ("decay", "beta", "keys", "history", "poison"):
            cov["regime." + k][str(r["regime"][k])] += 1
        for slot, P, base in r["rows"]:
            if slot < 0:
                cov["row kind"]["pad"] += 1
                continue
            cov["P"][P] += 1
            cov["row kind"]["flush" if P >= r["flush_min"] else "verify"] += 1
            cov["window"]["wrapped" if base + P > 32 else "empty" if P == 0 else "contiguous"] += 1
            if P == r["flush_min"] - 1:
                cov["row kind"]["P = flush_min - 1"] += 1
            if P == r["flush_min"]:
                cov["row kind"]["P = flush_min"] += 1
    return cov


def _plots(recs, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    arms = sorted({r["arm"] for r in recs})
    per_arm = {o: {a: [] for a in arms} for o in OUTPUTS}
    byP = {o: ([], [], []) for o in ("y", "fold")}
    over = []
    for r in recs:
        m = r.get("metrics") or {}
        worst = 0.0
        for o in OUTPUTS:
            for (slot, P, _), v in zip(r["rows"], m.get(o, [])):
                if v is None or slot < 0 or v != v or v == float("inf"):
                    continue
                per_arm[o][r["arm"]].append(max(v, 1e-12))
                worst = max(worst, v)
                if o in byP:
                    byP[o][0].append(P)
                    byP[o][1].append(max(v, 1e-12))
                    byP[o][2].append(arms.index(r["arm"]))
        over.append((r["i"], max(worst, 1e-12)))
    fig, axes = plt.subplots(1, len(OUTPUTS), figsize=(4 * len(OUTPUTS), 3.5), sharey=False)
    for ax, o in zip(axes, OUTPUTS):
        data = [per_arm[o][a] or [float("nan")] for a in arms]
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(arms) + 1), arms, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{o}: error / magnitude")
    fig.tight_layout()
    fig.savefig(out / "error_by_arm.png", dpi=90)
    plt.close(fig)
    made.append("error_by_arm.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, o in zip(axes, ("y", "fold")):
        P, v, c = byP[o]
        sc = ax.scatter(P, v, c=c, s=6, cmap="tab10", vmin=0, vmax=9)
        ax.set_yscale("log")
        ax.set_xlabel("hist_len P")
        ax.set_title(f"{o}: error / magnitude by P (colour = arm)")
    if arms:
        handles = [plt.Line2D([], [], marker="o", ls="", color=sc.cmap(sc.norm(i))) for i in range(len(arms))]
        axes[1].legend(handles, arms, fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "error_by_P.png", dpi=90)
    plt.close(fig)
    made.append("error_by_P.png")
    fig, ax = plt.subplots(figsize=(8, 3))
    if over:
        ax.plot([i for i, _ in over], [v for _, v in over], ".", ms=2)
    ax.set_yscale("log")
    ax.set_xlabel("example")
    ax.set_ylabel("worst error / magnitude")
    ax.set_title("worst error of each example over the campaign")
    fig.tight_layout()
    fig.savefig(out / "error_over_campaign.png", dpi=90)
    plt.close(fig)
    made.append("error_over_campaign.png")
    return made


def build(records_path, campaign_json=None, out_dir="report") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recs = load_records(records_path)
    camp = json.loads(Path(campaign_json).read_text()) if campaign_json else {}
    md = ["# gdn_fuzz campaign report", ""]
    if camp:
        md += [f"- target: `{camp.get('target')}` ({camp.get('path')})", f"- device: {camp.get('device')}",
               f"- arms: {', '.join(camp.get('arms', []))}; T: {camp.get('T')}; seed {camp.get('seed')}",
               f"- examples: {camp.get('examples')}, launches: {camp.get('launches')}, JIT compiles: "
               f"{camp.get('compiles')}, time: {camp.get('seconds', 0):.1f} s; date {camp.get('date')}", ""]
    md += [f"{len(recs)} examples recorded.", "", "## Findings", ""]
    finds = camp.get("findings", [])
    if not finds:
        md.append("None.")
    for f in finds:
        md.append(f"- `{f.get('signature', f['prop'])}` (property `{f['prop']}`): " + "; ".join(f["findings"]))
        if f.get("first_failure_s") is not None:
            md.append(f"  - first failing example at {f['first_failure_s']:.1f} s after {f['examples_before']} examples; "
                      + (f"shrunk in {f['shrink_s']:.1f} s" if f.get("shrunk") else "shrinking cut short (budget)")
                      + (f"; corpus entry `{f['corpus_entry']}`" if f.get("corpus_entry") else ""))
        md.append(f"  - case: `{json.dumps(f['case'], sort_keys=True)}`")
    known = camp.get("known", [])
    if known:
        md += ["", "## Known bugs seen (open corpus entries of this target: expected, not failing the run)", ""]
        for k in known:
            md.append(f"- `{k['signature']}`: {k['examples']} example(s), corpus entry `{k['corpus_entry']}`")
    md += ["", "## Coverage of the strategy space", ""]
    for k, c in coverage(recs).items():
        items = sorted(c.items(), key=lambda kv: (str(type(kv[0])), kv[0]))
        md.append(f"- **{k}**: " + (", ".join(f"{v}: {n}" for v, n in items) or "not reached"))
    md += ["", "Accept sequences are exercised by the stateful machine (tests/test_machine.py), not by",
           "single-launch campaigns.", "", "## Error against the float64 oracle", ""]
    worst = {}
    for r in recs:
        for o, vals in (r.get("metrics") or {}).items():
            for v in vals:
                if v is not None:
                    worst.setdefault((r["arm"], o), []).append(v)
    md.append("| arm | " + " | ".join(OUTPUTS) + " |")
    md.append("|---|" + "---|" * len(OUTPUTS))
    for arm in sorted({a for a, _ in worst}):
        md.append(f"| {arm} | " + " | ".join(
            f"{max(worst[(arm, o)]):.2e}" if (arm, o) in worst else "-" for o in OUTPUTS) + " |")
    md.append("")
    for png in _plots(recs, out):
        md.append(f"![{png}]({png})")
    text = "\n".join(md) + "\n"
    (out / "report.md").write_text(text)
    body = []
    for line in text.splitlines():
        if line.startswith("!["):
            src = line[line.index("(") + 1:-1]
            body.append(f'<img src="{html.escape(src)}" style="max-width:100%">')
        elif line.startswith("#"):
            n = len(line) - len(line.lstrip("#"))
            body.append(f"<h{n}>{html.escape(line[n:].strip())}</h{n}>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    (out / "report.html").write_text("<!doctype html><meta charset=utf-8><title>gdn_fuzz report</title>\n"
                                     + "\n".join(body) + "\n")
    return out / "report.md"
