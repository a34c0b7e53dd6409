#!/usr/bin/env bash
# Runs the whole test suite; "no tests collected" (pytest's exit code 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "test: pytest collected no tests; failing" >&2; exit 1; fi
exit $rc
