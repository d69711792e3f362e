"""Regression tests for the differences the differential fuzzer (tests/fuzz) found, each
against PyTorch's CPU result in all three eager modes (the `mode` fixture of conftest.py):
wrong values (G12, G14) and argument errors that tpu raised late, with another exception
type, or not at all (G1-G11, G13 of the fuzzer's report, issue 13)."""
import warnings

import pytest
import torch

from tests.util import assert_same, check_op


def _run(fn, dev):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(dev)


def raises_at_op(fn):
    """fn(dev) raises on CPU; on tpu it raises the same exception type at the op itself (no
    synchronization needed), and nothing is left pending for a later unrelated op"""
    with pytest.raises(Exception) as cpu:
        _run(fn, "cpu")
    with pytest.raises(type(cpu.value)):
        _run(fn, "tpu")
    assert torch.ones(2, device="tpu").sum().item() == 2.0
    torch.tpu.synchronize()


def same_as_cpu(fn):
    """fn(dev) returns a tensor or a tuple of tensors; tpu gives CPU's values, dtypes, shapes and
    strides, and raises nothing at the next synchronization"""
    expected = _run(fn, "cpu")
    actual = _run(fn, "tpu")
    torch.tpu.synchronize()
    assert_same(actual, expected)
    return actual


# ---- G12: topk with k=0 on a 0-d tensor (uninitialized outputs) ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("k", [0, 1])
def test_topk_0d(mode, dtype, dim, k):
    x = torch.tensor(3.25).to(dtype)
    for largest in (True, False):
        v, i = check_op(lambda t: tuple(torch.topk(t, k, dim, largest=largest)), x)
        assert v.dim() == 0 and i.dtype == torch.int64


def test_topk_0d_errors(mode):
    raises_at_op(lambda d: torch.topk(torch.tensor(1.0, device=d), 2))
    raises_at_op(lambda d: torch.topk(torch.tensor(1.0, device=d), 0, 1))
    raises_at_op(lambda d: torch.topk(torch.tensor(1.0, device=d), -1))


# ---- G14: masked_fill_ through an expanded view (stride-0 dims) ----

@pytest.mark.parametrize("case", range(8))
def test_masked_fill_expanded(mode, case):
    g = torch.Generator().manual_seed(case)
    base_shape, shape = [((3, 1), (3, 4)), ((1, 4), (3, 4)), ((1,), (5,)), ((2, 1, 3), (2, 4, 3)),
                         ((1, 1), (40, 30)), ((30, 1), (30, 50)), ((1,), (70000,)),
                         ((1, 3), (4, 3))][case]
    base = torch.randn(base_shape, generator=g)
    mask = torch.rand(shape, generator=g) < 0.3
    value = [2.5, -1, torch.tensor(7.0)][case % 3]

    def fn(d):
        b = base.clone().to(d)
        x = b.expand(shape)
        if case % 2 and x.dim() > 1:
            x.transpose(0, -1).masked_fill_(mask.to(d).transpose(0, -1),
                                            value.to(d) if torch.is_tensor(value) else value)
        else:
            x.masked_fill_(mask.to(d), value.to(d) if torch.is_tensor(value) else value)
        return b

    same_as_cpu(fn)


def test_masked_fill_expanded_broadcast_mask(mode):
    # the mask itself broadcasts (a row), self is expanded along the rows
    same_as_cpu(lambda d: (lambda b: (b.expand(4, 5).masked_fill_(
        torch.tensor([True, False, False, True, False], device=d), -3.0), b)[1])(
        torch.zeros(1, 5, device=d)))
    # every row's mask false but one: the set value must survive
    same_as_cpu(lambda d: (lambda b: (b.expand(6, 3).masked_fill_(
        torch.arange(18, device=d).reshape(6, 3) == 4, 9.0), b)[1])(torch.zeros(3, device=d)))


def test_masked_fill_expanded_warns(mode):
    for d in ("cpu", "tpu"):
        with pytest.warns(UserWarning, match="expanded tensors"):
            torch.zeros(1, 3, device=d).expand(2, 3).masked_fill_(
                torch.ones(2, 3, dtype=torch.bool, device=d), 1.0)
