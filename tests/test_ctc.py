"""CTC loss (F.ctc_loss: aten::_ctc_loss and _ctc_loss_backward, both the
int-list and the tensor-lengths overloads) on tpu against PyTorch CPU:
losses, gradients, the reductions, zero_infinity, and the errors for invalid
lengths, labels and blanks."""
import pytest
import torch
import torch.nn.functional as F

from util import check_op, raises_like_cpu


def log_probs(T, N, C, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (T, C) if N is None else (T, N, C)
    return torch.randn(shape, generator=g, dtype=torch.float64).log_softmax(-1).to(dtype)


def labels(shape, C, blank=0, seed=1):
    """labels in [0, C) other than blank, with repeats (consecutive equal labels)"""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, C - 1, shape, generator=g)
    t = t + (t >= blank).long()
    if t.numel() > 2:
        t.view(-1)[1] = t.view(-1)[0]
    return t


def ctc(reduction="mean", blank=0, zero_infinity=False):
    return lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl, blank=blank, reduction=reduction,
                                             zero_infinity=zero_infinity)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("lengths", ["list", "tensor"])
def test_ctc_padded(dtype, reduction, lengths):
    T, N, C, S = 12, 4, 7, 5
    lp = log_probs(T, N, C, dtype)
    tg = labels((N, S), C)
    il, tl = [12, 11, 9, 12], [5, 3, 4, 1]
    if lengths == "tensor":
        il, tl = torch.tensor(il), torch.tensor(tl)
    check_op(ctc(reduction), lp, tg, il, tl, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("lengths", ["list", "tensor"])
def test_ctc_concatenated(dtype, reduction, lengths):
    T, N, C = 10, 3, 6
    lp = log_probs(T, N, C, dtype, seed=2)
    tl = [4, 2, 3]
    tg = labels((sum(tl),), C, seed=3)
    il = [10, 7, 8]
    if lengths == "tensor":
        il, tl = torch.tensor(il, dtype=torch.int32), torch.tensor(tl)
    check_op(ctc(reduction), lp, tg, il, tl, grad=True)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_impossible_alignment(zero_infinity, reduction):
    # sample 1 needs 5 frames for "1 1 2" (a blank between the repeats) but has 3;
    # sample 2 has no frames and a non-empty target: both losses are inf
    T, N, C = 6, 3, 4
    lp = log_probs(T, N, C)
    tg = torch.tensor([[1, 2, 3], [1, 1, 2], [3, 3, 3]])
    il, tl = [6, 3, 0], [3, 3, 2]
    out = check_op(ctc(reduction, zero_infinity=zero_infinity), lp, tg, il, tl, grad=True)
    assert torch.isinf(out).any().item() != zero_infinity


@pytest.mark.parametrize("blank", [2, 5])
def test_ctc_blank_not_zero(blank):
    T, N, C, S = 9, 3, 6, 4
    lp = log_probs(T, N, C, torch.float64, seed=4)
    tg = labels((N, S), C, blank=blank, seed=5)
    assert not (tg == blank).any()
    check_op(ctc("sum", blank=blank), lp, tg, [9, 8, 9], [4, 4, 2], grad=True)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_ctc_empty_target(reduction):
    # a zero-length target (loss: -sum of the blank log-probs) and a zero-length
    # input with a zero-length target (loss 0)
    T, N, C, S = 7, 3, 5, 3
    lp = log_probs(T, N, C, seed=6)
    tg = labels((N, S), C, seed=7)
    check_op(ctc(reduction), lp, tg, [7, 5, 0], [0, 3, 0], grad=True)


@pytest.mark.parametrize("lengths", ["list", "tensor"])
def test_ctc_unbatched(lengths):
    T, C = 8, 5
    lp = log_probs(T, None, C, seed=8)
    tg = labels((4,), C, seed=9)
    il, tl = ([8], [4]) if lengths == "list" else (torch.tensor(8), torch.tensor(4))
    for reduction in ("none", "mean", "sum"):
        check_op(ctc(reduction), lp, tg, il, tl, grad=True)


def test_ctc_noncontiguous_log_probs():
    # (N, T, C) data viewed as (T, N, C), as after a batch-first model
    T, N, C, S = 10, 3, 6, 4
    lp = log_probs(T, N, C, seed=10).transpose(0, 1).contiguous().transpose(0, 1)
    tg = labels((N, S), C, seed=11)
    check_op(ctc("mean"), lp, tg, [10, 9, 6], [4, 2, 3], grad=True)


def test_ctc_aten_outputs():
    # _ctc_loss itself: the loss per sample, and log_alpha's shape; the backward
    # of the int-list overload with a given upstream grad
    T, N, C, S = 6, 2, 5, 3
    lp = log_probs(T, N, C, torch.float64, seed=12)
    tg = labels((N, S), C, seed=13)
    il, tl = [6, 5], [3, 2]
    nll, la = torch.ops.aten._ctc_loss(lp, tg, il, tl)
    nll_d, la_d = torch.ops.aten._ctc_loss(lp.to("tpu"), tg.to("tpu"), il, tl)
    assert la_d.shape == la.shape == (N, T, 2 * S + 1)
    torch.testing.assert_close(nll_d.cpu(), nll)
    go = torch.tensor([0.5, -2.0], dtype=torch.float64)
    g = torch.ops.aten._ctc_loss_backward(go, lp, tg, il, tl, nll, la, 0)
    g_d = torch.ops.aten._ctc_loss_backward(go.to("tpu"), lp.to("tpu"), tg.to("tpu"), il, tl,
                                            nll_d, la_d, 0)
    torch.testing.assert_close(g_d.cpu(), g)
    g_d = torch.ops.aten._ctc_loss_backward.Tensor(
        go.to("tpu"), lp.to("tpu"), tg.to("tpu"), torch.tensor(il, device="tpu"),
        torch.tensor(tl, device="tpu"), nll_d, la_d, 0)
    torch.testing.assert_close(g_d.cpu(), g)


def test_ctc_errors():
    T, N, C, S = 6, 2, 5, 3
    lp = log_probs(T, N, C)
    tg = labels((N, S), C)
    f = ctc("none")
    raises_like_cpu(f, lp, tg, [7, 5], [3, 2], match="input_lengths")  # longer than T
    raises_like_cpu(f, lp, tg, [-1, 5], [3, 2], match="input_lengths")
    raises_like_cpu(f, lp, tg, [6, 5], [4, 2], match="size at least 4")  # longer than S
    raises_like_cpu(f, lp, tg, [6, 5], [-1, 2], match="target_lengths")
    raises_like_cpu(f, lp, tg, [6], [3, 2], match="input_lengths must be of size batch_size")
    raises_like_cpu(f, lp, tg, [6, 5], [3], match="target_lengths must be of size batch_size")
    raises_like_cpu(f, lp, tg.flatten(), [6, 5], [3, 4], match="size 7")  # concatenated: too short
    raises_like_cpu(f, lp, tg, torch.tensor([6.0, 5.0]), torch.tensor([3, 2]),
                    match="input_lengths must be integral")
    raises_like_cpu(f, lp, tg, torch.tensor([7, 5]), torch.tensor([3, 2]), match="input_lengths")
    raises_like_cpu(ctc("none", blank=5), lp, tg, [6, 5], [3, 2], match="blank must be in label range")
    raises_like_cpu(ctc("none", blank=-1), lp, tg, [6, 5], [3, 2],
                    match="blank must be in label range")
    raises_like_cpu(f, lp.half(), tg, [6, 5], [3, 2])  # NotImplementedError on both


@pytest.mark.parametrize("bad", [5, -1])
def test_ctc_label_out_of_range(bad):
    # CPU reads such labels unchecked; tpu refuses them, naming the label
    lp = log_probs(6, 2, 5).to("tpu")
    tg = torch.tensor([[1, bad, 2], [3, 4, 1]], device="tpu")
    with pytest.raises(RuntimeError, match=f"_ctc_loss: target label {bad} .*out of range"):
        out = F.ctc_loss(lp, tg, [6, 6], [3, 3], reduction="none")
        torch.tpu.synchronize()
        del out
