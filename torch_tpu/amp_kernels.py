"""GradScaler's two ATen ops for tpu, composed of tpu ops.

torch.amp.GradScaler calls `_amp_foreach_non_finite_check_and_unscale_` (unscale the
gradients, note whether any is inf/NaN) and `_amp_update_scale_` (grow or back off the
scale). PyTorch has kernels for them only on CPU, CUDA and MPS. Here they are written with
tensor ops, so they stay on the device without reading anything back to the host (in
DeferAndFuse they join the trace), and compute what CPU's kernels compute: the gradient times
the float32 inverse scale in the gradient's compute type, found_inf set to 1 (never
cleared), and the new scale rounded from a double product as CPU's kernel does.
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


def _install():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    _lib.impl("_amp_foreach_non_finite_check_and_unscale_", _non_finite_check_and_unscale_,
              "PrivateUse1")
    _lib.impl("_amp_update_scale_", _update_scale_, "PrivateUse1")
