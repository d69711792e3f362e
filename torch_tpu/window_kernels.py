"""torch.kaiser_window for tpu, composed of tpu ops.

PyTorch computes the Kaiser window with a per-device kernel stub (DispatchStub) that only
CPU and CUDA fill in, so on other devices the factory fails inside ATen. This computes
what CPU's kernel computes: the sample positions 0..n-1 in the requested dtype, then, in
the op math type (float32 for half/bfloat16),
i0(beta * sqrt(|1 - ((k - alpha) / alpha)^2|)) / i0(beta) with alpha = (n - 1) / 2,
and the periodic window as the first n of a window of n + 1.
"""
import torch

_lib = None


def _kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None,
                   device=None, pin_memory=None):
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    if not dtype.is_floating_point:
        raise RuntimeError(f"kaiser_window expects floating point dtypes, got: {dtype}")
    if window_length < 0:
        raise RuntimeError(f"kaiser_window requires non-negative window_length, got window_length={window_length}")
    if layout not in (None, torch.strided):
        raise RuntimeError("kaiser_window is implemented for strided tensors only")
    opts = dict(dtype=dtype, device=device)
    if window_length == 0:
        return torch.empty(0, **opts)
    if window_length == 1:
        return torch.ones(1, **opts)
    n = window_length + 1 if periodic else window_length
    k = torch.arange(n, **opts)
    math = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    alpha = (n - 1) / 2.0
    r = (k.to(math) - alpha) / alpha
    arg = torch.sqrt(torch.abs(1 - r * r)) * beta
    beta_t = torch.full((), beta, dtype=math, device=k.device)
    w = (torch.special.i0(arg) / torch.special.i0(beta_t)).to(dtype)
    return w[: n - 1] if periodic else w


def _install():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    # the overloads without beta (or periodic) do not dispatch to .beta: each needs its kernel
    _lib.impl("kaiser_window", _kaiser_window, "PrivateUse1")
    _lib.impl("kaiser_window.periodic", _kaiser_window, "PrivateUse1")
    _lib.impl("kaiser_window.beta", _kaiser_window, "PrivateUse1")
