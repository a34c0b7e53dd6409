#!/usr/bin/env bash
# The checks that need a CUDA device, as one script for a GPU machine that already has torch
# (CI has no GPU; these tests skip there): the gpu-marked tests, then the overhead benchmark on
# the GPU. Logs go to $OUT when it is set (the device tool), else to ./gpu-check-logs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-logs}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NNWATCH_RUN_DIR=$(mktemp -d)
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$out/device.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts="-ra" --timeout 300 \
  tests/integration/test_probe_gpu.py tests/unit/test_grad.py tests/integration/test_probe_bad_input.py 2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
timeout "${GPU_BENCH_SECONDS:-240}" python3 bench/overhead.py --device cuda \
  --rounds "${GPU_BENCH_ROUNDS:-6}" --steps 20 2>&1 | tee "$out/gpu-bench.log"
exit "$tests"
