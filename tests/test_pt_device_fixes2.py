"""Regression tests, second round, for defects PyTorch's own device-generic tests found on
tpu (scripts/pytorch_device_tests.sh): each compares with CPU in every eager mode (the
`mode` fixture of conftest.py)."""
import warnings

import pytest
import torch

from util import assert_same, check_op, raises_like_cpu


def _quiet(fn, *args, **kwargs):
    # torch.range and index_reduce warn (deprecated / beta) on every device alike
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# ---- range.out (test_tensor_creation_ops test_range): the inclusive range ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("start,end,step", [(0, 5, 1), (1, 10, 3), (5, 0, -1), (0, 1, 0.1),
                                            (-2.5, 3.75, 0.25), (3, 3, 1)])
def test_range(mode, dtype, start, end, step):
    if not dtype.is_floating_point and any(isinstance(v, float) for v in (start, end, step)):
        pytest.skip("fractional bounds into an integer dtype")
    if dtype == torch.uint8 and min(start, end) < 0:
        pytest.skip("negative values in uint8")
    expected = _quiet(torch.range, start, end, step, dtype=dtype)
    assert_same(_quiet(torch.range, start, end, step, dtype=dtype, device="tpu"), expected)


def test_range_out_resizes_and_two_argument_form(mode):
    out_c = torch.empty(2)
    out_t = torch.empty(2, device="tpu")
    _quiet(torch.range, 0, 4, out=out_c)
    _quiet(torch.range, 0, 4, out=out_t)
    assert_same(out_t, out_c)
    assert_same(torch.ops.aten.range.out_(1, 4, out=torch.empty(0, device="tpu")),
                torch.ops.aten.range.out_(1, 4, out=torch.empty(0)))


def test_range_errors(mode):
    # a zero step, a step of the wrong sign: raised at the op as on CPU
    for args in [(0, 5, 0), (0, 5, -1), (5, 0, 1)]:
        with pytest.raises(Exception) as cpu:
            _quiet(torch.range, *args)
        with pytest.raises(type(cpu.value)):
            _quiet(torch.range, *args, device="tpu")


# ---- unique_dim (test_sort_and_select test_unique_dim): distinct slices along a dim ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int8, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_unique_dim(mode, dtype, dim):
    g = torch.Generator().manual_seed(5)
    base = torch.randint(0, 2, (3, 2, 2), generator=g)
    x = torch.cat([base, base[:2], base[1:]], 0).repeat(1, 2, 1)[:, :, :]  # repeated slices
    x = x.permute(1, 0, 2).contiguous().permute(1, 0, 2).to(dtype)  # non-contiguous input
    for flags in [(False, False), (True, False), (False, True), (True, True)]:
        expected = torch.ops.aten.unique_dim(x, dim, True, *flags)
        assert_same(torch.ops.aten.unique_dim(x.to("tpu"), dim, True, *flags), expected,
                    check_stride=False)
        assert_same(torch.unique(x.to("tpu"), dim=dim, return_inverse=flags[0],
                                 return_counts=flags[1]),
                    torch.unique(x, dim=dim, return_inverse=flags[0], return_counts=flags[1]),
                    check_stride=False)


def test_unique_dim_shapes(mode):
    # one row, an empty selected dim, a 1-d tensor
    for x, dim in [(torch.tensor([[4, 1, 4]]), 1), (torch.empty(0, 3), 0),
                   (torch.tensor([3, 1, 3, 2]), 0), (torch.tensor([[1.5, -0.0], [1.5, 0.0]]), 0)]:
        assert_same(torch.ops.aten.unique_dim(x.to("tpu"), dim, True, True, True),
                    torch.ops.aten.unique_dim(x, dim, True, True, True), check_stride=False)


def test_unique_dim_errors(mode):
    raises_like_cpu(lambda t: torch.ops.aten.unique_dim(t, 0), torch.tensor(5))  # 0-d
    raises_like_cpu(lambda t: torch.ops.aten.unique_dim(t, 2), torch.ones(2, 3))
    raises_like_cpu(lambda t: torch.ops.aten.unique_dim(t, 0), torch.ones(2, 0, 3))
    raises_like_cpu(lambda t: torch.ops.aten.unique_dim(t, 1), torch.ones(0, 0))


# ---- arange / linspace / logspace / range into an out= that is not 1-D (test_arange,
# test_linspace, test_logspace): an out of the right element count keeps its shape and is
# filled in row-major logical order, also a non-contiguous view; the kernels required 1-D
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("fn", [lambda out: torch.linspace(0, 3, 4, out=out),
                                lambda out: torch.logspace(0, 3, 4, base=2, out=out),
                                lambda out: torch.arange(0, 4, out=out),
                                lambda out: torch.arange(4, out=out),
                                lambda out: _quiet(torch.range, 0, 3, out=out)],
                         ids=["linspace", "logspace", "arange", "arange_end", "range"])
def test_sequence_into_shaped_out(mode, dtype, fn):
    res = []
    for dev in ("cpu", "tpu"):
        x = torch.zeros(2, 3, dtype=dtype, device=dev)
        fn(x.narrow(1, 1, 2))  # a 2x2 non-contiguous view
        y = torch.zeros(4, 5, dtype=dtype, device=dev)
        fn(y[1:3, ::2][:, :2])  # strided both ways
        z = torch.zeros(2, 2, dtype=dtype, device=dev)
        fn(z.t())  # a transposed view: logical order, not memory order
        res.append((x, y, z))
    assert_same(res[1], res[0])


def test_arange_into_permuted_out(mode):
    res = []
    for dev in ("cpu", "tpu"):
        r = torch.zeros(3, 3, 700, dtype=torch.int64, device=dev).permute(2, 0, 1)
        torch.arange(0, 700 * 9, out=r)
        res.append(r)
    assert_same(res[1], res[0])


# ---- an out= whose dtype is wider than the inputs' common dtype (test_type_promotion
# test_computation_ignores_out): computed in the common dtype, then cast, as on CPU
@pytest.mark.parametrize("case", [
    (torch.add, torch.float16, 33000.0, 33000.0, torch.float64),   # f16 overflow -> inf
    (torch.true_divide, torch.float16, 1.5, 0.666, torch.float64),  # rounded to f16 first
    (torch.sub, torch.uint8, 5, 8, torch.float64),                  # uint8 wraps to 253
    (torch.mul, torch.bfloat16, 2.7, 2.7, torch.float32),
    (torch.add, torch.int8, 100, 100, torch.int64),                  # int8 wraps
    (torch.mul, torch.int16, 300, 300, torch.float32),
    (torch.add, torch.bool, True, True, torch.int64),                # bool add is logical or
    (torch.add, torch.float16, 1.0, 0.0004, torch.float32),
])
def test_out_wider_than_common_dtype(mode, case):
    fn, dt, a, b, out_dt = case
    x = torch.tensor([a, -a if dt.is_floating_point else a], dtype=dt)
    y = torch.tensor([b, b], dtype=dt)
    check_op(lambda x, y: fn(x, y, out=torch.empty(0, dtype=out_dt, device=x.device)), x, y)


@pytest.mark.parametrize("fn", [torch.exp, torch.sqrt, torch.neg, torch.abs, torch.sigmoid])
@pytest.mark.parametrize("dt,out_dt", [(torch.bfloat16, torch.float32), (torch.float16, torch.float64)])
def test_unary_out_wider_than_input(mode, fn, dt, out_dt):
    x = torch.tensor([1.5, 2.7, 9.1, 0.3, 11.0], dtype=dt)
    check_op(lambda x: fn(x, out=torch.empty(0, dtype=out_dt, device=x.device)), x)


def test_comparison_into_bool_out_unchanged(mode):
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    check_op(lambda x: torch.gt(x, 2.0), x)
    check_op(lambda x: torch.eq(x, x.flip(0), out=torch.empty(0, dtype=torch.bool, device=x.device)), x)


# ---- float -> int32 conversion of out-of-range values (test_float_to_int_conversion_finite):
# CPU's cast gives INT32_MIN for values outside int32 and NaN (x86 cvtt); tpu went through
# int64 and truncated to 0
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int32, torch.int8, torch.int64, torch.uint8])
def test_float_to_int_out_of_range(mode, src, dst):
    big = torch.finfo(torch.float32).max
    vals = [-big, -2.0, -1.5, -0.5, 0.0, 0.5, 1.5, 2.0, big, 3e9, -3e9, 2147483520.0]
    if dst == torch.uint8:
        vals = [0.0, 0.5, 1.5, 2.0, 200.0, 255.0]  # CPU's uint8 casts of the rest are not portable
    x = torch.tensor(vals, dtype=torch.float64).to(src)
    check_op(lambda x: x.to(dst), x)


# ---- fused optimizers (test_torch test_grad_scaling_autocast_*_fused_True_*):
# _fused_adam_, _fused_adamw_, _fused_sgd_ were missing on tpu
_OPTIMS = [
    (torch.optim.Adam, dict(lr=0.01)),
    (torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    (torch.optim.Adam, dict(lr=torch.tensor(0.01), maximize=True)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=True, betas=(0.8, 0.95))),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=torch.tensor(0.1), momentum=0.5, dampening=0.1, maximize=True)),
]


def _optim_steps(dev, ctor, kw, dtype, steps=3):
    g = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype).to(dev))
          for s in [(5, 7), (3,), (40,)]]
    opt = ctor(ps, **kw)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(dtype).to(dev)
        opt.step()
    return [p.detach() for p in ps]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("opt", range(len(_OPTIMS)))
def test_fused_optimizer_matches_cpu(mode, opt, dtype):
    ctor, kw = _OPTIMS[opt]
    expected = _optim_steps("cpu", ctor, dict(kw, fused=True), dtype)
    actual = _optim_steps("tpu", ctor, dict(kw, fused=True), dtype)
    # CPU's kernels use multiply-adds (lerp, momentum): last-ulp differences
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-14, rtol=1e-12)
    assert_same(actual, expected, **tol)


@pytest.mark.parametrize("opt", range(len(_OPTIMS)))
def test_fused_optimizer_bfloat16(mode, opt):
    # computed in float32 and rounded once per step, as the unfused algorithm on CPU
    ctor, kw = _OPTIMS[opt]
    expected = _optim_steps("cpu", ctor, dict(kw, foreach=False), torch.bfloat16)
    actual = _optim_steps("tpu", ctor, dict(kw, fused=True), torch.bfloat16)
    assert_same(actual, expected, atol=0.02, rtol=0.02)


@pytest.mark.parametrize("name", ["_fused_adam_", "_fused_adamw_", "_fused_sgd_"])
@pytest.mark.parametrize("found", [0.0, 1.0])
def test_fused_optimizer_grad_scale_and_found_inf(mode, name, found):
    res = []
    for dev in ("cpu", "tpu"):
        g = torch.Generator().manual_seed(2)
        mk = lambda: [torch.randn(s, generator=g).to(dev) for s in [(6, 3), (17,)]]
        params, grads, a, b, c = mk(), mk(), mk(), mk(), mk()
        for t in b + c:
            t.abs_()
        scale = torch.full((), 64.0, device=dev)
        found_inf = torch.full((), found, device=dev)
        if name == "_fused_sgd_":
            torch._fused_sgd_(params, grads, a, weight_decay=0.01, momentum=0.9, lr=0.1,
                              dampening=0.0, nesterov=False, maximize=False, is_first_step=False,
                              grad_scale=scale, found_inf=found_inf)
        else:
            steps = [torch.full((), 3.0, device=dev) for _ in params]
            getattr(torch, name)(params, grads, a, b, c, steps, lr=0.01, beta1=0.9, beta2=0.999,
                                 weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False,
                                 grad_scale=scale, found_inf=found_inf)
        res.append(params + grads + a + b + c)
    assert_same([t for t in res[1]], [t for t in res[0]], atol=1e-6, rtol=1e-5)


# ---- copy-on-write (test_torch test_lazy_clone_*): a write to a lazily cloned tensor
# reached the clone too (the bridge never materialized the shared storage)
@pytest.mark.parametrize("write", ["t_inplace", "t_view", "t_copy", "t_out", "clone_inplace",
                                   "t_foreach"])
def test_lazy_clone_write_is_private(mode, write):
    res = []
    for dev in ("cpu", "tpu"):
        t = torch.arange(6.0, device=dev).reshape(2, 3)
        c = t._lazy_clone()
        read = (c * 2).sum()  # reads keep it lazy
        if write == "t_inplace":
            t.mul_(3)
        elif write == "t_view":
            v = t.view([6])
            v += torch.ones(1, device=dev)
        elif write == "t_copy":
            t.copy_(torch.full((2, 3), 7.0, device=dev))
        elif write == "t_out":
            torch.add(c, 1, out=t)
        elif write == "clone_inplace":
            c.add_(5)
        else:
            torch._foreach_add_([t], 2.0)
        res.append([t.clone(), c.clone(), read])
        t.sub_(1)  # a second write, after the first one materialized
        res[-1] += [t.clone(), c.clone()]
    assert_same(res[1], res[0])


def test_lazy_clone_cow_state_strict():
    # in Strict/Debug the storages follow CPU's copy-on-write states exactly
    t = torch.tensor([[0.0, 1.0], [2.0, 3.0]], device="tpu")
    addr = torch._C._data_address(t)
    c = t._lazy_clone()
    t.view([4]).add_(1)
    assert not torch._C._is_cow_tensor(t) and torch._C._is_cow_tensor(c)
    assert torch._C._data_address(t) != addr and torch._C._data_address(c) == addr
    c.add_(1)  # the last reference: materialized in place, no copy
    assert not torch._C._is_cow_tensor(c) and torch._C._data_address(c) == addr
    assert c.tolist() == [[1.0, 2.0], [3.0, 4.0]] and t.tolist() == [[1.0, 2.0], [3.0, 4.0]]


# ---- antialiased bicubic resampling (test_nn test_upsamplingBiMode2d_*antialias_True*
# _bicubic): _upsample_bicubic2d_aa (and its backward) were missing
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,size,align", [((1, 3, 32, 32), (12, 12), False),
                                              ((2, 1, 8, 9), (20, 5), True),
                                              ((1, 2, 16, 16), (16, 16), False),
                                              ((1, 1, 5, 40), (3, 7), False),
                                              ((1, 2, 6, 6), (13, 2), False)])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_upsample_antialias(mode, dtype, shape, size, align):
    import torch.nn.functional as F
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4), dtype=dtype)
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    check_op(lambda t: F.interpolate(t, size, mode=mode, antialias=True, align_corners=align), x,
             grad=True, **tol)


def test_upsample_bicubic_antialias_modes_and_scales(mode):
    import torch.nn.functional as F
    x = torch.randn(2, 3, 17, 11, generator=torch.Generator().manual_seed(6))
    check_op(lambda t: F.interpolate(t, scale_factor=(0.4, 1.7), mode="bicubic", antialias=True),
             x, atol=2e-6, rtol=1e-5)
    check_op(lambda t: F.interpolate(t.contiguous(memory_format=torch.channels_last), (5, 5),
                                     mode="bicubic", antialias=True), x, atol=2e-6, rtol=1e-5,
             check_stride=False)


# ---- fractional max pooling (test_torch test_nondeterministic_alert_FractionalMaxPool2d/3d):
# fractional_max_pool2d/3d and their backward were missing
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [((2, 3, 9, 9), 2, (4, 4)), ((3, 10, 7), (3, 2), (5, 3)),
                                  ((1, 2, 12, 5), (2, 2), (6, 4)), ((1, 1, 4, 4), 2, (3, 3))])
def test_fractional_max_pool2d(mode, dtype, case):
    import torch.nn.functional as F
    shape, k, out = case
    g = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=g).to(dtype)
    x.view(-1)[3] = float("nan")  # a NaN wins its window
    batch = shape[0] if len(shape) == 4 else 1
    samples = torch.rand(batch, shape[-3], 2, generator=g).to(dtype)
    # the samples are constants (no gradient): moved to the input's device
    check_op(lambda t: F.fractional_max_pool2d(t, k, output_size=out, return_indices=True,
                                               _random_samples=samples.to(t.device)), x,
             grad=dtype in (torch.float32, torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fractional_max_pool3d(mode, dtype):
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, 7, 8, 9, generator=g).to(dtype)
    samples = torch.rand(2, 3, 3, generator=g).to(dtype)
    check_op(lambda t: F.fractional_max_pool3d(t, (2, 3, 2), output_size=(4, 3, 5),
                                               return_indices=True,
                                               _random_samples=samples.to(t.device)),
             x, grad=True)


def test_fractional_max_pool_module_and_errors(mode):
    import torch.nn.functional as F
    x = torch.randn(2, 3, 9, 9, requires_grad=True, device="tpu")
    y = torch.nn.FractionalMaxPool2d(2, output_ratio=0.5)(x)
    y.sum().backward()
    assert y.shape == (2, 3, 4, 4) and x.grad.shape == x.shape
    assert x.grad.sum().item() == y.numel()  # each output's gradient reaches one input
    # integer input, and an output too large for the kernel: rejected as on CPU
    raises_like_cpu(lambda t, u: F.fractional_max_pool2d(t, 2, output_size=(3, 3),
                                                         _random_samples=u),
                    torch.ones(1, 1, 6, 6, dtype=torch.int64), torch.rand(1, 1, 2))
    raises_like_cpu(lambda t, u: F.fractional_max_pool2d(t, 3, output_size=(5, 5),
                                                         _random_samples=u),
                    torch.ones(1, 1, 6, 6), torch.rand(1, 1, 2))


# ---- fused RNN cells (test_nn test_variable_sequence, every nn.LSTM / nn.GRU on tpu):
# ATen's lstm_cell / gru_cell call _thnn_fused_*_cell on non-CPU devices; they were missing
def _rnn_case(cls, bias, dtype, packed, x, h0):
    import copy
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    m = cls(4, 5, 2, bias=bias).to(dtype)
    res = []
    for dev in ("cpu", "tpu"):
        md = copy.deepcopy(m).to(dev)
        xd = x.detach().to(dev).requires_grad_()
        inp = pack_padded_sequence(xd, torch.tensor([7, 5, 2])) if packed else xd
        out, state = md(inp, None if h0 is None else (h0.to(dev) if cls is torch.nn.GRU
                                                       else (h0.to(dev), h0.to(dev) * 0.5)))
        data = out.data if packed else out
        g = torch.Generator().manual_seed(3)
        data.backward(torch.randn(data.shape, generator=g, dtype=dtype).to(dev))
        res.append([data.detach()] + [xd.grad] + [p.grad for p in md.parameters()])
    return res


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_rnn_modules(mode, cls, bias, packed):
    with torch.tpu.precision("highest"):
        x = torch.randn(7, 3, 4, generator=torch.Generator().manual_seed(1))
        h0 = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(2))
        res = _rnn_case(cls, bias, torch.float32, packed, x, None if packed else h0)
    assert_same(res[1], res[0], atol=1e-5, rtol=1e-4, check_stride=False)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_rnn_cells_and_double_backward(mode, cell):
    with torch.tpu.precision("highest"):
        g = torch.Generator().manual_seed(5)
        x, h = torch.randn(3, 4, generator=g), torch.randn(3, 5, generator=g)
        c = torch.nn.LSTMCell(4, 5) if cell == "lstm" else torch.nn.GRUCell(4, 5)
        ps = [p.detach() for p in c.parameters()]

        def run(x, h, *ps):
            if cell == "lstm":
                hy, cy = torch.lstm_cell(x, (h, h * 0.3), *ps)
                return hy * 2 + cy  # both outputs reach the loss
            return torch.gru_cell(x, h, *ps)
        check_op(run, x, h, *ps, grad=True, atol=1e-5, rtol=1e-4)

        # second order: the differentiable backward composes ordinary ops
        def second(x, h, *ps):
            x = x.detach().requires_grad_()
            y = run(x, h, *ps).pow(2).sum()
            (gx,) = torch.autograd.grad(y, x, create_graph=True)
            return torch.autograd.grad(gx.sum(), x)[0]
        check_op(second, x, h, *ps, atol=1e-4, rtol=1e-4)


def test_lstm_cell_only_hidden_grad(mode):
    # grad_cy undefined (only hy used), and a half-precision cell computed in float32
    with torch.tpu.precision("highest"):
        g = torch.Generator().manual_seed(6)
        x, h = torch.randn(2, 3, generator=g), torch.randn(2, 4, generator=g)
        c = torch.nn.LSTMCell(3, 4)
        ps = [p.detach() for p in c.parameters()]
        check_op(lambda x, h, *ps: torch.lstm_cell(x, (h, h), *ps)[0], x, h, *ps, grad=True,
                 atol=1e-5, rtol=1e-4)
        xh, hh = x.half(), h.half()
        check_op(lambda x, h, *ps: torch.lstm_cell(x, (h, h), *ps), xh, hh,
                 *[p.half() for p in ps], atol=2e-3, rtol=2e-3)
