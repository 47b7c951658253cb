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

# the launch property's own planted bugs (tests/test_launch.py); tests/test_mutants.py covers the
# whole catalogue, each mutant against the property family meant to kill it
LAUNCH_PLANTS = ("fold_skipped", "no_local_g_restart", "anchor_off_by_one", "flush_restart_at_zero",
                 "pad_rows_write", "flush_off_by_one")
PLANTS = {n: CATALOGUE[n] for n in LAUNCH_PLANTS}


def plant(name: str | Plant, tmpdir) -> Path:
    """Write the planted copy of its base target into tmpdir and return its path."""
    return materialize_mutant(PLANTS[name] if isinstance(name, str) else name, Path(tmpdir))


__all__ = ["PLANTS", "Plant", "plant"]
