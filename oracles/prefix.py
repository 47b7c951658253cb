"""The prefix materializer in float64 (kernel-contract-0.7.4.md PMM1-PMM4, PMS1-PMS5).

For a processed request with checkpoint slot src, ring origin base, count C (0 <= C <= 16) and ring
depth R: slot_j = (base + j) & (R - 1), and with g_j, u_j, k_j read at src (k at key head hv // (HV/H)),

    S_C = e^{G_C} S0 + sum_{j<C} e^{G_C - g_j} u_j k_j^T,      G_C = g_{C-1} (0 when C = 0)     (PMM3)

written to dst.  Which requests are processed (PMM1, PMM2):
  * the active list: given, or derived by the wrapper as the rows with count >= 0 in index order, then
    -1 (PMS5); num_active: given, or the derived list's length, or B when only the list is given;
  * entries v < min(num_active, B) of the list (PMS4), with entry >= 0 (PMS3: -1 is skipped, not a stop);
  * a request with src < 0, dst < 0, count < 0 or count > 16 is skipped (PMS1).
Nothing else is written (PMW1-PMW3).

Besides S the expectation carries the magnitudes the PMN5 bound is made of (gdn_fuzz.compare.prefix_bound):
M = e^{G_C}|S0| + sum_j w_j |u_j| |k_j|^T, W = sum_j w_j |u_j| |k_j|^T, U = sum_j |u_j| |k_j|^T, A (the largest
exponent argument per (request, head)), ksum[k] = sum_j |k_j[k]|.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

W_RING = 16


def active_entries(count, active, num_active) -> list[int]:
    """The rows the kernel walks, in list order (PMM1, PMS3-PMS5): the first min(num_active, B) entries of
    the active list (derived from count >= 0 when None), -1 entries left out.  CPU lists of ints."""
    count = [int(c) for c in count]
    B = len(count)
    if active is None:
        live = [i for i, c in enumerate(count) if c >= 0]
        active = live + [-1] * (B - len(live))
        if num_active is None:
            num_active = len(live)
    active = [int(a) for a in active]
    n = B if num_active is None else int(num_active)
    return [a for a in active[:max(0, min(n, B))] if a >= 0]


def processed(src, dst, count, active=None, num_active=None) -> list[int]:
    """active_entries less the skipped requests (PMS1)."""
    s, d, c = ([int(x) for x in t] for t in (src, dst, count))
    return [p for p in active_entries(c, active, num_active)
            if s[p] >= 0 and d[p] >= 0 and 0 <= c[p] <= W_RING]


@dataclass
class PrefixExpectation:
    """rows: the processed rows (physical batch rows, list order); dst: their destination slots;
    S [n, HV, V, K] float64: the states they must hold; M, W, U [n, HV, V, K], A [n, HV], ksum [n, HV, K]:
    the magnitudes of the PMN5 bound; copy [n] bool: count == 0 (PMS2: an exact copy)."""

    rows: list
    dst: list
    S: torch.Tensor
    M: torch.Tensor
    W: torch.Tensor
    U: torch.Tensor
    A: torch.Tensor
    ksum: torch.Tensor
    copy: torch.Tensor


def materialize(state, k_cache, u_cache, g_cache, src_slots, dst_slots, cache_base, count,
                active_request_indices=None, num_active=None) -> PrefixExpectation:
    """PMM3 for every processed request, in float64 on state's device."""
    dev = state.device
    HV, V, K = state.shape[1:]
    H, R = k_cache.shape[1], k_cache.shape[2]
    src, dst, base, cnt = (t.detach().cpu().long().tolist() for t in (src_slots, dst_slots, cache_base, count))
    act = None if active_request_indices is None else active_request_indices.cpu().tolist()
    na = None if num_active is None else int(num_active.reshape(-1)[0])
    rows = processed(src, dst, cnt, act, na)
    n = len(rows)
    z = torch.zeros(n, HV, V, K, dtype=torch.float64, device=dev)
    if n == 0:
        e = torch.zeros(0, HV, dtype=torch.float64, device=dev)
        return PrefixExpectation([], [], z, z, z, z, e, torch.zeros(0, HV, K, dtype=torch.float64, device=dev),
                                 torch.zeros(0, dtype=torch.bool))
    s_ = torch.tensor([src[p] for p in rows], device=dev)
    C = torch.tensor([cnt[p] for p in rows], device=dev)
    j = torch.arange(W_RING, device=dev)
    slots = (torch.tensor([base[p] for p in rows], device=dev)[:, None] + j[None, :]) & (R - 1)  # [n, 16]
    valid = j[None, :] < C[:, None]  # [n, 16]
    hv = torch.arange(HV, device=dev)
    kh = hv // (HV // H)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    g = g_cache[s_[:, None, None], hv[None, :, None], slots[:, None, :]].double()  # [n, HV, 16]
    u = u_cache[s_[:, None, None], hv[None, :, None], slots[:, None, :]].double()  # [n, HV, 16, V]
    k = k_cache[s_[:, None, None], kh[None, :, None], slots[:, None, :]].double()  # [n, HV, 16, K]
    m = valid[:, None, :]
    g = torch.where(m, g, zero)  # rows j >= C are never read (PMM3's NaN safety): exactly 0 here
    u = torch.where(m[..., None], u, zero)
    k = torch.where(m[..., None], k, zero)
    last = (C - 1).clamp(min=0)
    GC = torch.where((C > 0)[:, None], g.gather(2, last[:, None, None].expand(-1, HV, 1)).squeeze(2), zero)  # [n, HV]
    arg = torch.where(m, GC[..., None] - g, zero)
    w = torch.where(m, torch.exp(arg), zero)  # [n, HV, 16]
    S0 = state[s_].double()
    bdec = torch.exp(GC)[..., None, None]
    S = bdec * S0 + torch.einsum("nhj,nhjv,nhjk->nhvk", w, u, k)
    W = torch.einsum("nhj,nhjv,nhjk->nhvk", w, u.abs(), k.abs())
    U = torch.einsum("nhjv,nhjk->nhvk", u.abs(), k.abs())
    M = bdec * S0.abs() + W
    A = torch.maximum(GC.abs(), arg.abs().amax(-1))
    ksum = k.abs().sum(2)  # [n, HV, K]
    return PrefixExpectation(rows, [dst[p] for p in rows], S, M, W, U, A, ksum, (C == 0).cpu())


__all__ = ["active_entries", "processed", "PrefixExpectation", "materialize", "W_RING"]
