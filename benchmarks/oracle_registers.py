"""Registers, spill stack and compile seconds of the fused oracle's kernel per variant, compiled for a GPU
target on any machine (no GPU needed: Triton compiles ahead of time and its bundled ptxas and cuobjdump read
the cubin), issue 32.

The kernel's scalar arguments are typed i32, as Triton's launcher types a Python int below 2^31 (the strides
and sizes of every case); pointers by the dtypes of a bf16 case (pool and rings float32, v bfloat16).  The
numbers are this machine's Triton's: another Triton release (the GPU image's) compiles differently, so they
point at what to time on the GPU (benchmarks/oracle_tiling.py), they do not replace it.

    python benchmarks/oracle_registers.py --arch 90 --json regs.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile
import time

from gdn_fuzz import fused_oracle

KINDS = {  # kernel flags of the three callers
    "measure": dict(HISTORY=False, MEASURE=True, HAS_Y=True),
    "launch": dict(HISTORY=False, MEASURE=False, HAS_Y=False),
    "history": dict(HISTORY=True, MEASURE=False, HAS_Y=False),
}
POINTERS = {"fp64": ("egp_ptr", "w_ptr", "eg_ptr", "beta_ptr", "q_ptr", "k_ptr", "y_ptr", "ym_ptr", "u_ptr",
                     "um_ptr", "fold_ptr", "foldm_ptr", "sums_ptr", "yo_ptr"),
            "i64": ("rows_ptr", "wslot_ptr", "nwin_ptr", "slots_ptr"),
            "fp32": ("pool_ptr", "kc_ptr", "uw_ptr", "uc_ptr", "pa_ptr"),
            "bf16": ("v_ptr",)}


def compile_one(arch: int, kind: str, T: int, block_v: int, num_warps: int, variant: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit = fused_oracle._kernel(False)
    flags = fused_oracle.VARIANTS[variant]
    consts = dict(T=T, W=fused_oracle.W, BLOCK_V=block_v, BLOCK_K=128, PREFETCH=flags["prefetch"],
                  TOKEN_PREFETCH=flags["token_prefetch"], **KINDS[kind])
    ptr = {name: f"*{dt}" for dt, names in POINTERS.items() for name in names}
    sig = {n: "constexpr" if n in consts else ptr.get(n, "i32") for n in jit.arg_names}
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(jit, sig, constexprs=consts), target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=num_warps))
    seconds = time.perf_counter() - t0
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(k.asm["cubin"])
        fh.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    return dict(kind=kind, T=T, block_v=block_v, num_warps=num_warps, variant=variant,
                registers=int(m.group(1)) if m else None, stack_bytes=int(m.group(2)) if m else None,
                compile_s=round(seconds, 2), triton=triton.__version__, arch=arch)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100 / H200)")
    ap.add_argument("--kinds", nargs="+", choices=tuple(KINDS), default=["measure", "history"])
    ap.add_argument("--T", nargs="+", type=int, default=[4], help="tokens (history: always 16)")
    ap.add_argument("--block-v", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--warps", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--variants", nargs="+", choices=tuple(fused_oracle.VARIANTS), default=["loop", "prefetch"])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    # a fresh cache, so that every compile is timed (Triton reuses a kernel it compiled before from its cache)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="oracle-registers-")
    rows = []
    for kind, T, bv, w, variant in itertools.product(args.kinds, args.T, args.block_v, args.warps, args.variants):
        if kind == "history" and (variant == "prefetch" or T != args.T[0]):
            continue  # history has no window (prefetch is its loop; tokens is not) and always 16 tokens
        row = compile_one(args.arch, kind, 16 if kind == "history" else T, bv, w, variant)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
