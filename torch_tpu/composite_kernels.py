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
* Fused optimizers (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, also with a tensor lr),
  what `torch.optim.Adam/AdamW/SGD(fused=True)` call: CPU's kernels' arithmetic per
  parameter (in float32 for half/bfloat16, bias corrections and step size in double,
  rounded to the compute type where the kernel rounds them), one tensor op at a time. A
  grad_scale unscales the gradients in place; a found_inf of 1 leaves everything unchanged
  (selected on the device, no read-back).
* Fused RNN cells: ATen's `lstm_cell` / `gru_cell` call `_thnn_fused_lstm_cell` /
  `_thnn_fused_gru_cell` for every device but CPU (so nn.LSTM, nn.GRU and their cells
  reach them), and backward without grad mode their `_backward(_impl)`. Composed as
  CUDA's kernels compute them: the gate pre-activations summed (biases added), sigmoid /
  tanh per gate, the workspace holding what the backward reads (LSTM: the four activated
  gates; GRU: r, z, n, hx and the hidden n pre-activation), in float32 for half inputs.
* `fractional_max_pool3d_backward` (which has no meta kernel, so the runtime's kernel
  cannot be given its output): the gradient scattered through the indices per plane.
* `isin.Scalar_Tensor`: ATen's meta function declares a 1-d output of size 0 and its CPU and
  CUDA kernels resize it to 0-d after wrapping the scalar in a tensor; this does the same
  wrapping and calls isin.Tensor_Tensor.
* `rrelu_with_noise` (functional, in place, out=), what `F.rrelu` / `nn.RReLU` call: CPU's
  kernel. Training: each element <= 0 is scaled by a uniform sample from [lower, upper],
  which `noise` keeps (1 elsewhere); evaluation: leaky_relu with slope (lower + upper) / 2
  computed in double, `noise` untouched.
* `_histogramdd_bin_edges` (what `torch.histogramdd` calls for bin counts; it returns a list
  of tensors, which the runtime's calls cannot): dim d's edges are those `torch.histogram`
  computes for column d with range[2d:2d+2] (the runtime's histogram kernel: CPU shares the
  outer-edge choice and the linspace between histogram and histogramdd).
* `linalg_lstsq.out`: the runtime kernel serves the functional overload (its solution is the
  first n rows of a column-major max(m, n) x nrhs buffer, which an out= resize cannot give);
  as on CPU, an out tensor of the result's shape receives a copy (keeping its strides), any
  other takes the result's storage and geometry (solution) or is resized and filled.
* `is_set_to`: metadata only (CPU's and CUDA's kernel): the same storage, offset, sizes and
  strides.
"""
import builtins

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


def _opmath(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _check_fused_lists(name, *lists):
    n = len(lists[0])
    for lst in lists[1:]:
        if len(lst) != n:
            raise RuntimeError(f"{name}: all tensor lists must have the same length, got "
                               f"{[len(x) for x in lists]}")


def _fused_store(found_inf, pairs):
    # pairs: (tensor to update, its new value in the compute type)
    keep = None if found_inf is None else found_inf == 1.0
    for dst, new in pairs:
        if keep is not None:
            new = torch.where(keep, _opmath(dst), new)
        dst.copy_(new)


def _fused_grad(grad, grad_scale, maximize, pairs):
    """the gradient as the fused optimizers read it: in opmath, unscaled (the unscaled grad is
    stored back, as CPU's kernels do: appended to pairs), negated when maximizing"""
    g = _opmath(grad)
    if grad_scale is not None:
        g = g / grad_scale
        pairs.append((grad, g))
    return -g if maximize else g


def _fused_adam_common(adamw, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                       state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
                       grad_scale, found_inf):
    name = "_fused_adamw_" if adamw else "_fused_adam_"
    lists = [params, grads, exp_avgs, exp_avg_sqs, state_steps]
    if amsgrad:
        lists.append(max_exp_avg_sqs)
    _check_fused_lists(name, *lists)
    for i, p in enumerate(params):
        dev = p.device
        f64 = dict(dtype=torch.float64, device=dev)
        step = state_steps[i].to(**f64)
        lr_t = lr.to(**f64) if isinstance(lr, torch.Tensor) else torch.tensor(lr, **f64)
        bc1 = 1 - torch.pow(torch.tensor(beta1, **f64), step)
        bc2_sqrt = torch.sqrt(1 - torch.pow(torch.tensor(beta2, **f64), step))
        step_size = lr_t / bc1
        pairs = []
        g = _fused_grad(grads[i], grad_scale, maximize, pairs)
        pv = _opmath(p)
        if weight_decay != 0:
            if adamw:
                pv = pv * (1 - lr_t * weight_decay)
            else:
                g = g + pv * weight_decay
        ea = torch.lerp(_opmath(exp_avgs[i]), g, 1 - beta1)
        eas = _opmath(exp_avg_sqs[i]) * beta2 + (1 - beta2) * g * g
        pairs += [(exp_avgs[i], ea), (exp_avg_sqs[i], eas)]
        if amsgrad:
            m = torch.maximum(_opmath(max_exp_avg_sqs[i]), eas)
            pairs.append((max_exp_avg_sqs[i], m))
            denom = m.sqrt() / bc2_sqrt + eps
        else:
            denom = eas.sqrt() / bc2_sqrt + eps
        pairs.append((p, pv + (-step_size) * ea / denom))
        _fused_store(found_inf, pairs)


def _fused_adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    _fused_adam_common(False, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                       lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


def _fused_adamw(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                 beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    _fused_adam_common(True, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                       lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


def _fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
               nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    lists = [self, grads] + ([momentum_buffer_list] if momentum != 0 else [])
    _check_fused_lists("_fused_sgd_", *lists)
    for i, p in enumerate(self):
        lr_t = (lr.to(dtype=torch.float64, device=p.device) if isinstance(lr, torch.Tensor)
                else torch.tensor(lr, dtype=torch.float64, device=p.device))
        pairs = []
        g = _fused_grad(grads[i], grad_scale, maximize, pairs)
        pv = _opmath(p)
        if weight_decay != 0:
            g = g + pv * weight_decay
        if momentum != 0:
            buf = g if is_first_step else (
                _opmath(momentum_buffer_list[i]) * momentum + (1 - dampening) * g)
            pairs.append((momentum_buffer_list[i], buf))
            g = buf * momentum + g if nesterov else buf
        pairs.append((p, pv + g * (-lr_t)))
        _fused_store(found_inf, pairs)


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dt = input_gates.dtype
    gates = _opmath(input_gates) + _opmath(hidden_gates)
    if input_bias is not None:
        gates = gates + _opmath(input_bias) + _opmath(hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * _opmath(cx) + i * g
    hy = o * cy.tanh()
    workspace = torch.cat([i, f, g, o], 1)
    return hy.to(dt), cy.to(dt), workspace.to(dt)


def _lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    dt = workspace.dtype
    i, f, g, o = _opmath(workspace).chunk(4, 1)
    cy = _opmath(cy)
    tcy = cy.tanh()
    go = _opmath(grad_hy) if grad_hy is not None else torch.zeros_like(cy)
    gc = _opmath(grad_cy) if grad_cy is not None else torch.zeros_like(cy)
    gcx = go * o * (1 - tcy * tcy) + gc
    gi = gcx * g * (1 - i) * i
    gf = gcx * _opmath(cx) * (1 - f) * f
    gg = gcx * i * (1 - g * g)
    gog = go * tcy * (1 - o) * o
    grad_gates = torch.cat([gi, gf, gg, gog], 1)
    grad_bias = grad_gates.sum(0).to(dt) if has_bias else None
    return grad_gates.to(dt), (gcx * f).to(dt), grad_bias


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dt = input_gates.dtype
    ig, hg = _opmath(input_gates), _opmath(hidden_gates)
    if input_bias is not None:
        ig = ig + _opmath(input_bias)
        hg = hg + _opmath(hidden_bias)
    ir, ii, in_ = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    h = _opmath(hx)
    hy = n + z * (h - n)
    workspace = torch.cat([r, z, n, h, hn], 1)
    return hy.to(dt), workspace.to(dt)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    dt = workspace.dtype
    r, z, n, h, hn = _opmath(workspace).chunk(5, 1)
    go = _opmath(grad_hy)
    gz = go * (h - n) * (1 - z) * z
    ghx = go * z
    gn = go * (1 - z) * (1 - n * n)
    ghn = gn * r
    gr = gn * hn * (1 - r) * r
    grad_input = torch.cat([gr, gz, gn], 1)
    grad_hidden = torch.cat([gr, gz, ghn], 1)
    gib = grad_input.sum(0).to(dt) if has_bias else None
    ghb = grad_hidden.sum(0).to(dt) if has_bias else None
    return grad_input.to(dt), grad_hidden.to(dt), ghx.to(dt), gib, ghb


def _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    planes = self.shape[:-3].numel() if self.dim() > 3 else 1
    if planes == 0 or self.numel() == 0:
        return torch.zeros_like(self)
    flat = torch.zeros((planes, self.shape[-3:].numel()), dtype=self.dtype, device=self.device)
    flat.scatter_add_(1, indices.reshape(planes, -1), grad_output.reshape(planes, -1))
    return flat.view(self.shape)


def _fractional_max_pool3d_backward_out(grad_output, self, kernel_size, output_size, indices, *,
                                        grad_input):
    r = _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices)
    grad_input.resize_(r.shape)
    return grad_input.copy_(r)


_RRELU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _rrelu_with_noise_into(self, noise, lower, upper, training, generator, out):
    if self.shape != noise.shape:
        raise RuntimeError("noise tensor shape must match self tensor shape. Got self.shape = "
                           f"{list(self.shape)} noise.shape = {list(noise.shape)}")
    if not training:
        slope = (float(lower) + float(upper)) / 2
        return torch.nn.functional.leaky_relu(self, slope) if out is None else \
            torch._C._nn.leaky_relu(self, slope, out=out)
    if self.dtype not in _RRELU_DTYPES:
        raise NotImplementedError(f'"rrelu_with_noise_out_cpu" not implemented for \'{_dtype_name(self.dtype)}\'')
    r = torch.empty(self.shape, dtype=self.dtype, device=self.device).uniform_(
        float(lower), float(upper), generator=generator)
    neg = self <= 0
    res = torch.where(neg, self * r, self)
    noise.copy_(torch.where(neg, r, torch.ones_like(r)))
    if out is None:
        return res
    out.resize_(res.shape)
    return out.copy_(res)


def _dtype_name(dtype):
    return {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool"}.get(dtype, str(dtype).replace("torch.", ""))


def _rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3, training=False, generator=None):
    return _rrelu_with_noise_into(self, noise, lower, upper, training, generator, None)


def _rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3, training=False, generator=None):
    return _rrelu_with_noise_into(self, noise, lower, upper, training, generator, self)


def _rrelu_with_noise_out(self, noise, lower=0.125, upper=1.0 / 3, training=False, generator=None, *,
                          out):
    return _rrelu_with_noise_into(self, noise, lower, upper, training, generator, out)


def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    if self.dim() < 1:
        raise RuntimeError("torch.histogramdd: input tensor should have at least 1 dimension, "
                           "but got 0")
    d = self.shape[-1]
    if len(bins) != d:
        raise RuntimeError(f"torch.histogramdd: expected {d} sequences of bin edges for each of "
                           f"the {d} dimensions of the input, but got {len(bins)}")
    if range is not None and len(range) != 2 * d:
        raise RuntimeError(f"torch.histogramdd: for a {d}-dimensional input, range should have "
                           f"{2 * d} elements, but got {len(range)}")
    points = self.reshape(-1, d)
    return [torch.histogram(points[:, i], bins[i],
                            range=None if range is None else (range[2 * i], range[2 * i + 1])
                            ).bin_edges for i in builtins.range(d)]


def _linalg_lstsq_out(self, b, rcond=None, *, driver=None, solution, residuals, rank,
                      singular_values):
    outs = (solution, residuals, rank, singular_values)
    res = torch.linalg.lstsq(self, b, rcond, driver=driver)
    for name, o, r in zip(("solution", "residuals", "rank", "singular_values"), outs, res):
        if o.dtype != r.dtype:
            raise RuntimeError(f"torch.linalg.lstsq: Expected {name} to have dtype {r.dtype}, "
                               f"but got {o.dtype}")
        if o.device != r.device:
            raise RuntimeError(f"torch.linalg.lstsq: Expected {name} and input tensors to be on "
                               f"the same device, but got {name} on {o.device} and input on "
                               f"{r.device}")
    for i, (o, r) in enumerate(zip(outs, res)):
        if o.shape == r.shape:
            o.copy_(r)
        elif i == 0:
            o.set_(r.untyped_storage(), r.storage_offset(), r.shape, r.stride())
        else:
            o.resize_(r.shape).copy_(r)
    return outs


def _is_set_to(self, tensor):
    return (self.untyped_storage()._cdata == tensor.untyped_storage()._cdata
            and self.storage_offset() == tensor.storage_offset()
            and self.shape == tensor.shape and self.stride() == tensor.stride())


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
    for name, fn in (("_fused_adam_", _fused_adam), ("_fused_adamw_", _fused_adamw),
                     ("_fused_sgd_", _fused_sgd)):
        _lib.impl(name, fn, "PrivateUse1")
        _lib.impl(name + ".tensor_lr", fn, "PrivateUse1")
    _lib.impl("_thnn_fused_lstm_cell", _lstm_cell, "PrivateUse1")
    _lib.impl("_thnn_fused_lstm_cell_backward_impl", _lstm_cell_backward_impl, "PrivateUse1")
    _lib.impl("_thnn_fused_gru_cell", _gru_cell, "PrivateUse1")
    _lib.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward, "PrivateUse1")
    _lib.impl("fractional_max_pool3d_backward", _fractional_max_pool3d_backward, "PrivateUse1")
    _lib.impl("fractional_max_pool3d_backward.grad_input", _fractional_max_pool3d_backward_out,
              "PrivateUse1")
    _lib.impl("isin.Scalar_Tensor", _isin_scalar_tensor, "PrivateUse1")
    _lib.impl("isin.Scalar_Tensor_out", _isin_scalar_tensor_out, "PrivateUse1")
    _lib.impl("is_set_to", _is_set_to, "PrivateUse1")
    _lib.impl("_histogramdd_bin_edges", _histogramdd_bin_edges, "PrivateUse1")
    _lib.impl("linalg_lstsq.out", _linalg_lstsq_out, "PrivateUse1")
    _lib.impl("rrelu_with_noise", _rrelu_with_noise, "PrivateUse1")
    _lib.impl("rrelu_with_noise_", _rrelu_with_noise_, "PrivateUse1")
    _lib.impl("rrelu_with_noise.out", _rrelu_with_noise_out, "PrivateUse1")
