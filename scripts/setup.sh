#!/usr/bin/env bash
# One-time set-up, run by `make demo` and `make test`: a .venv with nnwatch and its test tools.
# torch is not among nnwatch's dependencies (a monitor never needs it), so the demos and the tests
# get it here.
# A torch that the calling python already has is reused, never replaced; otherwise the CPU build
# of torch is installed (set NNWATCH_TORCH_INDEX to pick another wheel index).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.nnwatch-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: reusing the torch that $PY already has"
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found; installing torch 2.13.0 (NNWATCH_TORCH_INDEX picks the wheel index)"
  if [ -n "${NNWATCH_TORCH_INDEX:-}" ]; then
    .venv/bin/python -m pip install -q "torch==2.13.0" --index-url "$NNWATCH_TORCH_INDEX"
  else
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
fi
.venv/bin/python -m pip install -q -e ".[dev]"
touch "$stamp"
