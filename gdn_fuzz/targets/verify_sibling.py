"""FlashInfer's verify-only sibling kernel as a differential target (issue 18), and a CPU emulation of it.

The sibling: `gated_delta_rule_mtp_ucache` in flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache.py
(flashinfer-python 0.7.2.post1, the release of the fused kernel).  Line numbers below are that file's.

What it is, read from its source (contract M7 names it):
  * the fused kernel's verify path without the fold: per (row, v-head) CTA it computes the T draft
    outputs from the checkpoint and the ring window, and appends T (k_hat, U, G) records;
  * a 16-slot FLAT ring: k_cache [pool, H, 16, K], u_cache [pool, HV, 16, V], g_cache [pool, HV, 16]
    (asserted, 2538-2557; the k_cache message says "LEGACY 16-deep flat ring ... NOT ring-format
    compatible" with the fused kernel's 32-slot ring); the window is physical rows [0, P) and the
    appends land on rows [P, P + T); there is no cache_base argument at all (signature, 2397-2424);
  * the checkpoint pool is read-only (disable_state_update=True, 2800; no pool store in the kernel);
  * bf16 only: the pool (2477), q/k/v/a/b (2501) and the k/u rings (2538, 2550) must be bf16;
    A_log/dt_bias are cast to bf16 (2511-2512); g_cache is f32 (2555);
  * T in {4, 8} (2560); hist_len is checked for dtype and length only (2558): P + T <= 16 is the
    caller's duty (module docstring, 44-46), unchecked;
  * it launches only on a CUDA device of SM90+ (TMA, mbarrier; gdn_device_target, 2684).

Layout maps (the differential, gdn_fuzz.properties.sibling): at cache_base = 0 the fused kernel's
window record j sits in ring slot (0 + j) & 31 = j and its appends in slots P + s; with P + T <= 16
every slot a row touches is below 16, so flat row j <-> ring slot j, j < 16, is the whole map
(fused_ring_to_flat, flat_to_fused_ring).  Ring slots 16..31 have no flat counterpart.

The emulation (emulate_sibling, EmulatedSibling) is NOT the kernel: a ~60-line float32 torch
rendering of the semantics above, so that the property machinery can be tested on a machine
without a GPU, with planted bugs (EMULATION_BUGS) it must catch.  A passing emulation says
nothing about the real sibling.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from types import ModuleType

import torch

from gdn_fuzz.targets import kernel_store
from gdn_fuzz.targets.loading import TargetMismatch, TargetUnavailable, _module_file, import_file

SIBLING_MODULE = "flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache"
SIBLING_ENTRY = "gated_delta_rule_mtp_ucache"
SIBLING_ENV = "GDN_FUZZ_SIBLING_MODULE"  # a path to another copy of the sibling's file
SIBLING_ARM = "bf16"  # the only dtype set the sibling accepts (its bf16 asserts)
FLAT_SLOTS = 16
RING_SLOTS = 32
# keyword arguments of the fused entry point that the sibling does not take (its signature, 2397-2424)
FUSED_ONLY = ("cache_base", "flush_min", "restart_hist_on_flush", "pdl_trigger")
RING_NAMES = ("k_cache", "u_cache", "g_cache")


# ------------------------------------------------------------------ loading the real sibling


def resolve_sibling_path() -> Path:
    """$GDN_FUZZ_SIBLING_MODULE if set, else the installed FlashInfer sibling's file."""
    env = os.environ.get(SIBLING_ENV, "").strip()
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise TargetUnavailable(f"{SIBLING_ENV}={env!r} is not a file; point it at a .py file defining "
                                    f"{SIBLING_ENTRY}")
        return p.resolve()
    p = _module_file(SIBLING_MODULE)
    if p is None:
        raise TargetUnavailable(f"{SIBLING_MODULE} is not installed; flashinfer-python 0.7.2.post1 and 0.7.4 ship it (the same file) "
                                f"(or set {SIBLING_ENV}=/path/to/gdn_decode_bf16_wy_ucache.py)")
    return p


_LOCK = threading.RLock()
_MODULES: dict[str, ModuleType] = {}


def load_sibling(path: Path | None = None) -> ModuleType:
    """The sibling's module, imported once per file (it reads no dtype env: there is one arm), with
    a disk-backed kernel store in place of its `_CACHE` (gdn_fuzz.targets.kernel_store; the sibling's
    wrapper uses `_CACHE` exactly as the fused one does, lines 2797-2811).

    Raises TargetUnavailable (not installed, or its import fails: cutlass-dsl missing) or
    TargetMismatch (no callable entry point, or W_RING != 16: not the 16-slot sibling)."""
    path = resolve_sibling_path() if path is None else Path(path)
    key = str(path.resolve())
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        try:
            mod = import_file(path, f"_gdn_fuzz_sibling_{abs(hash(key)):x}")
        except ImportError as e:
            raise TargetUnavailable(f"{path} does not import here: {type(e).__name__}: {e}") from e
        if not callable(getattr(mod, SIBLING_ENTRY, None)):
            raise TargetMismatch(f"{path} defines no callable {SIBLING_ENTRY}()")
        if getattr(mod, "W_RING", None) != FLAT_SLOTS:
            raise TargetMismatch(f"{path}: W_RING={getattr(mod, 'W_RING', None)!r}, expected {FLAT_SLOTS}: "
                                 "not the 16-slot flat-ring sibling")
        kernel_store.install(mod, path, "sibling-" + SIBLING_ARM)
        _MODULES[key] = mod
        return mod


class SiblingTarget:
    """The real sibling.  launch(**kwargs) calls gated_delta_rule_mtp_ucache with flat-ring inputs
    (sibling_inputs); there is no arm argument (bf16 only)."""

    name = "sibling"
    needs_cuda = True
    min_sm = (9, 0)

    def __init__(self, path: Path | None = None):
        self.path = resolve_sibling_path() if path is None else Path(path)

    def module(self) -> ModuleType:
        return load_sibling(self.path)

    def launch(self, **kwargs):
        return getattr(self.module(), SIBLING_ENTRY)(**kwargs)

    def unavailable_reason(self, device: str) -> str | None:
        """None when the sibling can launch on `device`, else why not (in words)."""
        try:
            self.module()
        except (TargetUnavailable, TargetMismatch) as e:
            return f"the verify-only sibling cannot be used: {e}"
        if not str(device).startswith("cuda"):
            return f"the sibling launches only on CUDA devices (a CPU tensor ends in ValueError); device={device!r}"
        if not torch.cuda.is_available():
            return "the sibling needs a CUDA GPU (SM90+) and this machine has none"
        cap = torch.cuda.get_device_capability(torch.device(device))
        if cap < self.min_sm:
            return f"the sibling needs SM90+ (TMA, mbarrier); {torch.cuda.get_device_name(torch.device(device))} " \
                   f"is SM{cap[0]}{cap[1]}"
        return None

    def __str__(self) -> str:
        return self.name


def get_sibling() -> SiblingTarget:
    """The real sibling (TargetUnavailable when its file cannot be found)."""
    return SiblingTarget()


def available(device: str) -> str | None:
    """None when the real sibling can launch on `device`; else the reason, in words."""
    try:
        return get_sibling().unavailable_reason(device)
    except TargetUnavailable as e:
        return f"the verify-only sibling cannot be used: {e}"


# ------------------------------------------------------------------ the layout map (base 0)


def fused_ring_to_flat(ring: torch.Tensor) -> torch.Tensor:
    """A fused-kernel ring ([pool, heads, 32, D] or g's [pool, HV, 32]) as the sibling's flat ring
    ([pool, heads, 16, ...]), for rows at cache_base 0: flat row j = ring slot (0 + j) & 31 = j.
    A copy with canonical row-major strides: the sibling compares every inner stride with the dense
    one (_inner_dense, 2514-2525), size-1 dims included, and `.contiguous()` of the slice would keep
    the 32-slot strides where pool and heads are 1 (torch calls that tensor contiguous already)."""
    if ring.shape[2] != RING_SLOTS:
        raise ValueError(f"expected a {RING_SLOTS}-slot ring in dim 2, got shape {tuple(ring.shape)}")
    flat = ring[:, :, :FLAT_SLOTS]
    return torch.empty(flat.shape, dtype=flat.dtype, device=flat.device).copy_(flat)


def flat_to_fused_ring(flat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The inverse map: a copy of the 32-slot ring `like` whose slots 0..15 hold the flat ring's rows
    (slot j = flat row j, base 0); slots 16..31 keep `like`'s bits."""
    if flat.shape[2] != FLAT_SLOTS or like.shape[2] != RING_SLOTS or flat.shape[:2] != like.shape[:2]:
        raise ValueError(f"cannot map flat {tuple(flat.shape)} into ring {tuple(like.shape)}")
    out = like.clone()
    out[:, :, :FLAT_SLOTS] = flat
    return out


def sibling_inputs(fused_inputs: dict, rows=None) -> dict:
    """The sibling's keyword arguments for the same launch as `fused_inputs` (gdn_fuzz.case.materialize's
    dict, 32-slot rings): the rings mapped to the flat layout (fused_ring_to_flat: valid for rows at
    cache_base 0), the fused-only arguments dropped (FUSED_ONLY), every tensor a private copy.

    rows: the batch rows to keep (None: all); every other row becomes a pad row (index -1, hist_len 0),
    which the sibling skips without reading or writing anything (line 894)."""
    out = {}
    for name, v in fused_inputs.items():
        if name in FUSED_ONLY:
            continue
        if name in RING_NAMES:
            out[name] = fused_ring_to_flat(v)
        else:
            out[name] = v.clone() if isinstance(v, torch.Tensor) else v
    if rows is not None:
        keep = torch.zeros(out["initial_state_indices"].shape[0], dtype=torch.bool)
        keep[list(rows)] = True
        keep = keep.to(out["initial_state_indices"].device)
        out["initial_state_indices"] = torch.where(keep, out["initial_state_indices"],
                                                   torch.full_like(out["initial_state_indices"], -1))
        out["hist_len"] = torch.where(keep, out["hist_len"], torch.zeros_like(out["hist_len"]))
    return out


# ------------------------------------------------------------------ the emulation (not the kernel)

EMULATION_BUGS = {
    "append_shift": "appends land on rows [P + 1, P + T + 1) (mod 16) instead of [P, P + T)",
    "state_write": "writes the replayed checkpoint S_P back into the pool (as a fused flush row would)",
    "g_local": "appends g as Gamma_s, without the anchor G_P (the fused kernel's flush-row rule, M6)",
}


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def emulate_sibling(*, A_log, a, dt_bias, q, k, v, b, initial_state_source, initial_state_indices=None,
                    k_cache, u_cache, g_cache, hist_len, scale=None, output=None, bug: str | None = None):
    """EMULATION, not the kernel: the sibling's documented semantics in float32 torch, on any device.

    Checks a few of the sibling's host asserts (bf16 pool and activations, 16-slot rings, T in {4, 8}),
    then per non-pad row: S_P = e^{G_P} S0 + sum_{j<P} e^{G_P - G_j} u_j k_j^T from flat rows [0, P),
    the T tokens sequentially (q_hat/k_hat rounded to bf16, y rounded to bf16), and the T appends at
    rows [P, P + T) (k_hat bf16 on every k-head, U bf16, g = G_P + Gamma_s f32).  The pool is only read.
    bug: one of EMULATION_BUGS (a planted bug the property must catch), or None (faithful).
    Keyword arguments the real sibling does not take (cache_base, flush_min, ...) raise TypeError, as
    they would there.
    """
    if bug is not None and bug not in EMULATION_BUGS:
        raise ValueError(f"bug={bug!r} is unknown; use None or one of {', '.join(EMULATION_BUGS)}")
    io = torch.bfloat16
    pool = initial_state_source
    assert pool.dtype == io, f"initial_state_source must be bf16 (pool, HV, V, K); got {pool.dtype}."
    for n, t in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        assert t.dtype == io, f"gated_delta_rule_mtp_ucache: {n}.dtype={t.dtype} unsupported"
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert tuple(k_cache.shape[1:3]) == (H, FLAT_SLOTS), f"k_cache must be [pool, H, 16, K]; got {tuple(k_cache.shape)}"
    assert tuple(u_cache.shape[1:3]) == (HV, FLAT_SLOTS) and tuple(g_cache.shape[1:]) == (HV, FLAT_SLOTS)
    if T not in (4, 8):
        raise NotImplementedError(f"gated_delta_rule_mtp_ucache: T={T} unsupported")
    idx = torch.arange(B, dtype=torch.int32) if initial_state_indices is None else initial_state_indices
    scale = 1.0 / math.sqrt(K) if scale is None else scale
    A = A_log.to(io).float()
    g = -torch.exp(A) * torch.log1p(torch.exp(a.float() + dt_bias.to(io).float()))  # [B, T, HV], no threshold
    beta = torch.sigmoid(b.float())
    q_hat = (_l2norm(q) * scale).to(io).float()
    k_hat = _l2norm(k).to(io)  # [B, T, H, K]: what the k ring receives
    kh = torch.arange(HV, device=q.device) // (HV // H)
    out = torch.zeros(B, T, HV, V, dtype=io, device=q.device)
    for r in range(B):
        s = int(idx[r])
        if s < 0:
            continue
        P = int(hist_len[r])
        Gw = g_cache[s, :, :P].float()  # [HV, P]
        GP = Gw[:, P - 1] if P > 0 else torch.zeros(HV, device=q.device)
        w = torch.exp(GP[:, None] - Gw)
        S = torch.exp(GP)[:, None, None] * pool[s].float() + torch.einsum(
            "hj,hjv,hjk->hvk", w, u_cache[s, :, :P].float(), k_cache[s][kh, :P].float())
        if bug == "state_write":
            pool[s] = S.to(pool.dtype)
        kt, qt = k_hat[r].float()[:, kh], q_hat[r][:, kh]  # [T, HV, K]
        Us = []
        for t in range(T):
            S = torch.exp(g[r, t])[:, None, None] * S
            U = beta[r, t][:, None] * (v[r, t].float() - (S @ kt[t][..., None]).squeeze(-1))
            S = S + U[:, :, None] * kt[t][:, None, :]
            out[r, t] = (S @ qt[t][..., None]).squeeze(-1).to(io)
            Us.append(U)
        gapp = torch.cumsum(g[r], 0) + (0.0 if bug == "g_local" else GP[None, :])  # [T, HV]
        for t in range(T):
            row = (P + t + (1 if bug == "append_shift" else 0)) % FLAT_SLOTS
            k_cache[s, :, row] = k_hat[r, t].to(k_cache.dtype)
            u_cache[s, :, row] = Us[t].to(u_cache.dtype)
            g_cache[s, :, row] = gapp[t]
    if output is not None:
        output.copy_(out)
        return output
    return out


class EmulatedSibling:
    """An EMULATION of the sibling (emulate_sibling), with an optional planted bug; runs on the CPU."""

    needs_cuda = False

    def __init__(self, bug: str | None = None):
        if bug is not None and bug not in EMULATION_BUGS:
            raise ValueError(f"bug={bug!r} is unknown; use None or one of {', '.join(EMULATION_BUGS)}")
        self.bug = bug
        self.name = "emulation" + (f":{bug}" if bug else "")

    def launch(self, **kwargs):
        return emulate_sibling(bug=self.bug, **kwargs)

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __str__(self) -> str:
        return self.name
