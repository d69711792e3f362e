"""Custom kernels as PyTorch ops (torch_tpu.kernels): a C kernel on the host target and a
StableHLO / JAX kernel on the pjrt target, each called eagerly, in DeferAndFuse, inside
torch.compile(backend="tpu", fullgraph=True) and through autograd, against CPU; compile
errors, Debug mode's guard regions, and the compilation cache."""
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import torch_tpu
import torch_tpu.kernels as K
from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _uniq(base):
    """A fresh op name (ops live as long as the process; tests may define twice)."""
    return f"tpu_test_k::{base}_{uuid.uuid4().hex[:8]}"


# A fused scaled add over any float dtype and any strides: out = x + alpha * y, the
# element loop split across the runtime's thread pool.
SCALED_ADD = r"""
typedef struct { const tpuk_tensor_t *x, *y, *out; float alpha; } args_t;

static void body(void* p, int64_t begin, int64_t end) {
  const args_t* a = p;
  for (int64_t i = begin; i < end; i++) {
    float v = tpuk_load_f32(a->x, tpuk_offset(a->x, i)) +
              a->alpha * tpuk_load_f32(a->y, tpuk_offset(a->y, i));
    tpuk_store_f32(a->out, i, v);   /* the output is contiguous */
  }
}

int scaled_add(const tpuk_call_t* call) {
  if (call->n_in != 2 || call->n_out != 1 || call->n_num != 1)
    return tpuk_fail(call, "expected (x, y, alpha) -> out");
  args_t a = {&call->in[0], &call->in[1], &call->out[0], (float)call->num[0]};
  if (a.x->numel != a.y->numel) return tpuk_fail(call, "x and y differ in size");
  call->parallel_for(a.out->numel, 4096, body, &a);
  return 0;
}
"""

# A row-wise op that writes one of its arguments in place: rows of x scaled to unit
# L2 norm (float32, contiguous), also returning each row's norm.
ROW_NORMALIZE = r"""
#include <math.h>
typedef struct { float* x; float* norms; int64_t cols; } rows_t;

static void rows(void* p, int64_t begin, int64_t end) {
  const rows_t* r = p;
  for (int64_t i = begin; i < end; i++) {
    float* row = r->x + i * r->cols;
    double s = 0;
    for (int64_t j = 0; j < r->cols; j++) s += (double)row[j] * row[j];
    float n = (float)sqrt(s);
    r->norms[i] = n;
    for (int64_t j = 0; j < r->cols; j++) row[j] = n > 0 ? row[j] / n : 0.0f;
  }
}

int row_normalize_(const tpuk_call_t* call) {
  const tpuk_tensor_t* x = &call->in[0];
  if (x->dtype != TPUK_F32 || x->ndim != 2 || !tpuk_is_contiguous(x))
    return tpuk_fail(call, "x must be a contiguous 2-d float32 tensor");
  rows_t r = {x->data, call->out[0].data, x->sizes[1]};
  call->parallel_for(x->sizes[0], 16, rows, &r);
  return 0;
}
"""


def _scaled_add_op(name=None, source=SCALED_ADD):
    name = name or _uniq("scaled_add")

    def backward(ctx, g):
        return g, g * ctx.alpha, None

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[2]

    @K.c_op(name, source, entry="scaled_add", backward=backward, setup_context=setup_context)
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return scaled_add


@pytest.fixture(scope="module")
def scaled_add():
    return _scaled_add_op()


def test_header_is_shipped_and_self_contained(tmp_path):
    text = K.header_text()
    assert "tpuk_call_t" in text and "parallel_for" in text and "tpuk_f32_to_bf16" in text
    path = K.header_path(str(tmp_path))
    assert os.path.basename(path) == "torch_tpu_kernel.h"
    with open(path) as f:
        assert f.read() == text
    # it compiles on its own, as C and as C++
    src = tmp_path / "t.c"
    src.write_text('#include "torch_tpu_kernel.h"\nint main(void) { return tpuk_dtype_size(TPUK_BF16) != 2; }\n')
    r = subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-I", str(tmp_path), "-o",
                        str(tmp_path / "t"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(tmp_path / "t")]).returncode == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_c_kernel_eager(scaled_add, dtype):
    x = torch.randn(3, 1000, dtype=dtype)
    y = torch.randn(3, 1000, dtype=dtype)
    out = scaled_add(x.to("tpu"), y.to("tpu"), 0.5)
    assert out.device.type == "tpu" and out.dtype == dtype
    ref = (x.float() + 0.5 * y.float()).to(dtype)
    torch.testing.assert_close(out.cpu(), ref, atol=0, rtol=0)
    # strided inputs: the kernel walks them by their strides
    out = scaled_add(x.to("tpu").t(), y.to("tpu").t(), -2.0)
    torch.testing.assert_close(out.cpu(), (x.float().t() - 2.0 * y.float().t()).to(dtype))


def test_c_kernel_large_is_queued_and_parallel(scaled_add):
    x, y = torch.randn(1 << 18), torch.randn(1 << 18)
    out = scaled_add(x.to("tpu"), y.to("tpu"), 3.0)
    torch.tpu.synchronize()
    torch.testing.assert_close(out.cpu(), x + 3.0 * y, atol=0, rtol=0)


def test_c_kernel_in_defer_and_fuse(scaled_add, defer):
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    xt, yt = x.to("tpu"), y.to("tpu")
    torch_tpu.materialize()
    before = torch_tpu.modes.trace_stats()["nodes"] if hasattr(torch_tpu.modes, "trace_stats") else None
    # fusible element-wise ops around the kernel: the kernel is a node of its own
    z = scaled_add((xt * 2).exp(), yt + 1, 0.25).relu() * 3
    assert torch_tpu._C.trace_length(0) >= 4
    got = z.cpu()
    ref = ((x * 2).exp() + 0.25 * (y + 1)).relu() * 3
    torch.testing.assert_close(got, ref)
    if before is not None:
        assert torch_tpu.modes.trace_stats()["nodes"] - before >= 4


def test_c_kernel_dead_result_is_dropped(scaled_add, defer):
    x = torch.randn(100).to("tpu")
    torch_tpu.materialize()
    scaled_add(x, x, 1.0)  # nobody keeps the result: the node is dead
    torch_tpu.materialize()
    torch.tpu.synchronize()


def test_c_kernel_in_torch_compile(scaled_add):
    def f(x, y):
        return torch.sigmoid(scaled_add(x * 2, y, 0.5)) + 1

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    x, y = torch.randn(16, 40), torch.randn(16, 40)
    got = cf(x.to("tpu"), y.to("tpu"))
    torch.testing.assert_close(got.cpu(), torch.sigmoid(x * 2 + 0.5 * y) + 1)


def test_c_kernel_autograd_eager_and_compiled(scaled_add):
    x = torch.randn(8, 20, requires_grad=True)
    y = torch.randn(8, 20, requires_grad=True)
    (x * (x + 1.5 * y)).sum().backward()
    gx, gy = x.grad.clone(), y.grad.clone()

    for compiled in (False, True):
        xt = x.detach().to("tpu").requires_grad_()
        yt = y.detach().to("tpu").requires_grad_()

        def f(a, b):
            return (a * scaled_add(a, b, 1.5)).sum()
        fn = torch.compile(f, backend="tpu", fullgraph=True) if compiled else f
        fn(xt, yt).backward()
        torch.testing.assert_close(xt.grad.cpu(), gx)
        torch.testing.assert_close(yt.grad.cpu(), gy)


def test_c_kernel_mutating_argument(mode):
    name = _uniq("row_normalize_")

    @K.c_op(name, ROW_NORMALIZE, entry="row_normalize_", mutates_args=("x",))
    def row_normalize_(x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape[0], dtype=x.dtype, device=x.device)

    x = torch.randn(37, 50)
    xt = x.to("tpu")
    norms = row_normalize_(xt)
    ref_n = x.double().norm(dim=1).float()
    torch.testing.assert_close(norms.cpu(), ref_n)
    torch.testing.assert_close(xt.cpu(), x / ref_n[:, None])


def test_c_kernel_mutating_in_torch_compile():
    name = _uniq("row_normalize_")

    @K.c_op(name, ROW_NORMALIZE, entry="row_normalize_", mutates_args=("x",))
    def row_normalize_(x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape[0], dtype=x.dtype, device=x.device)

    def f(a):
        b = a * 2
        n = row_normalize_(b)
        return b + 1, n

    x = torch.randn(9, 31)
    b, n = torch.compile(f, backend="tpu", fullgraph=True)(x.to("tpu"))
    ref_n = (x * 2).double().norm(dim=1).float()
    torch.testing.assert_close(n.cpu(), ref_n)
    torch.testing.assert_close(b.cpu(), x * 2 / ref_n[:, None] + 1)


def test_kernel_error_message_names_the_op(mode):
    name = _uniq("scaled_add")
    op = _scaled_add_op(name)
    with pytest.raises(RuntimeError, match=rf"{name} failed: x and y differ in size"):
        # the result is read: in DeferAndFuse, errors of dropped (dead) nodes are not raised
        op(torch.ones(4, device="tpu"), torch.ones(5, device="tpu"), 1.0).cpu()
    torch.tpu.synchronize()  # the device stays usable
    assert op(torch.ones(2, device="tpu"), torch.ones(2, device="tpu"), 1.0).cpu().tolist() == [2, 2]


def test_compile_error_reports_the_compilers_message_and_line():
    bad = "int broken(const tpuk_call_t* call) {\n  int x = 1;\n  return x +* ;\n}\n"
    name = _uniq("broken")
    with pytest.raises(K.KernelCompileError) as ei:
        @K.c_op(name, bad, entry="broken")
        def broken(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)
    msg = str(ei.value)
    assert "compilation failed" in msg and "error" in msg, msg
    # the user's own line number, in a file named after the op
    assert name.replace("::", "_") + ".c:3:" in msg, msg
    assert "torch_tpu_cc_" not in msg, msg  # no temporary paths


def test_missing_entry_is_a_clear_error():
    with pytest.raises(K.KernelCompileError, match="no exported function 'nope'"):
        @K.c_op(_uniq("noentry"), SCALED_ADD, entry="nope")
        def noentry(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)


OVERRUN = r"""
int overrun(const tpuk_call_t* call) {
  float* o = call->out[0].data;
  for (int64_t i = 0; i <= call->out[0].numel; i++) o[i] = 1.0f;  /* one element too many */
  return 0;
}
"""

WRITES_INPUT = r"""
int writes_input(const tpuk_call_t* call) {
  ((float*)call->in[0].data)[0] = 42.0f;  /* x is not declared in mutates_args */
  ((float*)call->out[0].data)[0] = 0.0f;
  return 0;
}
"""


def test_debug_mode_guard_regions_catch_out_of_bounds_writes():
    name = _uniq("overrun")

    @K.c_op(name, OVERRUN, entry="overrun")
    def overrun(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    x = torch.zeros(10, device="tpu")
    with torch_tpu.eager_mode("debug"):
        with pytest.raises(RuntimeError, match=rf"{name} wrote out of bounds of output 0.*past its last element"):
            overrun(x)

    name2 = _uniq("writes_input")

    @K.c_op(name2, WRITES_INPUT, entry="writes_input")
    def writes_input(x: torch.Tensor) -> torch.Tensor:
        return torch.empty(1, device=x.device)

    with torch_tpu.eager_mode("debug"):
        with pytest.raises(RuntimeError, match=rf"{name2} wrote into input 0.*mutates_args"):
            writes_input(x)
    assert x.cpu().eq(0).all()  # nothing was written back


def test_debug_mode_env_catches_overrun_in_a_fresh_process():
    code = textwrap.dedent(f"""
        import torch, torch_tpu, torch_tpu.kernels as K
        @K.c_op("tpu_test_env::overrun", {OVERRUN!r}, entry="overrun")
        def overrun(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)
        try:
            overrun(torch.zeros(7, device="tpu"))
        except RuntimeError as e:
            print("CAUGHT", e)
    """)
    r = run_python(code, env={"TORCH_TPU_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert "CAUGHT" in r.stdout and "tpu_test_env::overrun wrote out of bounds" in r.stdout, r.stdout


def test_same_source_hits_the_cache(tmp_path):
    # a fresh source for this test run, so the first definition compiles
    src = SCALED_ADD + f"\n/* {uuid.uuid4().hex} */\n"
    a = _scaled_add_op(_uniq("cache_a"), src)
    assert a.kernel_info.cache_tier == 0
    stats = torch.tpu.compilation_cache_stats()
    b = _scaled_add_op(_uniq("cache_b"), src)  # another op, the same source
    assert b.kernel_info.cache_tier == 1 and b.kernel_info.key == a.kernel_info.key
    assert torch.tpu.compilation_cache_stats()["compiles"] == stats["compiles"]
    x = torch.arange(4.0, device="tpu")
    assert b(x, x, 2.0).cpu().tolist() == [0, 3, 6, 9]
    # another process finds it in the machine's tiers without compiling
    code = textwrap.dedent(f"""
        import torch, torch_tpu, torch_tpu.kernels as K
        @K.c_op("tpu_test_cache::c", {src!r}, entry="scaled_add")
        def c(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
            return torch.empty_like(x)
        print("TIER", c.kernel_info.cache_tier)
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "TIER 2" in r.stdout or "TIER 3" in r.stdout, r.stdout


def test_stablehlo_kernel_needs_the_pjrt_target():
    if torch_tpu._C.target() == "pjrt":
        pytest.skip("runs on the host target")
    with pytest.raises(NotImplementedError, match="TORCH_TPU_TARGET=pjrt"):
        @K.stablehlo_op(_uniq("hlo"), HLO_SCALED_ADD)
        def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)


# ---- the pjrt target (a child process with TORCH_TPU_TARGET=pjrt) ----
def _cpu_plugin():
    from torch_tpu import pjrt_plugins
    for p in pjrt_plugins.installed():
        if p.kind == "cpu":
            return p.path
    return None


HLO_SCALED_ADD = """
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = stablehlo.constant dense<5.000000e-01> : tensor<4x8xf32>
  %m = stablehlo.multiply %c, %y : tensor<4x8xf32>
  %s = stablehlo.add %x, %m : tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}
"""

PJRT_CHILD = r'''
import torch, torch_tpu, torch_tpu.kernels as K
assert torch_tpu._C.target() == "pjrt", torch_tpu._C.target()

HLO = {hlo!r}

def bwd(ctx, g):
    return g, g * 0.5

@K.stablehlo_op("tpu_test_hlo::scaled_add", HLO, backward=bwd)
def hlo_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)

x, y = torch.randn(4, 8), torch.randn(4, 8)
ref = x + 0.5 * y
xt, yt = x.to("tpu"), y.to("tpu")
# eager
torch.testing.assert_close(hlo_add(xt, yt).cpu(), ref)
# DeferAndFuse: one program with the kernel's function inside
with torch_tpu.eager_mode("defer_and_fuse"):
    z = (hlo_add(xt * 2, yt) + 1).cpu()
torch.testing.assert_close(z, (x * 2 + 0.5 * y) + 1)
# torch.compile
cf = torch.compile(lambda a, b: hlo_add(a, b).tanh(), backend="tpu", fullgraph=True)
torch.testing.assert_close(cf(xt, yt).cpu(), ref.tanh())
# autograd
a = xt.clone().requires_grad_()
b = yt.clone().requires_grad_()
(hlo_add(a, b) * 3).sum().backward()
torch.testing.assert_close(a.grad.cpu(), torch.full((4, 8), 3.0))
torch.testing.assert_close(b.grad.cpu(), torch.full((4, 8), 1.5))
# a C kernel has no place on this target
try:
    K.c_op("tpu_test_hlo::c", "int f(const tpuk_call_t* c) {{ return 0; }}", entry="f")(
        lambda x: x)
    raise AssertionError("a C kernel was accepted on pjrt")
except NotImplementedError as e:
    assert "host target" in str(e), e
print("HLO OK")

# a JAX function, lowered per input signature, with a mutated argument and a number
import jax.numpy as jnp

def jfn(acc, v, scale):
    return jnp.sum(v * scale, axis=-1), acc + v * scale

@K.jax_op("tpu_test_jax::accumulate", jfn, mutates_args=("acc",))
def accumulate(acc: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty(v.shape[:-1], dtype=v.dtype, device=v.device)

acc = torch.zeros(3, 5)
v = torch.randn(3, 5)
acct = acc.to("tpu")
s = accumulate(acct, v.to("tpu"), 2.0)
torch.testing.assert_close(s.cpu(), (v * 2).sum(-1))
torch.testing.assert_close(acct.cpu(), v * 2)
with torch_tpu.eager_mode("defer_and_fuse"):
    s = accumulate(acct, v.to("tpu"), 2.0)
    torch.testing.assert_close(acct.cpu(), v * 4)
cf = torch.compile(lambda a, b: accumulate(a, b * 1, 0.5) + 1, backend="tpu", fullgraph=True)
torch.testing.assert_close(cf(acct, v.to("tpu")).cpu(), (v * 0.5).sum(-1) + 1)
torch.testing.assert_close(acct.cpu(), v * 4.5)
assert len(accumulate.jax_variants) == 2, accumulate.jax_variants.keys()
print("JAX OK")
'''


@pytest.mark.skipif(_cpu_plugin() is None,
                    reason="the pjrt target is not available: xla-cpu-pjrt is not installed "
                           "(scripts/setup.sh installs it)")
def test_stablehlo_and_jax_kernels_on_pjrt():
    try:
        import jax  # noqa: F401
    except ImportError:
        pytest.skip("jax is not installed (jax_op lowers JAX functions with it)")
    env = dict(os.environ, TORCH_TPU_TARGET="pjrt", PYTHONPATH=ROOT)
    env.pop("TORCH_TPU_PJRT_PLUGIN", None)
    r = subprocess.run([sys.executable, "-c", PJRT_CHILD.format(hlo=HLO_SCALED_ADD)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "HLO OK" in r.stdout and "JAX OK" in r.stdout, r.stdout


CONVERT = r"""
int convert(const tpuk_call_t* call) {
  const float* x = call->in[0].data;
  const uint16_t* h = call->in[1].data;
  const uint16_t* b = call->in[2].data;
  uint16_t* oh = call->out[0].data;
  uint16_t* ob = call->out[1].data;
  float* fh = call->out[2].data;
  float* fb = call->out[3].data;
  for (int64_t i = 0; i < call->in[0].numel; i++) {
    oh[i] = tpuk_f32_to_f16(x[i]);
    ob[i] = tpuk_f32_to_bf16(x[i]);
  }
  for (int64_t i = 0; i < call->in[1].numel; i++) {
    fh[i] = tpuk_f16_to_f32(h[i]);
    fb[i] = tpuk_bf16_to_f32(b[i]);
  }
  return 0;
}
"""


def test_abi_element_conversions_round_as_pytorch():
    @K.c_op(_uniq("convert"), CONVERT, entry="convert")
    def convert(x: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.empty(x.shape, dtype=torch.float16, device=x.device),
                torch.empty(x.shape, dtype=torch.bfloat16, device=x.device),
                torch.empty(h.shape, dtype=torch.float32, device=h.device),
                torch.empty(b.shape, dtype=torch.float32, device=b.device))

    g = torch.Generator().manual_seed(0)
    # float32: ordinary values, f16's subnormal and overflow ranges, ties, specials
    bits = torch.randint(-2**31, 2**31 - 1, (200000,), generator=g, dtype=torch.int64)
    x = torch.cat([bits.to(torch.int32).view(torch.float32),
                   torch.randn(20000, generator=g) * 1e-6, torch.randn(20000, generator=g) * 7e4,
                   torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25,
                                 3 * 2.0**-26, float("inf"), -float("inf")])])
    x = x[~x.isnan()]  # NaN payloads differ between conversions; NaN-ness is checked below
    every16 = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    oh, ob, fh, fb = convert(x.to("tpu"), every16.view(torch.float16).to("tpu"),
                             every16.view(torch.bfloat16).to("tpu"))
    assert torch.equal(oh.cpu().view(torch.int16), x.to(torch.float16).view(torch.int16))
    assert torch.equal(ob.cpu().view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    ref_h = every16.view(torch.float16).float()
    ref_b = every16.view(torch.bfloat16).float()
    for got, ref in ((fh.cpu(), ref_h), (fb.cpu(), ref_b)):
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int32), ref[~nan].view(torch.int32))
    nan_in = torch.tensor([float("nan")])
    oh, ob, _, _ = convert(nan_in.to("tpu"), every16[:1].view(torch.float16).to("tpu"),
                           every16[:1].view(torch.bfloat16).to("tpu"))
    assert oh.cpu().isnan().all() and ob.cpu().isnan().all()
