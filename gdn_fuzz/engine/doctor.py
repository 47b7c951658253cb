"""`gdn-fuzz doctor`: what this machine can run, and why not."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import platform

from gdn_fuzz.arms import ARM_NAMES
from gdn_fuzz.targets import TargetMismatch, TargetUnavailable, get_target


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def report() -> str:
    import torch

    lines = [f"python {platform.python_version()}  torch {torch.__version__}  "
             f"flashinfer-python {_version('flashinfer-python')}  nvidia-cutlass-dsl {_version('nvidia-cutlass-dsl')}  "
             f"hypothesis {_version('hypothesis')}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)} SM{cap[0]}{cap[1]}")
    else:
        lines.append("GPU: none (torch.cuda.is_available() is False)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("reference", "production", "sm100"):
        try:
            t = get_target(name)
        except (TargetUnavailable, ValueError) as e:
            lines.append(f"target {name}: unavailable: {e}")
            continue
        arms_ok, arms_bad = [], []
        for arm in ARM_NAMES:
            try:
                t.module(arm)
                arms_ok.append(arm)
            except (TargetMismatch, TargetUnavailable, ImportError, ValueError, RuntimeError) as e:
                arms_bad.append(f"{arm} ({type(e).__name__}: {e})")
        why = t.unavailable_reason(device)
        lines.append(f"target {name}: {t.path}")
        lines.append(f"  arms that import: {', '.join(arms_ok) or 'none'}")
        for b in arms_bad:
            lines.append(f"  arm fails to import: {b}")
        lines.append(f"  launches on {device}: " + ("yes" if why is None else f"no: {why}"))
        if why is not None and name == "production" and arms_ok:
            lines.append("  host checks (H1-H14) still run here: tests/test_host_checks.py")
    lines += _siblings(device)
    ray = _version("ray")
    lines.append("fleets: --processes N / --gpus here; --ray: " + (
        f"ray {ray} installed (a cluster: `ray start --head`, then --ray auto; docs/fleet.md)" if ray != "not installed"
        else "ray not installed (pip install 'gdn-fuzz[cluster]')"))
    return "\n".join(lines)


SIBLING = "flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache"  # the verify-only kernel, same release


def _siblings(device: str) -> list[str]:
    """The kernels around the fused one (issue 18): the verify-only sibling and SGLang's Triton ReplaySSM
    files -- whether they are here, where they would run, and which of them gdn_fuzz drives today."""
    from gdn_fuzz.targets.triton_baseline import resolve_sglang_files, triton_missing_reason

    try:
        found = importlib.util.find_spec(SIBLING) is not None
    except (ImportError, ValueError):
        found = False
    out = [f"kernel {SIBLING}.gated_delta_rule_mtp_ucache (verify-only sibling: 16-slot ring, state read-only): "
           + ("installed" if found else "not installed (flashinfer-python 0.7.2.post1 ships it)"),
           "  launches on an SM90 GPU, like the production target; driven by gdn_fuzz: yes, by "
           "tests/test_verify_sibling.py (gdn_fuzz.properties.sibling: its launch vs a float64 oracle of its "
           "16-slot ring, and bitwise vs the fused kernel's verify rows at cache_base 0; GPU only, not a "
           "`gdn-fuzz run` property)"]
    try:
        where, folder = resolve_sglang_files()
        here = f"found ({where}: {folder or 'the installed sglang package'})"
    except TargetUnavailable as e:
        here = f"not found: {e}"
    no_triton = triton_missing_reason()
    runs = (f"no: {no_triton}" if no_triton else "on CUDA, or on the CPU in Triton's interpreter "
            "(TRITON_INTERPRET=1 set before the process starts)")
    out += [f"kernels of SGLang's Triton ReplaySSM baseline: {here}",
            f"  runs {runs}; this machine's device: {device}",
            "  gdn_replayssm_spec_decode, commit_gdn_replayssm_spec: driven (`gdn-fuzz triton`, docs/triton-baseline.md)",
            "  commit_gdn_replayssm_circular, commit_gdn_replayssm_spec(fold_every_commit=True) and "
            "commit_gdn_replayssm_fold_all_layers (gdn_replayssm_spec_fold.py): driven (`gdn-fuzz triton`, "
            "tests/test_triton_baseline.py)",
            "  commit_gdn_replayssm_fold_after_verify: not driven (it imports a module the released files lack)"]
    return out
