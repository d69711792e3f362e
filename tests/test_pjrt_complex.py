"""complex64 / complex128 and torch.fft on the pjrt target (XLA's CPU plugin), against PyTorch
CPU: element-wise math (with C's values where XLA's differ: signed zeros on branch cuts,
hypot's NaN rules, pow's special exponents), casts to and from complex, complex numbers as
constants keyed by value, views of the parts (also inside one DeferAndFuse graph, where a
float view reads a complex value the graph wrote), the conjugate bit, reductions, products,
polar/complex, every torch.fft function with each norm mode, and complex randn / uniform_ /
normal_ drawing the host target's numbers; special values (infinities, NaNs, signed zeros) in
exp/sin/cos/log/sqrt/div, scans, variances and products as CPU gives them."""
import os
import subprocess
import sys

import torch

from tests.test_pjrt_target import ROOT, pytestmark, run_pjrt  # noqa: F401  (the skip mark)

HELPERS = """
CX = (torch.complex64, torch.complex128)
TOL = {torch.complex64: dict(atol=2e-5, rtol=2e-5), torch.complex128: dict(atol=1e-12, rtol=1e-12),
       torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-12, rtol=1e-12),
       torch.bool: dict(atol=0, rtol=0), torch.int32: dict(atol=0, rtol=0)}

def close(got, want, what, scale=1.0):
    assert got.device.type == "tpu", what
    c = got.cpu()
    assert c.dtype == want.dtype and c.shape == want.shape, (what, c.dtype, want.dtype, c.shape, want.shape)
    if want.numel() > 1:
        assert got.stride() == want.stride(), (what, got.stride(), want.stride())
    tol = {k: v * scale for k, v in TOL[want.dtype].items()}
    torch.testing.assert_close(c, want, equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)

def both(f, *xs, what, scale=1.0):
    close(f(*[x.to("tpu") for x in xs]), f(*xs), what, scale)

g = torch.Generator().manual_seed(0)
def rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, generator=g)
"""


def run(code):
    run_pjrt(HELPERS + code)


def test_elementwise_math_matches_cpu():
    run("""
UNARY = ["neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin",
         "acos", "atan", "asinh", "acosh", "atanh", "abs", "angle", "sgn", "sigmoid", "reciprocal",
         "log2", "log10", "log1p", "expm1", "isnan", "isinf", "isfinite", "square", "conj_physical"]
for dt in CX:
    x, y = rand(5, 6, dtype=dt), rand(5, 6, dtype=dt)
    for op in UNARY:
        both(getattr(torch, op), x, what=f"{op} {dt}")
    for op in ["add", "sub", "mul", "div", "pow", "eq", "ne"]:
        both(getattr(torch, op), x, y, what=f"{op} {dt}")
    both(lambda a, b: torch.add(a, b, alpha=2 - 1j), x, y, what="add alpha")
    both(lambda a: 3j - a, x, what="rsub")
    both(lambda a, b: torch.where(a.real > 0, a, b), x, y, what="where")
    both(lambda a: a.masked_fill(a.imag > 0, 1 + 1j), x, what="masked_fill")
    both(lambda a: a.clone().fill_(2 - 3j), x, what="fill_")
    both(torch.mul, x, rand(6, dtype=torch.float32), what="complex * float")
    for p in (0, 1, 2, 3, -2, 0.5, -0.5, -1, 2.5, 1 + 1j):  # CPU's special exponents, then cpow
        both(lambda a: a ** p, x, what=f"pow {p} {dt}")
    both(lambda a: 2 ** a, x, what="number ** complex")
    both(lambda a, b: torch.polar(a, b), x.abs(), y.real.contiguous(), what="polar")
    both(lambda a, b: torch.complex(a, b), x.real.contiguous(), y.real.contiguous(), what="complex")
""")


def test_special_values_follow_c():
    run("""
vals = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 1e-30, 1e30, float("inf"), -float("inf"),
                     float("nan")])
re, im = vals.repeat_interleave(len(vals)), vals.repeat(len(vals))
for dt in CX:
    z = torch.complex(re.to(dt.to_real()), im.to(dt.to_real()))
    finite = torch.isfinite(z)
    # branch cuts: the sign of a zero part picks the side, as in C
    for op in ["sqrt", "rsqrt", "asin", "acos", "atan", "asinh", "acosh", "atanh", "log", "log1p"]:
        want = getattr(torch, op)(z)
        keep = finite & torch.isfinite(want)
        close(getattr(torch, op)(z.to("tpu"))[keep.to("tpu")], want[keep], f"{op} {dt}")
    # C's hypot: infinite when a part is, else NaN when a part is
    close(z.to("tpu").abs(), z.abs(), f"abs {dt}")
    close(z.to("tpu").sgn(), z.sgn(), f"sgn {dt}")  # z / |z|: NaN parts stay NaN
    both(torch.isnan, z, what="isnan")
    both(torch.isinf, z, what="isinf")
    both(torch.isfinite, z, what="isfinite")
    zero = torch.zeros(4, dtype=dt)
    both(lambda a: torch.pow(a, torch.tensor([2 + 0j, 3 + 3j, 0.5 + 1j, 1j], dtype=dt, device=a.device)),
         zero, what="0 ** w")
    both(lambda a: torch.log2(a), zero, what="log2(0)")  # real scalings part by part: no NaN
""")


def test_special_values_match_cpu():
    """exp, sin, cos, log, sqrt and division on every pair of special parts (signed zeros,
    infinities, NaN, tiny and huge values): CPU's values, NaN where CPU's are, and the sign
    of every zero (C99 Annex G for the functions, c10's Smith division for /)"""
    run("""
import math
vals = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, 1e30, -1e30, float("inf"), -float("inf"),
                     float("nan")], dtype=torch.float64)
re, im = vals.repeat_interleave(len(vals)), vals.repeat(len(vals))

def exact(got, want, what):
    g, w = torch.view_as_real(got.cpu()).flatten(), torch.view_as_real(want).flatten()
    t = TOL[want.dtype]
    for i in range(len(w)):
        a, b = g[i].item(), w[i].item()
        ok = (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)) \
            or (b != 0 and abs(a - b) <= t["atol"] + t["rtol"] * abs(b))
        assert ok, (what, i // 2, "real imag".split()[i % 2], a, b)

for dt in CX:
    z = torch.complex(re, im).to(dt)
    d = z.to("tpu")
    for op in ["exp", "sin", "cos", "log", "sqrt"]:
        exact(getattr(torch, op)(d), getattr(torch, op)(z), f"{op} {dt}")
    a, b = z.repeat_interleave(len(z)), z.repeat(len(z))
    exact(a.to("tpu") / b.to("tpu"), a / b, f"div {dt}")
    exact(d / 2, z / 2, f"div by a number {dt}")
    exact(torch.ones_like(d) * (1 - 2j) / d, torch.ones_like(z) * (1 - 2j) / z, f"number / z {dt}")
""")


def test_scans_variances_and_products_with_specials():
    """cumsum/cumprod, var/std (and their _mean: CPU's Welford mean is NaN where an infinite
    value meets another), addmv and baddbmm on complex values with infinities and NaNs"""
    run("""
inf, nan = float("inf"), float("nan")
for dt in CX:
    x = torch.tensor([[1 + 1j, complex(inf, 0), 2 - 1j, complex(nan, 1)],
                      [complex(0, inf), 1, complex(inf, inf), 3j],
                      [1, 2, 3, 4]], dtype=dt)
    y = rand(3, 4, dtype=dt)
    for t, name in ((x, "specials"), (y, "finite")):
        both(lambda a: a.cumsum(1), t, what=f"cumsum {name} {dt}")
        both(lambda a: a.cumprod(1), t, what=f"cumprod {name} {dt}")
        both(lambda a: a.cumprod(0), t, what=f"cumprod dim 0 {name} {dt}")
        both(lambda a: a.var(1), t, what=f"var {name} {dt}")
        both(lambda a: a.var(), t, what=f"var all {name} {dt}")
        both(lambda a: a.std(0, correction=0, keepdim=True), t, what=f"std {name} {dt}")
        for f in (torch.var_mean, torch.std_mean):
            for k in range(2):
                both(lambda a: f(a, 1)[k], t, what=f"{f.__name__}[{k}] {name} {dt}")
                both(lambda a: f(a, 0, correction=0)[k], t, what=f"{f.__name__}[{k}] dim 0 {name} {dt}")
        with torch.tpu.precision("highest"):
            both(lambda a, v, c: torch.addmv(c, a, v, beta=1j, alpha=2), t, y[2], y[:, 0], what=f"addmv {name} {dt}")
            both(lambda a, v, c: torch.addmv(c, a, v, beta=0.5, alpha=1 + 1j), t, t[2], t[:, 1], what=f"addmv {name} {dt}")
            both(lambda a, b, c: torch.baddbmm(c, a, b, alpha=1 - 1j, beta=2), t.expand(2, 3, 4), y.t().expand(2, 4, 3),
                 y[:, :3].expand(2, 3, 3), what=f"baddbmm {name} {dt}")
    # small batched products (contraction x rows x cols < 400) are CPU's float loop: the same
    # bits where alpha and beta are exact (else XLA may fuse a product by them into an FMA)
    a, b, s = rand(2, 5, 5, dtype=dt), rand(2, 5, 10, dtype=dt), rand(5, 10, dtype=dt)
    for what, f in (("bmm", lambda a, b, s: torch.bmm(a, b)),
                    ("baddbmm", lambda a, b, s: torch.baddbmm(s, a, b, beta=0.5 + 1j, alpha=1.5 - 2j)),
                    ("baddbmm beta 0", lambda a, b, s: torch.baddbmm(s, a, b, beta=0, alpha=2))):
        got, want = f(a.to("tpu"), b.to("tpu"), s.to("tpu")).cpu(), f(a, b, s)
        assert torch.equal(got, want) if dt == torch.complex64 else torch.allclose(got, want, rtol=1e-12), what
    both(lambda a, b, s: torch.baddbmm(s, a, b, beta=0.2 + 0.4j, alpha=1.2 + 1.8j), a, b, s, what="baddbmm",
         scale=0.1)
r = torch.tensor([[inf, 1.0, 2.0], [1.0, 2.0, 3.0], [nan, 0.0, 1.0], [inf, -inf, 0.0]])
for k in range(2):  # real var_mean: the same Welford mean
    both(lambda a: torch.var_mean(a, 1)[k], r, what=f"var_mean[{k}] float32")
    both(lambda a: torch.std_mean(a[:, :1], 1, correction=0)[k], r, what=f"std_mean[{k}] of one value")
""")


def test_casts_and_scalars():
    run("""
for dt in CX:
    x = rand(4, 3, dtype=dt)
    for other in (torch.float32, torch.float64, torch.int64, torch.bool, torch.int8):
        src = (torch.randn(4, 3, generator=g) * 5).to(other)
        both(lambda a: a.to(dt), src, what=f"{other} -> {dt}")
    both(lambda a: a.to(torch.float64), x, what="complex -> real keeps the real part")
    both(lambda a: a.to(torch.int32), x * 10, what="complex -> int")
    other = torch.complex128 if dt == torch.complex64 else torch.complex64
    both(lambda a: a.to(other), x, what="between complex widths")
    # complex numbers are constants keyed by value: a second value must not reuse the first's program
    d = x.to("tpu")
    for k in range(3):
        close(d * (1 + k * 1j), x * (1 + k * 1j), f"x * (1+{k}j)")
        close(d + torch.tensor(k - 2j), x + torch.tensor(k - 2j), f"x + CPU scalar {k}")
""")


def test_views_and_conjugate_bit():
    run("""
for dt in CX:
    x = rand(4, 6, dtype=dt)
    both(lambda a: a.real * 2, x, what="real")
    both(lambda a: a.imag + 1, x, what="imag")
    both(lambda a: torch.view_as_real(a) * 1, x, what="view_as_real")
    both(lambda a: torch.view_as_complex(a) * 1j, rand(3, 5, 2, dtype=dt.to_real()), what="view_as_complex")
    both(lambda a: a.t().contiguous(), x, what="transpose")
    both(lambda a: a[:, 1::2] + 1, x, what="strided slice")
    both(lambda a: a.conj() * 1, x, what="conj")
    both(lambda a: a.conj() + a, x, what="conj + x")
    both(lambda a: a.conj().resolve_conj(), x, what="resolve_conj")
    both(lambda a: torch.cat([a, a.conj()], 1), x, what="cat with a conj")
    d = x.to("tpu")
    d.real.mul_(2)  # a write through a float view of a complex tensor
    w = x.clone()
    w.real.mul_(2)
    close(d, w, "write through .real")
    # one DeferAndFuse graph: float views of complex values it wrote and back
    with torch_tpu.eager_mode("defer_and_fuse"):
        a = d * d
        b = torch.view_as_real(a) * 2
        c = torch.view_as_complex(b + 1) * 1j
        e = a.real + a.imag
        torch_tpu.materialize()
    wa = w * w
    close(b, torch.view_as_real(wa) * 2, "graph: view_as_real")
    close(c, torch.view_as_complex(torch.view_as_real(wa) * 2 + 1) * 1j, "graph: view_as_complex")
    close(e, wa.real + wa.imag, "graph: real + imag")
""")


def test_reductions_and_products():
    run("""
for dt in CX:
    x, y = rand(5, 6, dtype=dt), rand(6, 4, dtype=dt)
    both(lambda a: a.sum(), x, what="sum")
    both(lambda a: a.sum(1, keepdim=True), x, what="sum dim")
    both(lambda a: a.mean(0), x, what="mean")
    both(lambda a: a.prod(1), x, what="prod")
    both(lambda a: torch.linalg.vector_norm(a, dim=1), x, what="vector_norm")
    with torch.tpu.precision("highest"):
        both(torch.mm, x, y, what="mm")
        both(lambda a, b: torch.bmm(a.expand(2, 5, 6), b.expand(2, 6, 4)), x, y, what="bmm")
        both(lambda a, b: a @ b[:, 0], x, y, what="mv")
        both(lambda a, b: torch.dot(a[0], b[:, 1]), x, y, what="dot")
        both(lambda a, b: torch.vdot(a[0], b[:, 1]), x, y, what="vdot conjugates")
        both(lambda a, b: torch.addmm(a[:, :4], a, b, beta=1j, alpha=2 - 1j), x, y, what="addmm")
    # the default (medium) mode: complex64 follows float32's, within bfloat16-pass error
    both(torch.mm, x, y, what="mm medium", scale=1e3 if dt == torch.complex64 else 1)
""")


def test_every_fft_function_and_norm():
    run("""
C2C = ["fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "hfft"]
R2C = ["rfft", "rfft2", "rfftn", "ihfft"]
C2R = ["irfft", "irfft2", "irfftn"]
for dt in CX:
    rdt = dt.to_real()
    x, r = rand(4, 6, 5, dtype=dt), rand(4, 6, 5, dtype=rdt)
    for norm in (None, "forward", "ortho"):
        for name in C2C + C2R:
            f = getattr(torch.fft, name)
            both(lambda a: f(a, norm=norm), x, what=f"{name} {norm} {dt}")
        for name in R2C:
            f = getattr(torch.fft, name)
            both(lambda a: f(a, norm=norm), r, what=f"{name} {norm} {rdt}")
    # dims that are not trailing, sizes given (padding, trimming), more than 3 dims at once
    both(lambda a: torch.fft.fft(a, n=7, dim=0), x, what="fft n dim 0")
    both(lambda a: torch.fft.ifftn(a, s=(3, 8), dim=(2, 0), norm="ortho"), x, what="ifftn s dims")
    both(lambda a: torch.fft.rfftn(a, dim=(0, 2)), r, what="rfftn dims (0, 2)")
    both(lambda a: torch.fft.irfftn(a, s=(4, 9), dim=(1, 0)), x, what="irfftn odd last")
    both(lambda a: torch.fft.hfft(a, n=9, dim=1), x, what="hfft n")
    x5, r5 = rand(2, 3, 2, 4, 3, dtype=dt), rand(2, 3, 2, 4, 3, dtype=rdt)
    both(lambda a: torch.fft.fftn(a, norm="forward"), x5, what="fftn 5 dims")
    both(lambda a: torch.fft.rfftn(a), r5, what="rfftn 5 dims")
    both(lambda a: torch.fft.irfftn(a, norm="ortho"), x5, what="irfftn 5 dims")
    both(lambda a: torch.fft.fft(a.conj()), x, what="fft of a conj view")
    # r2c with the whole spectrum (onesided=False): stft's path
    both(lambda a: torch.ops.aten._fft_r2c(a, [1, 2], 0, False), r, what="r2c two-sided")
    # a compiled graph: one program with the transforms and a float view of a complex value
    def spectrum(a):
        s = torch.fft.rfft(a, dim=0, norm="ortho")
        return torch.fft.irfft(s * s.conj() + 1j, n=4, dim=0) + torch.view_as_real(s).sum()
    both(torch.compile(spectrum, backend="tpu"), r, what="compiled")
""")


RANDOM = """
import sys, torch, torch_tpu
out = {}
for dt in (torch.complex64, torch.complex128):
    torch.manual_seed(3)
    out[f"randn {dt}"] = torch.randn(5, 3, dtype=dt, device="tpu").cpu()
    torch.manual_seed(4)
    out[f"uniform_ {dt}"] = torch.empty(4, 2, dtype=dt, device="tpu").uniform_(-1, 2).cpu()
    torch.manual_seed(5)
    out[f"normal_ {dt}"] = torch.zeros(6, 4, dtype=dt, device="tpu").t().normal_(1, 3).cpu()
torch.save(out, sys.argv[1])
"""


def test_complex_random_draws_the_host_targets_numbers(tmp_path):
    got = {}
    for target in ("host", "pjrt"):
        path = str(tmp_path / target)
        env = dict(os.environ, TORCH_TPU_TARGET=target, PYTHONPATH=ROOT)
        env.pop("TORCH_TPU_PJRT_PLUGIN", None)
        r = subprocess.run([sys.executable, "-c", RANDOM, path], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        got[target] = torch.load(path)
    for name, want in got["host"].items():
        torch.testing.assert_close(got["pjrt"][name], want, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")
