"""The five legal dtype arms of the production module (contract D1, D2).

An arm is chosen by three environment variables read once at import.  Each arm here
names the exact env values that select it, and the torch dtypes it implies:
IO (q/k/v/a/b/output), STATE (pool), RING (u/k rings), PACK (stored q_hat/k_hat; fp16
only in the combined bf16/fp16/fp16 mode).  g_cache is always float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ENV_VARS = ("GDN_UCACHE_IO_DTYPE", "GDN_UCACHE_STATE_DTYPE", "GDN_UCACHE_RING_DTYPE")


@dataclass(frozen=True)
class Arm:
    name: str
    io: torch.dtype
    state: torch.dtype
    ring: torch.dtype
    env: tuple[tuple[str, str], ...]

    @property
    def pack(self) -> torch.dtype:
        """D2: q_hat/k_hat are stored fp16 only when both STATE and RING are fp16 under bf16 IO."""
        mixed = self.io == torch.bfloat16 and self.state == torch.float16 and self.ring == torch.float16
        return torch.float16 if mixed else self.io

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def __str__(self) -> str:
        return self.name


def _arm(name, io, state, ring, io_env, st_env, rg_env):
    return Arm(name, io, state, ring, tuple(zip(ENV_VARS, (io_env, st_env, rg_env))))


BF, FP = torch.bfloat16, torch.float16
ARMS: dict[str, Arm] = {a.name: a for a in (
    _arm("bf16", BF, BF, BF, "bf16", "", ""),
    _arm("bf16-state16", BF, FP, BF, "bf16", "fp16", ""),
    _arm("bf16-ring16", BF, BF, FP, "bf16", "", "fp16"),
    _arm("bf16-state16-ring16", BF, FP, FP, "bf16", "fp16", "fp16"),
    _arm("fp16", FP, FP, FP, "fp16", "", ""),
)}
ARM_NAMES = tuple(ARMS)


def get_arm(name: str) -> Arm:
    """Look an arm up by name, with a message that lists the legal ones."""
    try:
        return ARMS[name]
    except KeyError:
        raise ValueError(f"arm={name!r} is not a legal dtype arm; use one of {', '.join(ARM_NAMES)}") from None


def parse_arms(values) -> tuple[str, ...]:
    """Arm names from option values, each one name or several separated by commas ("bf16,fp16");
    an unknown name raises ValueError listing the legal ones (get_arm)."""
    arms = []
    for v in values:
        for name in v.split(","):
            if name.strip():
                get_arm(name.strip())
                arms.append(name.strip())
    return tuple(arms)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p for round-to-nearest with p significand bits (bf16: 2^-8, fp16: 2^-11, fp32: 2^-24)."""
    return {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]
