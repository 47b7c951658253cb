#!/usr/bin/env bash
# The Triton ReplaySSM baseline on the H200 (issue 9): GPU property tests and the differential
# run against the fused `production` kernel (all five arms) for T = 4 and 8.
# Assumes the environment is already set up (offline bundle unpacked to /tmp/gdn/site, repo
# installed, `production` importable).  Run from the repo root:  bash tools/h200_triton.sh
# Writes $OUT/r/triton-*.{txt,json} (OUT defaults to /tmp/out).  Budget: < 4 minutes in all.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1 GDN_FUZZ_PROFILE=${GDN_FUZZ_PROFILE:-ci}
export GDN_FUZZ_SGLANG_DIR=${GDN_FUZZ_SGLANG_DIR:-/tmp/gdn/site/sglang_replayssm}
export GDN_FUZZ_TRITON_EXAMPLES=${GDN_FUZZ_TRITON_EXAMPLES:-4}
unset TRITON_INTERPRET
t0=$(date +%s)
{ date -u; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; ls -l "$GDN_FUZZ_SGLANG_DIR"/sglang/kernels/ops/attention/linear/; } > "$R/triton-env.txt" 2>&1

# 1. property tests (pytest; Hypothesis shrinks failing streams)       cap 110 s
s=$(date +%s)
timeout "${TRITON_PYTEST_S:-110}" python3 -m pytest tests/test_triton_baseline.py -p no:cacheprovider -q -rA \
  --gdn-device cuda -s --durations=10 --hypothesis-show-statistics > "$R/triton-pytest.txt" 2>&1
echo "pytest rc=$? $(( $(date +%s) - s ))s"; tail -n 15 "$R/triton-pytest.txt" | cut -c1-220

# 2. properties table + differential vs production (5 arms) x Triton (fp32 and bf16 checkpoints)  cap 110 s
s=$(date +%s)
timeout "${TRITON_DIFF_S:-110}" gdn-fuzz triton --kernels triton --device cuda --T 4 8 \
  --cfgs bf16-ckpt32 bf16-ckpt16 --steps 16 --diff --fused-target production --diff-steps 24 \
  --json "$R/triton-diff.json" > "$R/triton-diff.txt" 2>&1
echo "diff rc=$? $(( $(date +%s) - s ))s"; tail -n 40 "$R/triton-diff.txt" | cut -c1-220
echo "total $(( $(date +%s) - t0 ))s"
