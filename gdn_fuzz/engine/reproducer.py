"""A finding is its own reproducer: the launch that failed, as data, as text and as a test.

A property may launch something other than materialize(case) of the Case it was given: the
commit property sets restart_hist_on_flush=True and gives pad rows cursors, extremes puts a = 120
on v-head 0, routing launches a second time with another flush_min, each metamorphic relation
transforms the inputs.  Every check therefore attaches to its findings the launch it ran
(findings.Finding.launch, built by findings.launch_record), and this module reads it back:

Launch              the Case as it ran (materialize() uses its rows' cursors verbatim, pad rows'
                    included) + the named transformation of its inputs with its parameters
                    ("" when the launch is exactly materialize(case)).  to_dict()/from_dict()
                    is the JSON stored with a corpus entry ("launch") and sent by workers.
launch_inputs()     the keyword arguments of that launch, rebuilt from the Launch alone with the
                    same builders the checks use (TRANSFORMS).
effective_case()    the Case a property launches for a given Case, without running it.
finding_launch()    the Launch of a finding (or of a campaign finding / corpus entry).
explain()           what a CLI prints for a finding: the effective Case, the transformation, and
                    for the launch property's oracle findings on a routing or ring edge, which
                    neighbouring cursors pass (edge_neighbours; a few launches, once per finding).
case_literal()      a readable Python literal of a Case (Case(...)/Row(...)/Regime(...)).
emit_test()         a standalone pytest file that fails while a corpus entry's bug is present
                    and passes once it is fixed (`gdn-fuzz replay ENTRY --emit-test PATH`).

Every property's check is idempotent on its effective Case: check(effective_case(prop, c)) gives
the findings of check(c), with the same launch, so the printed Case is one the check runs as is.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from gdn_fuzz.case import W_RING, Case, Regime, materialize, row_edges
from gdn_fuzz.findings import Finding, TRANSFORM_NAMES, case_changes, launch_record, parse_launch
from gdn_fuzz.engine.isolation import Worker
from gdn_fuzz.properties import get_property
from gdn_fuzz.properties.contract import commit_case, gate_inputs, guard_case, guard_inputs
from gdn_fuzz.properties.relations import METAMORPHIC_LAUNCHES, metamorphic_inputs, output_inputs, override_inputs

OVERRIDABLE = ("flush_min", "restart_hist_on_flush")  # scalar keywords the "override" transformation may set


# ------------------------------------------------------------------ transformations


def _override(case, inputs, params, device):
    bad = sorted(set(params) - set(OVERRIDABLE))
    if bad:
        raise ValueError(f"launch.params of 'override' may set only {', '.join(OVERRIDABLE)}; got {', '.join(bad)}")
    return override_inputs(inputs, params)


def _output(case, inputs, params, device):
    return output_inputs(inputs, params)


def _gate(case, inputs, params, device):
    if not 0 <= int(params["v_head"]) < case.HV:
        raise ValueError(f"launch.params.v_head={params['v_head']!r} is out of range; legal: 0 <= v_head < HV={case.HV}")
    return gate_inputs(inputs, params)


def _guard(case, inputs, params, device):
    return guard_inputs(case, params["scenario"], device)


def _metamorphic(name):
    def build(case, inputs, params, device):
        return metamorphic_inputs(name, case, inputs, params)

    return build


def _transforms() -> dict:
    out = {"override": _override, "output": _output, "extremes.gate": _gate, "guard": _guard}
    out.update({f"metamorphic.{n}": _metamorphic(n) for n in METAMORPHIC_LAUNCHES})
    return out


# name -> build(case, materialize(case), params, device) -> the launch's keyword arguments
TRANSFORMS = _transforms()
if set(TRANSFORMS) != set(TRANSFORM_NAMES):  # the names a stored launch may use (checks) must be these
    raise RuntimeError(f"findings.TRANSFORM_NAMES {sorted(TRANSFORM_NAMES)} != reproducer.TRANSFORMS {sorted(TRANSFORMS)}")


# ------------------------------------------------------------------ Launch


@dataclass(frozen=True)
class Launch:
    """One launch: materialize(case), then the transformation `transform` with `params`."""

    case: Case
    transform: str = ""
    params: dict = field(default_factory=dict)
    note: str = ""
    changes: tuple = ()  # how `case` differs from the Case the property was given (words)

    def to_dict(self) -> dict:
        return dict(case=self.case.to_dict(), transform=self.transform, params=dict(self.params), note=self.note,
                    changes=list(self.changes))

    @classmethod
    def from_dict(cls, d) -> "Launch":
        """The Launch stored as `d`; ValueError naming the field on anything malformed (findings.parse_launch)."""
        case, transform, params, note, changes = parse_launch(d)
        return cls(case=case, transform=transform, params=params, note=note, changes=changes)

    @property
    def plain(self) -> bool:
        """True when the launch is exactly materialize(case)."""
        return not self.transform

    def inputs(self, device="cpu") -> dict:
        """The keyword arguments of the launch (launch_inputs)."""
        return launch_inputs(self, device)

    def transform_text(self) -> str:
        if not self.transform:
            return "none: the launch is materialize(case) as printed"
        ps = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"{self.transform}({ps})"

    def describe(self) -> str:
        """The Case as it ran, then how the launch was made from it."""
        lines = [self.case.describe()]
        if self.changes:
            lines.append("  set by the property (not drawn): " + ", ".join(self.changes))
        lines.append("  transformation: " + self.transform_text())
        if self.note:
            lines.append("  launch: " + self.note)
        return "\n".join(lines)


def launch_inputs(launch: Launch, device="cpu") -> dict:
    """The keyword arguments of `launch`: materialize(launch.case), transformed as it names
    (the same builders the checks use, so the tensors are bitwise those that ran)."""
    inputs = materialize(launch.case, device)
    if not launch.transform:
        return inputs
    return TRANSFORMS[launch.transform](launch.case, inputs, dict(launch.params), device)


def effective_case(prop: str, case: Case) -> Case:
    """The Case property `prop` launches for `case` (commit: restart_hist_on_flush=True and pad
    rows' cursors; guards: restart_hist_on_flush=False; every other property: `case`)."""
    if prop == "commit":
        return commit_case(case)
    if prop == "guards":
        return guard_case(case)
    return case


def finding_launch(f, prop: str | None = None, case: Case | None = None, signature: str | None = None) -> Launch:
    """The Launch of a finding.

    f: a findings.Finding (its .launch), or a campaign finding / a list of findings (the launch of
    the finding with `signature`, else of the first one that has a launch).  A finding without a
    launch (a crash or a hang reported by the worker's parent) gets the effective Case of
    (prop, case) with no transformation."""
    findings = [f] if isinstance(f, Finding) else list(getattr(f, "findings", f) or [])
    prop = prop if prop is not None else getattr(f, "prop", None)
    case = case if case is not None else getattr(f, "case", None)
    signature = signature if signature is not None else getattr(f, "signature", None)
    if callable(signature):
        signature = signature()
    pick = [x for x in findings if x.launch and x.signature() == signature] or [x for x in findings if x.launch]
    if pick:
        return Launch.from_dict(pick[0].launch)
    if case is None:
        raise ValueError("no finding carries a launch; pass the case")
    eff = effective_case(prop or "", case)
    return Launch(case=eff, changes=tuple(case_changes(case, eff)))


def entry_launch(entry) -> Launch:
    """The Launch of a corpus entry: its stored "launch", else derived from its case and property
    (entries written before launches were stored)."""
    if getattr(entry, "launch", None):
        return Launch.from_dict(entry.launch)
    eff = effective_case(entry.prop, entry.case)
    return Launch(case=eff, changes=tuple(case_changes(entry.case, eff)))


# ------------------------------------------------------------------ edges and neighbours


def neighbours(case: Case, i: int) -> list[tuple[str, Case]]:
    """(label, case) with row i's P moved by +/-1 (0 <= P <= 16) and its base by +/-1 (mod 32)."""
    r = case.rows[i]
    out = []

    def moved(**kw):
        rows = list(case.rows)
        rows[i] = dataclasses.replace(r, **kw)
        return dataclasses.replace(case, rows=tuple(rows))

    for P in (r.hist_len - 1, r.hist_len + 1):
        if 0 <= P <= W_RING:
            c = moved(hist_len=P)
            out.append((f"P={P} ({c.row_kind(c.rows[i])})", c))
    for b in ((r.cache_base - 1) & 31, (r.cache_base + 1) & 31):
        out.append((f"base={b}", moved(cache_base=b)))
    return out


def edge_neighbours(target, prop: str, case: Case, finding: Finding, device="cpu", *, check=None,
                    isolate: bool = False) -> str | None:
    """For a finding of the launch property's oracle on a row at a routing or ring edge (P = flush_min,
    flush_min - 1, 0 or 16, or a wrapping window): run the case with that row's P and base moved by
    +/-1 (at most 4 launches) and say which pass, so an off-by-one reads as one.  None when the
    finding is not such a finding.  check(case) -> findings (default: the property's check against
    `target`, in a worker process when isolate=True)."""
    if prop != "launch" or not finding.prop.startswith("oracle.") or finding.row is None:
        return None
    i = finding.row
    if not 0 <= i < case.B:
        return None
    edges = row_edges(case, i)
    if not edges:
        return None
    sig = finding.signature()
    worker = None
    if check is None:
        if isolate:
            worker = Worker(target.name, device, name="neighbours")

            def check(c):
                return worker.check(prop, c)
        else:
            p = get_property(prop)

            def check(c):
                return p.check(target, c, device)
    results = []
    try:
        for label, c in neighbours(case, i):
            sigs = sorted({f.signature() for f in check(c)})
            if not sigs:
                results.append(f"{label}: passes")
            elif sig in sigs:
                results.append(f"{label}: fails the same way")
            else:
                results.append(f"{label}: fails differently ({'; '.join(sigs)})")
    finally:
        if worker is not None:
            worker.close()
    r = case.rows[i]
    return (f"edge: row {i} (P={r.hist_len}, base={r.cache_base}, {case.row_kind(r)}) sits at " + "; ".join(edges)
            + f". Row {i} moved by one, all else as printed: " + ", ".join(results))


def explain(prop: str, case: Case, findings, signature: str | None = None, target=None, device="cpu", *,
            isolate: bool = False, check=None) -> str:
    """What to print for a finding: the Case as it ran and the launch made from it; with a target,
    also the neighbours of a launch-property oracle finding at an edge (edge_neighbours; check: how they are
    checked, as there: a running campaign passes its own, Campaign.check_aside, and isolate is then unused).

    This is the campaign CLI's hook: print explain(f.prop, f.case, f.findings, f.signature,
    target, device) where it printed f.case.describe()."""
    findings = list(findings or [])
    launch = finding_launch(findings, prop=prop, case=case, signature=signature)
    lines = [launch.describe()]
    if target is not None:
        pick = [f for f in findings if f.signature() == signature] or findings
        for f in pick[:1]:
            try:
                n = edge_neighbours(target, prop, launch.case, f, device, isolate=isolate, check=check)
            except Exception as e:  # noqa: BLE001 - the neighbours are a courtesy; the finding stands
                n = f"edge: the neighbours could not be run ({type(e).__name__}: {e})"
            if n:
                lines.append("  " + n)
    return "\n".join(lines)


# ------------------------------------------------------------------ the finding as Python


def _lit(x) -> str:
    return json.dumps(x) if isinstance(x, str) else repr(x)


def case_literal(case: Case, indent: str = "") -> str:
    """A readable Python literal of `case` (fields at their defaults left out, one row a line with
    its route and edges as a comment); eval() with Case, Row, Regime in scope gives `case` back."""
    i1, i2 = indent + "    ", indent + "        "
    head = [f"arm={_lit(case.arm)}", f"T={case.T}", f"H={case.H}", f"HV={case.HV}", f"pool={case.pool}",
            f"seed={case.seed}"]
    lines = ["Case(", i1 + ", ".join(head) + ","]
    fm = f"flush_min={case.flush_min!r},"
    lines.append(i1 + fm + (f"  # {case.fmin} in force (17 - T)" if case.flush_min is None else ""))
    lines.append(i1 + f"restart_hist_on_flush={case.restart_hist_on_flush!r},")
    lines.append(i1 + "rows=(")
    for i, r in enumerate(case.rows):
        tags = [case.row_kind(r)] + row_edges(case, i)
        lines.append(i2 + f"Row(slot={r.slot}, hist_len={r.hist_len}, cache_base={r.cache_base}),  # row {i}: "
                     + "; ".join(tags))
    lines.append(i1 + "),")
    reg = [f"{f.name}={_lit(getattr(case.regime, f.name))}" for f in dataclasses.fields(Regime)
           if getattr(case.regime, f.name) != f.default]
    if reg:
        lines.append(i1 + "regime=Regime(" + ", ".join(reg) + "),")
    for name, default in (("K", 128), ("V", 128), ("draws", "cpu")):
        if getattr(case, name) != default:
            lines.append(i1 + f"{name}={_lit(getattr(case, name))},")
    lines.append(indent + ")")
    return "\n".join(lines)


TARGET_ENV = "GDN_FUZZ_REPRO_TARGET"
DEVICE_ENV = "GDN_FUZZ_REPRO_DEVICE"


def _comment(text: str, prefix: str = "") -> str:
    return "\n".join((prefix + ln).rstrip() for ln in str(text).splitlines())


def emit_test(entry, path=None, *, target: str | None = None) -> str:
    """The text of a standalone pytest file reproducing corpus entry `entry` (written to `path`
    when given).  It builds the entry's effective Case as a literal, runs the property's check on
    the target (${TARGET_ENV}, default `target` or the entry's own) and asserts the entry's signature
    is NOT among the findings: it fails while the bug is present and passes once it is fixed.  A
    commit entry also gets a plain launch of the Case whose committed cursors are checked against C2.
    The device defaults to the entry's (cuda for a GPU target or a Case drawn by the CUDA generator, else
    cpu; ${DEVICE_ENV} overrides).  The test skips, saying why, where there is no such device or the target
    cannot be loaded (TargetUnavailable), and it fails when any finding is a raised exception other than
    the entry's own signature: a target that refused the launch has not shown that the bug is fixed."""

    launch = entry_launch(entry)
    prop = get_property(entry.prop)
    tname = target or entry.target
    # the device the entry's launch needs: a GPU target's, or a Case drawn by the CUDA generator (Case.draws)
    dname = "cuda" if entry.needs_gpu or getattr(launch.case, "draws", "cpu") == "cuda" else "cpu"
    name = entry.path.name if getattr(entry, "path", None) is not None else entry.filename()
    recorded = "\n".join("  " + ln for f in entry.findings for ln in str(f).splitlines()) or "  -"
    desc = "\n".join("  " + ln for ln in launch.describe().splitlines())
    doc = (f'"""Reproducer of a gdn_fuzz finding, written by `gdn-fuzz replay {name} --emit-test`.\n\n'
           f"corpus entry: {name} (status {entry.status}, recorded on target {entry.target})\n"
           f"property:     {entry.prop} ({prop.clauses}): {prop.doc}\n"
           f"signature:    {entry.signature}\n"
           f"recorded findings:\n{recorded}\n"
           f"the launch that failed:\n{desc}\n\n"
           "CASE is that launch's Case (materialize(CASE) gives its tensors and cursors, pad rows' included);\n"
           "the property's check runs it as written, plus TRANSFORM where it is not a plain launch.\n"
           "The test fails while the bug is present and passes once it is fixed.  It skips, saying why, where\n"
           "the target cannot be loaded or the device is missing, and it fails (never passes) when the target\n"
           "raised instead of running the launch: then it cannot tell whether the bug is fixed.\n"
           f"Target: ${TARGET_ENV} (default {tname}); device: ${DEVICE_ENV} (default {dname}).\n"
           '"""')
    body = doc[3:-3].replace("\\", "\\\\").replace('"""', "'''")  # a docstring that stays one
    doc = '"""' + body + '"""'
    src = [doc, "", "import os", "", "import pytest", "import torch", "",
           "from gdn_fuzz.case import Case, Regime, Row, materialize",
           "from gdn_fuzz.properties import get_property", "from gdn_fuzz.targets import TargetUnavailable, get_target",
           "",
           f"TARGET = os.environ.get({TARGET_ENV!r}) or {tname!r}",
           f"DEVICE = os.environ.get({DEVICE_ENV!r}) or {dname!r}",
           f"PROPERTY = {entry.prop!r}",
           f"SIGNATURE = {entry.signature!r}",
           "# what the check launches besides materialize(CASE) (gdn_fuzz.engine.reproducer.TRANSFORMS; '' = nothing)",
           f"TRANSFORM = {launch.transform!r}",
           f"PARAMS = {json.dumps(launch.params, sort_keys=True)}",
           "", "CASE = " + case_literal(launch.case), "", "",
           "def _target():",
           '    """The target, or a skip saying why it cannot run here (not installed, no such device)."""',
           "    if DEVICE.startswith('cuda') and not torch.cuda.is_available():",
           f"        pytest.skip(f'the launch runs on {{DEVICE}} and this machine has no CUDA device (set {DEVICE_ENV} '",
           "                    'to run it elsewhere; a GPU target refuses CPU tensors)')",
           "    try:",
           "        target = get_target(TARGET)",
           "        target.module(CASE.arm)",
           "    except TargetUnavailable as e:",
           "        pytest.skip(f'target {TARGET} cannot be loaded here: {e}')",
           "    return target",
           "", "",
           "def test_finding_is_fixed():",
           f'    """{entry.prop} on CASE must not show {entry.signature.replace(chr(34), chr(39))}."""',
           "    found = get_property(PROPERTY).check(_target(), CASE.validate(), DEVICE)",
           "    signatures = sorted({f.signature() for f in found})",
           "    assert SIGNATURE not in signatures, (f'still reproduces on {TARGET}:\\n' + CASE.describe() + '\\n'",
           "                                         + '\\n'.join(str(f) for f in found))",
           "    # the signature is gone, but only a launch that ran can show a fix: a target that raised instead",
           "    refused = [str(f) for f in found if f.outcome.startswith('raised')]",
           "    assert not refused, (f'{TARGET} on {DEVICE} raised instead of running the launch, so this cannot tell '",
           "                         'whether the bug is fixed:\\n' + '\\n'.join(refused))", ""]
    if entry.prop == "commit" and launch.case.restart_hist_on_flush and entry.signature.startswith("commit.cursors"):
        src += ["",
                "def test_plain_launch_commits_cursors():",
                '    """C2 on a plain launch of CASE (restart_hist_on_flush=True, pad rows included): flush rows',
                '    (P >= flush_min) get base = (base + P) & 31 and P = 0; every other row keeps its cursors."""',
                "    target = _target()",
                "    kw = materialize(CASE, DEVICE)",
                "    P = [r.hist_len for r in CASE.rows]",
                "    base = [r.cache_base for r in CASE.rows]",
                "    fmin = CASE.fmin",
                "    target.launch(CASE.arm, **kw)",
                "    want_len = [0 if p >= fmin else p for p in P]",
                "    want_base = [(b + p) & 31 if p >= fmin else b for p, b in zip(P, base)]",
                "    assert (kw['hist_len'].tolist(), kw['cache_base'].tolist()) == (want_len, want_base)", ""]
    text = "\n".join(src)
    if path is not None:
        from pathlib import Path

        Path(path).write_text(text)
    return text


__all__ = ["Launch", "TRANSFORMS", "launch_inputs", "launch_record", "effective_case", "finding_launch",
           "entry_launch", "row_edges", "neighbours", "edge_neighbours", "explain", "case_literal", "emit_test"]
