#!/usr/bin/env bash
# Run the megatron adapter checks on a GPU machine: 1 GPU, then 2 GPUs (TP=2 and DP=2 over NCCL), then a
# short demo on CUDA, then a 2-rank demo (one process per GPU, NCCL) with --serve whose OpenAI-compatible servers
# are probed mid-run. Usage: bash scripts/gpu_megatron_check.sh OUT_DIR   (PYTHONPATH must reach megatron-core,
# flash-attn-4, transitions, fastapi/uvicorn and this checkout; wheels installed under /opt/site, see docs/megatron.md).
# GPU_CHECK_ONLY="name ..." runs only the named steps (e.g. GPU_CHECK_ONLY=demo_cuda2_serve).
set -uo pipefail
out=${1:-gpu-check-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-}:$PWD" NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
status=0
only=${GPU_CHECK_ONLY:-}
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  wanted "$name" || return 0
  echo "=== $name: $*" | tee -a "$out/all.log"
  local t0=$SECONDS
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E '^\{|^\[ *[0-9.]+s\]|^done:|^dp_openai|^probe|Error|error' "$out/$name.log" | grep -v '"traceback"' | cut -c1-1500 | tee -a "$out/all.log"
  echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$out/all.log"
  [ "$rc" -eq 0 ] || status=1
}
{ nvidia-smi -L; python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)'; } 2>&1 | tee -a "$out/all.log"
step gpu1 240 env CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu_megatron_check.py --out "$out/gpu1"
if [ "$ngpu" -ge 2 ]; then
  step gpu2_tp2 200 torchrun --nproc-per-node 2 scripts/gpu_megatron_check.py --tp 2 --out "$out/gpu2_tp2"
  step gpu2_dp2 160 torchrun --nproc-per-node 2 scripts/gpu_megatron_check.py --tp 1 --out "$out/gpu2_dp2"
fi
serve_probe() {  # the demo with --serve in the background; POST /v1/completions to every rank's server mid-run
  local log=$1; shift
  python3 -m colo_fsm.demo "$@" > "$log.demo" 2>&1 &
  local pid=$! urls=""
  for _ in $(seq 1 240); do
    urls=$(grep -m1 '^dp_openai_server_base_urls=' "$log.demo" | cut -d= -f2-)
    [ -n "$urls" ] || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.5
  done
  echo "probe: base urls $urls"
  [ -n "$urls" ] && URLS="$urls" python3 - <<'PY'
import json, os, time, urllib.request
for url in json.loads(os.environ["URLS"]):
    body = json.dumps({"model": "colo-fsm-demo", "prompt": "123>", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.load(r)
    print(f"probe: {url} -> HTTP {r.status} in {time.monotonic() - t:.3f}s text={out['choices'][0]['text']!r} "
          f"finish={out['choices'][0]['finish_reason']} usage={out['usage']}", flush=True)
PY
  local probe=$?
  wait "$pid"
  local rc=$?
  cat "$log.demo"
  [ "$probe" -eq 0 ] && [ "$rc" -eq 0 ]
}
export -f serve_probe
step demo_cuda 150 python3 -m colo_fsm.demo --device cuda --steps 60 --validate-every 20 --checkpoint-every 30 \
  --no-tensorboard --run-dir "$out/demo_run"
if [ "$ngpu" -ge 2 ]; then
  step demo_cuda2_serve 240 bash -c 'serve_probe "$@"' _ "$out/demo_cuda2_serve" --device cuda --ranks 2 --steps 60 --serve \
    --validate-every 20 --checkpoint-every 30 --no-tensorboard --run-dir "$out/demo2_run"
fi
exit $status
