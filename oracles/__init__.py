"""Float64 reference math for the ReplaySSM step: the spec that every target is checked against.

gdn      the gated delta rule token by token (M1, M2, M4)
ring     window replay, appends, fold and write sets of one launch (M3, M5-M8)
commit   cursor commits (C2, C3) and resets
serving  multi-step verify/accept/commit machines
"""

from . import commit, gdn, ring, serving  # noqa: F401

__all__ = ["commit", "gdn", "ring", "serving"]
