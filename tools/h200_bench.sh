#!/usr/bin/env bash
# Issue 10 throughput measurements on one H200 (benchmarks/throughput.py; docs/benchmarks.md).
# Assumes the environment and `pip install -e .` are done (tools/h200_session.sh / h200_x2.sh
# set-up).  Writes under "$OUT/r/"; the whole script stays under ~230 s of wall time
# (every step has a cap from what is left of BUDGET_S; the table writes its JSON after every
# row, so a capped step keeps what it measured).
#
#   OUT=/tmp/out bash tools/h200_bench.sh            (CUDA_VISIBLE_DEVICES picks the GPU)
#
# Steps, in order of importance:
#   1. campaign: the `launch` property over every arm, T in {4, 8}, the default GPU fuzz
#      geometries (1,1) (1,2) (16,64) and buckets 4, 8; warm-up pays all 60 JIT compiles
#      outside the clock, then 30 s measured (--draws device), then 10 s with CPU draws
#      (device-independent bits) for comparison, then 5 s under cProfile
#   2. table (bf16, fp16): production kernel, H=16 HV=64, B in {8, 64, 256}, T in {4, 8}:
#      bare wrapper+kernel, materialize, oracle, checked; overhead = checked / bare;
#      Cases draw their bulk tensors on the GPU (--draws device); 12 JIT compiles
#   3. table, one shape with CPU draws (bf16, T=4, B=64): what the CPU random draw costs
#   4. table, the other three arms (capped by what is left)
#   5. the reference target on the CPU (H=1 HV=2, bf16 fp16), as in docs/benchmarks.md
#   6. torch.profiler operator table of one checked launch per shape (bf16, T=4, B 8 64 256)
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-230}
export PYTHONUNBUFFERED=1
t0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
B="$PY benchmarks/throughput.py --target production --device cuda"
step() {  # step NAME CAP_S CMD...: run under min(CAP_S, time left), log to $R/bench-NAME.txt
  local name=$1 cap=$2; shift 2
  local l; l=$(left); (( l < cap )) && cap=$l
  if (( cap < 10 )); then echo "$name: skipped (budget spent)"; return; fi
  local s; s=$(date +%s)
  timeout "$cap" "$@" > "$R/bench-$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - s ))s (cap ${cap}s)"
  tail -n 16 "$R/bench-$name.txt" | cut -c1-200
}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; git rev-parse HEAD; } \
  > "$R/bench-env.txt" 2>&1

step campaign 165 $B --campaign 30 --draws device --compare-draws 10 --profile cprofile --profile-seconds 5 \
  --json "$R/bench-campaign.json"
step table-main 75 $B --H 16 --HV 64 --arms bf16 fp16 --T 4 8 --B 8 64 256 --reps 5 --draws device \
  --max-seconds $(( $(left) - 25 )) --json "$R/bench-table-main.json"
step table-cpudraws 25 $B --H 16 --HV 64 --arms bf16 --T 4 --B 64 --reps 3 --draws cpu \
  --json "$R/bench-table-cpudraws.json"
step table-other-arms 45 $B --H 16 --HV 64 --arms bf16-state16 bf16-ring16 bf16-state16-ring16 --T 4 8 \
  --B 8 64 256 --reps 3 --draws device --max-seconds 25 --json "$R/bench-table-other-arms.json"
step cpu-reference 25 $PY benchmarks/throughput.py --target reference --device cpu --H 1 --HV 2 --arms bf16 fp16 \
  --B 8 64 256 --reps 3 --max-seconds 15 --json "$R/bench-cpu-reference.json"
step profile-torch 20 $B --H 16 --HV 64 --arms bf16 --T 4 --B 8 64 256 --reps 1 --draws device --profile torch \
  --json "$R/bench-profile-torch.json"
echo "bench total $(( $(date +%s) - t0 ))s"
