#!/usr/bin/env bash
# Issue 18 on the lent H200, after `bash tools/h200_triage.sh setup` (which unpacks .gpu to /tmp/gdn):
#   bash tools/h200_issue18.sh focused   the new GPU tests: the Qwen3-Next pool past 2^31 elements, the
#                                        verify-only sibling, params_inplace (N5), SGLang's commits
#   bash tools/h200_issue18.sh scale     a campaign on the production kernel with every bucket 4-256 and
#                                        the pool-scale regime, its record and the coverage report
# Logs under $OUT/r/; the corpus copy $OUT/r/corpus (made by setup) receives any new finding.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:$PWD:${PYTHONPATH:-}
[ -d /tmp/gdn/site ] || { echo "bundle gone from /tmp/gdn: run tools/h200_triage.sh setup in a call carrying .gpu"; exit 3; }
[ -d "$R/corpus" ] || cp -r corpus "$R/corpus"
PT="python3 -m pytest -p no:cacheprovider -q -rA --gdn-target production --gdn-device cuda --gdn-corpus $R/corpus"
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    focused)
      timeout 150 $PT tests/test_pool_scale.py -k qwen --durations=3 > "$R/pool.txt" 2>&1; echo "pool rc=$?"
      timeout 150 $PT tests/test_verify_sibling.py --durations=5 > "$R/sibling.txt" 2>&1; echo "sibling rc=$?"
      timeout 120 $PT tests/test_contract_properties.py -k "test_contract_property_holds and params_inplace" \
        > "$R/params.txt" 2>&1; echo "params rc=$?"
      GDN_FUZZ_SGLANG_DIR=/tmp/gdn/site/sglang_replayssm GDN_FUZZ_TRITON_EXAMPLES=${TRITON_EXAMPLES:-25} \
        timeout 150 $PT tests/test_triton_baseline.py -k "commit or fold_all or finding" --durations=5 \
        > "$R/triton.txt" 2>&1; echo "triton rc=$?"
      for f in pool sibling params triton; do echo "== $f"; grep -E "passed|failed|PASSED|FAILED|XFAIL|SKIPPED|Error" "$R/$f.txt" | tail -n 30 | cut -c1-260; done ;;
    scale)
      timeout "${CAMPAIGN_TO:-540}" gdn-fuzz run --target production --warm-up --seconds "${CAMPAIGN_S:-180}" \
        --processes "${PROCS:-4}" --arms ${ARMS:-bf16 fp16} --buckets 4 8 16 32 64 128 256 \
        --corpus "$R/corpus" --json "$R/scale.json" --record "$R/scale.jsonl" > "$R/scale.txt" 2>&1
      echo "scale rc=$?"
      gdn-fuzz report "$R/scale.jsonl" --campaign "$R/scale.json" --out "$R/scale-report" > "$R/report.txt" 2>&1
      echo "report rc=$?"
      tail -n 40 "$R/scale.txt" | cut -c1-240 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step $(( $(date +%s) - s ))s"
done
