"""What a property is: a name, the contract clauses it covers, a strategy factory and a check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gdn_fuzz.case import Case
from gdn_fuzz.targets import Target


def launch_cases(**kw):
    """The default strategy factory: legal launches (gdn_fuzz.strategies.cases)."""
    from gdn_fuzz.strategies import cases

    return cases(**kw)


@dataclass(frozen=True)
class Property:
    """check(target, case, device) -> list[Finding]; strategy(arms, Ts, geometries, buckets) -> cases."""

    name: str
    clauses: str
    doc: str
    check: Callable[[Target, Case, str], list]
    strategy: Callable[..., object] = field(default=launch_cases)
