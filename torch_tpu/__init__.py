"""TorchTPU: a native PyTorch backend for TPU-class accelerators.

Installing the package is enough: PyTorch calls `_autoload` through the
`torch.backends` entry point while `import torch` runs, which renames the
PrivateUse1 device to "tpu", loads the C++/C runtime and registers the
`torch.tpu` module. Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off and
`import torch_tpu` explicitly instead.
"""
__all__ = ["supported_ops", "set_eager_mode", "get_eager_mode", "eager_mode", "materialize",
           "debug", "export_stablehlo"]

import os  # noqa: E402

_registered = False


def _register():
    import torch

    global _registered
    if _registered:
        return
    _registered = True
    torch.utils.rename_privateuse1_backend("tpu")
    _prefer_cpp_meta_kernels()
    _register_missing_meta_kernels()
    if os.environ.get("TORCH_TPU_TARGET") == "pjrt" and not os.environ.get("TORCH_TPU_PJRT_PLUGIN"):
        # the runtime loads the plugin that TORCH_TPU_PJRT_PLUGIN names: the discovered one
        from . import pjrt_plugins
        os.environ["TORCH_TPU_PJRT_PLUGIN"] = pjrt_plugins.find()
    from . import _C  # noqa: F401  (loads the bridge: allocator, guard, hooks, kernels)
    from . import device as _device_module

    torch._register_device_module("tpu", _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    torch.set_autocast_dtype("tpu", torch.bfloat16)  # the matrix unit's input type
    from . import precision as _precision

    _precision._install()
    from . import composite_kernels as _composite_kernels

    _composite_kernels._install()
    from . import _everyday

    _everyday._install()  # safetensors' device="tpu"


def _prefer_cpp_meta_kernels():
    """Makes PyTorch's C++ meta kernels the active Meta kernels again.

    The bridge infers every output's shape, strides and dtype by calling the
    op's Meta kernel. torch._meta_registrations overrides most C++ meta kernels
    with Python ones (for FakeTensor), which costs milliseconds per call. The
    C++ kernels are the ones CPU itself uses, so they give CPU's exact
    metadata; the Python ones stay registered where no C++ kernel exists, and
    as Python-dispatcher kernels (OpOverload.py_kernels) for FakeTensor and
    torch.compile, which do not use these registrations.
    """
    import torch
    from torch import _meta_registrations as mr

    from . import _everyday

    lib = getattr(mr, "_meta_lib_dont_use_me_use_register_meta", None)
    if lib is None:
        return
    keys = sorted(lib._op_impls)
    lib._destroy()
    keep = torch.library.Library("aten", "IMPL", "Meta")
    meta = torch._C.DispatchKey.Meta
    for key in keys:
        ns, name, _ = key.split("/")
        qual = f"{ns}::{name}"
        if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "Meta"):
            continue  # a C++ meta kernel is active again
        base, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, ns), base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        fn = op.py_kernels.get(meta) if op is not None else None
        if fn is not None:
            keep.impl(op, _everyday.meta_for_bridge(qual, fn))
    globals()["_meta_lib"] = keep  # keep the registrations alive


def _register_missing_meta_kernels():
    """Meta kernels for ops that PyTorch ships without one (their CPU kernels
    compute the output shapes themselves); the bridge needs them to allocate
    outputs. Registered only where no Meta kernel exists."""
    import torch

    def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
        return self.new_empty(bins), self.new_empty(bins + 1)

    def histogram_bins_tensor(self, bins, *, weight=None, density=False):
        return self.new_empty(bins.numel() - 1), self.new_empty(bins.numel())

    def margin_loss_backward(grad_output, self, *args, **kwargs):
        return self.new_empty(self.shape)  # CPU: a contiguous tensor like self

    def margin_loss_backward_out(grad_output, self, *args, grad_input, **kwargs):
        return grad_input.resize_(self.shape)

    def ctc_loss_backward(grad, log_probs, *args, **kwargs):
        return log_probs.new_empty(log_probs.shape)  # CPU: contiguous, like log_probs

    def geqrf(self):
        if self.dim() < 2:
            raise RuntimeError("geqrf: input must have at least 2 dimensions.")
        m, n = self.shape[-2:]
        # CPU: column-major reflectors, contiguous tau
        return self.new_empty(self.shape[:-2] + (n, m)).mT, self.new_empty(
            self.shape[:-2] + (min(m, n),))

    def linalg_lstsq(self, b, rcond=None, *, driver=None):
        op = "torch.linalg.lstsq"
        if self.dim() < 2:
            raise RuntimeError(f"{op}: input must have at least 2 dimensions.")
        if b.dim() < 1:
            raise RuntimeError(f"{op}: other must have at least 1 dimension.")
        if self.dtype != b.dtype:
            raise RuntimeError(f"{op}: Expected input and other to have the same dtype, but got "
                               f"input's dtype {self.dtype} and other's dtype {b.dtype}")
        diff = self.dim() - b.dim()
        if not 0 <= diff <= 1:
            raise RuntimeError(f"{op}: input.dim() must be greater or equal to other.dim() and "
                               "(input.dim() - other.dim()) <= 1")
        vector = b.dim() == 1 or (diff == 1 and b.shape == self.shape[:-1])
        bb = b.unsqueeze(-1) if vector else b
        m, n = self.shape[-2:]
        if bb.shape[-2] != m:
            raise RuntimeError(f"{op}: input.size(-2) should match other.size(-2)")
        if diff == 1 and not vector:
            # CPU takes other's leading dims as its batch dims, which then do not match
            raise RuntimeError(f"{op}: the batch dims of input {tuple(self.shape[:-2])} and "
                               f"other {tuple(b.shape[:-2])} do not broadcast")
        driver = "gelsy" if driver is None else driver
        if driver not in ("gels", "gelsy", "gelsd", "gelss"):
            raise RuntimeError(f"{op}: parameter `driver` should be one of "
                               "(gels, gelsy, gelsd, gelss)")
        batch = torch.broadcast_shapes(self.shape[:-2], bb.shape[:-2])
        nrhs, mx = bb.shape[-1], max(m, n)
        # CPU: LAPACK solves in a column-major max(m, n) x nrhs buffer per matrix, and the
        # solution is its first n rows
        sol = self.new_empty(batch + (nrhs, mx)).mT[..., :n, :]
        if vector:
            sol = sol.squeeze(-1)
        real = self.dtype.to_real()  # residuals and singular values of complex input are real
        res = self.new_empty(batch + (nrhs,) if m > n and driver != "gelsy" else (0,), dtype=real)
        abatch = self.shape[:-2]  # rank and singular values: A's batch shape, not broadcast
        rank = self.new_empty(abatch if driver != "gels" else (0,), dtype=torch.int64)
        sv = self.new_empty(abatch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,),
                            dtype=real)
        return sol, res, rank, sv

    def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
        return self.new_empty(tuple(bins))

    def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
        return self.new_empty(tuple(b.numel() - 1 for b in bins))

    lib = torch.library.Library("aten", "IMPL", "Meta")
    for name, fn in (("geqrf", geqrf), ("linalg_lstsq", linalg_lstsq),
                     ("_histogramdd_from_bin_cts", histogramdd_from_bin_cts),
                     ("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors),
                     ("histogram.bin_ct", histogram_bin_ct),
                     ("_ctc_loss_backward", ctc_loss_backward),
                     ("histogram.bins_tensor", histogram_bins_tensor),
                     ("multi_margin_loss_backward", margin_loss_backward),
                     ("multilabel_margin_loss_backward", margin_loss_backward),
                     ("multi_margin_loss_backward.grad_input", margin_loss_backward_out),
                     ("multilabel_margin_loss_backward.grad_input", margin_loss_backward_out)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "Meta"):
            lib.impl(name, fn)
    globals()["_extra_meta_lib"] = lib  # keep the registrations alive


def _autoload():
    """Entry point called by `import torch` (group `torch.backends`)."""
    _register()


import torch  # noqa: E402  (autoload may re-enter this module: _autoload is defined above)

_register()

from ._C import supported_ops as _supported_ops  # noqa: E402
from .modes import eager_mode, get_eager_mode, materialize, set_eager_mode  # noqa: E402
from . import debug  # noqa: E402,F401
from .compile import export_stablehlo  # noqa: E402,F401
from . import compile as _compile  # noqa: E402

_compile._register()
from . import distributed as _distributed  # noqa: E402

_distributed._register()


def supported_ops():
    """ATen overload names ("aten::add.Tensor", ...) implemented natively."""
    return list(_supported_ops())


def _drain_autograd_device_threads():
    """At interpreter exit: PyTorch's autograd engine runs tpu backward work on a thread per
    device, and that thread may drop its last reference to a finished graph task a moment
    after backward() returned. The task's saved thread-local state holds a Python object
    (the contextvars copy torch.autograd stashes), so a release during finalization takes the
    GIL there and aborts the process ("terminate called without an active exception"; seen
    under load). One more backward per device that was used, run through the engine without
    Python state, makes each device thread finish that release first. It runs no device
    program (an empty tensor, a view, its gradient stored as is), so no target compiles or
    caches anything at exit."""
    if not _C.is_initialized():
        return
    from torch.autograd.graph import Variable
    try:
        for i in range(torch.tpu.device_count()):
            if torch.tpu.memory_reserved(i) == 0:
                continue
            x = torch.empty((), device=torch.device("tpu", i), requires_grad=True)
            Variable._execution_engine.run_backward((x.view(()),), (torch.empty_like(x),),
                                                    False, False, (), True, True)
    except Exception:  # noqa: BLE001  (a device in error at exit: nothing to drain)
        pass


import atexit as _atexit  # noqa: E402

_atexit.register(_drain_autograd_device_threads)
