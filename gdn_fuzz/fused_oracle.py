"""The float64 launch oracle as one Triton kernel: the same numbers as oracles.ring.launch, fewer passes.

oracles.ring.launch (the specification) builds the float64 state S_P [B, HV, V, K] from the
checkpoint and the window, then runs the T tokens of the delta rule and of its magnitude
recurrence on it with ~10 passes of small torch ops over the whole state (memory-bound on a
GPU).  The recurrence is independent per value row: S[b, hv, v, :] (K entries) evolves on its
own.  The kernel here gives one program a tile of BLOCK_V value rows of one (row b, v-head hv),
holds S and its magnitude M ([BLOCK_V, K] float64) in registers, reads the checkpoint pool row
once (in its stored dtype) and computes, in float64 throughout, exactly what the spec defines:

    S_P   = e^{G_P} S0 + sum_j w_j u_j k_j^T          (M3; w_j = e^{G_P - G_j} on the window, 0 off it)
    S_mag = e^{G_P} |S0| + sum_j w_j |u_j| |k_j|^T
    per token t (oracles.gdn.sequential / sequential_magnitude, M4):
        S <- e^{g_t} S;  U_t = beta_t (v_t - S k_t);  S <- S + U_t k_t^T;  y_t = S q_t
        M <- e^{g_t} M;  U_mag = beta_t (|v_t| + M |k_t|);  M <- M + U_mag |k_t|^T;  y_mag = M |q_t|

writing y, y_mag, U, U_mag [B, T, HV, V] and fold = S_P, fold_mag = S_mag [B, HV, V, K].

Everything without a [V, K] state comes from the spec's own functions, called before the
kernel: gates (g, beta), normalized_qk (q_hat, k_hat), gather_window on a zero-width value
dimension (the window's G and mask, and the cursor check), replay on a zero-width state (its
anchor G_P and weights w), ring_slots (the window's slots), and appends (the fields that do not
depend on the value dimension: k_app, g_app, g_mag, slots, flush, pad).  The kernel reads the
window's keys and updates from the rings themselves (k_cache, u_cache, in their stored dtype),
only the records inside the window: the spec's masked gather, without its float64 copies.
The kernel therefore only sums in another order than torch does: agreement with the spec is to
float64 rounding (tests/test_fused_oracle.py), never by definition.  The spec stays the
definition of every property; this module is a faster way to evaluate it.

Triton is imported on first use, not at import (gdn_fuzz runs without it).  On a CPU the
kernel runs in Triton's interpreter when TRITON_INTERPRET=1 was in the environment before
triton was imported (triton.jit reads it when it decorates, and triton.language decorates its
own functions at import; slow: for tests).  checks.expectation() chooses the oracle with
oracle_for() and the environment variable GDN_FUZZ_ORACLE (auto | spec | fused).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass

import torch

from gdn_fuzz import environment
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles import ring as ring_oracle

ENV = "GDN_FUZZ_ORACLE"
CHOICES = ("auto", "spec", "fused")
# value rows per program (S and M: 2 x BLOCK_V x 128 float64 in registers) and warps per program, of launch() and
# measure(): H200, benchmarks/oracle_tiling.py (2026-12-04, run 71): the measure kernel at B = 64 1.28 ms at 8 x 1,
# 1.50 at 16 x 2 (it spilled there: 255 registers), 1.79 at 32 x 4; at B = 8 0.34 / 0.37 / 0.40 ms
BLOCK_V = 8
NUM_WARPS = 1
# history()'s (case.materialize's windows on CUDA): pinned, since the tiling sets the order of its float64 sums over
# K, and so, rarely, a bit of the float32 records a CUDA-drawn case materializes (corpus entries replay them)
HISTORY_BLOCK_V = 16
HISTORY_NUM_WARPS = 2
# the window's records loaded one record ahead of their sums (launch and measure; history has no window): on an H100
# (run 93, benchmarks/oracle_tiling.py) the measure kernel at this tiling 1.17 ms against 1.29 with each record loaded
# in the branch that adds it (B = 64), 0.31 against 0.34 (B = 8), the same bits (measure's sums at all 8 tilings
# tried); unrolling the loops instead (Triton's loop_unroll_factor) was slower and changed the sums' bits: dropped
PREFETCH = True
# each token's inputs loaded one token ahead of its sums (launch, measure and history): the same operations in the same
# order; off until timed on a GPU (benchmarks/oracle_tiling.py --variants prefetch tokens, and its bits there)
TOKEN_PREFETCH = False
# the kernel's load orders by name, as launch / measure keywords (benchmarks/oracle_tiling.py and oracle_registers.py
# time and compile them; history takes token_prefetch only)
VARIANTS = dict(loop=dict(prefetch=False, token_prefetch=False), prefetch=dict(prefetch=True, token_prefetch=False),
                tokens=dict(prefetch=True, token_prefetch=True))


@functools.lru_cache(maxsize=None)
def _triton():
    """(triton module or None, why not): the import is tried once."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return None, f"triton does not import ({type(e).__name__}: {e})"
    return triton, ""


def _interpreter() -> tuple[bool, str | None]:
    """(Triton's interpreter is on, why it cannot run kernels) -- why is None when it can."""
    triton, why = _triton()
    if triton is None:
        return False, why
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older releases read the variable directly
    on = bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET", "0") == "1"
    if not on:
        return False, None
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.standard.sum, InterpretedFunction):  # triton.language was built before it was set
        return True, ("TRITON_INTERPRET=1 was set after triton was imported (triton.jit reads it at decoration, "
                      "and triton.language's own functions were decorated for a GPU); set it before the process "
                      "starts")
    return True, None


def interpreted() -> bool:
    """True when kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton was imported)."""
    on, why = _interpreter()
    return on and why is None


def unavailable(device) -> str | None:
    """Why the fused oracle cannot run on `device` (a torch device or its name), or None when it can."""
    triton, why = _triton()
    if triton is None:
        return why
    on, why = _interpreter()
    if on:
        return why
    if torch.device(device).type == "cuda":
        return None
    return (f"Triton kernels need a CUDA device (the inputs are on {torch.device(device)}) unless Triton's "
            "interpreter is on (TRITON_INTERPRET=1 set before triton is imported; slow)")


def choice() -> str:
    """GDN_FUZZ_ORACLE, validated: auto (default), spec or fused."""
    return environment.choice(ENV, CHOICES, "auto: the fused Triton oracle on a CUDA device where triton imports, "
                              "else the spec")


def oracle_for(device):
    """The launch oracle for inputs on `device`, by GDN_FUZZ_ORACLE:

    auto   this module's launch() on a CUDA device where triton imports, else oracles.ring.launch
    spec   oracles.ring.launch, everywhere
    fused  this module's launch(); RuntimeError (naming the variable, its value and the fix) where
           it cannot run
    """
    which = choice()
    if which == "spec":
        return ring_oracle.launch
    if which == "auto":
        return launch if torch.device(device).type == "cuda" and _triton()[0] is not None else ring_oracle.launch
    why = unavailable(device)
    if why is not None:
        raise RuntimeError(
            f"{ENV}=fused asks for the fused Triton oracle, but it cannot run here: {why}.  Fix: unset {ENV} "
            f"(auto: the spec oracle on this device) or set {ENV}=spec; or run on a CUDA device with triton "
            "installed (pip install 'triton>=3.2'); on a CPU, TRITON_INTERPRET=1 in the environment of the process "
            "runs it in Triton's interpreter (slowly)")
    return launch


@functools.lru_cache(maxsize=None)
def _kernel(interpret: bool):
    """The jitted kernel, built on first use (one per interpreter mode: triton.jit reads
    TRITON_INTERPRET when it decorates)."""
    import triton
    import triton.language as tl

    # no value specialization of the sizes and strides: one compile per (T, the pool's, rings' and v's dtypes),
    # whatever the geometry, so that prepare (checks.prepare_oracle) compiles everything up front
    @triton.jit(do_not_specialize=["sp_r", "sp_h", "sp_v", "sp_k", "sk_r", "sk_h", "sk_s", "sk_k",
                                   "sw_r", "sw_h", "sw_s", "sw_v", "GH", "sv_b", "sv_t", "sv_h", "sv_v", "HV", "V", "K",
                                   "sy_b", "sy_t", "sy_h", "sy_v", "su_r", "su_h", "su_s", "su_v",
                                   "sa_r", "sa_h", "sa_v", "sa_k", "NVB"])
    def fused_launch_kernel(
            pool_ptr, sp_r, sp_h, sp_v, sp_k,  # checkpoint pool [pool, HV, V, K], its stored dtype
            rows_ptr,  # [B] int64: pool row of each batch row (pad rows: 0, as the spec reads)
            egp_ptr,  # [B, HV] e^{G_P}
            w_ptr,  # [B, HV, W] window weights (0 off the window)
            kc_ptr, sk_r, sk_h, sk_s, sk_k,  # k_cache [pool, H, 32, K] before the launch: the window keys, in place
            uw_ptr, sw_r, sw_h, sw_s, sw_v,  # u_cache [pool, HV, 32, V] before the launch: the window updates
            wslot_ptr,  # [B, W] int64: the ring slot of window record j
            nwin_ptr,  # [B] int64: the window's length (records j < nwin are in it; 0 for pad rows)
            GH,  # HV // H: v-head hv reads k-head hv // GH
            eg_ptr, beta_ptr,  # [B, T, HV] e^{g_t}, beta_t
            q_ptr, k_ptr,  # [B, T, HV, K] q_hat, k_hat
            v_ptr, sv_b, sv_t, sv_h, sv_v,  # v [B, T, HV, V], its IO dtype
            y_ptr, ym_ptr, u_ptr, um_ptr,  # [B, T, HV, V] float64 out
            fold_ptr, foldm_ptr,  # [B, HV, V, K] float64 out
            HV, V, K,
            # MEASURE: the observed launch, compared here instead of storing y, U and the fold
            yo_ptr, sy_b, sy_t, sy_h, sy_v,  # the target's y [B, T, HV, V] (read when HAS_Y)
            uc_ptr, su_r, su_h, su_s, su_v,  # u_cache after the launch [pool, HV, 32, V]
            slots_ptr,  # [B, T] int64: the ring slot each draft's record lands in (ring.appends)
            pa_ptr, sa_r, sa_h, sa_v, sa_k,  # the pool after the launch [pool, HV, V, K]
            sums_ptr, NVB,  # [B, HV, NVB, 3, 3] float64 out: (y, u, fold) x (sum err^2, sum mag^2, non-finite)
            T: tl.constexpr, W: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
            HISTORY: tl.constexpr = False, MEASURE: tl.constexpr = False, HAS_Y: tl.constexpr = False,
            PREFETCH: tl.constexpr = False, TOKEN_PREFETCH: tl.constexpr = False):
        pid_v = tl.program_id(0)
        hv = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_k = tl.arange(0, BLOCK_K)
        mv = offs_v < V
        mk = offs_k < K
        m2 = mv[:, None] & mk[None, :]
        bh = b * HV + hv

        # the window replay (M3) and its magnitude, from one read of the checkpoint row
        row = tl.load(rows_ptr + b)
        S0 = tl.load(pool_ptr + row * sp_r + hv * sp_h + offs_v[:, None] * sp_v + offs_k[None, :] * sp_k,
                     mask=m2, other=0.0).to(tl.float64)  # exact (triton widens 16-bit floats via fp32)
        if HISTORY:  # history(): no window, S0 as stored, only U is written
            S = S0
            M = S0  # unused
        else:
            egp = tl.load(egp_ptr + bh)
            S = egp * S0
            M = egp * tl.abs(S0)
            nw = tl.load(nwin_ptr + b)
            kh = hv // GH
            # the window's records are read where they are (the ring, in its stored dtype: widening is exact),
            # only the nw records of the window: nothing outside it is read, so its poison cannot leak
            # PREFETCH: iteration j loads record j + 1 and the slot of record j + 2 before it adds record j (loaded
            # by the iteration before), so a record's loads wait through one record's sums instead of stalling them
            # (the loads do not depend on S).  Its loads are predicated on the window, not branched around: the
            # masks mk and mv are off outside it, offs < a bound that is 0 there (Triton 3.9's interpreter rejects a
            # mask and-ed with a loaded scalar's comparison); wslots and w are [.., W], so their loads need no mask.
            # Without it, each record is loaded inside the branch that adds it.  The same operations on the same
            # records in the same order either way.  W: a static bound (Triton 3.6's interpreter cannot loop to a
            # loaded value)
            kb = kc_ptr + row * sk_r + kh * sk_h + offs_k * sk_k  # + slot * sk_s: a record's key
            ub = uw_ptr + row * sw_r + hv * sw_h + offs_v * sw_v  # + slot * sw_s: its update
            sb = wslot_ptr + b * W
            wb = w_ptr + bh * W
            if PREFETCH:  # record 0, and record 1's slot
                s0 = tl.load(sb)
                kn = tl.load(kb + s0 * sk_s, mask=offs_k < tl.where(0 < nw, K, 0), other=0.0)
                un = tl.load(ub + s0 * sw_s, mask=offs_v < tl.where(0 < nw, V, 0), other=0.0)
                wn = tl.load(wb)
                sn = tl.load(sb + 1)
            for j in range(W):
                if PREFETCH:
                    kj, uj, wj = kn.to(tl.float64), un.to(tl.float64), wn
                    on = j + 1 < nw
                    kn = tl.load(kb + sn * sk_s, mask=offs_k < tl.where(on, K, 0), other=0.0)
                    un = tl.load(ub + sn * sw_s, mask=offs_v < tl.where(on, V, 0), other=0.0)
                    wn = tl.load(wb + tl.minimum(j + 1, W - 1))
                    sn = tl.load(sb + tl.minimum(j + 2, W - 1))
                    if j < nw:
                        S += (wj * uj)[:, None] * kj[None, :]
                        M += (wj * tl.abs(uj))[:, None] * tl.abs(kj)[None, :]
                else:
                    if j < nw:
                        sl = tl.load(sb + j)
                        wj = tl.load(wb + j)
                        kj = tl.load(kb + sl * sk_s, mask=mk, other=0.0).to(tl.float64)
                        uj = tl.load(ub + sl * sw_s, mask=mv, other=0.0).to(tl.float64)
                        S += (wj * uj)[:, None] * kj[None, :]
                        M += (wj * tl.abs(uj))[:, None] * tl.abs(kj)[None, :]
            if MEASURE:  # the pool row after the launch against S_P (read for every row; check_oracle masks)
                fa = tl.load(pa_ptr + row * sa_r + hv * sa_h + offs_v[:, None] * sa_v + offs_k[None, :] * sa_k,
                             mask=m2, other=0.0).to(tl.float64)
                df = fa - S
                f_err = tl.sum(df * df, axis=1)  # [BLOCK_V]
                f_mag = tl.sum(M * M, axis=1)
                f_bad = tl.sum(tl.where((fa - fa) != 0.0, 1.0, 0.0), axis=1)  # x - x: 0 finite, NaN else
            else:
                state_off = bh * V * K + offs_v[:, None] * K + offs_k[None, :]
                tl.store(fold_ptr + state_off, S, mask=m2)
                tl.store(foldm_ptr + state_off, M, mask=m2)

        if MEASURE:
            y_err = tl.zeros([BLOCK_V], dtype=tl.float64)
            y_mag = tl.zeros([BLOCK_V], dtype=tl.float64)
            y_bad = tl.zeros([BLOCK_V], dtype=tl.float64)
            u_err = tl.zeros([BLOCK_V], dtype=tl.float64)
            u_mag = tl.zeros([BLOCK_V], dtype=tl.float64)
            u_bad = tl.zeros([BLOCK_V], dtype=tl.float64)

        # the T drafts (M4) and their magnitudes.  TOKEN_PREFETCH: iteration t loads token t + 1's inputs (none
        # depends on S; the last iteration loads token T - 1's again) before its own sums, as PREFETCH does for the
        # window's records; token 0's are loaded before the loop.  The same operations in the same order.
        if TOKEN_PREFETCH:
            bth0 = b * T * HV + hv
            egn, btn = tl.load(eg_ptr + bth0), tl.load(beta_ptr + bth0)
            ktn = tl.load(k_ptr + bth0 * K + offs_k, mask=mk, other=0.0)
            vtn = tl.load(v_ptr + b * sv_b + hv * sv_h + offs_v * sv_v, mask=mv, other=0.0)
            if not HISTORY:
                qtn = tl.load(q_ptr + bth0 * K + offs_k, mask=mk, other=0.0)
            if MEASURE:
                ugn = tl.load(uc_ptr + row * su_r + hv * su_h + tl.load(slots_ptr + b * T) * su_s + offs_v * su_v,
                              mask=mv, other=0.0)
                if HAS_Y:
                    ygn = tl.load(yo_ptr + b * sy_b + hv * sy_h + offs_v * sy_v, mask=mv, other=0.0)
        for t in range(T):
            bth = (b * T + t) * HV + hv
            if TOKEN_PREFETCH:
                eg, bt, kt, vt = egn, btn, ktn, vtn.to(tl.float64)
                tn = tl.minimum(t + 1, T - 1)
                bthn = (b * T + tn) * HV + hv
                egn, btn = tl.load(eg_ptr + bthn), tl.load(beta_ptr + bthn)
                ktn = tl.load(k_ptr + bthn * K + offs_k, mask=mk, other=0.0)
                vtn = tl.load(v_ptr + b * sv_b + tn * sv_t + hv * sv_h + offs_v * sv_v, mask=mv, other=0.0)
                if not HISTORY:
                    qt = qtn
                    qtn = tl.load(q_ptr + bthn * K + offs_k, mask=mk, other=0.0)
                if MEASURE:
                    ug = ugn.to(tl.float64)
                    ugn = tl.load(uc_ptr + row * su_r + hv * su_h + tl.load(slots_ptr + b * T + tn) * su_s
                                  + offs_v * su_v, mask=mv, other=0.0)
                    if HAS_Y:
                        yg = ygn.to(tl.float64)
                        ygn = tl.load(yo_ptr + b * sy_b + tn * sy_t + hv * sy_h + offs_v * sy_v, mask=mv, other=0.0)
            else:
                eg = tl.load(eg_ptr + bth)
                bt = tl.load(beta_ptr + bth)
                kt = tl.load(k_ptr + bth * K + offs_k, mask=mk, other=0.0)
                vt = tl.load(v_ptr + b * sv_b + t * sv_t + hv * sv_h + offs_v * sv_v, mask=mv,
                             other=0.0).to(tl.float64)
            S = eg * S
            U = bt * (vt - tl.sum(S * kt[None, :], axis=1))
            S += U[:, None] * kt[None, :]
            out_off = bth * V + offs_v
            if not MEASURE:
                tl.store(u_ptr + out_off, U, mask=mv)
            if not HISTORY:
                if not TOKEN_PREFETCH:
                    qt = tl.load(q_ptr + bth * K + offs_k, mask=mk, other=0.0)
                qa = tl.abs(qt)
                ka = tl.abs(kt)
                y = tl.sum(S * qt[None, :], axis=1)
                M = eg * M
                Um = bt * (tl.abs(vt) + tl.sum(M * ka[None, :], axis=1))
                M += Um[:, None] * ka[None, :]
                ym = tl.sum(M * qa[None, :], axis=1)
                if MEASURE:  # this draft's appended record and, with HAS_Y, its output
                    if not TOKEN_PREFETCH:
                        slot = tl.load(slots_ptr + b * T + t)
                        ug = tl.load(uc_ptr + row * su_r + hv * su_h + slot * su_s + offs_v * su_v, mask=mv,
                                     other=0.0).to(tl.float64)
                    du = ug - U
                    u_err += du * du
                    u_mag += Um * Um
                    u_bad += tl.where((ug - ug) != 0.0, 1.0, 0.0)
                    if HAS_Y:
                        if not TOKEN_PREFETCH:
                            yg = tl.load(yo_ptr + b * sy_b + t * sy_t + hv * sy_h + offs_v * sy_v, mask=mv,
                                         other=0.0).to(tl.float64)
                        dy = yg - y
                        y_err += dy * dy
                        y_mag += ym * ym
                        y_bad += tl.where((yg - yg) != 0.0, 1.0, 0.0)
                else:
                    tl.store(y_ptr + out_off, y, mask=mv)
                    tl.store(ym_ptr + out_off, ym, mask=mv)
                    tl.store(um_ptr + out_off, Um, mask=mv)
        if MEASURE:  # one program's partial sums; measure() adds the NVB programs of a (row, head)
            so = sums_ptr + (bh * NVB + pid_v) * 9
            tl.store(so + 0, tl.sum(y_err, axis=0))
            tl.store(so + 1, tl.sum(y_mag, axis=0))
            tl.store(so + 2, tl.sum(y_bad, axis=0))
            tl.store(so + 3, tl.sum(u_err, axis=0))
            tl.store(so + 4, tl.sum(u_mag, axis=0))
            tl.store(so + 5, tl.sum(u_bad, axis=0))
            tl.store(so + 6, tl.sum(f_err, axis=0))
            tl.store(so + 7, tl.sum(f_mag, axis=0))
            tl.store(so + 8, tl.sum(f_bad, axis=0))

    return fused_launch_kernel


def _prepare(q, k, v, a, b, A_log, dt_bias, idx, k_cache, u_cache, g_cache, hist_len, cache_base, flush_min,
             scale, validate):
    """What launch() and measure() share: the device check, and the kernel's small per-token and per-window
    inputs by the spec's functions (gather_window validates the cursors exactly as the spec does: the one
    check_cursors of a call; on a zero-width value dimension it gathers only G and the window mask: the kernel
    reads the window's keys and updates from the rings), and the value-independent fields of the expectation
    (k_app, g_app, g_mag, slots, flush, pad: ring.appends, the spec's own code).  Returns (the kernel's inputs by
    name, appends, (B, T, H, K, HV, V))."""
    why = unavailable(q.device)
    if why is not None:
        raise RuntimeError(f"the fused oracle cannot run here: {why}; use oracles.ring.launch ({ENV}=spec)")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    # the cursors as int64 once: the spec's functions below take .long() of them, a no-op on an int64 tensor (on a
    # GPU each conversion of the int32 cursors is a kernel: 11 of them, 3 now)
    idx, hist_len, cache_base = idx.long(), hist_len.long(), cache_base.long()
    g, beta = gdn_oracle.gates(a, dt_bias, A_log, b)  # [B, T, HV]
    q_hat, k_hat = gdn_oracle.normalized_qk(q, k, HV, scale)  # [B, T, HV, K]
    kw0, uw0, Gw, valid = ring_oracle.gather_window(k_cache[..., :0], u_cache[..., :0], g_cache, idx, hist_len,
                                                    cache_base, HV, validate=validate)
    # the anchor G_P and the window weights w: replay on a zero-width state builds no [V, K] state
    empty = torch.zeros(B, HV, 0, 0, dtype=torch.float64, device=q.device)
    _, GP, w = ring_oracle.replay(empty, kw0, uw0, Gw, valid, hist_len)
    rows = idx.long().clamp(min=0)  # the spec's pool row: pad rows read row 0 (S0 = pool[rows])
    named = dict(rows=rows.contiguous(), egp=torch.exp(GP).contiguous(), w=w.contiguous(),
                 wslots=ring_oracle.ring_slots(cache_base, 0, W).contiguous(), nwin=valid.sum(1).contiguous(),
                 eg=torch.exp(g).contiguous(), beta=beta.contiguous(), q=q_hat.contiguous(), k=k_hat.contiguous())
    app = ring_oracle.appends(g, GP, k_hat, H, idx, hist_len, cache_base, flush_min)
    return named, app, (B, T, H, K, HV, V)


W = ring_oracle.W_RING  # the window's records (16)


class Gate:
    """Compiles of this module's kernel made on another thread (checks.OraclePrep: an isolated worker compiles the
    oracle while its first check's target compiles), which calls from any other thread wait for: a HISTORY call
    (case.materialize's window fill) until `history` is set, any other call until `done` is set.  The thread
    that compiles (owner, set by it before its first call) never waits.  error: why the compiles failed (both
    events are set then, and waiters raise)."""

    def __init__(self):
        self.history, self.done = threading.Event(), threading.Event()
        self.owner: int | None = None
        self.error: str | None = None
        self.waited_s = 0.0  # seconds other threads spent waiting here
        # called with True before a wait and False after it (an isolated worker tells its parent, whose hang timer
        # leaves the wait out: the oracle's compile is not the target's time)
        self.on_wait = lambda waiting: None

    def wait(self, history: bool) -> None:
        if threading.get_ident() == self.owner:
            return
        event = self.history if history else self.done
        if not event.is_set():
            t0 = time.monotonic()
            self.on_wait(True)
            try:
                event.wait()
            finally:
                self.waited_s += time.monotonic() - t0
                self.on_wait(False)
        if self.error is not None:
            raise RuntimeError(f"the fused oracle's kernel did not compile ({self.error}); its compile ran when "
                               "the worker started (checks.OraclePrep)")


_gate: Gate | None = None  # installed by checks.OraclePrep while (and after) it compiles


def install_gate(gate: Gate | None) -> None:
    """Make every later kernel call of this module wait on `gate` (None: on nothing)."""
    global _gate
    _gate = gate


def _run(pool, named, v, dims, *, unused, block_v, num_warps, k_cache=None, u_cache=None, stores=None,
         observed=None, **flags):
    """One launch of the kernel on the grid (V / block_v, HV, n) for the three callers (launch, measure,
    history).  named: _prepare's inputs (rows, egp, w, wslots, nwin, eg, beta, q, k); k_cache, u_cache: the
    rings before the launch (the window's records); stores: y, y_mag, U, U_mag, fold, fold_mag (launch,
    history); observed: (y_out, its strides, u_after, its strides, slots, pool_after, its
    strides, sums, NVB) (measure).  A pointer a variant never touches is `unused`."""
    n, T, K, HV, V = dims
    if not (n and HV and V):
        return
    if _gate is not None:
        _gate.wait(history=bool(flags.get("HISTORY")))
    stores = stores or (unused,) * 6
    yo, sy, uc, su, slots, pa, sa, sums, nvb = observed or (unused, (0,) * 4, unused, (0,) * 4, unused, unused,
                                                           (0,) * 4, unused, 1)
    x = lambda name: named.get(name, unused)  # noqa: E731
    kc = unused if k_cache is None else k_cache
    uw = unused if u_cache is None else u_cache
    kcs = (0,) * 4 if k_cache is None else k_cache.stride()
    uws = (0,) * 4 if u_cache is None else u_cache.stride()
    gh = HV // k_cache.shape[1] if k_cache is not None else 1
    _kernel(_interpreter()[0])[(_cdiv(V, block_v), HV, n)](
        pool, *pool.stride(), x("rows"), x("egp"), x("w"), kc, *kcs, uw, *uws, x("wslots"), x("nwin"), gh,
        x("eg"), x("beta"), x("q"), x("k"), v, *v.stride(), *stores, HV, V, K,
        yo, *sy, uc, *su, slots, pa, *sa, sums, nvb, T=T, W=W, BLOCK_V=block_v, BLOCK_K=_next_pow2(K),
        num_warps=num_warps, **flags)


def launch(*, q, k, v, a, b, A_log, dt_bias, pool, idx, k_cache, u_cache, g_cache,
           hist_len, cache_base, flush_min: int, scale: float, validate: bool = True,
           block_v: int = BLOCK_V, num_warps: int = NUM_WARPS, prefetch: bool = PREFETCH,
           token_prefetch: bool = TOKEN_PREFETCH) -> ring_oracle.LaunchExpectation:
    """oracles.ring.launch (same keywords, same LaunchExpectation), with the [V, K] state work in one
    Triton kernel.  block_v: value rows per program (a power of two); prefetch: the window's records loaded one
    ahead of their sums (PREFETCH; the same bits); token_prefetch: each token's inputs one ahead (TOKEN_PREFETCH).
    Reads its inputs, writes nothing."""
    named, app, (B, T, H, K, HV, V) = _prepare(q, k, v, a, b, A_log, dt_bias, idx, k_cache, u_cache, g_cache,
                                               hist_len, cache_base, flush_min, scale, validate)
    f64 = dict(dtype=torch.float64, device=q.device)
    y, y_mag, U, U_mag = (torch.empty(B, T, HV, V, **f64) for _ in range(4))
    fold, fold_mag = (torch.empty(B, HV, V, K, **f64) for _ in range(2))
    _run(pool, named, v, (B, T, K, HV, V), unused=y, block_v=block_v, num_warps=num_warps, k_cache=k_cache,
         u_cache=u_cache, stores=(y, y_mag, U, U_mag, fold, fold_mag), PREFETCH=prefetch,
         TOKEN_PREFETCH=token_prefetch)
    return ring_oracle.LaunchExpectation(y=y, y_mag=y_mag, u_app=U, u_mag=U_mag, fold=fold, fold_mag=fold_mag, **app)


@dataclass
class Measured:
    """The observed launch against the fused oracle, reduced on the device (measure()).

    sums  [B, HV, 3, 3] float64: for y, u and the fold (dim 2, in SUMMED's order), per (row, v-head)
          sum (got - want)^2, sum mag^2 and the number of non-finite got elements (dim 3), where
          want / mag are the spec's y / y_mag (over T x V), u_app / u_mag (over the T appended records)
          and fold / fold_mag (over V x K, the pool row after the launch; meaningful on flush rows)
    the rest: ring.appends' fields of the LaunchExpectation (k_app, g_app, g_mag, slots, flush, pad)
    """

    sums: torch.Tensor
    k_app: torch.Tensor
    g_app: torch.Tensor
    g_mag: torch.Tensor
    slots: torch.Tensor
    flush: torch.Tensor
    pad: torch.Tensor


SUMMED = ("y", "u", "fold")  # the outputs of Measured.sums, in order


def measure(*, q, k, v, a, b, A_log, dt_bias, pool, idx, k_cache, u_cache, g_cache, hist_len, cache_base,
            flush_min: int, scale: float, y_out, u_after, pool_after, validate: bool = True,
            block_v: int = BLOCK_V, num_warps: int = NUM_WARPS, prefetch: bool = PREFETCH,
            token_prefetch: bool = TOKEN_PREFETCH) -> Measured:
    """launch()'s expectation of the inputs (the same keywords; num_warps: Triton's, per program), compared in
    the same kernel with what the launch left: y_out (the target's output [B, T, HV, V], or None: no y sums),
    u_after (u_cache after the launch: the records at ring.appends' slots) and pool_after (the pool after the
    launch, rows idx).  Nothing of size [B, HV, V, K] or [B, T, HV, V] is written: the partial sums of one
    program (BLOCK_V value rows) are stored, and added here per (row, v-head).  The same sums as
    checks.summed_errors on launch()'s fields, in another summation order (tests/test_fused_oracle.py)."""
    named, app, (B, T, H, K, HV, V) = _prepare(q, k, v, a, b, A_log, dt_bias, idx, k_cache, u_cache, g_cache,
                                               hist_len, cache_base, flush_min, scale, validate)
    nvb = _cdiv(V, block_v)
    sums = torch.zeros(B, HV, nvb, 3, 3, dtype=torch.float64, device=q.device)
    has_y = y_out is not None
    observed = (y_out if has_y else sums, y_out.stride() if has_y else (0,) * 4, u_after, u_after.stride(),
                app["slots"].contiguous(), pool_after, pool_after.stride(), sums, nvb)
    _run(pool, named, v, (B, T, K, HV, V), unused=sums, block_v=block_v, num_warps=num_warps, k_cache=k_cache,
         u_cache=u_cache, observed=observed, MEASURE=True, HAS_Y=has_y, PREFETCH=prefetch,
         TOKEN_PREFETCH=token_prefetch)
    return Measured(sums=sums.sum(2), **app)


def history(pool, rows, g, beta, k_hat, v, *, block_v: int = HISTORY_BLOCK_V,
            num_warps: int = HISTORY_NUM_WARPS, token_prefetch: bool = TOKEN_PREFETCH) -> torch.Tensor:
    """U [n, T, HV, V] float64 of oracles.gdn.sequential(pool[rows].double(), k_hat, k_hat, v, g, beta)
    (its second output), from the launch kernel with no window and no magnitudes: how
    case.materialize fills consistent windows on a CUDA device.  pool [NP, HV, V, K] in its stored
    dtype; rows [n] int (pool rows); g, beta [n, T, HV]; k_hat [n, T, HV, K]; v [n, T, HV, V] (IO dtype).
    Same arithmetic as the spec in another summation order: float64 rounding apart (the records are
    then stored in float32 or narrower)."""
    why = unavailable(k_hat.device)
    if why is not None:
        raise RuntimeError(f"the fused history cannot run here: {why}; use oracles.gdn.sequential")
    n, T, HV, K = k_hat.shape
    V = v.shape[-1]
    U = torch.empty(n, T, HV, V, dtype=torch.float64, device=k_hat.device)
    f64 = lambda x: x.to(torch.float64).contiguous()  # noqa: E731
    u = U  # pointers the HISTORY variant never reads or writes
    named = dict(rows=rows.long().contiguous(), eg=f64(torch.exp(g)), beta=f64(beta), k=f64(k_hat))
    _run(pool, named, v, (n, T, K, HV, V), unused=u, block_v=block_v, num_warps=num_warps,
         stores=(u, u, U, u, u, u), HISTORY=True, TOKEN_PREFETCH=token_prefetch)
    return U


def _cdiv(n: int, d: int) -> int:
    return -(-n // d)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
