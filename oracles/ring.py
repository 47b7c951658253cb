"""The ring model of one ReplaySSM launch, in float64 (contract M3, M5, M6, M7, M8).

Per row b: idx = initial_state_indices[b] (negative: pad row), P = hist_len[b],
base = cache_base[b], slot(j) = (base + j) & 31.  The checkpoint S0 = pool[idx, hv] and
the window records (k_j, u_j, G_j) at slot(j), j < P, define the logical state

    S_P = e^{G_P} S0 + sum_{j<P} e^{G_P - G_j} u_j k_j^T,     G_P := G_{P-1} (0 if P = 0)   (M3)

The launch runs the T drafts from S_P (oracles.gdn.sequential), appends every draft's
(k_hat, U, G) at slot(P + s) (M5) with G measured from the checkpoint the pool holds
after the launch (M6), and on flush rows (P >= flush_min) stores S_P into the pool (M7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gdn import gates, normalized_qk, sequential, sequential_magnitude

RING_SLOTS = 32
RING_MASK = RING_SLOTS - 1
W_RING = 16


def ring_slots(base, start: int, count: int):
    """Physical ring slots (base + start + j) & 31 for j < count.  base: [B] -> [B, count]."""
    j = torch.arange(start, start + count, device=base.device)
    return (base.long()[:, None] + j[None, :]) & RING_MASK


def _cursor_error(hist_len: list) -> ValueError:
    return ValueError(f"hist_len of non-pad rows must lie in [0, {W_RING}] for the ring model; got {hist_len}")


def check_cursors(idx, hist_len) -> None:
    """hist_len of non-pad rows must lie in [0, 16] (the ring model's domain).

    One host sync when the cursors live on a GPU: callers that know the cursors already
    (checks.expectation validates them from the Case's rows, check_row_cursors) pass validate=False.
    """
    P = hist_len.long()
    if bool(((P > W_RING) | (P < 0))[idx.long() >= 0].any()):
        raise _cursor_error(P.tolist())


def check_row_cursors(slots, hist_lens) -> None:
    """check_cursors on host integers (a Case's rows: slot < 0 is a pad row), with the same error and no tensor
    op: a check calls it once per launch, where check_cursors' dozen small CPU tensor ops took ~0.19 ms."""
    if any(p > W_RING or p < 0 for s, p in zip(slots, hist_lens) if s >= 0):
        raise _cursor_error(list(hist_lens))


def gather_window(k_cache, u_cache, g_cache, idx, hist_len, cache_base, HV: int, *, validate: bool = True):
    """M3: the window records of every row, masked to j < P.

    k_cache [pool, H, 32, K], u_cache [pool, HV, 32, V], g_cache [pool, HV, 32];
    idx, hist_len, cache_base: [B].  Pad rows (idx < 0) get an empty window.
    Returns k [B, HV, 16, K], u [B, HV, 16, V], G [B, HV, 16], valid [B, 16] (float64;
    masked entries are exactly 0, so poison outside the window cannot leak).
    validate=False skips check_cursors (the caller has checked them).
    """
    H = k_cache.shape[1]
    if validate:
        check_cursors(idx, hist_len)
    P = hist_len.long()
    live_rows = idx.long() >= 0  # pad rows' cursors are never read (M8)
    P = torch.where(live_rows, P, torch.zeros_like(P))
    rows = idx.long().clamp(min=0)
    valid = (torch.arange(W_RING, device=P.device)[None, :] < P[:, None]) & (idx.long() >= 0)[:, None]
    slots = ring_slots(cache_base, 0, W_RING)  # [B, 16]
    hv = torch.arange(HV, device=P.device)
    kh = hv // (HV // H)
    k = k_cache[rows[:, None, None], kh[None, :, None], slots[:, None, :]].double()  # [B, HV, 16, K]
    u = u_cache[rows[:, None, None], hv[None, :, None], slots[:, None, :]].double()  # [B, HV, 16, V]
    G = g_cache[rows[:, None, None], hv[None, :, None], slots[:, None, :]].double()  # [B, HV, 16]
    m = valid[:, None, :]
    zero = torch.zeros((), dtype=torch.float64, device=P.device)
    k = torch.where(m[..., None], k, zero)
    u = torch.where(m[..., None], u, zero)
    G = torch.where(m, G, zero)
    return k, u, G, valid


def anchor(G, hist_len):
    """M3: G_P = G_{P-1}, or 0 for an empty window.  G [B, HV, 16] -> [B, HV]."""
    P = hist_len.long()
    last = (P - 1).clamp(0, W_RING - 1)  # pad rows may carry any cursor (M8): keep the gather in range
    GP = G.gather(2, last[:, None, None].expand(-1, G.shape[1], 1)).squeeze(2)
    return torch.where((P > 0)[:, None], GP, torch.zeros_like(GP))


def replay(S0, k, u, G, valid, hist_len):
    """M3: S_P = e^{G_P} S0 + sum_j w_j u_j k_j^T with w_j = e^{G_P - G_j} on the window.

    S0 [B, HV, V, K]; k, u, G, valid from gather_window.  Returns (S_P, GP, w) where S_P is
    [B, HV, V, K] float64 and w [B, HV, 16] (0 outside the window).
    """
    GP = anchor(G, hist_len)
    w = torch.where(valid[:, None, :], torch.exp(GP[..., None] - G), torch.zeros_like(G))
    S = torch.exp(GP)[..., None, None] * S0.double() + torch.einsum("bhj,bhjv,bhjk->bhvk", w, u, k)
    return S, GP, w


@dataclass
class LaunchExpectation:
    """What one launch must produce, in float64, plus the magnitudes that bound rounding.

    y, y_mag            [B, T, HV, V]   draft outputs (M4)
    k_app               [B, T, H, K]    normalized keys appended per k-head (M5)
    u_app, u_mag        [B, T, HV, V]   corrected updates appended (M5)
    g_app, g_mag        [B, T, HV]      cumulative log-decay appended (M6), |terms| summed
    slots               [B, T]          ring slot of draft s: (base + P + s) & 31
    flush               [B]             rows that fold (P >= flush_min, idx >= 0)
    pad                 [B]             rows with idx < 0
    fold, fold_mag      [B, HV, V, K]   S_P, the value a flush row stores (M7)
    """

    y: torch.Tensor
    y_mag: torch.Tensor
    k_app: torch.Tensor
    u_app: torch.Tensor
    u_mag: torch.Tensor
    g_app: torch.Tensor
    g_mag: torch.Tensor
    slots: torch.Tensor
    flush: torch.Tensor
    pad: torch.Tensor
    fold: torch.Tensor
    fold_mag: torch.Tensor


def launch(*, q, k, v, a, b, A_log, dt_bias, pool, idx, k_cache, u_cache, g_cache,
           hist_len, cache_base, flush_min: int, scale: float, validate: bool = True) -> LaunchExpectation:
    """One launch of the kernel, as the spec says it (M1-M8).  Reads its inputs, writes nothing.

    A_log and dt_bias must be the IO-rounded values the kernel sees (N4).  Runs on the
    inputs' device with no host round trip when validate=False (see check_cursors).
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    g, beta = gates(a, dt_bias, A_log, b)  # [B, T, HV]
    q_hat, k_hat = normalized_qk(q, k, HV, scale)  # [B, T, HV, K]
    kw, uw, Gw, valid = gather_window(k_cache, u_cache, g_cache, idx, hist_len, cache_base, HV,
                                      validate=validate)
    rows = idx.long().clamp(min=0)
    S0 = pool[rows].double()  # [B, HV, V, K]
    S_P, GP, w = replay(S0, kw, uw, Gw, valid, hist_len)
    S_mag = torch.exp(GP)[..., None, None] * S0.abs() + torch.einsum(
        "bhj,bhjv,bhjk->bhvk", w, uw.abs(), kw.abs())
    # only y and U are needed: keep_states=False holds two states at a time, not 2T
    y, U, _ = sequential(S_P, q_hat, k_hat, v, g, beta, keep_states=False)
    y_mag, U_mag, _ = sequential_magnitude(S_mag, q_hat, k_hat, v, g, beta, keep_states=False)
    return LaunchExpectation(y=y, y_mag=y_mag, u_app=U, u_mag=U_mag, fold=S_P, fold_mag=S_mag,
                             **appends(g, GP, k_hat, H, idx, hist_len, cache_base, flush_min))


def appends(g, GP, k_hat, H: int, idx, hist_len, cache_base, flush_min: int) -> dict:
    """M5/M6: what a launch appends besides the updates, and which rows flush (no state involved).

    g [B, T, HV] log-decays, GP [B, HV] anchors, k_hat [B, T, HV, K]; flush_min an int or a 0-d tensor on
    the cursors' device.  Returns the k_app, g_app, g_mag, slots, flush and pad fields of LaunchExpectation.
    """
    B, T, HV, _ = k_hat.shape
    pad = idx.long() < 0
    flush = (hist_len.long() >= flush_min) & ~pad
    Gam = torch.cumsum(g, dim=1)  # [B, T, HV], inclusive scan (M1)
    anchor_keep = torch.where(flush[:, None], torch.zeros_like(GP), GP)  # M6: flush restarts at 0
    g_app = Gam + anchor_keep[:, None, :]
    g_mag = torch.cumsum(g.abs(), dim=1) + anchor_keep.abs()[:, None, :]
    k_app = k_hat[:, :, :: HV // H]  # [B, T, H, K]: k-head i is v-head i*G's key
    slots = (cache_base.long()[:, None] + hist_len.long()[:, None]
             + torch.arange(T, device=k_hat.device)[None, :]) & RING_MASK
    return dict(k_app=k_app, g_app=g_app, g_mag=g_mag, slots=slots, flush=flush, pad=pad)


@dataclass
class WriteSet:
    """M8: every element a launch may write.  Everything outside must keep its bits.

    pool [pool, HV], k_ring [pool, H, 32], u_ring [pool, HV, 32], g_ring [pool, HV, 32],
    output_rows [B]: booleans, True where a write is expected.  The ring maps are broadcast views of one
    [pool, 32] map: read them, do not write them.
    """

    pool: torch.Tensor
    k_ring: torch.Tensor
    u_ring: torch.Tensor
    g_ring: torch.Tensor
    output_rows: torch.Tensor


def write_set(*, pool_size: int, H: int, HV: int, T: int, idx, hist_len, cache_base,
              flush_min: int) -> WriteSet:
    """M8: non-pad rows write output rows and T append slots; flush rows also write pool[idx].
    flush_min: an int or a 0-d tensor on idx's device."""
    dev = idx.device
    idx, hist_len = idx.long(), hist_len.long()  # once: on a GPU each conversion is a kernel
    live = idx >= 0
    # pad rows write nothing: they are routed to a spare row `pool_size` that is dropped
    # (no boolean indexing, so no host round trip on a GPU)
    rows = torch.where(live, idx, torch.full_like(idx, pool_size))
    slots = ring_slots(cache_base, 0, T) + hist_len[:, None]
    slots = slots & RING_MASK  # [B, T]
    true = torch.ones((), dtype=torch.bool, device=dev)  # a device value: `= True` would copy it from the host
    ring = torch.zeros(pool_size + 1, RING_SLOTS, dtype=torch.bool, device=dev)
    ring.index_put_((rows[:, None].expand_as(slots), slots), true)
    ring = ring[:pool_size]
    flush = live & (hist_len >= flush_min)
    pool = torch.zeros(pool_size + 1, HV, dtype=torch.bool, device=dev)
    pool.index_put_((torch.where(flush, rows, torch.full_like(rows, pool_size)),), true)
    pool = pool[:pool_size]
    # the per-head maps are broadcast views of the one [pool, 32] map (read-only: a copy would be a kernel each)
    return WriteSet(pool=pool,
                    k_ring=ring[:, None, :].expand(pool_size, H, RING_SLOTS),
                    u_ring=ring[:, None, :].expand(pool_size, HV, RING_SLOTS),
                    g_ring=ring[:, None, :].expand(pool_size, HV, RING_SLOTS),
                    output_rows=live)


def read_set(*, pool_size: int, H: int, HV: int, idx, hist_len, cache_base):
    """M3: ring slots each launch may read (the windows) as a [pool, 32] boolean map."""
    dev = idx.device
    live = idx.long() >= 0
    ring = torch.zeros(pool_size, RING_SLOTS, dtype=torch.bool, device=dev)
    for_rows = idx.long()[live]
    P = hist_len.long()[live]
    slots = ring_slots(cache_base[live], 0, W_RING)
    m = torch.arange(W_RING, device=dev)[None, :] < P[:, None]
    ring[for_rows[:, None].expand_as(slots)[m], slots[m]] = True
    return ring
