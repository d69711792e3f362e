"""Reliability of the host kernel library (issue 13): strided row kernels,
index_reduce rounding, index error types, signed results near zero, result
dtypes, and the fill loop's inputs. Every case compares against PyTorch on
CPU, in each eager mode where the mode changes which code runs."""
import os
import shutil
import subprocess

import pytest
import torch

import torch_tpu
from util import assert_same

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# `mode`: the all-modes fixture in conftest.py


def _tol(dtype):
    return {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12),
            torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}[dtype]


# ---- softmax / log_softmax over strided rows ----
# Each layout maps a contiguous base tensor to a view; the row dim is given
# for the view. Input and output views then differ in their lane blocking.
LAYOUTS = {
    "transpose01": ((16, 8, 4), lambda t: t.transpose(0, 1), 1),
    "transpose01_dim0": ((16, 8, 4), lambda t: t.transpose(0, 1), 0),
    "transpose01_last": ((16, 8, 4), lambda t: t.transpose(0, 1), -1),
    "expand": ((5, 8), lambda t: t.expand(2, 5, 8), 1),
    "expand_dim0": ((5, 8), lambda t: t.expand(3, 5, 8), 0),
    "expand_inner": ((5, 1), lambda t: t.expand(5, 40), 0),
    "step_slice": ((12, 20), lambda t: t[::2, 1::3], 0),
    "step_slice_last": ((12, 20), lambda t: t[1::2, ::3], 1),
    "permute3": ((3, 17, 19), lambda t: t.permute(2, 0, 1), 1),
    "permute4": ((2, 3, 5, 18), lambda t: t.permute(0, 3, 1, 2), 1),
    "permute4_dim3": ((2, 3, 5, 18), lambda t: t.permute(3, 1, 0, 2), 3),
    "column_major": ((33, 40), lambda t: t.t(), 1),
    "column_major_dim0": ((33, 40), lambda t: t.t(), 0),
    "wide_lanes": ((7, 70), lambda t: t.t(), 1),
}


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_softmax_strided_forward_backward(mode, fn, layout, dtype):
    shape, view, dim = LAYOUTS[layout]
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    f = getattr(torch, fn)
    xc = base.clone().requires_grad_(True)
    xt = base.to("tpu").requires_grad_(True)
    yc = f(view(xc), dim)
    yt = f(view(xt), dim)
    atol, rtol = _tol(dtype)
    assert_same(yt, yc, atol=atol, rtol=rtol)
    up = torch.randn(yc.shape, generator=g, dtype=torch.float64).to(dtype)
    yc.backward(up)
    yt.backward(up.to("tpu"))
    assert_same(xt.grad, xc.grad, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_issue_reproducers(mode, fn):
    # the two reproducers of the issue, compared element by element
    x = torch.randn(16, 8, 4)
    f = getattr(torch, fn)
    assert_same(f(x.to("tpu").transpose(0, 1), 1), f(x.transpose(0, 1), 1))
    b = torch.randn(5, 8)
    assert_same(f(b.to("tpu").expand(2, 5, 8), 1), f(b.expand(2, 5, 8), 1))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("out_layout", ["transposed", "permuted", "strided"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_out_of_other_strides(mode, fn, out_layout, dim):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 9, 20, generator=g)
    ops = {"softmax": torch._softmax, "log_softmax": torch._log_softmax}
    expected = ops[fn](x, dim, False)

    def make_out(device):
        if out_layout == "transposed":
            return torch.empty(20, 9, 6, device=device).permute(2, 1, 0)
        if out_layout == "permuted":
            return torch.empty(9, 6, 20, device=device).transpose(0, 1)
        return torch.empty(6, 9, 40, device=device)[:, :, ::2]

    for src in (x, x.transpose(0, 2).contiguous().transpose(0, 2)):
        out_c = make_out("cpu")
        ops[fn](src, dim, False, out=out_c)
        out_t = make_out("tpu")
        ops[fn](src.to("tpu"), dim, False, out=out_t)
        assert out_t.stride() == out_c.stride()
        torch.testing.assert_close(out_t.cpu(), expected)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_backward_grad_of_other_strides(mode, fn):
    # _softmax_backward_data with grad, output and grad_input in three layouts
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 24, 20, generator=g)
    f = getattr(torch, fn)
    y = f(x, 1)
    grad = torch.randn(20, 24, 4, generator=g).permute(2, 1, 0)
    bwd = torch._softmax_backward_data if fn == "softmax" else torch._log_softmax_backward_data
    expected = bwd(grad, y, 1, torch.float32)
    yt = y.to("tpu").transpose(0, 2).contiguous().transpose(0, 2)
    actual = bwd(grad.to("tpu"), yt, 1, torch.float32)
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("layout", ["transposed", "expanded", "sliced"])
def test_layer_norm_strided(mode, layout):
    g = torch.Generator().manual_seed(4)
    base = torch.randn(6, 10, 12, generator=g)
    view = {"transposed": lambda t: t.transpose(0, 1),
            "expanded": lambda t: t[:1].expand(3, 10, 12),
            "sliced": lambda t: t[::2, ::3]}[layout]
    w = torch.randn(12, generator=g)
    xc = base.clone().requires_grad_(True)
    xt = base.to("tpu").requires_grad_(True)
    yc = torch.nn.functional.layer_norm(view(xc), (12,), w)
    yt = torch.nn.functional.layer_norm(view(xt), (12,), w.to("tpu"))
    assert_same(yt, yc, atol=1e-5, rtol=1e-5)
    up = torch.randn(yc.shape, generator=g)
    yc.backward(up)
    yt.backward(up.to("tpu"))
    assert_same(xt.grad, xc.grad, atol=1e-4, rtol=1e-4)


# ---- log_softmax with a dominant maximum, atan2 at the branch cut ----
def test_log_softmax_dominant_max_is_exact_zero(mode):
    # every other term of the row is below half an ulp of the sum: the sum
    # in float32 is exactly 1 and log_softmax at the maximum exactly 0
    x = torch.tensor([[20.0, 0.0, -1.0, 2.5], [3.0, 3.0, -40.0, 0.0]])
    for t in (x, x.t().contiguous().t(), x.to(torch.float64)):
        cpu = torch.log_softmax(t, 1)
        tpu = torch.log_softmax(t.to("tpu"), 1).cpu()
        assert torch.equal(torch.signbit(tpu), torch.signbit(cpu)), (tpu, cpu)
        assert torch.equal(tpu == 0, cpu == 0)
        torch.testing.assert_close(tpu, cpu)


def test_atan2_after_log_softmax_of_exp(mode):
    # the fuzzer's chain: atan2 jumps by 2*pi where log_softmax gives +0 on
    # CPU and a tiny negative value (or -0) on tpu
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, generator=g) * 3
    d = -torch.rand(40, 8, generator=g) - 0.5
    expected = torch.atan2(torch.log_softmax(torch.exp(x + 1), 1), d)
    xt, dt = x.to("tpu"), d.to("tpu")
    actual = torch.atan2(torch.log_softmax(torch.exp(xt + 1), 1), dt)
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_atan2_signed_zeros(mode, dtype):
    v = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf")], dtype=dtype)
    a, b = torch.meshgrid(v, v, indexing="ij")
    expected = torch.atan2(a, b)
    actual = torch.atan2(a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(actual, expected)
    assert torch.equal(torch.signbit(actual), torch.signbit(expected))


# ---- index_reduce ----
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("reduce", ["mean", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_index_reduce_rounds_like_cpu(mode, dtype, reduce, include_self, dim):
    g = torch.Generator().manual_seed(5)
    n = 40
    self_ = (torch.rand(3, 5, generator=g, dtype=torch.float64) * 4 + 1).to(dtype)
    shape = (n, 5) if dim == 0 else (3, n)
    lo, hi = (0.9, 1.1) if reduce == "prod" else (1.0, 9.0)
    src = (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    idx = torch.randint(0, self_.shape[dim], (n,), generator=g)
    expected = self_.index_reduce(dim, idx, src, reduce, include_self=include_self)
    actual = self_.to("tpu").index_reduce(dim, idx.to("tpu"), src.to("tpu"), reduce,
                                          include_self=include_self)
    assert_same(actual, expected, atol=0, rtol=0)


@pytest.mark.parametrize("reduce", ["mean", "prod", "amax", "amin"])
@pytest.mark.parametrize("shape,src_shape", [((3, 4), (0, 4)), ((3,), (0,))])
def test_index_reduce_empty_source(mode, reduce, shape, src_shape):
    for inplace in (True, False):
        self_ = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        idx = torch.tensor([], dtype=torch.long)
        src = torch.ones(src_shape)
        st = self_.to("tpu")
        if inplace:
            expected = self_.clone().index_reduce_(0, idx, src, reduce)
            actual = st.index_reduce_(0, idx.to("tpu"), src.to("tpu"), reduce)
        else:
            expected = self_.index_reduce(0, idx, src, reduce)
            actual = st.index_reduce(0, idx.to("tpu"), src.to("tpu"), reduce)
        assert_same(actual, expected)


# ---- exception types of out-of-range indices ----
# Each case builds its tensors on `dev`. CPU raises RuntimeError for gather,
# scatter*, index_add and one_hot (which scatters on tpu), IndexError for
# index_copy, index_fill, index_select, index_reduce, take and advanced
# indexing: tpu must raise the same type.
def _t(v, dev):
    return torch.tensor(v, device=dev)


OOB_CASES = {
    "gather": lambda d: torch.gather(torch.zeros(3, 4, device=d), 0, _t([[5, 0, 0, 0]], d)),
    "gather_neg": lambda d: torch.gather(torch.zeros(3, 4, device=d), 0, _t([[-4, 0, 0, 0]], d)),
    "scatter_value": lambda d: torch.zeros(3, 4, device=d).scatter_(0, _t([[5, 0, 0, 0]], d), 1.0),
    "scatter_src": lambda d: torch.zeros(3, 4, device=d).scatter_(
        0, _t([[5, 0, 0, 0]], d), torch.ones(1, 4, device=d)),
    "scatter_add": lambda d: torch.zeros(3, 4, device=d).scatter_add_(
        0, _t([[5, 0, 0, 0]], d), torch.ones(1, 4, device=d)),
    "scatter_reduce": lambda d: torch.zeros(3, 4, device=d).scatter_reduce_(
        0, _t([[5, 0, 0, 0]], d), torch.ones(1, 4, device=d), "amax"),
    "scatter_out_of_place": lambda d: torch.scatter(torch.zeros(3, 4, device=d), 1,
                                                    _t([[4]], d), 2.0),
    "index_add": lambda d: torch.zeros(3, 4, device=d).index_add_(0, _t([5], d),
                                                                  torch.ones(1, 4, device=d)),
    "index_add_neg": lambda d: torch.zeros(3, 4, device=d).index_add_(0, _t([-1], d),
                                                                      torch.ones(1, 4, device=d)),
    "index_copy": lambda d: torch.zeros(3, 4, device=d).index_copy_(0, _t([5], d),
                                                                    torch.ones(1, 4, device=d)),
    "index_fill": lambda d: torch.zeros(3, 4, device=d).index_fill_(0, _t([5], d), 1.0),
    "index_select": lambda d: torch.zeros(3, 4, device=d).index_select(0, _t([5], d)),
    "index_reduce": lambda d: torch.zeros(3, 4, device=d).index_reduce_(
        0, _t([5], d), torch.ones(1, 4, device=d), "prod"),
    "advanced_indexing": lambda d: torch.zeros(3, 4, device=d)[_t([5], d)],
    "take": lambda d: torch.zeros(3, 4, device=d).take(_t([12], d)),
    "one_hot": lambda d: torch.nn.functional.one_hot(_t([0, 5], d), 3),
    "one_hot_neg": lambda d: torch.nn.functional.one_hot(_t([0, -1], d), 3),
}


@pytest.mark.parametrize("case", sorted(OOB_CASES))
def test_out_of_range_index_exception_type(mode, case):
    fn = OOB_CASES[case]
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(Exception) as tpu:
        out = fn("tpu")
        torch.tpu.synchronize()
        del out
    assert type(tpu.value) is type(cpu.value), (case, cpu.value, tpu.value)


# ---- result dtypes and edge values ----
def test_exponential_infinite_rate(mode):
    cpu = torch.empty(6).exponential_(float("inf"))
    tpu = torch.empty(6, device="tpu").exponential_(float("inf"))
    assert_same(tpu, cpu)


BOOL_DIVS = {
    "div": lambda a, b: torch.div(a, b),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "true_divide": lambda a, b: torch.true_divide(a, b),
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "remainder": lambda a, b: torch.remainder(a, b),
    "fmod": lambda a, b: torch.fmod(a, b),
}


@pytest.mark.parametrize("name", sorted(BOOL_DIVS))
@pytest.mark.parametrize("other", ["bool_tensor", "bool_scalar", "int_tensor", "float_scalar"])
def test_div_family_on_bool(mode, name, other):
    # CPU gives true division of bools a float result and has no bool loop
    # for the rounding divisions (NotImplementedError)
    fn = BOOL_DIVS[name]
    a = torch.tensor([True, False, True, True])
    b = {"bool_tensor": torch.tensor([True, True, True, True]), "bool_scalar": True,
         "int_tensor": torch.tensor([1, 2, 3, 1]), "float_scalar": 2.0}[other]
    bt = b.to("tpu") if isinstance(b, torch.Tensor) else b
    try:
        expected = fn(a, b)
    except Exception as e:
        with pytest.raises(type(e)):
            out = fn(a.to("tpu"), bt)
            torch.tpu.synchronize()
            del out
        return
    assert_same(fn(a.to("tpu"), bt), expected)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8, torch.int32,
                                   torch.int64, torch.bool, torch.float32])
def test_addr_result_dtype(mode, dtype):
    g = torch.Generator().manual_seed(6)
    m = torch.randint(0, 3, (3, 4), generator=g).to(dtype)
    u = torch.randint(0, 3, (3,), generator=g).to(dtype)
    v = torch.randint(0, 3, (4,), generator=g).to(dtype)
    kw = {} if dtype in (torch.bool, torch.float32) else dict(beta=2, alpha=3)
    expected = torch.addr(m, u, v, **kw)
    actual = torch.addr(m.to("tpu"), u.to("tpu"), v.to("tpu"), **kw)
    assert_same(actual, expected)


# ---- the fill loop reads no input ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int16, torch.bool])
def test_fill_values(mode, dtype):
    for value in (0, 1, -2.5, True):
        if not dtype.is_floating_point and isinstance(value, float):
            continue
        expected = torch.empty(37, dtype=dtype).fill_(value)
        assert_same(torch.empty(37, dtype=dtype, device="tpu").fill_(value), expected)
        assert_same(torch.full((3, 5), value, dtype=dtype, device="tpu"),
                    torch.full((3, 5), value, dtype=dtype))


UBSAN_DRIVER = r"""
#include "tests/test_util.h"
int main(void) {
  unsigned char buf[8 * 40];
  int64_t n[1] = {40};
  const tpu_dtype_t dts[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16, TPU_I64, TPU_I32, TPU_BOOL};
  for (unsigned k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    tpu_tensor_t o = tt_make(buf, dts[k], 1, n);
    tpu_arg_t a[2] = {ta_t(&o), ta_d(1.0)};
    CHECK_OK(tt_run("fill_.Scalar", a, 2, &o, 1));
    CHECK_OK(tt_run("zero_", a, 1, &o, 1));
  }
  return g_failures ? 1 : 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_fill_kernel_reads_no_input_under_ubsan(tmp_path):
    """Builds the element-wise kernels with UBSAN (no recovery) and runs
    fill_ and zero_ over every compute type: a loop that loads its declared
    input, which tpu_k_fill does not pass, aborts."""
    lib = os.path.join(ROOT, "build", "libtpurt.a")
    if not os.path.exists(lib):
        pytest.skip("runtime library not built")
    probe = subprocess.run(["gcc", "-fsanitize=undefined", "-x", "c", "-", "-o",
                            str(tmp_path / "probe")], input="int main(void){return 0;}",
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("gcc has no UBSAN runtime")
    drv = tmp_path / "drv.c"
    drv.write_text(UBSAN_DRIVER)
    ew = os.path.join(ROOT, "runtime", "targets", "host", "kernels", "elementwise.c")
    flags = ["-std=c11", "-O0", "-g", "-D_GNU_SOURCE", "-pthread",
             "-I" + os.path.join(ROOT, "runtime", "include"), "-I" + os.path.join(ROOT, "runtime"),
             "-fsanitize=undefined", "-fno-sanitize-recover=all"]
    obj = tmp_path / "ew.o"
    r = subprocess.run(["gcc", *flags, "-c", ew, "-o", str(obj)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    exe = tmp_path / "drv"
    r = subprocess.run(["gcc", *flags, str(drv), str(obj), lib, "-o", str(exe), "-lm", "-ldl"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "runtime error" not in r.stderr, r.stderr[-2000:]
