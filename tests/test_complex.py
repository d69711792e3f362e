"""complex64 / complex128 on tpu against PyTorch CPU: creation, copies and casts,
views over the same storage (view_as_real, view_as_complex, .real/.imag), the lazy
conjugate bit, shape and index ops, element-wise math with real and complex operands
(products and quotients of special values as CPU's), reductions, products, autograd, and refusals."""
import math
import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

from util import assert_same, crand

DEV = "tpu"
CDT = [torch.complex64, torch.complex128]


def tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.complex64 else dict(atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", CDT)
def test_creation(mode, dtype):
    assert_same(torch.zeros(3, 4, dtype=dtype, device=DEV), torch.zeros(3, 4, dtype=dtype))
    assert_same(torch.ones(2, 3, dtype=dtype, device=DEV), torch.ones(2, 3, dtype=dtype))
    assert_same(torch.full((2, 2), 1 - 2j, dtype=dtype, device=DEV),
                torch.full((2, 2), 1 - 2j, dtype=dtype))
    e = torch.empty(5, dtype=dtype, device=DEV)
    assert e.dtype == dtype and e.shape == (5,)
    t = torch.tensor([1 + 2j, -3.5j, 4], device=DEV, dtype=dtype)
    assert_same(t, torch.tensor([1 + 2j, -3.5j, 4], dtype=dtype))
    assert torch.tensor([1j], device=DEV).dtype == torch.complex64
    r = torch.randn(1000, dtype=dtype, device=DEV)
    assert r.dtype == dtype
    # each part has variance 1/2, as CPU's randn
    assert abs(r.real.float().var().item() - 0.5) < 0.1
    assert abs(r.imag.float().var().item() - 0.5) < 0.1


@pytest.mark.parametrize("dtype", CDT)
def test_copies_and_casts(mode, dtype):
    x = crand((4, 5), dtype)
    d = x.to(DEV)
    assert_same(d, x)
    assert torch.equal(d.cpu(), x)
    assert_same(d.t().contiguous(), x.t().contiguous())
    assert_same(d[:, 1::2].clone(), x[:, 1::2].clone())
    other = torch.complex128 if dtype == torch.complex64 else torch.complex64
    assert_same(d.to(other), x.to(other))
    r = torch.randn(3, 4, dtype=torch.float64)
    assert_same(r.to(DEV).to(dtype), r.to(dtype))
    assert_same(torch.arange(6, device=DEV).to(dtype), torch.arange(6).to(dtype))
    with warnings.catch_warnings():  # (warned once per process, as CPU)
        warnings.simplefilter("ignore")
        assert_same(d.to(torch.float32), x.to(torch.float32))
        assert_same(d.to(torch.int32), x.to(torch.int32))
    out = torch.empty(4, 5, dtype=dtype, device=DEV)
    out.copy_(r.new_ones(4, 5).to(DEV))
    assert_same(out, torch.ones(4, 5, dtype=dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_views_alias_storage(mode, dtype):
    x = crand((3, 4), dtype)
    d = x.to(DEV)
    vr = torch.view_as_real(d)
    assert_same(vr, torch.view_as_real(x))
    assert vr.data_ptr() == d.data_ptr()
    vr[0, 0, 1] = 7.0  # writes d's imaginary part
    assert d[0, 0].item().imag == 7.0
    back = torch.view_as_complex(vr)
    assert back.data_ptr() == d.data_ptr() and back.dtype == dtype
    x2 = x.clone()
    x2[0, 0] = complex(x[0, 0].real.item(), 7.0)
    assert_same(d, x2)
    assert_same(d.real, x2.real)
    assert_same(d.imag, x2.imag)
    d.imag.zero_()
    assert torch.count_nonzero(d.imag.cpu()).item() == 0
    assert d.real.stride() == x.real.stride() and d.imag.storage_offset() == 1
    with pytest.raises(RuntimeError, match="last dimension"):
        torch.view_as_complex(torch.zeros(3, 3, device=DEV))


def test_printing(mode):
    x = torch.tensor([1.5 + 2j, -0.5j, 1e-3 + 4j])
    def flat(s):
        return " ".join(s.split())

    assert flat(repr(x.to(DEV))) == flat(repr(x)[:-1] + ", device='tpu:0')")
    assert flat(str(x.to(DEV).conj())) == flat(str(x.conj())[:-1] + ", device='tpu:0')")


@pytest.mark.parametrize("dtype", CDT)
def test_conj_bit(mode, dtype):
    x = crand((3, 4), dtype)
    d = x.to(DEV)
    c = d.conj()
    assert c.is_conj() and c.data_ptr() == d.data_ptr()
    assert_same(c.resolve_conj(), x.conj().resolve_conj())
    assert not c.resolve_conj().is_conj()
    assert_same(torch.conj_physical(d), torch.conj_physical(x))
    assert torch.equal(c.cpu(), x.conj())
    assert_same(c + 1, x.conj() + 1, **tol(dtype))
    assert c.imag.is_neg()
    assert_same(c.imag, x.conj().imag)
    dd = d.clone()
    dd.conj_physical_()
    assert_same(dd, x.conj_physical())
    # copies into and out of conjugated views
    t = torch.zeros(3, 4, dtype=dtype, device=DEV)
    t.conj().copy_(d)
    assert_same(t, x.conj().resolve_conj())
    host = torch.zeros(3, 4, dtype=dtype)
    host.copy_(c)
    assert torch.equal(host, x.conj().resolve_conj())
    assert_same(x.conj().to(DEV).resolve_conj(), x.conj().resolve_conj())


@pytest.mark.parametrize("dtype", CDT)
def test_shape_and_index(mode, dtype):
    x, y = crand((3, 4), dtype, 1), crand((2, 4), dtype, 2)
    d, e = x.to(DEV), y.to(DEV)
    assert_same(torch.cat([d, e]), torch.cat([x, y]))
    assert_same(torch.stack([d, d], 1), torch.stack([x, x], 1))
    assert_same(d[1:, ::2], x[1:, ::2])
    idx = torch.tensor([2, 0])
    assert_same(d[idx.to(DEV)], x[idx])
    assert_same(d.index_select(1, idx.to(DEV)), x.index_select(1, idx))
    assert_same(d[d.real > 0], x[x.real > 0])
    assert_same(d.flip(0), x.flip(0))
    assert_same(d.roll(1, 1), x.roll(1, 1))
    assert_same(d.repeat(2, 1), x.repeat(2, 1))
    assert_same(d.t().reshape(-1), x.t().reshape(-1))
    z = d.clone()
    z[0] = 1j
    w = x.clone()
    w[0] = 1j
    assert_same(z, w)
    z[:, 1] = e[0, :3]
    w[:, 1] = y[0, :3]
    assert_same(z, w)
    assert_same(torch.nn.functional.pad(d, (1, 2)), torch.nn.functional.pad(x, (1, 2)))
    assert_same(torch.where(d.real > 0, d, 0), torch.where(x.real > 0, x, 0))
    assert_same(d.masked_fill(d.imag > 0, 2 + 1j), x.masked_fill(x.imag > 0, 2 + 1j))


BINARY = [torch.add, torch.sub, torch.mul, torch.div, torch.eq, torch.ne, torch.rsub,
          lambda a, b: torch.add(a, b, alpha=2 - 1j), lambda a, b: torch.sub(a, b, alpha=3)]


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("op", range(len(BINARY)))
def test_binary(mode, dtype, op):
    fn = BINARY[op]
    x, y = crand((3, 4), dtype, 1), crand((4,), dtype, 2)
    r = torch.randn(3, 1, dtype=torch.float32)
    for a, b in [(x, y), (x, r), (r, y), (x, 2.5), (x, 1 - 1j), (x, torch.tensor(2 + 3j))]:
        da = a.to(DEV) if isinstance(a, torch.Tensor) and a.dim() else a
        db = b.to(DEV) if isinstance(b, torch.Tensor) and b.dim() else b
        assert_same(fn(da, db), fn(a, b), **tol(dtype))
    # a real tensor times a complex scalar promotes by the tensor's precision
    f64 = torch.randn(3, dtype=torch.float64)
    assert_same(f64.to(DEV) * 1j, f64 * 1j)
    assert_same(f64.to(DEV).float() * (2 + 1j), f64.float() * (2 + 1j))
    z = x.to(DEV)
    z.mul_(y.to(DEV))
    assert_same(z, x * y, **tol(dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_mul_div_special_values(mode, dtype):
    """products and quotients of infinities, NaNs and signed zeros as CPU's c10::complex
    computes them (no C99 recovery: 1j * (inf + inf i) and 0 / (inf + inf i) are NaN)"""
    v = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    z = torch.complex(v.repeat_interleave(len(v)), v.repeat(len(v))).to(dtype)
    a, b = z.repeat_interleave(len(z)), z.repeat(len(z))
    for op in (torch.mul, torch.div):
        got, want = op(a.to(DEV), b.to(DEV)), op(a, b)
        assert_same(got, want, **tol(dtype))
        assert torch.equal(got.real.isnan().cpu(), want.real.isnan()), op
        assert torch.equal(got.imag.isnan().cpu(), want.imag.isnan()), op


UNARY = ["neg", "abs", "angle", "sgn", "exp", "log", "sqrt", "reciprocal", "sin", "cos", "tanh",
         "sigmoid", "isnan", "isfinite", "isinf", "rsqrt", "expm1", "log1p"]


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("name", UNARY)
def test_unary(mode, dtype, name):
    x = crand((5, 6), dtype, 3)
    x[0, 0] = 0
    x[0, 1] = complex(math.inf, 1)
    x[0, 2] = complex(math.nan, 0)
    if name in ("log", "rsqrt", "reciprocal", "expm1", "log1p", "sigmoid", "tanh", "sin", "cos",
                "exp", "sqrt", "sgn", "angle"):
        x = x[1:]  # libm and CPU's vector code differ on infinities
    fn = getattr(torch, name)
    assert_same(fn(x.to(DEV)), fn(x), **tol(dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_constructors_and_pow(mode, dtype):
    part = torch.float32 if dtype == torch.complex64 else torch.float64
    re, im = torch.randn(4, 3, dtype=part), torch.randn(4, 3, dtype=part)
    assert_same(torch.complex(re.to(DEV), im.to(DEV)), torch.complex(re, im))
    ab = re.abs()
    assert_same(torch.polar(ab.to(DEV), im.to(DEV)), torch.polar(ab, im), **tol(dtype))
    x = crand((4, 3), dtype, 4)
    y = crand((4, 3), dtype, 5)
    for e in [2, 0.5, 1 + 1j]:
        assert_same(torch.pow(x.to(DEV), e), torch.pow(x, e), **tol(dtype))
    assert_same(torch.pow(x.to(DEV), y.to(DEV)), torch.pow(x, y), **tol(dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_reductions(mode, dtype):
    x = crand((6, 7), dtype, 6) * 0.5
    d = x.to(DEV)
    assert_same(d.sum(), x.sum(), **tol(dtype))
    assert_same(d.sum(0), x.sum(0), **tol(dtype))
    assert_same(d.mean(1, keepdim=True), x.mean(1, keepdim=True), **tol(dtype))
    assert_same(d.prod(1), x.prod(1), **tol(dtype))
    assert_same(d.prod(), x.prod(), atol=1e-4, rtol=1e-4)
    assert_same(d.t().sum(1), x.t().sum(1), **tol(dtype))
    assert_same(d.sum(dtype=dtype), x.sum(dtype=dtype), **tol(dtype))  # dtype is not a dim
    assert_same(d.prod(dtype=dtype), x.prod(dtype=dtype), atol=1e-4, rtol=1e-4)
    assert_same(d.mean((0, 1)), x.mean((0, 1)), **tol(dtype))
    for ord in (2, 1, float("inf"), 3):
        assert_same(torch.linalg.vector_norm(d, ord, dim=1), torch.linalg.vector_norm(x, ord, dim=1),
                    **tol(dtype))
    assert_same(torch.tensordot(d.view(6, 7, 1), d.view(6, 1, 7), dims=([0, 1], [0, 2])),
                torch.tensordot(x.view(6, 7, 1), x.view(6, 1, 7), dims=([0, 1], [0, 2])),
                atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", CDT)
def test_products(mode, dtype):
    a, b = crand((5, 7), dtype, 7), crand((7, 3), dtype, 8)
    t = dict(atol=5e-2, rtol=5e-2) if dtype == torch.complex64 else tol(dtype)
    assert_same(a.to(DEV) @ b.to(DEV), a @ b, **t)
    assert_same(a.to(DEV).t().conj() @ a.to(DEV), a.t().conj() @ a, **t)
    ba, bb = crand((2, 5, 7), dtype, 9), crand((2, 7, 3), dtype, 10)
    assert_same(torch.bmm(ba.to(DEV), bb.to(DEV)), torch.bmm(ba, bb), **t)
    v = crand((7,), dtype, 11)
    assert_same(a.to(DEV) @ v.to(DEV), a @ v, **t)
    assert_same(torch.vdot(v.to(DEV), v.to(DEV)), torch.vdot(v, v), **tol(dtype))
    assert_same(torch.dot(v.to(DEV), v.to(DEV)), torch.dot(v, v), **tol(dtype))
    c = crand((5, 3), dtype, 12)
    assert_same(torch.addmm(c.to(DEV), a.to(DEV), b.to(DEV), beta=0.5, alpha=2),
                torch.addmm(c, a, b, beta=0.5, alpha=2), **t)
    with torch.tpu.precision("highest"):
        assert_same(a.to(DEV) @ b.to(DEV), a @ b, **tol(dtype))


def test_autograd(mode):
    """Wirtinger gradients of a real loss, against CPU."""
    x = crand((4, 3), torch.complex128, 13)
    w = crand((3, 2), torch.complex128, 14)

    def f(x, w):
        y = (x @ w).exp() * x.sum(1, keepdim=True).conj()
        return (y.abs() ** 2).sum() + torch.view_as_real(y / (1 + y.abs())).sum()

    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    f(xc, wc).backward()
    xd, wd = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
    f(xd, wd).backward()
    assert_same(xd.grad, xc.grad, atol=1e-9, rtol=1e-9)
    assert_same(wd.grad, wc.grad, atol=1e-9, rtol=1e-9)


def test_gradcheck(mode):
    x = crand((3,), torch.complex128, 15).to(DEV).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: (t * t.conj().exp()).sqrt(), (x,), atol=1e-6)


def test_refusals(mode):
    d = crand((3, 3)).to(DEV)
    # CPU's refusal where CPU has no kernel, else tpu's naming the op
    with pytest.raises(NotImplementedError, match=r"erf.*ComplexFloat"):
        torch.special.erf(d)
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="aten::max is not implemented for dtype ComplexFloat on the tpu"):
        torch.max(d)
    with pytest.raises(RuntimeError):
        torch.div(d, d, rounding_mode="floor")
    with pytest.raises(NotImplementedError, match=r"aten::tanh_backward.*ComplexFloat.*tpu"):
        torch.ops.aten.tanh_backward(d, d)
