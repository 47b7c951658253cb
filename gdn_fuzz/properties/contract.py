"""Contract properties beyond one oracle comparison: illegal calls, the in-place commit, extreme gates.

The properties (PROPERTIES below; gdn_fuzz.properties lists them)
-----------------------------------------------------------------
guards      H4, H6, H9-H11, H13, H14: the target is called with illegal inputs (T = 6,
            flush_min = 0 and 18 - T, hist_len 17 and -1 and cache_base 32 and None with
            restart_hist_on_flush=True, q/k/v/a/b in the other IO dtype, an fp32 pool, an fp32
            u ring, int64 hist_len) and must raise the exception type the reference target
            raises for the same call.  Finding prop "guard.<clause>.<scenario>".
commit      C2: with restart_hist_on_flush=True (pad rows given in-range cursors, since the
            host commits them too), the cursors after the call equal
            oracles.commit.standalone_commit of the cursors before, and y and every buffer are
            bitwise those of the same launch with restart_hist_on_flush=False (the commit runs
            after the launch).  Finding prop "commit.cursors.<name>" / "commit.launch_bits.<buffer>".
extremes    N2 as containment: a gate logit a + dt_bias ~ 120 on v-head 0; that head (y, u, g, fold)
            may match the float64 oracle or show the documented non-finite outcome, everything else
            must match the oracle and the write set.  Finding prop "extremes.oracle.<output>" / "extremes.writes.*".

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

from gdn_fuzz.properties.base import Property, not_exercised
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.checks import check_oracle, check_writes, expectation, oracle_metrics
from gdn_fuzz.findings import BITS_DIFFER, Finding, WRONG_VALUE, launch_record, raised
from gdn_fuzz.observation import clone_inputs, observe, same_bits
from gdn_fuzz.oracles import commit as commits
from gdn_fuzz.targets import Target, get_target

_OTHER_IO = {torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}


# ------------------------------------------------------------------ helpers


def _call(target: Target, arm: str, kwargs: dict):
    """(returned, exception) of one entry-point call."""
    try:
        return target.launch(arm, **kwargs), None
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return None, e


# ------------------------------------------------------------------ guards (H*)


def _guard_scenarios(case: Case, device):
    """(id, description, clause, kwargs) of illegal calls derived from the case (fresh tensors each)."""
    T = case.T
    base = materialize(dataclasses.replace(case, restart_hist_on_flush=False), device)
    io = base["q"].dtype

    def kw(**over):
        d = clone_inputs(base)
        d.update(over)
        return d

    out = []
    t6 = dataclasses.replace(case, T=6, flush_min=None, restart_hist_on_flush=False)
    out.append(("T", "T=6", "H13", materialize(t6, device)))
    out.append(("flush_min_zero", "flush_min=0", "H14", kw(flush_min=0)))
    out.append(("flush_min_cap", f"flush_min={18 - T} (17 - T + 1)", "H14", kw(flush_min=18 - T)))
    for sid, name, val in (("hist_len_high", "hist_len", 17), ("hist_len_negative", "hist_len", -1),
                           ("cache_base_high", "cache_base", 32)):
        d = kw(restart_hist_on_flush=True)
        d[name][0] = val
        out.append((sid, f"{name}[0]={val} with restart_hist_on_flush=True", "H11", d))
    out.append(("cache_base_none", "cache_base=None with restart_hist_on_flush=True", "H11",
                kw(restart_hist_on_flush=True, cache_base=None)))
    for name in ("q", "k", "v", "a", "b"):
        out.append((f"{name}_dtype", f"{name} in {_OTHER_IO[io]} (module IO {io})", "H6",
                    kw(**{name: base[name].to(_OTHER_IO[io])})))
    out.append(("state_dtype", "initial_state_source in float32", "H4",
                kw(initial_state_source=base["initial_state_source"].float())))
    out.append(("u_cache_dtype", "u_cache in float32", "H9", kw(u_cache=base["u_cache"].float())))
    out.append(("hist_len_dtype", "hist_len in int64", "H10", kw(hist_len=base["hist_len"].long())))
    return out


def guard_case(case: Case) -> Case:
    """The Case the guards property's illegal calls start from: the case with
    restart_hist_on_flush=False (each scenario sets what it needs)."""
    return dataclasses.replace(case, restart_hist_on_flush=False)


def guard_inputs(case: Case, scenario: str, device="cpu") -> dict:
    """The keyword arguments of one illegal call of check_guards (transformation "guard" of
    gdn_fuzz.engine.reproducer: {"scenario": id})."""
    for sid, _, _, kwargs in _guard_scenarios(case, device):
        if sid == scenario:
            return kwargs
    raise ValueError(f"guard scenario {scenario!r} is unknown; use one of "
                     f"{', '.join(s for s, *_ in _guard_scenarios(case, device))}")


def check_guards(target: Target, case: Case, device="cpu", expected: Target | None = None) -> list[Finding]:
    """H4, H6, H9-H11, H13, H14: every illegal call raises the reference target's exception type.

    The expectation is what the reference target (or `expected`, another target: a test that
    compares the reference itself with an independent implementation) raises for the very
    same call; a scenario the expectation accepts is skipped (Hypothesis event "guards: nothing
    exercised: ..."), so the property follows the reference's host checks.  Compared with
    itself (target is the reference) the property proves nothing.  The contract fixes the
    exception type and the clause, not the wording: messages are reported, never compared.
    Check id guard.<clause>.<scenario>.  Each finding carries its call (Finding.launch):
    guard_case(case) and the transformation "guard" {"scenario": id}.
    """
    ref = get_target("reference") if expected is None else expected
    who = "the reference" if expected is None else f"the expected target {expected.name}"
    gcase = guard_case(case)
    out = []
    for sid, name, clause, kwargs in _guard_scenarios(case, device):
        _, want = _call(ref, case.arm, clone_inputs(kwargs))
        if want is None:
            not_exercised("guards", f"scenario {sid}: {who} accepts it")
            continue
        _, got = _call(target, case.arm, kwargs)
        rec = launch_record(gcase, "guard", {"scenario": sid}, given=case,
                            note=f"the illegal call guard {sid!r}: {name}, on the inputs of the case")
        if got is None:
            out.append(Finding(f"guard.{clause}.{sid}", clause, f"illegal call ({name}) returned normally; "
                               f"{who} raises {type(want).__name__}: {str(want)[:120]}",
                               outcome="returned normally", launch=rec))
        elif type(got) is not type(want):
            out.append(Finding(f"guard.{clause}.{sid}", clause, f"illegal call ({name}) raised {type(got).__name__}: "
                               f"{str(got)[:120]}; {who} raises {type(want).__name__}",
                               outcome=raised(got), launch=rec))
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
    e = expectation(obs)
    metrics = oracle_metrics(obs, e)
    for name in ("y", "u", "g", "fold"):  # v-head 0: the documented non-finite outcome is allowed (N2)
        m = metrics[name]
        m.ratio[:, 0] = torch.where(torch.isinf(m.rel[:, 0]), torch.zeros_like(m.ratio[:, 0]), m.ratio[:, 0])
    out = []
    for f in check_oracle(obs, e, metrics) + check_writes(obs):
        out.append(dataclasses.replace(f, prop=f"extremes.{f.prop}", message=(
            f"with a + dt_bias ~ {EXTREME_LOGIT:g} on v-head 0: " + f.message), launch=rec))
    return out


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
)
