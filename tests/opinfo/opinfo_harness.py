"""Runs PyTorch's OpInfo samples on CPU and on tpu and compares the results.

One (OpInfo, dtype, direction) gives a `Result`: "pass", "fail" (with a short
error), "unsupported" (an ATen op has no tpu kernel) or "skip" (with a reason).
Forward compares every output's dtype, shape, strides, device, values
(`torch.testing.assert_close` defaults, equal_nan=True) and aliasing with the
inputs; backward compares the inputs' gradients for one upstream gradient.
Used by tests/opinfo/test_opinfo.py and tools/op_coverage.py.
"""
import itertools
import os
import re
from dataclasses import dataclass, field

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_leaves

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_SAMPLES = 4

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

# Tolerance overrides: (OpInfo name, dtype) -> (atol, rtol, reason). The
# defaults are assert_close's for the dtype.
TOLERANCES = {}

_MISSING_RE = re.compile(r"operator '(aten::[\w.]+)' is not implemented for the tpu device")


@dataclass
class Result:
    status: str  # "pass" | "fail" | "unsupported" | "skip"
    detail: str = ""  # fail: "<kind>: message"; skip: reason
    missing: list = field(default_factory=list)  # ATen ops without a tpu kernel

    def to_dict(self):
        return {"status": self.status, "detail": self.detail, "missing": self.missing}


class Mismatch(AssertionError):
    """A comparison failed; `kind` is values/dtype/shape/stride/device/alias/grad/structure."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")


def op_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = {op_name(op): op for op in op_db}


def cpu_fallback_enabled():
    v = os.environ.get("TORCH_TPU_CPU_FALLBACK", "")
    return bool(v) and v != "0"


def dtypes_for(op):
    """The harness dtypes the OpInfo supports on CPU."""
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


def has_backward(op, dtype):
    return (op.supports_autograd and dtype in FLOAT_DTYPES
            and dtype in op.supported_backward_dtypes("cpu"))


# ------------------------------------------------------------------ moving inputs
def _to_tpu(x, memo):
    """Copies x to tpu keeping each tensor's strides and storage offset, and
    keeping tensors that share a CPU storage sharing one tpu storage."""
    if isinstance(x, torch.Tensor):
        key = (x.untyped_storage().data_ptr(), x.dtype)
        if key not in memo:
            n = x.untyped_storage().nbytes() // x.element_size()
            memo[key] = x.detach().as_strided((n,), (1,), 0).to("tpu")
        t = memo[key].as_strided(x.size(), x.stride(), x.storage_offset())
        return t.requires_grad_(x.requires_grad)
    if isinstance(x, torch.device) and x.type == "cpu" or x == "cpu":
        return torch.device("tpu") if isinstance(x, torch.device) else "tpu"
    if isinstance(x, dict):
        return {k: _to_tpu(v, memo) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_tpu(v, memo) for v in x)
    return x


def to_tpu(sample):
    memo = {}
    return type(sample)(
        _to_tpu(sample.input, memo), args=_to_tpu(sample.args, memo),
        kwargs=_to_tpu(sample.kwargs, memo), output_process_fn_grad=sample.output_process_fn_grad)


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
    if expected.numel() > 1 and not expected.is_sparse and actual.stride() != expected.stride():
        raise Mismatch("stride", f"{what}: {actual.stride()} != CPU {expected.stride()}")
    atol, rtol = tol if tol else (None, None)
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


# ------------------------------------------------------------------ running
def _summary(exc):
    if isinstance(exc, Mismatch):
        return str(exc)
    msg = " ".join(str(exc).split())
    return f"error: {type(exc).__name__}: {msg}"


def _classify(exc):
    """The Result of a sample that raised `exc` on tpu."""
    missing = _MISSING_RE.findall(str(exc))
    if isinstance(exc, NotImplementedError) and missing:
        return Result("unsupported", f"unsupported: {missing[0]}", missing[:1])
    return Result("fail", _summary(exc)[:300])


def _run(op, sample):
    out = op(sample.input, *sample.args, **sample.kwargs)
    torch.tpu.synchronize()  # queued kernel errors surface here, attributed to this op
    return out


def check_forward(op, sample, tol=None):
    """Runs one sample on CPU and tpu; raises on any difference."""
    tpu_sample = to_tpu(sample)  # before the CPU run: an op may write its inputs
    try:
        expected = op(sample.input, *sample.args, **sample.kwargs)
    except Exception as e:  # CPU refuses: tpu must refuse with the same type
        try:
            _run(op, tpu_sample)
        except type(e):
            return
        raise Mismatch("error", f"CPU raised {type(e).__name__}, tpu did not") from None
    actual = _run(op, tpu_sample)
    _assert_all_same(actual, expected, tol, "output")
    cpu_alias = _aliases(tree_leaves(expected), _inputs(sample))
    tpu_alias = _aliases(tree_leaves(actual), _inputs(tpu_sample))
    if cpu_alias != tpu_alias:
        raise Mismatch("alias", f"outputs share storage with inputs {tpu_alias}, CPU {cpu_alias}")


def check_backward(op, sample, tol=None):
    """Compares the gradients of the inputs for one fixed upstream gradient;
    returns False when no output of the sample is differentiable."""
    tpu_sample = to_tpu(sample)
    expected = sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))
    actual = tpu_sample.output_process_fn_grad(_run(op, tpu_sample))
    pairs = [(e, a) for e, a in zip(tree_leaves(expected), tree_leaves(actual))
             if isinstance(e, torch.Tensor) and e.requires_grad]
    if not pairs:
        return False
    if not all(isinstance(a, torch.Tensor) and a.requires_grad for _, a in pairs):
        raise Mismatch("grad", "a tpu output does not require grad")
    gen = torch.Generator().manual_seed(0)
    ups = [torch.randn(e.shape, generator=gen, dtype=e.dtype) for e, _ in pairs]
    ins = [(c, t) for c, t in zip(_inputs(sample), _inputs(tpu_sample))
           if isinstance(c, torch.Tensor) and c.requires_grad]
    grads = lambda outs, xs, us: torch.autograd.grad(outs, xs, us, allow_unused=True)  # noqa: E731
    g_cpu = grads([e for e, _ in pairs], [c for c, _ in ins], ups)
    g_tpu = grads([a for _, a in pairs], [t for _, t in ins], [u.to("tpu") for u in ups])
    torch.tpu.synchronize()
    for i, (gc, gt) in enumerate(zip(g_cpu, g_tpu)):
        if (gc is None) != (gt is None):
            raise Mismatch("grad", f"input {i}: gradient is {gt is None and 'None' or 'set'} "
                                   f"on tpu, {gc is None and 'None' or 'set'} on CPU")
        if gc is not None:
            _assert_same(gt, gc, tol, f"grad of input {i}")
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
    if not results:
        return Result("skip", "no samples")
    return Result("pass")


def run_direction(op, dtype, backward, limit=DEFAULT_SAMPLES):
    """The Result of one (OpInfo, dtype, direction)."""
    name = op_name(op)
    if name in SKIP:
        return Result("skip", SKIP[name])
    if backward and not has_backward(op, dtype):
        return Result("skip", "not differentiable for this dtype")
    tol = TOLERANCES.get((name, dtype), (None, None, ""))[:2]
    tol = tol if tol[0] is not None else None
    results = []
    try:
        for sample in samples(op, dtype, backward, limit):
            try:
                if backward:
                    if not check_backward(op, sample, tol):
                        continue
                else:
                    check_forward(op, sample, tol)
                results.append(Result("pass"))
            except Exception as e:  # noqa: BLE001  (every failure becomes a result)
                results.append(_classify(e))
                try:
                    torch.tpu.synchronize()  # drop an error left by this sample's queued work
                except Exception:  # noqa: BLE001
                    pass
    except Exception as e:  # noqa: BLE001  (the sample generator itself failed on CPU)
        return Result("skip", f"sample inputs failed on CPU: {_summary(e)[:200]}")
    if not results:
        return Result("skip", "no differentiable samples" if backward else "no samples")
    return _combine(results)
