"""PyTorch's OpInfo samples on tpu against CPU, for a representative subset of
OpInfos in float32 and bfloat16 (forward and backward). The full sweep over
every OpInfo and dtype is `tools/op_coverage.py` (docs/op_coverage.md)."""
import pytest
import torch

import opinfo_harness as h

SUBSET = [
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "pow", "neg", "abs", "exp", "log",
    "log1p", "sqrt", "rsqrt", "erf", "sigmoid", "tanh", "clamp", "maximum", "eq", "lt", "where",
    "masked_fill", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.leaky_relu", "nn.functional.softplus", "nn.functional.hardtanh",
    "softmax", "log_softmax", "logsumexp", "sum", "mean", "prod", "amax", "amin", "argmax",
    "max.reduction_with_dim", "var", "std", "cumsum", "sort", "topk",
    "matmul", "mm", "bmm", "addmm", "baddbmm", "nn.functional.linear",
    "nn.functional.scaled_dot_product_attention",
    "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.one_hot",
    "cat", "stack", "split", "index_select", "gather", "scatter", "scatter_add", "index_put",
    "__getitem__", "triu", "tril", "transpose", "permute", "reshape", "view", "expand",
    "flatten", "squeeze", "unsqueeze", "narrow", "flip", "roll", "repeat", "clone", "to",
    "zeros_like", "full_like", "arange",
]

# (OpInfo, dtype) -> reason for the pairs that fail today. xfail is strict: a
# fix makes the test fail as XPASS until its entry is removed here.
KNOWN_FAILURES = {
}


# OpInfo samples use deprecated arguments on purpose (scatter's reduce=).
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _params():
    for name in SUBSET:
        op = h.OPS[name]
        for dtype in (torch.float32, torch.bfloat16):
            if dtype not in h.dtypes_for(op):
                continue
            reason = KNOWN_FAILURES.get((name, dtype))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}")


@pytest.fixture(autouse=True, scope="module")
def _no_cpu_fallback():
    if h.cpu_fallback_enabled():
        pytest.fail("TORCH_TPU_CPU_FALLBACK is set: ops would run on the CPU and pass untested")


@pytest.mark.parametrize("name,dtype", list(_params()))
def test_opinfo(name, dtype):
    op = h.OPS[name]
    results = {d: h.run_direction(op, dtype, backward=d == "backward") for d in ("forward", "backward")}
    failed = {d: r.detail for d, r in results.items() if r.status in ("fail", "unsupported")}
    assert not failed, failed
    if all(r.status == "skip" for r in results.values()):
        pytest.skip(results["forward"].detail)
