"""Ops on tpu against PyTorch's CPU results: values, dtypes, shapes, strides,
aliasing and gradients, across dtypes, broadcasting, views, 0-d and empty tensors."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

from util import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, assert_same, check_op, gelu, make

PJRT = torch_tpu._C.target() == "pjrt"

SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 4)]


# ---------------------------------------------------------------- elementwise
UNARY_FLOAT = {
    "exp": (torch.exp, -3, 3), "log": (torch.log, 0.1, 5), "sqrt": (torch.sqrt, 0.1, 5),
    "rsqrt": (torch.rsqrt, 0.1, 5), "tanh": (torch.tanh, -3, 3), "sigmoid": (torch.sigmoid, -5, 5),
    "relu": (torch.relu, -3, 3), "gelu": (F.gelu, -3, 3),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), -3, 3), "silu": (F.silu, -3, 3),
    "neg": (torch.neg, -3, 3), "abs": (torch.abs, -3, 3), "sin": (torch.sin, -3, 3),
    "erf": (torch.erf, -2, 2), "log1p": (torch.log1p, 0, 3), "reciprocal": (torch.reciprocal, 0.5, 3),
    "floor": (torch.floor, -3, 3), "round": (torch.round, -3, 3), "sign": (torch.sign, -3, 3),
    "square": (torch.square, -3, 3), "pow_scalar": (lambda x: x ** 2.5, 0.1, 3),
    "leaky_relu": (F.leaky_relu, -3, 3), "hardtanh": (F.hardtanh, -3, 3),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
def test_unary_float(name, dtype):
    fn, lo, hi = UNARY_FLOAT[name]
    for i, shape in enumerate(SHAPES):
        x = make(shape, dtype, lo, hi, seed=i)
        grad = dtype in (torch.float32, torch.float64) and name not in ("floor", "round", "sign")
        check_op(fn, x, grad=grad)
    check_op(fn, make((4, 6), dtype, lo, hi, noncontig=True), grad=False)
    check_op(lambda x: fn(x[:, ::2]), make((4, 6), dtype, lo, hi), grad=False)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool], ids=str)
def test_unary_int_promotes(dtype):
    x = make((3, 4), dtype, 0, 5)
    for fn in (torch.exp, torch.sqrt, torch.sigmoid, torch.neg if dtype != torch.bool else torch.abs,
               torch.abs if dtype not in (torch.bool,) else torch.logical_not, torch.isnan,
               torch.isfinite, torch.logical_not):
        check_op(fn, x)


def test_unary_special_values():
    vals = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -2.0]
    if PJRT:
        # XLA's CPU plugin runs every program with subnormals flushed to zero (FTZ/DAZ, as
        # TPUs do), so 1e-40 reads as 0 there; the other special values still apply
        vals.remove(1e-40)
    x = torch.tensor(vals)
    for fn in (torch.exp, torch.log, torch.sqrt, torch.tanh, torch.sigmoid, torch.relu, torch.abs,
               torch.isnan, torch.isinf, torch.isfinite, torch.sign, F.silu,
               lambda t: torch.nan_to_num(t), lambda t: torch.clamp(t, -1, 1)):
        check_op(fn, x)
    for approximate in ("none", "tanh"):
        check_op(lambda t: gelu(t, approximate), x)


BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
}
PAIRS = [(torch.float32, torch.float32), (torch.float32, torch.float64),
         (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
         (torch.bfloat16, torch.float16), (torch.int64, torch.int64), (torch.int32, torch.int8),
         (torch.uint8, torch.int8), (torch.int32, torch.float32), (torch.bool, torch.int64),
         (torch.bool, torch.bool), (torch.int16, torch.float16)]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_promotion_broadcast(name, pair):
    fn = BINARY[name]
    da, db = pair
    if name in ("sub",) and torch.bool in pair:
        pytest.skip("sub of bools is an error on CPU too")
    if name == "add_alpha" and torch.bool in pair:
        pytest.skip("alpha is not boolean")
    check_op(fn, make((3, 4), da, seed=1), make((3, 4), db, seed=2))
    check_op(fn, make((2, 1, 4), da, seed=3), make((3, 1), db, seed=4))  # broadcast both
    check_op(fn, make((4, 3), da, seed=5, noncontig=True), make((3,), db, seed=6))
    check_op(fn, make((), da, seed=7), make((2, 3), db, seed=8))  # 0-d operand
    check_op(fn, make((0, 3), da), make((3,), db))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.int32, torch.uint8], ids=str)
def test_python_scalars(dtype):
    x = make((2, 5), dtype, 1, 4)
    for fn in (lambda t: t + 2, lambda t: t * 2.5, lambda t: 3 - t, lambda t: t / 2,
               lambda t: t > 1.5, lambda t: t == 2, lambda t: t ** 2, lambda t: 2 ** t,
               lambda t: t * True, lambda t: torch.where(t > 2, t, 0)):
        check_op(fn, x)


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.int32], ids=str)
def test_div_rounding_modes(mode, dtype):
    a = make((4, 5), dtype, -7, 7, seed=1)
    b = make((4, 5), dtype, 1, 4, seed=2) * torch.tensor([1, -1, 1, -1, 1]).to(dtype)
    check_op(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b,
             grad=dtype.is_floating_point and mode is None)
    check_op(lambda x: torch.div(x, -3, rounding_mode=mode), a)
    if dtype.is_floating_point:
        check_op(lambda x, y: torch.remainder(x, y), a, b)
        check_op(lambda x, y: torch.fmod(x, y), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_binary_grads(dtype):
    a, b = make((3, 4), dtype, 0.5, 2, seed=1), make((4,), dtype, 0.5, 2, seed=2)
    for fn in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x / y, lambda x, y: x - 3 * y,
               torch.pow, torch.maximum, lambda x, y: torch.where(x > 1, x, y)):
        check_op(fn, a, b, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_clamp_where_masked_fill(dtype):
    x = make((4, 6), dtype, -5, 5)
    check_op(lambda t: torch.clamp(t, -2, 3), x, grad=dtype == torch.float32)
    check_op(lambda t: torch.clamp(t, min=-1), x)
    check_op(lambda t: torch.clamp(t, max=1), x)
    lo, hi = make((6,), dtype, -4, -1, seed=3), make((4, 1), dtype, 1, 4, seed=4)
    check_op(lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
    mask = make((4, 6), torch.bool, seed=9)
    check_op(lambda t, m: t.masked_fill(m, 7), x, mask)
    check_op(lambda t, m: t.masked_fill(m[0], -1), x, mask)
    check_op(lambda t, m: torch.where(m, t, t * 2), x, mask)
    check_op(lambda t: torch.where(t > 0, 1.0, 0.0), x)


def test_masked_fill_grad_and_tensor_value():
    x = make((3, 4), torch.float32)
    m = make((3, 4), torch.bool, seed=3)
    check_op(lambda t, mm: t.masked_fill(mm, float("-inf")).softmax(-1), x, m, grad=True)
    v = torch.tensor(2.5)
    check_op(lambda t, mm, vv: t.masked_fill(mm, vv), x, m, v.to("cpu"))


def test_bitwise_and_shifts():
    a, b = make((3, 4), torch.int32, -8, 8, seed=1), make((3, 4), torch.int32, 0, 3, seed=2)
    for fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor, lambda x, y: x << y,
               lambda x, y: x >> y, lambda x, y: ~x):
        check_op(fn, a, b)
    check_op(lambda x: ~x, make((5,), torch.bool))


# ------------------------------------------------------------ in-place & views
def test_inplace_and_views_alias_like_cpu():
    for dev in ("cpu", "tpu"):
        base = torch.arange(12.0).reshape(3, 4).to(dev)
        v = base[:, 1]          # strided view
        v.mul_(10)
        base[0].add_(100)
        t = base.t()
        t[2].zero_()
        base.view(-1)[-1] = -1  # write through a view via copy_/fill_
        d = base.diagonal()
        d.fill_(5)
        if dev == "cpu":
            expected = base.clone()
        else:
            assert_same(base, expected)
    x = torch.zeros(4, device="tpu")
    y = x.view(2, 2)
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y[1] = 3
    assert x.cpu().tolist() == [0, 0, 3, 3]
    z = x.as_strided((2,), (2,), 1)
    z.add_(1)
    assert x.cpu().tolist() == [0, 1, 3, 4]


def test_inplace_version_counter_and_autograd():
    x = torch.ones(3, device="tpu", requires_grad=True)
    y = x * 2
    y.add_(1)
    y.sum().backward()
    assert x.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    w = torch.ones(3, device="tpu", requires_grad=True)
    s = torch.sigmoid(w)
    s.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_copies_across_dtypes_and_devices(dtype):
    src = make((3, 4), dtype, -3, 3)
    t = src.to("tpu")
    assert_same(t, src)
    for other in (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.uint8):
        assert_same(t.to(other), src.to(other))
        dst = torch.empty(3, 4, dtype=other, device="tpu")
        dst.copy_(t)  # device -> device, converting
        assert_same(dst, src.to(other))
        dst2 = torch.empty(4, 3, dtype=other, device="tpu").t()
        dst2.copy_(src)  # host -> strided device
        assert_same(dst2.contiguous(), src.to(other))
    assert_same(t.t().contiguous(), src.t().contiguous())
    cpu_out = torch.empty(4, 3, dtype=dtype).t()
    cpu_out.copy_(t)  # device -> strided host
    assert torch.equal(cpu_out, src)
    assert_same(t[1:, ::2].clone(), src[1:, ::2].clone())
    assert_same(torch.empty(2, 3, device="tpu").copy_(torch.tensor([1.0, 2, 3])),
                torch.empty(2, 3).copy_(torch.tensor([1.0, 2, 3])))  # broadcast copy


def test_factories_and_metadata_ops():
    assert_same(torch.zeros(2, 3, device="tpu"), torch.zeros(2, 3))
    assert_same(torch.ones(2, 3, dtype=torch.int8, device="tpu"), torch.ones(2, 3, dtype=torch.int8))
    assert_same(torch.full((2, 2), 3.5, device="tpu"), torch.full((2, 2), 3.5))
    assert_same(torch.full((2,), 7, device="tpu"), torch.full((2,), 7))
    assert_same(torch.arange(10, device="tpu"), torch.arange(10))
    assert_same(torch.arange(1, 4, 0.5, device="tpu"), torch.arange(1, 4, 0.5))
    assert_same(torch.arange(5, -3, -2, device="tpu"), torch.arange(5, -3, -2))
    e = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert e.stride() == (1, 2) and e.device.type == "tpu"
    assert torch.empty(0, device="tpu").numel() == 0
    x = torch.arange(6.0, device="tpu")
    assert_same(x.view(2, 3), torch.arange(6.0).view(2, 3))
    assert_same(x.reshape(3, 2).t(), torch.arange(6.0).reshape(3, 2).t())
    assert_same(x.as_strided((2, 2), (1, 2), 1), torch.arange(6.0).as_strided((2, 2), (1, 2), 1))
    r = torch.arange(4.0, device="tpu")
    r.resize_(2, 3)
    assert r.shape == (2, 3) and r[0].cpu().tolist()[:3] == [0, 1, 2]
    s = torch.empty(0, device="tpu")
    s.set_(x.untyped_storage(), 2, (2,), (1,))
    assert s.cpu().tolist() == [2.0, 3.0]
    s2 = torch.empty(0, device="tpu").set_(x)
    assert s2.cpu().tolist() == x.cpu().tolist()
    assert torch.tensor(3.5, device="tpu").item() == 3.5
    assert torch.tensor([True], device="tpu").item() is True
    assert torch.tensor(7, dtype=torch.int16, device="tpu").item() == 7
    f = torch.empty(2, 3, device="tpu").fill_(2.0)
    assert_same(f, torch.full((2, 3), 2.0))
    f.zero_()
    assert_same(f, torch.zeros(2, 3))
    assert_same(torch.zeros_like(f, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.bfloat16))
    assert_same(torch.eye(3, device="tpu"), torch.eye(3))


# ----------------------------------------------------------------- reductions
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=str)
def test_reductions_float(dtype):
    x = make((4, 5, 6), dtype, seed=3)
    for fn in (lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.sum((0, 2), keepdim=True),
               lambda t: t.mean(), lambda t: t.mean(-1), lambda t: t.amax(1), lambda t: t.amin((0, 1)),
               lambda t: t.max(), lambda t: t.min(), lambda t: t.var(1), lambda t: t.std(),
               lambda t: t.var(0, correction=0), lambda t: t.std(2, keepdim=True),
               lambda t: t.sum(dtype=torch.float64), lambda t: t.norm(), lambda t: t.logsumexp(1),
               lambda t: t.prod(2)):
        check_op(fn, x, grad=dtype in (torch.float32, torch.float64), check_stride=False,
                 atol=1e-2 if dtype in (torch.bfloat16, torch.float16) else None,
                 rtol=1e-2 if dtype in (torch.bfloat16, torch.float16) else None)
    check_op(lambda t: t.sum(0), make((5, 3), dtype, noncontig=True))
    check_op(lambda t: t.sum(), make((0, 3), dtype))
    check_op(lambda t: t.sum(0), make((0, 3), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.uint8, torch.bool],
                         ids=str)
def test_reductions_with_indices(dtype):
    x = make((4, 7), dtype, 0, 3, seed=5)  # many ties
    for fn in (lambda t: t.max(1), lambda t: t.min(0), lambda t: t.max(1, keepdim=True),
               lambda t: t.argmax(), lambda t: t.argmin(1), lambda t: t.argmax(0, keepdim=True),
               lambda t: t.amax(1), lambda t: t.all(), lambda t: t.any(1), lambda t: t.all(0),
               lambda t: t.sum(), lambda t: t.sum(1)):
        check_op(fn, x)


def test_max_dim_nan_and_grad():
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, 5.0]])
    check_op(lambda t: t.max(1), x)
    check_op(lambda t: t.amax(1), x)
    y = make((3, 5), torch.float32, seed=2)
    check_op(lambda t: t.max(1)[0], y, grad=True)
    check_op(lambda t: t.amax(0), y, grad=True)


# ------------------------------------------------------------------- matmul
@pytest.fixture
def highest_precision():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_matmul_family(dtype, highest_precision):
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    grad = dtype != torch.bfloat16
    a, b = make((37, 19), dtype, seed=1), make((19, 53), dtype, seed=2)
    check_op(torch.mm, a, b, grad=grad, **tol)
    check_op(lambda x, y: x.t() @ y, make((19, 37), dtype), b, grad=grad, **tol)
    check_op(lambda x, y: x @ y.t(), a, make((53, 19), dtype), grad=grad, **tol)
    check_op(torch.bmm, make((3, 8, 5), dtype), make((3, 5, 6), dtype), grad=grad, **tol)
    bias = make((53,), dtype, seed=3)
    check_op(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2), bias, a, b, grad=grad, **tol)
    check_op(F.linear, make((4, 7, 19), dtype), make((11, 19), dtype), make((11,), dtype),
             grad=grad, **tol)
    check_op(torch.matmul, make((2, 3, 5, 4), dtype), make((4, 6), dtype), grad=grad, **tol)
    check_op(torch.mm, make((4, 0), dtype), make((0, 3), dtype))  # K = 0
    check_op(torch.mm, make((0, 5), dtype), make((5, 3), dtype))


def test_matmul_int():
    check_op(torch.mm, make((5, 4), torch.int64, seed=1), make((4, 3), torch.int64, seed=2))


# ----------------------------------------------------------------------- nn
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_softmax_family(dtype):
    x = make((4, 5, 6), dtype, -4, 4)
    g = dtype != torch.bfloat16
    for dim in (-1, 0, 1):
        check_op(lambda t: F.softmax(t, dim), x, grad=g)
        check_op(lambda t: F.log_softmax(t, dim), x, grad=g)
    check_op(lambda t: F.softmax(t, -1), make((6, 4), dtype, noncontig=True), grad=g)
    check_op(lambda t: F.softmax(t.float(), -1), x)
    check_op(lambda t: F.softmax(t, -1, dtype=torch.float32), x, grad=g)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_and_cross_entropy(reduction):
    logits = make((6, 5), torch.float32, seed=1)
    target = torch.tensor([0, 4, 2, 1, 3, 2])
    weight = make((5,), torch.float32, 0.5, 2, seed=2)
    check_op(lambda x, t: F.cross_entropy(x, t, reduction=reduction), logits, target, grad=True)
    check_op(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction, ignore_index=2),
             logits, target, weight, grad=True)
    check_op(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t, reduction=reduction), logits, target,
             grad=True)
    check_op(lambda x, t: F.cross_entropy(x, t, reduction=reduction),
             make((2, 5, 3), torch.float32, seed=3), torch.tensor([[0, 1, 4], [2, 2, 3]]), grad=True)


def test_nll_loss_bad_target():
    x = torch.randn(3, 4, device="tpu")
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(x, torch.tensor([0, 9, 1], device="tpu")).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_layer_norm(dtype):
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    g = dtype != torch.bfloat16
    x = make((4, 3, 8), dtype, seed=1)
    w, b = make((8,), dtype, seed=2), make((8,), dtype, seed=3)
    check_op(lambda t, ww, bb: F.layer_norm(t, (8,), ww, bb), x, w, b, grad=g, **tol)
    check_op(lambda t: F.layer_norm(t, (3, 8)), x, grad=g, **tol)
    check_op(lambda t, ww: F.layer_norm(t, (8,), ww, None, eps=1e-3), x, w, grad=g, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_softmax_layer_norm_long_rows(dtype):
    """rows long enough for the vectorized single-precision kernels (with tails), special
    values, and layer norm of data far from zero"""
    tol = dict(atol=2e-2, rtol=2e-2) if dtype != torch.float32 else {}
    # 16-bit: CPU rounds max + log(sum) to the dtype in log_softmax, off by up to half an
    # ulp of the row maximum; a small range keeps that within the tolerance
    hi = 20 if dtype == torch.float32 else 4
    for n in (1, 7, 1027, 4096):
        x = make((5, n), dtype, -hi, hi, seed=n)
        check_op(lambda t: F.softmax(t, -1), x)
        check_op(lambda t: F.log_softmax(t, -1), x)
        check_op(lambda t: F.softmax(t, -1, dtype=torch.float32), x)
        w, b = make((n,), dtype, seed=2), make((n,), dtype, seed=3)
        check_op(lambda t, ww, bb: F.layer_norm(t, (n,), ww, bb), x, w, b, **tol)
        check_op(lambda t, ww: F.layer_norm(t, (n,), ww), x, w, **tol)
        check_op(lambda t, bb: F.layer_norm(t, (n,), None, bb), x, b, **tol)
        check_op(lambda t: F.layer_norm(t, (n,)), x, **tol)
    x = make((6, 300), dtype, -5, 5)
    x[1, 7] = float("-inf")
    x[2] = float("-inf")
    x[3, 100] = float("nan")
    x[4, 5] = float("inf")
    check_op(lambda t: F.softmax(t, -1), x)
    check_op(lambda t: F.log_softmax(t, -1), x)
    check_op(lambda t: F.layer_norm(t + 4, (300,)), make((6, 300), dtype, -1, 1), **tol)
    if dtype == torch.float32:  # far from zero CPU's float statistics lose digits; ours do not
        t = make((6, 300), dtype, -1, 1) + 100
        ref = F.layer_norm(t.double(), (300,))
        assert (F.layer_norm(t.to("tpu"), (300,)).cpu().double() - ref).abs().max() < 1e-6
    check_op(lambda t: F.layer_norm(t, (300,)), x[3:4], **tol)
    # a view with strided rows, and one whose rows are strided (the double path)
    y = make((8, 600), dtype, -3, 3)
    check_op(lambda t: F.softmax(t[::2, ::2], -1), y)
    check_op(lambda t: F.log_softmax(t[:, 1:], -1), y)
    check_op(lambda t: F.layer_norm(t[::3, :500], (500,)), y, **tol)


def test_index_select_blocks():
    """index_select and embedding on the block-copy path: any dim, strided outer dims,
    int32 and int64 indices, duplicates"""
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        x = make((6, 5, 40), dtype, seed=4)
        for dim in (0, 1, 2):
            idx = torch.tensor([4, 0, 0, 3, 1])
            check_op(lambda t, i: torch.index_select(t, dim, i), x, idx)
            check_op(lambda t, i: torch.index_select(t, dim, i), x, idx.int())
            check_op(lambda t, i: torch.index_select(t.transpose(0, 1), dim, i), x, idx)
            check_op(lambda t, i: torch.index_select(t[::2], dim, i), x, idx)
        check_op(lambda t, i: torch.index_select(t, 0, i), x, torch.tensor([], dtype=torch.long))
    w = make((300, 64), torch.float32, seed=5)
    idx = torch.randint(0, 300, (7, 50), generator=torch.Generator().manual_seed(0))
    check_op(F.embedding, idx, w)
    check_op(lambda i, ww: torch.index_select(ww, 0, i[::2].flatten()), idx, w)


def test_embedding():
    w = make((10, 4), torch.float32, seed=1)
    idx = torch.tensor([[1, 3, 3], [9, 0, 1]])
    check_op(F.embedding, idx, w, grad=True)
    check_op(lambda i, ww: F.embedding(i, ww, padding_idx=3), idx, w, grad=True)
    check_op(lambda i, ww: F.embedding(i, ww, scale_grad_by_freq=True), idx, w, grad=True)


def test_dropout():
    torch.tpu.manual_seed(0)
    x = torch.ones(2000, device="tpu", requires_grad=True)
    y = F.dropout(x, 0.3, training=True)
    kept = (y != 0).float()
    frac = kept.mean().item()
    assert 0.62 < frac < 0.78
    nz = y[y != 0]
    assert torch.allclose(nz.cpu(), torch.full_like(nz.cpu(), 1 / 0.7))
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad.cpu(), (kept / 0.7).cpu())
    assert torch.equal(F.dropout(x, 0.3, training=False).detach().cpu(), x.detach().cpu())
    torch.tpu.manual_seed(4)
    a = F.dropout(torch.ones(100, device="tpu"), 0.5).cpu()
    torch.tpu.manual_seed(4)
    assert torch.equal(F.dropout(torch.ones(100, device="tpu"), 0.5).cpu(), a)


# ----------------------------------------------------------------- indexing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_cat_and_select(dtype):
    a, b = make((2, 3), dtype, seed=1), make((4, 3), dtype, seed=2, noncontig=True)
    check_op(lambda x, y: torch.cat([x, y]), a, b, grad=dtype == torch.float32)
    check_op(lambda x, y: torch.cat([x.t(), y.t()], 1), a, b)
    check_op(lambda x, y: torch.stack([x, y[:2]], 1), a, b)
    check_op(lambda x: torch.cat([x, torch.empty(0, dtype=x.dtype, device=x.device)]), a)
    idx = torch.tensor([3, 0, 0, 1])
    check_op(lambda x, i: torch.index_select(x, 0, i), b, idx, grad=dtype == torch.float32)
    check_op(lambda x, i: x[i], b, idx)
    check_op(lambda x: x[-1], b)
    check_op(lambda x: x[1:3, 1:], b)


def test_cat_mixed_dtypes():
    check_op(lambda x, y: torch.cat([x, y]), make((2, 3), torch.int32), make((1, 3), torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_gather_scatter(dtype):
    x = make((4, 5), dtype, seed=1)
    idx = torch.tensor([[0, 1, 2, 3, 0], [3, 3, 0, 1, 2]])
    g = dtype.is_floating_point
    check_op(lambda t, i: torch.gather(t, 0, i), x, idx, grad=g)
    check_op(lambda t, i: torch.gather(t, 1, i[:, :3] % 5), x, idx, grad=g)
    src = make((2, 5), dtype, seed=2)
    check_op(lambda t, i, s: t.scatter(0, i, s), x, idx[:, :], src, grad=False)
    check_op(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src, grad=g)
    check_op(lambda t, i: t.scatter(1, i % 5, 2), x, idx)
    check_op(lambda t, i, s: torch.zeros_like(t).scatter_(0, i, s, reduce="add"), x, idx, src)


def test_advanced_indexing():
    x = make((4, 5, 6), torch.float32, seed=1)
    i0 = torch.tensor([0, 3, 3])
    i1 = torch.tensor([[1], [4]])
    check_op(lambda t, a: t[a], x, i0, grad=True)
    check_op(lambda t, a, b: t[a, b], x, i0, i1, grad=True)        # broadcast indices
    check_op(lambda t, a, b: t[:, a, b[:, 0][:1]], x, i0, i1, grad=True)  # adjacent, after slice
    check_op(lambda t, a, b: t[a, :, b], x, i0, i1, grad=True)     # non-adjacent
    check_op(lambda t, a: t[..., a % 6], x, i0)
    check_op(lambda t, a: t[a.to("cpu")] if t.device.type == "tpu" else t[a], x, i0)  # CPU index
    m = make((4, 5), torch.bool, seed=2)
    check_op(lambda t, mm: t[mm], x, m, grad=True)
    check_op(lambda t, mm: torch.masked_select(t, mm), make((4, 5), torch.float32), m, grad=True)
    check_op(lambda t: t[t > 0.5], x)


def test_index_put():
    for acc in (False, True):
        x = make((5, 3), torch.float32, seed=1)
        idx = torch.tensor([0, 4, 0])
        v = make((3, 3), torch.float32, seed=2)
        check_op(lambda t, i, vv: t.index_put((i,), vv, accumulate=acc), x, idx, v,
                 grad=not acc)
        check_op(lambda t, i, vv: t.index_put((i, i % 3), vv[0], accumulate=acc), x, idx, v)
    def setitem(t, m):
        t = t.clone()
        t[m] = 0.5
        return t
    check_op(setitem, make((4, 4), torch.float32), make((4, 4), torch.bool, seed=3), grad=True)
    def setrow(t, i):
        t = t.clone()
        t[i] = torch.arange(4.0, device=t.device)
        return t
    check_op(setrow, make((4, 4), torch.float32), torch.tensor([2, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool], ids=str)
def test_nonzero_triu_tril_cumsum(dtype):
    x = make((4, 5), dtype, -1, 1, seed=4)
    check_op(torch.nonzero, x)
    check_op(lambda t: torch.nonzero(t, as_tuple=True), x)
    check_op(torch.nonzero, make((0, 3), dtype))
    check_op(torch.nonzero, make((), dtype, 1, 1))
    check_op(lambda t: t.triu(1), x)
    check_op(lambda t: t.tril(-1), make((2, 4, 3), dtype))
    if dtype != torch.bool:
        check_op(lambda t: t.cumsum(1), x, grad=dtype == torch.float32)
        check_op(lambda t: t.cumsum(0), make((4, 3), dtype, noncontig=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_sort_topk(dtype):
    x = make((4, 9), dtype, -3, 3, seed=5)
    check_op(lambda t: torch.sort(t, dim=1, stable=True), x)
    check_op(lambda t: torch.sort(t, dim=0, descending=True, stable=True), x)
    check_op(lambda t: torch.topk(t, 3, 1), make((4, 9), dtype, -100, 100, seed=6))
    check_op(lambda t: torch.topk(t, 2, 0, largest=False), make((5, 4), dtype, -100, 100, seed=7))
    if dtype == torch.float32:
        check_op(lambda t: torch.sort(t, -1)[0], make((3, 7), dtype, seed=8), grad=True)
        nan = torch.tensor([3.0, float("nan"), -1.0, 2.0])
        check_op(lambda t: torch.sort(t), nan)
        check_op(lambda t: torch.sort(t, descending=True), nan)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.bool], ids=str)
def test_tie_order_matches_cpu(dtype):
    """Equal values leave sort(stable=False), argsort, topk (heap and selection
    paths, sorted or not) and kthvalue in the same order as on CPU, whose order
    comes from its algorithms rather than from the values (tpu runs the same
    schemes); stable sorts keep the original order."""
    g = torch.Generator().manual_seed(11)
    x = torch.randint(0, 2 if dtype == torch.bool else 5, (3, 700), generator=g).to(dtype)
    if dtype.is_floating_point:
        x[0, ::37] = float("nan")
    t = x.to("tpu")
    def same(a, b):
        for u, v in zip(a, b):
            assert u.dtype == v.dtype
            assert torch.equal(u.cpu().nan_to_num(9), v.nan_to_num(9)) if v.is_floating_point() \
                else torch.equal(u.cpu(), v)

    def key(v):
        return v.nan_to_num(9) if v.is_floating_point() else v

    def same_ties(a, b, src, dim):
        """(values, indices) of an unstable sort, topk or kthvalue. On pjrt the program
        sorts with XLA's sort, whose order of ties is its own: CPU's comes from libstdc++'s
        introsort and heaps, which a StableHLO program does not replay. There the values
        must match CPU's (as multisets for unsorted topk) and the indices point at them."""
        if not PJRT:
            return same(a, b)
        vals, idx, ref = a[0].cpu(), a[1].cpu(), b[0]
        assert vals.dtype == ref.dtype and idx.dtype == b[1].dtype and vals.shape == ref.shape
        if vals.dim() < src.dim():
            vals, idx, ref = vals.unsqueeze(dim), idx.unsqueeze(dim), ref.unsqueeze(dim)
        assert torch.equal(key(src.gather(dim, idx)), key(vals))
        assert torch.equal(key(vals).sort(dim)[0], key(ref).sort(dim)[0])

    for kw in ({}, dict(descending=True), dict(stable=False), dict(stable=True, descending=True)):
        if kw.get("stable"):
            same(torch.sort(t, dim=1, **kw), torch.sort(x, dim=1, **kw))
            same(torch.sort(t.T, dim=0, **kw), torch.sort(x.T, dim=0, **kw))
        else:
            same_ties(torch.sort(t, dim=1, **kw), torch.sort(x, dim=1, **kw), x, 1)
            same_ties(torch.sort(t.T, dim=0, **kw), torch.sort(x.T, dim=0, **kw), x.T, 0)
    same_ties((torch.sort(t, dim=1)[0], torch.argsort(t, dim=1)), (torch.sort(x, dim=1)[0], torch.argsort(x, dim=1)),
              x, 1)
    if dtype == torch.bool:
        return
    for k in (1, 5, 11, 300, 700):  # k * 64 <= 700 takes CPU's heap path
        for largest in (True, False):
            for sort in (True, False):
                same_ties(torch.topk(t, k, 1, largest, sort), torch.topk(x, k, 1, largest, sort), x, 1)
        same_ties(torch.kthvalue(t, k, 1), torch.kthvalue(x, k, 1), x, 1)


# ------------------------------------------------------------------ random
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=str)
def test_random_distributions(dtype):
    torch.tpu.manual_seed(1)
    u = torch.empty(20000, dtype=dtype, device="tpu").uniform_(-2, 3).float().cpu()
    assert u.min() >= -2 and u.max() <= 3 and abs(u.mean() - 0.5) < 0.05
    n = torch.empty(20000, dtype=dtype, device="tpu").normal_(1, 2).float().cpu()
    assert abs(n.mean() - 1) < 0.08 and abs(n.std() - 2) < 0.08
    b = torch.empty(20000, dtype=dtype, device="tpu").bernoulli_(0.25).float().cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.25) < 0.02
    r = torch.randint(-5, 5, (1000,), device="tpu").cpu()
    assert r.min() == -5 and r.max() == 4 and r.dtype == torch.int64
    p = torch.full((1000,), 0.9, device="tpu")
    assert abs(torch.bernoulli(p).mean().item() - 0.9) < 0.05
    e = torch.randn(3, 4, device="tpu").t()
    e.normal_()  # non-contiguous target
    assert e.shape == (4, 3)


# ------------------------------------------------------------- dtype sweep
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_core_ops_every_dtype(dtype):
    """The core op set on every supported dtype, including views and 0-d/empty tensors."""
    x, y = make((3, 4), dtype, 0, 4, seed=1), make((4,), dtype, 1, 4, seed=2)
    ops = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a == b, lambda a, b: a < b,
           lambda a, b: torch.maximum(a, b), lambda a, b: torch.where(a > b, a, b),
           lambda a, b: torch.cat([a, b[None]]), lambda a, b: a.t().contiguous(),
           lambda a, b: a[:, 1:3].clone(), lambda a, b: a.sum(0), lambda a, b: a.amax(1),
           lambda a, b: a.index_select(1, torch.tensor([3, 0], device=a.device)),
           lambda a, b: torch.gather(a, 1, torch.tensor([[0], [2], [3]], device=a.device)),
           lambda a, b: a.masked_fill(a > 1, 0), lambda a, b: a.triu(), lambda a, b: a.flip(0),
           lambda a, b: a.to(torch.float32), lambda a, b: a.any(), lambda a, b: a[a > 1],
           lambda a, b: torch.nonzero(a), lambda a, b: a.view(-1)[5], lambda a, b: a.clone().fill_(1)]
    if dtype != torch.bool:
        ops += [lambda a, b: a - b, lambda a, b: a.cumsum(1), lambda a, b: torch.sort(a, 1)[0],
                lambda a, b: torch.clamp(a, 1, 2), lambda a, b: a.abs()]
    for fn in ops:
        check_op(fn, x, y)
        check_op(fn, make((3, 4), dtype, 0, 4, seed=3, noncontig=True), y)
    check_op(lambda a: a + a, make((), dtype, 1, 3))
    check_op(lambda a: a.sum(), make((0, 4), dtype))
    assert_same(torch.zeros(2, 3, dtype=dtype, device="tpu"), torch.zeros(2, 3, dtype=dtype))
    t = make((5,), dtype, 0, 4).to("tpu")
    assert t.dtype == dtype and t[2].item() == t.cpu()[2].item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_unique(dtype):
    x = make((4, 5), dtype, -2, 2, seed=11)
    check_op(lambda t: torch.unique(t), x)
    check_op(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    check_op(lambda t: torch.unique_consecutive(t.flatten(), return_inverse=True,
                                                return_counts=True), x)
    check_op(lambda t: torch.unique(t), make((0,), dtype))
    # by dim: runs of equal slices (inverse and counts come back whatever the flags say)
    rows = x[torch.tensor([0, 0, 2, 1, 1, 1, 0, 2])]
    for d in (0, 1, -1):
        check_op(lambda t: torch.unique_consecutive(t, dim=d), rows)
        check_op(lambda t: torch.ops.aten.unique_consecutive(t, False, False, d), rows)
    check_op(lambda t: torch.unique_consecutive(t, return_inverse=True, dim=0), make((0, 3), dtype))
    check_op(lambda t: torch.unique_consecutive(t, return_counts=True, dim=0), x[:, :1])
    # a 1-D tensor: dim 0 follows the flags, dim -1 returns everything (CPU's split)
    for d in (0, -1):
        check_op(lambda t: torch.ops.aten.unique_consecutive(t, True, False, d), x[0])
    for dev in ("cpu", "tpu"):  # a 0-d tensor has no dim 0
        with pytest.raises(IndexError, match="no dimensions"):
            torch.ops.aten.unique_consecutive(torch.tensor(5).to(dev), False, False, 0)
        with pytest.raises(IndexError, match="no dimensions"):
            torch.unique(torch.tensor(5).to(dev), dim=0)
    for inverse in (False, True):  # the older _unique overload (index_fill's backward uses it)
        check_op(lambda t: torch._unique(t, True, inverse), x)


def test_equal_returns_bool():
    a = torch.arange(6.0).reshape(2, 3)
    for other in (a.clone(), a + 1, a[:1], a.t().contiguous().t()):
        assert torch.equal(a.to("tpu"), other.to("tpu")) == torch.equal(a, other)


def test_repeat_interleave_data_dependent():
    r = torch.tensor([1, 0, 3])
    check_op(torch.repeat_interleave, r)
    check_op(lambda x, rr: torch.repeat_interleave(x, rr, dim=0), make((3, 2), torch.float32), r)
