"""The comparison: the one error metric, every bound and where each comes from.

Everything that judges a target against float64 lives here: the Frobenius metric
(frobenius, distance, relative, rel_to_magnitude, ratio), the per-arm tolerance table of one
launch (table_for, TABLE), the drift budget of a served request (DRIFT_C, drift_unit,
drift_budget, drift_need) and the pad-lane bound (PAD_LANE_RTOL).  No other module computes a
norm of an error or restates a bound; measurement logs behind the numbers are in
docs/tolerances.md.

One launch: the tolerance table
-------------------------------
The metric (rel_to_magnitude) is, per (row, head), the Frobenius norm of the error
divided by the Frobenius norm of the *magnitude* of the terms that build the value
(oracles.gdn.sequential_magnitude: the same recurrence on |S|, |v|, |k|, |q|).  Rounding
error of any evaluation order is bounded by a multiple of that magnitude, so the metric
cannot blow up when y cancels to ~0, and a real bug (wrong slot, wrong decay, wrong row)
moves it to O(1e-1 .. 1).

Each bound is c * u, with u the unit roundoff (2^-p) of the dtype that limits that value
(contract N3) and c the number of roundings in its path, rounded up:

  y      u(IO)            q_hat/k_hat (PACK), L, QK^T, decayed QK^T, Tmat, R, QT and y (IO):
                          8 roundings; errors of random sign add in quadrature (sqrt 8 ~ 3),
                          c = 4.
  u      u(IO)            U = Tmat (IO) x (V - e^G S_h K) with S_h K through IO/PACK
                          operands, then one rounding to RING: c = 4.
  k      max u(PACK,RING) one rounding to PACK, then PACK -> RING (exact in range): c = 2.
  fold   max u(STATE,RING) w*u rounded to RING, one rounding to STATE: c = 3.
  g      f32             ex2.approx (rel. err 2^-22) and an f32 scan of T <= 8 terms;
                          bound 2^-16 relative to the summed |g| (over 10x the model),
                          plus an absolute e^{A_log} * 2^-23 per token: softplus is
                          evaluated as ln(1 + z) with z = e^x in f32, and 1 + z rounds
                          with absolute error <= 2^-24, so for x << 0 (z small) g's
                          relative error grows like 2^-24 / z.  Found on the H200
                          (2026-11-29, weak decay, relative g error 2.7e-5 > 2^-16);
                          see docs/tolerances.md.

Underflow: fp16 holds values below 2^-14 only as subnormals spaced 2^-24 apart, so a value
built from K-term dot products of fp16-rounded intermediates can be off by ~K * 2^-24 in
absolute terms however small it is (strong decay with beta near 0 makes such values).
Every arm with an fp16 dtype therefore adds an absolute floor atol = K * 2^-24 per element
to y, u and fold and 2^-24 to k.  bf16's subnormals sit at 2^-133, but the kernel computes in
f32 with subnormals flushed to zero (N1): every f32 term below 2^-126 is 0, where the float64
oracle keeps it (beta exactly 0 in f32 is sigma(-120) = 8e-53 in float64; a decay e^{-400} is
1.9e-174).  So every arm's floor is at least K * 2^-126 per element (2^-126 for k): an element
is a sum of at most K such terms (a K-term dot product; a fold element sums 17).  Found on the
CPU reference with the issue-18 regimes beta "zero" and decay "vanishing" (2026-12-02): U = 0
against 1e-52, relative error 1.

Measured evidence is recorded beside each arm in docs/tolerances.md (H200 maxima over
the recorded campaigns).  A bound is never raised to make a test pass: a target outside
it is a finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gdn_fuzz.arms import ARMS, Arm, get_arm, unit_roundoff

OUTPUTS = ("y", "u", "k", "g", "fold")

# roundings counted per output (see the module docstring)
C_Y, C_U, C_K, C_FOLD = 4.0, 4.0, 2.0, 3.0
G_RTOL = 2.0**-16
G_ABS_PER_TOKEN = 2.0**-23  # x e^{A_log}: 2 x the 2^-24 rounding of 1 + e^x in f32
FP16_SUBNORMAL = 2.0**-24  # spacing of fp16 subnormals
F32_FTZ = 2.0**-126  # f32's smallest normal: the kernel flushes anything below it to zero (N1)
K_TERMS = 128  # K = V = 128: terms in each dot product of normalized vectors


@dataclass(frozen=True)
class Tol:
    rtol: float
    source: str
    atol: float = 0.0  # absolute floor per element (underflow, see the module docstring)


def table_for(arm: Arm | str) -> dict[str, Tol]:
    arm = get_arm(arm) if isinstance(arm, str) else arm
    uio = unit_roundoff(arm.io)
    uk = max(unit_roundoff(arm.pack), unit_roundoff(arm.ring))
    uf = max(unit_roundoff(arm.state), unit_roundoff(arm.ring))
    has_fp16 = torch.float16 in (arm.io, arm.state, arm.ring)
    tiny = FP16_SUBNORMAL if has_fp16 else F32_FTZ
    return {
        "y": Tol(C_Y * uio, f"{C_Y:g} x u(IO={arm.io}): 8 IO/PACK roundings in quadrature (N3)", K_TERMS * tiny),
        "u": Tol(C_U * uio, f"{C_U:g} x u(IO={arm.io}): Tmat/S_h K in IO, one RING rounding (N3)", K_TERMS * tiny),
        "k": Tol(C_K * uk, f"{C_K:g} x u(max(PACK={arm.pack}, RING={arm.ring})): one rounding (N3)", tiny),
        "fold": Tol(C_FOLD * uf, f"{C_FOLD:g} x u(max(STATE={arm.state}, RING={arm.ring})): w*u to RING, S_h to STATE (N3)",
                    K_TERMS * tiny),
        "g": Tol(G_RTOL, "2^-16 of summed |g| + e^{A_log} 2^-23 per token: ex2.approx, ln(1 + e^x) in f32, "
                 "f32 scan (N1, N3)", G_ABS_PER_TOKEN),
    }


TABLE: dict[str, dict[str, Tol]] = {name: table_for(arm) for name, arm in ARMS.items()}


# ------------------------------------------------------------------ the kernel authors' bounds
# Not ours: the absolute tolerances of FlashInfer's own ucache test (contract section 8, N4), used
# only by the example-based baseline (gdn_fuzz.studies.baseline) that imitates that test.
AUTHORS_Y_ATOL = 8e-3  # max |y - y_ref|
AUTHORS_STATE_ATOL = 2e-2  # max |pool[slot] - S_P| on folded rows


# ------------------------------------------------------------------ the metric


def frobenius(x: torch.Tensor, dims) -> torch.Tensor:
    """||x||_F over `dims`, in float64."""
    return x.double().pow(2).sum(dims).sqrt()


def distance(got: torch.Tensor, want: torch.Tensor, dims) -> torch.Tensor:
    """||got - want||_F over `dims`, in float64 (the error every check measures)."""
    return frobenius(got.double() - want.double(), dims)


def ratio(err: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """err / allowed, with a zero budget and NaN errors reading as +inf (always a failure)."""
    return torch.nan_to_num(err / allowed.clamp_min(1e-300), nan=float("inf"))


def relative(got: torch.Tensor, want: torch.Tensor, dims) -> torch.Tensor:
    """||got - want||_F / ||want||_F over `dims` (float64; a zero reference gives err / 1e-300)."""
    return distance(got, want, dims) / frobenius(want, dims).clamp_min(1e-300)


def rel_to_magnitude(got, want, mag, dims, atol: float = 0.0):
    """Per-slice (||got - want||_F, ||mag||_F, atol-floor) over `dims`, float64.

    Callers compare err <= rtol * mag + floor, the floor being atol * sqrt(elements per slice).
    """
    n = 1
    for d in dims:
        n *= got.shape[d]
    g = got.double()
    return from_sums((g - want.double()).pow(2).sum(dims), mag.double().pow(2).sum(dims), n, atol)


def from_sums(err2: torch.Tensor, mag2: torch.Tensor, n: int, atol: float = 0.0):
    """rel_to_magnitude's (err, mag, floor) of a slice of n elements from its sums of squares: sum (got - want)^2
    and sum mag^2 (what the fused oracle's kernel reduces on the device: gdn_fuzz.fused_oracle.measure)."""
    return err2.sqrt(), mag2.sqrt(), floor_of(n, atol)


def floor_of(n: int, atol: float) -> float:
    """The absolute floor of a slice of n elements: atol * sqrt(n) (rel_to_magnitude, from_sums)."""
    return atol * n**0.5


# ------------------------------------------------------------------ drift budget (served requests)
#
# A request served for `age` launches since admission: per (request, v-head), Frobenius over [V, K]
#
#     ||S_target - S_truth|| <= DRIFT_C * u(arm) * sqrt(1 + age) * ||S_truth|| + atol * sqrt(V K)
#
# u(arm): the coarsest unit roundoff among IO/PACK, STATE and RING (every token's k_hat and U and
# every fold pass through them); atol: the arm's fold floor above.  Rounding errors of random sign
# add in quadrature, hence sqrt(1 + age).  MEASURED_DRIFT is the worst "need" (the DRIFT_C a state
# needed) over 36,000 launches per arm on an H200 (2026-11-29, `gdn-fuzz drift --measure-budget`,
# the whole log and the stagnation corner of bf16 checkpoints in docs/tolerances.md, "Drift budget").
MEASURED_DRIFT: dict[str, float] = {"bf16": 2.706, "bf16-ring16": 2.705, "fp16": 1.073,
                                    "bf16-state16": 0.998, "bf16-state16-ring16": 0.137}
DRIFT_MARGIN = 4.0  # covers the production kernel's extra IO roundings and the stagnation corner
DRIFT_C = 11.0  # = ceil(DRIFT_MARGIN * max(MEASURED_DRIFT))
assert DRIFT_C >= DRIFT_MARGIN * max(MEASURED_DRIFT.values())


def drift_unit(arm: Arm | str) -> float:
    """u(arm): the coarsest unit roundoff among IO, PACK, STATE and RING."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    return max(unit_roundoff(d) for d in (arm.io, arm.pack, arm.state, arm.ring))


def drift_scale(u: float, age, den: torch.Tensor) -> torch.Tensor:
    """u * sqrt(1 + age) * ||truth||: the budget's unit (age: a number or a tensor broadcasting to den)."""
    age = torch.as_tensor(age, dtype=torch.float64, device=den.device)
    return u * torch.sqrt(1.0 + age) * den


def drift_budget(u: float, age, den: torch.Tensor, floor: float = 0.0, c: float = DRIFT_C) -> torch.Tensor:
    """The allowed ||S - S_truth||: c * u * sqrt(1 + age) * ||S_truth|| + floor."""
    return c * drift_scale(u, age, den) + floor


def drift_need(err: torch.Tensor, u: float, age, den: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The DRIFT_C this error needs: (err - floor)_+ / (u sqrt(1 + age) ||truth||); what studies record."""
    scaled = drift_scale(u, age, den)
    return torch.nan_to_num((err - floor).clamp_min(0.0) / scaled.clamp_min(1e-300), nan=float("inf"))


# ------------------------------------------------------------------ pad lanes (varlen rows)
# A pad lane (a = -inf, zero q/k/v/b) appends an identity record: replaying the window through the
# pad lanes must give the state at the last real token.  Float64 replay of exact zeros leaves only
# summation noise (1e-12 relative), plus 8 fp32 ulps of the anchor |G_P| (2^-21 |G_P|) for a kernel
# whose scan groups the f32 sum of g differently once zeros are appended (N3).
PAD_LANE_RTOL = 1e-12
PAD_LANE_G_ULPS = 2.0**-21


# ------------------------------------------------------------------ outputs of a served request
# The outputs y of a launch that starts from a state of age `age` (launches since admission), per
# (request, v-head), Frobenius over the step's tokens and V, against the float64 truth:
#
#     ||y - y_truth|| <= (C_Y + DRIFT_C sqrt(1 + age)) * u * ||y_mag|| + floor
#
# C_Y u: the launch's own roundings (the y row of the table above); DRIFT_C u sqrt(1 + age): the
# drift budget of the state it starts from (drift_budget), carried to y because |dS q| <= |dS| |q|
# and y_mag >= |S| |q| term by term (y_mag: oracles.gdn.sequential_magnitude on |terms|).  Used by
# the serving engine's y check and the Triton differential (studies/triton_diff.py), with
# u = drift_unit(arm) or, for the Triton baseline, the coarsest of its IO and checkpoint dtypes.


def y_budget(u: float, age, mag: torch.Tensor, floor: float = 0.0, c: float = DRIFT_C) -> torch.Tensor:
    """The allowed ||y - y_truth|| of a launch from a state of age `age`: (C_Y + c sqrt(1 + age)) u ||y_mag|| + floor."""
    age = torch.as_tensor(age, dtype=torch.float64, device=mag.device)
    return (C_Y + c * torch.sqrt(1.0 + age)) * u * mag + floor


# ------------------------------------------------------------------ exact fold (Triton baseline)
# The Triton baseline folds its raw window (v, k, g, beta) by an fp32 sequential replay, rounded once
# to the checkpoint dtype.  Against the float64 replay of the same raw records, relative to the
# magnitude of the terms (the replay on |terms|):
#     C_FOLD u(ckpt)                      one rounding to the checkpoint dtype (C_FOLD above), plus
#     wp (8 + log2 K) 2^-24               per replayed token the fp32 recurrence's roundings: exp, the
#                                         K-term dot (pairwise summation ~ log2 K), subtract, scale,
#                                         rank-1 update (8 + log2 K).
F32_UNIT = 2.0**-24


def exact_fold_rtol(u_ckpt: float, window: int, K: int) -> float:
    """Relative bound of the baseline's exact fold over a window of `window` records (above)."""
    return C_FOLD * u_ckpt + window * (8 + math.log2(K)) * F32_UNIT


# Two float64 replays of the same records in different layouts (the Triton baseline's own replay and
# oracles.ring.replay of its fused-layout mapping) differ by summation order only.
F64_REPLAY_RTOL = 1e-12


# ------------------------------------------------------------------ drift study regression bounds
# The worst relative error of the committed state and of the accepted outputs measured by the drift
# study (gdn_fuzz.studies.drift) in two fixed configurations; a later run of the same configuration must
# stay within STUDY_MARGIN x these (tests/test_drift.py).  CPU: reference target, 512 tokens, batch 2,
# H=2, HV=4, normal decay, worst of 8 runs (2026-11-29).  H200: production kernel, H=16, HV=64, batch 4,
# 32,768 tokens, MTP-like acceptance, normal decay (2026-11-29, docs/drift-h200.md).  The measurement
# logs and their scope are in docs/tolerances.md, "Drift study bounds".
STUDY_MARGIN = 4.0
STUDY_CPU_STATE = {"bf16": 3.541e-3, "bf16-state16": 3.111e-3}

STUDY_CPU_Y = {"bf16": 1.114e-3, "bf16-state16": 1.008e-3}

STUDY_H200_STATE = {
    ("4", "bf16"): 5.492e-03, ("4", "bf16-state16"): 5.488e-03, ("4", "bf16-ring16"): 4.989e-03,
    ("4", "bf16-state16-ring16"): 4.422e-03, ("4", "fp16"): 6.912e-04, ("8", "bf16"): 5.612e-03,
    ("8", "bf16-state16"): 5.600e-03, ("8", "bf16-ring16"): 4.958e-03, ("8", "bf16-state16-ring16"): 4.649e-03,
    ("8", "fp16"): 7.567e-04,
}

STUDY_H200_Y = {
    ("4", "bf16"): 2.248e-03, ("4", "bf16-state16"): 2.248e-03, ("4", "bf16-ring16"): 2.254e-03,
    ("4", "bf16-state16-ring16"): 2.219e-03, ("4", "fp16"): 3.769e-04, ("8", "bf16"): 2.339e-03,
    ("8", "bf16-state16"): 2.339e-03, ("8", "bf16-ring16"): 2.340e-03, ("8", "bf16-state16-ring16"): 2.182e-03,
    ("8", "fp16"): 3.143e-04,
}


# ------------------------------------------------------------------ the prefix materializer (PMN1-PMN5)
# Per element (v, k) of a materialized state, against the float64 PMM3 value S of the same stored ring and
# state values (kernel-contract-0.7.4.md 2.7; the terms are PMN5's, with the magnitudes of oracles.prefix):
#
#   rest  = u_RG W + (2^-21 + 2^-23 A + 2^-19 + 2^-24) M + delta + PM_FTZ (1 + |S0| + U)
#   bound = u_ST (|S| + rest) + rest
#
#   u_RG W            w_j u_j rounded once to RING (_mul_rg2_f32, PMN1), W = sum_j w_j |u_j||k_j|
#   2^-21 M           ex2.approx of both exponentials (2^-22, doubled for safety, PMN2)
#   2^-23 A M         the exponent argument subtracted and scaled by log2 e in f32 (PMN2), A its largest |.|
#   2^-19 M           the MMA's f32 accumulation of 16 exact products (16 x 2^-23, PMN3)
#   2^-24 M           the final fma.rn.f32 (PMN4)
#   delta             fp16 underflow: 2^-25 (1 + sum_j |k_j[k]|) when STATE or RING is fp16 (PMN1, PMN4)
#   PM_FTZ (...)      flush to zero below 2^-126 (ex2.approx.ftz, the MMA): a value lost there is < 2^-126
#                     times the operands' magnitudes (|S0| and U = sum_j |u_j||k_j|), 16 such ops at most
#   u_ST (|S| + rest) the one rounding to STATE of a value within `rest` of S (PMN4): |round(x) - x| <= u |x|
# With u_ST = u(STATE), u_RG = u(RING) (2^-8 bf16, 2^-11 fp16).  count == 0 is an exact copy (PMS2): bits.
PM_FP16_FLOOR = 2.0**-25
PM_FTZ = 16 * F32_FTZ
PM_TERMS = "u_ST(|S|+r) + r, r = u_RG W + (2^-21 + 2^-23 A + 2^-19 + 2^-24) M + delta (PMN5)"


def prefix_bound(arm: Arm | str, S, M, W, U, A, ksum, S0_abs) -> torch.Tensor:
    """The allowed |S_kernel - S| per element of a materialized state (the table above)."""
    arm = get_arm(arm) if isinstance(arm, str) else arm
    u_st, u_rg = unit_roundoff(arm.state), unit_roundoff(arm.ring)
    rest = u_rg * W + (2.0**-21 + 2.0**-23 * A[..., None, None] + 2.0**-19 + 2.0**-24) * M
    if torch.float16 in (arm.state, arm.ring):
        rest = rest + PM_FP16_FLOOR * (1.0 + ksum[..., None, :])
    rest = rest + PM_FTZ * (1.0 + S0_abs + U)
    return u_st * (S.abs() + rest) + rest
