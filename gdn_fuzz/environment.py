"""What a process reads from its environment: a validated choice from an environment variable, and the version
of an installed distribution.  Standard library only, so that `gdn-fuzz --version` and the modules that read
their switches at import stay light."""

from __future__ import annotations

import os
from importlib import metadata


def choice(var: str, choices: tuple, meaning: str) -> str:
    """The value of environment variable `var`, lower-cased, one of `choices` (unset or empty: the first).  Any
    other value raises ValueError naming the variable, its value, the choices and `meaning` (what each does)."""
    val = os.environ.get(var, "").strip().lower() or choices[0]
    if val not in choices:
        raise ValueError(f"{var}={os.environ[var]!r} is not a legal choice; use one of {', '.join(choices)} "
                         f"({meaning})")
    return val


def dist_version(dist: str, missing: str | None = "not installed") -> str | None:
    """The installed version of distribution `dist` (its metadata; nothing is imported), or `missing`."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return missing
