"""Second production backend: SGLang's Triton ReplaySSM baseline, loaded by path, and its serving adapter.

The fused CuTeDSL kernel (target ``production``) is an opt-in replacement for this baseline,
released in SGLang 0.5.23 as
``sglang/kernels/ops/attention/linear/gdn_replayssm_spec_decode.py`` (the verify / flush
launches ``gdn_replayssm_spec_decode``, the cursor commits ``commit_gdn_replayssm_spec`` and
``commit_gdn_replayssm_circular``, the exact fold kernel) and ``gdn_replayssm_spec_fold.py``
(the fold-every-commit variant).  The SGLang source is never copied into this repository.

Where the files come from (``resolve_sglang_files``), first hit wins:
  1. $GDN_FUZZ_SGLANG_DIR: the folder that holds ``sglang/kernels/...`` (the unpacked
     ``sglang_replayssm`` folder of the offline bundle, or any SGLang checkout's python/ dir);
  2. an installed ``sglang`` package (imported normally, with its own helpers);
  3. /tmp/gdn/site/sglang_replayssm (the H200 offline bundle), /tmp/sgl/site/sglang_replayssm.
Files found by path are imported by path.  Their two helper imports are served by stub
modules placed in ``sys.modules`` for the duration of the import only (removed afterwards;
names that were already there are left alone):
  * ``sglang.kernels.ops.attention.fla.utils.is_tf32_supported`` -- in SGLang a module-level
    *bool* (the decode file uses it as a value: ``"tf32" if is_tf32_supported else "ieee"``),
    True when a CUDA GPU of compute capability >= 8 is present (TF32 exists from Ampere on);
  * ``sglang.srt.utils.is_gfx95_supported()`` -- True only on AMD MI350-class (gfx950) GPUs;
    on NVIDIA and on the CPU it is False, which keeps the decode wrapper's tile choice.
TRITON_INTERPRET=1 is read by ``triton.jit`` at decoration time, i.e. at import: a module
instance is therefore cached per (file, interpret flag); ``load_kernels(interpret=True)``
imports with the variable set (it must stay set while interpreted kernels run: set it in
the environment, as the tests do).

Serving adapter (``TritonBaselineServing``)
--------------------------------------------
The two backends agree at the serving level -- requests, the tokens they verify, the
accepted counts, the committed logical state -- not at the kernel signature.  The adapter
owns the baseline's buffers and drives one step as SGLang does: pack the batch varlen
(``query_start_loc = [0, T, 2T, ...]``), launch ``gdn_replayssm_spec_decode`` (exact fold on
flush rows, verify pass, flush-output pass), then ``commit_gdn_replayssm_spec``.

Layout mapping (fused contract -> Triton baseline) and the clauses of
shared/docs/kernel-contract.md that DIFFER:
  * M3/C1 keying: the fused kernel keys checkpoint, rings and cursors by the pool slot
    ``initial_state_indices[b]`` (cursors per batch row).  The baseline keys the checkpoint
    ``h0`` by the physical block ``ssm_state_indices[b]`` and the rings and cursors by the
    request slot ``replay_indices[b]`` (``write_pos`` = hist_len, ``cache_base``).  Here:
    request r -> block ``blocks[r]`` (a permutation of 1..R, so the two keys differ) and
    replay slot r + 1.  Slot/block 0 is SGLang's null block.
  * M8 pad rows: pad = ``ssm_state_indices <= null_block_id`` (default 0), not ``idx < 0``.
    The verify pass ZEROES a pad row's output rows (fused: untouched / uninitialised).
    ``commit_gdn_replayssm_spec`` decides pad-ness from ``replay_indices <= null_block_id``
    instead: a request whose replay slot were 0 would be verified but never committed
    (the adapter never uses replay slot 0 for a live request).
  * M6 g meaning: the baseline stores per-token g_t (rebuilding prefix sums in the kernel);
    the fused kernel stores cumulative G from the checkpoint (local restart on flush rows).
    ``to_fused_layout`` converts (cumsum along the logical window).
  * M5 records: d_cache holds the corrected update U (= fused u_cache), k_cache the
    normalized key (written by the first v-head of each k-head group, as the fused kernel),
    plus raw v, raw (un-normalised) k and fp32 beta for the exact fold.  Ring size = the
    decode call's max_cache_len (power of two; 32 here, = the fused RING_SLOTS).
  * M7 fold: EXACT sequential replay of the raw window (v, k, g, beta) in fp32 into the
    checkpoint, rounded once to the checkpoint dtype; fused: closed form from (u, k, G).
    An fp32 checkpoint is allowed (fused STATE is bf16/fp16 only, D2).
  * C2/C3 commit: no in-kernel commit (C2 does not apply); ``commit_gdn_replayssm_spec`` is
    C3 (flush rows: base' = (base + wp) & (ring - 1), wp' = accepted; verify rows:
    wp' = wp + accepted), except that a flush row with accepted = 0 keeps its base (wp' = 0,
    so the window is empty either way).  The flush decision is an ``is_flush`` flag stored
    per request at commit time for the NEXT step: is_flush = (wp' + 2T > L), L = the
    commit's max_cache_len.  With L = 16 + T that is wp' >= 17 - T, the fused lazy
    flush_min (docs/replayssm-serving.md); other L give flush_min = L - 2T + 1 and a window
    of up to L - T rows (fused: 16, W_RING).  Every verify window fits: wp + T <= L.
  * M1 gating: softplus has a threshold (x > 20 -> x); fused has none (N2).  A_log and
    dt_bias are read as fp32 (fused casts them to IO, N4/N5).
  * H*: the baseline has no host checks beyond power-of-two max_cache_len and tile limits
    (K power of two, K/nk >= 16); D1/D2 env dtype selection does not exist (dtypes follow
    the tensors).  T is any max_spec_len (fused: 4 or 8, H13).
  * N*: fp32-checkpoint dots use TF32 on Ampere+ GPUs (``dot_precision``), IEEE fp32 on the
    CPU interpreter.

``TorchBaselineModel`` is a float64 torch model of the same three entry points (same
signatures, same buffer semantics, read from the SGLang source) so that the adapter's
mapping is unit-tested on the CPU without Triton.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.targets.loading import TargetUnavailable, import_file

SGLANG_DIR_ENV = "GDN_FUZZ_SGLANG_DIR"
DEFAULT_DIRS = ("/tmp/gdn/site/sglang_replayssm", "/tmp/sgl/site/sglang_replayssm")
PKG = "sglang.kernels.ops.attention.linear"
REL = Path("sglang/kernels/ops/attention/linear")
DECODE_FILE = "gdn_replayssm_spec_decode.py"
FOLD_FILE = "gdn_replayssm_spec_fold.py"
RING = 32  # ring slots used by the adapter (decode max_cache_len): the fused RING_SLOTS
NULL = 0  # SGLang's null block id (ssm_state_indices / replay_indices <= NULL: pad)
EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


# ------------------------------------------------------------------ loader


def resolve_sglang_files() -> tuple[str, Path | None]:
    """('env'|'installed'|'default', folder holding sglang/...) ; folder None for 'installed'."""
    env = os.environ.get(SGLANG_DIR_ENV, "").strip()
    if env:
        d = Path(env).expanduser()
        if not (d / REL / DECODE_FILE).is_file():
            raise TargetUnavailable(
                f"{SGLANG_DIR_ENV}={env!r} does not hold {REL / DECODE_FILE}; point it at the folder "
                "that contains sglang/ (e.g. .../site/sglang_replayssm)")
        return "env", d
    try:
        if importlib.util.find_spec(f"{PKG}.gdn_replayssm_spec_decode") is not None:
            return "installed", None
    except (ImportError, ValueError):
        pass
    for d in DEFAULT_DIRS:
        if (Path(d) / REL / DECODE_FILE).is_file():
            return "default", Path(d)
    raise TargetUnavailable(
        f"the SGLang Triton ReplaySSM files are not here: install sglang>=0.5.23, or set {SGLANG_DIR_ENV} to the "
        f"folder holding {REL}/{{{DECODE_FILE},{FOLD_FILE}}} (tried {', '.join(DEFAULT_DIRS)})")


def _tf32_supported() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8)


@contextlib.contextmanager
def _helper_stubs():
    """Stub sglang's two helper modules in sys.modules while the kernel files import; then remove them."""
    added = []

    def mod(name):
        if name in sys.modules:
            return sys.modules[name]
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so that submodule imports resolve through sys.modules
        m.__gdn_fuzz_stub__ = True
        sys.modules[name] = m
        added.append(name)
        return m

    for name in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                 "sglang.kernels.ops.attention.fla", "sglang.srt"):
        mod(name)
    utils = mod("sglang.kernels.ops.attention.fla.utils")
    if getattr(utils, "__gdn_fuzz_stub__", False):
        # SGLang: is_tf32_supported = is_nvidia and torch.cuda.get_device_capability(0)[0] >= 8 (a bool)
        utils.is_tf32_supported = _tf32_supported()
    srt = mod("sglang.srt.utils")
    if getattr(srt, "__gdn_fuzz_stub__", False):
        # SGLang: True only on AMD gfx950 (MI350-class); never on NVIDIA or the CPU
        srt.is_gfx95_supported = lambda: False
    try:
        yield
    finally:
        for name in reversed(added):
            sys.modules.pop(name, None)


@dataclass
class TritonKernels:
    """The baseline's entry points, from one import of the two files."""

    spec_decode: object
    commit_spec: object
    commit_circular: object
    fold_all_layers: object | None
    source: str
    interpret: bool
    name: str = "triton"


_LOCK = threading.RLock()
_CACHE: dict = {}


def triton_missing_reason() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"triton is not importable ({type(e).__name__}: {e}); the Triton baseline needs it"
    return None


def load_kernels(interpret: bool | None = None) -> TritonKernels:
    """Import the baseline once per (location, interpret flag).  Raises TargetUnavailable with the reason."""
    if interpret is None:
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    why = triton_missing_reason()
    if why:
        raise TargetUnavailable(why)
    how, folder = resolve_sglang_files()
    key = (how, str(folder), interpret)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        try:
            if how == "installed":
                dec = importlib.import_module(f"{PKG}.gdn_replayssm_spec_decode")
                try:
                    fold = importlib.import_module(f"{PKG}.gdn_replayssm_spec_fold")
                except ImportError:
                    fold = None
                src = str(Path(dec.__file__).parent)
            else:
                tag = f"{abs(hash((str(folder), interpret))):x}"
                with _helper_stubs():
                    dec = import_file(folder / REL / DECODE_FILE, f"_gdn_fuzz_sgl_decode_{tag}")
                    fp = folder / REL / FOLD_FILE
                    fold = import_file(fp, f"_gdn_fuzz_sgl_fold_{tag}") if fp.is_file() else None
                src = str(folder / REL)
        finally:
            if saved is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved
        k = TritonKernels(spec_decode=dec.gdn_replayssm_spec_decode, commit_spec=dec.commit_gdn_replayssm_spec,
                          commit_circular=dec.commit_gdn_replayssm_circular,
                          fold_all_layers=getattr(fold, "commit_gdn_replayssm_fold_all_layers", None),
                          source=src, interpret=interpret, name="triton-interpret" if interpret else "triton")
        _CACHE[key] = k
        return k


def interpreter_unusable_reason() -> str | None:
    """None when the Triton interpreter can run the baseline on CPU tensors here, else why not."""
    why = triton_missing_reason()
    if why:
        return why
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return "TRITON_INTERPRET is not set to 1 (the interpreter mode is chosen at import, see the loader)"
    try:
        resolve_sglang_files()
    except TargetUnavailable as e:
        return str(e)
    return None


# ------------------------------------------------------------------ float64 model of the three entry points


def _softplus_thr(x):
    return torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))), x)


def _l2n(x):
    """M2 (eps inside the square root, as the SGLang kernels do): oracles.gdn.l2norm, float64."""
    return gdn_oracle.l2norm(x, EPS)


class TorchBaselineModel:
    """Float64 torch model of the baseline's decode + commit, as read from the SGLang source.

    Same signatures as ``gdn_replayssm_spec_decode`` / ``commit_gdn_replayssm_spec`` (only
    the arguments the adapter passes), same buffers, same routing; math in float64 (the
    sequential recurrence, instead of the kernel's chunked (I + A)^-1 form), rounded only
    at the stores.  Used to unit-test the adapter on the CPU without Triton.
    """

    name = "torch-model"
    interpret = False
    source = "gdn_fuzz.targets.triton_baseline.TorchBaselineModel"
    fold_all_layers = None
    commit_circular = None

    @staticmethod
    def spec_decode(q, k, v, a, b, A_log, dt_bias, checkpoint_state, d_cache, k_cache, g_cache, rawv_cache,
                    rawk_cache, beta_cache, out, query_start_loc, ssm_state_indices, replay_indices, write_pos,
                    cache_base, is_flush, max_cache_len, max_spec_len, scale=None, use_qk_l2norm_in_kernel=True,
                    null_block_id=0, **_):
        HV, V, K = checkpoint_state.shape[1:]
        H = k.shape[1]
        G = HV // H
        mask = max_cache_len - 1
        scale = K ** -0.5 if scale is None else scale
        B = query_start_loc.shape[0] - 1
        for n in range(B):
            bos, eos = int(query_start_loc[n]), int(query_start_loc[n + 1])
            sidx, ridx = int(ssm_state_indices[n]), int(replay_indices[n])
            if sidx <= null_block_id:
                out[bos:eos] = 0  # verify pass zeroes pad rows' outputs
                continue
            wp, base, fl = int(write_pos[ridx]), int(cache_base[ridx]), bool(is_flush[ridx] != 0)
            hv = torch.arange(HV)
            kh = hv // G
            S = checkpoint_state[sidx].double()  # [HV, V, K]
            if fl and wp > 0:  # exact fold: sequential replay of raw (v, k, g, beta)
                p = (base + torch.arange(wp)) & mask
                kk = _l2n(rawk_cache[ridx][kh][:, p].double()).transpose(0, 1)[None]  # [1, wp, HV, K]
                vv = rawv_cache[ridx][:, p].double().transpose(0, 1)[None]  # [1, wp, HV, V]
                gw = g_cache[ridx][:, p].double().T[None]  # [1, wp, HV]
                bw = beta_cache[ridx][:, p].double().T[None]
                _, _, S = gdn_oracle.sequential(S[None], kk, kk, vv, gw, bw, keep_states=False)
                checkpoint_state[sidx] = S[0].to(checkpoint_state.dtype)
                S = checkpoint_state[sidx].double()  # the flush-output pass reads the stored checkpoint
            elif not fl and wp > 0:  # verify: replay the window from (d, k, per-token g)
                p = (base + torch.arange(wp)) & mask
                gw = g_cache[ridx][:, p].double()  # [HV, wp]
                pre = torch.cumsum(gw, 1)
                tot = pre[:, -1:]
                w = torch.exp(tot - pre)
                kw = k_cache[ridx][kh][:, p].double()  # [HV, wp, K]
                dw = d_cache[ridx][:, p].double()  # [HV, wp, V]
                S = torch.exp(tot)[:, :, None] * S + torch.einsum("hj,hjv,hjk->hvk", w, dw, kw)
            x = a[bos:eos].double() + dt_bias.double()  # [T, HV]
            g = -torch.exp(A_log.double()) * _softplus_thr(x)
            beta = 1.0 / (1.0 + torch.exp(-b[bos:eos].double()))
            qq, kr = q[bos:eos].double(), k[bos:eos].double()  # [T, H, K]
            if use_qk_l2norm_in_kernel:
                qh, kn = _l2n(qq) * scale, _l2n(kr)
            else:
                qh, kn = qq * scale, kr
            y, Us, _ = gdn_oracle.sequential(S[None], qh[:, kh][None], kn[:, kh][None], v[bos:eos].double()[None],
                                             g[None], beta[None], keep_states=False)
            out[bos:eos] = y[0].to(out.dtype)
            for s in range(eos - bos):
                U = Us[0, s]  # [HV, V]
                if wp + s < max_cache_len:
                    p = (base + wp + s) & mask
                    d_cache[ridx, :, p] = U.to(d_cache.dtype)
                    k_cache[ridx, :, p] = kn[s].to(k_cache.dtype)
                    g_cache[ridx, :, p] = g[s].to(g_cache.dtype)
                    rawv_cache[ridx, :, p] = v[bos + s].to(rawv_cache.dtype)
                    rawk_cache[ridx, :, p] = kr[s].to(rawk_cache.dtype)
                    beta_cache[ridx, :, p] = beta[s].to(beta_cache.dtype)
        return out

    @staticmethod
    def commit_spec(write_pos, cache_base, is_flush, num_accepted, replay_indices, max_cache_len, max_spec_len,
                    fold_every_commit=False, cache_buf_len=None, null_block_id=0):
        buf = max_cache_len if cache_buf_len is None else cache_buf_len
        for n in range(replay_indices.shape[0]):
            blk = int(replay_indices[n])
            if blk <= null_block_id:
                continue
            wp, base, fl, acc = int(write_pos[blk]), int(cache_base[blk]), int(is_flush[blk]), int(num_accepted[n])
            flush_now = acc > 0 and fl != 0
            new_base = (base + wp) & (buf - 1) if flush_now else base
            new_wp = acc if fl != 0 else wp + acc
            nxt = (new_wp > 0) if fold_every_commit else (new_wp + 2 * max_spec_len > max_cache_len)
            write_pos[blk], cache_base[blk], is_flush[blk] = new_wp, new_base, int(nxt)


# ------------------------------------------------------------------ the serving adapter


def flush_min_of(L: int, T: int) -> int:
    """The fused-contract flush_min equivalent to the baseline's early-flush rule wp + 2T > L."""
    return L - 2 * T + 1


class TritonBaselineServing:
    """Drive the baseline as a serving engine does: requests, steps, accepted counts, commits.

    kernels: a TritonKernels (real, or interpreted) or TorchBaselineModel.
    n_requests R; request r lives in block blocks[r] (default: a fixed permutation of 1..R)
    and replay slot r + 1.  io: activation dtype (q/k/v/a/b, out, d/k/raw rings);
    ckpt: checkpoint dtype (float32, bfloat16, float16).  ring: decode max_cache_len
    (power of two), L: the commit's max_cache_len (the early-flush budget; default 16 + T,
    which reproduces the fused lazy flush_min 17 - T).
    """

    def __init__(self, kernels, *, n_requests: int, H: int, HV: int, K: int, V: int, T: int, A_log, dt_bias,
                 io=torch.bfloat16, ckpt=torch.float32, ring: int = RING, L: int | None = None,
                 device: str = "cpu", blocks=None, scale: float | None = None, launch_kw: dict | None = None):
        if ring & (ring - 1):
            raise ValueError(f"ring={ring} must be a power of two (the kernel masks slots with ring - 1)")
        self.kernels, self.R, self.H, self.HV, self.K, self.V, self.T = kernels, n_requests, H, HV, K, V, T
        self.io, self.ckpt, self.ring = io, ckpt, ring
        self.L = 16 + T if L is None else L
        if self.L < 2 * T:
            raise ValueError(f"L={self.L} < 2T={2 * T}: SGLang's config requires max_cache_len >= 2 * max_spec_len")
        if self.L > ring:
            raise ValueError(f"L={self.L} > ring={ring}: windows would wrap into their own appends")
        self.dev = torch.device(device)
        self.scale = K ** -0.5 if scale is None else scale
        self.launch_kw = dict(launch_kw or {})
        R, dev = n_requests, self.dev
        if blocks is None:
            g = torch.Generator().manual_seed(1234 + R)
            blocks = (torch.randperm(R, generator=g) + 1).tolist()
        self.blocks = list(blocks)
        self.slots = [r + 1 for r in range(R)]
        nb = max(self.blocks) + 1
        self.A_log = A_log.float().to(dev)
        self.dt_bias = dt_bias.float().to(dev)
        gen = torch.Generator().manual_seed(99)
        # rings and checkpoints start as garbage: a freshly reset request must never read them
        self.h0 = (torch.randn(nb, HV, V, K, generator=gen)).to(ckpt).to(dev)
        self.d_cache = torch.randn(R + 1, HV, ring, V, generator=gen).to(io).to(dev)
        self.k_cache = torch.randn(R + 1, H, ring, K, generator=gen).to(io).to(dev)
        self.g_cache = (-torch.rand(R + 1, HV, ring, generator=gen) * 4).float().to(dev)
        self.rawv = torch.randn(R + 1, HV, ring, V, generator=gen).to(io).to(dev)
        self.rawk = torch.randn(R + 1, H, ring, K, generator=gen).to(io).to(dev)
        self.beta = torch.rand(R + 1, HV, ring, generator=gen).float().to(dev)
        self.write_pos = torch.zeros(R + 1, dtype=torch.int32, device=dev)
        self.cache_base = torch.zeros(R + 1, dtype=torch.int32, device=dev)
        self.is_flush = torch.zeros(R + 1, dtype=torch.int8, device=dev)
        self.last: dict = {}

    @property
    def flush_min(self) -> int:
        return flush_min_of(self.L, self.T)

    # -- requests
    def admit(self, r: int, S0, base: int = 0):
        """Prefill-to-decode handoff: checkpoint <- S0, cursors reset (wp = 0, base, is_flush = 0)."""
        self.h0[self.blocks[r]] = S0.to(self.ckpt).to(self.dev)
        s = self.slots[r]
        self.write_pos[s], self.cache_base[s], self.is_flush[s] = 0, base, 0

    def buffers(self) -> dict:
        return dict(h0=self.h0, d_cache=self.d_cache, k_cache=self.k_cache, g_cache=self.g_cache, rawv=self.rawv,
                    rawk=self.rawk, beta=self.beta, write_pos=self.write_pos, cache_base=self.cache_base,
                    is_flush=self.is_flush)

    def cursors(self, reqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(write_pos, cache_base, is_flush) of requests `reqs`, int64 CPU."""
        s = torch.tensor([self.slots[r] for r in reqs], dtype=torch.long)
        return (self.write_pos.cpu().long()[s], self.cache_base.cpu().long()[s], self.is_flush.cpu().long()[s])

    # -- one step
    def step(self, reqs, q, k, v, a, b, accepted, *, commit: bool = True):
        """Verify T tokens for each batch row, then commit.  reqs[i] = request id, or -1 for a pad row.

        q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV] (any float dtype; cast to io);
        accepted [B] in 0..T (pad rows: ignored).  Returns y [B, T, HV, V] in io dtype.
        """
        B, T = q.shape[:2]
        if T != self.T:
            raise ValueError(f"T={T} but the adapter was built for T={self.T}")
        dev, io = self.dev, self.io
        pack = lambda x: x.to(device=dev, dtype=io).reshape(B * T, *x.shape[2:]).contiguous()  # noqa: E731
        qs, ks, vs, as_, bs = (pack(x) for x in (q, k, v, a, b))
        out = torch.full((B * T, self.HV, self.V), float("nan"), dtype=io, device=dev)
        sidx = torch.tensor([self.blocks[r] if r >= 0 else NULL for r in reqs], dtype=torch.int32, device=dev)
        ridx = torch.tensor([self.slots[r] if r >= 0 else NULL for r in reqs], dtype=torch.int32, device=dev)
        qsl = (torch.arange(B + 1, dtype=torch.int32) * T).to(dev)
        live = [r for r in reqs if r >= 0]
        self.last = dict(reqs=list(reqs), before=self.cursors(live), live=live)
        self.kernels.spec_decode(
            qs, ks, vs, as_, bs, self.A_log, self.dt_bias, self.h0, self.d_cache, self.k_cache, self.g_cache,
            self.rawv, self.rawk, self.beta, out, qsl, sidx, ridx, self.write_pos, self.cache_base, self.is_flush,
            max_cache_len=self.ring, max_spec_len=T, scale=self.scale, null_block_id=NULL, **self.launch_kw)
        if commit:
            acc = torch.as_tensor(accepted).to(device=dev, dtype=torch.int32)
            self.kernels.commit_spec(self.write_pos, self.cache_base, self.is_flush, acc, ridx,
                                     max_cache_len=self.L, max_spec_len=T, cache_buf_len=self.ring,
                                     null_block_id=NULL)
        return out.reshape(B, T, self.HV, self.V)

    # -- the committed logical state (what both backends must agree on)
    def _window(self, reqs):
        wp, base, _ = self.cursors(reqs)
        W = int(wp.max()) if len(reqs) else 0
        j = torch.arange(max(W, 1))
        valid = j[None, :] < wp[:, None]  # [n, W]
        slots = (base[:, None] + j[None, :]) & (self.ring - 1)
        ridx = torch.tensor([self.slots[r] for r in reqs], dtype=torch.long)
        return wp, base, valid, slots, ridx

    def logical_state(self, reqs) -> torch.Tensor:
        """Checkpoint replayed through the committed (d, k, per-token g) window, float64 [n, HV, V, K] (M3)."""
        wp, _, valid, slots, ridx = self._window(reqs)
        hv = torch.arange(self.HV)
        kh = hv // (self.HV // self.H)
        cpu = lambda x: x.detach().cpu()  # noqa: E731
        g = cpu(self.g_cache)[ridx[:, None, None], hv[None, :, None], slots[:, None, :]].double()  # [n, HV, W]
        g = torch.where(valid[:, None, :], g, torch.zeros_like(g))
        pre = torch.cumsum(g, 2)
        tot = pre[:, :, -1:]
        w = torch.where(valid[:, None, :], torch.exp(tot - pre), torch.zeros_like(pre))
        d = cpu(self.d_cache)[ridx[:, None, None], hv[None, :, None], slots[:, None, :]].double()
        kk = cpu(self.k_cache)[ridx[:, None, None], kh[None, :, None], slots[:, None, :]].double()
        d = torch.where(valid[:, None, :, None], d, torch.zeros_like(d))
        kk = torch.where(valid[:, None, :, None], kk, torch.zeros_like(kk))
        S0 = cpu(self.h0)[torch.tensor([self.blocks[r] for r in reqs])].double()
        return torch.exp(tot)[..., None] * S0 + torch.einsum("nhj,nhjv,nhjk->nhvk", w, d, kk)

    def logical_state_raw(self, reqs) -> torch.Tensor:
        """The same state rebuilt the exact-fold way: sequential float64 replay of raw (v, k, g, beta)."""
        wp, _, valid, slots, ridx = self._window(reqs)
        hv = torch.arange(self.HV)
        kh = hv // (self.HV // self.H)
        cpu = lambda x: x.detach().cpu()  # noqa: E731
        S = cpu(self.h0)[torch.tensor([self.blocks[r] for r in reqs])].double()
        r_, h_, p_ = ridx[:, None, None], hv[None, None, :], slots[:, :, None]  # -> [n, W, HV]
        m = valid[:, :, None]  # records past a row's window are identity steps: g = 0, beta = 0, k = 0
        kk = torch.where(m[..., None], _l2n(cpu(self.rawk)[r_, kh[None, None, :], p_].double()), 0.0)
        vv = torch.where(m[..., None], cpu(self.rawv)[r_, h_, p_].double(), 0.0)
        g = torch.where(m, cpu(self.g_cache)[r_, h_, p_].double(), 0.0)
        bt = torch.where(m, cpu(self.beta)[r_, h_, p_].double(), 0.0)
        return gdn_oracle.sequential(S, kk, kk, vv, g, bt, keep_states=False)[2]

    def to_fused_layout(self, reqs) -> dict:
        """The fused kernel's layout of the same committed state (ring must be 32, windows <= 16).

        pool slot i = request reqs[i]; k_cache/u_cache copied from k/d rings; g_cache holds the
        cumulative G of each window record from the checkpoint (fused M6), built by a cumsum
        of the per-token g along the logical window; hist_len = write_pos; cache_base as is.
        Feed it to oracles.ring.gather_window + replay (M3).
        """
        if self.ring != 32:
            raise ValueError("the fused layout has 32 ring slots; build the adapter with ring=32")
        wp, base, valid, slots, ridx = self._window(reqs)
        if int(wp.max()) > 16:
            raise ValueError(f"windows of {int(wp.max())} rows do not fit the fused 16-row window (L > 16 + T)")
        cpu = lambda x: x.detach().cpu()  # noqa: E731
        g = cpu(self.g_cache)[ridx].double()  # [n, HV, 32] per token
        G = torch.zeros_like(g)
        n = len(reqs)
        for i in range(n):
            s = slots[i][valid[i]]
            G[i][:, s] = torch.cumsum(g[i][:, s], 1)
        return dict(pool=cpu(self.h0)[torch.tensor([self.blocks[r] for r in reqs])].double(),
                    idx=torch.arange(n), k_cache=cpu(self.k_cache)[ridx].double(),
                    u_cache=cpu(self.d_cache)[ridx].double(), g_cache=G, hist_len=wp, cache_base=base)


def triton_io_ckpt(name: str) -> tuple[torch.dtype, torch.dtype]:
    """Configuration names of the baseline: 'bf16-ckpt32' (fp32 checkpoint), 'bf16-ckpt16', 'fp16-ckpt32', 'fp16-ckpt16'."""
    table = {"bf16-ckpt32": (torch.bfloat16, torch.float32), "bf16-ckpt16": (torch.bfloat16, torch.bfloat16),
             "fp16-ckpt32": (torch.float16, torch.float32), "fp16-ckpt16": (torch.float16, torch.float16)}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"triton config {name!r}; use one of {', '.join(table)}") from None


TRITON_CONFIGS = ("bf16-ckpt32", "bf16-ckpt16", "fp16-ckpt32", "fp16-ckpt16")


__all__ = ["TritonKernels", "TorchBaselineModel", "TritonBaselineServing", "load_kernels", "resolve_sglang_files",
           "interpreter_unusable_reason", "triton_missing_reason", "flush_min_of", "TRITON_CONFIGS",
           "triton_io_ckpt"]
