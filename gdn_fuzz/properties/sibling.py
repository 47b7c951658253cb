"""The verify-only sibling as a property and a differential oracle (issue 18).

Not in gdn_fuzz.properties.REGISTRY on purpose: the sibling is another kernel (16-slot flat ring,
bf16 only, read-only state; gdn_fuzz.targets.verify_sibling), so campaigns over the fused entry
point do not schedule it and corpus replay never meets it.  Its checks and strategies are exposed
here for tests/test_verify_sibling.py and for any script that wants them:

  sibling_cases()          Cases the sibling accepts: arm bf16, every real row at cache_base 0 with
                           0 <= P <= 16 - T, pad rows, any value regime
  check_sibling_launch()   (a) one sibling launch against the float64 oracle of its own layout
                           (oracles.flat_ring): outputs y, the appended k/u/g records on flat rows
                           [P, P + T), the pool bitwise untouched, every flat-ring row outside
                           [P, P + T) bitwise untouched, read-only inputs untouched
  differential_cases()     fused-kernel Cases (arm bf16, any legal flush_min) with at least one row
                           the differential can compare, other rows free (any base, flush rows)
  check_differential()     (b) the sibling against the fused kernel's verify rows

Which rows the differential compares (eligible_rows): non-pad rows with cache_base = 0,
0 <= P, P + T <= 16 (the sibling's domain) and P < flush_min (the fused kernel routes them to its
verify path, contract M7/M8).  The fused kernel runs the Case as drawn (every row); the sibling
runs the same inputs with its rings mapped to the flat layout (verify_sibling.fused_ring_to_flat:
flat row j = ring slot j at base 0) and every other row turned into a pad row.  The sibling's rings
are mapped back (flat_to_fused_ring) and compared with the fused kernel's, slot by slot.

Bitwise or within tolerance, and why (checked against both sources, flashinfer-python 0.7.2.post1;
S = gdn_decode_bf16_wy_ucache.py, F = gdn_decode_bf16_wy_ucache_flush.py, line numbers):

  The contract (M7, a (src) claim) says the sibling is bit-identical to the fused kernel's verify
  rows at base 0.  The two kernel bodies are the same code in the bf16 arm except where noted:
  * ring addresses: F adds (ring_base + row) & 31 everywhere S uses the physical row (g load F 1466
    vs S 946; k tile F 2020 vs S 1445; u tile F 2400 vs S 1780; appends F 1830/1920/2948 vs S
    1282/1340/2301); at base 0 with P + T <= 16 both address the same row numbers;
  * the g append: F stores (P >= flush_min ? 0 : G_P) + Gamma_s (1825-1827), S stores G_P + Gamma_s
    (1283): the same f32 add on a verify row;
  * dtype-generic helpers of F (_mul_packstore_f32, _mul_pack_f32, _fused_ab_4mma_serial_brow_rgb,
    _qtv_4mma_rg, _sts_rg2_f32) emit exactly S's PTX when IO = STATE = RING = bf16 (their conversion
    blocks are empty and their mnemonics are S's: F 136-317);
  * QT is rounded to bf16 by F's cvt.rn.bf16x2.f32 pair store (2677-2687) and by S's typed `.to(io)`
    stores (2045-2056): both round to nearest even, so the same bits for finite values;
  * OutStage lives in sK (F) instead of sH (S) and F hoists the k-append LDS: placement only;
  * F's flush-only code (khist snapshot, fold) is behind `P_hist >= flush_min` (2366, 2974).
  So every compared value (y; the k, u and g records appended at [P, P + T); the untouched window,
  other ring slots and pool rows) is compared BITWISE by default (exact=True): a difference is a
  finding against M7's claim.  Its size is reported against twice the tolerance table's bound
  (gdn_fuzz.compare.table_for("bf16")), so triage can tell a rounding-level difference (for instance
  a compiler contracting a multiply-add differently in one of the two kernels) from a divergence.
  exact=False compares y and the appended records within twice the table's bound instead: each side
  is within the table's bound of the same float64 oracle, so by the triangle inequality their
  difference is within twice it, per (row, head) against the same magnitudes.  That is the right
  check where the two sides are not the same arithmetic: the CPU stand-ins (the reference target for
  the fused kernel, verify_sibling.EmulatedSibling for the sibling).  Slots and rows neither side
  may write are compared bitwise in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from gdn_fuzz import checks
from gdn_fuzz.case import W_RING, Case, Row, lazy_flush_min, materialize
from gdn_fuzz.compare import table_for
from gdn_fuzz.findings import (BITS_DIFFER, NON_FINITE, OUT_OF_TOLERANCE, Finding, Findings, attach,
                               launch_record, raised)
from gdn_fuzz.observation import Observation, clone_inputs, same_bits
from gdn_fuzz.oracles import flat_ring
from gdn_fuzz.properties.base import not_exercised
from gdn_fuzz.strategies import BUCKETS, CPU_GEOMETRIES, cache_bases, flush_mins, hist_lens, regimes
from gdn_fuzz.targets import verify_sibling as vs

PROP_LAUNCH = "sibling_launch"
PROP_DIFF = "sibling_diff"
NOTE = "the sibling's inputs are materialize(case) with the rings mapped to the 16-slot flat layout " \
       "(gdn_fuzz.targets.verify_sibling.sibling_inputs)"
_SEEDS = st.integers(0, 2**32 - 1)


# ------------------------------------------------------------------ strategies


def sibling_hist_lens(T: int, hi: int | None = None):
    """P in [0, hi] (default 16 - T: the sibling's domain, P + T <= 16), edges 0, 1 and hi drawn explicitly."""
    hi = W_RING - T if hi is None else hi
    edges = sorted({p for p in (0, 1, hi) if 0 <= p <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(0, hi))


@st.composite
def sibling_cases(draw, *, Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=BUCKETS, poison=None,
                  max_extra_pool: int = 6):
    """A launch the sibling accepts: arm bf16, real rows on distinct permuted pool slots with cache_base 0
    and 0 <= P <= 16 - T, pad rows up to a bucket size, any value regime (poison included: NaN in every
    ring slot outside the windows and in unused pool rows, which the sibling must not read)."""
    T = draw(st.sampled_from(tuple(Ts)))
    H, HV = draw(st.sampled_from(tuple(geometries)))
    bucket = draw(st.sampled_from(tuple(buckets)))
    n_real = draw(st.integers(1, bucket))
    pool = n_real + draw(st.integers(0, max_extra_pool))
    slots = draw(st.permutations(range(pool)))[:n_real]
    rows = [Row(slot=s, hist_len=draw(sibling_hist_lens(T)), cache_base=0) for s in slots]
    rows += [Row(slot=-1, hist_len=0, cache_base=0)] * (bucket - n_real)
    order = draw(st.permutations(range(bucket)))
    return Case(arm=vs.SIBLING_ARM, T=T, H=H, HV=HV, pool=pool, rows=tuple(rows[i] for i in order),
                regime=draw(regimes(poison=poison)), seed=draw(_SEEDS))


@st.composite
def differential_cases(draw, *, Ts=(4, 8), geometries=CPU_GEOMETRIES, buckets=BUCKETS, poison=None,
                       max_extra_pool: int = 6):
    """A fused-kernel launch (arm bf16, flush_min None or any legal value) whose first real row is
    eligible for the differential (base 0, P <= min(16 - T, flush_min - 1)); the other real rows are
    drawn as the launch property draws them (any P in [0, 16], any base: flush rows and wrapped
    windows ride along in the fused launch and must not disturb the compared rows)."""
    T = draw(st.sampled_from(tuple(Ts)))
    H, HV = draw(st.sampled_from(tuple(geometries)))
    bucket = draw(st.sampled_from(tuple(buckets)))
    n_real = draw(st.integers(1, bucket))
    pool = n_real + draw(st.integers(0, max_extra_pool))
    fm = draw(flush_mins(T))
    fmin = fm if fm is not None else lazy_flush_min(T)
    slots = draw(st.permutations(range(pool)))[:n_real]
    rows = [Row(slot=slots[0], hist_len=draw(sibling_hist_lens(T, min(W_RING - T, fmin - 1))), cache_base=0)]
    for s in slots[1:]:
        P = draw(hist_lens(fmin))
        rows.append(Row(slot=s, hist_len=P, cache_base=draw(cache_bases(P))))
    rows += [Row(slot=-1, hist_len=0, cache_base=0)] * (bucket - n_real)
    order = draw(st.permutations(range(bucket)))
    return Case(arm=vs.SIBLING_ARM, T=T, H=H, HV=HV, pool=pool, rows=tuple(rows[i] for i in order), flush_min=fm,
                regime=draw(regimes(poison=poison)), seed=draw(_SEEDS))


def eligible_rows(case: Case) -> list[int]:
    """Batch rows the differential compares: non-pad, cache_base 0, 0 <= P, P + T <= 16, P < flush_min."""
    return [i for i, r in enumerate(case.rows)
            if not r.pad and r.cache_base == 0 and 0 <= r.hist_len and r.hist_len + case.T <= W_RING
            and r.hist_len < case.fmin]


def _check_domain(case: Case) -> None:
    """ValueError unless every real row of `case` is in the sibling's domain (a misuse, not a finding)."""
    if case.arm != vs.SIBLING_ARM:
        raise ValueError(f"the sibling is bf16 only; case.arm={case.arm!r}")
    bad = [i for i, r in enumerate(case.rows)
           if not r.pad and (r.cache_base != 0 or r.hist_len < 0 or r.hist_len + case.T > W_RING)]
    if bad:
        raise ValueError(f"rows {bad} are outside the sibling's domain (cache_base 0, 0 <= P <= 16 - T); "
                         "draw cases with sibling_cases()")


# ------------------------------------------------------------------ (a) the sibling against its oracle


@dataclass
class SiblingObservation:
    case: Case
    before: dict  # the sibling's keyword arguments (flat rings) before the launch
    after: dict  # the same tensors after it
    output: torch.Tensor | None
    error: BaseException | None = None


def observe_sibling(target, case: Case, device: str = "cpu", rows=None) -> SiblingObservation:
    """materialize(case) on `device`, mapped to the flat layout (sibling_inputs, keeping `rows`, None:
    all), a copy kept as "before", one launch of `target` (the real sibling or an emulation)."""
    inputs = vs.sibling_inputs(materialize(case, device), rows)
    before = clone_inputs(inputs)
    try:
        out, err = target.launch(**inputs), None
    except Exception as e:  # the target's own exception: a finding for the caller
        out, err = None, e
    return SiblingObservation(case=case, before=before, after=inputs, output=out, error=err)


def expectation(obs: SiblingObservation):
    """The float64 expectation of the observed sibling launch (oracles.flat_ring.launch)."""
    b = obs.before
    return flat_ring.launch(q=b["q"], k=b["k"], v=b["v"], a=b["a"], b=b["b"], A_log=b["A_log"],
                            dt_bias=b["dt_bias"], pool=b["initial_state_source"], idx=b["initial_state_indices"],
                            k_cache=b["k_cache"], u_cache=b["u_cache"], g_cache=b["g_cache"],
                            hist_len=b["hist_len"], scale=b.get("scale") or 1.0 / (obs.case.K ** 0.5))


def check_sibling_writes(obs: SiblingObservation) -> list[Finding]:
    """Bits outside the sibling's write set are unchanged (oracles.flat_ring.write_set): the whole pool,
    every flat-ring row outside [P, P + T) of each real row, and the read-only inputs."""
    case, b, a = obs.case, obs.before, obs.after
    ws = flat_ring.write_set(pool_size=case.pool, H=case.H, HV=case.HV, T=case.T,
                             idx=b["initial_state_indices"], hist_len=b["hist_len"])
    out = []
    for name, mask in ws.items():
        changed = ~same_bits(b[name], a[name])
        if name == "initial_state_source":  # nothing may change: the state is read-only (line 2800)
            what, clause = "the checkpoint pool is read-only in the sibling", "M8"
        else:
            changed = changed & ~(mask[..., None] if changed.dim() > mask.dim() else mask)
            what, clause = "outside the appended rows [P, P + T)", "M5"
        if bool(changed.any()):
            where = changed.nonzero()[0].tolist()
            out.append(Finding(f"sibling.writes.{name}", clause,
                               f"{name}{where} changed ({int(changed.sum())} elements): {what}", outcome=BITS_DIFFER))
    for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "initial_state_indices", "hist_len"):
        if isinstance(b.get(name), torch.Tensor) and not bool(same_bits(b[name], a[name]).all()):
            out.append(Finding(f"sibling.writes.inputs.{name}", "M8", f"read-only input {name} was modified",
                               outcome=BITS_DIFFER))
    return out


def check_sibling_launch(target, case: Case, device: str = "cpu") -> Findings:
    """(a) One sibling launch against the float64 oracle of its flat layout, and its write set.

    Outputs y and the appended k/u/g records are compared exactly as the fused kernel's launch
    property compares them (gdn_fuzz.checks.check_oracle: same metric, same per-arm tolerance table,
    bf16 arm), with prop names prefixed "sibling."; the pool and every other ring row bitwise."""
    _check_domain(case)
    obs = observe_sibling(target, case, device)
    rec = launch_record(case, note=NOTE)
    if obs.error is not None:
        return attach(Findings([Finding("sibling.launch", "H*", f"a legal sibling launch raised "
                                        f"{type(obs.error).__name__}: {obs.error}", outcome=raised(obs.error))]), rec)
    e = expectation(obs)
    fo = Observation(case=case, before=obs.before, after=obs.after, output=obs.output)
    findings = checks.check_oracle(fo, e)
    for f in findings:
        f.prop = "sibling." + f.prop
    findings += check_sibling_writes(obs)
    return attach(Findings(findings), rec)


# ------------------------------------------------------------------ (b) the differential


def _per_head(got, want, mag, dims, rtol, atol):
    """(rel, ratio) per (row, head): ||got - want|| / ||mag||, and that error over 2 x (rtol ||mag|| + floor)."""
    n = 1
    for d in dims:
        n *= got.shape[d]
    err = (got.double() - want.double()).pow(2).sum(dims).sqrt()
    den = mag.double().pow(2).sum(dims).sqrt()
    allowed = 2.0 * (rtol * den + atol * n ** 0.5)
    fin = torch.isfinite(got.double()).all(dims[-1]) & torch.isfinite(want.double()).all(dims[-1])
    for d in sorted(dims[:-1], reverse=True):
        fin = fin.all(d)
    inf = torch.full_like(err, float("inf"))
    return (torch.where(fin, err / den.clamp_min(1e-300), inf),
            torch.where(fin, err / allowed.clamp_min(1e-300), inf))


def check_differential(sibling, fused, case: Case, device: str = "cpu", *, exact: bool = True) -> Findings:
    """(b) The sibling against the fused kernel's verify rows at base 0 (module docstring).

    sibling: the real sibling (verify_sibling.SiblingTarget) or an emulation; fused: a
    gdn_fuzz.targets.Target of the fused entry point ("production" on a GPU, "reference" on a CPU).
    exact=True: every compared value bitwise (the contract's M7 claim); exact=False: y and the appended
    records within twice the bf16 tolerance table, everything else bitwise.  Rows the differential
    cannot compare are ignored (not_exercised when there are none)."""
    if case.arm != vs.SIBLING_ARM:
        raise ValueError(f"the sibling is bf16 only; case.arm={case.arm!r}")
    rows = eligible_rows(case)
    if not rows:
        not_exercised(PROP_DIFF, "no row at cache_base 0 with P + T <= 16 and P < flush_min")
        return Findings()
    rec = launch_record(case, note=NOTE + "; rows the sibling does not share become pad rows there")
    inputs = materialize(case, device)
    before = clone_inputs(inputs)
    sib_in = vs.sibling_inputs(before, rows)
    sib_before = clone_inputs(sib_in)
    findings = Findings()
    try:
        out_f = fused.launch(case.arm, **inputs)
    except Exception as e:
        findings.append(Finding("sibling.diff.fused_launch", "H*", f"the fused kernel raised {type(e).__name__}: {e}",
                                outcome=raised(e)))
    try:
        out_s = sibling.launch(**sib_in)
    except Exception as e:
        findings.append(Finding("sibling.diff.sibling_launch", "H*", f"the sibling raised {type(e).__name__}: {e}",
                                outcome=raised(e)))
    if findings:
        return attach(findings, rec)
    dev = before["q"].device
    r_ = torch.tensor(rows, dtype=torch.long, device=dev)
    slot = before["initial_state_indices"].long()[r_]  # [n] pool slots of the compared rows
    P = before["hist_len"].long()[r_]
    T = case.T
    app = P[:, None] + torch.arange(T, device=dev)[None, :]  # [n, T] appended slots, in both layouts (base 0)
    e = flat_ring.launch(q=sib_before["q"], k=sib_before["k"], v=sib_before["v"], a=sib_before["a"],
                         b=sib_before["b"], A_log=sib_before["A_log"], dt_bias=sib_before["dt_bias"],
                         pool=sib_before["initial_state_source"], idx=sib_before["initial_state_indices"],
                         k_cache=sib_before["k_cache"], u_cache=sib_before["u_cache"],
                         g_cache=sib_before["g_cache"], hist_len=sib_before["hist_len"],
                         scale=1.0 / (case.K ** 0.5))
    tol = table_for(case.arm)
    # the sibling's rings, mapped back to the 32-slot layout (slots 16..31 from the fused kernel's "before")
    back = {n: vs.flat_to_fused_ring(sib_in[n], before[n]) for n in vs.RING_NAMES}
    # --- the compared values: y [n, heads, T, D] and the appended records, per side
    got = {"y": (out_f[r_].permute(0, 2, 1, 3), out_s[r_].permute(0, 2, 1, 3), e.y_mag[r_].permute(0, 2, 1, 3))}
    for name, mag in (("k", e.k_app[r_].abs()), ("u", e.u_mag[r_])):
        ring = name + "_cache"
        f_rec = inputs[ring].permute(0, 2, 1, 3)[slot[:, None], app].permute(0, 2, 1, 3)  # [n, heads, T, D]
        s_rec = back[ring].permute(0, 2, 1, 3)[slot[:, None], app].permute(0, 2, 1, 3)
        got[name] = (f_rec, s_rec, mag.permute(0, 2, 1, 3))
    g_f = inputs["g_cache"].permute(0, 2, 1)[slot[:, None], app]  # [n, T, HV]
    g_s = back["g_cache"].permute(0, 2, 1)[slot[:, None], app]
    for name, (a_, b_, mag) in got.items():
        bits = same_bits(a_, b_)
        if exact and bool(bits.all()):
            continue
        t = tol[name]
        rel, ratio = _per_head(a_, b_, mag, (2, 3), t.rtol, t.atol)
        worst = int(torch.nan_to_num(ratio, nan=float("inf")).argmax())
        i, h = divmod(worst, ratio.shape[1])
        w_rel, w_ratio = float(rel.flatten()[worst]), float(ratio.flatten()[worst])
        if exact:
            findings.append(Finding(
                f"sibling.diff.{name}", "M7",
                f"{'y' if name == 'y' else 'appended ' + name + ' record'} of a fused verify row differs in bits from "
                f"the sibling's at base 0 ({int((~bits).sum())} elements; worst head: {w_ratio:.3g} x twice the "
                f"bf16 tolerance)", row=rows[i], head=h, value=w_rel, outcome=BITS_DIFFER, family="verify",
                unit="||fused - sibling|| / ||magnitude of its terms|| per (row, head)",
                bound="bit-identical (contract M7, a (src) claim)"))
        elif w_ratio > 1.0:
            findings.append(Finding(
                f"sibling.diff.{name}", "M7",
                f"{'y' if name == 'y' else 'appended ' + name + ' record'} of a fused verify row and the sibling's "
                f"differ by more than twice the bf16 tolerance", row=rows[i], head=h, value=w_rel,
                tol=2.0 * t.rtol, outcome=NON_FINITE if w_rel == float("inf") else OUT_OF_TOLERANCE,
                family="verify", unit="||fused - sibling|| / ||magnitude of its terms|| per (row, head)",
                bound=f"2 x ({checks._tol_bound(t)}): each side within the table of one float64 oracle"))
    # g: per token |dG| against 2 x the g bound of the launch check (2^-16 of the summed |g| + e^{A_log} 2^-23 per token)
    g_bits = same_bits(g_f, g_s)
    if not (exact and bool(g_bits.all())):
        tg = tol["g"]
        tokens = torch.arange(1, T + 1, device=dev, dtype=torch.float64)[None, :, None]
        floor = tokens * torch.exp(before["A_log"].double())[None, None, :] * tg.atol
        d = (g_f.double() - g_s.double()).abs()
        fin = torch.isfinite(g_f) & torch.isfinite(g_s)
        inf = torch.full_like(d, float("inf"))
        ratio = torch.where(fin, d / (2.0 * (tg.rtol * e.g_mag[r_] + floor)).clamp_min(1e-300), inf).amax(1)
        rel = torch.where(fin, d / e.g_mag[r_].clamp_min(1e-30), inf).amax(1)
        worst = int(ratio.argmax())
        i, h = divmod(worst, ratio.shape[1])
        w_rel, w_ratio = float(rel.flatten()[worst]), float(ratio.flatten()[worst])
        if exact or w_ratio > 1.0:
            findings.append(Finding(
                "sibling.diff.g", "M7",
                ("appended g record of a fused verify row differs in bits from the sibling's at base 0 "
                 f"({int((~g_bits).sum())} elements; worst: {w_ratio:.3g} x twice the g bound)") if exact else
                "appended g records of a fused verify row and the sibling's differ by more than twice the g bound",
                row=rows[i], head=h, value=w_rel, tol=None if exact else 2.0 * tg.rtol,
                outcome=BITS_DIFFER if exact else (NON_FINITE if w_rel == float("inf") else OUT_OF_TOLERANCE),
                family="verify", unit="max over tokens of |G_fused - G_sibling| / the summed |g| that built it",
                bound="bit-identical (contract M7, a (src) claim)" if exact else "2 x the launch check's g bound"))
    # every ring slot neither side may write (the window, slots past P + T, slots 16..31) and the pool rows: bits
    for ring in vs.RING_NAMES:
        f_rows, s_rows = inputs[ring][slot], back[ring][slot]  # [n, heads, 32(, D)]
        bits = same_bits(f_rows, s_rows)
        if bits.dim() == 4:
            bits = bits.all(3)
        off = torch.ones_like(bits)
        off.permute(0, 2, 1)[torch.arange(len(rows), device=dev)[:, None], app] = False  # drop appended slots
        bad = ~bits & off
        if bool(bad.any()):
            i, h, s = bad.nonzero()[0].tolist()
            side = ("the fused kernel" if not bool(same_bits(inputs[ring][slot[i], h, s], before[ring][slot[i], h, s]).all())
                    else "the sibling")
            findings.append(Finding(f"sibling.diff.untouched.{ring}", "M8",
                                    f"{ring} slot {s} of pool slot {int(slot[i])} differs between the two kernels "
                                    f"outside the appended slots [P, P + T) (written by {side})",
                                    row=rows[i], head=h, outcome=BITS_DIFFER, family="verify"))
    pf, ps = inputs["initial_state_source"][slot], sib_in["initial_state_source"][slot]
    pb = before["initial_state_source"][slot]
    for who, p in (("the fused kernel", pf), ("the sibling", ps)):
        if not bool(same_bits(p, pb).all()):
            i = int((~same_bits(p, pb)).flatten(1).any(1).nonzero()[0])
            findings.append(Finding("sibling.diff.pool", "M8",
                                    f"{who} wrote pool slot {int(slot[i])} of a verify row (the checkpoint of a row "
                                    f"with P < flush_min is read-only in both kernels)", row=rows[i],
                                    outcome=BITS_DIFFER, family="verify"))
    return attach(findings, rec)
