"""Float32 matmul precision on tpu: medium / high / highest numerics and the precision API.

References are exact float64 sums of the inputs each level multiplies:
- medium: bf16(a) @ bf16(b)  (inputs rounded to bfloat16, round to nearest even);
- high: a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi  (3-pass split, a_hi = bf16(a), a_lo = bf16(a - a_hi));
- highest: a @ b.
tpu must match them within float32 accumulation error, (K + 2) * 2^-24 * sum |a||b| per
element. That bound also proves the kernel's shortcuts (high runs two float32 passes,
a_hi * (b_hi + b_lo) + a_lo * b_hi; highest runs true float32 products instead of 6 passes).
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.precision as tpu_precision

from conftest import run_python

LEVELS = ("medium", "high", "highest")
U = 2.0 ** -24


@pytest.fixture(autouse=True)
def quiet_cost_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tpu_precision.TpuPerformanceWarning)
        yield


@pytest.fixture
def restore_precision():
    """Restores PyTorch's and tpu's process-wide float32 matmul precision."""
    torch_level, tpu_level = torch.get_float32_matmul_precision(), tpu_precision._explicit
    yield
    torch.set_float32_matmul_precision(torch_level)
    tpu_precision._explicit = tpu_level
    tpu_precision._apply()


def bf16(x):
    return x.bfloat16().float()


def split(x):
    hi = bf16(x)
    return hi, bf16(x - hi)


def reference(level, fn, a, b, c):
    """Float64 value of fn(a, b, c) under `level` and its magnitude fn(|a|, |b|, |c|);
    fn is bilinear in (a, b) plus a term linear in c."""
    d = torch.float64
    zero = None if c is None else torch.zeros_like(c, dtype=d)
    cd = None if c is None else c.to(d)
    if level == "medium":
        ref = fn(bf16(a).to(d), bf16(b).to(d), cd)
    elif level == "high":
        (ah, al), (bh, bl) = split(a), split(b)
        ah, al, bh, bl = (t.to(d) for t in (ah, al, bh, bl))
        ref = fn(ah, bh, cd) + fn(ah, bl, zero) + fn(al, bh, zero)
    else:
        ref = fn(a.to(d), b.to(d), cd)
    mag = fn(a.to(d).abs(), b.to(d).abs(), None if c is None else cd.abs())
    return ref, mag


def check_level(level, fn, a, b, c=None, k=None):
    """fn on tpu under `level` equals its reference within float32 accumulation error."""
    k = k if k is not None else a.shape[-1]
    with torch.tpu.precision(level):
        got = fn(a.to("tpu"), b.to("tpu"), None if c is None else c.to("tpu")).cpu()
    ref, mag = reference(level, fn, a, b, c)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    bound = (k + 2) * U * mag + 1e-30
    err = (got.double() - ref).abs()
    assert bool((err <= bound).all()), f"{level}: worst error / bound = {(err / bound).max():.3g}"
    return got, ref, mag


def rand(*shape, spread=4, seed=0):
    """Values of several binades, so that rounding and splitting matter."""
    g = torch.Generator().manual_seed(seed + sum(shape))
    x = torch.randn(*shape, generator=g)
    return x * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g).float())


# (name, fn(a, b, c), shapes of a, b, c, summed products per element)
CASES = [
    ("mm", lambda a, b, c: torch.mm(a, b), (37, 300), (300, 29), None, 300),
    ("mm_transposed", lambda a, b, c: torch.mm(a.t(), b.t()), (300, 37), (29, 300), None, 300),
    ("mm_strided", lambda a, b, c: torch.mm(a[:, ::2], b[::2]), (20, 160), (160, 18), None, 80),
    ("matmul_broadcast", lambda a, b, c: torch.matmul(a, b), (2, 3, 4, 5), (5, 6), None, 5),
    ("matmul_batched", lambda a, b, c: torch.matmul(a, b), (2, 1, 7, 40), (3, 40, 9), None, 40),
    ("bmm", lambda a, b, c: torch.bmm(a, b), (5, 17, 70), (5, 70, 23), None, 70),
    ("bmm_transposed", lambda a, b, c: torch.bmm(a, b.transpose(1, 2)), (4, 19, 50), (4, 21, 50),
     None, 50),
    # attention's P @ V: few columns, A kept by rows (tile_rows); partial strips and row blocks,
    # 2 k blocks (3 in high)
    ("bmm_few_columns", lambda a, b, c: torch.bmm(a, b), (6, 130, 600), (6, 600, 64), None, 600),
    ("linear", lambda a, b, c: F.linear(a, b, c), (4, 6, 64), (33, 64), (33,), 64),
    ("linear_nobias", lambda a, b, c: F.linear(a, b), (50, 64), (33, 64), None, 64),
    ("addmm", lambda a, b, c: torch.addmm(c, a, b, beta=2, alpha=0.5), (30, 100), (100, 20),
     (30, 20), 100),
    ("baddbmm", lambda a, b, c: torch.baddbmm(c, a, b, beta=0.5, alpha=2), (3, 9, 40),
     (3, 40, 11), (9, 11), 40),
    ("addbmm", lambda a, b, c: torch.addbmm(c, a, b), (3, 9, 40), (3, 40, 11), (9, 11), 120),
    ("addmv", lambda a, b, c: torch.addmv(c, a, b), (40, 90), (90,), (40,), 90),
    ("mv", lambda a, b, c: torch.mv(a, b), (300, 50), (50,), None, 50),
    ("vm", lambda a, b, c: torch.matmul(a, b), (70,), (70, 300), None, 70),
    ("dot", lambda a, b, c: torch.dot(a, b), (500,), (500,), None, 500),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_levels_match_references(case, level):
    _, fn, sa, sb, sc, k = case
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    c = None if sc is None else rand(*sc, seed=3)
    check_level(level, fn, a, b, c, k)


def test_levels_differ_in_accuracy():
    """medium is visibly bfloat16, high close to float32, highest float32."""
    a, b = rand(64, 512, seed=4), rand(512, 48, seed=5)
    exact = a.double() @ b.double()
    mag = a.double().abs() @ b.double().abs()
    worst = {}
    for level in LEVELS:
        with torch.tpu.precision(level):
            got = (a.to("tpu") @ b.to("tpu")).cpu().double()
        worst[level] = ((got - exact).abs() / mag).max().item()
    assert worst["medium"] > 2 ** -12            # inputs rounded to 8 significant bits
    assert worst["high"] < 2 ** -15              # 3-pass: only ~2^-16 relative terms dropped
    assert worst["highest"] < 514 * U
    assert worst["high"] < worst["medium"] / 16


def test_highest_matches_cpu_float32():
    a, b = rand(96, 700, seed=6), rand(700, 80, seed=7)
    with torch.tpu.precision("highest"):
        got = (a.to("tpu") @ b.to("tpu")).cpu()
    mag = a.abs() @ b.abs()
    assert bool(((got - a @ b).abs() <= 2 * 702 * U * mag).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_take_one_pass(dtype):
    """bf16/f16 products are exact in float32: every level gives the same result."""
    a, b = rand(33, 200, seed=8).to(dtype), rand(200, 41, seed=9).to(dtype)
    outs = []
    for level in LEVELS:
        with torch.tpu.precision(level):
            outs.append((a.to("tpu") @ b.to("tpu")).cpu())
            outs.append(torch.bmm(a[None].to("tpu"), b[None].to("tpu")).cpu()[0])
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    ref = a.double() @ b.double()
    assert torch.allclose(outs[0].double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_float64_and_integers_unaffected():
    a, b = torch.randn(20, 30, dtype=torch.float64), torch.randn(30, 10, dtype=torch.float64)
    ia, ib = torch.randint(-100, 100, (20, 30)), torch.randint(-100, 100, (30, 10))
    with torch.tpu.precision("medium"):
        got = (a.to("tpu") @ b.to("tpu")).cpu()
        igot = (ia.to("tpu") @ ib.to("tpu")).cpu()
    assert torch.allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    assert torch.equal(igot, ia @ ib)


@pytest.mark.parametrize("level", LEVELS)
def test_nan_inf_propagate(level):
    a = rand(6, 40, seed=10)
    a[0, 3] = float("nan")
    a[1, 5] = float("inf")
    a[2, 7] = -float("inf")
    b = torch.rand(40, 17) + 0.5  # positive: inf rows stay inf, no inf - inf
    with torch.tpu.precision(level):
        got = (a.to("tpu") @ b.to("tpu")).cpu()
    want = a @ b
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[1:3].sign(), want[1:3].sign())
    ref, mag = reference(level, lambda x, y, c: x @ y, a[3:], b, None)
    assert bool(((got[3:].double() - ref).abs() <= 42 * U * mag).all())


@pytest.mark.parametrize("level", LEVELS)
def test_denormals_are_not_flushed(level):
    tiny = 3e-39  # float32 subnormal, also a bfloat16 subnormal after rounding
    a = torch.full((4, 16), tiny)
    b = torch.ones(16, 5)
    with torch.tpu.precision(level):
        got = (a.to("tpu") @ b.to("tpu")).cpu()
    want = 16 * (bf16(a[0, 0]).item() if level == "medium" else tiny)
    assert bool((got > 0).all())
    assert torch.allclose(got.double(), torch.full((4, 5), want, dtype=torch.float64), rtol=2e-2)


@pytest.mark.parametrize("level", LEVELS)
def test_empty_k(level):
    a, b, c = torch.randn(3, 0), torch.randn(0, 4), torch.randn(3, 4)
    with torch.tpu.precision(level):
        assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), torch.zeros(3, 4))
        got = torch.addmm(c.to("tpu"), a.to("tpu"), b.to("tpu"), beta=0.5).cpu()
    assert torch.equal(got, 0.5 * c)


@pytest.mark.parametrize("level", LEVELS)
def test_conv2d_follows_precision(level):
    x, w, bias = rand(2, 3, 11, 11, seed=11), rand(5, 3, 3, 3, seed=12), rand(5, seed=13)
    with torch.tpu.precision(level):
        got = F.conv2d(x.to("tpu"), w.to("tpu"), bias.to("tpu"), padding=1).cpu().double()
    d = torch.float64
    if level == "medium":
        ref = F.conv2d(bf16(x).to(d), bf16(w).to(d), bias.to(d), padding=1)
    else:
        ref = F.conv2d(x.to(d), w.to(d), bias.to(d), padding=1)
    mag = F.conv2d(x.to(d).abs(), w.to(d).abs(), bias.to(d).abs(), padding=1)
    tol = {"medium": 64 * U, "high": 2 ** -14, "highest": 64 * U}[level]
    assert bool(((got - ref).abs() <= tol * mag).all())
    if level == "medium":  # and not float32's result
        exact = F.conv2d(x.to(d), w.to(d), bias.to(d), padding=1)
        assert ((got - exact).abs() / mag).max() > 2 ** -12


# ---- precision API ----

def test_default_is_medium():
    r = run_python(
        "import torch, torch_tpu\n"
        "print(torch.tpu.get_precision())\n"
        "a = torch.randn(64, 256); b = torch.randn(256, 32)\n"
        "got = (a.to('tpu') @ b.to('tpu')).cpu().double()\n"
        "ref = a.bfloat16().double() @ b.bfloat16().double()\n"
        "mag = a.bfloat16().double().abs() @ b.bfloat16().double().abs()\n"
        "print(bool(((got - ref).abs() <= 258 * 2.0 ** -24 * mag).all()))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["medium", "True"]


def test_context_manager_and_decorator():
    a, b = rand(40, 128, seed=14), rand(128, 24, seed=15)
    outer = torch.tpu.get_precision()
    with torch.tpu.precision("highest"):
        assert torch.tpu.get_precision() == "highest"
        with torch.tpu.precision("medium"):
            assert torch.tpu.get_precision() == "medium"
        assert torch.tpu.get_precision() == "highest"
    assert torch.tpu.get_precision() == outer

    @torch.tpu.precision("high")
    def product(x, y):
        assert torch.tpu.get_precision() == "high"
        return (x.to("tpu") @ y.to("tpu")).cpu()

    ref, mag = reference("high", lambda x, y, c: x @ y, a, b, None)
    assert bool(((product(a, b).double() - ref).abs() <= 130 * U * mag).all())
    assert torch.tpu.get_precision() == outer
    with pytest.raises(ValueError):
        torch.tpu.precision("low")


def test_set_float32_matmul_precision_routes_to_tpu(restore_precision):
    a, b = rand(40, 128, seed=16), rand(128, 24, seed=17)
    for level in LEVELS:
        torch.set_float32_matmul_precision(level)
        assert torch.get_float32_matmul_precision() == level
        assert torch.tpu.get_precision() == level
        got = (a.to("tpu") @ b.to("tpu")).cpu().double()
        ref, mag = reference(level, lambda x, y, c: x @ y, a, b, None)
        assert bool(((got - ref).abs() <= 130 * U * mag).all()), level
    with torch.tpu.precision("medium"):  # a local override wins
        assert torch.tpu.get_precision() == "medium"
    assert torch.tpu.get_precision() == "highest"


def test_cost_warning_once_per_level():
    r = run_python(
        "import warnings, torch, torch_tpu\n"
        "from torch_tpu.precision import TpuPerformanceWarning\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    torch.set_float32_matmul_precision('medium')\n"
        "    for _ in range(3):\n"
        "        with torch.tpu.precision('high'):\n"
        "            pass\n"
        "    torch.set_float32_matmul_precision('high')\n"
        "    torch.set_float32_matmul_precision('highest')\n"
        "    with torch.tpu.precision('highest'):\n"
        "        pass\n"
        "hits = [str(x.message) for x in w if issubclass(x.category, TpuPerformanceWarning)]\n"
        "print(len(hits), sum(\"'high'\" in h for h in hits), sum(\"'highest'\" in h for h in hits))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "1", "1"]
