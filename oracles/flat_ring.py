"""The verify-only sibling's 16-slot flat ring, in float64: the layout part of its oracle (issue 18).

The sibling is FlashInfer's `gated_delta_rule_mtp_ucache` (flashinfer-python 0.7.2.post1,
flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache.py).  Its math is the fused kernel's verify
path (contract M1-M4), so this module reuses the float64 math of oracles.gdn (gates,
normalization, the token recurrence) and oracles.ring.replay (M3's S_P from a gathered window,
layout-free).  What is its own is the layout, read from the sibling's source (line numbers of
that file):

  rings      k_cache [pool, H, 16, K] bf16, u_cache [pool, HV, 16, V] bf16, g_cache [pool, HV, 16] f32
             (host asserts, lines 2538-2557); 16 physical rows per (pool slot, head), no cache_base.
  window     physical rows [0, P) of the row's pool slot, P = hist_len[b]: the g LDG reads row
             lane_id (946), the k tile rows _kh_row < P (1442-1445), the u tile rows _uh_row < P
             (1777-1780); anchor G_P = g[P-1] (0 at P = 0) and w_j = e^{G_P - G_j} for j < P,
             0 otherwise (1253-1275).  Rows >= P are never loaded (k, u) or are masked (g).
  appends    physical rows [P, P + T): g = G_P + Gamma_s (1276-1283), the normalized k by the
             CTA with hv % G == 0 only (1338-1340), U (2301-2316).
  state      read-only: the kernel is built with disable_state_update=True (2800) and has no
             store to the pool.
  pad rows   idx < 0: the CTA exits before anything else is read or written (894).
  domain     P + T <= 16 (module docstring, lines 44-46: "The caller must keep P + T <= 16").
             Nothing checks it: hist_len is asserted for dtype and length only (2558), and a
             larger P appends past row 15 into the next head's ring.  check_cursors refuses it.

Physical row j of the flat ring is the fused kernel's ring slot (base + j) & 31 at base = 0,
i.e. slot j (gdn_fuzz.targets.verify_sibling maps one layout to the other).
"""

from __future__ import annotations

import torch

from .gdn import gates, normalized_qk, sequential, sequential_magnitude
from .ring import LaunchExpectation, replay

FLAT_SLOTS = 16  # physical rows per (pool slot, head): the sibling's W_RING (line 107)


def check_cursors(idx, hist_len, T: int) -> None:
    """hist_len of non-pad rows must lie in [0, 16 - T]: the sibling's domain (P + T <= 16)."""
    P = hist_len.long()
    bad = ((P < 0) | (P + T > FLAT_SLOTS)) & (idx.long() >= 0)
    if bool(bad.any()):
        raise ValueError(f"hist_len of non-pad rows must lie in [0, {FLAT_SLOTS - T}] for the flat ring "
                         f"(P + T <= {FLAT_SLOTS}, T = {T}); got {P.tolist()}")


def gather_window(k_cache, u_cache, g_cache, idx, hist_len, HV: int):
    """The window records of every row: physical rows [0, P) of pool slot idx, masked to j < P.

    k_cache [pool, H, 16, K], u_cache [pool, HV, 16, V], g_cache [pool, HV, 16].
    Returns k [B, HV, 16, K], u [B, HV, 16, V], G [B, HV, 16], valid [B, 16] (float64; masked
    entries are exactly 0, so NaN outside the window cannot leak); pad rows get an empty window.
    """
    H = k_cache.shape[1]
    live = idx.long() >= 0
    P = torch.where(live, hist_len.long(), torch.zeros_like(hist_len.long()))
    rows = idx.long().clamp(min=0)
    j = torch.arange(FLAT_SLOTS, device=P.device)
    valid = (j[None, :] < P[:, None]) & live[:, None]
    hv = torch.arange(HV, device=P.device)
    kh = hv // (HV // H)
    k = k_cache[rows[:, None, None], kh[None, :, None], j[None, None, :]].double()  # [B, HV, 16, K]
    u = u_cache[rows[:, None, None], hv[None, :, None], j[None, None, :]].double()  # [B, HV, 16, V]
    G = g_cache[rows[:, None, None], hv[None, :, None], j[None, None, :]].double()  # [B, HV, 16]
    m = valid[:, None, :]
    zero = torch.zeros((), dtype=torch.float64, device=P.device)
    return (torch.where(m[..., None], k, zero), torch.where(m[..., None], u, zero), torch.where(m, G, zero),
            valid)


def append_slots(hist_len, T: int):
    """[B, T] physical rows the T appends of each row land on: P + s (no wrap: P + T <= 16)."""
    return hist_len.long()[:, None] + torch.arange(T, device=hist_len.device)[None, :]


def launch(*, q, k, v, a, b, A_log, dt_bias, pool, idx, k_cache, u_cache, g_cache, hist_len,
           scale: float, validate: bool = True) -> LaunchExpectation:
    """One launch of the sibling in float64.  Reads its inputs, writes nothing.

    Returns an oracles.ring.LaunchExpectation so that the launch checks' metrics apply as they
    are (gdn_fuzz.checks.oracle_metrics): slots are the flat rows P + s, flush is all False (the
    sibling never folds; fold/fold_mag hold S_P only so the fields are filled, and no row is
    live for them), g_app = G_P + Gamma_s on every row (the sibling has no local restart).
    A_log and dt_bias must be the IO-rounded values the kernel sees (N4; the sibling casts them
    to bf16, _cached_bf16, lines 2511-2512).
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    if validate:
        check_cursors(idx, hist_len, T)
    g, beta = gates(a, dt_bias, A_log, b)  # [B, T, HV]
    q_hat, k_hat = normalized_qk(q, k, HV, scale)  # [B, T, HV, K]
    kw, uw, Gw, valid = gather_window(k_cache, u_cache, g_cache, idx, hist_len, HV)
    live = idx.long() >= 0
    P = torch.where(live, hist_len.long(), torch.zeros_like(hist_len.long()))
    S0 = pool[idx.long().clamp(min=0)].double()  # [B, HV, V, K]
    S_P, GP, w = replay(S0, kw, uw, Gw, valid, P)
    S_mag = torch.exp(GP)[..., None, None] * S0.abs() + torch.einsum("bhj,bhjv,bhjk->bhvk", w, uw.abs(), kw.abs())
    y, U, _ = sequential(S_P, q_hat, k_hat, v, g, beta, keep_states=False)
    y_mag, U_mag, _ = sequential_magnitude(S_mag, q_hat, k_hat, v, g, beta, keep_states=False)
    Gam = torch.cumsum(g, dim=1)  # [B, T, HV]
    return LaunchExpectation(
        y=y, y_mag=y_mag, k_app=k_hat[:, :, :: HV // H], u_app=U, u_mag=U_mag,
        g_app=Gam + GP[:, None, :], g_mag=torch.cumsum(g.abs(), dim=1) + GP.abs()[:, None, :],
        slots=append_slots(P, T), flush=torch.zeros_like(live), pad=~live, fold=S_P, fold_mag=S_mag)


def write_set(*, pool_size: int, H: int, HV: int, T: int, idx, hist_len) -> dict:
    """Every element one sibling launch may write, as booleans (True: may change).

    k_ring [pool, H, 16], u_ring / g_ring [pool, HV, 16]: rows [P, P + T) of each non-pad row's
    pool slot; pool [pool, HV]: nothing (the state is read-only).
    """
    dev = idx.device
    live = idx.long() >= 0
    rows = torch.where(live, idx.long(), torch.full_like(idx.long(), pool_size))  # pad rows -> a dropped row
    slots = append_slots(torch.where(live, hist_len.long(), torch.zeros_like(hist_len.long())), T)
    ring = torch.zeros(pool_size + 1, FLAT_SLOTS, dtype=torch.bool, device=dev)
    ring[rows[:, None].expand_as(slots), slots.clamp(max=FLAT_SLOTS - 1)] = True
    ring = ring[:pool_size]
    return dict(k_cache=ring[:, None, :].expand(pool_size, H, FLAT_SLOTS),
                u_cache=ring[:, None, :].expand(pool_size, HV, FLAT_SLOTS),
                g_cache=ring[:, None, :].expand(pool_size, HV, FLAT_SLOTS),
                initial_state_source=torch.zeros(pool_size, HV, dtype=torch.bool, device=dev))
