"""`gdn-fuzz diff OLD NEW`: what changes for a caller between two releases of the flush kernel (or two files).

What a kernel or serving team runs before it bumps a pin.  OLD and NEW are each a modelled release
(`0.7.2.post1`: the target production@0.7.2.post1, found installed or fetched), a target name
(`production`, `reference`, `mutant:NAME`) or a path to a module file.  Two parts:

Host checks (host_check_diff)
    Every single change of a valid call (gdn_fuzz.properties.hostchecks.CHANGES) that either side's
    release model covers, on every arm, called on both sides with the same tensors.  Each call is
    observed (exception type, whether the message names the argument) and placed by each side's model
    (which check the model says catches it).  The table lists the changes whose outcome differs, one
    row per (change, old outcome, new outcome) with the arms it holds for: the clause, the old
    behaviour, the new behaviour.  A call that does not do what its own side's model says is marked
    "(model: ...)", so a table row is either a modelled difference or a contract change the model
    has not caught up with.  On a CUDA device a call that a model says passes every host check although
    it is illegal (an unvalidated input) is not made: it would launch on garbage.

Launches (launch_diff)
    The same drawn launches (gdn_fuzz.strategies.cases, seeded) on both sides, each on its own copy of
    the same inputs.  Per output and clause (y M4, k/u appends M5, g appends M6, the pool M7/M8, the
    cursors C2), every launch is counted as bit-identical, within tolerance (both sides pass the float64
    oracle's bound for that output, gdn_fuzz.checks), or different (one side fails the bound, or one
    raised and the other did not).  It needs a device both sides launch on.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hseed

from gdn_fuzz.checks import check_oracle, expectation
from gdn_fuzz.observation import clone_inputs, observe, same_bits
from gdn_fuzz.case import materialize
from gdn_fuzz.properties import hostchecks as hc
from gdn_fuzz.strategies import cases, geometries_for
from gdn_fuzz.targets import Target, get_target, releases


def resolve(spec: str) -> Target:
    """A diff side: a modelled release version (production@VERSION), a target name, or a file."""
    if spec in releases.RELEASES:
        return get_target(f"production@{spec}")
    return get_target(spec)


# ------------------------------------------------------------------ host checks

@dataclass
class HostRow:
    clause: str
    change: str
    old: str
    new: str
    arms: list = field(default_factory=list)
    note: str = ""


def _outcome(pr: hc.Probe | None, change: hc.Change) -> str:
    """'ExcType (check id)' / 'passes' as observed, with the side's model where it disagrees."""
    if pr is None:
        return "not called"
    o = pr.observed
    if o.exc is None:
        text = "passes every host check"
    else:
        named = change.named is not None and hc.names_argument(o.message, change.named)
        text = o.exc + (f" naming {change.named}" if named else "")
    chk = pr.expected.check
    where = chk.id if chk is not None else "accepted"
    if pr.problem is None:
        return f"{text} ({where})" if chk is not None else text
    return f"{text} (model: {pr.expected.describe()})"


def _key(pr: hc.Probe | None, change: hc.Change):
    if pr is None:
        return None
    o = pr.observed
    return (o.exc, change.named is not None and o.exc is not None and hc.names_argument(o.message, change.named))


def _probe(target: Target, change: hc.Change, arm: str, device: str) -> hc.Probe | None:
    em = target.release.release.entry(target.model_entry)
    if arm not in em.arms:
        return None
    mod = target.module(arm)
    try:
        if device != "cpu" and hc.unvalidated_on_device(mod, target.release.release, target.model_entry, arm,
                                                        change, device):
            return None  # never launch an illegal call a model lets through (module docstring)
        return hc.probe(getattr(mod, target.entry), mod, target.release.release, target.model_entry, arm,
                        [change], device)
    except hc.NotModelled:
        return None


def host_check_diff(old: Target, new: Target, device: str = "cpu", arms=None) -> dict:
    """{rows: [HostRow] (changes whose outcome differs), probes: n, same: n, misfits: [(side, change, arm, problem)]};
    arms: only these (default: every arm a change applies to)."""
    ems = [t.release.release.entry(t.model_entry) for t in (old, new)]
    covered = []
    for c in hc.CHANGES.values():
        if any(_covers(em, c) for em in ems):
            covered.append(c)
    groups: dict = defaultdict(list)
    misfits, probes, same = [], 0, 0
    for c in covered:
        for arm in c.arms:
            if arms is not None and arm not in arms:
                continue
            po, pn = _probe(old, c, arm, device), _probe(new, c, arm, device)
            if po is None and pn is None:
                continue
            probes += 1
            for side, t, pr in (("old", old, po), ("new", new, pn)):
                if pr is not None and not pr.ok:
                    misfits.append((side, t.name, c.id, arm, pr.problem or f"inputs changed: {pr.inputs_changed}"))
            if _key(po, c) == _key(pn, c):
                same += 1
                continue
            clause = next((p.expected.check.clause for p in (pn, po) if p is not None and p.expected.check), c.check)
            groups[(clause, c.id, _outcome(po, c), _outcome(pn, c))].append(arm)
    rows = [HostRow(k[0], k[1], k[2], k[3], arms) for k, arms in groups.items()]
    rows.sort(key=lambda r: (_clause_key(r.clause), r.change))
    return dict(rows=rows, probes=probes, same=same, misfits=misfits)


def _covers(em, change) -> bool:
    if not set(change.arms) & set(em.arms):
        return False
    try:
        hc.catch(em, change)
    except hc.NotModelled:
        return False
    return True


def _clause_key(clause: str):
    head = clause.rstrip("0123456789*.")
    num = clause[len(head):].split(".")[0]
    return (head, int(num) if num.isdigit() else 0, clause)


# ------------------------------------------------------------------ launches

OUTPUTS = (("y", "M4", None), ("k_cache", "M5", "k"), ("u_cache", "M5", "u"), ("g_cache", "M6", "g"),
           ("initial_state_source", "M7", "fold"), ("hist_len", "C2", None), ("cache_base", "C2", None))


def launch_diff(old: Target, new: Target, device: str, examples: int = 50, arms=None, Ts=(4, 8), seed: int = 0,
                geometries=None, on_example=lambda: None) -> dict:
    """{counts: {output: Counter(bit-identical|within tolerance|different)}, clauses, examples, seconds,
    different: [first cases that differ]}."""
    arms = tuple(arms) if arms else tuple(a for a in new.release.release.entry(new.model_entry).arms
                                          if a in old.release.release.entry(old.model_entry).arms)
    geometries = geometries or geometries_for(new)
    counts: dict = {name: Counter() for name, _, _ in OUTPUTS}
    counts["raised"] = Counter()
    differ: list = []
    t0 = time.monotonic()
    n = [0]

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(arms=arms, Ts=tuple(Ts), geometries=geometries))
    def body(case):
        on_example()
        n[0] += 1
        inputs = materialize(case, device)
        a = observe(old, case, device, inputs=clone_inputs(inputs))
        b = observe(new, case, device, inputs=clone_inputs(inputs))
        if (a.error is None) != (b.error is None) or (a.error is not None and type(a.error) is not type(b.error)):
            counts["raised"]["different"] += 1
            differ.append(dict(case=case.to_dict(), output="raised",
                               old=repr(a.error)[:200], new=repr(b.error)[:200]))
            return
        if a.error is not None:
            counts["raised"]["both raised " + type(a.error).__name__] += 1
            return
        live = inputs["initial_state_indices"].long() >= 0
        pairs = {name: ((a.output[live], b.output[live]) if name == "y"  # pad rows' output rows: unwritten (M8)
                        else (a.after[name], b.after[name])) for name, _, _ in OUTPUTS}
        differs = {name for name, (x, y) in pairs.items() if not bool(same_bits(x, y).all())}
        for name in pairs.keys() - differs:
            counts[name]["bit-identical"] += 1
        if not differs:
            return
        # both sides launched the same inputs: one float64 expectation judges both
        e = expectation(a)
        fa, fb = ({f.prop for f in check_oracle(o, e)} for o in (a, b))
        for name, clause, oracle_name in OUTPUTS:
            if name not in differs:
                continue
            bad = oracle_name is not None and any(p.startswith(f"oracle.{oracle_name}") for p in fa | fb)
            if oracle_name is None or bad:
                counts[name]["different"] += 1
                if len(differ) < 20:
                    differ.append(dict(case=case.to_dict(), output=name, old=sorted(fa), new=sorted(fb)))
            else:
                counts[name]["within tolerance"] += 1

    body()
    return dict(counts={k: dict(v) for k, v in counts.items()}, clauses={n: c for n, c, _ in OUTPUTS},
                examples=n[0], seconds=time.monotonic() - t0, different=differ, arms=list(arms), Ts=list(Ts),
                device=device)


# ------------------------------------------------------------------ report

def markdown(old: Target, new: Target, host: dict, launches: dict | None, host_device: str) -> str:
    lines = [f"# Release differential: {old.name} -> {new.name}", "",
             f"- old: `{old.path}` (model {old.release})",
             f"- new: `{new.path}` (model {new.release})", "",
             f"## Host checks ({host['probes']} single-change calls on {host_device} tensors; "
             f"{host['same']} behave the same, {len(host['rows'])} rows differ)", ""]
    if host["rows"]:
        lines += ["| clause | change | arms | old | new |", "|---|---|---|---|---|"]
        for r in host["rows"]:
            arms = "all" if len(r.arms) >= 5 else ", ".join(r.arms)
            lines.append(f"| {r.clause} | `{r.change}` | {arms} | {r.old} | {r.new} |")
    else:
        lines.append("No single change behaves differently.")
    if host["misfits"]:
        lines += ["", f"Calls that do not do what their own side's model says ({len(host['misfits'])}):", ""]
        lines += [f"- {side} ({name}) `{cid}` {arm}: {why}" for side, name, cid, arm, why in host["misfits"][:40]]
    lines.append("")
    if launches is None:
        lines.append("## Launches: not run (no device both sides launch on)")
    else:
        lines += [f"## Launches ({launches['examples']} drawn launches on {launches['device']}, arms "
                  f"{', '.join(launches['arms'])}, T {launches['Ts']}, {launches['seconds']:.0f} s)", "",
                  "| output | clause | bit-identical | within tolerance | different |", "|---|---|---|---|---|"]
        for name, clause, _ in OUTPUTS:
            c = launches["counts"].get(name, {})
            lines.append(f"| {name} | {clause} | {c.get('bit-identical', 0)} | {c.get('within tolerance', 0)} | "
                         f"{c.get('different', 0)} |")
        r = launches["counts"].get("raised", {})
        if r:
            lines.append("")
            lines.append("Launches that raised: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.items())))
    return "\n".join(lines) + "\n"


def to_json(host: dict, launches: dict | None) -> dict:
    return dict(host=dict(probes=host["probes"], same=host["same"],
                          rows=[r.__dict__ for r in host["rows"]],
                          misfits=[dict(side=s, target=t, change=c, arm=a, problem=p)
                                   for s, t, c, a, p in host["misfits"]]),
                launches=launches)
