"""gdn_fuzz: property-based testing and fuzzing of the ReplaySSM Gated DeltaNet decode step.

The public surface, importable from here (loaded on first use: `import gdn_fuzz` itself imports
nothing heavy and changes no global state):

  Case, Row, Regime        what one launch is (gdn_fuzz.case)
  materialize              its tensors, from the case's seed
  get_target, Target       what runs it: "reference", "production", "mutant:NAME" or a file
  observe, Observation     one launch with every buffer before and after (gdn_fuzz.observation)
  expectation              the float64 oracle's view of that launch (gdn_fuzz.oracles.ring)
  check_launch, check_oracle, check_writes
                           the launch property and its two halves (gdn_fuzz.checks)
  Finding                  what a check reports; its signature() names the bug (gdn_fuzz.findings)
  get_property, REGISTRY, Property, register
                           the campaign properties by name (gdn_fuzz.properties), and how to add one
  Campaign                 a budgeted fuzz campaign (gdn_fuzz.engine.campaign; what `gdn-fuzz run` drives)
  cases                    the Hypothesis strategy of legal launches (gdn_fuzz.strategies)

See tests/test_public_api.py for a ten-line property written with these names only.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Case": "case", "Row": "case", "Regime": "case", "materialize": "case",
    "get_target": "targets", "Target": "targets",
    "observe": "observation", "Observation": "observation", "Finding": "findings",
    "expectation": "checks", "check_launch": "checks", "check_oracle": "checks", "check_writes": "checks",
    "get_property": "properties", "REGISTRY": "properties",
    "Campaign": "engine.campaign", "Property": "properties", "register": "properties",
    "cases": "strategies",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'gdn_fuzz' has no attribute {name!r}; public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"gdn_fuzz.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
