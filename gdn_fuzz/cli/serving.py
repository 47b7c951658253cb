"""The serving studies' sub-commands: `gdn-fuzz drift` (gdn_fuzz.studies.drift: long-horizon drift, and the
grid behind the drift budget with --measure-budget) and `gdn-fuzz triton` (gdn_fuzz.studies.triton_diff: the SGLang
Triton ReplaySSM baseline's properties and the differential against the fused kernel)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.studies.drift import (DEFAULT_TOKENS, fmt_number, measure_budget_grid, merge_results, run_drift,
                                    write_outputs)
from gdn_fuzz.studies.triton_diff import run_differential, run_properties
from gdn_fuzz.targets import TargetUnavailable, get_target
from gdn_fuzz.targets.triton_baseline import TRITON_CONFIGS, TorchBaselineModel, load_kernels


def add_drift_parser(subparsers):
    p = subparsers.add_parser("drift", help=help_of("drift"))
    p.add_argument("--target", default="reference", help="reference | production | mutant:NAME | PATH.py")
    p.add_argument("--arms", nargs="+", help=f"dtype arms (default: all of {', '.join(ARM_NAMES)})")
    p.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="committed tokens per request")
    p.add_argument("--batch", type=int, default=4, help="requests per launch")
    p.add_argument("--accept", default="mtp", help="mtp | mtp:MEAN (mean accepted length at T=4) | all | one")
    p.add_argument("--regime", default="normal",
                   help="realistic | normal | weak | strong | 'decay=D,beta=B,keys=K,...' (gdn_fuzz.case.Regime)")
    p.add_argument("--heads", default=None, help="H,HV (default 16,64 on CUDA, 2,4 on the CPU)")
    p.add_argument("--record-every", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--seconds", type=float, help="wall-clock budget: stop early (marked truncated) when spent")
    p.add_argument("--out", default="drift", help="output folder")
    p.add_argument("--measure-budget", action="store_true",
                   help="do not run the study: run the grid behind the serving drift budget compare.DRIFT_C "
                        "(docs/tolerances.md, 'Drift budget'; --steps launches per run, --seeds seeds) and print the "
                        "worst need per arm; --json writes every run")
    p.add_argument("--steps", type=int, default=200, help="with --measure-budget: launches per run")
    p.add_argument("--seeds", type=int, default=2, help="with --measure-budget: seeds per grid cell")
    p.add_argument("--json", help="with --measure-budget: write every run's numbers here")
    p.add_argument("--merge", nargs="+", metavar="DRIFT_JSON",
                   help="do not run: merge the drift.json of parts of one study (split by --T / --arms and run "
                        "in parallel) into --out")
    p.set_defaults(func=cmd_drift)
    return p


def cmd_drift(args) -> int:
    if args.merge:
        parts = []
        for f in args.merge:
            try:
                parts.append(json.loads(Path(f).read_text()))
            except (OSError, ValueError) as e:
                print(f"--merge {f}: cannot read a drift.json there ({e})")
                return 2
        try:
            res = merge_results(parts)
        except ValueError as e:
            print(str(e))
            return 2
        paths = write_outputs(res, args.out)
        print(f"merged {len(parts)} parts; written: {', '.join(str(p) for p in paths.values())}")
        return 0

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        torch.set_num_threads(1)
    try:
        target = get_target(args.target)
    except (TargetUnavailable, ValueError) as e:
        print(f"target {args.target!r} unavailable: {e}")
        return 2
    why = target.unavailable_reason(args.device)
    if why:
        print(f"cannot run: {why}")
        return 2
    arms = [a.strip() for v in (args.arms or list(ARM_NAMES)) for a in v.split(",") if a.strip()]
    if args.measure_budget:
        measure_budget_grid(target, args.device, steps=args.steps, seeds=args.seeds, arms=arms, Ts=tuple(args.T),
                            json_path=args.json, log=lambda line: print(line, flush=True))
        return 0
    heads = tuple(int(x) for x in args.heads.split(",")) if args.heads else None
    last = [0.0]

    def progress(T, step, tok):
        if time.time() - last[0] > 10:
            last[0] = time.time()
            print(f"  T={T} step {step}: {tok:.0f} / {args.tokens} tokens", flush=True)

    res = run_drift(target, arms, tuple(args.T), args.tokens, args.batch, args.accept, args.regime, args.seed,
                    args.device, args.record_every, heads=heads, progress=progress, seconds=args.seconds)
    paths = write_outputs(res, args.out)
    for T, run in res["runs"].items():
        for arm, s in run["summary"].items():
            print(f"T={T} {arm:20s} state final {s['state_final']:.2e} max {s['state_max']:.2e} "
                  f"({s['state_max_over_u']:.2f} u)  y max {s['y_max']:.2e}  slope {fmt_number(s['fit']['slope'], '+.3f')} "
                  f"({s['fit']['verdict']})")
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return 0


def _kernels(which: str):
    if which == "model":
        return TorchBaselineModel
    return load_kernels(interpret=(which == "interpret"))


def add_triton_parser(sub) -> None:
    p = sub.add_parser("triton", help=help_of("triton"))
    _add_args(p)
    p.set_defaults(func=lambda args: _run(args))


def _add_args(p):
    p.add_argument("--kernels", choices=["triton", "interpret", "model"], default="triton",
                   help="triton (GPU), interpret (TRITON_INTERPRET=1 on CPU tensors), model (torch float64 model)")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--T", nargs="+", type=int, default=[4, 8])
    p.add_argument("--cfgs", nargs="+", default=["bf16-ckpt32", "bf16-ckpt16"], help=f"of {', '.join(TRITON_CONFIGS)}")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-properties", action="store_true")
    p.add_argument("--diff", action="store_true", help="also run the differential against --fused-target")
    p.add_argument("--fused-target", default="production")
    p.add_argument("--fused-arms", nargs="+", default=None, help="default: all five")
    p.add_argument("--diff-steps", type=int, default=24)
    p.add_argument("--json", help="write the JSON record here")


def _run(args) -> int:
    con = Console(highlight=False, width=160)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.kernels == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        kern = _kernels(args.kernels)
    except TargetUnavailable as e:
        con.print(f"[red]Triton baseline unavailable:[/red] {e}")
        return 2
    rec = dict(kernels=args.kernels, source=getattr(kern, "source", "?"), device=dev, properties=[], differential=[],
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    bad = False
    if not args.no_properties:
        tab = Table(title=f"Triton baseline properties ({args.kernels}, {dev})")
        for col in ("T", "cfg", "findings", "state", "y", "fold rel", "fold=fp32 bits", "max ulp(max|F|)", "pad", "det", "perm", "s"):
            tab.add_column(col)
        for T in args.T:
            for cfg in args.cfgs:
                r = run_properties(kern, T=T, cfg=cfg, device=dev, steps=args.steps, seed=args.seed)
                rec["properties"].append(r)
                m = r["measurements"]
                bad |= bool(r["findings"])
                bits = f"{m['fold_bit_identical']}/{m['fold_elements']}" if m["fold_elements"] else "-"
                tab.add_row(str(T), cfg, str(len(r["findings"])), f"{m['state_max']:.2e}", f"{m['y_max']:.2e}",
                            f"{m['fold_max_rel']:.2e}", bits, f'{m["fold_vs_fp32_max_ulp"]:.2g}',
                            f"{m['pad_output_max']:.1g}", str(m.get("determinism_bit_identical")),
                            str(m.get("permutation_bit_identical")), f"{r['seconds']:.1f}")
                for f in r["findings"]:
                    con.print(f"  T={T} {cfg}: {f}", markup=False)
        con.print(tab)
    if args.diff:
        try:
            ft = get_target(args.fused_target)
            why = ft.unavailable_reason(dev)
        except (TargetUnavailable, ValueError) as e:
            why = str(e)
        if why:
            con.print(f"[red]differential skipped:[/red] {why}")
            rec["differential_skipped"] = why
            bad = True
        else:
            arms = tuple(args.fused_arms or ARM_NAMES)
            tab = Table(title=f"differential: fused {args.fused_target} vs Triton baseline (max over steps)")
            for col in ("T", "pair", "max state div", "max y div", "max ratio to budget", "agree"):
                tab.add_column(col)
            for T in args.T:
                d = run_differential(ft, arms, kern, args.cfgs, T=T, steps=args.diff_steps, seed=args.seed, device=dev)
                rec["differential"].append(d)
                for name, p in d["pairs"].items():
                    bad |= not p["agree"]
                    tab.add_row(str(T), name, f"{p['max_state']:.2e}", f"{p['max_y']:.2e}", f"{p['max_ratio']:.3f}",
                                str(p["agree"]))
            con.print(tab)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1, default=str)
    return 1 if bad else 0


def add_parser(sub) -> None:
    add_drift_parser(sub)
    add_triton_parser(sub)
