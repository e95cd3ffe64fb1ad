#!/usr/bin/env bash
# Round 3 on one H200, megatron-core's coordinator mode (~6-7 min; each coordinator bring-up costs ~20 s there): the coordinator adapter's GPU tests, then
# bench/engine_paths.py: bench/inflight_handoff.py with both engine paths, direct and coordinator (park = megatron's
# pause, drain, sync), side by side in one run.
# Run from the folder holding colo_fsm/, tests/ and bench/, with megatron-core + flash-attn-4, pyzmq and
# msgpack (wheelhouse.sh pyzmq==27.3.0 msgpack==1.2.4) and fastapi/uvicorn importable, OUT set.
# ONLY="pytest bench" picks steps; each has its own timeout; no new step starts past BUDGET_S seconds.
set -u
out=${OUT:-gpu-coord-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
budget=${BUDGET_S:-450}
log="$out/coord.log"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null; cat COMMIT 2>/dev/null
  python3 -c 'import torch, megatron.core as m, zmq, msgpack; print("torch", torch.__version__, "megatron-core", m.__version__, "pyzmq", zmq.__version__, "msgpack", msgpack.version)'; } 2>&1 | tee -a "$log"
step() {  # step NAME TIMEOUT MIN_LEFT CMD...
  local name=$1 t=$2 need=$3; shift 3
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$need" ]; then echo "=== $name: SKIPPED ($left s left of the budget)" | tee -a "$log"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  echo "=== $name (timeout ${t}s): $*" | tee -a "$log"
  local t0=$SECONDS
  timeout "$t" "$@" >> "$log" 2>&1
  echo "=== $name: rc=$? in $((SECONDS - t0))s (at ${SECONDS}s)" | tee -a "$log"
}
only=${ONLY:-"pytest bench"}
for s in $only; do
  case $s in
    pytest) step pytest_coordinator "${PYTEST_T:-220}" 60 python3 -m pytest -q -m gpu -rA -s -p no:cacheprovider \
        tests/test_megatron_coordinator_gpu.py --junitxml "$out/pytest_coordinator.xml" ;;
    bench) step engine_paths "${BENCH_T:-250}" 120 python3 bench/engine_paths.py --device cuda --model gpt200m \
        ${BENCH_ARGS:---quick --steps 4 --warmup 1 --rounds 1 --buffer-gb 4 --modes park,drain,sync --mode-budget-s 20} \
        --out "$out/engine_paths_coordinator.json" ;;
    probe) step probe 240 120 python3 scripts/gpu_probe_coordinator.py --out "$out" ;;
    # more than one GPU (not in the default list): experts over 2 GPUs, then tensor parallel
    multi_ep) step multi_ep 240 120 torchrun --nproc-per-node 2 scripts/gpu_coordinator_multi.py --ep 2 ;;
    multi_tp) step multi_tp 240 120 torchrun --nproc-per-node 2 scripts/gpu_coordinator_multi.py --tp 2 ;;
  esac
done
grep -E '^\||^===|PASSED|FAILED|passed|failed|Error|wrote|ratio|step_wall|suspend/resume|^ *(park|drain|sync|batcher|coordinator)' "$log" \
  | grep -v Traceback | cut -c1-300 | tail -120
