#!/usr/bin/env bash
# One call on a two-GPU H200 host (device kind nvidia-h200-x2), jobs spread over both GPUs.
# Same set-up as tools/h200_session.sh (offline bundle carried as .gpu, repo installed --no-deps),
# then the named phases, each job logging under $OUT/r/, everything packed into $OUT/results.tar.gz.
#
#   bash tools/h200_x2.sh drift serving mutants contract multi
#
#   drift     gdn-fuzz drift on production, one process per (study, T), 5 arms each:
#             mtp/normal and realistic at 32,768 tokens, accept-all at 32,768, accept-one at 8,192,
#             weak+near0 accept-one at 4,096; T=4 on GPU 0, T=8 on GPU 1, in the background
#   serving   tests/test_serving_harness.py on production (eager properties, machine, CUDA graphs)  [GPU 1]
#   mutants   gdn-fuzz mutants --base production (suite vs example-based baseline)              [GPU 0]
#   contract  tests/test_contract_properties.py + tests/test_mutants.py -k production on production [GPU 1]
#   multi     after the above: pytest -n 2 (one xdist worker per GPU) on the GPU property suite +
#             corpus replay, then `gdn-fuzz run --gpus 0,1` and a one-GPU run of the same length
#   triton    bash tools/h200_triton.sh      [GPU 0]      bench  bash tools/h200_bench.sh  [GPU 1]
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1 GDN_FUZZ_PROFILE=${GDN_FUZZ_PROFILE:-ci} OMP_NUM_THREADS=2
t0=$(date +%s)
mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
export GDN_FUZZ_SGLANG_DIR=/tmp/gdn/site/sglang_replayssm
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; python3 -c "import torch,sys; print(sys.version); print('torch', torch.__version__)"; cat /tmp/gdn/site/BUNDLE_VERSIONS; } > "$R/env.txt" 2>&1
echo "setup $(( $(date +%s) - t0 ))s"
el() { echo $(( $(date +%s) - t0 )); }
on() { local g=$1; shift; CUDA_VISIBLE_DEVICES=$g "$@"; }
DRIFT_S=${DRIFT_S:-330}
pids=()
PHASES=" $* "
want() { [[ "$PHASES" == *" $1 "* ]]; }

# drift jobs: GPU:T:accept:regime:tokens:name[:arms,comma,separated] (DRIFT_JOBS overrides the default list)
DEFAULT_DRIFT=""
for T in 4 8; do
  g=$([ $T = 4 ] && echo 0 || echo 1)
  DEFAULT_DRIFT+=" $g:$T:mtp:normal:32768:mtp_normal $g:$T:mtp:realistic:32768:mtp_realistic $g:$T:all:normal:32768:all_normal"
  DEFAULT_DRIFT+=" $g:$T:one:normal:8192:one_normal $g:$T:one:decay=weak,beta=near0:4096:one_weak_near0"
done
if want drift; then
  mkdir -p "$R/drift"
  for job in ${DRIFT_JOBS:-$DEFAULT_DRIFT}; do
    IFS=: read -r g T acc reg tok name arms <<< "$job"
    ( on $g timeout $(( DRIFT_S + 60 )) gdn-fuzz drift --target production --T $T --tokens $tok --accept $acc \
        ${arms:+--arms ${arms//,/ }} \
        --regime $reg --record-every 4 --seconds $DRIFT_S --out "$R/drift/${name}_T$T" > "$R/drift/${name}_T$T.log" 2>&1
      echo "drift $name T=$T rc=$? at $(el)s" ) &
    pids+=($!)
  done
fi
# GPU 0, in sequence
( if want triton; then on 0 timeout ${TRITON_S:-200} bash tools/h200_triton.sh > "$R/triton.txt" 2>&1; echo "triton rc=$? at $(el)s"; fi
  if want mutants; then
    on ${MUTANTS_GPU:-0} timeout ${MUTANTS_S:-420} gdn-fuzz mutants --base production --device cuda --budget ${MUTANT_BUDGET:-30} \
      --only ${MUTANTS:-prod_no_local_g_restart prod_anchor_lane_p prod_fold_no_bdec prod_g_append_restart prod_beta_no_sigmoid prod_lazy_flush_min prod_commit_slides_verify prod_commit_pad_exempt prod_guard_hist_len} \
      --json "$R/mutants-gpu.json" \
      > "$R/mutants-gpu.txt" 2>&1; echo "mutants rc=$? at $(el)s"; fi ) &
pids+=($!)
# GPU 1, in sequence
( if want bench; then on 1 timeout 260 bash tools/h200_bench.sh > "$R/bench.txt" 2>&1; echo "bench rc=$? at $(el)s"; fi
  if want onegpu; then  # the one-GPU reference for the two-GPU campaign of the multi phase (same options)
    mkdir -p "$R/multi"
    on 1 timeout $(( ${MULTI_S:-40} + 90 )) gdn-fuzz run --target production --seconds "${MULTI_S:-40}" \
      --corpus "$R/corpus-x1" --json "$R/multi/one-gpu.json" > "$R/one-gpu.txt" 2>&1; echo "one-gpu rc=$? at $(el)s"; fi
  if want serving; then
    on 1 timeout 200 python3 -m pytest tests/test_serving_harness.py -p no:cacheprovider -q -rA --gdn-target production \
      -k "not planted" --durations=10 > "$R/serving.txt" 2>&1; echo "serving rc=$? at $(el)s"; fi
  if want replay; then  # the committed corpus (open bugs: strict xfail; guards: must pass)
    on 1 timeout 120 python3 -m pytest tests/test_corpus_replay.py -p no:cacheprovider -q -rA --gdn-target production \
      --gdn-corpus-readonly > "$R/replay.txt" 2>&1; echo "replay rc=$? at $(el)s"; fi
  if want contract; then
    on 1 timeout 150 python3 -m pytest tests/test_contract_properties.py tests/test_mutants.py -k "contract or production" \
      -p no:cacheprovider -q -rA --gdn-target production --gdn-corpus "$R/corpus" --hypothesis-show-statistics \
      > "$R/contract.txt" 2>&1; echo "contract rc=$? at $(el)s"; fi ) &
pids+=($!)
wait "${pids[@]}"
echo "phase 1 done at $(el)s"
if want drift; then
  for study in mtp_normal mtp_realistic all_normal one_normal one_weak_near0; do
    [ -f "$R/drift/${study}_T4/drift.json" ] && [ -f "$R/drift/${study}_T8/drift.json" ] && \
      gdn-fuzz drift --merge "$R/drift/${study}_T4/drift.json" "$R/drift/${study}_T8/drift.json" --out "$R/drift/$study" \
        >> "$R/drift/merge.log" 2>&1
  done
  tail -n 3 "$R/drift/merge.log"
fi
if want multi; then
  MS=${MULTI_S:-40}
  timeout ${XDIST_S:-150} python3 -m pytest -n 2 tests/test_launch.py tests/test_relations.py tests/test_corpus_replay.py \
    tests/test_contract_properties.py tests/test_drift.py::test_production_drift_bound \
    -p no:cacheprovider -q -rA --gdn-target production --gdn-corpus "$R/corpus-x2" -k "not planted" \
    > "$R/xdist2.txt" 2>&1; echo "xdist2 rc=$? at $(el)s"
  mkdir -p "$R/multi"
  timeout $(( MS + 90 )) gdn-fuzz run --target production --gpus 0,1 --seconds "$MS" --corpus "$R/corpus-x2" \
    --json "$R/multi/campaign.json" > "$R/multi.txt" 2>&1; echo "multi rc=$? at $(el)s"
fi
for f in serving replay contract mutants-gpu triton bench xdist2 multi one-gpu; do [ -f "$R/$f.txt" ] && { echo "== $f"; tail -n 6 "$R/$f.txt" | cut -c1-200; }; done
# the per-(study, T) drift parts are large: their own archive (the merged studies stay in results)
[ -d "$R/drift" ] && tar czf "$OUT/drift-parts.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d r/drift/*_T[48] 2>/dev/null)
tar czf "$OUT/results.tar.gz" --exclude='r/drift/*_T[48]/drift.json' -C "$OUT" r
ls -la "$OUT"
echo "total $(el)s"
