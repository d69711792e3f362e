"""torch.compile(backend="tpu"): models compiled vs eager CPU (forward and gradients),
input mutations, graph breaks, options, lowering errors, the shared cache, export."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from conftest import run_python


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train_compare(make, x_cpu, y_cpu, loss_fn, steps=3, rtol=1e-4, atol=1e-5):
    torch.manual_seed(0)
    ref = make()
    dev = make()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("tpu")
    compiled = torch.compile(dev, backend="tpu")
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1)
    with torch.tpu.precision("highest"):
        for _ in range(steps):
            lr_ = loss_fn(ref(x_cpu), y_cpu)
            ld = loss_fn(compiled(x_cpu.to("tpu")), y_cpu.to("tpu"))
            opt_r.zero_grad()
            opt_d.zero_grad()
            lr_.backward()
            ld.backward()
            for (n, pr), pd in zip(ref.named_parameters(), dev.parameters()):
                torch.testing.assert_close(pd.grad.cpu(), pr.grad, rtol=rtol, atol=atol, msg=n)
            opt_r.step()
            opt_d.step()
            torch.testing.assert_close(ld.cpu(), lr_, rtol=rtol, atol=atol)
    return ref, dev


def test_backend_is_registered_after_plain_import():
    r = run_python("import torch\nfrom torch._dynamo import list_backends\n"
                   "print('tpu' in list_backends())\n"
                   "f = torch.compile(lambda x: (x * 2).sin(), backend='tpu')\n"
                   "print(f(torch.ones(3, device='tpu')).cpu().tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "True"


def test_mlp_training_matches_cpu():
    _train_compare(lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)),
                   torch.randn(8, 16), torch.randint(0, 4, (8,)), F.cross_entropy)


def test_cnn_with_batchnorm_updates_running_stats():
    make = lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),  # noqa: E731
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    ref, dev = _train_compare(make, torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)),
                              F.cross_entropy, rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(dev[1].running_mean.cpu(), ref[1].running_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev[1].running_var.cpu(), ref[1].running_var, rtol=1e-4, atol=1e-5)
    assert int(dev[1].num_batches_tracked) == 3


def test_lstm_through_decomposition():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(6, 10, batch_first=True)
            self.head = nn.Linear(10, 3)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])
    with torch._dynamo.config.patch(allow_rnn=True):  # trace through LSTM's decomposition
        _train_compare(M, torch.randn(4, 5, 6), torch.randint(0, 3, (4,)), F.cross_entropy,
                       steps=2)


def test_attention_model_inference():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():  # the fused fast path (_transformer_encoder_layer_fwd) on both
        want = layer(x)
        got = torch.compile(layer.to("tpu"), backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-2)  # medium precision


def test_graph_break_runs_eager_pieces():
    def f(x):
        y = x.exp()
        print("graph break")  # noqa: T201
        return (y * 2).sum()
    x = torch.randn(5)
    got = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(x))


def test_options_validation():
    f = torch.compile(lambda x: x + 1, backend="tpu", options={"bogus": 1})
    with pytest.raises(Exception, match="valid options are"):
        f(torch.ones(2, device="tpu"))
    torch._dynamo.reset()
    g = torch.compile(lambda x: x @ x, backend="tpu", options={"precision": "highest"})
    a = torch.randn(16, 16)
    torch.testing.assert_close(g(a.to("tpu")).cpu(), a @ a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs"])
def test_inductor_mode_names_are_accepted(mode):
    # scripts (and transformers' CompileConfig) pass Inductor's mode names; tpu compiles the same
    torch._dynamo.reset()
    x = torch.randn(6)
    got = torch.compile(lambda t: (t * 2).sin() + 1, backend="tpu", mode=mode)(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), (x * 2).sin() + 1)
    torch._dynamo.reset()


def test_unknown_mode_names_the_valid_ones():
    torch._dynamo.reset()
    f = torch.compile(lambda t: t + 1, backend="tpu", mode="fastest")
    with pytest.raises(Exception, match="mode='fastest'; expected one of"):
        f(torch.ones(2, device="tpu"))
    torch._dynamo.reset()


def test_unlowerable_node_names_node_and_op():
    from torch_tpu.compile import LoweringError, unsupported_nodes
    # an op without a tpu kernel (yet)
    fq = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask.default
    gm = torch.fx.symbolic_trace(lambda x: fq(x, 0.5, 0, 0, 255))
    assert unsupported_nodes(gm)[0][1] == "aten.fake_quantize_per_tensor_affine_cachemask.default"
    f = torch.compile(lambda x: fq(x, 0.5, 0, 0, 255)[0].abs(), backend="tpu")
    with pytest.raises(Exception, match="fake_quantize_per_tensor_affine_cachemask"):
        f(torch.randn(4, 4, device="tpu"))
    assert issubclass(LoweringError, RuntimeError)


def test_compiled_graphs_use_the_shared_cache(tmp_path):
    code = """
import torch, torch_tpu
f = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w + 1).exp() * 0.5, backend='tpu')
x, w = torch.randn(64, 32, device='tpu'), torch.randn(32, 32, device='tpu')
print(f(x, w).sum().item())
s = torch.tpu.compilation_cache_stats()
print(s['compiles'], s['tier3_hits'] + s['tier2_hits'])
"""
    env = {"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path)}
    r1 = run_python(code, env=env)
    assert r1.returncode == 0, r1.stderr
    r2 = run_python(code, env=env)
    assert r2.returncode == 0, r2.stderr
    c1, _ = map(int, r1.stdout.split("\n")[1].split())
    c2, hits2 = map(int, r2.stdout.split("\n")[1].split())
    assert c1 >= 1 and c2 == 0 and hits2 >= 1
    assert r1.stdout.split("\n")[0] == r2.stdout.split("\n")[0]


def test_export_stablehlo_text():
    lin = nn.Linear(8, 4).to("tpu")
    text = torch_tpu.export_stablehlo(lambda x: torch.relu(lin(x)), torch.randn(2, 8, device="tpu"))
    assert "func.func @main" in text
    assert "tensor<2x4xf32>" in text


def test_gpt_training_keeps_the_host_kernels_whole(tmp_path):
    """A GPT (embedding, layer norm, hand-written attention, cross entropy) compiled for the
    host target: its graphs keep the ops the host runs as one kernel (layer norm's and
    embedding's backward, the softmax backward, NLL loss) and attention as the fused ops,
    where core ATen decompositions would split them; gradients and losses match CPU. The
    backward row reductions run inside fused row kernels: the graphs name them."""
    import os
    import sys
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples")
    sys.path.insert(0, examples)
    try:
        import train_gpt
    finally:
        sys.path.remove(examples)

    class Wrap(nn.Module):  # (logits, loss) -> logits for _train_compare
        def __init__(self):
            super().__init__()
            self.gpt = train_gpt.GPT(11, block_size=16, n_layer=2, n_embd=32, n_head=2)

        def forward(self, idx):
            return self.gpt(idx)[0].flatten(0, 1)

    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 11, (4, 16), generator=g)
    y = torch.randint(0, 11, (4 * 16,), generator=g)
    # attention of 16 x 16 scores runs fused only below sdpa's default size threshold
    prev = torch_tpu._C.set_sdpa_fused_min_scores(0)
    torch_tpu.debug.dump_graphs(tmp_path)
    try:
        with torch_tpu.debug.kernel_profile() as prof:
            _train_compare(Wrap, x, y, F.cross_entropy, steps=2, rtol=1e-4, atol=2e-5)
    finally:
        torch_tpu._C.set_sdpa_fused_min_scores(prev)
        torch_tpu.debug.dump_graphs(None)
    graphs = "".join(f.read_text() for f in tmp_path.iterdir())
    ops = set(prof.ops)
    for op in ("native_layer_norm_backward", "_log_softmax_backward_data"):  # maybe fused
        assert op in ops or f"aten::{op}" in graphs, (op, sorted(ops))
    for op in ("embedding_dense_backward", "nll_loss_forward", "nll_loss_backward",
               "_scaled_dot_product_fused_attention_overrideable",
               "_scaled_dot_product_fused_attention_overrideable_backward"):
        assert op in ops, (op, sorted(ops))
    assert not any(op.startswith("index_put") for op in ops), sorted(ops)
