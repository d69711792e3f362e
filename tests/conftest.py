import os
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401  (also registers the device when autoload is off)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CPU's reference results are small computations: one intra-op thread. Its default pool makes
# each tiny CPU op wake threads that compete with the tpu runtime's (and, under pytest-xdist,
# the other worker's) on a 2-core machine.
torch.set_num_threads(1)


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


# The op suites run once per eager mode (issue: one conformance suite for every
# mode). TORCH_TPU_TEST_MODES narrows it, e.g. TORCH_TPU_TEST_MODES=strict.
OP_SUITES = {"test_ops.py", "test_math_ops.py", "test_nn_ops.py", "test_misc_ops.py",
             "test_linalg.py", "test_linalg2.py", "test_numerics.py", "test_more_ops.py", "test_more_ops2.py"}
TEST_MODES = [m for m in os.environ.get("TORCH_TPU_TEST_MODES",
                                        "strict,debug,defer_and_fuse").split(",") if m]


def pytest_generate_tests(metafunc):
    if ("tpu_mode" in metafunc.fixturenames and
            os.path.basename(str(metafunc.definition.fspath)) in OP_SUITES):
        metafunc.parametrize("tpu_mode", TEST_MODES, indirect=True)


@pytest.fixture(autouse=True)
def tpu_mode(request):
    """The eager mode an op-suite test runs in (see TEST_MODES)."""
    mode = getattr(request, "param", None)
    if mode is None:
        yield None
        return
    with torch_tpu.eager_mode(mode):
        yield mode
        torch.tpu.synchronize()


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def mode(request):
    """Runs the test once per eager mode, all three (reliability suites)."""
    torch.tpu.synchronize()
    with torch_tpu.eager_mode(request.param):
        yield request.param
        torch.tpu.synchronize()
    torch.tpu.synchronize()


@pytest.fixture
def defer():
    """runs the test body in DeferAndFuse mode (tests of the trace and the fusion compiler)"""
    torch.tpu.synchronize()
    with torch_tpu.eager_mode("defer_and_fuse"):
        yield
    torch.tpu.synchronize()


@pytest.fixture
def highest_precision():
    """float32 matmuls at precision highest for the test (model comparisons against CPU at
    1e-5), without the performance warning; the previous precision afterwards."""
    import warnings
    old = torch.get_float32_matmul_precision()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)
