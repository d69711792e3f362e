"""Regression tests, third round, for defects PyTorch's own device-generic tests found on
tpu (scripts/pytorch_device_tests.sh): each compares with CPU, in every eager mode where the
behaviour does not depend on the mode (the `mode` fixture of conftest.py)."""
import warnings

import pytest
import torch

import torch_tpu

from util import assert_same


def _outcome(fn, dev):
    """(exception type or None, warning messages) of fn(dev); on tpu the stream is
    synchronized inside, so an error that surfaced late would still be seen."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            out = fn(dev)
            if dev == "tpu":
                torch.tpu.synchronize()  # with the result alive: DeferAndFuse drops dead ops
            del out
            err = None
        except Exception as e:  # noqa: BLE001 - the type is what is compared
            err = type(e)
    return err, sorted({str(x.message).split(".")[0] for x in w if x.category is UserWarning})


def _same_outcome(fn):
    cpu = _outcome(fn, "cpu")
    tpu = _outcome(fn, "tpu")
    assert tpu == cpu
    torch.tpu.synchronize()  # nothing left over for a later op
    assert torch.ones(2, device="tpu").sum().item() == 2.0
    return cpu


# ---- an index out of range in the data raises at the op (test_indexing
# test_trivial_fancy_out_of_bounds, test_advancedindex): a small call that runs inline on
# an idle stream returns its own error instead of leaving it for the next synchronization
@pytest.mark.parametrize("eager", ["strict", "debug"])
@pytest.mark.parametrize("case", ["getitem", "setitem", "index_select", "gather", "index_put_"])
def test_data_dependent_index_error_at_op(eager, case):
    def run(dev):
        a = torch.zeros(5, device=dev)
        ind = torch.ones(20, dtype=torch.int64, device=dev)
        ind[-1] = 10
        if case == "getitem":
            return a[ind]
        if case == "setitem":
            a[ind] = 1.0
            return a
        if case == "index_select":
            return a.index_select(0, ind)
        if case == "gather":
            return a.gather(0, ind)
        return a.index_put_((ind,), torch.tensor(2.0, device=dev))

    with pytest.raises(Exception) as cpu:
        run("cpu")
    torch.tpu.synchronize()
    with torch_tpu.eager_mode(eager):
        with pytest.raises(type(cpu.value), match="10"):
            run("tpu")  # no synchronization: raised by the op itself
        torch.tpu.synchronize()  # and nothing is left for a later one
        x = torch.arange(4.0, device="tpu")
        assert x[torch.tensor([3, 0], device="tpu")].tolist() == [3.0, 0.0]


def test_data_dependent_index_error_then_device_keeps_working(mode):
    _same_outcome(lambda d: torch.zeros(5, device=d)[torch.tensor([0, 11], device=d)])
    x = torch.arange(6.0, device="tpu")
    assert_same(x[torch.tensor([5, 1], device="tpu")], torch.arange(6.0)[torch.tensor([5, 1])])


# ---- index_put_: CPU checks the value's shape before its dtype (test_indexing
# test_boolean_assignment_value_mismatch), and refuses a call without an index tensor
# (test_index_put_accumulate_empty)
@pytest.mark.parametrize("value,n", [([], 4), ([1.0, 2.0, 3.0], 4), ([1.0, 2.0, 3.0], 1)])
def test_index_put_value_shape_checked_before_dtype(mode, value, n):
    def run(dev):
        a = torch.arange(0, 4, device=dev)[:n]  # int64; the value is float
        a[a > -1] = torch.tensor(value).to(dev)

    with pytest.raises(RuntimeError, match="shape mismatch") as cpu:
        run("cpu")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run("tpu")
    del cpu


def test_index_put_dtype_mismatch_still_refused(mode):
    def run(dev):
        a = torch.arange(0, 4, device=dev)
        a[a > 1] = torch.tensor([1.0, 2.0]).to(dev)

    assert _same_outcome(run)[0] is RuntimeError


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("shape,value", [((), [1.0]), ((3,), [1.0, 2.0, 3.0]), ((3,), [1.0, 2.0])])
def test_index_put_without_index_tensors_refused(mode, accumulate, shape, value):
    def run(dev):
        torch.rand(shape, device=dev).index_put([], torch.tensor(value, device=dev), accumulate)

    assert _same_outcome(run)[0] is RuntimeError


# ---- index_fill_ with a complex Scalar into a real tensor: CPU's RuntimeError at the op
# (test_torch test_index_fill), not the device's "no complex scalars" NotImplementedError
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_fill_complex_scalar_refused_like_cpu(mode, dtype):
    def run(dev):
        x = torch.tensor([[1, 2], [4, 5]], dtype=dtype, device=dev)
        x.index_fill_(1, torch.tensor([0], device=dev), 1 + 1j)

    with pytest.raises(RuntimeError, match="Scalar"):
        run("cpu")
    with pytest.raises(RuntimeError, match="Scalar"):
        run("tpu")


def test_index_fill_real_scalar_still_works(mode):
    for dev_x in [torch.tensor([[1, 2], [4, 5]])]:
        expected = dev_x.clone().index_fill_(1, torch.tensor([0]), -3)
        actual = dev_x.to("tpu").index_fill_(1, torch.tensor([0], device="tpu"), -3)
        assert_same(actual, expected)


# ---- memory overlap (test_torch test_*_mem_overlap): CPU's at::assert_no_overlap of self
# against the index and the source for the scatter family, index_add_/index_copy_/
# index_reduce_/index_fill_/put_/index_put_; masked_fill_ checks its mask for a partial
# overlap but reads its value tensor with item(); masked_scatter_ checks neither; an
# expanded self only warns for index_fill_/index_put_/masked_fill_
def _arange8(d):
    return torch.arange(8.0, device=d)


def _idx(d):
    return torch.tensor([2, 1, 0], device=d)


def _all8(d):
    return torch.arange(8, device=d)


def _mask6(d):
    return torch.tensor([True, False, True, True, False, True], device=d)


OVERLAP = {
    "scatter_src_part": lambda d: (lambda y: y.scatter_(0, _idx(d), y[1:4]))(_arange8(d)),
    "scatter_src_self": lambda d: (lambda y: y.scatter_(0, _all8(d), y))(_arange8(d)),
    "scatter_add_src_self": lambda d: (lambda y: y.scatter_add_(0, _all8(d), y))(_arange8(d)),
    "scatter_reduce_src_self": lambda d: (lambda y: y.scatter_reduce_(0, _all8(d), y, "sum"))(_arange8(d)),
    "scatter_value_index_self": lambda d: (lambda i: i.scatter_(0, i, 0))(_idx(d)),
    "scatter_add_index_self": lambda d: (lambda i: i.scatter_add_(0, i, i.clone()))(_idx(d)),
    "scatter_disjoint_rows": lambda d: (lambda x: x[1:].scatter_(
        0, torch.zeros(1, 5, dtype=torch.long, device=d), x[:1]))(torch.ones(6, 5, device=d)),
    "index_add_src_part": lambda d: (lambda y: y.index_add_(0, _idx(d), y[3:6]))(_arange8(d)),
    "index_add_src_self": lambda d: (lambda y: y.index_add_(0, _all8(d), y))(_arange8(d)),
    "index_add_index_self": lambda d: (lambda i: i.index_add_(0, i, i.clone()))(_idx(d)),
    "index_add_src_is_self": lambda d: (lambda i: i.index_add_(0, i.clone(), i))(_idx(d)),
    "index_copy_src_self": lambda d: (lambda y: y.index_copy_(0, _all8(d), y))(_arange8(d)),
    "index_copy_index_self": lambda d: (lambda i: i.index_copy_(0, i, i.clone()))(_idx(d)),
    "index_reduce_src_self": lambda d: (lambda y: y.index_reduce_(0, _all8(d), y, "prod"))(_arange8(d)),
    "index_reduce_index_self": lambda d: (lambda i: i.index_reduce_(0, i, i.clone(), "prod"))(_idx(d)),
    "index_fill_index_self": lambda d: (lambda i: i.index_fill_(0, i, 0))(_idx(d)),
    "index_fill_value_view": lambda d: (lambda y: y.index_fill_(0, _idx(d), y[5]))(_arange8(d)),
    "index_fill_expanded": lambda d: torch.rand(1, device=d).expand(6).index_fill_(0, _idx(d), 1.0),
    "put_src_self": lambda d: (lambda y: y.put_(_all8(d), y))(_arange8(d)),
    "put_src_part": lambda d: (lambda y: y.put_(_idx(d), y[3:6]))(_arange8(d)),
    "put_index_self": lambda d: (lambda i: i.put_(i, i.clone()))(_idx(d)),
    "put_src_is_self": lambda d: (lambda i: i.put_(i.clone(), i))(_idx(d)),
    "index_put_value_part": lambda d: (lambda y: y.index_put_((_idx(d),), y[3:6]))(_arange8(d)),
    "index_put_value_0d_view": lambda d: (lambda y: y.index_put_((_idx(d),), y[5]))(_arange8(d)),
    "index_put_index_self": lambda d: (lambda i: i.index_put_((i,), i.clone()))(_idx(d)),
    "index_put_acc_index_self": lambda d: (lambda i: i.index_put_((i,), i.clone(), accumulate=True))(_idx(d)),
    "index_put_expanded": lambda d: torch.rand(1, device=d).expand(6).index_put_(
        (_idx(d),), torch.rand(3, device=d)),
    "index_put_expanded_acc": lambda d: torch.rand(1, device=d).expand(6).index_put_(
        (_idx(d),), torch.rand(3, device=d), accumulate=True),
    "masked_fill_mask_part": lambda d: (lambda m: m[1:].masked_fill_(m[:-1], False))(_mask6(d)),
    "masked_fill_mask_part_tensor": lambda d: (lambda m: m[1:].masked_fill_(
        m[:-1], torch.tensor(False, device=d)))(_mask6(d)),
    "masked_fill_mask_self": lambda d: (lambda m: m.masked_fill_(m, False))(_mask6(d)),
    "masked_fill_value_view": lambda d: (lambda y: y.masked_fill_(y > 3, y[0]))(_arange8(d)),
    "masked_fill_expanded": lambda d: torch.rand(1, device=d).expand(6).masked_fill_(_mask6(d), 0.0),
    "masked_scatter_src_part": lambda d: (lambda y: y[:6].masked_scatter_(_mask6(d), y[2:]))(_arange8(d)),
    "masked_scatter_mask_part": lambda d: (lambda m: m[1:].masked_scatter_(m[:-1], m[:-1].clone()))(_mask6(d)),
}


@pytest.mark.parametrize("case", sorted(OVERLAP))
def test_overlap_checks_like_cpu(mode, case):
    _same_outcome(OVERLAP[case])


def test_overlap_checks_leave_results_like_cpu(mode):
    # accepted overlaps compute what CPU computes
    for case in ["scatter_disjoint_rows", "index_fill_value_view", "masked_fill_value_view"]:
        assert_same(OVERLAP[case]("tpu"), OVERLAP[case]("cpu"))


# ---- rrelu_with_noise (test_nn test_nn_empty, test_nn_scalars,
# test_leaky_relu_inplace_with_neg_slope): F.rrelu / nn.RReLU on tpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 5), (), (0, 3)])
def test_rrelu_eval_like_cpu(mode, dtype, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    for fn in [lambda t: torch.nn.functional.rrelu(t, 0.1, 0.3),
               lambda t: torch.nn.functional.rrelu_(t.clone(), 0.1, 0.3),
               lambda t: torch.nn.RReLU().eval()(t)]:
        assert_same(fn(x.to("tpu")), fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rrelu_training_noise_and_grad(mode, dtype):
    x = torch.randn(64, generator=torch.Generator().manual_seed(4)).to(dtype)
    xt = x.to("tpu").requires_grad_()
    noise = torch.empty(64, dtype=dtype, device="tpu")
    y = torch.ops.aten.rrelu_with_noise(xt, noise, 0.1, 0.3, True)
    y.sum().backward()
    n = noise.cpu()
    neg = x <= 0
    assert bool((n[~neg] == 1).all())
    assert bool(((n[neg] >= 0.1) & (n[neg] <= 0.3)).all())
    assert n[neg].unique().numel() > 1  # sampled per element
    torch.testing.assert_close(y.detach().cpu(), torch.where(neg, x * n, x))
    torch.testing.assert_close(xt.grad.cpu(), n)
    m = torch.nn.RReLU(0.1, 0.3).train()(torch.zeros(0, device="tpu"))
    assert m.shape == (0,) and m.device.type == "tpu"


def test_rrelu_errors_like_cpu(mode):
    cases = [
        lambda d: torch.nn.functional.rrelu(torch.ones(3, dtype=torch.int64, device=d)),
        lambda d: torch.nn.functional.rrelu(torch.ones(3, dtype=torch.int64, device=d), training=True),
        lambda d: torch.ops.aten.rrelu_with_noise(torch.ones(3, device=d), torch.ones(2, device=d)),
    ]
    for fn in cases:
        assert _same_outcome(fn)[0] is not None
    # an in-place rrelu_ with a negative slope has no backward, as on CPU
    for d in ["cpu", "tpu"]:
        a = torch.tensor([-1.0, 1.0], device=d, requires_grad=True)
        b = torch.nn.functional.rrelu_(a.clone(), -5.0, 1.0)
        with pytest.raises(RuntimeError, match="call out-of-place version"):
            b.backward(torch.ones(2, device=d))


# ---- put_ without accumulate is nondeterministic for CPU too (test_torch
# test_nondeterministic_alert_put): it alerts under torch.use_deterministic_algorithms
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_put_deterministic_alert_like_cpu(mode, accumulate, inplace):
    def run(dev):
        a = torch.randn(10, device=dev)
        fn = torch.Tensor.put_ if inplace else torch.Tensor.put
        return fn(a, torch.tensor([0, 0], device=dev), torch.tensor([0.0, 1.0], device=dev),
                  accumulate=accumulate)

    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        err = _same_outcome(run)[0]
    finally:
        torch.use_deterministic_algorithms(prev)
    assert (err is RuntimeError) == (not accumulate)


# ---- the index copied from the host just before (test_indexing test_advancedindex):
# a small host-to-device copy onto an idle stream runs inline too, so the index op that
# follows still finds the stream idle and raises at the op
@pytest.mark.parametrize("how", ["to", "list"])
def test_index_error_at_op_after_host_copy(how):
    reference = torch.empty(10, dtype=torch.float64, device="tpu")
    torch.tpu.synchronize()
    with torch_tpu.eager_mode("strict"):
        for err_idx in (10, -11):
            with pytest.raises(IndexError, match="out of"):
                if how == "to":
                    reference[torch.LongTensor([err_idx]).to("tpu")]
                else:
                    reference[[err_idx]]
        torch.tpu.synchronize()


def test_small_host_copies_keep_order(mode):
    # inline copies and queued work interleave in program order
    x = torch.zeros(100000, device="tpu")
    x.add_(1.0)  # large: queued
    small = torch.arange(4.0).to("tpu")  # may run inline only once the stream is idle
    x[:4] = small
    expected = torch.ones(100000)
    expected[:4] = torch.arange(4.0)
    assert_same(x, expected)


# ---- logcumsumexp / cummax / cummin with out= of another dtype (test_torch
# test_logcumsumexp): CPU refuses at the op
@pytest.mark.parametrize("op", ["logcumsumexp", "cummax", "cummin"])
def test_scan_out_dtype_checked_like_cpu(mode, op):
    def run(dev, out_dtype, idx_dtype=torch.int64):
        b = torch.randn(5, 2, device=dev, dtype=torch.float64)
        o = torch.zeros(5, 2, device=dev, dtype=out_dtype)
        if op == "logcumsumexp":
            return torch.logcumsumexp(b, 1, out=o)
        i = torch.zeros(5, 2, device=dev, dtype=idx_dtype)
        return getattr(torch, op)(b, 1, out=(o, i))

    assert _same_outcome(lambda d: run(d, torch.float32))[0] is RuntimeError
    if op != "logcumsumexp":
        assert _same_outcome(lambda d: run(d, torch.float64, torch.int32))[0] is RuntimeError
    b = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    o_c, o_t = torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64, device="tpu")
    if op == "logcumsumexp":
        assert_same(torch.logcumsumexp(b.to("tpu"), 1, out=o_t), torch.logcumsumexp(b, 1, out=o_c))


# ---- a resized out= takes the meta function's strides (test_torch
# test_strides_propagation): TensorIterator's layout of a permuted input, as on CPU
@pytest.mark.parametrize("op", ["eq", "add", "exp", "mul", "lt"])
@pytest.mark.parametrize("perm", [(0, 2, 1), (1, 0, 2), (2, 0, 1)])
def test_resized_out_follows_input_layout(mode, op, perm):
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1)).permute(perm)
    fn = getattr(torch, op)
    args = (x,) if op == "exp" else (x, x)
    expected = fn(*args)
    out_c = fn(*args, out=torch.empty(0, dtype=expected.dtype))
    out_t = fn(*[a.to("tpu") for a in args], out=torch.empty(0, dtype=expected.dtype, device="tpu"))
    assert out_t.stride() == out_c.stride()
    assert_same(out_t, out_c)
    # an out= of the right shape keeps its own strides
    keep_t = torch.empty(x.shape, dtype=expected.dtype, device="tpu")
    keep_c = torch.empty(x.shape, dtype=expected.dtype)
    assert_same(fn(*[a.to("tpu") for a in args], out=keep_t), fn(*args, out=keep_c))


# ---- grid_sampler_2d's Python meta function checks less than CPU (test_torch
# test_invalid_shapes_grid_sampler): CPU's checks and messages at the op
@pytest.mark.parametrize("fn", ["grid_sampler", "grid_sampler_2d", "grid_sampler_3d"])
@pytest.mark.parametrize("shapes", [((5, 5, 5, 5, 5), (1, 1, 1, 4, 4)), ((5, 5, 5, 5), (1, 1, 4, 4)),
                                    ((2, 3, 5, 5), (2, 4, 4, 3)), ((2, 3, 5, 5), (2, 4, 2)),
                                    ((2, 3, 0, 5), (2, 4, 4, 2)), ((2, 3, 5, 5, 5), (2, 4, 4, 4, 3))])
def test_grid_sampler_shape_checks_like_cpu(mode, fn, shapes):
    def run(dev):
        inp = torch.ones(shapes[0], dtype=torch.float64, device=dev)
        grid = torch.zeros(shapes[1], dtype=torch.float64, device=dev)
        return getattr(torch, fn)(inp, grid, 0, 0, True)

    cpu = _outcome(run, "cpu")
    tpu = _outcome(run, "tpu")
    assert tpu == cpu
    if cpu[0] is None:
        assert_same(run("tpu"), run("cpu"))


def test_grid_sampler_dtype_mismatch_like_cpu(mode):
    def run(dev):
        return torch.grid_sampler_2d(torch.ones(1, 1, 3, 3, device=dev),
                                     torch.zeros(1, 2, 2, 2, dtype=torch.float64, device=dev), 0, 0, True)

    assert _same_outcome(run)[0] is RuntimeError


# ---- Tensor.is_set_to (test_torch test_is_set_to): the same storage, offset and geometry
def test_is_set_to_like_cpu(mode):
    def cases(dev):
        t1 = torch.empty(3, 4, 9, 10, device=dev)
        t2 = torch.empty(3, 4, 9, 10, device=dev)
        t3 = torch.tensor([], device=dev).set_(t1)
        t4 = t3.clone().resize_(12, 90)
        b1 = torch.tensor([True, True], device=dev)
        b2 = torch.tensor([False], device=dev).set_(b1)
        e1 = torch.empty([2, 5, 0], device=dev)
        v1 = torch.empty([2, 3, 4], device=dev)
        return [t1.is_set_to(t2), t1.is_set_to(t3), t3.is_set_to(t1), t1.is_set_to(t4),
                torch.tensor([], device=dev).is_set_to(torch.tensor([], device=dev)),
                b1.is_set_to(b2), e1.is_set_to(e1.view([0])), v1.is_set_to(v1.view(4, 3, 2)),
                v1.is_set_to(v1[:]), v1[1].is_set_to(v1[0]), v1.is_set_to(v1)]

    assert cases("tpu") == cases("cpu")
