"""The Hypothesis state machine over the serving engine, and a script driver.

`machine_class(target, arms, device, adapter=...)` is a RuleBasedStateMachine that draws one
geometry (dtype arm, T, H/HV, layers, pool, batch bucket, flush_min, commit style, value
regime), builds an Engine with one backend (gdn_fuzz.serving.adapters: "direct", "packed", or
an adapter class such as a planted bug) and then lets Hypothesis pick serving events: admit
into a fresh or a recycled block (with a one-token final prompt chunk where the adapter takes
ragged rows), retire a request that ran its drawn lifetime, preempt and readmit, and steps:
a drawn plan (a subset of the live requests, ragged, drawn acceptance) or every live request
with all / one / random accepted tokens, in sorted or shuffled row order with pad rows.  Every
step runs the engine's checks (gdn_fuzz.serving.engine); a finding fails the run
(EngineFailure, after shrinking).  tests/test_machine.py runs it on the direct adapter,
tests/test_serving_harness.py on the packed one and its planted bugs.

`run_script(target, geo, events, ...)` drives an engine through a list of events without the
state machine (the property tests draw such scripts).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from gdn_fuzz.case import BETAS, DECAYS, KEYS, LEGAL_T, RING_SLOTS, W_RING, Regime, lazy_flush_min
from gdn_fuzz.serving.adapters import COMMITS, DirectAdapter, PackedAdapter
from gdn_fuzz.serving.engine import FOREVER, PREFIX_MAX_COUNT, Engine, Geometry
from gdn_fuzz.targets import Target

HEADS = ((1, 2), (2, 4), (1, 1))  # (H, HV): G = 2, 2, 1
POOLS = (4, 8)  # pool blocks (inclusive range)
BUCKETS = (4, 8)  # batch buckets (power-of-two sizes, D4)
LIFETIMES = (0, 4, 16, 64, FOREVER)
ADAPTERS = {"direct": DirectAdapter, "packed": PackedAdapter}


def make_engine(target: Target, geo: Geometry, arm: str, device: str = "cpu", seed: int = 0, *,
                adapter="direct", commit: str = "caller", checks=None, materializer: Target | None = None) -> Engine:
    """An engine with one backend: adapter "direct" | "packed" | an adapter class; materializer: the prefix
    cache's kernel (Engine.prefix_hit), or None."""
    cls = ADAPTERS[adapter] if isinstance(adapter, str) else adapter
    kw = {"commit": commit} if issubclass(cls, DirectAdapter) else {}
    return Engine(geo, cls(target, geo, arm, device, seed, **kw), device, seed, checks=checks,
                  materializer=materializer)


def plan_rows(live: list, plan, T: int, ragged: bool = True) -> list[tuple]:
    """A drawn step plan [(pick, real tokens, accepted)] -> rows (request id, n, accepted).

    Picks index the live requests cyclically; a request appears once; n is clamped to [1, T]
    (T when the adapter takes whole rows only) and accepted to [1, n]."""
    rows, seen = [], set()
    for i, n, a in plan:
        if not live:
            break
        rid = live[i % len(live)]
        if rid in seen:
            continue
        seen.add(rid)
        n = min(max(n, 1), T) if ragged else T
        rows.append((rid, n, min(max(a, 1), n)))
    return rows


def run_script(target: Target, geo: Geometry, arm: str, events: list[tuple], device: str = "cpu", seed: int = 0, *,
               adapter="packed", checks=None, materializer: Target | None = None) -> Engine:
    """Drive an engine through a list of events; raise EngineFailure on the first finding.

    Events: ("admit", block | None | "recycled", seed, chunk) | ("retire", i) | ("preempt", i, block | None)
            | ("step", seed, [(i, n_real, accepted), ...]) | ("prefix", i, count, block | None) (a prefix hit:
            count is taken modulo the request's tokens since its checkpoint + 1; needs a materializer)
    where i indexes the live requests in admission order (mod their count), n_real / accepted are
    clamped into 1 <= accepted <= n_real <= T; None blocks pick the lowest free block, "recycled"
    the lowest free block an earlier request used.  Events that cannot apply are skipped."""
    eng = make_engine(target, geo, arm, device, seed, adapter=adapter, checks=checks, materializer=materializer)
    for ev in events:
        live = eng.live
        if ev[0] == "admit":
            _, blk, s, chunk = ev
            if not eng.can_admit():
                continue
            free = eng.free_blocks
            if blk == "recycled":
                blk = (eng.recycled_blocks or free)[0]
            eng.admit(blk if blk in free else free[0], s, chunk=chunk and eng.adapter.RAGGED)
        elif ev[0] == "retire" and live:
            eng.retire(live[ev[1] % len(live)])
        elif ev[0] == "preempt" and live:
            rid = live[ev[1] % len(live)]
            dest = [eng.requests[rid].block] + eng.free_blocks
            eng.preempt(rid, ev[2] if ev[2] in dest else dest[0])
        elif ev[0] == "step":
            _, s, plan = ev
            eng.fail(eng.step(plan_rows(live, plan, geo.T, eng.adapter.RAGGED), s).findings)
        elif ev[0] == "prefix" and live and eng.can_admit():
            _, i, count, blk = ev
            eng.fail(_prefix_hit(eng, live[i % len(live)], count, blk)[1])
    return eng


def _prefix_hit(eng: Engine, rid: int, count: int, block=None, lifetime: int = FOREVER):
    """A prefix hit on request rid: count modulo the legal counts (0..tokens since its checkpoint, at most 16);
    block: a free block (default: the lowest)."""
    free = eng.free_blocks
    most = min(len(eng.requests[rid].prefix) - 1, PREFIX_MAX_COUNT)
    return eng.prefix_hit(rid, count % (most + 1), block if block in free else free[0], lifetime=lifetime)


def machine_class(target: Target, arms, device: str = "cpu", *, adapter="direct", checks=None, commits_=COMMITS,
                  Ts=LEGAL_T, heads=HEADS, layers=(1,), name: str = "ServingMachine",
                  materializer: Target | None = None):
    """A RuleBasedStateMachine over one engine (module docstring).

    arms: the dtype arms to draw from; adapter: "direct" | "packed" | an adapter class; checks:
    the engine checks (default: the adapter's); commits_ (direct adapter only), Ts, heads,
    layers: what the initialize rule may draw; materializer: a target of gdn_prefix_materialize, which
    adds the prefix-hit rule (Engine.prefix_hit: a live request's state at a drawn token is materialized
    into a free block and a new request decodes its continuation from there)."""
    arms, commits_, Ts, heads, layers = tuple(arms), tuple(commits_), tuple(Ts), tuple(heads), tuple(layers)
    cls = ADAPTERS[adapter] if isinstance(adapter, str) else adapter
    direct = issubclass(cls, DirectAdapter)
    kind = "machine" if direct else "harness"
    plan_st = st.lists(st.tuples(st.integers(0, 7), st.integers(1, 8), st.integers(1, 8)), min_size=0, max_size=4)

    class ServingMachine(RuleBasedStateMachine):
        """Multi-step serving of one geometry (module docstring of gdn_fuzz.serving.machine)."""

        def __init__(self):
            super().__init__()
            self.e: Engine | None = None
            self.rules_run = 0  # serving events so far (initialize included)

        @initialize(data=st.data())
        def setup(self, data):
            """Draw the geometry, build the engine and its backend, admit the first requests."""
            self.rules_run += 1
            arm = data.draw(st.sampled_from(arms), label="arm")
            T = data.draw(st.sampled_from(Ts), label="T")
            H, HV = data.draw(st.sampled_from(heads), label="(H, HV)")
            L = data.draw(st.sampled_from(layers), label="layers")
            pool = data.draw(st.integers(POOLS[0], POOLS[1]), label="pool")
            B = data.draw(st.sampled_from(BUCKETS), label="B")
            # lazy rule first (what serving uses), then any legal flush_min (H14)
            fmin = data.draw(st.one_of(st.just(lazy_flush_min(T)), st.integers(1, lazy_flush_min(T))),
                             label="flush_min")
            commit = data.draw(st.sampled_from(commits_), label="commit") if direct and L == 1 else "caller"
            regime = Regime(decay=data.draw(st.sampled_from(DECAYS), label="decay"),
                            beta=data.draw(st.sampled_from(BETAS), label="beta"),
                            keys=data.draw(st.sampled_from(KEYS), label="keys"))
            seed = data.draw(st.integers(0, 2**16 - 1), label="seed")
            blocks = pool if direct else pool + 1  # + the NULL block
            geo = Geometry(T, H, HV, L, blocks, B, fmin, regime)
            self.e = make_engine(target, geo, arm, device, seed, adapter=cls, commit=commit, checks=checks,
                                 materializer=materializer)
            self.commit = commit
            # with a materializer, room for a prefix hit from the start (a hit admits a request)
            n0 = data.draw(st.integers(1, max(1, min(B, pool) - (materializer is not None))), label="initial requests")
            for j in range(n0):
                chunk = cls.RAGGED and data.draw(st.booleans(), label="chunk")
                self.e.admit(self.e.free_blocks[0], seed + 1 + j, chunk=chunk)

        @precondition(lambda self: self.e is not None and self.e.can_admit())
        @rule(recycled=st.booleans(), pick=st.integers(0, 7), seed=st.integers(0, 2**16 - 1),
              lifetime=st.sampled_from(LIFETIMES), chunk=st.booleans())
        def admit(self, recycled, pick, seed, lifetime, chunk):
            """A new request: a never-used block, or a recycled one (stale ring and cursors)."""
            self.rules_run += 1
            blocks = (self.e.recycled_blocks if recycled else self.e.fresh_blocks) or self.e.free_blocks
            self.e.admit(blocks[pick % len(blocks)], seed, chunk=chunk and cls.RAGGED, lifetime=lifetime)

        @precondition(lambda self: self.e is not None and any(r.age >= r.lifetime for r in self.e.requests.values()))
        @rule(pick=st.integers(0, 7))
        def retire(self, pick):
            """A request that ran its lifetime leaves; its block keeps the garbage."""
            self.rules_run += 1
            done = [rid for rid in self.e.live if self.e.requests[rid].age >= self.e.requests[rid].lifetime]
            self.e.retire(done[pick % len(done)])

        @precondition(lambda self: self.e is not None and self.e.requests)
        @rule(pick=st.integers(0, 7), where=st.integers(0, 7))
        def preempt(self, pick, where):
            """Preempt a request and readmit it (same block or another free one) as a fresh checkpoint."""
            self.rules_run += 1
            rid = self.e.live[pick % len(self.e.live)]
            dest = [self.e.requests[rid].block] + self.e.free_blocks
            self.e.preempt(rid, dest[where % len(dest)])

        @precondition(lambda self: materializer is not None and self.e is not None and self.e.requests
                      and self.e.can_admit())
        @rule(pick=st.integers(0, 7), count=st.integers(0, 16), recycled=st.booleans(), where=st.integers(0, 7),
              lifetime=st.sampled_from(LIFETIMES))
        def prefix_hit(self, pick, count, recycled, where, lifetime):
            """The prefix cache: a live request's state after a drawn number of its window's tokens is
            materialized into a free block, where a new request decodes the same continuation."""
            self.rules_run += 1
            blocks = (self.e.recycled_blocks if recycled else self.e.fresh_blocks) or self.e.free_blocks
            rid = self.e.live[pick % len(self.e.live)]
            self.e.fail(_prefix_hit(self.e, rid, count, blocks[where % len(blocks)], lifetime)[1])

        @precondition(lambda self: self.e is not None)
        @rule(seed=st.integers(0, 2**16 - 1), plan=plan_st, shuffled=st.booleans())
        def step(self, seed, plan, shuffled):
            """A step over a drawn subset / order of the live requests (ragged rows, drawn acceptance)."""
            self.rules_run += 1
            rows = plan_rows(self.e.live, plan, self.e.geo.T, cls.RAGGED)
            self.e.fail(self.e.step(rows, seed, order="shuffled" if shuffled else "sorted").findings)

        @precondition(lambda self: self.e is not None)
        @rule(seed=st.integers(0, 2**16 - 1), accept=st.sampled_from(("random", "all", "one")),
              shuffled=st.booleans())
        def step_all(self, seed, accept, shuffled):
            """Every live request, T tokens, all / one / random accepted."""
            self.rules_run += 1
            rows = self.e.plan_all(seed, accept)
            self.e.fail(self.e.step(rows, seed, order="shuffled" if shuffled else "sorted").findings)

        @precondition(lambda self: self.e is not None)
        @rule(seed=st.integers(0, 2**16 - 1))
        def step_full(self, seed):
            """Every live request accepts all T tokens (the quickest way to a flush)."""
            self.rules_run += 1
            self.e.fail(self.e.step(self.e.plan_all(seed, "all"), seed, order="shuffled").findings)

        @invariant()
        def cursors_in_range(self):
            """C4: every handed-off request's hist_len in [0, 16] and cache_base in [0, 32) between events."""
            if self.e is None:
                return
            for r in self.e.requests.values():
                if r.handed_off:
                    P, base = self.e.adapter.cursor(r.rid, r.block)
                    assert 0 <= P <= W_RING and 0 <= base < RING_SLOTS, self.e.describe()

        def teardown(self):
            if self.e is not None:
                e = self.e
                event(f"{kind}: commit={self.commit}")
                event(f"{kind}: flushed={e.flushes > 0}")
                event(f"{kind}: ring wrapped={e.wraps > 0}")
                event(f"{kind}: recycled a block={e.recycles > 0}")
                event(f"{kind}: preempted={e.preempts > 0}")
                if materializer is not None:
                    event(f"{kind}: prefix hit={e.prefix_hits > 0}")
                    event(f"{kind}: a fork decoded its source's continuation={e.followed > 0}")
                if cls.RAGGED:
                    event(f"{kind}: ragged rows={e.ragged_rows > 0}")
                    event(f"{kind}: one-token chunk={e.chunks > 0}")
                event(f"{kind}: steps>=100={e.steps >= 100}")
                event(f"{kind}: rules run >= 200={self.rules_run >= 200}")

    ServingMachine.__name__ = ServingMachine.__qualname__ = name
    return ServingMachine


# ------------------------------------------------------------------ settings and running

DEV_MAX_EXAMPLES = int(os.environ.get("GDN_FUZZ_MACHINE_EXAMPLES", "15"))
LONG_RUN_STEPS = 200  # a profile with stateful_step_count >= this is a long (nightly) profile


def machine_settings(base: settings | None = None, *, max_examples: int | None = None, steps: int | None = None,
                     **overrides) -> settings:
    """The active profile's settings for the machine.

    Long profiles (stateful_step_count >= LONG_RUN_STEPS, nightly: 250) run as given.  Short
    profiles (dev, ci: 50 steps) are capped at max_examples (default DEV_MAX_EXAMPLES, env
    GDN_FUZZ_MACHINE_EXAMPLES) and, if given, `steps` steps per example."""
    base = settings.default if base is None else base
    kw = dict(deadline=None, suppress_health_check=list(set(base.suppress_health_check) | {
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much}))
    if base.stateful_step_count < LONG_RUN_STEPS:
        kw["max_examples"] = min(base.max_examples, DEV_MAX_EXAMPLES if max_examples is None else max_examples)
        if steps is not None:
            kw["stateful_step_count"] = steps
    kw.update(overrides)
    return settings(base, **kw)


def run_machine(target: Target, arms, device: str = "cpu", *, settings_: settings | None = None, **kw) -> None:
    """Run the machine as a test (raises on the first broken check, after shrinking)."""
    run_state_machine_as_test(machine_class(target, arms, device, **kw),
                              settings=settings_ if settings_ is not None else machine_settings())
