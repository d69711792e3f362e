"""Element-wise math against PyTorch's CPU results: the special-function family
(special.c), the vectorized float32 math (vecmath.h) on both instruction-set
paths, 16-bit float conversions, and the vectorized reductions."""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from util import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, check_op, gelu, make

SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -1.0, -2.0, -2.5, 1.0, 0.5,
            1e-30, 3.0, 30.5, 100.0, -700.0, 710.0]


def mk(shape, dtype, lo, hi, seed=0, noncontig=False):
    """make() with the bounds rounded to integers for integer dtypes"""
    if not dtype.is_floating_point:
        lo, hi = max(math.floor(lo), -100), min(math.ceil(hi), 100)
    return make(shape, dtype, lo, hi, seed=seed, noncontig=noncontig)


def with_specials(x):
    """x (1-d) followed by the special values, in x's dtype."""
    return torch.cat([x, torch.tensor(SPECIALS, dtype=torch.float64).to(x.dtype)])


# name: (fn, low, high, differentiable)
UNARY = {
    "erfinv": (torch.erfinv, -1, 1, True),
    "digamma": (torch.digamma, -5, 8, True),
    "polygamma0": (lambda x: torch.polygamma(0, x), -5, 8, True),
    "polygamma1": (lambda x: torch.polygamma(1, x), -5, 8, True),
    "polygamma3": (lambda x: torch.polygamma(3, x), 0.2, 8, True),
    "lgamma": (torch.lgamma, -5, 8, True),
    "sinc": (torch.sinc, -4, 4, True),
    "i0": (torch.i0, -40, 40, True),
    "i0e": (torch.special.i0e, -40, 40, True),
    "i1": (torch.special.i1, -40, 40, True),
    "i1e": (torch.special.i1e, -40, 40, True),
    "entr": (torch.special.entr, -1, 3, True),
    "signbit": (torch.signbit, -3, 3, False),
    "frexp": (torch.frexp, -1e3, 1e3, False),
    "mvlgamma": (lambda x: torch.mvlgamma(x, 3), 1.1, 6, True),
}

BINARY = {
    "logaddexp": (torch.logaddexp, -5, 5, True),
    "logaddexp2": (torch.logaddexp2, -5, 5, True),
    "xlog1py": (torch.special.xlog1py, -0.9, 3, True),
    "zeta": (torch.special.zeta, 1.1, 6, False),
    "heaviside": (torch.heaviside, -2, 2, False),
    "nextafter": (torch.nextafter, -2, 2, False),
}


def tol(dtype):
    """Tolerances for the special functions: CPU evaluates them in float16 and
    bfloat16 arithmetic for those dtypes (a few ulp off), tpu in double and
    rounds once, so results may be two ulp apart there."""
    return {torch.float16: dict(atol=1e-3, rtol=4e-3),
            torch.bfloat16: dict(atol=1e-2, rtol=3e-2)}.get(dtype, {})


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_special_unary(name, dtype):
    fn, lo, hi, diff = UNARY[name]
    grad = diff and dtype in (torch.float32, torch.float64)
    check_op(fn, mk((5, 7), dtype, lo, hi), grad=grad, **tol(dtype))
    check_op(fn, mk((4, 6), dtype, lo, hi, noncontig=True), **tol(dtype))
    check_op(fn, mk((), dtype, lo, hi), **tol(dtype))
    check_op(fn, mk((0, 3), dtype, lo, hi))
    if dtype.is_floating_point and name != "mvlgamma":  # mvlgamma raises on out-of-domain values
        check_op(fn, with_specials(mk((40,), dtype, lo, hi)), **tol(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_special_binary(name, dtype):
    fn, lo, hi, diff = BINARY[name]
    grad = diff and dtype in (torch.float32, torch.float64)
    a, b = mk((5, 7), dtype, lo, hi, seed=1), mk((5, 7), dtype, lo, hi, seed=2)
    check_op(fn, a, b, grad=grad, **tol(dtype))
    check_op(fn, a, mk((7,), dtype, lo, hi, seed=3), **tol(dtype))  # broadcast
    if dtype.is_floating_point:
        x = with_specials(mk((40,), dtype, lo, hi, seed=4))
        check_op(fn, x, x.flip(0), **tol(dtype))
        check_op(fn, x, x, **tol(dtype))


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool, torch.float32], ids=str)
@pytest.mark.parametrize("fn", [torch.gcd, torch.lcm], ids=["gcd", "lcm"])
def test_gcd_lcm(fn, dtype):
    a, b = mk((6, 9), dtype, -60, 60, seed=1), mk((6, 9), dtype, -60, 60, seed=2)
    check_op(fn, a, b)
    check_op(fn, a, torch.zeros_like(b))
    if dtype == torch.int32:  # lcm overflow wraps like PyTorch's int32 arithmetic
        big = torch.tensor([2 ** 30 + 1, -(2 ** 31), 65537], dtype=dtype)
        check_op(fn, big, big.flip(0) - 2)
    if dtype == torch.int64:
        check_op(fn, torch.tensor([-(2 ** 63), 0, 12]), torch.tensor([0, -(2 ** 63), 18]))


def test_polygamma_orders_and_inplace():
    x = mk((20,), torch.float64, 0.1, 6)
    for n in range(0, 6):
        check_op(lambda t: torch.polygamma(n, t), x, grad=n < 4)
    check_op(lambda t: t.clone().polygamma_(2), x)
    check_op(lambda t: torch.polygamma(-1, t), x)  # RuntimeError on both


def test_inplace_and_out_variants():
    x = mk((4, 5), torch.float32, -0.9, 0.9)
    check_op(lambda t: t.clone().erfinv_(), x)
    check_op(lambda t: t.clone().digamma_(), x)
    check_op(lambda t: t.clone().i0_(), x)
    check_op(lambda t: t.clone().sinc_(), x)
    check_op(lambda t: torch.erfinv(t, out=torch.empty_like(t)), x)
    check_op(lambda t: torch.frexp(t, mantissa=torch.empty_like(t),
                                   exponent=torch.empty(t.shape, dtype=torch.int32)), x)
    check_op(lambda t: torch.mvlgamma(t.abs() + 2, 2, out=torch.empty_like(t)), x)
    check_op(lambda t: torch.mvlgamma(t, 2), x)  # out of the domain: RuntimeError on both


# ------------------------------------------------------------ vectorized math
VEC_UNARY = {
    "exp": (torch.exp, -100, 90), "log": (torch.log, 1e-30, 1e30), "tanh": (torch.tanh, -12, 12),
    "sigmoid": (torch.sigmoid, -60, 60), "erf": (torch.erf, -5, 5), "gelu": (gelu, -8, 8),
    "gelu_tanh": (lambda x: gelu(x, approximate="tanh"), -8, 8), "silu": (F.silu, -60, 60),
    "elu": (F.elu, -10, 3), "xlogy": (lambda x: torch.xlogy(x, x), 0, 9),
}


def dense(lo, hi, n=20011, dtype=torch.float32):
    """n points covering [lo, hi] (log-spaced in magnitude for wide ranges)"""
    if lo > 0 and hi / lo > 1e6:
        return torch.logspace(math.log10(lo), math.log10(hi), n, dtype=torch.float64).to(dtype)
    return torch.linspace(lo, hi, n, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(VEC_UNARY))
def test_vecmath_matches_cpu(name, dtype):
    fn, lo, hi = VEC_UNARY[name]
    check_op(fn, dense(lo, hi, dtype=dtype))
    check_op(fn, with_specials(mk((64,), dtype, lo, hi)))
    huge = [1e20, -1e20, 3e38, -3e38, 1e10, -1e10, 50.0, -50.0, 9.0, -9.0, 9.2, 4.0, -4.1]
    check_op(fn, torch.tensor(huge, dtype=torch.float64).to(dtype))  # saturation, no nan
    check_op(fn, mk((33, 65), dtype, max(lo, -4), min(hi, 4)), grad=dtype == torch.float32)


@pytest.mark.parametrize("name,ulps", [("exp", 1), ("log", 1), ("tanh", 2), ("sigmoid", 3), ("erf", 2)])
def test_vecmath_accuracy(name, ulps):
    """float32 results within a few ulp of the float64 function, subnormals included"""
    ref = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
           "erf": torch.erf}[name]
    lo, hi = {"exp": (-103, 88.7), "log": (1e-44, 3e38), "tanh": (-10, 10),
              "sigmoid": (-87, 40), "erf": (-4, 4)}[name]
    x = dense(lo, hi, 200003)
    got = ref(x.to("tpu")).cpu().double()
    want = ref(x.double())
    ulp = torch.nextafter(want.float().abs(), torch.tensor(math.inf)).double() - want.float().abs().double()
    ulp = torch.clamp(ulp, min=2.0 ** -149)
    err = ((got - want).abs() / ulp).max().item()
    assert err <= ulps, f"{name}: max error {err:.2f} ulp"


def test_float16_conversions_exact():
    """every float16 / bfloat16 value converts like CPU, and float32 values round like CPU
    (ties to even, overflow, subnormals, nan)"""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    for dt in (torch.float16, torch.bfloat16):
        h = bits.view(dt)
        f_cpu = h.float()
        f_tpu = h.to("tpu").float().cpu()
        assert torch.equal(f_tpu.isnan(), f_cpu.isnan())
        assert torch.equal(f_tpu.nan_to_num(), f_cpu.nan_to_num())
        # float32 values between neighbours, at ties and beyond the range
        g = torch.Generator().manual_seed(0)
        x = torch.cat([f_cpu[~f_cpu.isnan()], (f_cpu[:-1] + f_cpu[1:]) / 2,
                       torch.randn(100000, generator=g) * 1e4, torch.randn(1000, generator=g) * 1e-6,
                       torch.tensor([65504.0, 65519.0, 65520.0, 1e30, -1e30, 2.0 ** -25, 2.0 ** -24 * 1.5])])
        x = x[~x.isnan()]
        want = x.to(dt)
        got = x.to("tpu").to(dt).cpu()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), dt


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_large_elementwise(dtype):
    """parallel and chunked paths: contiguous, broadcast, strided, mixed dtypes"""
    a = mk((300, 257), dtype, -3, 3, seed=1)
    b = mk((257,), dtype, -3, 3, seed=2)
    check_op(lambda x, y: x * y + x, a, b)
    check_op(lambda x: torch.tanh(x[:, ::3]), a)
    check_op(lambda x: x.t().exp(), a)
    check_op(lambda x, y: torch.where(x > 0, x, y), a, b)
    check_op(lambda x: x.clamp(-1, 1).to(torch.float32 if dtype != torch.float32 else torch.bfloat16), a)
    check_op(lambda x: x.clamp(2, -1), a)  # min > max: all max, like PyTorch
    check_op(lambda x: x + torch.ones((), dtype=torch.float64), a)
    # same-shaped operands of one dtype (bfloat16: loops on bfloat16 arrays), in place too
    c = mk((300, 257), dtype, -3, 3, seed=3)
    check_op(lambda x, y: torch.add(x, y, alpha=2) / (y.abs() + 1), a, c)
    check_op(lambda x, y: torch.where(x > y, gelu(x), F.silu(y)) - torch.relu(x), a, c)
    check_op(lambda x, y: x.clone().mul_(y).clamp_(-2, 2).exp_(), a, c)
    check_op(lambda x, y: torch.lerp(x, y, 0.3) + torch.addcmul(x, x, y, value=0.5), a, c)
    check_op(lambda x, y: x[:, 1:] + y[:, :-1], a, c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_large_reductions(dtype):
    # positive values: CPU sums in float(-like) precision, tpu in double, so
    # sums with cancellation would differ by CPU's rounding error
    x = mk((257, 1030), dtype, 0.25, 3)
    x[5, 7] = float("nan")
    y = mk((257, 1030), dtype, 0.25, 3, seed=1)
    y[::7] *= -1
    for fn in (lambda t: t.sum(), lambda t: t.sum(-1), lambda t: t.sum(0), lambda t: t.mean(0),
               lambda t: t.mean(-1), lambda t: t.amax(-1), lambda t: t.amin(0), lambda t: t.amax(),
               lambda t: t.max(), lambda t: t.t().sum(-1), lambda t: t[:, ::2].amax(0),
               lambda t: torch.linalg.vector_norm(t, dim=0), lambda t: t.abs().sum(0),
               lambda t: t.nansum(0)):
        check_op(fn, y)
        check_op(fn, x)
    check_op(lambda t: t.amax(0), torch.full((4, 300), float("-inf"), dtype=dtype))
    check_op(lambda t: t.sum(), mk((1 << 18,), dtype, 0, 1))  # no cancellation: CPU sums in float
    # column reductions split into chunks of rows (several blocks of outputs, strided kept dims)
    z = mk((3000, 2100), dtype, 0.25, 3, seed=2)
    z[1500, 3] = float("nan")
    for fn in (lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0), lambda t: t.amin(0),
               lambda t: t.view(30, 100, 2100).sum(1), lambda t: t[:, :1500].mean(0)):
        check_op(fn, z)


# ------------------------------------------------------------ ISA paths
ISA_CHECK = r"""
import torch, torch.nn.functional as F
import sys
sys.path.insert(0, "tests")
from util import check_op
from test_math_ops import VEC_UNARY, dense, mk, with_specials
for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
    for name, (fn, lo, hi) in VEC_UNARY.items():
        check_op(fn, dense(lo, hi, 4001, dtype=dt))
        check_op(fn, with_specials(mk((64,), dt, lo, hi)))
    x = mk((129, 515), dt, -3, 3)
    for fn in (lambda t: t.sum(), lambda t: t.mean(0), lambda t: t.amax(-1), lambda t: t.amin(0),
               lambda t: (t * 2 + 1).clamp(-1, 1), lambda t: t.to(torch.float16).to(torch.bfloat16),
               lambda t: t.softmax(-1), lambda t: t.log_softmax(-1), lambda t: torch.cat([t, t[1:]])):
        check_op(fn, x)
    check_op(lambda t: F.layer_norm(t, (515,)), x,
             **({} if dt in (torch.float32, torch.float64) else dict(atol=2e-2, rtol=2e-2)))
    # element-wise bodies (blocks of 32 plus tails) round once like CPU: bit-identical,
    # special values included
    a = with_specials(mk((1000,), dt, -3, 3, seed=1))
    b = with_specials(mk((1000,), dt, 0.5, 3, seed=2)).flip(0)
    for fn in (torch.add, torch.sub, torch.mul, torch.div, torch.maximum,
               lambda p, q: torch.where(p > 0, p, q), lambda p, q: torch.relu(p),
               lambda p, q: p.clamp(-0.5, 0.5)):
        for n in (a.numel(), 37, 16):
            r, t = fn(a[:n], b[:n]), fn(a[:n].to("tpu"), b[:n].to("tpu")).cpu()
            assert torch.equal(r.isnan(), t.isnan()), fn
            assert torch.equal(r.nan_to_num(0.0), t.nan_to_num(0.0)), (fn, dt, n)
    check_op(lambda p, q: torch.addcmul(p, p, q, value=0.5), a, b)  # FMA or not: tolerance
print("ok")
"""


@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_isa_paths(isa):
    """the portable and AVX2 loops give CPU's results (avx2 falls back to portable
    on CPUs without it, so both runs are valid everywhere)"""
    env = dict(os.environ, TORCH_TPU_ISA=isa)
    r = subprocess.run([sys.executable, "-c", ISA_CHECK], capture_output=True, text=True,
                       env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
