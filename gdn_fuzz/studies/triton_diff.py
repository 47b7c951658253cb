"""`gdn-fuzz triton`: the Triton ReplaySSM baseline's properties, and a differential run against the fused kernel.

Both backends are driven at the serving level (gdn_fuzz.targets.triton_baseline module
doc): a set of requests, T tokens verified per step, an accepted count per request, a
commit.  Inputs are teacher-forced (generated once per (seed, T, step), bf16-rounded, the
same for every backend) so there is ONE float64 truth per stream:
oracles.serving.sequential_decode over exactly the accepted tokens.

Properties of the baseline (``run_properties``; clause ids of shared/docs/kernel-contract.md):
  oracle.y      [M4]  outputs of the accepted tokens vs the truth
  oracle.state  [M3, C3, C4] committed logical state (checkpoint + d/k/g window) vs the truth
  state.raw     [M7]  the same state rebuilt the exact-fold way (raw v/k/beta) vs the truth
  fold          [M7]  at every flush launch, the folded checkpoint vs the float64 sequential
                      replay of the kernel's own raw records (asserted within the bound below),
                      and vs an fp32 emulation of the fold's op order (MEASURED: bit-identical
                      count and max ulp distance; never asserted)
  pad           [M8]  pad rows (null block 0): null block / replay slot 0 keep their bits;
                      pad outputs are zero (the baseline's verify pass zeroes them)
  early_flush   [C3]  before every launch wp + T <= L for every live request, and is_flush ==
                      (wp >= L - 2T + 1): every verify window fits its buffer
  cursors       [C3]  cursors after commit_gdn_replayssm_spec vs oracles.commit.caller_commit
                      (ring 32) and is_flush' = (wp' + 2T > L)
  fused_layout  [M3, M6] the adapter's mapping to the fused layout, replayed by
                      oracles.ring.replay, equals the adapter's own replay (float64)
  determinism   [R1]  the same stream twice: bit-identical outputs and buffers
  permutation   [R1]  the same stream with the batch rows permuted and pads moved:
                      bit-identical per-request outputs and committed checkpoints

Budgets (where they come from): u = the coarsest unit roundoff among the IO dtype (the d/k
rings and outputs are stored in it) and the checkpoint dtype (gdn_fuzz.arms.unit_roundoff).
  state    ||S - S_truth||_F <= DRIFT_C u sqrt(1 + age) ||S_truth||_F per (request, head):
           gdn_fuzz.serving.machine's drift budget (DRIFT_C = 11, measured provenance there), age =
           launches since admission.
  y        ||y - y_truth||_F <= (C_Y + DRIFT_C sqrt(1 + age)) u ||y_mag||_F over the accepted
           tokens: the launch's own roundings (gdn_fuzz.compare.C_Y) plus the state drift it
           starts from (|dS q| <= |dS| |q|, and y_mag >= |S| |q| term by term).
  fold     ||F - F64||_F <= (C_FOLD u(ckpt) + wp (8 + log2 K) 2^-24) ||F_mag||_F: one
           rounding to the checkpoint dtype (compare.C_FOLD), plus per replayed token the
           fp32 recurrence's roundings (exp, the K-term dot with pairwise summation ~log2 K,
           subtract, scale, rank-1 update: 8 + log2 K), F_mag the same recurrence on |terms|.
Differential (``run_differential``): max over requests and heads of ||S_a - S_b|| /
||S_truth|| per step and of ||y_a - y_b|| / ||y_mag|| over the accepted tokens; allowed =
the sum of both backends' budgets above (fused arms: u = gdn_fuzz.serving.machine.drift_unit).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass

import torch

from gdn_fuzz.arms import get_arm, unit_roundoff
from gdn_fuzz.case import Regime, _decay_params, draw_tokens
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.oracles.serving import StepInputs, sequential_decode
from gdn_fuzz.targets.triton_baseline import (TRITON_CONFIGS, TorchBaselineModel, TritonBaselineServing, flush_min_of,
                                      triton_io_ckpt)
from gdn_fuzz.compare import C_FOLD, C_Y

F32 = 2.0**-24


def _drift_c() -> float:
    from gdn_fuzz.compare import DRIFT_C as dc

    return dc


@dataclass
class Stream:
    """A teacher-forced request stream: initial states and per-step inputs (bf16-rounded, float32 CPU)."""

    T: int
    H: int
    HV: int
    K: int
    V: int
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    S0: torch.Tensor  # [R, HV, V, K]
    steps: list  # of StepInputs (float32 values, bf16-exact), accepted in 1..T
    seed: int = 0

    @property
    def R(self) -> int:
        return self.S0.shape[0]


def make_stream(seed: int, T: int, R: int, steps: int, H: int = 1, HV: int = 2, K: int = 128, V: int = 128,
                decay: str = "normal", accept: str = "random") -> Stream:
    """accept: random (uniform 1..T) | all | one | mtp (gdn_fuzz.studies.drift's truncated-geometric drafter)."""
    from gdn_fuzz.studies.drift import draw_accepts, parse_accept

    reg = Regime(decay=decay)
    gen = torch.Generator().manual_seed(seed * 7919 + T)
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    A_log, dt_bias, _ = _decay_params(reg, gen, 1, 1, HV)
    S0 = bf(torch.randn(R, HV, V, K, generator=gen) * reg.state_scale)
    rnd = random.Random(seed * 31 + T)
    kind, p = parse_accept(accept) if accept != "random" else ("random", None)
    out = []
    for _ in range(steps):
        q, k, v, _, _, a, b = draw_tokens(reg, gen, R, T, H, HV, K, V)
        if kind == "random":
            acc = [rnd.randint(1, T) for _ in range(R)]
        else:
            acc = draw_accepts(rnd, kind, p, T, R)
        out.append(StepInputs(q=bf(q), k=bf(k), v=bf(v), a=bf(a), b=bf(b), accepted=torch.tensor(acc)))
    return Stream(T=T, H=H, HV=HV, K=K, V=V, A_log=bf(A_log), dt_bias=bf(dt_bias), S0=S0, steps=out, seed=seed)


@dataclass
class Truth:
    states: list  # after each step, [R, HV, V, K] float64
    ys: list  # [R, T, HV, V]
    y_mags: list


def truth_of(st: Stream) -> Truth:
    S = st.S0.double()
    A, dt = st.A_log.double(), st.dt_bias.double()
    scale = st.K ** -0.5
    states, ys, mags = [], [], []
    for inp in st.steps:
        g, beta = gdn_oracle.gates(inp.a, dt, A, inp.b)
        qh, kh = gdn_oracle.normalized_qk(inp.q, inp.k, st.HV, scale)
        ym, _, _ = gdn_oracle.sequential_magnitude(S.abs(), qh, kh, inp.v, g, beta)
        S, y = sequential_decode(S, inp, A, dt, scale)
        states.append(S)
        ys.append(y)
        mags.append(ym)
    return Truth(states, ys, mags)


@dataclass
class Finding:
    prop: str
    clause: str
    message: str
    step: int | None = None
    value: float | None = None
    tol: float | None = None

    def __str__(self):
        num = "" if self.value is None else (f" ({self.value:.3e}" + ("" if self.tol is None else f" > {self.tol:.3e}") + ")")
        return f"[{self.clause}] {self.prop}" + ("" if self.step is None else f" step {self.step}") + f": {self.message}{num}"


def _rel_rows(got, want, den):
    """max over heads of ||got - want||_F / ||den||_F per request: [R]."""
    e = (got.double() - want).pow(2).sum((-2, -1)).sqrt()
    d = den.pow(2).sum((-2, -1)).sqrt().clamp_min(1e-300)
    return torch.nan_to_num(e / d, nan=float("inf"))


def _y_rel(y, yt, ym, acc, T):
    """[R, HV] relative y error over the accepted tokens (dims T and V)."""
    m = (torch.arange(T)[None, :] < acc[:, None]).double()[..., None, None]
    e = ((y.double() - yt) * m).pow(2).sum((1, 3)).sqrt()
    d = (ym * m).pow(2).sum((1, 3)).sqrt().clamp_min(1e-300)
    return torch.nan_to_num(e / d, nan=float("inf"))


def _raw_windows(ad: TritonBaselineServing, reqs):
    """Per request of `reqs`: (checkpoint [HV, V, K], [(raw k [HV, K], v [HV, V], g [HV], beta [HV])
    for each window record in order]), on the CPU, in the stored dtypes."""
    wp, base, _ = ad.cursors(reqs)
    kh = torch.arange(ad.HV) // (ad.HV // ad.H)
    h0, rawk, rawv, g, beta = (x.detach().cpu() for x in (ad.h0, ad.rawk, ad.rawv, ad.g_cache, ad.beta))
    for i, r in enumerate(reqs):
        s = ad.slots[r]
        recs = []
        for t in range(int(wp[i])):
            p = (int(base[i]) + t) & (ad.ring - 1)
            recs.append((rawk[s, kh, p], rawv[s, :, p], g[s, :, p], beta[s, :, p]))
        yield h0[ad.blocks[r]], recs


def fold_fp32_emulation(ad: TritonBaselineServing, reqs) -> torch.Tensor:
    """The exact fold's op order in fp32 torch (b_k / sqrt(sum k^2 + 1e-6); h *= exp(g); v -= sum(h k);
    v *= beta; h += k v), from the checkpoint and the raw window of `reqs`: [n, HV, V, K] fp32."""
    out = []
    for h, recs in _raw_windows(ad, reqs):
        h = h.float()  # [HV, V, K]
        for k, v, g, beta in recs:
            k = k.float()
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            h = h * torch.exp(g.float())[:, None, None]
            v = v.float() - (h * k[:, None, :]).sum(-1)
            v = v * beta.float()[:, None]
            h = h + v[:, :, None] * k[:, None, :]
        out.append(h)
    return torch.stack(out)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in units of 2^-24 max|a|: fp32 ulps at the scale of the largest element."""
    return float((a.float() - b.float()).abs().max() / (F32 * a.float().abs().max().clamp_min(1e-30)))


def _pads(seed: int, R: int, n_pad: int) -> list[int]:
    """Batch order: requests 0..R-1 shuffled with n_pad pad rows (-1) in between, from the seed."""
    rows = list(range(R)) + [-1] * n_pad
    random.Random(seed).shuffle(rows)
    return rows


def _mk_adapter(kernels, st: Stream, cfg: str, device: str, ring: int = 32, L: int | None = None):
    io, ck = triton_io_ckpt(cfg)
    ad = TritonBaselineServing(kernels, n_requests=st.R, H=st.H, HV=st.HV, K=st.K, V=st.V, T=st.T,
                               A_log=st.A_log, dt_bias=st.dt_bias, io=io, ckpt=ck, ring=ring, L=L, device=device)
    for r in range(st.R):
        ad.admit(r, st.S0[r])
    return ad


def drive(kernels, st: Stream, cfg: str, device: str, order: list[int], *, ring: int = 32, L: int | None = None,
          truth: Truth | None = None, checks: bool = True):
    """Run the stream through one adapter.  Returns (adapter, per-step records, findings, measurements)."""
    ad = _mk_adapter(kernels, st, cfg, device, ring, L)
    io, ck = triton_io_ckpt(cfg)
    u = max(unit_roundoff(io), unit_roundoff(ck))
    dc = _drift_c()
    reqs = list(range(st.R))
    F: list[Finding] = []
    meas = dict(state_max=0.0, state_raw_max=0.0, y_max=0.0, state_ratio=0.0, y_ratio=0.0, fold_max_rel=0.0,
                fold_ratio=0.0, fold_vs_fp32_max_abs=0.0, fold_vs_fp32_max_ulp=0.0, fold_bit_identical=0,
                fold_elements=0, folds=0, fused_layout_max=0.0, pad_output_max=0.0, launches=0)
    recs = []
    B = len(order)
    for i, inp in enumerate(st.steps):
        T = st.T
        pos = {r: j for j, r in enumerate(order) if r >= 0}
        perm = [pos[r] for r in reqs]

        def spread(x, fill=0.0):
            full = torch.full((B, *x.shape[1:]), fill, dtype=x.dtype)
            full[perm] = x
            return full

        wp, base, fl = ad.cursors(reqs)
        if checks:
            bad = (wp + T > ad.L).nonzero().flatten().tolist()
            if bad:
                F.append(Finding("early_flush", "C3", f"requests {bad} verify past the budget: wp + T > L={ad.L}",
                                 step=i, value=float(wp.max() + T)))
            want_fl = (wp >= flush_min_of(ad.L, T)).long()
            if not torch.equal(fl, want_fl):
                F.append(Finding("early_flush", "C3", f"is_flush {fl.tolist()} != wp >= L - 2T + 1 "
                                 f"({want_fl.tolist()}), wp={wp.tolist()}", step=i))
        folding = [r for r in reqs if int(fl[r]) and int(wp[r]) > 0]
        if checks and folding:
            f64 = ad.logical_state_raw(folding)
            f32 = fold_fp32_emulation(ad, folding)
            mag = _fold_magnitude(ad, folding)
        null_before = {k: v.clone() for k, v in _null_view(ad).items()}
        acc = inp.accepted
        y = ad.step(order, spread(inp.q), spread(inp.k), spread(inp.v), spread(inp.a), spread(inp.b),
                    spread(acc, 0))
        meas["launches"] += 1
        y_req = y.detach().cpu()[perm]
        rec = dict(y=y_req.clone(), cursors=(wp, base, fl))
        if checks:
            # pad rows
            for k_, v_ in _null_view(ad).items():
                if not _bits_equal(v_.detach().cpu(), null_before[k_].detach().cpu()):
                    F.append(Finding("pad", "M8", f"the null block / replay slot 0 changed: {k_}", step=i))
            padrows = [j for j, r in enumerate(order) if r < 0]
            if padrows:
                pv = y.detach().cpu()[padrows].double().abs()
                meas["pad_output_max"] = max(meas["pad_output_max"], float(torch.nan_to_num(pv, nan=float("inf")).max()))
                if not bool((pv == 0).all()):
                    F.append(Finding("pad", "M8", "pad rows' outputs are not zero (the verify pass zeroes them)", step=i))
            # cursors after the commit
            wp2, base2, fl2 = ad.cursors(reqs)
            if ad.ring == 32:
                cw, cb = commits.caller_commit(wp, base, acc, flush_min_of(ad.L, T))
                zero_acc_flush = (fl == 1) & (acc == 0)  # documented: base kept, window empty either way
                cb = torch.where(zero_acc_flush, base, cb)
            else:
                f = fl == 1
                cw = torch.where(f, acc, wp + acc)
                cb = torch.where(f & (acc > 0), (base + wp) & (ad.ring - 1), base)
            nf = ((cw + 2 * T) > ad.L).long()
            if not (torch.equal(wp2, cw) and torch.equal(base2, cb) and torch.equal(fl2, nf)):
                F.append(Finding("cursors", "C3", f"after commit (wp, base, is_flush) = {wp2.tolist()}, {base2.tolist()}, "
                                 f"{fl2.tolist()}; model {cw.tolist()}, {cb.tolist()}, {nf.tolist()}", step=i))
            # fold
            if folding:
                after = ad.h0.detach().cpu()[[ad.blocks[r] for r in folding]]
                meas["folds"] += len(folding)
                rel = _rel_rows(after, f64, mag).max().item()
                wps = torch.tensor([int(wp[r]) for r in folding], dtype=torch.float64)
                tol = C_FOLD * unit_roundoff(ck) + float(wps.max()) * (8 + math.log2(st.K)) * F32
                meas["fold_max_rel"] = max(meas["fold_max_rel"], rel)
                meas["fold_ratio"] = max(meas["fold_ratio"], rel / tol)
                if not rel <= tol:
                    F.append(Finding("fold", "M7", "folded checkpoint vs the float64 replay of its raw window",
                                     step=i, value=rel, tol=tol))
                if ck == torch.float32:
                    meas["fold_vs_fp32_max_abs"] = max(meas["fold_vs_fp32_max_abs"],
                                                       float((after.float() - f32).abs().max()))
                    meas["fold_vs_fp32_max_ulp"] = max(meas["fold_vs_fp32_max_ulp"], _ulps(after, f32))
                    meas["fold_bit_identical"] += int((after.float().view(torch.int32) == f32.view(torch.int32)).sum())
                    meas["fold_elements"] += after.numel()
            # committed state
            if truth is not None:
                age = i + 1
                S = ad.logical_state(reqs)
                Sr = ad.logical_state_raw(reqs)
                tS = truth.states[i]
                rel = _rel_rows(S, tS, tS)
                relr = _rel_rows(Sr, tS, tS)
                budget = dc * u * math.sqrt(1 + age)
                meas["state_max"] = max(meas["state_max"], float(rel.max()))
                meas["state_raw_max"] = max(meas["state_raw_max"], float(relr.max()))
                meas["state_ratio"] = max(meas["state_ratio"], float(rel.max()) / budget)
                if not float(rel.max()) <= budget:
                    F.append(Finding("oracle.state", "M3", "committed logical state vs the sequential truth", step=i,
                                     value=float(rel.max()), tol=budget))
                if not float(relr.max()) <= budget:
                    F.append(Finding("state.raw", "M7", "raw-window rebuild vs the sequential truth", step=i,
                                     value=float(relr.max()), tol=budget))
                yr = _y_rel(y_req, truth.ys[i], truth.y_mags[i], acc, T)
                yb = (C_Y + dc * math.sqrt(age)) * u  # the state the launch starts from has age i
                meas["y_max"] = max(meas["y_max"], float(yr.max()))
                meas["y_ratio"] = max(meas["y_ratio"], float(yr.max()) / yb)
                if not float(yr.max()) <= yb:
                    F.append(Finding("oracle.y", "M4", "accepted outputs vs the sequential truth", step=i,
                                     value=float(yr.max()), tol=yb))
                rec["state"] = S
            if ad.ring == 32 and int(ad.cursors(reqs)[0].max()) <= 16:
                lay = ad.to_fused_layout(reqs)
                kw, uw, Gw, valid = ring_oracle.gather_window(lay["k_cache"], lay["u_cache"], lay["g_cache"],
                                                              lay["idx"], lay["hist_len"], lay["cache_base"], st.HV)
                So, _, _ = ring_oracle.replay(lay["pool"], kw, uw, Gw, valid, lay["hist_len"])
                own = rec.get("state", ad.logical_state(reqs))
                d = float(((So - own).abs().max() / own.abs().max().clamp_min(1e-300)))
                meas["fused_layout_max"] = max(meas["fused_layout_max"], d)
                if not d <= 1e-12:
                    F.append(Finding("fused_layout", "M3", "fused-layout replay != the adapter's replay", step=i,
                                     value=d, tol=1e-12))
        recs.append(rec)
    return ad, recs, F, meas


def _null_view(ad):
    return dict(h0=ad.h0[0], d=ad.d_cache[0], k=ad.k_cache[0], g=ad.g_cache[0], rawv=ad.rawv[0], rawk=ad.rawk[0],
                beta=ad.beta[0], wp=ad.write_pos[0:1], base=ad.cache_base[0:1], fl=ad.is_flush[0:1])


def _fold_magnitude(ad, reqs):
    """The raw-window recurrence on |terms| (oracles.gdn.sequential_magnitude), float64 [n, HV, V, K]."""
    out = []
    for M, recs in _raw_windows(ad, reqs):
        M = M.double().abs()
        for k, v, g, beta in recs:
            k = gdn_oracle.l2norm(k.double()).abs()
            M = torch.exp(g.double())[:, None, None] * M
            U = beta.double()[:, None] * (v.double().abs() + torch.einsum("hvk,hk->hv", M, k))
            M = M + U[:, :, None] * k[:, None, :]
        out.append(M)
    return torch.stack(out)


def _bits_equal(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def run_properties(kernels, *, T: int, cfg: str = "bf16-ckpt32", device: str = "cpu", steps: int = 12, R: int = 3,
                   n_pad: int = 1, seed: int = 0, H: int = 1, HV: int = 2, K: int = 128, decay: str = "normal",
                   accept: str = "random", ring: int = 32, L: int | None = None, relations: bool = True) -> dict:
    """Every property above on one stream.  Returns {findings: [...], measurements: {...}, seconds}."""
    t0 = time.time()
    st = make_stream(seed, T, R, steps, H, HV, K, K, decay, accept)
    tr = truth_of(st)
    order = _pads(seed, R, n_pad)
    ad, recs, F, meas = drive(kernels, st, cfg, device, order, ring=ring, L=L, truth=tr)
    if relations:
        ad2, recs2, _, _ = drive(kernels, st, cfg, device, order, ring=ring, L=L, checks=False)
        same = all(_bits_equal(a["y"], b["y"]) for a, b in zip(recs, recs2))
        bufs = all(_bits_equal(x, y) for x, y in zip(ad.buffers().values(), ad2.buffers().values()))
        meas["determinism_bit_identical"] = bool(same and bufs)
        if not (same and bufs):
            F.append(Finding("determinism", "R1", f"two runs of one stream differ (outputs equal: {same}, "
                             f"buffers equal: {bufs})"))
        order3 = _pads(seed + 1, R, n_pad + 1)
        ad3, recs3, _, _ = drive(kernels, st, cfg, device, order3, ring=ring, L=L, checks=False)
        ysame = all(_bits_equal(a["y"], b["y"]) for a, b in zip(recs, recs3))
        hsame = _bits_equal(ad.logical_state(list(range(R))), ad3.logical_state(list(range(R))))
        meas["permutation_bit_identical"] = bool(ysame and hsame)
        if not (ysame and hsame):
            F.append(Finding("permutation", "R1", f"permuting the batch rows changed results (outputs equal: {ysame}, "
                             f"committed states equal: {hsame})"))
    return dict(T=T, cfg=cfg, device=device, steps=steps, R=R, n_pad=n_pad, seed=seed, H=H, HV=HV, K=K, ring=ring,
                L=ad.L, flush_min=ad.flush_min, decay=decay, accept=accept, kernels=getattr(kernels, "name", "?"),
                findings=[str(f) for f in F], measurements=meas, seconds=time.time() - t0)


# ------------------------------------------------------------------ differential


def _fused_drive(target, arm, st: Stream, device: str):
    """The fused target through the same stream: caller commit (C3), lazy flush_min.  Yields (y [R,T,HV,V], S [R,...])."""
    spec = get_arm(arm)
    dev = torch.device(device)
    R, T, H, HV, K, V = st.R, st.T, st.H, st.HV, st.K, st.V
    fmin = 17 - T
    g = torch.Generator().manual_seed(5)
    pool = st.S0.to(device=dev, dtype=spec.state, copy=True)
    kc = gdn_oracle.l2norm(torch.randn(R, H, 32, K, generator=g)).to(spec.ring).to(dev)
    uc = torch.randn(R, HV, 32, V, generator=g).to(spec.ring).to(dev)
    gc = (-torch.rand(R, HV, 32, generator=g) * 4).float().to(dev)
    out = torch.zeros(R, T, HV, V, dtype=spec.io, device=dev)
    A = st.A_log.to(device=dev, dtype=spec.io, copy=True)
    dt = st.dt_bias.to(device=dev, dtype=spec.io, copy=True)
    hist = torch.zeros(R, dtype=torch.long)
    base = torch.zeros(R, dtype=torch.long)
    idx = torch.arange(R)
    for inp in st.steps:
        c = lambda x: x.to(device=dev, dtype=spec.io, copy=True)  # noqa: E731
        target.launch(arm, A_log=A, dt_bias=dt, a=c(inp.a), b=c(inp.b), q=c(inp.q), k=c(inp.k), v=c(inp.v),
                      initial_state_source=pool, initial_state_indices=idx.to(torch.int32).to(dev),
                      k_cache=kc, u_cache=uc, g_cache=gc, hist_len=hist.to(torch.int32).to(dev),
                      cache_base=base.to(torch.int32).to(dev), output=out, scale=K ** -0.5, flush_min=fmin,
                      restart_hist_on_flush=False)
        hist, base = commits.caller_commit(hist, base, inp.accepted, fmin)
        kw, uw, Gw, valid = ring_oracle.gather_window(kc.cpu(), uc.cpu(), gc.cpu(), idx, hist, base, HV)
        S, _, _ = ring_oracle.replay(pool.cpu()[idx], kw, uw, Gw, valid, hist)
        yield out.detach().cpu().clone(), S


def run_differential(fused_target, fused_arms, triton_kernels, triton_cfgs, *, T: int, steps: int = 24, R: int = 4,
                     H: int = 2, HV: int = 4, seed: int = 0, device: str = "cpu", accept: str = "mtp",
                     decay: str = "normal") -> dict:
    """Same request stream through every fused arm and every Triton config; per-step max divergence per pair."""
    from gdn_fuzz.compare import drift_unit

    t0 = time.time()
    st = make_stream(seed, T, R, steps, H, HV, 128, 128, decay, accept)
    tr = truth_of(st)
    dc = _drift_c()
    backends = {}  # name -> (u, list of (y, S))
    for arm in fused_arms:
        backends[f"fused:{arm}"] = (drift_unit(arm), list(_fused_drive(fused_target, arm, st, device)))
    for cfg in triton_cfgs:
        io, ck = triton_io_ckpt(cfg)
        u = max(unit_roundoff(io), unit_roundoff(ck))
        ad = _mk_adapter(triton_kernels, st, cfg, device)
        seq = []
        for inp in st.steps:
            y = ad.step(list(range(R)), inp.q, inp.k, inp.v, inp.a, inp.b, inp.accepted).detach().cpu()
            seq.append((y, ad.logical_state(list(range(R)))))
        backends[f"triton:{cfg}"] = (u, seq)
    vs_truth = {}
    for name, (u, seq) in backends.items():
        vs_truth[name] = dict(
            state=[float(_rel_rows(S, tr.states[i], tr.states[i]).max()) for i, (_, S) in enumerate(seq)],
            y=[float(_y_rel(y, tr.ys[i], tr.y_mags[i], st.steps[i].accepted, T).max()) for i, (y, _) in enumerate(seq)])
    pairs = {}
    fused = [n for n in backends if n.startswith("fused:")]
    trit = [n for n in backends if n.startswith("triton:")]
    for a in fused:
        for b in trit:
            ua, sa = backends[a]
            ub, sb = backends[b]
            rs, ry, ratio = [], [], 0.0
            for i in range(steps):
                age = i + 1
                s = float(_rel_rows(sa[i][1], sb[i][1], tr.states[i]).max())
                y = float(_y_rel(sa[i][0], sb[i][0].double(), tr.y_mags[i], st.steps[i].accepted, T).max())
                sb_ = dc * (ua + ub) * math.sqrt(1 + age)
                yb_ = (C_Y + dc * math.sqrt(age)) * (ua + ub)
                rs.append(s)
                ry.append(y)
                ratio = max(ratio, s / sb_, y / yb_)
            pairs[f"{a} vs {b}"] = dict(state=rs, y=ry, max_state=max(rs), max_y=max(ry), max_ratio=ratio,
                                        agree=ratio <= 1.0)
    return dict(meta=dict(T=T, steps=steps, R=R, H=H, HV=HV, K=128, seed=seed, device=device, accept=accept,
                          decay=decay, fused_target=str(fused_target), triton=getattr(triton_kernels, "name", "?"),
                          triton_source=getattr(triton_kernels, "source", "?"), flush_min=17 - T, L=16 + T,
                          seconds=time.time() - t0, torch=torch.__version__,
                          date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          budget="state: DRIFT_C (u_a + u_b) sqrt(1 + age); y: (C_Y + DRIFT_C sqrt(age)) (u_a + u_b)"),
                vs_truth=vs_truth, pairs=pairs)


# ------------------------------------------------------------------ command line


def _kernels(which: str):
    if which == "model":
        return TorchBaselineModel
    from gdn_fuzz.targets.triton_baseline import load_kernels

    return load_kernels(interpret=(which == "interpret"))


def add_parser(sub) -> None:
    p = sub.add_parser("triton", help="the SGLang Triton ReplaySSM baseline: properties and a differential run")
    _add_args(p)
    p.set_defaults(func=lambda args: _run(args))


def _add_args(p):
    p.add_argument("--kernels", choices=["triton", "interpret", "model"], default="triton",
                   help="triton (GPU), interpret (TRITON_INTERPRET=1 on CPU tensors), model (torch float64 model)")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--T", nargs="+", type=int, default=[4, 8])
    p.add_argument("--cfgs", nargs="+", default=["bf16-ckpt32", "bf16-ckpt16"], help=f"of {', '.join(TRITON_CONFIGS)}")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-properties", action="store_true")
    p.add_argument("--diff", action="store_true", help="also run the differential against --fused-target")
    p.add_argument("--fused-target", default="production")
    p.add_argument("--fused-arms", nargs="+", default=None, help="default: all five")
    p.add_argument("--diff-steps", type=int, default=24)
    p.add_argument("--json", help="write the JSON record here")


def _run(args) -> int:
    import os

    from rich.console import Console
    from rich.table import Table

    from gdn_fuzz.arms import ARM_NAMES
    from gdn_fuzz.targets import TargetUnavailable, get_target

    con = Console(highlight=False, width=160)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.kernels == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        kern = _kernels(args.kernels)
    except TargetUnavailable as e:
        con.print(f"[red]Triton baseline unavailable:[/red] {e}")
        return 2
    rec = dict(kernels=args.kernels, source=getattr(kern, "source", "?"), device=dev, properties=[], differential=[],
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    bad = False
    if not args.no_properties:
        tab = Table(title=f"Triton baseline properties ({args.kernels}, {dev})")
        for col in ("T", "cfg", "findings", "state", "y", "fold rel", "fold=fp32 bits", "max ulp(max|F|)", "pad", "det", "perm", "s"):
            tab.add_column(col)
        for T in args.T:
            for cfg in args.cfgs:
                r = run_properties(kern, T=T, cfg=cfg, device=dev, steps=args.steps, seed=args.seed)
                rec["properties"].append(r)
                m = r["measurements"]
                bad |= bool(r["findings"])
                bits = f"{m['fold_bit_identical']}/{m['fold_elements']}" if m["fold_elements"] else "-"
                tab.add_row(str(T), cfg, str(len(r["findings"])), f"{m['state_max']:.2e}", f"{m['y_max']:.2e}",
                            f"{m['fold_max_rel']:.2e}", bits, f'{m["fold_vs_fp32_max_ulp"]:.2g}',
                            f"{m['pad_output_max']:.1g}", str(m.get("determinism_bit_identical")),
                            str(m.get("permutation_bit_identical")), f"{r['seconds']:.1f}")
                for f in r["findings"]:
                    con.print(f"  T={T} {cfg}: {f}", markup=False)
        con.print(tab)
    if args.diff:
        try:
            ft = get_target(args.fused_target)
            why = ft.unavailable_reason(dev)
        except (TargetUnavailable, ValueError) as e:
            why = str(e)
        if why:
            con.print(f"[red]differential skipped:[/red] {why}")
            rec["differential_skipped"] = why
            bad = True
        else:
            arms = tuple(args.fused_arms or ARM_NAMES)
            tab = Table(title=f"differential: fused {args.fused_target} vs Triton baseline (max over steps)")
            for col in ("T", "pair", "max state div", "max y div", "max ratio to budget", "agree"):
                tab.add_column(col)
            for T in args.T:
                d = run_differential(ft, arms, kern, args.cfgs, T=T, steps=args.diff_steps, seed=args.seed, device=dev)
                rec["differential"].append(d)
                for name, p in d["pairs"].items():
                    bad |= not p["agree"]
                    tab.add_row(str(T), name, f"{p['max_state']:.2e}", f"{p['max_y']:.2e}", f"{p['max_ratio']:.3f}",
                                str(p["agree"]))
            con.print(tab)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1, default=str)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdn_fuzz.studies.triton_diff", description=__doc__.splitlines()[0])
    _add_args(ap)
    return _run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
