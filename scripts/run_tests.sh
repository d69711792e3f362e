#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the C runtime tests (plain, ASAN, UBSAN) and
# the pytest suite. Extra arguments go to pytest. Exit code 5 (no tests ran) fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
make -s -j"$(nproc)" PYTHON=.venv/bin/python ctest
# the C tests again under AddressSanitizer and UBSAN (build-asan/, build-ubsan/; incremental)
make -s -j"$(nproc)" PYTHON=.venv/bin/python asan
make -s -j"$(nproc)" PYTHON=.venv/bin/python ubsan
set +e
.venv/bin/python -m pytest tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
