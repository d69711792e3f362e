"""Convolution, pooling, resampling, normalization and embedding-bag ops on tpu
against PyTorch's CPU results: values, dtypes, shapes and gradients over
shapes, strides, layouts and options."""
import pytest
import torch
import torch.nn.functional as F

from util import assert_same, check_op, make

GRAD_DTYPES = [torch.float32, torch.float64]
LOW_DTYPES = [torch.bfloat16, torch.float16]
LOW_TOL = dict(atol=5e-2, rtol=2e-2)


def tol_for(dtype):
    return LOW_TOL if dtype in LOW_DTYPES else {}


@pytest.fixture(autouse=True)
def highest_precision():
    """Convolutions run on the matrix unit, which follows the float32 matmul
    precision (tpu default "medium": bfloat16 inputs); compare at "highest"."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


# ---------------------------------------------------------------- convolution
# (fn, input shape, weight shape, kwargs); transposed weights are (Cin, Cout/G, k...)
CONVS = {
    "1d": (F.conv1d, (2, 4, 11), (6, 4, 3), dict(stride=2, padding=1)),
    "1d_dil_groups": (F.conv1d, (2, 4, 12), (6, 2, 3), dict(dilation=2, groups=2, padding=2)),
    "2d": (F.conv2d, (2, 3, 9, 8), (5, 3, 3, 3), dict(padding=1)),
    "2d_mixed": (F.conv2d, (2, 4, 9, 10), (6, 2, 3, 2),
                 dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    "2d_1x1": (F.conv2d, (3, 5, 6, 7), (4, 5, 1, 1), {}),
    "2d_1x1_strided": (F.conv2d, (2, 4, 7, 7), (3, 4, 1, 1), dict(stride=2)),
    "2d_depthwise": (F.conv2d, (2, 6, 8, 8), (6, 1, 3, 3), dict(groups=6, padding=1)),
    "2d_kernel_eq_input": (F.conv2d, (2, 3, 4, 4), (2, 3, 4, 4), {}),
    "3d": (F.conv3d, (2, 3, 5, 6, 4), (4, 3, 2, 3, 2), dict(stride=(1, 2, 1), padding=1)),
    "t1d": (F.conv_transpose1d, (2, 4, 6), (4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "t2d": (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 2),
            dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2))),
    "t2d_1x1": (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 1, 1), {}),
    "t2d_1x1_outpad": (F.conv_transpose2d, (1, 2, 4, 4), (2, 3, 1, 1),
                       dict(dilation=2, output_padding=1)),
    "t3d": (F.conv_transpose3d, (1, 2, 3, 4, 3), (2, 3, 2, 2, 3), dict(stride=2)),
}


def _conv_bias(fn, wshape, kw):
    transposed = fn in (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
    return wshape[1] * kw.get("groups", 1) if transposed else wshape[0]


@pytest.mark.parametrize("dtype", GRAD_DTYPES + LOW_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution(name, dtype):
    fn, xs, ws, kw = CONVS[name]
    x, w = make(xs, dtype, -1, 1, seed=1), make(ws, dtype, -1, 1, seed=2)
    b = make((_conv_bias(fn, ws, kw),), dtype, -1, 1, seed=3)
    grad = dtype in GRAD_DTYPES
    check_op(lambda x, w, b: fn(x, w, b, **kw), x, w, b, grad=grad, **tol_for(dtype))
    check_op(lambda x, w: fn(x, w, **kw), x, w, grad=grad, **tol_for(dtype))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_convolution_layouts():
    x, w = make((2, 4, 9, 9), torch.float32), make((6, 4, 3, 3), torch.float32, seed=1)
    b = make((6,), torch.float32, seed=2)

    def conv(x, w, b):
        return F.conv2d(x, w, b, stride=2, padding=1)

    # non-contiguous input and weight (same values, permuted memory)
    check_op(conv, x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),
             w.transpose(2, 3).contiguous().transpose(2, 3), b, grad=True)
    check_op(lambda x, w, b: conv(x[:, ::2], w[:, ::2], b), x, w, b, grad=True)
    # channels_last: same values; the output layout comes from the meta kernel
    cl = torch.channels_last
    check_op(conv, x.contiguous(memory_format=cl), w.contiguous(memory_format=cl), b, grad=True,
             check_stride=False)
    # unbatched input, empty batch, 'same' padding
    check_op(lambda x, w: F.conv2d(x, w, padding=1), x[0], w, grad=True)
    check_op(lambda x, w: F.conv2d(x, w), make((0, 4, 5, 5), torch.float32), w)
    check_op(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w, grad=True)
    check_op(lambda x, w: F.conv1d(x, w, padding="same"), make((2, 4, 7), torch.float32),
             make((3, 4, 4), torch.float32), grad=True)


def test_convolution_integer_and_modules():
    xi, wi = make((2, 3, 6, 6), torch.int64, -5, 5), make((4, 3, 3, 3), torch.int64, -5, 5, seed=1)
    check_op(lambda x, w: F.conv2d(x, w, padding=1), xi, wi)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 8, 3, stride=2, groups=4),
                            torch.nn.ConvTranspose2d(8, 3, 2, stride=2))
    mt = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                             torch.nn.Conv2d(8, 8, 3, stride=2, groups=4),
                             torch.nn.ConvTranspose2d(8, 3, 2, stride=2)).to("tpu")
    mt.load_state_dict(m.state_dict())
    x = make((2, 3, 9, 9), torch.float32)
    y, yt = m(x), mt(x.to("tpu"))
    assert_same(yt, y)
    y.square().sum().backward()
    yt.square().sum().backward()
    for p, pt in zip(m.parameters(), mt.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4)


def test_convolution_double_backward():
    x = make((1, 2, 5, 5), torch.float64).to("tpu").requires_grad_()
    w = make((3, 2, 3, 3), torch.float64, seed=1).to("tpu").requires_grad_()
    wt = make((2, 3, 3, 3), torch.float64, seed=2).to("tpu").requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, w: F.conv2d(x, w, padding=1, stride=2), (x, w))
    assert torch.autograd.gradgradcheck(
        lambda x, w: F.conv_transpose2d(x, w, padding=1, stride=2, output_padding=1), (x, wt))


def test_convolution_medium_precision():
    # "medium": inputs rounded to bfloat16, products summed in float32
    torch.set_float32_matmul_precision("medium")
    x = make((2, 4, 9, 9), torch.float32, -1, 1)
    w = make((6, 4, 3, 3), torch.float32, -1, 1, seed=1)
    want = F.conv2d(x.bfloat16().float(), w.bfloat16().float(), padding=1)
    assert_same(F.conv2d(x.to("tpu"), w.to("tpu"), padding=1), want, atol=1e-4, rtol=1e-4)


def test_convolution_errors():
    x, w = make((1, 3, 5, 5), torch.float32), make((2, 4, 3, 3), torch.float32)
    check_op(lambda x, w: F.conv2d(x, w), x, w)  # channel mismatch: same exception type
    check_op(lambda x, w: F.conv2d(x, w), make((1, 4, 2, 2), torch.float32), w)  # too small


# ---------------------------------------------------------------- pooling
POOL_DTYPES = GRAD_DTYPES + LOW_DTYPES


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
def test_max_pool(dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 13), dtype), make((2, 3, 9, 10), dtype), make((2, 2, 5, 6, 7), dtype)
    for kw in (dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1),
               dict(kernel_size=2, stride=2, ceil_mode=True),
               dict(kernel_size=3, stride=1, padding=1, dilation=2)):
        check_op(lambda x: F.max_pool1d(x, return_indices=True, **kw), x1, grad=grad)
        check_op(lambda x: F.max_pool2d(x, return_indices=True, **kw), x2, grad=grad)
        check_op(lambda x: F.max_pool3d(x, return_indices=True, **kw), x3, grad=grad)
    check_op(lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 0), (1, 2), ceil_mode=True), x2,
             grad=grad)
    check_op(lambda x: F.max_pool2d(x, 2), x2[0], grad=grad)  # unbatched
    cl = x2.contiguous(memory_format=torch.channels_last)
    check_op(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), cl, grad=grad)
    check_op(lambda x: F.max_pool2d(x, 2, return_indices=True), x2.transpose(2, 3), grad=grad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8],
                         ids=str)
def test_max_pool_integer(dtype):
    check_op(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), make((2, 3, 8, 7), dtype))
    check_op(lambda x: F.max_pool3d(x, 2, return_indices=True), make((1, 2, 4, 4, 4), dtype))


def test_max_pool_nan_and_ties():
    x = torch.tensor([[[[1.0, float("nan"), 3.0], [float("nan"), 2.0, 3.0], [3.0, 0.0, 3.0]]]])
    check_op(lambda x: F.max_pool2d(x, 2, 1, return_indices=True), x)
    check_op(lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True), x)
    ties = torch.zeros(1, 1, 4, 4)
    check_op(lambda x: F.max_pool2d(x, 2, return_indices=True), ties, grad=True)


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
def test_avg_pool(dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 13), dtype), make((2, 3, 9, 10), dtype), make((2, 2, 5, 6, 7), dtype)
    for kw in (dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1),
               dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
               dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
               dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)):
        check_op(lambda x: F.avg_pool1d(x, **kw), x1, grad=grad)
        check_op(lambda x: F.avg_pool2d(x, **kw), x2, grad=grad)
        if dtype in GRAD_DTYPES:  # CPU has no float16/bfloat16 avg_pool3d
            check_op(lambda x: F.avg_pool3d(x, **kw), x3, grad=grad)
    check_op(lambda x: F.avg_pool2d(x, (3, 2), divisor_override=4), x2, grad=grad)
    check_op(lambda x: F.avg_pool2d(x, 3, 2, 1), x2.contiguous(memory_format=torch.channels_last),
             grad=grad)
    if dtype in GRAD_DTYPES:
        check_op(lambda x: F.avg_pool3d(x, 2, divisor_override=3), x3, grad=grad)


def test_avg_pool_low_precision_3d():
    # CPU lacks these dtypes for avg_pool3d: compare with float32 rounded once
    x = make((2, 2, 5, 6, 7), torch.float32)
    want = F.avg_pool3d(x.bfloat16().float(), 3, 2, 1).bfloat16()
    assert_same(F.avg_pool3d(x.bfloat16().to("tpu"), 3, 2, 1), want, **LOW_TOL)


def test_avg_pool_integer():
    x = make((2, 3, 8, 7), torch.int64, -50, 50)
    check_op(lambda x: F.avg_pool2d(x, 3, 2, 1), x)
    check_op(lambda x: F.avg_pool2d(x, 2, count_include_pad=False), x)
    check_op(lambda x: F.avg_pool3d(x, 2), make((1, 2, 4, 4, 4), torch.int64, -50, 50))


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
def test_adaptive_pool(dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 13), dtype), make((2, 3, 9, 10), dtype), make((2, 2, 5, 6, 7), dtype)
    for size in (4, 1, 13):
        check_op(lambda x: F.adaptive_avg_pool1d(x, size), x1, grad=grad)
        check_op(lambda x: F.adaptive_max_pool1d(x, size, return_indices=True), x1, grad=grad)
    for size in ((4, 3), (1, 1), (9, 10), (12, 14)):
        check_op(lambda x: F.adaptive_avg_pool2d(x, size), x2, grad=grad)
        check_op(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), x2, grad=grad)
    for size in ((2, 4, 3), (5, 6, 7)):  # CPU sums bfloat16/float16 3-d windows in low precision
        check_op(lambda x: F.adaptive_avg_pool3d(x, size), x3, grad=grad, **tol_for(dtype))
        check_op(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), x3, grad=grad)
    cl = x2.contiguous(memory_format=torch.channels_last)
    check_op(lambda x: F.adaptive_avg_pool2d(x, (4, 3)), cl, grad=grad)
    check_op(lambda x: F.adaptive_max_pool2d(x, (4, 3)), x2[0], grad=grad)


def test_max_pool_backward_bad_index():
    x = torch.randn(1, 1, 4, 4, device="tpu")
    go = torch.ones(1, 1, 2, 2, device="tpu")
    ind = torch.tensor([[[[0, 3], [99, 15]]]], device="tpu")
    with pytest.raises(IndexError):
        r = torch.ops.aten.max_pool2d_with_indices_backward(go, x, [2, 2], [2, 2], [0, 0],
                                                            [1, 1], False, ind)
        torch.tpu.synchronize()  # (r kept alive: DeferAndFuse drops unobserved work)


# ---------------------------------------------------------------- resampling
@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_upsample_nearest(mode, dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 7), dtype), make((2, 3, 5, 6), dtype), make((1, 2, 3, 4, 5), dtype)
    for kw in (dict(size=11), dict(size=3), dict(scale_factor=1.7), dict(scale_factor=2)):
        check_op(lambda x: F.interpolate(x, mode=mode, **kw), x1, grad=grad)
    for kw in (dict(size=(9, 4)), dict(scale_factor=2), dict(scale_factor=(1.5, 0.5)),
               dict(scale_factor=1.3, recompute_scale_factor=True)):
        check_op(lambda x: F.interpolate(x, mode=mode, **kw), x2, grad=grad)
    check_op(lambda x: F.interpolate(x, scale_factor=(1.5, 2.3, 0.6), mode=mode), x3, grad=grad)
    check_op(lambda x: F.interpolate(x, size=(7, 9), mode=mode),
             x2.contiguous(memory_format=torch.channels_last), grad=grad)


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
@pytest.mark.parametrize("align", [False, True])
def test_upsample_interpolating(align, dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 7), dtype), make((2, 3, 5, 6), dtype), make((1, 2, 3, 4, 5), dtype)

    def ip(mode, **kw):
        return lambda x: F.interpolate(x, mode=mode, align_corners=align, **kw)

    for kw in (dict(size=13), dict(size=4), dict(scale_factor=2.5), dict(size=7)):
        check_op(ip("linear", **kw), x1, grad=grad, **tol_for(dtype))
    for mode in ("bilinear", "bicubic"):
        for kw in (dict(size=(9, 4)), dict(scale_factor=(1.5, 2.5)), dict(size=(1, 1)),
                   dict(size=(5, 6))):
            check_op(ip(mode, **kw), x2, grad=grad, **tol_for(dtype))
        check_op(ip(mode, size=(8, 11)), x2.contiguous(memory_format=torch.channels_last),
                 grad=grad, **tol_for(dtype))
    for kw in (dict(size=(5, 3, 7)), dict(scale_factor=2)):
        check_op(ip("trilinear", **kw), x3, grad=grad, **tol_for(dtype))


def test_upsample_uint8():
    x = make((2, 3, 5, 6), torch.uint8, 0, 255)
    for mode in ("nearest", "nearest-exact"):
        check_op(lambda x: F.interpolate(x, size=(9, 4), mode=mode), x)
    check_op(lambda x: F.interpolate(x, size=(1, 5, 6), mode="nearest"), x[None])
    # interpolated uint8 rounds to nearest; CPU's fixed-point path may differ by one
    check_op(lambda x: F.interpolate(x, size=(9, 4), mode="bilinear"), x, atol=1, rtol=0)


@pytest.mark.parametrize("dtype", POOL_DTYPES + [torch.int64, torch.uint8], ids=str)
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_modes(mode, dtype):
    grad = dtype in GRAD_DTYPES
    x1, x2, x3 = make((2, 3, 7), dtype), make((2, 3, 5, 6), dtype), make((1, 2, 3, 4, 5), dtype)
    for pads in ((2, 3), (0, 1), (-1, 2)):
        check_op(lambda x: F.pad(x, pads, mode=mode), x1, grad=grad)
        check_op(lambda x: F.pad(x, pads, mode=mode), x1[0], grad=grad)  # unbatched
    for pads in ((1, 2, 3, 0), (2, 2, 2, 2), (-1, 1, 0, -2)):
        check_op(lambda x: F.pad(x, pads, mode=mode), x2, grad=grad)
    # CPU keeps channels_last; the meta kernel's output (and so ours) is contiguous
    check_op(lambda x: F.pad(x, (1, 2, 3, 1), mode=mode),
             x2.contiguous(memory_format=torch.channels_last), grad=grad, check_stride=False)
    check_op(lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode=mode), x3, grad=grad)


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample(mode, padding, align, dtype):
    x = make((2, 3, 5, 6), dtype)
    grid = make((2, 4, 7, 2), dtype, -1.3, 1.3, seed=5)

    def fn(x, g):
        return F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)

    check_op(fn, x, grid, grad=True)
    # CPU's output strides follow the transposed grid; ours the meta kernel's
    check_op(fn, x.contiguous(memory_format=torch.channels_last), grid.transpose(1, 2), grad=True,
             check_stride=False)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_low_precision(mode):
    # CPU computes bfloat16 grid sampling in bfloat16; ours computes in float
    # and rounds once: compare with float32 on the same rounded inputs
    x = make((2, 3, 5, 6), torch.bfloat16)
    grid = make((2, 4, 7, 2), torch.bfloat16, -1.1, 1.1, seed=5)
    want = F.grid_sample(x.float(), grid.float(), mode=mode, align_corners=False).bfloat16()
    got = F.grid_sample(x.to("tpu"), grid.to("tpu"), mode=mode, align_corners=False)
    assert_same(got, want, **LOW_TOL)


@pytest.mark.parametrize("dtype", GRAD_DTYPES + LOW_DTYPES, ids=str)
def test_unfold_fold(dtype):
    grad = dtype in GRAD_DTYPES
    x = make((2, 3, 7, 8), dtype)
    for kw in (dict(kernel_size=3), dict(kernel_size=(2, 3), dilation=(2, 1), padding=1,
                                         stride=(2, 1))):
        check_op(lambda x: F.unfold(x, **kw), x, grad=grad)
        check_op(lambda x: F.unfold(x, **kw), x[0], grad=grad)
        cols = F.unfold(x, **kw)
        check_op(lambda c: F.fold(c, (7, 8), **kw), cols, grad=grad, **tol_for(dtype))
        check_op(lambda c: F.fold(c, (7, 8), **kw), cols[0], grad=grad, **tol_for(dtype))
    check_op(lambda x: F.unfold(x, 2), x.contiguous(memory_format=torch.channels_last), grad=grad)


def test_shuffles():
    x = make((2, 6, 4, 6), torch.float32)
    check_op(lambda x: F.channel_shuffle(x, 3), x)
    # CPU returns a contiguous result for channels_last input; the meta kernel keeps the layout
    check_op(lambda x: F.channel_shuffle(x, 2), x.contiguous(memory_format=torch.channels_last),
             check_stride=False)
    check_op(lambda x: F.channel_shuffle(x, 2), make((2, 4, 5), torch.int64))
    check_op(lambda x: F.pixel_shuffle(x, 2), make((2, 8, 3, 3), torch.float32), grad=True)
    check_op(lambda x: F.pixel_unshuffle(x, 2), x, grad=True)


# ---------------------------------------------------------------- normalization
@pytest.mark.parametrize("dtype", GRAD_DTYPES + [torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)], ids=str)
def test_batch_norm(shape, dtype):
    grad, tol, c = dtype in GRAD_DTYPES, tol_for(dtype), shape[1]
    x, w, b = make(shape, dtype), make((c,), dtype, 0.5, 1.5, seed=1), make((c,), dtype, seed=2)
    rm, rv = make((c,), dtype, seed=3), make((c,), dtype, 0.5, 2, seed=4)
    for training in (True, False):
        def fn(x, w, b):
            return F.batch_norm(x, rm.clone().to(x.device), rv.clone().to(x.device), w, b,
                                training=training, momentum=0.3, eps=1e-4)
        check_op(fn, x, w, b, grad=grad, **tol)
    check_op(lambda x: F.batch_norm(x, None, None, training=True), x, grad=grad, **tol)
    # training updates the running statistics in place (momentum, unbiased variance)
    rm_c, rv_c, rm_t, rv_t = rm.clone(), rv.clone(), rm.to("tpu"), rv.to("tpu")
    F.batch_norm(x, rm_c, rv_c, w, b, training=True, momentum=0.3)
    F.batch_norm(x.to("tpu"), rm_t, rv_t, w.to("tpu"), b.to("tpu"), training=True, momentum=0.3)
    assert_same(rm_t, rm_c, **tol)
    assert_same(rv_t, rv_c, **tol)


def test_norm_layers():
    x = make((2, 4, 5, 6), torch.float32)
    check_op(lambda x: F.instance_norm(x), x, grad=True)
    check_op(lambda x, w, b: F.group_norm(x, 2, w, b), x, make((4,), torch.float32, seed=1),
             make((4,), torch.float32, seed=2), grad=True)
    check_op(lambda x, w: F.rms_norm(x, (6,), w), x, make((6,), torch.float32, seed=1),
             grad=True)
    check_op(lambda x: F.rms_norm(x, (5, 6), eps=1e-3), x, grad=True)
    # module in train mode keeps its running statistics on tpu
    bn = torch.nn.BatchNorm2d(4, momentum=0.2)
    bnt = torch.nn.BatchNorm2d(4, momentum=0.2).to("tpu")
    for i in range(3):
        xi = make((2, 4, 5, 6), torch.float32, seed=i)
        bn(xi)
        bnt(xi.to("tpu"))
    assert_same(bnt.running_mean, bn.running_mean)
    assert_same(bnt.running_var, bn.running_var)
    assert int(bnt.num_batches_tracked) == 3


def test_instance_norm_affine():
    check_op(lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
             make((2, 4, 5, 6), torch.float32), make((4,), torch.float32, seed=1),
             make((4,), torch.float32, seed=2), grad=True)


# ---------------------------------------------------------------- embedding bags
@pytest.mark.parametrize("dtype", GRAD_DTYPES + [torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode, dtype):
    grad = dtype in GRAD_DTYPES
    w = make((10, 5), dtype)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0])
    tol = tol_for(dtype)
    for offsets, last in ((torch.tensor([0, 3, 3, 5]), False),
                          (torch.tensor([0, 3, 3, 5, 10]), True)):
        for pad in (None, 4):
            def fn(w, i, o):
                return F.embedding_bag(i, w, o, mode=mode, padding_idx=pad,
                                       include_last_offset=last)
            check_op(fn, w, idx, offsets, grad=grad, **tol)
    check_op(lambda w, i: F.embedding_bag(i, w, mode=mode), w, idx.view(2, 5), grad=grad, **tol)
    check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, idx.int(),
             torch.tensor([0, 4], dtype=torch.int32), grad=grad, **tol)
    check_op(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w.t().contiguous().t(), idx,
             torch.tensor([0, 7]), grad=grad, **tol)
    if mode == "sum":
        psw = make((10,), dtype, seed=4)
        check_op(lambda w, i, o, p: F.embedding_bag(i, w, o, per_sample_weights=p, padding_idx=2),
                 w, idx, torch.tensor([0, 3, 3, 5]), psw, grad=grad, **tol)


def test_embedding_bag_scale_grad_by_freq():
    # gradient rows divided by each index's number of occurrences (CPU's
    # sum/mean kernels look the count up at the wrong position)
    w = make((10, 5), torch.float32)
    idx, offsets = torch.tensor([1, 2, 1, 5, 4, 3, 2, 1]), torch.tensor([0, 3, 3, 5])
    counts = torch.bincount(idx, minlength=10).clamp(min=1).float()[:, None]
    for mode in ("sum", "mean"):
        wc = w.clone().requires_grad_()
        F.embedding_bag(idx, wc, offsets, mode=mode).sum().backward()
        wt = w.to("tpu").requires_grad_()
        F.embedding_bag(idx.to("tpu"), wt, offsets.to("tpu"), mode=mode,
                        scale_grad_by_freq=True).sum().backward()
        assert_same(wt.grad, wc.grad / counts, check_stride=False)


def test_embedding_bag_errors():
    w = torch.randn(10, 3, device="tpu")
    with pytest.raises(IndexError):
        F.embedding_bag(torch.tensor([1, 10], device="tpu"), w, torch.tensor([0], device="tpu"))
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError):
        F.embedding_bag(torch.tensor([1, 2], device="tpu"), w, torch.tensor([1], device="tpu"))
        torch.tpu.synchronize()
