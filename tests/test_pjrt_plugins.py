"""Finding a PJRT plugin (torch_tpu/pjrt_plugins.py): the documented order, the
hardware checks, TORCH_TPU_PJRT_PLUGIN first, a clear error when there is none.
Fake packages and device nodes in a temporary directory; each case runs in a fresh
interpreter so that the fake packages are found like installed ones."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import json, sys
sys.path.insert(0, {root!r})
import importlib.util
spec = importlib.util.spec_from_file_location("pp", {root!r} + "/torch_tpu/pjrt_plugins.py")
pp = importlib.util.module_from_spec(spec); spec.loader.exec_module(pp)
try:
    path = pp.find({dev!r})
except RuntimeError as e:
    path = "ERROR: " + str(e)
print(json.dumps({{"find": path, "installed": [[p.kind, p.path, p.hardware] for p in pp.installed({dev!r})]}}))
"""


def _fake(tmp_path, packages, devices):
    site = tmp_path / "site"
    for rel in packages:
        f = site / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
        if rel.startswith("libtpu/"):
            (site / "libtpu" / "__init__.py").write_text("")
    dev = tmp_path / "dev"
    for node in devices:
        p = dev / node
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    dev.mkdir(parents=True, exist_ok=True)
    return site, dev


def _probe(site, dev, env=None, isolated=True):
    e = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_PJRT_PLUGIN"}
    e.update(env or {})
    e["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    # -S: no site-packages, so only the fake packages exist (isolated); else both
    args = [sys.executable] + (["-S"] if isolated else []) + [
        "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" +
        PROBE.format(root=ROOT, dev=str(dev))]
    out = subprocess.run(args, capture_output=True, text=True, env=e, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


ALL = ["libtpu/libtpu.so", "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
       "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"]


def test_order_follows_the_hardware(tmp_path):
    site, dev = _fake(tmp_path, ALL, ["accel0", "nvidia0"])
    r = _probe(site, dev)
    assert [k for k, _, _ in r["installed"]] == ["tpu", "cuda", "cpu"]
    assert r["find"].endswith("libtpu/libtpu.so")


def test_no_tpu_chips_takes_the_gpu_then_the_cpu(tmp_path):
    site, dev = _fake(tmp_path, ALL, ["nvidia0"])
    r = _probe(site, dev)
    assert r["find"].endswith("xla_cuda13/xla_cuda_plugin.so")
    assert [h for _, _, h in r["installed"]] == [False, True, True]
    site2, dev2 = _fake(tmp_path / "b", ALL, [])
    assert _probe(site2, dev2)["find"].endswith("xla_cpu_pjrt/xla_cpu_pjrt.so")


def test_vfio_groups_count_as_tpu_chips(tmp_path):
    site, dev = _fake(tmp_path, ALL, ["vfio/0", "vfio/vfio"])
    assert _probe(site, dev)["find"].endswith("libtpu/libtpu.so")
    site2, dev2 = _fake(tmp_path / "b", ALL, ["vfio/vfio"])  # the control node alone: no chip
    assert not _probe(site2, dev2)["find"].endswith("libtpu.so")


def test_the_variable_wins(tmp_path):
    site, dev = _fake(tmp_path, ALL, ["accel0"])
    r = _probe(site, dev, env={"TORCH_TPU_PJRT_PLUGIN": "/opt/my/plugin.so"})
    assert r["find"] == "/opt/my/plugin.so"


def test_none_usable_is_a_clear_error(tmp_path):
    site, dev = _fake(tmp_path, ["libtpu/libtpu.so"], [])
    r = _probe(site, dev)
    assert r["find"].startswith("ERROR: TORCH_TPU_TARGET=pjrt: no usable PJRT plugin")
    assert "TORCH_TPU_PJRT_PLUGIN" in r["find"] and "xla-cpu-pjrt" in r["find"]
    assert "tpu at " in r["find"] and "(no hardware)" in r["find"]
    site2, dev2 = _fake(tmp_path / "b", [], [])
    assert "Installed plugins: none" in _probe(site2, dev2)["find"]


def test_the_installed_cpu_plugin_is_found():
    # the real environment: setup.sh installs xla-cpu-pjrt
    r = _probe(ROOT + "/nonexistent", "/nonexistent-dev", isolated=False)
    assert any(k == "cpu" and os.path.isfile(p) for k, p, _ in r["installed"]), r
    assert r["find"].endswith("xla_cpu_pjrt.so")
