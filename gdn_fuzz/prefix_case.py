"""PrefixCase: one call of FlashInfer 0.7.4's gdn_prefix_materialize, as plain data, and its tensors.

The prefix materializer (kernel-contract-0.7.4.md section 2, PM*) rebuilds request b's state after
the first count[b] entries of its src slot's ring and writes it into the dst slot of the same pool:

    state[dst] <- round_STATE(e^{G_C} S0 + sum_{j<C} e^{G_C - g_j} u_j k_j^T),   G_C = g_{C-1}   (PMM3)

A PrefixCase holds the structure of one such call (the arm, the geometry, the ring depth R, each
request's src/dst/base/count and the live history P of its src ring, how the active list and
num_active are passed) and a seed; `materialize_prefix` makes the call's keyword arguments from the
seed, on the CPU generator, so the same case gives the same bits everywhere.  It is what a failure
prints, what the corpus stores (kind "materialize") and what `gdn-fuzz replay` re-runs, like a Case
of the flush kernel (gdn_fuzz.case); `load_case` reads either kind from its JSON.

What the tensors hold:
  state    randn * state_scale in the STATE dtype; with bits="all" the src checkpoint of every
           count == 0 request holds every 16-bit pattern once per 65,536 elements (PMS2's promise
           is over every bit pattern a state can hold: signed zeros, Inf, NaN payloads, subnormals)
  rings    k: l2-normalized random keys, u: randn * v_scale, both in the RING dtype; g (fp32): on
           each src slot's live window [base, base + P) a decreasing cumulative log-decay from 0
           (the records a decode launch leaves, M6), random negative garbage elsewhere
  poison   (regime.poison) NaN in every ring slot outside the live windows of the src slots a
           processed request reads, and in every pool slot no processed request reads from
           (the destinations included: the kernel must overwrite all of them): PMM3's NaN safety
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch

from gdn_fuzz.arms import ARM_NAMES, Arm, get_arm
from gdn_fuzz.case import CASE_VERSION, INT32, MAX_POOL, MAX_ROWS, W_RING, Case, _bounded, case_fields
from gdn_fuzz.oracles import gdn as gdn_oracle

KIND = "materialize"
RINGS = (16, 32)  # the STP and MTP ring depths (PMS8); the kernel also takes 64, 128 ... (PMH9)
ACTIVE_MODES = ("derived", "list", "device")
# derived: active_request_indices=None, num_active=None (the wrapper derives both on the host, 710-726)
# list:    the list given (live rows first, in `order`, then -1), num_active=None (the wrapper covers B)
# device:  both given as tensors (the CUDA-graph path; num_active = the live count + num_active_slack)
PM_DECAYS = {"normal": (0.05, 1.0), "weak": (1e-4, 1e-3), "strong": (1.0, 8.0), "vanishing": (13.0, 61.0)}
BITS = ("random", "all")
MAX_SCALE = 1e6
NUM_ACTIVE_SLACK = (-MAX_ROWS, MAX_ROWS)  # negative: a num_active below the live count (PMS4 drops rows)


@dataclass(frozen=True)
class Request:
    """One batch row: read the checkpoint at src, replay `count` ring entries from `base`, write dst.

    hist: the live history P of src's ring (the window [base, base + P) holds records; the caller's
    promise is count <= P, PMM4).  Requests that share a src share its window (base and hist).
    Negative src, dst or count, or count > 16, is a skipped request (PMS1)."""

    src: int
    dst: int
    base: int = 0
    count: int = 0
    hist: int = 0


@dataclass(frozen=True)
class PrefixRegime:
    """How values are drawn: state_scale, v_scale (element stds), decay (the per-entry step of g:
    PM_DECAYS), poison (NaN outside the windows and in pool slots no request reads), bits ("all":
    the src checkpoints of count == 0 requests hold every 16-bit pattern)."""

    state_scale: float = 0.1
    v_scale: float = 1.0
    decay: str = "normal"
    poison: bool = False
    bits: str = "random"


@dataclass(frozen=True)
class PrefixCase:
    """One gdn_prefix_materialize call.  B = len(requests); the pool has `pool` slots; ring depth R."""

    arm: str
    H: int
    HV: int
    pool: int
    ring: int
    requests: tuple[Request, ...]
    seed: int
    active: str = "derived"
    order_seed: int = 0  # 0: live entries in index order; else a permutation drawn from it (PMR6)
    num_active_slack: int = 0  # active="device": num_active = live rows + this
    regime: PrefixRegime = field(default_factory=PrefixRegime)
    kind: str = KIND
    version: int = CASE_VERSION
    draws: str = "cpu"  # every value from one CPU generator (kept for the campaign's interface)

    K = 128
    V = 128

    @property
    def B(self) -> int:
        return len(self.requests)

    @property
    def arm_spec(self) -> Arm:
        return get_arm(self.arm)

    def live_rows(self) -> list[int]:
        """The rows the derived active list holds: count >= 0, in index order (PMS5)."""
        return [i for i, r in enumerate(self.requests) if r.count >= 0]

    def active_list(self) -> list[int] | None:
        """The active list passed to the kernel (None: derived by the wrapper)."""
        if self.active == "derived":
            return None
        live = self.live_rows()
        if self.order_seed:
            g = torch.Generator().manual_seed(self.order_seed)
            live = [live[i] for i in torch.randperm(len(live), generator=g).tolist()]
        return live + [-1] * (self.B - len(live))

    def num_active_value(self) -> int | None:
        """The num_active passed (None: the wrapper's own, live count or B)."""
        if self.active != "device":
            return None
        return len(self.live_rows()) + self.num_active_slack

    def row_kind(self, i: int) -> str:
        r = self.requests[i]
        if r.src < 0 or r.dst < 0 or r.count < 0 or r.count > W_RING:
            return "skip"
        return "copy" if r.count == 0 else "fold"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["draws"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def record_fields(self) -> dict:
        """What a campaign's per-example record says of this case."""
        return dict(kind=KIND, arm=self.arm, H=self.H, HV=self.HV, B=self.B, pool=self.pool, ring=self.ring,
                    active=self.active, requests=[[r.src, r.dst, r.base, r.count, r.hist] for r in self.requests],
                    regime=self.regime.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "PrefixCase":
        return cls(**case_fields(d, cls, "requests", Request, PrefixRegime)).validate()

    def validate(self) -> "PrefixCase":
        """Each field against its bounds; ValueError naming the field, its value and the legal range."""
        if self.kind != KIND:
            raise ValueError(f"case.kind={self.kind!r} is illegal for a PrefixCase; legal: {KIND!r}")
        if self.version != CASE_VERSION:
            raise ValueError(f"case.version={self.version!r} is not supported; legal: {CASE_VERSION}")
        if not isinstance(self.arm, str) or self.arm not in ARM_NAMES:
            raise ValueError(f"case.arm={self.arm!r} is illegal; legal: one of {', '.join(ARM_NAMES)}")
        _bounded("case.H", self.H, 1, 64)
        _bounded("case.HV", self.HV, 1, 128)
        if self.HV % self.H:
            raise ValueError(f"case.HV={self.HV} is illegal for H={self.H}; legal: a multiple of H")
        _bounded("case.pool", self.pool, 1, MAX_POOL)
        if self.ring not in RINGS:
            raise ValueError(f"case.ring={self.ring!r} is illegal; legal: one of {', '.join(map(str, RINGS))}")
        if not isinstance(self.requests, tuple) or not 1 <= len(self.requests) <= MAX_ROWS:
            raise ValueError(f"case.requests must be a tuple of 1 to {MAX_ROWS} Request")
        windows: dict[int, tuple[int, int]] = {}
        for i, r in enumerate(self.requests):
            _bounded(f"case.requests[{i}].src", r.src, INT32[0], self.pool - 1, f"below pool={self.pool}; negative: skipped")
            _bounded(f"case.requests[{i}].dst", r.dst, INT32[0], self.pool - 1, f"below pool={self.pool}; negative: skipped")
            _bounded(f"case.requests[{i}].base", r.base, INT32[0], INT32[1] - 1)
            _bounded(f"case.requests[{i}].count", r.count, -64, 64)
            _bounded(f"case.requests[{i}].hist", r.hist, 0, W_RING)
            if r.src >= 0:
                w = windows.setdefault(r.src, (r.base, r.hist))
                if w != (r.base, r.hist):
                    raise ValueError(f"case.requests[{i}] reads src={r.src} with base={r.base}, hist={r.hist}; an earlier "
                                     f"request reads it with base={w[0]}, hist={w[1]}: requests sharing a src share its window")
        if self.active not in ACTIVE_MODES:
            raise ValueError(f"case.active={self.active!r} is illegal; legal: one of {', '.join(ACTIVE_MODES)}")
        _bounded("case.order_seed", self.order_seed, 0, 2**63 - 1)
        _bounded("case.num_active_slack", self.num_active_slack, *NUM_ACTIVE_SLACK)
        _bounded("case.seed", self.seed, 0, 2**64 - 1)
        reg = self.regime
        if reg.decay not in PM_DECAYS:
            raise ValueError(f"case.regime.decay={reg.decay!r} is illegal; legal: one of {', '.join(PM_DECAYS)}")
        if reg.bits not in BITS:
            raise ValueError(f"case.regime.bits={reg.bits!r} is illegal; legal: one of {', '.join(BITS)}")
        for name in ("state_scale", "v_scale"):
            x = getattr(reg, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and 0 < x <= MAX_SCALE):
                raise ValueError(f"case.regime.{name}={x!r} is illegal; legal: a finite number in (0, {MAX_SCALE:g}]")
        if not isinstance(reg.poison, bool):
            raise ValueError(f"case.regime.poison={reg.poison!r} is illegal; legal: true/false")
        nbytes = 4 * self.pool * (self.HV * self.V * self.K + self.ring * (self.H * self.K + self.HV * (self.V + 1)))
        if nbytes > 16 * 2**30:
            raise ValueError(f"case pool={self.pool}, HV={self.HV} needs ~{nbytes / 2**30:.1f} GiB; legal: <= 16 GiB")
        return self

    def describe(self) -> str:
        lines = [f"PrefixCase(arm={self.arm}, H={self.H}, HV={self.HV}, B={self.B}, pool={self.pool}, ring={self.ring}, "
                 f"active={self.active}" + (f", order_seed={self.order_seed}" if self.order_seed else "")
                 + (f", num_active={self.num_active_value()} (live {len(self.live_rows())} + {self.num_active_slack})"
                    if self.active == "device" else "") + f", seed={self.seed})",
                 f"  regime: {self.regime}"]
        lst = self.active_list()
        if lst is not None:
            lines.append(f"  active_request_indices: {lst}")
        for i, r in enumerate(self.requests):
            edge = []
            b = r.base & (self.ring - 1)
            if 0 < r.count <= W_RING and b + r.count > self.ring:
                edge.append(f"window wraps past slot {self.ring - 1}: base {b} + count {r.count} > {self.ring}")
            if r.count > r.hist and r.count <= W_RING and r.src >= 0:
                edge.append(f"count {r.count} > hist {r.hist}: past the live window")
            if r.src >= 0 and r.src == r.dst:
                edge.append("dst == src (in place, not promised: PMR1)")
            lines.append(f"  request {i}: src={r.src:>3} dst={r.dst:>3} base={r.base:>2} count={r.count:>2} "
                         f"hist={r.hist:>2}  {self.row_kind(i)}" + (f"  ({'; '.join(edge)})" if edge else ""))
        return "\n".join(lines)


def load_case(d: dict):
    """The Case or PrefixCase stored as `d` (its "kind": "materialize" for the prefix materializer, absent
    for the flush kernel), validated before anything is allocated; ValueError naming the field otherwise."""
    if isinstance(d, dict) and d.get("kind") == KIND:
        return PrefixCase.from_dict(d)
    return Case.from_dict(d)


def is_prefix(case) -> bool:
    return isinstance(case, PrefixCase)


# ------------------------------------------------------------------ materialization


def _all_bits(n: int, gen, dtype: torch.dtype) -> torch.Tensor:
    """n 16-bit patterns covering all 65,536 once per 65,536 elements, in a seeded order."""
    perm = torch.randperm(65536, generator=gen).to(torch.int32)
    pats = perm.repeat((n + 65535) // 65536)[:n]
    return (pats - 65536 * (pats >= 32768).int()).to(torch.int16).view(dtype)


def windows_of(case: PrefixCase) -> dict[int, tuple[int, int]]:
    """src slot -> (base, hist) of every request with src >= 0."""
    out: dict[int, tuple[int, int]] = {}
    for r in case.requests:
        if r.src >= 0:
            out.setdefault(r.src, (r.base, r.hist))
    return out


def processed_rows(case: PrefixCase) -> list[int]:
    """The rows the kernel processes (PMM1, PMM2, PMS1, PMS3, PMS4): the first min(num_active, B) entries
    of the active list (derived: rows with count >= 0), less -1 entries and skipped requests."""
    lst = case.active_list()
    if lst is None:
        lst = case.live_rows() + [-1] * (case.B - len(case.live_rows()))
        n = len(case.live_rows())
    else:
        na = case.num_active_value()
        n = case.B if na is None else na
    n = max(0, min(n, case.B))
    return [p for p in lst[:n] if p >= 0 and case.row_kind(p) != "skip"]


def materialize_prefix(case: PrefixCase, device: str | torch.device = "cpu") -> dict:
    """The keyword arguments of the call, generated from case.seed on the CPU, then moved to `device`."""
    arm = case.arm_spec
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(case.seed)
    NP, H, HV, R, K, V = case.pool, case.H, case.HV, case.ring, case.K, case.V
    reg = case.regime
    state = (torch.randn(NP, HV, V, K, generator=gen) * reg.state_scale).to(arm.state)
    k_cache = gdn_oracle.l2norm(torch.randn(NP, H, R, K, generator=gen)).float()
    u_cache = torch.randn(NP, HV, R, V, generator=gen) * reg.v_scale
    g_cache = -torch.rand(NP, HV, R, generator=gen) * 4.0
    lo, hi = PM_DECAYS[reg.decay]
    steps = torch.empty(NP, HV, W_RING).uniform_(lo, hi, generator=gen)
    win = windows_of(case)
    for s, (base, hist) in win.items():  # the live window: G_j = -(steps_0 + ... + steps_j), decreasing from the checkpoint
        if hist:
            slots = (base + torch.arange(hist)) & (R - 1)
            g_cache[s][:, slots] = -torch.cumsum(steps[s, :, :hist], -1)
    if reg.bits == "all":  # the sources only count == 0 requests read (a fold of NaN or Inf has no finite oracle)
        folded = {r.src for i, r in enumerate(case.requests) if case.row_kind(i) == "fold"}
        for s in sorted({r.src for r in case.requests if r.count == 0 and r.src >= 0} - folded):
            state[s] = _all_bits(HV * V * K, gen, arm.state).view(HV, V, K)
    if reg.poison:
        read = {case.requests[i].src for i in processed_rows(case)}
        keep = torch.zeros(NP, R, dtype=torch.bool)
        for s in read:
            base, hist = win[s]
            keep[s, (base + torch.arange(hist)) & (R - 1)] = True
        k_cache.masked_fill_(~keep[:, None, :, None], float("nan"))
        u_cache.masked_fill_(~keep[:, None, :, None], float("nan"))
        g_cache.masked_fill_(~keep[:, None, :], float("nan"))
        unread = torch.ones(NP, dtype=torch.bool)
        unread[list(read)] = False
        state[unread] = float("nan")
    i32 = dict(dtype=torch.int32)
    lst, na = case.active_list(), case.num_active_value()
    return dict(
        state=state.to(dev),
        src_slots=torch.tensor([r.src for r in case.requests], **i32).to(dev),
        dst_slots=torch.tensor([r.dst for r in case.requests], **i32).to(dev),
        k_cache=k_cache.to(arm.ring).to(dev), u_cache=u_cache.to(arm.ring).to(dev), g_cache=g_cache.to(dev),
        cache_base=torch.tensor([r.base for r in case.requests], **i32).to(dev),
        count=torch.tensor([r.count for r in case.requests], **i32).to(dev),
        active_request_indices=None if lst is None else torch.tensor(lst, **i32).to(dev),
        num_active=None if na is None else torch.tensor([na], **i32).to(dev),
    )


__all__ = ["PrefixCase", "Request", "PrefixRegime", "load_case", "is_prefix", "materialize_prefix",
           "processed_rows", "windows_of", "KIND", "RINGS", "ACTIVE_MODES", "PM_DECAYS", "BITS"]
