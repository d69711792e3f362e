"""complex64 / complex128 math, reductions and scans on tpu against PyTorch CPU:
element-wise ops (pow, exp2, sinc, silu, logaddexp, lerp, addcmul, addcdiv),
scans (cumsum, cumprod, logcumsumexp), reductions (var/std and their _mean
variants, logsumexp, trace, norm), cross products, linspace/logspace, renorm,
the matmul family with complex alpha and beta, and gradients through a few."""
import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

from util import assert_same, crand

DEV = "tpu"
CDT = [torch.complex64, torch.complex128]


def tol(dtype):
    return dict(atol=1e-5, rtol=1.3e-6) if dtype == torch.complex64 else dict(atol=1e-12, rtol=1e-12)


def same(fn, *inputs, dtype, **kw):
    """fn on the CPU inputs and on their tpu copies: values, dtype, shape, strides."""
    expected = fn(*inputs)
    actual = fn(*[x.to(DEV) if isinstance(x, torch.Tensor) else x for x in inputs])
    assert_same(actual, expected, **{**tol(dtype), **kw})


def factory(fn, dtype):
    """fn(device) on tpu against CPU"""
    assert_same(fn(DEV), fn("cpu"), **tol(dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_elementwise(mode, dtype):
    x, y, w = crand((4, 5), dtype, 1), crand((4, 5), dtype, 2), crand((5,), dtype, 3, 0.3)
    for f in (torch.exp2, torch.sinc, torch.nn.functional.silu):
        same(f, x, dtype=dtype)
    same(lambda t: torch.sinc(t * 0), x, dtype=dtype)  # sinc(0) = 1
    same(torch.logaddexp, x, y, dtype=dtype)
    same(lambda a, b: torch.logaddexp(a, b * 10), x, y, dtype=dtype)
    same(lambda a, b: torch.lerp(a, b, 0.3 - 0.2j), x, y, dtype=dtype)
    same(lambda a, b: torch.lerp(a, b, 0.9), x, y, dtype=dtype)
    same(torch.lerp, x, y, w, dtype=dtype)
    same(lambda a, b, c: torch.addcmul(a, b, c, value=2 - 1j), x, y, w, dtype=dtype)
    same(lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), x, y, w, dtype=dtype)
    same(lambda a, b: a.clone().addcmul_(b, b, value=3), x, y, dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_pow(mode, dtype):
    # large results: complex64 computes in float like CPU's cpowf
    x, y = crand((8, 8), dtype, 4, 2.0), crand((8, 8), dtype, 5, 2.0)
    same(torch.pow, x, y, dtype=dtype)
    zero = torch.zeros(3, dtype=dtype)
    for e in (2, 3, -2, 0.5, -0.5, -1, 2.5, 1 + 1j, 0, 1, 1 + 0j):
        same(lambda a: torch.pow(a, e), x, dtype=dtype)
        same(lambda a: torch.pow(a, e), zero, dtype=dtype)
    same(lambda a: torch.pow(2.0, a), x, dtype=dtype)
    same(lambda a, b: torch.pow(a, b[:3]), zero, y[0], dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_scans(mode, dtype):
    x = crand((3, 6, 4), dtype, 6)
    for dim in (0, 1, -1):
        same(lambda t: torch.cumsum(t, dim), x, dtype=dtype)
        same(lambda t: torch.cumprod(t, dim), x, dtype=dtype)
        same(lambda t: torch.logcumsumexp(t, dim), x, dtype=dtype)
    same(lambda t: torch.cumsum(t.transpose(0, 2), 1), x, dtype=dtype)
    same(lambda t: torch.cumsum(t, 0), crand((), dtype), dtype=dtype)
    same(lambda t: torch.cumsum(t, 1, dtype=torch.complex128), x, dtype=torch.complex128)
    same(lambda t: torch.cumsum(t, 1), torch.randn(3, 4).to(dtype), dtype=dtype)
    # logcumsumexp's infinities and NaNs as CPU's helper treats them
    s = torch.tensor([float("-inf"), 1 + 1j, float("-inf"), complex(float("inf"), 0),
                      complex(float("inf"), 1), float("nan"), 2j], dtype=dtype)
    same(lambda t: torch.logcumsumexp(t, 0), s, dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_reductions(mode, dtype):
    x = crand((4, 5, 3), dtype, 7)
    for f in (lambda t: torch.var(t), lambda t: torch.std(t, 1), lambda t: torch.var(t, (0, 2), correction=0),
              lambda t: torch.std(t, 2, keepdim=True, correction=2),
              lambda t: torch.var_mean(t, 1), lambda t: torch.std_mean(t, (0, 1), keepdim=True),
              lambda t: torch.logsumexp(t, 1), lambda t: torch.logsumexp(t, (0, 2), keepdim=True),
              lambda t: torch.trace(t[:, :, 0]), lambda t: torch.trace(t[:, :, 1].t()),
              lambda t: torch.norm(t, dim=1), lambda t: torch.dist(t, t.flip(0), 3)):
        same(f, x, dtype=dtype)
    r = torch.var(x.to(DEV), 1)
    assert r.dtype == x.real.dtype
    # logsumexp: an infinite largest real part and an empty input
    s = torch.tensor([[1 + 1j, complex(float("-inf"), 0)], [complex(float("inf"), 0), 2]], dtype=dtype)
    same(lambda t: torch.logsumexp(t, 1), s, dtype=dtype)
    same(lambda t: torch.logsumexp(t, 1), torch.zeros(2, 0, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_cross_spaced_renorm(mode, dtype):
    a, b = crand((1, 4, 3), dtype, 8), crand((2, 4, 3), dtype, 9)
    same(torch.linalg.cross, a, b, dtype=dtype)
    same(lambda p, q: torch.linalg.cross(p.transpose(1, 2), q.transpose(1, 2), dim=1), a, b, dtype=dtype)
    for steps in (0, 1, 2, 7, 40):
        factory(lambda d: torch.linspace(1 - 2j, -3 + 0.5j, steps, dtype=dtype, device=d), dtype)
        factory(lambda d: torch.logspace(-1 + 2j, 2 - 1j, steps, base=3, dtype=dtype, device=d), dtype)
    factory(lambda d: torch.logspace(1j, 2, 5, base=-2.0, dtype=dtype, device=d), dtype)
    start, end = torch.tensor(2 + 1j), torch.tensor(-1j)
    factory(lambda d: torch.linspace(start.to(d), end.to(d), 9, dtype=dtype, device=d), dtype)
    x = crand((3, 4, 2), dtype, 10, 3.0)
    same(lambda t: torch.renorm(t, 2, 1, 4.0), x, dtype=dtype)
    same(lambda t: torch.renorm(t, 1, 0, 5.0), x, dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_products(mode, dtype, highest_precision):
    m, a, b = crand((4, 6), dtype, 11), crand((4, 5), dtype, 12), crand((5, 6), dtype, 13)
    v, bias = crand((5,), dtype, 14), crand((4,), dtype, 15)
    b1, b2, s3 = crand((3, 4, 5), dtype, 16), crand((3, 5, 6), dtype, 17), crand((3, 4, 6), dtype, 18)
    for beta, alpha in ((1, 1), (0.5, 2), (1 + 2j, 2 - 3j), (0, 1j)):
        same(lambda s, p, q: torch.addmm(s, p, q, beta=beta, alpha=alpha), m, a, b, dtype=dtype)
        same(lambda s, p, q: torch.addmv(s, p, q, beta=beta, alpha=alpha), bias, a, v, dtype=dtype)
        same(lambda s, p, q: torch.baddbmm(s, p, q, beta=beta, alpha=alpha), s3, b1, b2, dtype=dtype)
        same(lambda s, p, q: torch.addbmm(s, p, q, beta=beta, alpha=alpha), m, b1, b2, dtype=dtype)
    # beta = 0 ignores self's NaNs, as on CPU
    nan = torch.full((4, 6), complex(float("nan"), 0), dtype=dtype)
    same(lambda s, p, q: torch.addmm(s, p, q, beta=0, alpha=1 + 1j), nan, a, b, dtype=dtype)
    same(lambda s, p, q: s.clone().addmm_(p, q, alpha=1j), m, a, b, dtype=dtype)
    same(torch.mv, a, v, dtype=dtype)


def test_products_follow_precision():
    # float32 products at "medium" round the parts to bfloat16, complex64 too
    a, b = crand((16, 16), seed=19), crand((16, 16), seed=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.tpu.precision("medium"):
            medium = torch.addmm(a.to(DEV), a.to(DEV), b.to(DEV), alpha=1j).cpu()
        with torch.tpu.precision("highest"):
            highest = torch.addmm(a.to(DEV), a.to(DEV), b.to(DEV), alpha=1j).cpu()
    exact = torch.addmm(a.to(torch.complex128), a.to(torch.complex128), b.to(torch.complex128), alpha=1j)
    assert (highest - exact).abs().max() < 1e-4 < (medium - exact).abs().max()


@pytest.mark.parametrize("dtype", CDT)
def test_autograd(mode, dtype):
    x = crand((3, 4), dtype, 21)
    fns = [lambda t: t.cumsum(1), lambda t: t.var(1), lambda t: t.std(),
           lambda t: torch.addcmul(t, t, t.conj(), value=0.5 - 1j), lambda t: t.cumprod(0),
           lambda t: t.logsumexp(1)]
    for f in fns:
        grads = []
        for dev in ("cpu", DEV):
            t = x.to(dev).requires_grad_()
            y = f(t)
            (g,) = torch.autograd.grad(y.abs().sum(), t)
            assert g.dtype == dtype and g.device.type == dev
            grads.append(g.cpu())
        torch.testing.assert_close(grads[1], grads[0], **tol(dtype))
