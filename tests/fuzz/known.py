"""Explained differences: mismatches the fuzzer counts as known rather than as failures.

Each entry is already reported (issue 13, or the fuzzer's report on it: group G<n>) and says
why tpu differs. An entry matches on the mismatch kind, the op of the line (the fuzzer's short
op name, None: any), the modes (None: all) and a substring of the detail (None: any). Keep the
table small and delete an entry once its difference is fixed (the fuzzer then checks it again);
a bug that is not reported yet does not belong here.
"""

KNOWN = [
    # kind, op, modes, detail substring, reason
    # (the fuzz report's groups G1-G14 and the issue 13 entries are fixed; see
    # tests/test_fuzz_findings.py)
    ("compile_error", "compile", ("compile",), "[aot_eager on cpu: the same]",
     "PyTorch's compile stack raises it on CPU too (torch.compile(backend='aot_eager'), checked "
     "by the worker): fake-tensor decompositions refusing what eager accepts (log_softmax of an "
     "empty bool tensor, seed 15040; roll of an empty tensor along an absent dim, seed 15634)"),
    ("value", None, ("compile",), "[aot_eager on cpu: the same]",
     "PyTorch's compile stack gives that value on CPU too (aot_eager, checked by the worker): "
     "writes through expanded views (zero_ of an expand of an input, seed 4160; setitem into "
     "an expanded tensor, seed 22930) are not replayed by functionalization as eager runs them"),
    ("value", "gelu", None, "tpu inf cpu nan",
     "CPU's float32 gelu gives NaN at +inf (its vectorized erf; float64 and the tanh form give "
     "inf, the limit): a CPU kernel defect, tpu keeps the limit (seed 59570)"),
    ("value", "prod", None, "0.0 cpu nan",
     "CPU's float prod multiplies in vector lanes: when the running product underflows to 0 in "
     "some lanes and overflows to inf in others, combining the lanes gives 0 * inf = NaN, though "
     "no input is NaN. tpu multiplies in order as CPU's cumprod does (its last element) and gets "
     "0 or inf (seed 94460: the log of the product is -12699, cumprod ends at 0, checked)"),
    ("value", "prod", None, "inf cpu nan",
     "as the entry above, with the in-order product overflowing to +-inf"),
    ("value", None, None, "[cpu on tpu's inputs: the same]",
     "the op is right: CPU's op run on tpu's inputs to that line gives tpu's value, and those "
     "inputs matched CPU's within tolerance; the op amplifies an earlier last-ulp difference "
     "(cos of an L1 norm near 4e4, seed 135027; a float16 cumsum crossing 65504, seed 180847; "
     "checked by the worker, tests/fuzz/worker.py explain_value)"),
    ("value", None, None, "[tpu agrees with cpu in float64]",
     "tpu's value is CPU's op computed in float64 (on CPU's inputs, cast back) and CPU's own "
     "float kernel is further off: a float32 L1 vector_norm over 38458 elements, CPU 69431 or "
     "69405 (by thread count), float64 and tpu 69412.39 (seed 161525; checked by the worker)"),
]


def explained(m, mode):
    """the reason string when mismatch m (a worker's dict) is a known difference, else None"""
    for kind, op, modes, sub, reason in KNOWN:
        if m["kind"] == kind and (op is None or m["op"] == op) and (modes is None or mode in modes) \
                and (sub is None or sub in m["detail"]):
            return reason
    return None
