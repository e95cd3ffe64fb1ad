#!/usr/bin/env bash
# One GPU call (~9 min): the megatron trainer's GPU tests, then the reasoning-workload bench (park, sync, drain,
# abort, each within a time budget, plus the pure graph-decode baseline), results under $OUT.
#
#   OUT=/tmp/out bash scripts/gpu_round3_trainer.sh           # on the H200 (megatron-core + flash-attn importable)
#   OUT=/tmp/out bash scripts/gpu_round3_trainer.sh --dry     # the same plumbing on the CPU in seconds
#
# Knobs (environment): PYTHON (python3), TOTAL_S (540: the whole script's budget), MODEL (gpt200m), MODES
# (park,sync,drain,abort), MODE_BUDGET_S (default: what is left after the tests, split over the modes), MAX_LEN
# (8192), MAX_AGE (2), STEPS (6), TEST_TIMEOUT_S (150), CGD=1 (also re-run bench/cuda_graph_decode.py, layer
# scope, if at least 200 s are left at the end).
# Every stage has its own timeout; the bench rewrites its JSON after each mode, so a cut run keeps its data.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
OUT="${OUT:-$ROOT/gpu-round3-trainer-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export LOCAL_RANK="${LOCAL_RANK:-0}" PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" NCCL_NVLS_ENABLE=0
TOTAL_S="${TOTAL_S:-540}"
MODEL="${MODEL:-gpt200m}"
MODES="${MODES:-park,sync,drain,abort}"
MAX_LEN="${MAX_LEN:-8192}"
MAX_AGE="${MAX_AGE:-2}"
STEPS="${STEPS:-6}"
TEST_TIMEOUT_S="${TEST_TIMEOUT_S:-150}"
T0=$(date +%s)
left() { echo $((TOTAL_S - ($(date +%s) - T0))); }

stage() { echo "=== [$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/stages.log"; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "dry: $DRY"
  "$PY" -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__, 'cuda', torch.cuda.is_available())" 2>&1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. the trainer's GPU tests (megatron-core DDP / optimizer / schedule; DDP param-gather hooks switched at
#    suspend and resume; distributed-optimizer checkpoint). --dry: the CPU tests of the same code, GPU ones skip.
stage "pytest (trainer)"
if [ "$DRY" = 1 ]; then
  TESTS=(tests/test_megatron_trainer_gpu.py tests/test_megatron_microbatch.py)
  MARK="not slow"
else
  TESTS=(tests/test_megatron_trainer_gpu.py)
  MARK="gpu"
fi
timeout "$TEST_TIMEOUT_S" "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -m "$MARK" -rs \
  --junitxml="$OUT/pytest_trainer.xml" "${TESTS[@]}" >"$OUT/pytest_trainer.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/stages.log"
tail -n 15 "$OUT/pytest_trainer.log"

# 2. the reasoning workload: graph-decode baseline first, then each mode within MODE_BUDGET_S
N_MODES=$(echo "$MODES" | tr ',' '\n' | grep -c .)
BENCH_TIMEOUT_S=$(($(left) - 20))
if [ -z "${MODE_BUDGET_S:-}" ]; then  # start-up + graph baseline ~60 s, each mode's build + capture ~25 s
  MODE_BUDGET_S=$(((BENCH_TIMEOUT_S - 60) / N_MODES - 25))
  [ "$MODE_BUDGET_S" -lt 40 ] && MODE_BUDGET_S=40
fi
stage "bench: reasoning workload ($MODEL, cut $MAX_LEN, max age $MAX_AGE, modes $MODES, ${MODE_BUDGET_S}s/mode)"
JSON="$OUT/inflight_handoff_reasoning_${MODEL}_cut${MAX_LEN}_age${MAX_AGE}.json"
if [ "$DRY" = 1 ]; then
  ARGS=(--workload reasoning --smoke --modes "$MODES" --mode-budget-s "$MODE_BUDGET_S" --max-age "$MAX_AGE")
  JSON="$OUT/inflight_handoff_reasoning_smoke.json"
else
  ARGS=(--workload reasoning --model "$MODEL" --modes "$MODES" --mode-budget-s "$MODE_BUDGET_S"
    --max-len "$MAX_LEN" --max-age "$MAX_AGE" --steps "$STEPS")
fi
timeout "$BENCH_TIMEOUT_S" "$PY" bench/inflight_handoff.py "${ARGS[@]}" --out "$JSON" >"$OUT/bench_reasoning.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/stages.log"
grep -v -i -E "warn|deprecat" "$OUT/bench_reasoning.log" | tail -n 30

if [ "${CGD:-0}" = 1 ] && [ "$DRY" = 0 ] && [ "$(left)" -ge 200 ]; then
  stage "cuda_graph_decode (layer scope)"
  timeout $(($(left) - 10)) "$PY" bench/cuda_graph_decode.py --scopes layer --train-steps 2 \
    --out "$OUT/cuda_graph_decode_layer.json" >"$OUT/cuda_graph_decode.log" 2>&1
  echo "cuda_graph_decode rc=$?" | tee -a "$OUT/stages.log"
fi

stage "summary"
"$PY" - "$JSON" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:  # the bench wrote nothing
    print(f"no JSON: {exc}")
    sys.exit(0)
for m, r in d.get("modes", {}).items():
    if "samples_per_s" in r:
        print(f"{m:6} {r['samples_per_s']:8.2f} samples/s  decode {r['decode_tokens_per_s']:8.0f} tok/s  "
              f"engine {r['engine_decode_tokens_per_s']:8.0f} tok/s  steps {r['measured_steps']}  "
              f"draining {r['draining_share']:.2f}  peak {r.get('peak_allocated_gib')} GiB")
    else:
        print(f"{m:6} {r}")
for k in sorted(d):
    if k.startswith("ratio_") or k.startswith("graph_decode_tokens"):
        print(f"{k} = {d[k]:.3f}")
EOF
stage "done in $(($(date +%s) - T0)) s; results in $OUT"
