"""Reference target: a plain torch implementation of the production entry point.

Same signature, module constants, import-time dtype selection (D1-D2) and host checks
(H1-H14, H16-H22, in the order of flashinfer-python 0.7.4: it declares GDN_FUZZ_RELEASE_MODEL
below, so gdn_fuzz models it with that release's host checks) as FlashInfer's
``gdn_decode_bf16_wy_ucache_flush.gated_delta_rule_mtp_ucache_flush``.  It runs on any
torch device, so the CUDA-only probes are not applied (H15, the device probe of H19, the
capture probe of H11), and it has no UMMA backend: backend="umma" is refused (H20), "auto"
and "hmma" run this code.  It computes in float32 with
rounding at the stores the contract names (N3): q_hat/k_hat to PACK, appended u to RING,
y to IO, the folded checkpoint to STATE.  It writes exactly the contract's write set
(M8): T append slots per non-pad row, the pool row of flush rows, the output rows of
non-pad rows; nothing else.

This file is self-contained (torch only) so the loader can import it by path, once per
dtype arm, exactly like the production module.  It deliberately shares no code with the
float64 oracle: a shared helper would hide a shared bug.
"""

import math
import os
from typing import Optional

import torch

# ---------------------------------------------------------------- D1: dtypes at import
_IO_ENV = os.environ.get("GDN_UCACHE_IO_DTYPE", "bf16").strip().lower()
if _IO_ENV in ("fp16", "float16", "half"):
    IO_TORCH = torch.float16
elif _IO_ENV in ("bf16", "bfloat16"):
    IO_TORCH = torch.bfloat16
else:
    raise ValueError(f"GDN_UCACHE_IO_DTYPE={_IO_ENV!r} unsupported: use 'bf16' or 'fp16'.")


def _narrow_dtype(var: str, what: str) -> torch.dtype:
    """STATE / RING dtype (D1): the IO dtype, or fp16 beside bf16 IO."""
    env = os.environ.get(var, "").strip().lower()
    if env in ("", _IO_ENV):
        return IO_TORCH
    if env in ("fp16", "float16", "half") and IO_TORCH is torch.bfloat16:
        return torch.float16
    raise ValueError(f"{var}={env!r} with IO={_IO_ENV!r} unsupported: "
                     f"{what} dtype must equal the IO dtype, or be 'fp16' with bf16 IO.")


_ST_ENV = os.environ.get("GDN_UCACHE_STATE_DTYPE", "").strip().lower()  # named in the H4 message
ST_TORCH = _narrow_dtype("GDN_UCACHE_STATE_DTYPE", "state")
RING_TORCH = _narrow_dtype("GDN_UCACHE_RING_DTYPE", "ring")
# D2: q_hat/k_hat are stored fp16 only in the combined state+ring fp16 mode.
PACK_TORCH = torch.float16 if (ST_TORCH is torch.float16 and RING_TORCH is torch.float16
                               and IO_TORCH is torch.bfloat16) else IO_TORCH

# the release whose host checks this file follows (gdn_fuzz.targets.releases.detect reads it)
GDN_FUZZ_RELEASE_MODEL = "0.7.4"

# ---------------------------------------------------------------- D3: constants
T = 16  # the production module's tile size; draft T is 4 or 8
K_DIM = 128
V_DIM_C = 128
EPS = 1e-6
THREADS = 128
W_RING = 16
RING_SLOTS = 32
RING_MASK = RING_SLOTS - 1


def _inner_dense(t: torch.Tensor, name: str) -> bool:
    dense_inner = torch.empty(t.shape[1:], device="meta").stride()
    assert tuple(t.stride()[1:]) == tuple(dense_inner) and t.stride(0) >= (
        t.shape[1] * dense_inner[0] if t.dim() > 1 else 1
    ), (
        f"{name}: inner dims must be dense (block-strided dim 0 is OK); "
        f"got shape {tuple(t.shape)} strides {tuple(t.stride())}"
    )
    return t.is_contiguous()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _cast_io(t: torch.Tensor) -> torch.Tensor:
    """N5: A_log / dt_bias in the IO dtype (no id()-keyed cache here: the reference recasts)."""
    if t.dtype == IO_TORCH and t.is_contiguous():
        return t
    return t.to(IO_TORCH).contiguous()


def _l2n(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)


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
    backend: str = "auto",
    stochastic_rounding: Optional[str] = None,
    rand_seed: Optional[torch.Tensor] = None,
    philox_rounds: int = 10,
) -> torch.Tensor:
    """Verify T drafts through the ring window, append their records, fold flush rows."""
    # ---- H1
    assert q is not None and k is not None and v is not None
    assert b is not None and initial_state_source is not None
    # ---- H2
    name = "gated_delta_rule_mtp_ucache_flush"
    if recovery_steps != 0:
        raise NotImplementedError(f"{name}: recovery_steps>0 is not supported (fused recovery is not implemented).")
    if disable_output:
        raise NotImplementedError(f"{name}: disable_output=True (state-only mode) is not supported "
                                  "(this kernel always emits output).")
    if intermediate_states_buffer is not None:
        raise NotImplementedError(f"{name}: intermediate-state caching is not supported.")
    if accepted_steps is not None or ssm_state_indices is not None:
        raise NotImplementedError(f"{name}: per-request K / FLA-scatter is not supported.")
    if output_state_indices is not None:
        raise NotImplementedError(f"{name}: split-pool (output_state_indices) is not supported.")
    # ---- H3
    assert softplus_beta == 1.0, f"softplus_beta={softplus_beta} not supported (kernel hardcodes beta=1.0)."
    assert softplus_threshold == 20.0, (
        f"softplus_threshold={softplus_threshold} not supported (kernel ignores "
        "the threshold; pass 20.0 for signature compatibility)."
    )
    assert use_qk_l2norm_in_kernel, (
        f"{name}: use_qk_l2norm_in_kernel=False is not supported "
        "(the kernel always applies Q/K L2 normalization)."
    )
    # ---- H4
    assert initial_state_source.dtype == ST_TORCH, (
        f"initial_state_source must be {ST_TORCH} (pool, HV, V, K) — module "
        f"STATE dtype (GDN_UCACHE_IO_DTYPE={_IO_ENV!r}, "
        f"GDN_UCACHE_STATE_DTYPE={_ST_ENV!r}); got {initial_state_source.dtype}."
    )
    # ---- H5
    B, Tq, H, K_dim = q.shape
    HV = v.shape[2]
    V_dim = v.shape[3]
    device = q.device
    assert K_dim == K_DIM and V_dim == V_DIM_C, f"this kernel requires K==V=={K_DIM}; got K={K_dim}, V={V_dim}."
    if scale is None:
        scale = 1.0 / math.sqrt(K_dim)
    if initial_state_indices is None:
        initial_state_indices = torch.arange(B, dtype=torch.int32, device=device)
    # ---- H6
    assert (q.dtype == IO_TORCH and k.dtype == IO_TORCH and v.dtype == IO_TORCH
            and a.dtype == IO_TORCH and b.dtype == IO_TORCH), (
        f"module compiled for {IO_TORCH} IO (GDN_UCACHE_IO_DTYPE={_IO_ENV!r}); got "
        f"q={q.dtype} k={k.dtype} v={v.dtype} a={a.dtype} b={b.dtype}. SMEM tiles "
        "and packed-pair PTX specialize on the IO dtype — mixed dtypes would "
        "silently reinterpret bits."
    )
    HK = k.shape[2]
    # ---- H11
    if restart_hist_on_flush and hist_len is not None:
        if cache_base is None:
            raise ValueError(
                f"{name}: restart_hist_on_flush=True commits ring cursors in place and needs a caller-owned "
                "cache_base (got None). Keep a persistent int32 [B] tensor (zeros initially) across calls, or "
                "pass restart_hist_on_flush=False and own the cursor commit.")
        assert hist_len.is_contiguous() and cache_base.is_contiguous(), (
            "restart_hist_on_flush=True: hist_len and cache_base must be contiguous — .contiguous() would "
            "copy them and the in-place cursor commit would be lost on the caller's tensors.")
        if not _capturing(device):
            lo, hi = (int(x.item()) for x in hist_len.aminmax())
            assert lo >= 0 and hi <= W_RING, f"hist_len out of legal range [0, {W_RING}]: min={lo} max={hi}"
            lo, hi = (int(x.item()) for x in cache_base.aminmax())
            assert lo >= 0 and hi < RING_SLOTS, f"cache_base out of legal range [0, {RING_SLOTS}): min={lo} max={hi}"
    # ---- H17: a 5-D (uGPU) pool is the Rubin UMMA build's, which the reference does not have
    if initial_state_source.dim() == 5:
        if backend not in ("auto", "umma"):
            raise ValueError(f"{name}: uGPU buffers (a 5-D state pool) need backend 'auto' or 'umma', got {backend!r}.")
        raise ValueError(f"{name}: uGPU buffers are served by the UMMA backend only, unavailable: "
                         "the reference implementation has no UMMA backend.")
    A_log_io = _cast_io(A_log)  # N5: cast to the IO dtype
    dt_bias_io = _cast_io(dt_bias)
    h0 = initial_state_source
    # ---- H7
    assert (k_cache is not None and u_cache is not None and g_cache is not None
            and hist_len is not None), "gated_delta_rule_mtp_ucache: k_cache/u_cache/g_cache/hist_len are required."
    # ---- H8, H9
    pool = h0.shape[0]
    contig = _inner_dense(h0, "initial_state_source")
    assert k_cache.dtype == RING_TORCH, (
        f"k_cache must be {RING_TORCH} (module RING dtype, see GDN_UCACHE_RING_DTYPE); got {k_cache.dtype}.")
    contig &= _inner_dense(k_cache, "k_cache")
    assert tuple(k_cache.shape) == (pool, HK, RING_SLOTS, K_dim), (
        f"k_cache must be [pool={pool}, H={HK}, {RING_SLOTS}, K={K_dim}]; got {tuple(k_cache.shape)}")
    # H9': an fp16 u ring beside bf16 rings is the UMMA backend's mixed arm (D5); H21 refuses it below
    u_mixed = u_cache.dtype != RING_TORCH
    assert not u_mixed or (u_cache.dtype == torch.float16 and RING_TORCH is torch.bfloat16), (
        f"u_cache must be {RING_TORCH} (module RING dtype, see GDN_UCACHE_RING_DTYPE) or, with bf16 "
        f"rings, fp16 (UMMA backend only); got {u_cache.dtype}.")
    contig &= _inner_dense(u_cache, "u_cache")
    assert tuple(u_cache.shape) == (pool, HV, RING_SLOTS, V_dim)
    assert g_cache.dtype == torch.float32
    contig &= _inner_dense(g_cache, "g_cache")
    assert tuple(g_cache.shape) == (pool, HV, RING_SLOTS)
    # ---- H10
    assert hist_len.dtype == torch.int32 and hist_len.shape[0] == B
    if cache_base is None:
        cache_base = torch.zeros_like(hist_len)
    # ---- H12
    assert cache_base.dtype == torch.int32 and cache_base.shape[0] == B
    # ---- H18-H22: the backend (no UMMA here: "auto" and "hmma" run this code)
    if backend not in ("auto", "umma", "hmma"):
        raise ValueError(f"{name}: backend={backend!r}; use 'auto', 'umma' or 'hmma'.")
    why = "backend='hmma' was requested" if backend == "hmma" else "the reference implementation has no UMMA backend"
    if backend == "umma":
        raise ValueError(f"{name}: backend='umma' unavailable: {why}.")
    if u_mixed:
        raise ValueError(f"{name}: an fp16 u_cache with bf16 k_cache is served by the UMMA backend only ({why}); "
                         f"the HMMA kernel needs both rings in {RING_TORCH}.")
    if stochastic_rounding not in (None, "none"):
        raise NotImplementedError(
            f"{name}: stochastic rounding of the flushed state is implemented by the UMMA backend only (SM100, "
            "bf16 IO and rings, fp16 state); the HMMA kernel rounds to nearest.")
    # ---- H13
    if Tq not in (4, 8):
        raise NotImplementedError(
            f"{name}: T={Tq} unsupported — native T in "
            "{{4, 8}} only (T=16 leaves no ring headroom; other T have no serving user).")
        # the doubled braces are production's text verbatim (its second piece is not an f-string)
    # ---- H14
    if flush_min is None:
        flush_min = W_RING - Tq + 1
    assert 1 <= flush_min <= W_RING - Tq + 1, (
        f"flush_min={flush_min} out of range [1, {W_RING - Tq + 1}] for T={Tq} "
        "(above the cap, a request could neither append nor flush).")
    # ---- H16
    if not contig:
        raise NotImplementedError(
            "block-strided state pools require the static-descriptor mode: set SGLANG_GDN_WY_STRIDED_QKV=1 "
            "and pass q/k/v slices sharing a token stride (the compact-dynamic descriptors assume contiguous pools).")

    out = _compute_and_store(
        q=q, k=k, v=v, a=a, b=b, A_log=A_log_io, dt_bias=dt_bias_io, h0=h0, idx=initial_state_indices,
        k_cache=k_cache, u_cache=u_cache, g_cache=g_cache, hist_len=hist_len, cache_base=cache_base,
        output=output, scale=float(scale), flush_min=int(flush_min))

    # C2: the standalone commit, in place on the caller's cursors
    if restart_hist_on_flush:
        flushed = hist_len >= flush_min
        cache_base.copy_((cache_base + hist_len * flushed) & (RING_SLOTS - 1))
        hist_len.masked_fill_(flushed, 0)
    return out


def _compute_and_store(*, q, k, v, a, b, A_log, dt_bias, h0, idx, k_cache, u_cache, g_cache,
                       hist_len, cache_base, output, scale, flush_min):
    B, Tq, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    dev = q.device
    idx = idx.to(dev).long()
    P = hist_len.to(dev).long()
    base = cache_base.to(dev).long()
    live = idx >= 0
    rows = idx.clamp(min=0)

    # M1 gating (f32, no softplus threshold: x >~ 88.7 gives g = -inf, as in the kernel, N2)
    x = a.float() + dt_bias.float()[None, None, :]
    g = -torch.exp(A_log.float())[None, None, :] * torch.log1p(torch.exp(x))  # [B, T, HV]
    beta = torch.sigmoid(b.float())
    Gam = torch.cumsum(g, dim=1)
    # M2 norms, stored in PACK
    q_hat = (_l2n(q) * scale).to(PACK_TORCH).float().repeat_interleave(G, dim=2)  # [B, T, HV, K]
    k_pack = _l2n(k).to(PACK_TORCH)  # [B, T, H, K]
    k_hat = k_pack.float().repeat_interleave(G, dim=2)

    # M3 window: 16 lanes, lane j valid when j < P; anchor lane P-1 (an unloaded lane reads 0)
    lanes = torch.arange(W_RING, device=dev)
    slots = (base[:, None] + lanes[None, :]) & RING_MASK  # [B, 16]
    valid = (lanes[None, :] < P[:, None]) & live[:, None]
    hv = torch.arange(HV, device=dev)
    kw = k_cache[rows[:, None, None], (hv // G)[None, :, None], slots[:, None, :]].float()
    uw = u_cache[rows[:, None, None], hv[None, :, None], slots[:, None, :]].float()
    gw = g_cache[rows[:, None, None], hv[None, :, None], slots[:, None, :]].float()
    m = valid[:, None, :]
    kw = torch.where(m[..., None], kw, 0.0)
    uw = torch.where(m[..., None], uw, 0.0)
    anchor_lane = (P - 1).clamp(0, W_RING - 1)
    GP = gw.gather(2, anchor_lane[:, None, None].expand(B, HV, 1)).squeeze(2)
    GP = torch.where(((P >= 1) & (P <= W_RING) & live)[:, None], GP, 0.0)  # [B, HV]
    w = torch.where(m, torch.exp(GP[..., None] - torch.where(m, gw, 0.0)), 0.0)
    S0 = h0[rows].float()  # [B, HV, V, K]
    wu = (w[..., None] * uw).to(u_cache.dtype).float()  # N3: w*u rounded to RING
    S = torch.exp(GP)[..., None, None] * S0 + torch.einsum("bhjv,bhjk->bhvk", wu, kw)
    fold = S.to(h0.dtype)

    # M4 drafts, sequential form, f32.  N2: the kernel's WY form weighs token c by e^{G_t - G_c} for
    # c <= t, the diagonal included, so a -inf G (softplus overflow) gives NaN there, not a zero
    # decay: `own` (1, or NaN where G_t = -inf) carries that into U and y as the kernel documents.
    ys, Us = [], []
    for t in range(Tq):
        own = torch.exp(Gam[:, t] - Gam[:, t])[..., None]  # [B, HV, 1]
        S = torch.exp(g[:, t])[..., None, None] * S
        U = own * beta[:, t, :, None] * (v[:, t].float() - torch.einsum("bhvk,bhk->bhv", S, k_hat[:, t]))
        S = S + U[..., :, None] * k_hat[:, t, :, None, :]
        ys.append(torch.einsum("bhvk,bhk->bhv", S, q_hat[:, t]))
        Us.append(U)
    y = torch.stack(ys, 1).to(q.dtype)  # [B, T, HV, V]
    U = torch.stack(Us, 1).to(u_cache.dtype)  # [B, T, HV, V]

    # M5/M6 appends at (base + P + s) & 31 for non-pad rows
    flush = (P >= flush_min) & live
    g_app = Gam + torch.where(flush[:, None], 0.0, GP)[:, None, :]  # [B, T, HV]
    aslots = (base[:, None] + P[:, None] + torch.arange(Tq, device=dev)[None, :]) & RING_MASK  # [B, T]
    r = rows[live][:, None].expand(-1, Tq)
    s = aslots[live]
    k_cache.permute(0, 2, 1, 3)[r, s] = k_pack[live].to(k_cache.dtype)
    u_cache.permute(0, 2, 1, 3)[r, s] = U[live]
    g_cache.permute(0, 2, 1)[r, s] = g_app[live].to(g_cache.dtype)
    # M7 fold
    if bool(flush.any()):
        h0[idx[flush]] = fold[flush]

    # M8 output: in place when it is exactly [B, T, HV, V], IO dtype and contiguous
    if (output is not None and tuple(output.shape) == (B, Tq, HV, V)
            and output.dtype == q.dtype and output.is_contiguous()):
        output[live] = y[live]
        return output
    out = torch.empty(B, Tq, HV, V, dtype=q.dtype, device=dev)
    out[live] = y[live]
    if output is None:
        return out
    output.copy_(out)
    return output


__all__ = [
    "gated_delta_rule_mtp_ucache_flush",
    "K_DIM",
    "V_DIM_C",
    "W_RING",
    "RING_SLOTS",
    "RING_MASK",
]
