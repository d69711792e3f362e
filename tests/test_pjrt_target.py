"""The pjrt target (TORCH_TPU_TARGET=pjrt) on the XLA CPU plugin, against PyTorch's CPU results.

The target is chosen once per process, so each test runs its checks in a child process with
TORCH_TPU_TARGET=pjrt; the child asserts and exits non-zero on the first difference."""
import os
import subprocess
import sys
import textwrap

import pytest

from torch_tpu import pjrt_plugins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_plugin():
    for p in pjrt_plugins.installed():
        if p.kind == "cpu":
            return p.path
    return None


pytestmark = pytest.mark.skipif(_cpu_plugin() is None and not os.environ.get("CI"),
                                reason="xla-cpu-pjrt is not installed (scripts/setup.sh installs it)")

PRELUDE = """
import torch, torch_tpu
import torch.nn.functional as F
assert torch_tpu._C.target() == "pjrt", torch_tpu._C.target()

def same(a, e, atol=0.0, rtol=0.0):
    assert a.device.type == "tpu", a.device
    c = a.cpu()
    assert c.dtype == e.dtype, (c.dtype, e.dtype)
    assert c.shape == e.shape, (c.shape, e.shape)
    if e.numel() > 1:
        assert a.stride() == e.stride(), (a.stride(), e.stride())
    torch.testing.assert_close(c, e, atol=atol, rtol=rtol, equal_nan=True)
"""


def run_pjrt(code, env=None, expect_rc=0):
    e = dict(os.environ, TORCH_TPU_TARGET="pjrt", PYTHONPATH=ROOT)
    e.pop("TORCH_TPU_PJRT_PLUGIN", None)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == expect_rc, r.stdout + r.stderr
    return r


def test_devices_come_from_the_plugin():
    r = run_pjrt("""
        n = torch.tpu.device_count()
        assert n == 4, n                      # the XLA CPU plugin's devices
        assert "cpu" in torch.tpu.get_device_name(0), torch.tpu.get_device_name(0)
        p = torch.tpu.get_device_properties(1)
        assert p.target == "pjrt" and p.total_memory > 0, p
        print(torch.tpu.get_device_name(3))
    """)
    assert "pjrt" in r.stdout


def test_copies_views_and_in_place_through_views():
    run_pjrt("""
        torch.manual_seed(0)
        x = torch.randn(5, 7)
        a = x.to("tpu")
        same(a, x)
        b = torch.empty(5, 7, device="tpu")
        b[1:3].copy_(x[1:3])
        assert torch.equal(b.cpu()[1:3], x[1:3])
        for f in (lambda t: t.t() + 1, lambda t: t[:, ::2] * 2, lambda t: t[1:4, 2:].exp(),
                  lambda t: t[2], lambda t: t.unsqueeze(1).expand(5, 3, 7) - t[:, None],
                  lambda t: t.t()[::2, 1:] @ t[:4, :3]):
            same(f(a), f(x), atol=1e-6, rtol=1e-6)
        v = a[1:3, 2:5]
        w = a.t()
        v.mul_(10.0)
        x[1:3, 2:5].mul_(10.0)
        same(a, x)
        same(w.contiguous(), x.t().contiguous())
        a.t()[::2].add_(1.0)
        x.t()[::2].add_(1.0)
        same(a, x)
        o = torch.zeros(7, 5, device="tpu")
        torch.add(a.t(), 1.0, out=o)
        same(o, (x.t() + 1.0).contiguous())
        for dt in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
                   torch.int8, torch.uint8, torch.bool):
            c = (x * 3).to(dt)
            same(c.to("tpu"), c)
            same(c.to("tpu")[1:, ::3].contiguous(), c[1:, ::3].contiguous())
        s = torch.tensor(2.5)
        same(a * s, x * s, atol=1e-6, rtol=1e-6)
        same(a + 3, x + 3)
        torch.testing.assert_close(a.sum().item(), x.sum().item(), atol=1e-5, rtol=1e-5)
    """)


def test_ops_against_cpu():
    run_pjrt("""
        torch.manual_seed(1)
        x = torch.randn(6, 8)
        y = torch.randn(8, 5)
        a, b = x.to("tpu"), y.to("tpu")
        torch.set_float32_matmul_precision("highest")
        same(a @ b, x @ y, atol=1e-5, rtol=1e-5)
        same(torch.softmax(a, -1), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
        same(torch.log_softmax(a.t(), 1), torch.log_softmax(x.t(), 1), atol=1e-5, rtol=1e-5)
        same(a.sum(1), x.sum(1), atol=1e-5, rtol=1e-5)
        same(a.mean(0, keepdim=True), x.mean(0, keepdim=True), atol=1e-6, rtol=1e-5)
        same(a.amax(1), x.amax(1))
        same(F.gelu(a), F.gelu(x), atol=1e-6, rtol=1e-5)
        same(torch.tanh(a), torch.tanh(x), atol=1e-6, rtol=1e-5)
        same(torch.where(a > 0, a, a * 2), torch.where(x > 0, x, x * 2))
        same(torch.cat([a, a * 2], 0), torch.cat([x, x * 2], 0))
        w = torch.randn(8, 8)
        ln = F.layer_norm(x, (8,), w[0], w[1])
        same(F.layer_norm(a, (8,), w[0].to("tpu"), w[1].to("tpu")), ln, atol=1e-5, rtol=1e-5)
        same(a.to(torch.bfloat16), x.to(torch.bfloat16))
        same(a > 0.5, x > 0.5)
    """)


def test_autograd_step():
    run_pjrt("""
        torch.manual_seed(2)
        torch.set_float32_matmul_precision("highest")
        x = torch.randn(16, 8)
        w0 = torch.randn(8, 4, requires_grad=True)
        w1 = w0.detach().to("tpu").requires_grad_()
        for w, dev in ((w0, "cpu"), (w1, "tpu")):
            loss = torch.tanh(x.to(dev) @ w).pow(2).mean()
            loss.backward()
        same(w1.grad, w0.grad, atol=1e-6, rtol=1e-5)
        with torch.no_grad():
            w0 -= 0.1 * w0.grad
            w1 -= 0.1 * w1.grad
        same(w1.detach(), w0.detach(), atol=1e-6, rtol=1e-5)
    """)


def test_programs_are_compiled_once():
    r = run_pjrt("""
        a = torch.randn(16).to("tpu")
        b = torch.randn(16).to("tpu")
        for _ in range(3):  # compiles: a fresh output storage, then a reused one
            c = a + b
        torch.tpu.synchronize()
        s0 = torch_tpu._C.pjrt_stats()
        for _ in range(20):
            c = a + b
        torch.tpu.synchronize()
        s1 = torch_tpu._C.pjrt_stats()
        assert s1["compiles"] == s0["compiles"], (s0, s1)
        assert s1["call_hits"] >= s0["call_hits"] + 20, (s0, s1)  # found without composing
        assert s1["runs"] >= s0["runs"] + 20, (s0, s1)
        same(c, a.cpu() + b.cpu())
    """)


def test_defer_and_fuse_graph_is_one_program():
    run_pjrt("""
        x = torch.randn(32, 16)
        a = x.to("tpu")
        torch.tpu.synchronize()
        s0 = torch_tpu._C.pjrt_stats()
        with torch_tpu.eager_mode("defer_and_fuse"):
            y = ((a * 2).exp() + a.t().t()).sum(1)
            torch_tpu.materialize()
        torch.tpu.synchronize()
        s1 = torch_tpu._C.pjrt_stats()
        assert s1["runs"] - s0["runs"] == 1, (s0, s1)
        same(y, ((x * 2).exp() + x).sum(1), atol=1e-4, rtol=1e-5)
    """)


def test_debug_mode():
    run_pjrt("""
        x = torch.randn(4, 4)
        with torch_tpu.eager_mode("debug"):
            same(x.to("tpu").exp() * 2, x.exp() * 2, atol=1e-6, rtol=1e-6)
    """)


def test_ops_without_a_lowering_raise_and_the_device_keeps_working():
    run_pjrt("""
        a = torch.randn(8).to("tpu")
        try:
            torch.special.airy_ai(a)
        except NotImplementedError as e:
            assert "pjrt" in str(e) and "airy_ai" in str(e), str(e)
        else:
            raise AssertionError("no error")
        same(a * 2, a.cpu() * 2)
    """)


def test_out_of_memory_raises_and_the_device_keeps_working():
    run_pjrt("""
        keep = torch.ones(1024, device="tpu")
        try:
            torch.empty(64 << 20, dtype=torch.uint8, device="tpu")
        except torch.OutOfMemoryError as e:
            assert "out of memory" in str(e), str(e)
        else:
            raise AssertionError("no OOM")
        same(keep + 1, torch.full((1024,), 2.0))
    """, env={"TORCH_TPU_HBM_BYTES": str(32 << 20)})


def test_no_plugin_is_one_clear_error():
    r = run_pjrt("torch.zeros(1, device=\"tpu\")", env={"TORCH_TPU_PJRT_PLUGIN": "/nonexistent/plugin.so"},
                 expect_rc=1)
    assert "/nonexistent/plugin.so" in r.stderr, r.stderr
    assert "Traceback" in r.stderr and "Aborted" not in r.stderr


def test_call_key_tells_apart_what_the_program_depends_on():
    # Calls found by their call key skip composing: every difference that changes the
    # module (scalars, view offsets, aliasing, a storage without contents yet) must
    # change the key, so alternating calls each get their own right answer.
    run_pjrt("""
        x = torch.arange(16, dtype=torch.float32)
        a, b = x.to("tpu"), (x * 10).to("tpu")
        s0 = torch_tpu._C.pjrt_stats()
        for i in range(3):
            same(a[0:4] - a[4:8], x[0:4] - x[4:8])    # views of one storage
            same(a[4:8] - a[0:4], x[4:8] - x[0:4])    # the same views, swapped
            same(a[2:6] + a[0:4], x[2:6] + x[0:4])    # another offset
            same(a + a, x + x)                        # one storage twice
            same(a + b, x + x * 10)                   # two storages
            same(a * 2, x * 2)                        # Python scalars are constants
            same(a * 3, x * 3)
            same(a.view(4, 4).t() + 1, x.view(4, 4).t() + 1)
            same(a.view(4, 4)[:, 1] * 1, x.view(4, 4)[:, 1] * 1)  # strided views
            same(a.view(4, 4)[:, 2] * 1, x.view(4, 4)[:, 2] * 1)
            same(a.view(4, 4)[1, :] * 1, x.view(4, 4)[1, :] * 1)
            same(a + torch.tensor(2.5), x + 2.5)      # a CPU scalar operand
            same(a + torch.tensor(-1.0), x - 1.0)
            c = torch.empty(16, device="tpu")         # fresh storage, then a reused one
            torch.add(a, 1, out=c)
            same(c, x + 1)
            c[3:5] = 7.0                              # partial write keeps the rest
            e = x + 1
            e[3:5] = 7.0
            same(c, e)
        s1 = torch_tpu._C.pjrt_stats()
        assert s1["call_hits"] > s0["call_hits"], (s0, s1)
        y = a.clone()
        for k in range(5):                            # in place, a changing scalar
            y.mul_(k + 1)
        same(y, x * 120)
    """)


def test_storage_reinterpreted_through_views_of_other_dtypes():
    # A storage keeps the element type it is first used with; views of other
    # dtypes (same width: a bitcast; other widths and bool: through its bytes)
    # read and write the same bytes as on the CPU.
    run_pjrt("""
        x = torch.randn(8, 6)
        a = x.to("tpu")
        same(a * 1, x * 1)                                  # the storage becomes float32
        same(a.view(torch.int32) + 1, x.view(torch.int32) + 1)
        same(a.view(torch.int16)[:, 3:9] * 1, x.view(torch.int16)[:, 3:9] * 1)
        same(a.view(torch.uint8)[1] + 0, x.view(torch.uint8)[1] + 0)
        same(a.view(torch.float64) * 1, x.view(torch.float64) * 1)
        b, y = a.clone(), x.clone()
        b.view(torch.int32)[2:4] = 7                        # same width write
        y.view(torch.int32)[2:4] = 7
        same(b, y)
        b.view(torch.uint8)[0, 1:6] = 255                   # narrower write, unaligned
        y.view(torch.uint8)[0, 1:6] = 255
        same(b, y)
        b.view(torch.int16)[5, ::3] = -2                    # strided, narrower
        y.view(torch.int16)[5, ::3] = -2
        same(b, y)
        m = torch.zeros(12, dtype=torch.uint8)
        m[::5] = 1
        t = m.to("tpu")
        same(t.view(torch.bool) & True, m.view(torch.bool) & True)
        c = torch.zeros(4, dtype=torch.bfloat16, device="tpu")
        c.view(torch.int16).fill_(16256)                    # bf16 1.0 through int16
        same(c * 2, torch.full((4,), 2.0, dtype=torch.bfloat16))
        same(a, x)                                          # nothing lost
    """)


def test_index_put():
    run_pjrt("""
        x = torch.randn(6, 5, 4)
        i = torch.tensor([0, 4, -1, 2])
        j = torch.tensor([1, 0, 3, 3])
        cases = [((i,), torch.randn(4, 5, 4)),                    # one index tensor
                 ((i, j), torch.randn(4, 4)),                      # two, adjacent
                 ((i,), torch.tensor(2.5)),                        # a broadcast value
                 ((i[:, None], j[None, :]), torch.randn(4, 4, 4)),  # indices that broadcast
                 ((None, j), torch.randn(6, 4, 4))]                # after a full dim
        for acc in (False, True):
            for idx, val in cases:
                e = torch.ops.aten.index_put(x, list(idx), val, acc)
                got = torch.ops.aten.index_put(x.to("tpu"), [None if t is None else t.to("tpu") for t in idx],
                                               val.to("tpu"), acc)
                same(got, e)
        a, e = x.to("tpu"), x.clone()
        a[i, j] = torch.ones(4, 4, device="tpu")                  # in place, through indexing
        e[i, j] = torch.ones(4, 4)
        same(a, e)
        w = torch.randn(10, 3, requires_grad=True)
        wt = w.detach().to("tpu").requires_grad_()
        ids = torch.tensor([[1, 2, 1], [9, 0, 2]])
        (F.embedding(ids.to("tpu"), wt) * 2).sum().backward()    # embedding backward accumulates
        (F.embedding(ids, w) * 2).sum().backward()
        same(wt.grad, w.grad)
    """)


def test_empty_views_read_as_empty():
    # a permuted view of an empty tensor is an empty parameter (its nonempty dims
    # must not be taken for its memory order)
    run_pjrt("""
        x = torch.randn(0, 2, 3)
        a = x.to("tpu")
        same(a.transpose(-1, -2).tril(), x.transpose(-1, -2).tril())
        same(a.mT.contiguous(), x.mT.contiguous())
        same(a.sum(), x.sum())
    """)


def test_special_functions():
    # the lowerings of runtime/lower/special.c against PyTorch's CPU values: the
    # polynomials' while loops (each element stops at its own degree), the Bessel
    # functions' series / asymptotic branches, and the special values
    run_pjrt("""
        S = torch.special
        torch.manual_seed(3)
        x = torch.cat([torch.randn(40) * 5, torch.tensor([0., -0., 1., -1., 0.5, 30.5, -31., 100., 1e-3,
                                                          17.5, 16.9, 1e-8, float("inf"), float("-inf"),
                                                          float("nan")])])
        for f in (S.i0, S.i0e, S.i1, S.i1e, S.modified_bessel_i0, S.modified_bessel_i1, S.bessel_j0,
                  S.bessel_j1, S.bessel_y0, S.bessel_y1, S.modified_bessel_k0, S.modified_bessel_k1,
                  S.scaled_modified_bessel_k0, S.scaled_modified_bessel_k1, S.spherical_bessel_j0,
                  S.log_ndtr):
            same(f(x.to("tpu")), f(x), atol=1e-5, rtol=1.3e-6)
        # erfcx: against float64 (PyTorch's float32 kernel rounds exp(x^2) below -6)
        same(S.erfcx(x.to("tpu")), S.erfcx(x.double()).float(), atol=1e-5, rtol=1.3e-6)
        y = torch.cat([torch.linspace(-1.2, 1.2, 13), torch.tensor([1., -1., 0.])])[:, None]
        n = torch.tensor([0., 1., 2., 3., 5., 7., 9., 12., -1., 4.3, float("nan")])[None, :]
        for f in (S.chebyshev_polynomial_t, S.chebyshev_polynomial_u, S.chebyshev_polynomial_v,
                  S.chebyshev_polynomial_w, S.shifted_chebyshev_polynomial_t,
                  S.shifted_chebyshev_polynomial_u, S.shifted_chebyshev_polynomial_v,
                  S.shifted_chebyshev_polynomial_w, S.hermite_polynomial_h, S.hermite_polynomial_he,
                  S.laguerre_polynomial_l, S.legendre_polynomial_p):
            same(f(y.to("tpu"), n.to("tpu")), f(y, n), atol=1e-5, rtol=1.3e-6)
            same(f(y.to("tpu"), 3), f(y, 3), atol=1e-5, rtol=1.3e-6)
        p = torch.cat([torch.randn(30) * 5, torch.tensor([-2., -1.5, 0., -0., 0.25, 3., 12.])])
        for k in range(5):
            same(torch.polygamma(k, p.to("tpu")), torch.polygamma(k, p), atol=1e-5, rtol=1.3e-6)
    """)


def test_nonzero_and_linalg_factors():
    # nonzero (its output size is counted before it is queued) and what builds on it;
    # LU of rectangular and batched matrices; det / slogdet of 0 x 0 matrices
    run_pjrt("""
        torch.manual_seed(4)
        torch.set_float32_matmul_precision("highest")
        x = torch.randn(4, 5, 3)
        x[x.abs() < 0.7] = 0
        same(torch.nonzero(x.to("tpu")), torch.nonzero(x))
        same(torch.argwhere(x[1].to("tpu")), torch.argwhere(x[1]))
        same(torch.nonzero(torch.zeros(3, 2).to("tpu")), torch.nonzero(torch.zeros(3, 2)))
        same(x.to("tpu")[x.to("tpu") > 0], x[x > 0])
        same(torch.masked_select(x.to("tpu"), x.to("tpu") < 0), torch.masked_select(x, x < 0))
        for shp in [(3, 5), (5, 3), (2, 4, 6), (2, 6, 4), (3, 3, 3), (1, 4), (4, 1)]:
            a = torch.randn(*shp)
            lu, piv = torch.linalg.lu_factor(a)
            g = torch.linalg.lu_factor(a.to("tpu"))
            same(g[0], lu, atol=1e-5, rtol=1e-5)
            same(g[1], piv)
            for t, e in zip(torch.linalg.lu(a.to("tpu")), torch.linalg.lu(a)):
                same(t, e, atol=1e-5, rtol=1e-5)
        a = torch.randn(3, 4, 4)
        same(torch.linalg.det(a.to("tpu")), torch.linalg.det(a), atol=1e-5, rtol=1e-5)
        for t, e in zip(torch.linalg.slogdet(a.to("tpu")), torch.linalg.slogdet(a)):
            same(t, e, atol=1e-5, rtol=1e-5)
        for shp in [(0, 0), (2, 0, 0)]:
            z = torch.randn(*shp)
            same(torch.linalg.det(z.to("tpu")), torch.linalg.det(z))
            for t, e in zip(torch.linalg.slogdet(z.to("tpu")), torch.linalg.slogdet(z)):
                same(t, e)
    """)


def test_max_unpool():
    run_pjrt("""
        torch.manual_seed(5)
        for dims, pool, unpool in ((2, F.max_pool2d, F.max_unpool2d), (3, F.max_pool3d, F.max_unpool3d)):
            x = torch.randn(2, 3, *([6] * dims))
            v, i = pool(x, 2, stride=2, return_indices=True)
            same(unpool(v.to("tpu"), i.to("tpu"), 2, stride=2), unpool(v, i, 2, stride=2))
            same(unpool(v[0].to("tpu"), i[0].to("tpu"), 2, stride=2, output_size=[7] * dims),
                 unpool(v[0], i[0], 2, stride=2, output_size=[7] * dims))
        v, i = F.max_pool1d(torch.randn(2, 9), 3, return_indices=True)
        same(F.max_unpool1d(v.to("tpu"), i.to("tpu"), 3), F.max_unpool1d(v, i, 3))
    """)


def test_batch_norm_variants_and_dropout_backward():
    run_pjrt("""
        torch.manual_seed(6)
        x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
        A = torch.ops.aten
        for training in (True, False):
            rm, rv = torch.randn(3), torch.rand(3) + 0.5
            rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
            e = A._native_batch_norm_legit(x, w, b, rm, rv, training, 0.1, 1e-5)
            g = A._native_batch_norm_legit(x.to("tpu"), w.to("tpu"), b.to("tpu"), rm_t, rv_t, training, 0.1, 1e-5)
            for t, r in zip(g, e):
                same(t, r, atol=1e-5, rtol=1e-5)
            same(rm_t, rm, atol=1e-6, rtol=1e-5)
            same(rv_t, rv, atol=1e-6, rtol=1e-5)
        e = A._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5)       # no_stats
        g = A._native_batch_norm_legit(x.to("tpu"), w.to("tpu"), b.to("tpu"), True, 0.1, 1e-5)
        for t, r in zip(g, e):
            same(t, r, atol=1e-5, rtol=1e-5)
        rm, rv = torch.randn(3), torch.rand(3) + 0.5
        rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
        e = A._batch_norm_with_update(x, w, b, rm, rv, 0.2, 1e-5)
        g = A._batch_norm_with_update(x.to("tpu"), w.to("tpu"), b.to("tpu"), rm_t, rv_t, 0.2, 1e-5)
        for t, r in zip(g[:3], e[:3]):
            same(t, r, atol=1e-5, rtol=1e-5)
        assert g[3].numel() == e[3].numel() == 0
        same(rv_t, rv, atol=1e-6, rtol=1e-5)
        m = torch.rand(4, 3, 5) > 0.5
        same(A.native_dropout_backward(x.to("tpu"), m.to("tpu"), 2.0), A.native_dropout_backward(x, m, 2.0))
    """)


def test_svd_and_eigh_by_jacobi():
    # one-sided (SVD) and cyclic (eigh) Jacobi sweeps in a stablehlo.while; vectors up to sign
    run_pjrt("""
        torch.manual_seed(7)
        torch.set_float32_matmul_precision("highest")
        for shp in [(5, 5), (5, 3), (3, 5), (2, 4, 4), (1, 1)]:
            a = torch.randn(*shp)
            U, S, Vh = torch.linalg.svd(a, full_matrices=False)
            u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=False)
            same(s, S, atol=1e-5, rtol=1e-5)
            same(u.abs(), U.abs(), atol=1e-5, rtol=1e-5)
            same(vh.abs(), Vh.abs(), atol=1e-5, rtol=1e-5)
            same(torch.linalg.svdvals(a.to("tpu")), S, atol=1e-5, rtol=1e-5)
            same(torch.linalg.pinv(a.to("tpu")), torch.linalg.pinv(a), atol=1e-4, rtol=1e-4)
        r2 = torch.randn(5, 2) @ torch.randn(2, 5)                  # rank 2
        same(torch.linalg.pinv(r2.to("tpu")), torch.linalg.pinv(r2), atol=1e-4, rtol=1e-4)
        same(torch.linalg.matrix_rank(r2.to("tpu")), torch.linalg.matrix_rank(r2))
        for shp in [(5, 5), (3, 4, 4)]:
            a = torch.randn(*shp)
            for uplo in "LU":
                w, v = torch.linalg.eigh(a, UPLO=uplo)
                gw, gv = torch.linalg.eigh(a.to("tpu"), UPLO=uplo)
                same(gw, w, atol=1e-5, rtol=1e-5)
                same(gv.abs(), v.abs(), atol=1e-5, rtol=1e-5)
                same(torch.linalg.eigvalsh(a.to("tpu"), UPLO=uplo), w, atol=1e-5, rtol=1e-5)
    """)


def test_householder_qr():
    # geqrf's reflectors unrolled over the columns (LAPACK's signs), Q from them
    run_pjrt("""
        torch.manual_seed(8)
        for shp in [(5, 5), (5, 2), (2, 5), (3, 4, 3), (5, 0)]:
            a = torch.randn(*shp)
            for mode in ("reduced", "complete", "r"):
                for t, e in zip(torch.linalg.qr(a.to("tpu"), mode=mode), torch.linalg.qr(a, mode=mode)):
                    same(t, e, atol=1e-5, rtol=1e-5)
            if 0 in shp or shp[-2] < shp[-1]:
                continue
            g, tau = torch.geqrf(a)
            same(torch.linalg.householder_product(g.to("tpu"), tau.to("tpu")),
                 torch.linalg.householder_product(g, tau), atol=1e-5, rtol=1e-5)
            m = shp[-2]
            cl, cr = torch.randn(*shp[:-2], m, 3), torch.randn(*shp[:-2], 3, m)
            for tr in (False, True):
                same(torch.ormqr(g.to("tpu"), tau.to("tpu"), cl.to("tpu"), True, tr),
                     torch.ormqr(g, tau, cl, True, tr), atol=1e-5, rtol=1e-5)
                same(torch.ormqr(g.to("tpu"), tau.to("tpu"), cr.to("tpu"), False, tr),
                     torch.ormqr(g, tau, cr, False, tr), atol=1e-5, rtol=1e-5)
    """)


def test_histc_frexp_segment_reduce_and_distances():
    run_pjrt("""
        torch.manual_seed(9)
        x = torch.randn(40) * 3
        for bins, lo, hi in ((10, -2, 2), (7, 0, 0), (1, 0, 10), (5, -9, 9)):
            same(torch.histc(x.to("tpu"), bins, lo, hi), torch.histc(x, bins, lo, hi))
        same(torch.histc(torch.full((4,), 2.0).to("tpu"), 4), torch.histc(torch.full((4,), 2.0), 4))
        f = torch.cat([x, torch.tensor([0., -0., 1e-40, -3e-39, float("inf"), float("nan"), 0.5, 1.0])])
        for t, e in zip(torch.frexp(f.to("tpu")), torch.frexp(f)):
            same(t, e)
        d = torch.randn(6, 3)
        for how in ("max", "min", "sum", "mean", "prod"):
            for init in ({}, {"initial": 0.5}):
                L = torch.tensor([2, 0, 3, 1])
                same(torch.segment_reduce(d.to("tpu"), how, lengths=L.to("tpu"), **init),
                     torch.segment_reduce(d, how, lengths=L, **init), atol=1e-6, rtol=1e-6)
                O = torch.tensor([0, 2, 2, 5, 6])
                same(torch.segment_reduce(d.to("tpu"), how, offsets=O.to("tpu"), **init),
                     torch.segment_reduce(d, how, offsets=O, **init), atol=1e-6, rtol=1e-6)
        a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
        for p in (0.0, 1.0, 2.0, 3.5, float("inf")):
            same(torch.cdist(a.to("tpu"), b.to("tpu"), p), torch.cdist(a, b, p), atol=1e-5, rtol=1e-5)
            same(F.pdist(a[0].to("tpu"), p), F.pdist(a[0], p), atol=1e-5, rtol=1e-5)
    """)


def test_grid_sample_2d():
    run_pjrt("""
        torch.manual_seed(10)
        x = torch.randn(2, 3, 5, 7)
        g = torch.rand(2, 4, 6, 2) * 2.4 - 1.2                      # some corners outside
        for mode in ("bilinear", "nearest"):
            for pad in ("zeros", "border"):
                for align in (False, True):
                    kw = dict(mode=mode, padding_mode=pad, align_corners=align)
                    same(F.grid_sample(x.to("tpu"), g.to("tpu"), **kw), F.grid_sample(x, g, **kw),
                         atol=1e-5, rtol=1e-5)
    """)


def test_mode():
    run_pjrt("""
        torch.manual_seed(11)
        # (no NaN: CPU's mode of NaNs depends on their order, [nan, 5] -> nan but [5, nan] -> 5)
        x = torch.randint(0, 4, (3, 5, 7)).float()                  # ties: the smallest, last index
        for dim in (0, 1, -1):
            for keep in (False, True):
                for t, e in zip(torch.mode(x.to("tpu"), dim, keep), torch.mode(x, dim, keep)):
                    same(t, e)
        i = torch.randint(-2, 3, (4, 9))
        for t, e in zip(torch.mode(i.to("tpu")), torch.mode(i)):
            same(t, e)
        for t, e in zip(torch.mode(torch.tensor(2.5).to("tpu")), torch.mode(torch.tensor(2.5))):
            same(t, e)
    """)


def test_matrix_exp_and_max_pool_backward():
    run_pjrt("""
        torch.manual_seed(12)
        torch.set_float32_matmul_precision("highest")
        for a in (torch.randn(5, 5), torch.randn(3, 4, 4) * 3, torch.zeros(2, 2), torch.randn(1, 1)):
            same(torch.linalg.matrix_exp(a.to("tpu")), torch.linalg.matrix_exp(a), atol=1e-5, rtol=1e-5)
        A = torch.ops.aten
        x = torch.randn(2, 3, 7, 8)
        for k, s in ((3, 2), (2, 2), (3, 1)):                        # overlapping windows share argmaxes
            v, i = F.max_pool2d(x, k, s, return_indices=True)
            g = torch.randn_like(v)
            e = A.max_pool2d_with_indices_backward(g, x, [k, k], [s, s], [0, 0], [1, 1], False, i)
            t = A.max_pool2d_with_indices_backward(g.to("tpu"), x.to("tpu"), [k, k], [s, s], [0, 0], [1, 1],
                                                   False, i.to("tpu"))
            same(t, e, atol=1e-6, rtol=1e-6)
    """)
