"""Findings: how a target disagreed with the contract, the signature that names a bug, and the
launch that showed it (a JSON record the corpus stores and the reproducer reads).

signature() = check id, clause, outcome class and route family: it keys deduplication, corpus
entries and known bugs (docs/triage.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gdn_fuzz.case import Case
from gdn_fuzz.prefix_case import load_case


_NUM = re.compile(r"(?<![A-Za-z_\d.])(?:0x[0-9a-fA-F]+|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


_PATH = re.compile(r"(?:/[\w.@+-]+)+")


def normalize_message(text: str, limit: int = 160) -> str:
    """An exception message reduced to what identifies it: its first non-empty line, file
    paths as <path>, numbers (shapes, addresses, values) as #, whitespace collapsed."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    line = _PATH.sub("<path>", line)
    line = _NUM.sub("#", line)
    return re.sub(r"\s+", " ", line)[:limit]


def raised(exc: BaseException | str, type_name: str | None = None) -> str:
    """The outcome class of an exception: 'raised <Type>: <normalized message>'."""
    if isinstance(exc, BaseException):
        type_name, text = type(exc).__name__, str(exc)
    else:
        text = exc
    msg = normalize_message(text)
    return f"raised {type_name}" + (f": {msg}" if msg else "")


# outcome classes of findings that are not exceptions
OUT_OF_TOLERANCE = "out of tolerance"


NON_FINITE = "non-finite"


BITS_DIFFER = "bits differ"


WRONG_VALUE = "wrong value"  # an exact integer or identity expectation (cursors, object identity)


@dataclass
class Finding:
    """One way the target disagreed with the contract.

    prop     the check id, e.g. "oracle.y", "writes.outside.u_cache", "guard.H6"
    clause   the contract clause id, e.g. "M4"
    outcome  the outcome class: raised <Type>: <normalized message> | out of tolerance |
             non-finite | bits differ | wrong value | crash ... | hang
    family   the route family where it tells bugs apart ("flush" / "verify" rows), else ""
    value    a number that shows the failure, in `unit` (e.g. "relative error per (row, head)
             vs the float64 oracle"); tol: the largest value allowed, made up as `bound` says
             (e.g. "4 x u(IO=bfloat16)"); no tol: an exact comparison
    launch   the launch that ran (findings.launch_record): the Case as it actually ran (the
             property may derive it from the Case it was given: commit's cursors), and the named
             transformation with its parameters where the launch is not a plain
             materialize(case) (extremes' gate, routing's second flush_min, a metamorphic
             relation).  JSON data; gdn_fuzz.engine.reproducer.Launch reads it.

    signature() = check id, clause, outcome and family: two different bugs never share one,
    the same bug found again (another seed, row, arm) does.  It keys deduplication, corpus
    entries and known bugs.  Neither the message, the numbers nor the launch are part of it.
    """

    prop: str
    clause: str
    message: str
    row: int | None = None
    head: int | None = None
    value: float | None = None
    tol: float | None = None
    outcome: str = ""
    family: str = ""
    unit: str = ""
    bound: str = ""
    launch: dict | None = None

    def signature(self) -> str:
        s = f"{self.prop} [{self.clause}] {self.outcome or WRONG_VALUE}"
        return s + (f" ({self.family} rows)" if self.family else "")

    def key(self) -> tuple:
        """What makes two findings 'the same failure' for deduplication: the signature."""
        return (self.signature(),)

    def numbers(self) -> str:
        """The finding's number with its unit, e.g. "relative error per (row, head) vs the float64
        oracle: 14.4, allowed 1.53e-05 = 2^-16"."""
        if self.value is None:
            return ""
        if not self.unit:  # findings of other modules that give no unit keep their old form
            return f"{self.value}" if self.tol is None else f"got {self.value:.3e}, allowed {self.tol:.3e}"
        s = f"{self.unit}: {_num(self.value)}"
        if self.tol is not None:
            s += f", allowed {_num(self.tol)}" + (f" = {self.bound}" if self.bound else "")
        elif self.bound:
            s += f"; {self.bound}"
        return s

    def __str__(self) -> str:
        where = "" if self.row is None else f" row {self.row}" + ("" if self.head is None else f" head {self.head}")
        num = self.numbers()
        s = f"[{self.clause}] {self.prop}{where}: {self.message}" + (f" ({num})" if num else "")
        ran = launch_summary(self.launch)
        return s + (f"\n    ran: {ran}" if ran else "")


def _num(x: float) -> str:
    return f"{x:.3g}"


def case_changes(given: Case, ran: Case) -> list[str]:
    """How the Case that ran differs from the Case a property was given, in words (empty: the same)."""
    if given == ran:
        return []
    out = []
    for name in ("arm", "T", "H", "HV", "K", "V", "pool", "seed", "flush_min", "restart_hist_on_flush", "regime",
                 "draws"):
        a, b = getattr(given, name), getattr(ran, name)
        if a != b:
            out.append(f"{name}={b!r}" if name != "flush_min" else f"flush_min={ran.fmin}")
    if len(given.rows) != len(ran.rows):
        out.append(f"{len(ran.rows)} rows")
    else:
        for i, (a, b) in enumerate(zip(given.rows, ran.rows)):
            if a != b:
                kind = ran.row_kind(b)
                out.append(f"row {i} ({kind}): slot={b.slot} P={b.hist_len} base={b.cache_base}")
    return out


def launch_record(case: Case, transform: str = "", params: dict | None = None, note: str = "",
                  given: Case | None = None) -> dict:
    """The JSON description of a launch a finding comes from (Finding.launch).

    case       the Case as it ran: materialize(case) gives its tensors and cursors (rows' cursors
               are used verbatim, pad rows' included)
    transform  "" when the launch is exactly materialize(case); else the name of the
               transformation applied to those inputs (gdn_fuzz.engine.reproducer.TRANSFORMS) ...
    params     ... with its parameters (JSON values)
    note       the launch in words ("a = 120 on v-head 0, every row and token")
    given      the Case the property was given, when the launch's Case differs from it: the
               differences are listed under "changes" (what a reader of the given Case must know)
    """
    rec = dict(case=case.to_dict(), transform=transform, params=dict(params or {}), note=note, changes=[])
    if given is not None:
        rec["changes"] = case_changes(given, case)
    return rec


# The transformations a stored launch may name (gdn_fuzz.engine.reproducer.TRANSFORMS builds each; it
# checks at import that the two lists agree).  Kept here, as data, so that reading a corpus entry
# needs no import of the properties.
LAUNCH_KEYS = ("case", "transform", "params", "note", "changes")


METAMORPHIC_TRANSFORMS = ("batch_perm", "slot_move", "pool_relabel", "isolation", "rotation", "strided_qkv",
                          "strided_ab", "strided_pool")


TRANSFORM_NAMES = ("override", "output", "extremes.gate", "guard") + tuple(
    f"metamorphic.{n}" for n in METAMORPHIC_TRANSFORMS)


def parse_launch(d) -> tuple:
    """(case, transform, params, note, changes) of a stored launch; ValueError naming the field on
    anything malformed (the case is validated by Case.from_dict before anything is allocated)."""
    if not isinstance(d, dict):
        raise ValueError(f"launch must be an object, got {type(d).__name__}")
    unknown = sorted(str(k) for k in d if k not in LAUNCH_KEYS)
    if unknown:
        raise ValueError(f"launch has unknown field(s) {', '.join(unknown)}; known: {', '.join(LAUNCH_KEYS)}")
    if "case" not in d:
        raise ValueError("launch lacks its case")
    case = load_case(d["case"])
    transform = d.get("transform", "") or ""
    if not isinstance(transform, str) or (transform and transform not in TRANSFORM_NAMES):
        raise ValueError(f"launch.transform={transform!r} is unknown; use '' or one of {', '.join(TRANSFORM_NAMES)}")
    params = d.get("params", {}) or {}
    if not isinstance(params, dict):
        raise ValueError(f"launch.params must be an object, got {type(params).__name__}")
    note = d.get("note", "") or ""
    changes = d.get("changes", []) or []
    if not isinstance(note, str) or not isinstance(changes, (list, tuple)) or not all(
            isinstance(c, str) for c in changes):
        raise ValueError("launch.note must be a string and launch.changes a list of strings")
    return case, transform, params, note, tuple(changes)


def launch_summary(launch: dict | None) -> str:
    """One line: how the launch differs from a plain launch of the Case the property was given
    ("" when it does not): the Case fields the property set, then the transformation."""
    if not launch:
        return ""
    parts = []
    if launch.get("changes"):
        parts.append(", ".join(launch["changes"]) + " (set by the property, not drawn)")
    if launch.get("transform"):
        parts.append(launch.get("note") or (launch["transform"] + "(" + ", ".join(
            f"{k}={v!r}" for k, v in sorted((launch.get("params") or {}).items())) + ")"))
    elif launch.get("note"):
        parts.append(launch["note"])
    return "; ".join(parts)


def attach(findings, record: dict):
    """Give every finding without a launch description this one; returns `findings` (same object)."""
    for f in findings:
        if f.launch is None:
            f.launch = record
    return findings


class Findings(list):
    """A list of Findings that may also carry the launch's error metrics (for reports).

    metrics: {output: [worst error / magnitude per batch row, None for rows without it]}
    """

    metrics: dict | None = None



# ------------------------------------------------------------------ findings grouped by bug


def _case_size(case: dict) -> tuple:
    """How big a shrunk case is (Hypothesis shrinks toward small ones): live rows, batch rows, T, the JSON."""
    rows = case.get("rows") or case.get("requests") or []
    live = [r for r in rows if isinstance(r, dict) and r.get("slot", 0) >= 0]
    return len(live), len(rows), case.get("T", 0), len(repr(sorted(case.items())))


_WRAPPED = re.compile(r"^[a-z][a-z_]*\.(?=(?:oracle|writes)[.\s])")


def symptom(signature: str) -> str:
    """A signature without the name of the property that made its launch, where the check is the launch check's
    (oracle.*, writes.*): "extremes.oracle.fold [M7] out of tolerance (flush rows)" is the launch property's
    "oracle.fold [M7] out of tolerance (flush rows)" seen through the extremes property's gates.  Others as given."""
    return _WRAPPED.sub("", signature)


_RAISED = re.compile(r"\[H\*\] (raised .+)$")
# a relation's bit check of a buffer (relations.BUFFER_CLAUSE) and the oracle check of the output it holds; not
# determinism's (a launch against itself: a race, not a wrong value)
_BITS = re.compile(r"^(?!determinism\.)[a-z][a-z_.]*\.(g_cache|k_cache|u_cache|initial_state_source|y)_bits "
                   r"(\[[A-Z]+[0-9]*\])")
_BITS_OUTPUT = {"g_cache": "g", "k_cache": "k", "u_cache": "u", "initial_state_source": "fold", "y": "y"}


def check_clause(signature: str, buffers: bool = True) -> str:
    """What links signatures of one bug: symptom()'s check id and clause ("oracle.u [M5]" of "extremes.oracle.u [M5]
    non-finite (flush rows)"), or, for a legal launch that raised (clause H*), the exception and its normalized
    message, whichever property's launch it was ("launch [H*] raised IndexError: index # is out of bounds ..." and
    "determinism.launch [H*] raised IndexError: index # is out of bounds ...").  buffers: a relation's bit check
    of a buffer under the buffer's clause is the oracle check of the output it holds ("routing.g_cache_bits [M6]"
    and "metamorphic.rotation.g_cache_bits [M6]" are "oracle.g [M6]": the appended g records wrong, against a twin
    launch or against the oracle); False: as written (the rule before issue 33's last part)."""
    m = _RAISED.search(signature)
    if m:
        return m.group(1)
    m = _BITS.match(signature) if buffers else None
    if m:
        return f"oracle.{_BITS_OUTPUT[m.group(1)]} {m.group(2)}"
    sym = symptom(signature)
    return sym[:sym.index("]") + 1] if "]" in sym else sym


_NODE = "\x00"  # group_findings' nodes for a check and clause and for a case (no signature starts with NUL)


def group_findings(records: list[dict], shown: bool = True, buffers: bool = True) -> list[dict]:
    """The new findings of a campaign grouped by bug.  Two signatures are one group when
      1. one's shrunk launch also showed the other (`launch_signatures`: every signature of the check of that
         launch), or
      2. their shrunk cases are the same case, or
      3. they are one check of one clause (check_clause(): on launches of two properties, on flush and on verify
         rows, out of tolerance and non-finite; a legal launch that raised one exception, under any property), or
      4. their shrunk launches showed one check of one clause, filed as a finding or not (the two shrunk launches of
         a broken anchor, one flush row and one verify row, both break oracle.u [M5]);
      5. in 3 and 4, a relation's bit check of a buffer reads as the oracle check of the output it holds
         (check_clause's `buffers`).
    The groups are the connected components of those links (a planted one-line edit that breaks y, u and the fold
    shows all three on its minimal launch: one group, three symptoms).  Links 3-5 can join two bugs that break one
    output on two paths: both stay listed, as symptoms of one group.

    records: CampaignFinding.to_record() dicts (signature, case, launch_signatures; a record without
    launch_signatures links only through its case and its own check and clause).  shown=False and buffers=False:
    the rule before issue 33's last part (links 1-3 only; the grouping study compares the two).  Returns one dict
    per group, largest first: `symptoms`, the signatures, most specific first (the one whose shrunk launch showed
    the fewest other signatures of the run, then the smallest shrunk case, then by name), `headline` (the first)
    and `records` (the same order).  Grouping is presentation only: every signature stays a finding of its own (its
    own corpus entry and exit status)."""
    recs = {r["signature"]: r for r in records}
    parent = {s: s for s in recs}  # union-find over the signatures and one node per check and clause, per case

    def root(s):
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    def link(a, node):
        parent.setdefault(node, node)
        ra, rb = root(a), root(node)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for s, r in recs.items():
        others = r.get("launch_signatures") or ()
        for x in (s, *(others if shown else [o for o in others if o in recs])):
            link(s, _NODE + "clause " + check_clause(x, buffers))
        if r.get("case"):  # findings without a case share nothing by that
            link(s, _NODE + "case " + repr(sorted(r["case"].items())))
    members: dict[str, list[str]] = {}
    for s in recs:
        members.setdefault(root(s), []).append(s)  # the nodes are not findings: only signatures listed

    def specific(s):
        also = [x for x in recs[s].get("launch_signatures") or () if x in recs and x != s]
        return len(also), _case_size(recs[s].get("case") or {}), s

    groups = []
    for sigs in members.values():
        sigs.sort(key=specific)
        groups.append(dict(headline=sigs[0], symptoms=sigs, records=[recs[s] for s in sigs]))
    groups.sort(key=lambda g: (-len(g["symptoms"]), g["headline"]))
    return groups


GROUPING_RULE = ("symptoms that share a shrunk launch, or that are, or whose shrunk launches showed, one check and "
                 "clause (on other rows, under another property, failing otherwise, or a buffer's bits against a twin "
                 "launch), are one bug")  # group_findings' links, in words


def groups_record(groups: list[dict]) -> list[dict]:
    """The groups as a campaign's JSON record keeps them: headline and symptoms (the records are there already)."""
    return [dict(headline=g["headline"], symptoms=g["symptoms"]) for g in groups]


def groups_line(groups: list[dict]) -> str:
    """One line for a run's end: 'N bug(s) (S symptoms ...): headline (+k: a; b), ...' ('' without findings)."""
    if not groups:
        return ""
    n = sum(len(g["symptoms"]) for g in groups)
    parts = []
    for g in groups:
        more = g["symptoms"][1:]
        parts.append(g["headline"] + (f" (+{len(more)}: {'; '.join(more)})" if more else ""))
    head = f"{len(groups)} bug{'s' if len(groups) != 1 else ''}, {n} symptom{'s' if n != 1 else ''} ({GROUPING_RULE})"
    return head + ": " + " | ".join(parts)
