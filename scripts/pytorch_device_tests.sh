#!/usr/bin/env bash
# Runs PyTorch's own device-generic test files for device tpu and, for comparison, cpu,
# and prints a table per file (tests run, passed on cpu, on tpu, tpu among cpu passes,
# crashes, hangs). The PyTorch sources are never part of this repository:
#
#   scripts/pytorch_device_tests.sh [--test-dir DIR] [--out DIR] [runner options] [FILE[:N] ...]
#
# The test tree is DIR, else $PYTORCH_TEST_DIR, else the test/ folder of Debian trixie's
# `pytorch` source package (2.6.0, the release nearest to our torch that a package
# registry carries), fetched once with `apt-get source --download-only` into
# $PYTORCH_TEST_CACHE (default ~/.cache/torch_tpu_pytorch_tests) and extracted there.
# FILE is a test file name without .py (default: all eleven); FILE:N runs a stable 1-in-N
# sample of it. Runner options (tools/pt_device_tests/run.py --help): --devices cpu,tpu,
# --timeout SECONDS per test, -k EXPR, --sample N, --matmul-precision P (float32 matmul
# precision for the run; default the device's, medium on tpu), --summary-only.
# Results go to --out (default build/pytorch_device_tests): junit XML and a log per file
# and device, summary.md and results.json. Exit status 0 unless the runner itself fails
# (test failures are results, not errors).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py=python3
test_dir="${PYTORCH_TEST_DIR:-}"
out="$repo/build/pytorch_device_tests"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --test-dir) test_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

fetch_tests() {
  # Debian's source package, through apt with a private source list and state folder,
  # so the system's apt configuration is left as it is.
  local cache="${PYTORCH_TEST_CACHE:-$HOME/.cache/torch_tpu_pytorch_tests}"
  local found
  found="$(ls -d "$cache"/src/pytorch-*/test 2>/dev/null | head -n1 || true)"
  if [ -n "$found" ]; then echo "$found"; return; fi
  mkdir -p "$cache/lists/partial" "$cache/src"
  cat > "$cache/trixie-src.sources" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  local opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$cache/parts"
              -o "Dir::State::Lists=$cache/lists")
  mkdir -p "$cache/parts"
  cp "$cache/trixie-src.sources" "$cache/parts/"
  apt-get "${opts[@]}" update >&2
  (cd "$cache/src" && apt-get "${opts[@]}" source --download-only pytorch >&2)
  local orig
  orig="$(ls "$cache"/src/pytorch_*.orig.tar.* | head -n1)"
  # only the test tree: the rest of the sources is not needed
  (cd "$cache/src" && tar -xf "$orig" --wildcards '*/test/*' >&2)
  found="$(ls -d "$cache"/src/*/test | head -n1)"
  local top
  top="$(basename "$(dirname "$found")")"
  case "$top" in pytorch-*) ;; *) mv "$cache/src/$top" "$cache/src/pytorch-$top"; found="$cache/src/pytorch-$top/test" ;; esac
  echo "$found"
}

if [ -z "$test_dir" ]; then
  test_dir="$(fetch_tests)"
fi
[ -f "$test_dir/test_view_ops.py" ] || { echo "no PyTorch test tree at $test_dir" >&2; exit 2; }

# the runner's own needs (per-test timeouts, a worker that is replaced when it dies) and
# what the test files import besides torch (test_nn: hypothesis)
if ! "$py" -c 'import pytest_timeout, xdist, hypothesis, expecttest' 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check pytest-timeout pytest-xdist hypothesis expecttest
fi
mkdir -p "$out"
exec "$py" "$repo/tools/pt_device_tests/run.py" --repo "$repo" --test-dir "$test_dir" --out "$out" "${args[@]}"
