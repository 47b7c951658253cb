"""The multi-step serving model: verify T tokens -> accept n in 1..T -> commit, for a batch.

Two float64 machines that must agree:
  * `sequential_decode`: the plain recurrence over the accepted tokens only (the truth);
  * `RingMachine`: checkpoint pool + 32-slot rings + cursors, driven by the launch oracle
    (oracles.ring.launch) and a commit model (oracles.commit).  Its committed logical state
    (checkpoint replayed through the window, M3) must equal the truth after every step.

A step's inputs are one `StepInputs` per step: q, k [B, T, H, K], v [B, T, HV, V],
a, b [B, T, HV] and accepted [B] (in 1..T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import commit as commits
from . import ring
from .gdn import gates, normalized_qk, sequential


@dataclass
class StepInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    accepted: torch.Tensor  # [B] int, 1..T


def sequential_decode(S, step: StepInputs, A_log, dt_bias, scale: float, *, trail: bool = False):
    """Advance the logical states S [B, HV, V, K] by each row's accepted tokens.

    Returns (S_next, y) with y [B, T, HV, V] for all T drafts (rejected ones included); trail=True:
    (S_next, y, states) with states [B, T, HV, V, K], S after every draft token t (a row's first
    `accepted` of them are the states of its accepted tokens: what a prefix cache can store).
    """
    HV = step.v.shape[2]
    g, beta = gates(step.a, dt_bias, A_log, step.b)
    q_hat, k_hat = normalized_qk(step.q, step.k, HV, scale)
    n = step.accepted.long() - 1  # index of the last accepted token; -1: none accepted (C4 allows 0)
    if not trail:
        y, _, S_next = sequential(S, q_hat, k_hat, step.v, g, beta, pick=n)  # S after token n per row
        return S_next, y
    y, _, states = sequential(S, q_hat, k_hat, step.v, g, beta)
    last = states[torch.arange(states.shape[0], device=states.device), n.clamp_min(0)]
    S_next = torch.where((n >= 0)[:, None, None, None], last, S.double())
    return S_next, y, states


class RingMachine:
    """Float64 buffers of the fused kernel's layout, advanced by the launch oracle.

    pool [pool, HV, V, K], k_cache [pool, H, 32, K], u_cache [pool, HV, 32, V],
    g_cache [pool, HV, 32]; cursors hist_len, cache_base [B] for rows mapped to `idx`.
    commit: "caller" (C3) or "standalone" (C2 then += accepted).
    """

    def __init__(self, pool, H: int, idx, T: int, flush_min: int, commit: str = "caller"):
        P, HV, V, K = pool.shape
        dev = pool.device
        self.pool = pool.double().clone()
        self.k_cache = torch.zeros(P, H, ring.RING_SLOTS, K, dtype=torch.float64, device=dev)
        self.u_cache = torch.zeros(P, HV, ring.RING_SLOTS, V, dtype=torch.float64, device=dev)
        self.g_cache = torch.zeros(P, HV, ring.RING_SLOTS, dtype=torch.float64, device=dev)
        self.idx = idx.long().clone()
        self.hist_len = torch.zeros_like(self.idx)
        self.cache_base = torch.zeros_like(self.idx)
        self.T, self.flush_min, self.commit = T, flush_min, commit
        if commit not in ("caller", "standalone"):
            raise ValueError(f"commit={commit!r}: use 'caller' (C3) or 'standalone' (C2)")

    def logical_state(self):
        """M3 replay of every row's window from its checkpoint: [B, HV, V, K]."""
        HV = self.pool.shape[1]
        k, u, G, valid = ring.gather_window(self.k_cache, self.u_cache, self.g_cache, self.idx,
                                            self.hist_len, self.cache_base, HV)
        S, _, _ = ring.replay(self.pool[self.idx.clamp(min=0)], k, u, G, valid, self.hist_len)
        return S

    def step(self, inp: StepInputs, A_log, dt_bias, scale: float):
        """One launch (oracle), its writes applied, then the cursor commit.  Returns y."""
        e = ring.launch(q=inp.q, k=inp.k, v=inp.v, a=inp.a, b=inp.b, A_log=A_log, dt_bias=dt_bias,
                        pool=self.pool, idx=self.idx, k_cache=self.k_cache, u_cache=self.u_cache,
                        g_cache=self.g_cache, hist_len=self.hist_len, cache_base=self.cache_base,
                        flush_min=self.flush_min, scale=scale)
        apply_launch(self.pool, self.k_cache, self.u_cache, self.g_cache, self.idx, e)
        if self.commit == "caller":
            self.hist_len, self.cache_base = commits.caller_commit(
                self.hist_len, self.cache_base, inp.accepted, self.flush_min)
        else:
            self.hist_len, self.cache_base = commits.standalone_then_accept(
                self.hist_len, self.cache_base, inp.accepted, self.flush_min)
        return e.y

    def reset(self, rows):
        self.hist_len, self.cache_base = commits.reset(self.hist_len, self.cache_base, rows)


def apply_launch(pool, k_cache, u_cache, g_cache, idx, e: ring.LaunchExpectation):
    """Write a launch's expected effects into float64 buffers in place (M5, M7)."""
    live = ~e.pad
    rows = idx.long()[live]
    slots = e.slots[live]  # [n, T]
    r = rows[:, None].expand_as(slots)
    # advanced indexing puts the [n, T] index dims first: values are [n, T, heads, dim]
    k_cache.permute(0, 2, 1, 3)[r, slots] = e.k_app[live].to(k_cache.dtype)
    u_cache.permute(0, 2, 1, 3)[r, slots] = e.u_app[live].to(u_cache.dtype)
    g_cache.permute(0, 2, 1)[r, slots] = e.g_app[live].to(g_cache.dtype)
    f = e.flush
    pool[idx.long()[f]] = e.fold[f].to(pool.dtype)
