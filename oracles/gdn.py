"""The gated delta rule, token by token, in float64: the spec (contract M1, M2, M4).

Shapes follow the contract: B rows, T tokens, H k-heads, HV v-heads (G = HV // H),
K = V = 128 for the production kernel (any K, V here).  A state S is [V, K] per
(row, v-head): y = S q, S <- e^g S + U k^T.

Everything here is plain torch float64, vectorized over rows and heads, and runs on
whatever device its inputs live on.  Nothing clever: the loops over tokens are the
definition.
"""

from __future__ import annotations

import torch

EPS = 1e-6  # M2: eps inside the square root, ||x||^2 + 1e-6


def gates(a, dt_bias, A_log, b):
    """M1: g_t = -e^{A_log} * ln(1 + e^{a_t + dt_bias}),  beta_t = sigmoid(b_t).

    a, b: [B, T, HV]; dt_bias, A_log: [HV].  Returns (g, beta), both [B, T, HV] float64.
    No softplus threshold (the kernel has none).  Callers pass A_log / dt_bias already
    rounded to the IO dtype (N4).
    """
    x = a.double() + dt_bias.double()  # [B, T, HV]
    g = -torch.exp(A_log.double()) * torch.logaddexp(x, torch.zeros_like(x))  # ln(1 + e^x), finite for any x
    beta = torch.sigmoid(b.double())
    return g, beta


def l2norm(x, eps: float = EPS):
    """M2: x (||x||^2 + eps)^{-1/2} over the last dim, float64."""
    x = x.double()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def expand_heads(x, HV: int):
    """Map k-head tensors [..., H, K] to v-heads [..., HV, K]: v-head hv reads k-head hv // G."""
    H = x.shape[-2]
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}; use HV = G*H for an integer G")
    return x.repeat_interleave(HV // H, dim=-2)


def normalized_qk(q, k, HV: int, scale: float):
    """M2: q_hat = l2norm(q) * scale, k_hat = l2norm(k), both mapped to v-heads.

    q, k: [B, T, H, K] -> ([B, T, HV, K], [B, T, HV, K]) float64.
    """
    return expand_heads(l2norm(q) * scale, HV), expand_heads(l2norm(k), HV)


def matvec(S, x):
    """S x for every (row, head): S [..., V, K], x [..., K] -> [..., V] (a batched matmul)."""
    return (S @ x[..., None]).squeeze(-1)


def sequential(S, q_hat, k_hat, v, g, beta, *, keep_states: bool = True, pick=None):
    """M4, one token at a time, from state S.

    S: [B, HV, V, K]; q_hat, k_hat: [B, T, HV, K]; v: [B, T, HV, V]; g, beta: [B, T, HV].
    For t in 0..T-1:
        S <- e^{g_t} S
        U_t = beta_t (v_t - S k_t)          (the corrected update, what the ring stores)
        S <- S + U_t k_t^T
        y_t = S q_t
    Returns (y [B, T, HV, V], U [B, T, HV, V], states), where states is
      keep_states=True (default): [B, T, HV, V, K], S after every token t;
      keep_states=False:          [B, HV, V, K], S after the last token only (two states
                                  live at a time instead of 2T: callers that need y and U);
      pick ([B] int in -1..T-1):  [B, HV, V, K], each row's S after token pick[b] (-1: the
                                  input S), selected as the loop runs (keep_states ignored).
    """
    S = S.double()
    v = v.double()
    kept = S if pick is not None else None
    ys, Us, Ss = [], [], []
    for t in range(q_hat.shape[1]):
        S = torch.exp(g[:, t])[..., None, None] * S  # a new tensor: states kept earlier are untouched
        U = beta[:, t, :, None] * (v[:, t] - matvec(S, k_hat[:, t]))
        S.addcmul_(U[..., :, None], k_hat[:, t, :, None, :])  # S <- S + U_t k_t^T
        ys.append(matvec(S, q_hat[:, t]))
        Us.append(U)
        if pick is not None:
            kept = torch.where((pick == t)[:, None, None, None], S, kept)
        elif keep_states:
            Ss.append(S)
    states = kept if pick is not None else (torch.stack(Ss, 1) if keep_states else S)
    return torch.stack(ys, 1), torch.stack(Us, 1), states


def sequential_magnitude(S_abs, q_hat, k_hat, v, g, beta, *, keep_states: bool = True):
    """The same recurrence on absolute values: |terms| that build y, U and S.

    Floating-point error in any evaluation order of M4 is bounded by a multiple of
    these magnitudes (the classical |A||x| bound), so the tolerance checks divide
    errors by them instead of by |y|, which can cancel to zero.  Same shapes as
    sequential() (keep_states likewise); S_abs must already be a magnitude (non-negative).
    """
    M = S_abs.double()
    qa, ka, va = q_hat.abs(), k_hat.abs(), v.double().abs()
    ys, Us, Ms = [], [], []
    for t in range(q_hat.shape[1]):
        M = torch.exp(g[:, t])[..., None, None] * M
        U = beta[:, t, :, None] * (va[:, t] + matvec(M, ka[:, t]))
        M.addcmul_(U[..., :, None], ka[:, t, :, None, :])  # M <- M + U_t |k_t|^T
        ys.append(matvec(M, qa[:, t]))
        Us.append(U)
        if keep_states:
            Ms.append(M)
    return torch.stack(ys, 1), torch.stack(Us, 1), (torch.stack(Ms, 1) if keep_states else M)
