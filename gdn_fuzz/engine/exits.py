"""Exit codes of `gdn-fuzz run` (and replay), documented in the README.

Here, in the engine layer, so that both the CLI (gdn_fuzz.cli.common re-exports them) and the
engine's multi-process parent (gdn_fuzz.engine.multigpu, which merges its children's codes) use
one definition; the engine must not import the CLI."""

import signal

EXIT_OK = 0  # nothing new (known bugs may have shown: listed, not failing)
EXIT_NEW = 1  # new findings
EXIT_USAGE = 2  # usage or setup error: bad option, target missing or unloadable, no device
EXIT_KNOWN_ONLY = 3  # only known findings, and --fail-on-known was given
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT: what was found is reported and stored first
EXIT_TERMINATED = 128 + signal.SIGTERM  # SIGTERM (a shell's convention): the same, after a TERM
