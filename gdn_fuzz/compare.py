"""Per-arm tolerance table: how far a target may sit from the float64 oracle.

The metric (checks.rel_to_magnitude) is, per (row, head), the Frobenius norm of the error
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
to y, u and fold and 2^-24 to k; bf16's subnormals sit at 2^-133 (atol 0 in practice).

Measured evidence is recorded beside each arm in docs/tolerances.md (H200 maxima over
the recorded campaigns).  A bound is never raised to make a test pass: a target outside
it is a finding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_fuzz.arms import ARMS, Arm, get_arm, unit_roundoff

OUTPUTS = ("y", "u", "k", "g", "fold")

# roundings counted per output (see the module docstring)
C_Y, C_U, C_K, C_FOLD = 4.0, 4.0, 2.0, 3.0
G_RTOL = 2.0**-16
G_ABS_PER_TOKEN = 2.0**-23  # x e^{A_log}: 2 x the 2^-24 rounding of 1 + e^x in f32
FP16_SUBNORMAL = 2.0**-24  # spacing of fp16 subnormals
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
    tiny = FP16_SUBNORMAL if has_fp16 else 0.0
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
