"""The regression corpus: one readable JSON entry per distinct failure.

An entry holds the shrunk Case (geometry, arm, rows, cursors, seed, value regime: the
tensors are regenerated from the seed), the launch that failed ("launch": the Case as the
property ran it and the transformation of its inputs, gdn_fuzz.engine.reproducer.Launch; absent in
entries written before it was stored), the failure's signature (findings.Finding.signature:
check id, clause, outcome class, route family), every finding of that case, the target and
the versions it ran with, the date, and whether it is an `open` bug (a known outcome: replayed
as a strict xfail that must reproduce the same signature; campaigns and property tests count it
and search on) or a regression `guard` (must pass).

File names are `<property>-<hash>.json`, the hash taken over (property, target, signature),
so the same failure found twice - by another campaign, another seed, another xdist worker -
lands on the same name and is stored once, and two different failures never share one.
Writes go to a hidden temporary file in the same folder, then os.replace(): readers never see
half an entry (entries() skips hidden files), and concurrent writers of one entry leave one
whole file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gdn_fuzz.environment import dist_version, write_atomic
from gdn_fuzz.case import Case
from gdn_fuzz.prefix_case import load_case
from gdn_fuzz.findings import parse_launch
from gdn_fuzz.engine.isolation import Worker
from gdn_fuzz.properties import get_property
from gdn_fuzz.targets import get_target, releases
from gdn_fuzz.targets.mutants import CATALOGUE, get_mutant

FORMAT = "gdn_fuzz.corpus/2"
ALLOW_PATHS_ENV = "GDN_FUZZ_ALLOW_TARGET_PATHS"
BUILTIN_TARGETS = ("reference", "production", "sm100")
CORPUS_ENV = "GDN_FUZZ_CORPUS"
READONLY_ENV = "GDN_FUZZ_CORPUS_READONLY"


class CorpusError(ValueError):
    """A corpus entry that cannot be read: the message names the file and what is wrong."""


@dataclass
class Entry:
    case: Case
    prop: str
    findings: list[str]
    keys: list[tuple[str, str]]  # (check, clause) of each finding
    target: str
    signature: str = ""  # the failure this entry stands for (findings.Finding.signature)
    signatures: list[str] = field(default_factory=list)  # every finding's signature on this case
    status: str = "open"  # open | guard
    reason: str = ""
    versions: dict = field(default_factory=dict)
    date: str = ""
    path: Path | None = None
    launch: dict | None = None  # the launch that failed (findings.Finding.launch; gdn_fuzz.engine.reproducer.Launch)

    @property
    def needs_gpu(self) -> bool:
        return released_name(self.target) in ("production", "sm100") or (
            self.target.startswith("mutant:") and _mutant_needs_gpu(self.target))

    @property
    def clauses(self) -> list[str]:
        return sorted({c for _, c in self.keys})

    def ident(self) -> str:
        ident = json.dumps([self.prop, self.target, self.signature], sort_keys=True)
        return hashlib.sha256(ident.encode()).hexdigest()[:16]

    def filename(self) -> str:
        return f"{self.prop}-{self.ident()}.json"

    def to_dict(self) -> dict:
        d = dict(format=FORMAT, property=self.prop, signature=self.signature, signatures=self.signatures,
                 clauses=self.clauses, status=self.status, reason=self.reason, target=self.target,
                 needs_gpu=self.needs_gpu, findings=self.findings, keys=[list(k) for k in self.keys],
                 versions=self.versions, date=self.date, case=self.case.to_dict())
        if self.launch is not None:  # entries written before launches were stored have none
            d["launch"] = self.launch
        return d

    def reproduced_by(self, findings) -> bool:
        """True when a replay's findings show this entry's signature."""
        return any(f.signature() == self.signature for f in findings)


def released_name(target: str) -> str:
    """production@VERSION -> production (one release's copy of the production module: the entries of the
    production target are its known bugs too); any other name unchanged."""
    return "production" if target.startswith("production@") else target


def _mutant_needs_gpu(target: str) -> bool:
    m = CATALOGUE.get(target.split(":", 1)[1])
    return m is not None and m.base == "production"


def versions() -> dict:
    import torch

    out = {"torch": torch.__version__}
    for dist in ("gdn-fuzz", "flashinfer-python", "nvidia-cutlass-dsl", "hypothesis"):
        v = dist_version(dist, None)
        if v is not None:
            out[dist] = v
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def make_entry(prop: str, case: Case, findings, target: str, status: str = "open", reason: str = "",
               signature: str | None = None) -> Entry:
    """An entry for the failure `signature` (default: the first of the findings' signatures)."""
    sigs = sorted({f.signature() for f in findings})
    if signature is None:
        if not sigs:
            raise ValueError("make_entry needs at least one finding (or signature=...)")
        signature = sigs[0]
    launch = next((f.launch for f in findings if getattr(f, "launch", None) and f.signature() == signature),
                  next((f.launch for f in findings if getattr(f, "launch", None)), None))
    return Entry(case=case, prop=prop, findings=[str(f) for f in findings],
                 keys=sorted({(f.prop, f.clause) for f in findings}), target=target, status=status,
                 signature=signature, signatures=sigs, reason=reason or signature,
                 versions=versions(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), launch=launch)


def default_dir() -> Path:
    return Path(os.environ.get(CORPUS_ENV) or "corpus")


def is_readonly() -> bool:
    """GDN_FUZZ_CORPUS_READONLY set: the configured corpus ($GDN_FUZZ_CORPUS or ./corpus) is never
    written (CI).  A folder passed explicitly elsewhere (a test's temporary corpus) still is."""
    return os.environ.get(READONLY_ENV, "").strip() not in ("", "0", "false", "no")


def unwritable(directory: Path | None = None) -> str | None:
    """Why the corpus folder `directory` (default: the configured one) cannot take new entries, or None: it is
    the configured corpus and GDN_FUZZ_CORPUS_READONLY is set, or the filesystem refuses writes there (a read-only
    checkout or mount; checked on the folder, or on its nearest existing parent when it does not exist yet)."""
    d = Path(directory) if directory is not None else default_dir()
    if is_readonly() and d.resolve() == default_dir().resolve():
        return f"corpus {d} is read-only ({READONLY_ENV} is set)"
    p = d
    while not p.exists() and p != p.parent:
        p = p.parent
    if not os.access(p, os.W_OK):
        return f"corpus {d} cannot be written (no write access to {p})"
    return None


def write(entry: Entry, directory: Path | None = None, replace: bool = False) -> tuple[Path, bool]:
    """Store an entry atomically.  Returns (path, written); written is False for a duplicate (an entry
    of the same identity is there already), unless `replace`: then it is written over, atomically (a
    fleet's driver replacing the unshrunk case of a lost worker by a shrunk one, gdn_fuzz.engine.fleet)."""
    d = Path(directory) if directory is not None else default_dir()
    path = d / entry.filename()
    if path.exists() and not replace:
        return path, False
    why = unwritable(d)
    if why is not None:
        raise PermissionError(f"{why}; new entry {path.name} not written:\n" + json.dumps(entry.to_dict(), indent=1))
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entry.to_dict(), indent=1, sort_keys=True) + "\n", durable=True, mode=0o644,
                     prefix=".tmp-", suffix=".partial")
    except OSError as e:  # a read-only filesystem is EROFS, not a PermissionError: the caller reports both alike
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise PermissionError(f"corpus {d} cannot be written ({e.strerror}); new entry {path.name} not written:\n"
                              + json.dumps(entry.to_dict(), indent=1)) from e
    entry.path = path
    return path, True


def read(path: Path) -> Entry:
    """Parse one entry; any problem raises CorpusError naming the file."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"corpus entry {path}: unreadable or truncated JSON ({e}); delete it or restore it from git") from e
    return from_dict(d, path)


def from_dict(d, path: Path | None = None, where: str | None = None) -> Entry:
    """An entry from its JSON data (what Entry.to_dict gives: a file's contents, or an entry a fleet
    worker sent its driver), every field checked as read() checks a file; CorpusError names `where`
    (default: the file `path`) and what is wrong."""
    where = where or str(path)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        hint = ("entries of format 1 predate failure signatures: replay the case against its target and store "
                "the signature it shows (gdn_fuzz.engine.corpus.make_entry), or delete the file"
                if got == "gdn_fuzz.corpus/1" else "re-create it with this version or upgrade gdn_fuzz")
        raise CorpusError(f"corpus entry {where}: format={got!r}, this gdn_fuzz reads {FORMAT!r}; {hint}")
    try:
        case = load_case(d["case"])
        sig = d["signature"]
        if not isinstance(sig, str) or not sig:
            raise ValueError(f"signature={sig!r} must be a non-empty string")
        e = Entry(case=case, prop=d["property"], findings=list(d.get("findings", [])),
                  keys=[tuple(k) for k in d.get("keys", [])], target=d["target"], status=d.get("status", "open"),
                  signature=sig, signatures=list(d.get("signatures", [sig])),
                  reason=d.get("reason", ""), versions=d.get("versions", {}), date=d.get("date", ""), path=path,
                  launch=_read_launch(d.get("launch")))
    except (KeyError, TypeError, ValueError) as err:
        raise CorpusError(f"corpus entry {where}: missing or malformed field ({type(err).__name__}: {err})") from err
    if e.status not in ("open", "guard"):
        raise CorpusError(f"corpus entry {where}: status={e.status!r}; use 'open' or 'guard'")
    return e


def _read_launch(d) -> dict | None:
    """An entry's optional "launch", validated (findings.parse_launch) and kept as its JSON;
    ValueError on anything malformed."""
    if d is None:
        return None

    case, transform, params, note, changes = parse_launch(d)
    return dict(case=case.to_dict(), transform=transform, params=dict(params), note=note, changes=list(changes))


STALE_TEMP_S = 3600.0  # a hidden temporary entry older than this was left by a killed writer


def clean_stale_temps(directory: Path | None = None, older_than_s: float = STALE_TEMP_S) -> int:
    """Remove hidden temporary entries (.tmp-*.partial) left by writers that were killed mid-write;
    recent ones may belong to a live writer and stay.  Returns how many were removed."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return 0
    n, now = 0, time.time()
    for p in d.glob(".tmp-*"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
                n += 1
        except FileNotFoundError:
            pass
    return n


def entries(directory: Path | None = None) -> list[Path]:
    """The entry files of a corpus folder: *.json, hidden files (writes in progress) left out."""
    d = Path(directory) if directory is not None else default_dir()
    return sorted(p for p in d.glob("*.json") if not p.name.startswith(".")) if d.is_dir() else []


def unreadable(directory: Path | None = None) -> list[str]:
    """One line per entry file of the folder that read() refuses (truncated JSON, another format, a malformed
    field): what `gdn-fuzz run` says at start, since its known bugs leave such entries out."""
    out = []
    for p in entries(directory):
        try:
            read(p)
        except CorpusError as e:
            out.append(str(e).splitlines()[0])
    return out


def known_signatures(target: str, directory: Path | None = None) -> dict[str, str]:
    """{signature: entry file name} of the `open` entries of `target`: outcomes that are known
    bugs, counted and listed by campaigns and property tests instead of failing them.
    Unreadable entries are left out here (replay and the corpus test report them)."""
    out = {}
    for p in entries(directory):
        try:
            e = read(p)
        except CorpusError:
            continue
        if e.status == "open" and e.target in (target, released_name(target)):
            out.setdefault(e.signature, p.name)
    return out


def known_on_backend(known: dict[str, str], target, backend: str | None) -> dict[str, str]:
    """The known bugs of a launch of `target` that runs on `backend` (Target.backend_for): the corpus's
    `known` {signature: entry} less the bugs the target's release model says are absent on that backend
    (a strided a/b view on UMMA, which copies a/b: a new finding there), plus the bugs the model says are
    present on it that no corpus entry of this target records (the UMMA cast cache, read from the source:
    named "release model VERSION (BACKEND): EVIDENCE").  Targets that are not FlashInfer's code
    (Target.released False), and backend None, keep `known` as it is."""
    if backend is None or not getattr(target, "released", False):
        return known
    rel = target.release.release
    absent = rel.absent_on(backend)
    out = {s: n for s, n in known.items() if s not in absent}
    for sig, bug in rel.known_on(backend).items():
        out.setdefault(sig, f"release model {rel.version} ({backend}): {bug.backends[backend]}")
    return out


def is_crash(entry: Entry) -> bool:
    return any(check in ("crash", "hang") for check, _ in entry.keys)


def verdict(entry: Entry, findings) -> tuple[bool, str]:
    """(as expected, what happened) of a replay.

    open:  expected when the replay shows the entry's signature (other findings beside it are
           listed); passing means the bug is fixed (make the entry a guard), and failing with
           other signatures only means the entry no longer reproduces what it records.
    guard: expected when the replay passes.
    """
    sigs = sorted({f.signature() for f in findings})
    others = [s for s in sigs if s != entry.signature]
    if entry.status == "guard":
        return (not sigs, "passes" if not sigs else "REGRESSION: " + "; ".join(sigs))
    if entry.reproduced_by(findings):
        return True, "reproduces its signature" + (f" (also: {'; '.join(others)})" if others else "")
    if not sigs:
        return False, "passes: the open bug is fixed? make the entry a guard"
    return False, f"fails differently: expected {entry.signature!r}, got " + "; ".join(sigs)


def paths_allowed() -> bool:
    return os.environ.get(ALLOW_PATHS_ENV, "").strip() not in ("", "0", "false", "no")


def check_replayable(entry: Entry, allow_paths: bool | None = None) -> None:
    """Corpus entries are data, never code: the target an entry names may only be a built-in
    target or a catalogued mutant.  An entry naming a file (a campaign against a user's kernel
    file writes those) replays only when the person running asks for it: allow_paths=True
    (`gdn-fuzz replay --allow-target-paths`) or GDN_FUZZ_ALLOW_TARGET_PATHS=1, never by default,
    so a pull request that adds one JSON file cannot make CI import a file of its choosing."""
    t = entry.target
    where = f"corpus entry {entry.path or entry.filename()}"
    if t in BUILTIN_TARGETS:
        return
    if t.startswith("production@"):
        if t.split("@", 1)[1] in releases.RELEASES:
            return
        raise CorpusError(f"{where}: target={t!r}: no release model for {t.split('@', 1)[1]!r}; modelled releases: "
                          f"{', '.join(releases.RELEASES)}")
    if t.startswith("mutant:"):
        try:
            get_mutant(t.split(":", 1)[1])
        except ValueError as e:
            raise CorpusError(f"{where}: target={t!r}: {e}") from None
        return
    if allow_paths if allow_paths is not None else paths_allowed():
        return
    raise CorpusError(f"{where}: target={t!r} names a file; entries may name only {', '.join(BUILTIN_TARGETS)}, "
                      f"production@VERSION or mutant:NAME.  To replay it against that file on purpose, pass --allow-target-paths to "
                      f"gdn-fuzz replay or set {ALLOW_PATHS_ENV}=1 (never in CI), or replay with --target NAME")


def replay(entry: Entry, target_name: str | None = None, device: str = "cpu", isolate: bool | None = None,
           allow_paths: bool | None = None):
    """Re-run the entry's property on its case; returns the findings (empty = passes).

    The entry's own target must pass check_replayable (target_name, the caller's explicit
    choice, is not checked).  Crash entries (and isolate=True) run in a worker process
    (gdn_fuzz.engine.isolation), so a reproduced crash is a finding, not the end of the caller's process.
    """

    if target_name is None:
        check_replayable(entry, allow_paths)
    name = target_name or entry.target
    if isolate is None:
        isolate = is_crash(entry)
    if isolate:
        w = Worker(name, device, name=f"replay-{os.getpid()}")
        try:
            return w.check(entry.prop, entry.case)
        finally:
            w.close()
    return get_property(entry.prop).check(get_target(name), entry.case, device)
