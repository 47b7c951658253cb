"""GPU time of the fused oracle's kernel per tiling (value rows per program x warps), issue 32.

At B = 64 (H = 16, HV = 64, T = 4) the kernel of fused_oracle.measure took ~2-3 ms of the H200
(torch.profiler, docs/benchmarks.md "Issue 32"), against a 0.5 ms launch under test: the check's
GPU floor.  This times, for each (block_v, num_warps), the two calls a checked launch makes:

  measure   fused_oracle.measure on an observed launch of --target (the comparison in the kernel)
  history   fused_oracle.history on materialize's 16 history tokens of every row

each captured as a CUDA graph and replayed --reps times between CUDA events (so the time is the
GPU's, not the host's), and checks that every tiling gives the first one's sums to 1e-12 of their
magnitude (float64 rounding: another summation order; tests/test_fused_oracle.py).  --variants times
each tiling with the window's records loaded as they are added (loop), one ahead (prefetch:
fused_oracle.PREFETCH; history has no window, so there it is the loop) and, besides, each token's inputs
one ahead (tokens: fused_oracle.TOKEN_PREFETCH, history's too), and says whether each gave
the first variant's bits at that tiling (measure's sums, history's U): it should, the operations and
their order being the same.  "history bits": history's U
bit for bit as the first tiling's with as many warps (the warps split K, so the value rows per program
should not change a bit: case.materialize's records depend on it).  At the end, per compiled kernel: its registers and
spills (Triton's cache of the jitted function).

    python benchmarks/oracle_tiling.py --target production --B 8 64 --variants loop prefetch --json t.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch

from gdn_fuzz import checks, fused_oracle
from gdn_fuzz.case import Case, Row, materialize
from gdn_fuzz.observation import bits, observe
from gdn_fuzz.oracles import gdn as gdn_oracle
from gdn_fuzz.targets import get_target

RTOL = 1e-12  # tests/test_fused_oracle.py's bound for two float64 summation orders


def _case(B, H, HV, T, seed):
    rng = random.Random(seed)
    slots = list(range(B))
    rng.shuffle(slots)
    return Case(arm="bf16", T=T, H=H, HV=HV, pool=B, seed=seed, draws="cuda",
                rows=tuple(Row(s, rng.randint(0, 16), rng.randint(0, 31)) for s in slots))


def _graph_ms(fn, reps):
    """Median GPU ms of fn() replayed as a CUDA graph (events around each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="production")
    ap.add_argument("--B", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=64)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--block-v", nargs="+", type=int, default=[8, 16, 32])
    ap.add_argument("--warps", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--variants", nargs="+", choices=tuple(fused_oracle.VARIANTS), default=["loop"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    target = get_target(args.target)
    rows = []
    print(f"{'B':>4s} {'block_v':>7s} {'warps':>5s} {'variant':>8s} {'measure ms':>10s} {'history ms':>10s} "
          f"{'vs first':>10s} {'bits as 1st':>12s} {'history bits':>13s}")
    for B in args.B:
        case = _case(B, args.H, args.HV, args.T, seed=B)
        obs = observe(target, case, "cuda")
        kw = checks._oracle_inputs(obs)
        a = obs.after
        inputs = materialize(case, "cuda")
        n = B
        gen = torch.Generator(device="cuda").manual_seed(1)
        k_hat = gdn_oracle.l2norm(torch.randn(n, 16, args.HV, 128, device="cuda", generator=gen)).double()
        v = torch.randn(n, 16, args.HV, 128, device="cuda", generator=gen).to(torch.bfloat16)
        g = -torch.rand(n, 16, args.HV, device="cuda", generator=gen, dtype=torch.float64)
        beta = torch.rand(n, 16, args.HV, device="cuda", generator=gen, dtype=torch.float64)
        rows_h = torch.arange(n, device="cuda")
        ref = None
        hist_ref = {}  # num_warps -> history's U of the first tiling with that many warps
        for bv in args.block_v:
            for w in args.warps:
                loop = None  # (sums, U) of this tiling's first variant
                for variant in args.variants:
                    flags = fused_oracle.VARIANTS[variant]

                    def meas(bv=bv, w=w, flags=flags):
                        return fused_oracle.measure(**kw, y_out=obs.output, u_after=a["u_cache"],
                                                    pool_after=a["initial_state_source"], block_v=bv, num_warps=w,
                                                    **flags).sums

                    def hist(bv=bv, w=w, flags=flags):
                        return fused_oracle.history(inputs["initial_state_source"], rows_h, g, beta, k_hat, v,
                                                    block_v=bv, num_warps=w, token_prefetch=flags["token_prefetch"])

                    m_ms, sums = _graph_ms(meas, args.reps)
                    h_ms, U = _graph_ms(hist, args.reps)
                    sums, U = sums.clone(), U.clone()
                    if ref is None:
                        ref = sums
                    if loop is None:
                        loop = (sums, U)
                    same_bits = torch.equal(bits(sums), bits(loop[0])) and torch.equal(bits(U), bits(loop[1]))
                    hist_same = torch.equal(bits(U), bits(hist_ref.setdefault(w, U)))
                    err = ((sums[..., :2].sqrt() - ref[..., :2].sqrt()).abs()
                           / ref[..., 1:2].sqrt().clamp_min(1e-300))
                    agree = float(err.max())
                    same_bad = bool(torch.equal(sums[..., 2], ref[..., 2]))
                    rows.append(dict(B=B, block_v=bv, num_warps=w, variant=variant, measure_ms=m_ms, history_ms=h_ms,
                                     vs_first=agree, nonfinite_counts_equal=same_bad,
                                     same_bits_as_first_variant=same_bits, history_same_bits_as_warps_first=hist_same))
                    flag = "" if agree <= RTOL and same_bad else "  DIFFERS"
                    print(f"{B:4d} {bv:7d} {w:5d} {variant:>8s} {m_ms:10.3f} {h_ms:10.3f} {agree:10.1e} "
                          f"{str(same_bits):>12s} {str(hist_same):>13s}{flag}", flush=True)
                    _dump(args, rows)
    kernels = _compiled()
    for k in kernels:
        print("compiled:", k, flush=True)
    _dump(args, rows, kernels)


def _dump(args, rows, kernels=None):
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(H=args.H, HV=args.HV, T=args.T, target=args.target, gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=_triton_version(), rows=rows, kernels=kernels), fh,
                      indent=1)


def _triton_version():
    import triton
    return triton.__version__


def _compiled() -> list[dict]:
    """Each compiled specialization of the fused kernel: its key (constexprs, num_warps), registers and spills
    (Triton's JITFunction cache; its layout differs between releases, so this reports what it finds)."""
    out = []
    try:
        jit = fused_oracle._kernel(False)
        for cache in jit.device_caches.values():
            for key, ck in cache[0].items():
                out.append(dict(key=str(key)[-300:], n_regs=getattr(ck, "n_regs", None),
                                n_spills=getattr(ck, "n_spills", None)))
    except Exception as e:  # noqa: BLE001 - diagnostics only
        out.append(dict(error=f"{type(e).__name__}: {e}"))
    return out


if __name__ == "__main__":
    main()
