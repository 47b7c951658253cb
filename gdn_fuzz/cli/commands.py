"""The sub-commands of gdn-fuzz: name -> (the gdn_fuzz.cli module that builds its options, its one-line help), in
the order `gdn-fuzz --help` lists them.

Standard library only: `gdn-fuzz --help`, `--version` and a bad command name are answered from this table alone,
without importing torch or any sub-command module (gdn_fuzz.cli.main); each module"s add_parser takes its
command"s help from here (help_of), so the table is the one place a command is named and described.
"""

from __future__ import annotations

TABLE = {
    "run": ("run", "fuzz a target within a time or example budget"),
    "corpus": ("replay", "corpus folders: `corpus check` validates every entry (runs nothing)"),
    "replay": ("replay", "re-run corpus entries against their target (or --target)"),
    "report": ("report", "Markdown/HTML report with coverage and error plots of a campaign"),
    "doctor": ("report", "what this machine can run, and why not"),
    "precision": ("studies", "steer generation toward the largest error vs the oracle (tolerance evidence)"),
    "unguarded": ("studies", "measure what unvalidated inputs do (hist_len > 16, duplicate slots, ...; with a "
                  "materializer target: dst past the pool, duplicate dst, dst == src)"),
    "mutants": ("studies", "mutation score: run the suite and the example-based baseline against every catalogued "
                "mutant"),
    "drift": ("serving", "long-horizon drift of each dtype arm's committed state (teacher-forced, float64 truth): "
              "JSON, plot, Markdown"),
    "triton": ("serving", "the SGLang Triton ReplaySSM baseline: properties and a differential run"),
    "release": ("releases", "the modelled FlashInfer releases: list them, fetch a release's kernel files"),
    "diff": ("releases", "release differential: host checks and drawn launches of OLD vs NEW (each a release, a target "
             "name or a module file)"),
}


def help_of(name: str) -> str:
    return TABLE[name][1]
