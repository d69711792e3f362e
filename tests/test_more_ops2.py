"""renorm, the multi-class margin losses (multi_margin_loss,
multilabel_margin_loss) and the regularized incomplete gamma functions
(igamma, igammac) on tpu against PyTorch CPU: values, dtypes, shapes,
gradients and the errors for invalid inputs."""
import math

import pytest
import torch
import torch.nn.functional as F

from util import check_op, raises_like_cpu, make


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)



# ---- renorm ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p,dim,maxnorm", [(2, 0, 1.0), (1, 1, 0.5), (3.5, -1, 2.0),
                                           (math.inf, 0, 0.8), (2, 1, 100.0), (0.5, 2, 3.0)])
def test_renorm(dtype, p, dim, maxnorm):
    x = make((4, 3, 5), dtype, seed=1)
    tol = {} if dtype in (torch.float32, torch.float64) else dict(atol=1e-2, rtol=1e-2)
    grad = dtype in (torch.float32, torch.float64)
    check_op(lambda t: torch.renorm(t, p, dim, maxnorm), x, grad=grad, **tol)


def test_renorm_inplace_out_noncontig():
    x = make((6, 4), torch.float32, seed=2, noncontig=True)
    check_op(lambda t: torch.renorm(t, 2, 1, 1.5), x)
    y, yt = x.clone(), x.clone().to("tpu")
    y.renorm_(1, 0, 2.0)
    yt.renorm_(1, 0, 2.0)
    torch.testing.assert_close(yt.cpu(), y)
    out, outt = torch.empty(6, 4), torch.empty(6, 4, device="tpu")
    torch.renorm(x, 2, 0, 0.7, out=out)
    torch.renorm(x.to("tpu"), 2, 0, 0.7, out=outt)
    torch.testing.assert_close(outt.cpu(), out)


def test_renorm_empty():
    check_op(lambda t: torch.renorm(t, 2, 0, 1.0), torch.randn(0, 3))


@pytest.mark.parametrize("args,match", [((0, 0, 1.0), "non-positive"), ((2, 0, -1.0), "maxnorm"),
                                        ((2, 5, 1.0), "[Dd]imension out of range")])
def test_renorm_errors(args, match):
    raises_like_cpu(lambda t: torch.renorm(t, *args), torch.randn(3, 4), match=match)


def test_renorm_1d_and_int_errors():
    raises_like_cpu(lambda t: torch.renorm(t, 2, 0, 1.0), torch.randn(5), match="2 dimensions")
    raises_like_cpu(lambda t: torch.renorm(t, 2, 0, 1.0), torch.ones(3, 3, dtype=torch.long),
                    match="floating point")


# ---- multi_margin_loss ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin_loss(dtype, p, reduction, weighted):
    x = make((5, 7), dtype, seed=3)
    y = torch.randint(0, 7, (5,), generator=torch.Generator().manual_seed(4))
    w = make((7,), dtype, low=0.1, high=2, seed=5) if weighted else None
    check_op(lambda a, t, ww: F.multi_margin_loss(a, t, p=p, margin=0.7, weight=ww,
                                                  reduction=reduction),
             x, y, w, grad=True)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(6,), ()])
def test_multi_margin_loss_single_sample(reduction, shape):
    x = make(shape, torch.float32, seed=6)
    y = torch.tensor(2 if shape else 0)
    check_op(lambda a, t: F.multi_margin_loss(a, t, reduction=reduction), x, y, grad=True)


def test_multi_margin_loss_empty_batch():
    # (CPU leaves the 'mean' and 'sum' of an empty batch uninitialized; tpu
    # gives nan and 0)
    x = torch.randn(0, 4)
    y = torch.zeros(0, dtype=torch.long)
    check_op(lambda a, t: F.multi_margin_loss(a, t, reduction="none"), x, y, grad=True)
    dev = (x.to("tpu"), y.to("tpu"))
    assert F.multi_margin_loss(*dev, reduction="sum").item() == 0
    assert math.isnan(F.multi_margin_loss(*dev, reduction="mean").item())


def test_multi_margin_loss_noncontig():
    x = make((4, 6), torch.float32, seed=7, noncontig=True)
    y = torch.tensor([5, 0, 3, 3])
    check_op(lambda a, t: F.multi_margin_loss(a, t, p=2, reduction="none"), x, y, grad=True)


@pytest.mark.parametrize("bad", [5, -1, 100])
def test_multi_margin_loss_target_out_of_range(bad):
    raises_like_cpu(lambda a, t: F.multi_margin_loss(a, t), torch.randn(3, 5),
                    torch.tensor([0, bad, 1]), match="out of range")


def test_multi_margin_loss_errors():
    x = torch.randn(3, 5)
    raises_like_cpu(lambda a, t: F.multi_margin_loss(a, t), x, torch.tensor([0, 1, 1]).int())
    raises_like_cpu(lambda a, t: F.multi_margin_loss(a, t), x, torch.tensor([0, 1]))
    raises_like_cpu(lambda a, t, w: F.multi_margin_loss(a, t, weight=w), x, torch.tensor([0, 1, 1]),
                    torch.ones(4))
    raises_like_cpu(lambda a, t: F.multi_margin_loss(a, t, p=3), x, torch.tensor([0, 1, 1]))
    raises_like_cpu(lambda a, t, w: F.multi_margin_loss(a, t, weight=w), x, torch.tensor([0, 1, 1]),
                    torch.ones(5, dtype=torch.float64), match="Double|float64")


def test_multi_margin_loss_bf16_matches_cpu_refusal():
    # CPU has no bfloat16 kernel: tpu refuses too (same exception type)
    check_op(lambda a, t: F.multi_margin_loss(a, t), make((3, 4), torch.bfloat16),
             torch.tensor([0, 1, 2]))


# ---- multilabel_margin_loss ----

def ml_target(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.full((n, c), -1, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(0, c + 1, (1,), generator=g))
        t[i, :k] = torch.randperm(c, generator=g)[:k]
        if k < c and i % 2:  # entries after the first -1 are ignored
            t[i, k + 1:] = torch.randint(0, c, (c - k - 1,), generator=g)
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(dtype, reduction):
    x = make((6, 5), dtype, seed=8)
    y = ml_target(6, 5, 9)
    check_op(lambda a, t: F.multilabel_margin_loss(a, t, reduction=reduction), x, y, grad=True)


def test_multilabel_margin_loss_forward_is_target():
    x = make((4, 6), torch.float32, seed=10)
    y = ml_target(4, 6, 11)
    for r in (0, 1, 2):
        check_op(lambda a, t: torch.ops.aten.multilabel_margin_loss_forward(a, t, r), x, y)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_1d(reduction):
    x = make((5,), torch.float32, seed=12)
    y = torch.tensor([3, 0, -1, 1, 1])
    check_op(lambda a, t: F.multilabel_margin_loss(a, t, reduction=reduction), x, y, grad=True)


def test_multilabel_margin_loss_noncontig_and_empty():
    x = make((5, 4), torch.float32, seed=13, noncontig=True)
    check_op(lambda a, t: F.multilabel_margin_loss(a, t, reduction="none"), x, ml_target(5, 4, 14),
             grad=True)
    check_op(lambda a, t: F.multilabel_margin_loss(a, t, reduction="none"), torch.randn(0, 4),
             torch.zeros(0, 4, dtype=torch.long), grad=True)


@pytest.mark.parametrize("bad", [4, -2])
def test_multilabel_margin_loss_target_out_of_range(bad):
    raises_like_cpu(lambda a, t: F.multilabel_margin_loss(a, t), torch.randn(2, 4),
                    torch.tensor([[0, bad, -1, 0], [1, -1, 0, 0]]), match="out of range")


def test_multilabel_margin_loss_shape_error():
    raises_like_cpu(lambda a, t: F.multilabel_margin_loss(a, t), torch.randn(2, 4),
                    torch.zeros(2, 3, dtype=torch.long))


# ---- igamma / igammac ----

@pytest.mark.parametrize("op", [torch.igamma, torch.igammac])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_igamma_values(op, dtype):
    g = torch.Generator().manual_seed(15)
    a = (torch.rand(400, generator=g, dtype=torch.float64) * 20).to(dtype)
    x = (torch.rand(400, generator=g, dtype=torch.float64) * 25).to(dtype)
    check_op(op, a, x)
    # wide range of magnitudes, both sides of the x = a + 1 switch
    a = torch.tensor([1e-3, 0.1, 0.5, 1, 2.5, 10, 50, 300, 1e4, 1e4, 1e4, 3.0], dtype=dtype)
    x = torch.tensor([1e-4, 3.0, 0.5, 1, 7.0, 9.5, 52, 280, 1e4 - 50, 1e4 + 120, 1e4, 4.0],
                     dtype=dtype)
    check_op(op, a, x)
    check_op(op, a.view(3, 4).t(), x.view(3, 4).t())  # strided operands


@pytest.mark.parametrize("op", [torch.igamma, torch.igammac])
def test_igamma_special_values(op):
    inf, nan = math.inf, math.nan
    a = torch.tensor([0.0, 0.0, 2.0, inf, inf, 2.0, -1.0, 2.0, nan, 1.0, 0.0])
    x = torch.tensor([1.0, 0.0, 0.0, 3.0, inf, inf, 1.0, -1.0, 1.0, nan, inf])
    check_op(op, a, x)


@pytest.mark.parametrize("op", [torch.igamma, torch.igammac])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_igamma_half(op, dtype):
    a = make((50,), dtype, low=0.01, high=8, seed=16)
    x = make((50,), dtype, low=0.0, high=10, seed=17)
    check_op(op, a, x)


def test_igamma_broadcast_inplace_grad_and_gammainc():
    a = make((3, 1), torch.float32, low=0.5, high=5, seed=18)
    x = make((1, 4), torch.float32, low=0.1, high=6, seed=19)
    check_op(torch.igamma, a, x)
    check_op(torch.special.gammainc, a, x)
    check_op(torch.special.gammaincc, a, x)
    # the gradient flows to `other` (PyTorch has none for the first argument)
    for op in (torch.igamma, torch.igammac):
        xc = x.expand(3, 4).contiguous().requires_grad_()
        xt = x.expand(3, 4).contiguous().to("tpu").requires_grad_()
        up = torch.randn(3, 4)
        op(a, xc).backward(up)
        op(a.to("tpu"), xt).backward(up.to("tpu"))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    y, yt = a.expand(3, 4).contiguous(), a.expand(3, 4).contiguous().to("tpu")
    y.igamma_(x)
    yt.igamma_(x.to("tpu"))
    torch.testing.assert_close(yt.cpu(), y)


def test_igamma_int_refused_like_cpu():
    check_op(torch.igamma, torch.tensor([1, 2]), torch.tensor([1, 2]))


def test_margin_loss_backward_out_variants():
    x = make((4, 5), torch.float32, seed=20)
    y = torch.tensor([1, 0, 4, 2])
    ml = ml_target(4, 5, 21)
    is_t = torch.ops.aten.multilabel_margin_loss_forward(x, ml, 1)[1]
    go = torch.tensor(0.7)
    cases = [(torch.ops.aten.multi_margin_loss_backward.grad_input, (go, x, y, 2, 0.5, None, 1)),
             (torch.ops.aten.multilabel_margin_loss_backward.grad_input, (go, x, ml, 2, is_t))]
    for op, args in cases:
        exp = op(*args, grad_input=torch.empty(0))
        out = torch.empty(0, device="tpu")
        op(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args], grad_input=out)
        assert out.shape == exp.shape
        torch.testing.assert_close(out.cpu(), exp)


# ---- backward kernels PyTorch could decompose, and logit's eps ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", [torch.ops.aten.silu_backward, torch.ops.aten.mish_backward])
def test_activation_backward_runs_the_tpu_kernel(op, dtype):
    """silu_backward and mish_backward have a composite (decomposed) form besides
    CPU's kernel; tpu registers its own kernel, so reduced-precision results
    are rounded once like CPU's (the decomposition rounds every step)."""
    import torch_tpu.debug
    x, g = make((4097,), dtype, seed=2), make((4097,), dtype, seed=3)
    with torch_tpu.debug.kernel_profile() as prof:
        out = op(g.to("tpu"), x.to("tpu")).cpu()
    name = op.__name__.split(".")[0]
    assert prof.seconds(name) > 0, prof.table()
    expect = op(g, x)
    assert out.dtype == expect.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, expect)
    else:  # same float computation, one rounding: equal, or 1 ulp where libm differs
        torch.testing.assert_close(out, expect, atol=0, rtol=2 ** -7 if dtype == torch.bfloat16
                                   else 2 ** -10)
        assert (out != expect).float().mean() < 0.01
    assert f"aten::{name}" in torch_tpu.supported_ops()


def test_supported_ops_have_tpu_kernels():
    """supported_ops() names only overloads whose tpu kernel is ours: composite
    overloads that decompose before reaching the backend are not counted."""
    import torch_tpu
    names = torch_tpu.supported_ops()
    assert len(names) >= 450
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert all(has(n, "PrivateUse1") for n in names)
    assert "aten::square" not in names and "aten::add.Tensor" in names


@pytest.mark.parametrize("eps", [None, 0.0, 0.2, -0.5])
def test_logit_backward_eps(eps):
    """With eps the forward clamps to [eps, 1 - eps] and no gradient flows where it
    clamped; without (or with a negative) eps, NaN outside [0, 1]."""
    x = torch.cat([torch.rand(40), torch.tensor([0.0, 1.0, 0.1, 0.9, 0.2, 0.8, -0.5, 1.5])])
    check_op(lambda t: torch.logit(t, eps), x, grad=True)


def test_unfold_fold_bool():
    """im2col / col2im move bool values like any other (fold ORs overlapping windows)."""
    x = torch.rand(2, 3, 5, 6, generator=torch.Generator().manual_seed(4)) > 0.5
    check_op(lambda t: F.unfold(t, (2, 3), padding=1, stride=(1, 2)), x)
    cols = torch.rand(2, 3 * 4, 9, generator=torch.Generator().manual_seed(5)) > 0.7
    check_op(lambda t: F.fold(t, (4, 4), 2), cols)


# ---- angle, tril/triu_indices, matrix_exp ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_angle(dtype):
    x = torch.tensor([-2.5, -0.0, 0.0, 1.5, float("nan"), float("-inf"), float("inf")])
    if not dtype.is_floating_point:
        x = torch.tensor([-3, 0, 4]).to(dtype)
    check_op(torch.angle, x.to(dtype), grad=dtype == torch.float32)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("args", [(4, 3, 1), (3, 5, -1), (0, 3, 0), (5, 5, 0), (2, 7, 9), (6, 2, -8)])
def test_tri_indices(fn, args):
    for dtype in (torch.int64, torch.int32):
        expect, got = fn(*args, dtype=dtype), fn(*args, dtype=dtype, device="tpu")
        assert got.device.type == "tpu" and got.dtype == dtype
        assert torch.equal(got.cpu(), expect)
    with pytest.raises(RuntimeError):
        fn(-1, 3, device="tpu")


@pytest.mark.parametrize("shape,scale", [((3, 3), 1.0), ((5, 5), 8.0), ((2, 4, 4), 0.1),
                                         ((1, 1), 3.0), ((0, 0), 1.0)])
def test_matrix_exp(shape, scale):
    """Against float64 on CPU (tpu evaluates in double; CPU's float32 is less accurate),
    and the gradient, which PyTorch forms from matrix_exp of a block matrix."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(*shape, generator=g) * scale
    ref = torch.linalg.matrix_exp(x.double())
    got = torch.linalg.matrix_exp(x.to("tpu"))
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-6, atol=1e-6 * max(1.0, ref.abs().max().item()) if ref.numel() else 0)
    if x.numel():
        xt = x.to("tpu").requires_grad_()
        torch.linalg.matrix_exp(xt).sum().backward()
        xd = x.double().requires_grad_()
        torch.linalg.matrix_exp(xd).sum().backward()
        torch.testing.assert_close(xt.grad.cpu().double(), xd.grad, rtol=1e-5,
                                   atol=1e-5 * max(1.0, xd.grad.abs().max().item()))
    bad = torch.tensor([[float("inf"), 0.0], [0.0, 1.0]], device="tpu")
    assert torch.linalg.matrix_exp(bad).isnan().all()
    with pytest.raises(RuntimeError):
        torch.linalg.matrix_exp(torch.randn(2, 3, device="tpu"))


# ---- segment_reduce ----

@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce(reduce, initial):
    """lengths and offsets forms, an empty segment, zeros (prod's gradient), an
    inner dim, axis 1 with per-row lengths: values and gradients against CPU."""
    data = torch.tensor([[1.0, 3.5, 3.0, 0.0, 2.0, -1.0], [0.5, 0.0, 0.0, 4.0, 4.25, 1.0]])
    if reduce == "prod":  # two zeros in one segment, one in another
        data[0, 3] = 0.0
    kw = {} if initial is None else {"initial": initial}
    lengths = torch.tensor([2, 0, 3, 1])
    offsets = torch.tensor([0, 2, 2, 5, 6])
    check_op(lambda d: torch.segment_reduce(d, reduce, lengths=lengths.to(d.device), **kw),
             data[0], grad=True)
    check_op(lambda d: torch.segment_reduce(d, reduce, offsets=offsets.to(d.device), **kw),
             data[1], grad=True)
    check_op(lambda d: torch.segment_reduce(d, reduce, lengths=lengths.to(d.device), axis=0, **kw),
             data.t().contiguous(), grad=True)  # (6, 2): an inner dim
    per_row = torch.tensor([[2, 4], [3, 3]], dtype=torch.int32)
    check_op(lambda d: torch.segment_reduce(d, reduce, lengths=per_row.to(d.device), axis=1, **kw),
             data, grad=True)
    check_op(lambda d: torch.segment_reduce(d, reduce, lengths=lengths.to(d.device), **kw),
             data[0].bfloat16())


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_segment_reduce_ties_share_gradient(reduce):
    """Tied extremes split the gradient evenly (checked with a positive upstream
    gradient: CPU divides only positive gradients between ties)."""
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 5.0])
    lengths = torch.tensor([4, 3])
    g = torch.tensor([1.5, 6.0])
    grads = []
    for dev in ("cpu", "tpu"):
        d = x.clone().to(dev).requires_grad_()
        y = torch.segment_reduce(d if reduce == "max" else -d, reduce, lengths=lengths.to(dev))
        y.backward(g.to(dev))
        grads.append(d.grad.cpu())
    assert torch.equal(grads[0], grads[1])
    assert torch.equal(grads[1][4:], torch.full((3,), 2.0 if reduce == "max" else -2.0))


def test_segment_reduce_errors():
    d = torch.arange(6.0)
    raises_like_cpu(lambda x, l: torch.segment_reduce(x, "sum", lengths=l), d, torch.tensor([2, 2]),
                    match="sum to")
    raises_like_cpu(lambda x, l: torch.segment_reduce(x, "sum", lengths=l), d,
                    torch.tensor([2, -1, 5]), match="negative")
    out = torch.segment_reduce(d.to("tpu"), "max", lengths=torch.tensor([2, 2], device="tpu"),
                               unsafe=True)
    assert torch.equal(out.cpu(), torch.tensor([1.0, 3.0]))


# ---- grid_sample on 5-D input (grid_sampler_3d) ----

@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode, padding, align):
    # grid spans [-1.4, 1.4]: some points fall outside the input
    x = make((2, 3, 4, 5, 6), torch.float32, seed=3)
    grid = make((2, 3, 4, 5, 3), torch.float32, -1.4, 1.4, seed=4)

    def fn(x, g):
        return F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)

    check_op(fn, x, grid, grad=True)
    # unit depth (align_corners maps every z to 0) and far-out points
    x1 = make((1, 2, 1, 3, 4), torch.float32, seed=5)
    g1 = make((1, 2, 2, 3, 3), torch.float32, -3.5, 3.5, seed=6)
    check_op(fn, x1, g1, grad=True)
    check_op(fn, x.double(), grid.double(), grad=True)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_noncontig(mode):
    x = make((2, 6, 5, 4, 3), torch.float32, seed=7).permute(0, 4, 3, 2, 1)  # (2, 3, 4, 5, 6)
    grid = make((2, 5, 3, 4, 3), torch.float32, -1.2, 1.2, seed=8).transpose(1, 2)
    assert not x.is_contiguous() and not grid.is_contiguous()

    def fn(x, g):
        return F.grid_sample(x, g, mode=mode, padding_mode="reflection", align_corners=False)

    check_op(fn, x, grid, grad=True, check_stride=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_low_precision(dtype, mode):
    # CPU rounds every step to the low dtype; ours computes in float and rounds
    # once: compare with float32 on the same rounded inputs
    x = make((2, 3, 4, 5, 6), dtype, seed=9)
    grid = make((2, 3, 4, 2, 3), dtype, -1.1, 1.1, seed=10)
    want = F.grid_sample(x.float(), grid.float(), mode=mode, padding_mode="border",
                         align_corners=True).to(dtype)
    got = F.grid_sample(x.to("tpu"), grid.to("tpu"), mode=mode, padding_mode="border",
                        align_corners=True)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), want, atol=2e-2, rtol=2e-2)


def test_grid_sample_3d_errors():
    x = make((2, 3, 4, 5, 6), torch.float32)
    grid = make((2, 3, 4, 5, 3), torch.float32, -1, 1)
    # bicubic is 2-D only, through F.grid_sample and through the aten op
    raises_like_cpu(lambda a, g: F.grid_sample(a, g, mode="bicubic", align_corners=False),
                    x, grid, match="bicubic")
    raises_like_cpu(lambda a, g: torch.ops.aten.grid_sampler_3d(a, g, 2, 0, False), x, grid,
                    match="bicubic")
    # batch mismatch and a grid with 2 components for a 5-D input
    raises_like_cpu(lambda a, g: torch.ops.aten.grid_sampler_3d(a, g, 0, 0, False), x, grid[:1])
    raises_like_cpu(lambda a, g: F.grid_sample(a, g, align_corners=False), x, grid[:1])
    raises_like_cpu(lambda a, g: torch.ops.aten.grid_sampler_3d(a, g, 0, 0, False), x,
                    grid[..., :2])


# ---- antialiased bilinear resize ----

@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,kw", [((2, 3, 10, 12), dict(size=(4, 5))),
                                      ((1, 1, 4, 9), dict(size=(10, 3))),
                                      ((2, 2, 9, 9), dict(scale_factor=(0.37, 0.5))),
                                      ((1, 3, 5, 8), dict(size=(1, 1))),
                                      ((1, 1, 6, 6), dict(scale_factor=(1.7, 2.5)))])
def test_upsample_bilinear_antialias(shape, kw, align):
    """F.interpolate(mode="bilinear", antialias=True) down and up, both corner modes,
    values and gradients (the weights: a triangle stretched by the ratio when
    shrinking, normalized per output)."""
    x = make(shape, torch.float32, seed=3)
    check_op(lambda t: F.interpolate(t, mode="bilinear", antialias=True, align_corners=align, **kw),
             x, grad=True, atol=1e-5, rtol=1e-5)


def test_sgn_backward_and_efficient_zeros():
    """sgn's gradient on real inputs comes from _efficientzerotensor: on tpu an
    ordinary zero-filled tensor (same values as PyTorch's storage-less one)."""
    x = torch.tensor([-2.0, 0.0, 3.5, -0.0, 1.0])
    check_op(torch.sgn, x, grad=True)
    check_op(lambda t: torch.sgn(t) * t, x, grad=True)
    z = torch._efficientzerotensor([2, 3], dtype=torch.bfloat16, device="tpu")
    assert z.device.type == "tpu" and z.dtype == torch.bfloat16 and z.shape == (2, 3)
    assert torch.equal(z.cpu(), torch.zeros(2, 3, dtype=torch.bfloat16))
