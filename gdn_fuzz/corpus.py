"""The regression corpus: one readable JSON entry per distinct failure.

An entry holds the shrunk Case (geometry, arm, rows, cursors, seed, value regime: the
tensors are regenerated from the seed), the property and clauses that failed, the target
and the versions it ran with, the date, and whether it is an `open` bug (expected to fail
until fixed: replayed as a strict xfail) or a regression `guard` (must pass).

File names are `<property>-<hash>.json`, the hash taken over the failure's identity
(property, target, sorted (check, clause) keys of its findings), so the same failure found
twice - by another campaign, another seed, another xdist worker - lands on the same name
and is stored once.  Writes go to a temporary file in the same folder, then os.replace():
readers never see half an entry, and concurrent writers of one entry leave one whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .case import Case

FORMAT = "gdn_fuzz.corpus/1"
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
    status: str = "open"  # open | guard
    reason: str = ""
    versions: dict = field(default_factory=dict)
    date: str = ""
    path: Path | None = None

    @property
    def needs_gpu(self) -> bool:
        return self.target == "production" or self.target == "sm100" or (
            self.target.startswith("mutant:") and _mutant_needs_gpu(self.target))

    @property
    def clauses(self) -> list[str]:
        return sorted({c for _, c in self.keys})

    def signature(self) -> str:
        ident = json.dumps([self.prop, self.target, sorted(map(list, self.keys))], sort_keys=True)
        return hashlib.sha256(ident.encode()).hexdigest()[:16]

    def filename(self) -> str:
        return f"{self.prop}-{self.signature()}.json"

    def to_dict(self) -> dict:
        return dict(format=FORMAT, property=self.prop, clauses=self.clauses, status=self.status,
                    reason=self.reason, target=self.target, needs_gpu=self.needs_gpu,
                    findings=self.findings, keys=[list(k) for k in self.keys],
                    versions=self.versions, date=self.date, case=self.case.to_dict())


def _mutant_needs_gpu(target: str) -> bool:
    from .mutants import CATALOGUE

    m = CATALOGUE.get(target.split(":", 1)[1])
    return m is not None and m.base == "production"


def versions() -> dict:
    import importlib.metadata as md

    import torch

    out = {"torch": torch.__version__}
    for dist in ("gdn-fuzz", "flashinfer-python", "nvidia-cutlass-dsl", "hypothesis"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def make_entry(prop: str, case: Case, findings, target: str, status: str = "open", reason: str = "") -> Entry:
    return Entry(case=case, prop=prop, findings=[str(f) for f in findings],
                 keys=sorted({(f.prop, f.clause) for f in findings}), target=target, status=status,
                 reason=reason or "; ".join(sorted({str(f.prop) + " (" + f.clause + ")" for f in findings})),
                 versions=versions(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def default_dir() -> Path:
    return Path(os.environ.get(CORPUS_ENV) or "corpus")


def is_readonly() -> bool:
    return os.environ.get(READONLY_ENV, "").strip() not in ("", "0", "false", "no")


def write(entry: Entry, directory: Path | None = None) -> tuple[Path, bool]:
    """Store an entry atomically.  Returns (path, written); written is False for a duplicate."""
    d = Path(directory) if directory is not None else default_dir()
    path = d / entry.filename()
    if path.exists():
        return path, False
    if is_readonly():
        raise PermissionError(f"corpus {d} is read-only ({READONLY_ENV} is set); new entry {path.name} not written:\n"
                              + json.dumps(entry.to_dict(), indent=1))
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(entry.to_dict(), fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    entry.path = path
    return path, True


def read(path: Path) -> Entry:
    """Parse one entry; any problem raises CorpusError naming the file."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"corpus entry {path}: unreadable or truncated JSON ({e}); delete it or restore it from git") from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise CorpusError(f"corpus entry {path}: format={got!r}, this gdn_fuzz reads {FORMAT!r}; "
                          "re-create it with this version or upgrade gdn_fuzz")
    try:
        case = Case.from_dict(d["case"])
        e = Entry(case=case, prop=d["property"], findings=list(d.get("findings", [])),
                  keys=[tuple(k) for k in d.get("keys", [])], target=d["target"], status=d.get("status", "open"),
                  reason=d.get("reason", ""), versions=d.get("versions", {}), date=d.get("date", ""), path=path)
    except (KeyError, TypeError, ValueError) as err:
        raise CorpusError(f"corpus entry {path}: missing or malformed field ({type(err).__name__}: {err})") from err
    if e.status not in ("open", "guard"):
        raise CorpusError(f"corpus entry {path}: status={e.status!r}; use 'open' or 'guard'")
    return e


def entries(directory: Path | None = None) -> list[Path]:
    d = Path(directory) if directory is not None else default_dir()
    return sorted(d.glob("*.json")) if d.is_dir() else []


def is_crash(entry: Entry) -> bool:
    return any(check == "crash" for check, _ in entry.keys)


def replay(entry: Entry, target_name: str | None = None, device: str = "cpu", isolate: bool | None = None):
    """Re-run the entry's property on its case; returns the findings (empty = passes).

    Crash entries (and isolate=True) run in a worker process (gdn_fuzz.isolation), so a
    reproduced crash is a finding, not the end of the caller's process.
    """
    from .properties import get_property
    from .targets import get_target

    name = target_name or entry.target
    if isolate is None:
        isolate = is_crash(entry)
    if isolate:
        from .isolation import Worker

        w = Worker(name, device, name=f"replay-{os.getpid()}")
        try:
            return w.check(entry.prop, entry.case)
        finally:
            w.close()
    return get_property(entry.prop).check(get_target(name), entry.case, device)
