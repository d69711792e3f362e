"""Argument errors raise at the op that caused them, in every eager mode, with
CPU's exception type; the device keeps working and a later unrelated op does
not see them. Also: boolean-mask shape checks, memory-overlap checks,
negative-bit copies and deterministic filling of new memory (issue 13)."""
import warnings

import pytest
import torch

import torch_tpu



# `mode`: the all-modes fixture in conftest.py


def A(d):
    return torch.arange(9., device=d).reshape(3, 3)


def X(d):
    return torch.arange(30., device=d).reshape(6, 5)


def L(v, d):
    return torch.tensor(v, device=d)


def B(shape, d):
    return torch.ones(shape, dtype=torch.bool, device=d)


def E(d):  # an expanded (self-overlapping) tensor
    return torch.ones(1, 5, device=d).expand(4, 5)


# Each case raises on CPU; on tpu it must raise the same type at the op.
BAD_ARGS = {
    # indexing
    "index_put_indices_bcast": lambda d: A(d).__setitem__(([0, 1, 2], [0, 1]), 5),
    "index_put_value_bcast": lambda d: A(d).index_put_((L([0, 1], d),), torch.ones(3, 2, device=d)),
    "index_put_dtype": lambda d: A(d).index_put_((L([0, 1], d),),
                                                 torch.ones(3, dtype=torch.double, device=d)),
    "index_put_too_many": lambda d: A(d).index_put_((L([0], d),) * 3, L(1., d)),
    "index_put_index_dtype": lambda d: A(d).index_put_((L([0.], d),), L(1., d)),
    "index_indices_bcast": lambda d: A(d)[L([0, 1], d), L([0, 1, 2], d)],
    "index_too_many": lambda d: A(d)[L([0], d), L([0], d), L([0], d)],
    "mask_len_get": lambda d: X(d)[B(4, d)],
    "mask_len_set": lambda d: X(d).__setitem__(B(4, d), 1.),
    "mask_2d_shape": lambda d: X(d)[B((6, 4), d)],
    "mask_after_slice": lambda d: X(d)[:, B(4, d)],
    "mask_cpu_on_tpu": lambda d: X(d)[torch.ones(4, dtype=torch.bool)],
    "index_put_mask_len": lambda d: X(d).index_put_((B(4, d),), L(1., d)),
    "index_put_mask_len_acc": lambda d: X(d).index_put_((B(4, d),), torch.ones(5, device=d), True),
    "index_select_2d_index": lambda d: X(d).index_select(0, torch.zeros(2, 2, dtype=torch.long, device=d)),
    "index_select_float_index": lambda d: X(d).index_select(0, torch.zeros(2, device=d)),
    "index_select_dim": lambda d: X(d).index_select(3, L([0], d)),
    "index_fill_dim": lambda d: X(d).index_fill_(3, L([0, 1], d), 1.),
    "index_fill_2d_index": lambda d: X(d).index_fill_(0, L([[0, 1]], d), 1.),
    "index_fill_float_index": lambda d: X(d).index_fill_(0, L([0.], d), 1.),
    "put_numel": lambda d: X(d).put_(L([0, 1], d), torch.ones(3, device=d)),
    "put_index_dtype": lambda d: X(d).put_(L([0., 1.], d), torch.ones(2, device=d)),
    "put_dtype": lambda d: X(d).put_(L([0, 1], d), torch.ones(2, dtype=torch.double, device=d)),
    "gather_rank": lambda d: X(d).gather(0, torch.zeros(2, 2, 2, dtype=torch.long, device=d)),
    "index_add_shape": lambda d: X(d).index_add_(0, L([0, 1], d), torch.ones(3, 5, device=d)),
    "index_copy_shape": lambda d: X(d).index_copy_(0, L([0, 1], d), torch.ones(3, 5, device=d)),
    # masked ops
    "masked_scatter_small_source": lambda d: X(d).masked_scatter_(B((6, 5), d), torch.ones(3, device=d)),
    "masked_scatter_small_source_fn": lambda d: X(d).masked_scatter(B((6, 5), d), torch.ones(3, device=d)),
    "masked_scatter_mask_bcast": lambda d: X(d).masked_scatter_(B(4, d), torch.ones(30, device=d)),
    "masked_scatter_dtype": lambda d: X(d).masked_scatter_(B((6, 5), d),
                                                           torch.ones(30, dtype=torch.double, device=d)),
    "masked_scatter_mask_dtype": lambda d: X(d).masked_scatter_(torch.ones(6, 5, device=d),
                                                                torch.ones(30, device=d)),
    "masked_fill_mask_bcast": lambda d: X(d).masked_fill_(B(4, d), 1.),
    "masked_fill_fn_mask_bcast": lambda d: X(d).masked_fill(B(4, d), 1.),
    "masked_fill_mask_dtype": lambda d: X(d).masked_fill_(torch.ones(6, 5, device=d), 1.),
    "masked_fill_value_dim": lambda d: X(d).masked_fill_(B((6, 5), d), torch.ones(2, device=d)),
    "masked_select_bcast": lambda d: torch.masked_select(X(d), B(4, d)),
    # shapes, dtypes, dims, out=
    "add_bcast": lambda d: X(d) + torch.ones(4, device=d),
    "add_out_dtype": lambda d: torch.add(X(d), 1, out=torch.empty(3, dtype=torch.long, device=d)),
    "inplace_bcast": lambda d: torch.ones(3, 1, device=d).mul_(torch.ones(3, 4, device=d)),
    "inplace_dtype": lambda d: torch.ones(3, dtype=torch.long, device=d).add_(torch.ones(3, device=d)),
    "sum_dim": lambda d: X(d).sum(5),
    "sort_dim": lambda d: X(d).sort(4),
    "argsort_dim": lambda d: X(d).argsort(-3),
    "cumsum_dim": lambda d: X(d).cumsum(4),
    "softmax_dim": lambda d: X(d).softmax(4),
    "cat_shape": lambda d: torch.cat([X(d), torch.ones(2, 4, device=d)]),
    "cat_dim": lambda d: torch.cat([X(d), X(d)], 3),
    "stack_shape": lambda d: torch.stack([X(d), torch.ones(2, 4, device=d)]),
    "mm_shape": lambda d: X(d) @ X(d),
    "bmm_shape": lambda d: torch.bmm(torch.ones(2, 3, 4, device=d), torch.ones(3, 4, 5, device=d)),
    "where_bcast": lambda d: torch.where(B(4, d), X(d), X(d)),
    "copy_bcast": lambda d: X(d).copy_(torch.ones(4, device=d)),
    "topk_k": lambda d: X(d).topk(10),
    "bucketize_2d_boundaries": lambda d: torch.bucketize(X(d), X(d)),
    "searchsorted_shape": lambda d: torch.searchsorted(X(d), torch.ones(2, 2, device=d)),
    "scatter_src_dtype": lambda d: X(d).scatter_(0, torch.zeros(2, 2, dtype=torch.long, device=d),
                                                 torch.ones(2, 2, dtype=torch.double, device=d)),
    "index_reduce_shape": lambda d: X(d).index_reduce_(0, L([0, 1], d), torch.ones(3, 5, device=d), "prod"),
    "conv_channels": lambda d: torch.nn.functional.conv2d(torch.ones(1, 3, 5, 5, device=d),
                                                          torch.ones(2, 4, 3, 3, device=d)),
    "nonzero_out_dtype": lambda d: torch.nonzero(B(3, d), out=torch.empty(5, dtype=torch.int, device=d)),
    # foreach
    "foreach_list_lengths": lambda d: torch._foreach_add([X(d), X(d)], [X(d)]),
    "foreach_empty": lambda d: torch._foreach_add([], []),
    "foreach_shape": lambda d: torch._foreach_add([X(d)], [torch.ones(4, device=d)]),
    "foreach_scalarlist_length": lambda d: torch._foreach_add([X(d)], [1., 2.]),
    "foreach_overlap": lambda d: (lambda t: torch._foreach_add_([t[1:], t], [t[:-1], t]))(X(d)),
    "foreach_expanded": lambda d: torch._foreach_mul_([E(d)], 2.),
    # memory overlap
    "overlap_add_": lambda d: (lambda x: x[1:].add_(x[:5]))(X(d)),
    "overlap_add_row": lambda d: (lambda x: x.add_(x[0]))(X(d)),
    "overlap_add_out": lambda d: (lambda x: torch.add(x[:5], 1, out=x[1:]))(X(d)),
    "overlap_exp_out": lambda d: (lambda x: torch.exp(x[:5], out=x[1:]))(X(d)),
    "overlap_sigmoid_out": lambda d: (lambda x: torch.sigmoid(x[:5], out=x[1:]))(X(d)),
    "overlap_copy_t": lambda d: (lambda x: x.copy_(x.t()))(A(d)),
    "overlap_copy_shift": lambda d: (lambda x: x[1:].copy_(x[:-1]))(X(d)),
    "overlap_cat_out": lambda d: (lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]))(X(d)),
    "overlap_index_select_out": lambda d: (lambda x: torch.index_select(x, 0, L([0, 1], d), out=x[1:3]))(X(d)),
    "overlap_clamp_tensor": lambda d: (lambda x: x[1:].clamp_(x[:5]))(X(d)),
    "overlap_lerp": lambda d: (lambda x: x[1:].lerp_(x[:5], 0.5))(X(d)),
    "overlap_index_put_value": lambda d: (lambda x: x.index_put_((L([0, 1], d),), x[2]))(X(d)),
    "expanded_relu_": lambda d: E(d).relu_(),
    "expanded_abs_": lambda d: E(d).abs_(),
    "expanded_clamp_": lambda d: E(d).clamp_(0, 1),
    "expanded_copy_": lambda d: E(d).copy_(torch.ones(4, 5, device=d)),
    "expanded_copy_from_cpu": lambda d: E(d).copy_(torch.ones(4, 5)),
    "expanded_mul_out": lambda d: torch.mul(torch.ones(4, 5, device=d), 2, out=E(d)),
    "expanded_index_add_": lambda d: E(d).index_add_(0, L([0, 1], d), torch.ones(2, 5, device=d)),
    "expanded_uniform_": lambda d: E(d).uniform_(),
    "expanded_cumsum_out": lambda d: torch.cumsum(torch.ones(4, 5, device=d), 1, out=E(d)),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_error_raises_at_op(mode, case):
    fn = BAD_ARGS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as cpu:
            fn("cpu")
        with pytest.raises(type(cpu.value)):
            fn("tpu")
    # nothing was left queued: an unrelated op and a synchronization work
    assert torch.ones(2, device="tpu").sum().item() == 2.0
    torch.tpu.synchronize()


# What CPU accepts must keep working (the overlap checks are CPU's, not stricter).
ALLOWED = {
    "fill_expanded": lambda d: E(d).fill_(2.),
    "zero_expanded": lambda d: E(d).zero_(),
    "inplace_same": lambda d: (lambda x: (x.add_(x), x)[1])(X(d)),
    "inplace_same_view": lambda d: (lambda x: (x.mul_(x.view(6, 5)), x)[1])(X(d)),
    "out_is_input": lambda d: (lambda x: (torch.add(x, 1, out=x), x)[1])(X(d)),
    "copy_same_view": lambda d: (lambda x: (x.copy_(x.view(6, 5)), x)[1])(X(d)),
    "copy_disjoint": lambda d: (lambda x: (x[:3].copy_(x[3:]), x)[1])(X(d)),
    "add_disjoint_halves": lambda d: (lambda x: (x[:, :2].add_(x[:, 3:]), x)[1])(X(d)),
    "strided_not_dense": lambda d: (lambda x: (x[:, ::2].add_(x[:, 1::2][:, :2].sum(1, keepdim=True)), x)[1])(X(d)),
    "masked_fill_overlap": lambda d: (lambda x: (x[1:].masked_fill_(x[:5] > 3, 1.), x)[1])(X(d)),
    "foreach_disjoint": lambda d: (lambda t: (torch._foreach_add_([t[:3], t[3:]], [t[3:], t[3:]]), t)[1])(X(d)),
    "mask_full": lambda d: X(d)[X(d) > 7],
    "mask_rows": lambda d: X(d)[L([True, False, True, False, True, True], d)],
    "mask_rows_set": lambda d: (lambda x: (x.__setitem__(L([True, False, True, False, True, True], d), -1.), x)[1])(X(d)),
    "mask_cols_after_slice": lambda d: X(d)[:, L([True, False, True, False, True], d)],
    "mask_and_index": lambda d: X(d)[L([True, False, True, False, True, True], d), L([0, 1, 2, 3], d)],
    "mask_0d": lambda d: X(d)[L(True, d)],
    "index_put_mask_acc": lambda d: X(d).index_put_((L([True, False, True, False, True, True], d),),
                                                     torch.ones(5, device=d), True),
    "index_put_nonadjacent": lambda d: (lambda x: (x.__setitem__((L([0, 1], d), slice(None), L([1, 2], d)),
                                                                 torch.arange(8., device=d).reshape(2, 4)), x)[1])(
        torch.zeros(3, 4, 5, device=d)),
    "index_put_adjacent": lambda d: (lambda x: (x.__setitem__((slice(None), L([0, 1], d), L([1, 2], d)),
                                                              torch.arange(6., device=d).reshape(3, 2)), x)[1])(
        torch.zeros(3, 4, 5, device=d)),
    "masked_scatter_exact": lambda d: X(d).masked_scatter_(X(d) > 20, -torch.arange(30., device=d)),
    "masked_scatter_bcast_mask": lambda d: X(d).masked_scatter(L([True, False, True, False, True], d),
                                                               -torch.arange(30., device=d)),
    "index_fill_0d_index": lambda d: X(d).index_fill_(1, L(2, d), -1.),
    "put_": lambda d: X(d).put_(L([0, 29], d), L([-1., -2.], d)),
    "sort_neg_dim": lambda d: X(d).sort(-2, descending=True).values,
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_valid_arguments_still_work(mode, case):
    fn = ALLOWED[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn("cpu")
        actual = fn("tpu")
    assert actual.device.type == "tpu"
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected)


# CPU accepts these overlaps (the result depends on the kernel's order, so
# only the absence of an error is compared).
ALLOWED_ORDER_DEPENDENT = {
    "sum_out_overlap": lambda d: (lambda x: (torch.sum(x, 1, out=x[:, 0]), x)[1])(X(d)),
    "softmax_out_overlap": lambda d: (lambda x: (torch.softmax(x[:5], 1, out=x[1:]), x)[1])(X(d)),
    "scatter_src_overlap": lambda d: (lambda x: (x[1:].scatter_(0, torch.zeros(1, 5, dtype=torch.long, device=d),
                                                                x[:1]), x)[1])(X(d)),
    "mm_out_overlap": lambda d: (lambda x: (torch.mm(x[:3, :3], x[1:4, :3], out=x[2:5, :3]), x)[1])(
        torch.ones(6, 6, device=d)),
}


@pytest.mark.parametrize("case", sorted(ALLOWED_ORDER_DEPENDENT))
def test_overlaps_cpu_accepts(mode, case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ALLOWED_ORDER_DEPENDENT[case]("cpu")
        ALLOWED_ORDER_DEPENDENT[case]("tpu").cpu()


def test_issue_reproducer_index_put_mismatch(mode):
    a = torch.arange(9, device="tpu").reshape(3, 3)
    with pytest.raises(IndexError, match="could not be broadcast"):
        a[[0, 1, 2], [0, 1]] = 5
    assert torch.ones(2, device="tpu").sum().item() == 2.0
    assert a.cpu().tolist() == torch.arange(9).reshape(3, 3).tolist()


def test_wrong_length_mask_does_not_write(mode):
    x = torch.arange(30., device="tpu").reshape(6, 5)
    with pytest.raises(IndexError, match="shape of the mask"):
        x[torch.ones(4, dtype=torch.bool, device="tpu")] = 0.
    with pytest.raises(IndexError, match="shape of the mask"):
        x[torch.ones(4, dtype=torch.bool, device="tpu")]
    assert x.cpu().equal(torch.arange(30.).reshape(6, 5))


def test_data_dependent_error_names_op(mode):
    """An index out of range in the data may surface at the next
    synchronization (Debug: at the op), and then names the op."""
    x = torch.arange(5., device="tpu")
    with pytest.raises(IndexError, match="index"):
        y = x.index_select(0, torch.tensor([7], device="tpu"))
        torch.tpu.synchronize()
        del y
    assert torch.ones(2, device="tpu").sum().item() == 2.0


# --- negative views -----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_copy_from_neg_view(mode, dtype):
    src = torch.arange(-3, 9).reshape(3, 4).to(dtype)
    x = src.to("tpu")
    y = torch.zeros(3, 4, dtype=dtype, device="tpu")
    y.copy_(x._neg_view())
    assert y.cpu().equal(-src)
    assert x._neg_view().resolve_neg().cpu().equal(-src)
    assert x._neg_view().cpu().equal(-src)
    assert x._neg_view().clone().cpu().equal(-src)
    # into a negative view: memory holds -value
    z = torch.zeros(3, 4, dtype=dtype, device="tpu")
    z._neg_view().copy_(x)
    assert z.cpu().equal(-src)
    # from a non-contiguous negative view
    w = torch.zeros(4, 3, dtype=dtype, device="tpu")
    w.copy_(x._neg_view().t())
    assert w.cpu().equal(-src.t())
    assert x.cpu().equal(src)  # the source is unchanged


def test_ops_on_neg_view(mode):
    src = torch.arange(-3., 9.).reshape(3, 4)
    x = src.to("tpu")
    n = x._neg_view()
    torch.testing.assert_close((n + 1).cpu(), -src + 1)
    torch.testing.assert_close(n.sum(0).cpu(), (-src).sum(0))
    torch.testing.assert_close(torch.mm(n, x.t()).cpu(), torch.mm(-src, src.t()))


# --- deterministic mode ----------------------------------------------------

@pytest.fixture
def deterministic():
    import torch.utils.deterministic as det
    old_alg = torch.are_deterministic_algorithms_enabled()
    old_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    yield det
    torch.use_deterministic_algorithms(old_alg)
    det.fill_uninitialized_memory = old_fill


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
def test_deterministic_fill_empty(mode, deterministic, dtype):
    for make in (lambda d: torch.empty(3, 4, dtype=dtype, device=d),
                 lambda d: torch.empty_strided((3, 4), (1, 3), dtype=dtype, device=d),
                 lambda d: torch.empty_like(torch.zeros(2, 5, dtype=dtype, device=d))):
        expected = make("cpu")
        actual = make("tpu")
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_deterministic_fill_resize(mode, deterministic):
    for dtype in (torch.float32, torch.int32):
        def grow(d):
            t = torch.arange(4, device=d).to(dtype)
            t.resize_(3, 3)
            return t
        torch.testing.assert_close(grow("tpu").cpu(), grow("cpu"), equal_nan=True)


def test_deterministic_fill_off(mode, deterministic):
    deterministic.fill_uninitialized_memory = False
    t = torch.empty(16, device="tpu")  # no fill: nothing to compare, but no error
    assert t.shape == (16,)


# --- nonzero ---------------------------------------------------------------

@pytest.mark.parametrize("start_shape", [(0,), (5,), (2, 3), (30, 2), (7,)])
def test_nonzero_out_resizes(mode, start_shape):
    m = torch.tensor([[True, False, True], [False, True, True]])
    out_c = torch.empty(start_shape, dtype=torch.long)
    out_t = torch.empty(start_shape, dtype=torch.long, device="tpu")
    r_c = torch.nonzero(m, out=out_c)
    r_t = torch.nonzero(m.to("tpu"), out=out_t)
    assert r_t is out_t
    assert out_t.shape == out_c.shape and out_t.stride() == out_c.stride()
    assert out_t.cpu().equal(out_c) and r_c is out_c


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64])
def test_nonzero_shapes(mode, dtype):
    for shape in [(), (0,), (4,), (2, 3), (2, 0, 3), (2, 1, 3, 1)]:
        x = (torch.arange(max(1, torch.Size(shape).numel())) % 3 == 1)[:torch.Size(shape).numel()]
        x = x.reshape(shape).to(dtype)
        e = torch.nonzero(x)
        a = torch.nonzero(x.to("tpu"))
        assert a.shape == e.shape and a.stride() == e.stride(), (shape, a.shape, e.shape)
        assert a.cpu().equal(e)
        t = torch.nonzero(x.to("tpu"), as_tuple=True)
        for p, q in zip(t, torch.nonzero(x, as_tuple=True)):
            assert p.cpu().equal(q)


# --- PyTorch's OpInfo error inputs ------------------------------------------

# (OpInfo name, expected error regex fragment) of error inputs still not
# raised at the op, with the reason.
OPINFO_ERRORS_KNOWN = {
    # op_db's error inputs share tensors, and CPU resizes out= before its
    # overlap check raises, so the later samples differ between CPU and tpu
    # (which raises before resizing); run alone, the calls raise at the op
    # on both (overlap_cat_out, overlap_index_select_out above)
    ("cat", "the written-to tensor refer to a single memory location"),
    ("gather", "unsupported operation"),
}


@pytest.mark.parametrize("eager", ["strict", "defer_and_fuse"])
def test_opinfo_error_inputs_raise_at_op(eager):
    """Every OpInfo error input that raises on CPU raises the same exception
    type at the op on tpu, and leaves nothing queued for a later op."""
    from torch.testing._internal.common_methods_invocations import op_db
    bad = set()
    torch.tpu.synchronize()
    with torch_tpu.eager_mode(eager), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            if op.error_inputs_func is None:
                continue
            try:
                pairs = list(zip(op.error_inputs("tpu"), op.error_inputs("cpu")))
            except Exception:
                continue
            for ei, cei in pairs:
                cs = cei.sample_input
                try:
                    op(cs.input, *cs.args, **cs.kwargs)
                    continue  # CPU accepts it (device-specific error input)
                except Exception:
                    pass
                s = ei.sample_input
                raised = None
                try:
                    out = op(s.input, *s.args, **s.kwargs)
                    del out
                except NotImplementedError:
                    raised = NotImplementedError  # no tpu kernel: nothing to compare
                except Exception as e:
                    raised = type(e)
                try:
                    torch.ones(2, device="tpu").sum().item()
                    later = False
                except Exception:
                    later = True
                if raised is NotImplementedError and not later:
                    continue
                if later or raised is None or not issubclass(raised, ei.error_type):
                    bad.add((op.name, str(ei.error_regex)[:60]))
    unexpected = {b for b in bad if not any(b[0] == k[0] and k[1] in b[1] for k in OPINFO_ERRORS_KNOWN)}
    assert not unexpected, sorted(unexpected)
    torch.tpu.synchronize()


def test_result_dtype_follows_default_dtype_change():
    # The bridge memoizes output metadata; the default dtype decides the result type of
    # an integer tensor with a float scalar, so a later set_default_dtype must be seen.
    u = torch.tensor([1, 2], dtype=torch.uint8)
    ut = u.to("tpu")
    old = torch.get_default_dtype()
    try:
        for dt in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dt)
            expected = u + 5.5
            actual = ut + 5.5
            assert actual.dtype == expected.dtype == dt
            torch.testing.assert_close(actual.cpu(), expected)
            assert torch.arange(3, device="tpu").float().div(2).dtype == torch.float32
            assert (ut / 2).dtype == (u / 2).dtype
    finally:
        torch.set_default_dtype(old)
