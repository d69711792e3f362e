"""Finding a PJRT plugin for the pjrt target (TORCH_TPU_TARGET=pjrt).

The runtime loads the plugin named by TORCH_TPU_PJRT_PLUGIN. When that is not set,
`find()` picks one of the installed plugins, looking in this order and taking the
first that is installed and whose hardware is present:

1. ``tpu``: the ``libtpu`` package (``libtpu/libtpu.so``), when the machine has TPU
   chips (``/dev/accel*`` or ``/dev/vfio/<n>`` device nodes, as on TPU VMs);
2. ``cuda``: JAX's CUDA plugins (``jax_plugins/xla_cuda13`` or ``xla_cuda12``,
   ``xla_cuda_plugin.so``), when an NVIDIA device node (``/dev/nvidia0``) exists;
3. ``cpu``: the XLA CPU plugin of the ``xla-cpu-pjrt`` package
   (``xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so``), which runs anywhere.

Packages are located without importing them (importing JAX's plugins would start
JAX). `installed()` lists every plugin found with whether its hardware is present.
"""
import glob
import importlib.util
import os

__all__ = ["find", "installed", "Plugin"]


class Plugin:
    """An installed PJRT plugin: its kind ("tpu", "cuda", "cpu"), path and whether
    the machine has the hardware it drives."""

    def __init__(self, kind, path, hardware):
        self.kind, self.path, self.hardware = kind, path, hardware

    def __repr__(self):
        return f"Plugin({self.kind!r}, {self.path!r}, hardware={self.hardware})"


def _package_dir(name):
    """the directory of package `name` (dotted), or None; nothing is imported
    except the parents of a dotted name, which are namespace packages here"""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locs = list(spec.submodule_search_locations)
        return locs[0] if locs else None
    return os.path.dirname(spec.origin) if spec.origin else None


def _has_tpu(dev_root):
    return bool(glob.glob(os.path.join(dev_root, "accel*")) or
                [p for p in glob.glob(os.path.join(dev_root, "vfio", "*"))
                 if os.path.basename(p).isdigit()])


def _has_nvidia(dev_root):
    return os.path.exists(os.path.join(dev_root, "nvidia0"))


def installed(dev_root="/dev"):
    """every installed plugin, in the order find() prefers them"""
    found = []
    d = _package_dir("libtpu")
    if d and os.path.isfile(os.path.join(d, "libtpu.so")):
        found.append(Plugin("tpu", os.path.join(d, "libtpu.so"), _has_tpu(dev_root)))
    for mod in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        d = _package_dir(mod)
        if d and os.path.isfile(os.path.join(d, "xla_cuda_plugin.so")):
            found.append(Plugin("cuda", os.path.join(d, "xla_cuda_plugin.so"),
                                _has_nvidia(dev_root)))
    d = _package_dir("xla_plugins.xla_cpu_pjrt")
    if d and os.path.isfile(os.path.join(d, "xla_cpu_pjrt.so")):
        found.append(Plugin("cpu", os.path.join(d, "xla_cpu_pjrt.so"), True))
    return found


def find(dev_root="/dev"):
    """the plugin path the pjrt target loads: TORCH_TPU_PJRT_PLUGIN when set, else the
    first installed plugin whose hardware is present; raises RuntimeError naming what
    was looked for when there is none"""
    env = os.environ.get("TORCH_TPU_PJRT_PLUGIN")
    if env:
        return env
    plugins = installed(dev_root)
    for p in plugins:
        if p.hardware:
            return p.path
    seen = ", ".join(f"{p.kind} at {p.path} (no hardware)" for p in plugins) or "none"
    raise RuntimeError(
        "TORCH_TPU_TARGET=pjrt: no usable PJRT plugin. Set TORCH_TPU_PJRT_PLUGIN=PATH, or "
        "install one: 'pip install xla-cpu-pjrt' (XLA on the CPU), 'libtpu' (TPU VMs) or "
        f"'jax-cuda13-pjrt' (NVIDIA GPUs). Installed plugins: {seen}")
