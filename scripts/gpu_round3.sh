#!/usr/bin/env bash
# This round's GPU evidence on one H200, in two calls of under 10 minutes each (run from the repo root, with
# megatron-core + flash-attn-4, pyzmq, msgpack, fastapi and uvicorn importable; see docs/megatron.md):
#   OUT=... bash scripts/gpu_round3.sh tests   # pytest -m gpu (engine, trainer, coordinator) + NCCL fingerprint
#   OUT=... bash scripts/gpu_round3.sh bench   # reasoning workload (MODES, default park,abort) + coordinator paths
# Each stage has its own timeout and writes under $OUT as it goes, so a cut run keeps what it measured.
set -u
phase=${1:?tests or bench}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0 LOCAL_RANK=0
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
log="$OUT/round3_$phase.log"
{ date -u; git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } | tee -a "$log"
stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  echo "=== $name (timeout ${t}s)" | tee -a "$log"
  local t0=$SECONDS
  timeout "$t" "$@" >>"$log" 2>&1
  echo "=== $name: rc=$? in $((SECONDS - t0))s" | tee -a "$log"
}
case $phase in
  tests)
    stage pytest_gpu "${PYTEST_T:-420}" python3 -m pytest -q -m gpu -rA -p no:cacheprovider -o addopts= \
      tests/test_megatron_engine.py tests/test_megatron_trainer_gpu.py tests/test_megatron_coordinator_gpu.py \
      --junitxml "$OUT/pytest_gpu.xml"
    stage fingerprint_nccl 90 python3 bench/fingerprint_barrier.py --backend nccl --ranks 1 --quick \
      --json "$OUT/fingerprint_barrier_nccl.json"
    grep -E "passed|failed|PASSED|FAILED|ERROR|ratio|rows" "$log" | cut -c1-240 | tail -60 ;;
  bench)
    stage reasoning "${REASONING_T:-300}" python3 bench/inflight_handoff.py --device cuda --workload reasoning \
      --model gpt200m --modes "${MODES:-park,abort}" --mode-budget-s "${MODE_BUDGET_S:-70}" --max-len 8192 \
      --max-age 2 --steps 6 --no-graph-baseline \
      --out "$OUT/inflight_handoff_reasoning_gpt200m_cut8192_age2_${MODES:-park,abort}.json"
    stage engine_paths "${PATHS_T:-230}" python3 bench/engine_paths.py --device cuda --model gpt200m --quick \
      --steps 4 --warmup 1 --rounds 1 --buffer-gb 4 --modes park,drain,sync --mode-budget-s 20 \
      --out "$OUT/engine_paths_coordinator.json"
    grep -v -i -E "warn|deprecat|cuda graph warmup" "$log" | grep -E "^===|samples|ratio|park|drain|sync|abort|coordinator|direct|Error" | cut -c1-240 | tail -60 ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
