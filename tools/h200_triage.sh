#!/usr/bin/env bash
# Issue 14 on the lent H200: the whole suite against the released kernel must be green with the
# known production bugs as xfails, and a 300 s campaign must report no new finding.
#   bash tools/h200_triage.sh setup suite        (first call: carries .gpu, unpacks it to /tmp/gdn)
#   bash tools/h200_triage.sh campaign           (next call, within 30 s: /tmp/gdn must still be there)
#   bash tools/h200_triage.sh setup before suite (issue 16: the suite of an earlier commit, then this tree's;
#        .gpu/before-REV.tar.xz is `git archive REV -- . ':!docs' | xz`, carried with the bundle)
# Logs under $OUT/r/.  The committed corpus is copied to $OUT/r/corpus, so its open production
# entries are the known bugs and anything new lands in the copy.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:$PWD:${PYTHONPATH:-}
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    setup)
      if [ -f .gpu/site.tar.xz ]; then
        mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn
        echo "bundle unpacked to /tmp/gdn"
      elif [ -d /tmp/gdn/site ]; then
        echo "bundle already in /tmp/gdn (machine kept warm)"
      else
        echo "no bundle: carry .gpu or call within 30 s of the call that unpacked it"; exit 3
      fi
      python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
      { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        python3 -c "import torch,sys,hypothesis; print(sys.version); print('torch', torch.__version__, 'hypothesis', hypothesis.__version__)"
        cat /tmp/gdn/site/BUNDLE_VERSIONS 2>/dev/null; git log -1 --format='commit %H %s' 2>/dev/null; } > "$R/env.txt" 2>&1
      cp -r corpus "$R/corpus" ;;
    before)
      [ -d /tmp/gdn/site ] || { echo "bundle gone from /tmp/gdn"; exit 3; }
      arc=$(ls .gpu/before-*.tar.xz 2>/dev/null | head -1)
      [ -n "$arc" ] || { echo "no .gpu/before-REV.tar.xz carried"; exit 3; }
      rev=$(basename "$arc" .tar.xz); rm -rf /tmp/before && mkdir -p /tmp/before && xz -d < "$arc" | tar x -C /tmp/before
      here=$PWD; cp -r /tmp/before/corpus "$R/corpus-$rev"
      ( cd /tmp/before && python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install-$rev.log" 2>&1 &&
        PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:/tmp/before \
        timeout "${SUITE_S:-420}" python3 -m pytest tests -n "${SUITE_N:-4}" -p no:cacheprovider -q -rfEx \
          --gdn-target production --gdn-corpus "$R/corpus-$rev" --durations=10 > "$R/before.txt" 2>&1
        echo "before ($rev) rc=$?" )
      cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 ;;
    suite)
      [ -d /tmp/gdn/site ] || { echo "bundle gone from /tmp/gdn"; exit 3; }
      timeout "${SUITE_S:-420}" python3 -m pytest tests -n "${SUITE_N:-4}" -p no:cacheprovider -q -rfEx \
        --gdn-target production --gdn-corpus "$R/corpus" --durations=10 ${SUITE_FLAGS:-} > "$R/suite.txt" 2>&1
      echo "suite rc=$?" ;;
    campaign)
      [ -d /tmp/gdn/site ] || { echo "bundle gone from /tmp/gdn"; exit 3; }
      [ -d "$R/corpus" ] || cp -r corpus "$R/corpus"
      timeout "${CAMPAIGN_TO:-560}" gdn-fuzz run --target production --warm-up --seconds "${CAMPAIGN_S:-300}" \
        --corpus "$R/corpus" --json "$R/campaign.json" --record "$R/campaign.jsonl" > "$R/campaign.txt" 2>&1
      echo "campaign rc=$?" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step $(( $(date +%s) - s ))s"
  tail -n 25 "$R/$step.txt" 2>/dev/null | cut -c1-240
done
