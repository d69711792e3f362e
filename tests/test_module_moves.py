"""What Hugging Face models need from a backend's everyday ops: moving a module keeps tied
weights one Parameter (as between cpu and cuda), and the counting ops take the integer dtypes
CUDA takes (transformers' MoE routing calls histc on int32)."""
import pytest
import torch

from tests.util import INT_DTYPES


class Tied(torch.nn.Module):
    """An embedding whose weight is also the output head's (GPT-2, Gemma, BERT, T5 ...)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, ids):
        h = self.norm(self.emb(ids))
        return self.head(self.bn(h))


def test_to_tpu_keeps_tied_weights_one_parameter(tpu_mode):
    m = Tied()
    weight = m.emb.weight
    assert m.to("tpu") is m
    # the same Parameter object, moved in place, still shared
    assert m.emb.weight is weight and m.head.weight is weight
    assert weight.device.type == "tpu" and isinstance(weight, torch.nn.Parameter)
    assert weight.requires_grad
    assert len(list(m.parameters())) == len(list(Tied().parameters())) == 5  # head is emb
    assert m.bn.running_mean.device.type == "tpu"
    # dtype moves and the way back keep it too
    m.to(torch.float64)
    assert m.head.weight is m.emb.weight and m.emb.weight.dtype == torch.float64
    m.cpu()
    assert m.head.weight is m.emb.weight and m.emb.weight.device.type == "cpu"
    # the .cuda()-style method moves the same way
    m.tpu()
    assert m.head.weight is m.emb.weight is weight and weight.device == torch.device("tpu", 0)
    m.cpu()


def test_tied_training_step_matches_cpu(tpu_mode):
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    results = []
    for dev in ("cpu", "tpu"):
        m = Tied().to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        with torch_precision_highest():
            out = m(ids.to(dev).flatten())
            loss = torch.nn.functional.cross_entropy(out, ids.to(dev).flatten().roll(1))
            loss.backward()
            opt.step()
        results.append((loss.item(), m.emb.weight.detach().cpu(), m.head.weight is m.emb.weight))
    (lc, wc, tc), (lt, wt, tt) = results
    assert tc and tt
    assert abs(lc - lt) <= 1e-5 * abs(lc)
    torch.testing.assert_close(wt, wc, rtol=1e-5, atol=1e-6)


def torch_precision_highest():
    import contextlib

    @contextlib.contextmanager
    def ctx():
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(old)

    return ctx()


def test_load_state_dict_and_set_data_keep_identity():
    m = Tied().to("tpu")
    weight = m.emb.weight
    sd = {k: v.cpu() * 2 for k, v in Tied().state_dict().items()}
    m.load_state_dict(sd)
    assert m.emb.weight is weight and m.head.weight is weight
    torch.testing.assert_close(weight.detach().cpu(), sd["emb.weight"])
    # `.data =` across devices, as modules and optimizers do
    p = torch.nn.Parameter(torch.ones(3))
    p.data = torch.full((3,), 2.0, device="tpu")
    assert p.device.type == "tpu" and p.requires_grad and p.cpu().tolist() == [2.0, 2.0, 2.0]
    assert torch._has_compatible_shallow_copy_type(torch.ones(1), torch.ones(1, device="tpu"))
    assert torch._has_compatible_shallow_copy_type(torch.ones(1, device="tpu"), torch.ones(1))
    # a sparse tensor is not one of ours: PyTorch's own rule
    assert not torch._has_compatible_shallow_copy_type(torch.ones(1, device="tpu"),
                                                      torch.ones(1).to_sparse())


def histc_like_cuda(x, bins, lo, hi):
    """CUDA's histc of an integer tensor: integer min/max, integer bin arithmetic."""
    v = x.to(torch.int64).tolist()
    lo, hi = int(lo), int(hi)
    if lo == hi and v:
        lo, hi = min(v), max(v)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    out = [0] * bins
    for e in v:
        if lo <= e <= hi:
            b = (e - lo) * bins // (hi - lo)
            out[min(b, bins - 1)] += 1
    return torch.tensor(out, dtype=x.dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 9), (5, 0, 0), (3, 2, 8), (7, -3.7, 5.2), (1, 0, 0)])
def test_histc_integers_count_as_cuda(dtype, bins, lo, hi, tpu_mode):
    g = torch.Generator().manual_seed(bins)
    low = 0 if dtype == torch.uint8 else -5
    x = torch.randint(low, 12, (40,), generator=g).to(dtype)
    got = torch.histc(x.to("tpu"), bins=bins, min=lo, max=hi)
    want = histc_like_cuda(x, bins, lo, hi)
    assert got.dtype == dtype and got.device.type == "tpu"
    assert got.cpu().tolist() == want.tolist()


def test_histc_int_moe_routing_and_errors(tpu_mode):
    # what transformers' MoE routing does: count the tokens per expert
    experts = torch.tensor([[0, 3], [1, 3], [3, 2], [0, 0]], dtype=torch.int32)
    got = torch.histc(experts.to("tpu").flatten(), bins=4, min=0, max=3)
    assert got.cpu().tolist() == [3, 1, 1, 3]
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(experts.to("tpu"), bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(experts.to("tpu"), bins=3, min=5, max=1)
    with pytest.raises((RuntimeError, NotImplementedError), match="histc"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="tpu"), bins=2)
    # the device keeps working
    assert torch.histc(torch.arange(4.0, device="tpu"), bins=2).cpu().tolist() == [2.0, 2.0]


def test_histc_int_compiled():
    f = torch.compile(lambda x: torch.histc(x, bins=4, min=0, max=3) * 2, backend="tpu")
    x = torch.tensor([0, 1, 1, 3, 2, 2, 2], dtype=torch.int32)
    assert f(x.to("tpu")).cpu().tolist() == [2, 4, 6, 2]
