"""Multi-step speculative decoding against a target: a Hypothesis rule-based state machine.

How the machine tests, in plain words
-------------------------------------
A serving engine keeps, per request, a checkpoint (one pool row) and a 32-slot ring of
per-token records, and it advances both with one kernel launch per decode step followed by
a cursor commit (shared/docs/replayssm-serving.md).  Single-launch tests cannot see bugs that need
several steps to show: a g value stored with the wrong origin that only matters after the
next flush, a commit that slides the ring base on the wrong rows, a recycled pool slot
whose old ring is still reachable, error that piles up over hundreds of folds.

This module plays the engine.  Each machine run fixes one geometry (dtype arm, T, H/HV,
pool size, batch bucket, flush_min, commit style, value regime) and then lets Hypothesis
pick a sequence of serving events:

  admit      a new request takes a never-used pool slot: its checkpoint is a drawn state
             (rounded to the STATE dtype) written into the pool row, cursors (0, 0) -- the
             prefill -> decode handoff.
  recycle    the same, into a slot a previous request used: its ring is left as garbage
             and must be unreachable once the cursors are reset.
  step       one launch of the target for the whole batch: every admitted request (or a
             drawn subset) plus pad rows (slot -1, drawn cursors) up to the bucket size, in
             a drawn row order; q/k/v/a/b come from a drawn seed; each request then accepts
             n in 1..T tokens and the cursors are committed, either by the caller (C3,
             restart_hist_on_flush=False, oracles.commit.caller_commit) or by the kernel
             wrapper in place (C2, restart_hist_on_flush=True) followed by += accepted.
  retire     a request that has run its drawn lifetime leaves; its slot keeps the garbage.
  preempt    a request is preempted and readmitted (same or another free slot): the engine
             replays its checkpoint + window in float64, writes that state back as a fresh
             checkpoint (rounded to STATE) and resets the cursors to (0, 0).  The request's
             truth is unchanged: readmission must not change the logical state.

Beside the target's buffers (in the arm's dtypes, on the target's device) the machine keeps,
per request, a float64 *truth*: the state reached by the plain token-by-token recurrence
over exactly the accepted tokens (oracles.serving.sequential_decode), starting from the
admitted checkpoint.  Invariants, checked after every launch:

  launch      [M1-M7] the launch agrees with the float64 oracle evaluated on the target's
              OWN buffers just before that launch (checks.observe / check_oracle), within
              the arm's tolerance table -- so a bug is caught at the launch that makes it,
              and earlier drift cannot mask or fake a failure.
  writes      [M8, M5, R2, C1] no bit outside the launch's write set changes (other
              requests, idle and retired slots, pad rows' targets, read-only inputs); with
              caller commits the kernel leaves the cursors alone (checks.check_writes).
  cursors     [C2] with restart_hist_on_flush=True the wrapper's in-place commit equals
              oracles.commit.standalone_commit of the cursors before the launch, pad rows
              included; [C3, C4] after the caller's part every request's cursors equal
              oracles.commit.caller_commit of its previous cursors, hist_len equals the
              number of tokens accepted since the last fold, 0 <= hist_len <= 16 and
              0 <= cache_base < 32.
  trajectory  [M3, M6, M7, C4] the logical state rebuilt in float64 from the target's
              buffers (ring.gather_window + ring.replay on checkpoint + window) stays within
              the drift budget of the truth (see DRIFT_C below: measured, with provenance).

ServingHarness holds the state and the checks and can be driven without Hypothesis (the
drift measurement does that); `machine_class(target, arms, device)` wraps it in a
RuleBasedStateMachine for pytest and the nightly profile; `run_machine` runs it.
Measure the drift again with `python -m gdn_fuzz.serving.machine --measure`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from gdn_fuzz.arms import get_arm
from gdn_fuzz.compare import DRIFT_C, drift_unit
from gdn_fuzz.case import BETAS, DECAYS, KEYS, Case, Regime, Row, _decay_params, draw_tokens
from gdn_fuzz.checks import Finding, check_oracle, check_writes, observe
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.oracles.serving import StepInputs, sequential_decode
from gdn_fuzz.targets import Target
from gdn_fuzz.compare import table_for

RING_SLOTS = ring_oracle.RING_SLOTS
W_RING = ring_oracle.W_RING
K_DIM = V_DIM = 128
TS = (4, 8)
HEADS = ((1, 2), (2, 4), (1, 1))  # (H, HV): G = 2, 2, 1
POOLS = (4, 8)  # pool size range (inclusive)
BUCKETS = (4, 8)  # batch buckets (power-of-two sizes, D4)
COMMITS = ("caller", "standalone")
ALL_CHECKS = frozenset({"launch", "writes", "cursors", "trajectory"})

# ------------------------------------------------------------------ geometry and state


@dataclass(frozen=True)
class Geometry:
    """What stays fixed for one machine run."""

    arm: str
    T: int
    H: int
    HV: int
    pool: int
    B: int  # batch bucket: requests + pad rows
    flush_min: int
    commit: str  # "caller" (C3) | "standalone" (C2)
    regime: Regime = field(default_factory=Regime)

    def __post_init__(self):
        if self.T not in TS:
            raise ValueError(f"T={self.T}: the fused kernel supports T in {TS}")
        if not 1 <= self.flush_min <= W_RING - self.T + 1:
            raise ValueError(f"flush_min={self.flush_min} out of [1, {W_RING - self.T + 1}] for T={self.T}")
        if self.commit not in COMMITS:
            raise ValueError(f"commit={self.commit!r}; use one of {COMMITS}")
        if self.HV % self.H:
            raise ValueError(f"HV={self.HV} is not a multiple of H={self.H}")

    @property
    def restart(self) -> bool:
        return self.commit == "standalone"

    @property
    def capacity(self) -> int:
        return min(self.B, self.pool)


@dataclass
class Request:
    rid: int
    slot: int
    truth: torch.Tensor  # [HV, V, K] float64: sequential decode of the accepted tokens
    hist_len: int = 0
    cache_base: int = 0
    age: int = 0  # launches since admission
    lifetime: int = 10**9  # launches before the request may retire
    since_fold: int = 0  # tokens accepted since the checkpoint (C4: must equal hist_len)


class MachineFailure(AssertionError):
    """A serving invariant broke; the message lists the findings and the machine's state."""


class ServingHarness:
    """Target-side buffers + per-request float64 truths, and the invariants (see module doc).

    Every method that launches returns the list of Findings (empty when all is well); the
    state machine turns a non-empty list into a failure.  `checks` selects the invariants.
    """

    def __init__(self, target: Target, geo: Geometry, device: str = "cpu", seed: int = 0,
                 checks=ALL_CHECKS):
        self.target, self.geo, self.device = target, geo, torch.device(device)
        self.checks = frozenset(checks)
        unknown = self.checks - ALL_CHECKS
        if unknown:
            raise ValueError(f"checks={sorted(unknown)} unknown; use a subset of {sorted(ALL_CHECKS)}")
        arm = get_arm(geo.arm)
        self.arm = arm
        gen = torch.Generator().manual_seed(seed)
        NP, H, HV, K, V = geo.pool, geo.H, geo.HV, K_DIM, V_DIM
        dev = self.device
        # model parameters (fixed per run), already in the IO dtype (N4, N5)
        A_log, dt_bias, _ = _decay_params(geo.regime, gen, 1, 1, HV)
        self.A_log = A_log.to(arm.io).to(dev)
        self.dt_bias = dt_bias.to(arm.io).to(dev)
        # target buffers, garbage everywhere until a request is admitted
        self.pool = (torch.randn(NP, HV, V, K, generator=gen) * geo.regime.state_scale).to(arm.state).to(dev)
        self.k_cache = gdn_oracle.l2norm(torch.randn(NP, H, RING_SLOTS, K, generator=gen)).to(arm.ring).to(dev)
        self.u_cache = torch.randn(NP, HV, RING_SLOTS, V, generator=gen).to(arm.ring).to(dev)
        self.g_cache = (-torch.rand(NP, HV, RING_SLOTS, generator=gen) * 4.0).float().to(dev)
        # a persistent output buffer, as a CUDA-graph engine keeps one (pad rows leave it stale)
        self.output = torch.zeros(geo.B, geo.T, HV, V, dtype=arm.io, device=dev)
        self.scale = 1.0 / math.sqrt(K)
        self.requests: dict[int, Request] = {}  # slot -> request
        self.used: set[int] = set()  # slots any request ever held
        self.next_rid = 0
        self.u = drift_unit(arm)
        self.atol = table_for(arm)["fold"].atol
        # statistics (events and the drift measurement)
        self.launches = 0
        self.flushes = 0
        self.wraps = 0
        self.recycles = 0
        self.preempts = 0
        self.worst_drift = 0.0  # max drift / (u sqrt(1 + age) ||truth||), all requests so far
        self.worst_ratio = 0.0  # max drift / budget
        self.last_case: Case | None = None

    # ---------------------------------------------------------------- queries
    @property
    def free_slots(self) -> list[int]:
        return [s for s in range(self.geo.pool) if s not in self.requests]

    @property
    def fresh_slots(self) -> list[int]:
        return [s for s in self.free_slots if s not in self.used]

    @property
    def recycled_slots(self) -> list[int]:
        return [s for s in self.free_slots if s in self.used]

    @property
    def live(self) -> list[int]:
        return sorted(self.requests)

    def can_admit(self) -> bool:
        return len(self.requests) < self.geo.capacity

    def describe(self) -> str:
        g = self.geo
        lines = [f"machine: arm={g.arm} T={g.T} H={g.H} HV={g.HV} pool={g.pool} B={g.B} "
                 f"flush_min={g.flush_min} commit={g.commit} ({'C2' if g.restart else 'C3'}) regime={g.regime}",
                 f"  launches={self.launches} flushes={self.flushes} wraps={self.wraps} "
                 f"recycles={self.recycles} preempts={self.preempts}"]
        for s in self.live:
            r = self.requests[s]
            lines.append(f"  request {r.rid}: slot={s} hist_len={r.hist_len} cache_base={r.cache_base} "
                         f"age={r.age} lifetime={r.lifetime}")
        if self.last_case is not None:
            lines.append("last launch:\n" + self.last_case.describe())
        return "\n".join(lines)

    # ---------------------------------------------------------------- serving events
    def _draw_state(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        S = torch.randn(self.geo.HV, V_DIM, K_DIM, generator=gen) * self.geo.regime.state_scale
        return S.to(self.arm.state).to(self.device)

    def admit(self, slot: int, seed: int, lifetime: int = 10**9) -> Request:
        """Prefill -> decode handoff: checkpoint = a drawn state, cursors (0, 0), truth = the same."""
        if slot in self.requests:
            raise ValueError(f"slot {slot} is held by request {self.requests[slot].rid}")
        if not self.can_admit():
            raise ValueError(f"batch bucket B={self.geo.B} / pool {self.geo.pool} is full")
        if slot in self.used:
            self.recycles += 1
        S = self._draw_state(seed)
        self.pool[slot] = S
        req = Request(self.next_rid, slot, S.double().clone(), lifetime=lifetime)
        self.next_rid += 1
        self.requests[slot] = req
        self.used.add(slot)
        return req

    def retire(self, slot: int) -> None:
        """The request leaves; its pool row and ring stay behind as garbage."""
        del self.requests[slot]

    def rebuilt_states(self, slots: list[int]) -> torch.Tensor:
        """M3: float64 logical states [n, HV, V, K] from the target's pool + ring windows."""
        reqs = [self.requests[s] for s in slots]
        dev = self.device
        idx = torch.tensor(slots, dtype=torch.long, device=dev)
        P = torch.tensor([r.hist_len for r in reqs], dtype=torch.long, device=dev)
        base = torch.tensor([r.cache_base for r in reqs], dtype=torch.long, device=dev)
        k, u, G, valid = ring_oracle.gather_window(self.k_cache, self.u_cache, self.g_cache, idx, P, base,
                                                   self.geo.HV)
        S, _, _ = ring_oracle.replay(self.pool[idx], k, u, G, valid, P)
        return S

    def preempt(self, slot: int, new_slot: int) -> None:
        """Preemption + readmission: fold checkpoint + window (float64 replay) into a fresh
        checkpoint in `new_slot` (rounded to STATE), cursors (0, 0); the truth is unchanged."""
        req = self.requests[slot]
        if new_slot != slot and new_slot in self.requests:
            raise ValueError(f"slot {new_slot} is held by request {self.requests[new_slot].rid}")
        S = self.rebuilt_states([slot])[0]
        del self.requests[slot]
        if new_slot in self.used and new_slot != slot:
            self.recycles += 1
        self.pool[new_slot] = S.to(self.pool.dtype)
        req.slot, req.hist_len, req.cache_base, req.since_fold = new_slot, 0, 0, 0
        self.requests[new_slot] = req
        self.used.add(new_slot)
        self.preempts += 1

    # ---------------------------------------------------------------- one decode step
    def step(self, seed: int, accept: str = "random", order: str = "shuffled") -> list[Finding]:
        """One launch for the batch, the commit, the truth update, and every invariant.

        accept: random (n uniform in 1..T per request) | all (n = T) | one (n = 1)
        order:  sorted (requests first, pads last) | shuffled (random row order)
                | subset (a random subset of the requests, shuffled; the others sit out)
        """
        geo, arm, dev = self.geo, self.arm, self.device
        B, T, H, HV = geo.B, geo.T, geo.H, geo.HV
        gen = torch.Generator().manual_seed(seed)
        slots = self.live
        if order == "subset" and slots:
            keep = torch.rand(len(slots), generator=gen) < 0.6
            slots = [s for s, k in zip(slots, keep.tolist()) if k]
        n_live = len(slots)
        # batch rows: requests then pads; then a row order
        row_slot = slots + [-1] * (B - n_live)
        perm = torch.randperm(B, generator=gen).tolist() if order in ("shuffled", "subset") else list(range(B))
        row_slot = [row_slot[p] for p in perm]
        pad_P = torch.randint(0, W_RING + 1, (B,), generator=gen).tolist()
        pad_base = torch.randint(0, RING_SLOTS, (B,), generator=gen).tolist()
        if accept == "random":
            acc_draw = torch.randint(1, T + 1, (B,), generator=gen).tolist()
        elif accept == "all":
            acc_draw = [T] * B
        elif accept == "one":
            acc_draw = [1] * B
        else:
            raise ValueError(f"accept={accept!r}; use random | all | one")
        rows, accepted = [], []
        for b, s in enumerate(row_slot):
            if s < 0:
                rows.append(Row(-1, pad_P[b], pad_base[b]))
                accepted.append(0)
            else:
                r = self.requests[s]
                rows.append(Row(s, r.hist_len, r.cache_base))
                accepted.append(acc_draw[b])
        reg = geo.regime
        q, k, v, _, _, a, b_ = draw_tokens(reg, gen, B, T, H, HV, K_DIM, V_DIM)
        io = lambda x: x.to(arm.io).to(dev)  # noqa: E731
        case = Case(arm=geo.arm, T=T, H=H, HV=HV, pool=geo.pool, rows=tuple(rows), seed=seed,
                    flush_min=geo.flush_min, restart_hist_on_flush=geo.restart, regime=reg)
        self.last_case = case
        inputs = dict(
            A_log=self.A_log, dt_bias=self.dt_bias, a=io(a), b=io(b_), q=io(q), k=io(k), v=io(v),
            initial_state_source=self.pool, initial_state_indices=torch.tensor(row_slot, dtype=torch.int32, device=dev),
            k_cache=self.k_cache, u_cache=self.u_cache, g_cache=self.g_cache,
            hist_len=torch.tensor([r.hist_len for r in rows], dtype=torch.int32, device=dev),
            cache_base=torch.tensor([r.cache_base for r in rows], dtype=torch.int32, device=dev),
            flush_min=geo.flush_min, restart_hist_on_flush=geo.restart,
        )
        obs = observe(self.target, case, str(dev), inputs=inputs, output=self.output)
        self.launches += 1
        findings: list[Finding] = []
        if obs.error is not None:
            return check_oracle(obs)  # the launch raised on a legal step
        if "launch" in self.checks:
            findings += check_oracle(obs)
        if "writes" in self.checks:
            findings += check_writes(obs)

        # ---- cursors: C2 (wrapper's in-place part) then the caller's part (C3 / += accepted)
        P0 = obs.before["hist_len"].long().cpu()
        b0 = obs.before["cache_base"].long().cpu()
        acc = torch.tensor(accepted, dtype=torch.long)
        if geo.restart:
            P_got, b_got = obs.after["hist_len"].long().cpu(), obs.after["cache_base"].long().cpu()
            P_c2, b_c2 = commits.standalone_commit(P0, b0, geo.flush_min)
            if "cursors" in self.checks and not (torch.equal(P_got, P_c2) and torch.equal(b_got, b_c2)):
                bad = [i for i in range(B) if (P_got[i], b_got[i]) != (P_c2[i], b_c2[i])]
                findings.append(Finding(
                    "machine.cursors", "C2",
                    f"in-place commit (restart_hist_on_flush=True) gave (hist_len, cache_base) = "
                    f"{[(int(P_got[i]), int(b_got[i])) for i in bad]} on rows {bad}; the model "
                    f"(standalone_commit of {[(int(P0[i]), int(b0[i])) for i in bad]}) says "
                    f"{[(int(P_c2[i]), int(b_c2[i])) for i in bad]}", row=bad[0]))
            P_new, b_new = P_got + acc, b_got  # the caller adds `accepted` (C2)
        else:
            P_new, b_new = commits.caller_commit(P0, b0, acc, geo.flush_min)  # C3
        P_c3, b_c3 = commits.caller_commit(P0, b0, acc, geo.flush_min)

        # ---- truth: sequential decode of the accepted tokens of every scheduled request
        live_rows = [i for i, s in enumerate(row_slot) if s >= 0]
        if live_rows:
            li = torch.tensor(live_rows, dtype=torch.long, device=dev)
            S = torch.stack([self.requests[row_slot[i]].truth for i in live_rows])
            tok = StepInputs(q=inputs["q"][li], k=inputs["k"][li], v=inputs["v"][li], a=inputs["a"][li],
                             b=inputs["b"][li], accepted=acc.to(dev)[li])
            S_next, _ = sequential_decode(S, tok, self.A_log, self.dt_bias, self.scale)
        for j, i in enumerate(live_rows):
            r = self.requests[row_slot[i]]
            flushed = int(P0[i]) >= geo.flush_min
            self.flushes += flushed
            self.wraps += int(b0[i]) + int(P0[i]) + T > RING_SLOTS
            r.since_fold = (0 if flushed else r.since_fold) + int(acc[i])
            r.hist_len, r.cache_base = int(P_new[i]), int(b_new[i])
            r.truth = S_next[j]
            r.age += 1
            if "cursors" in self.checks:
                if (int(P_new[i]), int(b_new[i])) != (int(P_c3[i]), int(b_c3[i])):
                    findings.append(Finding(
                        "machine.cursors", "C3",
                        f"request {r.rid}: cursors after the commit ({r.hist_len}, {r.cache_base}) differ "
                        f"from caller_commit(({int(P0[i])}, {int(b0[i])}), accepted={int(acc[i])}) = "
                        f"({int(P_c3[i])}, {int(b_c3[i])})", row=i))
                if not (0 <= r.hist_len <= W_RING and 0 <= r.cache_base < RING_SLOTS):
                    findings.append(Finding("machine.cursors", "C4",
                                            f"request {r.rid}: cursors ({r.hist_len}, {r.cache_base}) out of "
                                            f"[0, 16] x [0, 32)", row=i))
                elif r.hist_len != r.since_fold:
                    findings.append(Finding("machine.cursors", "C4",
                                            f"request {r.rid}: hist_len {r.hist_len} != tokens accepted since "
                                            f"the checkpoint ({r.since_fold})", row=i))
        if "trajectory" in self.checks:
            findings += self.check_trajectory()
        return findings

    # ---------------------------------------------------------------- trajectory
    def drift(self, slots: list[int] | None = None):
        """Per (request, v-head), float64 [n, HV]: (err, allowed, need).

        err     ||rebuilt - truth||_F, the rebuilt state from the target's checkpoint + window (M3)
        allowed DRIFT_C * u * sqrt(1 + age) * ||truth||_F + atol * sqrt(V K)   (the budget)
        need    (err - atol * sqrt(V K))_+ / (u * sqrt(1 + age) * ||truth||_F): the DRIFT_C this
                state needs; what the drift measurement records
        """
        slots = self.live if slots is None else slots
        reqs = [self.requests[s] for s in slots]
        S = self.rebuilt_states(slots)
        truth = torch.stack([r.truth for r in reqs])
        err = (S - truth).pow(2).sum((-2, -1)).sqrt()
        den = truth.pow(2).sum((-2, -1)).sqrt()
        ages = torch.tensor([r.age for r in reqs], dtype=torch.float64, device=err.device)
        scaled = self.u * torch.sqrt(1.0 + ages)[:, None] * den  # [n, HV]
        floor = self.atol * math.sqrt(V_DIM * K_DIM)
        need = torch.nan_to_num((err - floor).clamp_min(0.0) / scaled.clamp_min(1e-300), nan=float("inf"))
        return err, DRIFT_C * scaled + floor, need

    def check_trajectory(self) -> list[Finding]:
        """[M3, M6, M7, C4] rebuilt state vs truth within the drift budget (DRIFT_C, module top)."""
        slots = self.live
        if not slots:
            return []
        err, allowed, need = self.drift(slots)
        ratio = torch.nan_to_num(err / allowed.clamp_min(1e-300), nan=float("inf"))
        self.worst_drift = max(self.worst_drift, float(need.max()))
        self.worst_ratio = max(self.worst_ratio, float(ratio.max()))
        if float(ratio.max()) <= 1.0:
            return []
        flat = int(torch.argmax(ratio))
        i, h = divmod(flat, ratio.shape[1])
        r = self.requests[slots[i]]
        rel = float(err[i, h]) / max(float(r.truth[h].norm()), 1e-300)
        return [Finding("machine.trajectory", "M3",
                        f"request {r.rid} (slot {r.slot}, age {r.age}, hist_len {r.hist_len}, base "
                        f"{r.cache_base}): the state rebuilt from the target's checkpoint + window is "
                        f"{rel:.3e} (relative) from the sequential truth; budget DRIFT_C={DRIFT_C:.3g} x "
                        f"u={self.u:.3g} x sqrt(1 + age) (+ atol floor {self.atol:.1e}/element)",
                        head=h, value=float(ratio[i, h]), tol=1.0)]


# ------------------------------------------------------------------ the Hypothesis machine

LIFETIMES = (4, 16, 64, 10**9)


def machine_class(target: Target, arms, device: str = "cpu", *, checks=ALL_CHECKS,
                  commits_=COMMITS, Ts=TS, heads=HEADS, name: str = "ServingMachine"):
    """A RuleBasedStateMachine class bound to one target (see the module docstring).

    arms: the dtype arms to draw from; checks: which invariants run (a subset of
    ALL_CHECKS, e.g. {"trajectory"} alone to show the drift budget still has power);
    commits_/Ts/heads narrow what the initialize rule draws.
    """
    arms = tuple(arms)
    commits_, Ts, heads = tuple(commits_), tuple(Ts), tuple(heads)

    class ServingMachine(RuleBasedStateMachine):
        """Multi-step serving of one geometry against the target (module docstring of gdn_fuzz.serving.machine)."""

        def __init__(self):
            super().__init__()
            self.h: ServingHarness | None = None
            self.rules_run = 0  # serving events so far (initialize included)

        def _fail_if(self, findings):
            if findings:
                raise MachineFailure("\n".join([str(f) for f in findings] + [self.h.describe()]))

        @initialize(data=st.data())
        def setup(self, data):
            """Draw the geometry, allocate the target's buffers, admit the first requests."""
            self.rules_run += 1
            arm = data.draw(st.sampled_from(arms), label="arm")
            T = data.draw(st.sampled_from(Ts), label="T")
            H, HV = data.draw(st.sampled_from(heads), label="(H, HV)")
            pool = data.draw(st.integers(POOLS[0], POOLS[1]), label="pool")
            B = data.draw(st.sampled_from(BUCKETS), label="B")
            # lazy rule first (what serving uses), then any legal flush_min (H14)
            fmax = W_RING - T + 1
            flush_min = data.draw(st.one_of(st.just(fmax), st.integers(1, fmax)), label="flush_min")
            commit = data.draw(st.sampled_from(commits_), label="commit")
            regime = Regime(decay=data.draw(st.sampled_from(DECAYS), label="decay"),
                            beta=data.draw(st.sampled_from(BETAS), label="beta"),
                            keys=data.draw(st.sampled_from(KEYS), label="keys"))
            seed = data.draw(st.integers(0, 2**16 - 1), label="seed")
            geo = Geometry(arm, T, H, HV, pool, B, flush_min, commit, regime)
            self.h = ServingHarness(target, geo, device, seed, checks)
            n0 = data.draw(st.integers(1, geo.capacity), label="initial requests")
            for j in range(n0):
                self.h.admit(j, seed + 1 + j)

        @precondition(lambda self: self.h is not None and self.h.can_admit() and self.h.fresh_slots)
        @rule(pick=st.integers(0, 7), seed=st.integers(0, 2**16 - 1), lifetime=st.sampled_from(LIFETIMES))
        def admit(self, pick, seed, lifetime):
            """A new request in a never-used slot (prefill -> decode handoff, cursors (0, 0))."""
            self.rules_run += 1
            fs = self.h.fresh_slots
            self.h.admit(fs[pick % len(fs)], seed, lifetime)

        @precondition(lambda self: self.h is not None and self.h.can_admit() and self.h.recycled_slots)
        @rule(pick=st.integers(0, 7), seed=st.integers(0, 2**16 - 1), lifetime=st.sampled_from(LIFETIMES))
        def recycle(self, pick, seed, lifetime):
            """A new request in a slot a previous request used: the old ring must be unreachable."""
            self.rules_run += 1
            rs = self.h.recycled_slots
            self.h.admit(rs[pick % len(rs)], seed, lifetime)

        @precondition(lambda self: self.h is not None and any(
            r.age >= r.lifetime for r in self.h.requests.values()))
        @rule(pick=st.integers(0, 7))
        def retire(self, pick):
            """A request that ran its lifetime leaves; its slot keeps the garbage."""
            self.rules_run += 1
            done = [s for s, r in sorted(self.h.requests.items()) if r.age >= r.lifetime]
            self.h.retire(done[pick % len(done)])

        @precondition(lambda self: self.h is not None and self.h.requests)
        @rule(pick=st.integers(0, 7), where=st.integers(0, 7))
        def preempt(self, pick, where):
            """Preempt a request and readmit it (same slot or another free one) as a fresh checkpoint."""
            self.rules_run += 1
            live = self.h.live
            s = live[pick % len(live)]
            dest = [s] + self.h.free_slots
            self.h.preempt(s, dest[where % len(dest)])

        @precondition(lambda self: self.h is not None)
        @rule(seed=st.integers(0, 2**16 - 1), accept=st.sampled_from(("random", "all", "one")),
              order=st.sampled_from(("shuffled", "sorted", "subset")))
        def step(self, seed, accept, order):
            """One launch + commit; the launch, writes, cursors and trajectory invariants."""
            self.rules_run += 1
            self._fail_if(self.h.step(seed, accept, order))

        @precondition(lambda self: self.h is not None)
        @rule(seed=st.integers(0, 2**16 - 1))
        def step_full(self, seed):
            """One launch where every request accepts all T tokens (fastest way to the flush)."""
            self.rules_run += 1
            self._fail_if(self.h.step(seed, "all", "shuffled"))

        @precondition(lambda self: self.h is not None)
        @rule(seed=st.integers(0, 2**16 - 1))
        def step_random(self, seed):
            """One launch with random accept counts (a second launch rule: launches dominate)."""
            self.rules_run += 1
            self._fail_if(self.h.step(seed, "random", "shuffled"))

        @invariant()
        def cursors_in_range(self):
            """C4: every request's hist_len in [0, 16] and cache_base in [0, 32) between events."""
            if self.h is None:
                return
            for r in self.h.requests.values():
                assert 0 <= r.hist_len <= W_RING and 0 <= r.cache_base < RING_SLOTS, self.h.describe()

        def teardown(self):
            if self.h is not None:
                h = self.h
                event(f"machine: commit={h.geo.commit}")
                event(f"machine: flushed={h.flushes > 0}")
                event(f"machine: ring wrapped={h.wraps > 0}")
                event(f"machine: recycled a slot={h.recycles > 0}")
                event(f"machine: launches>=100={h.launches >= 100}")
                event(f"machine: rules run >= 200={self.rules_run >= 200}")

    ServingMachine.__name__ = ServingMachine.__qualname__ = name
    return ServingMachine


# ------------------------------------------------------------------ settings and running

DEV_MAX_EXAMPLES = int(os.environ.get("GDN_FUZZ_MACHINE_EXAMPLES", "15"))
LONG_RUN_STEPS = 200  # a profile with stateful_step_count >= this is a long (nightly) profile


def machine_settings(base: settings | None = None, **overrides) -> settings:
    """The active profile's settings for the machine.

    stateful_step_count always comes from the profile (nightly: 250).  Short profiles
    (dev, ci: 50 steps) are capped at DEV_MAX_EXAMPLES examples (env
    GDN_FUZZ_MACHINE_EXAMPLES) so the CPU run stays under a minute; long profiles run
    their max_examples as given.
    """
    base = settings.default if base is None else base
    n = base.max_examples
    if base.stateful_step_count < LONG_RUN_STEPS:
        n = min(n, DEV_MAX_EXAMPLES)
    kw = dict(max_examples=n, deadline=None,
              suppress_health_check=list(set(base.suppress_health_check)
                                         | {HealthCheck.too_slow, HealthCheck.data_too_large}))
    kw.update(overrides)
    return settings(base, **kw)


def run_machine(target: Target, arms, device: str = "cpu", *, settings_: settings | None = None, **kw) -> None:
    """Run the machine as a test (raises on the first broken invariant, after shrinking)."""
    run_state_machine_as_test(machine_class(target, arms, device, **kw),
                              settings=settings_ if settings_ is not None else machine_settings())


# ------------------------------------------------------------------ drift measurement


def measure_drift(target: Target, geo: Geometry, device: str = "cpu", *, steps: int = 200, seed: int = 0,
                  preempt_every: int = 50) -> dict:
    """Drive the harness without Hypothesis: full batch, random accepts, a preemption every
    `preempt_every` launches; returns the worst drift / (u sqrt(1 + age) ||truth||) and
    stats.  Launch, write and cursor checks run too (a finding raises)."""
    import random

    rnd = random.Random(seed)
    h = ServingHarness(target, geo, device, seed, checks=ALL_CHECKS - {"trajectory"})
    for j in range(geo.capacity):
        h.admit(j, seed * 1000 + j)
    worst, worst_age = 0.0, 0
    for i in range(steps):
        f = h.step(rnd.randrange(2**16), "random", "shuffled")
        if f:
            raise MachineFailure("\n".join([str(x) for x in f] + [h.describe()]))
        _, _, need = h.drift()
        if float(need.max()) > worst:
            worst = float(need.max())
            worst_age = h.requests[h.live[int(need.amax(1).argmax())]].age
        if preempt_every and (i + 1) % preempt_every == 0:
            live = h.live
            s = live[rnd.randrange(len(live))]
            h.preempt(s, rnd.choice([s] + h.free_slots))
    return {"worst": worst, "worst_age": worst_age, "launches": h.launches, "flushes": h.flushes,
            "wraps": h.wraps, "preempts": h.preempts}


def _measure_main(argv=None) -> None:
    """`python -m gdn_fuzz.serving.machine --measure`: the drift grid behind DRIFT_C (see the module top).

    Grid: arm x T x decay x beta x seed; keys cycle through KEYS, flush_min alternates between
    the lazy rule (17 - T) and 1 (a fold every launch: the most STATE roundings), the commit
    style alternates with the seed.  Geometry H=2, HV=4, pool 8, B 8 (every slot busy).
    """
    import argparse
    import json
    import time

    from gdn_fuzz.arms import ARM_NAMES
    from gdn_fuzz.targets import get_target

    ap = argparse.ArgumentParser(description="measure the trajectory drift of a target")
    ap.add_argument("--measure", action="store_true", required=True)
    ap.add_argument("--target", default="reference")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARM_NAMES))
    ap.add_argument("--decays", default=",".join(DECAYS))
    ap.add_argument("--betas", default=",".join(BETAS))
    ap.add_argument("--Ts", default="4,8")
    ap.add_argument("--json", default=None, help="write every run's numbers here")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        torch.set_num_threads(1)
    t = get_target(a.target)
    per_arm: dict[str, float] = {}
    runs = []
    t0 = time.time()
    n = 0
    for arm in a.arms.split(","):
        for T in map(int, a.Ts.split(",")):
            for decay in a.decays.split(","):
                for beta in a.betas.split(","):
                    for s in range(a.seeds):
                        keys = KEYS[n % len(KEYS)]
                        fmin = (W_RING - T + 1) if (n // len(KEYS)) % 2 == 0 else 1
                        n += 1
                        geo = Geometry(arm, T, 2, 4, 8, 8, fmin, COMMITS[s % 2],
                                       Regime(decay=decay, beta=beta, keys=keys))
                        m = measure_drift(t, geo, a.device, steps=a.steps, seed=s)
                        per_arm[arm] = max(per_arm.get(arm, 0.0), m["worst"])
                        m.update(arm=arm, T=T, decay=decay, beta=beta, keys=keys, flush_min=fmin,
                                 commit=geo.commit, seed=s)
                        runs.append(m)
                        print(f"{arm:20s} T={T} decay={decay:6s} beta={beta:5s} keys={keys:9s} fmin={fmin:2d} "
                              f"seed={s} need={m['worst']:.3f} (age {m['worst_age']}) flushes={m['flushes']} "
                              f"wraps={m['wraps']} ({time.time() - t0:.0f}s)", flush=True)
    print("worst need per arm:", {k: round(v, 3) for k, v in per_arm.items()})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"target": a.target, "device": a.device, "steps": a.steps, "torch": torch.__version__,
                       "per_arm": per_arm, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    _measure_main()
