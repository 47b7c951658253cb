"""The backends of the serving engine: adapters between the engine and one kernel.

An adapter owns a kernel's buffers (every layer's pool and rings, in the backend's dtypes, on
its device) and its cursor store, and turns the engine's Batch into launches and a commit.
Interface (gdn_fuzz.serving.engine): bind, write_checkpoint, assign, release, step -> StepOut,
cursor, rebuild (float64 logical state, M3), watched / pad_rows_output (null-block check);
the fused-layout adapters also materialize / fork (the prefix cache: Engine.prefix_hit).

  DirectAdapter   what a test harness does: one launch per layer over the batch as it is,
                  cursors gathered per batch row from a block-keyed store, pad rows as slot -1
                  with drawn cursors, commits by the caller (C3, restart_hist_on_flush=False)
                  or by the wrapper in place (C2) then += accepted.  Every launch can be
                  observed (observation.observe) for the launch and writes checks.
  PackedAdapter   what vLLM / SGLang put between the scheduler and the kernel
                  (shared/docs/replayssm-serving.md): token-major activations with
                  query_start_loc unpacked into [B, T] (pad lanes a = -inf, zero q/k/v/b; only
                  real outputs gathered back), the batch padded with the NULL block 0 (-> slot
                  -1, M8), cursors kept per block and gathered into fixed-address per-row
                  buffers, L layers on one cursor set committed once per step (C3), a reset
                  at the handoff (first step after assign: new request, recycled block,
                  readmission).  Each decision is a small method; the planted adapter bugs
                  (PLANTED: name -> (subclass, the check that must catch it)) override one.
  GraphedPackedAdapter  the same with the L launches captured once into a CUDA graph and
                  replayed every later step (validated on the H200: replay equals eager
                  bitwise, docs/h200-results.md).  CUDA only (GraphUnavailable elsewhere);
                  needs a target without host syncs in the launch (production, not reference).
  TritonAdapter   SGLang's Triton ReplaySSM baseline (targets.triton_baseline.TritonBaselineServing):
                  engine block b = the baseline's request b - 1; its own commit and fold.

Planted adapter bugs:
  null_block_as_slot_zero     block 0 passed through as slot 0 (no 0 -> -1)      null_block
  pad_lanes_zero_a            pad lanes zero-filled, a = 0 instead of -inf         pad_lanes
  right_aligned_gather        outputs gathered from the last n lanes of a row      ragged
  commit_per_layer            cursor commit after every layer, not once a step     trajectory
  no_reset_on_recycle         reset only on a block's first use                    trajectory
  reset_on_first_spec_decode  a second reset at the first decode row, after a
                              one-token prompt chunk went through the kernel       trajectory
  request_keyed_cursors       cursors keyed by request id, reset on a new id only
                              (stale on readmission)                               trajectory
Planted prefix-cache bugs (PREFIX_PLANTED; Engine.prefix_hit, an engine with a materializer):
  prefix_from_ring_start      the prefix read from ring slot 0, not cache_base     trajectory (serving.prefix)
  prefix_whole_window         the whole window materialized, not `count` entries   trajectory (serving.prefix)
  fork_keeps_cursors          the fork's block takes the source's cursors          trajectory
"""

from __future__ import annotations

import torch

from gdn_fuzz.arms import get_arm, unit_roundoff
from gdn_fuzz.case import RING_SLOTS, W_RING, Case, Row, lazy_flush_min
from gdn_fuzz.observation import clone_inputs, observe
from gdn_fuzz.compare import drift_unit, table_for
from gdn_fuzz.oracles import commit as commits, gdn as gdn_oracle, ring as ring_oracle
from gdn_fuzz.serving.engine import NULL_BLOCK, Batch, Sched, StepOut
from gdn_fuzz.targets import Target
from gdn_fuzz.targets.triton_baseline import TritonBaselineServing, flush_min_of, triton_io_ckpt

COMMITS = ("caller", "standalone")


class Adapter:
    """Base of every backend (module docstring)."""

    FIRST_BLOCK = 1  # the lowest block a request may hold (0: the NULL block)
    CHECKS: frozenset = frozenset()
    DEFAULT_CHECKS: frozenset = frozenset()
    RAGGED = False  # rows with fewer than T real tokens
    ring = RING_SLOTS

    def __init__(self, geo, device: str = "cpu", seed: int = 0, name: str | None = None):
        self.geo, self.device, self.seed = geo, torch.device(device), seed
        self.name = name or type(self).__name__
        self.fmin = geo.fmin
        self.engine = None

    def bind(self, engine) -> None:
        """Called once by the engine: the model parameters and the active checks."""
        self.engine = engine
        self.set_params(engine.A_log, engine.dt_bias)

    def set_params(self, A_log: list, dt_bias: list) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def release(self, rid: int, block: int) -> None:
        """The request left `block` (retired or preempted); the ring stays as garbage."""
    def watched(self) -> dict:
        return {}

    def pad_rows_output(self, batch: Batch) -> dict:
        return {}


# ------------------------------------------------------------------ fused-kernel buffers


class FusedAdapter(Adapter):
    """Buffers of the fused kernel's layout per layer, the block-keyed cursor store, the resets."""

    def __init__(self, target: Target, geo, arm: str = "bf16", device: str = "cpu", seed: int = 0,
                 name: str | None = None):
        super().__init__(geo, device, seed, name or arm)
        self.target = target
        a = self.arm = get_arm(arm)
        self.io, self.state = a.io, a.state
        self.u = drift_unit(a)
        self.atol = table_for(a)["fold"].atol
        gen = torch.Generator().manual_seed(seed)
        L, NB, B, T, H, HV, K = geo.layers, geo.blocks, geo.B, geo.T, geo.H, geo.HV, geo.K
        dev = self.device
        # garbage everywhere (a recycled block must never expose it)
        self.pool = [(torch.randn(NB, HV, K, K, generator=gen) * geo.regime.state_scale).to(a.state).to(dev)
                     for _ in range(L)]
        self.k_cache = [gdn_oracle.l2norm(torch.randn(NB, H, RING_SLOTS, K, generator=gen)).to(a.ring).to(dev)
                        for _ in range(L)]
        self.u_cache = [torch.randn(NB, HV, RING_SLOTS, K, generator=gen).to(a.ring).to(dev) for _ in range(L)]
        self.g_cache = [(-torch.rand(NB, HV, RING_SLOTS, generator=gen) * 4.0).float().to(dev) for _ in range(L)]
        # per-block cursor store: legal garbage except the NULL block's (0, 0)
        self.blk_hist = torch.randint(0, lazy_flush_min(T), (NB,), generator=gen, dtype=torch.int32).to(dev)
        self.blk_base = torch.randint(0, RING_SLOTS, (NB,), generator=gen, dtype=torch.int32).to(dev)
        self.blk_hist[NULL_BLOCK] = 0
        self.blk_base[NULL_BLOCK] = 0
        self.out_buf = [torch.zeros(B, T, HV, K, dtype=a.io, device=dev) for _ in range(L)]
        self.scale = K ** -0.5
        self._pending_reset: set[int] = set()  # blocks whose next kernel step is a handoff

    def describe(self) -> str:
        return f"{type(self).__name__} arm={self.arm.name}"

    def set_params(self, A_log, dt_bias):
        self.A_log = [x.to(self.io).to(self.device) for x in A_log]
        self.dt_bias = [x.to(self.io).to(self.device) for x in dt_bias]

    def write_checkpoint(self, block: int, states) -> None:
        for l, S in enumerate(states):
            self.pool[l][block] = S.to(self.state).to(self.device)

    def assign(self, rid: int, block: int) -> None:
        """A request (new, or readmitted) now owns `block`, its checkpoint written: its next kernel
        step is the prefill -> decode handoff, cursors (0, 0)."""
        if block == NULL_BLOCK and self.FIRST_BLOCK > 0:
            raise ValueError("block 0 is the NULL block")
        self._pending_reset.add(block)

    def fork(self, rid: int, src: int, block: int) -> None:
        """A prefix hit: request rid starts in `block` from a state materialized out of block src's ring; like
        any new request its next kernel step is the handoff (cursors (0, 0): the checkpoint is the prefix)."""
        self.assign(rid, block)

    # ---------------------------------------------------------------- decisions (bug sites)
    def _needs_reset(self, row: Sched) -> bool:
        """The handoff: the first kernel step after assign(), whatever the row's kind."""
        return row.block in self._pending_reset

    def _reset_cursors(self, row: Sched) -> None:
        self.blk_hist[row.block] = 0
        self.blk_base[row.block] = 0

    def _begin(self, rows) -> None:
        for r in rows:
            if self._needs_reset(r):
                self._reset_cursors(r)
        self._pending_reset -= {r.block for r in rows}

    def cursor(self, rid: int, block: int) -> tuple[int, int]:
        """The committed (hist_len, cache_base) the adapter would use for this request next."""
        return int(self.blk_hist[block]), int(self.blk_base[block])

    def rebuild(self, layer: int, blocks, cursors):
        """M3 replay of `blocks` of one layer with the given (hist_len, cache_base) each:
        (S [n, HV, V, K], anchor G_P [n, HV]), float64."""
        dev = self.device
        idx = torch.tensor(blocks, dtype=torch.long, device=dev)
        P = torch.tensor([c[0] for c in cursors], dtype=torch.long, device=dev)
        base = torch.tensor([c[1] for c in cursors], dtype=torch.long, device=dev)
        k, u, G, valid = ring_oracle.gather_window(self.k_cache[layer], self.u_cache[layer], self.g_cache[layer],
                                                   idx, P, base, self.geo.HV)
        S, GP, _ = ring_oracle.replay(self.pool[layer][idx], k, u, G, valid, P)
        return S, GP

    def materialize(self, target: Target, src: int, dst: int, base: int, count: int, hist: int) -> list[tuple]:
        """The prefix cache's store on this backend's buffers (Engine.prefix_hit): per layer, `target`'s
        gdn_prefix_materialize of one request (block src's checkpoint and `count` entries of its ring from
        `base`) into block dst, in this backend's arm.  Returns per layer (the PrefixCase describing the call,
        its inputs before, the same tensors after, what it returned, the exception or None)."""
        from gdn_fuzz.prefix_case import PrefixCase, Request
        from gdn_fuzz.properties.materialize import call

        g = self.geo
        case = PrefixCase(self.arm.name, g.H, g.HV, g.blocks, RING_SLOTS, (Request(src, dst, base, count, hist),), seed=0)
        meta = {n: torch.tensor([x], dtype=torch.int32, device=self.device)
                for n, x in (("src_slots", src), ("dst_slots", dst), ("cache_base", base), ("count", count))}
        out = []
        for l in range(g.layers):
            inputs = dict(state=self.pool[l], k_cache=self.k_cache[l], u_cache=self.u_cache[l], g_cache=self.g_cache[l],
                          active_request_indices=None, num_active=None, **{n: t.clone() for n, t in meta.items()})
            before = clone_inputs(inputs)
            returned, exc = call(target, case, inputs)
            out.append((case, before, inputs, returned, exc))
        return out

    def watched(self) -> dict:
        out = {}
        for l in range(self.geo.layers):
            out.update({f"pool[{l}]": self.pool[l], f"k_cache[{l}]": self.k_cache[l],
                        f"u_cache[{l}]": self.u_cache[l], f"g_cache[{l}]": self.g_cache[l]})
        return out

    def _launch_kw(self, l: int, q, k, v, a, b, idx, hist, base, restart: bool) -> dict:
        return dict(q=q, k=k, v=v, a=a, b=b, A_log=self.A_log[l], dt_bias=self.dt_bias[l],
                    initial_state_source=self.pool[l], initial_state_indices=idx, k_cache=self.k_cache[l],
                    u_cache=self.u_cache[l], g_cache=self.g_cache[l], hist_len=hist, cache_base=base,
                    scale=self.scale, flush_min=self.fmin, restart_hist_on_flush=restart)


class DirectAdapter(FusedAdapter):
    """One launch per layer over the batch as the engine orders it; per-row cursors; C2 or C3."""

    FIRST_BLOCK = 0
    CHECKS = frozenset({"launch", "writes", "cursors", "trajectory", "ragged", "null_block"})
    DEFAULT_CHECKS = frozenset({"launch", "writes", "cursors", "trajectory"})

    def __init__(self, target: Target, geo, arm: str = "bf16", device: str = "cpu", seed: int = 0, *,
                 commit: str = "caller", name: str | None = None):
        super().__init__(target, geo, arm, device, seed, name)
        if commit not in COMMITS:
            raise ValueError(f"commit={commit!r}; use one of {COMMITS}")
        if commit == "standalone" and geo.layers > 1:
            raise ValueError("restart_hist_on_flush=True commits in place after each launch: one layer only (C3)")
        self.commit = commit

    @property
    def restart(self) -> bool:
        return self.commit == "standalone"

    def describe(self) -> str:
        return f"{super().describe()} commit={self.commit} ({'C2' if self.restart else 'C3'})"

    def pad_rows_output(self, batch):
        pads = [p for p, j in enumerate(batch.order) if j < 0]
        return {f"output[{l}]": self.out_buf[l][pads] for l in range(self.geo.layers)}

    def step(self, batch: Batch) -> StepOut:
        geo, arm, dev, T = self.geo, self.arm, self.device, self.geo.T
        rows = batch.rows
        if any(x.n != T for x in rows):
            raise ValueError("the direct adapter launches whole rows: every row carries T tokens")
        self._begin(rows)
        gen = torch.Generator().manual_seed(batch.seed + 7919)
        pad_P = torch.randint(0, W_RING + 1, (geo.B,), generator=gen).tolist()
        pad_base = torch.randint(0, RING_SLOTS, (geo.B,), generator=gen).tolist()
        crow, acc = [], []
        for p, j in enumerate(batch.order):
            if j < 0:
                crow.append(Row(-1, pad_P[p], pad_base[p]))
                acc.append(0)
            else:
                x = rows[j]
                crow.append(Row(x.block, *self.cursor(x.rid, x.block)))
                acc.append(x.accepted)
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
        idx, hist, base = i32([r.slot for r in crow]), i32([r.hist_len for r in crow]), i32([r.cache_base for r in crow])
        checks = self.engine.checks if self.engine is not None else frozenset()
        watch = bool({"launch", "writes"} & checks)
        out = StepOut()
        for l in range(geo.layers):
            tok = {n: x.to(device=dev, dtype=arm.io, copy=True) for n, x in batch.tokens[l].items()}
            kw = self._launch_kw(l, idx=idx, hist=hist, base=base, restart=self.restart, **tok)
            if watch:
                case = Case(arm=arm.name, T=T, H=geo.H, HV=geo.HV, pool=geo.blocks, rows=tuple(crow), seed=batch.seed,
                            flush_min=self.fmin, restart_hist_on_flush=self.restart, regime=geo.regime, K=geo.K,
                            V=geo.K)
                obs = observe(self.target, case, str(dev), inputs=kw, output=self.out_buf[l])
                out.observations.append(obs)
                if obs.error is not None:
                    out.error = True
                    return out
            else:
                self.target.launch(arm, output=self.out_buf[l], **kw)
        P0 = torch.tensor([r.hist_len for r in crow])
        b0 = torch.tensor([r.cache_base for r in crow])
        acc_t = torch.tensor(acc)
        if self.restart:  # C2: the wrapper committed in place (pad rows too); the caller adds accepted
            P1, b1 = hist.long().cpu(), base.long().cpu()
            out.inplace = (P0, b0, P1, b1)
            P_new, b_new = P1 + acc_t, b1
        else:  # C3
            P_new, b_new = commits.caller_commit(P0, b0, acc_t, self.fmin)
        pos = batch.positions
        for i, x in enumerate(rows):
            self.blk_hist[x.block] = int(P_new[pos[i]])
            self.blk_base[x.block] = int(b_new[pos[i]])
        out.launch_cursors = [(int(P0[p]), int(b0[p])) for p in pos]
        pi = torch.tensor(pos, dtype=torch.long, device=dev)
        out.y = [self.out_buf[l][pi].reshape(-1, geo.HV, geo.K).clone() for l in range(geo.layers)]
        return out


# ------------------------------------------------------------------ the packed varlen adapter


class PackedAdapter(FusedAdapter):
    """The layer between a serving engine and the kernel (module docstring), eager launches.

    Owns the fixed-address per-row buffers a CUDA graph captures."""

    CHECKS = frozenset({"cursors", "trajectory", "ragged", "null_block", "pad_lanes"})
    DEFAULT_CHECKS = frozenset({"null_block", "pad_lanes", "ragged", "trajectory"})
    RAGGED = True
    PAD_A = float("-inf")  # a for pad lanes: softplus(-inf) = 0, so g = 0 (decay 1)

    def __init__(self, target: Target, geo, arm: str = "bf16", device: str = "cpu", seed: int = 0,
                 name: str | None = None):
        super().__init__(target, geo, arm, device, seed, name)
        if geo.blocks < 2:
            raise ValueError("the packed adapter needs blocks >= 2 (block 0 is the NULL block)")
        L, B, T, H, HV, K, io, dev = geo.layers, geo.B, geo.T, geo.H, geo.HV, geo.K, self.io, self.device
        self.q_buf = [torch.zeros(B, T, H, K, dtype=io, device=dev) for _ in range(L)]
        self.k_buf = [torch.zeros(B, T, H, K, dtype=io, device=dev) for _ in range(L)]
        self.v_buf = [torch.zeros(B, T, HV, K, dtype=io, device=dev) for _ in range(L)]
        self.a_buf = [torch.zeros(B, T, HV, dtype=io, device=dev) for _ in range(L)]
        self.b_buf = [torch.zeros(B, T, HV, dtype=io, device=dev) for _ in range(L)]
        self.idx_buf = torch.full((B,), -1, dtype=torch.int32, device=dev)
        self.hist_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self.base_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self.acc_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        self._rows: list[Sched] = []

    def pad_rows_output(self, batch):
        return {f"output[{l}]": self.out_buf[l][len(batch.rows):] for l in range(self.geo.layers)}

    # ---------------------------------------------------------------- decisions (bug sites)
    def _slot_indices(self, blocks: torch.Tensor) -> torch.Tensor:
        """Engine block ids -> kernel slot indices: the NULL block 0 becomes -1 (pad row, M8)."""
        return torch.where(blocks == NULL_BLOCK, torch.full_like(blocks, -1), blocks)

    def _load_cursors(self, rows) -> None:
        """Gather block-keyed cursors into the fixed per-row buffers; pads gather the NULL block's (0, 0)."""
        blocks = torch.tensor([r.block for r in rows] + [NULL_BLOCK] * (self.geo.B - len(rows)),
                              dtype=torch.long, device=self.device)
        self.hist_buf.copy_(self.blk_hist[blocks])
        self.base_buf.copy_(self.blk_base[blocks])

    def _store_cursors(self, rows, hist: torch.Tensor, base: torch.Tensor) -> None:
        """Scatter committed cursors of the real rows back to their blocks (pads are dropped)."""
        if rows:
            blocks = torch.tensor([r.block for r in rows], dtype=torch.long, device=self.device)
            self.blk_hist[blocks] = hist[:len(rows)].to(torch.int32)
            self.blk_base[blocks] = base[:len(rows)].to(torch.int32)

    def _commit(self) -> None:
        """C3 on the per-row buffers with acc_buf, then scatter to the blocks."""
        hist, base = commits.caller_commit(self.hist_buf, self.base_buf, self.acc_buf, self.fmin)
        self.hist_buf.copy_(hist)
        self.base_buf.copy_(base)
        self._store_cursors(self._rows, self.hist_buf, self.base_buf)

    def _after_layer(self, layer: int) -> None:
        """Nothing: the cursors are shared by every layer and committed once per step."""
    def _after_step(self) -> None:
        self._commit()

    def _unpack(self, layer: int, x: torch.Tensor, buf: torch.Tensor, lanes, mask, pad_value: float) -> None:
        """Token-major [N, ...] -> padded [B, T, ...] in place: real lanes copied, the rest pad_value."""
        buf.fill_(pad_value)
        if lanes.shape[0] and x.shape[0]:
            view = buf[: lanes.shape[0]]
            view[mask] = x[lanes[mask]].to(buf.dtype)

    def _gather_outputs(self, layer: int, mask: torch.Tensor) -> torch.Tensor:
        """Real tokens' outputs, token-major [N, HV, V] (query_start_loc order)."""
        return self.out_buf[layer][: mask.shape[0]][mask].clone()

    # ---------------------------------------------------------------- the step
    def stage(self, rows, acts: list[dict], query_start_loc: torch.Tensor, accepted: torch.Tensor):
        """Everything before the launches: resets, cursor gather, slot indices, padded inputs.
        acts: per layer token-major q, k [N, H, K], v [N, HV, V], a, b [N, HV].  Returns the [R, T] real-lane mask."""
        geo, dev = self.geo, self.device
        R, B, T = len(rows), geo.B, geo.T
        self._rows = list(rows)
        self._begin(rows)
        self._load_cursors(rows)
        blocks = torch.tensor([r.block for r in rows] + [NULL_BLOCK] * (B - R), dtype=torch.int32, device=dev)
        self.idx_buf.copy_(self._slot_indices(blocks))
        qsl = query_start_loc.to(dev).long()
        n_real = qsl[1:] - qsl[:-1]
        j = torch.arange(T, device=dev)
        lanes = qsl[:-1, None] + j[None, :]  # [R, T] token id of lane j
        mask = j[None, :] < n_real[:, None]
        for l, x in enumerate(acts):
            for name, buf, pad in (("q", self.q_buf, 0.0), ("k", self.k_buf, 0.0), ("v", self.v_buf, 0.0),
                                   ("a", self.a_buf, self.PAD_A), ("b", self.b_buf, 0.0)):
                self._unpack(l, x[name], buf[l], lanes, mask, pad)
        acc = torch.zeros(B, dtype=torch.int32, device=dev)
        acc[:R] = accepted.to(dev).to(torch.int32)
        self.acc_buf.copy_(acc)
        return mask

    def launch_layer(self, l: int) -> None:
        self.target.launch(self.arm, output=self.out_buf[l], **self._launch_kw(
            l, self.q_buf[l], self.k_buf[l], self.v_buf[l], self.a_buf[l], self.b_buf[l], self.idx_buf,
            self.hist_buf, self.base_buf, restart=False))

    def run_layers(self) -> None:
        for l in range(self.geo.layers):
            self.launch_layer(l)
            self._after_layer(l)

    def step(self, batch: Batch) -> StepOut:
        """Pack the batch token-major (query_start_loc), stage, L launches, one commit."""
        dev, rows = self.device, batch.rows
        pos = batch.positions
        n = torch.tensor([x.n for x in rows], dtype=torch.long)
        qsl = torch.zeros(len(rows) + 1, dtype=torch.long)
        qsl[1:] = torch.cumsum(n, 0)
        acts = []
        for tok in batch.tokens:
            acts.append({name: (torch.cat([x[p, :m] for p, m in zip(pos, n.tolist())]) if rows else x[0, :0])
                         .to(device=dev, dtype=self.io) for name, x in tok.items()})
        mask = self.stage(rows, acts, qsl, torch.tensor([x.accepted for x in rows], dtype=torch.int32))
        out = StepOut(launch_cursors=list(zip(self.hist_buf[:len(rows)].tolist(), self.base_buf[:len(rows)].tolist())))
        self.run_layers()
        out.y = [self._gather_outputs(l, mask) for l in range(self.geo.layers)]
        self._after_step()
        return out


class GraphUnavailable(RuntimeError):
    """CUDA-graph capture needs a CUDA device (and a CUDA build of torch)."""


class GraphedPackedAdapter(PackedAdapter):
    """The packed adapter with the L launches captured once into a torch.cuda.CUDAGraph.

    The first step runs eagerly on a side stream (compile + warm-up), the second captures,
    every later step only replays: staging writes new contents into the fixed-address buffers
    (inputs, slot indices with pad rows, gathered cursors, acceptance) and the commit runs
    eagerly after the replay.  Validated on the H200 (replay equals eager bitwise, T = 4 and 8,
    every arm: docs/h200-results.md, run 4)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise GraphUnavailable(f"CUDA graphs need a CUDA device; got device={self.device}")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.replays = 0

    def run_layers(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return
        # the launches leave hist/base alone (restart=False) but append and fold: save and restore
        # every buffer they write around the warm-up
        written = (*self.pool, *self.k_cache, *self.u_cache, *self.g_cache, *self.out_buf)
        saved = [t.clone() for t in written]
        s = torch.cuda.Stream(device=self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for l in range(self.geo.layers):
                self.launch_layer(l)  # compile / warm-up (not captured)
        torch.cuda.current_stream(self.device).wait_stream(s)
        torch.cuda.synchronize(self.device)
        for dst, src in zip(written, saved):
            dst.copy_(src)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for l in range(self.geo.layers):
                self.launch_layer(l)
        self.graph = g
        g.replay()  # capture does not execute: run this step's work once
        self.replays += 1


# ------------------------------------------------------------------ planted adapter bugs


class NullBlockAsSlotZero(PackedAdapter):
    """[M8] The NULL block id 0 is passed through as slot 0 (no 0 -> -1 translation): pad rows
    become live rows of pool row 0 and append into the NULL block's ring."""

    def _slot_indices(self, blocks):
        return blocks


class PadLanesZeroA(PackedAdapter):
    """[M1] Pad lanes get a = 0 (zero-filled like q/k/v/b) instead of -inf: g = -e^A ln 2,
    so a pad lane's record decays everything before it."""

    PAD_A = 0.0


class RightAlignedGather(PackedAdapter):
    """[M8] Outputs gathered from the last n lanes of each row (as if rows were left-padded):
    a ragged row returns pad lanes' outputs instead of its real tokens'."""

    def _gather_outputs(self, layer, mask):
        return self.out_buf[layer][: mask.shape[0]][mask.flip(1)].clone()


class CommitPerLayer(PackedAdapter):
    """[C3] The cursor commit runs after every layer instead of once per model step: layer
    l > 0 reads layer 0's committed cursors, and hist_len advances L times."""

    def _after_layer(self, layer):
        self._commit()

    def _after_step(self):
        pass


class NoResetOnRecycle(PackedAdapter):
    """[C2-C4 reset] Cursors are reset only when a block is handed out for the first time: a
    recycled block keeps the previous tenant's (hist_len, cache_base), so the new request
    replays the old tenant's ring on top of its own checkpoint."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._ever: set[int] = set()

    def assign(self, rid, block):
        if block not in self._ever:
            super().assign(rid, block)
        self._ever.add(block)


class ResetOnFirstSpecDecode(PackedAdapter):
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


class RequestKeyedCursors(PackedAdapter):
    """[reset, C3] Cursors kept per request id instead of per pool block, reset the first time
    a request id is seen: a request readmitted after preemption (same id, fresh checkpoint)
    resumes its old cursors and replays stale ring records."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._by_rid: dict[int, tuple[int, int]] = {}

    def _needs_reset(self, row):
        return row.rid not in self._by_rid

    def _reset_cursors(self, row):
        self._by_rid[row.rid] = (0, 0)

    def _load_cursors(self, rows):
        cur = [self._by_rid[r.rid] for r in rows] + [(0, 0)] * (self.geo.B - len(rows))
        self.hist_buf.copy_(torch.tensor([c[0] for c in cur], dtype=torch.int32))
        self.base_buf.copy_(torch.tensor([c[1] for c in cur], dtype=torch.int32))

    def _store_cursors(self, rows, hist, base):
        for i, r in enumerate(rows):
            self._by_rid[r.rid] = (int(hist[i]), int(base[i]))

    def cursor(self, rid, block):
        return self._by_rid.get(rid, (0, 0))


class PrefixFromRingStart(PackedAdapter):
    """Planted prefix-cache bug: the prefix is read from ring slot 0, not from the request's cache_base."""

    def materialize(self, target, src, dst, base, count, hist):
        return super().materialize(target, src, dst, 0, count, hist)


class PrefixWholeWindow(PackedAdapter):
    """Planted prefix-cache bug: the whole live window is materialized (count = hist_len), whatever token
    the prefix cache asked for: the state stored is the latest, not the prefix's."""

    def materialize(self, target, src, dst, base, count, hist):
        return super().materialize(target, src, dst, base, hist, hist)


class ForkKeepsCursors(PackedAdapter):
    """Planted prefix-cache bug: the fork's block takes the source's cursors (no handoff reset), so its
    first step replays the source's window again on top of the materialized prefix."""

    def fork(self, rid, src, block):
        self.blk_hist[block] = self.blk_hist[src]
        self.blk_base[block] = self.blk_base[src]


# planted bug -> the check that must catch it
PLANTED: dict[str, tuple[type[PackedAdapter], str]] = {
    "null_block_as_slot_zero": (NullBlockAsSlotZero, "null_block"),
    "pad_lanes_zero_a": (PadLanesZeroA, "pad_lanes"),
    "right_aligned_gather": (RightAlignedGather, "ragged"),
    "commit_per_layer": (CommitPerLayer, "trajectory"),
    "no_reset_on_recycle": (NoResetOnRecycle, "trajectory"),
    "reset_on_first_spec_decode": (ResetOnFirstSpecDecode, "trajectory"),
    "request_keyed_cursors": (RequestKeyedCursors, "trajectory"),
}
# planted bugs of the prefix-cache flow (Engine.prefix_hit; an engine with a materializer finds them)
PREFIX_PLANTED: dict[str, tuple[type[PackedAdapter], str]] = {
    "prefix_from_ring_start": (PrefixFromRingStart, "trajectory"),
    "prefix_whole_window": (PrefixWholeWindow, "trajectory"),
    "fork_keeps_cursors": (ForkKeepsCursors, "trajectory"),
}


# ------------------------------------------------------------------ the Triton baseline


class TritonAdapter(Adapter):
    """SGLang's Triton ReplaySSM baseline as a backend (one layer).

    kernels: targets.triton_baseline.TritonKernels or TorchBaselineModel; cfg: a Triton
    configuration name (triton_io_ckpt); ring: the decode max_cache_len, L: the commit's
    (default 16 + T: the fused lazy flush_min).  Engine block b is the baseline's request
    b - 1 (checkpoint block blocks[b - 1], replay slot b); the handoff reset happens at assign,
    as TritonBaselineServing.admit does.  u: the coarsest of the IO and checkpoint dtypes."""

    CHECKS = frozenset({"cursors", "trajectory", "ragged"})
    DEFAULT_CHECKS = CHECKS

    def __init__(self, kernels, geo, cfg: str = "bf16-ckpt32", device: str = "cpu", seed: int = 0, *,
                 ring: int = RING_SLOTS, L: int | None = None, name: str | None = None):

        super().__init__(geo, device, seed, name or f"triton:{cfg}")
        if geo.layers != 1:
            raise ValueError("the Triton adapter drives one layer")
        self.kernels, self.cfg, self.ring, self.L = kernels, cfg, ring, (16 + geo.T if L is None else L)
        self.io, self.state = triton_io_ckpt(cfg)
        self.u = max(unit_roundoff(self.io), unit_roundoff(self.state))
        self.atol = 0.0
        self.fmin = flush_min_of(self.L, geo.T)
        self.tb = None
        self.last_y = None  # the last step's whole output [B, T, HV, V] (pad rows included)

    def describe(self) -> str:
        return f"TritonAdapter {getattr(self.kernels, 'name', '?')} {self.cfg} ring={self.ring} L={self.L}"

    def set_params(self, A_log, dt_bias):
        g = self.geo
        self.tb = TritonBaselineServing(self.kernels, n_requests=g.blocks - 1, H=g.H, HV=g.HV, K=g.K, V=g.K, T=g.T,
                                        A_log=A_log[0], dt_bias=dt_bias[0], io=self.io, ckpt=self.state,
                                        ring=self.ring, L=self.L, device=str(self.device))

    def write_checkpoint(self, block, states):
        self.tb.h0[self.tb.blocks[block - 1]] = states[0].to(self.state).to(self.tb.dev)

    def assign(self, rid, block):
        s = self.tb.slots[block - 1]
        self.tb.write_pos[s], self.tb.cache_base[s], self.tb.is_flush[s] = 0, 0, 0

    def cursor(self, rid, block):
        wp, base, _ = self.tb.cursors([block - 1])
        return int(wp[0]), int(base[0])

    def rebuild(self, layer, blocks, cursors=None):
        """The baseline's own replay of its committed window (its cursors), float64."""
        return self.tb.logical_state([b - 1 for b in blocks]), None

    def step(self, batch: Batch) -> StepOut:
        rows, T = batch.rows, self.geo.T
        if any(x.n != T for x in rows):
            raise ValueError("the Triton adapter launches whole rows: every row carries T tokens")
        reqs = [rows[j].block - 1 if j >= 0 else -1 for j in batch.order]
        acc = torch.tensor([rows[j].accepted if j >= 0 else 0 for j in batch.order])
        wp, base, _ = self.tb.cursors([x.block - 1 for x in rows])
        tok = batch.tokens[0]
        y = self.tb.step(reqs, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], acc)
        self.last_y = y
        pi = torch.tensor(batch.positions, dtype=torch.long, device=y.device)
        return StepOut(y=[y[pi].reshape(-1, self.geo.HV, self.geo.K).clone()],
                       launch_cursors=list(zip(wp.tolist(), base.tolist())))
