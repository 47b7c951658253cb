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

from gdn_fuzz.environment import write_atomic
from gdn_fuzz.findings import GROUPING_RULE, group_findings
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


def measured(recs: list[dict]) -> tuple[dict, Counter]:
    """Per output, per arm, the measured error / magnitude values of live rows (finite, > 0: a log axis can plot
    them), and the counts of what was left out: "not measured" (an example without oracle metrics, e.g. a host
    check), "exact" (error 0) and "non-finite" (the target gave NaN or inf)."""
    vals = {o: {} for o in OUTPUTS}
    left = Counter()
    for r in recs:
        m = r.get("metrics") or {}
        if not any(v is not None for vs in m.values() for v in vs):
            left["not measured"] += 1
            continue
        for o in OUTPUTS:
            for (slot, P, _), v in zip(r["rows"], m.get(o, [])):
                if v is None or slot < 0:
                    continue
                if v != v or v in (float("inf"), float("-inf")):
                    left["non-finite"] += 1
                elif v == 0:
                    left["exact"] += 1
                else:
                    vals[o].setdefault(r["arm"], []).append((r["i"], P, v))
    return vals, left


def bounds(arms) -> dict:
    """(arm, output) -> (rtol, its provenance): the tolerance table (gdn_fuzz.compare.table_for) the checks use."""
    from gdn_fuzz.compare import table_for

    out = {}
    for arm in arms:
        try:
            t = table_for(arm)
        except (KeyError, ValueError):
            continue
        for o in OUTPUTS:
            out[arm, o] = (t[o].rtol, t[o].source)
    return out


def _plots(vals: dict, arms: list[str], tol: dict, out: Path) -> list[str]:
    """The three figures as PNG files in `out`, from measured()'s values and the bounds of `arms`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, axes = plt.subplots(1, len(OUTPUTS), figsize=(4 * len(OUTPUTS), 3.5), sharey=False)
    for ax, o in zip(axes, OUTPUTS):
        data = [[v for _, _, v in vals[o].get(a, [])] or [float("nan")] for a in arms]
        ax.boxplot(data, showfliers=True)
        for i, a in enumerate(arms, 1):
            if (a, o) in tol:
                ax.hlines(tol[a, o][0], i - 0.4, i + 0.4, colors="tab:red", linestyles="dashed", lw=1)
        ax.set_xticks(range(1, len(arms) + 1), arms, rotation=45, ha="right", fontsize=7)
        _log_or_empty(ax, any(vals[o].get(a) for a in arms))
        ax.set_title(f"{o}: error / magnitude (red: bound)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "error_by_arm.png", dpi=90)
    plt.close(fig)
    made.append("error_by_arm.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    sc = None
    for ax, o in zip(axes, ("y", "fold")):
        pts = [(P, v, arms.index(a)) for a in arms for _, P, v in vals[o].get(a, [])]
        if pts:
            sc = ax.scatter([p[0] for p in pts], [p[1] for p in pts], c=[p[2] for p in pts], s=6, cmap="tab10",
                            vmin=0, vmax=9)
        _log_or_empty(ax, bool(pts))
        ax.set_xlabel("hist_len P")
        ax.set_title(f"{o}: error / magnitude by P (colour = arm)", fontsize=9)
    if arms and sc is not None:
        handles = [plt.Line2D([], [], marker="o", ls="", color=sc.cmap(sc.norm(i))) for i in range(len(arms))]
        axes[1].legend(handles, arms, fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "error_by_P.png", dpi=90)
    plt.close(fig)
    made.append("error_by_P.png")
    worst: dict[int, float] = {}
    for o in OUTPUTS:
        for a in arms:
            for i, _, v in vals[o].get(a, []):
                worst[i] = max(worst.get(i, 0.0), v)
    fig, ax = plt.subplots(figsize=(8, 3))
    if worst:
        ax.plot(list(worst), list(worst.values()), ".", ms=2)
    _log_or_empty(ax, bool(worst))
    ax.set_xlabel("example")
    ax.set_ylabel("worst error / magnitude")
    ax.set_title("worst measured error of each example over the campaign", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "error_over_campaign.png", dpi=90)
    plt.close(fig)
    made.append("error_over_campaign.png")
    return made


def _left_out(left: Counter) -> str:
    return ("left out of the plots (a log axis cannot show them): " + ", ".join(
        f"{n} {k}" + (" example(s)" if k == "not measured" else " row value(s)") for k, n in sorted(left.items()))
            if left else "nothing left out of the plots")


def build(records_path, campaign_json=None, out_dir="report") -> Path:
    recs = load_records(records_path)  # both inputs read (and checked) before anything is written
    camp = load_campaign(campaign_json) if campaign_json else {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    finds = camp.get("findings", [])
    groups = group_findings(finds)
    md = ["# gdn_fuzz campaign report", ""]
    if camp:
        md += [f"- target: `{camp.get('target')}` ({camp.get('path')})", f"- device: {camp.get('device')}",
               f"- arms: {', '.join(camp.get('arms', []))}; T: {camp.get('T')}; seed {camp.get('seed')}",
               f"- examples: {camp.get('examples')}, launches: {camp.get('launches')}, JIT compiles: "
               f"{camp.get('compiles')}, time: {camp.get('seconds', 0):.1f} s; date {camp.get('date')}"]
        if camp.get("command"):
            md.append(f"- command: `{camp['command']}`")
        if camp.get("versions"):
            md.append("- versions: " + ", ".join(f"{k} {v}" for k, v in camp["versions"].items()))
        md.append("")
    md += [f"{len(recs)} examples recorded.", "", "## Findings", ""]
    if not finds:
        md.append("None.")
    else:
        n = sum(len(g["symptoms"]) for g in groups)
        md += [f"{len(groups)} bug(s), {n} symptom(s): {GROUPING_RULE}; the most specific symptom first.", ""]
    for k, g in enumerate(groups, 1):
        md.append(f"### Bug {k}: `{g['headline']}`" + (f" (+{len(g['symptoms']) - 1} symptoms)"
                                                        if len(g["symptoms"]) > 1 else ""))
        md.append("")
        for f in g["records"]:
            md.append(f"- `{f.get('signature', f['prop'])}` (property `{f['prop']}`): " + "; ".join(f["findings"]))
            if f.get("first_failure_s") is not None:
                md.append(f"  - first failing example at {f['first_failure_s']:.1f} s after {f['examples_before']} "
                          "examples; " + (f"shrunk in {f['shrink_s']:.1f} s" if f.get("shrunk") else
                                          "shrinking cut short (budget)")
                          + (f"; corpus entry `{f['corpus_entry']}`" if f.get("corpus_entry") else ""))
            md.append(f"  - case: `{json.dumps(f['case'], sort_keys=True)}`")
        md.append("")
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
           "single-launch campaigns.", "", "## Error against the float64 oracle", "",
           "Worst error / magnitude over the live rows of every measured example, next to the bound the checks "
           "allow and where it comes from. " + BOUND_NOTE, ""]
    vals, left = measured(recs)
    arms = sorted({r["arm"] for r in recs})
    tol = bounds(arms)
    worst = error_table(vals, tol)
    md.append("| arm | output | worst error / magnitude | relative bound | where the bound comes from |")
    md.append("|---|---|---|---|---|")
    for arm, o, w, rtol, src in worst:
        md.append(f"| {arm} | {o} | {w:.2e} | " + (f"{rtol:.2e} | {src}" if rtol else "- | -") + " |")
    md.append("")
    pngs = _plots(vals, arms, tol, out)
    md.append(_left_out(left) + ".")
    md.append("")
    for png in pngs:
        md.append(f"![{png}]({png})")
    text = "\n".join(md) + "\n"
    write_atomic(out / "report.md", text)
    write_atomic(out / "report.html", page(camp, recs, groups, worst, pngs, left, out))
    return out / "report.md"


BOUND_NOTE = ("A check allows rtol x magnitude + a per-element floor for underflow (gdn_fuzz.compare), so a row of "
              "tiny magnitude can pass with error / magnitude above the relative bound: the findings are the verdict, "
              "this table shows how close the measured outputs came.")


def error_table(vals: dict, tol: dict) -> list[tuple]:
    """(arm, output, worst error / magnitude, the bound's rtol or None, its provenance) per measured pair, from
    measured()'s values and bounds()."""
    rows = []
    for arm in sorted({a for o in OUTPUTS for a in vals[o]}):
        for o in OUTPUTS:
            if vals[o].get(arm):
                rtol, src = tol.get((arm, o), (None, ""))
                rows.append((arm, o, max(v for _, _, v in vals[o][arm]), rtol, src))
    return rows


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c9d1e0}main{max-width:1180px;margin:0 auto;padding:8px 28px 40px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid #e6e9ef;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f6;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.zero{color:#b42318;font-weight:600}code,.sig{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
.new{color:#b42318;font-weight:600}.ok{color:#067647;font-weight:600}.warn{color:#b54708}
.bug{background:#fef3f2}.bug td:first-child{font-weight:700}figure{margin:10px 0}
figure img{max-width:100%;border:1px solid #e6e9ef;border-radius:4px}figcaption{color:#5b6475;font-size:12.5px}
details pre{white-space:pre-wrap;background:#f6f7f9;padding:8px;border-radius:4px;font-size:12px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}dl.kv dt{color:#5b6475}dl.kv dd{margin:0}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(head: list[str], rows: list[list[str]], attrs: str = "", row_attrs=None) -> str:
    """An HTML table; cells are HTML already (escape text with _e)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    trs = "".join(f"<tr{(row_attrs or (lambda i: ''))(i)}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>"
                                                                      for c in r) + "</tr>"
                  for i, r in enumerate(rows))
    return f"<table{attrs}><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    import base64

    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def page(camp: dict, recs: list[dict], groups: list[dict], worst: list[tuple], pngs: list[str], left: Counter,
         out: Path) -> str:
    """The report as one self-contained HTML page: inline style, the plots as data: URIs, no script."""
    parts = []
    title = f"gdn_fuzz campaign report: {camp.get('target', 'records only')}"
    sub = (f"{camp.get('examples', len(recs))} examples, {camp.get('launches', '?')} launches, "
           f"{camp.get('seconds', 0):.1f} s on {camp.get('device', '?')}; {camp.get('date', '')}" if camp
           else f"{len(recs)} examples recorded (no campaign record given)")
    kv = [("target", f"<code>{_e(camp.get('target'))}</code> ({_e(camp.get('path'))})"),
          ("device", _e(camp.get("device"))), ("command", f"<code>{_e(camp.get('command', '-'))}</code>"),
          ("versions", _e(", ".join(f"{k} {v}" for k, v in (camp.get("versions") or {}).items()) or "-")),
          ("arms, T", _e(f"{', '.join(camp.get('arms', []))}; T {camp.get('T')}")), ("seed", _e(camp.get("seed"))),
          ("budget", _e(f"{camp.get('budget_s')} s" if camp.get("budget_s") else f"{camp.get('budget_examples')} examples")),
          ("JIT compiles", _e(camp.get("compiles")))] if camp else []
    if kv:
        parts.append("<section id=run><h2>The run</h2><dl class=kv>"
                     + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in kv) + "</dl></section>")
    n = sum(len(g["symptoms"]) for g in groups)
    head = (f"{len(groups)} bug{'s' if len(groups) != 1 else ''}, {n} symptom{'s' if n != 1 else ''}" if groups
            else "no new findings")
    rows, marks = [], []
    for k, g in enumerate(groups, 1):
        for j, f in enumerate(g["records"]):
            rows.append([str(k) if j == 0 else "", f"<span class=sig>{_e(f['signature'])}</span>", _e(f["prop"]),
                         f"<td class=num>{f['first_failure_s']:.1f} s</td>" if f.get("first_failure_s") is not None
                         else "-", "yes" if f.get("shrunk") else "<span class=warn>cut short</span>",
                         _e(f.get("corpus_entry") or "-"),
                         f"<details><summary>case</summary><pre>{_e(json.dumps(f['case'], sort_keys=True))}</pre>"
                         f"<pre>{_e(chr(10).join(f['findings']))}</pre></details>"])
            marks.append(j == 0)
    body = (_table(["bug", "signature", "property", "first at", "shrunk", "corpus entry", "details"], rows,
                   " id=findings", lambda i: " class=bug" if marks[i] else "")
            + f"<p>{_e(GROUPING_RULE[0].upper() + GROUPING_RULE[1:])}; the most specific symptom (its shrunk launch "
              "shows the fewest others) heads each.</p>"
            if groups else "<p class=ok>None: no check failed outside the known bugs.</p>")
    parts.append(f"<section id=findings-section><h2>Findings: {head}</h2>{body}</section>")
    known = camp.get("known", [])
    if known:
        parts.append("<section id=known><h2>Known bugs seen (expected: open corpus entries of this target)</h2>"
                     + _table(["signature", "examples", "corpus entry"],
                              [[f"<span class=sig>{_e(k['signature'])}</span>", f"<td class=num>{k['examples']}</td>",
                                _e(k["corpus_entry"])] for k in known]) + "</section>")
    erows = [[_e(a), _e(o), f"<td class=num>{w:.2e}</td>", f"<td class=num>{r:.2e}</td>" if r else "-", _e(src)]
             for a, o, w, r, src in worst]
    parts.append("<section id=errors><h2>Error against the float64 oracle</h2><p>The worst error / magnitude over "
                 f"the live rows of the measured examples, next to the bound the checks allow and where it comes from. "
                 f"{_e(BOUND_NOTE)}</p>"
                 + (_table(["arm", "output", "worst error / magnitude", "relative bound", "where the bound comes from"],
                           erows) if erows else "<p>No measured example.</p>") + "</section>")
    props = camp.get("per_property") or {}
    cov = coverage(recs)
    prow = [[_e(p), f"<td class=num>{v.get('examples', 0)}</td>", f"<td class=num>{v.get('seconds', 0):.1f}</td>",
             f"<td class=num>{cov['property'].get(p, 0)}</td>"] for p, v in props.items()]
    ptab = (_table(["property", "examples", "seconds", "examples recorded"], prow) if prow else "")
    menus = menu_tables(recs, camp)
    mparts, table = [], []
    for line in menus + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            mparts.append(_md_table(table))
            table = []
        if line.startswith("### "):
            mparts.append(f"<h3>{_e(line[4:])}</h3>")
        elif line.startswith("- **not explored**"):
            mparts.append(f"<p><b>not explored</b>{_e(line.split('**', 2)[2])}</p>")
    parts.append("<section id=coverage><h2>Coverage</h2><h3>Per property</h3>" + ptab + "<h3>Rows and windows</h3>"
                 + _table(["what", "values reached (examples or rows)"],
                          [[_e(k), _e(", ".join(f"{v}: {c}" for v, c in sorted(cnt.items(), key=lambda kv: str(kv[0])))
                                      or "not reached")] for k, cnt in cov.items() if k != "property"])
                 + "".join(mparts) + "</section>")
    figs = "".join(f"<figure>{_img(out / p, p)}<figcaption>{_e(p)}</figcaption></figure>" for p in pngs)
    parts.append(f"<section id=plots><h2>Plots</h2><p>{_e(_left_out(left))}.</p>{figs}</section>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body><header><h1>{_e(title)}</h1><p>{_e(sub)}</p>"
            "</header><main>" + "".join(parts) + "</main></body></html>\n")


def _md_table(lines: list[str]) -> str:
    """A Markdown table (header, |---| rule, rows) as an HTML table; a **0** cell is marked."""
    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    head, rows = cells(lines[0]), [cells(x) for x in lines[2:]]
    return _table([_e(c) for c in head], [[("<td class=zero>0</td>" if c == "**0**" else
                                           f"<td class=num>{_e(c)}</td>" if c.isdigit() else _e(c)) for c in r]
                                         for r in rows])
