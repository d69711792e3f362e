"""uint16 / uint32 / uint64 on tpu against PyTorch CPU, on the ops CPU has kernels for:
creation, copies and casts (uint64 above 2^63 included), views, cat, indexing, eq/ne,
mul, div, bitwise and/or/xor, sum and prod (wrapping as CPU's int64 sums), cumsum and
cumprod, sort / argsort / msort, unique (sorted, inverse, counts, by dim) and
unique_consecutive, in every eager mode. Ops CPU refuses stay refused (topk, searchsorted,
min / max reductions, results of these dtypes from cumsum / prod ...), naming op and dtype."""
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


def _dups(dt, n=96, seed=1):
    """n values drawn from 16 of _sample's (ties for sorts and unique; uint64 above 2^63
    included)."""
    g = torch.Generator().manual_seed(seed)
    return _sample(dt, 16, seed)[torch.randint(0, 16, (n,), generator=g)]


def _both(f, x):
    """f on CPU and on tpu, each result compared exactly (tuples element by element)."""
    want, got = f(x), f(x.to(DEV))
    if not isinstance(want, (tuple, list)):
        want, got = (want,), (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.device.type == DEV
        _same(w, g)


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_scans_and_prod(dt, mode):
    x = _sample(dt, 48, seed=3)
    small = (_sample(dt, 24, seed=4).long() % 7).to(dt)  # products that stay readable
    for f in (lambda t: t.cumsum(0), lambda t: t.reshape(6, 8).cumsum(1),
              lambda t: t.reshape(6, 8).t().cumsum(0), lambda t: t.cumsum(0, dtype=torch.int32),
              lambda t: t.cumsum(0, dtype=torch.float64), lambda t: t.cumprod(0),
              lambda t: t.reshape(4, 12).cumprod(1), lambda t: t.prod(),
              lambda t: t.reshape(6, 8).prod(1), lambda t: t.reshape(6, 8).prod(0, keepdim=True),
              lambda t: t[:0].cumsum(0), lambda t: t[:0].prod()):
        _both(f, x)
        _both(f, small[:24].repeat(2))
    # uint16 / uint32 to float32: exact in float32, so the float sums agree too
    if dt != torch.uint64:
        _both(lambda t: (t.long() % 4096).to(dt).cumsum(0, dtype=torch.float32), x)


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_sort(dt, mode):
    x = _dups(dt)
    for f in (lambda t: t.sort(), lambda t: t.sort(descending=True),
              lambda t: t.sort(stable=True), lambda t: t.sort(stable=True, descending=True),
              lambda t: t.reshape(8, 12).sort(1), lambda t: t.reshape(8, 12).sort(dim=0, stable=True),
              lambda t: t.reshape(8, 12).t().sort(dim=1, descending=True, stable=True),
              lambda t: t.argsort(), lambda t: t.argsort(descending=True, stable=True),
              lambda t: torch.msort(t.reshape(12, 8)), lambda t: t[:0].sort()):
        _both(f, x)
    # every value's order: the largest codes (uint64 above 2^63) sort last
    top = torch.tensor([-1, 0, 1, -2, 2 ** 62, -(2 ** 62)]).view(torch.uint64)
    if dt == torch.uint64:
        _both(lambda t: t.sort(), top)


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_unique(dt, mode):
    x = _dups(dt)
    for f in (lambda t: torch.unique(t), lambda t: torch.unique(t, return_inverse=True),
              lambda t: torch.unique(t, return_counts=True),
              lambda t: torch.unique(t.reshape(8, 12), return_inverse=True, return_counts=True),
              lambda t: torch.unique_consecutive(t),
              lambda t: torch.unique_consecutive(t.sort().values, return_inverse=True,
                                                 return_counts=True),
              lambda t: torch.unique_consecutive(t.reshape(8, 12), return_inverse=True),
              lambda t: torch.unique(t[:0], return_inverse=True, return_counts=True)):
        _both(f, x)
    # by dim: rows with repeats (and runs of equal rows)
    rows = _sample(dt, 12, seed=5).reshape(4, 3)
    m = rows[torch.tensor([2, 0, 0, 3, 2, 2, 1, 0])]
    for f in (lambda t: torch.unique(t, dim=0), lambda t: torch.unique(t, dim=1),
              lambda t: torch.unique(t, dim=0, return_inverse=True, return_counts=True),
              lambda t: torch.unique_consecutive(t, dim=0),
              lambda t: torch.unique_consecutive(t, dim=0, return_inverse=True, return_counts=True),
              lambda t: torch.unique_consecutive(t.t(), dim=1, return_counts=True),
              lambda t: torch.unique_consecutive(t, dim=1, return_inverse=True)):
        _both(f, m)
    # sorted=False: CPU's order is its own; the same set, and the inverse maps back
    u, inv = torch.unique(x.to(DEV), sorted=False, return_inverse=True)
    _same(torch.unique(x), u.sort().values)
    _same(x, u[inv])


@pytest.mark.parametrize("dt", U, ids=str)
def test_uint_refused_where_cpu_refuses(dt, mode):
    """CPU has no kernel for these with unsigned 16/32/64-bit integers: tpu refuses them
    too, at the op, naming the op and the dtype."""
    x = _dups(dt)
    name = str(dt).split(".")[1].replace("uint", "UInt")
    b = x.sort().values
    for op, f in (("topk", lambda t: t.topk(3)), ("topk", lambda t: t.topk(3, largest=False)),
                  ("kthvalue", lambda t: t.kthvalue(2)), ("median", lambda t: t.median()),
                  ("mode", lambda t: t.mode()),
                  ("searchsorted", lambda t: torch.searchsorted(b.to(t.device), t)),
                  ("max", lambda t: t.max()), ("min", lambda t: t.min()),
                  ("max", lambda t: t.reshape(8, 12).max(1)), ("amax", lambda t: t.amax()),
                  ("amin", lambda t: t.amin(0)), ("aminmax", lambda t: torch.aminmax(t)),
                  ("argmax", lambda t: t.argmax()), ("argmin", lambda t: t.argmin()),
                  ("cummax", lambda t: t.cummax(0)), ("cummin", lambda t: t.cummin(0)),
                  ("cumsum", lambda t: t.cumsum(0, dtype=dt)),
                  ("cumsum", lambda t: t.clone().cumsum_(0)),
                  ("cumprod", lambda t: t.cumprod(0, dtype=dt)),
                  ("prod", lambda t: t.prod(dtype=dt))):
        with pytest.raises((NotImplementedError, RuntimeError)) as cpu_err:
            f(x)
        with pytest.raises((NotImplementedError, RuntimeError)) as err:
            f(x.to(DEV))
            torch.tpu.synchronize()
        assert name in str(cpu_err.value)
        msg = str(err.value)
        assert name in msg and op in msg, (op, msg)
