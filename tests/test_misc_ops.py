"""Miscellaneous nn ops on tpu against PyTorch CPU: log-sigmoid, ELU backward,
shrink activations, PReLU, GLU, point-wise losses, unfold (a view) and vdot;
values, dtypes, shapes and gradients."""
import pytest
import torch
import torch.nn.functional as F

DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def tol(dt):
    return {"atol": 2e-2, "rtol": 2e-2} if dt == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}


def compare(fn, inputs, dt, grad=True, grad_tol=None):
    """Runs fn on CPU and tpu copies of inputs (cast to dt when floating);
    compares results and, with grad, the gradients of floating inputs."""
    def prep(dev):
        out = []
        for x in inputs:
            x = x.to(dt) if x.is_floating_point() else x
            x = x.detach().to(dev)
            out.append(x.requires_grad_(grad and x.is_floating_point()))
        return out
    cx, tx = prep("cpu"), prep("tpu")
    rc, rt = fn(*cx), fn(*tx)
    assert rt.device.type == "tpu"
    assert rt.dtype == rc.dtype and rt.shape == rc.shape
    torch.testing.assert_close(rt.cpu(), rc, **tol(dt))
    if grad:
        g = torch.randn(rc.shape, dtype=rc.dtype)
        gc = torch.autograd.grad(rc, [x for x in cx if x.requires_grad], g)
        gt = torch.autograd.grad(rt, [x for x in tx if x.requires_grad], g.to("tpu"))
        for a, b in zip(gt, gc):
            torch.testing.assert_close(a.cpu(), b, **(grad_tol or tol(dt)))


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


X = lambda: torch.randn(4, 6) * 2  # noqa: E731


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name,fn", [
    ("logsigmoid", F.logsigmoid),
    ("elu", lambda a: F.elu(a, 0.7)),
    ("hardshrink", lambda a: F.hardshrink(a, 0.6)),
    ("softshrink", lambda a: F.softshrink(a, 0.6)),
    ("glu_last", lambda a: F.glu(a, -1)),
    ("glu_dim0_noncontig", lambda a: F.glu(a.t(), 0)),
])
def test_activation(name, fn, dt):
    compare(fn, [X()], dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_elu_inplace_backward(dt):
    # elu_ with autograd saves the result: elu_backward with is_result=True
    compare(lambda a: F.elu(a * 1, 0.7, inplace=True), [X()], dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_prelu(dt):
    compare(lambda a, w: F.prelu(a, w), [torch.randn(3, 4, 5), torch.rand(4)], dt)
    compare(lambda a, w: F.prelu(a, w), [torch.randn(3, 4, 5), torch.rand(1)], dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name,fn", [
    ("mse", lambda a, b, r: F.mse_loss(a, b, reduction=r)),
    ("huber", lambda a, b, r: F.huber_loss(a, b, reduction=r, delta=0.5)),
    ("smooth_l1", lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.5)),
    ("smooth_l1_beta0", lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.0)),
    ("bce_with_logits", lambda a, b, r: F.binary_cross_entropy_with_logits(a, b.sigmoid(),
                                                                            reduction=r)),
])
def test_loss(name, fn, reduction, dt):
    compare(lambda a, b: fn(a, b, reduction), [X(), torch.randn(4, 6)], dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy(reduction, dt):
    p, t, w = torch.rand(4, 6) * 0.98 + 0.01, torch.rand(4, 6), torch.rand(6)
    compare(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), [p, t], dt)
    compare(lambda a, b: F.binary_cross_entropy(a, b, w.to(a.device, a.dtype), reduction=reduction),
            [p, t], dt)


def test_binary_cross_entropy_out_of_range():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.full((3,), 1.5, device="tpu"), torch.rand(3, device="tpu")).cpu()


@pytest.mark.parametrize("dt", DTYPES + [torch.int64])
def test_unfold_is_view(dt):
    x = (torch.randn(5, 7) * 10).to(dt)
    y = x.to("tpu")
    u = y.unfold(1, 3, 2)
    assert u._base is y and u.stride() == x.unfold(1, 3, 2).stride()
    torch.testing.assert_close(u.cpu(), x.unfold(1, 3, 2))
    y.add_(1)  # the view sees writes to its base
    torch.testing.assert_close(u.cpu(), (x + 1).unfold(1, 3, 2))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("dim,size,step", [(1, 3, 2), (0, 2, 1), (1, 2, 3), (-1, 7, 1)])
def test_unfold_backward(dim, size, step, dt):
    compare(lambda a: a.t().unfold(dim, size, step) * 1, [torch.randn(7, 5)], dt)


def test_unfold_scalar():
    compare(lambda a: a.unfold(0, 1, 1) * 1, [torch.randn(())], torch.float32)


@pytest.mark.parametrize("dt", [torch.float64, torch.int64, torch.int32])
def test_vdot(dt):
    a, b = (torch.randn(9) * 5).to(dt), (torch.randn(9) * 5).to(dt)
    r = torch.vdot(a.to("tpu"), b.to("tpu"))
    assert r.dtype == dt
    torch.testing.assert_close(r.cpu(), torch.vdot(a, b))
