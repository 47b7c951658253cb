#!/usr/bin/env bash
# Issue 17 on the lent H200: the product command's checked launches per 30 s, the warm-up of a first
# and a second process (CuTe DSL's on-disk kernel cache, CUTE_DSL_CACHE_DIR, fresh before the first),
# and how early every property is reached (per-property table of the --json record).
#   bash tools/h200_throughput.sh [cache|scale]  (after `bash tools/h200_triage.sh setup` in the same call,
#                                                 or on a warm machine that kept /tmp/gdn)
#   cache (default): first and second process, then all properties; scale: one process with
#   --torch-threads 1, then 4 processes at once with --torch-threads 4 each (16 cores);
#   store: the kernel store (gdn_fuzz.targets.kernel_store, a fresh folder): its GPU test, then a
#   first and a second launch-only process (the second should compile nothing and load every kernel);
#   oracle: benchmarks/throughput.py --oracle both (fused vs spec oracle: deviation, ms per shape);
#   product: the product command with its defaults (launch only, then all properties), each also with
#   --seeds-per-example 4
# Logs and JSON under $OUT/r/.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/gdn/site:/tmp/gdn/site/nvidia_cutlass_dsl/dsl_packages:$PWD:${PYTHONPATH:-}
[ -d /tmp/gdn/site ] || { echo "bundle gone from /tmp/gdn"; exit 3; }
export CUTE_DSL_CACHE_DIR=${CUTE_DSL_CACHE_DIR:-/tmp/gdn-cute-cache}
rm -rf "$CUTE_DSL_CACHE_DIR"; mkdir -p "$CUTE_DSL_CACHE_DIR"
S=${SECONDS_EACH:-30}
run() {  # run NAME ARGS...: one product command, its log and JSON
  local name=$1; shift; local s=$(date +%s)
  [ -d "$R/corpus" ] || cp -r corpus "$R/corpus"
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > "$R/$name.util" 2>/dev/null &
  local smi=$!
  timeout "${CAP_S:-150}" gdn-fuzz run --target production --warm-up --seconds "$S" --corpus "$R/corpus" \
    --json "$R/$name.json" "$@" > "$R/$name.txt" 2>&1
  local rc=$?; kill "$smi" 2>/dev/null
  echo "$name rc=$rc wall $(( $(date +%s) - s ))s; cache files $(find "$CUTE_DSL_CACHE_DIR" -type f | wc -l)"
  # GPU utilization (nvidia-smi, every 0.5 s): the last S seconds of samples are the measured campaign
  awk -v n=$(( S * 2 )) '{a[NR]=$1} END {s=0; c=0; for (i=NR-n+1; i<=NR; i++) if (i>0) {s+=a[i]; c++};
    if (c) printf "  GPU utilization over the last %d samples: mean %.0f%%\n", c, s/c}' "$R/$name.util"
  python3 - "$R/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ws = d.get("workers") or [d]  # several campaign processes (--processes, --gpus): a merged record
for w in ws:
    print(f"  {w.get('gpu', '-')}: warm-up {w['warmup_s']:.1f}s ({w['warmup_compiles']} compiles); "
          f"{w['examples']} examples / {w['launches']} checked launches in {w['seconds']:.1f}s; "
          f"findings {len(w['findings'])}, known {len(w['known'])}")
if len(ws) > 1:
    print(f"  {len(ws)} processes: {sum(w['launches'] for w in ws)} checked launches in total")
per = {}
for w in ws:
    for p, v in (w.get("per_property") or {}).items():
        a = per.setdefault(p, [0, None])
        a[0] += v["examples"]
        a[1] = v["first_s"] if a[1] is None else min(a[1], v["first_s"])
for p, (n, first) in per.items():
    print(f"  {p:15s} {n:6d} examples, first at {first:.2f}s")
PY
}
export GDN_FUZZ_KERNEL_STORE=${GDN_FUZZ_KERNEL_STORE:-/tmp/gdn-kstore}
case "${1:-cache}" in
  store)
    rm -rf "$GDN_FUZZ_KERNEL_STORE"
    python3 -m pytest -p no:cacheprovider -q -rs tests/test_kernel_store.py > "$R/store-test.txt" 2>&1
    echo "store test rc=$?"; tail -n 5 "$R/store-test.txt"
    rm -rf "$GDN_FUZZ_KERNEL_STORE"
    run store-first --property launch
    echo "  store: $(find "$GDN_FUZZ_KERNEL_STORE" -name '*.o' | wc -l) kernels, $(du -sh "$GDN_FUZZ_KERNEL_STORE" | cut -f1)"
    run store-second --property launch
    grep -h "kernel store" "$R"/store-*.txt | head -5 ;;
  oracle)  # the fused float64 oracle against the spec on the GPU (deviation and time per shape)
    timeout 300 python3 benchmarks/throughput.py --target production --device cuda --H 16 --HV 64 --draws device \
      --B 8 64 --T 4 8 --arms bf16 --reps 5 --oracle both --json "$R/oracle-both.json" > "$R/oracle-both.txt" 2>&1
    echo "oracle rc=$?"; tail -n 20 "$R/oracle-both.txt" | cut -c1-200 ;;
  product)  # the product command as a user types it (defaults: processes per GPU, draws, kernel store)
    run product-launch --property launch
    run product-launch-k4 --property launch --seeds-per-example 4
    run product-all
    run product-all-k4 --seeds-per-example 4 ;;
  profile)  # where a checked launch's time goes: in-process campaign under cProfile and torch.profiler,
    # then the product command in one process with its parent (Hypothesis, isolation) under cProfile
    for how in cprofile torch; do
      timeout 240 python3 benchmarks/throughput.py --target production --device cuda --campaign 15 --draws device \
        --profile $how --profile-seconds 10 --json "$R/profile-$how.json" > "$R/profile-$how.txt" 2>&1
      echo "profile $how rc=$?"; grep -m1 "^campaign: [0-9]" "$R/profile-$how.txt"
    done
    [ -d "$R/corpus" ] || cp -r corpus "$R/corpus"
    timeout 150 python3 -m cProfile -o "$R/parent.prof" -m gdn_fuzz.cli run --target production --warm-up \
      --seconds "$S" --processes 1 --property launch --corpus "$R/corpus" --json "$R/parent.json" > "$R/parent.txt" 2>&1
    echo "parent rc=$?"; tail -n 3 "$R/parent.txt"
    python3 -c "import pstats,sys; s=pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(25); s.sort_stats('cumulative').print_stats(40)" \
      "$R/parent.prof" > "$R/parent-prof.txt" 2>&1 ;;
  final)  # issue 17, third session: per-shape table, launch only at 1 / 4 / auto (8 on 16 cores) processes, all properties
    timeout 200 python3 benchmarks/throughput.py --target production --device cuda --H 16 --HV 64 --draws device \
      --B 8 64 --T 4 --arms bf16 --reps 5 --json "$R/table.json" > "$R/table.txt" 2>&1
    echo "table rc=$?"; tail -n 4 "$R/table.txt" | cut -c1-200
    for n in 1 4; do run "launch-p$n" --property launch --processes "$n"; done
    run launch-auto --property launch
    run all-auto ;;
  mutants)  # the production mutation score (docs/mutation.md), then the suite
    timeout "${MUT_S:-420}" gdn-fuzz mutants --base production --device cuda --budget "${MUT_BUDGET:-40}" \
      --json "$R/mutants.json" > "$R/mutants.txt" 2>&1
    echo "mutants rc=$?"; tail -n 16 "$R/mutants.txt" | cut -c1-200 ;;
  cache)
    run launch-first --property launch
    run launch-second --property launch
    run all-properties ;;
  scale)
    run launch-threads1 --property launch --torch-threads 1
    s0=$(date +%s)
    for i in 0 1 2 3; do run "launch-4procs-$i" --property launch --torch-threads 4 --seed "$i" > "$R/scale-$i.log" 2>&1 & done
    wait; echo "4 processes: wall $(( $(date +%s) - s0 ))s"; cat "$R"/scale-*.log
    python3 - "$R" <<'PY'
import json, sys, glob
ds = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/launch-4procs-*.json"))]
print(f"4 processes: {sum(d['launches'] for d in ds)} checked launches in total, "
      f"{', '.join(str(d['launches']) for d in ds)} each, in {max(d['seconds'] for d in ds):.1f}s")
PY
    ;;
esac
