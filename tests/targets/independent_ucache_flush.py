"""Independent float64 target for ``gated_delta_rule_mtp_ucache_flush`` (ReplaySSM ring cache).

What it is
    A second *correct* implementation of FlashInfer's entry point, loaded by path as a
    gdn_fuzz target (one module instance per dtype arm, D1/D2 read at import).  It runs on
    CPU (or CUDA) tensors, computes everything in float64 and rounds each stored value
    exactly once: y to IO, u and k appends to RING, g appends to fp32, the fold to STATE.

How it is independent
    Written from the kernel contract (shared/docs/kernel-contract.md) only (clause ids in comments); it
    imports nothing from gdn_fuzz (no oracle, no reference target), only torch and the
    standard library.  The math is the plain sequential delta rule of M4 started from the
    window-replayed state S_h of M3 (no WY form, no kernel rounding points of N3).  Where the
    released kernel has a hazard (N1 approximations, N2 softplus overflow to -inf) this file
    computes the mathematically correct value instead.

Host checks H1-H14 and H16 run in the contract's order (flashinfer-python 0.7.2.post1's: it declares
GDN_FUZZ_RELEASE_MODEL below) with the contract's exception types, but every message is worded
differently from the released module (and from the reference target): tests of these checks must
compare exception types, clauses and the argument a message names, not message text.
H15 (CUDA only) is not applied: this target runs anywhere.
"""

import math
import os
from typing import Optional

import torch

GDN_FUZZ_RELEASE_MODEL = "0.7.2.post1"  # the release whose host-check order this file follows

# ------------------------------------------------------------------ D1/D2: dtype arm at import
_FP16_NAMES = ("fp16", "float16", "half")
_BF16_NAMES = ("bf16", "bfloat16")


def _read_env(var: str, default: str) -> str:
    return os.environ.get(var, default).strip().lower()


_IO_SPELLING = _read_env("GDN_UCACHE_IO_DTYPE", "bf16")
if _IO_SPELLING in _BF16_NAMES:
    IO_TORCH = torch.bfloat16
elif _IO_SPELLING in _FP16_NAMES:
    IO_TORCH = torch.float16
else:
    raise ValueError(f"[D1] independent target: activation dtype spelling {_IO_SPELLING!r} is not "
                     "recognised (want a bf16 or fp16 name)")


def _follower_dtype(var: str) -> torch.dtype:
    """D1: STATE/RING are empty or the IO spelling verbatim, or an fp16 name under bf16 IO."""
    s = _read_env(var, "")
    if s == "" or s == _IO_SPELLING:
        return IO_TORCH
    if s in _FP16_NAMES and IO_TORCH is torch.bfloat16:
        return torch.float16
    raise ValueError(f"[D1] independent target: {s!r} cannot be combined with activation dtype "
                     f"{_IO_SPELLING!r} (variable {var})")


ST_TORCH = _follower_dtype("GDN_UCACHE_STATE_DTYPE")
RING_TORCH = _follower_dtype("GDN_UCACHE_RING_DTYPE")

# ------------------------------------------------------------------ D3: constants
T = 16  # tile size of the production module; the draft count is 4 or 8
K_DIM = 128
V_DIM_C = 128
EPS = 1e-6
THREADS = 128
W_RING = 16
RING_SLOTS = 32
RING_MASK = RING_SLOTS - 1

_WHO = "independent ucache-flush target"


def _dense_strides(shape) -> tuple:
    """Row-major strides of a freshly allocated tensor of this shape."""
    out, acc = [], 1
    for n in reversed(tuple(shape)):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _layout_ok(t: torch.Tensor, name: str) -> bool:
    """H8: dims 1.. packed row-major, dim 0 any stride at least one block.  Returns whether the
    tensor is fully contiguous (a block-strided dim 0 is rejected later, H16)."""
    tail = tuple(t.shape[1:])
    packed = tuple(t.stride()[1:]) == _dense_strides(tail) and t.stride(0) >= math.prod(tail)
    assert packed, f"[H8] {_WHO}: {name} has a non-packed layout below dim 0 (sizes {tuple(t.shape)}, " \
                   f"strides {tuple(t.stride())})"
    return t.is_contiguous()


def _io_param(t, name: str) -> torch.Tensor:
    """N5: A_log / dt_bias are used in the IO dtype (value-wise the same as the kernel's cache)."""
    if t is None:  # H1: the released wrapper dies on `.dtype` of None here
        raise AttributeError(f"[H1] {_WHO}: {name} is None, a tensor is needed")
    return t.to(IO_TORCH)


def gated_delta_rule_mtp_ucache_flush(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    q: Optional[torch.Tensor] = None,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    b: Optional[torch.Tensor] = None,
    initial_state_source: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    disable_output: bool = False,
    recovery_steps: int = 0,
    k_cache: Optional[torch.Tensor] = None,
    u_cache: Optional[torch.Tensor] = None,
    g_cache: Optional[torch.Tensor] = None,
    hist_len: Optional[torch.Tensor] = None,
    cache_base: Optional[torch.Tensor] = None,
    flush_min: Optional[int] = None,
    restart_hist_on_flush: bool = True,
    pdl_trigger: bool = False,
) -> torch.Tensor:
    """Replay the ring window, run T drafts, append their records, fold flush rows, commit (C2)."""
    pool = initial_state_source
    # H1: the mandatory tensors
    for nm, t in (("q", q), ("k", k), ("v", v), ("b", b), ("initial_state_source", pool)):
        assert t is not None, f"[H1] {_WHO}: argument {nm} was not supplied"
    # H2: modes this kernel does not have
    if recovery_steps != 0:
        raise NotImplementedError(f"[H2] {_WHO}: no fused recovery, recovery_steps must stay 0 (got {recovery_steps})")
    if disable_output:
        raise NotImplementedError(f"[H2] {_WHO}: y is always produced; disable_output cannot be honoured")
    if intermediate_states_buffer is not None:
        raise NotImplementedError(f"[H2] {_WHO}: an intermediate_states_buffer has no meaning here")
    if accepted_steps is not None or ssm_state_indices is not None:
        raise NotImplementedError(f"[H2] {_WHO}: accepted_steps / ssm_state_indices are not handled")
    if output_state_indices is not None:
        raise NotImplementedError(f"[H2] {_WHO}: a separate output pool (output_state_indices) is not handled")
    # H3: signature-compatibility arguments
    assert softplus_beta == 1.0, f"[H3] {_WHO}: only softplus_beta 1.0 is implemented, got {softplus_beta}"
    assert softplus_threshold == 20.0, f"[H3] {_WHO}: softplus_threshold must be left at 20.0, got {softplus_threshold}"
    assert use_qk_l2norm_in_kernel, f"[H3] {_WHO}: q/k are always L2-normalised; use_qk_l2norm_in_kernel=False is refused"
    # H4: pool dtype
    assert pool.dtype == ST_TORCH, f"[H4] {_WHO}: state pool (initial_state_source) holds {pool.dtype}, this arm stores {ST_TORCH}"
    # H5: head dims (a q that is not 4-D cannot be unpacked: ValueError)
    if q.dim() != 4:
        raise ValueError(f"[H5] {_WHO}: q should be [B, T, H, K], it has {q.dim()} dims")
    B, n_tok, H, Kd = q.shape
    HV, Vd = v.shape[2], v.shape[3]
    assert Kd == K_DIM and Vd == V_DIM_C, f"[H5] {_WHO}: head size 128 needed for both q and v (q: {Kd}, v: {Vd})"
    # H6: activations in the IO dtype (a None `a` fails on its dtype: AttributeError)
    for nm, t in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        if t is None:
            raise AttributeError(f"[H1] {_WHO}: {nm} is None, a tensor is needed")
        assert t.dtype == IO_TORCH, f"[H6] {_WHO}: {nm} arrives as {t.dtype} but this arm reads {IO_TORCH} activations"
    A_log_io = _io_param(A_log, "A_log")  # N4/N5
    dt_bias_io = _io_param(dt_bias, "dt_bias")
    # H7: ring buffers and the window length
    assert k_cache is not None and u_cache is not None and g_cache is not None and hist_len is not None, \
        f"[H7] {_WHO}: the ring caches (k_cache, u_cache, g_cache) and hist_len must all be passed"
    # H8 (layouts) and H9 (ring dtypes/shapes), interleaved as in the released wrapper
    n_pool = pool.shape[0]
    contiguous = _layout_ok(pool, "initial_state_source")
    assert k_cache.dtype == RING_TORCH, f"[H9] {_WHO}: k ring (k_cache) holds {k_cache.dtype}, arm ring dtype is {RING_TORCH}"
    contiguous &= _layout_ok(k_cache, "k_cache")
    want = (n_pool, k.shape[2], RING_SLOTS, Kd)
    assert tuple(k_cache.shape) == want, f"[H9] {_WHO}: k ring (k_cache) sized {tuple(k_cache.shape)}, expected {want}"
    assert u_cache.dtype == RING_TORCH, f"[H9] {_WHO}: u ring (u_cache) holds {u_cache.dtype}, arm ring dtype is {RING_TORCH}"
    contiguous &= _layout_ok(u_cache, "u_cache")
    want = (n_pool, HV, RING_SLOTS, Vd)
    assert tuple(u_cache.shape) == want, f"[H9] {_WHO}: u ring sized {tuple(u_cache.shape)}, expected {want}"
    assert g_cache.dtype == torch.float32, f"[H9] {_WHO}: g ring must be float32, not {g_cache.dtype}"
    contiguous &= _layout_ok(g_cache, "g_cache")
    want = (n_pool, HV, RING_SLOTS)
    assert tuple(g_cache.shape) == want, f"[H9] {_WHO}: g ring sized {tuple(g_cache.shape)}, expected {want}"
    # H10
    assert hist_len.dtype == torch.int32 and hist_len.shape[0] == B, \
        f"[H10] {_WHO}: hist_len needs int32 and one entry per request ({hist_len.dtype}, {tuple(hist_len.shape)})"
    # H11: only the in-place commit mode needs caller-owned, contiguous, in-range cursors
    if restart_hist_on_flush:
        if cache_base is None:
            raise ValueError(f"[H11] {_WHO}: the in-place cursor commit has nowhere to write without cache_base")
        assert hist_len.is_contiguous() and cache_base.is_contiguous(), \
            f"[H11] {_WHO}: cursor tensors (hist_len, cache_base) must be contiguous for the in-place commit"
        capturing = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing and hist_len.numel() > 0:
            assert bool(((hist_len >= 0) & (hist_len <= W_RING)).all()), \
                f"[H11] {_WHO}: some window length (hist_len) lies outside 0..{W_RING}: {hist_len.tolist()}"
        if not capturing and cache_base.numel() > 0:
            assert bool(((cache_base >= 0) & (cache_base < RING_SLOTS)).all()), \
                f"[H11] {_WHO}: some ring base (cache_base) lies outside 0..{RING_SLOTS - 1}: {cache_base.tolist()}"
    if cache_base is None:
        cache_base = torch.zeros_like(hist_len)
    # H12
    assert cache_base.dtype == torch.int32 and cache_base.shape[0] == B, \
        f"[H12] {_WHO}: cache_base needs int32 and one entry per request ({cache_base.dtype}, {tuple(cache_base.shape)})"
    # H13: draft count
    if n_tok not in (4, 8):
        raise NotImplementedError(f"[H13] {_WHO}: drafts per request (T) must be 4 or 8, not {n_tok}")
    # H14: flush threshold
    if flush_min is None:
        flush_min = W_RING + 1 - n_tok
    assert 1 <= flush_min <= W_RING + 1 - n_tok, \
        f"[H14] {_WHO}: flush threshold (flush_min) {flush_min} must lie in 1..{W_RING + 1 - n_tok} when T is {n_tok}"
    # H16: block-strided pools/rings need a mode this target does not model
    if not contiguous:
        raise NotImplementedError(f"[H16] {_WHO}: pool and rings must be fully contiguous (no dim-0 block stride)")
    if initial_state_indices is None:
        initial_state_indices = torch.arange(B, dtype=torch.int32, device=q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(K_DIM)

    result = _launch(q, k, v, a, b, A_log_io, dt_bias_io, pool, initial_state_indices, k_cache, u_cache,
                     g_cache, hist_len, cache_base, output, float(scale), int(flush_min))

    # C2: commit after the launch, in place; pad rows are committed as well
    if restart_hist_on_flush:
        flushed = hist_len >= flush_min
        cache_base.copy_((cache_base + hist_len * flushed.to(hist_len.dtype)) & RING_MASK)
        hist_len.copy_(torch.where(flushed, torch.zeros_like(hist_len), hist_len))
    return result


def _launch(q, k, v, a, b, A_log, dt_bias, pool, indices, k_cache, u_cache, g_cache,
            hist_len, cache_base, output, scale, flush_min):
    """All reads first, float64 math, then the writes of M5-M8 (so aliasing cannot feed back)."""
    f64 = torch.float64
    dev = q.device
    B, n_tok, H, _ = q.shape
    HV, Vd = v.shape[2], v.shape[3]
    grp = HV // H  # G v-heads share one k-head
    v_heads = torch.arange(HV, device=dev)
    k_head_of = v_heads // grp  # M2: i_h = hv // G

    idx_all = indices.to(dev).long()
    rows = (idx_all >= 0).nonzero().flatten()  # M8: negative index = pad row, does nothing
    n = rows.numel()
    slot_of = idx_all[rows]
    P = hist_len.to(dev).long()[rows]
    base = cache_base.to(dev).long()[rows]

    if n > 0:
        # M1 gating: x = a + dt_bias (IO operands), g = -exp(A_log) * softplus(x), overflow-free
        x = a[rows].to(f64) + dt_bias.to(f64)
        softplus = x.clamp(min=0.0) + torch.log1p(torch.exp(-x.abs()))
        g = -torch.exp(A_log.to(f64)) * softplus  # [n, T, HV]
        beta = torch.sigmoid(b[rows].to(f64))
        Gamma = torch.cumsum(g, dim=1)  # inclusive scan

        # M2: eps inside the sqrt; scale on q only
        kk = k[rows].to(f64)
        qq = q[rows].to(f64)
        k_hat = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + EPS)  # [n, T, Hk, K]
        q_hat = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + EPS) * scale
        k_v = k_hat[:, :, k_head_of]  # per v-head: [n, T, HV, K]
        q_v = q_hat[:, :, k_head_of]

        # M3: window j in [0, P) at slot (base + j) & 31; masked lanes never contribute
        win = P.clamp(0, W_RING)  # out-of-contract P (restart=False, 1.3): clamp the window
        lanes = torch.arange(W_RING, device=dev)
        inside = lanes[None, :] < win[:, None]  # [n, 16]
        wslot = (base[:, None] + lanes[None, :]) & RING_MASK
        r3, h3, s3 = slot_of[:, None, None], v_heads[None, :, None], wslot[:, None, :]
        k_win = k_cache[r3, k_head_of[None, :, None], s3].to(f64)  # [n, HV, 16, K]
        u_win = u_cache[r3, h3, s3].to(f64)  # [n, HV, 16, V]
        g_win = g_cache[r3, h3, s3].to(f64)  # [n, HV, 16]
        m = inside[:, None, :].expand(n, HV, W_RING)
        k_win = torch.where(m[..., None], k_win, torch.zeros((), dtype=f64, device=dev))
        u_win = torch.where(m[..., None], u_win, torch.zeros((), dtype=f64, device=dev))
        last = (win - 1).clamp(min=0)[:, None, None].expand(n, HV, 1)
        G_P = torch.where((win > 0)[:, None], g_win.gather(2, last).squeeze(2), torch.zeros((), dtype=f64, device=dev))
        w = torch.where(m, torch.exp(G_P[..., None] - torch.where(m, g_win, G_P[..., None])),
                        torch.zeros((), dtype=f64, device=dev))
        S0 = pool[slot_of].to(f64)  # [n, HV, V, K]
        S_h = torch.exp(G_P)[..., None, None] * S0 + torch.einsum("nhj,nhjv,nhjk->nhvk", w, u_win, k_win)

        # M4: plain sequential delta rule from S_h, one (b, hv) state per batch entry of S
        nb = n * HV
        S = S_h.reshape(nb, Vd, -1).clone()  # [n*HV, V, K]; S_h itself is kept for the fold
        decay = torch.exp(g).permute(1, 0, 2).reshape(n_tok, nb, 1, 1)
        beta_t = beta.permute(1, 0, 2).reshape(n_tok, nb, 1)
        v_t = v[rows].to(f64).permute(1, 0, 2, 3).reshape(n_tok, nb, Vd)
        k_t = k_v.permute(1, 0, 2, 3).reshape(n_tok, nb, -1)
        q_t = q_v.permute(1, 0, 2, 3).reshape(n_tok, nb, -1)
        ys, us = [], []
        for t in range(n_tok):
            S.mul_(decay[t])  # e^{g_t} S_{t-1}
            pred = torch.bmm(S, k_t[t, :, :, None])[..., 0]
            U = beta_t[t] * (v_t[t] - pred)  # U_t = beta_t (v_t - e^{g_t} S_{t-1} k_t)
            S.baddbmm_(U[:, :, None], k_t[t, :, None, :])  # S_t = e^{g_t} S_{t-1} + U_t k_t^T
            ys.append(torch.bmm(S, q_t[t, :, :, None])[..., 0])  # y_t = S_t q_t
            us.append(U)
        y = torch.stack(ys).reshape(n_tok, n, HV, Vd).permute(1, 0, 2, 3)  # [n, T, HV, V]
        U_all = torch.stack(us).reshape(n_tok, n, HV, Vd).permute(1, 0, 2, 3)

        # M6: verify rows store G_P + Gamma_s, flush rows (P >= flush_min) restart at 0
        flush = P >= flush_min
        g_rec = Gamma + torch.where(flush[:, None], torch.zeros_like(G_P), G_P)[:, None, :]

        # M5: appends at slot (base + P + s) & 31, all T tokens
        aslot = (base[:, None] + P[:, None] + torch.arange(n_tok, device=dev)[None, :]) & RING_MASK
        writers = k_head_of[::grp]  # the k-heads, each written once (by its hv % G == 0 v-head)
        k_cache[slot_of[:, None, None], writers[None, :, None], aslot[:, None, :]] = \
            k_hat[:, :, writers].permute(0, 2, 1, 3).to(k_cache.dtype)
        u_cache[slot_of[:, None, None], v_heads[None, :, None], aslot[:, None, :]] = \
            U_all.permute(0, 2, 1, 3).to(u_cache.dtype)
        g_cache[slot_of[:, None, None], v_heads[None, :, None], aslot[:, None, :]] = \
            g_rec.permute(0, 2, 1).to(g_cache.dtype)
        # M7: flush rows fold the window state S_h (drafts not folded)
        if bool(flush.any()):
            pool[slot_of[flush]] = S_h[flush].to(pool.dtype)
        y_io = y.to(IO_TORCH)
    else:
        y_io = torch.zeros(0, n_tok, HV, Vd, dtype=IO_TORCH, device=dev)

    # M8 / table 1.1: the output argument
    shape = (B, n_tok, HV, Vd)
    if output is not None and tuple(output.shape) == shape:
        # in place when exact; otherwise the same rows with a (silent) dtype conversion, pad rows kept
        output[rows] = y_io.to(output.dtype)
        return output
    fresh = torch.zeros(shape, dtype=IO_TORCH, device=dev)
    fresh[rows] = y_io
    if output is None:
        return fresh
    output.copy_(fresh)
    return output


__all__ = ["gated_delta_rule_mtp_ucache_flush", "K_DIM", "V_DIM_C", "W_RING", "RING_SLOTS", "RING_MASK",
           "IO_TORCH", "ST_TORCH", "RING_TORCH"]
