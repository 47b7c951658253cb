#!/usr/bin/env bash
# Run gdn_fuzz on the lent H200 (no network there): unpack the offline bundle carried as
# .gpu/site.tar.xz (built by shared/gpu/make-offline-bundle.sh), install this repo without
# dependencies, then run the steps named on the command line, each under its own time cap,
# logging under $OUT/r/ and packing everything into $OUT/results.tar.gz.
#   bash tools/h200_session.sh doctor pytest campaign crash unguarded
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1 GDN_FUZZ_PROFILE=${GDN_FUZZ_PROFILE:-ci}
t0=$(date +%s)
mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch,sys; print(sys.version); print('torch', torch.__version__)"; cat /tmp/gdn/site/BUNDLE_VERSIONS; } > "$R/env.txt" 2>&1
echo "setup $(( $(date +%s) - t0 ))s"
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    doctor) timeout 60 gdn-fuzz doctor > "$R/doctor.txt" 2>&1 ;;
    pytest) timeout "${PYTEST_S:-150}" python3 -m pytest tests/test_launch.py tests/test_relations.py tests/test_corpus_replay.py \
              -p no:cacheprovider -q -rA --gdn-target production --gdn-corpus "$R/corpus" -k "not planted" \
              --hypothesis-show-statistics --durations=15 > "$R/pytest.txt" 2>&1 ;;
    machine) timeout "${MACHINE_S:-70}" python3 -m pytest tests/test_machine.py -p no:cacheprovider -q -rA \
               --gdn-target production -k "not planted" > "$R/machine.txt" 2>&1 ;;
    campaign) timeout "$(( ${CAMPAIGN_S:-75} + 60 ))" gdn-fuzz run --target production --seconds "${CAMPAIGN_S:-75}" \
                --corpus "$R/corpus" --json "$R/campaign.json" --record "$R/campaign.jsonl" > "$R/campaign.txt" 2>&1
              gdn-fuzz report "$R/campaign.jsonl" --campaign "$R/campaign.json" --out "$R/report" > /dev/null 2>&1 ;;
    crash) timeout 90 gdn-fuzz run --target mutant:gpu_oob_full_window --arms bf16 --T 4 --examples 40 \
             --property launch --corpus "$R/crash-corpus" --json "$R/crash.json" > "$R/crash.txt" 2>&1 ;;
    unguarded) timeout 60 gdn-fuzz unguarded --target production --arms bf16 fp16 --json "$R/unguarded.json" \
                 > "$R/unguarded.txt" 2>&1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - s ))s"
  tail -n 12 "$R/$step.txt" 2>/dev/null | cut -c1-220
done
tar czf "$OUT/results.tar.gz" -C "$OUT" r
echo "total $(( $(date +%s) - t0 ))s"
