#!/usr/bin/env bash
# Builds the runtime and the bridge with AddressSanitizer + UndefinedBehaviorSanitizer into
# build-san/ (the bridge as build-san/pkg/torch_tpu/_C.so beside a copy of the Python package;
# the normal build is untouched), then runs a Python workload against it: the example GPT for a
# few steps in each eager mode and a few ops. Prints the number of sanitizer reports; exit
# status 1 when there is any.
#   scripts/sanitize.sh [PYTHON]      (default .venv/bin/python; STEPS=3 by default)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-.venv/bin/python}}
STEPS=${STEPS:-3}
OUT=build-san
FLAGS="-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer"
make -s -j"$(nproc)" PYTHON="$PY" BUILD="$OUT" SO="$OUT/pkg/torch_tpu/_C.so" \
  CFLAGS="$FLAGS" CXXFLAGS="$FLAGS" bridge || exit 2
# the package beside the sanitized bridge (Python files copied, so the normal _C.so is not seen)
(cd torch_tpu && find . -name '*.py' -not -path './csrc/*' -print0 |
  while IFS= read -r -d '' f; do mkdir -p "../$OUT/pkg/torch_tpu/$(dirname "$f")";
    cp "$f" "../$OUT/pkg/torch_tpu/$f"; done)
LOGS=$OUT/logs
rm -rf "$LOGS"; mkdir -p "$LOGS"
ASAN_LIB=$(${CC:-gcc} -print-file-name=libasan.so)
CXX_LIB=$(${CXX:-g++} -print-file-name=libstdc++.so)
# Python itself leaks by design: leak checking off; every other report is logged.
export ASAN_OPTIONS="detect_leaks=0:log_path=$PWD/$LOGS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$PWD/$LOGS/ubsan"
export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="$PWD/$OUT/cache"
export TORCH_TPU_TIER2_COMPILATION_CACHE=sanitize
run() {  # run NAME ENV... -- CMD...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $name"
  env "${envs[@]}" LD_PRELOAD="$ASAN_LIB $CXX_LIB" PYTHONPATH="$PWD/$OUT/pkg:$PWD" \
    "$PY" "$@" > "$LOGS/$name.out" 2>&1
  local rc=$?
  tail -n 2 "$LOGS/$name.out"
  [ $rc -eq 0 ] || { echo "   exit status $rc"; FAILED=1; }
}
FAILED=0
# Every workload starts from a script inside $OUT: `python -` or `-c` would put the checkout
# (with the normal _C.so) first on sys.path. The wrapper checks that the sanitized bridge is
# the one loaded, then runs the given script.
cat > "$OUT/run_sanitized.py" <<'EOF'
import os, runpy, sys
import torch_tpu
assert torch_tpu._C.__file__.startswith(os.path.abspath("build-san")), torch_tpu._C.__file__
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
EOF
GPT=("$OUT/run_sanitized.py" examples/train_gpt.py --steps "$STEPS" --log-every 1 --n-layer 2 --n-embd 64 --block-size 32
     --batch-size 8 --precision highest)
run gpt_strict -- "${GPT[@]}"
run gpt_debug TORCH_TPU_LAUNCH_BLOCKING=1 -- "${GPT[@]}"
run gpt_defer TORCH_TPU_DEFER_AND_FUSE=1 -- "${GPT[@]}"
cat > "$OUT/ops_workload.py" <<'EOF'
import torch, torch_tpu
for mode in ("strict", "debug", "defer_and_fuse"):
    with torch_tpu.eager_mode(mode):
        x = torch.randn(64, 33, device="tpu")
        y = (x.t() @ x).softmax(-1).log_softmax(0)[::2].sum(0)
        z = torch.cat([x, x[:5]]).index_select(0, torch.arange(10, device="tpu")).cumsum(1)
        torch.fill(torch.empty(7, device="tpu"), 2.0)
        x[x > 0] = 0.5
        try:
            x.index_select(0, torch.tensor([100], device="tpu")).cpu()
        except (IndexError, RuntimeError):
            pass
        print(mode, float(y.sum()), float(z.sum()), float(x.sum()))
EOF
run ops -- "$OUT/run_sanitized.py" "$OUT/ops_workload.py"
n_asan=$(cat "$LOGS"/asan.* 2>/dev/null | grep -c "ERROR: AddressSanitizer")
n_ubsan=$(cat "$LOGS"/ubsan.* 2>/dev/null | grep -c "runtime error:")
echo "sanitizer reports: ASAN $n_asan, UBSAN $n_ubsan (logs in $LOGS/)"
cat "$LOGS"/ubsan.* 2>/dev/null | grep "runtime error:" | sort | uniq -c | head -20
cat "$LOGS"/asan.* 2>/dev/null | grep -A3 "ERROR: AddressSanitizer" | head -40
[ "$n_asan" -eq 0 ] && [ "$n_ubsan" -eq 0 ] && [ $FAILED -eq 0 ]
