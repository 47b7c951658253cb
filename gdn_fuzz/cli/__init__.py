"""The gdn-fuzz command line.

  gdn-fuzz run [--target NAME|PATH] [--arms ...] [--T 4 8] [--device D] [--seconds S | --examples N]
  gdn-fuzz mutants [--budget S] [--only NAME ...] [--json PATH] [--seed N]
  gdn-fuzz drift [--tokens N] [--arms ...] [--T 4 8] [--accept mtp|all|one] [--out DIR]
  gdn-fuzz triton [--kernels triton|interpret|model] [--T 4 8] [--cfgs ...] [--diff] [--json PATH]
  gdn-fuzz diff OLD NEW [--device D] [--examples N] [--markdown F] [--json F]
  gdn-fuzz release [list | fetch VERSION ...]
  gdn-fuzz replay | report | precision | unguarded | doctor
"""

from __future__ import annotations

import argparse

from gdn_fuzz.cli import releases, replay, report, run, serving, studies
from gdn_fuzz.cli.common import (  # noqa: F401  (the exit codes, documented in the README)
    EXIT_INTERRUPTED, EXIT_KNOWN_ONLY, EXIT_NEW, EXIT_OK, EXIT_USAGE, UsageError)
from gdn_fuzz.cli.run import validate_run_args  # noqa: F401

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_NEW", "EXIT_USAGE", "EXIT_KNOWN_ONLY",
           "EXIT_INTERRUPTED", "UsageError", "validate_run_args"]

# every sub-command module, in the order `gdn-fuzz --help` lists them; each defines add_parser(sub)
COMMANDS = (run, replay, report, studies, serving, releases)


def version_text() -> str:
    """`gdn-fuzz --version`: this package's version and those of what it drives, read from the installed
    distributions' metadata (nothing is imported)."""
    from gdn_fuzz.environment import dist_version as v

    return (f"gdn-fuzz {v('gdn-fuzz')} (torch {v('torch')}, hypothesis {v('hypothesis')}, "
            f"flashinfer-python {v('flashinfer-python')}, nvidia-cutlass-dsl {v('nvidia-cutlass-dsl')})")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gdn-fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=version_text())
    sub = ap.add_subparsers(dest="cmd", required=True)
    for mod in COMMANDS:
        mod.add_parser(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
