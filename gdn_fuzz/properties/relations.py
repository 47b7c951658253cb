"""Relations between launches: properties that need no oracle and compare bits, not tolerances.

How these relations test, in plain words
----------------------------------------
The float64 oracle (gdn_fuzz.checks) can only say "close enough".  Many promises of the
contract are stronger: two launches that must compute the same thing the same way must give
the same *bits*.  Each relation here materializes a Case once, launches it as drawn (the
base run), then launches a transformed copy of the *same* tensors and compares the two runs
bit for bit (observation.same_bits).  Every launch gets its own clone of the inputs, because a
launch writes the rings and the pool in place.  Only live rows' outputs are compared: a pad
row's output is uninitialized (M8).  Nothing here needs a reference implementation, so the
same checks run against the CPU reference target and the production kernel on a GPU.

routing          (M7, M8) the case again with flush_min moved so that at least one row
                 switches between flush and verify.  y and the appended k/u records must be
                 bit-identical (same instruction path); only the switched rows' g appends and
                 pool rows may differ; every other element keeps its bits.  Only a row with
                 1 <= P <= 16 - T can switch (P = 0 never flushes, P >= 17 - T always does):
                 the property's strategy (routing_cases) draws one in every Case.
determinism      (R1-R3) the same inputs launched twice give the same output bits and the same
                 buffers after; and, without launching, the case's ring read set (the
                 windows) and write set (the appends) are disjoint (R2).
output_inplace   (M8) a caller-provided contiguous IO-dtype output filled with a recognizable
                 pattern is the object returned, its pad rows keep the pattern, its live rows
                 equal a run with output=None; a transposed (non-contiguous) output and an
                 fp32 output get the same live rows through the copy path.
metamorphic      transformations the math is blind to, each compared with the base run:
  batch_perm     (R1) permuting the batch rows permutes y and leaves the same buffers;
  slot_move      (M3, M5, M7) moving one request to a free pool slot (pool row and its rings
                 copied there, the vacated slot poisoned with NaN) moves its results;
  pool_relabel   (M3, M5, M7) relabelling every pool slot by a permutation does the same;
  isolation      (R1) a row's results do not change when the other rows become pad rows;
  rotation       (M3, M5) adding r to a row's cache_base and rotating its 32 ring slots by r
                 (the same logical window) leaves y unchanged and rotates the appends;
  strided_qkv    (H16, table 1.1) q/k/v as views of one fused projection tensor give the
                 same bits as compact tensors;
  strided_ab     (table 1.1) a/b as views of a fused [B, T, 2*HV + pad] tensor: the same;
  strided_pool   (H8, H16) the pool and rings as dim-0 block-strided views of larger pages
                 give the same bits and leave the rest of each page untouched.  A target that
                 refuses the mode with NotImplementedError (H16 allows it: the mode needs
                 SGLANG_GDN_WY_STRIDED_QKV=1 at import; the reference, the independent target
                 and the released module imported without it all refuse) cannot be checked:
                 no finding, and the example records the Hypothesis event "metamorphic.strided_pool:
                 nothing exercised: ..." (strided_pool_refusal tells a test beforehand).

A relation that a Case cannot exercise (routing with no switchable row, batch_perm with one
row, pool_relabel with one pool slot, isolation with one live row, strided_pool refused)
returns no finding and records a Hypothesis event saying so (properties.base.not_exercised):
the statistics show how many examples checked nothing instead of counting them as passes.

Transformations choose their permutations, rows and offsets with a random.Random seeded from
the case's seed and the relation's name, so a Case replays exactly.  Every check has the
signature check_X(target, case, device) -> list[Finding] and registers itself as a campaign
property (gdn_fuzz.properties) at import.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from gdn_fuzz.case import RING_SLOTS, Case, Row, lazy_flush_min, materialize
from gdn_fuzz.checks import check_writes
from gdn_fuzz.findings import BITS_DIFFER, Finding, WRONG_VALUE, attach, launch_record, raised
from gdn_fuzz.observation import BUFFERS, Observation, clone_inputs, observe, same_bits
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.properties.base import Property, launch_cases, not_exercised
from gdn_fuzz.targets import Target

POOL_KEYS = ("initial_state_source", "k_cache", "u_cache", "g_cache")  # indexed by pool slot
BATCH_KEYS = ("q", "k", "v", "a", "b", "initial_state_indices", "hist_len", "cache_base")  # by batch row
CURSORS = ("hist_len", "cache_base")
# the clause a difference in each buffer breaks
BUFFER_CLAUSE = {"initial_state_source": "M7", "k_cache": "M5", "u_cache": "M5", "g_cache": "M6",
                 "hist_len": "C2", "cache_base": "C2"}


# ------------------------------------------------------------------ helpers


def _run(target: Target, case: Case, device, inputs: dict, output=None) -> Observation:
    """One launch on a private copy of `inputs` (the caller's dict and tensors stay untouched)."""
    return observe(target, case, device, inputs=clone_inputs(inputs), output=output)


def _rng(case: Case, name: str) -> random.Random:
    return random.Random(f"{case.seed}:{name}")


def _live(inputs: dict) -> torch.Tensor:
    return inputs["initial_state_indices"].long() >= 0


def _failed(prop: str, obs: Observation, what: str = "a legal launch") -> list[Finding]:
    """A launch that raised or returned no output, as a finding (empty when it went fine)."""
    if obs.error is not None:
        return [Finding(f"{prop}.launch", "H*", f"{what} raised {type(obs.error).__name__}: {obs.error}",
                        outcome=raised(obs.error))]
    if not isinstance(obs.output, torch.Tensor):
        return [Finding(f"{prop}.launch", "M8", f"{what} returned {type(obs.output).__name__}, not the output tensor",
                        outcome=WRONG_VALUE)]
    return []


def _maxdiff(got: torch.Tensor, want: torch.Tensor, diff: torch.Tensor) -> float:
    d = (got.double() - want.double()).abs()[diff]
    d = torch.nan_to_num(d, nan=float("inf"))
    return float(d.max().item()) if d.numel() else 0.0


def _diff(prop: str, clause: str, got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor | None,
          what: str, *, head_dim: int | None = None, row_of=None) -> list[Finding]:
    """A finding when got and want differ in any bit where mask (broadcast) is True.

    head_dim: the head axis, to name the first differing (row, head); row_of: maps the first
    differing index to a batch row (default: index[0]).
    """
    diff = ~same_bits(got, want)
    if mask is not None:
        diff = diff & mask
    n = int(diff.sum().item())
    if n == 0:
        return []
    first = diff.nonzero()[0].tolist()
    row = row_of(first) if row_of is not None else first[0]
    head = first[head_dim] if head_dim is not None else None
    g, w = float(got[tuple(first)].double()), float(want[tuple(first)].double())
    return [Finding(prop, clause, f"{what}: {n} element(s) differ in their bits, first at index {first} "
                    f"({g:.6g} vs {w:.6g} expected)", row=row, head=head, value=_maxdiff(got, want, diff),
                    outcome=BITS_DIFFER, unit=f"largest absolute difference over the {n} differing "
                    f"{str(got.dtype).replace('torch.', '')} element(s)", bound="the contract requires equal bits")]


def _y_diff(prop: str, clause: str, got: torch.Tensor, want: torch.Tensor, live: torch.Tensor,
            what: str) -> list[Finding]:
    """Output rows [B, T, HV, V] of live rows only (a pad row's output is uninitialized, M8)."""
    return _diff(prop, clause, got, want, live[:, None, None, None], what, head_dim=2)


def _slot_owner(inputs: dict):
    """index -> the batch row whose pool slot is index[0] (None when no live row uses it)."""
    owner = {}
    for b, s in enumerate(inputs["initial_state_indices"].tolist()):
        if s >= 0:
            owner.setdefault(s, b)
    return lambda first: owner.get(first[0])


def _buffers_diff(prop: str, got: dict, want: dict, keys, what: str, *, masks: dict | None = None,
                  owner=None) -> list[Finding]:
    out = []
    for name in keys:
        m = None if masks is None else masks.get(name)
        row_of = owner if name in POOL_KEYS else None
        out += _diff(f"{prop}.{name}_bits", BUFFER_CLAUSE[name], got[name], want[name], m,
                     f"{what} ({name})", row_of=row_of)
    return out


def append_slots(inputs: dict, T: int) -> torch.Tensor:
    """[B, T] ring slots (base + P + s) & 31 of every row's appends (M5), from the launch's
    cursors before the call (the one definition: the precision study uses it too)."""
    base = inputs["cache_base"].long()
    P = inputs["hist_len"].long()
    return (base[:, None] + P[:, None] + torch.arange(T, device=base.device)[None, :]) & (RING_SLOTS - 1)


def _base(target: Target, case: Case, device, prop: str):
    """Materialize once and launch as drawn: (inputs, observation, findings)."""
    inputs = materialize(case, device)
    obs = _run(target, case, device, inputs)
    return inputs, obs, _failed(prop, obs, "the base launch of a legal case")


def _one_cycle(rng: random.Random, n: int) -> list[int]:
    """A random permutation that is one n-cycle (it moves every element when n >= 2)."""
    order = list(range(n))
    rng.shuffle(order)
    perm = [0] * n
    for i in range(n):
        perm[order[i]] = order[(i + 1) % n]
    return perm


# ------------------------------------------------------------------ 1. routing (M7, M8)


def alternate_flush_min(case: Case) -> int | None:
    """A legal flush_min in [1, 17 - T] that switches the most non-pad rows between flush and
    verify (the closest to the case's own on ties); None when no legal value switches any
    (every non-pad row has P = 0, which never flushes, or P >= 17 - T, which always does)."""
    hi = lazy_flush_min(case.T)
    Ps = [r.hist_len for r in case.rows if not r.pad]
    fmin = case.fmin

    def flips(f):
        return sum((P >= f) != (P >= fmin) for P in Ps)

    best = max(range(1, hi + 1), key=lambda f: (flips(f), -abs(f - fmin), -f))
    return best if flips(best) else None


def override_inputs(inputs: dict, params: dict) -> dict:
    """Transformation "override": the same tensors with scalar keyword arguments replaced
    (params: e.g. {"flush_min": 9} or {"restart_hist_on_flush": False})."""
    return dict(inputs, **params)


def check_routing(target: Target, case: Case, device="cpu") -> list[Finding]:
    """M7, M8: a row's route (flush or verify) changes nothing but its g appends and its pool row.

    The case runs as drawn and again with flush_min moved (alternate_flush_min) so that some
    rows switch route.  For every non-pad row, y and the appended k/u records are
    bit-identical (M7: the same instruction path); rows that keep their route keep their g
    appends and pool row bit-identical (M6, M7); switched rows may differ only in the g
    appends (M6: local restart) and the pool row (M7: the fold); every other element of the
    rings and pool keeps its bits in both runs (M8, via checks.check_writes).  With
    restart_hist_on_flush=True the committed cursors of rows that kept their route are
    bit-identical too (C2).  No legal flush_min switches any row: nothing to compare, no
    finding, and the Hypothesis event "routing: nothing exercised: ..." (routing_cases, the
    property's strategy, draws a switchable row in every Case, so this happens only to Cases
    drawn by other strategies or replayed).

    Findings carry their launch (Finding.launch): the second run is the transformation
    "override" with {"flush_min": f2} of the case's inputs; a write-set finding of the first
    run is the plain case.
    """
    f2 = alternate_flush_min(case)
    if f2 is None:
        not_exercised("routing", "no legal flush_min switches a row (every live row has P = 0 or P >= 17 - T)")
        return []
    plain = launch_record(case)
    inputs, a, bad = _base(target, case, device, "routing")
    if bad:
        return attach(bad, plain)
    live = _live(inputs)
    P = inputs["hist_len"].long()
    switched = live & ((P >= case.fmin) != (P >= f2))
    sw_list = switched.nonzero().flatten().tolist()
    params = {"flush_min": f2}
    second = launch_record(case, "override", params,
                           note=f"launched as printed (flush_min={case.fmin}) and again with flush_min={f2} "
                                f"(rows {sw_list} switch route), the two compared bit for bit")
    case2 = dataclasses.replace(case, flush_min=f2)
    b = _run(target, case2, device, override_inputs(inputs, params))
    bad = _failed("routing", b, f"the launch with flush_min={f2}")
    if bad:
        return attach(bad, second)
    where = f"flush_min {case.fmin} vs {f2} (rows {sw_list} switch route)"
    out = _y_diff("routing.y_bits", "M7", b.output, a.output, live, f"y of a live row, {where}")
    # allowed differences: g appends and pool rows of switched rows
    pool_n = inputs["initial_state_source"].shape[0]
    HV = inputs["u_cache"].shape[1]
    idx = inputs["initial_state_indices"].long()
    g_ok = torch.zeros(pool_n, RING_SLOTS, dtype=torch.bool, device=P.device)
    sw_rows = idx[switched]
    sl = append_slots(inputs, case.T)[switched]
    g_ok[sw_rows[:, None].expand_as(sl), sl] = True
    pool_ok = torch.zeros(pool_n, dtype=torch.bool, device=P.device)
    pool_ok[sw_rows] = True
    masks = {"initial_state_source": ~pool_ok[:, None, None, None],
             "g_cache": ~g_ok[:, None, :].expand(pool_n, HV, RING_SLOTS)}
    out += _buffers_diff("routing", b.after, a.after, POOL_KEYS, f"buffers after, {where}",
                         masks=masks, owner=_slot_owner(inputs))
    if case.restart_hist_on_flush:
        for name in CURSORS:
            out += _diff(f"routing.{name}_bits", "C2", b.after[name], a.after[name], ~switched,
                         f"committed {name} of a row that kept its route, {where}")
    attach(out, second)
    for obs, tag, rec in ((a, f"flush_min={case.fmin}", plain), (b, f"flush_min={f2}", second)):
        for f in check_writes(obs):
            out.append(dataclasses.replace(f, prop=f"routing.{f.prop}", message=f"{tag}: {f.message}", launch=rec))
    return out


# ------------------------------------------------------------------ 2. determinism (R1-R3)


def check_rw_disjoint(case: Case, device="cpu") -> list[Finding]:
    """R2 (pure, no launch): the rings' read set (the windows, M3) and write set (the appends,
    M5) of the case are disjoint, so no CTA reads what another writes; duplicate slots (R3)
    or P + T > 32 break it."""
    dev = torch.device(device)
    idx = torch.tensor([r.slot for r in case.rows], dtype=torch.int32, device=dev)
    P = torch.tensor([r.hist_len for r in case.rows], dtype=torch.int32, device=dev)
    base = torch.tensor([r.cache_base for r in case.rows], dtype=torch.int32, device=dev)
    rs = ring_oracle.read_set(pool_size=case.pool, H=case.H, HV=case.HV, idx=idx, hist_len=P, cache_base=base)
    ws = ring_oracle.write_set(pool_size=case.pool, H=case.H, HV=case.HV, T=case.T, idx=idx, hist_len=P,
                               cache_base=base, flush_min=case.fmin)
    both = rs & (ws.g_ring.any(1) | ws.u_ring.any(1) | ws.k_ring.any(1))
    if not bool(both.any()):
        return []
    s, j = both.nonzero()[0].tolist()
    return [Finding("determinism.rw_disjoint", "R2",
                    f"pool slot {s} ring slot {j} is both read (a window) and written (an append) by this "
                    f"launch ({int(both.sum())} such slots): its result depends on CTA order", outcome=WRONG_VALUE)]


def check_determinism(target: Target, case: Case, device="cpu") -> list[Finding]:
    """R1-R3: two launches from identical inputs give bit-identical live output rows and
    bit-identical buffers after (pool, rings, cursors), and the case's read and write sets
    are disjoint (R2, check_rw_disjoint).  A case whose sets overlap is racy by contract
    (R3), so it is not launched."""
    plain = launch_record(case)
    out = check_rw_disjoint(case, device)
    if out:
        return attach(out, plain)
    inputs, a, bad = _base(target, case, device, "determinism")
    if bad:
        return attach(bad, plain)
    twice = launch_record(case, note="the printed case launched twice from identical inputs")
    b = _run(target, case, device, inputs)
    bad = _failed("determinism", b, "the second launch of the same inputs")
    if bad:
        return attach(bad, twice)
    out = _y_diff("determinism.y_bits", "R1", b.output, a.output, _live(inputs),
                  "y of a live row between two launches of the same inputs")
    for f in _buffers_diff("determinism", b.after, a.after, BUFFERS,
                           "buffers after two launches of the same inputs", owner=_slot_owner(inputs)):
        out.append(dataclasses.replace(f, clause="R1"))
    return attach(out, twice)


# ------------------------------------------------------------------ 3. output in place (M8)


def output_pattern(shape, dtype, device) -> torch.Tensor:
    """7 + (flat index mod 64) / 8: exact in bf16/fp16/fp32, position-dependent, never y-like."""
    n = 1
    for s in shape:
        n *= s
    return (7.0 + (torch.arange(n, device=device) % 64).float() / 8.0).to(dtype).reshape(shape)


OUTPUTS = {
    "contiguous": "output= a contiguous [B, T, HV, V] IO-dtype tensor pre-filled with output_pattern (written in "
                  "place), compared with the output=None launch",
    "transposed": "output= a transposed [B, T, HV, V] IO-dtype view (the copy path), compared with the output=None "
                  "launch",
    "fp32": "output= an fp32 [B, T, HV, V] tensor of NaN (the copy path), compared with the output=None launch",
}


def output_tensor(kind: str, inputs: dict) -> torch.Tensor:
    """The caller-provided output of check_output_inplace's launch `kind` (a key of OUTPUTS)."""
    B, T = inputs["q"].shape[:2]
    HV, V = inputs["v"].shape[2], inputs["v"].shape[3]
    io, dev = inputs["q"].dtype, inputs["q"].device
    if kind == "contiguous":
        return output_pattern((B, T, HV, V), io, dev)
    if kind == "transposed":
        return output_pattern((B, HV, T, V), io, dev).transpose(1, 2)
    if kind == "fp32":
        return torch.full((B, T, HV, V), float("nan"), dtype=torch.float32, device=dev)
    raise ValueError(f"output kind {kind!r} is unknown; use one of {', '.join(OUTPUTS)}")


def output_inputs(inputs: dict, params: dict) -> dict:
    """Transformation "output": the same inputs with output=output_tensor(params["output"])."""
    return dict(inputs, output=output_tensor(params["output"], inputs))


def _output_record(case: Case, kind: str) -> dict:
    return launch_record(case, "output", {"output": kind}, note=OUTPUTS[kind])


def check_output_inplace(target: Target, case: Case, device="cpu") -> list[Finding]:
    """M8 (and table 1.1 `output`): where the output goes does not change what is computed.

    A contiguous [B, T, HV, V] IO-dtype output pre-filled with output_pattern is written in
    place: the launch returns that very object, its pad rows keep the pattern bytes (a pad
    row writes nothing), its live rows equal the output=None run bitwise, and the buffers
    after are the same.  A transposed view (non-contiguous) and an fp32 tensor go through
    the copy path: the same object comes back and its live rows equal the output=None run
    bitwise (exactly converted for fp32); their pad rows are scratch (M8) and not checked.
    Findings carry their launch: the transformation "output" with {"output": kind}.
    """
    inputs, a, bad = _base(target, case, device, "output_inplace")
    if bad:
        return attach(bad, launch_record(case))
    live = _live(inputs)
    out: list[Finding] = []
    # contiguous, exact shape and dtype: in place
    buf = output_tensor("contiguous", inputs)
    pattern = buf.clone()
    obs = _run(target, case, device, inputs, output=buf)
    if obs.error is not None:
        return attach(_failed("output_inplace", obs, "a launch with a contiguous output tensor"),
                      _output_record(case, "contiguous"))
    if obs.output is not buf:
        out.append(Finding("output_inplace.identity", "M8",
                           "a contiguous [B, T, HV, V] IO-dtype output was not the object returned",
                           outcome=WRONG_VALUE))
    out += _diff("output_inplace.pad_rows", "M8", buf, pattern, ~live[:, None, None, None],
                 "a pad row's bytes in the caller's output changed (a pad row writes nothing)", head_dim=2)
    out += _y_diff("output_inplace.y_bits", "M8", buf, a.output, live,
                   "y written in place vs output=None")
    out += _buffers_diff("output_inplace", obs.after, a.after, POOL_KEYS,
                         "buffers after, in-place output vs output=None", owner=_slot_owner(inputs))
    attach(out, _output_record(case, "contiguous"))
    # the copy paths: a non-contiguous view, and another dtype (fp32: the conversion is exact)
    copy_paths = (
        ("strided", "transposed", "a transposed output view", a.output),
        ("converted", "fp32", "an fp32 output tensor", a.output.float()),
    )
    for tag, kind, what, want in copy_paths:
        buf2 = output_tensor(kind, inputs)
        obs = _run(target, case, device, inputs, output=buf2)
        found: list[Finding] = []
        if obs.error is not None:
            found += _failed(f"output_inplace.{tag}", obs, f"a launch with {what}")
        else:
            if obs.output is not buf2:
                found.append(Finding(f"output_inplace.{tag}_identity", "M8", f"{what} was not the object returned",
                                     outcome=WRONG_VALUE))
            found += _y_diff(f"output_inplace.{tag}_y_bits", "M8", buf2, want, live,
                             f"y copied into {what} vs output=None")
        out += attach(found, _output_record(case, kind))
    return out


# ------------------------------------------------------------------ 4. metamorphic


def _extend_pool(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([t, t[:1].expand(n, *t.shape[1:])], 0).clone() if n else t


# Each relation is a parameter draw X_params(case) (from _rng(case, X): a Case replays exactly), a
# builder X_inputs(case, inputs, params) -> (case2, inputs2) that makes the transformed launch from
# the case's materialized inputs, and the check X(target, case, device, inputs, a).  Findings carry
# the transformation "metamorphic.X" with its params (Finding.launch), and
# gdn_fuzz.engine.reproducer rebuilds the transformed launch from them with the same builder.


def _drawn(name: str, params, why: str):
    """A relation's drawn parameters; None (the case cannot exercise the relation) is recorded as the
    Hypothesis event "metamorphic.NAME: nothing exercised: WHY"."""
    if params is None:
        not_exercised(f"metamorphic.{name}", why)
    return params


def batch_perm_params(case: Case) -> dict | None:
    if case.B < 2:
        return None
    return {"perm": _one_cycle(_rng(case, "batch_perm"), case.B)}  # new row i = old row perm[i]


def batch_perm_inputs(case: Case, inputs: dict, params: dict):
    perm = params["perm"]
    pt = torch.tensor(perm, device=inputs["q"].device)
    case2 = dataclasses.replace(case, rows=tuple(case.rows[p] for p in perm))
    inp2 = dict(inputs)
    for key in BATCH_KEYS:
        inp2[key] = inputs[key][pt].clone()
    return case2, inp2


def batch_perm(target, case, device, inputs, a) -> list[Finding]:
    """R1: permuting the batch rows (one cycle moving every row) permutes y and leaves the
    same pool and rings; committed cursors are permuted with their rows."""
    params = _drawn("batch_perm", batch_perm_params(case), "one batch row")
    if params is None:
        return []
    perm = params["perm"]
    pt = torch.tensor(perm, device=inputs["q"].device)
    case2, inp2 = batch_perm_inputs(case, inputs, params)
    b = _run(target, case2, device, inp2)
    bad = _failed("metamorphic.batch_perm", b, "the launch with permuted batch rows")
    if bad:
        return bad
    live2 = _live(inp2)
    out = _y_diff("metamorphic.batch_perm.y_bits", "R1", b.output, a.output[pt], live2,
                  f"y of new row i vs old row perm[i], perm={perm}")
    want = {k: a.after[k] for k in POOL_KEYS}
    want.update({k: a.after[k][pt] for k in CURSORS})
    out += _buffers_diff("metamorphic.batch_perm", b.after, want, BUFFERS,
                         f"buffers after with batch rows permuted by {perm}", owner=_slot_owner(inputs))
    return [dataclasses.replace(f, clause="R1") if f.clause != "C2" else f for f in out]


def slot_move_params(case: Case) -> dict | None:
    live_rows = [i for i, r in enumerate(case.rows) if not r.pad]
    if not live_rows:
        return None
    rng = _rng(case, "slot_move")
    r = rng.choice(live_rows)
    used = {x.slot for x in case.rows if not x.pad}
    free = [x for x in range(case.pool) if x not in used]
    if free:
        u, pool2 = rng.choice(free), case.pool
    else:
        u, pool2 = case.pool, case.pool + 1
    return {"row": r, "to": u, "pool": pool2}


def slot_move_inputs(case: Case, inputs: dict, params: dict):
    r, u, pool2 = params["row"], params["to"], params["pool"]
    s = case.rows[r].slot
    inp2 = dict(inputs)
    for key in POOL_KEYS:
        t = _extend_pool(inputs[key], pool2 - case.pool).clone()
        t[u] = inputs[key][s]
        t[s] = float("nan")
        inp2[key] = t
    idx = inputs["initial_state_indices"].clone()
    idx[r] = u
    inp2["initial_state_indices"] = idx
    rows = list(case.rows)
    rows[r] = dataclasses.replace(rows[r], slot=u)
    return dataclasses.replace(case, rows=tuple(rows), pool=pool2), inp2


def slot_move(target, case, device, inputs, a) -> list[Finding]:
    """M3, M5, M7: every access goes through initial_state_indices.  One live request moves to
    a slot no row uses (appended to the pool when none is free): its pool row and its rings
    are copied there and the vacated slot is filled with NaN.  y is bitwise the same, the new
    slot after equals the old slot after, and the vacated slot keeps its NaN."""
    params = _drawn("slot_move", slot_move_params(case), "no live row")
    if params is None:
        return []
    r, u, pool2 = params["row"], params["to"], params["pool"]
    s = case.rows[r].slot
    case2, inp2 = slot_move_inputs(case, inputs, params)
    b = _run(target, case2, device, inp2)
    what = f"row {r} moved from pool slot {s} to {u}" + ("" if pool2 == case.pool else " (appended to the pool)")
    bad = _failed("metamorphic.slot_move", b, f"the launch with {what}")
    if bad:
        return bad
    out = _y_diff("metamorphic.slot_move.y_bits", "M3", b.output, a.output, _live(inputs), f"y, {what}")
    want = {}
    for key in POOL_KEYS:
        w = _extend_pool(a.after[key], pool2 - case.pool).clone()
        w[u] = a.after[key][s]
        w[s] = inp2[key][s]
        want[key] = w
    want.update({k: a.after[k] for k in CURSORS})
    out += _buffers_diff("metamorphic.slot_move", b.after, want, BUFFERS, f"buffers after, {what}",
                         owner=_slot_owner(inp2))
    return out


def pool_relabel_params(case: Case) -> dict | None:
    if case.pool < 2:
        return None
    return {"sigma": _one_cycle(_rng(case, "pool_relabel"), case.pool)}  # old slot i -> new slot sigma[i]


def pool_relabel_inputs(case: Case, inputs: dict, params: dict):
    sigma = params["sigma"]
    n = case.pool
    dev = inputs["q"].device
    st = torch.tensor(sigma, device=dev)
    inv = torch.empty_like(st)
    inv[st] = torch.arange(n, device=dev)
    inp2 = dict(inputs)
    for key in POOL_KEYS:
        inp2[key] = inputs[key][inv].clone()  # new[j] = old[inv[j]]
    idx = inputs["initial_state_indices"].long()
    inp2["initial_state_indices"] = torch.where(idx >= 0, st[idx.clamp(min=0)], idx).to(torch.int32)
    case2 = dataclasses.replace(case, rows=tuple(
        r if r.pad else dataclasses.replace(r, slot=sigma[r.slot]) for r in case.rows))
    return case2, inp2


def pool_relabel(target, case, device, inputs, a) -> list[Finding]:
    """M3, M5, M7: relabelling every pool slot by a permutation sigma (pool rows and rings
    moved to sigma(slot), indices mapped through sigma) changes no bit of y and relabels the
    buffers after the same way."""
    params = _drawn("pool_relabel", pool_relabel_params(case), "one pool slot")
    if params is None:
        return []
    sigma = params["sigma"]
    st = torch.tensor(sigma, device=inputs["q"].device)
    inv = torch.empty_like(st)
    inv[st] = torch.arange(case.pool, device=st.device)
    case2, inp2 = pool_relabel_inputs(case, inputs, params)
    b = _run(target, case2, device, inp2)
    what = f"pool slots relabelled by {sigma}"
    bad = _failed("metamorphic.pool_relabel", b, f"the launch with {what}")
    if bad:
        return bad
    out = _y_diff("metamorphic.pool_relabel.y_bits", "M3", b.output, a.output, _live(inputs), f"y, {what}")
    want = {k: a.after[k][inv] for k in POOL_KEYS}
    want.update({k: a.after[k] for k in CURSORS})
    out += _buffers_diff("metamorphic.pool_relabel", b.after, want, BUFFERS, f"buffers after, {what}",
                         owner=_slot_owner(inp2))
    return out


def isolation_params(case: Case) -> list[dict] | None:
    """One params dict per launch: {"live_rows": the rows kept live}."""
    live_rows = [i for i, r in enumerate(case.rows) if not r.pad]
    if len(live_rows) < 2:
        return None
    _rng(case, "isolation").shuffle(live_rows)
    return [{"live_rows": sorted(live_rows[0::2])}, {"live_rows": sorted(live_rows[1::2])}]


def isolation_inputs(case: Case, inputs: dict, params: dict):
    group = params["live_rows"]
    keep = torch.zeros(case.B, dtype=torch.bool, device=inputs["q"].device)
    keep[group] = True
    inp2 = dict(inputs)
    inp2["initial_state_indices"] = torch.where(keep, inputs["initial_state_indices"], -1).to(torch.int32)
    inp2["hist_len"] = torch.where(keep, inputs["hist_len"], 0).to(torch.int32)
    inp2["cache_base"] = torch.where(keep, inputs["cache_base"], 0).to(torch.int32)
    case2 = dataclasses.replace(case, rows=tuple(
        r if i in group else Row(slot=-1, hist_len=0, cache_base=0) for i, r in enumerate(case.rows)))
    return case2, inp2


def isolation(target, case, device, inputs, a) -> list[Finding]:
    """R1 (one CTA per (row, head), no communication): the live rows are split in two groups;
    each group runs with the other rows turned into pad rows (same batch size and positions).
    Its rows' y, pool rows, rings and cursors are bitwise those of the full run, and no slot
    of the padded rows is touched."""
    groups = _drawn("isolation", isolation_params(case), "fewer than two live rows")
    if groups is None:
        return []
    out = []
    dev = inputs["q"].device
    for params in groups:
        group = params["live_rows"]
        keep = torch.zeros(case.B, dtype=torch.bool, device=dev)
        keep[group] = True
        case2, inp2 = isolation_inputs(case, inputs, params)
        b = _run(target, case2, device, inp2)
        what = f"only rows {group} live, the others pad rows"
        rec = _metamorphic_record(case, "isolation", params)
        bad = _failed("metamorphic.isolation", b, f"the launch with {what}")
        if bad:
            out += attach(bad, rec)
            continue
        found = _y_diff("metamorphic.isolation.y_bits", "R1", b.output, a.output, keep, f"y, {what}")
        slots = torch.tensor([case.rows[i].slot for i in group], device=dev, dtype=torch.long)
        want = {}
        for key in POOL_KEYS:
            w = inputs[key].clone()
            w[slots] = a.after[key][slots]
            want[key] = w
        masks = {k: keep for k in CURSORS}
        want.update({k: a.after[k] for k in CURSORS})
        found += [dataclasses.replace(f, clause="R1") if f.clause != "C2" else f for f in _buffers_diff(
            "metamorphic.isolation", b.after, want, BUFFERS, f"buffers after, {what}", masks=masks,
            owner=_slot_owner(inp2))]
        out += attach(found, rec)
    return out


def rotation_params(case: Case) -> dict | None:
    live_rows = [i for i, r in enumerate(case.rows) if not r.pad]
    if not live_rows:
        return None
    rng = _rng(case, "rotation")
    return {"rotations": [[i, rng.randrange(1, RING_SLOTS)] for i in live_rows]}  # [row, r]


def rotation_inputs(case: Case, inputs: dict, params: dict):
    rot = {int(i): int(r) for i, r in params["rotations"]}
    dev = inputs["q"].device
    inp2 = dict(inputs)
    for key in ("k_cache", "u_cache", "g_cache"):
        inp2[key] = inputs[key].clone()
    shift = torch.zeros(case.B, dtype=torch.int32, device=dev)
    for i, r in rot.items():
        s = case.rows[i].slot
        shift[i] = r
        for key in ("k_cache", "u_cache", "g_cache"):
            inp2[key][s] = torch.roll(inputs[key][s], r, dims=1)
    inp2["cache_base"] = ((inputs["cache_base"] + shift) & (RING_SLOTS - 1)).to(torch.int32)
    case2 = dataclasses.replace(case, rows=tuple(
        dataclasses.replace(r, cache_base=(r.cache_base + rot.get(i, 0)) & (RING_SLOTS - 1))
        for i, r in enumerate(case.rows)))
    return case2, inp2


def rotation(target, case, device, inputs, a) -> list[Finding]:
    """M3, M5: slot(j) = (base + j) & 31 is the only place a physical slot appears.  Each live
    row's cache_base grows by r in [1, 31] and its pool slot's 32 ring slots are rolled by r
    (the same logical window): y is bitwise unchanged, the rings after are the base run's
    rolled by r, the pool is unchanged and the committed cache_base is shifted by r."""
    params = _drawn("rotation", rotation_params(case), "no live row")
    if params is None:
        return []
    rot = {i: r for i, r in params["rotations"]}
    shift = torch.zeros(case.B, dtype=torch.int32, device=inputs["q"].device)
    for i, r in rot.items():
        shift[i] = r
    case2, inp2 = rotation_inputs(case, inputs, params)
    b = _run(target, case2, device, inp2)
    what = "ring rotated by " + ", ".join(f"row {i}: {r}" for i, r in rot.items())
    bad = _failed("metamorphic.rotation", b, f"the launch with the {what}")
    if bad:
        return bad
    out = _y_diff("metamorphic.rotation.y_bits", "M3", b.output, a.output, _live(inputs), f"y, {what}")
    want = {"initial_state_source": a.after["initial_state_source"], "hist_len": a.after["hist_len"]}
    for key in ("k_cache", "u_cache", "g_cache"):
        w = a.after[key].clone()
        for i, r in rot.items():
            s = case.rows[i].slot
            w[s] = torch.roll(a.after[key][s], r, dims=1)
        want[key] = w
    want["cache_base"] = ((a.after["cache_base"] + shift) & (RING_SLOTS - 1)).to(torch.int32)
    out += _buffers_diff("metamorphic.rotation", b.after, want, BUFFERS, f"buffers after, {what}",
                         owner=_slot_owner(inputs))
    return out


def fused_qkv(inputs: dict, pad: int = 64) -> dict:
    """q, k, v as views of one fused [B, T, H*K + H*K + HV*V + pad] projection (the serving
    layout: one token stride shared by the three, non-contiguous).  The pad columns hold
    NaN, so a read outside a view shows."""
    q, k, v = (inputs[n] for n in ("q", "k", "v"))
    B, T, H, K = q.shape
    HK = k.shape[2]
    HV, V = v.shape[2], v.shape[3]
    w = H * K + HK * K + HV * V
    fused = torch.full((B, T, w + pad), float("nan"), dtype=q.dtype, device=q.device)
    fused[..., : H * K] = q.reshape(B, T, -1)
    fused[..., H * K: H * K + HK * K] = k.reshape(B, T, -1)
    fused[..., H * K + HK * K: w] = v.reshape(B, T, -1)
    return dict(inputs,
                q=fused[..., : H * K].view(B, T, H, K),
                k=fused[..., H * K: H * K + HK * K].view(B, T, HK, K),
                v=fused[..., H * K + HK * K: w].view(B, T, HV, V))


def fused_ab(inputs: dict, pad: int = 64) -> dict:
    """a and b as views of one fused [B, T, 2*HV + pad] gate projection (token stride
    2*HV + pad, equal strides, non-contiguous; b starts HV elements in).  Pad is NaN."""
    a, b = inputs["a"], inputs["b"]
    B, T, HV = a.shape
    ab = torch.full((B, T, 2 * HV + pad), float("nan"), dtype=a.dtype, device=a.device)
    ab[..., :HV] = a
    ab[..., HV: 2 * HV] = b
    return dict(inputs, a=ab[..., :HV], b=ab[..., HV: 2 * HV])


def _run_views(target, case, device, inputs: dict, make) -> tuple[Observation, dict]:
    """A launch on views built by make(cloned inputs); returns the observation and the views
    (observe's `after` holds the views, so the caller sees what the launch wrote)."""
    kw = make(clone_inputs(inputs))
    return observe(target, case, device, inputs=kw), kw


def _same_as_compact(name: str, clause: str, target, case, device, inputs, a, make, what: str) -> list[Finding]:
    b, _ = _run_views(target, case, device, inputs, make)
    prop = f"metamorphic.{name}"
    bad = _failed(prop, b, f"the launch with {what}")
    if bad:
        return bad
    out = _y_diff(f"{prop}.y_bits", clause, b.output, a.output, _live(inputs), f"y with {what} vs compact")
    out += _buffers_diff(prop, b.after, a.after, BUFFERS, f"buffers after, {what} vs compact",
                         owner=_slot_owner(inputs))
    return [dataclasses.replace(f, clause=clause) if f.clause != "C2" else f for f in out]


FUSED_PAD = 64  # NaN columns after the fused q/k/v and a/b projections
PAGES = 2  # strided_pool: each pool/ring row is the first of PAGES rows of a page


def strided_qkv_params(case: Case) -> dict:
    return {"pad": FUSED_PAD}


def strided_qkv_inputs(case: Case, inputs: dict, params: dict):
    return case, fused_qkv(inputs, params["pad"])


def strided_qkv(target, case, device, inputs, a) -> list[Finding]:
    """H16 / table 1.1: q/k/v given as strided views of one fused projection (fused_qkv; the
    default mode copies them, the strided mode reads them in place) give the same output and
    buffers bitwise as compact tensors."""
    params = strided_qkv_params(case)
    return _same_as_compact("strided_qkv", "H16", target, case, device, inputs, a,
                            lambda kw: strided_qkv_inputs(case, kw, params)[1],
                            "q/k/v as views of a fused projection")


def strided_ab_params(case: Case) -> dict:
    return {"pad": FUSED_PAD}


def strided_ab_inputs(case: Case, inputs: dict, params: dict):
    return case, fused_ab(inputs, params["pad"])


def strided_ab(target, case, device, inputs, a) -> list[Finding]:
    """Table 1.1 (a, b: read in place if compact with equal strides, else copied): a and b
    given as views of one fused gate projection (fused_ab) give the same output and buffers
    bitwise as compact tensors.  No clause id covers the a/b layout, so findings cite "1.1"."""
    params = strided_ab_params(case)
    return _same_as_compact("strided_ab", "1.1", target, case, device, inputs, a,
                            lambda kw: strided_ab_inputs(case, kw, params)[1],
                            "a/b as views of a fused [B, T, 2*HV + pad] tensor")


def paged(t: torch.Tensor, pages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, view): view = page[:, 0] holds t, dim-0 stride `pages` times the dense one, inner
    dims dense (H8); the rest of each page is NaN."""
    page = torch.full((t.shape[0], pages, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
    page[:, 0] = t
    return page, page[:, 0]


def strided_pool_params(case: Case) -> dict:
    return {"pad": FUSED_PAD, "pages": PAGES}


def _strided_pool_views(inputs: dict, params: dict, pages: dict) -> dict:
    kw = fused_qkv(inputs, params["pad"])
    for key in POOL_KEYS:
        pages[key], kw[key] = paged(kw[key], params["pages"])
    return kw


def strided_pool_inputs(case: Case, inputs: dict, params: dict):
    return case, _strided_pool_views(inputs, params, {})


STRIDED_POOL_REFUSED = ("the target refuses block-strided pools with NotImplementedError (H16 allows it: the mode "
                        "needs SGLANG_GDN_WY_STRIDED_QKV=1 at import)")


def strided_pool_refusal(target: Target, case: Case, device="cpu") -> NotImplementedError | None:
    """The NotImplementedError the target raises for the case's strided_pool launch (H16: the
    strided mode is off in this module instance), or None when it accepts the launch: a test
    skips the relation, with this reason, rather than pass without checking it."""
    params = strided_pool_params(case)
    b, _ = _run_views(target, case, device, materialize(case, device),
                      lambda kw: _strided_pool_views(kw, params, {}))
    return b.error if isinstance(b.error, NotImplementedError) else None


def strided_pool(target, case, device, inputs, a) -> list[Finding]:
    """H8, H16: the pool and rings as block-strided views of larger pages (dim-0 stride twice
    the dense one, inner dims dense, as paged serving layouts do) with q/k/v/a/b as fused views
    (the strided mode wants slices sharing a token stride) give the same bits as compact
    tensors, and the rest of every page keeps its NaN.  NotImplementedError (H16: the mode
    needs SGLANG_GDN_WY_STRIDED_QKV=1 at import) is allowed: nothing is checked then, no
    finding, and the example records the event "metamorphic.strided_pool: nothing exercised"."""
    pages = {}
    params = strided_pool_params(case)
    b, _ = _run_views(target, case, device, inputs, lambda kw: _strided_pool_views(kw, params, pages))
    if isinstance(b.error, NotImplementedError):
        not_exercised("metamorphic.strided_pool", STRIDED_POOL_REFUSED)
        return []
    bad = _failed("metamorphic.strided_pool", b, "the launch with a block-strided pool and rings")
    if bad:
        return bad
    out = _y_diff("metamorphic.strided_pool.y_bits", "H16", b.output, a.output, _live(inputs),
                  "y with block-strided pool/rings vs compact")
    out += _buffers_diff("metamorphic.strided_pool", b.after, a.after, BUFFERS,
                         "buffers after, block-strided pool/rings vs compact", owner=_slot_owner(inputs))
    for key, page in pages.items():
        rest = page[:, 1:]
        out += _diff("metamorphic.strided_pool.page_rest", "H8", rest, torch.full_like(rest, float("nan")),
                     None, f"{key}: elements of the page outside the view were written")
    return [dataclasses.replace(f, clause="H16") if f.clause not in ("C2", "H8") else f for f in out]


METAMORPHIC = {
    "batch_perm": batch_perm,
    "slot_move": slot_move,
    "pool_relabel": pool_relabel,
    "isolation": isolation,
    "rotation": rotation,
    "strided_qkv": strided_qkv,
    "strided_ab": strided_ab,
    "strided_pool": strided_pool,
}

# name -> (params(case), inputs(case, inputs, params) -> (case2, inputs2), what the launch is)
METAMORPHIC_LAUNCHES = {
    "batch_perm": (batch_perm_params, batch_perm_inputs,
                   "the batch rows permuted (new row i = old row perm[i])"),
    "slot_move": (slot_move_params, slot_move_inputs,
                  "row `row` moved to pool slot `to` (pool and rings copied there, the old slot NaN; pool size `pool`)"),
    "pool_relabel": (pool_relabel_params, pool_relabel_inputs,
                     "every pool slot i relabelled sigma[i] (pool rows, rings and indices)"),
    "isolation": (isolation_params, isolation_inputs, "only rows `live_rows` live, the others turned into pad rows"),
    "rotation": (rotation_params, rotation_inputs,
                 "each [row, r]: cache_base + r and the row's 32 ring slots rolled by r"),
    "strided_qkv": (strided_qkv_params, strided_qkv_inputs,
                    "q/k/v as views of one fused [B, T, H*K + H*K + HV*V + pad] projection (pad NaN)"),
    "strided_ab": (strided_ab_params, strided_ab_inputs,
                   "a/b as views of one fused [B, T, 2*HV + pad] gate tensor (pad NaN)"),
    "strided_pool": (strided_pool_params, strided_pool_inputs,
                     "q/k/v fused views, and the pool and rings as dim-0 strided views (page = `pages` rows, rest NaN)"),
}


def _metamorphic_record(case: Case, name: str, params: dict | None) -> dict:
    what = METAMORPHIC_LAUNCHES[name][2]
    ps = ", ".join(f"{k}={v}" for k, v in (params or {}).items())
    return launch_record(case, f"metamorphic.{name}", params or {},
                         note=f"metamorphic.{name}({ps}): {what}; compared with the plain launch of the case")


def metamorphic_inputs(name: str, case: Case, inputs: dict, params: dict) -> dict:
    """The keyword arguments of relation `name`'s transformed launch (the transformation
    "metamorphic.<name>" of gdn_fuzz.engine.reproducer), from the case's materialized inputs."""
    return METAMORPHIC_LAUNCHES[name][1](case, inputs, params)[1]


def check_metamorphic(target: Target, case: Case, device="cpu", only=None) -> list[Finding]:
    """R1, M3, M5, M7, H8, H16, table 1.1: every relation in METAMORPHIC (or those named in `only`)
    against one shared base launch; see each function's docstring for what it transforms."""
    names = list(METAMORPHIC) if only is None else list(only)
    inputs, a, bad = _base(target, case, device, "metamorphic")
    if bad:
        return attach(bad, launch_record(case))
    out = []
    for name in names:
        found = METAMORPHIC[name](target, case, device, inputs, a)
        if found:
            params = METAMORPHIC_LAUNCHES[name][0](case)
            attach(found, _metamorphic_record(case, name, None if isinstance(params, list) else params))
        out += found
    return out


def metamorphic_check(*names):
    """check_X(target, case, device) for a subset of METAMORPHIC (tests and single-relation runs)."""
    for n in names:
        if n not in METAMORPHIC:
            raise ValueError(f"metamorphic relation {n!r} is unknown; use one of {', '.join(METAMORPHIC)}")

    def check(target: Target, case: Case, device="cpu") -> list[Finding]:
        return check_metamorphic(target, case, device, only=names)

    check.__name__ = "check_metamorphic_" + "_".join(names)
    check.__doc__ = "\n\n".join(f"{n}: {METAMORPHIC[n].__doc__}" for n in names)
    return check


# ------------------------------------------------------------------ the properties (gdn_fuzz.properties lists them)


def routing_cases(**kw):
    """The routing property's strategy: legal launches with at least one real row that some legal
    flush_min switches (1 <= P <= 16 - T), so that check_routing always has something to compare."""
    return launch_cases(need="switchable", **kw)


PROPERTIES = (
    Property("routing", "M7,M8", "flush_min moved so rows switch route: y and k/u appends bit-identical; "
             "only switched rows' g appends and pool rows differ", check_routing, strategy=routing_cases),
    Property("determinism", "R1-R3", "two launches of the same inputs are bit-identical; read and write sets "
             "are disjoint", check_determinism),
    Property("output_inplace", "M8", "caller output: same object, pad rows untouched, live rows bitwise equal "
             "to output=None (also transposed and fp32 outputs)", check_output_inplace),
    Property("metamorphic", "R1,M3,M5,M7,H8,H16,1.1", "batch permutation, slot move, pool relabel, isolation, "
             "ring rotation, strided q/k/v, strided a/b and strided pool: bitwise the same results",
             check_metamorphic),
)
