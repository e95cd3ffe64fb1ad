#!/usr/bin/env bash
# Wheel folders for a GPU machine that reaches no package registry (Python 3.12, x86-64, CUDA 13): megatron-core,
# flash-attn-4 and the CUTLASS DSL it compiles its kernels with, pyzmq (megatron-core's coordinator mode) and the
# OpenAI server's web stack. A remote call carries at most 64 MiB, the repository's tracked files and the folder
# together, so each folder leaves room for the tree (the script checks, at the end):
#   .devwheels/part1   the first 40 MB of the CUTLASS DSL's one large library (xz) and the DSL's wheel (~40 MB)
#   .devwheels/part2   the rest of that library, the rest of the CUTLASS CUDA-13 wheel, the DSL's other wheels,
#                      megatron-core, flash-attn-4, apache-tvm-ffi, pyzmq, fastapi, uvicorn ... (~43 MB)
# Run here, from the repository root (needs pip and a registry). On the GPU machine, from the same root:
#   bash .devwheels/part1/install.sh && bash .devwheels/part2/install.sh   # into /opt/site (COLO_FSM_SITE)
#   export PYTHONPATH=/opt/site:/opt/site/nvidia_cutlass_dsl/dsl_packages:$PWD NCCL_NVLS_ENABLE=0
#   python3 -m bench.gpu --list
# part2's installer exits 3 ("COLD") where part1 is not installed (a machine that was given back meanwhile).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.devwheels
grep -qxF "/$dest/" .gitignore 2>/dev/null || echo "note: $dest/ should be git-ignored" >&2
rm -rf "$dest" && mkdir -p "$dest/part1" "$dest/part2" "$dest/big"
fetch() {  # fetch FOLDER [--deps] PACKAGE==VERSION ...: wheels built for CPython 3.12 on x86-64 Linux
  local folder=$1; shift
  local deps=--no-deps
  if [ "${1:-}" = "--deps" ]; then deps=""; shift; fi
  python3 -m pip download -q $deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$folder" "$@"
}
fetch "$dest/part1" nvidia-cutlass-dsl==4.8.1
# the DSL's other wheels and apache-tvm-ffi (8 MB) travel with part2: part1 beside the tree was refused at 63.7 MiB
fetch "$dest/part2" nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 megatron-core==0.19.2 \
  transitions==0.9.3 flash-attn-4==4.0.0b36 quack-kernels torch-c-dlpack-ext apache-tvm-ffi pyzmq==27.3.0 "$@"
fetch "$dest/part2" --deps fastapi==0.163.2 uvicorn==0.54.0  # with what they import (opentelemetry-api among them)
fetch "$dest/big" nvidia-cutlass-dsl-libs-cu13==4.8.1
# The CUDA-13 CUTLASS wheel (~92 MB) does not fit one folder: its largest library is xz-compressed and split, its
# first 40 MB in part1 and the rest in part2, and everything else it holds goes to part2 as one archive. (Whole, even
# at xz -9e, the library left part1 beside the tree only 0.7 MB under the check below; split, each part has 8 MB or
# more to spare.)
lib=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
python3 -m zipfile -e "$dest"/big/*.whl "$dest/big/tree"
source scripts/wheel_folders.sh
pack_library "$dest/big/tree" "$lib" "$dest" 40000000
rm -rf "$dest/big"
write_installers "$dest" "$lib"
du -sh "$dest/part1" "$dest/part2"
# What one call carries: the tracked files, the untracked ones that git does not ignore, and one folder. The remote
# side counts more than these bytes (a call at 63.7 MiB by this count was refused, one at 60.6 went through), so
# the check keeps 4 MiB spare. du reads the names itself: one total, however many files.
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
for part in part1 part2; do
  size=$(( tree + $(du -sb "$dest/$part" | cut -f1) ))
  echo "$part with the tree: $(( size / 1048576 )) MiB (at most 60 of the 64 a call carries)"
  [ "$size" -le $(( 60 * 1048576 )) ] || { echo "error: $dest/$part and the tree exceed 60 MiB: move a wheel to the other part" >&2; exit 1; }
done
