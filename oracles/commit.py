"""Cursor commit models (contract C1-C4) and the prefill-to-decode reset.

The kernel never writes hist_len or cache_base (C1).  After a launch the cursors advance
by one of two rules; both must leave every row's window equal to exactly its accepted
records (C4).  All functions are pure: they return new int64 tensors [B].
"""

from __future__ import annotations

import torch

from .ring import RING_MASK


def flush_rows(hist_len, flush_min: int):
    """The rows the launch folded: P >= flush_min (M7).  Pad rows are not exempt here (C2)."""
    return hist_len.long() >= flush_min


def caller_commit(hist_len, cache_base, accepted, flush_min: int):
    """C3 (restart_hist_on_flush=False, Triton commit_gdn_replayssm_spec).

    Flush rows:  base' = (base + P) & 31, len' = accepted.
    Verify rows: base' = base,            len' = P + accepted.
    """
    P, base, n = hist_len.long(), cache_base.long(), accepted.long()
    f = flush_rows(P, flush_min)
    return torch.where(f, n, P + n), torch.where(f, (base + P) & RING_MASK, base)


def standalone_commit(hist_len, cache_base, flush_min: int):
    """C2 (restart_hist_on_flush=True): what the wrapper does in place after the launch.

    f = P >= flush_min; base <- (base + P*f) & 31; P <- 0 where f.  Returns (len, base);
    the caller then adds `accepted` to every row's len.
    """
    P, base = hist_len.long(), cache_base.long()
    f = flush_rows(P, flush_min)
    return torch.where(f, torch.zeros_like(P), P), (base + P * f) & RING_MASK


def standalone_then_accept(hist_len, cache_base, accepted, flush_min: int):
    """C2 followed by the caller's `hist_len += accepted`; must equal caller_commit (C3)."""
    P, base = standalone_commit(hist_len, cache_base, flush_min)
    return P + accepted.long(), base


def reset(hist_len, cache_base, rows):
    """Prefill-to-decode handoff, recycled block, readmission: hist_len = 0, cache_base = 0."""
    P, base = hist_len.long().clone(), cache_base.long().clone()
    P[rows] = 0
    base[rows] = 0
    return P, base
