"""uint16 / uint32 / uint64 on tpu against PyTorch CPU, on the ops CPU has kernels for:
creation, copies and casts (uint64 above 2^63 included), views, cat, indexing, eq/ne,
mul, div, bitwise and/or/xor, sum (wrapping as CPU's int64 sums). Ops CPU refuses stay refused, naming op and dtype."""
import pytest
import torch

import torch_tpu  # noqa: F401

U = [torch.uint16, torch.uint32, torch.uint64]
DEV = "tpu"


def _sample(dt, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-2 ** 62, 2 ** 62, (n,), generator=g, dtype=torch.int64) * 2
    if dt == torch.uint64:
        x = raw.view(dt).clone()
    else:
        bits = 8 * torch.empty(0, dtype=dt).element_size()
        x = raw.bitwise_and((1 << bits) - 1).to(dt)
    x[:4] = torch.tensor([0, 1, 2, 3]).to(dt)
    return x


def _same(a, b):
    b = b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_ops(dt):
    x = _sample(dt)
    d = x.to(DEV)
    for f in (lambda t: t.clone(), lambda t: t.reshape(8, 8).t().contiguous(),
              lambda t: torch.cat([t, t[::3]]), lambda t: torch.stack([t, t]),
              lambda t: t[torch.tensor([5, 1, 63], device=t.device)],
              lambda t: t == t[torch.arange(63, -1, -1, device=t.device)], lambda t: t != t,
              lambda t: t * t, lambda t: t & (t * t), lambda t: t | (t * t), lambda t: t ^ (t * t),
              lambda t: t / t, lambda t: t.sum(), lambda t: t.reshape(8, 8).sum(0),
              lambda t: t.reshape(4, 16).sum(1, keepdim=True), lambda t: t.float(), lambda t: t.double(), lambda t: t.long(),
              lambda t: t.to(torch.int32), lambda t: t.view(torch.int8 if dt == torch.uint16 else torch.int16),
              lambda t: torch.zeros(3, dtype=dt, device=t.device),
              lambda t: torch.full((3,), 7, dtype=dt, device=t.device),
              lambda t: torch.tensor([1.5, 7.0, 65535.0, 1e9], device=t.device).to(dt),
              lambda t: torch.tensor([1, -1, 70000, 2 ** 40 + 3], device=t.device).to(dt)):
        _same(f(x), f(d))
    e = torch.empty(8, 8, dtype=dt, device=DEV)
    e.copy_(d.reshape(8, 8).t())
    _same(x.reshape(8, 8).t().contiguous(), e)


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_refusals(dt):
    d = _sample(dt).to(DEV)
    for f in (lambda t: t + t, lambda t: t.flip(0), lambda t: t < t, lambda t: t.max()):
        with pytest.raises((NotImplementedError, RuntimeError), match=str(dt).split(".")[1].replace("uint", "UInt")):
            f(d)
