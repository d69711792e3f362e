#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the C runtime tests (plain, ASAN, UBSAN) and
# the pytest suite. Extra arguments go to pytest. Exit code 5 (no tests ran) fails.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
stage() { echo "[run_tests] $1 done at $((SECONDS - t0)) s" >&2; }
scripts/setup.sh
stage setup
make -s -j"$(nproc)" PYTHON=.venv/bin/python ctest
stage "C tests"
# the C tests again under AddressSanitizer + UBSAN, one build (build-sanc/; incremental)
make -s -j"$(nproc)" PYTHON=.venv/bin/python san
stage "sanitized C tests"
set +e
# one pytest worker per core (pytest-xdist); TORCH_TPU_TEST_JOBS=0 runs in this process
jobs=${TORCH_TPU_TEST_JOBS:-$(nproc)}
par=()
[ "$jobs" -gt 1 ] && par=(-n "$jobs")
.venv/bin/python -m pytest tests "${par[@]}" --durations=25 "$@"
rc=$?
set -e
stage pytest
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
