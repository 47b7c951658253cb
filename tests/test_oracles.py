"""The float64 oracles (gdn_fuzz.oracles) proved against each other.

How this file tests, in plain words
-----------------------------------
Every other check in gdn_fuzz compares a kernel against the float64 oracles, so the oracles
themselves must be right.  There is no second implementation to compare them with, so this
file compares the oracles with *each other*: the same logical quantity is computed along two
independent routes, and the routes must agree.

* The plain token-by-token recurrence (oracles.gdn.sequential) is the truth.  It is first
  checked against the chunked WY form written out in the contract (M4), coded here from
  scratch with a triangular solve.
* The ring model (oracles.ring: gather_window, anchor, replay, launch) must reproduce that
  truth from a checkpoint plus ring records written at wrapped slots (M3, M4, M5, M6, M7).
* The commit models (oracles.commit) are run against integer simulations that track which
  token id sits in which ring slot, and against each other (C2 == C3, C4).
* The multi-step serving model (oracles.serving.RingMachine) must track the plain
  recurrence over the accepted tokens (sequential_decode) for 30+ steps, with pad rows,
  flushes, wrapped rings, resets and both commit styles.
* Which elements a launch writes and reads (write_set, read_set) is compared with an
  independent per-row enumeration and with the elements apply_launch actually changed.

Hypothesis draws the *structure* of each case (geometry, cursors, pad rows, flush_min,
accept counts, reset points) and one integer seed; all floating-point inputs come from a
torch.Generator seeded with that integer, so failures shrink on structure and replay exactly.
Geometry is small (K, V in {4, 8, 16}; H in {1, 2}; HV = G*H, G in {1, 2}; B <= 4; pool <= 6).
Rings are poisoned with NaN everywhere outside the written window, so any out-of-window read
shows up as NaN.

Finally, the tests at the end break one oracle function at a time (monkeypatch) in a way a
plausible bug would, and show that the corresponding identity then fails by a wide margin
(relative error > 1e-3, or an assertion).  This shows the identities have power: they are
not satisfied by construction.

Measured worst relative errors are collected in WORST; run with GDN_ORACLE_REPORT=1 to get
the table printed at the end of the module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.oracles import gdn, ring, serving

F64 = torch.float64
SLOTS, MASK, W = ring.RING_SLOTS, ring.RING_MASK, ring.W_RING
NEVER = 10**6  # a flush_min no legal hist_len reaches: every row verifies

# Tolerances of float64 identities (unit roundoff 1.1e-16).  Two float64 evaluation orders
# of the same math differ by a small multiple of 1e-16 relative; 30+ chained serving steps
# stay far inside 1e-10.
TOL_ONE = 1e-12  # one launch
TOL_CHAIN = 1e-10  # multi-step chains
BROKEN = 1e-3  # a broken oracle must miss by more than this

# Examples per test scale with the Hypothesis profile (gdn_fuzz plugin: ci=30, dev=15,
# nightly=2000): CI and dev run the base counts, nightly about 60x more.
_SCALE = max(1, settings.default.max_examples // 30)


def hsettings(n: int):
    return settings(max_examples=n * _SCALE, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


WORST: dict[str, float] = {}



def record(name: str, err: float) -> float:
    """Keep the worst measured error of each identity (printed with GDN_ORACLE_REPORT=1)."""
    err = float(err)
    WORST[name] = max(WORST.get(name, 0.0), err)
    return err


@pytest.fixture(scope="module", autouse=True)
def _report_worst(request):
    yield
    if os.environ.get("GDN_ORACLE_REPORT"):
        tr = request.config.pluginmanager.get_plugin("terminalreporter")
        capman = request.config.pluginmanager.get_plugin("capturemanager")
        if tr is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                tr.write_line("")
                tr.write_line("worst measured errors per identity (test_oracles.py):")
                for k in sorted(WORST):
                    tr.write_line(f"  {k:<48s} {WORST[k]:.3e}")


# ----------------------------------------------------------------------------------------
# metrics


def rel(got, want) -> float:
    """Per leading row: max|got - want| / max|want|; the worst row.  NaN counts as inf."""
    got, want = got.double(), want.double()
    if got.numel() == 0:
        return 0.0
    d = (got - want).abs().flatten(1).amax(1)
    s = want.abs().flatten(1).amax(1).clamp_min(1e-300)
    r = torch.nan_to_num(d / s, nan=float("inf"))
    return float(r.max())


def g_err(got, want, scale) -> float:
    """|got - want| relative to the summed |g| that built the value (cumsums cancel)."""
    if got.numel() == 0:
        return 0.0
    r = (got.double() - want.double()).abs() / scale.double().clamp_min(1e-300)
    return float(torch.nan_to_num(r, nan=float("inf")).max())


def same_bits(x, y):
    """Elementwise bit equality (NaN == NaN when the bits match)."""
    return x.contiguous().view(torch.int64) == y.contiguous().view(torch.int64)


def max_abs(x, y) -> float:
    if x.numel() == 0:
        return 0.0
    return float(torch.nan_to_num((x - y).abs(), nan=float("inf")).max())


# ----------------------------------------------------------------------------------------
# geometry, inputs and ring construction


@dataclass(frozen=True)
class Geo:
    B: int
    T: int
    H: int
    G: int
    K: int
    V: int
    pool: int

    @property
    def HV(self) -> int:
        return self.G * self.H

    @property
    def scale(self) -> float:
        return self.K ** -0.5


@st.composite
def geometries(draw, T=None, min_pool_extra=0):
    B = draw(st.integers(1, 4))
    return Geo(B=B,
               T=draw(st.sampled_from([4, 8])) if T is None else T,
               H=draw(st.sampled_from([1, 2])),
               G=draw(st.sampled_from([1, 2])),
               K=draw(st.sampled_from([4, 8, 16])),
               V=draw(st.sampled_from([4, 8, 16])),
               pool=draw(st.integers(min(6, B + min_pool_extra), 6)))


def make_params(gen, HV: int, strong: bool = False):
    """A_log, dt_bias [HV].  strong: decay large enough that a wrong anchor shows (power tests)."""
    lo, hi = (0.3, 1.0) if strong else (-1.5, 1.0)
    A_log = torch.empty(HV, dtype=F64).uniform_(lo, hi, generator=gen)
    dt_bias = 0.5 * torch.randn(HV, generator=gen, dtype=F64)
    return A_log, dt_bias


def make_tokens(gen, geo: Geo, T: int, accepted=None, strong: bool = False):
    B, H, HV, K, V = geo.B, geo.H, geo.HV, geo.K, geo.V
    q = torch.randn(B, T, H, K, generator=gen, dtype=F64)
    k = torch.randn(B, T, H, K, generator=gen, dtype=F64)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=F64)
    a = 1.5 * torch.randn(B, T, HV, generator=gen, dtype=F64) + (1.0 if strong else 0.0)
    b = torch.randn(B, T, HV, generator=gen, dtype=F64)
    if accepted is None:
        accepted = torch.full((B,), T, dtype=torch.long)
    return serving.StepInputs(q=q, k=k, v=v, a=a, b=b, accepted=torch.as_tensor(accepted).long())


def prep(tok, A_log, dt_bias, HV: int, scale: float):
    """(g, beta, q_hat, k_hat) of a token block, from the M1/M2 oracles."""
    g, beta = gdn.gates(tok.a, dt_bias, A_log, tok.b)
    q_hat, k_hat = gdn.normalized_qk(tok.q, tok.k, HV, scale)
    return g, beta, q_hat, k_hat


def rows_of(tok, sel):
    return serving.StepInputs(q=tok.q[sel], k=tok.k[sel], v=tok.v[sel], a=tok.a[sel],
                              b=tok.b[sel], accepted=tok.accepted[sel])


@dataclass
class World:
    """A pool + rings holding, for every live row, a checkpoint S0 and P ring records of the
    tokens that followed it, written at wrapped slots (base + j) & 31; everything else NaN."""

    geo: Geo
    idx: torch.Tensor
    P: torch.Tensor
    base: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    pool: torch.Tensor
    k_cache: torch.Tensor
    u_cache: torch.Tensor
    g_cache: torch.Tensor
    S_P: torch.Tensor  # [B, HV, V, K] truth: S0 advanced by the P history tokens
    g_hist: torch.Tensor  # [B, 16, HV] per-token g of the history tokens
    live: torch.Tensor

    def buffers(self):
        return self.pool, self.k_cache, self.u_cache, self.g_cache


def build_world(geo: Geo, seed: int, idx, P, base, strong: bool = False) -> World:
    gen = torch.Generator().manual_seed(seed)
    HV, H, K, V = geo.HV, geo.H, geo.K, geo.V
    idx, P, base = (torch.as_tensor(x, dtype=torch.long) for x in (idx, P, base))
    A_log, dt_bias = make_params(gen, HV, strong)
    nan = float("nan")
    pool = torch.full((geo.pool, HV, V, K), nan, dtype=F64)
    k_cache = torch.full((geo.pool, H, SLOTS, K), nan, dtype=F64)
    u_cache = torch.full((geo.pool, HV, SLOTS, V), nan, dtype=F64)
    g_cache = torch.full((geo.pool, HV, SLOTS), nan, dtype=F64)
    S0 = 0.5 * torch.randn(geo.B, HV, V, K, generator=gen, dtype=F64)
    hist = make_tokens(gen, geo, W, strong=strong)
    g, beta, q_hat, k_hat = prep(hist, A_log, dt_bias, HV, geo.scale)
    _, U, states = gdn.sequential(S0, q_hat, k_hat, hist.v, g, beta)
    Gcum = torch.cumsum(g, dim=1)  # cumulative log-decay from S0 through token j
    live = idx >= 0
    S_P = S0.clone()
    for r in range(geo.B):
        if not live[r]:
            continue
        i, p, bs = int(idx[r]), int(P[r]), int(base[r])
        pool[i] = S0[r]
        for j in range(p):
            s = (bs + j) & MASK
            k_cache[i, :, s] = k_hat[r, j, :: geo.G]
            u_cache[i, :, s] = U[r, j]
            g_cache[i, :, s] = Gcum[r, j]
        if p > 0:
            S_P[r] = states[r, p - 1]
    return World(geo=geo, idx=idx, P=P, base=base, A_log=A_log, dt_bias=dt_bias, pool=pool,
                 k_cache=k_cache, u_cache=u_cache, g_cache=g_cache, S_P=S_P, g_hist=g, live=live)


def launch(w: World, tok, flush_min: int, buffers=None, hist_len=None, cache_base=None):
    pool, kc, uc, gc = buffers if buffers is not None else w.buffers()
    return ring.launch(q=tok.q, k=tok.k, v=tok.v, a=tok.a, b=tok.b, A_log=w.A_log,
                       dt_bias=w.dt_bias, pool=pool, idx=w.idx, k_cache=kc, u_cache=uc,
                       g_cache=gc, hist_len=w.P if hist_len is None else hist_len,
                       cache_base=w.base if cache_base is None else cache_base,
                       flush_min=flush_min, scale=w.geo.scale)


def expected_writes(pool_size: int, T: int, idx, P, base, flush_min: int):
    """M8 by enumeration: (pool rows [pool], ring slots [pool, 32]) a launch may write."""
    pool_mask = torch.zeros(pool_size, dtype=torch.bool)
    ring_mask = torch.zeros(pool_size, SLOTS, dtype=torch.bool)
    for r in range(len(idx)):
        i = int(idx[r])
        if i < 0:
            continue
        for s in range(T):
            ring_mask[i, (int(base[r]) + int(P[r]) + s) % SLOTS] = True
        if int(P[r]) >= flush_min:
            pool_mask[i] = True
    return pool_mask, ring_mask


def expected_reads(pool_size: int, idx, P, base):
    ring_mask = torch.zeros(pool_size, SLOTS, dtype=torch.bool)
    for r in range(len(idx)):
        i = int(idx[r])
        if i < 0:
            continue
        for j in range(int(P[r])):
            ring_mask[i, (int(base[r]) + j) % SLOTS] = True
    return ring_mask


def stray_writes(before, after, pool_mask, ring_mask) -> int:
    """Elements that changed outside the allowed masks (pool rows, ring slots)."""
    pb, kb, ub, gb = before
    pa, ka, ua, ga = after
    bad_pool = ((~same_bits(pb, pa)).flatten(2).any(2) & ~pool_mask[:, None]).sum()
    bad_k = ((~same_bits(kb, ka)).any(-1) & ~ring_mask[:, None, :]).sum()
    bad_u = ((~same_bits(ub, ua)).any(-1) & ~ring_mask[:, None, :]).sum()
    bad_g = ((~same_bits(gb, ga)) & ~ring_mask[:, None, :]).sum()
    return int(bad_pool + bad_k + bad_u + bad_g)


# ----------------------------------------------------------------------------------------
# strategies


@dataclass
class LaunchCase:
    geo: Geo
    flush_min: int
    idx: list
    P: list
    base: list
    seed: int
    n: list  # per row: accepted count (identity 2) / first changed token (identity 3)


@st.composite
def launch_cases(draw, pads: bool = True, n_lo: int = 0, n_hi_offset: int = 0, T=None):
    """One launch over legal cursors: distinct pool rows (permuted), optional pad rows (idx<0),
    each row a flush row (flush_min <= P <= 16) or a verify row (P < flush_min), bases biased
    towards wrapping windows / appends past slot 31."""
    geo = draw(geometries(T=T))
    T = geo.T
    flush_min = draw(st.integers(1, 17 - T))
    perm = draw(st.permutations(range(geo.pool)))
    idx, P, base, n = [], [], [], []
    for r in range(geo.B):
        pad = pads and draw(st.integers(0, 3)) == 0
        idx.append(draw(st.integers(-4, -1)) if pad else perm[r])
        if draw(st.booleans()):
            p = draw(st.integers(flush_min, W))
        else:
            p = draw(st.integers(0, flush_min - 1))
        P.append(p)
        if draw(st.booleans()):
            base.append(draw(st.integers(0, MASK)))
        else:  # base + P + T - 1 >= 32: the window or the appends wrap past slot 31
            base.append(SLOTS - draw(st.integers(1, max(1, p + T - 1))))
        n.append(draw(st.integers(n_lo, T - n_hi_offset)))
    if all(i < 0 for i in idx):
        r = draw(st.integers(0, geo.B - 1))
        idx[r] = perm[r]
    seed = draw(st.integers(0, 2**31 - 1))
    live = [i >= 0 for i in idx]
    kinds = {p >= flush_min for ok, p in zip(live, P) if ok}
    event("live rows: " + ("flush and verify" if len(kinds) == 2 else "flush" if True in kinds else "verify"))
    event(f"window wraps past slot 31: {any(ok and b + p > SLOTS for ok, b, p in zip(live, base, P))}")
    event(f"pad rows: {not all(live)}")
    c = LaunchCase(geo=geo, flush_min=flush_min, idx=idx, P=P, base=base, seed=seed, n=n)
    note(repr(c))
    return c


# ----------------------------------------------------------------------------------------
# identity helpers: each returns measured errors; the tests assert, the power tests break an
# oracle and show the same helper then reports a large error.


def wy_chunk(S_h, q_hat, k_hat, v, g, beta):
    """The contract's chunked WY form of M4, written independently of gdn.sequential.

    U = (I + L)^{-1} diag(beta) (V - e^Gamma o S_h K),  L_rc = beta_r e^{Gamma_r - Gamma_c} k_r.k_c (r > c)
    y_t = e^{Gamma_t} S_h q_t + sum_{c<=t} e^{Gamma_t - Gamma_c} (q_t.k_c) U_c
    S_T = e^{Gamma_{T-1}} S_h + sum_c e^{Gamma_{T-1} - Gamma_c} U_c k_c^T
    """
    T = q_hat.shape[1]
    Gam = torch.cumsum(g, 1).permute(0, 2, 1)  # [B, HV, T]
    kh = k_hat.permute(0, 2, 1, 3)  # [B, HV, T, K]
    qh = q_hat.permute(0, 2, 1, 3)
    vv = v.double().permute(0, 2, 1, 3)  # [B, HV, T, V]
    bt = beta.permute(0, 2, 1)  # [B, HV, T]
    diff = Gam[..., :, None] - Gam[..., None, :]  # Gamma_r - Gamma_c
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool), -1)
    incl = torch.tril(torch.ones(T, T, dtype=torch.bool), 0)
    dec_strict = torch.where(strict, torch.exp(torch.where(strict, diff, 0.0)), 0.0)
    dec_incl = torch.where(incl, torch.exp(torch.where(incl, diff, 0.0)), 0.0)
    L = bt[..., :, None] * dec_strict * (kh @ kh.transpose(-1, -2))
    Shk = torch.einsum("bhvk,bhtk->bhtv", S_h.double(), kh)
    rhs = bt[..., None] * (vv - torch.exp(Gam)[..., None] * Shk)
    eye = torch.eye(T, dtype=F64)
    U = torch.linalg.solve_triangular(eye + L, rhs, upper=False)
    Shq = torch.einsum("bhvk,bhtk->bhtv", S_h.double(), qh)
    y = torch.exp(Gam)[..., None] * Shq + (dec_incl * (qh @ kh.transpose(-1, -2))) @ U
    wlast = torch.exp(Gam[..., -1:] - Gam)  # [B, HV, T]
    S_T = torch.exp(Gam[..., -1])[..., None, None] * S_h.double() + torch.einsum(
        "bht,bhtv,bhtk->bhvk", wlast, U, kh)
    return y.permute(0, 2, 1, 3), U.permute(0, 2, 1, 3), S_T


def check_ring_replay(c: LaunchCase, strong: bool = False) -> dict:
    """Identity 1 (M3, M4, M5, M6, M7): ring replay and launch == the sequential recurrence."""
    geo = c.geo
    w = build_world(geo, c.seed, c.idx, c.P, c.base, strong)
    gen = torch.Generator().manual_seed(c.seed + 1)
    live = w.live
    kw, uw, Gw, valid = ring.gather_window(w.k_cache, w.u_cache, w.g_cache, w.idx, w.P, w.base, geo.HV)
    S_rep, _, _ = ring.replay(w.pool[w.idx.clamp(min=0)], kw, uw, Gw, valid, w.P)
    out = {"M3 replay state": rel(S_rep[live], w.S_P[live])}

    drafts = make_tokens(gen, geo, geo.T, strong=strong)
    e = launch(w, drafts, c.flush_min)
    g, beta, q_hat, k_hat = prep(drafts, w.A_log, w.dt_bias, geo.HV, geo.scale)
    y_t, U_t, _ = gdn.sequential(w.S_P, q_hat, k_hat, drafts.v, g, beta)
    out["M4 launch y"] = rel(e.y[live], y_t[live])
    out["M5 launch u_app"] = rel(e.u_app[live], U_t[live])
    k_ref = drafts.k / torch.sqrt((drafts.k * drafts.k).sum(-1, keepdim=True) + 1e-6)  # M2
    out["M5 launch k_app"] = rel(e.k_app[live], k_ref[live])
    fl = e.flush
    out["M7 fold == S_P"] = rel(e.fold[fl], w.S_P[fl])
    # M6: cumulative log-decay from the checkpoint the pool holds after this launch, summed
    # token by token over the whole token sequence since that checkpoint
    ge, gs = [], []
    for r in range(geo.B):
        if not live[r]:
            continue
        p = int(w.P[r])
        seq = g[r] if bool(fl[r]) else torch.cat([w.g_hist[r, :p], g[r]], 0)
        acc, tot, rows, mags = torch.zeros(geo.HV, dtype=F64), torch.zeros(geo.HV, dtype=F64), [], []
        for t in range(seq.shape[0]):
            acc = acc + seq[t]
            tot = tot + seq[t].abs()
            rows.append(acc.clone())
            mags.append(tot.clone())
        ge.append(torch.stack(rows[-geo.T:]))
        gs.append(torch.stack(mags[-geo.T:]))
        out.setdefault("_slots_ok", True)
        want_slots = torch.tensor([(int(w.base[r]) + p + s) % SLOTS for s in range(geo.T)])
        out["_slots_ok"] &= bool(torch.equal(e.slots[r], want_slots))
    out["M6 launch g_app"] = g_err(e.g_app[live], torch.stack(ge), torch.stack(gs))
    out["_pad_flags_ok"] = bool(torch.equal(e.pad, ~live)) and bool(
        torch.equal(e.flush, live & (w.P >= c.flush_min)))
    return out


def check_fold_continue(c: LaunchCase, strong: bool = False) -> dict:
    """Identity 2 (M6, M7, M8, C3): launch, apply, caller commit; the committed logical state
    equals the recurrence after the P history tokens and the accepted drafts."""
    geo = c.geo
    w = build_world(geo, c.seed, c.idx, c.P, c.base, strong)
    gen = torch.Generator().manual_seed(c.seed + 1)
    live = w.live
    acc = torch.tensor(c.n, dtype=torch.long)
    drafts = make_tokens(gen, geo, geo.T, accepted=acc, strong=strong)
    e = launch(w, drafts, c.flush_min)
    out = {}
    # M7: flush rows produce the same y / k / u bits as the same launch with no flush
    e_v = launch(w, drafts, NEVER)
    out["_m7_bits"] = bool(torch.equal(e.y[live], e_v.y[live]) and torch.equal(e.u_app[live], e_v.u_app[live])
                           and torch.equal(e.k_app[live], e_v.k_app[live]))
    before = tuple(x.clone() for x in w.buffers())
    m = serving.RingMachine(torch.zeros(geo.pool, geo.HV, geo.V, geo.K, dtype=F64), geo.H, w.idx,
                            geo.T, c.flush_min, "caller")
    m.pool, m.k_cache, m.u_cache, m.g_cache = (x.clone() for x in w.buffers())
    serving.apply_launch(m.pool, m.k_cache, m.u_cache, m.g_cache, m.idx, e)
    pm, rm = expected_writes(geo.pool, geo.T, w.idx, w.P, w.base, c.flush_min)
    out["_stray_writes"] = stray_writes(before, (m.pool, m.k_cache, m.u_cache, m.g_cache), pm, rm)
    m.hist_len, m.cache_base = commits.caller_commit(w.P, w.base, acc, c.flush_min)
    S_log = m.logical_state()

    g, beta, q_hat, k_hat = prep(drafts, w.A_log, w.dt_bias, geo.HV, geo.scale)
    _, _, states = gdn.sequential(w.S_P, q_hat, k_hat, drafts.v, g, beta)
    S_true = w.S_P.clone()
    for r in range(geo.B):
        if c.n[r] > 0:
            S_true[r] = states[r, c.n[r] - 1]
    fl = e.flush
    vr = live & ~fl
    out["C3 logical state (flush rows)"] = rel(S_log[fl], S_true[fl])
    out["C3 logical state (verify rows)"] = rel(S_log[vr], S_true[vr])
    out["M7 pool after flush"] = rel(m.pool[w.idx[fl]], w.S_P[fl])
    # M8: verify rows leave their pool row bit-identical
    out["_verify_pool_bits"] = bool(same_bits(m.pool[w.idx[vr]], before[0][w.idx[vr]]).all())
    return out


def check_prefix(c: LaunchCase) -> dict:
    """Identity 3 (M4): outputs of tokens before n ignore every input from token n on."""
    geo = c.geo
    w = build_world(geo, c.seed, c.idx, c.P, c.base)
    gen = torch.Generator().manual_seed(c.seed + 1)
    live = w.live
    d1 = make_tokens(gen, geo, geo.T)
    d2 = make_tokens(gen, geo, geo.T)
    mix = serving.StepInputs(q=d1.q.clone(), k=d1.k.clone(), v=d1.v.clone(), a=d1.a.clone(),
                             b=d1.b.clone(), accepted=d1.accepted)
    for r in range(geo.B):
        n = c.n[r]
        for name in ("q", "k", "v", "a", "b"):
            getattr(mix, name)[r, n:] = getattr(d2, name)[r, n:]
    e1, e2 = launch(w, d1, c.flush_min), launch(w, mix, c.flush_min)
    diff, changed = 0.0, True
    for r in range(geo.B):
        if not live[r]:
            continue
        n = c.n[r]
        for f in ("y", "u_app", "k_app", "g_app"):
            x1, x2 = getattr(e1, f)[r, :n], getattr(e2, f)[r, :n]
            if not torch.equal(x1, x2):
                diff = max(diff, max_abs(x1, x2) / max(float(x1.abs().max()), 1e-300))
        if n < geo.T:  # the change is real: token n's output moved
            changed &= not torch.equal(e1.y[r, n], e2.y[r, n])
    return {"M4 prefix independence": diff, "_changed": changed}


def check_g_bookkeeping(geo: Geo, seed: int, flush_min: int, idx, accepts, strong=False) -> dict:
    """Identity 4 (M6): every window's g values equal the cumulative log-decay measured from
    the row's current checkpoint, and the checkpoint is the true state at its flush point."""
    gen = torch.Generator().manual_seed(seed)
    A_log, dt_bias = make_params(gen, geo.HV, strong)
    idx = torch.tensor(idx, dtype=torch.long)
    live = idx >= 0
    pool0 = 0.5 * torch.randn(geo.pool, geo.HV, geo.V, geo.K, generator=gen, dtype=F64)
    m = serving.RingMachine(pool0, geo.H, idx, geo.T, flush_min, "caller")
    S = pool0[idx.clamp(min=0)].clone()
    ckpt = S.clone()
    since = [torch.zeros(0, geo.HV, dtype=F64) for _ in range(geo.B)]  # g per committed token
    g_worst, ck_worst, len_ok, flushes = 0.0, 0.0, True, 0
    for acc in accepts:
        tok = make_tokens(gen, geo, geo.T, accepted=acc, strong=strong)
        g, _ = gdn.gates(tok.a, dt_bias, A_log, tok.b)
        P_before = m.hist_len.clone()
        m.step(tok, A_log, dt_bias, geo.scale)
        S_next, _ = serving.sequential_decode(S, tok, A_log, dt_bias, geo.scale)
        for r in range(geo.B):
            if not live[r]:
                continue
            n = int(tok.accepted[r])
            if int(P_before[r]) >= flush_min:  # this launch folded S (before the step)
                since[r] = g[r, :n]
                ckpt[r] = S[r]
                flushes += 1
            else:
                since[r] = torch.cat([since[r], g[r, :n]], 0)
            L = int(m.hist_len[r])
            len_ok &= L == since[r].shape[0]
            if L:
                slots = (int(m.cache_base[r]) + torch.arange(L)) & MASK
                got = m.g_cache[int(idx[r]), :, slots].T  # [L, HV]
                want = torch.cumsum(since[r], 0)
                mag = torch.cumsum(since[r].abs(), 0)
                g_worst = max(g_worst, g_err(got, want, mag))
            ck_worst = max(ck_worst, rel(m.pool[int(idx[r])][None], ckpt[r][None]))
        S = S_next
    return {"M6 window g == log-decay from checkpoint": g_worst,
            "M6/M7 checkpoint == state at flush": ck_worst, "_len_ok": len_ok, "_flushes": flushes}


def run_commit_invariants(T: int, flush_min: int, bases, accepts) -> dict:
    """Identity 5 (C2, C3, C4, R2) on integers: token ids written to ring slots by each launch;
    after every commit the window holds exactly the accepted ids since the checkpoint, in
    order; hist_len <= 16, hist_len + T <= 24 <= 32; C2-then-accept == C3.  Raises on failure."""
    B = len(bases)
    P = torch.zeros(B, dtype=torch.long)
    base = torch.tensor(bases, dtype=torch.long)
    ids = torch.full((B, SLOTS), -1, dtype=torch.long)
    since = [[] for _ in range(B)]
    max_len = 0
    for step, acc in enumerate(accepts):
        acc = torch.tensor(acc, dtype=torch.long)
        for r in range(B):
            window = {(int(base[r]) + j) % SLOTS for j in range(int(P[r]))}
            app = [(int(base[r]) + int(P[r]) + s) % SLOTS for s in range(T)]
            assert not window & set(app), "R2: an append lands on a window slot"
            assert len(set(app)) == T
            for s, sl in enumerate(app):
                ids[r, sl] = step * T + s
        Pc, bc = commits.caller_commit(P, base, acc, flush_min)
        Ps, bs = commits.standalone_then_accept(P, base, acc, flush_min)
        assert torch.equal(Pc, Ps) and torch.equal(bc, bs), "C2 then accept != C3"
        for r in range(B):
            new = [step * T + s for s in range(int(acc[r]))]
            since[r] = new if int(P[r]) >= flush_min else since[r] + new
            assert int(Pc[r]) == len(since[r])
            got = [int(ids[r, (int(bc[r]) + j) % SLOTS]) for j in range(int(Pc[r]))]
            assert got == since[r], f"C4: window {got} != accepted {since[r]}"
        assert bool(((Pc >= 0) & (Pc <= W)).all()), f"C4: hist_len {Pc.tolist()} outside [0, 16]"
        assert bool((Pc + T <= 24).all()) and 24 <= SLOTS
        assert bool(((bc >= 0) & (bc < SLOTS)).all())
        P, base = Pc, bc
        max_len = max(max_len, int(P.max()))
    return {"max_hist_len": max_len}


def run_serving(geo: Geo, seed: int, flush_min: int, idx, accepts, reset_at: int, reset_row: int,
                twin: bool = True) -> dict:
    """Identity 6: RingMachine (caller and standalone commits) vs sequential_decode, with pad
    rows, a reset to a fresh checkpoint mid-run (stale ring poisoned with NaN), a pad-free twin
    machine and a fresh machine for the reset row."""
    gen = torch.Generator().manual_seed(seed)
    A_log, dt_bias = make_params(gen, geo.HV)
    idx = torch.tensor(idx, dtype=torch.long)
    live = idx >= 0
    lrows = torch.nonzero(live).flatten()
    pool0 = 0.5 * torch.randn(geo.pool, geo.HV, geo.V, geo.K, generator=gen, dtype=F64)
    mc = serving.RingMachine(pool0, geo.H, idx, geo.T, flush_min, "caller")
    ms = serving.RingMachine(pool0, geo.H, idx, geo.T, flush_min, "standalone")
    mt = serving.RingMachine(pool0, geo.H, idx[live], geo.T, flush_min, "caller") if twin else None
    # pad twin: same batch, but the pad rows carry other negative ids, other inputs and other
    # accept counts; the live rows must not see a single bit of difference
    pad = ~live
    mp = None
    if bool(pad.any()):
        mp = serving.RingMachine(pool0, geo.H, torch.where(pad, -7, idx), geo.T, flush_min, "caller")
        gen_pad = torch.Generator().manual_seed(seed ^ 0x5A5A)
    S = pool0[idx.clamp(min=0)].clone()
    fresh, out = None, {"y": 0.0, "state": 0.0, "fresh_y": 0.0, "fresh_state": 0.0, "twin": 0.0,
                        "stray": 0, "c_vs_s_bits": True, "fresh_cursors": True, "flushes": 0,
                        "wraps": 0, "pad_bits": True}
    for step, acc in enumerate(accepts):
        if step == reset_at:
            r = int(reset_row)
            i = int(idx[r])
            S_new = 0.5 * torch.randn(geo.HV, geo.V, geo.K, generator=gen, dtype=F64)
            machines = [(mc, r), (ms, r)] + ([(mt, int((lrows < r).sum()))] if mt else []) + (
                [(mp, r)] if mp else [])
            for mm, rr in machines:
                mm.reset(torch.tensor([rr]))
                mm.pool[i] = S_new
                mm.k_cache[i] = float("nan")
                mm.u_cache[i] = float("nan")
                mm.g_cache[i] = float("nan")
            S[r] = S_new
            fp = torch.full_like(pool0, float("nan"))
            fp[i] = S_new
            fresh = (serving.RingMachine(fp, geo.H, idx[r:r + 1], geo.T, flush_min, "caller"), r)
        tok = make_tokens(gen, geo, geo.T, accepted=acc)
        before = tuple(x.clone() for x in (mc.pool, mc.k_cache, mc.u_cache, mc.g_cache))
        Pb, bb = mc.hist_len.clone(), mc.cache_base.clone()
        out["flushes"] += int(((Pb >= flush_min) & live).sum())
        out["wraps"] += int(((bb + Pb + geo.T > SLOTS) & live).sum())
        y_c = mc.step(tok, A_log, dt_bias, geo.scale)
        pm, rm = expected_writes(geo.pool, geo.T, idx, Pb, bb, flush_min)
        out["stray"] += stray_writes(before, (mc.pool, mc.k_cache, mc.u_cache, mc.g_cache), pm, rm)
        y_s = ms.step(tok, A_log, dt_bias, geo.scale)
        out["c_vs_s_bits"] &= bool(
            torch.equal(mc.hist_len, ms.hist_len) and torch.equal(mc.cache_base, ms.cache_base)
            and same_bits(y_c, y_s).all() and same_bits(mc.pool, ms.pool).all()
            and same_bits(mc.u_cache, ms.u_cache).all() and same_bits(mc.g_cache, ms.g_cache).all()
            and same_bits(mc.k_cache, ms.k_cache).all())
        if mp is not None:
            alt = make_tokens(gen_pad, geo, geo.T, accepted=tok.accepted % geo.T + 1)
            for name in ("q", "k", "v", "a", "b", "accepted"):
                x = getattr(alt, name)
                x[live] = getattr(tok, name)[live]
            y_p = mp.step(alt, A_log, dt_bias, geo.scale)
            out["pad_bits"] &= bool(same_bits(y_c[live], y_p[live]).all() and same_bits(mc.pool, mp.pool).all()
                                    and same_bits(mc.k_cache, mp.k_cache).all()
                                    and same_bits(mc.u_cache, mp.u_cache).all()
                                    and same_bits(mc.g_cache, mp.g_cache).all()
                                    and torch.equal(mc.hist_len[live], mp.hist_len[live])
                                    and torch.equal(mc.cache_base[live], mp.cache_base[live]))
        if mt is not None:
            y_t = mt.step(rows_of(tok, live), A_log, dt_bias, geo.scale)
            out["twin"] = max(out["twin"], rel(y_c[live], y_t),
                              rel(mc.logical_state()[live], mt.logical_state()),
                              rel(mc.pool, mt.pool), rel(mc.u_cache.nan_to_num(), mt.u_cache.nan_to_num()),
                              rel(mc.g_cache.nan_to_num()[..., None], mt.g_cache.nan_to_num()[..., None]))
        S, y_true = serving.sequential_decode(S, tok, A_log, dt_bias, geo.scale)
        out["y"] = max(out["y"], rel(y_c[live], y_true[live]))
        out["state"] = max(out["state"], rel(mc.logical_state()[live], S[live]))
        if fresh is not None:
            fm, r = fresh
            y_f = fm.step(rows_of(tok, slice(r, r + 1)), A_log, dt_bias, geo.scale)
            out["fresh_y"] = max(out["fresh_y"], rel(y_c[r:r + 1], y_f))
            out["fresh_state"] = max(out["fresh_state"], rel(mc.logical_state()[r:r + 1], fm.logical_state()))
            out["fresh_cursors"] &= int(fm.hist_len[0]) == int(mc.hist_len[r]) and int(
                fm.cache_base[0]) == int(mc.cache_base[r])
    return out


# ----------------------------------------------------------------------------------------
# 0. the recurrence itself: gates, norms and sequential vs the contract's closed forms


@hsettings(150)
@given(geo=geometries(), T=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_M1_M2_M4_sequential_matches_wy_chunk_form(geo, T, seed):
    """M1, M2, M4: gdn.gates / l2norm / normalized_qk match the formulas, and gdn.sequential
    (token loop) equals the chunked WY form (triangular solve) the kernel uses, for y, U and
    the final state; sequential_magnitude bounds |y|, |U| and |S|."""
    gen = torch.Generator().manual_seed(seed)
    A_log, dt_bias = make_params(gen, geo.HV)
    tok = make_tokens(gen, geo, T)
    S0 = 0.5 * torch.randn(geo.B, geo.HV, geo.V, geo.K, generator=gen, dtype=F64)
    g, beta, q_hat, k_hat = prep(tok, A_log, dt_bias, geo.HV, geo.scale)
    x = tok.a + dt_bias
    assert rel(g, -torch.exp(A_log) * torch.log1p(torch.exp(x))) < TOL_ONE
    assert rel(beta, 1 / (1 + torch.exp(-tok.b))) < TOL_ONE
    for hv in range(geo.HV):  # M2: v-head hv reads k-head hv // G; scale on q only
        h = hv // geo.G
        kn = tok.k[:, :, h] / torch.sqrt((tok.k[:, :, h] ** 2).sum(-1, keepdim=True) + 1e-6)
        qn = tok.q[:, :, h] / torch.sqrt((tok.q[:, :, h] ** 2).sum(-1, keepdim=True) + 1e-6)
        assert rel(k_hat[:, :, hv], kn) < TOL_ONE
        assert rel(q_hat[:, :, hv], qn * geo.scale) < TOL_ONE
    y, U, states = gdn.sequential(S0, q_hat, k_hat, tok.v, g, beta)
    y_w, U_w, S_w = wy_chunk(S0, q_hat, k_hat, tok.v, g, beta)
    assert record("M4 sequential == WY y", rel(y, y_w)) < TOL_ONE
    assert record("M4 sequential == WY U", rel(U, U_w)) < TOL_ONE
    assert record("M4 sequential == WY state", rel(states[:, -1], S_w)) < TOL_ONE
    y_m, U_m, S_m = gdn.sequential_magnitude(S0.abs(), q_hat, k_hat, tok.v, g, beta)
    slack = 1 + 1e-12
    assert bool((y.abs() <= y_m * slack).all() and (U.abs() <= U_m * slack).all()
                and (states.abs() <= S_m * slack).all())


# ----------------------------------------------------------------------------------------
# 1. ring replay == sequential recurrence (M3), launch y == continued recurrence (M4)


@hsettings(200)
@given(c=launch_cases())
def test_M3_M4_ring_replay_equals_sequential(c):
    """M3: a checkpoint plus P ring records (k_hat, U, cumulative G) at slots (base+j)&31,
    wrapped windows included and NaN everywhere else, replays to the sequential state S_P.
    M4/M5/M6/M7: the launch's y, u/k appends, g appends and fold equal the recurrence
    continued over the T drafts, the token-by-token cumulative log-decay and S_P."""
    out = check_ring_replay(c)
    for k in ("M3 replay state", "M4 launch y", "M5 launch u_app", "M5 launch k_app",
              "M7 fold == S_P", "M6 launch g_app"):
        assert record(k, out[k]) < TOL_ONE, (k, out[k])
    assert out["_slots_ok"] and out["_pad_flags_ok"]


# ----------------------------------------------------------------------------------------
# 2. fold-then-continue == continue (M6, M7, C3)


@hsettings(200)
@given(c=launch_cases())
def test_M6_M7_C3_fold_then_continue_equals_continue(c):
    """M6, M7, M8, C3: after the launch is applied (apply_launch) and committed with
    caller_commit(accepted in 0..T), RingMachine.logical_state equals the plain recurrence
    after the P history tokens and the accepted drafts, for flush rows (fold S_P, local G
    restart) and verify rows alike.  Flush rows' pools hold S_P; verify rows' pools keep
    their bits; y/k/u of a flush row are bit-identical to the same launch without flush (M7);
    nothing outside the enumerated write set changes (M8)."""
    out = check_fold_continue(c)
    for k in ("C3 logical state (flush rows)", "C3 logical state (verify rows)", "M7 pool after flush"):
        assert record(k, out[k]) < TOL_ONE, (k, out[k])
    assert out["_m7_bits"], "M7: flush and verify launches differ in y/k/u bits"
    assert out["_verify_pool_bits"], "M8: a verify row changed its pool row"
    assert out["_stray_writes"] == 0, "M8: write outside the enumerated write set"


# ----------------------------------------------------------------------------------------
# 3. accepted outputs are independent of rejected drafts (M4)


@hsettings(150)
@given(c=launch_cases(n_lo=1, n_hi_offset=1))
def test_M4_accepted_outputs_ignore_rejected_drafts(c):
    """M4: changing q, k, v, a, b of every token from position n on leaves y[:, :n],
    U[:, :n] (and the k/g appends before n) bit-identical, while y[:, n] does move."""
    out = check_prefix(c)
    record("M4 prefix independence", out["M4 prefix independence"])
    assert out["M4 prefix independence"] == 0.0
    assert out["_changed"]


# ----------------------------------------------------------------------------------------
# 4. g bookkeeping across flush boundaries (M6)


@st.composite
def machine_runs(draw, min_steps: int, max_steps: int, pads: bool = True):
    geo = draw(geometries())
    T = geo.T
    flush_min = draw(st.integers(1, 17 - T))
    perm = draw(st.permutations(range(geo.pool)))
    idx = [draw(st.integers(-3, -1)) if pads and draw(st.integers(0, 3)) == 0 else perm[r]
           for r in range(geo.B)]
    if all(i < 0 for i in idx):
        idx[0] = perm[0]
    steps = draw(st.integers(min_steps, max_steps))
    accepts = draw(st.lists(st.lists(st.integers(1, T), min_size=geo.B, max_size=geo.B),
                            min_size=steps, max_size=steps))
    seed = draw(st.integers(0, 2**31 - 1))
    note(f"geo={geo} flush_min={flush_min} idx={idx}")
    return geo, flush_min, idx, accepts, seed


@hsettings(60)
@given(run=machine_runs(12, 30))
def test_M6_g_bookkeeping_across_flushes(run):
    """M6: over a multi-step RingMachine run (T in {4, 8}, flush_min in [1, 17-T], accepts
    in 1..T), after every commit the g values in each row's window equal the cumulative
    log-decay of the committed tokens since the row's current checkpoint (restarting at 0
    at each flush), and the checkpoint equals the true state where the flush happened (M7)."""
    geo, flush_min, idx, accepts, seed = run
    out = check_g_bookkeeping(geo, seed, flush_min, idx, accepts)
    assert out["_len_ok"]
    for k in ("M6 window g == log-decay from checkpoint", "M6/M7 checkpoint == state at flush"):
        assert record(k, out[k]) < TOL_CHAIN, (k, out[k])


# ----------------------------------------------------------------------------------------
# 5. commit invariants (C2, C3, C4)


@hsettings(300)
@given(data=st.data())
def test_C2_C3_C4_commit_invariants_over_accept_sequences(data):
    """C3, C4: for any accept sequence (n in 1..T, up to 60 steps) caller_commit keeps
    hist_len <= 16 and hist_len + T <= 24 <= 32, and after each commit the window holds
    exactly the accepted records since the checkpoint (integer token-id ring).  R2: appends
    never hit a window slot.  C2 == C3: standalone_then_accept equals caller_commit."""
    T = data.draw(st.sampled_from([4, 8]))
    flush_min = data.draw(st.integers(1, 17 - T))
    B = data.draw(st.integers(1, 4))
    bases = data.draw(st.lists(st.integers(0, MASK), min_size=B, max_size=B))
    accepts = data.draw(st.lists(st.lists(st.integers(1, T), min_size=B, max_size=B), max_size=60))
    out = run_commit_invariants(T, flush_min, bases, accepts)
    assert out["max_hist_len"] <= W


@pytest.mark.parametrize("T", [4, 8])
def test_C2_equals_C3_for_every_state(T):
    """C2 == C3 exhaustively: every hist_len 0..16, cache_base 0..31, accepted 0..T and
    flush_min 1..17-T.  C2 alone leaves verify rows untouched and zeroes flush rows; C3 keeps
    len' <= 16 from every legal state (C4) and base' in [0, 32)."""
    P, base, n = torch.meshgrid(torch.arange(W + 1), torch.arange(SLOTS), torch.arange(T + 1), indexing="ij")
    P, base, n = P.flatten(), base.flatten(), n.flatten()
    for fm in range(1, 18 - T):
        Pc, bc = commits.caller_commit(P, base, n, fm)
        Ps, bs = commits.standalone_then_accept(P, base, n, fm)
        assert torch.equal(Pc, Ps) and torch.equal(bc, bs)
        P2, b2 = commits.standalone_commit(P, base, fm)
        f = P >= fm
        assert torch.equal(P2[~f], P[~f]) and torch.equal(b2[~f], base[~f])
        assert bool((P2[f] == 0).all()) and torch.equal(b2[f], (base[f] + P[f]) % SLOTS)
        legal = f | (P + T <= W)  # verify rows have P <= 16 - T because P < flush_min <= 17 - T
        assert bool(legal.all())
        assert bool((Pc <= W).all() and (Pc >= 0).all() and (bc >= 0).all() and (bc < SLOTS).all())
        assert torch.equal(Pc, torch.where(f, n, P + n))


def test_C_reset_zeroes_only_the_given_rows():
    """Reset (serving doc): hist_len = 0, cache_base = 0 on the given rows only; pure."""
    P, base = torch.tensor([3, 16, 7, 0]), torch.tensor([5, 31, 12, 9])
    P2, b2 = commits.reset(P, base, torch.tensor([1, 3]))
    assert P2.tolist() == [3, 0, 7, 0] and b2.tolist() == [5, 0, 12, 0]
    assert P.tolist() == [3, 16, 7, 0] and base.tolist() == [5, 31, 12, 9]


# ----------------------------------------------------------------------------------------
# 6. the multi-step serving model


@st.composite
def serving_runs(draw):
    geo, flush_min, idx, accepts, seed = draw(machine_runs(30, 40))
    live_rows = [r for r, i in enumerate(idx) if i >= 0]
    reset_at = draw(st.integers(1, len(accepts) - 5))
    reset_row = draw(st.sampled_from(live_rows))
    return geo, flush_min, idx, accepts, seed, reset_at, reset_row


@hsettings(40)
@given(run=serving_runs())
def test_serving_ring_machine_tracks_sequential_decode(run):
    """Serving model (M3-M8, C2, C3, reset): RingMachine with commit='caller' (C3) and with
    commit='standalone' (C2 then += accepted) tracks sequential_decode within 1e-10 relative
    (all T drafts' y, committed logical state) over 30-40 steps with random accepts; both
    commit styles stay bit-identical.  Pad rows (idx < 0) change nothing: every step's writes
    lie inside the live rows' enumerated write set; a twin batch whose pad rows carry other
    ids, inputs and accepts gives the same bits; a twin machine without the pad rows agrees
    to rounding (batched kernels of another batch size may differ in the last bit).  A reset row with a fresh checkpoint and a NaN-poisoned ring behaves
    like a new request (fresh machine: same y, state and cursors)."""
    geo, flush_min, idx, accepts, seed, reset_at, reset_row = run
    out = run_serving(geo, seed, flush_min, idx, accepts, reset_at, reset_row)
    note(repr(out))
    event(f"appends wrapped past slot 31: {out['wraps'] > 0}")
    event(f"pad rows: {any(i < 0 for i in idx)}")
    assert out["flushes"] > 0  # hist_len grows by >= 1 a step, so every live row flushes
    assert record("serving y vs sequential_decode", out["y"]) < TOL_CHAIN
    assert record("serving state vs sequential_decode", out["state"]) < TOL_CHAIN
    assert record("serving reset row vs fresh machine (y)", out["fresh_y"]) < TOL_CHAIN
    assert record("serving reset row vs fresh machine (state)", out["fresh_state"]) < TOL_CHAIN
    assert record("serving pad-free twin", out["twin"]) < TOL_CHAIN
    assert out["c_vs_s_bits"], "caller and standalone commits diverged"
    assert out["fresh_cursors"]
    assert out["pad_bits"], "pad rows changed a bit of the live rows (other pad inputs, same batch)"
    assert out["stray"] == 0, "a write outside the live rows' write set (pad rows must write nothing)"


# ----------------------------------------------------------------------------------------
# 7. write_set / read_set (M8, R2)


@hsettings(200)
@given(c=launch_cases())
def test_R2_M8_write_set_and_read_set(c):
    """R2: for every legal cursor state the read set (windows) and the write set (appends) of
    one launch are disjoint ring slots.  M8: write_set equals the per-row enumeration exactly
    (T append slots per live row, all heads; pool rows exactly the live flush rows; output
    rows exactly the live rows), read_set equals the enumerated windows, and apply_launch
    changes nothing outside write_set."""
    geo = c.geo
    idx, P, base = (torch.tensor(x, dtype=torch.long) for x in (c.idx, c.P, c.base))
    ws = ring.write_set(pool_size=geo.pool, H=geo.H, HV=geo.HV, T=geo.T, idx=idx, hist_len=P,
                        cache_base=base, flush_min=c.flush_min)
    rs = ring.read_set(pool_size=geo.pool, H=geo.H, HV=geo.HV, idx=idx, hist_len=P, cache_base=base)
    for m in (ws.k_ring, ws.u_ring, ws.g_ring):
        assert not bool((m & rs[:, None, :]).any()), "R2: read and write sets overlap"
    pm, rm = expected_writes(geo.pool, geo.T, idx, P, base, c.flush_min)
    assert torch.equal(ws.pool, pm[:, None].expand(geo.pool, geo.HV))
    flush_pool_rows = {int(i) for i, p in zip(idx, P) if i >= 0 and p >= c.flush_min}
    assert {int(i) for i in torch.nonzero(ws.pool.any(1)).flatten()} == flush_pool_rows
    assert torch.equal(ws.k_ring, rm[:, None, :].expand(geo.pool, geo.H, SLOTS))
    assert torch.equal(ws.u_ring, rm[:, None, :].expand(geo.pool, geo.HV, SLOTS))
    assert torch.equal(ws.g_ring, rm[:, None, :].expand(geo.pool, geo.HV, SLOTS))
    assert torch.equal(ws.output_rows, idx >= 0)
    assert torch.equal(rs, expected_reads(geo.pool, idx, P, base))
    # apply_launch stays inside write_set
    w = build_world(geo, c.seed, idx, P, base)
    e = launch(w, make_tokens(torch.Generator().manual_seed(c.seed + 1), geo, geo.T), c.flush_min)
    before = tuple(x.clone() for x in w.buffers())
    serving.apply_launch(*w.buffers(), w.idx, e)
    assert stray_writes(before, w.buffers(), ws.pool.any(1), ws.k_ring.any(1)) == 0


@pytest.mark.parametrize("T", [4, 8])
def test_R2_disjoint_for_every_legal_cursor(T):
    """R2 exhaustively: every hist_len 0..16 and cache_base 0..31 (one row each, distinct pool
    rows): the window and the T appends never share a slot, and each row writes T slots."""
    P, base = torch.meshgrid(torch.arange(W + 1), torch.arange(SLOTS), indexing="ij")
    P, base = P.flatten(), base.flatten()
    n = P.numel()
    idx = torch.arange(n)
    rs = ring.read_set(pool_size=n, H=1, HV=1, idx=idx, hist_len=P, cache_base=base)
    for fm in (1, 17 - T):
        ws = ring.write_set(pool_size=n, H=1, HV=1, T=T, idx=idx, hist_len=P, cache_base=base, flush_min=fm)
        assert not bool((ws.u_ring[:, 0] & rs).any())
        assert torch.equal(ws.u_ring[:, 0].sum(1), torch.full((n,), T))
        assert torch.equal(ws.pool[:, 0], P >= fm)
    assert torch.equal(rs.sum(1), P)


# ----------------------------------------------------------------------------------------
# 8. the identities have power: break one oracle function, watch the identity fail


def _fixed_case(T=4, flush_min=None, P=(8, 12, 5), base=(28, 3, 30), n=None, pads=False) -> LaunchCase:
    geo = Geo(B=len(P), T=T, H=2, G=2, K=8, V=8, pool=5)
    flush_min = 17 - T if flush_min is None else flush_min
    idx = [3, 0, 4][: len(P)]
    return LaunchCase(geo=geo, flush_min=flush_min, idx=idx, P=list(P), base=list(base), seed=1234,
                      n=list(n) if n is not None else [T] * len(P))


def test_power_anchor_from_lane_P_breaks_replay(monkeypatch):
    """M3 power: anchor G_P taken from lane P (instead of P-1) makes identity 1 (replay ==
    sequential) and the launch's y fail by far more than 1e-3."""
    c = _fixed_case()
    assert check_ring_replay(c, strong=True)["M3 replay state"] < TOL_ONE

    def anchor_lane_P(G, hist_len):
        lane = hist_len.long().clamp(max=W - 1)
        GP = G.gather(2, lane[:, None, None].expand(-1, G.shape[1], 1)).squeeze(2)
        return torch.where((hist_len > 0)[:, None], GP, torch.zeros_like(GP))

    monkeypatch.setattr(ring, "anchor", anchor_lane_P)
    out = check_ring_replay(c, strong=True)
    assert record("POWER anchor lane P: replay err", out["M3 replay state"]) > BROKEN
    assert out["M4 launch y"] > BROKEN


def _launch_without_g_restart(orig):
    def broken(**kw):
        e = orig(**kw)
        e.g_app = orig(**{**kw, "flush_min": NEVER}).g_app  # flush rows keep G_P + Gamma_s
        return e
    return broken


def test_power_no_local_G_restart_breaks_fold_and_g_bookkeeping(monkeypatch):
    """M6 power: flush rows appending G_P + Gamma_s (no local restart) break identity 2
    (logical state after fold + commit) and identity 4 (window g == log-decay from the
    checkpoint) by far more than 1e-3; verify rows are unaffected."""
    # rows 0, 1 flush; row 2 verifies.  Moderate decay and few accepted tokens: the wrong
    # e^{G_P} factor hits the folded checkpoint while it still dominates the state.
    c = _fixed_case(flush_min=8, P=(8, 12, 5), n=(1, 2, 2))
    ok = check_fold_continue(c)
    assert ok["C3 logical state (flush rows)"] < TOL_ONE
    geo = Geo(B=2, T=4, H=1, G=2, K=8, V=8, pool=3)
    accepts = [[4, 3], [2, 4], [4, 4], [1, 2], [3, 3], [4, 1], [2, 2], [4, 4]] * 2
    good = check_g_bookkeeping(geo, 7, 6, [2, 0], accepts, strong=True)
    assert good["M6 window g == log-decay from checkpoint"] < TOL_CHAIN and good["_flushes"] > 0

    monkeypatch.setattr(ring, "launch", _launch_without_g_restart(ring.launch))
    bad = check_fold_continue(c)
    assert record("POWER no G restart: fold-continue err", bad["C3 logical state (flush rows)"]) > BROKEN
    assert bad["C3 logical state (verify rows)"] < TOL_ONE
    bad4 = check_g_bookkeeping(geo, 7, 6, [2, 0], accepts, strong=True)
    assert record("POWER no G restart: g bookkeeping err",
                  bad4["M6 window g == log-decay from checkpoint"]) > BROKEN


def test_power_fold_including_drafts_breaks_fold_then_continue(monkeypatch):
    """M7 power: folding the state after the T drafts (instead of S_P, window rows only)
    breaks identity 2 by far more than 1e-3."""
    c = _fixed_case(flush_min=8, P=(8, 12, 5), n=(1, 2, 2))  # rows 0, 1 flush
    assert check_fold_continue(c)["C3 logical state (flush rows)"] < TOL_ONE
    orig = ring.launch

    def fold_drafts(**kw):
        e = orig(**kw)
        HV = kw["v"].shape[2]
        g, beta = gdn.gates(kw["a"], kw["dt_bias"], kw["A_log"], kw["b"])
        q_hat, k_hat = gdn.normalized_qk(kw["q"], kw["k"], HV, kw["scale"])
        e.fold = gdn.sequential(e.fold, q_hat, k_hat, kw["v"], g, beta)[2][:, -1]
        return e

    monkeypatch.setattr(ring, "launch", fold_drafts)
    bad = check_fold_continue(c)
    assert record("POWER fold drafts: fold-continue err", bad["C3 logical state (flush rows)"]) > BROKEN
    assert bad["M7 pool after flush"] > BROKEN


def test_power_y_from_final_state_breaks_prefix_independence(monkeypatch):
    """M4 power: a recurrence whose y_t reads the state after the last draft (not after
    token t) makes accepted outputs depend on rejected drafts (identity 3) by far more than 1e-3."""
    c = _fixed_case(n=(1, 2, 3))
    assert check_prefix(c)["M4 prefix independence"] == 0.0
    orig = gdn.sequential

    def y_from_final(S, q_hat, k_hat, v, g, beta, **kw):  # ring.launch passes keep_states=False
        y, U, states = orig(S, q_hat, k_hat, v, g, beta)
        y = torch.einsum("bhvk,bthk->bthv", states[:, -1], q_hat)
        return y, U, states

    monkeypatch.setattr(ring, "sequential", y_from_final)
    bad = check_prefix(c)
    assert record("POWER y from final state: prefix diff", bad["M4 prefix independence"]) > BROKEN


def test_power_flush_commit_without_base_advance_breaks_serving(monkeypatch):
    """C3 power: a caller commit that forgets base' = (base + P) & 31 on flush rows makes the
    serving machine drift from sequential_decode (identity 6) by far more than 1e-3, and the
    integer window model (identity 5) catches it too."""
    geo = Geo(B=2, T=4, H=1, G=1, K=8, V=8, pool=3)
    accepts = [[4, 3], [2, 4], [4, 4], [1, 2], [3, 3], [4, 1], [2, 2], [4, 4]] * 4
    good = run_serving(geo, 11, 13, [2, 0], accepts, 3, 0, twin=False)
    assert good["state"] < TOL_CHAIN
    orig = commits.caller_commit

    def no_base_advance(hist_len, cache_base, accepted, flush_min):
        P, _ = orig(hist_len, cache_base, accepted, flush_min)
        return P, cache_base.long()

    monkeypatch.setattr(commits, "caller_commit", no_base_advance)
    bad = run_serving(geo, 11, 13, [2, 0], accepts, 3, 0, twin=False)
    assert record("POWER no base advance: serving state err", bad["state"]) > BROKEN
    assert record("POWER no base advance: serving y err", bad["y"]) > BROKEN
    assert not bad["c_vs_s_bits"]
    with pytest.raises(AssertionError):
        run_commit_invariants(4, 13, [0, 30], accepts)


def test_power_flush_commit_without_restart_breaks_C4(monkeypatch):
    """C3/C4 power: a caller commit that keeps len' = P + accepted on flush rows lets the
    window grow past 16 (and past the 24-slot bound), which identity 5 reports."""
    orig = commits.caller_commit

    def no_restart(hist_len, cache_base, accepted, flush_min):
        P, base = orig(hist_len, cache_base, accepted, flush_min)
        return hist_len.long() + accepted.long(), base

    monkeypatch.setattr(commits, "caller_commit", no_restart)
    with pytest.raises(AssertionError):
        run_commit_invariants(8, 9, [5, 31], [[8, 8]] * 6)


def test_power_illegal_hist_len_overlaps_read_and_write_sets():
    """R2 power: the disjointness check is not vacuous: at the illegal hist_len 33 - T (R3)
    the appends wrap onto the window and read_set & write_set overlap."""
    for T in (4, 8):
        P = torch.tensor([33 - T])
        rs = ring.read_set(pool_size=1, H=1, HV=1, idx=torch.tensor([0]), hist_len=P, cache_base=torch.tensor([7]))
        ws = ring.write_set(pool_size=1, H=1, HV=1, T=T, idx=torch.tensor([0]), hist_len=P,
                            cache_base=torch.tensor([7]), flush_min=17 - T)
        assert bool((ws.u_ring[:, 0] & rs).any())


# ----------------------------------------------------------------------------------------
# regression guards for three oracle bugs found while writing this file (all fixed):
# softplus overflow, accepted = 0 in sequential_decode, pad-row cursor range check.


def test_M1_gates_stay_finite_for_large_softplus_argument():
    """M1, N2: ln(1 + e^x) is finite for every finite x, so the float64 spec must be too
    (N2: the kernel overflows at ~88.7, the reference is meant to stay finite)."""
    x = torch.tensor([[[30.0, 700.0, 710.0, 1000.0]]], dtype=F64)
    z = torch.zeros(4, dtype=F64)
    g, _ = gdn.gates(x, z, z, torch.zeros_like(x))
    assert bool(torch.isfinite(g).all())
    assert rel(g, -torch.logaddexp(x, torch.zeros_like(x))) < TOL_ONE


def test_C4_accepted_zero_sequential_decode_matches_ring_machine():
    """C4: accepted = 0 is arithmetically consistent; the truth machine and the ring machine
    must then agree that the logical state does not move."""
    geo = Geo(B=2, T=4, H=1, G=1, K=4, V=4, pool=2)
    gen = torch.Generator().manual_seed(3)
    A_log, dt_bias = make_params(gen, geo.HV)
    pool0 = 0.5 * torch.randn(geo.pool, geo.HV, geo.V, geo.K, generator=gen, dtype=F64)
    m = serving.RingMachine(pool0, geo.H, torch.tensor([0, 1]), geo.T, 13, "caller")
    tok = make_tokens(gen, geo, geo.T, accepted=[0, 2])
    m.step(tok, A_log, dt_bias, geo.scale)
    S_next, _ = serving.sequential_decode(pool0.clone(), tok, A_log, dt_bias, geo.scale)
    assert rel(m.logical_state(), S_next) < TOL_ONE


def test_M8_pad_row_cursors_are_ignored():
    """M8: a pad row (idx < 0) exits before reading its cursors, so any hist_len there must
    give the same expectation for the live rows as hist_len = 0."""
    geo = Geo(B=2, T=4, H=1, G=1, K=4, V=4, pool=2)
    w = build_world(geo, 5, [0, -1], [3, 0], [30, 0])
    tok = make_tokens(torch.Generator().manual_seed(6), geo, geo.T)
    e0 = launch(w, tok, 13)
    e1 = launch(w, tok, 13, hist_len=torch.tensor([3, 20]), cache_base=torch.tensor([30, 40]))
    assert torch.equal(e0.y[0], e1.y[0]) and torch.equal(e0.u_app[0], e1.u_app[0])
