"""Planted bugs: small text edits of the reference target, each one a realistic kernel bug.

`plant(name, tmpdir)` writes the edited copy of gdn_fuzz/targets/reference_ucache_flush.py
and returns its path; every edit must apply exactly once (a stale edit fails loudly).
Each entry names the contract clause it breaks and the property expected to catch it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gdn_fuzz.targets import REFERENCE_PATH


@dataclass(frozen=True)
class Plant:
    name: str
    clause: str
    prop: str  # the property (Finding.prop prefix) expected to catch it
    old: str
    new: str
    doc: str


PLANTS = {p.name: p for p in (
    Plant("fold_skipped", "M7", "oracle.fold",
          "        h0[idx[flush]] = fold[flush]", "        pass",
          "flush rows never write the folded checkpoint"),
    Plant("no_local_g_restart", "M6", "oracle.g",
          "torch.where(flush[:, None], 0.0, GP)", "GP",
          "flush rows append G_P + G_s instead of restarting at 0"),
    Plant("anchor_off_by_one", "M3", "oracle.y",
          "anchor_lane = (P - 1).clamp(0, W_RING - 1)", "anchor_lane = P.clamp(0, W_RING - 1)",
          "anchor G_P read from lane P instead of P - 1"),
    Plant("flush_restart_at_zero", "M5", "writes.outside",
          "aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
          "aslots = torch.where((P >= flush_min)[:, None], base[:, None] + torch.arange(Tq, device=dev)[None, :],"
          " base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK",
          "the old flush path: appends restart at the window start instead of past the window (the 16-slot race)"),
    Plant("pad_rows_write", "M8", "writes.outside",
          "    live = idx >= 0\n", "    live = idx >= -1\n",
          "pad rows (idx = -1) are treated as slot -1 = the last pool row"),
    Plant("flush_off_by_one", "M7", "oracle.fold",
          "    flush = (P >= flush_min) & live\n", "    flush = (P > flush_min) & live\n",
          "rows exactly at flush_min do not fold"),
)}


def plant(name: str | Plant, tmpdir) -> Path:
    """Write the planted copy of the reference target for a Plant (or a PLANTS name)."""
    p = PLANTS[name] if isinstance(name, str) else name
    src = REFERENCE_PATH.read_text()
    if src.count(p.old) != 1:
        raise AssertionError(f"planted bug {name!r}: its edit no longer applies once to {REFERENCE_PATH} "
                             f"(found {src.count(p.old)} matches); update tests/planted/__init__.py")
    out = Path(tmpdir) / f"planted_{p.name}.py"
    out.write_text(src.replace(p.old, p.new))
    return out
