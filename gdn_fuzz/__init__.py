"""gdn_fuzz: property-based testing and fuzzing of the ReplaySSM Gated DeltaNet decode step.

Public surface: Case/Row/Regime (what one launch is), materialize (its tensors),
get_target (what runs it), the checks, and the float64 oracles (gdn_fuzz.oracles).
"""

__version__ = "0.1.0"
