import os
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401  (also registers the device when autoload is off)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, env=None, timeout=120):
    """Runs `code` in a fresh interpreter; returns CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=ROOT)


@pytest.fixture(params=["strict", "debug"])
def eager_mode(request):
    """Runs a test once per eager mode."""
    with torch_tpu.eager_mode(request.param):
        yield request.param
