#!/usr/bin/env bash
# Run gdn_fuzz on the lent H200 (no network there): unpack the offline bundle carried as
# .gpu/site.tar.xz (built by shared/gpu/make-offline-bundle.sh), install this repo without
# dependencies, then run the steps named on the command line, logging under $OUT.
#   bash tools/h200_session.sh doctor precision pytest campaign
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 3; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch,sys; print(sys.version); print('torch', torch.__version__)"; cat /tmp/gdn/site/BUNDLE_VERSIONS; } > "$OUT/env.txt" 2>&1
echo "setup $(( $(date +%s) - t0 ))s"
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    doctor) gdn-fuzz doctor > "$OUT/doctor.txt" 2>&1 ;;
    precision) gdn-fuzz precision --targets production reference --examples "${PREC_EXAMPLES:-30}" \
                 --json "$OUT/precision.json" > "$OUT/precision.txt" 2>&1 ;;
    pytest) python3 -m pytest tests -p no:cacheprovider -q --gdn-target production -x \
              --hypothesis-show-statistics ${PYTEST_ARGS:-} > "$OUT/pytest.txt" 2>&1 ;;
    campaign) gdn-fuzz run --target production --seconds "${CAMPAIGN_SECONDS:-90}" \
                --json "$OUT/campaign.json" > "$OUT/campaign.txt" 2>&1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - s ))s"
  tail -n 25 "$OUT/$step.txt" 2>/dev/null
done
echo "total $(( $(date +%s) - t0 ))s"
