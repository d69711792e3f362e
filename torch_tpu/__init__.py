"""TorchTPU: a native PyTorch backend for TPU-class accelerators.

Installing the package is enough: PyTorch calls `_autoload` through the
`torch.backends` entry point while `import torch` runs, which renames the
PrivateUse1 device to "tpu", loads the C++/C runtime and registers the
`torch.tpu` module. Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off and
`import torch_tpu` explicitly instead.
"""
import torch

__all__ = ["supported_ops", "set_eager_mode", "get_eager_mode", "eager_mode"]

_registered = False


def _register():
    global _registered
    if _registered:
        return
    _registered = True
    torch.utils.rename_privateuse1_backend("tpu")
    from . import _C  # noqa: F401  (loads the bridge: allocator, guard, hooks, kernels)
    from . import device as _device_module

    torch._register_device_module("tpu", _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)


def _autoload():
    """Entry point called by `import torch` (group `torch.backends`)."""
    _register()


_register()

from ._C import supported_ops as _supported_ops  # noqa: E402
from .modes import eager_mode, get_eager_mode, set_eager_mode  # noqa: E402


def supported_ops():
    """ATen overload names ("aten::add.Tensor", ...) implemented natively."""
    return list(_supported_ops())
