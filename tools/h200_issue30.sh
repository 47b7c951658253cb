#!/usr/bin/env bash
# Issue 30 on the lent H200: the GPU suite on flashinfer-python 0.7.4 and on 0.7.2.post1 from one commit,
# and the release differential 0.7.2.post1 -> 0.7.4.
#   bash tools/h200_issue30.sh setup doctor suite74      (first call: carries .gpu, unpacks it to /tmp/gdn)
# When the bundle and the working tree exceed one call's 64 MiB, split the bundle
# (`split -b 34000000 -d .gpu/site.tar.xz .gpu/part-`), carry .gpu/part-00 in a first call that runs
# `bash tools/h200_issue30.sh part`, then .gpu/part-01 in the next (within 30 s) with `setup ...`.
#   bash tools/h200_issue30.sh suite72                   (next call, within 30 s: /tmp/gdn must still be there)
#   bash tools/h200_issue30.sh diff campaign
# Issue 31 (the prefix materializer): steps pmsuite (tests/test_materialize.py on CUDA), pmdecode (the PMM5
# differential, gdn_fuzz.studies.prefix_decode), pmmutants (`gdn-fuzz mutants --base materialize`), pmcampaign,
# pmserve (tests/test_prefix_serving.py: the prefix cache in the serving harness).
# Issue 32 (the check on the device): g32tests (tests/test_graphs.py and the CUDA tests of the fused oracle's
# measure), g32table / g32camp / g32product (benchmarks/throughput.py's per-shape table, in-process campaign and
# product command, this tree and, with BASE_TAR=.gpu/base.tar (`git archive BASE -o .gpu/base.tar`), the base
# tree side by side), g32replay (the corpus replayed by both trees), g32mutants (the production mutant catalogue),
# firstfind (seconds to the first finding on edited kernels from empty caches, base tree and this tree in turn),
# g32draws (materialize by the draw program replayed as a CUDA graph against draws=cuda, table and campaign),
# g32pipe (the product command's runs, PIPE_RUNS; a tag "base..." runs the base tree), g32phases (one check's
# phases in the worker, benchmarks/check_phases.py), g32mps (the product command without and with a private CUDA MPS
# daemon, the host's CPU sampled), g32fleet (the product command itself, its own --mps), g32fault (a faulting kernel
# under --mps on and off).
# The bundle (shared/gpu/make-offline-bundle.sh) holds 0.7.4 as `flashinfer` and 0.7.2.post1 under
# site/releases/0.7.2.post1; suite72 puts that folder first on PYTHONPATH, so `production` is 0.7.2.post1
# there, and GDN_FUZZ_RELEASES points at a folder naming the 0.7.4 tree, so production@0.7.4 runs too.
# Logs under $OUT/r/.  The committed corpus is copied to $OUT/r/corpus-REL: its open production entries
# are the known bugs, and anything new lands in the copy.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1
SITE=/tmp/gdn/site
BASE_PP=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD
export PYTHONPATH=$BASE_PP:${PYTHONPATH:-}
# the base tree (BASE_TAR: `git archive -o .gpu/base.tar BASE gdn_fuzz oracles strategies benchmarks pyproject.toml`),
# unpacked once to /tmp/base, and the PYTHONPATH that runs it instead of this tree
BASE_PP_TREE=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:/tmp/base
unpack_base() { if [ -n "${BASE_TAR:-}" ] && [ ! -d /tmp/base/gdn_fuzz ]; then mkdir -p /tmp/base && tar xf "$BASE_TAR" -C /tmp/base; fi; }
# the tree a run's TAG names: tree and pp set to the base tree's for a TAG starting with "base" (false when it is not
# unpacked), to this tree's otherwise
pick_tree() {
  tree=$PWD; pp=$PYTHONPATH
  [[ "$1" == base* ]] || return 0
  [ -d /tmp/base/gdn_fuzz ] || return 1
  tree=/tmp/base; pp=$BASE_PP_TREE
}
need_bundle() { [ -d $SITE ] || { echo "bundle gone from /tmp/gdn: carry .gpu and run setup again"; exit 3; }; }
# the GPU's utilization (nvidia-smi, 250 ms) and the host's CPU (/proc/stat, 1 s) sampled into $R/NAME-smi.csv and
# $R/NAME-cpu.txt while a run lasts: samplers_start NAME ... samplers_stop
samplers_start() {
  nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 250 > "$R/$1-smi.csv" 2>&1 &
  smi=$!
  (while sleep 1; do head -n 1 /proc/stat; done) > "$R/$1-cpu.txt" 2>&1 &
  cpu=$!
}
samplers_stop() { kill $smi $cpu 2>/dev/null; wait $smi $cpu 2>/dev/null; return 0; }
# keep process p0's per-example record only, under folder $1 (the call's archive must stay under ~20 MB to come back:
# run 88's fleet call, with all eight records, was 21 MB and did not)
keep_p0_records() { find "$1" -name "${2:-*}.jsonl.*" ! -name '*.p0' -delete 2>/dev/null; return 0; }
mps_env() { { command -v nvidia-cuda-mps-control; nvidia-smi -q | grep -i -m2 "compute mode"; nproc; } > "$R/$1-env.txt" 2>&1; }
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    part)
      mkdir -p /tmp/gdnparts && cp .gpu/part-* /tmp/gdnparts/ && ls -l /tmp/gdnparts ;;
    setup)
      if [ ! -f .gpu/site.tar.xz ] && ls .gpu/part-* > /dev/null 2>&1 && [ -d /tmp/gdnparts ]; then
        cp .gpu/part-* /tmp/gdnparts/ && cat /tmp/gdnparts/part-* > /tmp/gdnparts/site.tar.xz
        mkdir -p /tmp/gdn && xz -d -T0 < /tmp/gdnparts/site.tar.xz | tar x -C /tmp/gdn && echo "bundle (in parts) unpacked to /tmp/gdn"
      elif [ -f .gpu/site.tar.xz ]; then
        mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn && echo "bundle unpacked to /tmp/gdn"
      elif [ -d $SITE ]; then
        echo "bundle already in /tmp/gdn (machine kept warm)"
      else
        echo "no bundle: carry .gpu or call within 30 s of the call that unpacked it"; exit 3
      fi
      mkdir -p /tmp/gdn/rel && ln -sfn $SITE /tmp/gdn/rel/0.7.4
      python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
      { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        python3 -c "import torch,sys,hypothesis; print(sys.version); print('torch', torch.__version__, 'hypothesis', hypothesis.__version__)"
        lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|MHz" ; nproc
        cat $SITE/BUNDLE_VERSIONS 2>/dev/null; echo "tree: commit ${GDN_COMMIT:-unknown (pass GDN_COMMIT=\$(git rev-parse HEAD))}"; } > "$R/env.txt" 2>&1 ;;
    doctor)
      need_bundle; timeout 120 gdn-fuzz doctor > "$R/doctor.txt" 2>&1 ;;
    suite74|suite72)
      need_bundle
      rel=0.7.4; pp=$BASE_PP
      if [ "$step" = suite72 ]; then rel=0.7.2.post1; pp=$SITE/releases/0.7.2.post1:$BASE_PP; fi
      rm -rf "$R/corpus-$rel" && cp -r corpus "$R/corpus-$rel"
      PYTHONPATH=$pp GDN_FUZZ_RELEASES=/tmp/gdn/rel timeout "${SUITE_S:-560}" python3 -m pytest tests -n "${SUITE_N:-8}" \
        -p no:cacheprovider -q -rfEsx --gdn-target production --gdn-corpus "$R/corpus-$rel" --durations=15 \
        ${SUITE_FLAGS:-} > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    focus74|focus72)
      # chosen tests alone (FOCUS: pytest arguments), on 0.7.4 or with 0.7.2.post1 first on PYTHONPATH
      need_bundle; pp=$BASE_PP; [ "$step" = focus72 ] && pp=$SITE/releases/0.7.2.post1:$BASE_PP
      PYTHONPATH=$pp GDN_FUZZ_RELEASES=/tmp/gdn/rel timeout 300 python3 -m pytest $FOCUS -p no:cacheprovider -q -rfEsx \
        --gdn-target production > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    diff)
      need_bundle
      timeout 300 gdn-fuzz diff 0.7.2.post1 0.7.4 --device cuda --examples "${DIFF_N:-200}" \
        --markdown "$R/diff-cuda.md" --json "$R/diff-cuda.json" > "$R/diff.txt" 2>&1
      echo "diff (cuda) rc=$?"
      timeout 200 gdn-fuzz diff 0.7.2.post1 0.7.4 --host-device cpu --examples 0 \
        --markdown "$R/diff-cpu-tensors.md" --json "$R/diff-cpu-tensors.json" >> "$R/diff.txt" 2>&1
      echo "diff (cpu tensors) rc=$?" ;;
    campaign)
      need_bundle; [ -d "$R/corpus-0.7.4" ] || cp -r corpus "$R/corpus-0.7.4"
      timeout "$(( ${CAMPAIGN_S:-60} + 120 ))" gdn-fuzz run --target production --warm-up --seconds "${CAMPAIGN_S:-60}" \
        --corpus "$R/corpus-0.7.4" --json "$R/campaign.json" > "$R/campaign.txt" 2>&1
      echo "campaign rc=$?" ;;
    pmsuite)
      # issue 31: the prefix materializer's tests on the GPU (FlashInfer's gdn_prefix_materialize, every arm, both rings)
      need_bundle
      timeout "${PM_SUITE_S:-400}" python3 -m pytest tests/test_materialize.py -n "${PM_N:-4}" -p no:cacheprovider -q -rfEsx \
        --gdn-target materialize --gdn-device cuda --durations=10 > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pmdecode)
      need_bundle
      timeout 300 python3 -m gdn_fuzz.studies.prefix_decode --examples "${PM_DECODE_N:-8}" --device cuda \
        --json "$R/pmdecode.json" > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pmmutants)
      need_bundle
      timeout 560 gdn-fuzz mutants --base materialize --device cuda --budget "${PM_MUT_S:-25}" ${PM_ONLY:+--only $PM_ONLY} \
        --json "$R/pmmutants.json" > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pmcampaign)
      need_bundle; mkdir -p "$R/corpus-pm"
      timeout "$(( ${PM_S:-90} + 150 ))" gdn-fuzz run --target materialize --warm-up --seconds "${PM_S:-90}" \
        --corpus "$R/corpus-pm" --json "$R/pmcampaign.json" > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pmserve)
      # issue 31: the prefix cache in the serving harness (production + materialize on CUDA, every arm)
      need_bundle
      timeout "${PM_SERVE_S:-400}" python3 -m pytest tests/test_prefix_serving.py -n "${PM_N:-4}" -p no:cacheprovider -q \
        -rfEsx --gdn-target production --gdn-device cuda --durations=10 > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pmunguarded)
      # issue 31: slot numbers the materializer does not validate, each scenario in an isolated worker
      need_bundle
      timeout 300 gdn-fuzz unguarded --target materialize --device cuda --json "$R/pmunguarded.json" \
        > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    editgrace)
      # issue 32: the product command on edited kernels (bf16, default processes, default --shrink-grace): when does
      # the first finding come, and is every finding shrunk
      need_bundle
      for m in ${GRACE_MUTANTS:-prod_anchor_lane_p prod_fold_no_bdec prod_beta_no_sigmoid}; do
        timeout "$(( ${GRACE_S:-45} + 120 ))" gdn-fuzz run --target "mutant:$m" --arms bf16 --seconds "${GRACE_S:-45}" \
          --no-corpus --json "$R/grace-$m.json" > "$R/grace-$m.txt" 2>&1
        echo "editgrace $m rc=$?"
      done ;;
    firstfind)
      # issue 32: seconds to the first finding on an edited kernel with a fresh machine's caches (an empty Triton
      # cache and kernel store for each run), the product command (bf16, default processes and --shrink-grace).
      # FIRST_TREES: base (BASE_TAR), new (this tree), nospare (this tree, GDN_FUZZ_SPARE_WORKER=off), defer (this
      # tree, GDN_FUZZ_DEFER_VERDICTS=on); their
      # order is reversed for every second mutant, so that neither tree always runs first; FIRST_TAG goes into the
      # log names (repeated runs in one call); FIRST_RECORD=1: each worker's per-example record too (--record)
      need_bundle
      unpack_base
      i=0; seen_m=""
      for m in ${FIRST_MUTANTS:-prod_beta_no_sigmoid prod_fold_no_bdec}; do
        trees=${FIRST_TREES:-base new}; [ $((i % 2)) = 1 ] && trees=$(echo $trees | tr ' ' '\n' | tac | tr '\n' ' ')
        i=$((i + 1))
        # a mutant named again in FIRST_MUTANTS gets its own log names (run 91's third run wrote over its first)
        rep=""; seen=" ${seen_m:-} "; [[ "$seen" == *" $m "* ]] && rep="-$i"; seen_m="${seen_m:-} $m"
        for tree in $trees; do
          d=/tmp/fresh/$tree-$m; rm -rf "$d"; mkdir -p "$d"
          dir=$PWD; pp=$PYTHONPATH; spare=auto
          [ "$tree" = base ] && { dir=/tmp/base; pp=$BASE_PP_TREE; }
          [ "$tree" = nospare ] && spare=off
          dv=off; [ "$tree" = defer ] && dv=on
          s1=$(date +%s)
          (cd "$dir" && PYTHONPATH=$pp TRITON_CACHE_DIR=$d/triton GDN_FUZZ_KERNEL_STORE=$d/kernels \
            GDN_FUZZ_SPARE_WORKER=$spare GDN_FUZZ_DEFER_VERDICTS=$dv timeout "$(( ${FIRST_S:-30} + 120 ))" python3 -m gdn_fuzz.cli run \
            --target "mutant:$m" --arms bf16 --seconds "${FIRST_S:-30}" --no-corpus --json "$R/first${FIRST_TAG:-}-$tree-$m$rep.json" \
            ${FIRST_RECORD:+--record "$R/first${FIRST_TAG:-}-$tree-$m$rep.jsonl"}) \
            > "$R/first${FIRST_TAG:-}-$tree-$m$rep.txt" 2>&1
          echo "firstfind $tree $m rc=$? wall=$(( $(date +%s) - s1 ))s"
          keep_p0_records "$R" "first${FIRST_TAG:-}-$tree-$m$rep"
          grep -m1 "^failure" "$R/first${FIRST_TAG:-}-$tree-$m$rep.txt" | cut -c1-160
          # the findings (first failing example, shrunk or not) and each worker's confirmations
          python3 - "$R/first${FIRST_TAG:-}-$tree-$m$rep.json" <<'PY' 2>&1 | tee "$R/first${FIRST_TAG:-}-$tree-$m$rep-summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
fs = r["findings"]
print(f"findings {len(fs)}, shrunk {sum(bool(f['shrunk']) for f in fs)}, first failure "
      f"{min((f['first_failure_s'] for f in fs), default=None)}, launches {r['totals'].get('launches')}")
for f in sorted(fs, key=lambda f: f["first_failure_s"]):
    print(f"  {f['first_failure_s']:6.1f} s {f['worker']:8} shrunk={f['shrunk']!s:5} {f['signature'][:110]}")
for w in r["workers"]:
    c = w.get("confirmations") or []
    print(f"  {w['worker']}: {w['launches']} launches, {len(c)} confirmations, {sum(x['check_s'] for x in c):.1f} s, "
          f"unconfirmed {len(w.get('unconfirmed') or {})}, grace {w.get('grace_used_s')}, "
          f"waited for confirmations {w.get('confirm_wait_s')}, seconds {w.get('seconds')}")
PY
        done
      done ;;
    g32tests)
      # issue 32: the comparison in the fused oracle's kernel and the CUDA-graph replay of the check, on the GPU
      need_bundle
      timeout 400 python3 -m pytest tests/test_graphs.py tests/test_fused_oracle.py tests/test_draw_program.py \
        tests/test_pool_scale.py -p no:cacheprovider -q -rfEsx \
        -k "${G32_K:-cuda or graph or replay or same_with or static or eager or key or draw or prefetching or reserved}" \
        > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    g32table|g32table_*|g32camp|g32camp_*|g32product|g32product_*)
      # issue 32: this tree and the base tree (BASE_TAR, unpacked to /tmp/base) side by side in one run;
      # g32table_2 etc.: the same step again, its logs named by the whole step name (repeated runs in one call);
      # TABLE_DRAW: g32table's draw mode (device, the earlier runs' default; graph, what `gdn-fuzz run` draws on a GPU)
      need_bundle
      unpack_base
      common="--target production --device cuda --arms bf16"
      case "${step%%_*}" in
        g32table) args="$common --H 16 --HV 64 --B 8 64 --T 4 --draws ${TABLE_DRAW:-device} --reps ${REPS:-5} ${PROFILE:+--profile $PROFILE}"
          new_args="--graphs both" ;;
        g32camp) args="$common --campaign ${CAMP_S:-15} --draws device"; new_args="" ;;
        g32product) args="$common --product ${PRODUCT_S:-30} --processes ${PROCS:-1 8}"; new_args="" ;;
      esac
      timeout 560 python3 benchmarks/throughput.py $args $new_args --json "$R/$step-new.json" > "$R/$step-new.txt" 2>&1
      echo "$step new rc=$?"; tail -n 6 "$R/$step-new.txt" | cut -c1-240
      if [ "$step" = g32camp ]; then
        GDN_FUZZ_GRAPHS=off timeout 300 python3 benchmarks/throughput.py $args --graphs off --json "$R/$step-off.json" \
          > "$R/$step-off.txt" 2>&1
        echo "$step off rc=$?"; tail -n 3 "$R/$step-off.txt" | cut -c1-240
      fi
      if [ -d /tmp/base/gdn_fuzz ] && [ -z "${NO_BASE:-}" ]; then
        (cd /tmp/base && PYTHONPATH=$BASE_PP_TREE timeout 560 python3 \
          benchmarks/throughput.py $args --json "$R/$step-base.json") > "$R/$step-base.txt" 2>&1
        echo "$step base rc=$?"; tail -n 4 "$R/$step-base.txt" | cut -c1-240
      fi ;;
    g32draws|g32draws_*)
      # issue 32: materialize by the draw program a CUDA graph replays (draws=graph, the GPU default since) against
      # the draws=cuda path, one tree, in turn: the per-shape table, then the in-process campaign
      need_bundle
      for d in ${TABLE_DRAWS-cuda graph}; do  # TABLE_DRAWS="": the campaigns only
        timeout 280 python3 benchmarks/throughput.py --target production --device cuda --arms bf16 --H 16 --HV 64 \
          --B 8 64 --T 4 --reps ${REPS:-5} --draws $d --json "$R/$step-table-$d.json" > "$R/$step-table-$d.txt" 2>&1
        echo "$step table $d rc=$?"; tail -n 3 "$R/$step-table-$d.txt" | cut -c1-240
      done
      for d in cuda graph; do
        timeout 200 python3 benchmarks/throughput.py --target production --device cuda --arms bf16 \
          --campaign ${CAMP_S:-15} --draws $d --json "$R/$step-camp-$d.json" > "$R/$step-camp-$d.txt" 2>&1
        echo "$step camp $d rc=$?"; grep "^campaign:" "$R/$step-camp-$d.txt" | cut -c1-240
      done ;;
    g32tiling)
      # issue 32: GPU time of the fused oracle's kernel per (block_v, num_warps), measure and history, B 8 and 64
      need_bundle
      # TILING_ARGS: e.g. "--block-v 8 16 --warps 1 2" (default: the script's tilings); BASE_TILING_ARGS: the base
      # tree's, where it lacks an option of this tree's (--variants); TILING_ARGS by default
      timeout "${TILING_S:-400}" python3 benchmarks/oracle_tiling.py --target production --B 8 64 ${TILING_ARGS:-} \
        --json "$R/$step.json" > "$R/$step.txt" 2>&1
      echo "$step rc=$?"
      unpack_base
      if [ -d /tmp/base/gdn_fuzz ] && [ -z "${NO_BASE:-}" ]; then  # the base tree's kernel, same tilings, same call
        (cd /tmp/base && PYTHONPATH=$BASE_PP_TREE timeout 300 python3 \
          benchmarks/oracle_tiling.py --target production --B 8 64 ${BASE_TILING_ARGS-${TILING_ARGS:-}} \
          --json "$R/$step-base.json") \
          > "$R/$step-base.txt" 2>&1
        echo "$step base rc=$?"; tail -n 12 "$R/$step-base.txt" | cut -c1-200
      fi ;;
    g32replay)
      need_bundle
      unpack_base
      rm -rf "$R/corpus-new" && cp -r corpus "$R/corpus-new"
      timeout 250 gdn-fuzz replay --device cuda "$R/corpus-new" > "$R/$step-new.txt" 2>&1; echo "$step new rc=$?"
      if [ -d /tmp/base/gdn_fuzz ]; then
        rm -rf "$R/corpus-base" && cp -r corpus "$R/corpus-base"
        (cd /tmp/base && PYTHONPATH=$BASE_PP_TREE timeout 250 python3 -m \
          gdn_fuzz.cli replay --device cuda "$R/corpus-base") > "$R/$step-base.txt" 2>&1; echo "$step base rc=$?"
      fi ;;
    g32where)
      # issue 32: where the product command's time goes (one process, bf16): each example's seconds in the record
      # (t, and check_s: the isolated worker's check, IPC included), with the default pool scales and without,
      # the GPU's utilization sampled by nvidia-smi every 250 ms meanwhile; then the in-process campaign under
      # cProfile (Hypothesis against the check, on the host)
      need_bundle
      for ps in default none; do
        extra=""; [ "$ps" = none ] && extra="--pool-scales none"
        nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 250 > "$R/$step-smi-$ps.csv" 2>&1 &
        smi=$!
        timeout 300 python3 benchmarks/throughput.py --target production --device cuda --arms bf16 \
          --product "${PRODUCT_S:-30}" --processes ${WHERE_PROCS:-1} $extra --record-dir "$R/$step-rec-$ps" \
          --json "$R/$step-$ps.json" > "$R/$step-$ps.txt" 2>&1
        echo "$step $ps rc=$?"; kill $smi 2>/dev/null; tail -n 2 "$R/$step-$ps.txt" | cut -c1-240
      done
      timeout 300 python3 benchmarks/throughput.py --target production --device cuda --arms bf16 \
        --campaign "${CAMP_S:-15}" --draws device --profile cprofile --profile-seconds "${PROF_S:-10}" \
        --json "$R/$step-camp.json" > "$R/$step-camp.txt" 2>&1
      echo "$step camp rc=$?"; grep "^campaign:" "$R/$step-camp.txt" | cut -c1-240 ;;
    g32pipe)
      # issue 32: the product command (bf16) with one round at a time against rounds at once (--pipeline), each
      # run's per-example record and the GPU's utilization; PIPE_RUNS: "PIPELINE:POOLSCALES:PROCESSES[:TAG[:K]] ..."
      # (K: value seeds per drawn structure, --seeds-per-example; empty: the command's default)
      # a TAG starting with "base" runs the base tree (BASE_TAR, unpacked to /tmp/base) in that slot; a TAG containing
      # "defer" runs with deferred verdicts (GDN_FUZZ_DEFER_VERDICTS=on; PIPELINE must be 1 or auto); a TAG containing
      # "ahead" (not "noahead"): the worker draws a case sent ahead (GDN_FUZZ_DRAW_AHEAD=on; off otherwise; run 90 ran
      # when the default was on for a GPU, and named the runs without it "noahead"); "depthN" (N in 1-4): the deferred
      # worker holds N cases beyond the one it runs (GDN_FUZZ_DEFER_DEPTH; default 2 since run 93, 1 before)
      need_bundle
      unpack_base
      for run in ${PIPE_RUNS:-1:none:1 2:none:1 2:none:1:b 1:none:1:b}; do
        IFS=: read -r pl ps np tag k <<< "$run"
        name="$step-p$pl-$ps-n$np${k:+-k$k}${tag:+-$tag}"; extra=""; [ "$ps" != default ] && extra="--pool-scales $ps"
        # a run named twice in PIPE_RUNS keeps both runs' logs (run 93's second runs wrote over the first's)
        rep=2; base_name=$name; while [ -e "$R/$name.txt" ]; do name="$base_name-$rep"; rep=$((rep + 1)); done
        [ -n "$k" ] && extra="$extra --seeds-per-example $k"
        pick_tree "$tag" || { echo "$name: no base tree (BASE_TAR)"; continue; }
        if [ -n "${STACKS:-}" ]; then  # every Python process of the run samples its threads' stacks (tools/stack_sampler)
          mkdir -p "$R/$name-stacks"; export GDN_STACKS_DIR="$R/$name-stacks"; pp=$PWD/tools/stack_sampler:$pp
        fi
        nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 250 > "$R/$name-smi.csv" 2>&1 &
        smi=$!
        dv=off; [[ "$tag" == *defer* ]] && dv=on
        da=off; [[ "$tag" == *ahead* && "$tag" != *noahead* ]] && da=on
        dd=""; [[ "$tag" =~ depth([1-4]) ]] && dd=${BASH_REMATCH[1]}
        (cd "$tree" && PYTHONPATH=$pp GDN_FUZZ_DEFER_VERDICTS=$dv GDN_FUZZ_DRAW_AHEAD=$da GDN_FUZZ_DEFER_DEPTH=$dd timeout 300 python3 benchmarks/throughput.py \
          --target production --device cuda \
          --arms bf16 --product "${PRODUCT_S:-30}" --processes "$np" --pipeline "$pl" $extra --record-dir "$R/$name-rec" \
          --json "$R/$name.json") > "$R/$name.txt" 2>&1
        echo "$name rc=$?"; kill $smi 2>/dev/null; tail -n 1 "$R/$name.txt" | cut -c1-200; unset GDN_STACKS_DIR
      done ;;
    g32mps)
      # issue 32: the product command (bf16, default pool scales) with each worker's own CUDA context (off) against
      # one shared context under a private CUDA MPS daemon (on: its pipe and log folders under /tmp/gdn-mps, stopped
      # after the run; the GPU's settings, compute mode included, are not touched), the GPU's utilization and the
      # host's CPU (/proc/stat, 1 s) sampled meanwhile; MPS_RUNS: "MODE:PROCESSES ..."
      need_bundle
      mps_env "$step"
      for run in ${MPS_RUNS:-off:8 on:8}; do
        IFS=: read -r mode np <<< "$run"; name="$step-$mode-n$np"
        if [ "$mode" = on ]; then
          export CUDA_MPS_PIPE_DIRECTORY=/tmp/gdn-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/gdn-mps/log
          mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
          nvidia-cuda-mps-control -d >> "$R/$name-mps.txt" 2>&1; echo "mps daemon rc=$?" >> "$R/$name-mps.txt"
        fi
        samplers_start "$name"
        dv=off; [[ "$tag" == *defer* ]] && dv=on
        GDN_FUZZ_DEFER_VERDICTS=$dv timeout 300 python3 benchmarks/throughput.py --target production --device cuda --arms bf16 \
          --product "${PRODUCT_S:-30}" --processes "$np" --json "$R/$name.json" > "$R/$name.txt" 2>&1
        echo "$name rc=$?"; samplers_stop; tail -n 1 "$R/$name.txt" | cut -c1-200
        if [ "$mode" = on ]; then
          echo quit | nvidia-cuda-mps-control >> "$R/$name-mps.txt" 2>&1; sleep 2
          cp -r $CUDA_MPS_LOG_DIRECTORY "$R/$name-mpslog" 2>/dev/null; rm -rf /tmp/gdn-mps
          unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        fi
      done ;;
    g32fleet)
      # issue 32: the product command itself (`gdn-fuzz run --processes N`, one fleet: benchmarks/throughput.py
      # --product --fleet), bf16, launch, default pool scales, with its own MPS decision (--mps MODE); the GPU's
      # utilization and the host's CPU (/proc/stat, 1 s) sampled; FLEET_RUNS: "MODE:PROCESSES[:TAG] ..." (a TAG
      # starting with "base": the base tree, BASE_TAR unpacked to /tmp/base, in that slot)
      need_bundle
      unpack_base
      mps_env "$step"
      i=0
      for run in ${FLEET_RUNS:-on:8 off:8}; do
        # the run's index in the name: repeated runs of one mode keep their own records (run 87 lost two to this)
        i=$((i + 1)); IFS=: read -r mode np tag <<< "$run"; name="$step-$i-$mode-n$np${tag:+-$tag}"
        pick_tree "$tag" || { echo "$name: no base tree (BASE_TAR)"; continue; }
        samplers_start "$name"
        (cd "$tree" && PYTHONPATH=$pp timeout 300 python3 benchmarks/throughput.py --target production --device cuda \
          --arms bf16 --product "${PRODUCT_S:-30}" --fleet --mps "$mode" --processes "$np" --record-dir "$R/$name-rec" \
          --json "$R/$name.json") > "$R/$name.txt" 2>&1
        echo "$name rc=$?"; samplers_stop; tail -n 1 "$R/$name.txt" | cut -c1-240
        keep_p0_records "$R/$name-rec"
      done ;;
    g32fault)
      # issue 32: a kernel that faults (gpu_oob_full_window: an out-of-bounds access on a full window) under the
      # product command with its MPS daemon (on) and without (off): the new findings, each worker's MPS story
      # (when it left, the cases checked again in its own context), lost workers; FAULT_RUNS: "MODE ..."
      need_bundle
      for mode in ${FAULT_RUNS:-on off}; do
        name="$step-$mode"
        timeout 300 python3 -m gdn_fuzz.cli run --target mutant:gpu_oob_full_window --arms bf16 \
          --seconds "${FAULT_S:-30}" --no-corpus --mps "$mode" --json "$R/$name.json" > "$R/$name.txt" 2>&1
        echo "$name rc=$?"
        python3 - "$R/$name.json" <<'PY' 2>&1 | tee "$R/$name-summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("mps:", r.get("mps"), "| lost:", len(r.get("lost", [])), "| failed:", r.get("failed"))
print("new:", sorted({f["signature"] for f in r["findings"]}))
for w in r["workers"]:
    m = w.get("mps") or {}
    print(w["worker"], "launches", w["launches"], "unconfirmed", sorted(w.get("unconfirmed") or {}), "left", m.get("left"),
          "rechecks", [(x["seen"], x["found"], x["s"], x.get("spare")) for x in m.get("rechecks", [])])
PY
      done ;;
    g32phases|g32phases_*)
      # issue 32: one check's time in the worker, phase by phase (benchmarks/check_phases.py: host time, then each
      # phase synchronized), the isolated worker's round trip against its own seconds, then cProfile and
      # torch.profiler passes over the same checks; g32phases_scales: the pool-scale cases only (PHASES_SCALES,
      # default "thousands int32"; PHASES_SCALES_N cases, default 32; no isolated pass)
      need_bundle
      extra="--isolated"; n=${PHASES_N:-300}
      [[ "$step" == g32phases_scales* ]] && { extra="--pool-scales ${PHASES_SCALES:-thousands int32}"; n=${PHASES_SCALES_N:-32}; }
      # a step name holding "base" (g32phases_scales_base): the base tree (BASE_TAR, unpacked to /tmp/base)
      tree=$PWD; pp=$PYTHONPATH
      if [[ "$step" == *base* ]]; then
        unpack_base
        tree=/tmp/base; pp=$BASE_PP_TREE
      fi
      (cd "$tree" && PYTHONPATH=$pp timeout 400 python3 benchmarks/check_phases.py --target production --device cuda \
        --n "$n" --sync $extra --profile ${PHASES_PROFILE-cprofile torch} --json "$R/$step.json") > "$R/$step.txt" 2>&1
      echo "$step rc=$?"; grep -E "^(per check|isolated|[0-9]+ cases)" "$R/$step.txt" | cut -c1-240 ;;
    g32overhead)
      # issue 32: the campaign process's own seconds per example (Hypothesis' draw and the bookkeeping, a stand-in
      # check that passes at once: benchmarks/campaign_overhead.py) on this machine's CPU, this tree, then the base's
      need_bundle
      timeout 200 python3 benchmarks/campaign_overhead.py --seconds "${OVER_S:-10}" --profile 25 \
        --json "$R/$step-new.json" > "$R/$step-new.txt" 2>&1
      echo "$step new rc=$?"; grep -E "^(plain|campaign)" "$R/$step-new.txt" | cut -c1-240
      # the campaign's isolated path with a stand-in worker check of OVER_CHECK_MS (default 2.5, about a real small
      # check's worker time): deferred and waiting, 1 and 4 value seeds per drawn structure
      timeout 200 python3 benchmarks/campaign_overhead.py --isolated --seconds "${OVER_S:-10}" \
        --check-ms "${OVER_CHECK_MS:-2.5}" --json "$R/$step-isolated.json" > "$R/$step-isolated.txt" 2>&1
      echo "$step isolated rc=$?"; grep -E "^isolated" "$R/$step-isolated.txt" | cut -c1-240 ;;
    g32mutants)
      need_bundle
      timeout 560 gdn-fuzz mutants --base production --device cuda --budget "${MUT_S:-25}" --json "$R/$step.json" \
        > "$R/$step.txt" 2>&1
      echo "$step rc=$?" ;;
    pack)
      # the device returns a few files per call: everything under $R in one archive
      # (a pack between steps keeps what ran if a later step runs past the call's limit: logs-1.tgz, logs-2.tgz ...)
      n=$(ls "$OUT"/logs*.tgz 2>/dev/null | wc -l); name=logs.tgz; [ "$n" -gt 0 ] && name=logs-$n.tgz
      tar czf "$OUT/$name" -C "$OUT" r && rm -rf "$R" && mkdir -p "$R" && ls -l "$OUT" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step $(( $(date +%s) - s ))s"
  tail -n 25 "$R/$step.txt" 2>/dev/null | cut -c1-240
done
