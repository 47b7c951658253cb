"""The prefix materializer's properties (kernel-contract-0.7.4.md section 2, PM*), for targets of kernel
"materialize" (Target.kernel): FlashInfer 0.7.4's gdn_prefix_materialize, an edited copy, the torch reference.

  pm_launch     one call against the float64 PMM3 oracle, element by element within the PMN5 bound
                (gdn_fuzz.compare.prefix_bound); count == 0 requests bit-exact copies (PMS2); every byte
                outside the processed destinations unchanged: other pool slots, the sources, the rings, g and
                every metadata tensor (PMW1-PMW3), skipped requests, -1 entries and entries past num_active
                included (PMS1, PMS3, PMS4); with regime.poison NaN outside the windows must not leak (PMM3)
  pm_copy       the same check on calls with a count == 0 request whose source holds every 16-bit pattern
                (PMS2 promises the copy for every bit pattern: signed zeros, Inf, NaN payloads, subnormals)
  pm_relations  PMR6: the destinations' bits do not change when the active list is given in another order,
                with num_active slack and the batch padded with skipped requests; a second call gives the
                same bits (determinism)
  pm_graph      PMR6 / PMS5 on CUDA: the active list and num_active built on the device (no host sync), the call
                captured in a CUDA graph and replayed, bit-equal to eager, and replayed again on new inputs
  pm_guards     PMH1-PMH19: a few changes of a valid call drawn from the case's seed, judged by the release model
                (gdn_fuzz.properties.hostchecks), as the flush kernel's guards property is; and an eighth of the
                rejected changes alone (sweep_changes: which eighth from the seed)

The decode/materialize differential (PMM5) is a measurement (gdn_fuzz.studies.prefix_decode), not a property:
its bit-identity is read from the source, not promised.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from gdn_fuzz import compare
from gdn_fuzz.findings import BITS_DIFFER, NON_FINITE, OUT_OF_TOLERANCE, WRONG_VALUE, Finding, Findings, launch_record, raised
from gdn_fuzz.observation import clone_inputs, same_bits
from gdn_fuzz.oracles import prefix as oracle
from gdn_fuzz.prefix_case import PrefixCase, Request, materialize_prefix
from gdn_fuzz.properties import hostchecks as hc
from gdn_fuzz.properties.base import Property, not_exercised
from gdn_fuzz.strategies.prefix import prefix_cases
from gdn_fuzz.targets import Target

META = ("src_slots", "dst_slots", "cache_base", "count", "active_request_indices", "num_active")
READ_ONLY = ("k_cache", "u_cache", "g_cache") + META


def call(target: Target, case: PrefixCase, inputs: dict):
    """The target's gdn_prefix_materialize on `inputs` (mutated in place); (returned, exception)."""
    try:
        return target.launch(case.arm, **inputs), None
    except Exception as e:  # noqa: BLE001 - the target's exception is the observation
        return None, e


def _bits_hex(x: torch.Tensor) -> str:
    return f"0x{int(x.view(torch.int16).item()) & 0xFFFF:04x}"


def error_ratio(arm: str, e: oracle.PrefixExpectation, got: torch.Tensor, S0: torch.Tensor) -> torch.Tensor:
    """max |got - S| / PMN5 bound (compare.prefix_bound) per (request, head) of the fold requests of `e`; got and S0
    [n, HV, V, K]: the states written and the sources read.  NaN where got is not finite."""
    g64 = got.double()
    bound = compare.prefix_bound(arm, e.S, e.M, e.W, e.U, e.A, e.ksum, S0.double().abs())
    r = ((g64 - e.S).abs() / bound).amax(dim=(2, 3))
    return torch.where(torch.isfinite(g64).all(3).all(2), r, torch.full_like(r, float("nan")))


def _copy_findings(prop, row, want, got, record) -> list[Finding]:
    """A count == 0 request whose destination is not its source's bits, in three signatures: the sign of a zero
    lost (-0 -> +0), a NaN's bits changed, any other value changed (PMS2)."""
    eq = same_bits(want, got)
    nan = torch.isnan(want.float())
    zero_sign = (want.float() == 0) & (got.float() == 0)
    out = []
    for label, sel, what in (("copy", ~nan & ~zero_sign, "other"), ("copy.zero_sign", zero_sign, "zero"),
                             ("copy.nan", nan, "NaN")):
        bad = (~eq) & sel
        if bool(bad.any()):
            at = tuple(bad.nonzero()[0].tolist())
            out.append(Finding(
                f"{prop}.{label}", "PMS2",
                f"count == 0 is not a bit copy: {int(bad.sum())} of {int(sel.sum())} {what} elements differ; first at "
                f"(head, v, k) = {at}: src {_bits_hex(want[at])} ({want[at].item()!r}) -> dst {_bits_hex(got[at])} "
                f"({got[at].item()!r})", row=row, head=at[0], outcome=BITS_DIFFER, launch=record))
    return out


def check_call(case: PrefixCase, before: dict, after: dict, returned, record: dict, prop: str = "pm") -> Findings:
    """The contract's word on one legal call: `before` its inputs, `after` the same tensors after it.  All requests
    are compared at once (one host sync per verdict); a failing request is then described on its own."""
    out = Findings()
    st0, st1 = before["state"], after["state"]
    dev = st0.device
    if returned is not st1:
        out.append(Finding(f"{prop}.return", "PMW1", "did not return its `state` argument (the same object)",
                           outcome=WRONG_VALUE, launch=record))
    e = oracle.materialize(**before)
    worst = None
    if e.rows:
        src = torch.tensor([case.requests[p].src for p in e.rows], device=dev)
        got, S0 = st1[torch.tensor(e.dst, device=dev)], st0[src]
        copy = e.copy.to(dev)
        same = same_bits(S0, got).reshape(len(e.rows), -1).all(1)
        for i in (copy & ~same).nonzero()[:, 0].tolist():
            out.extend(_copy_findings(prop, e.rows[i], S0[i], got[i], record))
        ratio = error_ratio(case.arm, e, got, S0)  # [n, HV]; copies: 0 within bits, judged above
        ratio = torch.where(copy[:, None], torch.zeros_like(ratio), ratio)
        bad = ratio.isnan() | (ratio > 1.0)
        finite = ratio[~ratio.isnan()]
        worst = float(finite.max()) if finite.numel() else None
        for i in (bad.any(1).nonzero()[:, 0].tolist() if bool(bad.any()) else ()):
            r = ratio[i]
            if bool(r.isnan().any()):
                out.append(Finding(f"{prop}.state", "PMM3", f"non-finite values in state[dst={e.dst[i]}] where the "
                                   "float64 oracle is finite (NaN outside the window leaked, or an overflow)",
                                   row=e.rows[i], head=int(r.isnan().nonzero()[0, 0]), outcome=NON_FINITE,
                                   launch=record))
            else:
                h = int(r.argmax())
                out.append(Finding(f"{prop}.state", "PMM3", f"state[dst={e.dst[i]}] differs from the float64 prefix "
                                   "state", row=e.rows[i], head=h, value=float(r[h]), tol=1.0,
                                   outcome=OUT_OF_TOLERANCE, unit="max |error| / PMN5 bound per element",
                                   bound=compare.PM_TERMS, launch=record))
    out.metrics = {"state": [worst]}
    # PMW1-PMW3: nothing else changes
    keep = torch.ones(st0.shape[0], dtype=torch.bool, device=dev)
    if e.dst:
        keep[torch.tensor(e.dst, device=dev)] = False
    moved = ~same_bits(st0[keep], st1[keep]).reshape(int(keep.sum()), -1).all(1)
    if bool(moved.any()):
        slot = int(keep.nonzero()[moved.nonzero()[0, 0], 0])
        out.append(Finding(f"{prop}.writes.state", "PMW2", f"pool slot {slot} changed, and no processed request "
                           f"writes it (processed destinations: {sorted(e.dst)})", outcome=BITS_DIFFER, launch=record))
    for name in READ_ONLY:
        a, b = before.get(name), after.get(name)
        if isinstance(a, torch.Tensor) and not (a.shape == b.shape and bool(same_bits(a, b).all())):
            out.append(Finding(f"{prop}.writes.{name}", "PMW2", f"{name} changed (read-only)", outcome=BITS_DIFFER,
                               launch=record))
    return out


def check_launch(target: Target, case: PrefixCase, device: str = "cpu") -> Findings:
    inputs = materialize_prefix(case, device)
    before = clone_inputs(inputs)
    ret, err = call(target, case, inputs)
    rec = launch_record(case)
    if err is not None:
        return Findings([Finding("pm.launch", "PMH*", f"a legal call raised {type(err).__name__}: {str(err)[:200]}",
                                 outcome=raised(err), launch=rec)])
    return check_call(case, before, inputs, ret, rec)


# ------------------------------------------------------------------ PMR6: invariance


def _relabelled(case: PrefixCase) -> PrefixCase:
    """The same processed requests, the active list given in another order with num_active slack, and the batch
    padded with two skipped requests (count = -1): PMR6 says the destinations' bits do not change."""
    pad = tuple(Request(-1, -1, 0, -1, 0) for _ in range(2))
    # an explicit list of the live rows: the derived one holds rows with count >= 0 (PMS5), as this one does
    return dataclasses.replace(case, requests=case.requests + pad, active="device", order_seed=case.seed % 997 + 1,
                               num_active_slack=3)


def check_relations(target: Target, case: PrefixCase, device: str = "cpu") -> Findings:
    processed = oracle.processed([r.src for r in case.requests], [r.dst for r in case.requests],
                                 [r.count for r in case.requests], case.active_list(), case.num_active_value())
    if not processed:
        not_exercised("pm_relations", "no processed request")
        return Findings()
    if case.active == "device" and case.num_active_slack < 0:
        not_exercised("pm_relations", "num_active below the live count drops rows: the relabelled call would not")
        return Findings()
    first = materialize_prefix(case, device)
    ret, err = call(target, case, first)
    if err is not None:
        return Findings([Finding("pm_relations.launch", "PMH*", f"a legal call raised {raised(err)}", outcome=raised(err),
                                 launch=launch_record(case))])
    out = Findings()
    dsts = torch.tensor([case.requests[p].dst for p in processed], device=first["state"].device)
    for label, other in (("determinism", case), ("reordered", _relabelled(case))):
        rec = launch_record(other, note=f"pm_relations.{label}: against the call of the case as drawn")
        kw = materialize_prefix(other, device)
        _, err = call(target, other, kw)
        if err is not None:
            out.append(Finding(f"pm_relations.{label}", "PMR6", f"the related call raised {raised(err)}",
                               outcome=raised(err), launch=rec))
            continue
        eq = same_bits(first["state"][dsts], kw["state"][dsts]).reshape(len(processed), -1).all(1)
        if not bool(eq.all()):
            i = int((~eq).nonzero()[0, 0])
            out.append(Finding(f"pm_relations.{label}", "PMR6",
                               f"request {processed[i]}'s destination bits changed ({label}: "
                               + ("the same call again" if label == "determinism" else
                                  "list order, num_active slack and skipped pad requests") + ")",
                               row=processed[i], outcome=BITS_DIFFER, launch=rec))
    return out


# ------------------------------------------------------------------ PMR6 / PMS5: the CUDA-graph path


def device_active(count: torch.Tensor):
    """The active list (rows with count >= 0, in index order, then -1) and num_active, built on count's device with
    no host sync: what a CUDA-graph caller passes (PMS5)."""
    live = count >= 0
    B = count.shape[0]
    idx = torch.arange(B, device=count.device, dtype=torch.int32)
    key = torch.where(live, idx, idx + B)  # live rows first, in index order
    order = torch.argsort(key)
    act = torch.where(live[order], order.to(torch.int32), torch.full_like(order, -1, dtype=torch.int32))
    return act.to(torch.int32).contiguous(), live.sum().to(torch.int32).reshape(1)


def check_graph(target: Target, case: PrefixCase, device: str = "cpu") -> Findings:
    if torch.device(device).type != "cuda":
        not_exercised("pm_graph", f"CUDA graphs need a CUDA device; device={device}")
        return Findings()
    base = dataclasses.replace(case, active="derived", order_seed=0, num_active_slack=0)
    static = materialize_prefix(base, device)
    static["active_request_indices"], static["num_active"] = device_active(static["count"])
    eager = clone_inputs(static)
    _, err = call(target, base, eager)  # also compiles outside the capture
    if err is not None:
        return Findings([Finding("pm_graph.eager", "PMH*", f"a legal call raised {raised(err)}", outcome=raised(err),
                                 launch=launch_record(base))])
    out = Findings()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                active, na = device_active(static["count"])
                static["active_request_indices"].copy_(active)
                static["num_active"].copy_(na)
                target.launch(base.arm, **static)
    except Exception as e:  # noqa: BLE001
        return Findings([Finding("pm_graph.capture", "PMS5", f"capture failed: {raised(e)}", outcome=raised(e),
                                 launch=launch_record(base, note="pm_graph: captured"))])
    torch.cuda.current_stream().wait_stream(s)  # capture records the work and runs none of it
    for k, seed in enumerate((case.seed, case.seed ^ 0x5A5A5A5A)):
        new = dataclasses.replace(base, seed=seed)
        kw = materialize_prefix(new, device)
        for name in ("state", "k_cache", "u_cache", "g_cache"):
            static[name].copy_(kw[name])
        ref = clone_inputs(kw)
        ref["active_request_indices"], ref["num_active"] = device_active(ref["count"])
        _, err = call(target, new, ref)
        if err is not None:
            out.append(Finding("pm_graph.eager", "PMH*", f"a legal call raised {raised(err)}", outcome=raised(err),
                               launch=launch_record(new)))
            break
        g.replay()
        torch.cuda.synchronize()
        if not bool(same_bits(ref["state"], static["state"]).all()):
            out.append(Finding("pm_graph.replay", "PMR6", f"replay {k} of the captured call differs from the eager call "
                               "on the same inputs", outcome=BITS_DIFFER,
                               launch=launch_record(new, note=f"pm_graph: replay {k} of a captured call")))
            break
    return out


# ------------------------------------------------------------------ PMH1-PMH19


def guard_changes(target: Target, case: PrefixCase) -> list[hc.Change]:
    """1-3 compatible changes of the materializer's valid call for the case's arm, from case.seed: the first is
    change seed % n of the n changes (every change leads equally often, whatever the draw), then 0-2 more at
    random ((seed // n) % 3 of them: each change is alone in a third of the seeds that lead with it, where no
    earlier check can mask it)."""
    em = target.release.release.entry("materialize")
    pool = hc.changes_for(em, case.arm)
    n = len(pool)
    picked: list[hc.Change] = [pool[case.seed % n]]
    more = (case.seed // n) % 3
    for c in random.Random(case.seed).sample(pool, min(n, 6)):
        if len(picked) < 1 + more and c not in picked and hc.compatible(picked + [c]):
            picked.append(c)
    return picked


GUARD_SWEEP = 8  # each pm_guards example also probes every 8th rejected change alone (which 8th: from the seed)


def sweep_changes(target: Target, case: PrefixCase, device: str = "cpu") -> list[hc.Change]:
    """The changes a pm_guards example probes one at a time besides its drawn combination: those of index
    seed % GUARD_SWEEP (mod GUARD_SWEEP) among the arm's changes that the release model says a host check
    rejects on `device` (an illegal change alone, where no earlier check can mask a missing one).  Legal changes
    are left to the drawn combinations (they launch, and some compile a new kernel: another ring depth, a strided
    pool), and so are the ones the release does not validate on this device."""
    rel, mod = target.release.release, target.module(case.arm)
    pool = hc.changes_for(rel.entry("materialize"), case.arm)
    return [c for i, c in enumerate(pool) if i % GUARD_SWEEP == case.seed % GUARD_SWEEP and not c.legal
            and not hc.unvalidated_on_device(mod, rel, "materialize", case.arm, c, device)]


def check_guards(target: Target, case: PrefixCase, device: str = "cpu") -> Findings:
    """The drawn combination of changes (guard_changes), then the sweep's single changes (sweep_changes): each
    probe's outcome against the release model's (the check it must raise at, or a normal return)."""
    rel = target.release.release
    mod = target.module(case.arm)
    fn = getattr(mod, target.entry)
    changes = guard_changes(target, case)
    out = Findings()
    if str(device).startswith("cuda") and any(hc.unvalidated_on_device(mod, rel, "materialize", case.arm, c, device)
                                             for c in changes):
        not_exercised("pm_guards", "a change the release does not validate would launch the kernel on it")
        probes = []
    else:
        probes = [changes]
    probes += [[c] for c in sweep_changes(target, case, device) if [c] != changes]
    for chs in probes:
        p = hc.probe(fn, mod, rel, "materialize", case.arm, chs, device)
        rec = launch_record(case, note="pm_guards: changes " + ", ".join(c.id for c in chs))
        if p.problem:
            chk = p.expected.check
            out.append(Finding(f"pm.guard.{chk.id if chk else 'pass'}", chk.clause if chk else "PMH*",
                               f"changes {', '.join(p.changes)}: {p.problem}",
                               outcome=f"raised {p.observed.exc}" if p.observed.exc else "returned normally",
                               launch=rec))
        if p.inputs_changed:
            out.append(Finding("pm.guard.inputs", "PMW2", f"changes {', '.join(p.changes)}: a rejected call changed "
                               f"{', '.join(p.inputs_changed)}", outcome=BITS_DIFFER, launch=rec))
    return out


def _cases(**kw):
    return prefix_cases(**_pm(kw))


def _pm(kw: dict) -> dict:
    """The campaign's strategy keywords that mean something to prefix_cases: arms and the (H, HV) menu (the
    campaign's, strategies.geometries_for(target)); its batch buckets are the decode step's compile buckets,
    while the materializer's B is dynamic (PMD4), so prefix_cases keeps its own."""
    return {k: v for k, v in kw.items() if k in ("arms", "geometries")}


PROPERTIES = (
    Property(name="pm_launch", clauses="PMM3 PMN5 PMS1-PMS5 PMW1-PMW3",
             doc="gdn_prefix_materialize vs the float64 PMM3 oracle within PMN5; copies bit-exact; nothing else written",
             check=check_launch, strategy=_cases, kernel="materialize"),
    Property(name="pm_copy", clauses="PMS2",
             doc="count == 0 is a bit copy for every 16-bit pattern of the source checkpoint",
             check=check_launch, strategy=lambda **kw: prefix_cases(need="copy", **_pm(kw)), kernel="materialize"),
    Property(name="pm_relations", clauses="PMR6 PMS3 PMS4",
             doc="destination bits invariant under list order, num_active slack, skipped pad requests; determinism",
             check=check_relations, strategy=lambda **kw: prefix_cases(need="fold", **_pm(kw)), kernel="materialize"),
    Property(name="pm_graph", clauses="PMR6 PMS5",
             doc="active list and num_active built on the device; CUDA-graph capture and replay bit-equal to eager",
             check=check_graph, strategy=lambda **kw: prefix_cases(need="fold", actives=("derived",), **_pm(kw)),
             reseed=False, kernel="materialize"),
    Property(name="pm_guards", clauses="PMH1-PMH19",
             doc="changes of a valid call raise what the release model says, in its order, naming the argument",
             check=check_guards, strategy=lambda **kw: prefix_cases(buckets=(1,), **_pm(kw)), kernel="materialize"),
)


__all__ = ["PROPERTIES", "check_launch", "check_call", "check_relations", "check_graph", "check_guards", "call",
           "device_active", "guard_changes", "sweep_changes"]
