"""`gdn-fuzz doctor`: what this machine can run, and why not."""

from __future__ import annotations

import importlib.metadata as md
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
    return "\n".join(lines)
