"""Reference target of the prefix materializer: a plain torch gdn_prefix_materialize.

Same signature, import-time dtype selection (the D1 variables, as the package copy of the flush
module reads them: PMD2) and host checks (PMH1-PMH15, PMH17-PMH19 in 0.7.4's order; it declares
GDN_FUZZ_RELEASE_MODEL below) as FlashInfer 0.7.4's flashinfer/gdn_kernels/gdn_prefix_materialize.py.
It runs on any torch device, so the CUDA-only checks are not applied (num_active on CUDA in PMH13, the
device probe PMH16).  It computes in float32 with the roundings the contract names (PMN1-PMN4): w_j u_j
rounded to RING, an f32 accumulation, one rounding to STATE; count == 0 is a bit copy (PMS2).  It writes
exactly state[dst] of every processed request (PMW1-PMW3).

Self-contained (torch only) so the loader can import it by path once per dtype arm; it shares no
code with the float64 oracle (oracles/prefix.py).
"""

import os
from typing import Optional

import torch


def _dtype(var: str, default: torch.dtype) -> torch.dtype:
    env = os.environ.get(var, "").strip().lower()
    if env in ("fp16", "float16", "half"):
        return torch.float16
    if env in ("bf16", "bfloat16"):
        return torch.bfloat16
    if env == "":
        return default
    raise ValueError(f"{var}={env!r} unsupported: use 'bf16' or 'fp16'.")


IO_TORCH = _dtype("GDN_UCACHE_IO_DTYPE", torch.bfloat16)
ST_TORCH = _dtype("GDN_UCACHE_STATE_DTYPE", IO_TORCH)
RING_TORCH = _dtype("GDN_UCACHE_RING_DTYPE", IO_TORCH)

GDN_FUZZ_RELEASE_MODEL = "0.7.4"
K_DIM = 128
V_DIM_C = 128
W_RING = 16
LOG2E = 1.4426950408889634


def _check_pool_layout(t: torch.Tensor, name: str) -> None:
    if t.is_contiguous():
        return
    dense = 1
    for i in range(t.dim() - 1, 0, -1):
        if t.stride(i) != dense:
            raise ValueError(f"{name}: only the slot (dim-0) stride may be padded; dim {i} has stride "
                             f"{t.stride(i)}, expected dense {dense}")
        dense *= t.shape[i]
    if t.stride(0) < dense:
        raise ValueError(f"{name}: overlapping slot stride {t.stride(0)}")
    if t.dtype != torch.float32 and (t.stride(0) * t.element_size()) % 16:
        raise ValueError(f"{name}: padded slot stride must keep slots 16-byte aligned")


def gdn_prefix_materialize(
    state: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    k_cache: torch.Tensor,
    u_cache: torch.Tensor,
    g_cache: torch.Tensor,
    cache_base: torch.Tensor,
    count: torch.Tensor,
    active_request_indices: Optional[torch.Tensor] = None,
    num_active: Optional[torch.Tensor] = None,
    *,
    min_blocks_per_mp: int = 8,
) -> torch.Tensor:
    if state.dim() != 4:  # PMH1
        raise ValueError(f"state must be [pool, HV, V, K]; got state.dim()={state.dim()}")
    if k_cache.dim() != 4 or u_cache.dim() != 4 or g_cache.dim() != 3:  # PMH2
        raise ValueError(f"k_cache [pool,H,RING,K], u_cache [pool,HV,RING,V], g_cache [pool,HV,RING]; got dims "
                         f"{k_cache.dim()}/{u_cache.dim()}/{g_cache.dim()}")
    _pool, HV, V_dim, K_dim = state.shape
    H = k_cache.shape[1]
    if K_dim != K_DIM or V_dim != V_DIM_C:  # PMH3
        raise ValueError(f"state: this kernel is fixed at K == V == {K_DIM}; got V={V_dim}, K={K_dim}")
    if HV % H:  # PMH4 (H = 0: ZeroDivisionError, as released)
        raise ValueError(f"HV must be a multiple of H (k_cache heads); got HV={HV}, H={H}")
    if k_cache.shape[3] != K_dim or u_cache.shape[3] != V_dim:  # PMH5
        raise ValueError("ring feature dims must match the state (k_cache/u_cache last dim)")
    if u_cache.shape[1] != HV or g_cache.shape[1] != HV:  # PMH6
        raise ValueError(f"u_cache/g_cache head dims must equal state HV ({HV}); got {u_cache.shape[1]}/{g_cache.shape[1]}")
    if k_cache.dtype != RING_TORCH or u_cache.dtype != RING_TORCH:  # PMH7
        raise ValueError(f"k_cache/u_cache dtype must be {RING_TORCH}; got {k_cache.dtype}/{u_cache.dtype}")
    R = k_cache.shape[2]
    if u_cache.shape[2] != R or g_cache.shape[2] != R:  # PMH8
        raise ValueError(f"ring depths disagree: k_cache={R}, u_cache={u_cache.shape[2]}, g_cache={g_cache.shape[2]}")
    if R & (R - 1) or R < W_RING:  # PMH9
        raise ValueError(f"ring depth (k_cache.shape[2]) must be a power of two >= {W_RING}; got {R}")
    if g_cache.dtype != torch.float32:  # PMH10
        raise ValueError(f"g_cache must be float32; got {g_cache.dtype}")
    for name, t in (("src_slots", src_slots), ("dst_slots", dst_slots), ("cache_base", cache_base), ("count", count)):
        if t.dtype != torch.int32 or t.dim() != 1:  # PMH11
            raise ValueError(f"{name} must be a 1-D int32 tensor")
    B = src_slots.shape[0]
    if not (dst_slots.shape[0] == cache_base.shape[0] == count.shape[0] == B):  # PMH12
        raise ValueError("per-request tensors (dst_slots, cache_base, count) must all have length B")
    if active_request_indices is None:
        live = torch.nonzero(count >= 0, as_tuple=False).flatten().to(torch.int32)
        active_request_indices = torch.full_like(count, -1)
        active_request_indices[: live.numel()] = live
        if num_active is None:
            num_active = torch.tensor([live.numel()], dtype=torch.int32, device=count.device)
    if num_active is None:
        num_active = torch.tensor([B], dtype=torch.int32, device=count.device)
    if num_active.dtype != torch.int32 or num_active.numel() != 1:  # PMH13 (no CUDA requirement here)
        raise ValueError("num_active must be a one-element int32 tensor")
    elif (active_request_indices.dtype != torch.int32 or active_request_indices.dim() != 1
          or active_request_indices.shape[0] != B):  # PMH14
        raise ValueError("active_request_indices must be a 1-D int32 tensor of length B")
    if state.dtype != ST_TORCH:  # PMH15
        raise ValueError(f"state dtype {state.dtype} does not match the module's STATE dtype {ST_TORCH}")
    if B == 0:  # PMS6
        return state
    for n, t in (("state", state), ("k_cache", k_cache), ("u_cache", u_cache), ("g_cache", g_cache)):
        _check_pool_layout(t, n)  # PMH17
    for n, t in (("src_slots", src_slots), ("dst_slots", dst_slots), ("cache_base", cache_base), ("count", count),
                 ("active_request_indices", active_request_indices), ("num_active", num_active)):
        if not t.is_contiguous():  # PMH18
            raise ValueError(f"{n} must be contiguous (got a strided view)")
    for t in (state, src_slots, dst_slots, k_cache, u_cache, g_cache, cache_base, count, active_request_indices,
              num_active):
        if t.data_ptr() % 16:  # PMH19
            raise ValueError(f"all materialization tensors must be 16-byte aligned (data_ptr % 16 == {t.data_ptr() % 16})")

    src, dst, base, cnt = (x.tolist() for x in (src_slots, dst_slots, cache_base, count))
    act = active_request_indices.tolist()
    n = max(0, min(int(num_active.reshape(-1)[0]), B))
    group = HV // H
    j = torch.arange(W_RING, device=state.device)
    results = []
    for v in range(n):  # PMM1: items of the first num_active entries
        p = act[v]
        if p < 0:
            continue
        C, s, d, b = cnt[p], src[p], dst[p], base[p]
        if s < 0 or d < 0 or C < 0 or C > W_RING:  # PMS1
            continue
        S0 = state[s]
        if C == 0:  # PMS2: a bit copy
            results.append((d, S0.clone()))
            continue
        slots = (b + j[:C]) & (R - 1)
        g = g_cache[s][:, slots]  # [HV, C] f32
        Gc = g[:, C - 1:C]
        w = torch.exp2((Gc - g) * LOG2E)  # [HV, C]
        bdec = torch.exp2(Gc[:, 0] * LOG2E)  # [HV]
        u = u_cache[s][:, slots].float()  # [HV, C, V]
        k = k_cache[s][torch.arange(HV, device=state.device) // group][:, slots].float()  # [HV, C, K]
        wu = (w[..., None] * u).to(RING_TORCH).float()  # PMN1: one rounding to RING
        D = torch.einsum("hjv,hjk->hvk", wu, k)  # f32 accumulation
        out = torch.addcmul(D, S0.float(), bdec[:, None, None].expand_as(D))
        results.append((d, out.to(ST_TORCH)))
    for d, x in results:  # stores after every read (no request reads another's destination in legal calls)
        state[d] = x
    return state
