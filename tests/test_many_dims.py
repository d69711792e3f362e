"""Tensors of up to 64 dims, as CPU (whose reductions take a 64-bit dim set): element-wise
ops, reductions, views, copies and indexing in every eager mode; 65 dims refused clearly."""
import pytest
import torch

from util import assert_same, check_op


def shapes():
    # 17 dims (one past the old limit), 25 (CUDA's TensorIterator limit), 64
    return [[2] + [1] * 15 + [3], [2, 1, 3] + [1] * 20 + [2, 2], [2] + [1] * 61 + [3, 2]]


@pytest.mark.parametrize("shape", shapes(), ids=lambda s: f"{len(s)}d")
def test_many_dims(mode, shape):
    x = torch.randn(shape)
    nd = len(shape)
    check_op(lambda t: (t * 2 + 1).tanh(), x)
    check_op(lambda t: t.sum(0), x)
    check_op(lambda t: t.sum(), x)
    check_op(lambda t: t.amax(-1, keepdim=True), x)
    check_op(lambda t: t.permute(*reversed(range(nd))).contiguous(), x)
    check_op(lambda t: t.transpose(0, -1) + t.transpose(0, -1), x)
    check_op(lambda t: t.softmax(-1), x)
    check_op(lambda t: t.unsqueeze(5).squeeze(5).flatten(), x)
    check_op(lambda t: t[1:, ..., ::2], x)
    check_op(lambda t: torch.cat([t, t], 0), x)
    check_op(lambda t: t.expand(*shape).clone(), x)
    check_op(lambda t: t.index_select(0, torch.tensor([1, 0], device=t.device)), x)
    y = x.to("tpu")
    y[0] = 5.0
    z = x.clone()
    z[0] = 5.0
    assert_same(y, z)


def test_more_than_64_dims_refused():
    with pytest.raises(RuntimeError, match="at most 64 dimensions, got 65"):
        torch.zeros([1] * 65, device="tpu")
    assert torch.ones(3, device="tpu").sum().item() == 3.0  # the device keeps working
