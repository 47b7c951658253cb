"""Hypothesis strategies for gdn_fuzz (installed as gdn_fuzz.strategies).

cases()       one legal launch of the entry point (gdn_fuzz.case.Case); need= "switchable" or
              "flush" asks for one row that some legal flush_min reroutes, or one flush row
regimes()     value regimes (norms, decay, beta, keys, history, poison)
hist_lens(), switchable_hist_lens(), flush_hist_lens(), cache_bases(), flush_mins(), rows_for()
              the pieces, for custom strategies
case_events() coverage labels for hypothesis.event()
pool_scales_for(), buckets_for(), geometries_for()
              what a campaign on a device or target draws by default
"""

from ._cases import (  # noqa: F401
    BUCKETS,
    CPU_BUCKETS,
    CPU_GEOMETRIES,
    GPU_GEOMETRIES,
    LARGE_BUCKETS,
    NEEDS,
    POOL_SCALES,
    QK_SCALES,
    SCALE_ODDS,
    STATE_SCALES,
    V_SCALES,
    buckets_for,
    cache_bases,
    case_events,
    cases,
    flush_hist_lens,
    flush_mins,
    geometries_for,
    hist_lens,
    int32_slot,
    pool_scale_kind,
    pool_scale_of,
    pool_scales_for,
    regimes,
    rows_for,
    switchable_hist_lens,
)

__all__ = ["BUCKETS", "CPU_BUCKETS", "CPU_GEOMETRIES", "GPU_GEOMETRIES", "LARGE_BUCKETS", "NEEDS", "POOL_SCALES", "QK_SCALES", "SCALE_ODDS", "STATE_SCALES", "V_SCALES",
           "buckets_for", "cache_bases", "case_events", "cases",
           "flush_hist_lens", "flush_mins", "geometries_for", "hist_lens", "int32_slot", "pool_scale_kind", "pool_scale_of", "pool_scales_for", "regimes", "rows_for",
           "switchable_hist_lens"]
