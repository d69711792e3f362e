"""Runs PyTorch's OpInfo samples on CPU and on tpu and compares the results.

One (OpInfo, dtype, direction) gives a `Result`: "pass", "fail" (with a short
error), "unsupported" (an ATen op has no tpu kernel) or "skip" (with a reason).
Forward compares every output's dtype, shape, strides, device, values
(`torch.testing.assert_close` defaults, equal_nan=True) and aliasing with the
inputs; backward compares the inputs' gradients for one upstream gradient.
Used by tests/opinfo/test_opinfo.py and tools/op_coverage.py.
"""
import itertools
import math
import os
import re
import warnings
from dataclasses import dataclass, field

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_leaves

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Swept only when asked for (tools/op_coverage.py --dtypes complex64 complex128):
# compared with assert_close's complex defaults, forward only.
OPTIONAL_DTYPES = (torch.complex64, torch.complex128)
DEFAULT_SAMPLES = 4
# float32 matmuls run at CPU's precision: the tpu default ("medium") rounds their
# inputs to bfloat16 by design (torch_tpu/precision.py), which is not a conformance bug.
MATMUL_PRECISION = "highest"

# OpInfos whose outputs cannot match CPU's: random numbers (the tpu generator is
# Philox, CPU's is mt19937) or uninitialized memory.
_RANDOM = "random output (tpu Philox vs CPU mt19937 streams)"
_UNINIT = "output is uninitialized memory"
SKIP = {
    **{name: _RANDOM for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
        "normal", "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randn",
        "randn_like", "randint", "randint_like", "nn.functional.dropout",
        "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
        "svd_lowrank", "pca_lowrank")},
    **{name: _UNINIT for name in (
        "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
        "new_empty_strided", "resize_", "resize_as_")},
}

# Samples of otherwise deterministic OpInfos that use dropout (random).
RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0) > 0,
    "nn.functional.multi_head_attention_forward": lambda s: s.kwargs.get("training", False),
}

# Sample arguments that PyTorch requires on the CPU whatever the op's device:
# OpInfo name -> (index in sample.args, reason). They are not moved to tpu.
CPU_ARGS = {
    "tensor_split": (0, "tensor_indices_or_sections must be a CPU tensor"),
}

# Tolerance overrides: (OpInfo name, dtype) -> (atol, rtol, reason), for both
# directions; other pairs use assert_close's defaults for the dtype. Add one
# only where the tpu result is at least as close to float64 as CPU's (the
# harness labels such failures "precision").
_BF16_ONCE = "tpu rounds to bfloat16 once; CPU rounds intermediates (tpu closer to float64)"
TOLERANCES = {
    ("special.log_ndtr", torch.float32): (
        1e-4, 1e-5, "gradient in the lower tail: tpu evaluates log_ndtr in double "
                    "(error 8e-6 against float64, CPU's 3e-5)"),
    ("nn.functional.scaled_dot_product_attention", torch.float32): (
        3e-5, 1.3e-6, "fused attention kernel (attention.c): float32 sums in another order "
                      "(online softmax; dS = P (dP - rowsum(dO O))); gradient errors against "
                      "float64 on the samples at most 6.2e-5, CPU's 9e-5"),
    ("nn.functional.scaled_dot_product_attention", torch.bfloat16): (
        1e-2, 1.6e-2, "fused attention kernel: softmax, P and dS in float32, rounded to "
                      "bfloat16 once; CPU rounds every intermediate (tpu closer to float64)"),
    ("nn.functional.scaled_dot_product_attention", torch.float16): (
        1e-4, 1e-3, "fused attention kernel: softmax, P and dS in float32, rounded to float16 "
                    "once; query gradients 7.6e-5 from CPU's, both 5.9e-4 from float64"),
    ("rsqrt", torch.bfloat16): (1e-2, 1.6e-2, _BF16_ONCE),
    ("softmax", torch.bfloat16): (1e-2, 1.6e-2, _BF16_ONCE),
    ("log_softmax", torch.bfloat16): (1e-2, 1.6e-2, _BF16_ONCE),
    ("_upsample_bilinear2d_aa", torch.float32): (
        5e-5, 1.3e-6, "tpu computes the antialias weights in double (max error 1.2e-6 against "
                      "float64 on the samples), CPU's float32 path 2.1e-5"),
    ("matrix_exp", torch.float32): (
        1e-3, 5e-3, "tpu evaluates the Pade approximant in double (max error 2e-3 against "
                    "float64 on the samples), CPU's float32 Taylor evaluation is off by 5e-2"),
    ("matrix_exp", torch.complex64): (
        1e-5, 4e-6, "tpu evaluates the Pade approximant in double complex (max relative error "
                    "4.9e-8 against complex128 on the samples), CPU's complex64 Taylor "
                    "evaluation 1.5e-6"),
    ("nn.functional.cross_entropy", torch.bfloat16): (
        1e-2, 1.6e-2, "log_softmax inside: CPU rounds max + log(sum) to bfloat16 (a "
                      "log-probability of -0.0024 becomes 0), tpu rounds once"),
    ("nn.functional.layer_norm", torch.bfloat16): (2e-2, 1.6e-2, _BF16_ONCE),
    ("nn.functional.embedding", torch.bfloat16): (1e-2, 1.6e-2, _BF16_ONCE),
    ("nn.functional.ctc_loss", torch.float32): (
        2e-4, 1e-4, "gradient: tpu runs the alpha/beta recursions in double (max error 2.6e-5 "
                    "against float64 on the samples), CPU's float32 recursions 9.4e-5"),
    ("nn.functional.layer_norm", torch.float32): (
        1e-4, 1.3e-6, "weight grad of a 1-element norm: CPU's float sum leaves 3.7e-5 "
                      "where the exact value is 1e-13 (tpu accumulates in double)"),
}

# A missing kernel: the bridge's message for an op without a runtime kernel,
# and the dispatcher's for a dispatch key without one (sparse layouts).
_MISSING_RES = (
    (re.compile(r"operator '(aten::[\w.]+)' is not implemented for the tpu device"), "{0}"),
    (re.compile(r"Could not run '(aten::[\w.]+)' with arguments from the '(\w+)' backend"),
     "{0} [{1}]"),
)


@dataclass
class Result:
    status: str  # "pass" | "fail" | "unsupported" | "skip"
    detail: str = ""  # fail: "<kind>: message"; skip: reason
    missing: list = field(default_factory=list)  # ATen ops without a tpu kernel

    def to_dict(self):
        d = {"status": self.status, "detail": self.detail, "missing": self.missing}
        return {k: v for k, v in d.items() if v}


class Mismatch(AssertionError):
    """A comparison failed. kind: values, precision (values, but tpu is closer
    to float64 than CPU), dtype, shape, stride, device, alias, grad, structure, error."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def op_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = {op_name(op): op for op in op_db}


def cpu_fallback_enabled():
    v = os.environ.get("TORCH_TPU_CPU_FALLBACK", "")
    return bool(v) and v != "0"


def dtypes_for(op, optional=False):
    """The harness dtypes the OpInfo supports on CPU (with OPTIONAL_DTYPES too)."""
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES + (OPTIONAL_DTYPES if optional else ()) if d in supported]


def has_backward(op, dtype):
    return (op.supports_autograd and dtype in FLOAT_DTYPES
            and dtype in op.supported_backward_dtypes("cpu"))


# ------------------------------------------------------------------ sample copies
def _map(fn, x):
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        return type(x)(_map(fn, v) for v in x)
    return fn(x)


def _map_sample(fn, sample):
    return type(sample)(_map(fn, sample.input), args=_map(fn, sample.args),
                        kwargs=_map(fn, sample.kwargs),
                        output_process_fn_grad=sample.output_process_fn_grad)


def to_tpu(op, sample):
    """The sample on tpu: each tensor keeps its strides and storage offset, and
    tensors sharing a CPU storage share one tpu storage; "cpu" devices become "tpu"."""
    storages = {}

    def move(x):
        if isinstance(x, torch.Tensor) and x.layout != torch.strided:  # sparse: no storage
            return x.detach().to("tpu").requires_grad_(x.requires_grad)
        if isinstance(x, torch.Tensor):
            key = (x.untyped_storage().data_ptr(), x.dtype)
            if key not in storages:
                n = x.untyped_storage().nbytes() // x.element_size()
                storages[key] = x.detach().as_strided((n,), (1,), 0).to("tpu")
            t = storages[key].as_strided(x.size(), x.stride(), x.storage_offset())
            return t.requires_grad_(x.requires_grad)
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device("tpu")
        return "tpu" if isinstance(x, str) and x == "cpu" else x

    tpu_sample = _map_sample(move, sample)
    keep = CPU_ARGS.get(op_name(op), (None,))[0]
    if keep is not None and keep < len(sample.args):
        tpu_sample.args = tpu_sample.args[:keep] + (sample.args[keep],) + tpu_sample.args[keep + 1:]
    return tpu_sample


def to_float64(sample):
    """The sample with floating tensors and dtypes in float64: the reference
    that tells which of two differing low-precision results is closer to exact."""
    def up(x):
        if isinstance(x, torch.Tensor):
            return x.detach().double().requires_grad_(x.requires_grad) if x.dtype in FLOAT_DTYPES else x
        return torch.float64 if isinstance(x, torch.dtype) and x in FLOAT_DTYPES else x

    return _map_sample(up, sample)


def _inputs(sample):
    return tree_leaves((sample.input, sample.args, sample.kwargs))


# ------------------------------------------------------------------ comparing
def _storage_key(t):
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else None


def _aliases(outputs, inputs):
    """For each output tensor, the indices of the inputs sharing its storage."""
    keys = [_storage_key(t) if isinstance(t, torch.Tensor) else None for t in inputs]
    return [{i for i, k in enumerate(keys) if k is not None and k == _storage_key(o)}
            for o in outputs if isinstance(o, torch.Tensor)]


def _assert_same(actual, expected, tol, what):
    if not isinstance(expected, torch.Tensor):
        if isinstance(actual, torch.Tensor) or not (
                actual == expected or actual != actual and expected != expected):
            raise Mismatch("values", f"{what}: {actual!r} != CPU {expected!r}")
        return
    if not isinstance(actual, torch.Tensor):
        raise Mismatch("structure", f"{what}: {type(actual).__name__} where CPU returns a tensor")
    for kind, a, e in (("device", actual.device.type, "tpu"), ("dtype", actual.dtype, expected.dtype),
                       ("shape", tuple(actual.shape), tuple(expected.shape))):
        if a != e:
            raise Mismatch(kind, f"{what}: {a} != {e}")
    if expected.numel() > 1 and actual.stride() != expected.stride():
        raise Mismatch("stride", f"{what}: {actual.stride()} != CPU {expected.stride()}")
    atol, rtol = tol or (None, None)
    try:
        torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise Mismatch("values", f"{what}: " + "; ".join(lines[1:4] or lines)) from None


def _assert_all_same(actual, expected, tol, what):
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if a_spec != e_spec:
        raise Mismatch("structure", f"{what}: {a_spec} != CPU {e_spec}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        _assert_same(a, e, tol, f"{what} {i}" if len(e_leaves) > 1 else what)


def _max_error(x, ref):
    x, ref = x.detach().cpu().double(), ref.detach().double()
    same = (x == ref) | (x.isnan() & ref.isnan())
    err = torch.where(same, 0.0, (x - ref).abs().nan_to_num(nan=math.inf))
    return err.max().item() if err.numel() else 0.0


def _judge_precision(mismatch, actual, expected, reference):
    """Re-raises a values mismatch as "precision" when only floating results
    differ and each is at least as close to the float64 `reference()` as CPU's."""
    pairs = [(a, e) for a, e in zip(actual, expected) if isinstance(e, torch.Tensor)]
    if mismatch.kind != "values" or any(
            e.dtype not in FLOAT_DTYPES and not torch.equal(a.cpu(), e) for a, e in pairs):
        raise mismatch
    try:
        ref = [r for r, e in zip(reference(), expected) if isinstance(e, torch.Tensor)]
    except Exception:  # noqa: BLE001  (no float64 reference: keep the mismatch)
        raise mismatch from None
    errs = [(_max_error(a, r), _max_error(e, r)) for (a, e), r in zip(pairs, ref)
            if e.dtype in FLOAT_DTYPES]
    if errs and all(ea <= ec for ea, ec in errs):
        ea, ec = max(errs)
        raise Mismatch("precision", f"{mismatch.message} [tpu closer to float64 than CPU: "
                                    f"max error {ea:.3g} vs {ec:.3g}]") from None
    raise mismatch from None


# ------------------------------------------------------------------ running
def _summary(exc):
    if isinstance(exc, Mismatch):
        return str(exc)
    msg = " ".join(str(exc).split())
    return f"error: {type(exc).__name__}: {msg}"


def _classify(exc):
    """The Result of a sample that raised `exc` on tpu."""
    for pattern, form in _MISSING_RES:
        match = pattern.search(str(exc))
        if isinstance(exc, NotImplementedError) and match:
            missing = form.format(*match.groups())
            return Result("unsupported", f"unsupported: {missing}", [missing])
    return Result("fail", _summary(exc)[:400])


def _call(op, sample):
    out = op(sample.input, *sample.args, **sample.kwargs)
    torch.tpu.synchronize()  # queued kernel errors surface here, attributed to this op
    return out


def _outputs(op, sample):
    return tree_leaves(sample.output_process_fn_grad(_call(op, sample)))


def _cpu_then_tpu(run, sample, tpu_sample):
    """(CPU result, tpu result) of run(sample); None when both raise the same
    exception type (the sample is invalid), Mismatch when only CPU raises."""
    try:
        expected = run(sample)
    except Exception as e:  # noqa: BLE001  (CPU refuses: tpu must refuse alike)
        try:
            run(tpu_sample)
        except type(e):
            return None
        raise Mismatch("error", f"CPU raised {type(e).__name__}, tpu did not") from None
    return expected, run(tpu_sample)


def check_forward(op, sample, tol=None):
    """Runs one sample on CPU and tpu; raises on any difference."""
    # Copies first: an op may write its inputs.
    tpu_sample, ref_sample = to_tpu(op, sample), to_float64(sample)
    results = _cpu_then_tpu(lambda s: _call(op, s), sample, tpu_sample)
    if results is None:
        return
    expected, actual = results
    note = ""
    try:
        _assert_all_same(actual, expected, tol, "output")
    except Mismatch as m:
        note = _same_up_to_convention(m, sample, actual, expected, tol)
        if not note:
            _judge_precision(m, tree_leaves(actual), tree_leaves(expected),
                             lambda: tree_leaves(_call(op, ref_sample)))
    cpu_alias = _aliases(tree_leaves(expected), _inputs(sample))
    tpu_alias = _aliases(tree_leaves(actual), _inputs(tpu_sample))
    if cpu_alias != tpu_alias:
        raise Mismatch("alias", f"outputs share storage with inputs {tpu_alias}, CPU {cpu_alias}")
    return note


def _same_up_to_convention(mismatch, sample, actual, expected, tol):
    """A note when outputs that differ in values agree once the sample's
    output_process_fn_grad is applied to both, else "".

    That function is how an OpInfo states which part of a result is defined: for
    eigh/eig/svd it drops the eigen- and singular vectors' signs or phases, which
    LAPACK libraries choose differently from each other (MKL's eigh signs are not
    netlib LAPACK's either). PyTorch's own device-vs-CPU test (test_ops.py,
    test_compare_cpu) compares through it for that reason; so does this one, and
    says so in the result."""
    if mismatch.kind != "values":
        return ""
    try:
        _assert_all_same(sample.output_process_fn_grad(actual),
                         sample.output_process_fn_grad(expected), tol, "output")
    except Mismatch:
        return ""
    return f"equal after the OpInfo's output_process_fn_grad (raw: {mismatch.message[:120]})"


def _grads(outs, sample, selected, upstream):
    """Gradients of the sample's grad-requiring inputs for the `selected`
    outputs and the `upstream` gradients."""
    outs = [o for o, sel in zip(outs, selected) if sel]
    if not all(isinstance(o, torch.Tensor) and o.requires_grad for o in outs):
        raise Mismatch("grad", "an output that requires grad on CPU does not on tpu")
    ins = [x for x in _inputs(sample) if isinstance(x, torch.Tensor) and x.requires_grad]
    ups = [u.to(o.device, o.dtype) for u, o in zip(upstream, outs)]
    grads = torch.autograd.grad(outs, ins, ups, allow_unused=True)
    torch.tpu.synchronize()
    return grads


def check_backward(op, sample, tol=None):
    """Compares the inputs' gradients for one fixed upstream gradient; returns
    False when no output of the sample is differentiable."""
    tpu_sample, ref_sample = to_tpu(op, sample), to_float64(sample)
    results = _cpu_then_tpu(lambda s: _outputs(op, s), sample, tpu_sample)
    if results is None:
        return True
    outs, tpu_outs = results
    selected = [isinstance(o, torch.Tensor) and o.requires_grad for o in outs]
    if not any(selected):
        return False
    gen = torch.Generator().manual_seed(0)
    upstream = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o, s in zip(outs, selected) if s]
    expected = _grads(outs, sample, selected, upstream)
    actual = _grads(tpu_outs, tpu_sample, selected, upstream)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            raise Mismatch("grad", f"input {i}: gradient {'None' if a is None else 'set'} on tpu, "
                                   f"{'None' if e is None else 'set'} on CPU")
    try:
        _assert_all_same([a for a in actual if a is not None],
                         [e for e in expected if e is not None], tol, "grad")
    except Mismatch as m:
        _judge_precision(m, actual, expected, lambda: _grads(
            _outputs(op, ref_sample), ref_sample, selected, upstream))
    return True


def samples(op, dtype, requires_grad, limit):
    torch.manual_seed(0)  # sample generators draw from the global generator
    random = RANDOM_SAMPLES.get(op_name(op), lambda s: False)
    gen = (s for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad) if not random(s))
    return itertools.islice(gen, limit)


def _combine(results):
    """One Result from per-sample ones: any failure, else any unsupported op, else pass."""
    missing = sorted({m for r in results for m in r.missing})
    for status in ("fail", "unsupported"):
        first = next((r for r in results if r.status == status), None)
        if first:
            return Result(status, first.detail, missing)
    noted = [r.detail for r in results if r.detail]
    return Result("pass", f"{len(noted)} of {len(results)} samples {noted[0]}" if noted else "")


def _check_sample(op, sample, backward, tol):
    """The Result of one sample; None when a backward sample has no differentiable output."""
    try:
        if backward:
            return Result("pass") if check_backward(op, sample, tol) else None
        return Result("pass", check_forward(op, sample, tol))
    except Exception as e:  # noqa: BLE001  (every failure becomes a result)
        try:
            torch.tpu.synchronize()  # drop an error left by this sample's queued work
        except Exception:  # noqa: BLE001
            pass
        return _classify(e)


def run_direction(op, dtype, backward, limit=DEFAULT_SAMPLES):
    """The Result of one (OpInfo, dtype, direction)."""
    name = op_name(op)
    if name in SKIP:
        return Result("skip", SKIP[name])
    if backward and not has_backward(op, dtype):
        return Result("skip", "not differentiable for this dtype")
    tol = TOLERANCES.get((name, dtype))
    tol = tol and tol[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.tpu.TpuPerformanceWarning)  # "highest" is slower
        with torch.tpu.precision(MATMUL_PRECISION):
            try:
                results = [r for s in samples(op, dtype, backward, limit)
                           if (r := _check_sample(op, s, backward, tol))]
            except Exception as e:  # noqa: BLE001  (the sample generator itself failed on CPU)
                return Result("skip", f"sample inputs failed on CPU: {_summary(e)[:200]}")
    if not results:
        return Result("skip", "no differentiable samples" if backward else "no samples")
    return _combine(results)
