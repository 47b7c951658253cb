"""Studies: measurements that are not pass/fail campaigns. Long-horizon drift and the drift budget's grid (drift),
the precision search (precision), unvalidated inputs (unguarded), the mutation score (mutation_score) against
an example-based baseline (baseline), and the Triton ReplaySSM differential (triton_diff)."""
