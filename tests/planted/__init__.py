"""Planted bugs for the test suites: the catalogue lives in gdn_fuzz.mutants.

Plant is gdn_fuzz.mutants.Mutant; PLANTS are the catalogued mutants of the reference
target; plant(name_or_plant, tmpdir) writes the edited copy and returns its path (every
edit must apply exactly once, so a stale edit fails loudly).
"""

from __future__ import annotations

from pathlib import Path

from gdn_fuzz.mutants import CATALOGUE
from gdn_fuzz.mutants import Mutant as Plant
from gdn_fuzz.mutants import materialize_mutant

PLANTS = {n: m for n, m in CATALOGUE.items() if m.base == "reference" and m.prop.startswith(("oracle.", "writes."))}


def plant(name: str | Plant, tmpdir) -> Path:
    """Write the planted copy of its base target into tmpdir and return its path."""
    return materialize_mutant(PLANTS[name] if isinstance(name, str) else name, Path(tmpdir))


__all__ = ["PLANTS", "Plant", "plant"]
