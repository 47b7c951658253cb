"""The property registry: what a campaign or a corpus replay can check.

A property is a name, the contract clauses it covers, a strategy factory (what Cases it
needs) and a check (target, case, device) -> list[Finding].  The campaign runner and the
corpus replay look properties up here, so a new property is one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import checks
from .case import Case
from .targets import Target


@dataclass(frozen=True)
class Property:
    name: str
    clauses: str
    doc: str
    strategy: Callable[..., object]  # (arms, Ts, geometries, buckets) -> SearchStrategy[Case]
    check: Callable[[Target, Case, str], list]


def _cases(**kw):
    from .strategies import cases

    return cases(**kw)


REGISTRY: dict[str, Property] = {}


def register(p: Property) -> Property:
    REGISTRY[p.name] = p
    return p


register(Property(
    name="launch",
    clauses="M1-M8",
    doc="outputs, appended k/u/g and the fold vs the float64 oracle; nothing outside the write set changes",
    strategy=_cases,
    check=checks.check_launch,
))


def get_property(name: str) -> Property:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"property={name!r} is unknown; use one of {', '.join(REGISTRY)}") from None


# ---- further properties register themselves from their own modules (imported here so
# ---- that the registry is complete whenever gdn_fuzz.properties is imported)
from . import relations  # noqa: E402,F401  (routing, determinism, output_inplace, metamorphic)
from . import mutation  # noqa: E402,F401  (guards, commit, precision, extremes)
