#!/usr/bin/env bash
# Issue 19 on a lent H200 host: `gdn-fuzz run --ray` with one actor per GPU, a planted kernel edit found
# and stored once, and the throughput of one process / N processes / N Ray actors (benchmarks/fleet.py).
#   bash tools/h200_fleet.sh setup graphs suite     (first call: carries .gpu, unpacks it to /tmp/gdn; the GPU suite)
#   bash tools/h200_fleet.sh ray gpu planted kill bench
#                                            (next call, within 30 s, carrying .ray: tools/make-ray-bundle.sh)
# Logs under $OUT/f/.  The committed corpus is copied to $OUT/f/corpus (its open production entries are the
# known bugs); the planted edit's campaign writes to an empty $OUT/f/corpus-planted.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/f; mkdir -p "$R"
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/ray/site:/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:$PWD:${PYTHONPATH:-}
S=${S:-60}
for step in "$@"; do
  s=$(date +%s)
  case "$step" in
    setup)
      if [ -f .gpu/site.tar.xz ]; then
        mkdir -p /tmp/gdn && xz -d -T0 < .gpu/site.tar.xz | tar x -C /tmp/gdn && echo "bundle unpacked to /tmp/gdn"
      elif [ -d /tmp/gdn/site ]; then echo "bundle already in /tmp/gdn (machine kept warm)"
      else echo "no bundle: carry .gpu or call within 30 s of the call that unpacked it"; exit 3; fi
      python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
      { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
        python3 -c "import torch,sys,hypothesis; print(sys.version); print('torch', torch.__version__, 'hypothesis', hypothesis.__version__)"
        git log -1 --format='commit %H %s' 2>/dev/null; } > "$R/env.txt" 2>&1
      cp -r corpus "$R/corpus" ;;
    ray)
      [ -d /tmp/gdn/site ] || { echo "FlashInfer bundle gone from /tmp/gdn (the machine was not kept warm)"; exit 3; }
      if [ -f .ray/site.tar.xz ]; then
        mkdir -p /tmp/ray && xz -d -T0 < .ray/site.tar.xz | tar x -C /tmp/ray && echo "ray bundle unpacked to /tmp/ray"
      elif [ -d /tmp/ray/site ]; then echo "ray bundle already in /tmp/ray"
      else echo "no ray bundle: carry .ray (tools/make-ray-bundle.sh)"; exit 3; fi
      python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 3; }
      [ -d "$R/corpus" ] || cp -r corpus "$R/corpus"
      python3 -c "import ray; print('ray', ray.__version__)" > "$R/ray.txt" 2>&1; cat "$R/ray.txt" ;;
    suite)
      timeout "${SUITE_S:-400}" python3 -m pytest tests -n "${SUITE_N:-6}" -p no:cacheprovider -v -rfEx \
        --gdn-target production --gdn-corpus "$R/corpus" --durations=10 > "$R/suite.txt" 2>&1
      echo "suite rc=$?" ;;
    graphs)  # the CUDA-graph test alone, one process, GRAPH_RUNS times (it failed once inside the -n 6 suite)
      for i in $(seq 1 "${GRAPH_RUNS:-3}"); do
        timeout 300 python3 -m pytest tests/test_serving_harness.py -k cuda_graph_replay -p no:cacheprovider -q \
          --tb=long --gdn-target production >> "$R/graphs.txt" 2>&1
        echo "graphs run $i rc=$?" | tee -a "$R/graphs.txt"
      done ;;
    gpu)  # one actor per GPU of a local cluster, the released kernel, the committed corpus's known bugs
      timeout $((S + 240)) gdn-fuzz run --ray local --target production --warm-up --seconds "$S" \
        --corpus "$R/corpus" --json "$R/gpu.json" > "$R/gpu.txt" 2>&1
      echo "gpu rc=$?" ;;
    planted)  # a one-line edit of the released kernel file, two actors per GPU: found, stored once
      mkdir -p "$R/corpus-planted"
      timeout $((S + 240)) gdn-fuzz run --ray local --processes 2 --target mutant:${MUTANT:-prod_anchor_lane_p} \
        --arms bf16 --property launch --warm-up --seconds "$S" --corpus "$R/corpus-planted" \
        --json "$R/planted.json" > "$R/planted.txt" 2>&1
      echo "planted rc=$? (1: the edit was found)"; ls "$R/corpus-planted" ;;
    kill)  # SIGKILL of the actor mid-run: its loss recorded with its in-flight case, a restart that rechecks it
      timeout $((S + 240)) gdn-fuzz run --ray local --target production --seconds "${KILL_RUN_S:-45}" \
        --corpus "$R/corpus" --json "$R/kill.json" > "$R/kill.txt" 2>&1 &
      drv=$!
      for _ in $(seq 1 240); do
        pid=$(grep -m1 -o 'worker ray0 started: pid [0-9]*' "$R/kill.txt" 2>/dev/null | grep -o '[0-9]*$')
        [ -n "$pid" ] && break; sleep 0.5
      done
      sleep "${KILL_AFTER_S:-20}"
      echo "SIGKILL actor pid ${pid:-none} at $(( $(date +%s) - s )) s" | tee -a "$R/kill.txt"
      [ -n "$pid" ] && kill -9 "$pid"
      wait $drv; echo "kill rc=$? (0: nothing new, the worker restarted)" ;;
    bench)  # examples/s: one process, N processes, N actors (one cluster started by the benchmark)
      timeout 560 python3 benchmarks/fleet.py --device cuda --target production --seconds "${BENCH_S:-30}" \
        --actors ${ACTORS:-1 8} --cpus "$(nproc)" --out "$R/bench.json" > "$R/bench.txt" 2>&1
      echo "bench rc=$?" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "$step $(( $(date +%s) - s ))s"
  tail -n 30 "$R/$step.txt" 2>/dev/null | cut -c1-240
done
