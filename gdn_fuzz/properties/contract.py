"""Contract properties beyond one oracle comparison: illegal calls, the in-place commit, extreme gates,
weights reloaded in place.

The properties (PROPERTIES below; gdn_fuzz.properties lists them)
-----------------------------------------------------------------
guards      H4, H6, H9-H11, H13, H14: the target is called with illegal inputs (T = 6,
            flush_min = 0 and 18 - T, hist_len 17 and -1 and cache_base 32 and None with
            restart_hist_on_flush=True, q/k/v/a/b in the other IO dtype, an fp32 pool, an fp32
            u ring, int64 hist_len) and must raise what its release model says (the exception
            type of the first check that fires, a message naming the argument where the model
            says so: gdn_fuzz.properties.hostchecks).  Finding prop "guard.<clause>.<scenario>".
commit      C2: with restart_hist_on_flush=True (pad rows given in-range cursors, since the
            host commits them too), the cursors after the call equal
            oracles.commit.standalone_commit of the cursors before, and y and every buffer are
            bitwise those of the same launch with restart_hist_on_flush=False (the commit runs
            after the launch).  Finding prop "commit.cursors.<name>" / "commit.launch_bits.<buffer>".
extremes    N2 as containment: a gate logit a + dt_bias ~ 120 on v-head 0; that head (y, u, g, fold)
            may match the float64 oracle or show the documented non-finite outcome, everything else
            must match the oracle and the write set.  Finding prop "extremes.oracle.<output>" / "extremes.writes.*".
params_inplace  N5: A_log and dt_bias given as fp32 or IO-dtype, contiguous or strided sources
            (drawn from the seed), launched once, reloaded IN PLACE with new values, launched again
            on fresh inputs: the second launch must match the float64 oracle of the new values (the
            released wrapper's id()-keyed cast cache serves the stale cast there, so this fails on
            it for every source that is not a contiguous IO tensor).  Finding prop
            "params_inplace.oracle" [N5] (one per launch, whatever outputs, rows or sources show it).

Not a property any more: the rounding-point ("precision") check.  It counted fp16 values whose
low 3 mantissa bits are zero and failed above 3/4.  No single element can show a violation of
N3 (a bf16-valued u record is a legal single rounding of some f32 value; U = R exactly when the
solve has nothing to subtract), so the rule was a statistical hunch and raised false alarms on
correct code (issue 14).  The measurement lives on in `gdn-fuzz precision` (rounding_pattern).

"""

from __future__ import annotations

import dataclasses
import random

import torch

from gdn_fuzz.properties import hostchecks
from gdn_fuzz.properties.base import Property, not_exercised, note
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.checks import check_oracle, check_writes, measure, oracle_metrics
from gdn_fuzz.findings import BITS_DIFFER, Finding, NON_FINITE, OUT_OF_TOLERANCE, WRONG_VALUE, launch_record, raised
from gdn_fuzz.observation import clone_inputs, observe, same_bits
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.targets import Target


# ------------------------------------------------------------------ guards (H*)

# (scenario id, change id): the illegal calls the guards property makes on the inputs of a drawn case
# (gdn_fuzz.properties.hostchecks.CHANGES); the scenario ids are what findings and reproducers name
GUARD_SCENARIOS = (
    ("T", "T=6"),
    ("flush_min_zero", "flush_min=0"),
    ("flush_min_cap", "flush_min=18-T"),
    ("hist_len_high", "restart-hist_len=17"),
    ("hist_len_negative", "restart-hist_len=-1"),
    ("cache_base_high", "restart-cache_base=32"),
    ("cache_base_none", "restart-cache_base=None"),
    *[(f"{n}_dtype", f"{n}-other-half") for n in ("q", "k", "v", "a", "b")],
    ("state_dtype", "pool-fp32"),
    ("u_cache_dtype", "u_cache-fp32"),
    ("hist_len_dtype", "hist_len-int64"),
)


def guard_case(case: Case) -> Case:
    """The Case the guards property's illegal calls start from: the case with
    restart_hist_on_flush=False (each scenario sets what it needs)."""
    return dataclasses.replace(case, restart_hist_on_flush=False)


def _scenario(scenario: str) -> hostchecks.Change:
    for sid, cid in GUARD_SCENARIOS:
        if sid == scenario:
            return hostchecks.get_change(cid)
    raise ValueError(f"guard scenario {scenario!r} is unknown; use one of {', '.join(s for s, _ in GUARD_SCENARIOS)}")


def guard_inputs(case: Case, scenario: str, device="cpu", base: dict | None = None) -> dict:
    """The keyword arguments of one illegal call of check_guards (transformation "guard" of
    gdn_fuzz.engine.reproducer: {"scenario": id}); `base`: materialize(guard_case(case), device) when the
    caller has it (it is cloned, not changed)."""
    change = _scenario(scenario)
    base = materialize(guard_case(case), device) if base is None else clone_inputs(base)
    return hostchecks.apply_changes(base, case.arm, [change])


def check_guards(target: Target, case: Case, device="cpu") -> list[Finding]:
    """H4, H6, H9-H11, H13, H14: every illegal call raises what the target's release model says.

    Each scenario is one change of the case's own inputs (GUARD_SCENARIOS); the expectation is the
    first check of the target's release model (Target.release) that fires for that call
    (hostchecks.expect), held by clause: the exception type, and that the message names the
    argument where the model says so, never the wording.  A scenario the model says passes every
    host check (an entry that does not validate it: sm100 never range-checks hist_len) is not
    launched (Hypothesis event "guards: nothing exercised: ...").  Check id guard.<clause>.<scenario>.
    Each finding carries its call (Finding.launch): guard_case(case) and the transformation "guard"
    {"scenario": id}."""
    detected = target.release
    rel = detected.release
    em = rel.entry(target.model_entry)
    gcase = guard_case(case)
    out = []
    base = materialize(gcase, device)  # once: each scenario changes a copy
    mod = target.module(case.arm)
    for sid, cid in GUARD_SCENARIOS:
        change = hostchecks.get_change(cid)
        if case.arm not in change.arms or case.arm not in em.arms:
            continue
        kwargs = guard_inputs(case, sid, device, base)
        try:
            want = hostchecks.expect_for(rel, target.model_entry, [change], kwargs, case.arm_spec, mod)
        except hostchecks.NotModelled as e:
            not_exercised("guards", f"scenario {sid}: {e}")
            continue
        if want.check is None:
            not_exercised("guards", f"scenario {sid}: the {rel.version} model of {em.name} does not refuse it")
            continue
        got = hostchecks.observe_call(lambda **kw: target.launch(case.arm, **kw), kwargs)
        problem = hostchecks.judge(want, got)
        if problem is None:
            continue
        clause = want.check.clause
        rec = launch_record(gcase, "guard", {"scenario": sid}, given=case,
                            note=f"the illegal call guard {sid!r}: {change.id}, on the inputs of the case")
        outcome = "returned normally" if got.exc is None else raised(got.message, got.exc)
        out.append(Finding(f"guard.{clause}.{sid}", clause,
                           f"illegal call ({change.id}): {problem} (release model {detected})",
                           outcome=outcome, launch=rec))
    return out


# ------------------------------------------------------------------ commit (C2)


def _pad_cursors(case: Case) -> list[tuple[int, int]]:
    """(hist_len, cache_base) of every pad row, drawn from the seed: in range, P >= flush_min often."""
    rng = random.Random(f"{case.seed}:commit")
    out = []
    for r in case.rows:
        if r.pad:
            out.append((rng.choice([case.fmin, 16, rng.randint(0, 16)]), rng.randrange(32)))
    return out


def commit_case(case: Case) -> Case:
    """The launch check_commit runs, as a Case: restart_hist_on_flush=True, and pad rows given
    in-range cursors drawn from the seed (the host commits them too, C2; a drawn pad row has
    P = 0, base = 0).  A case that already has restart_hist_on_flush=True runs as written (its
    pad rows' cursors verbatim), so commit_case(commit_case(c)) == commit_case(c) and the Case a
    commit finding prints is one that check_commit runs unchanged.  materialize() uses rows'
    cursors verbatim, so materialize(commit_case(c)) is exactly the launch."""
    if case.restart_hist_on_flush:
        return case
    pads = iter(_pad_cursors(case))
    rows = tuple(Row(r.slot, *next(pads)) if r.pad else r for r in case.rows)
    return dataclasses.replace(case, rows=rows, restart_hist_on_flush=True)


def commit_inputs(case: Case, device="cpu") -> dict:
    """The tensors check_commit launches: materialize(commit_case(case)) with
    restart_hist_on_flush=False (the launch with True adds nothing but that flag)."""
    return materialize(dataclasses.replace(commit_case(case), restart_hist_on_flush=False), device)


def check_commit(target: Target, case: Case, device="cpu") -> list[Finding]:
    """C2: the standalone commit of restart_hist_on_flush=True, pad rows included, and nothing else.

    The launch is commit_case(case) (restart_hist_on_flush=True, pad rows with cursors): its
    committed cursors must equal oracles.commit.standalone_commit of the cursors before; it is
    compared bit for bit with the same inputs launched with restart_hist_on_flush=False.
    Findings carry commit_case(case) as their launch (Finding.launch).
    """
    ccase = commit_case(case)
    inputs = commit_inputs(case, device)
    before = clone_inputs(inputs)
    plain = launch_record(ccase, given=case)
    twin = launch_record(ccase, given=case, note="compared with the same inputs launched with "
                                                 "restart_hist_on_flush=False")
    off = launch_record(ccase, "override", {"restart_hist_on_flush": False}, given=case,
                        note="the same inputs launched with restart_hist_on_flush=False")
    a = observe(target, dataclasses.replace(ccase, restart_hist_on_flush=False), device, inputs=clone_inputs(inputs))
    b = observe(target, ccase, device, inputs=dict(clone_inputs(inputs), restart_hist_on_flush=True))
    for obs, tag, rec in ((a, "restart_hist_on_flush=False", off), (b, "restart_hist_on_flush=True", plain)):
        if obs.error is not None:
            return [Finding("commit.launch", "H*", f"a legal launch ({tag}) raised {type(obs.error).__name__}: "
                            f"{obs.error}", outcome=raised(obs.error), launch=rec)]
    want_len, want_base = commits.standalone_commit(before["hist_len"], before["cache_base"], case.fmin)
    idx = before["initial_state_indices"].long().tolist()
    P0 = before["hist_len"].long().tolist()
    out = []
    for name, want in (("hist_len", want_len), ("cache_base", want_base)):
        got = b.after[name].long()
        bad = (got != want.to(got.device)).nonzero().flatten().tolist()
        if bad:
            r = bad[0]
            kind = "pad" if idx[r] < 0 else ("flush" if P0[r] >= case.fmin else "verify")
            out.append(Finding(f"commit.cursors.{name}", "C2",
                               f"{name} after the in-place commit is {got[r].item()}, expected {int(want[r])} "
                               f"(P={int(before['hist_len'][r])}, base={int(before['cache_base'][r])}, "
                               f"flush_min={case.fmin}, {kind} row; {len(bad)} rows differ)",
                               row=r, outcome=WRONG_VALUE, family=kind, launch=plain))
    live = inputs["initial_state_indices"].long() >= 0
    if isinstance(a.output, torch.Tensor) and isinstance(b.output, torch.Tensor):
        d = ~same_bits(a.output, b.output) & live[:, None, None, None]
        if bool(d.any()):
            out.append(Finding("commit.launch_bits.y", "C2", "y of a live row differs between restart_hist_on_flush "
                               "True and False (the commit must run after the launch)",
                               row=int(d.nonzero()[0, 0]), outcome=BITS_DIFFER, launch=twin))
    for name in ("initial_state_source", "k_cache", "u_cache", "g_cache"):
        if not bool(same_bits(a.after[name], b.after[name]).all()):
            out.append(Finding(f"commit.launch_bits.{name}", "C2", f"{name} after differs between "
                               "restart_hist_on_flush True and False (the commit must touch nothing but the cursors)",
                               outcome=BITS_DIFFER, launch=twin))
    return out


# ------------------------------------------------------------------ extremes (N2)

EXTREME_LOGIT = 120.0  # a on v-head 0: a + dt_bias >> 88.7, where e^x overflows f32
EXTREME_HEAD = 0


def gate_inputs(inputs: dict, params: dict) -> dict:
    """Transformation "extremes.gate": a = params["a"] on v-head params["v_head"], every row and token."""
    inputs["a"][:, :, int(params["v_head"])] = float(params["a"])
    return inputs


def extreme_inputs(case: Case, device="cpu") -> dict:
    """The launch check_extremes runs: the case's tensors with a = 120 on v-head 0, every token."""
    return gate_inputs(materialize(case, device), {"v_head": EXTREME_HEAD, "a": EXTREME_LOGIT})


def check_extremes(target: Target, case: Case, device="cpu") -> list[Finding]:
    """N2, as containment: a gate logit a + dt_bias ~ 120 on v-head 0 (every token) is outside
    what the released kernel computes exactly (no softplus threshold: g = -inf there, then NaN).

    The contract allows either outcome for that head: y, the u and g records and, on flush rows,
    the folded checkpoint of v-head 0 match the float64 oracle within the arm's tolerance, OR
    they are non-finite (the documented overflow; N2 lists the pool row among what a poisoned
    head damages).  Nothing outside that head may suffer: every other head's outputs, records
    and folds, and the k records (N2: the k ring is unaffected), match the oracle, and nothing
    outside the write set changes (M8).  A finite value of head 0 that matches neither is a
    finding, and so is any damage elsewhere.  Check ids extremes.oracle.<output>, extremes.writes.*.
    (The released kernel does write a non-finite fold here: run 9 of docs/h200-results.md.)
    Findings carry the launch: the case and the transformation "extremes.gate" {"v_head": 0, "a": 120}.
    """
    params = {"v_head": EXTREME_HEAD, "a": EXTREME_LOGIT}
    rec = launch_record(case, "extremes.gate", params,
                        note=f"a = {EXTREME_LOGIT:g} on v-head {EXTREME_HEAD} (every row and token) on the case's inputs")
    inputs = gate_inputs(materialize(case, device), params)
    obs = observe(target, case, device, inputs=inputs)
    if obs.error is not None:
        return [Finding("extremes.launch", "H*", f"a launch with a + dt_bias ~ {EXTREME_LOGIT:g} raised "
                        f"{type(obs.error).__name__}: {obs.error}", outcome=raised(obs.error), launch=rec)]
    e, sums = measure(obs)
    metrics = oracle_metrics(obs, e, sums)
    for name in ("y", "u", "g", "fold"):  # v-head 0: the documented non-finite outcome is allowed (N2)
        m = metrics[name]
        m.ratio[:, 0] = torch.where(torch.isinf(m.rel[:, 0]), torch.zeros_like(m.ratio[:, 0]), m.ratio[:, 0])
    out = []
    for f in check_oracle(obs, e, metrics) + check_writes(obs):
        out.append(dataclasses.replace(f, prop=f"extremes.{f.prop}", message=(
            f"with a + dt_bias ~ {EXTREME_LOGIT:g} on v-head 0: " + f.message), launch=rec))
    return out


# ------------------------------------------------------------------ params_inplace (N5)

# Where A_log and dt_bias live between the two launches (the cast cache of N5 keys on the source):
# the dtype (fp32: always cast; io: the arm's IO dtype) and the layout (a contiguous tensor, or a
# stride-2 view of a buffer twice as long whose other half holds NaN: a kernel that read it
# densely would show NaN).  Drawn independently for A_log and for dt_bias from the case's seed.
PARAM_SOURCES = ("fp32", "fp32_strided", "io", "io_strided")
PARAM_SHIFT = (0.1, 0.6)  # |new - old| of A_log and of dt_bias, per head, before IO rounding


def params_plan(case: Case) -> dict:
    """What check_params_inplace does to the case, drawn from its seed (a pure function of it):
    the source kind of A_log and of dt_bias (PARAM_SOURCES) and, per v-head, the signed shifts of
    the reload (|shift| in PARAM_SHIFT, so every head's new value differs from its old one by
    many IO ulps: the reload always changes g)."""
    rng = random.Random(f"{case.seed}:params_inplace")
    plan = {"A_log": rng.choice(PARAM_SOURCES), "dt_bias": rng.choice(PARAM_SOURCES)}
    for name in ("A_log", "dt_bias"):
        plan[name + "_shift"] = [rng.choice((-1.0, 1.0)) * rng.uniform(*PARAM_SHIFT) for _ in range(case.HV)]
    return plan


def _param_source(values_io: torch.Tensor, kind: str) -> torch.Tensor:
    """A fresh tensor object of `kind` (PARAM_SOURCES) holding values_io (IO-rounded values)."""
    dtype = torch.float32 if kind.startswith("fp32") else values_io.dtype
    if not kind.endswith("_strided"):
        return values_io.to(dtype).clone()
    buf = torch.full((2 * values_io.numel(),), float("nan"), dtype=dtype, device=values_io.device)
    view = buf[::2]
    view.copy_(values_io)
    return view


def _source_text(t: torch.Tensor, kind: str) -> str:
    dt = str(t.dtype).replace("torch.", "")
    if kind.endswith("_strided"):
        return f"{dt} stride-2 view" + ("" if not t.is_contiguous() else " (contiguous all the same: HV = 1)")
    return f"{dt} contiguous"


def check_params_inplace(target: Target, case: Case, device="cpu") -> list[Finding]:
    """N5: weights reloaded in place between two launches take effect on the next launch.

    A_log and dt_bias are given as source tensors of a kind drawn from the seed (params_plan:
    fp32 or the IO dtype, contiguous or a stride-2 view of a larger buffer), holding the case's
    values.  The case is launched once; then both sources are overwritten IN PLACE (copy_ of new
    IO-rounded values: the old ones shifted per head) and the case is launched again on freshly
    materialized inputs with the same source objects.  The second launch must agree with the
    float64 oracle of the NEW parameters (the launch property's tolerance table, M4-M7) and keep
    to its write set, the sources included (M8).  Contract N5 documents that the released wrapper
    caches the cast of any source that is not IO-dtype and contiguous by id(), so an in-place
    reload of such a source is not seen there (the stale cast is used): this property fails on the
    released kernel whenever a source is not a contiguous IO tensor, and the message says whether
    the second launch matches the oracle of the OLD parameters.  A reload of a contiguous IO source
    must take effect everywhere.  Check ids params_inplace.oracle (one finding, clause N5, over
    y/u/k/g/fold: the signature does not depend on which outputs, rows or source kinds show it),
    params_inplace.writes.*, params_inplace.launch.  Findings carry the case as their launch
    (transform "": the second launch's tensors are materialize(case) but for the reloaded
    parameters, which only this check builds: replay the property, not a plain launch).
    """
    plan = params_plan(case)
    base = materialize(case, device)
    io = base["q"].dtype
    old = {n: base[n] for n in ("A_log", "dt_bias")}
    new = {n: (old[n].double() + torch.tensor(plan[n + "_shift"], dtype=torch.float64, device=old[n].device)).to(io)
           for n in ("A_log", "dt_bias")}
    src = {n: _param_source(old[n], plan[n]) for n in ("A_log", "dt_bias")}
    where = ", ".join(f"{n} as {_source_text(src[n], plan[n])}" for n in ("A_log", "dt_bias"))
    for n in ("A_log", "dt_bias"):
        note(f"params_inplace: {n} source {plan[n]}")
    rec = launch_record(case, note=f"the second of two launches of the case: between them {where} were reloaded "
                                   "in place (copy_) with new values (check_params_inplace; a plain launch of the "
                                   "case does not reload anything)")
    first = observe(target, case, device, inputs=dict(base, **src))
    if first.error is not None:
        return [Finding("params_inplace.launch", "H*", f"the first launch ({where}) raised "
                        f"{type(first.error).__name__}: {first.error}", outcome=raised(first.error), launch=rec)]
    for n in ("A_log", "dt_bias"):
        src[n].copy_(new[n])  # in place: the same objects, new values
    obs = observe(target, case, device, inputs=dict(materialize(case, device), **src))
    if obs.error is not None:
        return [Finding("params_inplace.launch", "H*", f"the second launch, after the in-place reload ({where}), "
                        f"raised {type(obs.error).__name__}: {obs.error}", outcome=raised(obs.error), launch=rec)]
    out = [dataclasses.replace(f, prop=f"params_inplace.{f.prop}", message=(
        f"after an in-place reload of A_log/dt_bias ({where}): " + f.message), launch=rec) for f in check_writes(obs)]
    bad, other = _oracle_verdict(obs, new)
    out += [dataclasses.replace(f, prop=f"params_inplace.{f.prop}", launch=rec) for f in other]
    if not bad:
        return out
    # control: the same launch with FRESH source objects holding the new values (nothing to reload)
    fresh = observe(target, case, device, inputs=dict(
        materialize(case, device), **{n: _param_source(new[n], plan[n]) for n in ("A_log", "dt_bias")}))
    if fresh.error is not None or _oracle_verdict(fresh, new)[0]:
        # the new values fail without any reload too: not the reload's fault (the launch property's
        # ground); reported with the oracle's own check ids and clauses
        return out + [dataclasses.replace(f, prop=f"params_inplace.{f.prop}", message=(
            f"with new A_log/dt_bias ({where}; fresh source objects fail too): " + f.message), launch=rec)
            for f in bad]
    w = max(bad, key=lambda f: (f.value or 0.0) / f.tol if f.tol else float("inf"))
    used = [f"{n} {'new' if m[n] is new[n] else 'old'}" for m in _combos(old, new)
            if not _oracle_verdict(obs, m)[0] for n in ("A_log", "dt_bias")]
    same = isinstance(first.output, torch.Tensor) and isinstance(obs.output, torch.Tensor) and bool(
        same_bits(first.output, obs.output).all())
    out.insert(0, Finding(
        "params_inplace.oracle", "N5",
        f"after an in-place reload of A_log/dt_bias ({where}) the next launch disagrees with the float64 oracle "
        f"of the new values in {', '.join(f.prop.split('.', 1)[1] for f in bad)} (worst: {w.prop}); fresh "
        "source objects holding the same new values pass. "
        + (f"It matches the oracle of {' and '.join(used[:2])} (values before the reload: a stale cast, N5)."
           if used else "It matches no mix of old and new values.")
        + (" y is bitwise that of the launch before the reload." if same else ""),
        row=w.row, head=w.head, value=w.value, tol=w.tol, unit=w.unit, bound=w.bound,
        outcome=NON_FINITE if any(f.outcome == NON_FINITE for f in bad) else OUT_OF_TOLERANCE, launch=rec))
    return out


def _oracle_verdict(obs, params: dict) -> tuple[list, list]:
    """(oracle.* findings, other findings) of check_oracle for `obs` judged with the parameters
    `params` ({"A_log", "dt_bias"}: IO-rounded and contiguous, what the kernel must use, N4)."""
    found = check_oracle(dataclasses.replace(obs, before=dict(obs.before, **params)))
    bad = [f for f in found if f.prop.startswith("oracle.")]
    return bad, [f for f in found if not f.prop.startswith("oracle.")]


def _combos(old: dict, new: dict) -> list[dict]:
    """The parameter sets a stale cast may have used: A_log old, dt_bias old, both old."""
    return [dict(new, A_log=old["A_log"]), dict(new, dt_bias=old["dt_bias"]), dict(old)]


PROPERTIES = (
    # reseed=False: every illegal call differs from the legal one in a dtype, T, flush_min or a
    # cursor (all structure), and the host checks look at nothing else, so another value seed
    # launches the same 15 scenarios for the same verdict (campaign seeds_per_example)
    Property("guards", "H4,H6,H9-H11,H13,H14", "illegal calls raise the reference target's exception type",
             check_guards, reseed=False),
    Property("commit", "C2", "restart_hist_on_flush=True commits cursors as standalone_commit (pad rows included) "
             "and changes nothing else", check_commit),
    Property("extremes", "N2", "a + dt_bias ~ 120 on one head: that head matches the oracle or is non-finite (N2); "
             "nothing else changes", check_extremes),
    Property("params_inplace", "N5", "A_log/dt_bias reloaded in place between two launches (fp32 or IO, contiguous "
             "or strided sources) take effect on the next launch: it matches the oracle of the new values",
             check_params_inplace),
)
