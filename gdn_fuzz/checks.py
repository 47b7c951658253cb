"""Launch a Case on a target, observe every buffer it may touch, and check it.

observe()       (gdn_fuzz.observation) materialize -> copy "before" -> target launch -> Observation
check_oracle()  outputs, appended k/u/g and the folded checkpoint vs the float64 oracle
                within the arm's tolerance (M1-M7)
check_writes()  every element outside the launch's write set keeps its bits (M8, R2)

Checks return Findings; they never print.  Comparisons stay on the device and are
reduced there: a passing check_launch pulls two small tensors to the host (the oracle
summary and the write-check flags), whatever B and the geometry; details (where a write
landed, which row) are only looked up once a check has failed.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass

import torch

from gdn_fuzz import fused_oracle, graphs
from gdn_fuzz.case import Case, Row, draws_for, materialize
from gdn_fuzz.compare import floor_of, from_sums, rel_to_magnitude, table_for
from gdn_fuzz.findings import BITS_DIFFER, Finding, Findings, NON_FINITE, OUT_OF_TOLERANCE, WRONG_VALUE, attach, launch_record, raised
from gdn_fuzz.observation import (POOL_BUFFERS, READ_ONLY, Observation, RowsLaunch, bits, differ_bits, drawn,
                                  mapped_rows, observe, observe_rows, same_bits)
from gdn_fuzz.oracles import ring as ring_oracle
from gdn_fuzz.targets import Target


def _worst_on_device(ratio: torch.Tensor, rel: torch.Tensor, live_rows: torch.Tensor) -> torch.Tensor:
    """[flat index, ratio, rel, any live] of the worst live (row, head), as a float64 tensor
    on the metrics' device (no host round trip).  ratio, rel [B, X]; live_rows [B]."""
    m = torch.where(live_rows[:, None], torch.nan_to_num(ratio.double(), nan=float("inf")),
                    torch.full_like(ratio, -1.0, dtype=torch.float64))
    flat = torch.argmax(m).reshape(1)  # take(), not [flat]: indexing by a tensor would read it on the host
    return torch.cat([flat.double(), m.take(flat), rel.double().take(flat), live_rows.any().double().reshape(1)])


def _worst(metric: torch.Tensor, live_rows: torch.Tensor):
    """(row, head, value) of the worst (row, head) over live rows; metric [B, X]."""
    flat, val, _, _ = _worst_on_device(metric, metric, live_rows).tolist()
    r, h = divmod(int(flat), metric.shape[1])
    return r, h, val


def _not_finite(t: torch.Tensor) -> torch.Tensor:
    """~torch.isfinite(t) in two kernels, not five (isfinite is |t| != inf and t == t, then the not): t - t is 0
    for every finite t and NaN for an infinity or a NaN."""
    return (t - t) != 0


def _nonfinite(t: torch.Tensor, dims) -> torch.Tensor:
    x = _not_finite(t)
    for d in sorted(dims, reverse=True):
        x = x.any(d)
    return x


def _check_case_cursors(case: Case) -> None:
    """ring_oracle.check_cursors on the Case's own rows, as host integers (no device round trip, no tensor op)."""
    ring_oracle.check_row_cursors([r.slot for r in case.rows], [r.hist_len for r in case.rows])


def _oracle_inputs(obs: Observation, flush_min=None) -> dict:
    """The oracle's keywords for the observed launch (from its "before"); the cursors of a launch materialized
    from its Case are validated from the Case's rows, not on the device.  flush_min: the case's (default), or
    the same number as a 0-d device tensor (gdn_fuzz.graphs: data, not a constant of the graph)."""
    b, case = obs.before, obs.case
    validate = not obs.from_case
    if obs.from_case:
        _check_case_cursors(case)
    return dict(
        q=b["q"], k=b["k"], v=b["v"], a=b["a"], b=b["b"], A_log=b["A_log"], dt_bias=b["dt_bias"],
        pool=b["initial_state_source"], idx=b["initial_state_indices"], k_cache=b["k_cache"],
        u_cache=b["u_cache"], g_cache=b["g_cache"], hist_len=b["hist_len"], cache_base=b["cache_base"],
        flush_min=case.fmin if flush_min is None else flush_min, scale=b.get("scale") or 1.0 / (case.K ** 0.5),
        validate=validate)


def expectation(obs: Observation, flush_min=None) -> ring_oracle.LaunchExpectation:
    """The float64 expectation of the observed launch: oracles.ring.launch (the spec), or the same
    numbers from the fused Triton oracle (gdn_fuzz.fused_oracle) where GDN_FUZZ_ORACLE picks it
    (auto, the default: on a CUDA device where triton imports; spec; fused).  flush_min as in _oracle_inputs."""
    return fused_oracle.oracle_for(obs.before["q"].device)(**_oracle_inputs(obs, flush_min))


def summed_errors(obs: Observation, e: ring_oracle.LaunchExpectation) -> torch.Tensor:
    """[B, HV, 3, 3] float64: for y, u and the fold (fused_oracle.SUMMED), per (row, v-head), sum (got - want)^2,
    sum mag^2 and the number of non-finite got elements, from a whole expectation; what fused_oracle.measure
    computes inside its kernel (fused_oracle.Measured.sums).  y sums are 0 where the launch returned no output."""
    a = obs.after
    idx = obs.before["initial_state_indices"].long().clamp(min=0)
    B, T = e.slots.shape

    def sums(got, want, mag, dims):
        g = got.double()
        return torch.stack([(g - want).pow(2).sum(dims), mag.double().pow(2).sum(dims),
                            (~torch.isfinite(g)).sum(dims).double()], -1)

    u_got = a["u_cache"].permute(0, 2, 1, 3)[idx[:, None].expand(B, T), e.slots]  # [B, T, HV, V]
    u = sums(u_got, e.u_app, e.u_mag, (1, 3))
    y = sums(obs.output, e.y, e.y_mag, (1, 3)) if obs.output is not None else torch.zeros_like(u)
    fold = sums(a["initial_state_source"][idx], e.fold, e.fold_mag, (2, 3))
    return torch.stack([y, u, fold], 2)


def measure(obs: Observation, flush_min=None):
    """(expectation, sums) of the observed launch: the fused oracle's kernel compares the launch as it computes
    the expectation where GDN_FUZZ_ORACLE picks it (fused_oracle.measure: a Measured, no [V, K] tensor built);
    else the spec's whole LaunchExpectation and summed_errors of it.  Either way sums is [B, HV, 3, 3] and the
    expectation has the fields oracle_metrics and check_oracle read (k_app, g_app, g_mag, slots, flush, pad)."""
    a = obs.after
    if fused_oracle.oracle_for(obs.before["q"].device) is fused_oracle.launch:
        m = fused_oracle.measure(**_oracle_inputs(obs, flush_min), y_out=obs.output, u_after=a["u_cache"],
                                 pool_after=a["initial_state_source"])
        return m, m.sums
    e = expectation(obs, flush_min)
    return e, summed_errors(obs, e)


def prepare_oracle(device: str, arms, Ts, gate: fused_oracle.Gate | None = None) -> int:
    """Compile the oracle's kernel for `device` now (the fused oracle's Triton kernel: per arm, the HISTORY variant
    that case.materialize fills windows with, then per T and arm the measure variant, which check_launch and
    check_oracle use; nothing for the spec), so that no check pays that compile.  An isolated worker runs this
    on a thread while its first check's target compiles (OraclePrep; `gate`: set its `history` event once the
    first part is done).  The variant that writes the whole expectation (expectation(): the sibling property
    and the studies) compiles at its first use.  Returns the (arm, T) pairs run."""
    if fused_oracle.oracle_for(device) is ring_oracle.launch:
        return 0
    obs = {}
    for arm in arms:
        for T in Ts:
            case = Case(arm=arm, T=T, H=1, HV=1, pool=1, rows=(Row(0, 1, 0),), seed=0, draws=draws_for(device))
            inputs = materialize(case, device)  # a window of one record: the HISTORY variant, per arm
            obs[arm, T] = Observation(case=case, before=inputs, after=inputs, output=torch.zeros_like(inputs["v"]),
                                      from_case=True)  # y has v's shape and IO dtype
    if gate is not None:
        gate.history.set()
    for o in obs.values():
        measure(o)
    return len(obs)


class OraclePrep:
    """prepare_oracle on a background thread, behind a fused_oracle.Gate: an isolated worker starts this and
    reports ready at once, so that the oracle's compiles (7.2-7.9 s when 8 processes compile them from an empty
    Triton cache on the H200, run 63) overlap the first check's target compile instead of preceding it.  Until
    it is done, a fused-oracle call on another thread waits (a HISTORY call only for the first part).  Triton's
    compile leaves the interpreter lock free most of the time (measured: a Python loop on the main thread kept
    its speed while a compile ran on another).  seconds: how long the compiles took (None while they run);
    error: why they failed (None: they did not)."""

    def __init__(self, device: str, arms, Ts):
        self.gate = fused_oracle.Gate()
        self.seconds: float | None = None
        fused_oracle.install_gate(self.gate)
        self._thread = threading.Thread(target=self._run, args=(device, tuple(arms), tuple(Ts)),
                                        name="gdn-fuzz-oracle-prep", daemon=True)
        self._thread.start()

    def _run(self, device, arms, Ts) -> None:
        self.gate.owner = threading.get_ident()
        t0 = time.monotonic()
        try:
            prepare_oracle(device, arms, Ts, gate=self.gate)
        except Exception as e:  # noqa: BLE001 - every waiter raises it; the worker reports a setup error
            self.gate.error = f"{type(e).__name__}: {e}"
        finally:
            self.seconds = round(time.monotonic() - t0, 3)
            self.gate.history.set()
            self.gate.done.set()

    @property
    def error(self) -> str | None:
        return self.gate.error

    def join(self) -> "OraclePrep":
        self._thread.join()
        return self

    def report(self) -> dict:
        """oracle_s (the compiles' seconds, None while they run) and oracle_wait_s (how long checks waited)."""
        return dict(oracle_s=self.seconds, oracle_wait_s=round(self.gate.waited_s, 3))


@dataclass
class Metric:
    """Per-(row, head) agreement of one output with the oracle.

    rel    error / magnitude of its terms (inf where the target gave non-finite values)
    ratio  error / allowed error (rtol * magnitude + atol floor); > 1 fails
    live   the rows this output exists for ([B] bool)
    """

    rel: torch.Tensor
    ratio: torch.Tensor
    live: torch.Tensor

    def worst(self):
        """(row, head, ratio, rel) at the worst live (row, head)."""
        flat, ratio, rel, _ = _worst_on_device(self.ratio, self.rel, self.live).tolist()
        r, h = divmod(int(flat), self.ratio.shape[1])
        return r, h, ratio, rel


@dataclass
class MetricSummary:
    """One Metric on the host: the worst live (row, head), and the worst rel per row."""

    row: int
    head: int
    ratio: float
    rel: float
    any_live: bool
    row_rel: list  # [B] worst rel over heads, per row
    live: list  # [B] bool


def summary_tensor(metrics: dict[str, Metric]) -> torch.Tensor:
    """Every metric's verdict as one float64 device tensor: per metric [flat index, ratio, rel, any live] of its
    worst live (row, head), then the worst rel per row [B] and the live rows [B]; summarize() reads it back.

    The metrics of one [B, X] shape are reduced together, stacked (a dozen kernels per shape, not per metric: on a
    GPU each is a few microseconds of a check's replayed graph); the numbers are _worst_on_device's, bit for bit
    (the same elementwise float64 operations; argmax takes the first of equal maxima either way)."""
    groups: dict[tuple, list[str]] = {}
    for name, m in metrics.items():
        groups.setdefault(tuple(m.rel.shape), []).append(name)
    parts = {}
    for names in groups.values():
        ratio = torch.stack([metrics[n].ratio for n in names]).double()  # [M, B, X]
        rel = torch.stack([metrics[n].rel for n in names]).double()
        live = torch.stack([metrics[n].live for n in names])  # [M, B]
        m = torch.where(live[:, :, None], torch.nan_to_num(ratio, nan=float("inf")), -1.0).flatten(1)
        flat = torch.argmax(m, 1, keepdim=True)  # [M, 1]
        part = torch.cat([flat.double(), m.gather(1, flat), rel.flatten(1).gather(1, flat),
                          live.any(1, keepdim=True).double(), rel.amax(2), live.double()], 1)  # [M, 4 + 2B]
        parts.update(zip(names, part))
    return torch.cat([parts[n] for n in metrics])


def read_summary(flat: list, shapes: dict[str, tuple]) -> dict[str, MetricSummary]:
    """summary_tensor's values on the host (a list), per metric name and its [B, X] shape, in order."""
    out, i = {}, 0
    for name, (B, X) in shapes.items():
        f, ratio, rel, any_live = flat[i:i + 4]
        r, h = divmod(int(f), X)
        out[name] = MetricSummary(r, h, ratio, rel, bool(any_live), flat[i + 4:i + 4 + B],
                                  [bool(x) for x in flat[i + 4 + B:i + 4 + 2 * B]])
        i += 4 + 2 * B
    return out


def summarize(metrics: dict[str, Metric]) -> dict[str, MetricSummary]:
    """Every metric's verdict in ONE device-to-host transfer (a few floats per row)."""
    if not metrics:
        return {}
    return read_summary(summary_tensor(metrics).cpu().tolist(), {n: tuple(m.rel.shape) for n, m in metrics.items()})


CLAUSES = {"y": "M4", "k": "M5", "u": "M5", "g": "M6", "fold": "M7"}


@functools.lru_cache(maxsize=256)
def _coefficients(arm: str, outputs: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rtol, floor), float64 tensors [len(outputs)] on `device`, of the outputs (name, elements per slice) in
    order: the arm's tolerance table (compare.table_for) and from_sums' floor, atol * sqrt(elements).  Made once
    per key, outside any CUDA-graph capture (gdn_fuzz.graphs runs a check once before capturing it): the device
    code gets these numbers, never the rules."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the tolerance coefficients of {arm} {outputs} were first asked for inside a CUDA-graph "
                           "capture; run the check once before capturing it (gdn_fuzz.graphs._capture does)")
    tol = table_for(arm)
    rtol = [tol[name].rtol for name, _ in outputs]
    floor = [floor_of(n, tol[name].atol) for name, n in outputs]
    return (torch.tensor(rtol, dtype=torch.float64, device=device),
            torch.tensor(floor, dtype=torch.float64, device=device))


def oracle_metrics(obs: Observation, e=None, sums: torch.Tensor | None = None) -> dict[str, Metric]:
    """M4-M7: y, appended k/u/g and the fold against the float64 oracle, per (row, head).

    e, sums: measure(obs), or a whole LaunchExpectation (its sums are then summed_errors of it)."""
    if e is None:
        e, sums = measure(obs)
    elif sums is None:
        sums = summed_errors(obs, e)
    tol = table_for(obs.case.arm)
    live = ~e.pad
    B, T = e.slots.shape
    V, K = obs.before["initial_state_source"].shape[-2:]
    out: dict[str, Metric] = {}

    def metric(t, err, den, floor, nonfin, live_mask) -> Metric:
        inf = torch.full_like(err, float("inf"))
        ratio = torch.where(nonfin, inf, err / (t.rtol * den + floor).clamp_min(1e-300))
        rel = torch.where(nonfin, inf, err / den.clamp_min(1e-300))
        return Metric(rel, ratio, live_mask)

    # y, u and the fold from their sums: [B, HV] per output, the three reduced together (sums[:, :, j] is output j)
    outs = [o for o in (("y", T * V, live), ("u", T * V, live), ("fold", V * K, e.flush))
            if o[0] != "y" or obs.output is not None]
    s = sums[:, :, 3 - len(outs):]  # [B, HV, len(outs), 3]: y's sums are first
    rtol, floor = _coefficients(obs.case.arm, tuple((name, n) for name, n, _ in outs), s.device)
    err, den, _ = from_sums(s[..., 0], s[..., 1], 1)
    nonfin = s[..., 2] > 0
    ratio = torch.where(nonfin, float("inf"), err / (den * rtol + floor).clamp_min(1e-300))
    rel = torch.where(nonfin, float("inf"), err / den.clamp_min(1e-300))
    for j, (name, _, live_mask) in enumerate(outs):
        out[name] = Metric(rel[..., j], ratio[..., j], live_mask)
    # k: appends at (idx, k-head, slot(P+s)) -> [B, T, H, K], per (row, k-head) over (T, K)
    idx = obs.before["initial_state_indices"].long().clamp(min=0)
    k_got = obs.after["k_cache"].permute(0, 2, 1, 3)[idx[:, None].expand(B, T), e.slots]
    err, den, floor = rel_to_magnitude(k_got, e.k_app, e.k_app.abs(), (1, 3), tol["k"].atol)
    out["k"] = metric(tol["k"], err, den, floor, _nonfinite(k_got, (1, 3)), live)
    # g: max over tokens of |dG| / summed |g|  -> [B, HV]
    g_got = obs.after["g_cache"].permute(0, 2, 1)[idx[:, None].expand(B, T), e.slots]  # [B, T, HV]
    tg = tol["g"]
    g_abs = (g_got.double() - e.g_app).abs()  # [B, T, HV]
    tokens = torch.arange(1, T + 1, device=g_abs.device, dtype=torch.float64)[None, :, None]
    floor = tokens * torch.exp(obs.before["A_log"].double())[None, None, :] * tg.atol
    nonfin = _not_finite(g_got)
    g_rel = torch.where(nonfin, float("inf"), g_abs / e.g_mag.clamp_min(1e-30)).amax(1)
    g_ratio = torch.where(nonfin, float("inf"), g_abs / (tg.rtol * e.g_mag + floor).clamp_min(1e-300)).amax(1)
    out["g"] = Metric(g_rel, g_ratio, live)
    return {name: out[name] for name in ("y", "k", "u", "g", "fold") if name in out}


def check_oracle(obs: Observation, e: ring_oracle.LaunchExpectation | None = None,
                 metrics: dict[str, Metric] | None = None,
                 summary: dict[str, MetricSummary] | None = None) -> list[Finding]:
    """M1-M7 as findings: every output whose worst (row, head) exceeds the arm's tolerance.

    summary: summarize(metrics), when the caller has it already (one transfer per launch).
    """
    case = obs.case
    if obs.error is not None:
        return [Finding("launch", "H*", f"a legal case raised {type(obs.error).__name__}: {obs.error}",
                        outcome=raised(obs.error))]
    if e is None:
        e, sums = measure(obs)
        metrics = oracle_metrics(obs, e, sums) if metrics is None and summary is None else metrics
    findings: list[Finding] = []
    if obs.output is None:
        findings.append(Finding("launch.output", "M8", "the entry point returned None instead of the output tensor",
                                outcome=WRONG_VALUE))
    tol = table_for(case.arm)
    if summary is None:
        summary = summarize(oracle_metrics(obs, e) if metrics is None else metrics)
    for name, sm in summary.items():
        if not sm.any_live:
            continue
        r, h, ratio, rel = sm.row, sm.head, sm.ratio, sm.rel
        if ratio <= 1.0:
            continue
        t = tol[name]
        nonfinite = rel == float("inf")
        if name == "g":
            what = ("non-finite appended cumulative log-decay" if nonfinite else
                    "appended cumulative log-decay differs from ") + ("" if nonfinite else (
                        "G_s (flush row: local restart at 0)" if bool(e.flush[r]) else "G_P + G_s (verify row)"))
        else:
            what = ("non-finite values" if nonfinite else "error above the tolerance") + \
                f" of the {case.arm} arm ({_tol_reason(t)})"
        findings.append(Finding(f"oracle.{name}", CLAUSES[name], what, row=r, head=h, value=rel, tol=t.rtol,
                                outcome=NON_FINITE if nonfinite else OUT_OF_TOLERANCE,
                                family="flush" if bool(e.flush[r]) else "verify",
                                unit=UNITS[name], bound=_tol_bound(t)))
    return findings


# what check_oracle's numbers are (Finding.unit), per output
UNITS = {
    "y": "relative error per (row, head) vs the float64 oracle (||error|| / ||magnitude of its terms|| over T x V)",
    "u": "relative error per (row, head) vs the float64 oracle (||error|| / ||magnitude of its terms|| over the "
         "T appended u records)",
    "k": "relative error per (row, head) vs the float64 oracle (||error|| / ||k_hat|| over the T appended k records)",
    "fold": "relative error per (row, head) vs the float64 oracle (||error|| / ||magnitude of its terms|| over the "
            "folded V x K checkpoint)",
    "g": "error per (row, head) vs the float64 oracle (max over the T appended g of |error| / the summed |g| that "
         "built it)",
}


def _tol_bound(t) -> str:
    """'4 x u(IO=bfloat16)' (+ the absolute floor): how a tolerance is made up (Tol.source, first part)."""
    b = t.source.split(":", 1)[0].replace("torch.", "").strip()
    if t.atol and not b.startswith("2^-16"):
        b += f" (+ an absolute floor of {t.atol:.2g} per element)"
    return b


def _tol_reason(t) -> str:
    """The rest of Tol.source: why the bound is what it is."""
    parts = t.source.split(":", 1)
    return (parts[1] if len(parts) > 1 else parts[0]).replace("torch.", "").strip()


def _writes(obs: Observation, flush_min=None, per_input: bool = True):
    """check_writes' device half: (the ring and pool buffers as (name, mask, clause), the changed-outside masks,
    the rows compared (None: all), the read-only inputs and cursors compared, and the flags [changed outside
    per buffer] + [modified per input and cursor] as one bool device tensor).  per_input=False (the verdict): one
    flag for all the inputs and cursors, from one comparison of their bytes (which one changed is check_writes'
    question, asked only of a failing launch), and each buffer's flag from _changed_outside with no elementwise
    mask (the changed-outside masks are then None, except for a fill="rows" case on the CPU).  The pool size is
    the tensors': gdn_fuzz.graphs pads the pool-indexed buffers of a graph (rows no launch reads or writes, equal
    before and after); flush_min as in _oracle_inputs."""
    case, b, a = obs.case, obs.before, obs.after
    ws = ring_oracle.write_set(pool_size=b["initial_state_source"].shape[0], H=case.H, HV=case.HV, T=case.T,
                               idx=b["initial_state_indices"], hist_len=b["hist_len"],
                               cache_base=b["cache_base"], flush_min=case.fmin if flush_min is None else flush_min)
    masks = (("initial_state_source", ws.pool[..., None, None], "M8"),
             ("k_cache", ws.k_ring[..., None], "M5"),
             ("u_cache", ws.u_ring[..., None], "M5"),
             ("g_cache", ws.g_ring, "M5"))
    cursors = ("hist_len", "cache_base") if not case.restart_hist_on_flush else ()
    read_only = [n for n in READ_ONLY if isinstance(b.get(n), torch.Tensor)]
    # every verdict reduced on the device, then one transfer: [changed outside] + [modified]
    # fill="rows" on the CPU: only the rows whose pages were ever mapped can differ (mapped_rows)
    rows = [_mapped_either(b[name], a[name]) if obs.from_case and case.fill == "rows" else None
            for name, _, _ in masks]
    compared = read_only + list(cursors)
    if per_input or any(r is not None for r in rows):  # element by element: check_writes' evidence
        changed = [torch.where(mask, False, differ_bits(b[name], a[name])) if r is None
                   else torch.where(mask[r.to(mask.device)], False, differ_bits(b[name][r], a[name][r]))
                   for (name, mask, _), r in zip(masks, rows)]
        outside = [c.any() for c in changed]
    else:  # the verdict: one flag per buffer
        changed = None
        outside = [_changed_outside(b[name], a[name], mask) for name, mask, _ in masks]
    if per_input:
        modified = [~same_bits(b[n], a[n]).all() for n in compared]
    else:
        modified = [(_bytes([b[n] for n in compared]) != _bytes([a[n] for n in compared])).any()]
    flags = torch.stack(outside + modified)
    return masks, changed, rows, read_only, cursors, flags


def _changed_outside(b: torch.Tensor, a: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Whether any bit of b and a differs where `mask` (broadcast against them) is False: a bool device scalar,
    the same as torch.where(mask, False, differ_bits(b, a)).any(), with less memory traffic.  Where the mask is
    constant along the last dim (the pool's and the rings' value and key dims), the bits are compared in 8-byte
    words (a word differs exactly when one of its elements does); the comparison is then reduced over every dim
    along which the mask is constant (size 1 or a broadcast view's stride 0) before the mask is applied.  On the
    pool-scale cases (pools of GiBs, bf16) the boolean intermediate is 1/4 of the elements, written once, read once."""
    m = mask.expand(b.shape)  # a view: stride 0 along every dim the mask broadcasts
    wb, wa = (_words(b), _words(a)) if m.dim() > 0 and m.stride(-1) == 0 and b.shape[-1] > 1 else (None, None)
    d = wb != wa if wb is not None and wa is not None else differ_bits(b, a)
    const = tuple(i for i in range(m.dim()) if m.stride(i) == 0 and d.shape[i] > 1)
    if const:
        d = d.any(dim=const, keepdim=True)
        for i in const:
            m = m.narrow(i, 0, 1)
    return torch.where(m, False, d).any()


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """t's bits as 8-byte words along its last dim (a word is nonzero, or differs, exactly when one of its elements'
    bits does), or None where t is not contiguous or its last dim's bytes are not whole aligned words."""
    if t.dim() and t.is_contiguous() and (t.shape[-1] * t.element_size()) % 8 == 0 and t.data_ptr() % 8 == 0:
        return t.view(torch.int64)
    return None


def _bytes(tensors: list) -> torch.Tensor:
    """The tensors' bytes end to end, one uint8 tensor (one copy kernel for all of them)."""
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


def check_writes(obs: Observation) -> list[Finding]:
    """M8/R2: bits outside the write set are unchanged; read-only inputs are unchanged."""
    masks, changed, rows, read_only, cursors, flags = _writes(obs)
    flags = flags.tolist()
    findings = []
    for (name, _, clause), c, r, bad in zip(masks, changed, rows, flags):
        if bad:
            where = c.nonzero()[0].tolist()
            if r is not None:
                where[0] = int(r[where[0]])
            findings.append(Finding(f"writes.outside.{name}", clause,
                                    f"{name}{where} changed but lies outside the launch's write set "
                                    f"({int(c.sum())} elements)", outcome=BITS_DIFFER))
    for name, bad in zip(read_only, flags[len(masks):]):
        if bad:
            findings.append(Finding(f"writes.inputs.{name}", "M8", f"read-only input {name} was modified",
                                    outcome=BITS_DIFFER))
    for name, bad in zip(cursors, flags[len(masks) + len(read_only):]):
        if bad:
            findings.append(Finding(f"writes.cursors.{name}", "C1",
                                    f"{name} changed with restart_hist_on_flush=False (the kernel never writes cursors)",
                                    outcome=BITS_DIFFER))
    return findings


def _mapped_either(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor | None:
    """Indices of the dim-0 rows mapped in `b` or `a` (observation.mapped_rows), None where unknown."""
    rb, ra = mapped_rows(b), mapped_rows(a)
    return None if rb is None or ra is None else (rb | ra).nonzero().squeeze(1)


def row_metrics(summary: dict[str, MetricSummary]) -> dict:
    """Worst error / magnitude per row and output (None where the row has no such output)."""
    return {name: [v if live else None for v, live in zip(sm.row_rel, sm.live)] for name, sm in summary.items()}


def check_launch(target: Target, case: Case, device: str = "cpu") -> Findings:
    """The minimal per-launch property: oracle agreement plus the write set."""
    return begin_launch(target, case, device)()


def begin_launch(target: Target, case: Case, device: str = "cpu", ready: tuple[dict, dict] | None = None):
    """check_launch in two halves: this one draws (unless `ready`: prepare_launch's, for this case and device),
    launches and starts the verdict, whose one transfer to the host it queues without waiting for the device; the
    half it returns, finish() -> Findings, waits for that transfer and judges.  Between the two an isolated worker
    that draws ahead ($GDN_FUZZ_DRAW_AHEAD, gdn_fuzz.engine.isolation) draws the next case: the host works while the
    device ends this verdict.  finish()
    must be called, once, before the next begin_launch of the same shape (the verdict's CUDA graph is replayed
    with the next launch's tensors)."""
    try:
        pending = [_begin_launch(target, case, device, ready)]
    except BaseException:
        release_cache(case, device)
        raise

    def finished() -> Findings:
        if not pending:
            raise RuntimeError(f"the verdict of this launch (case seed {case.seed}) was already read: call the "
                               "function begin_launch returns once")
        finish = pending.pop()  # the one reference to the launch's tensors (its closures hold the observation)
        try:
            return finish()
        finally:
            # dropped before the cache is emptied, which hands back no block still in use.  Before 81c6f64 the
            # launch's 10.5 GiB pool (4096 slots at HV = 64) was still alive here, so every process that had drawn
            # one kept it reserved; in run 91 (8 processes, an 80 GB H100) 16 of 24 workers ran out of memory 1-4
            # times
            del finish
            release_cache(case, device)

    return finished


def release_cache(case: Case, device: str) -> None:
    """After a fill="rows" case past EMPTY_CACHE_BYTES on a CUDA device, once its tensors are gone: the caching
    allocator's blocks back to the device (up to ~10.5 GiB it would keep reserved, on a GPU that several campaign
    processes share, --processes)."""
    if case.fill == "rows" and torch.device(device).type == "cuda" and case.alloc_bytes() > EMPTY_CACHE_BYTES:
        torch.cuda.empty_cache()


# prepare_launch draws ahead only a launch whose pool and rings take at most this many bytes: a second launch's
# tensors (and their "before" copies) are alive beside the one being judged.  The campaign's default shapes take
# under 1 MiB; a B = 64 launch at H = 16, HV = 64 takes ~170 MiB; the pool-scale cases (fill="rows") are never drawn
# ahead.
PREPARE_MAX_BYTES = 256 << 20


def prepare_launch(case: Case, device: str = "cpu") -> tuple[dict, dict] | None:
    """What begin_launch(target, case, device) draws before it launches (observation.drawn: materialize and the
    "before" snapshot; no code of the target runs), or None where it draws nothing ahead: a fill="rows" case (its
    rows are observed alone, observe_rows), or one past PREPARE_MAX_BYTES."""
    if case.fill == "rows" or case.alloc_bytes() > PREPARE_MAX_BYTES:
        return None
    return drawn(case, device)


# check_launch hands the caching allocator's blocks back to the device after a fill="rows" case whose pool and rings
# (one copy: the launch's; "before" holds the rows' slots only, observe_rows, except for a failing launch's
# evidence) pass this: the pools past 2^31 elements (5.5-10.5 GiB in
# the default menu) and the "thousands" pools at HV = 64 (5.3-10.5 GiB) do; the "thousands" pools of the small
# geometries (0.1-0.3 GiB) keep their blocks for the next one (with an empty_cache after each, their checks took
# ~14 ms against ~5 ms for a small pool: H200, run 79)
EMPTY_CACHE_BYTES = 1 << 30


def verdict(obs: Observation, flush_min=None) -> torch.Tensor:
    """check_launch's device half, one float64 tensor on the inputs' device: summary_tensor of the oracle
    metrics, then the write-set flags of check_writes.  A pure function of obs's tensors (and of the case's
    arm, scale and cursor mode), with no host round trip for a launch materialized from its Case: what
    gdn_fuzz.graphs captures as a CUDA graph.  flush_min as in _oracle_inputs."""
    e, sums = measure(obs, flush_min)
    return torch.cat([summary_tensor(oracle_metrics(obs, e, sums)),
                      _writes(obs, flush_min, per_input=False)[-1].double()])


def verdict_shapes(obs: Observation) -> tuple[dict[str, tuple], int]:
    """The layout of verdict(obs): the metrics' names and [B, X] shapes in order, and the number of write flags."""
    case = obs.case
    shapes = {n: (case.B, case.H if n == "k" else case.HV) for n in ("y", "k", "u", "g", "fold")
              if n != "y" or obs.output is not None}
    return shapes, 5  # 4 buffers' changed-outside flags, then one for the read-only inputs and cursors


def _begin_launch(target: Target, case: Case, device: str, ready):
    if case.fill == "rows" and case.used_slots():  # (with no row on the pool, observe() draws nothing big)
        return _begin_rows(observe_rows(target, case, device))
    return _begin_observed(observe(target, case, device, ready=ready))


def set_rows(t: torch.Tensor) -> torch.Tensor:
    """[t.shape[0]] bool: whether any bit of that dim-0 row of t is set (compared in 8-byte words where the rows
    allow: a word is nonzero exactly when one of its elements' bits is)."""
    flat = t.reshape(t.shape[0], math.prod(t.shape[1:]))
    if flat.shape[1] == 0:
        return torch.zeros(flat.shape[0], dtype=torch.bool, device=t.device)
    w = _words(flat)
    return ((bits(flat) if w is None else w) != 0).any(dim=1)


def _set_outside(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Whether any bit of t is set in a dim-0 row where `keep` ([rows] bool, t's device) is False: a bool device
    scalar.  On the CPU only the rows whose pages were ever mapped are read (a page never mapped reads as zero:
    observation.mapped_rows)."""
    mapped = mapped_rows(t) if t.device.type == "cpu" else None
    if mapped is not None:
        return set_rows(t[(mapped & ~keep).nonzero().squeeze(1)]).any()
    return (set_rows(t) & ~keep).any()


def rows_outside(rl: RowsLaunch) -> torch.Tensor:
    """The write-set flags of a fill="rows" launch that its compact observation (RowsLaunch.obs) cannot see: per
    pool buffer, whether a slot no row uses holds a set bit after the launch (they were all zero before it, by
    construction: M8 for the pool, M5 for the rings), then whether the launch changed its slot indices (M8, a
    read-only input).  One bool device tensor, no host round trip."""
    keep = torch.zeros(rl.case.pool, dtype=torch.bool, device=rl.used.device)
    keep[rl.used] = True
    flags = [_set_outside(rl.launched[name], keep) for name in POOL_BUFFERS]
    flags.append((rl.launched["initial_state_indices"] != rl.indices).any())
    return torch.stack(flags)


def check_rows(rl: RowsLaunch) -> Findings:
    """check_launch's verdict on a fill="rows" launch: checks.verdict on its compact observation (every row's
    oracle agreement and write set, as a small launch of the same rows: replayed from the CUDA graph of that shape)
    and rows_outside for the rest of the pool, in one transfer.  The evidence of a failing launch is that of the
    whole launch (RowsLaunch.full: "before" drawn again, the whole pool compared), as check_observed gives it."""
    return _begin_rows(rl)()


def _begin_rows(rl: RowsLaunch):
    if rl.obs.error is not None:
        return lambda: check_observed(rl.full())
    return _judge(rl.obs, rl.case, rows_outside(rl), rl.full)


def check_observed(obs: Observation) -> Findings:
    """check_launch's verdict on a launch already observed (observe(target, case, device) of obs.case)."""
    return _begin_observed(obs)()


def _begin_observed(obs: Observation):
    if obs.error is not None:
        return lambda: attach(Findings(check_oracle(obs)), launch_record(obs.case))
    return _judge(obs, obs.case, None, lambda: obs)


def _to_host(t: torch.Tensor):
    """The one transfer of a verdict, queued: a function that waits for it and returns t's values as a list.  On a
    CUDA device a copy into page-locked memory and an event behind it, so the host may work until it reads; t may
    be a CUDA graph's output, which the copy has read before any later replay on the stream."""
    if t.device.type != "cuda":
        return t.tolist
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def read() -> list:
        done.synchronize()
        return host.tolist()

    return read


def _judge(obs: Observation, case: Case, more_flags: torch.Tensor | None, whole):
    """The verdict of `obs` (graphs.run of verdict), with more write flags (a bool device tensor, or None) read in
    the same transfer, in two halves: the verdict started and its transfer queued (this call), then the function
    returned, finish() -> Findings, which waits for the transfer and judges (begin_launch).  A failing launch's
    evidence is computed on whole() (the launch as observe() sees it); the findings carry case's launch record."""
    shapes, n_flags = verdict_shapes(obs)
    got = graphs.run(verdict, obs, lambda o: _check_case_cursors(o.case))
    if more_flags is not None:
        got, n_flags = torch.cat([got, more_flags.double()]), n_flags + more_flags.numel()
    read = _to_host(got)  # the one transfer
    return lambda: _judged_from(obs, case, read(), shapes, n_flags, whole)


def _judged_from(obs: Observation, case: Case, flat: list, shapes: dict, n_flags: int, whole) -> Findings:
    summary = read_summary(flat, shapes)
    passed = obs.output is not None and not any(flat[len(flat) - n_flags:]) and all(
        sm.ratio <= 1.0 or not sm.any_live for sm in summary.values())
    if passed:
        res = Findings([])
    else:  # the evidence, eagerly: check_oracle reads the flush rows, check_writes finds where a write landed
        full = whole()
        e, _ = measure(full)
        res = Findings(check_oracle(full, e, summary=summary) + check_writes(full))
    res.metrics = row_metrics(summary)
    return attach(res, launch_record(case))
