"""`gdn-fuzz triton`: the Triton ReplaySSM baseline's properties, and a differential run against the fused kernel.

Both backends run on the serving engine (gdn_fuzz.serving.engine; the baseline through
serving.adapters.TritonAdapter, the fused kernel through serving.adapters.DirectAdapter): a set of
requests, T tokens verified per step, an accepted count per request, a commit.  Inputs are
teacher-forced (generated once per (seed, T, step), bf16-rounded, the same for every backend)
so there is ONE float64 truth per stream: the engine's sequential decode over exactly the
accepted tokens.

Properties of the baseline (``run_properties``; clause ids of shared/docs/kernel-contract.md).
The engine's own checks:
  serving.trajectory [M3, C3, C4] committed logical state (checkpoint + d/k/g window) vs the truth
  serving.ragged     [M4]  outputs of the accepted tokens vs the truth
  serving.cursors    [C3]  cursors after commit_gdn_replayssm_spec vs oracles.commit.caller_commit
                           (ring mask ring - 1)
and the baseline's own, added to the same step as an engine hook (``TritonChecks``):
  state.raw     [M7]  the same state rebuilt the exact-fold way (raw v/k/beta) vs the truth
  fold          [M7]  at every flush launch, the folded checkpoint vs the float64 sequential
                      replay of the kernel's own raw records (asserted within the bound below),
                      and vs an fp32 emulation of the fold's op order (MEASURED: bit-identical
                      count and max ulp distance; never asserted)
  pad           [M8]  pad rows (null block 0): null block / replay slot 0 keep their bits;
                      pad outputs are zero (the baseline's verify pass zeroes them)
  early_flush   [C3]  before every launch wp + T <= L for every live request, and is_flush ==
                      (wp >= L - 2T + 1): every verify window fits its buffer; after the commit
                      is_flush' = (wp' + 2T > L)
  fused_layout  [M3, M6] the adapter's mapping to the fused layout, replayed by
                      oracles.ring.replay, equals the adapter's own replay (compare.F64_REPLAY_RTOL)
  determinism   [R1]  the same stream twice: bit-identical outputs and buffers
  permutation   [R1]  the same stream with the batch rows permuted and pads moved:
                      bit-identical per-request outputs and committed checkpoints

Budgets, all from gdn_fuzz.compare: u = the coarsest unit roundoff among the IO dtype (the d/k
rings and outputs are stored in it) and the checkpoint dtype; state: drift_budget (DRIFT_C u
sqrt(1 + age)); y: y_budget ((C_Y + DRIFT_C sqrt(1 + age)) u ||y_mag||, age of the state the
launch starts from); fold: exact_fold_rtol (norm-wise; the per-element commit check of the fold adds
store_underflow, the subnormal rounding of the checkpoint store).
Differential (``run_differential``): the fused arms and the Triton configurations as backends of
one engine on one stream; max over requests and heads of ||S_a - S_b|| / ||S_truth|| per step
and of ||y_a - y_b|| / ||y_mag|| over the accepted tokens; allowed = the same budgets with
u = u_a + u_b (fused arms: u = compare.drift_unit).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch

from gdn_fuzz.arms import unit_roundoff
from gdn_fuzz.case import Regime, decay_params, draw_tokens, lazy_flush_min
from gdn_fuzz.findings import Finding
from gdn_fuzz.compare import (C_FOLD, F32_UNIT, F64_REPLAY_RTOL, FP16_SUBNORMAL, distance, drift_budget,
                              exact_fold_rtol, frobenius, ratio, y_budget)
from gdn_fuzz.oracles import gdn as gdn_oracle, ring as ring_oracle
from gdn_fuzz.oracles.serving import StepInputs
from gdn_fuzz.serving.adapters import DirectAdapter, TritonAdapter
from gdn_fuzz.serving.engine import Engine, Geometry
from gdn_fuzz.targets import triton_baseline as tb
from gdn_fuzz.targets.triton_baseline import TritonBaselineServing
from gdn_fuzz.studies.drift import draw_accepts, parse_accept


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

    reg = Regime(decay=decay)
    gen = torch.Generator().manual_seed(seed * 7919 + T)
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    A_log, dt_bias, _ = decay_params(reg, gen, 1, 1, HV)
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
    return float((a.float() - b.float()).abs().max() / (F32_UNIT * a.float().abs().max().clamp_min(1e-30)))


def _pads(seed: int, R: int, n_pad: int) -> list[int]:
    """Batch order: requests 0..R-1 shuffled with n_pad pad rows (-1) in between, from the seed."""
    rows = list(range(R)) + [-1] * n_pad
    random.Random(seed).shuffle(rows)
    return rows


# ------------------------------------------------------------------ the stream on the serving engine


def _engine(st: Stream, backends, device: str, B: int, *, checks) -> Engine:
    """An engine over `backends` for the stream: request r in block r + 1 (block 0: the null block)."""
    fmin = next(iter(backends.values())).fmin
    geo = Geometry(st.T, st.H, st.HV, layers=1, blocks=st.R + 1, B=B, flush_min=fmin, K=st.K)
    eng = Engine(geo, backends, device, checks=checks, params=[(st.A_log, st.dt_bias)], io=torch.bfloat16,
                 state=torch.bfloat16, y_tokens="accepted")
    for r in range(st.R):
        eng.admit(r + 1, state=st.S0[r])  # request id r
    return eng


def _step(eng: Engine, st: Stream, i: int, order: list[int], check: bool = True):
    """Step i of the stream: request r at the batch position where order holds r, pads (-1) zero-filled."""
    inp = st.steps[i]
    pos = [p for r in range(st.R) for p, o in enumerate(order) if o == r]
    tok = {}
    for name in ("q", "k", "v", "a", "b"):
        x = getattr(inp, name)
        full = torch.zeros((len(order), *x.shape[1:]), dtype=x.dtype)
        full[pos] = x
        tok[name] = full.to(eng.device)
    plan = [(r, st.T, int(inp.accepted[r])) for r in range(st.R)]
    return eng.step(plan, order=order, tokens=[tok], check=check)


class TritonChecks:
    """The baseline's own properties (module docstring), as a hook on the engine's step."""

    def __init__(self, ad: TritonAdapter, meas: dict):
        self.ad, self.meas = ad, meas

    def before(self, eng, batch):
        tb, T, i = self.ad.tb, eng.geo.T, batch.step
        reqs = [x.block - 1 for x in batch.rows]
        wp, base, fl = tb.cursors(reqs)
        F = self.F = []
        bad = (wp + T > tb.L).nonzero().flatten().tolist()
        if bad:
            F.append(Finding("early_flush", "C3", f"step {i}: requests {bad} verify past the budget: wp + T > L={tb.L}",
                             value=float(wp.max() + T)))
        want_fl = (wp >= self.ad.fmin).long()
        if not torch.equal(fl, want_fl):
            F.append(Finding("early_flush", "C3", f"step {i}: is_flush {fl.tolist()} != wp >= L - 2T + 1 "
                             f"({want_fl.tolist()}), wp={wp.tolist()}"))
        self.reqs, self.wp = reqs, wp
        self.folding = [r for j, r in enumerate(reqs) if int(fl[j]) and int(wp[j]) > 0]
        if self.folding:
            self.f64 = tb.logical_state_raw(self.folding)
            self.f32 = fold_fp32_emulation(tb, self.folding)
            self.mag = _fold_magnitude(tb, self.folding)
        self.null_before = {k: v.detach().cpu().clone() for k, v in _null_view(tb).items()}

    def after(self, eng, batch, rec):
        ad, tb, meas, F, i = self.ad, self.ad.tb, self.meas, self.F, batch.step
        T, reqs = eng.geo.T, self.reqs
        meas["launches"] += 1
        for k_, v_ in _null_view(tb).items():
            if not _bits_equal(v_.detach().cpu(), self.null_before[k_]):
                F.append(Finding("pad", "M8", f"step {i}: the null block / replay slot 0 changed: {k_}"))
        padrows = [p for p, j in enumerate(batch.order) if j < 0]
        if padrows:
            pv = ad.last_y.detach().cpu()[padrows].double().abs()
            meas["pad_output_max"] = max(meas["pad_output_max"], float(torch.nan_to_num(pv, nan=float("inf")).max()))
            if not bool((pv == 0).all()):
                F.append(Finding("pad", "M8", f"step {i}: pad rows' outputs are not zero (the verify pass zeroes them)"))
        wp2, _, fl2 = tb.cursors(reqs)
        if not torch.equal(fl2, ((wp2 + 2 * T) > tb.L).long()):
            F.append(Finding("early_flush", "C3", f"step {i}: is_flush after the commit {fl2.tolist()} != "
                             f"wp' + 2T > L for wp' = {wp2.tolist()}"))
        if self.folding:
            after = tb.h0.detach().cpu()[[tb.blocks[r] for r in self.folding]]
            meas["folds"] += len(self.folding)
            rel = float(ratio(distance(after, self.f64, (-2, -1)), frobenius(self.mag, (-2, -1))).max())
            tol = exact_fold_rtol(unit_roundoff(ad.state), max(int(self.wp[reqs.index(r)]) for r in self.folding),
                                  eng.geo.K)
            meas["fold_max_rel"] = max(meas["fold_max_rel"], rel)
            meas["fold_ratio"] = max(meas["fold_ratio"], rel / tol)
            if not rel <= tol:
                F.append(Finding("fold", "M7", f"step {i}: folded checkpoint vs the float64 replay of its raw window",
                                 value=rel, tol=tol))
            if ad.state == torch.float32:
                f32 = self.f32
                meas["fold_vs_fp32_max_abs"] = max(meas["fold_vs_fp32_max_abs"], float((after.float() - f32).abs().max()))
                meas["fold_vs_fp32_max_ulp"] = max(meas["fold_vs_fp32_max_ulp"], _ulps(after, f32))
                meas["fold_bit_identical"] += int((after.float().view(torch.int32) == f32.view(torch.int32)).sum())
                meas["fold_elements"] += after.numel()
        st_m, y_m = rec.metrics[ad.name]["state"][0], rec.metrics[ad.name]["y"][0]
        meas["state_max"] = max(meas["state_max"], float(st_m["rel"].max()))
        meas["state_ratio"] = max(meas["state_ratio"], float(st_m["ratio"].max()))
        meas["y_max"] = max(meas["y_max"], float(y_m["rel"].max()))
        meas["y_ratio"] = max(meas["y_ratio"], float(y_m["ratio"].max()))
        # the exact-fold rebuild of the same committed state vs the truth (M7), same budget
        rids = st_m["rids"]
        truth = torch.stack([eng.requests[r].truth[0] for r in rids]).cpu()
        Sr = tb.logical_state_raw([eng.requests[r].block - 1 for r in rids])
        err, den = distance(Sr, truth, (-2, -1)), frobenius(truth, (-2, -1))
        ages = torch.tensor([eng.requests[r].age for r in rids], dtype=torch.float64)[:, None]
        meas["state_raw_max"] = max(meas["state_raw_max"], float(ratio(err, den).max()))
        worst = float(ratio(err, drift_budget(ad.u, ages, den)).max())
        if worst > 1.0:
            F.append(Finding("state.raw", "M7", f"step {i}: raw-window rebuild vs the sequential truth", value=worst,
                             tol=1.0))
        if ad.ring == 32 and int(tb.cursors(reqs)[0].max()) <= 16:
            lay = tb.to_fused_layout(reqs)
            kw, uw, Gw, valid = ring_oracle.gather_window(lay["k_cache"], lay["u_cache"], lay["g_cache"], lay["idx"],
                                                          lay["hist_len"], lay["cache_base"], eng.geo.HV)
            So, _, _ = ring_oracle.replay(lay["pool"], kw, uw, Gw, valid, lay["hist_len"])
            own = tb.logical_state(reqs)
            d = float(ratio(distance(So, own, (-2, -1)), frobenius(own, (-2, -1))).max())
            meas["fused_layout_max"] = max(meas["fused_layout_max"], d)
            if not d <= F64_REPLAY_RTOL:
                F.append(Finding("fused_layout", "M3", f"step {i}: fused-layout replay != the adapter's replay",
                                 value=d, tol=F64_REPLAY_RTOL))
        return F


def drive(kernels, st: Stream, cfg: str, device: str, order: list[int], *, ring: int = 32, L: int | None = None,
          checks: bool = True):
    """Run the stream through the baseline on the serving engine.  Returns (adapter, per-step outputs of
    the requests [R, T, HV, V] (request order), findings, measurements)."""
    meas = dict(state_max=0.0, state_raw_max=0.0, y_max=0.0, state_ratio=0.0, y_ratio=0.0, fold_max_rel=0.0,
                fold_ratio=0.0, fold_vs_fp32_max_abs=0.0, fold_vs_fp32_max_ulp=0.0, fold_bit_identical=0,
                fold_elements=0, folds=0, fused_layout_max=0.0, pad_output_max=0.0, launches=0)
    probe = Geometry(st.T, st.H, st.HV, blocks=st.R + 1, B=len(order), K=st.K)
    ad = TritonAdapter(kernels, probe, cfg, device, ring=ring, L=L)
    eng = _engine(st, {ad.name: ad}, device, len(order), checks=TritonAdapter.CHECKS if checks else ())
    if checks:
        eng.hooks.append(TritonChecks(ad, meas))
    ys, F = [], []
    for i in range(len(st.steps)):
        rec = _step(eng, st, i, order, check=checks)
        F += rec.findings
        ys.append(rec.outs[ad.name].y[0].detach().cpu().reshape(st.R, st.T, st.HV, st.K))
    return ad, ys, F, meas


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
                   accept: str = "random", ring: int = 32, L: int | None = None, relations: bool = True,
                   commits: int = 2) -> dict:
    """Every property above on one stream, plus `commits` drawn calls of each commit entry point
    (run_commit_properties; its record under measurements["commits"]).  Returns {findings: [...],
    measurements: {...}, seconds}."""
    t0 = time.time()
    st = make_stream(seed, T, R, steps, H, HV, K, K, decay, accept)
    order = _pads(seed, R, n_pad)
    ad, ys, F, meas = drive(kernels, st, cfg, device, order, ring=ring, L=L)
    if relations:
        ad2, ys2, _, _ = drive(kernels, st, cfg, device, order, ring=ring, L=L, checks=False)
        same = all(_bits_equal(a, b) for a, b in zip(ys, ys2))
        bufs = all(_bits_equal(x, y) for x, y in zip(ad.tb.buffers().values(), ad2.tb.buffers().values()))
        meas["determinism_bit_identical"] = bool(same and bufs)
        if not (same and bufs):
            F.append(Finding("determinism", "R1", f"two runs of one stream differ (outputs equal: {same}, "
                             f"buffers equal: {bufs})"))
        ad3, ys3, _, _ = drive(kernels, st, cfg, device, _pads(seed + 1, R, n_pad + 1), ring=ring, L=L, checks=False)
        ysame = all(_bits_equal(a, b) for a, b in zip(ys, ys3))
        hsame = _bits_equal(ad.tb.logical_state(list(range(R))), ad3.tb.logical_state(list(range(R))))
        meas["permutation_bit_identical"] = bool(ysame and hsame)
        if not (ysame and hsame):
            F.append(Finding("permutation", "R1", f"permuting the batch rows changed results (outputs equal: {ysame}, "
                             f"committed states equal: {hsame})"))
    extra = []
    if commits:
        cr = run_commit_properties(kernels, T=T, cfg=cfg, device=device, seed=seed, cases=commits, K=K)
        extra = cr["findings"]
        meas["commits"] = dict(cr["measurements"], skipped=cr["skipped"], seconds=cr["seconds"])
    return dict(T=T, cfg=cfg, device=device, steps=steps, R=R, n_pad=n_pad, seed=seed, H=H, HV=HV, K=K, ring=ring,
                L=ad.L, flush_min=ad.fmin, decay=decay, accept=accept, kernels=getattr(kernels, "name", "?"),
                findings=[str(f) for f in F] + extra, measurements=meas, seconds=time.time() - t0)


# ------------------------------------------------------------------ differential


def run_differential(fused_target, fused_arms, triton_kernels, triton_cfgs, *, T: int, steps: int = 24, R: int = 4,
                     H: int = 2, HV: int = 4, seed: int = 0, device: str = "cpu", accept: str = "mtp",
                     decay: str = "normal") -> dict:
    """Same request stream through every fused arm and every Triton config (backends of one engine, one
    truth); per-step max divergence per (fused, Triton) pair."""
    t0 = time.time()
    st = make_stream(seed, T, R, steps, H, HV, 128, 128, decay, accept)
    geo = Geometry(T, H, HV, blocks=R + 1, B=R)
    backends = {f"fused:{arm}": DirectAdapter(fused_target, geo, arm, device, 5, commit="caller") for arm in fused_arms}
    for cfg in triton_cfgs:
        backends[f"triton:{cfg}"] = TritonAdapter(triton_kernels, geo, cfg, device)
    eng = _engine(st, backends, device, R, checks={"trajectory", "ragged"})
    vs_truth = {name: dict(state=[], y=[]) for name in backends}
    fused = [n for n in backends if n.startswith("fused:")]
    trit = [n for n in backends if n.startswith("triton:")]
    pairs = {f"{a} vs {b}": dict(state=[], y=[], max_ratio=0.0) for a in fused for b in trit}
    for i in range(steps):
        rec = _step(eng, st, i, list(range(R)))
        m = rec.metrics
        for name in backends:
            vs_truth[name]["state"].append(float(m[name]["state"][0]["rel"].max()))
            vs_truth[name]["y"].append(float(m[name]["y"][0]["rel"].max()))
        for a in fused:
            for b in trit:
                sa, sb, ya, yb = m[a]["state"][0], m[b]["state"][0], m[a]["y"][0], m[b]["y"][0]
                mask = ya["mask"][..., None, None].double()
                s = float(ratio(distance(sa["S"], sb["S"], (-2, -1)), sa["den"]).max())
                y = float(ratio(distance(ya["Y"] * mask, yb["Y"] * mask, (1, 3)), ya["mag"]).max())
                u = backends[a].u + backends[b].u
                one = torch.ones((), dtype=torch.float64)
                p = pairs[f"{a} vs {b}"]
                p["state"].append(s)
                p["y"].append(y)
                p["max_ratio"] = max(p["max_ratio"], s / float(drift_budget(u, i + 1, one)),
                                     y / float(y_budget(u, i, one)))
    for p in pairs.values():
        p.update(max_state=max(p["state"]), max_y=max(p["y"]), agree=p["max_ratio"] <= 1.0)
    return dict(meta=dict(T=T, steps=steps, R=R, H=H, HV=HV, K=128, seed=seed, device=device, accept=accept,
                          decay=decay, fused_target=str(fused_target), triton=getattr(triton_kernels, "name", "?"),
                          triton_source=getattr(triton_kernels, "source", "?"), flush_min=lazy_flush_min(T), L=16 + T,
                          seconds=time.time() - t0, torch=torch.__version__,
                          date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          budget="state: compare.drift_budget with u_a + u_b; y: compare.y_budget with u_a + u_b"),
                vs_truth=vs_truth, pairs=pairs)


# ------------------------------------------------------------------ the commit entry points, one call each (issue 18)
# commit_gdn_replayssm_spec (both values of fold_every_commit), commit_gdn_replayssm_circular and the
# fold-every-commit fold commit_gdn_replayssm_fold_all_layers, each called once on a drawn table of
# cursors / rings and compared with the plain-Python expectations of gdn_fuzz.targets.triton_baseline
# (expect_*).  Per property:
#   commit.*.cursors   [C3] write_pos / cache_base / is_flush of every replay slot == the expectation
#                           (exact; slots outside the batch and pad rows' slots keep their values)
#   commit.*.invariant [C4] reachable states stay reachable: wp' + T <= L and is_flush' == (wp' + 2T > L)
#                           (fold_every_commit: wp' <= T and is_flush' == (wp' > 0)); circular: wp' = 0
#                           and is_flush' = 0 on capacity rows
#   commit.*.state     [M3 M7] checkpoint rows written by the commit vs the float64 expectation, per
#                           element within tol x |terms| (+ atol), see _commit_tolerance; the fold:
#                           exact_fold_rtol x |terms| + store_underflow(ckpt dtype)
#   commit.*.untouched [M8] every other buffer element (rings, residuals, other checkpoint rows,
#                           pad rows' blocks and slots) keeps its bits
# Pad rows use the entry point's own predicate (targets.triton_baseline, "pad-row predicates").


@dataclass
class CommitRow:
    """One batch row of a commit call.  live=False: a pad row (index <= null under the entry point's predicate).

    wp, base, flush: the cursors of the row's replay slot before the call; accepted: num_accepted /
    accept_lens; track_step: -1 none, else mamba_steps_to_track (circular / fold only)."""

    live: bool = True
    wp: int = 0
    base: int = 0
    flush: bool = False
    accepted: int = 0
    track_step: int = -1


@dataclass
class CommitCase:
    """A drawn commit call.  T: max_spec_len; L: commit budget (max_cache_len of the spec commit);
    ring: cache_buf_len / ring slots (power of two); null: null_block_id; pad_below: pad rows use
    null - 1 instead of null; seed: contents of rings, checkpoints and of slots outside the batch."""

    rows: list
    T: int = 4
    L: int = 20
    ring: int = 32
    fold_every: bool = False
    null: int = 0
    pad_below: bool = False
    layers: int = 1
    H: int = 1
    G: int = 2
    K: int = 32
    residual: bool = False
    track: bool = False
    seed: int = 0

    @property
    def HV(self) -> int:
        return self.H * self.G


def _indices(case: CommitCase):
    """(state index, replay index, track index) per row, the number of slots; live rows get distinct
    indices > null, in different permutations (so checkpoint and ring keys differ), track rows a spare
    state slot of their own; pad rows null (or null - 1) for the state index and an unused replay slot
    whose cursors say 'flush' (so a pad row that is not skipped shows)."""
    rnd = random.Random(case.seed * 1009 + 7)
    n = len(case.rows)
    first = max(case.null + 1, 1)
    nslots = first + 2 * n + 2
    pad = case.null - 1 if case.pad_below else case.null
    st_pool = list(range(first, nslots))
    rp_pool = list(range(first, nslots))
    rnd.shuffle(st_pool)
    rnd.shuffle(rp_pool)
    sidx, ridx, tidx = [], [], []
    for row in case.rows:
        rp = rp_pool.pop()
        if row.live:
            sidx.append(st_pool.pop())
        else:
            sidx.append(pad)
        ridx.append(rp)
        tidx.append(st_pool.pop() if row.track_step >= 0 else case.null)
    return sidx, ridx, tidx, nslots


def _cursor_tables(case: CommitCase, ridx, nslots, *, spec_pads: bool):
    """write_pos / cache_base / is_flush over nslots replay slots: the rows' cursors at their slots,
    random values elsewhere (slot 0 and the other unused slots say flush=1 half of the time)."""
    rnd = random.Random(case.seed * 31 + 3)
    wp = [rnd.randint(0, case.ring) for _ in range(nslots)]
    base = [rnd.randrange(case.ring) for _ in range(nslots)]
    fl = [rnd.randint(0, 1) for _ in range(nslots)]
    for row, r in zip(case.rows, ridx):
        if row.live or not spec_pads:
            wp[r], base[r], fl[r] = row.wp, row.base, int(row.flush)
        if not row.live and not spec_pads:
            fl[r] = 1  # a capacity slot: a pad row that were not skipped would fold and reset it
    return wp, base, fl


def _snapshot(bufs: dict) -> dict:
    return {k: v.detach().cpu().clone() for k, v in bufs.items() if v is not None}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def _untouched(name: str, before: dict, after: dict, skip: set, F: list, case, clause: str = "M8"):
    """Every buffer but the named ones keeps its bits; returns nothing, appends findings."""
    for k, b in before.items():
        if k in skip:
            continue
        a = after[k]
        if not torch.equal(_bits(a), _bits(b)):
            where = (a.view(-1).view(torch.uint8) != b.view(-1).view(torch.uint8)).nonzero().flatten()[:4].tolist()
            F.append(Finding(f"commit.{name}.untouched", clause, f"{k} changed (first changed bytes {where}); {case}",
                             outcome="bits differ"))


def _commit_tolerance(u_io: float, u_ckpt: float, n: int, ring: int, gsum: float, io: torch.dtype) -> tuple[float, float]:
    """(rtol of |terms|, atol per element unit) of commit_gdn_replayssm_circular's closed form.

    C_FOLD u(ckpt): one rounding to the checkpoint dtype.  4 u(io)^2: the hi/lo split of d w into the
    ring dtype (decode.py:729-734) leaves |x - hi - lo| <= u(io) |lo| <= u(io)^2 |x| (1 + u), twice (the
    residual keys add one more product).  F32_UNIT (8 + log2 ring + 2 n (1 + sum|g|)): fp32 dot
    accumulation over ring terms, exp, the final fma, and the fp32 cumsum of n gates whose absolute
    error n 2^-24 sum|g| becomes a relative error of every weight e^(Gam - Gam_j).  atol (fp16 rings
    only): d w below the fp16 subnormal range is lost, FP16_SUBNORMAL per record and unit |k|."""
    rtol = C_FOLD * u_ckpt + 4 * u_io * u_io + F32_UNIT * (8 + math.log2(ring) + 2 * n * (1 + gsum))
    atol = n * FP16_SUBNORMAL if io == torch.float16 else 0.0
    return rtol, atol


def store_underflow(dtype: torch.dtype) -> float:
    """eta: the absolute error of ONE round-to-nearest store of an fp32 value into `dtype` that the relative
    term u(dtype) |x| does not cover: half the subnormal spacing, tiny * eps / 2 (fp16 2^-25, bf16 2^-134,
    fp32 2^-150).  The standard model with gradual underflow is fl(x) = x (1 + d) + e, |d| <= u, |e| <= eta,
    d e = 0: below the smallest normal (fp16 2^-14 = 6.1e-5) the rounding is absolute, up to 2^-25, which
    exceeds C_FOLD u |x| = 3 * 2^-11 |x| for |x| < 2^-25 / (3 * 2^-11) = 2^-15.6 = 2.0e-5.

    The exact fold holds its state in fp32 and rounds it to the checkpoint dtype once per written row,
    gdn_replayssm_spec_fold.py:142 (`b_h.to(p_h0.dtype.element_ty)`; the track row :138); nothing else
    in it comes near the fp32 underflow on the drawn domain (fp32 normals reach 2^-126; g >= -4 and T <= 8
    bound the window's decay by e^-32).  With an fp16 checkpoint, K = 128 and a few records, elements with
    |terms| ~ 1e-5 occur (the last record's k_i beta v_j small, the checkpoint decayed by e^(sum g)): the
    H200 run (issue 18) and the interpreter at K = 128 both give error / (C_FOLD u |terms|) = 1.36 at
    checkpoint[1, 3] of FOLD_UNDERFLOW_CASE (|x| = 4.7e-6, a subnormal; error 1.98e-8 <= eta = 2.98e-8).
    docs/triton-baseline.md, "fp16 checkpoint: the store's underflow"."""
    fi = torch.finfo(dtype)
    return fi.tiny * fi.eps / 2


def _state_rows(name: str, ck_after: torch.Tensor, rows: dict, rtol_of, F: list, meas: dict, case):
    """Compare the expected checkpoint rows {(layer, slot): (state, magnitude)}; return the mask of them.

    rtol_of(key) -> (rtol, atol) or (rtol, atol, eta); an element passes when |got - want| <=
    rtol |terms| + atol (1 + max |terms|) + eta."""
    mask = torch.zeros(ck_after.shape[:2], dtype=torch.bool)
    for (l, s), (want, mag) in rows.items():
        mask[l, s] = True
        got = ck_after[l, s].double()
        if not bool(torch.isfinite(got).all()):
            F.append(Finding(f"commit.{name}.state", "M7", f"checkpoint[{l}, {s}] not finite; {case}",
                             outcome="non-finite"))
            continue
        rtol, atol, *eta = rtol_of((l, s))  # eta: an absolute bound per element, not scaled (store_underflow)
        eta = eta[0] if eta else 0.0
        r = float(((got - want).abs() / (rtol * mag + atol * (1 + mag.amax()) + eta).clamp_min(1e-300)).max())
        meas[f"{name}_state_ratio"] = max(meas.get(f"{name}_state_ratio", 0.0), r)
        rel = float(((got - want).abs() / mag.clamp_min(1e-300)).max())
        meas[f"{name}_state_rel"] = max(meas.get(f"{name}_state_rel", 0.0), rel)
        if not r <= 1.0:
            F.append(Finding(f"commit.{name}.state", "M7", f"checkpoint[{l}, {s}] vs the float64 expectation; {case}",
                             value=r, tol=1.0, outcome="out of tolerance", unit="error / (rtol |terms| + atol + eta)"))
    return mask


def _i32(x, device):
    return torch.tensor(x, dtype=torch.int32, device=device)


def check_commit_spec(kernels, case: CommitCase, device: str = "cpu") -> tuple[list, dict]:
    """commit_gdn_replayssm_spec on the case (pads: replay index <= null, decode.py:836)."""
    F, meas = [], {}
    name = "spec_fold_every" if case.fold_every else "spec"
    _, ridx, _, nslots = _indices(case)
    pad = case.null - 1 if case.pad_below else case.null
    ridx = [r if row.live else pad for r, row in zip(ridx, case.rows)]
    wp, base, fl = _cursor_tables(case, ridx, nslots, spec_pads=True)
    acc = [row.accepted for row in case.rows]
    want = tb.expect_commit_spec(wp, base, fl, acc, ridx, max_cache_len=case.L, max_spec_len=case.T,
                                 fold_every_commit=case.fold_every, cache_buf_len=case.ring, null_block_id=case.null)
    W, B, FL = _i32(wp, device), _i32(base, device), torch.tensor(fl, dtype=torch.int8, device=device)
    kernels.commit_spec(W, B, FL, _i32(acc, device), _i32(ridx, device), max_cache_len=case.L, max_spec_len=case.T,
                        fold_every_commit=case.fold_every, cache_buf_len=case.ring, null_block_id=case.null)
    got = (W.cpu().tolist(), B.cpu().tolist(), FL.cpu().tolist())
    for nm, g, w in zip(("write_pos", "cache_base", "is_flush"), got, want):
        if g != w:
            bad = [i for i in range(nslots) if g[i] != w[i]]
            F.append(Finding(f"commit.{name}.cursors", "C3", f"{nm} of replay slots {bad}: {[g[i] for i in bad]} != "
                             f"expected {[w[i] for i in bad]}; {case}", outcome="wrong value"))
    for row, r in zip(case.rows, ridx):
        if not row.live:
            continue
        w2, f2 = got[0][r], got[2][r]
        ok = (w2 <= case.T and f2 == int(w2 > 0)) if case.fold_every else \
            (w2 + case.T <= case.L and f2 == int(w2 + 2 * case.T > case.L))
        if not ok:
            F.append(Finding(f"commit.{name}.invariant", "C4", f"replay slot {r}: wp'={w2}, is_flush'={f2} leaves the "
                             f"reachable set (T={case.T}, L={case.L}); {case}", outcome="wrong value"))
    meas["spec_calls" if not case.fold_every else "spec_fold_every_calls"] = 1
    return F, meas


def _ring_buffers(case: CommitCase, nslots: int, io, ckpt, device, raw: bool):
    gen = torch.Generator().manual_seed(case.seed * 7 + 11)
    Lr, HV, H, K, nl = case.ring, case.HV, case.H, case.K, case.layers
    r = lambda *sh: torch.randn(*sh, generator=gen)  # noqa: E731
    bufs = dict(ckpt=r(nl, nslots, HV, K, K).to(ckpt),
                g=(-torch.rand(nl, nslots, HV, Lr, generator=gen) * 4).float())
    if raw:
        bufs.update(rawv=r(nl, nslots, HV, Lr, K).to(io), rawk=r(nl, nslots, H, Lr, K).to(io),
                    beta=torch.rand(nl, nslots, HV, Lr, generator=gen).float())
    else:
        bufs.update(d=r(nl, nslots, HV, Lr, K).to(io), k=(r(nl, nslots, H, Lr, K) / math.sqrt(K)).to(io))
        if case.residual:  # the low parts: a few io ulps of the high parts
            bufs.update(d_res=(r(nl, nslots, HV, Lr, K) * 2**-9).to(io),
                        k_res=(r(nl, nslots, H, Lr, K) * 2**-9 / math.sqrt(K)).to(io))
    return {k: v.to(device) for k, v in bufs.items()}


def check_commit_circular(kernels, case: CommitCase, io=torch.bfloat16, ckpt=torch.float32,
                          device: str = "cpu") -> tuple[list, dict]:
    """commit_gdn_replayssm_circular on the case (pads: ssm_state_indices <= null, decode.py:650, :798)."""
    F, meas = [], {}
    sidx, ridx, tidx, nslots = _indices(case)
    wp, base, fl = _cursor_tables(case, ridx, nslots, spec_pads=False)
    bufs = _ring_buffers(case, nslots, io, ckpt, device, raw=False)
    cur = dict(write_pos=_i32(wp, device), cache_base=_i32(base, device),
               is_flush=torch.tensor(fl, dtype=torch.int8, device=device))
    acc = _i32([row.accepted for row in case.rows], device)
    kw = dict(checkpoint_state=bufs["ckpt"], d_cache=bufs["d"], k_cache=bufs["k"], g_cache=bufs["g"],
              d_residual_cache=bufs.get("d_res"), k_residual_cache=bufs.get("k_res"),
              state_batch_indices=_i32(sidx, device), replay_indices=_i32(ridx, device), accept_lens=acc,
              null_block_id=case.null, **cur)
    if case.track:
        kw.update(mamba_track_indices=_i32(tidx, device),
                  mamba_steps_to_track=_i32([row.track_step for row in case.rows], device))
    want = tb.expect_commit_circular(**kw)
    before = _snapshot({**bufs, **cur})
    kernels.commit_circular(**kw)
    after = _snapshot({**bufs, **cur})
    for nm in ("write_pos", "cache_base", "is_flush"):
        g = after[nm].tolist()
        if g != want[nm]:
            bad = [i for i in range(nslots) if g[i] != want[nm][i]]
            F.append(Finding("commit.circular.cursors", "C3", f"{nm} of replay slots {bad}: {[g[i] for i in bad]} != "
                             f"expected {[want[nm][i] for i in bad]}; {case}", outcome="wrong value"))
    for row, r in zip(case.rows, ridx):
        if row.live and row.flush and (after["write_pos"][r] != 0 or after["is_flush"][r] != 0):
            F.append(Finding("commit.circular.invariant", "C4", f"capacity row's replay slot {r} keeps a window after "
                             f"materialization; {case}", outcome="wrong value"))
    u_io, u_ck = unit_roundoff(io), unit_roundoff(ckpt)
    g_cpu = before["g"].double()

    def rtol_of(key):
        l, s = key
        b = [i for i in range(len(case.rows)) if sidx[i] == s or tidx[i] == s][0]
        r = ridx[b]
        n = min(wp[r], case.ring)
        slots = [(base[r] + j) & (case.ring - 1) for j in range(n)]
        gsum = float(g_cpu[l, r][:, slots].abs().sum(-1).max()) if n else 0.0
        return _commit_tolerance(u_io, u_ck, n, case.ring, gsum, io)

    mask = _state_rows("circular", after["ckpt"], want["rows"], rtol_of, F, meas, case)
    ck_b, ck_a = before["ckpt"], after["ckpt"]
    if not torch.equal(_bits(ck_a[~mask]), _bits(ck_b[~mask])):
        F.append(Finding("commit.circular.untouched", "M8", f"checkpoint rows outside the fold / track rows "
                         f"{sorted(want['rows'])} changed; {case}", outcome="bits differ"))
    _untouched("circular", before, after, {"ckpt", "write_pos", "cache_base", "is_flush"}, F, case)
    meas["circular_rows_written"] = len(want["rows"])
    return F, meas


def check_fold_all_layers(kernels, case: CommitCase, io=torch.bfloat16, ckpt=torch.float32,
                          device: str = "cpu") -> tuple[list, dict]:
    """commit_gdn_replayssm_fold_all_layers on the case (pads: ssm_state_indices <= null, fold.py:68).  It
    takes no cursors: the rows' wp / base / flush are unused; accepted is the fold length."""
    F, meas = [], {}
    sidx, _, tidx, nslots = _indices(case)
    bufs = _ring_buffers(case, nslots, io, ckpt, device, raw=True)
    args = (bufs["ckpt"], bufs["rawv"], bufs["rawk"], bufs["g"], bufs["beta"], _i32(sidx, device),
            _i32([row.accepted for row in case.rows], device))
    kw = dict(null_block_id=case.null)
    if case.track:
        kw.update(mamba_track_indices=_i32(tidx, device),
                  mamba_steps_to_track=_i32([row.track_step for row in case.rows], device))
    want = tb.expect_fold_all_layers(*args, num_k_heads=case.H, **kw)
    before = _snapshot(bufs)
    kernels.fold_all_layers(*args, max_cache_len=case.ring, num_k_heads=case.H, **kw)
    after = _snapshot(bufs)
    u_ck = unit_roundoff(ckpt)
    n_of = {}
    for i, row in enumerate(case.rows):
        n_of[sidx[i]] = row.accepted
        n_of[tidx[i]] = row.track_step + 1

    eta = store_underflow(ckpt)

    def rtol_of(key):  # (rtol, atol, eta): see store_underflow for eta
        return exact_fold_rtol(u_ck, max(n_of.get(key[1], case.T), 1), case.K), 0.0, eta

    mask = _state_rows("fold", after["ckpt"], want, rtol_of, F, meas, case)
    if not torch.equal(_bits(after["ckpt"][~mask]), _bits(before["ckpt"][~mask])):
        F.append(Finding("commit.fold.untouched", "M8", f"checkpoint rows outside the folded / track rows "
                         f"{sorted(want)} changed; {case}", outcome="bits differ"))
    _untouched("fold", before, after, {"ckpt"}, F, case)
    meas["fold_rows_written"] = len(want)
    return F, meas


def draw_commit_case(rnd: random.Random, kind: str, T: int, *, ring: int = 32) -> CommitCase:
    """A random CommitCase from the same domain as the Hypothesis strategies of tests/test_triton_baseline.py.

    kind: spec | spec_fold_every | circular | fold.  Reachable cursors: spec: wp in [0, L - T] with
    is_flush = (wp + 2T > L), accepted in [0, T]; fold_every: wp in [0, T], is_flush = (wp > 0); circular:
    wp in [0, ring] (already including accepted <= min(T, wp)), any flag, track step < accepted; fold:
    accepted in [0, T] (fold length), track step in [-1, T)."""
    n = rnd.randint(1, 4)
    L = rnd.randint(2 * T, ring)
    rows = []
    for _ in range(n):
        live = rnd.random() < 0.8
        if kind == "spec":
            wp = rnd.randint(0, L - T)
            rows.append(CommitRow(live, wp, rnd.randrange(ring), wp + 2 * T > L, rnd.randint(0, T)))
        elif kind == "spec_fold_every":
            wp = rnd.randint(0, T)
            rows.append(CommitRow(live, wp, rnd.randrange(ring), wp > 0, rnd.randint(0, T)))
        elif kind == "circular":
            wp = rnd.randint(0, ring)
            acc = rnd.randint(0, min(T, wp))
            rows.append(CommitRow(live, wp, rnd.randrange(ring), rnd.random() < 0.5, acc,
                                  rnd.randint(-1, acc - 1) if acc else -1))
        else:
            rows.append(CommitRow(live, accepted=rnd.randint(0, T), track_step=rnd.randint(-1, T - 1)))
    null = 0 if kind.startswith("spec") else rnd.choice([-1, 0])
    H = rnd.choice([1, 2])
    return CommitCase(rows, T=T, L=L, ring=ring, fold_every=(kind == "spec_fold_every"), null=null,
                      pad_below=rnd.random() < 0.3, layers=rnd.choice([1, 2]), H=H, G=rnd.choice([1, 2]),
                      residual=kind == "circular" and rnd.random() < 0.5,
                      track=kind in ("circular", "fold") and rnd.random() < 0.5, seed=rnd.randrange(2**16))


COMMIT_KINDS = ("spec", "spec_fold_every", "circular", "fold")
# The fold case of the first H200 failure (test_gpu_commits[fp16-ckpt16-fold], issue 18): with an fp16
# checkpoint, checkpoint[1, 3] has an element of |x| = 4.7e-6 whose store rounding (2e-8, absolute in the
# subnormal range) is 1.36 x C_FOLD u |terms|; within store_underflow(float16).  K = 128.
FOLD_UNDERFLOW_CASE = CommitCase([CommitRow(live=True, accepted=5, track_step=0)], T=8, L=16, ring=16, null=-1,
                                 layers=2, H=2, G=1, K=128, seed=1)
INTERP_BF16_DOT = ("the Triton interpreter's tl.dot on bf16 operands returns garbage (measured with Triton 3.9: "
                   "|error| 2.8e10 on a 16x16 product; fp16 9.5e-7), and commit_gdn_replayssm_circular's closed "
                   "form is two tl.dot per record tile in the ring dtype: run it with fp16 rings, or on the GPU")


def run_commit_properties(kernels, *, T: int, cfg: str = "bf16-ckpt32", device: str = "cpu", seed: int = 0,
                          cases: int = 4, K: int | None = None) -> dict:
    """`cases` drawn calls of each commit entry point the kernels provide (COMMIT_KINDS).  Entry points
    the kernels lack (TorchBaselineModel has only commit_spec) are listed under `skipped` with why."""
    from gdn_fuzz.targets.triton_baseline import triton_io_ckpt

    t0 = time.time()
    io, ckpt = triton_io_ckpt(cfg)
    K = K or (128 if str(device).startswith("cuda") else 32)
    rnd = random.Random(seed * 7717 + T)
    F, meas, skipped = [], {}, {}
    for kind in COMMIT_KINDS:
        fn = {"spec": "commit_spec", "spec_fold_every": "commit_spec", "circular": "commit_circular",
              "fold": "fold_all_layers"}[kind]
        if getattr(kernels, fn, None) is None:
            skipped[kind] = f"{getattr(kernels, 'name', kernels)} has no {fn}"
            continue
        if kind == "circular" and getattr(kernels, "interpret", False) and io == torch.bfloat16:
            skipped[kind] = INTERP_BF16_DOT
            continue
        for _ in range(cases):
            c = draw_commit_case(rnd, kind, T, ring=rnd.choice([16, 32]) if kind != "spec" else rnd.choice([16, 32, 64]))
            c.K = K
            if kind.startswith("spec"):
                f, m = check_commit_spec(kernels, c, device)
            elif kind == "circular":
                f, m = check_commit_circular(kernels, c, io, ckpt, device)
            else:
                f, m = check_fold_all_layers(kernels, c, io, ckpt, device)
            F += f
            for k_, v_ in m.items():
                meas[k_] = max(meas.get(k_, 0), v_) if not k_.endswith(("calls", "written")) else meas.get(k_, 0) + v_
    return dict(findings=[str(f) for f in F], measurements=meas, skipped=skipped, seconds=time.time() - t0)


def pad_predicate_demo(kernels, *, device: str = "cpu", io=torch.float16, T: int = 4, K: int = 32,
                       accepted: int = 3) -> dict:
    """The known pad-row discrepancy, minimal case: one batch row, null_block_id = 0, one verify step
    (gdn_replayssm_spec_decode, then commit_gdn_replayssm_spec), on fresh adapter buffers.

    A: ssm_state_indices = [0], replay_indices = [1] (replay slot 1: wp = 0, base = 0, is_flush = 0).
       The decode skips the row (decode.py:148: state index <= null; outputs zeroed, no appends);
       the commit does not (decode.py:836 tests the replay index): write_pos[1] 0 -> accepted.
    B: ssm_state_indices = [1], replay_indices = [0].  The decode verifies the row and appends its T
       records to the rings of replay slot 0 (the null slot); the commit skips it: no cursor moves.
    Returns per case: which buffers each kernel changed, whether the outputs are all zero, write_pos."""
    out = {}
    for label, (s, r) in (("A", (0, 1)), ("B", (1, 0))):
        z = torch.zeros(2)
        ad = TritonBaselineServing(kernels, n_requests=1, H=1, HV=2, K=K, V=K, T=T, A_log=z, dt_bias=z, io=io,
                                   ckpt=torch.float32, device=device)
        gen = torch.Generator().manual_seed(5)
        rn = lambda *sh: torch.randn(*sh, generator=gen).to(io).to(device)  # noqa: E731
        q, k, v, a, b = rn(T, 1, K), rn(T, 1, K), rn(T, 2, K), rn(T, 2), rn(T, 2)
        y = torch.full((T, 2, K), float("nan"), dtype=io, device=device)
        sidx, ridx = _i32([s], device), _i32([r], device)
        b0 = _snapshot(ad.buffers())
        kernels.spec_decode(q, k, v, a, b, ad.A_log, ad.dt_bias, ad.h0, ad.d_cache, ad.k_cache, ad.g_cache, ad.rawv,
                            ad.rawk, ad.beta, y, _i32([0, T], device), sidx, ridx, ad.write_pos, ad.cache_base,
                            ad.is_flush, max_cache_len=ad.ring, max_spec_len=T, null_block_id=0)
        b1 = _snapshot(ad.buffers())
        kernels.commit_spec(ad.write_pos, ad.cache_base, ad.is_flush, _i32([accepted], device), ridx,
                            max_cache_len=ad.L, max_spec_len=T, cache_buf_len=ad.ring, null_block_id=0)
        b2 = _snapshot(ad.buffers())
        changed = lambda x, y_: sorted(n for n in x if not torch.equal(_bits(x[n]), _bits(y_[n])))  # noqa: E731
        ring_slots = {n: sorted({int(i) for i in (b1[n] != b0[n]).nonzero()[:, 0]}) for n in changed(b0, b1)}
        out[label] = dict(ssm_state_indices=s, replay_indices=r, accepted=accepted,
                          decode_changed=changed(b0, b1), decode_ring_rows=ring_slots,
                          decode_output_zero=bool((y == 0).all()), commit_changed=changed(b1, b2),
                          write_pos_before=b1["write_pos"].tolist(), write_pos_after=b2["write_pos"].tolist())
    return out

# ------------------------------------------------------------------ command line
