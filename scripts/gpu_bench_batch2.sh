#!/usr/bin/env bash
# Batch 2 of the H200 benchmarks: the request-level engine on the GPU (pytest -m gpu, park probe through the
# adapter), the collector's in-flight handoff bench, the NCCL fingerprint barrier (world size 1), and the
# graph-mode reruns (resident vs rebuild, colocated vs dedicated in one process, memory with graphs).
# Run from the folder holding colo_fsm/ and bench/ with megatron-core + flash-attn-4 importable and OUT set.
# ONLY="name ..." picks steps; each has its own timeout; no new step starts past BUDGET_S seconds.
set -u
out=${OUT:-gpu-bench-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
budget=${BUDGET_S:-540}
log="$out/all.log"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null; cat COMMIT 2>/dev/null
  python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)'; } 2>&1 | tee -a "$log"
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
only=${ONLY:-"inflight pytest barrier park rebuild colo memory"}
for s in $only; do
  case $s in
    inflight) step inflight_handoff "${INFLIGHT_T:-330}" 120 python3 bench/inflight_handoff.py --device cuda --model gpt200m \
        ${INFLIGHT_ARGS:---quick --steps 10 --rounds 2 --cuda-graphs 16 --buffer-gb 4} --out "$out/inflight_handoff.json" ;;
    pytest) step pytest_gpu 150 60 python3 -m pytest -q -m gpu -rA -p no:cacheprovider tests/test_megatron_engine.py tests/test_megatron_model.py ;;
    barrier) step fingerprint_barrier 90 30 python3 bench/fingerprint_barrier.py --backend nccl --ranks 1 ${BARRIER_ARGS:-} --json "$out/fingerprint_barrier.json" ;;
    park) step park_probe 200 90 python3 bench/park_probe.py --out "$out/park_probe.json" ;;
    park_offload_eager) step park_probe_offload_eager 90 40 python3 bench/park_probe.py --graphs off --modes offload --skip-decode --out "$out/park_probe_offload_eager.json" ;;
    rebuild) step resident_vs_rebuild 150 70 python3 bench/resident_vs_rebuild.py --graphs on --scope block --graph-cycles 3 --graph-rebuilds 2 --out "$out/resident_vs_rebuild_graphs.json" ;;
    colo) step colocated_inprocess 100 50 python3 bench/colocated_vs_dedicated.py --role inprocess --scope block --out "$out/colocated_inprocess.json" ;;
    memory) step memory_peak_graphs 70 40 python3 bench/memory_peak.py --graphs on --scope block --buffer-gb 8 --out "$out/memory_peak_graphs.json" ;;
  esac
done
grep -E '^\||^---|^===|PASSED|FAILED|passed|failed|speedup|Error|wrote|^ *(park|drain|sync) ' "$log" | grep -v Traceback | cut -c1-300 | tail -150
