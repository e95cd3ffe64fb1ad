#!/usr/bin/env bash
# Batch 1 of the H200 benchmarks (one device call). Run from the folder holding colo_fsm/ and bench/, with
# megatron-core + flash-attn-4 importable (wheels installed under /opt/site; see docs/megatron.md) and OUT set to the results folder.
# Each step has its own timeout and the whole batch stops starting new steps past BUDGET_S seconds.
set -u
out=${OUT:-gpu-bench-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
budget=${BUDGET_S:-540}
log="$out/all.log"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)'
  python3 -c 'from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available as d; print(d())'; } 2>&1 | tee -a "$log"
step() {  # step NAME TIMEOUT MIN_LEFT CMD...
  local name=$1 t=$2 need=$3; shift 3
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$need" ]; then echo "=== $name: SKIPPED ($left s left of the batch budget)" | tee -a "$log"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  echo "=== $name (timeout ${t}s): $*" | tee -a "$log"
  local t0=$SECONDS
  timeout "$t" "$@" >> "$log" 2>&1
  echo "=== $name: rc=$? in $((SECONDS - t0))s (batch at ${SECONDS}s)" | tee -a "$log"
}
only=${ONLY:-"graphs colo rebuild memory"}
for s in $only; do
  case $s in
    graphs) step cuda_graph_decode 230 90 python3 bench/cuda_graph_decode.py --out "$out/cuda_graph_decode.json" ;;
    colo) step colocated_vs_dedicated 160 80 python3 bench/colocated_vs_dedicated.py --timeout 78 --out "$out/colocated_vs_dedicated.json" ;;
    rebuild) step resident_vs_rebuild 200 70 python3 bench/resident_vs_rebuild.py ${REBUILD_ARGS:---graph-cycles 2 --graph-rebuilds 1} --out "$out/resident_vs_rebuild.json" ;;
    memory) step memory_peak 70 45 python3 bench/memory_peak.py --graphs off --buffer-gb 8 --out "$out/memory_peak.json" ;;
  esac
done
grep -E '^\||^---|^===|speedup|FAILED|Error|wrote' "$log" | grep -v Traceback | cut -c1-400 | tail -120
