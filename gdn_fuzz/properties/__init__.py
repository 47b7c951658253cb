"""The properties a campaign or a corpus replay can check, listed here explicitly.

A property is a name, the contract clauses it covers, a strategy factory (what Cases it
needs) and a check (target, case, device) -> list[Finding] (gdn_fuzz.properties.base).
The registry below is the whole list, in the order campaigns schedule them:

  launch      (gdn_fuzz.checks)               the launch against the float64 oracle and the write set
  relations   (gdn_fuzz.properties.relations) routing, determinism, output_inplace, metamorphic
  contract    (gdn_fuzz.properties.contract)  guards, commit, extremes
  materialize (gdn_fuzz.properties.materialize) pm_launch, pm_copy, pm_relations, pm_graph, pm_guards: the prefix
              materializer's properties, for targets of kernel "materialize" (Property.kernel, Target.kernel)

Importing this package registers nothing anywhere else; a user's own property is added with
register(Property(...)) from the code that wants it.
"""

from __future__ import annotations

from gdn_fuzz import checks
from gdn_fuzz.properties import contract, materialize, relations
from gdn_fuzz.properties.base import Property, launch_cases

__all__ = ["Property", "REGISTRY", "get_property", "register", "launch_cases", "for_kernel"]

LAUNCH = Property(
    name="launch",
    clauses="M1-M8",
    doc="outputs, appended k/u/g and the fold vs the float64 oracle; nothing outside the write set changes",
    check=checks.check_launch,
    pool_scale=True,  # check_launch observes a fill="rows" case's rows alone (observe_rows): no copy of the pool
    begin=checks.begin_launch,
    prepare=checks.prepare_launch,
)

REGISTRY: dict[str, Property] = {p.name: p for p in (LAUNCH, *relations.PROPERTIES, *contract.PROPERTIES,
                                                     *materialize.PROPERTIES)}


def for_kernel(kernel: str) -> list[str]:
    """The names of the registered properties that check targets of `kernel` (Target.kernel), in order."""
    return [n for n, p in REGISTRY.items() if p.kernel == kernel]


def register(p: Property) -> Property:
    """Add (or replace) a property by name: a user's own property for campaigns and replay."""
    REGISTRY[p.name] = p
    return p


def get_property(name: str) -> Property:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"property={name!r} is unknown; use one of {', '.join(REGISTRY)}") from None
