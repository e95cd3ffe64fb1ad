#!/usr/bin/env bash
# Run the megatron adapter checks on a GPU machine: 1 GPU, then 2 GPUs (TP=2 and DP=2 over NCCL), then a
# short demo on CUDA. Usage: bash scripts/gpu_megatron_check.sh OUT_DIR   (PYTHONPATH must reach megatron-core,
# flash-attn-4, transitions and this checkout; see ../shared/device/README.md)
set -uo pipefail
out=${1:-gpu-check-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-}:$PWD" NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
status=0
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  echo "=== $name: $*" | tee -a "$out/all.log"
  local t0=$SECONDS
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E '^\{|^\[ *[0-9.]+s\]|^done:|Error|error' "$out/$name.log" | grep -v '"traceback"' | cut -c1-1500 | tee -a "$out/all.log"
  echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$out/all.log"
  [ "$rc" -eq 0 ] || status=1
}
{ nvidia-smi -L; python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)'; } 2>&1 | tee -a "$out/all.log"
step gpu1 240 env CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu_megatron_check.py --out "$out/gpu1"
if [ "$ngpu" -ge 2 ]; then
  step gpu2_tp2 200 torchrun --nproc-per-node 2 scripts/gpu_megatron_check.py --tp 2 --out "$out/gpu2_tp2"
  step gpu2_dp2 160 torchrun --nproc-per-node 2 scripts/gpu_megatron_check.py --tp 1 --out "$out/gpu2_dp2"
fi
step demo_cuda 150 python3 -m colo_fsm.demo --device cuda --steps 60 --validate-every 20 --checkpoint-every 30 \
  --no-tensorboard --run-dir "$out/demo_run"
exit $status
