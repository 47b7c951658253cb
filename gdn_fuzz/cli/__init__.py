"""The gdn-fuzz command line.

  gdn-fuzz run [--target NAME|PATH] [--arms ...] [--T 4 8] [--device D] [--seconds S | --examples N]
  gdn-fuzz mutants [--budget S] [--only NAME ...] [--json PATH] [--seed N]
  gdn-fuzz drift [--tokens N] [--arms ...] [--T 4 8] [--accept mtp|all|one] [--out DIR]
  gdn-fuzz triton [--kernels triton|interpret|model] [--T 4 8] [--cfgs ...] [--diff] [--json PATH]
  gdn-fuzz diff OLD NEW [--device D] [--examples N] [--markdown F] [--json F]
  gdn-fuzz release [list | fetch VERSION ...]
  gdn-fuzz replay | report | precision | unguarded | doctor

Importing this package is light: the sub-command modules (which import torch) are imported when a command runs,
or when build_parser() or one of their names (COMMANDS, UsageError, validate_run_args) is asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gdn_fuzz.cli import commands
# the exit codes, documented in the README (gdn_fuzz.cli.common re-exports the same names)
from gdn_fuzz.engine.exits import EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_USAGE  # noqa: F401

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_NEW", "EXIT_USAGE", "EXIT_KNOWN_ONLY",
           "EXIT_INTERRUPTED", "UsageError", "validate_run_args"]

_LAZY = {"UsageError": "common", "validate_run_args": "run"}


def _modules() -> tuple:
    """Every sub-command module, in the order `gdn-fuzz --help` lists their commands; each defines add_parser(sub)."""
    names = dict.fromkeys(mod for mod, _ in commands.TABLE.values())
    return tuple(importlib.import_module(f"gdn_fuzz.cli.{n}") for n in names)


def __getattr__(name: str):
    if name == "COMMANDS":
        return _modules()
    if name in _LAZY:
        return getattr(importlib.import_module(f"gdn_fuzz.cli.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gdn_fuzz.cli' has no attribute {name!r}")


def version_text() -> str:
    """`gdn-fuzz --version`: this package's version and those of what it drives, read from the installed
    distributions' metadata (nothing is imported)."""
    from gdn_fuzz.environment import dist_version as v

    return (f"gdn-fuzz {v('gdn-fuzz')} (torch {v('torch')}, hypothesis {v('hypothesis')}, "
            f"flashinfer-python {v('flashinfer-python')}, nvidia-cutlass-dsl {v('nvidia-cutlass-dsl')})")


def _skeleton():
    ap = argparse.ArgumentParser(prog="gdn-fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=version_text())
    return ap, ap.add_subparsers(dest="cmd", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every sub-command with its options (imports every sub-command module)."""
    ap, sub = _skeleton()
    for mod in _modules():
        mod.add_parser(sub)
    return ap


def light_parser() -> argparse.ArgumentParser:
    """The top level alone: --help, --version and the commands' names and helps (commands.TABLE), with no
    sub-command module imported: what answers `gdn-fuzz --help`, `--version`, no command and an unknown one."""
    ap, sub = _skeleton()
    for name in commands.TABLE:
        sub.add_parser(name, help=commands.help_of(name), add_help=False)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = next((a for a in argv if not a.startswith("-")), None)  # the top level has no option with a value
    if cmd not in commands.TABLE:
        light_parser().parse_args(argv)  # prints the help, the version or the usage error, and exits
    args = build_parser().parse_args(argv)
    return args.func(args)
