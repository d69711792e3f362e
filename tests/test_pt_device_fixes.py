"""Regression tests for defects that PyTorch's own device-generic tests found on tpu
(scripts/pytorch_device_tests.sh), each checked against CPU in every eager mode."""
import pytest
import torch

import torch_tpu
from util import assert_same

MODES = ["strict", "debug", "defer_and_fuse"]


@pytest.fixture(params=MODES)
def mode(request):
    with torch_tpu.eager_mode(request.param):
        yield request.param
        torch.tpu.synchronize()


# test_sort_and_select's test_isin: a Scalar element against a tensor of test elements
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int8, torch.uint8])
@pytest.mark.parametrize("elem", [2, 3, 2.5, True, float("nan")])
@pytest.mark.parametrize("invert", [False, True])
def test_isin_scalar_element(mode, dtype, elem, invert):
    if dtype.is_floating_point:
        test = torch.tensor([1.0, 2.0, float("nan"), 7.0], dtype=dtype)
    else:
        test = torch.tensor([1, 2, 7], dtype=dtype)
    try:
        expected = torch.isin(elem, test, invert=invert)
    except RuntimeError as e:  # CPU refuses some dtypes (bool): tpu refuses them too
        with pytest.raises(type(e)):
            torch.isin(elem, test.to("tpu"), invert=invert)
        return
    assert_same(torch.isin(elem, test.to("tpu"), invert=invert), expected)
    out_c = torch.empty(0, dtype=torch.bool)
    out_t = torch.empty(0, dtype=torch.bool, device="tpu")
    torch.isin(elem, test, invert=invert, out=out_c)
    torch.isin(elem, test.to("tpu"), invert=invert, out=out_t)
    assert_same(out_t, out_c)


def test_isin_scalar_element_empty_test_elements(mode):
    e = torch.empty(0, dtype=torch.int64)
    assert_same(torch.isin(3, e.to("tpu")), torch.isin(3, e))


# GradScaler: the ops PyTorch implements only for CPU/CUDA/MPS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("with_inf", [False, True])
def test_amp_non_finite_check_and_unscale(mode, dtype, with_inf):
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(7, 5, generator=g).to(dtype) * 300, torch.randn(4, generator=g).to(dtype),
             torch.empty(0, dtype=dtype), torch.randn(6, generator=g).to(dtype)[::2]]
    if with_inf:
        grads[1][2] = float("inf")
        grads[3][0] = float("nan")
    res = {}
    for dev in ("cpu", "tpu"):
        gs = [x.to(dev, copy=True) for x in grads]
        found = torch.zeros((), device=dev)
        inv = torch.full((), 1.0 / 3072.0, device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found, inv)
        res[dev] = (gs, found)
    for a, e in zip(res["tpu"][0], res["cpu"][0]):
        assert_same(a, e)
    assert_same(res["tpu"][1], res["cpu"][1])


def test_amp_non_finite_check_keeps_found_inf_set(mode):
    found = torch.ones((), device="tpu")
    torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(3, device="tpu")], found,
                                                     torch.ones((), device="tpu"))
    assert found.item() == 1.0


def test_amp_non_finite_check_argument_errors():
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="1-element"):
            torch._amp_foreach_non_finite_check_and_unscale_(
                [torch.ones(2, device=dev)], torch.zeros((), device=dev), torch.ones(2, device=dev))
        with pytest.raises(RuntimeError, match="float tensor"):
            torch._amp_foreach_non_finite_check_and_unscale_(
                [torch.ones(2, device=dev)], torch.zeros((), dtype=torch.float64, device=dev),
                torch.ones((), device=dev))


@pytest.mark.parametrize("found_inf", [0.0, 1.0, float("nan")])
@pytest.mark.parametrize("tracker", [0, 1, 2])
@pytest.mark.parametrize("start", [3.3, 3e38])
def test_amp_update_scale(mode, found_inf, tracker, start):
    res = {}
    for dev in ("cpu", "tpu"):
        scale = torch.full((), start, device=dev)
        tr = torch.full((), tracker, dtype=torch.int32, device=dev)
        ret = torch._amp_update_scale_(scale, tr, torch.full((), found_inf, device=dev), 2.1, 0.37, 3)
        assert ret.data_ptr() == scale.data_ptr()
        res[dev] = (scale, tr)
    assert_same(res["tpu"][0], res["cpu"][0])
    assert_same(res["tpu"][1], res["cpu"][1])


def test_amp_update_scale_argument_errors():
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="int tensor"):
            torch._amp_update_scale_(torch.ones((), device=dev), torch.zeros((), device=dev),
                                     torch.zeros((), device=dev), 2.0, 0.5, 2)


def test_grad_scaler_training_matches_cpu(mode):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        def run(dev):
            torch.manual_seed(0)
            m = torch.nn.Linear(4, 3).to(dev)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 16, growth_interval=2)
            g = torch.Generator().manual_seed(1)
            for i in range(5):
                x = torch.randn(2, 4, generator=g)
                if i == 1:
                    x[0, 0] = float("inf")  # this step is skipped and the scale backs off
                opt.zero_grad()
                scaler.scale(m(x.to(dev)).sum()).backward()
                scaler.step(opt)
                scaler.update()
            return scaler.get_scale(), [p.detach() for p in m.parameters()]

        s_c, p_c = run("cpu")
        s_t, p_t = run("tpu")
        assert s_t == s_c
        for a, e in zip(p_t, p_c):
            assert_same(a, e, atol=1e-6, rtol=1e-6)
    finally:
        torch.set_float32_matmul_precision(old)


# test_tensor_creation_ops' window tests: torch.kaiser_window failed inside ATen on tpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("beta", [12.0, 0.5, 30.0])
def test_kaiser_window(mode, dtype, n, periodic, beta):
    expected = torch.kaiser_window(n, periodic, beta, dtype=dtype)
    actual = torch.kaiser_window(n, periodic, beta, dtype=dtype, device="tpu")
    tol = dict(atol=0, rtol=2e-6) if dtype == torch.float32 else {}
    assert_same(actual, expected, **tol)


def test_kaiser_window_default_overloads(mode):
    assert_same(torch.kaiser_window(9, device="tpu"), torch.kaiser_window(9), atol=0, rtol=2e-6)
    assert_same(torch.kaiser_window(9, False, device="tpu"), torch.kaiser_window(9, False),
                atol=0, rtol=2e-6)


def test_kaiser_window_errors():
    for bad in (dict(window_length=5, dtype=torch.int64), dict(window_length=-1)):
        with pytest.raises(RuntimeError) as cpu:
            torch.kaiser_window(**bad)
        with pytest.raises(type(cpu.value)):
            torch.kaiser_window(**bad, device="tpu")
