"""ATen ops that PyTorch implements per device (CPU, CUDA, MPS only), composed here of tpu ops.

Each is registered for PrivateUse1 with torch.library and computes what CPU's kernel
computes, without reading anything back to the host (in DeferAndFuse the ops join the
trace):

* GradScaler: `_amp_foreach_non_finite_check_and_unscale_` unscales the gradients (times
  the float32 inverse scale, in the gradient's op math type) and sets found_inf to 1 when
  one holds inf/NaN (never clears it); `_amp_update_scale_` backs the scale off or grows it,
  the new scale rounded from a double product as CPU's kernel does.
* `torch.kaiser_window`: ATen computes it with a per-device kernel stub (DispatchStub) that
  only CPU and CUDA fill in. The sample positions are made in the requested dtype, then, in
  the op math type (float32 for half/bfloat16),
  i0(beta * sqrt(|1 - ((k - alpha) / alpha)^2|)) / i0(beta) with alpha = (n - 1) / 2; the
  periodic window is the first n of a window of n + 1.
* `isin.Scalar_Tensor`: ATen's meta function declares a 1-d output of size 0 and its CPU and
  CUDA kernels resize it to 0-d after wrapping the scalar in a tensor; this does the same
  wrapping and calls isin.Tensor_Tensor.
"""
import torch

_lib = None

def _check_one_element_float(t, what):
    if t.numel() != 1:
        raise RuntimeError(f"{what} must be a 1-element tensor.")
    if t.dtype != torch.float32:
        raise RuntimeError(f"{what} must be a float tensor.")


def _non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    _check_one_element_float(inv_scale, "inv_scale")
    _check_one_element_float(found_inf, "found_inf")
    bad = None
    for g in grads:
        if g.device != found_inf.device or g.device != inv_scale.device:
            raise RuntimeError("scaled_grad, found_inf and inv_scale must be on the same device.")
        if g.layout != torch.strided:
            raise RuntimeError("scaled_grad must be a strided (usually dense) tensor.")
        if g.numel() == 0:
            continue
        b = torch.logical_not(torch.isfinite(g)).any()
        bad = b if bad is None else torch.logical_or(bad, b)
        if g.dtype in (torch.float16, torch.bfloat16):
            # CPU multiplies in float32 (the op math type) and rounds once
            g.copy_(g.float().mul_(inv_scale))
        else:
            g.mul_(inv_scale)
    if bad is not None:
        found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))


def _update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    if growth_tracker.numel() != 1:
        raise RuntimeError("growth_tracker must be a 1-element tensor.")
    if growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be an int tensor.")
    _check_one_element_float(scale, "current_scale")
    _check_one_element_float(found_inf, "found_inf")
    found = found_inf != 0
    successful = growth_tracker + 1
    grow = torch.logical_and(torch.logical_not(found), successful == growth_interval)
    wide = scale.double()
    grown = (wide * growth_factor).float()
    backed = (wide * backoff_factor).float()
    kept = torch.where(torch.logical_and(grow, torch.isfinite(grown)), grown, scale)
    scale.copy_(torch.where(found, backed, kept))
    growth_tracker.copy_(torch.where(torch.logical_or(found, grow),
                                     torch.zeros_like(successful), successful))
    return scale


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


def _isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    e = torch.scalar_tensor(element, dtype=_scalar_dtype(element), device=test_elements.device)
    return torch.isin(e, test_elements, assume_unique=assume_unique, invert=invert)


def _isin_scalar_tensor_out(element, test_elements, *, assume_unique=False, invert=False, out):
    e = torch.scalar_tensor(element, dtype=_scalar_dtype(element), device=test_elements.device)
    return torch.isin(e, test_elements, assume_unique=assume_unique, invert=invert, out=out)


def _scalar_dtype(v):
    # the dtype of a tensor made from a Python number (as ATen's scalar_to_tensor)
    if isinstance(v, bool):
        return torch.bool
    if isinstance(v, int):
        return torch.int64
    return torch.float64


def _install():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    _lib.impl("_amp_foreach_non_finite_check_and_unscale_", _non_finite_check_and_unscale_,
              "PrivateUse1")
    _lib.impl("_amp_update_scale_", _update_scale_, "PrivateUse1")
    # the overloads without beta (or periodic) do not dispatch to .beta: each needs its kernel
    for name in ("kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"):
        _lib.impl(name, _kaiser_window, "PrivateUse1")
    _lib.impl("isin.Scalar_Tensor", _isin_scalar_tensor, "PrivateUse1")
    _lib.impl("isin.Scalar_Tensor_out", _isin_scalar_tensor_out, "PrivateUse1")
