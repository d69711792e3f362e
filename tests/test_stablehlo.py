"""torch_tpu.export_stablehlo: the text parses with the MLIR/StableHLO bindings that ship in
jaxlib (a test-only dependency, pinned in scripts/setup.sh), and jax's CPU client, running
the module on the same inputs, gives PyTorch CPU's numbers.

Tolerances: XLA's CPU backend computes float32 dot_general in float32 whatever the
precision_config says (DEFAULT here: the 'medium' tpu precision is for TPUs, where DEFAULT
means one bfloat16 pass), so the exported module is compared with PyTorch CPU's float32
results at float32 tolerances (summation order only)."""
import copy
import glob
import os
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

try:
    import jax
    import jax.extend  # noqa: F401
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax, xla_client
    from jax._src.lib.mlir import ir
except ImportError as exc:  # scripts/setup.sh installs it; only a bare venv lacks it
    pytest.skip(f"jaxlib is not importable ({exc}); scripts/setup.sh installs the pinned "
                f"jax/jaxlib used to parse and run the exported StableHLO",
                allow_module_level=True)

jax.config.update("jax_enable_x64", True)  # int64 parameters stay int64


def parse(text):
    return ir.Module.parse(str(text), context=mlir.make_ir_context())


def dumped_modules(directory):
    """The texts of the graphs dump_graphs wrote into directory (at least one), each
    checked to parse."""
    files = sorted(glob.glob(os.path.join(directory, "*.stablehlo.mlir")))
    assert files
    texts = []
    for path in files:
        with open(path) as f:
            texts.append(f.read())
        parse(texts[-1])
    return texts


def run_on_jax_cpu(exported, params=None):
    """Compiles the module with jax's CPU client and runs it on the exported parameters
    (or `params`, CPU tensors); returns the results as numpy arrays."""
    module = parse(exported)
    backend = jax.extend.backend.get_backend("cpu")
    dev = backend.devices()[0]
    exe = backend.compile_and_load(mlir.module_to_bytecode(module), _jax.DeviceList((dev,)),
                                   xla_client.CompileOptions())
    if params is None:
        assert all(p is not None for p in exported.parameters), exported.parameters
        params = [p.cpu() for p in exported.parameters]
    args = [jax.device_put(p.contiguous().numpy(), dev) for p in params]
    return [np.asarray(r) for r in exe.execute(args)]


def check(fn_tpu, fn_cpu, *args, rtol=1e-5, atol=1e-5):
    """Exports fn_tpu on tpu copies of args, runs it on jax CPU, compares each output with
    fn_cpu(*args)."""
    exported = torch_tpu.export_stablehlo(fn_tpu, *[a.to("tpu") for a in args])
    assert exported.custom_calls == [], exported.custom_calls
    assert "stablehlo.custom_call" not in exported
    results = run_on_jax_cpu(exported)
    expected = fn_cpu(*args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(exported.outputs) == len(expected)
    for want, k in zip(expected, exported.outputs):
        assert k is not None
        got = results[k]
        # a result is the output's buffer: same elements in row-major order
        assert got.size == want.numel()
        np.testing.assert_allclose(got.reshape(want.shape), want.detach().numpy(),
                                   rtol=rtol, atol=atol)
    return exported


def module_pair(make):
    torch.manual_seed(0)
    cpu = make().eval()
    return copy.deepcopy(cpu).to("tpu"), cpu


def test_linear_relu_parameters_are_inputs():
    tpu, cpu = module_pair(lambda: nn.Linear(8, 4))
    x = torch.randn(2, 8)
    with torch.tpu.precision("medium"):  # whatever earlier tests left global
        exported = check(lambda t: torch.relu(tpu(t)), lambda t: torch.relu(cpu(t)), x)
    text = str(exported)
    assert text.lstrip().split("\n", 1)[1].startswith("module @tpu_graph")
    assert '"stablehlo.dot_general"' in text and "lhs_contracting_dimensions = [1]" in text
    assert "precision_config = [#stablehlo<precision DEFAULT>" in text
    # the weights are parameters, not constants: input, weight (4x8, transposed in the
    # graph) and bias
    sig = text[text.index("func.func @main("):text.index(") -> (")]
    assert sig.count("%arg") == 3
    assert "tensor<4x8xf32>" in sig and "tensor<4xf32>" in sig and "tensor<2x8xf32>" in sig
    assert '"stablehlo.transpose"' in text
    assert "dense<" not in text.split("stablehlo.dot_general")[0].split("func.func")[1]


def test_mlp_with_gelu():
    tpu, cpu = module_pair(lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8),
                                                 nn.GELU(approximate="tanh")))
    exported = check(tpu, cpu, torch.randn(3, 8))
    assert '"chlo.erf"' in exported and '"stablehlo.tanh"' in exported


def test_softmax_and_log_softmax():
    f = lambda x: (torch.softmax(x, -1), torch.log_softmax(x, 0), F.softmax(x * 3, dim=1))
    exported = check(f, f, torch.randn(4, 6))
    assert '"stablehlo.reduce"' in exported and '"stablehlo.exponential"' in exported


def test_layer_norm():
    tpu, cpu = module_pair(lambda: nn.LayerNorm(16))
    check(tpu, cpu, torch.randn(2, 3, 16))
    f = lambda x: F.layer_norm(x, (3, 16), eps=1e-3)
    check(f, f, torch.randn(2, 3, 16))


def test_reductions():
    f = lambda x: (x.sum(), x.sum(1, keepdim=True), x.mean((0, 2)), x.amax(-1), x.amin(0),
                   x.max(), x.prod(2))
    exported = check(f, f, torch.randn(3, 4, 5))
    assert "stablehlo.maximum" in exported and "stablehlo.minimum" in exported


def test_elementwise_compare_select_convert():
    def f(x, y):
        m = x > y
        return (torch.where(m, x, y * 2), (x - y).abs().sqrt(), m.to(torch.float32),
                torch.clamp(x, -0.5, 0.5), x.masked_fill(m, 3.0), (x * 10).to(torch.int64),
                torch.exp(x) / (1 + torch.sigmoid(y)), torch.rsqrt(y.abs() + 1), x.sign())
    check(f, f, torch.randn(4, 5), torch.randn(4, 5))


def test_matmul_with_broadcasting():
    f = lambda a, b: torch.matmul(a, b)
    check(f, f, torch.randn(2, 3, 4, 5), torch.randn(5, 6))
    exported = check(f, f, torch.randn(3, 4, 5), torch.randn(2, 1, 5, 6))
    assert "lhs_batching_dimensions = [0]" in exported
    g = lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2.0) + a @ b
    check(g, g, torch.randn(3, 5), torch.randn(5, 2), torch.randn(2))


def test_views_slices_cat():
    def f(x, y):
        z = torch.cat([x[:, 1:3], y.t()[:, :2], x[:, ::2][:, :2]], dim=1)
        return z.reshape(2, -1).transpose(0, 1) * 2, x.unsqueeze(0).expand(3, 4, 6) + 1
    check(f, f, torch.randn(4, 6), torch.randn(5, 4))


class Attention(nn.Module):
    """A causal self-attention block as in GPT: pre-norm, fused qkv, heads, residual."""

    def __init__(self, C=16, H=2):
        super().__init__()
        self.H = H
        self.ln = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.H) ** 0.5)
        mask = torch.tril(torch.ones(T, T, device=x.device)).view(1, 1, T, T)
        att = torch.softmax(att.masked_fill(mask == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return x + self.proj(y)


def test_attention_block():
    tpu, cpu = module_pair(Attention)
    exported = check(tpu, cpu, torch.randn(2, 5, 16))
    assert exported.count('"stablehlo.dot_general"') >= 4
    assert '"stablehlo.iota"' in exported  # the causal mask


def test_live_tensors_without_memory_are_skipped():
    """A tpu tensor with no memory of its own (a functional wrapper or fake tensor that some
    earlier trace left alive) is not a parameter candidate: export still finds the real one."""
    x = torch.randn(16, device="tpu")
    wrapper = torch._to_functional_tensor(torch.ones(16, device="tpu"))
    with pytest.raises(RuntimeError):
        wrapper.untyped_storage().data_ptr()
    # the wrapper comes first among the example arguments, so it is looked at first
    exported = torch_tpu.export_stablehlo(lambda w, t: t * 2 + 1, wrapper, x)
    assert exported.parameters[0] is not None
    assert exported.parameters[0].data_ptr() == x.data_ptr()
    (got,) = run_on_jax_cpu(exported)
    np.testing.assert_allclose(got, (x.cpu() * 2 + 1).numpy(), rtol=1e-6)


def test_unmapped_op_is_a_reported_custom_call():
    x = torch.randn(4, 3, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        exported = torch_tpu.export_stablehlo(lambda t: torch.special.airy_ai(t) * 2, x)
    assert exported.custom_calls == ["aten.special_airy_ai"]
    assert any("aten.special_airy_ai" in str(m.message) and "custom_call" in str(m.message) for m in w)
    module = parse(exported)  # still valid: the custom call has its operand and result types
    text = str(module)
    assert re.search(r"stablehlo.custom_call @aten.special_airy_ai\(%arg0\).*"
                     r"\(tensor<4x3xf32>\) -> tensor<4x3xf32>", text), text
    assert "tpu.custom_calls" in text


def test_in_place_updates_are_results():
    def g(x):
        x.add_(1)
        x[0].mul_(3)
        return x * 2
    x0 = torch.randn(3, 4)
    exported = torch_tpu.export_stablehlo(g, x0.to("tpu"))
    assert '"stablehlo.dynamic_update_slice"' in exported
    # the input's buffer now holds fn's update: it is a result as well as the output
    results = run_on_jax_cpu(exported, params=[x0])
    assert len(results) == 2
    x_ref = x0.clone()
    out = g(x_ref)
    np.testing.assert_allclose(results[exported.outputs[0]], out.numpy(), rtol=1e-6)
    mutated = [k for k in range(2) if k != exported.outputs[0]][0]
    np.testing.assert_allclose(results[mutated], x_ref.numpy(), rtol=1e-6)


def test_precision_is_recorded():
    a, b = torch.randn(4, 8, device="tpu"), torch.randn(8, 3, device="tpu")
    with torch.tpu.precision("highest"):
        text = torch_tpu.export_stablehlo(torch.mm, a, b)
    assert "#stablehlo<precision HIGHEST>" in text
    with torch.tpu.precision("medium"):
        text = torch_tpu.export_stablehlo(torch.mm, a, b)
    assert "#stablehlo<precision DEFAULT>" in text


def test_dumped_graphs_use_the_same_printer(tmp_path):
    """torch_tpu.debug.dump_graphs writes the same modules, and they parse."""
    tpu, cpu = module_pair(lambda: nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)))
    x = torch.randn(4, 8, device="tpu")
    with torch_tpu.eager_mode("defer_and_fuse"):
        torch_tpu.debug.dump_graphs(tmp_path)
        try:
            y = tpu(x)
            y.sum().item()
        finally:
            torch_tpu.debug.dump_graphs(None)
    for text in dumped_modules(tmp_path):
        assert "func.func @main(" in text


def test_backward_and_loss_ops():
    """Training graphs' ops: gelu/tanh/sigmoid/threshold/softmax backward, nll loss forward and
    backward, embedding backward, layer norm backward."""
    aten = torch.ops.aten

    def f(g, x, w, b, y, t, idx, tw):
        sm = torch.softmax(x, -1)
        lsm = torch.log_softmax(x, -1)
        out, mean, rstd = aten.native_layer_norm(x, [6], w, b, 1e-5)
        return (aten.gelu_backward(g, x), aten.gelu_backward(g, x, approximate="tanh"),
                aten.tanh_backward(g, torch.tanh(x)), aten.sigmoid_backward(g, torch.sigmoid(x)),
                aten.threshold_backward(g, x, 0.0),
                aten._softmax_backward_data(g, sm, 1, torch.float32),
                aten._log_softmax_backward_data(g, lsm, 1, torch.float32),
                F.cross_entropy(x, t), F.nll_loss(lsm, t, weight=w.abs(), reduction="sum"),
                aten.nll_loss_backward(y, lsm, t, None, 1, -100, tw),
                aten.embedding_dense_backward(g[:, :5], idx, 7, -1, False),
                *aten.native_layer_norm_backward(g, x, [6], mean, rstd, w, b, [True, True, True]))
    torch.manual_seed(0)
    args = (torch.randn(4, 6), torch.randn(4, 6), torch.randn(6), torch.randn(6), torch.tensor(1.5),
            torch.tensor([0, 5, 2, 2]), torch.tensor([1, 6, 1, 0]), torch.tensor(4.0))
    check(f, f, *args, rtol=1e-4, atol=1e-5)


def test_gpt_forward_loss_and_training_graphs_parse(tmp_path):
    """The example GPT's forward loss exports as pure StableHLO and matches CPU; every graph of
    a DeferAndFuse training step (forward, backward, AdamW) parses."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    from train_gpt import GPT
    torch.manual_seed(0)
    cpu = GPT(65, block_size=16, n_layer=2, n_embd=32, n_head=4).eval()
    tpu = copy.deepcopy(cpu).to("tpu")
    idx = torch.randint(0, 65, (2, 16))
    check(lambda i: tpu(i, i)[1], lambda i: cpu(i, i)[1], idx, rtol=1e-4, atol=1e-5)

    opt = torch.optim.AdamW(tpu.parameters(), lr=1e-3)
    i = idx.to("tpu")
    with torch_tpu.eager_mode("defer_and_fuse"):
        torch_tpu.debug.dump_graphs(tmp_path)
        try:
            for _ in range(2):
                _, loss = tpu(i, i)
                opt.zero_grad()
                loss.backward()
                opt.step()
            loss.item()
        finally:
            torch_tpu.debug.dump_graphs(None)
    for text in dumped_modules(tmp_path):
        assert "tpu.custom_calls" not in text, re.search(r"tpu.custom_calls = \[[^\]]*\]", text)


def test_bf16_autocast_linear():
    """Under bf16 autocast the matmul takes bf16 operands, accumulates in f32 (dot_general's
    result type) and rounds once with the bias, as PyTorch CPU does: results agree within one
    bf16 ulp (f32 summation order may move a rounding)."""
    tpu, cpu = module_pair(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))

    def run(model, device):
        def f(x):
            with torch.autocast(device, dtype=torch.bfloat16):
                return model(x).float()
        return f
    exported = check(run(tpu, "tpu"), run(cpu, "cpu"), torch.randn(5, 8), rtol=2 ** -7, atol=1e-3)
    assert "xbf16>" in exported and "tensor<5x16xf32>" in exported


def test_convolution():
    tpu, cpu = module_pair(lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                                 nn.Conv2d(8, 4, 3, stride=2, groups=2, dilation=1),
                                                 nn.Flatten(), nn.Linear(4 * 3 * 3, 5)))
    exported = check(tpu, cpu, torch.randn(2, 3, 8, 8), rtol=1e-4, atol=1e-5)
    assert exported.count('"stablehlo.convolution"') == 2
    c1 = nn.Conv1d(4, 6, 5, padding=2, dilation=1).eval()
    c1t = copy.deepcopy(c1).to("tpu")
    check(c1t, c1, torch.randn(3, 4, 10), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), divisor_override=5),
])
def test_avg_pool2d(kw):
    """avg_pool2d becomes a reduce_window sum divided by each window's count (explicit
    padding counted only with count_include_pad, ceil mode's overhang never)."""
    x = torch.randn(2, 3, 9, 9)
    exported = check(lambda t: F.avg_pool2d(t, **kw), lambda t: F.avg_pool2d(t, **kw), x)
    assert '"stablehlo.reduce_window"' in exported


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, dilation=2),
])
def test_max_pool2d_values_and_indices(kw):
    x = torch.randn(2, 3, 9, 9)
    exported = check(lambda t: F.max_pool2d(t, return_indices=True, **kw),
                     lambda t: F.max_pool2d(t, return_indices=True, **kw), x)
    assert exported.count('"stablehlo.reduce_window"') == 1
    # ties: the first element of the window in row-major order, as PyTorch picks it
    xi = torch.randint(0, 3, (2, 3, 8, 8)).float()
    check(lambda t: F.max_pool2d(t, return_indices=True, **kw),
          lambda t: F.max_pool2d(t, return_indices=True, **kw), xi)


def test_cnn_with_batch_norm_and_pooling_has_no_custom_calls():
    tpu, cpu = module_pair(lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 3 * 3, 10)))
    check(tpu, cpu, torch.randn(2, 3, 16, 16), rtol=1e-4, atol=1e-5)


def test_batch_norm_training_updates_running_stats():
    """In training mode the module's running statistics (and its batch counter) are written:
    they are results of the module, with the values PyTorch CPU leaves in them."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4, momentum=0.2)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    bt = copy.deepcopy(bn).to("tpu")
    # exporting runs the module on tpu (updating bt's statistics): feed jax the values
    # from before, as the module saw them
    before = {t.data_ptr(): t.cpu().clone() for t in bt.buffers()}
    x = torch.randn(3, 4, 5, 5)
    exported = torch_tpu.export_stablehlo(bt, x.to("tpu"))
    assert exported.custom_calls == []
    params = [before.get(p.data_ptr(), p.cpu()) for p in exported.parameters]
    results = run_on_jax_cpu(exported, params)
    want = bn(x)  # updates bn's running stats
    torch.testing.assert_close(bt.running_mean.cpu(), bn.running_mean)  # the eager run too
    got = results[exported.outputs[0]]
    np.testing.assert_allclose(got.reshape(want.shape), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    stats = [r for r in results if r.shape == (4,)]
    assert len(stats) == 2
    for ref in (bn.running_mean, bn.running_var):
        assert any(np.allclose(r, ref.numpy(), rtol=1e-5, atol=1e-6) for r in stats), (stats, ref)
    assert any(r.shape == () and int(r) == 1 for r in results)  # num_batches_tracked


def _mapped_cases():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    x[0, 1] = x[0, 4] = 3.0  # a tie for argmax / max.dim: the first index wins
    xn = x.clone()
    xn[1, 2] = xn[1, 5] = float("nan")  # NaN wins, the first one
    xi = torch.randint(-3, 4, (4, 6))
    return {
        "leaky_relu": (lambda t: F.leaky_relu(t, 0.2), x), "elu": (lambda t: F.elu(t, 0.7), x),
        "selu": (F.selu, x), "celu": (lambda t: F.celu(t, 1.3), x),
        "hardswish": (F.hardswish, x), "hardsigmoid": (F.hardsigmoid, x),
        "hardtanh": (lambda t: F.hardtanh(t, -0.5, 0.7), x), "relu6": (F.relu6, x),
        "softplus": (lambda t: F.softplus(t, 2, 1), x), "mish": (F.mish, x),
        "isneginf": (lambda t: torch.isneginf(t.log()), x),
        "isposinf": (lambda t: torch.isposinf(1 / (t * 0)), x),
        "isinf": (lambda t: torch.isinf(t.log()), x),
        "remainder": (lambda t: torch.remainder(t * 3, 2), x),
        "remainder_tensor": (lambda t: torch.remainder(t * 3, t.abs() + 0.5), x),
        "flip": (lambda t: t.flip(0, 1), x),
        "var": (lambda t: t.var(1), x), "std": (lambda t: t.std(), x),
        "var_mean": (lambda t: torch.var_mean(t, 0, correction=0, keepdim=True), x),
        "std_mean": (lambda t: torch.std_mean(t, (0, 1)), x),
        "logsumexp": (lambda t: t.logsumexp(1), x),
        "logsumexp_inf": (lambda t: torch.cat([t, t.log()]).logsumexp(1), x),
        "norm2": (lambda t: t.norm(dim=1), x),
        "norm1": (lambda t: torch.linalg.vector_norm(t, 1), x),
        "norm3": (lambda t: torch.linalg.vector_norm(t, 3, dim=0, keepdim=True), x),
        "norm_inf": (lambda t: torch.linalg.vector_norm(t, float("inf"), dim=1), x),
        "any": (lambda t: (t > 1).any(1), x), "all": (lambda t: (t > -3).all(), x),
        "any_int": (lambda t: t.any(), xi),
        "argmax": (lambda t: t.argmax(1), x), "argmin": (lambda t: t.argmin(), x),
        "max_dim": (lambda t: t.max(1), x), "min_dim": (lambda t: t.min(0, keepdim=True), x),
        "argmax_nan": (lambda t: t.argmax(1), xn), "max_dim_nan": (lambda t: t.max(1), xn),
        "argmax_int": (lambda t: t.argmax(1), xi),
        "cumsum": (lambda t: t.cumsum(1), x), "cumprod": (lambda t: t.cumprod(0), x),
        "cumsum_int": (lambda t: t.cumsum(0), xi),
        "mse_mean": (lambda t: F.mse_loss(t, t * 0.5 + 1), x),
        "mse_sum": (lambda t: F.mse_loss(t, t * 2, reduction="sum"), x),
        "mse_none": (lambda t: F.mse_loss(t, t.flip(0), reduction="none"), x),
        "logsigmoid": (F.logsigmoid, x * 5),
        "log_sigmoid_forward": (lambda t: torch.ops.aten.log_sigmoid_forward(t), x * 5),
        "bce_with_logits": (lambda t: F.binary_cross_entropy_with_logits(t, (t > 0).float()), x),
    }


@pytest.mark.parametrize("name", list(_mapped_cases()))
def test_more_mapped_ops(name):
    """Activations, remainder, flip, variance/std, logsumexp, vector norms, any/all,
    argmax/argmin and max/min over a dim (ties and NaN: the first index, as PyTorch),
    cumulative sums/products (a reduce_window over everything before), mse loss: pure
    StableHLO with PyTorch CPU's values."""
    fn, x = _mapped_cases()[name]
    check(fn, fn, x)


@pytest.mark.parametrize("name", ["roll", "roll_two_dims", "roll_flat", "nearest_2x", "nearest_size",
                                  "nearest_scale", "group_norm"])
def test_roll_upsample_group_norm(name):
    torch.manual_seed(0)
    x, img = torch.randn(4, 6), torch.randn(2, 4, 5, 7)
    fn, a = {
        "roll": (lambda t: t.roll(2, 1), x),
        "roll_two_dims": (lambda t: t.roll((1, -2), (0, 1)), x),
        "roll_flat": (lambda t: t.roll(5), x),
        "nearest_2x": (lambda t: F.interpolate(t, scale_factor=2), img),
        "nearest_size": (lambda t: F.interpolate(t, size=(3, 11)), img),
        "nearest_scale": (lambda t: F.interpolate(t, scale_factor=1.7), img),
        "group_norm": (lambda t: F.group_norm(t, 2), img),
    }[name]
    check(fn, fn, a)


def test_gather_and_group_norm_module():
    torch.manual_seed(0)
    x, xi = torch.randn(4, 6), torch.randint(0, 6, (4, 3))
    y, yi = torch.randn(3, 4, 5), torch.randint(0, 4, (3, 2, 5))
    check(lambda t, i: t.gather(1, i), lambda t, i: t.gather(1, i), x, xi)
    check(lambda t, i: t.gather(0, i), lambda t, i: t.gather(0, i), x, xi[:, :2].clamp(max=3))
    exported = check(lambda t, i: t.gather(1, i), lambda t, i: t.gather(1, i), y, yi)
    assert '"stablehlo.gather"' in exported
    tpu, cpu = module_pair(lambda: nn.GroupNorm(2, 4))
    check(tpu, cpu, torch.randn(2, 4, 5, 7))


@pytest.mark.parametrize("kw,shape", [
    (dict(in_channels=4, out_channels=6, kernel_size=3), (2, 4, 7, 7)),
    (dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1),
     (2, 4, 5, 6)),
    (dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0),
          groups=2, dilation=2), (2, 4, 5, 6)),
])
def test_transposed_convolution(kw, shape):
    """A transposed convolution is a convolution of the input dilated by the stride, with the
    kernel flipped and its channels swapped per group."""
    tpu, cpu = module_pair(lambda: nn.ConvTranspose2d(**kw))
    exported = check(tpu, cpu, torch.randn(*shape), rtol=1e-4, atol=1e-5)
    assert "lhs_dilation" in exported
    if kw.get("stride", 1) == 1:
        return
    tpu1, cpu1 = module_pair(lambda: nn.ConvTranspose1d(3, 5, 4, stride=3, padding=1, bias=False))
    check(tpu1, cpu1, torch.randn(2, 3, 9), rtol=1e-4, atol=1e-5)


def test_sort_topk_argsort():
    """stablehlo.sort over (values, indices), stable, NaN last ascending and first
    descending as PyTorch orders them; topk is the first k of a sort."""
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    xn = x.clone()
    xn[1, 2] = xn[2, 0] = float("nan")
    ties = torch.randint(0, 3, (4, 6)).float()
    xi = torch.randint(-5, 5, (3, 7))
    for fn, a in [(lambda t: t.sort(1), x), (lambda t: t.sort(0, descending=True), x),
                  (lambda t: t.sort(1), xn), (lambda t: t.sort(1, descending=True), xn),
                  (lambda t: t.sort(stable=True, dim=1), ties),
                  (lambda t: t.sort(stable=True, dim=1), xi),
                  (lambda t: t.topk(3, 1), x), (lambda t: t.topk(2, 0, largest=False), x),
                  (lambda t: torch.argsort(t, dim=1, stable=True, descending=True), ties)]:
        exported = check(fn, fn, a)
        assert '"stablehlo.sort"' in exported


@pytest.mark.parametrize("name", ["constant", "constant_negative", "reflect2d", "reflect1d",
                                  "replicate2d", "bilinear", "bilinear_align_corners",
                                  "bilinear_scale", "bilinear_down"])
def test_padding_and_bilinear(name):
    """constant_pad_nd is stablehlo.pad (negative pads crop); reflection / replication pads
    gather their source positions; bilinear upsampling gathers the two source rows per dim
    and blends them with PyTorch's float32 weights."""
    torch.manual_seed(0)
    img, x1 = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 7)
    fn, a = {
        "constant": (lambda t: F.pad(t, (1, 2, 3, 0), value=0.5), img),
        "constant_negative": (lambda t: F.pad(t, (-1, 2)), img),
        "reflect2d": (lambda t: F.pad(t, (2, 1, 1, 3), mode="reflect"), img),
        "reflect1d": (lambda t: F.pad(t, (3, 2), mode="reflect"), x1),
        "replicate2d": (lambda t: F.pad(t, (2, 1, 1, 3), mode="replicate"), img),
        "bilinear": (lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), img),
        "bilinear_align_corners": (lambda t: F.interpolate(t, size=(7, 4), mode="bilinear",
                                                           align_corners=True), img),
        "bilinear_scale": (lambda t: F.interpolate(t, scale_factor=1.3, mode="bilinear"), img),
        "bilinear_down": (lambda t: F.interpolate(t, size=(3, 4), mode="bilinear"), img),
    }[name]
    check(fn, fn, a)


def test_advanced_indexing_and_integer_remainder():
    """index.Tensor with index tensors on adjacent dims (broadcast together, negative
    indices wrapping) is one gather; integer remainder follows the divisor's sign."""
    torch.manual_seed(0)
    x = torch.randn(5, 6, 7)
    i1, j = torch.tensor([0, 4, -1, 2]), torch.tensor([3, 0, 6, -7])
    i2 = torch.tensor([[1, 5], [-2, 0]])
    for fn, args in [(lambda t, a: t[a], (x, i1)), (lambda t, a: t[:, a], (x, i2)),
                     (lambda t, a: t[:, :, a], (x, j)),
                     (lambda t, a, b: t[a, b[:, None] % 6], (x, i1, j)),
                     (lambda t, a, b: t[:, a, b], (x, i2 % 6, i2 % 7))]:
        exported = check(fn, fn, *args)
        assert '"stablehlo.gather"' in exported
    xi = torch.randint(-9, 9, (4, 5))
    check(lambda t: torch.remainder(t, 4), lambda t: torch.remainder(t, 4), xi)
    check(lambda t: torch.remainder(t, -3), lambda t: torch.remainder(t, -3), xi)


def test_scatter_scatter_add_one_hot():
    """scatter / scatter_add along a dim are one stablehlo.scatter over full coordinates
    (the update region keeps the new value or adds); one_hot goes through scatter_."""
    torch.manual_seed(0)
    x, src = torch.randn(4, 6), torch.randn(5, 7)
    unique = torch.stack([torch.randperm(6)[:3] for _ in range(4)])  # scatter: no duplicates
    dup = torch.randint(0, 6, (4, 5))
    for fn, args in [(lambda t, i, s: t.scatter(1, i, s), (x, unique, src)),
                     (lambda t, i: t.scatter(1, i, 2.5), (x, unique)),
                     (lambda t, i, s: t.scatter_add(1, i, s), (x, dup, src)),
                     (lambda t, i, s: t.scatter_add(0, i, s), (x, dup[:3].clamp(max=3), src)),
                     (lambda t, i, s: t.clone().scatter_(1, i, s), (x, unique, src))]:
        exported = check(fn, fn, *args)
        assert '"stablehlo.scatter"' in exported
    check(lambda i: F.one_hot(i, 5), lambda i: F.one_hot(i, 5), torch.randint(0, 5, (7,)))


def test_random_ops_export_with_their_seeds_as_constants():
    # the exported program draws what the host target draws for the same seed (Philox in
    # StableHLO, runtime/lower/random.c); exported, the seed and offset are constants
    f = lambda x: (F.dropout(x, 0.3, training=True) + torch.rand_like(x),
                   torch.randn(3, 4, device=x.device, dtype=torch.float64),
                   torch.randint(-4, 9, (6,), device=x.device))
    x = torch.randn(4, 5).to("tpu")
    torch.manual_seed(5)
    exported = torch_tpu.export_stablehlo(f, x)
    assert exported.custom_calls == [], exported.custom_calls
    assert "tensor<ui64>" in exported and '"stablehlo.iota"' in exported
    results = run_on_jax_cpu(exported)
    torch.manual_seed(5)
    want = f(x)
    assert len(exported.outputs) == len(want)
    for w, k in zip(want, exported.outputs):
        np.testing.assert_array_equal(results[k].reshape(w.shape), w.cpu().numpy())
    assert not torch.equal(want[0].cpu(), f(x)[0].cpu())  # the next draw differs
