"""A serving-style step driver around the kernel, and the harness that checks it.

How this tests, in plain words
------------------------------
gdn_fuzz.serving.machine drives the kernel directly: one launch per step, cursors per batch row.
A serving engine does not call the kernel like that.  Between the engine's scheduler and
the kernel sits an *adapter* (shared/docs/replayssm-serving.md) that

  * unpacks token-major activations [N_tokens, ...] with query_start_loc into the padded
    [B, T, ...] layout, filling the lanes of rows with fewer than T real tokens with
    a = -inf (decay 1) and zero q/k/v/b (zero update), and gathers only the real tokens'
    outputs back (varlen, "ragged" rows);
  * pads the batch to a fixed bucket B with the engine's NULL block (block id 0) and
    translates block 0 into slot -1, the kernel's pad row (M8);
  * keeps the ring cursors (hist_len, cache_base) per pool block and gathers them into
    fixed-address per-row buffers every step (pad rows gather the NULL block's (0, 0));
  * runs L GDN layers (each with its own pool, rings and weights) on that one cursor set
    and commits it once per model step, after every layer (C3, restart_hist_on_flush=False);
  * resets a block's cursors to (0, 0) at the prefill -> decode handoff: on a request's
    first kernel step, on a recycled block, and on readmission after preemption.

`ServingAdapter` is that adapter, written as a serving engine would write it, with each
decision in a small method.  The planted adapter bugs (`PLANTED`: name -> (subclass, the
check that must catch it)) are subclasses that override one method with the realistic
wrong code path:

  null_block_as_slot_zero     block 0 passed through as slot 0 (no 0 -> -1)      null_block
  pad_lanes_zero_a            pad lanes zero-filled, a = 0 instead of -inf         pad_lanes
  right_aligned_gather        outputs gathered from the last n lanes of a row      ragged
  commit_per_layer            cursor commit after every layer, not once a step     trajectory
  no_reset_on_recycle         reset only on a block's first use                    trajectory
  reset_on_first_spec_decode  a second reset at the first decode row, after a
                              one-token prompt chunk went through the kernel       trajectory
  request_keyed_cursors       cursors keyed by request id, reset on a new id only
                              (stale on readmission)                               trajectory

`ServingRig` plays the engine around an adapter: it admits requests (optionally with a
one-token final prompt chunk handed to the decode kernel), preempts and readmits them,
retires them, and runs steps with drawn occupancy, ragged rows and acceptance.  Beside the
target's buffers it keeps, per request and per layer, a float64 *truth*: the plain
token-by-token recurrence (oracles.serving.sequential_decode / oracles.gdn.sequential) over
exactly the request's real, accepted tokens.  After every step it checks (clause ids from
shared/docs/kernel-contract.md):

  null_block  [M8] NULL-block / pad rows write nothing: every bit of every layer's pool and
              rings outside the blocks of this step's real rows is unchanged (block 0, idle
              and retired blocks included), and the output rows of pad rows keep their bits.
  pad_lanes   [M1, M3, M5] pad lanes never change any state: for every ragged row and layer,
              the state replayed (M3) from the target's checkpoint + ring with the window
              extended over the pad lanes' appended records equals the state with the window
              ending at the last real token (float64 replay; relative 1e-12 + 8 f32 ulps of
              the anchor G): a pad lane's record must be an identity update (g = 0, u = 0).
  ragged      [M4, M8] each real token's output (gathered back through query_start_loc)
              equals the float64 truth for that request and layer on its real tokens, within
              the drift budget of gdn_fuzz.serving.machine (DRIFT_C x u(arm) x sqrt(1 + age) relative to
              the magnitude of the terms that build y).
  trajectory  [M3, M6, M7, C3, C4] for every live request and every layer, the state rebuilt
              from the target's checkpoint + window (read through the adapter's cursors for
              that request) stays within the drift budget of the truth, and hist_len equals
              the tokens accepted since the last fold.  This is where one shared commit per
              step across L layers, the resets (first decode, recycled block, readmission) and
              the one-token prompt chunk are checked: a missed or extra reset, or a second
              commit, moves the rebuilt state O(1) away from the truth.

CUDA graphs: `GraphedServingAdapter` captures the L launches of one step once into a
torch.cuda.CUDAGraph over the adapter's fixed-address buffers and replays it every later
step (inputs, cursors, pad rows and acceptance change only the buffers' contents).  It runs
only on CUDA; on a CPU it raises GraphUnavailable.  Its test (eager vs replay, bitwise) has
not been run yet: it needs the H200 session.  Capture needs a target without host syncs
inside the launch: the production kernel with restart_hist_on_flush=False (what this
adapter uses); the reference target syncs (`bool(flush.any())`) and cannot be captured.

Entry points: `run_script(target, geo, events, ...)` drives a rig through a list of events
and raises HarnessFailure on the first finding (the property tests draw such scripts);
`harness_machine(target, arms, device, adapter_cls=...)` is the Hypothesis state machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gdn_fuzz.arms import get_arm
from gdn_fuzz.case import Regime, _decay_params, draw_tokens
from gdn_fuzz.checks import Finding, same_bits
from gdn_fuzz.compare import DRIFT_C, drift_unit
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.oracles.serving import StepInputs, sequential_decode
from gdn_fuzz.targets import Target
from gdn_fuzz.compare import table_for

RING_SLOTS = ring_oracle.RING_SLOTS
W_RING = ring_oracle.W_RING
K_DIM = V_DIM = 128
NULL_BLOCK = 0
ALL_CHECKS = frozenset({"null_block", "pad_lanes", "ragged", "trajectory"})
PAD_LANE_RTOL = 1e-12  # float64 replay: a pad lane adds exact zeros, so only summation noise


# ------------------------------------------------------------------ geometry


@dataclass(frozen=True)
class ServingGeometry:
    """What stays fixed for one engine run.

    blocks: pool rows per layer, block 0 being the engine's NULL block (never a request's);
    B: the batch bucket (CUDA-graph size) the adapter pads every step to; layers: GDN layers
    sharing one cursor set; flush_min: one value for all layers (C3).
    """

    arm: str = "bf16"
    T: int = 4
    H: int = 1
    HV: int = 2
    layers: int = 2
    blocks: int = 6
    B: int = 4
    flush_min: int | None = None  # None: the lazy rule 17 - T
    regime: Regime = field(default_factory=Regime)

    def __post_init__(self):
        if self.T not in (4, 8):
            raise ValueError(f"T={self.T}: the fused kernel supports T in (4, 8)")
        if not 1 <= self.fmin <= W_RING - self.T + 1:
            raise ValueError(f"flush_min={self.flush_min} out of [1, {W_RING - self.T + 1}]")
        if self.blocks < 2 or self.layers < 1 or self.B < 1 or self.HV % self.H:
            raise ValueError(f"bad geometry {self}")

    @property
    def fmin(self) -> int:
        return self.flush_min if self.flush_min is not None else W_RING - self.T + 1


@dataclass(frozen=True)
class Sched:
    """One scheduled request row, as the engine hands it to the adapter.

    kind: "decode" (1 + drafts tokens) or "chunk" (a one-token final prompt chunk that the
    engine routes through the decode kernel).
    """

    rid: int
    block: int
    kind: str = "decode"


@dataclass
class Packed:
    """One layer's token-major activations: q, k [N, H, K], v [N, HV, V], a, b [N, HV]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


# ------------------------------------------------------------------ the adapter


class ServingAdapter:
    """The layer between the engine and the kernel (module docstring), eager launches.

    Owns every layer's pool and rings (target dtypes, target device), the per-block cursor
    store, and the fixed-address per-row buffers a CUDA graph would capture.
    """

    PAD_A = float("-inf")  # a for pad lanes: softplus(-inf) = 0, so g = 0 (decay 1)

    def __init__(self, target: Target, geo: ServingGeometry, device: str = "cpu", seed: int = 0):
        self.target, self.geo, self.device = target, geo, torch.device(device)
        arm = self.arm = get_arm(geo.arm)
        gen = torch.Generator().manual_seed(seed)
        L, NB, B, T, H, HV, K, V = geo.layers, geo.blocks, geo.B, geo.T, geo.H, geo.HV, K_DIM, V_DIM
        dev = self.device
        self.A_log, self.dt_bias = [], []
        self.pool, self.k_cache, self.u_cache, self.g_cache = [], [], [], []
        for _ in range(L):
            A_log, dt_bias, _ = _decay_params(geo.regime, gen, 1, 1, HV)
            self.A_log.append(A_log.to(arm.io).to(dev))
            self.dt_bias.append(dt_bias.to(arm.io).to(dev))
            # garbage everywhere (a recycled block must never expose it)
            self.pool.append((torch.randn(NB, HV, V, K, generator=gen) * geo.regime.state_scale).to(arm.state).to(dev))
            self.k_cache.append(gdn_oracle.l2norm(torch.randn(NB, H, RING_SLOTS, K, generator=gen)).to(arm.ring).to(dev))
            self.u_cache.append(torch.randn(NB, HV, RING_SLOTS, V, generator=gen).to(arm.ring).to(dev))
            self.g_cache.append((-torch.rand(NB, HV, RING_SLOTS, generator=gen) * 4.0).float().to(dev))
        # per-block cursor store: legal garbage (torch.empty-like) except the NULL block's (0, 0)
        self.blk_hist = torch.randint(0, W_RING - T + 1, (NB,), generator=gen, dtype=torch.int32).to(dev)
        self.blk_base = torch.randint(0, RING_SLOTS, (NB,), generator=gen, dtype=torch.int32).to(dev)
        self.blk_hist[NULL_BLOCK] = 0
        self.blk_base[NULL_BLOCK] = 0
        # fixed-address per-row buffers (what a CUDA graph captures)
        self.q_buf = [torch.zeros(B, T, H, K, dtype=arm.io, device=dev) for _ in range(L)]
        self.k_buf = [torch.zeros(B, T, H, K, dtype=arm.io, device=dev) for _ in range(L)]
        self.v_buf = [torch.zeros(B, T, HV, V, dtype=arm.io, device=dev) for _ in range(L)]
        self.a_buf = [torch.zeros(B, T, HV, dtype=arm.io, device=dev) for _ in range(L)]
        self.b_buf = [torch.zeros(B, T, HV, dtype=arm.io, device=dev) for _ in range(L)]
        self.out_buf = [torch.zeros(B, T, HV, V, dtype=arm.io, device=dev) for _ in range(L)]
        self.idx_buf = torch.full((B,), -1, dtype=torch.int32, device=dev)
        self.hist_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self.base_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self.acc_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self.scale = 1.0 / math.sqrt(K)
        self._pending_reset: set[int] = set()  # blocks whose next kernel step is a handoff
        self._rows: list[Sched] = []

    # ---------------------------------------------------------------- engine events
    def assign(self, rid: int, block: int) -> None:
        """A request (new, or readmitted after preemption) now owns `block`; the engine has
        written its prefilled checkpoint into every layer's pool row.  Its next kernel step
        is the prefill -> decode handoff: cursors (0, 0)."""
        if block == NULL_BLOCK:
            raise ValueError("block 0 is the NULL block")
        self._pending_reset.add(block)

    def release(self, rid: int, block: int) -> None:
        """The request left `block` (retired or preempted); the ring stays as garbage."""

    # ---------------------------------------------------------------- decisions (bug sites)
    def _slot_indices(self, blocks: torch.Tensor) -> torch.Tensor:
        """Engine block ids -> kernel slot indices: the NULL block 0 becomes -1 (pad row, M8)."""
        return torch.where(blocks == NULL_BLOCK, torch.full_like(blocks, -1), blocks)

    def _needs_reset(self, row: Sched) -> bool:
        """The handoff: the first kernel step after assign(), whatever the row's kind."""
        return row.block in self._pending_reset

    def _reset_cursors(self, row: Sched) -> None:
        self.blk_hist[row.block] = 0
        self.blk_base[row.block] = 0

    def _load_cursors(self, rows: list[Sched]) -> None:
        """Gather block-keyed cursors into the fixed per-row buffers; pad rows gather the
        NULL block's (0, 0)."""
        blocks = torch.tensor([r.block for r in rows] + [NULL_BLOCK] * (self.geo.B - len(rows)),
                              dtype=torch.long, device=self.device)
        self.hist_buf.copy_(self.blk_hist[blocks])
        self.base_buf.copy_(self.blk_base[blocks])

    def _store_cursors(self, rows: list[Sched], hist: torch.Tensor, base: torch.Tensor) -> None:
        """Scatter committed cursors of the real rows back to their blocks (pads are dropped)."""
        n = len(rows)
        if n:
            blocks = torch.tensor([r.block for r in rows], dtype=torch.long, device=self.device)
            self.blk_hist[blocks] = hist[:n].to(torch.int32)
            self.blk_base[blocks] = base[:n].to(torch.int32)

    def _commit(self) -> None:
        """C3 on the per-row buffers with acc_buf, then scatter to the blocks."""
        hist, base = commits.caller_commit(self.hist_buf, self.base_buf, self.acc_buf, self.geo.fmin)
        self.hist_buf.copy_(hist)
        self.base_buf.copy_(base)
        self._store_cursors(self._rows, self.hist_buf, self.base_buf)

    def _after_layer(self, layer: int) -> None:
        """Nothing: the cursors are shared by every layer and committed once per step."""

    def _after_step(self) -> None:
        self._commit()

    def _unpack(self, layer: int, x: torch.Tensor, buf: torch.Tensor, lanes, mask, pad_value: float) -> None:
        """Token-major [N, ...] -> padded [B, T, ...] in place: real lanes copied, the rest pad_value."""
        n_rows = lanes.shape[0]
        buf.fill_(pad_value)
        if n_rows and x.shape[0]:
            gathered = x[lanes[mask]]
            view = buf[:n_rows]
            view[mask] = gathered.to(buf.dtype)

    def _gather_outputs(self, layer: int, mask: torch.Tensor) -> torch.Tensor:
        """Real tokens' outputs, token-major [N, HV, V] (query_start_loc order)."""
        return self.out_buf[layer][: mask.shape[0]][mask].clone()

    # ---------------------------------------------------------------- the step
    def cursor(self, rid: int, block: int) -> tuple[int, int]:
        """The committed (hist_len, cache_base) the adapter would use for this request next."""
        return int(self.blk_hist[block]), int(self.blk_base[block])

    def stage(self, rows: list[Sched], acts: list[Packed], query_start_loc: torch.Tensor,
              accepted: torch.Tensor):
        """Everything before the launches: resets, cursor gather, slot indices, padded inputs.
        Returns the [R, T] real-lane mask."""
        geo, dev = self.geo, self.device
        R, B, T = len(rows), geo.B, geo.T
        if R > B:
            raise ValueError(f"{R} rows do not fit the bucket B={B}")
        if len({r.block for r in rows}) != R:
            raise ValueError("two rows share a block (R3)")
        self._rows = list(rows)
        for r in rows:
            if self._needs_reset(r):
                self._reset_cursors(r)
        self._pending_reset -= {r.block for r in rows}
        self._load_cursors(rows)
        blocks = torch.tensor([r.block for r in rows] + [NULL_BLOCK] * (B - R), dtype=torch.int32, device=dev)
        self.idx_buf.copy_(self._slot_indices(blocks))
        qsl = query_start_loc.to(dev).long()
        n_real = qsl[1:] - qsl[:-1]
        if bool(((n_real < 1) | (n_real > T)).any()):
            raise ValueError(f"rows must carry 1..T={T} tokens; got {n_real.tolist()}")
        j = torch.arange(T, device=dev)
        lanes = qsl[:-1, None] + j[None, :]  # [R, T] token id of lane j
        mask = j[None, :] < n_real[:, None]
        for l, x in enumerate(acts):
            self._unpack(l, x.q, self.q_buf[l], lanes, mask, 0.0)
            self._unpack(l, x.k, self.k_buf[l], lanes, mask, 0.0)
            self._unpack(l, x.v, self.v_buf[l], lanes, mask, 0.0)
            self._unpack(l, x.a, self.a_buf[l], lanes, mask, self.PAD_A)
            self._unpack(l, x.b, self.b_buf[l], lanes, mask, 0.0)
        acc = torch.zeros(B, dtype=torch.int32, device=dev)
        acc[:R] = accepted.to(dev).to(torch.int32)
        self.acc_buf.copy_(acc)
        return mask

    def launch_layer(self, l: int) -> None:
        self.target.launch(
            self.geo.arm, q=self.q_buf[l], k=self.k_buf[l], v=self.v_buf[l], a=self.a_buf[l], b=self.b_buf[l],
            A_log=self.A_log[l], dt_bias=self.dt_bias[l], initial_state_source=self.pool[l],
            initial_state_indices=self.idx_buf, k_cache=self.k_cache[l], u_cache=self.u_cache[l],
            g_cache=self.g_cache[l], hist_len=self.hist_buf, cache_base=self.base_buf,
            output=self.out_buf[l], scale=self.scale, flush_min=self.geo.fmin, restart_hist_on_flush=False)

    def run_layers(self) -> None:
        for l in range(self.geo.layers):
            self.launch_layer(l)
            self._after_layer(l)

    def step(self, rows: list[Sched], acts: list[Packed], query_start_loc: torch.Tensor,
             accepted: torch.Tensor) -> list[torch.Tensor]:
        """One model step: stage, L launches, one commit.  Returns each layer's real outputs
        token-major [N, HV, V].  `accepted` [R] counts accepted tokens per real row (C4)."""
        mask = self.stage(rows, acts, query_start_loc, accepted)
        self.run_layers()
        outs = [self._gather_outputs(l, mask) for l in range(self.geo.layers)]
        self._after_step()
        return outs


class GraphUnavailable(RuntimeError):
    """CUDA-graph capture needs a CUDA device (and a CUDA build of torch)."""


class GraphedServingAdapter(ServingAdapter):
    """The same adapter with the L launches captured once into a torch.cuda.CUDAGraph.

    The first step runs eagerly on a side stream (compile + warm-up), the second captures,
    every later step only replays: staging writes new contents into the fixed-address
    buffers (inputs, slot indices with pad rows, gathered cursors, acceptance) and the
    commit runs eagerly after the replay.  CUDA only; NOT validated in the CPU session that
    wrote it (needs the H200 run).
    """

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise GraphUnavailable(f"CUDA graphs need a CUDA device; got device={self.device}")
        self.graph: torch.cuda.CUDAGraph | None = None
        self._warm = False
        self.replays = 0

    def run_layers(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return
        # the graph's launches leave hist/base alone (restart=False): warm-up then capture
        # would commit nothing twice, but they would append and fold twice, so save and
        # restore every buffer the launches write around the warm-up.
        saved = [t.clone() for t in (*self.pool, *self.k_cache, *self.u_cache, *self.g_cache, *self.out_buf)]
        s = torch.cuda.Stream(device=self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for l in range(self.geo.layers):
                self.launch_layer(l)  # compile / warm-up (not captured)
        torch.cuda.current_stream(self.device).wait_stream(s)
        torch.cuda.synchronize(self.device)
        for dst, src in zip((*self.pool, *self.k_cache, *self.u_cache, *self.g_cache, *self.out_buf), saved):
            dst.copy_(src)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for l in range(self.geo.layers):
                self.launch_layer(l)
        self.graph = g
        g.replay()  # capture does not execute: run this step's work once
        self.replays += 1


# ------------------------------------------------------------------ planted adapter bugs


class NullBlockAsSlotZero(ServingAdapter):
    """[M8] The NULL block id 0 is passed through as slot 0 (no 0 -> -1 translation): pad
    rows become live rows of pool row 0 and append into the NULL block's ring."""

    def _slot_indices(self, blocks):
        return blocks


class PadLanesZeroA(ServingAdapter):
    """[M1] Pad lanes get a = 0 (zero-filled like q/k/v/b) instead of -inf: g = -e^A ln 2,
    so a pad lane's record decays everything before it."""

    PAD_A = 0.0


class RightAlignedGather(ServingAdapter):
    """[M8] Outputs gathered from the last n lanes of each row (as if rows were left-padded):
    a ragged row returns pad lanes' outputs instead of its real tokens'."""

    def _gather_outputs(self, layer, mask):
        out = self.out_buf[layer][: mask.shape[0]]
        return out[mask.flip(1)].clone()


class CommitPerLayer(ServingAdapter):
    """[C3] The cursor commit runs after every layer instead of once per model step: layer
    l > 0 reads layer 0's committed cursors, and hist_len advances L times."""

    def _after_layer(self, layer):
        self._commit()

    def _after_step(self):
        pass


class NoResetOnRecycle(ServingAdapter):
    """[C2-C4 reset] Cursors are reset only when a block is handed out for the first time:
    a recycled block keeps the previous tenant's (hist_len, cache_base), so the new request
    replays the old tenant's ring on top of its own checkpoint."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._ever: set[int] = set()

    def assign(self, rid, block):
        if block not in self._ever:
            super().assign(rid, block)
        self._ever.add(block)


class ResetOnFirstSpecDecode(ServingAdapter):
    """[reset] The handoff reset is also done at a request's first *decode* row: a one-token
    final prompt chunk routed through the decode kernel is appended to the fresh ring, then
    the first real decode resets the cursors again and the token is lost."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._decoded: set[int] = set()

    def _needs_reset(self, row):
        first_decode = row.kind == "decode" and row.rid not in self._decoded
        if row.kind == "decode":
            self._decoded.add(row.rid)
        return super()._needs_reset(row) or first_decode


class RequestKeyedCursors(ServingAdapter):
    """[reset, C3] Cursors kept per request id instead of per pool block, reset the first
    time a request id is seen: a request readmitted after preemption (same id, freshly
    prefilled checkpoint) resumes its old cursors and replays stale ring records."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._by_rid: dict[int, tuple[int, int]] = {}

    def _needs_reset(self, row):
        return row.rid not in self._by_rid

    def _reset_cursors(self, row):
        self._by_rid[row.rid] = (0, 0)

    def _load_cursors(self, rows):
        B = self.geo.B
        cur = [self._by_rid[r.rid] for r in rows] + [(0, 0)] * (B - len(rows))
        self.hist_buf.copy_(torch.tensor([c[0] for c in cur], dtype=torch.int32))
        self.base_buf.copy_(torch.tensor([c[1] for c in cur], dtype=torch.int32))

    def _store_cursors(self, rows, hist, base):
        for i, r in enumerate(rows):
            self._by_rid[r.rid] = (int(hist[i]), int(base[i]))

    def cursor(self, rid, block):
        return self._by_rid.get(rid, (0, 0))


# planted bug -> the harness check that must catch it
PLANTED: dict[str, tuple[type[ServingAdapter], str]] = {
    "null_block_as_slot_zero": (NullBlockAsSlotZero, "null_block"),
    "pad_lanes_zero_a": (PadLanesZeroA, "pad_lanes"),
    "right_aligned_gather": (RightAlignedGather, "ragged"),
    "commit_per_layer": (CommitPerLayer, "trajectory"),
    "no_reset_on_recycle": (NoResetOnRecycle, "trajectory"),
    "reset_on_first_spec_decode": (ResetOnFirstSpecDecode, "trajectory"),
    "request_keyed_cursors": (RequestKeyedCursors, "trajectory"),
}


# ------------------------------------------------------------------ the engine + truth


@dataclass
class Request:
    rid: int
    block: int
    truth: list[torch.Tensor]  # per layer [HV, V, K] float64
    age: int = 0
    since_fold: int = 0
    chunk_pending: bool = False  # next step is a one-token final prompt chunk
    handed_off: bool = False  # had a kernel step since its last (re)admission


class HarnessFailure(AssertionError):
    """A serving-harness property broke; the message lists the findings and the state."""


class ServingRig:
    """The engine around an adapter, with per-request float64 truths and the checks."""

    def __init__(self, target: Target, geo: ServingGeometry, device: str = "cpu", seed: int = 0,
                 adapter_cls: type[ServingAdapter] = ServingAdapter, checks=ALL_CHECKS):
        self.geo, self.device = geo, torch.device(device)
        self.checks = frozenset(checks)
        if self.checks - ALL_CHECKS:
            raise ValueError(f"unknown checks {sorted(self.checks - ALL_CHECKS)}; use {sorted(ALL_CHECKS)}")
        self.ad = adapter_cls(target, geo, device, seed)
        self.arm = self.ad.arm
        self.u = drift_unit(self.arm)
        self.atol = table_for(self.arm)["fold"].atol
        self.requests: dict[int, Request] = {}  # rid -> request
        self.used: set[int] = set()
        self.next_rid = 0
        self.steps = self.flushes = self.recycles = self.preempts = self.ragged_rows = self.chunks = 0
        self.log: list[str] = []

    # ---------------------------------------------------------------- queries
    @property
    def held(self) -> set[int]:
        return {r.block for r in self.requests.values()}

    @property
    def free_blocks(self) -> list[int]:
        return [b for b in range(1, self.geo.blocks) if b not in self.held]

    @property
    def fresh_blocks(self) -> list[int]:
        return [b for b in self.free_blocks if b not in self.used]

    @property
    def recycled_blocks(self) -> list[int]:
        return [b for b in self.free_blocks if b in self.used]

    def can_admit(self) -> bool:
        return len(self.requests) < self.geo.B and bool(self.free_blocks)

    def describe(self) -> str:
        g = self.geo
        lines = [f"rig: adapter={type(self.ad).__name__} arm={g.arm} T={g.T} H={g.H} HV={g.HV} L={g.layers} "
                 f"blocks={g.blocks} B={g.B} flush_min={g.fmin} regime={g.regime}",
                 f"  steps={self.steps} flushes={self.flushes} recycles={self.recycles} preempts={self.preempts} "
                 f"ragged rows={self.ragged_rows} chunks={self.chunks}"]
        for r in self.requests.values():
            lines.append(f"  request {r.rid}: block={r.block} cursors={self.ad.cursor(r.rid, r.block)} "
                         f"age={r.age} since_fold={r.since_fold} chunk_pending={r.chunk_pending}")
        lines += ["  events: " + "; ".join(self.log[-12:])]
        return "\n".join(lines)

    # ---------------------------------------------------------------- engine events
    def _write_checkpoint(self, block: int, states: list[torch.Tensor]) -> None:
        for l, S in enumerate(states):
            self.ad.pool[l][block] = S.to(self.arm.state).to(self.device)

    def admit(self, block: int, seed: int, chunk: bool = False) -> int:
        """Prefill done: each layer's checkpoint is a drawn state (rounded to STATE).  With
        chunk=True the prompt's last token is still to come, as a one-token chunk routed
        through the decode kernel at the request's next step."""
        if block == NULL_BLOCK or block in self.held:
            raise ValueError(f"block {block} is not free")
        if not self.can_admit():
            raise ValueError("bucket full")
        gen = torch.Generator().manual_seed(seed)
        g = self.geo
        states = [(torch.randn(g.HV, V_DIM, K_DIM, generator=gen) * g.regime.state_scale).to(self.arm.state)
                  for _ in range(g.layers)]
        self._write_checkpoint(block, states)
        if block in self.used:
            self.recycles += 1
        rid = self.next_rid
        self.next_rid += 1
        self.requests[rid] = Request(rid, block, [S.double().to(self.device) for S in states], chunk_pending=chunk)
        self.used.add(block)
        self.ad.assign(rid, block)
        self.log.append(f"admit r{rid}->b{block}{' chunk' if chunk else ''}")
        return rid

    def retire(self, rid: int) -> None:
        r = self.requests.pop(rid)
        self.ad.release(rid, r.block)
        self.log.append(f"retire r{rid}")

    def preempt(self, rid: int, new_block: int) -> None:
        """Preempt, then readmit (recompute prefill): each layer's checkpoint in `new_block` is
        the truth rounded to STATE; the truth itself is unchanged."""
        r = self.requests[rid]
        if new_block != r.block and new_block in self.held:
            raise ValueError(f"block {new_block} is held")
        self.ad.release(rid, r.block)
        if new_block != r.block and new_block in self.used:
            self.recycles += 1
        r.block = new_block
        self._write_checkpoint(new_block, r.truth)
        r.since_fold = 0
        r.handed_off = False
        self.used.add(new_block)
        self.ad.assign(rid, new_block)
        self.preempts += 1
        self.log.append(f"preempt r{rid}->b{new_block}")

    # ---------------------------------------------------------------- one model step
    def step(self, seed: int, plan: list[tuple[int, int, int]]) -> list[Finding]:
        """plan: (rid, n_real, accepted) per scheduled request, in batch-row order.  A request
        with a pending one-token chunk runs (1 token, accepted 1) whatever the plan says."""
        g, ad, dev = self.geo, self.ad, self.device
        T, H, HV, L = g.T, g.H, g.HV, g.layers
        rows, n_real, acc = [], [], []
        for rid, n, a in plan:
            r = self.requests[rid]
            if r.chunk_pending:
                n, a, kind = 1, 1, "chunk"
                self.chunks += 1
            else:
                kind = "decode"
            if not (1 <= n <= T and 1 <= a <= n):
                raise ValueError(f"request {rid}: n_real={n}, accepted={a}; need 1 <= accepted <= n_real <= T")
            rows.append(Sched(rid, r.block, kind))
            n_real.append(n)
            acc.append(a)
        R = len(rows)
        self.log.append("step " + ",".join(f"r{x.rid}:{n}/{a}" for x, n, a in zip(rows, n_real, acc)))
        gen = torch.Generator().manual_seed(seed)
        io = lambda x: x.to(self.arm.io).to(dev)
        qsl = torch.zeros(R + 1, dtype=torch.long)
        qsl[1:] = torch.cumsum(torch.tensor(n_real, dtype=torch.long), 0)
        acts, real = [], []  # packed per layer; real[l][i] = dict of the row's real tokens
        for l in range(L):
            q, k, v, _, _, a, b = draw_tokens(g.regime, gen, max(R, 1), T, H, HV, K_DIM, V_DIM)
            q, k, v, a, b = (io(x) for x in (q, k, v, a, b))
            rr = [dict(q=q[i, :n], k=k[i, :n], v=v[i, :n], a=a[i, :n], b=b[i, :n]) for i, n in enumerate(n_real)]
            full = dict(q=q, k=k, v=v, a=a, b=b)
            packed = {name: (torch.cat([x[name] for x in rr]) if rr else full[name][0, :0]) for name in full}
            acts.append(Packed(**packed))
            real.append(rr)
        watched = self._snapshot()
        blocks_before = [x.block for x in rows]
        outs = ad.step(rows, acts, qsl, torch.tensor(acc, dtype=torch.int32))
        self.steps += 1
        findings: list[Finding] = []
        if "null_block" in self.checks:
            findings += self._check_null_block(watched, set(blocks_before), R)
        # ---- truth and output checks per row and layer
        for i, (x, n, a) in enumerate(zip(rows, n_real, acc)):
            r = self.requests[x.rid]
            s, e = int(qsl[i]), int(qsl[i + 1])
            for l in range(L):
                tok = real[l][i]
                S_next, y, y_mag = _truth_step(r.truth[l], tok, a, ad.A_log[l], ad.dt_bias[l], ad.scale)
                if "ragged" in self.checks:
                    findings += self._check_y(r, l, outs[l][s:e], y, y_mag, n)
                r.truth[l] = S_next
            r.age += 1
            r.chunk_pending = False
            self.ragged_rows += n < T
        if "pad_lanes" in self.checks:
            findings += self._check_pad_lanes(rows, n_real, acc)
        self._advance_since_fold(rows, acc)
        if "trajectory" in self.checks:
            findings += self._check_trajectory()
        return findings

    def _advance_since_fold(self, rows, acc):
        """C4 bookkeeping: tokens accepted since the checkpoint, reset by the lazy fold rule
        applied to the rig's own count (the adapter's cursors are what is checked)."""
        for x, a in zip(rows, acc):
            r = self.requests[x.rid]
            flushed = r.since_fold >= self.geo.fmin
            self.flushes += flushed
            r.since_fold = (0 if flushed else r.since_fold) + a
            r.handed_off = True

    # ---------------------------------------------------------------- checks
    def _snapshot(self):
        ad = self.ad
        return dict(pool=[t.clone() for t in ad.pool], k=[t.clone() for t in ad.k_cache],
                    u=[t.clone() for t in ad.u_cache], g=[t.clone() for t in ad.g_cache],
                    out=[t.clone() for t in ad.out_buf])

    def _check_null_block(self, before, blocks: set[int], R: int) -> list[Finding]:
        """[M8] bits outside this step's real blocks unchanged, in every layer; pad rows'
        output rows unchanged."""
        ad, out = self.ad, []
        keep = torch.ones(self.geo.blocks, dtype=torch.bool, device=self.device)
        keep[list(blocks)] = False
        for l in range(self.geo.layers):
            for name, now, was in (("pool", ad.pool[l], before["pool"][l]), ("k_cache", ad.k_cache[l], before["k"][l]),
                                   ("u_cache", ad.u_cache[l], before["u"][l]), ("g_cache", ad.g_cache[l], before["g"][l])):
                changed = ~same_bits(now, was)
                changed = changed.reshape(changed.shape[0], -1).any(1) & keep
                if bool(changed.any()):
                    bad = changed.nonzero().flatten().tolist()
                    out.append(Finding("harness.null_block", "M8",
                                       f"layer {l}: {name} of block(s) {bad} changed, but no real row of this step "
                                       f"holds them (block 0 is the NULL block: pad rows must write nothing)"))
            if R < self.geo.B and not bool(same_bits(ad.out_buf[l][R:], before["out"][l][R:]).all()):
                out.append(Finding("harness.null_block", "M8",
                                   f"layer {l}: output rows {R}..{self.geo.B - 1} of pad rows were written"))
        return out

    def _check_y(self, r: Request, l: int, got, want, mag, n: int) -> list[Finding]:
        """[M4, M8] real outputs vs the truth's y, per head, within the drift budget."""
        if tuple(got.shape) != tuple(want.shape):
            return [Finding("harness.ragged", "M8", f"request {r.rid} layer {l}: gathered outputs have shape "
                            f"{tuple(got.shape)}, expected {tuple(want.shape)} ({n} real tokens)")]
        err = (got.double() - want).pow(2).sum((0, 2)).sqrt()  # [HV]
        den = mag.pow(2).sum((0, 2)).sqrt()
        allowed = DRIFT_C * self.u * math.sqrt(1 + r.age) * den + self.atol * math.sqrt(n * V_DIM)
        ratio = torch.nan_to_num(err / allowed.clamp_min(1e-300), nan=float("inf"))
        if float(ratio.max()) <= 1.0:
            return []
        h = int(ratio.argmax())
        return [Finding("harness.ragged", "M4",
                        f"request {r.rid} (block {r.block}, {n} real tokens, age {r.age}) layer {l}: gathered "
                        f"outputs are {float(err[h]) / max(float(want[:, h].norm()), 1e-300):.3e} (relative) from "
                        f"the float64 truth on its real tokens", head=h, value=float(ratio[h]), tol=1.0)]

    def _rebuild(self, l: int, blocks, hist, base):
        """M3 replay of the given blocks of layer l: (S [n, HV, V, K], anchor G_P [n, HV]), float64."""
        ad, dev = self.ad, self.device
        idx = torch.tensor(blocks, dtype=torch.long, device=dev)
        P = torch.tensor(hist, dtype=torch.long, device=dev)
        bb = torch.tensor(base, dtype=torch.long, device=dev)
        k, u, G, valid = ring_oracle.gather_window(ad.k_cache[l], ad.u_cache[l], ad.g_cache[l], idx, P, bb, self.geo.HV)
        S, GP, _ = ring_oracle.replay(ad.pool[l][idx], k, u, G, valid, P)
        return S, GP

    def _check_pad_lanes(self, rows, n_real, acc) -> list[Finding]:
        """[M1, M3, M5] for every ragged row and layer: replaying the window up to the last
        pad lane equals replaying it up to the last real token.  The committed cursors give
        the window start (hist_len - accepted: 0 on a flush row, P on a verify row).

        Allowed relative difference: PAD_LANE_RTOL plus 8 fp32 ulps of the anchor |G_P|
        (2^-21 |G_P|): exact on the reference, and room for a kernel whose parallel scan
        groups the f32 sum of g differently once zeros are appended (N3).  A pad lane with
        a = 0 decays the state by e^{g} per lane (1 - e^{g} is ~3e-4 or more even under
        weak decay).
        """
        out = []
        T = self.geo.T
        sel = [(i, x) for i, x in enumerate(rows) if n_real[i] < T]
        if not sel:
            return out
        blocks, h_real, h_pad, bases = [], [], [], []
        for i, x in sel:
            P, base = self.ad.cursor(x.rid, x.block)  # committed: (start + accepted, base')
            start = P - acc[i]
            blocks.append(x.block)
            h_real.append(start + n_real[i])
            h_pad.append(start + T)
            bases.append(base)
        if min(h_real) < 0 or max(h_pad) > W_RING:
            return [Finding("harness.pad_lanes", "C4", f"cursors out of range for the pad-lane probe: "
                            f"{list(zip(blocks, h_real, h_pad, bases))}")]
        for l in range(self.geo.layers):
            S_real, _ = self._rebuild(l, blocks, h_real, bases)
            S_pad, GP = self._rebuild(l, blocks, h_pad, bases)
            err = (S_pad - S_real).pow(2).sum((-2, -1)).sqrt()
            den = S_real.pow(2).sum((-2, -1)).sqrt()
            rtol = PAD_LANE_RTOL + 2.0**-21 * GP.abs()  # [n, HV]
            ratio = torch.nan_to_num(err / (rtol * den).clamp_min(1e-300), nan=float("inf"))
            if float(ratio.max()) > 1.0:
                flat = int(ratio.argmax())
                j, h = divmod(flat, ratio.shape[1])
                i, x = sel[j]
                out.append(Finding("harness.pad_lanes", "M1",
                                   f"layer {l}, request {x.rid} ({n_real[i]} real of {T} lanes): replaying the pad "
                                   f"lanes' records changes the state by {float(err[j, h] / den[j, h]):.3e} (relative); "
                                   f"a pad lane must be an identity update (a = -inf, zero q/k/v/b)", head=h,
                                   value=float(ratio[j, h]), tol=1.0))
        return out

    def _check_trajectory(self) -> list[Finding]:
        """[M3, M6, M7, C3, C4] every live request, every layer: rebuilt state vs truth."""
        reqs = [r for r in self.requests.values() if r.handed_off]  # others: reset still pending
        if not reqs:
            return []
        out = []
        curs = [self.ad.cursor(r.rid, r.block) for r in reqs]
        for r, (P, base) in zip(reqs, curs):
            if not (0 <= P <= W_RING and 0 <= base < RING_SLOTS):
                return [Finding("harness.trajectory", "C4", f"request {r.rid}: cursors ({P}, {base}) out of range")]
        for r, (P, _) in zip(reqs, curs):
            if P != r.since_fold:
                out.append(Finding("harness.trajectory", "C4",
                                   f"request {r.rid} (block {r.block}): hist_len {P} != tokens accepted since "
                                   f"its checkpoint ({r.since_fold})"))
        blocks = [r.block for r in reqs]
        ages = torch.tensor([r.age for r in reqs], dtype=torch.float64, device=self.device)
        floor = self.atol * math.sqrt(V_DIM * K_DIM)
        for l in range(self.geo.layers):
            S, _ = self._rebuild(l, blocks, [c[0] for c in curs], [c[1] for c in curs])
            truth = torch.stack([r.truth[l] for r in reqs])
            err = (S - truth).pow(2).sum((-2, -1)).sqrt()
            den = truth.pow(2).sum((-2, -1)).sqrt()
            allowed = DRIFT_C * self.u * torch.sqrt(1 + ages)[:, None] * den + floor
            ratio = torch.nan_to_num(err / allowed.clamp_min(1e-300), nan=float("inf"))
            if float(ratio.max()) > 1.0:
                j, h = divmod(int(ratio.argmax()), ratio.shape[1])
                r = reqs[j]
                out.append(Finding("harness.trajectory", "M3",
                                   f"layer {l}, request {r.rid} (block {r.block}, cursors {curs[j]}, age {r.age}): "
                                   f"state rebuilt from checkpoint + window is "
                                   f"{float(err[j, h] / den[j, h].clamp_min(1e-300)):.3e} (relative) from the truth",
                                   head=h, value=float(ratio[j, h]), tol=1.0))
        return out


def _truth_step(S, tok: dict, accepted: int, A_log, dt_bias, scale: float):
    """Float64 truth for one request and layer on its n real tokens only.

    Returns (S after the accepted tokens [HV, V, K], y [n, HV, V], |terms| of y [n, HV, V])."""
    one = lambda x: x[None]
    inp = StepInputs(q=one(tok["q"]), k=one(tok["k"]), v=one(tok["v"]), a=one(tok["a"]), b=one(tok["b"]),
                     accepted=torch.tensor([accepted], device=S.device))
    S_next, y = sequential_decode(S[None], inp, A_log, dt_bias, scale)
    HV = tok["v"].shape[1]
    g, beta = gdn_oracle.gates(inp.a, dt_bias, A_log, inp.b)
    q_hat, k_hat = gdn_oracle.normalized_qk(inp.q, inp.k, HV, scale)
    y_mag, _, _ = gdn_oracle.sequential_magnitude(S[None].abs(), q_hat, k_hat, inp.v, g, beta)
    return S_next[0], y[0], y_mag[0]


def plan_rows(live: list, plan, T: int) -> list[tuple]:
    """A drawn step plan [(pick, real tokens, accepted)] -> rows (request id, n, accepted).

    Picks index the live requests cyclically; a request appears once; n is clamped to
    [1, T] and accepted to [1, n].
    """
    rows, seen = [], set()
    for i, n, a in plan:
        if not live:
            break
        rid = live[i % len(live)]
        if rid in seen:
            continue
        seen.add(rid)
        n = min(max(n, 1), T)
        rows.append((rid, n, min(max(a, 1), n)))
    return rows


def run_script(target: Target, geo: ServingGeometry, events: list[tuple], device: str = "cpu", seed: int = 0,
               adapter_cls: type[ServingAdapter] = ServingAdapter, checks=ALL_CHECKS) -> ServingRig:
    """Drive a rig through a list of events; raise HarnessFailure on the first finding.

    Events: ("admit", block | None | "recycled", seed, chunk) | ("retire", i) | ("preempt", i, block | None)
            | ("step", seed, [(i, n_real, accepted), ...])
    where i indexes the live requests in admission order (mod their count) and out-of-range
    n_real / accepted are clamped into 1 <= accepted <= n_real <= T; None blocks pick the
    lowest free block, "recycled" the lowest free block an earlier request used.  Events that cannot apply (no free block, no request) are skipped.
    """
    rig = ServingRig(target, geo, device, seed, adapter_cls, checks)
    T = geo.T
    for ev in events:
        live = sorted(rig.requests)
        if ev[0] == "admit":
            _, blk, s, chunk = ev
            if not rig.can_admit():
                continue
            free = rig.free_blocks
            if blk == "recycled":
                blk = (rig.recycled_blocks or free)[0]
            rig.admit(blk if blk in free else free[0], s, chunk)
        elif ev[0] == "retire" and live:
            rig.retire(live[ev[1] % len(live)])
        elif ev[0] == "preempt" and live:
            rid = live[ev[1] % len(live)]
            dest = [rig.requests[rid].block] + rig.free_blocks
            blk = ev[2] if ev[2] in dest else dest[0]
            rig.preempt(rid, blk)
        elif ev[0] == "step":
            _, s, plan = ev
            f = rig.step(s, plan_rows(live, plan, T))
            if f:
                raise HarnessFailure("\n".join([str(x) for x in f] + [rig.describe()]))
    return rig


# ------------------------------------------------------------------ the Hypothesis machine

HEADS = ((1, 2), (2, 4), (1, 1))  # (H, HV)


def harness_machine(target: Target, arms, device: str = "cpu", *, adapter_cls: type[ServingAdapter] = ServingAdapter,
                    checks=ALL_CHECKS, layers=(1, 2, 3), Ts=(4, 8), name: str = "ServingHarnessMachine"):
    """A RuleBasedStateMachine over ServingRig: admissions (fresh or recycled blocks, with or
    without a one-token final prompt chunk), retirements, preemptions with readmission, and
    steps with drawn occupancy (a subset of the live requests, in a drawn order, padded to
    the bucket with NULL-block rows), ragged rows and acceptance.  Every step runs `checks`
    (module docstring); a finding fails the run."""
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        precondition,
        rule,
    )

    arms, layers, Ts = tuple(arms), tuple(layers), tuple(Ts)
    from gdn_fuzz.case import BETAS, DECAYS

    plan_st = st.lists(st.tuples(st.integers(0, 7), st.integers(1, 8), st.integers(1, 8)), min_size=0, max_size=4)

    class Machine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.rig: ServingRig | None = None

        def _run(self, findings):
            if findings:
                raise HarnessFailure("\n".join([str(f) for f in findings] + [self.rig.describe()]))

        @initialize(data=st.data())
        def setup(self, data):
            """Draw the geometry, build the adapter, admit the first requests."""
            arm = data.draw(st.sampled_from(arms), label="arm")
            T = data.draw(st.sampled_from(Ts), label="T")
            H, HV = data.draw(st.sampled_from(HEADS), label="(H, HV)")
            L = data.draw(st.sampled_from(layers), label="layers")
            fmin = data.draw(st.one_of(st.none(), st.integers(1, W_RING - T + 1)), label="flush_min")
            reg = Regime(decay=data.draw(st.sampled_from(DECAYS), label="decay"),
                         beta=data.draw(st.sampled_from(BETAS), label="beta"))
            seed = data.draw(st.integers(0, 2**16 - 1), label="seed")
            geo = ServingGeometry(arm, T, H, HV, L, blocks=6, B=4, flush_min=fmin, regime=reg)
            self.rig = ServingRig(target, geo, device, seed, adapter_cls, checks)
            for j in range(data.draw(st.integers(1, 4), label="initial requests")):
                self.rig.admit(self.rig.free_blocks[0], seed + 1 + j, data.draw(st.booleans(), label="chunk"))

        @precondition(lambda self: self.rig is not None and self.rig.can_admit())
        @rule(recycled=st.booleans(), seed=st.integers(0, 2**16 - 1), chunk=st.booleans())
        def admit(self, recycled, seed, chunk):
            """A new request: a never-used block, or a recycled one (stale ring and cursors)."""
            pick = (self.rig.recycled_blocks if recycled else self.rig.fresh_blocks) or self.rig.free_blocks
            self.rig.admit(pick[0], seed, chunk)

        @precondition(lambda self: self.rig is not None and self.rig.requests)
        @rule(i=st.integers(0, 7))
        def retire(self, i):
            live = sorted(self.rig.requests)
            self.rig.retire(live[i % len(live)])

        @precondition(lambda self: self.rig is not None and self.rig.requests)
        @rule(i=st.integers(0, 7), where=st.integers(0, 7))
        def preempt(self, i, where):
            """Preempt and readmit into the same block or another free one."""
            live = sorted(self.rig.requests)
            rid = live[i % len(live)]
            dest = [self.rig.requests[rid].block] + self.rig.free_blocks
            self.rig.preempt(rid, dest[where % len(dest)])

        @precondition(lambda self: self.rig is not None)
        @rule(seed=st.integers(0, 2**16 - 1), plan=plan_st)
        def step(self, seed, plan):
            """A model step over a drawn subset / order of the live requests (ragged, accepted)."""
            rows = plan_rows(sorted(self.rig.requests), plan, self.rig.geo.T)
            self._run(self.rig.step(seed, rows))

        @precondition(lambda self: self.rig is not None and self.rig.requests)
        @rule(seed=st.integers(0, 2**16 - 1))
        def step_full(self, seed):
            """Every live request, all T tokens real and accepted (the quickest way to a flush)."""
            T = self.rig.geo.T
            self._run(self.rig.step(seed, [(rid, T, T) for rid in sorted(self.rig.requests)]))

        def teardown(self):
            if self.rig is not None:
                from hypothesis import event
                r = self.rig
                event(f"harness: flushed={r.flushes > 0}")
                event(f"harness: ragged rows={r.ragged_rows > 0}")
                event(f"harness: one-token chunk={r.chunks > 0}")
                event(f"harness: recycled={r.recycles > 0}")
                event(f"harness: preempted={r.preempts > 0}")

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
