"""The target is chosen once at start-up from TORCH_TPU_TARGET (default host).

Each case starts a fresh interpreter, since the choice is made when the bridge
library loads: an unknown name fails `import torch` (autoload) and an explicit
`import torch_tpu` with a Python exception naming the value and the known
targets, never an abort; the default and "host" run ops (Strict and
DeferAndFuse, through the target's kernels and graph entries).
"""
import os
import subprocess
import sys

import torch_tpu

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torch_tpu.__file__)))

RUN_OPS = """
import torch, torch_tpu
x = torch.arange(6.0, device="tpu").reshape(2, 3)
print("target", torch_tpu._C.target())
print("strict", (x * 2 + 1).sum().item())
with torch_tpu.eager_mode("defer_and_fuse"):
    y = (x + 1) * 3 - x
print("defer", y.cpu().tolist())
"""


def run(code, target, autoload=True, timeout=180):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TORCH_TPU_TARGET", None)
    if target is not None:
        env["TORCH_TPU_TARGET"] = target
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=timeout)


def check_runs_on_host(r):
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "target host" in lines
    assert "strict 36.0" in lines  # sum(2 * [0..5] + 1)
    assert "defer [[3.0, 5.0, 7.0], [9.0, 11.0, 13.0]]" in lines


def test_default_target_is_host():
    check_runs_on_host(run(RUN_OPS, None))


def test_host_by_name_and_empty_means_default():
    check_runs_on_host(run(RUN_OPS, "host"))
    check_runs_on_host(run(RUN_OPS, ""))


def test_unknown_target_fails_the_import_naming_it():
    r = run("import torch", "tpu-v9000")
    assert r.returncode == 1, r.stdout + r.stderr  # a Python exception, not a signal
    assert "Traceback" in r.stderr
    assert "TORCH_TPU_TARGET='tpu-v9000' is not a known target (known targets: host, pjrt)" in r.stderr
    assert "Failed to load the backend extension: torch_tpu" in r.stderr  # torch's autoload


def test_unknown_target_explicit_import_raises_import_error():
    code = """
import torch
try:
    import torch_tpu._C
except ImportError as e:
    print("ImportError:", e)
else:
    print("imported")
"""
    r = run(code, "Host", autoload=False)  # names are exact
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("ImportError: TORCH_TPU_TARGET='Host' is not a known target (known targets: host, pjrt)"
            in r.stdout), r.stdout
