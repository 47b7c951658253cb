"""Mutants: realistic kernel bugs as small text edits of a target file, applied at run time.

A Mutant names its base file ("reference": this package's torch target; "production": the
installed FlashInfer module, edited in a temporary copy and never vendored), the text to
replace (which must occur exactly once, so a stale edit fails loudly), the contract clause
it breaks and the property expected to catch it.  `get_target("mutant:NAME")` loads one.

Mutated copies are written to $GDN_FUZZ_MUTANT_DIR (default: a per-user temp folder),
named by the hash of their content, and written atomically, so concurrent workers share
them safely.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    name: str
    clause: str
    prop: str  # Finding.prop prefix expected to catch it
    old: str
    new: str
    doc: str
    base: str = "reference"  # "reference" | "production"


CATALOGUE: dict[str, Mutant] = {}


def register(*ms: Mutant) -> None:
    for m in ms:
        if m.name in CATALOGUE:
            raise ValueError(f"mutant {m.name!r} registered twice")
        CATALOGUE[m.name] = m


register(
    Mutant("fold_skipped", "M7", "oracle.fold",
           "        h0[idx[flush]] = fold[flush]", "        pass",
           "flush rows never write the folded checkpoint"),
    Mutant("no_local_g_restart", "M6", "oracle.g",
           "torch.where(flush[:, None], 0.0, GP)", "GP",
           "flush rows append G_P + G_s instead of restarting at 0"),
    Mutant("anchor_off_by_one", "M3", "oracle.y",
           "anchor_lane = (P - 1).clamp(0, W_RING - 1)", "anchor_lane = P.clamp(0, W_RING - 1)",
           "anchor G_P read from lane P instead of P - 1"),
    Mutant("flush_restart_at_zero", "M5", "writes.outside",
           "aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
           "aslots = torch.where((P >= flush_min)[:, None], base[:, None] + torch.arange(Tq, device=dev)[None, :],"
           " base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
           "the old flush path: appends restart at the window start instead of past the window (the 16-slot race)"),
    Mutant("pad_rows_write", "M8", "writes.outside",
           "    live = idx >= 0\n", "    live = idx >= -1\n",
           "pad rows (idx = -1) are treated as slot -1 = the last pool row"),
    Mutant("flush_off_by_one", "M7", "oracle.fold",
           "    flush = (P >= flush_min) & live\n", "    flush = (P > flush_min) & live\n",
           "rows exactly at flush_min do not fold"),
    Mutant("worker_crash", "R*", "crash",
           "    # M8 output: in place",
           "    if bool(((P == W_RING) & live).any()):  # planted: a hard crash of the process\n"
           "        import os, signal\n"
           "        os.kill(os.getpid(), signal.SIGSEGV)\n"
           "    # M8 output: in place",
           "the process dies (SIGSEGV) whenever a row has a full window (P = 16): crash isolation demo"),
    Mutant("gpu_oob_full_window", "R*", "crash",
           "        initial_state_indices = initial_state_indices.contiguous()\n",
           "        initial_state_indices = initial_state_indices.contiguous()\n"
           "        if int(hist_len.max()) == W_RING:  # planted: slot index far past the pool\n"
           "            initial_state_indices = initial_state_indices + (1 << 26) * (initial_state_indices >= 0)\n",
           "the production wrapper shifts slot indices 2^26 rows past the pool when a row has P = 16: the kernel "
           "reads and writes out of bounds (illegal address, a sticky CUDA error)",
           base="production"),
)


def _mutant_dir() -> Path:
    d = os.environ.get("GDN_FUZZ_MUTANT_DIR") or os.path.join(tempfile.gettempdir(), f"gdn_fuzz_mutants_{os.getuid()}")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def base_path(m: Mutant) -> Path:
    from .targets import REFERENCE_PATH, resolve_production_path

    return REFERENCE_PATH if m.base == "reference" else resolve_production_path()


def apply(m: Mutant, src: str) -> str:
    n = src.count(m.old)
    if n != 1:
        raise ValueError(f"mutant {m.name!r}: its edit must match the {m.base} source exactly once, found {n} "
                         f"matches; update gdn_fuzz/mutants.py (the target file changed)")
    return src.replace(m.old, m.new)


def materialize_mutant(m: Mutant | str, directory: Path | None = None) -> Path:
    """Write the mutated copy (atomically, named by content hash) and return its path."""
    m = get_mutant(m) if isinstance(m, str) else m
    text = apply(m, base_path(m).read_text())
    d = Path(directory) if directory is not None else _mutant_dir()
    out = d / f"{m.base}_{m.name}_{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
    if not out.exists():
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    return out


def get_mutant(name: str) -> Mutant:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ValueError(f"mutant={name!r} is not in the catalogue; known: {', '.join(sorted(CATALOGUE))}") from None
