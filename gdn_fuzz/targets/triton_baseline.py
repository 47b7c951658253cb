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
        fold_all = getattr(fold, "commit_gdn_replayssm_fold_all_layers", None)
        if fold_all is not None and interpret:
            fold_all = _interpreted_loop_index(fold_all)
        k = TritonKernels(spec_decode=dec.gdn_replayssm_spec_decode, commit_spec=dec.commit_gdn_replayssm_spec,
                          commit_circular=dec.commit_gdn_replayssm_circular, fold_all_layers=fold_all,
                          source=src, interpret=interpret, name="triton-interpret" if interpret else "triton")
        _CACHE[key] = k
        return k


def _interpreted_loop_index(fn):
    """Run an interpreted kernel wrapper with its module's ``range`` yielding int32 tensors.

    Compiled Triton gives a ``for t in range(0, n)`` loop with a runtime bound an int32 tensor as
    induction variable, and ``gdn_replayssm_spec_fold.py`` (line 99) calls ``t.to(tl.int64)`` on it.
    The interpreter (Triton 3.9) runs the plain Python loop, so ``t`` is an ``int`` and the call
    raises AttributeError.  This wrapper installs, for the duration of the call only and only in
    the module of the by-path import, a ``range`` that yields 0-d int32 interpreter tensors: the
    value the compiled kernel sees.  Used only with interpret=True.
    """
    import functools

    g = fn.__globals__

    @functools.wraps(fn)
    def wrapped(*args, **kw):
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        def trange(*a):
            for t in range(*a):
                yield tl.tensor(TensorHandle(np.array(t, dtype=np.int32), tl.int32), tl.int32)

        with _LOCK:
            had, old = "range" in g, g.get("range")
            g["range"] = trange
            try:
                return fn(*args, **kw)
            finally:
                if had:
                    g["range"] = old
                else:
                    g.pop("range", None)

    return wrapped


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


# ------------------------------------------------------------------ plain-Python expectations of the commit entry points
# (issue 18).  Line numbers: SGLang 0.5.23, gdn_replayssm_spec_decode.py ("decode.py") and
# gdn_replayssm_spec_fold.py ("fold.py").  Pad-row predicates differ between the entry points:
#   decode (verify pass decode.py:148, flush pass :142, exact fold :535), commit_gdn_replayssm_circular
#   (:650, :798) and the fold-every-commit fold (fold.py:68):   ssm_state_indices[b] <= null_block_id;
#   commit_gdn_replayssm_spec (:836):                             replay_indices[b] <= null_block_id.
# Defaults: null_block_id = 0 for the decode and commit_gdn_replayssm_spec (:1094, :1244), -1 for
# commit_gdn_replayssm_circular and commit_gdn_replayssm_fold_all_layers (:1285, fold.py:158).


def expect_commit_spec(write_pos, cache_base, is_flush, num_accepted, replay_indices, *, max_cache_len: int,
                       max_spec_len: int, fold_every_commit: bool = False, cache_buf_len: int | None = None,
                       null_block_id: int = 0) -> tuple[list, list, list]:
    """``commit_gdn_replayssm_spec`` on Python ints: the new (write_pos, cache_base, is_flush) lists.

    Per batch row with replay slot r > null_block_id (decode.py:836), from wp, base, f = the slot's
    cursors and n = num_accepted[row]:
      C3 flush row (f != 0): wp' = n, base' = (base + wp) & (cache_buf_len - 1)  -- SGLang slides the
         base only when n > 0 (decode.py:846); with n = 0 the window is empty either way;
      C3 verify row (f == 0): wp' = wp + n, base' = base;
      next flag (decode.py:865-868): fold_every_commit: wp' > 0 (flush, i.e. fold, at every next step);
         else the early-flush rule wp' + 2 max_spec_len > max_cache_len.
    Rows with replay slot <= null_block_id write nothing; slots not in the batch keep their values.
    """
    wp, base, fl = [int(x) for x in write_pos], [int(x) for x in cache_base], [int(x) for x in is_flush]
    buf = max_cache_len if cache_buf_len is None else cache_buf_len
    for r, n in zip((int(x) for x in replay_indices), (int(x) for x in num_accepted)):
        if r <= null_block_id:
            continue
        f = fl[r] != 0
        new_wp = n if f else wp[r] + n
        if f and n > 0:
            base[r] = (base[r] + wp[r]) & (buf - 1)
        wp[r] = new_wp
        fl[r] = int(new_wp > 0) if fold_every_commit else int(new_wp + 2 * max_spec_len > max_cache_len)
    return wp, base, fl


def window_closed_form(S0, d, k, g, slots, n: int, G: int):
    """M3 with per-token g: e^{Gam} S0 + sum_{j<n} e^{Gam - Gam_j} d_j k_j^T, Gam_j = g_0 + ... + g_j, Gam = Gam_{n-1}.

    S0 [HV, V, K]; d [HV, ring, V]; k [H, ring, K]; g [HV, ring]; slots: the physical slot of each
    logical record.  Returns (state, |terms| magnitude), float64 [HV, V, K]; n <= 0: (S0, |S0|).
    """
    S0 = S0.double()
    if n <= 0:
        return S0.clone(), S0.abs()
    HV = S0.shape[0]
    p = torch.as_tensor(slots[:n], dtype=torch.long)
    kh = torch.arange(HV) // G
    gw = g.double()[:, p]  # [HV, n]
    pre = torch.cumsum(gw, 1)
    tot = pre[:, -1:]
    w = torch.exp(tot - pre)
    dw, kw = d.double()[:, p], k.double()[kh][:, p]  # [HV, n, V], [HV, n, K]
    e = torch.exp(tot)[..., None]  # [HV, 1, 1]
    S = e * S0 + torch.einsum("hj,hjv,hjk->hvk", w, dw, kw)
    M = e * S0.abs() + torch.einsum("hj,hjv,hjk->hvk", w, dw.abs(), kw.abs())
    return S, M


def expect_commit_circular(*, checkpoint_state, d_cache, k_cache, g_cache, d_residual_cache, k_residual_cache,
                           state_batch_indices, replay_indices, write_pos, cache_base, is_flush, accept_lens,
                           mamba_track_indices=None, mamba_steps_to_track=None, null_block_id: int = -1) -> dict:
    """``commit_gdn_replayssm_circular`` (compact materialization, decode.py:1269) in float64.

    checkpoint [layers, slots, HV, V, K]; d [layers, replay slots, HV, ring, V]; k [layers, replay slots,
    H, ring, K]; g [layers, replay slots, HV, ring]; ring = d.shape[-2].  ``write_pos`` already includes
    this step's accepted prefix (the wrapper's docstring).  Per batch row with s = state index >
    null_block_id (decode.py:650, :798), r = replay index, n = write_pos[r]:
      capacity row (is_flush[r] != 0): checkpoint[l, s] <- the window's M3 closed form over the n
         records from base (d + d_residual, k + k_residual; per-token g prefix sums), every layer l;
         cursors (decode.py:800-809): base' = (base + n) & (ring - 1), wp' = 0, is_flush' = 0 --
         the C2 restart of the fused contract with f = is_flush (nothing left to accept: wp' = 0);
      track row (track index t > null_block_id and step >= 0, decode.py:657-659): checkpoint[l, t] <- the
         same closed form over the first n - accept_lens[b] + step + 1 records, from the checkpoint
         as it was BEFORE this call (the kernel reads it once, decode.py:687);
      every other row, and every buffer not named here, is untouched.
    Returns dict(write_pos, cache_base, is_flush: lists; rows: {(layer, slot): (state float64, magnitude)}).
    """
    L_, _, HV = checkpoint_state.shape[:3]
    H = k_cache.shape[2]
    ring = d_cache.shape[-2]
    G = HV // H
    wp, base, fl = ([int(x) for x in t.cpu()] for t in (write_pos, cache_base, is_flush))
    wp0, base0, fl0 = list(wp), list(base), list(fl)
    cpu = lambda x: None if x is None else x.detach().cpu().double()  # noqa: E731
    ck, d, k, g = cpu(checkpoint_state), cpu(d_cache), cpu(k_cache), cpu(g_cache)
    if d_residual_cache is not None and k_residual_cache is not None:
        d, k = d + cpu(d_residual_cache), k + cpu(k_residual_cache)
    track = mamba_track_indices is not None and mamba_steps_to_track is not None
    rows = {}
    for b, (s, r) in enumerate(zip((int(x) for x in state_batch_indices.cpu()), (int(x) for x in replay_indices.cpu()))):
        if s <= null_block_id:
            continue
        n = wp0[r]
        slots = [(base0[r] + j) & (ring - 1) for j in range(ring)]
        if fl0[r] != 0:
            for l in range(L_):
                rows[(l, s)] = window_closed_form(ck[l, s], d[l, r], k[l, r], g[l, r], slots, n, G)
            base[r], wp[r], fl[r] = (base0[r] + n) & (ring - 1), 0, 0
        if track:
            t, step = int(mamba_track_indices[b]), int(mamba_steps_to_track[b])
            if t > null_block_id and step >= 0:
                m = min(n - int(accept_lens[b]) + step + 1, ring)
                for l in range(L_):
                    rows[(l, t)] = window_closed_form(ck[l, s], d[l, r], k[l, r], g[l, r], slots, m, G)
    return dict(write_pos=wp, cache_base=base, is_flush=fl, rows=rows)


def expect_fold_all_layers(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, ssm_state_indices,
                           accept_lens, *, num_k_heads: int, mamba_track_indices=None, mamba_steps_to_track=None,
                           use_qk_l2norm_in_kernel: bool = True, null_block_id: int = -1) -> dict:
    """``commit_gdn_replayssm_fold_all_layers`` (fold.py:145) in float64: {(layer, slot): (state, magnitude)}.

    No cursors: the rings are keyed by the state index itself and read at physical slots 0..n-1
    (fold.py:98-103).  Per batch row with s = ssm_state_indices[b] > null_block_id (fold.py:68) and
    n = accept_lens[b] > 0 (fold.py:71): checkpoint[l, s] <- the M4 recurrence (oracles.gdn.sequential)
    of the raw records t < n (k L2-normalised, eps 1e-6 inside the root) from checkpoint[l, s]; with
    a track index t_idx > null_block_id and step in [0, n): checkpoint[l, t_idx] <- the state after
    record `step` (fold.py:130-140).  Magnitudes: oracles.gdn.sequential_magnitude.  Nothing else changes.
    """
    L_, _, HV = checkpoint_state.shape[:3]
    kh = torch.arange(HV) // (HV // num_k_heads)
    cpu = lambda x: x.detach().cpu().double()  # noqa: E731
    ck, rv, rk, g, bt = (cpu(x) for x in (checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache))
    track = mamba_track_indices is not None and mamba_steps_to_track is not None
    rows = {}
    for b, s in enumerate(int(x) for x in ssm_state_indices.cpu()):
        n = int(accept_lens[b])
        if s <= null_block_id or n <= 0:
            continue
        for l in range(L_):
            kk = rk[l, s][kh][:, :n].transpose(0, 1)[None]  # [1, n, HV, K]
            if use_qk_l2norm_in_kernel:
                kk = _l2n(kk)
            vv = rv[l, s][:, :n].transpose(0, 1)[None]
            gw, bw = g[l, s][:, :n].T[None], bt[l, s][:, :n].T[None]
            _, _, Ss = gdn_oracle.sequential(ck[l, s][None], kk, kk, vv, gw, bw, keep_states=True)
            _, _, Ms = gdn_oracle.sequential_magnitude(ck[l, s][None].abs(), kk, kk, vv, gw, bw, keep_states=True)
            rows[(l, s)] = (Ss[0, -1], Ms[0, -1])
            if track:
                t, step = int(mamba_track_indices[b]), int(mamba_steps_to_track[b])
                if t > null_block_id and 0 <= step < n:
                    rows[(l, t)] = (Ss[0, step], Ms[0, step])
    return rows


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
           "triton_io_ckpt", "expect_commit_spec", "expect_commit_circular", "expect_fold_all_layers",
           "window_closed_form"]
