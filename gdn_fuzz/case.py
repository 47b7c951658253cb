"""Case: a small, serializable description of one launch, and its materialization.

Hypothesis draws the structure (geometry, arm, rows, cursors, flush_min, value regime,
seed); `materialize` turns it into tensors with a seeded torch generator on the CPU and
moves them to the target's device, so the same Case gives the same bits everywhere.
A Case is what a failure prints, what the corpus stores and what `gdn-fuzz replay` re-runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch

from .arms import Arm, get_arm
from .oracles import gdn as gdn_oracle

CASE_VERSION = 1
RING_SLOTS = 32
W_RING = 16


@dataclass(frozen=True)
class Row:
    """One batch row: pool slot (negative = pad row, M8), hist_len P, cache_base."""

    slot: int
    hist_len: int = 0
    cache_base: int = 0

    @property
    def pad(self) -> bool:
        return self.slot < 0


@dataclass(frozen=True)
class Regime:
    """How values are drawn.  Every field is a name a human can read in a failing case.

    qk_scale    element std of q and k before normalization ("tiny" and "huge" norms)
    v_scale     element std of v;  state_scale: element std of the checkpoints
    decay       weak | normal | strong   (A_log, dt_bias and a together set g, M1)
    beta        near0 | mid | near1      (b, through the sigmoid)
    keys        random | near_dup | zero_norm
    history     consistent (window records produced by the oracle from earlier tokens)
                | free (random normalized keys, random updates, decreasing G)
    poison      fill every ring slot outside the windows, g included, and the pool rows
                of slots no row uses, with NaN (R1: the launch must not read them)
    """

    qk_scale: float = 1.0
    v_scale: float = 1.0
    state_scale: float = 0.1
    decay: str = "normal"
    beta: str = "mid"
    keys: str = "random"
    history: str = "consistent"
    poison: bool = False


DECAYS = ("normal", "weak", "strong")  # first = where shrinking lands
BETAS = ("mid", "near0", "near1")
KEYS = ("random", "near_dup", "zero_norm")
HISTORIES = ("consistent", "free")


@dataclass(frozen=True)
class Case:
    """One launch of the entry point.  B = len(rows); the pool has `pool` slots."""

    arm: str
    T: int
    H: int
    HV: int
    pool: int
    rows: tuple[Row, ...]
    seed: int
    flush_min: int | None = None
    restart_hist_on_flush: bool = False
    regime: Regime = field(default_factory=Regime)
    K: int = 128
    V: int = 128
    version: int = CASE_VERSION

    @property
    def B(self) -> int:
        return len(self.rows)

    @property
    def arm_spec(self) -> Arm:
        return get_arm(self.arm)

    @property
    def fmin(self) -> int:
        """The flush threshold in force: flush_min, or the lazy default 17 - T."""
        return self.flush_min if self.flush_min is not None else W_RING - self.T + 1

    def row_kind(self, r: Row) -> str:
        if r.pad:
            return "pad"
        return "flush" if r.hist_len >= self.fmin else "verify"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        d = dict(d)
        ver = d.get("version", None)
        if ver != CASE_VERSION:
            raise ValueError(f"case version={ver!r} is not supported (this gdn_fuzz reads version {CASE_VERSION})")
        d["rows"] = tuple(Row(**r) for r in d["rows"])
        d["regime"] = Regime(**d.get("regime", {}))
        return cls(**d)

    def describe(self) -> str:
        """A few readable lines: geometry, arm, and one line per row."""
        lines = [f"Case(arm={self.arm}, T={self.T}, H={self.H}, HV={self.HV}, K={self.K}, V={self.V}, "
                 f"B={self.B}, pool={self.pool}, flush_min={self.fmin}, "
                 f"restart_hist_on_flush={self.restart_hist_on_flush}, seed={self.seed})",
                 f"  regime: {self.regime}"]
        for i, r in enumerate(self.rows):
            lines.append(f"  row {i}: slot={r.slot:>3} P={r.hist_len:>2} base={r.cache_base:>2}  {self.row_kind(r)}")
        return "\n".join(lines)


# ------------------------------------------------------------------ materialization


def _decay_params(regime: Regime, gen, B, T, HV):
    """(A_log [HV], dt_bias [HV], a [B, T, HV]) giving per-token g in the regime's range (M1).

    weak:   g ~ -1e-4 .. -1e-3 (memory kept for hundreds of tokens)
    normal: g ~ -0.05 .. -1    (Qwen3-Next-like: A = e^{A_log} in [0.5, 4])
    strong: g ~ -1 .. -8       (window contributions fall off by e^-8 per token)
    """
    if regime.decay == "weak":
        A = torch.empty(HV).uniform_(1e-3, 1e-2, generator=gen)
        a_mu = -3.0
    elif regime.decay == "normal":
        A = torch.empty(HV).uniform_(0.5, 4.0, generator=gen)
        a_mu = -2.0
    elif regime.decay == "strong":
        A = torch.empty(HV).uniform_(4.0, 16.0, generator=gen)
        a_mu = 0.5
    else:
        raise ValueError(f"regime.decay={regime.decay!r}; use one of {DECAYS}")
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    a = a_mu + torch.randn(B, T, HV, generator=gen)
    return torch.log(A), dt_bias, a


def _beta_logits(regime: Regime, gen, shape):
    mu = {"near0": -8.0, "mid": 0.0, "near1": 8.0}.get(regime.beta)
    if mu is None:
        raise ValueError(f"regime.beta={regime.beta!r}; use one of {BETAS}")
    return mu + torch.randn(shape, generator=gen) * 1.5


def _keys(regime: Regime, gen, shape):
    k = torch.randn(shape, generator=gen)
    if regime.keys == "near_dup":  # every token's key within 1e-3 of token 0's
        k = k[:, :1] + 1e-3 * k
    elif regime.keys == "zero_norm":  # tokens 1 and T-1 carry all-zero keys
        k[:, 1] = 0
        k[:, -1] = 0
    elif regime.keys != "random":
        raise ValueError(f"regime.keys={regime.keys!r}; use one of {KEYS}")
    return k * regime.qk_scale


def draw_tokens(reg: Regime, gen, B: int, T: int, H: int, HV: int, K: int, V: int):
    """One launch's token inputs from `gen`, in a fixed draw order (corpus entries rely on it).

    Returns float32 CPU tensors q, k [B, T, H, K], v [B, T, HV, V], A_log, dt_bias [HV], a, b [B, T, HV].
    """
    q = torch.randn(B, T, H, K, generator=gen) * reg.qk_scale
    k = _keys(reg, gen, (B, T, H, K))
    v = torch.randn(B, T, HV, V, generator=gen) * reg.v_scale
    A_log, dt_bias, a = _decay_params(reg, gen, B, T, HV)
    b = _beta_logits(reg, gen, (B, T, HV))
    return q, k, v, A_log, dt_bias, a, b


def materialize(case: Case, device: str | torch.device = "cpu") -> dict:
    """The keyword arguments of one entry-point call, generated from case.seed.

    Values are generated on the CPU (same bits on every device), rounded to the arm's
    dtypes, then moved to `device`.  Slots of the pool that no row uses, and ring slots
    outside every window, hold random values (or NaN with regime.poison).
    """
    arm = case.arm_spec
    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, HV, K, V, NP = case.B, case.T, case.H, case.HV, case.K, case.V, case.pool
    reg = case.regime
    q, k, v, A_log, dt_bias, a, b = draw_tokens(reg, gen, B, T, H, HV, K, V)
    pool = torch.randn(NP, HV, V, K, generator=gen) * reg.state_scale
    # ring garbage everywhere, then each row's window
    k_cache = gdn_oracle.l2norm(torch.randn(NP, H, RING_SLOTS, K, generator=gen)).float()
    u_cache = torch.randn(NP, HV, RING_SLOTS, V, generator=gen) * reg.v_scale
    g_cache = -torch.rand(NP, HV, RING_SLOTS, generator=gen) * 4.0
    A_io = A_log.to(arm.io)
    dt_io = dt_bias.to(arm.io)
    _fill_windows(case, gen, pool.to(arm.state), k_cache, u_cache, g_cache, A_io, dt_io)
    if reg.poison:
        _poison(case, pool, k_cache, u_cache, g_cache)
    dev = torch.device(device)
    idx = torch.tensor([r.slot for r in case.rows], dtype=torch.int32)
    return dict(
        A_log=A_log.to(arm.io).to(dev), dt_bias=dt_bias.to(arm.io).to(dev),
        a=a.to(arm.io).to(dev), b=b.to(arm.io).to(dev),
        q=q.to(arm.io).to(dev), k=k.to(arm.io).to(dev), v=v.to(arm.io).to(dev),
        initial_state_source=pool.to(arm.state).to(dev),
        initial_state_indices=idx.to(dev),
        k_cache=k_cache.to(arm.ring).to(dev), u_cache=u_cache.to(arm.ring).to(dev),
        g_cache=g_cache.float().to(dev),
        hist_len=torch.tensor([r.hist_len for r in case.rows], dtype=torch.int32, device=dev),
        cache_base=torch.tensor([r.cache_base for r in case.rows], dtype=torch.int32, device=dev),
        flush_min=case.flush_min,
        restart_hist_on_flush=case.restart_hist_on_flush,
    )


def _fill_windows(case: Case, gen, pool_state, k_cache, u_cache, g_cache, A_io, dt_io):
    """Write each non-pad row's P window records at slot (base + j) & 31, j < P.

    consistent: run W_RING history tokens through the float64 recurrence from the row's
    checkpoint and record (k_hat, U, G cumulative from the checkpoint), as earlier launches
    would have; free: random normalized keys, random updates, decreasing G.
    """
    arm = case.arm_spec
    live = [(i, r) for i, r in enumerate(case.rows) if not r.pad and r.hist_len > 0]
    n = len(live)
    H, HV, K, V = case.H, case.HV, case.K, case.V
    reg = case.regime
    # drawn for every case (even with no window) so that a row's values depend on the seed only
    hk = _keys(reg, gen, (max(n, 1), W_RING, H, K))
    hv_ = torch.randn(max(n, 1), W_RING, HV, V, generator=gen) * reg.v_scale
    _, _, ha = _decay_params(reg, gen, max(n, 1), W_RING, HV)
    hb = _beta_logits(reg, gen, (max(n, 1), W_RING, HV))
    if n == 0:
        return
    slots_ = torch.tensor([r.slot for _, r in live])
    if reg.history == "consistent":
        g, beta = gdn_oracle.gates(ha.to(arm.io), dt_io, A_io, hb.to(arm.io))
        _, k_hat = gdn_oracle.normalized_qk(hk.to(arm.io), hk.to(arm.io), HV, 1.0)
        S0 = pool_state[slots_].double()
        _, U, _ = gdn_oracle.sequential(S0, k_hat, k_hat, hv_.to(arm.io), g, beta)
        kw = k_hat[:, :, :: HV // H]  # [n, 16, H, K]
        Gc = torch.cumsum(g, 1)  # [n, 16, HV]
    elif reg.history == "free":
        kw = gdn_oracle.l2norm(hk)
        U = hv_.double() * 0.5
        g, _ = gdn_oracle.gates(ha.to(arm.io), dt_io, A_io, hb.to(arm.io))
        Gc = torch.cumsum(g, 1)
    else:
        raise ValueError(f"regime.history={reg.history!r}; use one of {HISTORIES}")
    for m, (_, r) in enumerate(live):
        s = (r.cache_base + torch.arange(r.hist_len)) & (RING_SLOTS - 1)
        k_cache[r.slot][:, s] = kw[m, : r.hist_len].permute(1, 0, 2).float()
        u_cache[r.slot][:, s] = U[m, : r.hist_len].permute(1, 0, 2).float()
        g_cache[r.slot][:, s] = Gc[m, : r.hist_len].permute(1, 0).float()


def _poison(case: Case, pool, k_cache, u_cache, g_cache):
    """NaN in every ring slot outside the windows and in pool rows no batch row uses (R1)."""
    nan = float("nan")
    used = {r.slot for r in case.rows if not r.pad}
    for s in range(case.pool):
        if s not in used:
            pool[s] = nan
            k_cache[s] = nan
            u_cache[s] = nan
            g_cache[s] = nan
    for r in case.rows:
        if r.pad:
            continue
        keep = torch.zeros(RING_SLOTS, dtype=torch.bool)
        keep[(r.cache_base + torch.arange(r.hist_len)) & (RING_SLOTS - 1)] = True
        k_cache[r.slot][:, ~keep] = nan
        u_cache[r.slot][:, ~keep] = nan
        g_cache[r.slot][:, ~keep] = nan


def default_scale(case: Case) -> float:
    return 1.0 / math.sqrt(case.K)
