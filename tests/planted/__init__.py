"""Planted bugs for the test suites: the catalogue lives in gdn_fuzz.targets.mutants.

Plant is gdn_fuzz.targets.mutants.Mutant; PLANTS are the catalogued mutants of the reference
target; plant(name_or_plant, tmpdir) writes the edited copy and returns its path (every
edit must apply exactly once, so a stale edit fails loudly).
"""

from __future__ import annotations

from pathlib import Path

from gdn_fuzz.targets.mutants import CATALOGUE
from gdn_fuzz.targets.mutants import Mutant as Plant
from gdn_fuzz.targets.mutants import materialize_mutant

# the launch property's own planted bugs (tests/test_launch.py); tests/test_mutants.py covers the
# whole catalogue, each mutant against the property family meant to kill it
LAUNCH_PLANTS = ("fold_skipped", "no_local_g_restart", "anchor_off_by_one", "flush_restart_at_zero",
                 "pad_rows_write", "flush_off_by_one")
PLANTS = {n: CATALOGUE[n] for n in LAUNCH_PLANTS}


def plant(name: str | Plant, tmpdir) -> Path:
    """Write the planted copy of its base target into tmpdir and return its path."""
    return materialize_mutant(PLANTS[name] if isinstance(name, str) else name, Path(tmpdir))





TWO_BUGS = '''"""Planted: two bugs that the launch property reports under different signatures.

A: every T = 8 launch raises RuntimeError (like the released kernel's layout errors, a bug that
   shows on a whole family of launches and hides anything else they would show);
B: flush rows never write their folded checkpoint (fold_skipped, oracle.fold, M7), on T = 4.
"""
import os
from pathlib import Path

from gdn_fuzz.targets import import_file

_env = "_".join(os.environ.get(k, "") for k in ("GDN_UCACHE_IO_DTYPE", "GDN_UCACHE_STATE_DTYPE",
                                                "GDN_UCACHE_RING_DTYPE"))
_base = import_file(Path({base!r}), "_gdn_fuzz_planted_two_bugs_" + _env.replace("-", "_"))
RING_SLOTS, W_RING = _base.RING_SLOTS, _base.W_RING
IO_TORCH, ST_TORCH, RING_TORCH = _base.IO_TORCH, _base.ST_TORCH, _base.RING_TORCH


def gated_delta_rule_mtp_ucache_flush(*args, **kw):
    q = kw["q"] if "q" in kw else args[0]
    if q.shape[1] == 8:
        raise RuntimeError("planted A: the T = 8 layout is not consistent with the tile")
    return _base.gated_delta_rule_mtp_ucache_flush(*args, **kw)
'''
# the signatures the launch property gives the two planted bugs of TWO_BUGS
TWO_BUGS_A = "launch [H*] raised RuntimeError: planted A: the T = # layout is not consistent with the tile"
TWO_BUGS_B = "oracle.fold [M7] out of tolerance (flush rows)"


def two_bugs(tmpdir) -> Path:
    """A target file with the two planted bugs of TWO_BUGS (A and B in one property)."""
    base = materialize_mutant(CATALOGUE["fold_skipped"], Path(tmpdir))
    p = Path(tmpdir) / "two_bugs.py"
    p.write_text(TWO_BUGS.format(base=str(base)))
    return p
# fold_skipped whose flush-row launches also sleep $GDN_FUZZ_TEST_SLOW_S seconds: shrinking its failure
# takes long enough to kill a fleet worker in the middle of it (tests/test_ray_fleet.py, test_multigpu.py)
SLOW_FOLD = Plant("slow_fold_skipped", "M7", "oracle.fold", CATALOGUE["fold_skipped"].old,
                  "        __import__('time').sleep(float(__import__('os').environ.get('GDN_FUZZ_TEST_SLOW_S', '0')))",
                  "fold_skipped, and every launch with a flush row sleeps $GDN_FUZZ_TEST_SLOW_S seconds")


def slow_fold(tmpdir) -> Path:
    """A target file with SLOW_FOLD's planted bug (signature TWO_BUGS_B)."""
    return plant(SLOW_FOLD, tmpdir)


__all__ = ["PLANTS", "Plant", "plant", "two_bugs", "slow_fold", "TWO_BUGS_A", "TWO_BUGS_B"]
