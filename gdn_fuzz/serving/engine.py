"""The serving engine: one simulator of the serving loop around a ReplaySSM backend.

How it works, in plain words
----------------------------
A serving engine keeps, per request, a checkpoint (one pool row per GDN layer) and a 32-slot
ring of per-token records, and advances both with one kernel launch per layer and decode step,
followed by one cursor commit (shared/docs/replayssm-serving.md).  `Engine` plays that engine:

  admit      a request takes a free block: its checkpoint (drawn, or given) is written into
             every layer's pool row; its cursors are reset at its next step (the prefill ->
             decode handoff).  A block an earlier request used is a *recycled* block: its
             old ring and cursors are garbage that must stay unreachable.  chunk=True: the
             prompt's last token still has to come, as a one-token chunk through the decode
             kernel at the request's next step.
  retire     the request leaves; its block keeps the garbage.
  preempt    the request is preempted and readmitted (same or another free block): its
             logical state (checkpoint + window, replayed in float64 from each backend's own
             buffers) becomes a fresh checkpoint, cursors reset at the next step.  The truth
             does not change: readmission must not change the logical state.
  prefix_hit the prefix cache (an engine with a materializer, FlashInfer 0.7.4's
             gdn_prefix_materialize or its reference): a request's state after `count` tokens of its
             window is materialized into a free block, where a new request (the fork) starts and
             decodes the source's continuation again, teacher-forced from its transcript.
  step       one model step: a plan of (request, real tokens n, accepted a) rows, padded to
             the batch bucket B with pad rows in a given or drawn order; q/k/v/a/b per layer
             (drawn from the seed, or given: teacher forcing); every backend runs it; then
             the float64 truth advances and the checks run.

A *backend* is an adapter (gdn_fuzz.serving.adapters) between the engine and one kernel: the
direct adapter (per-row cursors, one launch per layer, C2 or C3 commits), the packed varlen
adapter (token-major activations, NULL block, L layers on one block-keyed cursor set, CUDA
graphs) and the Triton baseline adapter.  Several backends can run one stream side by side
(one truth): the drift study runs one per dtype arm, the Triton differential fused arms beside
Triton configurations, the CUDA-graph test an eager and a graphed adapter.

Beside the backends' buffers the engine keeps, per request and layer, a float64 *truth*: the
plain token-by-token recurrence over exactly the request's real, accepted tokens
(oracles.serving.sequential_decode).  The checks (clause ids of shared/docs/kernel-contract.md),
each written once, after every step, per backend:

  launch      [M1-M7] every launch agrees with the float64 oracle run on the backend's OWN
              buffers just before it (checks.check_oracle): a bug shows at the launch that makes it.
  writes      [M8, M5, R2, C1] no bit outside each launch's write set changes (checks.check_writes).
  cursors     [C2, C3] the kernel wrapper's in-place commit (restart_hist_on_flush=True) equals
              oracles.commit.standalone_commit, pad rows included; after the step every
              scheduled request's cursors equal caller_commit of the cursors it launched with.
  trajectory  [M3, M6, M7, C3, C4] for every request and layer the state rebuilt from the
              backend's checkpoint + window (through the adapter's cursors) stays within the
              drift budget of the truth (compare.drift_budget), cursors lie in range and
              hist_len equals the tokens accepted since the last fold.
  ragged      [M4, M8] each real token's output (gathered back by the adapter) equals the
              truth's y within compare.y_budget (relative to the magnitude of the terms).
  null_block  [M8] pad rows write nothing: every bit of every layer's pool and rings outside
              the step's real blocks is unchanged (NULL block, idle and retired blocks), and so
              are the pad rows' output rows.
  pad_lanes   [M1, M3, M5] a pad lane of a ragged row is an identity update: replaying the
              window through the pad lanes' records equals stopping at the last real token
              (compare.PAD_LANE_RTOL + PAD_LANE_G_ULPS |G_P|).

Each adapter says which checks it supports.  `step` never raises on a finding: it returns a
StepRecord (findings, metrics: the numbers behind trajectory and ragged, for studies); callers
that test raise EngineFailure (`Engine.fail`).  Hooks (`Engine.hooks`: objects with
before(engine, batch) and after(engine, batch, record) -> findings) add a study's own checks to
the same step.  The Hypothesis state machine over the engine is gdn_fuzz.serving.machine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from gdn_fuzz.case import LEGAL_T, RING_SLOTS, W_RING, Regime, decay_params, draw_tokens, lazy_flush_min
from gdn_fuzz.checks import check_oracle, check_writes
from gdn_fuzz.findings import Finding, raised
from gdn_fuzz.observation import same_bits
from gdn_fuzz.compare import (PAD_LANE_G_ULPS, PAD_LANE_RTOL, distance, drift_budget, drift_need, frobenius, ratio,
                              y_budget)
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles.serving import StepInputs, sequential_decode
from gdn_fuzz.properties.materialize import check_call

K_DIM = V_DIM = 128
NULL_BLOCK = 0
CHECKS = ("launch", "writes", "cursors", "trajectory", "ragged", "null_block", "pad_lanes")
FOREVER = 10**9  # a request's lifetime when it never retires by itself
PREFIX_MAX_COUNT = W_RING  # gdn_prefix_materialize replays at most 16 entries (PMS1: a larger count is skipped)


@dataclass(frozen=True)
class Geometry:
    """What stays fixed for one engine run (dtype arms and commit styles belong to the backends).

    blocks: pool rows per layer (packed and Triton adapters keep block 0 as the NULL block);
    B: the batch bucket every step is padded to; layers: GDN layers sharing one cursor set;
    flush_min: one value for every layer (C3), None = the lazy rule 17 - T.
    """

    T: int = 4
    H: int = 1
    HV: int = 2
    layers: int = 1
    blocks: int = 6
    B: int = 4
    flush_min: int | None = None
    regime: Regime = field(default_factory=Regime)
    K: int = K_DIM  # = V; the fused kernel needs 128, the Triton model and interpreter take any power of two

    def __post_init__(self):
        if self.T not in LEGAL_T:
            raise ValueError(f"T={self.T}: the fused kernel supports T in {LEGAL_T}")
        if not 1 <= self.fmin <= lazy_flush_min(self.T):
            raise ValueError(f"flush_min={self.flush_min} out of [1, {lazy_flush_min(self.T)}] for T={self.T}")
        if self.blocks < 1 or self.layers < 1 or self.B < 1 or self.HV % self.H:
            raise ValueError(f"bad geometry {self}")

    @property
    def fmin(self) -> int:
        return self.flush_min if self.flush_min is not None else lazy_flush_min(self.T)


@dataclass
class Request:
    rid: int
    block: int
    truth: list  # per layer [HV, V, K] float64: sequential decode of the accepted tokens
    age: int = 0  # launches since admission
    since_fold: int = 0  # tokens accepted since the checkpoint (C4: must equal hist_len)
    lifetime: int = FOREVER  # launches before the request may retire
    chunk_pending: bool = False  # next step is a one-token final prompt chunk
    handed_off: bool = False  # had a kernel step since its last (re)admission
    # engines with a materializer (the prefix cache) keep what a prefix hit needs:
    prefix: list | None = None  # per token since the checkpoint (index = count), the truth per layer
    transcript: list | None = None  # every accepted token's inputs since admission: per layer {q, k, v, a, b}
    fold_at: int = 0  # transcript tokens at the checkpoint: prefix[c] is the truth after fold_at + c tokens
    follows: list | None = None  # a fork: the transcript it decodes again (its source's), shared while that grows
    pos: int = 0  # a fork: the next token of `follows` to decode
    forked: bool = False  # its checkpoint was written by the materializer, not rounded from the truth


@dataclass(frozen=True)
class Sched:
    """One scheduled request row, as the engine hands it to an adapter.

    kind: "decode" (1 + drafts tokens) or "chunk" (a one-token final prompt chunk that the
    engine routes through the decode kernel)."""

    rid: int
    block: int
    n: int = 0  # real tokens (1..T)
    accepted: int = 0  # 1..n
    kind: str = "decode"


@dataclass
class Batch:
    """One step as the adapters see it.

    order: per batch position the index of its row in `rows`, or -1 for a pad row;
    tokens: per layer q, k [B, T, H, K], v [B, T, HV, V], a, b [B, T, HV] in position order
    (lanes >= a row's n are not real tokens: adapters must not feed them to the kernel)."""

    rows: list
    order: list
    tokens: list
    seed: int
    step: int

    @property
    def positions(self) -> list[int]:
        pos = [0] * len(self.rows)
        for p, j in enumerate(self.order):
            if j >= 0:
                pos[j] = p
        return pos


@dataclass
class StepOut:
    """What an adapter returns for one step.

    y: per layer, the real tokens' outputs token-major [sum n, HV, V] in `rows` order;
    launch_cursors: per real row the (hist_len, cache_base) it launched with;
    observations: observation.Observation per launch (launch / writes checks);
    inplace: C2 only, (P0, b0, P_after, b_after) int64 [B] of every batch row;
    error: a launch raised (its observation holds the exception)."""

    y: list = field(default_factory=list)
    launch_cursors: list = field(default_factory=list)
    observations: list = field(default_factory=list)
    inplace: tuple | None = None
    error: bool = False


@dataclass
class StepRecord:
    """One step's outcome: findings, and per backend the numbers behind trajectory / ragged."""

    step: int
    rows: list
    findings: list = field(default_factory=list)
    flushed: list = field(default_factory=list)  # rids that folded at this launch (engine model)
    metrics: dict = field(default_factory=dict)  # backend -> {"state": [per layer], "y": [per layer]}
    outs: dict = field(default_factory=dict)  # backend -> StepOut


class EngineFailure(AssertionError):
    """A serving check broke; the message lists the findings and the engine's state."""


class Engine:
    """Requests, their float64 truths, the serving events and the checks, over one or more backends.

    backends: an adapter, a list of adapters, or {name: adapter}; checks: a subset of CHECKS
    (default: the first backend's DEFAULT_CHECKS) that every backend supports; params: per layer
    (A_log, dt_bias) (default drawn from the regime), rounded to `io`; io / state: the dtypes
    the engine rounds drawn tokens and checkpoints to before they become the truth (default:
    the first backend's); y_tokens: "real" (every real token's output) or "accepted" (the
    accepted ones only) for the ragged check and its metrics; materializer: a Target of kernel
    "materialize" (FlashInfer 0.7.4's gdn_prefix_materialize, an edited copy, the torch reference): the
    prefix cache's store, which `prefix_hit` calls on every backend's own buffers.
    """

    def __init__(self, geo: Geometry, backends, device: str = "cpu", seed: int = 0, *, checks=None,
                 params=None, io=None, state=None, y_tokens: str = "real", materializer=None):
        if not isinstance(backends, dict):
            backends = list(backends) if isinstance(backends, (list, tuple)) else [backends]
            backends = {ad.name: ad for ad in backends}
        if not backends:
            raise ValueError("the engine needs at least one backend")
        self.geo, self.device, self.backends = geo, torch.device(device), backends
        first = next(iter(backends.values()))
        self.checks = frozenset(first.DEFAULT_CHECKS if checks is None else checks)
        for name, ad in backends.items():
            bad = self.checks - ad.CHECKS
            if bad:
                raise ValueError(f"checks {sorted(bad)} are not supported by backend {name} "
                                 f"({type(ad).__name__}: {sorted(ad.CHECKS)}); use a subset of {CHECKS}")
            if ad.fmin != geo.fmin:
                raise ValueError(f"backend {name} folds at {ad.fmin}, the engine at {geo.fmin} (C3: one flush_min)")
        if y_tokens not in ("real", "accepted"):
            raise ValueError(f"y_tokens={y_tokens!r}; use real | accepted")
        self.y_tokens = y_tokens
        if materializer is not None:
            if materializer.kernel != "materialize":
                raise ValueError(f"materializer={materializer.name!r} is a target of the {materializer.kernel} kernel; "
                                 "use materialize, materialize-reference, mutant:pm_... or a file defining "
                                 "gdn_prefix_materialize")
            lacking = [n for n, ad in backends.items() if not hasattr(ad, "materialize")]
            if lacking:
                raise ValueError(f"backends {lacking} keep no ring a materializer can read (prefix hits need the "
                                 "fused kernel's layout: the direct or packed adapter)")
        self.materializer = materializer
        self.io = io if io is not None else first.io
        self.state_dtype = state if state is not None else first.state
        gen = torch.Generator().manual_seed(seed)
        if params is None:
            params = [decay_params(geo.regime, gen, 1, 1, geo.HV)[:2] for _ in range(geo.layers)]
        self.A_log = [A.to(self.io).to(self.device) for A, _ in params]
        self.dt_bias = [d.to(self.io).to(self.device) for _, d in params]
        self.scale = 1.0 / math.sqrt(geo.K)
        self.first_block = max(ad.FIRST_BLOCK for ad in backends.values())
        for ad in backends.values():
            ad.bind(self)
        self.hooks: list = []
        self.requests: dict[int, Request] = {}
        self.used: set[int] = set()
        self.next_rid = 0
        self.steps = self.flushes = self.wraps = self.recycles = self.preempts = self.ragged_rows = self.chunks = 0
        self.prefix_hits = self.followed = 0  # forks made; tokens forks decoded again from their source's transcript
        self.worst_prefix = 0.0  # max over prefix hits of the fork checkpoint's error / drift budget
        self.worst_need = 0.0  # max trajectory need (the DRIFT_C a state needed), every backend
        self.worst_ratio = 0.0  # max trajectory error / budget
        self.log: list[str] = []

    # ---------------------------------------------------------------- queries
    @property
    def adapter(self):
        """The only backend (single-backend engines)."""
        if len(self.backends) != 1:
            raise ValueError(f"{len(self.backends)} backends: name one")
        return next(iter(self.backends.values()))

    @property
    def held(self) -> set[int]:
        return {r.block for r in self.requests.values()}

    @property
    def free_blocks(self) -> list[int]:
        return [b for b in range(self.first_block, self.geo.blocks) if b not in self.held]

    @property
    def fresh_blocks(self) -> list[int]:
        return [b for b in self.free_blocks if b not in self.used]

    @property
    def recycled_blocks(self) -> list[int]:
        return [b for b in self.free_blocks if b in self.used]

    @property
    def live(self) -> list[int]:
        return sorted(self.requests)

    def can_admit(self) -> bool:
        return len(self.requests) < self.geo.B and bool(self.free_blocks)

    def describe(self) -> str:
        g = self.geo
        lines = [f"engine: backends={', '.join(f'{n} ({ad.describe()})' for n, ad in self.backends.items())}",
                 f"  T={g.T} H={g.H} HV={g.HV} layers={g.layers} blocks={g.blocks} B={g.B} flush_min={g.fmin} "
                 f"regime={g.regime}",
                 f"  steps={self.steps} flushes={self.flushes} wraps={self.wraps} recycles={self.recycles} "
                 f"preempts={self.preempts} ragged rows={self.ragged_rows} chunks={self.chunks}"
                 + (f" prefix hits={self.prefix_hits} tokens followed={self.followed}" if self.materializer else "")]
        for r in self.requests.values():
            cur = {n: ad.cursor(r.rid, r.block) for n, ad in self.backends.items()} if r.handed_off else "reset pending"
            fork = (f" fork: token {r.pos} of {len(r.follows)} of its source's transcript" if r.follows is not None
                    else "")
            lines.append(f"  request {r.rid}: block={r.block} cursors={cur} age={r.age} since_fold={r.since_fold} "
                         f"lifetime={r.lifetime} chunk_pending={r.chunk_pending}{fork}")
        lines.append("  events: " + "; ".join(self.log[-12:]))
        return "\n".join(lines)

    def plan_all(self, seed: int = 0, accept: str = "random") -> list[tuple]:
        """A plan with every live request and T tokens; accepted: all (T), one (1) or random (1..T, from seed)."""
        T = self.geo.T
        if accept == "random":
            n = torch.randint(1, T + 1, (len(self.requests),), generator=torch.Generator().manual_seed(seed)).tolist()
        elif accept in ("all", "one"):
            n = [T if accept == "all" else 1] * len(self.requests)
        else:
            raise ValueError(f"accept={accept!r}; use random | all | one")
        return [(rid, T, a) for rid, a in zip(self.live, n)]

    def fail(self, findings) -> None:
        """Raise EngineFailure listing the findings and the state, if there are any."""
        if findings:
            raise EngineFailure("\n".join([str(f) for f in findings] + [self.describe()]))

    # ---------------------------------------------------------------- serving events
    def admit(self, block: int, seed: int = 0, *, state=None, chunk: bool = False, lifetime: int = FOREVER) -> int:
        """Prefill done: the checkpoint of every layer (drawn from `seed`, or `state`: one [HV, V, K]
        tensor or one per layer), rounded to the engine's STATE dtype, is written into `block`."""
        if block in self.held or not self.first_block <= block < self.geo.blocks:
            raise ValueError(f"block {block} is not free")
        if not self.can_admit():
            raise ValueError(f"batch bucket B={self.geo.B} or the pool ({self.geo.blocks} blocks) is full")
        g = self.geo
        if state is None:
            gen = torch.Generator().manual_seed(seed)
            states = [torch.randn(g.HV, g.K, g.K, generator=gen) * g.regime.state_scale for _ in range(g.layers)]
        else:
            states = list(state) if isinstance(state, (list, tuple)) else [state] * g.layers
        states = [S.to(self.state_dtype).to(self.device) for S in states]
        if block in self.used:
            self.recycles += 1
        rid = self.next_rid
        self.next_rid += 1
        self.requests[rid] = r = Request(rid, block, [S.double() for S in states], lifetime=lifetime,
                                         chunk_pending=chunk)
        if self.materializer is not None:
            r.prefix, r.transcript = [list(r.truth)], []
        self.used.add(block)
        for ad in self.backends.values():
            ad.write_checkpoint(block, states)
            ad.assign(rid, block)
        self.log.append(f"admit r{rid}->b{block}{' chunk' if chunk else ''}")
        return rid

    def retire(self, rid: int) -> None:
        r = self.requests.pop(rid)
        for ad in self.backends.values():
            ad.release(rid, r.block)
        self.log.append(f"retire r{rid}")

    def preempt(self, rid: int, new_block: int) -> None:
        """Preempt and readmit into `new_block`: each backend's logical state (float64 replay of its
        own checkpoint + window, M3) becomes the new checkpoint (rounded to the backend's STATE);
        cursors reset at the next step; the truth is unchanged."""
        r = self.requests[rid]
        if new_block != r.block and (new_block in self.held or not self.first_block <= new_block < self.geo.blocks):
            raise ValueError(f"block {new_block} is not free")
        for ad in self.backends.values():
            if r.handed_off or r.forked:  # a fork's checkpoint is the materializer's, not the truth rounded
                cur = [ad.cursor(rid, r.block) if r.handed_off else (0, 0)]
                states = [ad.rebuild(l, [r.block], cur)[0][0] for l in range(self.geo.layers)]
            else:  # no step since (re)admission: the checkpoint is still the truth, exactly
                states = r.truth
            ad.release(rid, r.block)
            ad.write_checkpoint(new_block, states)
            ad.assign(rid, new_block)
        if new_block != r.block and new_block in self.used:
            self.recycles += 1
        r.block, r.since_fold, r.handed_off = new_block, 0, False
        if r.prefix is not None:
            r.prefix, r.fold_at = [list(r.truth)], len(r.transcript)
        self.used.add(new_block)
        self.preempts += 1
        self.log.append(f"preempt r{rid}->b{new_block}")

    def prefix_hit(self, rid: int, count: int, block: int, *, lifetime: int = FOREVER) -> tuple[int, list]:
        """The prefix cache, the flow gdn_prefix_materialize exists for (kernel-contract-0.7.4.md, PM*).

        Request `rid`'s state after `count` tokens of its window (its checkpoint plus the first `count`
        ring entries from its cache_base) is materialized, on every backend's own buffers, by the engine's
        materializer into the free `block`; a new request (the prefix-cache hit) starts there: its
        checkpoint is what the materializer wrote, its cursors reset at its next step (the handoff), its
        truth is the float64 sequential truth at that token, and it decodes rid's continuation after that
        token again (its rows' first lanes are teacher-forced from rid's transcript, its acceptance capped
        to it) until it has caught up, then drawn tokens.  The engine's checks follow it from there on.

        Checked here, per backend and layer, always: the call against the float64 PMM3 oracle on the buffers
        it read, and every byte outside the destination unchanged (gdn_fuzz.properties.materialize.check_call:
        PMM3, PMS2, PMW1-PMW3); with the "trajectory" check: the written state against the truth at that
        token within the drift budget of a state of the fork's age (the source's age + 1: a materialization
        is one fold, one more rounding to STATE; compare.drift_budget).  Returns (the new request's id,
        findings)."""
        if self.materializer is None:
            raise ValueError("this engine has no materializer: Engine(..., materializer=get_target("
                             "'materialize-reference')) (or 'materialize', FlashInfer's, on CUDA)")
        r = self.requests[rid]
        if block in self.held or not self.first_block <= block < self.geo.blocks:
            raise ValueError(f"block {block} is not free")
        if not self.can_admit():
            raise ValueError(f"batch bucket B={self.geo.B} or the pool ({self.geo.blocks} blocks) is full")
        most = min(len(r.prefix) - 1, PREFIX_MAX_COUNT)
        if not 0 <= count <= most:
            raise ValueError(f"count={count}: request {rid} has {len(r.prefix) - 1} tokens since its checkpoint; "
                             f"legal: 0..{most} (PMM4: count <= hist_len; PMS1: count > {PREFIX_MAX_COUNT} is skipped)")
        truth, age = r.prefix[count], r.age + 1
        findings = []
        for name, ad in self.backends.items():
            P, base = ad.cursor(rid, r.block) if r.handed_off else (0, 0)
            for l, (case, before, after, returned, exc) in enumerate(
                    ad.materialize(self.materializer, r.block, block, base, count, P)):
                if exc is not None:
                    findings.append(Finding("serving.materialize", "PMH1-PMH19", f"{name} layer {l}: the materializer "
                                            f"raised on a legal call (src {r.block}, dst {block}, cache_base {base}, "
                                            f"count {count}, hist_len {P}): {type(exc).__name__}: {exc}",
                                            outcome=raised(exc)))
                else:  # the call is observed whole whatever the adapter's checks: the hit's own check
                    findings += [dataclasses.replace(f, message=f"{name} layer {l}: {f.message}")
                                 for f in check_call(case, before, after, returned, None, prop="serving.materialize")]
            if "trajectory" in self.checks:
                findings += self._check_fork(name, ad, rid, count, block, truth, age)
        fid = self.next_rid
        self.next_rid += 1
        f = self.requests[fid] = Request(fid, block, [S.clone() for S in truth], age=age, lifetime=lifetime,
                                         forked=True, prefix=[list(truth)], transcript=[], follows=r.transcript,
                                         pos=r.fold_at + count)
        if block in self.used:
            self.recycles += 1
        self.used.add(block)
        for ad in self.backends.values():
            ad.fork(fid, r.block, block)
        self.prefix_hits += 1
        self.log.append(f"prefix r{rid}@{count}->r{fid} b{block}")
        return f.rid, findings

    def _check_fork(self, name, ad, rid, count, block, truth, age) -> list[Finding]:
        """[PMM3, M3] the state written into `block` against the truth at the prefix's token (drift budget)."""
        floor = ad.atol * math.sqrt(self.geo.K * self.geo.K)
        out = []
        for l in range(self.geo.layers):
            S = ad.rebuild(l, [block], [(0, 0)])[0].to(self.device)  # an empty window: the checkpoint itself
            want = truth[l][None]
            err, den = distance(S, want, (-2, -1)), frobenius(want, (-2, -1))
            rat = ratio(err, drift_budget(ad.u, age, den, floor)).nan_to_num(float("inf"))  # NaN state: over budget
            self.worst_prefix = max(self.worst_prefix, float(rat.max()))
            out += _over_budget(
                "serving.prefix", "PMM3", rat, err, den,
                lambda j: f"{name} layer {l}: request {rid}'s state after {count} tokens of its window, "
                          f"materialized into block {block}, is",
                f"(relative) from the sequential truth at that token; budget compare.drift_budget at the fork's "
                f"age {age} (u={ad.u:.3g}, atol floor {ad.atol:.1e}/element)")
        return out

    # ---------------------------------------------------------------- one model step
    def _follow(self, rows, order, tokens) -> tuple[list, set]:
        """Forks decode their source's transcript again: lanes 0..k-1 of a following fork's row get the next
        k tokens of it (k = min(real tokens, tokens left)); lanes past them keep drawn drafts.  Returns the
        tokens (copied when changed) and the ids of the rows that followed."""
        where = {j: p for p, j in enumerate(order) if j >= 0}
        out, followed = None, set()
        for j, x in enumerate(rows):
            r = self.requests[x.rid]
            if r.follows is None or r.pos >= len(r.follows) or x.kind != "decode":
                continue
            k = min(x.n, len(r.follows) - r.pos)
            if out is None:
                out = [{n: t.clone() for n, t in layer.items()} for layer in tokens]
            for l, layer in enumerate(out):
                for n, t in layer.items():
                    t[where[j], :k] = torch.stack([r.follows[r.pos + i][l][n] for i in range(k)]).to(t.device)
            followed.add(x.rid)
        return (tokens if out is None else out), followed

    def _order(self, order, R: int, gen) -> list[int]:
        B = self.geo.B
        base = list(range(R)) + [-1] * (B - R)
        if order == "sorted":
            return base
        if order == "shuffled":
            return [base[p] for p in torch.randperm(B, generator=gen).tolist()]
        order = list(order)
        if len(order) != B or sorted(j for j in order if j >= 0) != list(range(R)):
            raise ValueError(f"order {order}: each of the {R} rows once, -1 for pads, {B} positions")
        return order

    def _draw_tokens(self, gen) -> list[dict]:
        g, io = self.geo, self.io
        out = []
        for _ in range(g.layers):
            q, k, v, _, _, a, b = draw_tokens(g.regime, gen, g.B, g.T, g.H, g.HV, g.K, g.K)
            out.append({n: x.to(io).to(self.device) for n, x in dict(q=q, k=k, v=v, a=a, b=b).items()})
        return out

    def step(self, plan, seed: int = 0, *, order="sorted", tokens=None, check: bool = True) -> StepRecord:
        """One model step.  plan: [(rid, n_real, accepted)] in row order; a request with a pending
        one-token chunk runs (1 token, accepted 1) whatever the plan says.  order: "sorted" (rows
        first, pads last), "shuffled" (drawn from the seed) or a list of B positions (row index or
        -1).  tokens: per layer dict q/k/v/a/b [B, T, ...] in position order (teacher forcing);
        default drawn from the seed.  check=False: no checks, no metrics (truth still advances)."""
        g = self.geo
        T = g.T
        rows = []
        for rid, n, a in plan:
            r = self.requests[rid]
            kind = "decode"
            if r.chunk_pending:
                n, a, kind = 1, 1, "chunk"
                self.chunks += 1
            if not 1 <= a <= n <= T:
                raise ValueError(f"request {rid}: n_real={n}, accepted={a}; need 1 <= accepted <= n_real <= T")
            if r.follows is not None and r.pos < len(r.follows):  # a fork accepts no more than the known continuation
                a = min(a, len(r.follows) - r.pos)
            rows.append(Sched(rid, r.block, n, a, kind))
        R = len(rows)
        if R > g.B or len({x.block for x in rows}) != R:
            raise ValueError(f"{R} rows for a bucket of {g.B}, or two rows share a block (R3)")
        gen = torch.Generator().manual_seed(seed)
        order = self._order(order, R, gen)
        tokens = self._draw_tokens(gen) if tokens is None else tokens
        followed = set()
        if self.materializer is not None:
            tokens, followed = self._follow(rows, order, tokens)
        batch = Batch(rows, order, tokens, seed, self.steps)
        self.log.append(f"step {self.steps} " + ",".join(f"r{x.rid}:{x.n}/{x.accepted}" for x in rows))
        rec = StepRecord(self.steps, rows)
        for h in self.hooks:
            h.before(self, batch)
        checks = self.checks if check else frozenset()
        snaps = {n: _null_snapshot(ad, batch) for n, ad in self.backends.items()} if "null_block" in checks else {}
        for name, ad in self.backends.items():
            rec.outs[name] = out = ad.step(batch)
            if out.error:  # a launch raised on a legal step: report it, the state is undefined now
                rec.findings += [f for o in out.observations if o.error is not None for f in check_oracle(o)]
                self.steps += 1
                return rec
        self.steps += 1

        # ---- the truth: sequential decode of each row's accepted tokens, per layer
        ages = torch.tensor([self.requests[x.rid].age for x in rows], dtype=torch.float64, device=self.device)
        need_y = "ragged" in checks
        y_truth, y_mag = [], []
        trails, befores = [], []  # engines with a materializer: the truth after every token, and before the step
        if R:
            pos = torch.tensor(batch.positions, dtype=torch.long, device=self.device)
            acc = torch.tensor([x.accepted for x in rows], device=self.device)
            for l in range(g.layers):
                tok = StepInputs(**{n: x[pos] for n, x in tokens[l].items()}, accepted=acc)
                S = torch.stack([self.requests[x.rid].truth[l] for x in rows])
                if self.materializer is not None:
                    S_next, y, trail = sequential_decode(S, tok, self.A_log[l], self.dt_bias[l], self.scale, trail=True)
                    trails.append(trail)
                    befores.append(S)
                else:
                    S_next, y = sequential_decode(S, tok, self.A_log[l], self.dt_bias[l], self.scale)
                if need_y:
                    g_, beta = gdn_oracle.gates(tok.a, self.dt_bias[l], self.A_log[l], tok.b)
                    q_hat, k_hat = gdn_oracle.normalized_qk(tok.q, tok.k, g.HV, self.scale)
                    y_mag.append(gdn_oracle.sequential_magnitude(S.abs(), q_hat, k_hat, tok.v, g_, beta,
                                                                 keep_states=False)[0])
                y_truth.append(y)
                for i, x in enumerate(rows):
                    self.requests[x.rid].truth[l] = S_next[i]

        # ---- per-launch checks, null block, cursors, outputs
        for name, ad in self.backends.items():
            out = rec.outs[name]
            rec.metrics[name] = {}
            for o in out.observations:
                if "launch" in checks:
                    rec.findings += check_oracle(o)
                if "writes" in checks:
                    rec.findings += check_writes(o)
            if "null_block" in checks:
                rec.findings += self._check_null_block(name, ad, batch, snaps[name])
            if "cursors" in checks:
                rec.findings += self._check_cursors(name, ad, rows, out)
            if need_y and R:
                f, rec.metrics[name]["y"] = self._check_y(name, ad, rows, out, y_truth, y_mag, ages)
                rec.findings += f

        # ---- the engine's own bookkeeping (C4): tokens accepted since the checkpoint, by the lazy rule
        first = rec.outs[next(iter(self.backends))]
        for i, x in enumerate(rows):
            r = self.requests[x.rid]
            flushed = r.since_fold >= g.fmin
            if flushed:
                rec.flushed.append(x.rid)
            self.flushes += flushed
            if first.launch_cursors:
                P0, b0 = first.launch_cursors[i]
                self.wraps += b0 + P0 + T > RING_SLOTS
            r.since_fold = (0 if flushed else r.since_fold) + x.accepted
            if r.prefix is not None:  # what a prefix hit on this request needs (prefix_hit)
                p, a, L = batch.positions[i], x.accepted, range(g.layers)
                if flushed:
                    r.prefix, r.fold_at = [[befores[l][i].clone() for l in L]], len(r.transcript)
                # one copy per (layer, tensor) of the row's accepted tokens, then a view per token
                states = [trails[l][i, :a].clone().unbind(0) for l in L]
                toks = [{n: v[p, :a].clone().unbind(0) for n, v in tokens[l].items()} for l in L]
                r.prefix += [[states[l][t] for l in L] for t in range(a)]
                r.transcript += [[{n: toks[l][n][t] for n in toks[l]} for l in L] for t in range(a)]
                if x.rid in followed:
                    r.pos += x.accepted
                    self.followed += x.accepted
            r.age += 1
            r.handed_off, r.chunk_pending = True, False
            self.ragged_rows += x.n < T

        if "pad_lanes" in checks:
            for name, ad in self.backends.items():
                rec.findings += self._check_pad_lanes(name, ad, rows)
        if "trajectory" in checks:
            for name, ad in self.backends.items():
                f, rec.metrics[name]["state"] = self._check_trajectory(name, ad)
                rec.findings += f
        for h in self.hooks:
            rec.findings += h.after(self, batch, rec) or []
        return rec

    # ---------------------------------------------------------------- checks
    def _check_cursors(self, name, ad, rows, out) -> list[Finding]:
        """[C2] the wrapper's in-place commit vs standalone_commit (pad rows included); [C3] every
        scheduled request's cursors after the step vs caller_commit of its launch cursors."""
        out_f = []
        if out.inplace is not None:
            P0, b0, P1, b1 = out.inplace
            P2, b2 = commits.standalone_commit(P0, b0, self.geo.fmin)
            bad = [i for i in range(len(P0)) if (int(P1[i]), int(b1[i])) != (int(P2[i]), int(b2[i]))]
            if bad:
                out_f.append(Finding(
                    "serving.cursors", "C2",
                    f"{name}: in-place commit (restart_hist_on_flush=True) gave (hist_len, cache_base) = "
                    f"{[(int(P1[i]), int(b1[i])) for i in bad]} on rows {bad}; the model (standalone_commit of "
                    f"{[(int(P0[i]), int(b0[i])) for i in bad]}) says {[(int(P2[i]), int(b2[i])) for i in bad]}",
                    row=bad[0]))
        if not rows:
            return out_f
        P0 = torch.tensor([c[0] for c in out.launch_cursors])
        b0 = torch.tensor([c[1] for c in out.launch_cursors])
        acc = torch.tensor([x.accepted for x in rows])
        P3, b3 = commits.caller_commit(P0, b0, acc, self.geo.fmin)
        b3 = b3 & (ad.ring - 1)
        for i, x in enumerate(rows):
            got = ad.cursor(x.rid, x.block)
            if got != (int(P3[i]), int(b3[i])):
                out_f.append(Finding(
                    "serving.cursors", "C3",
                    f"{name}: request {x.rid} (block {x.block}): cursors after the commit {got} differ from "
                    f"caller_commit(({int(P0[i])}, {int(b0[i])}), accepted={x.accepted}) = "
                    f"({int(P3[i])}, {int(b3[i])})", row=i))
        return out_f

    def _check_y(self, name, ad, rows, out, y_truth, y_mag, ages):
        """[M4, M8] real (or accepted) tokens' outputs vs the truth's y, per (request, head), y_budget."""
        T, V = self.geo.T, self.geo.K
        n = torch.tensor([x.n for x in rows], device=self.device)
        upto = n if self.y_tokens == "real" else torch.tensor([x.accepted for x in rows], device=self.device)
        lanes = torch.arange(T, device=self.device)[None, :]
        real, mask = lanes < n[:, None], lanes < upto[:, None]
        m = mask[..., None, None].double()
        findings, metrics = [], []
        for l, got in enumerate(out.y):
            if tuple(got.shape) != (int(n.sum()), self.geo.HV, V):
                findings.append(Finding("serving.ragged", "M8", f"{name} layer {l}: gathered outputs have shape "
                                        f"{tuple(got.shape)}, expected {(int(n.sum()), self.geo.HV, V)} "
                                        f"({n.tolist()} real tokens)"))
                continue
            Y = torch.zeros(len(rows), T, self.geo.HV, V, dtype=torch.float64, device=self.device)
            Y[real] = got.to(self.device).double()
            err = distance(Y * m, y_truth[l] * m, (1, 3))  # [R, HV]
            mag = frobenius(y_mag[l] * m, (1, 3))
            floor = ad.atol * torch.sqrt(mask.sum(1, keepdim=True).double() * V)
            allowed = y_budget(ad.u, ages[:, None], mag, floor)
            rat = ratio(err, allowed)
            metrics.append(dict(rids=[x.rid for x in rows], Y=Y, mask=mask, err=err, mag=mag, rel=ratio(err, mag),
                                ratio=rat))
            findings += _over_budget(
                "serving.ragged", "M4", rat, err, mag,
                lambda i: f"{name} layer {l}: request {rows[i].rid} (block {rows[i].block}, {rows[i].n} real tokens, "
                          f"age {int(ages[i])}): gathered outputs are",
                "(relative to the magnitude) from the float64 truth")
        return findings, metrics

    def _check_trajectory(self, name, ad):
        """[M3, M6, M7, C3, C4] every handed-off request and layer: rebuilt state vs truth (drift budget)."""
        reqs = [self.requests[rid] for rid in self.live if self.requests[rid].handed_off]
        if not reqs:
            return [], []
        curs = [ad.cursor(r.rid, r.block) for r in reqs]
        for r, (P, base) in zip(reqs, curs):
            if not (0 <= P <= W_RING and 0 <= base < ad.ring):
                return [Finding("serving.trajectory", "C4", f"{name}: request {r.rid}: cursors ({P}, {base}) out of "
                                f"[0, {W_RING}] x [0, {ad.ring})")], []
        findings = [Finding("serving.trajectory", "C4", f"{name}: request {r.rid} (block {r.block}): hist_len {P} != "
                            f"tokens accepted since its checkpoint ({r.since_fold})")
                    for r, (P, _) in zip(reqs, curs) if P != r.since_fold]
        ages = torch.tensor([r.age for r in reqs], dtype=torch.float64, device=self.device)[:, None]
        floor = ad.atol * math.sqrt(self.geo.K * self.geo.K)
        metrics = []
        for l in range(self.geo.layers):
            S = ad.rebuild(l, [r.block for r in reqs], curs)[0].to(self.device)
            truth = torch.stack([r.truth[l] for r in reqs])
            err, den = distance(S, truth, (-2, -1)), frobenius(truth, (-2, -1))
            allowed = drift_budget(ad.u, ages, den, floor)
            need = drift_need(err, ad.u, ages, den, floor)
            rat = ratio(err, allowed)
            self.worst_need = max(self.worst_need, float(need.max()))
            self.worst_ratio = max(self.worst_ratio, float(rat.max()))
            metrics.append(dict(rids=[r.rid for r in reqs], S=S, err=err, den=den, rel=ratio(err, den), need=need,
                                ratio=rat))
            findings += _over_budget(
                "serving.trajectory", "M3", rat, err, den,
                lambda j: f"{name} layer {l}: request {reqs[j].rid} (block {reqs[j].block}, cursors {curs[j]}, age "
                          f"{reqs[j].age}): the state rebuilt from the checkpoint + window is",
                f"(relative) from the sequential truth; budget compare.drift_budget (u={ad.u:.3g}, atol floor "
                f"{ad.atol:.1e}/element)")
        return findings, metrics

    def _check_pad_lanes(self, name, ad, rows) -> list[Finding]:
        """[M1, M3, M5] for every ragged row and layer: replaying the window up to the last pad lane
        equals replaying it up to the last real token.  The committed cursors give the window
        start (hist_len - accepted: 0 on a flush row, P on a verify row).  A pad lane with a = 0
        decays the state by e^{g} per lane (1 - e^{g} >= ~3e-4 even under weak decay)."""
        T = self.geo.T
        sel = [(i, x) for i, x in enumerate(rows) if x.n < T]
        if not sel:
            return []
        blocks, c_real, c_pad = [], [], []
        for _, x in sel:
            P, base = ad.cursor(x.rid, x.block)
            start = P - x.accepted
            blocks.append(x.block)
            c_real.append((start + x.n, base))
            c_pad.append((start + T, base))
        if min(c[0] for c in c_real) < 0 or max(c[0] for c in c_pad) > W_RING:
            return [Finding("serving.pad_lanes", "C4", f"{name}: cursors out of range for the pad-lane probe: "
                            f"{list(zip(blocks, c_real, c_pad))}")]
        out = []
        for l in range(self.geo.layers):
            S_real, _ = ad.rebuild(l, blocks, c_real)
            S_pad, GP = ad.rebuild(l, blocks, c_pad)
            err, den = distance(S_pad, S_real, (-2, -1)), frobenius(S_real, (-2, -1))
            rat = ratio(err, (PAD_LANE_RTOL + PAD_LANE_G_ULPS * GP.abs()) * den)
            out += _over_budget(
                "serving.pad_lanes", "M1", rat, err, den,
                lambda j: f"{name} layer {l}, request {sel[j][1].rid} ({sel[j][1].n} real of {T} lanes): replaying "
                          f"the pad lanes' records changes the state by",
                "(relative); a pad lane must be an identity update (a = -inf, zero q/k/v/b)")
        return out

    def _check_null_block(self, name, ad, batch, before) -> list[Finding]:
        """[M8] bits outside this step's real blocks unchanged, every layer; pad rows' output rows unchanged."""
        watched, pad_out = before
        keep = torch.ones(self.geo.blocks, dtype=torch.bool, device=self.device)
        keep[[x.block for x in batch.rows]] = False
        out = []
        for key, now in ad.watched().items():
            changed = ~same_bits(now, watched[key])
            changed = changed.reshape(changed.shape[0], -1).any(1) & keep.to(changed.device)
            if bool(changed.any()):
                out.append(Finding("serving.null_block", "M8",
                                   f"{name}: {key} of block(s) {changed.nonzero().flatten().tolist()} changed, but no "
                                   f"real row of this step holds them (pad rows must write nothing)"))
        for key, now in ad.pad_rows_output(batch).items():
            if not bool(same_bits(now, pad_out[key]).all()):
                out.append(Finding("serving.null_block", "M8", f"{name}: {key}: output rows of pad rows were written"))
        return out


def _over_budget(check: str, clause: str, rat, err, den, where, what: str) -> list[Finding]:
    """[] when every (row, head) of rat = err / allowed is within budget, else one Finding for the worst:
    where(row) + " <err/den> " + what, with the ratio as its value (tolerance 1)."""
    if float(rat.max()) <= 1.0:
        return []
    i, h = divmod(int(rat.argmax()), rat.shape[1])
    rel = float(err[i, h] / den[i, h].clamp_min(1e-300))
    return [Finding(check, clause, f"{where(i)} {rel:.3e} {what}", head=h, value=float(rat[i, h]), tol=1.0)]


def _null_snapshot(ad, batch):
    return ({k: v.clone() for k, v in ad.watched().items()},
            {k: v.clone() for k, v in ad.pad_rows_output(batch).items()})
