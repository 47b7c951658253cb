"""Example-based baseline: a few fixed single launches per arm, in the style of the kernel authors' suite.

How this file tests
-------------------
This is the comparison point of the mutation score (gdn_fuzz.studies.mutation_score), written the way
FlashInfer's own ucache test checks the kernel (contract section 8): a handful of fixed
cases, each one launch, compared with a sequential float32 reference under absolute
tolerances.  Per dtype arm it runs 6 cases: hist_len P in {0, 12, 13} for every row, with
cache_base 0 for every row or a wrapped pattern (30, 27, 24, 21: the windows of P = 12 and 13
cross ring slot 31, and the appends of P = 0 at base 30 wrap), B = 4 rows on identity slot
indices (row i on pool slot i, pool = B), T = 4, the default flush_min (13, so P = 13 rows
flush), restart_hist_on_flush at its default (True, with caller-owned cursors).  The geometry
is H = 2, HV = 4 (G = 2; the authors use the model geometry, which costs 16x more on a CPU
and runs the same code paths).

The history is built the way such a test builds it: P history tokens per row are run through
the float32 recurrence from the checkpoint S0, their records (k_hat, U, cumulative G) are
written into the rings at (base + j) & 31, and the state S_P reached by the recurrence is the
reference for the fold.  Then the T drafts run from S_P in float32.

Checks per case (and only these, as in the authors' test):
  y       max |y - y_ref| <= 8e-3 over every row
  fold    rows with P >= flush_min: max |pool[slot] - S_P| <= 2e-2
  window  rows with P >= flush_min: the k/u/g ring slots of their window are bitwise unchanged
A launch that raises on one of these legal cases also fails the baseline.

The reference below is deliberately small and shares no code with the float64 oracles or the
reference target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gdn_fuzz.arms import ARM_NAMES, get_arm
from gdn_fuzz.case import lazy_flush_min
from gdn_fuzz.compare import AUTHORS_STATE_ATOL, AUTHORS_Y_ATOL
from gdn_fuzz.targets import Target

Y_ATOL = AUTHORS_Y_ATOL  # FlashInfer's absolute tolerances (gdn_fuzz.compare, contract N4)
STATE_ATOL = AUTHORS_STATE_ATOL
B, T, H, HV, K, V = 4, 4, 2, 4, 128, 128
FLUSH_MIN = lazy_flush_min(T)  # 13: the default the authors' test uses
PS = (0, 12, 13)
BASES = {"zero": (0, 0, 0, 0), "wrapped": (30, 27, 24, 21)}
A_MU = -2.0  # gate logits a ~ N(-2, 0.5^2): g ~ -0.13 per token, so S0 still weighs e^-1.7 after 13 tokens


@dataclass
class BaselineResult:
    killed: bool = False
    failures: list = field(default_factory=list)
    launches: int = 0


def _gates(a, b, A_log, dt_bias):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _recur(S, q, k, v, g, beta, scale):
    """float32 sequential gated delta rule for one row.  S [HV, V, K]; q, k [n, H, K]; v [n, HV, V]; g, beta [n, HV].
    Returns (S after, y [n, HV, V], U [n, HV, V], k_hat [n, H, K])."""
    G = HV // H
    k_hat = F.normalize(k.float(), dim=-1)
    q_hat = F.normalize(q.float(), dim=-1) * scale
    ys, Us = [], []
    for t in range(k.shape[0]):
        kk = k_hat[t].repeat_interleave(G, 0)  # [HV, K]
        qq = q_hat[t].repeat_interleave(G, 0)
        S = torch.exp(g[t])[:, None, None] * S
        U = beta[t][:, None] * (v[t].float() - torch.einsum("hvk,hk->hv", S, kk))
        S = S + U[:, :, None] * kk[:, None, :]
        ys.append(torch.einsum("hvk,hk->hv", S, qq))
        Us.append(U)
    return S, torch.stack(ys), torch.stack(Us), k_hat


def make_case(arm, P: int, bases, seed: int):
    """Inputs of one fixed case (in the arm's dtypes) and the fp32 expectations."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    gen = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen)

    io = arm.io
    scale = 1.0 / math.sqrt(K)
    A_log = (0.1 * rn(HV)).to(io)
    dt_bias = (0.1 * rn(HV)).to(io)
    pool = rn(B, HV, V, K).to(arm.state)
    k_cache = torch.zeros(B, H, 32, K, dtype=arm.ring)
    u_cache = torch.zeros(B, HV, 32, V, dtype=arm.ring)
    g_cache = torch.zeros(B, HV, 32, dtype=torch.float32)
    SP = []
    for r in range(B):
        S = pool[r].float()
        if P:
            hq, hk, hv = rn(P, H, K).to(io), rn(P, H, K).to(io), rn(P, HV, V).to(io)
            ha, hb = (A_MU + 0.5 * rn(P, HV)).to(io), rn(P, HV).to(io)
            g, beta = _gates(ha, hb, A_log, dt_bias)
            S, _, U, kh = _recur(S, hq, hk, hv, g, beta, scale)
            slots = (bases[r] + torch.arange(P)) & 31
            k_cache[r][:, slots] = kh.permute(1, 0, 2).to(arm.ring)
            u_cache[r][:, slots] = U.permute(1, 0, 2).to(arm.ring)
            g_cache[r][:, slots] = torch.cumsum(g, 0).t()
        SP.append(S)
    q, k, v = rn(B, T, H, K).to(io), rn(B, T, H, K).to(io), rn(B, T, HV, V).to(io)
    a, b = (A_MU + 0.5 * rn(B, T, HV)).to(io), rn(B, T, HV).to(io)
    y_ref = []
    for r in range(B):
        g, beta = _gates(a[r], b[r], A_log, dt_bias)
        y_ref.append(_recur(SP[r], q[r], k[r], v[r], g, beta, scale)[1])
    inputs = dict(A_log=A_log, a=a, dt_bias=dt_bias, q=q, k=k, v=v, b=b, initial_state_source=pool,
                  initial_state_indices=torch.arange(B, dtype=torch.int32), k_cache=k_cache, u_cache=u_cache,
                  g_cache=g_cache, hist_len=torch.full((B,), P, dtype=torch.int32),
                  cache_base=torch.tensor(bases, dtype=torch.int32))
    return inputs, torch.stack(y_ref), torch.stack(SP)


def run_case(target: Target, arm: str, P: int, base_name: str, device="cpu", seed: int = 0) -> list[str]:
    """Failures (messages) of one fixed case; empty when it passes."""
    bases = BASES[base_name]
    inputs, y_ref, SP = make_case(arm, P, bases, seed)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    before = {k: v.clone() for k, v in inputs.items()}
    tag = f"arm={arm} P={P} base={base_name}"
    try:
        y = target.launch(arm, **inputs)
    except Exception as e:  # noqa: BLE001 - a legal case must not raise
        return [f"{tag}: the launch raised {type(e).__name__}: {e}"]
    out = []
    err = (y.float().cpu() - y_ref).abs().max().item()
    if not err <= Y_ATOL:
        out.append(f"{tag}: y max abs error {err:.3e} > {Y_ATOL:g}")
    if P >= FLUSH_MIN:
        err = (inputs["initial_state_source"].float().cpu() - SP).abs().max().item()
        if not err <= STATE_ATOL:
            out.append(f"{tag}: folded state max abs error {err:.3e} > {STATE_ATOL:g}")
        for r in range(B):
            slots = ((bases[r] + torch.arange(P)) & 31).to(device)
            for name in ("k_cache", "u_cache", "g_cache"):
                if not torch.equal(before[name][r][:, slots], inputs[name][r][:, slots]):
                    out.append(f"{tag}: row {r}: window slots of {name} changed by the flush")
    return out


def run_baseline(target: Target, arms=ARM_NAMES, device="cpu", seed: int = 0) -> BaselineResult:
    """Every fixed case of every arm; killed = any case failed."""
    res = BaselineResult()
    for arm in arms:
        for i, (P, base_name) in enumerate((P, bn) for P in PS for bn in BASES):
            res.launches += 1
            res.failures += run_case(target, arm, P, base_name, device, seed=seed * 1000 + i)
    res.killed = bool(res.failures)
    return res
