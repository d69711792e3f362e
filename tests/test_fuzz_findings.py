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


# ---- argument errors: raised at the op, with CPU's exception type ----

def L(v, d, dt=torch.long):
    return torch.tensor(v, dtype=dt, device=d)


def F(shape, d, dt=torch.float32):
    return torch.ones(shape, dtype=dt, device=d)


BAD_ARGS = {
    # G1: a dtype CPU's kernel does not implement (NotImplementedError)
    "softmax_long": lambda d: torch.softmax(F((3, 4), d, torch.long), -1),
    "softmax_int_dim0": lambda d: torch.softmax(F((3, 4), d, torch.int32), 0),
    "log_softmax_bool": lambda d: torch.log_softmax(F((3, 4), d, torch.bool), 0),
    "bitwise_and_float": lambda d: F(3, d).bitwise_and(F(3, d)),
    "bitwise_or_half_scalar": lambda d: F(3, d, torch.half).bitwise_or(1),
    "bitwise_xor_bf16": lambda d: F(3, d, torch.bfloat16) ^ F(3, d, torch.bfloat16),
    "bitwise_and_float_": lambda d: F(3, d, torch.double).bitwise_and_(F(3, d, torch.double)),
    "silu_int": lambda d: torch.nn.functional.silu(F(3, d, torch.int32)),
    "silu_bool_": lambda d: torch.nn.functional.silu(F(3, d, torch.bool), inplace=True),
    "gelu_long": lambda d: torch.nn.functional.gelu(F(3, d, torch.long)),
    "abs_bool": lambda d: F(3, d, torch.bool).abs(),
    "abs__bool": lambda d: F(3, d, torch.bool).abs_(),
    # G2: std/var of integers (RuntimeError), checked before the dim
    "std_long": lambda d: F((3, 4), d, torch.long).std(),
    "var_int_dim": lambda d: F((3, 4), d, torch.int32).var(1),
    "std_long_bad_dim": lambda d: F((3, 4), d, torch.long).std(5),
    "var_mean_bool": lambda d: torch.var_mean(F((3, 4), d, torch.bool), 0),
    # G3: layer_norm of integers (NotImplementedError; a bad shape first: RuntimeError)
    "layer_norm_long": lambda d: torch.nn.functional.layer_norm(F((2, 3), d, torch.long), (3,)),
    "layer_norm_int_weight": lambda d: torch.nn.functional.layer_norm(F((2, 3), d, torch.int32), (3,),
                                                                      F(3, d, torch.int32)),
    "layer_norm_bool_bad_shape": lambda d: torch.nn.functional.layer_norm(F((2, 3), d, torch.bool), (4,)),
    # G4: bool inputs
    "relu_bool": lambda d: torch.relu(F(3, d, torch.bool)),
    "relu__bool": lambda d: F(3, d, torch.bool).relu_(),
    "floor_bool": lambda d: F(3, d, torch.bool).floor(),
    "round_bool": lambda d: F(3, d, torch.bool).round(),
    # G5: matmuls of mixed dtypes
    "matmul_mixed": lambda d: F((2, 3), d) @ F((3, 2), d, torch.double),
    "mv_mixed": lambda d: F((2, 3), d, torch.double) @ F(3, d),
    "linear_mixed": lambda d: torch.nn.functional.linear(F((2, 3), d), F((4, 3), d, torch.double)),
    "bmm_mixed": lambda d: torch.bmm(F((2, 2, 3), d), F((2, 3, 2), d, torch.bfloat16)),
    "dot_mixed": lambda d: torch.dot(F(3, d), F(3, d, torch.half)),
    # G10: copy_ into an empty tensor from a source that does not broadcast to it
    "copy_empty_no_bcast": lambda d: torch.zeros(5, 0, 3, device=d).copy_(F((5, 16, 3), d)),
    "copy_empty_more_dims": lambda d: torch.zeros(0, 3, device=d).copy_(F((2, 1, 3), d)),
    # G11: masked_fill_ with a mask that broadcasts beyond self
    "masked_fill_mask_beyond_self": lambda d: torch.zeros(3, device=d).masked_fill_(F((2, 3), d, torch.bool), 1.),
    # G9: index tensors that do not broadcast together (IndexError)
    "index_put_indices_no_bcast": lambda d: torch.zeros(3, 3, device=d).__setitem__(
        (L([0, 1, 2], d), L([0, 1], d)), 5.),
    "index_put_indices_no_bcast_fn": lambda d: torch.zeros(3, 3, device=d).index_put(
        (L([0, 1, 2], d), L([0, 1], d)), L(5., d, torch.float32)),
    # an indexed dim of size 0 admits no index (CPU's AdvancedIndex: IndexError, before the
    # value's shape is checked)
    "index_put_empty_dim_bad_value": lambda d: torch.zeros(0, dtype=torch.long, device=d).index_put_(
        (L([1], d),), torch.ones(2, dtype=torch.long, device=d)),
    "index_put_empty_dim": lambda d: torch.zeros(0, device=d).index_put_((L([1], d),), L(1., d, torch.float32)),
    "setitem_empty_dim": lambda d: torch.zeros(0, 3, device=d).__setitem__(L([2], d), 1.0),
    "index_empty_dim": lambda d: torch.zeros(0, 3, device=d)[L([1], d)],
    "index_empty_dim_after_slice": lambda d: torch.zeros(3, 0, device=d)[:, L([0, 1], d)],
    "index_empty_dim_nonadjacent": lambda d: torch.zeros(0, 3, 2, device=d)[L([0], d), :, L([1], d)],
    # index_select of an empty self along an empty dim
    "index_select_empty_axis": lambda d: torch.zeros(3, 0, device=d).index_select(1, L([0], d)),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_argument_error_at_op(mode, case):
    raises_at_op(BAD_ARGS[case])


# What CPU accepts: the dtype checks must not refuse these.
ALLOWED = {
    "softmax_empty_long": lambda d: torch.softmax(F((0, 4), d, torch.long), -1),
    "log_softmax_empty_bool": lambda d: torch.log_softmax(F((2, 0), d, torch.bool), 0),
    "bitwise_and_int": lambda d: L([5, 3], d).bitwise_and(L([6, 1], d)),
    "bitwise_or_bool_scalar": lambda d: F(3, d, torch.bool) | True,
    "abs_int": lambda d: L([-2, 3], d).abs(),
    "relu_int": lambda d: torch.relu(L([-2, 3], d)),
    "floor_int": lambda d: L([-2, 3], d).floor(),
    "std_float": lambda d: torch.arange(12., device=d).reshape(3, 4).std(1),
    "matmul_same_dtype": lambda d: F((2, 3), d, torch.double) @ F((3, 2), d, torch.double),
    "add_mixed_dtypes": lambda d: F(3, d, torch.int32) + F(3, d, torch.half),
    "pow_int_scalar": lambda d: L([2, 3], d) ** 2,
    "floor_divide_int": lambda d: torch.floor_divide(L([7, -7], d), L([2, 2], d)),
    "copy_empty_bcast": lambda d: torch.zeros(5, 0, 3, device=d).copy_(F((1, 3), d)),
    "layer_norm_float": lambda d: torch.nn.functional.layer_norm(torch.arange(6., device=d).reshape(2, 3), (3,)),
    # G6: index_add_ with an empty index, or into an empty dim: CPU does nothing
    "index_add_empty_index": lambda d: torch.zeros(4, 0, 3, device=d).index_add_(1, L([], d),
                                                                              torch.zeros(4, 0, 3, device=d)),
    "index_add_empty_index_dim0": lambda d: torch.zeros(0, 3, device=d).index_add_(0, L([], d),
                                                                                torch.zeros(0, 3, device=d)),
    "index_add_into_empty_dim": lambda d: torch.zeros(2, 0, device=d).index_add_(0, L([5], d),
                                                                              torch.zeros(1, 0, device=d)),
    "index_add_fn_empty_dim": lambda d: torch.zeros(3, 0, 2, device=d).index_add(1, L([], d),
                                                                              torch.zeros(3, 0, 2, device=d)),
    "index_reduce_empty_dim": lambda d: torch.zeros(2, 0, device=d).index_reduce_(1, L([], d),
                                                                               torch.zeros(2, 0, device=d), "prod"),
    # G7: nothing is read or written, so no index is checked
    "index_empty_result": lambda d: torch.zeros(3, 7, 2, 0, device=d)[L([-4], d), L([6], d)],
    "index_put_empty_self": lambda d: torch.zeros(3, 0, device=d).index_put_((L([7], d),), L(1., d, torch.float32)),
    "index_put_empty_acc": lambda d: torch.zeros(3, 0, device=d).index_put_((L([7], d),), L(1., d, torch.float32),
                                                                          accumulate=True),
    "setitem_empty_self": lambda d: (lambda x: (x.__setitem__(L([9], d), 2.), x)[1])(torch.zeros(2, 0, device=d)),
    "index_fill_empty_self": lambda d: torch.zeros(3, 0, device=d).index_fill_(0, L([9], d), 1.),
    "index_empty_dim_empty_index": lambda d: torch.zeros(0, 3, device=d)[L([], d)],
    "index_empty_mask": lambda d: torch.zeros(0, 3, device=d)[torch.zeros(0, dtype=torch.bool, device=d)],
    "index_select_empty_index": lambda d: torch.zeros(3, 4, device=d).index_select(1, L([], d)),
    # G13: gather with an empty index of another rank
    "gather_empty_index_rank1": lambda d: torch.zeros(3, 4, device=d).gather(0, L([], d)),
    "gather_empty_index_rank3": lambda d: torch.zeros(3, 4, device=d).gather(1, torch.zeros(2, 0, 1, dtype=torch.long,
                                                                                            device=d)),
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_valid_arguments_match_cpu(mode, case):
    same_as_cpu(ALLOWED[case])


# ---- data-dependent index errors: CPU's exception type (at the op or the next sync) ----

BAD_INDEX = {
    # G8 / issue 13 minor: CPU's type depends on the kernel path it takes
    "index_select_dim1": lambda d: torch.zeros(3, 4, device=d).index_select(1, L([7], d)),
    "index_select_dim0": lambda d: torch.zeros(3, 4, device=d).index_select(0, L([7], d)),
    "index_select_dim1_of_3": lambda d: torch.zeros(3, 4, 2, device=d).index_select(1, L([7], d)),
    "index_select_dim2_of_3": lambda d: torch.zeros(3, 4, 2, device=d).index_select(2, L([7], d)),
    "index_select_1d": lambda d: torch.zeros(3, device=d).index_select(0, L([-1], d)),
    "index_select_empty_self": lambda d: torch.zeros(3, 0, device=d).index_select(0, L([7], d)),
    "index_add_dim0": lambda d: torch.zeros(3, 4, device=d).index_add_(0, L([5], d), F((1, 4), d)),
    "index_add_last_dim": lambda d: torch.zeros(3, 4, device=d).index_add_(1, L([5], d), F((3, 1), d)),
    "index_add_middle_dim": lambda d: torch.zeros(3, 4, 2, device=d).index_add_(1, L([5], d), F((3, 1, 2), d)),
    "index_add_alpha": lambda d: torch.zeros(3, 4, device=d).index_add_(0, L([5], d), F((1, 4), d), alpha=2),
    "index_add_int32_index": lambda d: torch.zeros(3, 4, device=d).index_add_(0, L([5], d, torch.int32), F((1, 4), d)),
    "index_add_1d": lambda d: torch.zeros(3, device=d).index_add_(0, L([5], d), F(1, d)),
    "index_add_into_empty_1d": lambda d: torch.zeros(0, device=d).index_add_(0, L([0], d), F(1, d)),
    "gather": lambda d: torch.zeros(3, 4, device=d).gather(0, L([[5]], d)),
    "scatter_add": lambda d: torch.zeros(3, 4, device=d).scatter_add_(0, L([[5]], d), F((1, 1), d)),
    "index_copy": lambda d: torch.zeros(3, 4, device=d).index_copy_(0, L([5], d), F((1, 4), d)),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEX))
def test_bad_index_error_type(mode, case):
    fn = BAD_INDEX[case]
    with pytest.raises(Exception) as cpu:
        _run(fn, "cpu")
    with pytest.raises(type(cpu.value)):
        out = _run(fn, "tpu")
        torch.tpu.synchronize()
        del out
    assert torch.ones(2, device="tpu").sum().item() == 2.0


# ---- issue 13 (session 8): a 0-d operand of a wider dtype is cast to the common dtype ----

def _exact(fn):
    expected = _run(fn, "cpu")
    actual = _run(fn, "tpu")
    torch.tpu.synchronize()
    assert_same(actual, expected, atol=0, rtol=0)


SCALAR_OPS = {
    "remainder": torch.remainder, "fmod": torch.fmod, "sub": torch.sub, "add": torch.add,
    "rsub": torch.rsub, "atan2": torch.atan2, "hypot": torch.hypot,
    "pow": lambda a, b: torch.pow(a.abs(), b), "maximum": torch.maximum, "lt": torch.lt,
    "eq": torch.eq, "where": lambda a, b: torch.where(a > 0, a, b),
    # CPU's mul/div kernels read a one-element divisor's own value (not rounded) for bf16/f16
    "mul": torch.mul, "div": torch.div, "floor_divide": torch.floor_divide,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "add_": lambda a, b: a.clone().add_(b), "mul_": lambda a, b: a.clone().mul_(b),
}


@pytest.mark.parametrize("op", sorted(SCALAR_OPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("other", ["f64_0d", "f32_0d", "python"])
def test_wider_scalar_operand_rounded(mode, op, dtype, other):
    # seed 32270: f16 tensor % 0-d float64 tensor; CPU rounds the divisor to f16 first
    x = (torch.randn(70, generator=torch.Generator().manual_seed(1)) * 40).to(dtype)
    s = {"f64_0d": torch.tensor(-0.026367, dtype=torch.float64),
         "f32_0d": torch.tensor(1.2345678, dtype=torch.float32), "python": 1.2345678901}[other]
    if other == "python" and op in ("maximum", "atan2", "hypot"):
        return  # (these take no Python number)
    f = SCALAR_OPS[op]
    _exact(lambda d: f(x.to(d), s.to(d) if torch.is_tensor(s) else s))


def test_wider_int_scalar_operand_wraps(mode):
    x = torch.tensor([7, -9, 100, 3], dtype=torch.int32)
    s = torch.tensor(2 ** 33 + 5, dtype=torch.int64)  # int32(s) == 5, as CPU casts it
    for f in (torch.floor_divide, torch.remainder, torch.lt, torch.eq, torch.maximum):
        _exact(lambda d: f(x.to(d), s.to(d)))


def test_prod_accumulates_in_output_dtype(mode):
    # CPU's prod multiplies in the output's dtype: an f16 partial product past 65504 is inf
    _exact(lambda d: torch.tensor([300., 300., 0.001], dtype=torch.float16, device=d).prod())
    _exact(lambda d: torch.tensor([[1e30, 1e30, 1e-30]], dtype=torch.bfloat16, device=d).prod(1))
    _exact(lambda d: torch.tensor([1e300, 1e10, 1e-300], dtype=torch.float64, device=d).prod())


def test_float32_prod_is_the_exact_product_rounded_once(mode):
    # seed 231743: a float32 product runs in double and is rounded once. A running float32
    # product overflows where the exact product is finite: 4444 factors in [-2, 2] with a
    # finite product pass 3.4e38 on the way (CPU's vector lanes, holding shorter runs, did
    # not; its scalar loop over three elements does: [1e30, 1e30, 1e-30] is inf on CPU)
    x = torch.tensor([1e30, 1e30, 1e-30])
    assert torch.isinf(x.prod())
    assert_same(x.to("tpu").prod(), x.double().prod().float())
    # 200 factors of 2, then 150 of 0.5: the running product passes 2^128, the exact one is 2^50
    f = torch.cat([torch.full((200, 3), 2.0), torch.full((150, 3), 0.5)])
    # (CPU's answer depends on its loop: inf where it multiplies in order, 2^50 in its lanes)
    exact = torch.full((3,), 2.0 ** 50)
    assert torch.isinf(torch.cumprod(f, 0)).any() and (f.double().prod(0) == exact.double()).all()
    assert_same(f.to("tpu").prod(0), exact)
    assert_same(f.t().to("tpu").prod(1), exact)
    assert_same(f[:, 0].to("tpu").prod(), exact[0])


def test_bool_add_alpha(mode):
    # seed 16052: CPU casts alpha to bool, so True + True * -1 is True
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    for alpha in (-1, 2, 0):
        _exact(lambda d: a.to(d).clone().add_(b.to(d), alpha=alpha))
        _exact(lambda d: torch.add(a.to(d), b.to(d), alpha=alpha))


def test_roll_empty_any_dim(mode):
    # seeds 15634, 19714: CPU returns a clone of an empty tensor before it looks at dims
    x = torch.zeros(0, 1, 2, dtype=torch.int64)
    same_as_cpu(lambda d: torch.roll(x.to(d), -3, 3))
    same_as_cpu(lambda d: torch.roll(x.to(d), (1, 2), (5, -9)))
    raises_at_op(lambda d: torch.roll(x.to(d), (1,), (0, 5)))  # shifts and dims must align
    raises_at_op(lambda d: torch.roll(torch.zeros(3, 1, 2, device=d), 1, 5))


def test_roll_shifts_dims_must_align(mode):
    raises_at_op(lambda d: torch.roll(torch.zeros(3, 2, device=d), (1, 2), ()))
    raises_at_op(lambda d: torch.roll(torch.zeros(0, 2, device=d), (1, 2), ()))
    same_as_cpu(lambda d: torch.roll(torch.arange(6., device=d).reshape(3, 2), 1))


# ---- issue 13 (session 8): CPU's own overlap checks of masked_fill_, index_fill_, index_put_ ----

def _bools(d):
    return torch.tensor([True, False, True, True, False], device=d)


OVERLAP_ERRORS = {
    # seed 20671: the mask is a view of self
    "masked_fill_mask_view_of_self": lambda d: (lambda x: x.masked_fill_(x[4], -1))(_bools(d)),
    # seed 33399: index_put_'s values (or an index) are self
    "index_put_values_self_acc": lambda d: (lambda x: x.index_put_((L([0, 1, 2, 3, 4], d),), x,
                                                                   accumulate=True))(torch.arange(5., device=d)),
    "index_put_values_self": lambda d: (lambda x: x.index_put_((L([0, 1, 2, 3, 4], d),), x))(
        torch.arange(5., device=d)),
    "index_put_values_partial": lambda d: (lambda x: x.index_put_((L([0, 1], d),), x[2:4]))(
        torch.arange(5., device=d)),
    "index_put_index_view_of_self": lambda d: (lambda x: x.index_put_((x[:2],), L(1, d)))(torch.arange(5, device=d)),
    "setitem_values_self": lambda d: (lambda x: x.__setitem__(L([0, 1, 2, 3, 4], d), x))(torch.arange(5., device=d)),
    "index_fill_index_view_of_self": lambda d: (lambda x: x.index_fill_(0, x[:2], 3))(torch.arange(5, device=d)),
    "index_fill_index_self": lambda d: (lambda x: x.index_fill_(0, x, 3))(torch.arange(5, device=d)),
    # seed 20884: the functional index_fill fills a fresh clone of an empty self
    "index_fill_fn_empty_view": lambda d: torch.zeros(4, device=d)[1:1].index_fill(0, L([0, -1, 0, 0], d), -1),
    "index_fill_fn_empty_dim": lambda d: torch.zeros(3, 0, device=d).index_fill(1, L([9], d), -1),
}

OVERLAP_ALLOWED = {
    "masked_fill_mask_self": lambda d: (lambda x: (x.masked_fill_(x, False), x)[1])(_bools(d)),
    "masked_fill_fn_mask_view": lambda d: (lambda x: x.masked_fill(x[4], -1))(_bools(d)),
    "masked_fill_value_view_of_self": lambda d: (lambda x: (x.masked_fill_(
        torch.tensor([True] * 3 + [False] * 2, device=d), x[4]), x)[1])(torch.arange(5., device=d)),
    "index_put_fn_values_self": lambda d: (lambda x: x.index_put((L([0, 1, 2, 3, 4], d),), x))(
        torch.arange(5., device=d)),
    "index_fill_value_view_of_self": lambda d: (lambda x: (x.index_fill_(0, L([1], d), x[0]), x)[1])(
        torch.arange(5., device=d)),
    "index_fill_fn_empty_other_dim": lambda d: torch.zeros(3, 0, device=d).index_fill(0, L([9], d), -1),
}


@pytest.mark.parametrize("case", sorted(OVERLAP_ERRORS))
def test_overlap_error_at_op(mode, case):
    raises_at_op(OVERLAP_ERRORS[case])


@pytest.mark.parametrize("case", sorted(OVERLAP_ALLOWED))
def test_overlap_allowed(mode, case):
    same_as_cpu(OVERLAP_ALLOWED[case])


def test_index_fill_inplace_empty_view_checks_index(mode):
    # an empty view with storage behind it: CPU's restrided self has elements, so the index is
    # checked against the size 0 (IndexError; data-dependent, may surface at the next sync)
    def fn(d):
        return torch.zeros(4, device=d)[1:1].index_fill_(0, L([0, -1], d), -1)
    with pytest.raises(IndexError):
        _run(fn, "cpu")
    with pytest.raises(IndexError):
        _run(fn, "tpu")
        torch.tpu.synchronize()
    same_as_cpu(lambda d: torch.zeros(4, device=d)[1:1].index_fill_(0, L([], d), -1))
    same_as_cpu(lambda d: torch.zeros(4, 3, device=d)[1:1].index_fill_(1, L([2], d), -1))


CHAINS = {
    "sub": lambda x, s: ((x - s) * 2 + 1).abs(),
    "remainder": lambda x, s: torch.remainder(x.abs() + 1, s).neg(),
    "pow": lambda x, s: torch.pow(x.abs() + 1, s) * 3,
    "mul": lambda x, s: (x * s + 1) * s,
    "div": lambda x, s: (x.abs() / s - 1) / s,
    "python_scalar": lambda x, s: ((x - 1.2345678) * 2 - 0.3).abs(),
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_wider_scalar_operand_in_chains(mode, chain):
    # the same rounding where DeferAndFuse fuses the chain into one kernel
    x = (torch.randn(70, generator=torch.Generator().manual_seed(1)) * 40).to(torch.bfloat16)
    s = torch.tensor(-1.2345678, dtype=torch.float64)
    _exact(lambda d: CHAINS[chain](x.to(d), s.to(d)))


def test_std_var_dims_checked_in_order_after_a_passing_call(mode):
    # seeds 44308, 56007: the CPU probe remembered a passing (dtype, rank) signature without
    # its dims, so a later call with a repeated dim got the meta kernel's IndexError instead of
    # CPU's "dim 2 appears multiple times" (CPU checks duplicates before a later dim's range)
    x = lambda d: torch.ones(1, 5, 2, 13, device=d)
    same_as_cpu(lambda d: torch.var(x(d), (1, 2), correction=1, keepdim=True))
    raises_at_op(lambda d: torch.var(x(d), (-2, 2, 4), correction=1, keepdim=True))
    raises_at_op(lambda d: torch.std(x(d), (-2, 2, 4)))
    with pytest.raises(RuntimeError, match="appears multiple times"):
        torch.var(x("tpu"), (-2, 2, 4), correction=1)
    with pytest.raises(IndexError):
        torch.var(x("tpu"), (1, 4), correction=1)


# ---- seed 94460: prod whose in-order product underflows while vector lanes overflow ----

def test_prod_in_order_where_cpu_lanes_mix_zero_and_inf(mode):
    # the factors alternate between small (< 1) and large (> 1) every two elements, so the
    # in-order product drifts to 0 while CPU's vector lanes holding only large factors reach
    # inf: CPU's prod gives 0 * inf = NaN (explained in tests/fuzz/known.py); tpu gives the
    # in-order product, which is CPU's cumprod's last element
    small, large = torch.tensor([0.05, 0.1]), torch.tensor([9.0, 11.0])
    x = torch.cat([small, large]).repeat(400)
    expected = torch.cumprod(x, 0)[-1]
    assert expected.item() == 0.0 and torch.isinf(x.view(-1, 8)[:, 2:4].prod()).item()
    actual = x.to("tpu").prod()
    assert_same(actual, expected)
    y = torch.cat([3 * large, small]).repeat(400)  # overflows in order: +inf
    assert torch.isinf(torch.cumprod(y, 0)[-1]).item()
    assert_same(y.to("tpu").prod(), torch.cumprod(y, 0)[-1])


# ---- seed 99353: log of a layer_norm over one element ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_layer_norm_of_one_element_is_zero(mode, dtype):
    # x - mean is exactly 0 over one element: tpu gives 0 and log(0) = -inf, as CPU's float32
    # and float64 kernels do (CPU's f16/bf16 kernel leaves an FMA's rounding residue, about
    # 1e-5 of either sign, whose log is NaN or finite: the fuzzer no longer takes log of a
    # rounded value near 0, tests/fuzz/gen.py)
    x = torch.linspace(-3, 3, 6).reshape(6, 1).to(dtype)
    expected = torch.nn.functional.layer_norm(x.float(), (1,))
    assert (expected == 0).all()
    out = torch.nn.functional.layer_norm(x.to("tpu"), (1,))
    assert out.dtype == dtype
    assert (out.cpu().float() == 0).all()
    assert_same(torch.log(out).float(), torch.log(expected))


# ---- seed 190251: the functional index_fill keeps self's memory format ----

@pytest.mark.parametrize("value", [2, "tensor"])
def test_index_fill_of_a_strided_view_keeps_its_layout(mode, value):
    # CPU fills a clone in self's memory format: a diagonal view with strides (1, 20)
    # gives (1, 4), so a later .view((12, -1)) of an element-wise result raises on CPU
    x = torch.randn(3, 4, 4)

    def fn(d):
        t = x.to(d).diagonal(-1, -2, -3)
        v = torch.tensor(-1.5, device=d) if value == "tensor" else value
        return t.index_fill(1, torch.tensor([0, 2], device=d), v)

    out = same_as_cpu(fn)
    assert out.stride() == (1, 4)
    t9 = torch.randn(3, dtype=torch.bfloat16)
    raises_at_op(lambda d: torch.sub(fn(d), t9.to(d)).view((12, -1)))
