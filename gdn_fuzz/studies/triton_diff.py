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
launch starts from); fold: exact_fold_rtol.
Differential (``run_differential``): the fused arms and the Triton configurations as backends of
one engine on one stream; max over requests and heads of ||S_a - S_b|| / ||S_truth|| per step
and of ||y_a - y_b|| / ||y_mag|| over the accepted tokens; allowed = the same budgets with
u = u_a + u_b (fused arms: u = compare.drift_unit).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from gdn_fuzz.arms import unit_roundoff
from gdn_fuzz.case import Regime, decay_params, draw_tokens, lazy_flush_min
from gdn_fuzz.findings import Finding
from gdn_fuzz.compare import (F32_UNIT, F64_REPLAY_RTOL, distance, drift_budget, exact_fold_rtol, frobenius, ratio,
                              y_budget)
from gdn_fuzz.oracles import gdn as gdn_oracle, ring as ring_oracle
from gdn_fuzz.oracles.serving import StepInputs
from gdn_fuzz.serving.adapters import DirectAdapter, TritonAdapter
from gdn_fuzz.serving.engine import Engine, Geometry
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
                   accept: str = "random", ring: int = 32, L: int | None = None, relations: bool = True) -> dict:
    """Every property above on one stream.  Returns {findings: [...], measurements: {...}, seconds}."""
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
    return dict(T=T, cfg=cfg, device=device, steps=steps, R=R, n_pad=n_pad, seed=seed, H=H, HV=HV, K=K, ring=ring,
                L=ad.L, flush_min=ad.fmin, decay=decay, accept=accept, kernels=getattr(kernels, "name", "?"),
                findings=[str(f) for f in F], measurements=meas, seconds=time.time() - t0)


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


# ------------------------------------------------------------------ command line
