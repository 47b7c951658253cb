"""`gdn-fuzz drift`: how far each dtype arm's committed state wanders over long decodes.

What it does, in plain words
----------------------------
One target is driven through a long multi-step speculative decode: a batch of requests,
each verifying T tokens per launch (T = 4 or 8), accepting n of them, and committed by the
caller (contract C3: restart_hist_on_flush=False, oracles.commit.caller_commit), until
every request has committed `tokens` tokens (default 32,768).  Requests that are done
become pad rows (slot -1) for the remaining launches.

Teacher forcing.  Every launch's inputs (q, k, v, a, b of all T drafts, rejected ones
included) and every accept count are generated once from the seed, keyed by (seed, T,
step), and are the same for every arm.  Values are drawn in float32 and rounded to bf16
("the model's activations"); each arm then casts them to its IO dtype, which is exact for
fp16 IO except for bf16 values outside fp16's range or below its subnormals (counted and
recorded as `inputs_inexact_fp16`: none among the sampled token inputs of the shipped
regimes, a few initial-checkpoint elements of magnitude ~1e-6 that fall in fp16's subnormal
range, an offset of ~1e-7 absolute, far below the measured drift).  The initial checkpoint is
rounded the same way (bf16, then the arm's STATE dtype).  So all arms see the same numbers
and there is ONE truth per T: the float64 sequential recurrence (oracles.gdn.sequential via
oracles.serving.sequential_decode) over exactly the accepted tokens.

Measured per step and arm (float64):
  state  per (request, v-head): ||S_rebuilt - S_truth||_F / ||S_truth||_F, where S_rebuilt
         is the committed logical state rebuilt from the target's OWN buffers after the
         commit: checkpoint + window, oracles.ring.gather_window + oracles.ring.replay (M3).
  y      per (request, v-head) over the accepted tokens of the step:
         ||y_target - y_truth||_F / ||y_mag||_F, y_truth from the truth's state and y_mag the
         same recurrence on absolute values (oracles.gdn.sequential_magnitude, the |terms| that
         build y).  Not / ||y_truth||: a single accepted token's y is ~ beta v (k.q) under strong
         decay, and q.k of random unit vectors cancels to ~0 now and then, which made a plain
         relative error reach 35 on the CPU grid (bf16, accept=one, strong decay) with no drift
         at all.  The denominator is the error-analysis magnitude the launch checks use too.
  folds  how many requests folded (P >= flush_min at the launch, M7) since the last recorded step.
The record keeps, per recorded step, the max and the median over requests (max over heads).
Jump analysis: per request, d = log10(err_i / err_{i-1}) between consecutive recorded
steps, split by whether the request folded in between.

Acceptance (accept=...):
  all       n = T every step.
  one       n = 1 every step (only the bonus token; the slowest path to a fold).
  mtp[:M]   a truncated-geometric drafter: n = 1 + (number of leading drafts accepted), each
            draft accepted independently with the same probability p until the first
            rejection, so E[n] = (1 - p^T) / (1 - p).  p is solved so that E[n] = M at T = 4
            (M = 3.5 by default: the "mean accepted length 3.5 like real MTP drafters" of the
            issue that asked for this study; no acceptance trace was measured here).  For
            T = 8 the SAME p is used (p is a property of the drafter, not of T), which gives
            E[n] = 5.92 at M = 3.5 (p = 0.9116).  Real drafters' per-position acceptance falls with depth,
            so this overstates T = 8's mean accepted length; it is a model, stated as such.

Regimes (regime=...):
  synthetic  the value regimes of the strategies (gdn_fuzz.case): a decay name (normal |
             weak | strong) or "decay=D,beta=B,keys=K[,qk_scale=..,v_scale=..,state_scale=..]".
             A_log and dt_bias are drawn once per run (case.decay_params), q/k/v/a/b per step
             by case.draw_tokens.
  realistic  ASSUMED statistics, not measured ones.  A_log = log(A), A ~ U(0, 16) and
             dt_bias = 1: the GatedDeltaNet parameter initialisation of the public Qwen3-Next /
             Qwen3.5 model code (HF transformers' Qwen3NextGatedDeltaNet / Qwen3_5 _init_weights:
             `dt_bias = ones`, `A_log = log(uniform_(0, 16))`, reproduced in public training
             code), i.e. a freshly initialised layer, NOT a trained checkpoint's values (none
             was read for this; read A_log / dt_bias from a checkpoint to replace them).  a and
             b logits ~ N(0, 1) and q, k, v ~ N(0, 1) are assumptions (projections of
             RMS-normalised hidden states); q and k scale does not matter (M2 normalises them).
             Initial checkpoint ~ N(0, 0.1^2) per element, as the machine's admit().

The run is the serving engine (gdn_fuzz.serving.engine) with one direct-adapter backend per arm
on one teacher-forced stream (request b in block b, finished requests as pad rows); the errors
are the engine's trajectory and y metrics (gdn_fuzz.compare), computed on recorded steps only.

measure_budget / measure_budget_grid: the measurement behind compare.DRIFT_C (docs/tolerances.md,
"Drift budget"), the engine driven with every check but trajectory asserting and the "need"
(compare.drift_need) recorded over a grid of arms, T, regimes, flush_min and commit styles.

Outputs: write_outputs(result, out) writes drift.json (everything), drift.png (relative
error against committed tokens, log-log, one line per arm, a panel per T for the state and
for y) and drift.md (final and max error per arm, fp16 state vs bf16 state, jump analysis,
and a least-squares slope of log10(error) against log10(tokens), see `growth_fit`).

The regression bounds of two fixed configurations are compare.STUDY_* (tests/test_drift.py checks
them); what the study measured is in docs/drift-cpu/README.md and docs/drift-h200.md.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gdn_fuzz.arms import ARM_NAMES, get_arm
from gdn_fuzz.case import BETAS, DECAYS, KEYS, Regime, decay_params, draw_tokens, lazy_flush_min
from gdn_fuzz.compare import drift_unit
from gdn_fuzz.serving.adapters import COMMITS, DirectAdapter
from gdn_fuzz.serving.engine import K_DIM, V_DIM, Engine, Geometry
from gdn_fuzz.targets import get_target

DEFAULT_TOKENS = 32768
MTP_MEAN_T4 = 3.5
# growth verdict thresholds on the fitted slope of log10(err) vs log10(tokens)
SLOPE_BOUNDED = 0.1  # below: no growth (rounding errors washed out by decay)
SLOPE_SYSTEMATIC = 0.6  # above: systematic (linear-like) growth; between: random-walk-like (~0.5)
FIT_FROM = 1.0 / 16  # fit over steps with mean committed tokens >= FIT_FROM * horizon


# ------------------------------------------------------------------ acceptance


def mtp_p(mean_t4: float = MTP_MEAN_T4) -> float:
    """Per-draft acceptance probability p with E[n] = 1 + p + p^2 + p^3 = mean_t4 at T = 4."""
    if not 1.0 <= mean_t4 <= 4.0:
        raise ValueError(f"mtp mean accepted length at T=4 must lie in [1, 4]; got {mean_t4}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(4)) < mean_t4:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def parse_accept(accept: str):
    """'all' | 'one' | 'mtp' | 'mtp:MEAN' -> (kind, p or None)."""
    if accept in ("all", "one"):
        return accept, None
    if accept == "mtp" or accept.startswith("mtp:"):
        mean = float(accept.split(":", 1)[1]) if ":" in accept else MTP_MEAN_T4
        return "mtp", mtp_p(mean)
    raise ValueError(f"accept={accept!r}; use all | one | mtp | mtp:MEAN (mean accepted length at T=4)")


def expected_accept(accept: str, T: int) -> float:
    kind, p = parse_accept(accept)
    if kind == "all":
        return float(T)
    if kind == "one":
        return 1.0
    return sum(p**i for i in range(T))


def draw_accepts(rnd: random.Random, kind: str, p, T: int, B: int) -> list[int]:
    if kind == "all":
        return [T] * B
    if kind == "one":
        return [1] * B
    out = []
    for _ in range(B):
        n = 1
        while n < T and rnd.random() < p:
            n += 1
        out.append(n)
    return out


# ------------------------------------------------------------------ regimes

REALISTIC_DOC = ("ASSUMED, not measured: A_log = log(U(0, 16)), dt_bias = 1 (the GatedDeltaNet init of the public "
                 "Qwen3-Next / Qwen3.5 model code, i.e. an untrained layer), a, b ~ N(0, 1), q, k, v ~ N(0, 1), "
                 "initial checkpoint ~ N(0, 0.1^2)")


def parse_regime(regime: str) -> Regime | None:
    """None for 'realistic'; else a case.Regime from a decay name or 'key=value,...'."""
    if regime == "realistic":
        return None
    if "=" not in regime:
        return Regime(decay=regime)
    kw = {}
    for part in regime.split(","):
        key, _, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if key not in Regime.__dataclass_fields__:
            raise ValueError(f"regime field {key!r} unknown; use {', '.join(Regime.__dataclass_fields__)}")
        typ = type(getattr(Regime(), key))
        kw[key] = (val.lower() in ("1", "true", "yes")) if typ is bool else typ(val)
    return Regime(**kw)


def _params(reg: Regime | None, gen, HV: int):
    if reg is None:
        A = torch.empty(HV).uniform_(0.0, 16.0, generator=gen).clamp_min(1e-4)
        return torch.log(A), torch.ones(HV)
    A_log, dt_bias, _ = decay_params(reg, gen, 1, 1, HV)
    return A_log, dt_bias


def _tokens(reg: Regime | None, gen, B, T, H, HV):
    if reg is None:
        q = torch.randn(B, T, H, K_DIM, generator=gen)
        k = torch.randn(B, T, H, K_DIM, generator=gen)
        v = torch.randn(B, T, HV, V_DIM, generator=gen)
        a = torch.randn(B, T, HV, generator=gen)
        b = torch.randn(B, T, HV, generator=gen)
        return q, k, v, a, b
    q, k, v, _, _, a, b = draw_tokens(reg, gen, B, T, H, HV, K_DIM, V_DIM)
    return q, k, v, a, b


def _bf(x):
    return x.to(torch.bfloat16)


def _inexact_fp16(x) -> int:
    """bf16 elements that do not survive a round trip through fp16 (overflow / deep underflow)."""
    return int((x.to(torch.float16).to(torch.bfloat16) != x).sum())


# ------------------------------------------------------------------ the run


def _seed(*parts) -> int:
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def run_drift(target, arms=("bf16", "fp16"), Ts=(4, 8), tokens: int = DEFAULT_TOKENS, batch: int = 4,
              accept: str = "mtp", regime: str = "normal", seed: int = 0, device: str = "cpu",
              record_every: int = 1, *, heads: tuple[int, int] | None = None, flush_min: int | None = None,
              progress=None, seconds: float | None = None) -> dict:
    """Teacher-forced long-horizon drift of every arm against one float64 truth (module doc).

    target: a Target or a name for targets.get_target.  heads: (H, HV), default (16, 64)
    (Qwen3.5 geometry, contract section 7) on CUDA and (2, 4) on the CPU.  flush_min: default
    the lazy rule 17 - T.  record_every: record every k-th step (and the last one); the
    rebuild and error measurement run only on recorded steps.  progress: optional callable
    (T, arm-independent step, committed tokens) for a progress display.  seconds: a wall-clock
    budget for the whole call; a T whose run reaches it stops early and says so (truncated,
    tokens_reached), so a long study on a time-limited machine still returns its data.
    Returns a JSON-ready dict (see write_outputs).
    """

    if isinstance(target, str):
        target = get_target(target)
    arms = tuple(arms)
    for a in arms:
        get_arm(a)
    dev = torch.device(device)
    if heads is None:
        heads = (16, 64) if dev.type == "cuda" else (2, 4)
    H, HV = heads
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    if record_every < 1:
        raise ValueError("record_every must be >= 1")
    kind, p = parse_accept(accept)
    reg = parse_regime(regime)
    B = batch
    t_start = time.time()
    result = {
        "meta": dict(target=str(target), path=str(target.path), device=str(dev), arms=list(arms), Ts=list(Ts),
                     tokens=tokens, batch=B, H=H, HV=HV, accept=accept, accept_p=p,
                     expected_accept={str(T): expected_accept(accept, T) for T in Ts},
                     regime=regime, regime_fields=(asdict(reg) if reg is not None else REALISTIC_DOC),
                     seed=seed, record_every=record_every, commit="caller (C3, restart_hist_on_flush=False)",
                     torch=torch.__version__, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     unit_roundoff={a: drift_unit(a) for a in arms}),
        "runs": {},
    }
    deadline = None if seconds is None else t_start + seconds
    for T in Ts:
        fmin = flush_min if flush_min is not None else lazy_flush_min(T)
        result["runs"][str(T)] = _run_T(target, arms, T, tokens, B, H, HV, kind, p, reg, seed, dev, record_every,
                                        fmin, progress, deadline)
    result["meta"]["seconds"] = time.time() - t_start
    return result


def merge_results(results: list[dict]) -> dict:
    """One result from several runs of the same study split by T and/or by arm (parallel processes).

    Every part must share target, device, tokens, batch, heads, acceptance, regime, seed and
    record_every: then the teacher-forced inputs, the accept counts and the truth are the same,
    so the recorded steps of one T agree and the arms' series can sit side by side.  Raises
    ValueError naming the field that differs.
    """
    if not results:
        raise ValueError("merge_results: no results given")
    same = ("target", "device", "tokens", "batch", "H", "HV", "accept", "regime", "seed", "record_every")
    m0 = results[0]["meta"]
    out = {"meta": dict(m0, arms=[], Ts=[], seconds=0.0, parts=len(results)), "runs": {}}
    for r in results:
        m = r["meta"]
        for key in same:
            if m.get(key) != m0.get(key):
                raise ValueError(f"merge_results: meta[{key!r}] differs ({m.get(key)!r} vs {m0.get(key)!r}); "
                                 "only parts of one study (same options but --T/--arms) can be merged")
        out["meta"]["seconds"] = max(out["meta"]["seconds"], m.get("seconds", 0.0))  # parts run in parallel
        out["meta"]["unit_roundoff"] = {**out["meta"].get("unit_roundoff", {}), **m.get("unit_roundoff", {})}
        out["meta"]["expected_accept"] = {**out["meta"].get("expected_accept", {}), **m.get("expected_accept", {})}
        for a in m["arms"]:
            if a not in out["meta"]["arms"]:
                out["meta"]["arms"].append(a)
        for T, run in r["runs"].items():
            if int(T) not in out["meta"]["Ts"]:
                out["meta"]["Ts"].append(int(T))
            have = out["runs"].get(T)
            if have is None:
                out["runs"][T] = json.loads(json.dumps(run))  # a deep copy
                continue
            for key in ("steps", "flush_min", "folds"):
                if have[key] != run[key]:
                    raise ValueError(f"merge_results: T={T} runs differ in {key} ({have[key]} vs {run[key]})")
            if have["series"]["step"] != run["series"]["step"]:
                raise ValueError(f"merge_results: T={T} runs recorded different steps")
            for a in run["summary"]:
                if a in have["summary"]:
                    raise ValueError(f"merge_results: arm {a!r} appears twice for T={T}")
                have["summary"][a] = run["summary"][a]
                have["series"]["arms"][a] = run["series"]["arms"][a]
            have["launches"] += run["launches"]
    out["meta"]["Ts"].sort()
    out["meta"]["arms"] = [a for a in ARM_NAMES if a in out["meta"]["arms"]] + \
        [a for a in out["meta"]["arms"] if a not in ARM_NAMES]
    return out


def _run_T(target, arms, T, tokens, B, H, HV, kind, p, reg, seed, dev, record_every, fmin, progress, deadline=None):
    """One T: the serving engine with one direct-adapter backend per arm (caller commit, C3), request b
    in block b, teacher-forced tokens in request order (finished requests become pad rows)."""
    gen0 = torch.Generator().manual_seed(_seed(seed, T, 0xA11))
    A_log, dt_bias = (_bf(x) for x in _params(reg, gen0, HV))
    state_scale = reg.state_scale if reg is not None else 0.1
    S0 = _bf(torch.randn(B, HV, V_DIM, K_DIM, generator=gen0) * state_scale)
    inexact = _inexact_fp16(A_log) + _inexact_fp16(dt_bias) + _inexact_fp16(S0)
    geo = Geometry(T, H, HV, layers=1, blocks=B, B=B, flush_min=fmin, regime=reg or Regime())
    # one backend per arm, own buffers (rings start as garbage, never reachable); one truth in bf16 values
    backends = {arm: DirectAdapter(target, geo, arm, dev, _seed(seed, T, 0x6A5), commit="caller") for arm in arms}
    eng = Engine(geo, backends, dev, checks={"trajectory", "ragged"}, params=[(A_log, dt_bias)],
                 io=torch.bfloat16, state=torch.bfloat16, y_tokens="accepted")
    for b in range(B):
        eng.admit(b, state=S0[b])  # request b in block b
    committed = torch.zeros(B, dtype=torch.long)
    rnd = random.Random(_seed(seed, T, 0xACC))
    series = dict(step=[], tokens=[], tokens_min=[], folds=[], live=[],
                  arms={a: dict(state_max=[], state_med=[], y_max=[], y_med=[]) for a in arms})
    prev_err = {a: None for a in arms}
    folded_since = torch.zeros(B, dtype=torch.bool)
    jumps = {a: dict(fold=[], other=[]) for a in arms}
    per_req_max = {a: torch.zeros(B, dtype=torch.float64) for a in arms}
    y_worst = {a: 0.0 for a in arms}
    total_folds = total_launches = 0
    folds_acc = 0  # folds since the last recorded step
    step = 0
    truncated = False
    while bool((committed < tokens).any()):
        if deadline is not None and time.time() > deadline and series["step"]:
            truncated = True
            break
        live = committed < tokens
        acc = torch.tensor(draw_accepts(rnd, kind, p, T, B), dtype=torch.long)
        acc = torch.minimum(acc, (tokens - committed).clamp_min(0))
        acc = torch.where(live, acc, torch.zeros_like(acc))
        gen = torch.Generator().manual_seed(_seed(seed, T, step))
        q, k, v, a, b = (_bf(x) for x in _tokens(reg, gen, B, T, H, HV))
        if step == 0 or step % 997 == 0:  # a sample is enough: the regimes are fixed distributions
            inexact += sum(_inexact_fp16(x) for x in (q, k, v, a, b))
        record = (step % record_every == 0) or not bool((committed + acc < tokens).any())
        plan = [(i, T, int(acc[i])) for i in range(B) if live[i]]
        order = (torch.cumsum(live.long(), 0) - 1).masked_fill(~live, -1).tolist()  # request i at position i
        toks = [{n: x.to(dev) for n, x in dict(q=q, k=k, v=v, a=a, b=b).items()}]
        rec = eng.step(plan, order=order, tokens=toks, check=record)
        total_launches += len(arms)
        folds = len(rec.flushed)
        total_folds += folds
        folded_since[rec.flushed] = True
        if record:
            for arm in arms:
                rel = rec.metrics[arm]["state"][0]["rel"].amax(1).cpu()  # [B] (request b = rid b), max over heads
                per_req_max[arm] = torch.maximum(per_req_max[arm], rel)
                ser = series["arms"][arm]
                ser["state_max"].append(float(rel.max()))
                ser["state_med"].append(float(rel.median()))
                yr = rec.metrics[arm]["y"][0]["rel"].amax(1).cpu()  # live requests
                ser["y_max"].append(float(yr.max()))
                ser["y_med"].append(float(yr.median()))
                y_worst[arm] = max(y_worst[arm], float(yr.max()))
                # ---- jumps between consecutive recorded steps, split by fold
                if prev_err[arm] is not None:
                    d = torch.log10(rel.clamp_min(1e-300) / prev_err[arm].clamp_min(1e-300))
                    jumps[arm]["fold"] += d[live & folded_since].tolist()
                    jumps[arm]["other"] += d[live & ~folded_since].tolist()
                prev_err[arm] = rel
        committed = committed + acc
        folds_acc += folds
        if record:
            series["step"].append(step)
            series["tokens"].append(float(committed.double().mean()))
            series["tokens_min"].append(int(committed.min()))
            series["live"].append(int(live.sum()))
            series["folds"].append(folds_acc)
            folded_since[:] = False
            folds_acc = 0
        step += 1
        if progress is not None:
            progress(T, step, float(committed.double().mean()))
    summary = {}
    for arm in arms:
        ser = series["arms"][arm]
        summary[arm] = dict(
            u=drift_unit(arm),
            state_final=ser["state_max"][-1], state_max=max(ser["state_max"]),
            state_max_over_u=max(ser["state_max"]) / drift_unit(arm),
            state_final_per_request=per_req_max[arm].tolist(),
            y_final=next((x for x in reversed(ser["y_max"]) if x is not None), None), y_max=y_worst[arm],
            fit=growth_fit(series["tokens"], ser["state_max"], tokens),
            jumps=_jump_stats(jumps[arm]),
        )
    return dict(T=T, flush_min=fmin, steps=step, launches=total_launches, folds=total_folds, truncated=truncated,
                tokens_reached=series["tokens_min"][-1],
                inputs_inexact_fp16=inexact, summary=summary, series=series)


def _jump_stats(j) -> dict:
    f, o = j["fold"], j["other"]
    out = dict(n_fold=len(f), n_other=len(o),
               mean_log10_fold=(sum(f) / len(f)) if f else None,
               mean_log10_other=(sum(o) / len(o)) if o else None)
    allj = sorted([(x, True) for x in f] + [(x, False) for x in o], key=lambda t: -t[0])
    top = allj[: max(1, len(allj) // 100)] if allj else []
    out["top1pct_at_folds"] = (sum(1 for _, is_f in top if is_f) / len(top)) if top else None
    out["fold_fraction"] = len(f) / len(allj) if allj else None
    return out


def growth_fit(tokens_x, err, horizon) -> dict:
    """Least-squares slope of log10(err) against log10(committed tokens), over the steps with
    mean committed tokens >= FIT_FROM * horizon (the start-up transient left out), and the
    verdict: bounded (slope < SLOPE_BOUNDED), random-walk-like, or systematic (>= SLOPE_SYSTEMATIC)."""
    pts = [(math.log10(x), math.log10(e)) for x, e in zip(tokens_x, err)
           if x >= max(FIT_FROM * horizon, 1.0) and e is not None and 0 < e < float("inf")]
    if len(pts) < 3:
        return dict(slope=None, intercept=None, points=len(pts), verdict="too few points")
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return dict(slope=None, intercept=None, points=n, verdict="one token count")
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    verdict = ("bounded" if slope < SLOPE_BOUNDED else "systematic growth" if slope >= SLOPE_SYSTEMATIC
               else "random-walk-like growth")
    return dict(slope=slope, intercept=my - slope * mx, points=n, from_tokens=FIT_FROM * horizon, verdict=verdict)


# ------------------------------------------------------------------ outputs


def write_outputs(result: dict, out_dir) -> dict[str, Path]:
    """drift.json, drift.png and drift.md in out_dir; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = dict(json=out / "drift.json", png=out / "drift.png", md=out / "drift.md")
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    _plot(result, paths["png"])
    paths["md"].write_text(summary_markdown(result))
    return paths


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    Ts = list(runs)
    fig, axes = plt.subplots(2, len(Ts), figsize=(6 * len(Ts), 7), squeeze=False)
    for j, T in enumerate(Ts):
        ser = runs[T]["series"]
        for i, (key, what, ylab) in enumerate((
                ("state_max", "committed state", "||S - S_truth|| / ||S_truth||"),
                ("y_max", "outputs y of the accepted tokens", "||y - y_truth|| / ||y magnitude||"))):
            ax = axes[i][j]
            for arm, s in ser["arms"].items():
                xs = [x for x, e in zip(ser["tokens"], s[key]) if e is not None and e > 0]
                ys = [e for e in s[key] if e is not None and e > 0]
                ax.plot(xs, ys, lw=0.8, label=arm)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("committed tokens per request (mean over the batch)")
            ax.set_ylabel(f"{ylab}\n(max over requests, heads)", fontsize=8)
            ax.set_title(f"T={T}: {what}", fontsize=9)
            ax.legend(fontsize=7)
    m = result["meta"]
    fig.suptitle(f"drift: target {m['target']}, regime {m['regime']}, accept {m['accept']}, batch {m['batch']}, "
                 f"H={m['H']} HV={m['HV']}, {m['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def fmt_number(x, f=".2e"):
    return "-" if x is None else format(x, f)


def summary_markdown(result: dict) -> str:
    m = result["meta"]
    md = ["# Long-horizon drift", "",
          f"- target `{m['target']}` on {m['device']}; arms {', '.join(m['arms'])}; T {m['Ts']}; H={m['H']}, "
          f"HV={m['HV']}, batch {m['batch']}; {m['tokens']} committed tokens per request; seed {m['seed']}; "
          f"{m.get('seconds', 0):.0f} s, torch {m['torch']}, {m['date']}",
          f"- acceptance `{m['accept']}`" + (f" (per-draft p = {m['accept_p']:.4f}; E[n] = " + ", ".join(
              f"{v:.2f} at T={k}" for k, v in m["expected_accept"].items()) + ")" if m["accept_p"] else ""),
          f"- regime `{m['regime']}`: {m['regime_fields']}",
          "- truth: float64 sequential recurrence over the accepted tokens, the same teacher-forced inputs for every "
          "arm; state error = ||rebuilt - truth||_F / ||truth||_F per (request, head), rebuilt in float64 from the "
          "target's checkpoint + window; y error = ||y - y_truth||_F / ||y magnitude||_F over the accepted tokens "
          "(magnitude: the recurrence on |terms|, no cancellation); commit C3 (caller), lazy flush_min", ""]
    for T, run in result["runs"].items():
        md += [f"## T = {T} (flush_min {run['flush_min']}): {run['steps']} steps, {run['launches']} launches, "
               f"{run['folds']} folds", ""]
        if run.get("truncated"):
            md += [f"**Truncated** by the --seconds budget: every request reached {run['tokens_reached']} of "
                   f"{m['tokens']} tokens.", ""]
        if run.get("inputs_inexact_fp16"):
            md.append(f"Note: {run['inputs_inexact_fp16']} bf16 elements (initial checkpoint, sampled inputs) are not "
                      "exact in fp16 (tiny values in fp16's subnormal range); the fp16-STATE / fp16-IO arms start from "
                      "them rounded, an offset far below the errors above.")
            md.append("")
        md += ["| arm | u | state final | state max | max / u | y final | y max | slope (log-log) | growth |"
               " mean log10 jump at folds / elsewhere | top-1% jumps at folds (fold share) |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for arm, s in run["summary"].items():
            f, j = s["fit"], s["jumps"]
            md.append(f"| {arm} | {s['u']:.1e} | {fmt_number(s['state_final'])} | {fmt_number(s['state_max'])} | "
                      f"{s['state_max_over_u']:.3f} | {fmt_number(s['y_final'])} | {fmt_number(s['y_max'])} | "
                      f"{fmt_number(f['slope'], '+.3f')} | {f['verdict']} | {fmt_number(j['mean_log10_fold'], '+.3f')} / "
                      f"{fmt_number(j['mean_log10_other'], '+.3f')} | {fmt_number(j['top1pct_at_folds'], '.2f')} "
                      f"({fmt_number(j['fold_fraction'], '.2f')}) |")
        md.append("")
        summ = run["summary"]
        for st16, st8 in (("bf16-state16", "bf16"), ("bf16-state16-ring16", "bf16-ring16")):
            if st16 in summ and st8 in summ:
                a, b = summ[st16], summ[st8]
                verdict = "beats" if a["state_max"] < b["state_max"] else "does NOT beat"
                ratio = b["state_max"] / max(a["state_max"], 1e-300)
                md.append(f"- fp16 state ({st16}) {verdict} bf16 state ({st8}): max state error "
                          f"{a['state_max']:.2e} vs {b['state_max']:.2e} (x{ratio:.1f}), "
                          f"final {a['state_final']:.2e} vs {b['state_final']:.2e} "
                          f"(x{b['state_final'] / max(a['state_final'], 1e-300):.1f}).")
        if "fp16" in summ and "bf16" in summ:
            a, b = summ["fp16"], summ["bf16"]
            md.append(f"- all-fp16 arm vs all-bf16 arm: max state error {a['state_max']:.2e} vs {b['state_max']:.2e} "
                      f"(x{b['state_max'] / max(a['state_max'], 1e-300):.1f}).")
        grow = [arm for arm, s in summ.items() if s["fit"]["verdict"] not in ("bounded", "too few points")]
        md.append(f"- unbounded growth: {', '.join(grow) if grow else 'none'} (see the fit below).")
        md.append("")
    md += ["## How to read the fit and the jumps", "",
           f"Slope: ordinary least squares of log10(state error, max over requests and heads) against "
           f"log10(mean committed tokens), over the recorded steps with at least {FIT_FROM:g} x the horizon "
           f"committed (start-up transient left out).  Verdict: slope < {SLOPE_BOUNDED} bounded; "
           f"{SLOPE_BOUNDED} to {SLOPE_SYSTEMATIC} random-walk-like (independent rounding errors add in quadrature: "
           f"slope 0.5); >= {SLOPE_SYSTEMATIC} systematic (a bias that accumulates: slope 1).  A max over requests is "
           "noisy: read the plot too.", "",
           "Jumps: per request, log10(error after / error before) between consecutive recorded steps, split by "
           "whether the request folded (P >= flush_min at the launch) in between; 'top-1% jumps at folds' is the "
           "share of the largest 1% of jumps that contain a fold, to compare with the fold share of all intervals.",
           "", "![drift](drift.png)", ""]
    return "\n".join(md)


# ------------------------------------------------------------------ the measurement behind DRIFT_C


def measure_budget(target, arm: str, geo: Geometry, device: str = "cpu", *, commit: str = "caller", steps: int = 200,
                   seed: int = 0, preempt_every: int = 50) -> dict:
    """Drive the serving engine (direct adapter) without Hypothesis: every block busy, random accepts,
    shuffled rows, a preemption every `preempt_every` steps; the launch, writes and cursors checks
    run (a finding raises EngineFailure), the trajectory check only measures.  Returns the worst
    "need" (the DRIFT_C a state needed: compare.drift_need) with its age, and counts."""
    rnd = random.Random(seed)
    eng = Engine(geo, DirectAdapter(target, geo, arm, device, seed, commit=commit), device, seed,
                 checks=DirectAdapter.DEFAULT_CHECKS)
    for j in range(min(geo.B, geo.blocks)):
        eng.admit(j, seed * 1000 + j)
    worst, worst_age = 0.0, 0
    for i in range(steps):
        s = rnd.randrange(2**16)
        rec = eng.step(eng.plan_all(s, "random"), s, order="shuffled")
        eng.fail([f for f in rec.findings if f.prop != "serving.trajectory"])
        st = rec.metrics[eng.adapter.name]["state"][0]
        if float(st["need"].max()) > worst:
            worst = float(st["need"].max())
            worst_age = eng.requests[st["rids"][int(st["need"].amax(1).argmax())]].age
        if preempt_every and (i + 1) % preempt_every == 0:
            rid = eng.live[rnd.randrange(len(eng.live))]
            eng.preempt(rid, rnd.choice([eng.requests[rid].block] + eng.free_blocks))
    return {"worst": worst, "worst_age": worst_age, "launches": eng.steps, "flushes": eng.flushes,
            "wraps": eng.wraps, "preempts": eng.preempts}


def measure_budget_grid(target="reference", device: str = "cpu", *, steps: int = 200, seeds: int = 2,
                        arms=ARM_NAMES, Ts=(4, 8), decays=DECAYS[:3], betas=BETAS[:3], json_path=None,
                        log=print) -> dict:
    """The grid behind compare.DRIFT_C (docs/tolerances.md, "Drift budget"): arm x T x decay x beta x
    seed (decays and betas: the three of each DRIFT_C was calibrated on; the issue-18 regimes are
    not in the grid); keys cycle through KEYS, flush_min alternates between the lazy rule (17 - T) and 1 (a fold
    every launch: the most STATE roundings), the commit style alternates with the seed.  Geometry
    H=2, HV=4, 8 blocks, B=8 (every block busy).  Returns {"per_arm": worst need per arm, "runs": [...]}
    and writes it to json_path if given; `log` gets one line per run (None: silent)."""

    t = get_target(target) if isinstance(target, str) else target
    per_arm: dict[str, float] = {}
    runs = []
    t0 = time.time()
    n = 0
    for arm in arms:
        for T in Ts:
            for decay in decays:
                for beta in betas:
                    for s in range(seeds):
                        keys = KEYS[n % len(KEYS)]
                        fmin = lazy_flush_min(T) if (n // len(KEYS)) % 2 == 0 else 1
                        n += 1
                        geo = Geometry(T, 2, 4, layers=1, blocks=8, B=8, flush_min=fmin,
                                       regime=Regime(decay=decay, beta=beta, keys=keys))
                        m = measure_budget(t, arm, geo, device, commit=COMMITS[s % 2], steps=steps, seed=s)
                        per_arm[arm] = max(per_arm.get(arm, 0.0), m["worst"])
                        m.update(arm=arm, T=T, decay=decay, beta=beta, keys=keys, flush_min=fmin,
                                 commit=COMMITS[s % 2], seed=s)
                        runs.append(m)
                        if log is not None:
                            log(f"{arm:20s} T={T} decay={decay:6s} beta={beta:5s} keys={keys:9s} fmin={fmin:2d} "
                                f"seed={s} need={m['worst']:.3f} (age {m['worst_age']}) flushes={m['flushes']} "
                                f"wraps={m['wraps']} ({time.time() - t0:.0f}s)")
    out = {"target": str(t), "device": device, "steps": steps, "torch": torch.__version__, "per_arm": per_arm,
           "runs": runs}
    if log is not None:
        log(f"worst need per arm: { {k: round(v, 3) for k, v in per_arm.items()} }")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1))
    return out
