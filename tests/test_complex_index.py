"""complex64 / complex128 on tpu against PyTorch CPU for the data-movement ops
(gather/scatter and their reductions, index_add/copy/fill, take/put, index_put with
accumulate, masked_scatter, tril/triu, eye, reflection/replication padding, unfold/fold,
channel_shuffle), the truth-value ops (nonzero, argwhere, nonzero_static, count_nonzero,
any, all, logical_*: a complex is true when its real or imaginary part is nonzero), a few
gradients, and CPU's errors."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from util import assert_same, check_op, crand

DEV = "tpu"
CDT = [torch.complex64, torch.complex128]


def tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.complex64 else dict(atol=1e-12, rtol=1e-12)


def sparse_truth(dtype):
    """Zeros, -0.0, and values with only a real or only an imaginary part."""
    return torch.tensor([[0, 1j, 0, 2], [0, 0, -0.0 + 0j, 0], [3 - 1j, 0, 0, -0.0 - 2j]], dtype=dtype)


@pytest.mark.parametrize("dtype", CDT)
def test_gather_scatter(mode, dtype):
    x, s = crand((4, 5), dtype, 1), crand((3, 5), dtype, 2)
    d, e = x.to(DEV), s.to(DEV)
    idx = torch.tensor([[0, 3, 1, 1, 2], [2, 0, 0, 3, 1], [0, 0, 2, 3, 3]])
    i = idx.to(DEV)
    assert_same(torch.gather(d, 0, i), torch.gather(x, 0, idx))
    assert_same(torch.gather(d.t(), 1, i[:, :4].t()), torch.gather(x.t(), 1, idx[:, :4].t()))
    assert_same(torch.take_along_dim(d, i, 0), torch.take_along_dim(x, idx, 0))
    assert_same(d.scatter(0, i, e), x.scatter(0, idx, s))
    assert_same(d.scatter(0, i, 2 - 3j), x.scatter(0, idx, 2 - 3j))
    # duplicate indices accumulate in order
    assert_same(d.scatter_add(0, i, e), x.scatter_add(0, idx, s), **tol(dtype))
    with warnings.catch_warnings():  # reduce= of scatter is deprecated
        warnings.simplefilter("ignore")
        got = d.scatter(0, i, e, reduce="multiply")
        want = x.scatter(0, idx, s, reduce="multiply")
    assert_same(got, want, **tol(dtype))
    for reduce in ("sum", "prod", "mean"):
        for include_self in (True, False):
            assert_same(d.scatter_reduce(0, i, e, reduce, include_self=include_self),
                        x.scatter_reduce(0, idx, s, reduce, include_self=include_self), **tol(dtype))
    name = "ComplexFloat" if dtype == torch.complex64 else "ComplexDouble"
    with pytest.raises(NotImplementedError, match=f"reduce_amax.*{name}"):
        d.scatter_reduce(0, i, e, "amax").cpu()


@pytest.mark.parametrize("dtype", CDT)
def test_index_add_copy_fill(mode, dtype):
    x, s = crand((4, 3), dtype, 3), crand((3, 3), dtype, 4)
    d, e = x.to(DEV), s.to(DEV)
    idx = torch.tensor([2, 0, 2])
    i = idx.to(DEV)
    for alpha in (1, 2.5, 1 - 2j):
        assert_same(d.index_add(0, i, e, alpha=alpha), x.index_add(0, idx, s, alpha=alpha), **tol(dtype))
    s2 = crand((4, 3), dtype, 23)
    assert_same(d.index_add(1, i, s2.to(DEV)), x.index_add(1, idx, s2), **tol(dtype))
    assert_same(d.t().index_add(0, i, s2.t().to(DEV)), x.t().index_add(0, idx, s2.t()), **tol(dtype))
    assert_same(d.index_copy(0, torch.tensor([3, 0, 1], device=DEV), e),
                x.index_copy(0, torch.tensor([3, 0, 1]), s))
    assert_same(d.index_fill(1, i, 4 + 5j), x.index_fill(1, idx, 4 + 5j))
    assert_same(d.index_fill(0, i, -2.0), x.index_fill(0, idx, -2.0))
    v = torch.tensor(1j, dtype=dtype)
    assert_same(d.index_fill(0, i, v.to(DEV)), x.index_fill(0, idx, v))


@pytest.mark.parametrize("dtype", CDT)
def test_take_put_index_put(mode, dtype):
    x, s = crand((3, 4), dtype, 5), crand((2, 2), dtype, 6)
    d, e = x.to(DEV), s.to(DEV)
    idx = torch.tensor([[0, -1], [5, 0]])
    i = idx.to(DEV)
    assert_same(torch.take(d, i), torch.take(x, idx))
    assert_same(torch.take(d.t(), i), torch.take(x.t(), idx))
    for acc in (False, True):
        assert_same(d.put(i, e, accumulate=acc), x.put(idx, s, accumulate=acc), **tol(dtype))
    rows, cols = torch.tensor([0, 2, 0, 0]), torch.tensor([1, 3, 1, 1])
    vals = crand((4,), dtype, 7)
    for acc in (False, True):
        got = d.clone().index_put_((rows.to(DEV), cols.to(DEV)), vals.to(DEV), accumulate=acc)
        want = x.clone().index_put_((rows, cols), vals, accumulate=acc)
        if acc:
            assert_same(got, want, **tol(dtype))
        else:  # duplicates: the last write wins on both
            assert_same(got, want)
    rowvals = crand((2, 4), dtype, 24)
    got = d.clone().index_put_((torch.tensor([1, 1], device=DEV),), rowvals.to(DEV), accumulate=True)
    want = x.clone().index_put_((torch.tensor([1, 1]),), rowvals, accumulate=True)
    assert_same(got, want, **tol(dtype))
    mask = torch.tensor([[True, False, True, False], [False, False, True, True], [True, False, False, False]])
    src = crand((8,), dtype, 8)
    assert_same(d.masked_scatter(mask.to(DEV), src.to(DEV)), x.masked_scatter(mask, src))


@pytest.mark.parametrize("dtype", CDT)
def test_tril_triu_eye(mode, dtype):
    x = crand((2, 4, 5), dtype, 9)
    d = x.to(DEV)
    for k in (-1, 0, 2):
        assert_same(d.tril(k), x.tril(k))
        assert_same(d.triu(k), x.triu(k))
    assert_same(d.transpose(1, 2).triu(), x.transpose(1, 2).triu())
    z = d.clone()
    z.tril_(1)
    assert_same(z, x.tril(1))
    assert_same(torch.eye(3, dtype=dtype, device=DEV), torch.eye(3, dtype=dtype))
    assert_same(torch.eye(2, 4, dtype=dtype, device=DEV), torch.eye(2, 4, dtype=dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_truth_values(mode, dtype):
    x = sparse_truth(dtype)
    d = x.to(DEV)
    assert_same(torch.nonzero(d), torch.nonzero(x))
    assert_same(torch.argwhere(d), torch.argwhere(x))
    assert_same(torch.nonzero_static(d, size=6, fill_value=-3), torch.nonzero_static(x, size=6, fill_value=-3))
    assert_same(torch.count_nonzero(d), torch.count_nonzero(x))
    assert_same(torch.count_nonzero(d, 1), torch.count_nonzero(x, 1))
    assert_same(d.any(), x.any())
    assert_same(d.all(), x.all())
    assert_same(d.any(1), x.any(1))
    assert_same(d.all(0), x.all(0))
    assert_same((d + 1).all(), (x + 1).all())
    assert_same(torch.zeros(3, dtype=dtype, device=DEV).any(), torch.zeros(3, dtype=dtype).any())
    y = x.flip(1)
    r = torch.tensor([0.0, 2.0, 0.0, -1.0])
    for f in (torch.logical_and, torch.logical_or, torch.logical_xor):
        assert_same(f(d, y.to(DEV)), f(x, y))
        assert_same(f(d, r.to(DEV)), f(x, r))
        assert_same(f(r.to(DEV), d), f(r, x))
    assert_same(torch.logical_not(d), torch.logical_not(x))
    assert_same(torch.logical_not(d.t()), torch.logical_not(x.t()))
    # a complex result holds 1 or 0
    z = d.clone()
    z.logical_not_()
    assert_same(z, x.clone().logical_not_())
    out = torch.empty(3, 4, dtype=dtype, device=DEV)
    torch.logical_and(d, r.to(DEV), out=out)
    assert_same(out, torch.logical_and(x, r, out=torch.empty(3, 4, dtype=dtype)))


@pytest.mark.parametrize("dtype", CDT)
def test_padding_unfold_shuffle(mode, dtype):
    x1, x2, x3 = crand((2, 3, 6), dtype, 10), crand((1, 2, 4, 5), dtype, 11), crand((1, 1, 3, 4, 4), dtype, 12)
    for m in ("reflect", "replicate"):
        assert_same(F.pad(x1.to(DEV), (2, 3), mode=m), F.pad(x1, (2, 3), mode=m))
        assert_same(F.pad(x2.to(DEV), (1, 2, 3, 0), mode=m), F.pad(x2, (1, 2, 3, 0), mode=m))
        assert_same(F.pad(x3.to(DEV), (1, 1, 2, 0, 1, 2), mode=m), F.pad(x3, (1, 1, 2, 0, 1, 2), mode=m))
    assert_same(F.pad(x2.to(DEV), (-1, 2, 1, -2), mode="replicate"), F.pad(x2, (-1, 2, 1, -2), mode="replicate"))
    # a strided (transposed) input
    xt = x2.transpose(2, 3)
    assert_same(F.pad(xt.to(DEV), (1, 1, 2, 2), mode="reflect"), F.pad(xt, (1, 1, 2, 2), mode="reflect"))
    cols = F.unfold(x2, (2, 3), padding=1, stride=(1, 2))
    assert_same(F.unfold(x2.to(DEV), (2, 3), padding=1, stride=(1, 2)), cols)
    assert_same(F.fold(cols.to(DEV), (4, 5), (2, 3), padding=1, stride=(1, 2)),
                F.fold(cols, (4, 5), (2, 3), padding=1, stride=(1, 2)), **tol(dtype))
    x = crand((2, 6, 3), dtype, 13)
    assert_same(F.channel_shuffle(x.to(DEV), 3), F.channel_shuffle(x, 3))


def test_stft_complex(mode):
    x = crand((64,), torch.complex128, 14)
    w = torch.hann_window(16, dtype=torch.float64)
    kw = dict(n_fft=16, hop_length=4, return_complex=True, onesided=False)
    assert_same(torch.stft(x.to(DEV), window=w.to(DEV), **kw), torch.stft(x, window=w, **kw),
                atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", CDT)
def test_autograd(mode, dtype):
    x, s = crand((4, 3), dtype, 15), crand((2, 3), dtype, 16)
    idx = torch.tensor([[0, 3, 1], [0, 0, 2]])
    cases = [
        (lambda a, i: torch.gather(a, 0, i), (x, idx)),
        (lambda a, i, b: a.index_add(0, i, b, alpha=2 - 1j), (x, torch.tensor([3, 3]), s)),
        (lambda a: a.tril(-1) + a.triu(1), (x,)),
        (lambda a: F.pad(a[None], (2, 1), mode="reflect"), (x,)),
        (lambda a: F.pad(a[None, None], (1, 1, 2, 0), mode="replicate"), (x,)),
    ]
    for fn, ins in cases:
        check_op(fn, *ins, grad=True, **tol(dtype))


@pytest.mark.parametrize("dtype", CDT)
def test_errors(mode, dtype):
    d = crand((3, 4), dtype, 22).to(DEV)
    other = torch.complex128 if dtype == torch.complex64 else torch.complex64
    src = torch.ones(2, 4, dtype=other, device=DEV)
    with pytest.raises(RuntimeError, match="index_add"):
        d.index_add(0, torch.tensor([0, 1], device=DEV), src).cpu()
    with pytest.raises(IndexError):
        d.index_copy(0, torch.tensor([0, 5], device=DEV), src.to(dtype)).cpu()
    with pytest.raises(RuntimeError):
        torch.gather(d, 1, torch.tensor([[4]], device=DEV)).cpu()
    with pytest.raises(RuntimeError, match="scatter"):
        d.scatter(0, torch.tensor([[0]], device=DEV), src).cpu()
    with pytest.raises(IndexError, match="same number of elements"):
        d.put(torch.tensor([0, 1], device=DEV), torch.ones(3, dtype=dtype, device=DEV)).cpu()


def test_complex_scalar_into_real(mode):
    """A complex value or alpha with an imaginary part is refused for a real tensor as on CPU;
    one with imaginary part 0 is taken."""
    for dev in (DEV, "cpu"):
        x, i = torch.ones(3, 2, device=dev), torch.tensor([[0]], device=dev)
        with pytest.raises(RuntimeError, match="cannot be converted to type"):
            x.scatter(0, i, 1j).cpu()
        with pytest.raises(RuntimeError, match="cannot be converted to type"):
            x.index_add(0, i[0], torch.ones(1, 2, device=dev), alpha=2j).cpu()
    x = torch.ones(3, 2)
    assert_same(x.to(DEV).scatter(0, torch.tensor([[0]], device=DEV), 2 + 0j),
                x.scatter(0, torch.tensor([[0]]), 2 + 0j))
    assert_same(x.to(DEV).index_add(0, torch.tensor([1], device=DEV), torch.ones(1, 2, device=DEV), alpha=3 + 0j),
                x.index_add(0, torch.tensor([1]), torch.ones(1, 2), alpha=3 + 0j))
