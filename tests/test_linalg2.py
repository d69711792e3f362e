"""The OpInfo gaps of issue 18 item 6 on tpu against PyTorch's CPU results: geqrf
(reflectors and tau as LAPACK), Bunch-Kaufman LDL^T (linalg.ldl_factor(_ex), ldl_solve:
pivots as LAPACK's sytrf), least squares for every driver (linalg.lstsq), histogramdd,
hash_tensor (bit-exact) and rrelu_with_noise (random: properties and statistics in
training, CPU's values in evaluation)."""
import pytest
import torch

from util import assert_same, check_op, make

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}

# gradient formulas run matmuls on tpu: compare at "highest" (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("highest_precision")


def symmetric(shape, dtype, seed):
    a = make(shape, torch.float64, seed=seed)
    return (a + a.mT).to(dtype)


# ------------------------------------------------------------------ geqrf
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (2, 3, 5), (0, 3, 3), (3, 0)])
@pytest.mark.parametrize("noncontig", [False, True])
def test_geqrf(dtype, shape, noncontig):
    a = make(shape, dtype, seed=1, noncontig=noncontig)
    check_op(torch.geqrf, a, **TOL[dtype])


def test_geqrf_errors():
    check_op(torch.geqrf, torch.ones(3))  # 1-d: CPU raises, tpu raises the same type


# ------------------------------------------------------------------ LDL^T
def ldl_cases(dtype):
    yield symmetric((3, 6, 6), dtype, 2)
    s = symmetric((2, 5, 5), dtype, 3)
    s[..., 0, 0] = 0.01  # a small leading diagonal: 2x2 pivots
    yield s
    s = symmetric((7, 7), dtype, 4)
    s.diagonal().mul_(0.001)  # small diagonal throughout: 2x2 blocks and interchanges
    yield s
    yield torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=dtype)  # one 2x2 block


@pytest.mark.parametrize("dtype", DTYPES)
def test_ldl_factor_and_solve(dtype):
    for i, a in enumerate(ldl_cases(dtype)):
        ld, piv, info = torch.linalg.ldl_factor_ex(a)
        if i == 2:
            assert (piv < 0).any()  # the case exercises 2x2 blocks on CPU
        check_op(lambda x: torch.linalg.ldl_factor_ex(x), a, **TOL[dtype])
        check_op(lambda x: torch.linalg.ldl_factor(x), a, **TOL[dtype])
        check_op(lambda x: torch.linalg.ldl_factor(x, hermitian=True), a, **TOL[dtype])
        b = make(a.shape[:-1] + (3,), dtype, seed=5)
        check_op(torch.linalg.ldl_solve, ld, piv, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_ldl_solve_broadcast(dtype):
    a = symmetric((4, 4), dtype, 6)
    ld, piv = torch.linalg.ldl_factor(a)
    check_op(torch.linalg.ldl_solve, ld, piv, make((2, 4, 2), dtype, seed=7), **TOL[dtype])


def test_ldl_only_lower_triangle_read():
    a = make((5, 5), torch.float64, seed=8)  # not symmetric: the lower triangle is used
    check_op(lambda x: torch.linalg.ldl_factor_ex(x), a, **TOL[torch.float64])


def test_ldl_singular_and_bad_input():
    z = torch.zeros(2, 3, 3)
    ld, piv, info = torch.linalg.ldl_factor_ex(z.to("tpu"))
    assert info.cpu().tolist() == [1, 1]
    assert_same((ld, piv, info), torch.linalg.ldl_factor_ex(z))
    with pytest.raises(RuntimeError, match="ldl_factor"):
        out = torch.linalg.ldl_factor_ex(z.to("tpu"), check_errors=True)
        torch.tpu.synchronize()  # kept alive: DeferAndFuse drops work nobody observes
        del out
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.ldl_factor(torch.ones(3, 4, device="tpu"))


# ------------------------------------------------------------------ lstsq
DRIVERS = ["gels", "gelsy", "gelsd", "gelss"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("shapes", [((2, 5, 3), (2, 5, 2)), ((2, 3, 5), (2, 3, 2)), ((4, 4), (4,)),
                                    ((5, 3), (5,)), ((3, 1, 5, 3), (3, 2, 5, 2)), ((1, 5, 3), (2, 5, 2)),
                                    ((2, 6, 4), (6, 1)), ((2, 5, 3), (2, 5)), ((2, 5, 3), (5, 2))])
def test_lstsq(dtype, driver, shapes):
    a, b = make(shapes[0], dtype, seed=9), make(shapes[1], dtype, seed=10)
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_lstsq_grad(dtype):
    a, b = make((2, 5, 3), dtype, seed=11), make((2, 5, 2), dtype, seed=12)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else TOL[dtype]
    check_op(lambda x, y: torch.linalg.lstsq(x, y).solution, a, b, grad=True, **tol)
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver="gelsd").solution, a.mT, b[..., :3, :],
             grad=True, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rank_deficient(dtype, driver):
    a = make((4, 4), torch.float64, seed=13)
    a[:, 3] = a[:, 0] + a[:, 1]  # rank 3: the minimum-norm solution
    a = a.to(dtype)
    b = make((4, 2), dtype, seed=14)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else dict(atol=1e-8, rtol=1e-8)
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b, **tol)
    assert torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver).rank.item() == 3


@pytest.mark.parametrize("driver", DRIVERS)
def test_lstsq_out(driver):
    a, b = make((2, 5, 3), torch.float32, seed=15), make((2, 5, 2), torch.float32, seed=16)
    exp = torch.linalg.lstsq(a, b, driver=driver)
    for sized in (False, True):
        def outs(dev):
            if sized:
                return tuple(torch.empty(t.shape, dtype=t.dtype, device=dev) for t in exp)
            return tuple(torch.empty(0, dtype=t.dtype, device=dev) for t in exp)
        o_cpu, o_tpu = outs("cpu"), outs("tpu")
        torch.linalg.lstsq(a, b, driver=driver, out=o_cpu)
        r = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver, out=o_tpu)
        assert all(x is y for x, y in zip(r, o_tpu))
        assert_same(o_tpu, o_cpu, **TOL[torch.float32])


def test_lstsq_rcond():
    a = torch.diag(torch.tensor([1.0, 1e-3, 1e-6], dtype=torch.float64))
    b = torch.ones(3, 1, dtype=torch.float64)
    for rcond in (1e-2, 1e-4, 1e-8):
        check_op(lambda x, y: torch.linalg.lstsq(x, y, rcond=rcond, driver="gelsd"), a, b)


def test_lstsq_errors():
    a, b = torch.randn(5, 3), torch.randn(4, 2)
    for fn, args in ((lambda x, y: torch.linalg.lstsq(x, y), (a, b)),
                     (lambda x, y: torch.linalg.lstsq(x, y, driver="xyz"), (a, torch.randn(5, 2))),
                     (lambda x, y: torch.linalg.lstsq(x, y), (a, torch.randn(5, 2).double())),
                     (lambda x, y: torch.linalg.lstsq(x, y), (torch.randn(3), torch.randn(3)))):
        with pytest.raises(RuntimeError) as cpu:
            fn(*args)
        with pytest.raises(RuntimeError, match="lstsq"):
            fn(*[t.to("tpu") for t in args])
        assert "lstsq" in str(cpu.value)


# ------------------------------------------------------------------ histogramdd
@pytest.mark.parametrize("dtype", DTYPES)
def test_histogramdd(dtype):
    x = make((50, 3), dtype, seed=15)
    w = make((50,), dtype, low=0, high=2, seed=16)
    for kw in (dict(bins=[3, 4, 2]), dict(bins=[3, 4, 2], weight=w, density=True),
               dict(bins=[2, 2, 5], range=[-1.0, 1.0, 0.0, 2.0, -3.0, 0.5]),
               dict(bins=[torch.tensor([-3.0, 0.0, 3.0], dtype=dtype),
                          torch.tensor([-2.0, -1.0, 0.5, 2.0], dtype=dtype),
                          torch.tensor([-1.0, 1.0], dtype=dtype)], weight=w)):
        tpu_kw = {k: ([b.to("tpu") for b in v] if k == "bins" and isinstance(v[0], torch.Tensor)
                      else v.to("tpu") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        exp = torch.histogramdd(x, **kw)
        act = torch.histogramdd(x.to("tpu"), **tpu_kw)
        assert_same(act.hist, exp.hist, **TOL[dtype])
        assert_same(act.bin_edges, exp.bin_edges, **TOL[dtype])


def test_histogramdd_constant_and_1d():
    x = torch.full((6, 2), 2.5)
    exp = torch.histogramdd(x, bins=[3, 2])
    act = torch.histogramdd(x.to("tpu"), bins=[3, 2])
    assert_same(act.hist, exp.hist)
    assert_same(act.bin_edges, exp.bin_edges)
    x = make((20, 1), torch.float32, seed=17)
    assert_same(torch.histogramdd(x.to("tpu"), bins=[4]).hist, torch.histogramdd(x, bins=[4]).hist)


# ------------------------------------------------------------------ hash_tensor
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                   torch.bool])
def test_hash_tensor(dtype):
    x = make((3, 4, 5), dtype, seed=18)
    for kw in (dict(), dict(dim=1), dict(dim=[0, 2]), dict(dim=[0, 2], keepdim=True),
               dict(dim=-1, keepdim=True)):
        exp = torch.hash_tensor(x, **kw)
        act = torch.hash_tensor(x.to("tpu"), **kw)
        assert_same(act, exp)
        assert act.cpu().view(torch.int64).equal(exp.view(torch.int64))  # bit-exact
    xt = x.transpose(0, 2)  # strided input
    assert_same(torch.hash_tensor(xt.to("tpu"), dim=1), torch.hash_tensor(xt, dim=1))


def test_hash_tensor_special_values():
    x = torch.tensor([float("nan"), -0.0, float("inf"), 1.5, -1.0])
    assert torch.hash_tensor(x.to("tpu")).cpu().view(torch.int64).item() == \
        torch.hash_tensor(x).view(torch.int64).item()
    e = torch.empty(0, 3)
    assert_same(torch.hash_tensor(e.to("tpu"), dim=1), torch.hash_tensor(e, dim=1))
    with pytest.raises(IndexError, match="non-zero size"):  # as CPU
        torch.hash_tensor(e.to("tpu"), dim=0)
    with pytest.raises(RuntimeError) as cpu:
        torch.hash_tensor(torch.ones(3), mode=1)
    with pytest.raises(RuntimeError, match="mode"):
        torch.hash_tensor(torch.ones(3, device="tpu"), mode=1).cpu()
    assert "mode" in str(cpu.value)


# ------------------------------------------------------------------ rrelu_with_noise
@pytest.mark.parametrize("dtype", DTYPES)
def test_rrelu_training(dtype):
    lower, upper = 0.1, 0.4
    x = make((200, 50), dtype, seed=19).to("tpu").requires_grad_()
    noise = torch.empty_like(x).detach()
    torch.manual_seed(0)
    y = torch.ops.aten.rrelu_with_noise(x, noise, lower, upper, True)
    xc, nc, yc = x.detach().cpu(), noise.cpu(), y.detach().cpu()
    neg = xc <= 0
    assert ((nc[neg] >= lower) & (nc[neg] <= upper)).all()
    assert (nc[~neg] == 1).all()
    torch.testing.assert_close(yc, xc * nc)
    assert abs(nc[neg].double().mean().item() - (lower + upper) / 2) < 0.01
    assert abs(nc[neg].double().std().item() - (upper - lower) / 12 ** 0.5) < 0.01
    # the device generator: the same seed gives the same noise
    noise2 = torch.empty_like(noise)
    torch.manual_seed(0)
    torch.ops.aten.rrelu_with_noise(x.detach(), noise2, lower, upper, True)
    assert noise2.cpu().equal(nc)
    # backward: the gradient is the noise
    g = make((200, 50), dtype, seed=20)
    y.backward(g.to("tpu"))
    torch.testing.assert_close(x.grad.cpu(), g * nc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rrelu_eval_and_module(dtype):
    x = make((4, 6), dtype, seed=21)
    check_op(lambda t: torch.nn.functional.rrelu(t, 0.2, 0.3, training=False), x, grad=True)
    m = torch.nn.RReLU(0.2, 0.3).to("tpu").train()
    xt = x.to("tpu").requires_grad_()
    out = m(xt)
    ratio = (out.detach().cpu() / x)[x < 0]
    assert ((ratio >= 0.2 - 1e-6) & (ratio <= 0.3 + 1e-6)).all()
    out.sum().backward()
    gr = xt.grad.cpu()
    torch.testing.assert_close(gr[x >= 0], torch.ones_like(gr[x >= 0]))
    torch.testing.assert_close(gr[x < 0], ratio)
