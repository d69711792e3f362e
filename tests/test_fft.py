"""torch.fft on tpu against PyTorch CPU (pocketfft): every public function, lengths
of every kind (powers of two, mixed radix 2/3/5, primes small and large through
Bluestein), several dims, strided inputs, every norm, both precisions, and
gradients."""
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401

from util import assert_same

DEV = "tpu"


def tol(dtype):
    if dtype in (torch.float32, torch.complex64):
        return dict(atol=2e-4, rtol=2e-4)
    return dict(atol=1e-9, rtol=1e-9)


def rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        return torch.complex(torch.randn(shape, generator=g, dtype=part),
                             torch.randn(shape, generator=g, dtype=part))
    return torch.randn(shape, generator=g, dtype=dtype)


LENGTHS = [1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 17, 30, 60, 64, 97, 100, 120, 243, 1000, 1009]


@pytest.mark.parametrize("n", LENGTHS)
def test_fft_lengths(n):
    x = rand((3, n), torch.complex128, n)
    d = x.to(DEV)
    assert_same(torch.fft.fft(d), torch.fft.fft(x), **tol(torch.complex128))
    assert_same(torch.fft.ifft(d), torch.fft.ifft(x), **tol(torch.complex128))
    r = rand((2, n), torch.float64, n + 1)
    assert_same(torch.fft.rfft(r.to(DEV)), torch.fft.rfft(r), **tol(torch.float64))
    h = torch.fft.rfft(r)
    assert_same(torch.fft.irfft(h.to(DEV), n=n), torch.fft.irfft(h, n=n), **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("norm", [None, "forward", "ortho", "backward"])
def test_functions(mode, dtype, norm):
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    t = tol(dtype)
    x = rand((6, 10, 9), dtype, 1)
    r = rand((6, 10, 9), real, 2)
    d, dr = x.to(DEV), r.to(DEV)
    F = torch.fft
    assert_same(F.fft(d, norm=norm), F.fft(x, norm=norm), **t)
    assert_same(F.fft(d, n=12, dim=1, norm=norm), F.fft(x, n=12, dim=1, norm=norm), **t)
    assert_same(F.ifft(d, n=5, norm=norm), F.ifft(x, n=5, norm=norm), **t)
    assert_same(F.fft2(d, norm=norm), F.fft2(x, norm=norm), **t)
    assert_same(F.ifft2(d, norm=norm), F.ifft2(x, norm=norm), **t)
    assert_same(F.fftn(d, norm=norm), F.fftn(x, norm=norm), **t)
    assert_same(F.ifftn(d, dim=(0, 2), norm=norm), F.ifftn(x, dim=(0, 2), norm=norm), **t)
    assert_same(F.rfft(dr, norm=norm), F.rfft(r, norm=norm), **t)
    assert_same(F.rfft2(dr, norm=norm), F.rfft2(r, norm=norm), **t)
    assert_same(F.rfftn(dr, norm=norm), F.rfftn(r, norm=norm), **t)
    assert_same(F.irfft(d, norm=norm), F.irfft(x, norm=norm), **t)
    assert_same(F.irfft2(d, s=(10, 15), norm=norm), F.irfft2(x, s=(10, 15), norm=norm), **t)
    assert_same(F.irfftn(d, norm=norm), F.irfftn(x, norm=norm), **t)
    assert_same(F.hfft(d, norm=norm), F.hfft(x, norm=norm), **t)
    assert_same(F.ihfft(dr, norm=norm), F.ihfft(r, norm=norm), **t)
    assert_same(F.hfft2(d, norm=norm), F.hfft2(x, norm=norm), **t)
    assert_same(F.ihfftn(dr, norm=norm), F.ihfftn(r, norm=norm), **t)
    assert_same(F.fft(dr, norm=norm), F.fft(r, norm=norm), **t)  # real input


def test_helpers(mode):
    x = rand((5, 6), torch.float32, 3)
    d = x.to(DEV)
    F = torch.fft
    assert_same(F.fftshift(d), F.fftshift(x))
    assert_same(F.ifftshift(d, dim=1), F.ifftshift(x, dim=1))
    assert_same(F.fftfreq(8, device=DEV), F.fftfreq(8))
    assert_same(F.rfftfreq(9, d=0.5, device=DEV), F.rfftfreq(9, d=0.5))


def test_strided_inputs(mode):
    x = rand((8, 12), torch.complex64, 4)
    d = x.to(DEV)
    t = tol(torch.complex64)
    assert_same(torch.fft.fft(d.t(), dim=0), torch.fft.fft(x.t(), dim=0), **t)
    assert_same(torch.fft.fft(d[:, ::2]), torch.fft.fft(x[:, ::2]), **t)
    assert_same(torch.fft.fft(d.conj()), torch.fft.fft(x.conj()), **t)
    r = rand((12, 8), torch.float32, 5)
    assert_same(torch.fft.rfft(r.to(DEV).t()), torch.fft.rfft(r.t()), **t)
    out = torch.empty(8, 12, dtype=torch.complex64, device=DEV)
    torch.fft.fft(d, out=out)
    assert_same(out, torch.fft.fft(x), **t)


def test_large_batched():
    x = rand((16, 4096), torch.float32, 6)
    t = dict(atol=2e-3, rtol=2e-4)
    assert_same(torch.fft.rfft(x.to(DEV)), torch.fft.rfft(x), **t)
    y = rand((256, 256), torch.complex64, 7)
    assert_same(torch.fft.fft2(y.to(DEV)), torch.fft.fft2(y), **t)


def rel_err(got, want):
    got = got.cpu().to(want.dtype)
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("n", [64, 100, 243, 256, 1009, 4096])
def test_float32_paths(n):
    """complex64 / float32 transform in float: within float rounding of the
    complex128 result, for line counts that fill the lane blocks or not, rows and
    columns, every radix and Bluestein"""
    x = rand((19, n), torch.complex128, n)
    r = rand((19, n), torch.float64, n + 1)
    F = torch.fft
    for lines in (x, x.t().contiguous().t()):  # rows; columns of a [n, 19] tensor
        xf = lines.to(torch.complex64)
        assert rel_err(F.fft(xf.to(DEV)), F.fft(lines)) < 1e-6
        assert rel_err(F.ifft(xf.to(DEV), norm="ortho"), F.ifft(lines, norm="ortho")) < 1e-6
    rf = r.to(torch.float32)
    assert rel_err(F.rfft(rf.to(DEV)), F.rfft(r)) < 1e-6
    h = F.rfft(r)
    assert rel_err(F.irfft(h.to(torch.complex64).to(DEV), n=n), F.irfft(h, n=n)) < 1e-6
    assert_same(F.fft(xf.to(DEV)), F.fft(xf), atol=1e-4 * n ** 0.5, rtol=1e-4)


@pytest.mark.parametrize("n", [1 << 17, 81000])
def test_long_lines(n):
    """single lines past the caches (the two-pass split n = n1 n2, real lines
    through their half-length complex transform): within float rounding of the
    complex128 result; strided lines, a batch of two, both directions, every
    norm, two-sided r2c, c2r from a short or long half spectrum, an odd real
    length (the one-pass route)"""
    F = torch.fft
    x = rand((2, n), torch.complex128, 20)
    r = rand((2, n), torch.float64, 21)
    xf, rf = x.to(torch.complex64), r.to(torch.float32)
    for norm in (None, "ortho", "forward"):
        assert rel_err(F.fft(xf[0].to(DEV), norm=norm), F.fft(x[0], norm=norm)) < 1e-6
        assert rel_err(F.ifft(xf[0].to(DEV), norm=norm), F.ifft(x[0], norm=norm)) < 1e-6
        assert rel_err(F.rfft(rf[0].to(DEV), norm=norm), F.rfft(r[0], norm=norm)) < 1e-6
        h = F.rfft(r[0])
        assert rel_err(F.irfft(h.to(torch.complex64).to(DEV), n=n, norm=norm),
                       F.irfft(h, n=n, norm=norm)) < 1e-6
    assert rel_err(F.fft(xf.t().contiguous().to(DEV), dim=0), F.fft(x.t(), dim=0)) < 1e-6
    assert rel_err(F.fft(xf.to(DEV)), F.fft(x)) < 1e-6
    assert rel_err(F.rfft(rf.t().contiguous().to(DEV), dim=0), F.rfft(r.t(), dim=0)) < 1e-6
    assert rel_err(F.rfft(rf.to(DEV)), F.rfft(r)) < 1e-6
    assert rel_err(F.fft(rf[1].to(DEV)), F.fft(r[1])) < 1e-6  # r2c, two-sided
    for m in (n // 3, n // 2 + 1, n):  # c2r reads n / 2 + 1 values, zero-padded
        assert rel_err(F.irfft(xf[0, :m].to(DEV), n=n), F.irfft(x[0, :m], n=n)) < 1e-6
        assert rel_err(F.hfft(xf[1, :m].to(DEV), n=n), F.hfft(x[1, :m], n=n)) < 1e-6
    assert rel_err(F.rfft(rf[0, :n - 1].to(DEV)), F.rfft(r[0, :n - 1])) < 1e-6
    assert_same(F.fft(x[1].to(DEV)), F.fft(x[1]), **tol(torch.complex128))
    assert_same(F.irfft(x[1, : n // 2 + 1].to(DEV)), F.irfft(x[1, : n // 2 + 1]), **tol(torch.float64))
    assert_same(F.rfft(r[1].to(DEV)), F.rfft(r[1]), **tol(torch.float64))


def test_multi_dim_chunks(mode):
    """multi-dim transforms of batches larger than a cache-sized chunk (run chunk
    by chunk, the batch dim outermost or in the middle, c2r with its temporary)"""
    t = dict(atol=2e-3, rtol=2e-4)
    F = torch.fft
    x = rand((5, 256, 256), torch.complex64, 12)
    d = x.to(DEV)
    assert_same(F.fft2(d), F.fft2(x), **t)
    assert_same(F.ifftn(d, dim=(0, 2)), F.ifftn(x, dim=(0, 2)), **t)
    y = rand((256, 5, 256), torch.complex64, 13)
    assert_same(F.fftn(y.to(DEV), dim=(0, 2)), F.fftn(y, dim=(0, 2)), **t)
    r = rand((5, 256, 256), torch.float32, 14)
    assert_same(F.rfft2(r.to(DEV)), F.rfft2(r), **t)
    h = F.rfft2(r)
    assert_same(F.irfft2(h.to(DEV)), F.irfft2(h), atol=1e-5, rtol=1e-4)
    z = rand((3, 300, 200), torch.complex128, 15)
    assert_same(F.fft2(z.to(DEV)), F.fft2(z), **tol(torch.complex128))


ISA_CHECK = r"""
import torch, torch_tpu
F = torch.fft
g = torch.Generator().manual_seed(0)
for dt, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
    for shape in ((19, 256), (8, 100), (3, 1009), (2, 64, 64), (1, 1 << 17), (1 << 16, 2)):
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        x = torch.complex(r, torch.randn(shape, generator=g, dtype=torch.float64))
        cdt = torch.complex64 if dt == torch.float32 else torch.complex128
        for got, want in ((F.fftn(x.to(cdt).to("tpu")), F.fftn(x)),
                          (F.fft(x.to(cdt).to("tpu"), dim=0), F.fft(x, dim=0)),
                          (F.rfftn(r.to(dt).to("tpu")), F.rfftn(r)),
                          (F.irfftn(x.to(cdt).to("tpu")), F.irfftn(x))):
            err = ((got.cpu().to(want.dtype) - want).abs().max() / want.abs().max()).item()
            assert err < tol, (dt, shape, err)
print("ok")
"""


@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_isa_paths(isa):
    """the portable and AVX2 kernels (avx2 falls back to portable on CPUs
    without it, so both runs are valid everywhere)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TORCH_TPU_ISA=isa)
    r = subprocess.run([sys.executable, "-c", ISA_CHECK], capture_output=True, text=True,
                       env=env, timeout=600, cwd=root)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_gradients(mode):
    x = rand((4, 6), torch.complex128, 8)
    r = rand((4, 7), torch.float64, 9)

    def f(x, r):
        a = torch.fft.fft2(x, norm="ortho")
        b = torch.fft.rfft(r, n=8)
        c = torch.fft.irfft(a, n=9)
        d = torch.fft.ihfft(r)
        return (a.abs() ** 2).sum() + (b * b.conj()).real.sum() + c.pow(2).sum() + d.abs().sum()

    xc, rc = x.clone().requires_grad_(), r.clone().requires_grad_()
    f(xc, rc).backward()
    xd, rd = x.to(DEV).requires_grad_(), r.to(DEV).requires_grad_()
    f(xd, rd).backward()
    assert_same(xd.grad, xc.grad, atol=1e-9, rtol=1e-9)
    assert_same(rd.grad, rc.grad, atol=1e-9, rtol=1e-9)
    z = rand((5,), torch.complex128, 10).to(DEV).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch.fft.ifft(torch.fft.fft(t) * t), (z,))


def test_refusals(mode):
    h = torch.randn(8, dtype=torch.float16, device=DEV)
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.fft.fft(h)
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="Invalid number of data points"):
        torch.fft.fft(torch.randn(4, device=DEV), n=0)


def test_compile():
    """complex graphs compile for the tpu backend (their calls run unfused)"""
    f = torch.compile(lambda x: (torch.fft.rfft(x) * (1 + 1j)).abs(), backend="tpu")
    x = rand((4, 16), torch.float32, 11)
    assert_same(f(x.to(DEV)), (torch.fft.rfft(x) * (1 + 1j)).abs(), atol=1e-5, rtol=1e-5)
