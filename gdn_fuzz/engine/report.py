"""`gdn-fuzz report`: a Markdown and HTML report of a campaign.

Inputs: the campaign's JSON record (`gdn-fuzz run --json`) and its per-example JSON lines
(`gdn-fuzz run --record`).  Output folder: report.md, report.html and matplotlib PNGs of
the error against the float64 oracle by arm, by hist_len P and over the campaign.
Coverage tables say which parts of the strategy space the campaign reached (P values,
wrapped windows, pad rows, arms, T, flush_min, value regimes); per-regime and per-bucket tables
count, per property, the examples that reached each value of each menu (the Regime fields and the
batch buckets) and list the menu values no example reached.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

from gdn_fuzz.prefix_case import KIND as PREFIX_KIND

OUTPUTS = ("y", "u", "k", "g", "fold")
RECORD_KEYS = ("arm", "T", "flush_min", "prop", "regime", "rows")  # what a `gdn-fuzz run --record` line holds


class ReportInputError(ValueError):
    """A report input that is missing, unreadable, truncated or not what `gdn-fuzz report` reads: the message
    names the file (and line) and says what to give instead."""


def _read_text(path, what: str, fix: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise ReportInputError(f"{what} {str(path)!r} {'is a folder' if p.is_dir() else 'does not exist'}; {fix}")
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ReportInputError(f"{what} {str(path)!r} cannot be read ({type(e).__name__}: {e}); {fix}") from e


RECORDS_FIX = "give the JSON-lines file that `gdn-fuzz run --record FILE` wrote"
CAMPAIGN_FIX = "give the file that `gdn-fuzz run --json FILE` wrote, or leave --campaign out"


def load_records(path) -> list[dict]:
    """The example records of `gdn-fuzz run --record`, one JSON object per line (ReportInputError otherwise)."""
    recs = []
    for i, line in enumerate(_read_text(path, "records file", RECORDS_FIX).splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReportInputError(f"{path}:{i}: not a JSON line ({e}); was the campaign interrupted "
                                       f"mid-write? (drop that line, or {RECORDS_FIX})") from e
            if isinstance(rec, dict) and rec.get("kind") == PREFIX_KIND:
                raise ReportInputError(f"{path}:{i}: a record of a prefix-materializer campaign; `gdn-fuzz "
                                       "report` covers the flush kernel's campaigns only (their --record lines)")
            missing = [k for k in RECORD_KEYS if not isinstance(rec, dict) or k not in rec]
            if missing:
                hint = (" (it looks like a campaign's --json record: give it as --campaign)"
                        if isinstance(rec, dict) and "findings" in rec else "")
                raise ReportInputError(f"{path}:{i}: not an example record of gdn-fuzz run (no "
                                       f"{', '.join(missing)}){hint}; {RECORDS_FIX}")
            recs.append(rec)
    return recs


def load_campaign(path) -> dict:
    """The campaign record of `gdn-fuzz run --json` (ReportInputError when missing, truncated or not one)."""
    text = _read_text(path, "campaign record", CAMPAIGN_FIX)
    try:
        camp = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportInputError(f"campaign record {str(path)!r} is not JSON ({e}); was it cut short? "
                               f"{CAMPAIGN_FIX}") from e
    if not isinstance(camp, dict) or "findings" not in camp:
        raise ReportInputError(f"campaign record {str(path)!r} has no findings list: it is not a `gdn-fuzz run "
                               f"--json` record; {CAMPAIGN_FIX}")
    return camp


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


# ------------------------------------------------------------------ per-regime and per-bucket coverage

# The value menus the strategies draw a Regime from (strategies.regimes; gdn_fuzz.case for the names).
def regime_menus() -> dict[str, tuple]:
    """Regime field -> the values the strategies draw it from, in menu order."""
    from gdn_fuzz.case import BETAS, DECAYS, HISTORIES, KEYS
    from gdn_fuzz.strategies import QK_SCALES, STATE_SCALES, V_SCALES

    return {"qk_scale": QK_SCALES, "v_scale": V_SCALES, "state_scale": STATE_SCALES,
            "decay": tuple(DECAYS), "beta": tuple(BETAS), "keys": tuple(KEYS), "history": tuple(HISTORIES),
            "poison": (False, True)}


def record_pool_scale(r: dict) -> str:
    """strategies.pool_scale_of for a record (pool, HV, rows as [slot, P, base]): "int32" where a row
    sits on a slot whose element offset is >= 2^31, "thousands" for a pool of >= 1,024 slots, else "small"."""
    from gdn_fuzz.strategies import pool_scale_kind

    return pool_scale_kind(r["pool"], r["HV"], [slot for slot, _, _ in r["rows"]])


def bucket_menu(camp: dict) -> tuple[tuple, str]:
    """(the batch buckets the campaign drew from, where that menu comes from).  The campaign record's
    "buckets" when it has them; else the default of its target (strategies.buckets_for: BUCKETS on a
    target that JIT-compiles, CPU_BUCKETS otherwise); with no campaign record, both defaults."""
    from gdn_fuzz.strategies import BUCKETS, CPU_BUCKETS

    if camp.get("buckets"):
        return tuple(camp["buckets"]), "the campaign's buckets"
    name = str(camp.get("target") or "")
    if not name:
        return tuple(sorted(set(BUCKETS) | set(CPU_BUCKETS))), "the strategies' default buckets (no campaign record given)"
    gpu = name in ("production", "sm100")
    if name.startswith("mutant:"):
        from gdn_fuzz.targets.mutants import CATALOGUE

        m = CATALOGUE.get(name.split(":", 1)[1])
        gpu = m is not None and m.base == "production"
    return ((tuple(BUCKETS), f"the default buckets of target {name} (strategies.BUCKETS; the campaign record "
             "does not list --buckets)") if gpu else
            (tuple(CPU_BUCKETS), f"the default buckets of target {name} (strategies.CPU_BUCKETS; the campaign "
             "record does not list --buckets)"))


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _same(a, b) -> bool:
    """Equal menu values (a bool never equals a number: True is not 1.0)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def menu_coverage(recs: list[dict], menus: dict[str, tuple], props: list[str] | None = None) -> dict:
    """Per menu (a Regime field, or "bucket"): {"props": [...], "rows": [(value, on_menu, {prop: n}, total)]}.

    Every menu value is a row, those no example reached included (total 0); a value the records hold
    but the menu lacks (a custom strategy, an older menu) is a row with on_menu False.  An example's
    bucket is its batch size B (cases are padded with pad rows to their bucket)."""
    props = list(props) if props else []
    for r in recs:
        if r["prop"] not in props:
            props.append(r["prop"])
    out = {}
    for field, menu in menus.items():
        counts: dict = {}
        for r in recs:
            v = (r["B"] if field == "bucket" else record_pool_scale(r) if field == "pool_scale"
                 else r["regime"][field])
            key = next((m for m in menu if _same(m, v)), v)
            counts.setdefault(key, {}).setdefault(r["prop"], 0)
            counts[key][r["prop"]] += 1
        rows = [(v, True, counts.get(v, {}), sum(counts.get(v, {}).values())) for v in menu]
        extra = [v for v in counts if not any(_same(v, m) for m in menu)]
        rows += [(v, False, counts[v], sum(counts[v].values())) for v in sorted(extra, key=str)]
        out[field] = dict(props=props, rows=rows)
    return out


def unexplored(cov: dict) -> dict[str, list]:
    """Menu -> its values that no example reached (what the run did not explore)."""
    return {f: [v for v, on, _, n in c["rows"] if on and n == 0] for f, c in cov.items()}


def menu_tables(recs: list[dict], camp: dict) -> list[str]:
    """The Markdown of the per-regime and per-bucket tables."""
    from gdn_fuzz.properties import REGISTRY

    ran = list((camp.get("per_property") or {}).keys())
    props = [p for p in REGISTRY if p in ran] + [p for p in ran if p not in REGISTRY]
    menus = dict(regime_menus())
    buckets, source = bucket_menu(camp)
    menus["bucket"] = buckets
    from gdn_fuzz.strategies import POOL_SCALES

    menus["pool_scale"] = ("small", *POOL_SCALES)
    cov = menu_coverage(recs, menus, props)
    zero = unexplored(cov)
    md = ["## Coverage per regime and bucket", "",
          "Examples that reached each menu value, per property.  Every value of a menu is listed; "
          "**0** marks one that no example of the whole run reached.  Regime menus: strategies.regimes "
          f"(gdn_fuzz.case.Regime); bucket menu: {source}; an example's bucket is its batch size B; "
          "pool_scale: strategies.pool_scale_of (only the launch property draws the pool-scale regime).", ""]
    missed = [f"{f} = {', '.join(_fmt(v) for v in vs)}" for f, vs in zero.items() if vs]
    md.append("- **not explored** (no example): " + ("; ".join(missed) if missed else "none: every menu value was reached"))
    md.append("")
    for field, c in cov.items():
        md += [f"### {field if field in ('bucket', 'pool_scale') else 'regime.' + field}", "",
               "| value | " + " | ".join(c["props"]) + " | all |", "|---|" + "---|" * (len(c["props"]) + 1)]
        for v, on, per, n in c["rows"]:
            label = _fmt(v) + ("" if on else " (off menu)")
            cells = [str(per.get(p, 0)) for p in c["props"]]
            md.append(f"| {label} | " + " | ".join(cells) + f" | {'**0**' if n == 0 else n} |")
        md.append("")
    return md


def _log_or_empty(ax, has_data: bool) -> None:
    """A log y axis, or "no data" where the output had no value (e.g. no flush row, no fold: a log
    axis over nothing made matplotlib raise and the whole report fail)."""
    if has_data:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


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
        _log_or_empty(ax, any(per_arm[o][a] for a in arms))
        ax.set_title(f"{o}: error / magnitude")
    fig.tight_layout()
    fig.savefig(out / "error_by_arm.png", dpi=90)
    plt.close(fig)
    made.append("error_by_arm.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, o in zip(axes, ("y", "fold")):
        P, v, c = byP[o]
        sc = ax.scatter(P, v, c=c, s=6, cmap="tab10", vmin=0, vmax=9)
        _log_or_empty(ax, bool(v))
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
    recs = load_records(records_path)  # both inputs read (and checked) before anything is written
    camp = load_campaign(campaign_json) if campaign_json else {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
    md += [""] + menu_tables(recs, camp)
    md += ["Accept sequences are exercised by the stateful machine (tests/test_machine.py), not by",
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
    body, table = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            body.append(_html_table(table))
            table = []
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


def _html_table(lines: list[str]) -> str:
    """A Markdown table (header, |---| rule, rows) as an HTML table."""
    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    head, rows = cells(lines[0]), [cells(x) for x in lines[2:]]
    th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    tr = "".join("<tr>" + "".join(f"<td>{html.escape(c.replace('**', ''))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table border=1 cellspacing=0 cellpadding=3><tr>{th}</tr>{tr}</table>"
