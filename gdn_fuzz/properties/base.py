"""What a property is: a name, the contract clauses it covers, a strategy factory and a check.

A check that a drawn Case cannot exercise (no row switches route, a relation that needs two live
rows, a mode the target refuses) returns no finding and says so with not_exercised(): a
Hypothesis event, so Hypothesis' statistics (pytest --hypothesis-show-statistics) show how many
examples checked nothing instead of counting them as passes.  A property whose check needs
something of the Case (a row that can switch route, a flush row) draws it with its own
strategy factory (Property.strategy), so that such examples stay rare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hypothesis import event
from hypothesis.errors import InvalidArgument

from gdn_fuzz.case import Case
from gdn_fuzz.targets import Target
from gdn_fuzz.strategies import cases


def note(label: str) -> None:
    """hypothesis.event(label) inside a Hypothesis test (a campaign round, a @given test); a no-op
    anywhere else (a plain call, an isolated worker process, the reproducer)."""
    try:
        event(label)
    except InvalidArgument:  # "Cannot record events outside of a test"
        pass


def not_exercised(prop: str, why: str) -> None:
    """Record that this example checked nothing of `prop` (and why): the check returns no finding,
    which must not read as a pass."""
    note(f"{prop}: nothing exercised: {why}")


def launch_cases(**kw):
    """The default strategy factory: legal launches (gdn_fuzz.strategies.cases)."""
    return cases(**kw)


@dataclass(frozen=True)
class Property:
    """check(target, case, device) -> list[Finding]; strategy(arms, Ts, geometries, buckets) -> cases.

    reseed: a campaign with seeds_per_example K > 1 checks each drawn structure with K value seeds
    (gdn_fuzz.engine.campaign.value_seed).  That is sound when the check is a pure function of
    (structure, seed) and useful when its verdict depends on the values the seed draws.  False:
    one seed per structure whatever K is (a check that is not a pure function of the case, or
    whose verdict cannot depend on the drawn values).

    pool_scale: the campaign passes its pool-scale kinds (strategies.pool_scales_for) to the strategy
    as pool_scales=: pools of thousands of slots and past 2^31 elements (fill="rows").  Only for a
    check that never copies the whole pool (clone_inputs of such a case writes every page).

    begin, prepare (optional, both or neither): check in two halves, for an isolated worker that draws the next
    case while the device ends this one's check (gdn_fuzz.engine.isolation, $GDN_FUZZ_DRAW_AHEAD).
    begin(target, case, device, ready) -> finish, finish() -> list[Finding]: check() is begin(..., None)().
    prepare(case, device) -> ready or None: what begin would draw first, made ahead; it runs no code of the target
    (a crash or a fault while it runs is the check's before it).  None: begin draws it itself."""

    name: str
    clauses: str
    doc: str
    check: Callable[[Target, Case, str], list]
    strategy: Callable[..., object] = field(default=launch_cases)
    reseed: bool = True
    pool_scale: bool = False  # the strategy takes pool_scales= (a check that never copies the whole pool)
    kernel: str = "flush"  # the kernel whose targets it checks (Target.kernel): "flush" or "materialize"
    begin: Callable | None = None  # (target, case, device, ready) -> finish; finish() -> list[Finding]
    prepare: Callable | None = None  # (case, device) -> ready for begin, or None
