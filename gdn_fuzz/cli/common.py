"""What every gdn-fuzz sub-command shares: the console, exit codes, option parsing helpers."""

from __future__ import annotations

import sys

from rich.console import Console

from gdn_fuzz.arms import ARM_NAMES, parse_arms  # noqa: F401  (parse_arms: used by the sub-commands)
# exit codes of `gdn-fuzz run` (and replay), re-exported here: gdn_fuzz.engine.exits, documented in the README
from gdn_fuzz.engine.exits import EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_USAGE  # noqa: F401
from gdn_fuzz.targets import TargetUnavailable, default_target_name, get_target

console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def default_device(target) -> str:
    import torch

    return "cuda" if (target.needs_cuda or torch.cuda.is_available()) and torch.cuda.is_available() else "cpu"


def target_device_arms(args):
    """(target, device, arms) from --target/--device/--arms, or None after saying why not."""
    name = args.target or default_target_name()
    try:
        target = get_target(name)
    except (TargetUnavailable, ValueError) as e:
        console.print(f"[red]target {name!r} unavailable:[/red] {e}")
        return None
    device = args.device or default_device(target)
    import torch

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        console.print(f"[red]cannot run:[/red] --device {device}: this machine has no usable CUDA device "
                      f"(torch {torch.__version__}, cuda available: False); use --device cpu")
        return None
    why = target.unavailable_reason(device)
    if why:
        console.print(f"[red]cannot run:[/red] {why}")
        return None
    return target, device, (parse_arms(args.arms) if args.arms else ARM_NAMES)



class UsageError(ValueError):
    """A bad option value: one line naming the option, its value and the fix (exit 2)."""
