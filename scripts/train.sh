#!/usr/bin/env bash
# Sets up, then trains the example character-level GPT on device tpu for at
# most two minutes (extra arguments go to examples/train_gpt.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python examples/train_gpt.py --device tpu --max-seconds 120 "$@"
