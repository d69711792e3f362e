"""Reduction fusion in DeferAndFuse: softmax / log_softmax / layer norm and their backward
passes with their elementwise prologue and epilogue become one generated row kernel (layer
norm's backward with its weight and bias gradients: sums over rows).

Tolerances: the fused kernels follow the library's float32 row paths (float runs summed in
double, normalization in float32) but are compiled separately, so multiply-add contraction
may differ: results must match Strict mode within rtol = atol = 1e-5 (softmax outputs within
2e-6 absolute), layer-norm statistics within rtol 1e-5."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug
from conftest import run_python


def _twice(fn, *args, profile=False):
    """Runs fn in Strict, then twice in DeferAndFuse (the first run may compile in the
    background); returns (strict result, fused result, reduction groups of the 2nd run), and
    with profile the 2nd run's kernel profile (op -> (calls, seconds)) too."""
    ref = fn(*args)
    torch.tpu.synchronize()
    with torch_tpu.eager_mode("defer_and_fuse"):
        first = fn(*args)  # kept: a dropped result would be dead code, never compiled
        torch.tpu.synchronize()
        torch_tpu.modes.wait_compiles()
        del first
        torch_tpu.modes.reset_trace_stats()
        with torch_tpu.debug.kernel_profile() as prof:
            out = fn(*args)
            torch.tpu.synchronize()
        groups = torch_tpu.modes.trace_stats()["reduction_groups"]
    return (ref, out, groups, prof.ops) if profile else (ref, out, groups)


def _close(a, b, rtol=1e-5, atol=1e-5):
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b):
            _close(x, y, rtol, atol)
        return
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=rtol, atol=atol)


def test_attention_softmax_with_scale_and_causal_mask():
    torch.manual_seed(0)
    B, H, T = 2, 3, 40
    s = torch.randn(B, H, T, T, device="tpu")
    causal = torch.ones(T, T, dtype=torch.bool, device="tpu").tril()

    def f(s):
        att = s * 0.125
        att = att.masked_fill(~causal, float("-inf"))  # mask broadcast over B, H
        return F.softmax(att, dim=-1) * 2.0  # with an epilogue

    ref, out, groups = _twice(f, s)
    assert groups >= 1
    _close(ref, out, atol=2e-6)
    cpu = F.softmax((s.cpu() * 0.125).masked_fill(~causal.cpu(), float("-inf")), -1) * 2
    _close(out, cpu)


def test_log_softmax_with_prologue_and_epilogue():
    torch.manual_seed(1)
    x = torch.randn(64, 300, device="tpu") * 3
    bias = torch.randn(300, device="tpu")

    def f(x):
        return -(F.log_softmax(x / 2.0 + bias, dim=-1))

    ref, out, groups = _twice(f, x)
    assert groups >= 1
    _close(ref, out)
    _close(out, -F.log_softmax(x.cpu() / 2.0 + bias.cpu(), -1))


def test_where_mask_before_softmax():
    torch.manual_seed(2)
    x = torch.randn(4, 8, 33, device="tpu")
    keep = torch.rand(8, 33, device="tpu") > 0.3
    fill = torch.full((), -1e4, device="tpu")

    def f(x):
        return torch.softmax(torch.where(keep, x * 1.5, fill), dim=-1)

    ref, out, groups = _twice(f, x)
    assert groups >= 1
    _close(ref, out, atol=2e-6)


def test_layer_norm_with_residual_forward_and_backward():
    torch.manual_seed(3)
    C = 96
    ln = torch.nn.LayerNorm(C).to("tpu")
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    a0 = torch.randn(4, 10, C)
    b0 = torch.randn(4, 10, C)

    def f(_):
        a = a0.to("tpu").requires_grad_()
        b = b0.to("tpu").requires_grad_()
        x = a + b  # residual add: the prologue, its result needed later (backward)
        y = ln(x)
        z = y * 0.5 + 1.0  # epilogue
        (z * z).sum().backward()
        return [z.detach(), a.grad, b.grad, ln.weight.grad.clone(), ln.bias.grad.clone()]

    ln.zero_grad()
    ref = f(None)
    torch.tpu.synchronize()
    with torch_tpu.eager_mode("defer_and_fuse"):
        ln.zero_grad()
        first = f(None)
        torch.tpu.synchronize()
        torch_tpu.modes.wait_compiles()
        torch_tpu.modes.reset_trace_stats()
        ln.zero_grad()
        out = f(None)
        torch.tpu.synchronize()
        groups = torch_tpu.modes.trace_stats()["reduction_groups"]
    assert groups >= 1
    _close(ref, out, rtol=1e-5, atol=1e-4)


def test_native_layer_norm_statistics():
    torch.manual_seed(4)
    x = torch.randn(37, 200, device="tpu") + 5.0
    w = torch.randn(200, device="tpu")

    def f(x):
        return torch.native_layer_norm(x * 1.0 + 0.5, [200], w, None, 1e-5)

    ref, out, groups = _twice(f, x)
    assert groups >= 1
    _close(ref[0], out[0])
    _close(ref[1], out[1], rtol=1e-5, atol=1e-6)  # mean
    _close(ref[2], out[2], rtol=1e-5, atol=1e-6)  # rstd
    cpu = torch.native_layer_norm(x.cpu() * 1.0 + 0.5, [200], w.cpu(), None, 1e-5)
    _close(out, cpu, rtol=1e-4, atol=1e-4)


def test_in_place_and_views_keep_their_semantics():
    torch.manual_seed(5)
    x0 = torch.randn(16, 50)

    def f(_):
        x = x0.to("tpu")
        s = x * 2.0
        x[0].fill_(7.0)  # writes what the scale read: must not move past it
        x.add_(1.0)  # in place on a prologue input
        y = torch.softmax(s + x, dim=-1)
        v = y[:, ::2]  # a view of the fused result
        v.mul_(3.0)
        return [x, y, y[3:5, 10:20].contiguous()]

    ref, out, groups = _twice(f, None)
    assert groups >= 1
    _close(ref, out, atol=2e-6)
    x = x0.clone()
    s = x * 2
    x[0] = 7
    x += 1
    y = torch.softmax(s + x, -1)
    y[:, ::2] *= 3
    _close(out[1], y)


def test_small_gpt_losses_match_strict():
    code = """
import sys, torch, torch_tpu
sys.path.insert(0, 'examples')
import train_gpt
def run(mode):
    torch_tpu.set_eager_mode(mode)
    args = train_gpt.parser().parse_args(['--device', 'tpu', '--steps', '4', '--log-every',
        '100000', '--n-layer', '2', '--n-embd', '64', '--n-head', '4', '--batch-size', '4',
        '--block-size', '32'])
    losses = train_gpt.train(args)
    torch.tpu.synchronize()
    torch_tpu.set_eager_mode('strict')
    return losses
a = run('strict'); b = run('defer_and_fuse')
s = torch_tpu.modes.trace_stats()
print(max(abs(x - y) / abs(x) for x, y in zip(a, b)), s['reduction_groups'], s['epilogue_groups'])
"""
    r = run_python(code, env={"TORCH_TPU_ASYNC_COMPILE": "0"}, timeout=300)
    assert r.returncode == 0, r.stderr
    diff, groups, epilogues = r.stdout.strip().splitlines()[-1].split()
    assert float(diff) <= 1e-5
    assert int(groups) >= 2 * 3  # per block: attention softmax, ln1, ln2 at least
    assert int(epilogues) >= 2  # per block: fc + gelu


def test_no_compiler_falls_back(tmp_path):
    code = """
import torch, torch_tpu, torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(8, 64, device='tpu')
torch_tpu.set_eager_mode('defer_and_fuse')
y = F.softmax(x * 0.5 - 1.0, dim=-1)
z = F.layer_norm(x + 1.0, (64,))
torch.tpu.synchronize()
torch_tpu.modes.wait_compiles()
torch_tpu.set_eager_mode('strict')
print((y.cpu() - F.softmax(x.cpu() * 0.5 - 1.0, -1)).abs().max().item(),
      (z.cpu() - F.layer_norm(x.cpu() + 1.0, (64,))).abs().max().item(),
      torch_tpu.modes.trace_stats()['reduction_groups'])
"""
    r = run_python(code, env={"TORCH_TPU_CC": "/nonexistent/cc", "TORCH_TPU_ASYNC_COMPILE": "0",
                              "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
                              "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path / "t3")})
    assert r.returncode == 0, r.stderr
    dy, dz, groups = r.stdout.split()
    assert float(dy) < 1e-6 and float(dz) < 1e-5 and int(groups) == 0


def test_matmul_epilogues():
    torch.manual_seed(6)
    x = torch.randn(1500, 64, device="tpu")  # several row blocks of the product
    w1 = torch.randn(96, 64, device="tpu") * 0.1
    b1 = torch.randn(96, device="tpu")
    res = torch.randn(1500, 96, device="tpu")

    def f(x):
        h = F.gelu(F.linear(x, w1, b1))  # addmm + gelu; the product itself is dead
        r = torch.relu(x @ w1.t()) + res  # mm + relu + residual add
        keep = F.linear(x, w1, b1)  # a product also needed by itself
        k2 = keep * 2.0
        return [h, r, keep, k2]

    for precision in ("highest", "medium"):
        with torch.tpu.precision(precision):
            ref, out, _ = _twice(f, x)
        with torch_tpu.eager_mode("defer_and_fuse"), torch.tpu.precision(precision):
            torch_tpu.modes.reset_trace_stats()
            out = f(x)
            torch.tpu.synchronize()
            groups = torch_tpu.modes.trace_stats()["epilogue_groups"]
        assert groups >= 3, groups
        _close(ref, out, rtol=1e-6, atol=1e-6)  # the same GEMM, the same epilogue rounding
    cpu = F.gelu(F.linear(x.cpu(), w1.cpu(), b1.cpu()))
    _close(out[0], cpu, rtol=2e-2, atol=2e-2)  # medium precision: bf16-split products


def test_softmax_backward_with_mask_and_scale_epilogue():
    # attention's backward as AOTAutograd writes it: the mask's fill between the softmax
    # backward and its where does not touch the group's data, so the where and the scale join
    torch.manual_seed(7)
    B, H, T = 2, 3, 40
    g = torch.randn(B, H, T, T, device="tpu")
    y = torch.softmax(torch.randn(B, H, T, T, device="tpu"), -1)
    causal = torch.ones(T, T, dtype=torch.bool, device="tpu").tril()

    def f(g):
        gi = torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32)
        zero = torch.zeros((), device="tpu")
        return torch.where(~causal, zero, gi) * 0.125

    ref, out, groups, ops = _twice(f, g, profile=True)
    assert groups >= 1
    assert not {"_softmax_backward_data", "where.self", "mul.Tensor"} & set(ops), ops
    _close(ref, out, rtol=1e-6, atol=1e-7)  # the library's row code
    yc = y.cpu()
    cpu = torch.ops.aten._softmax_backward_data(g.cpu(), yc, -1, torch.float32)
    _close(out, torch.where(~causal.cpu(), torch.zeros(()), cpu) * 0.125)


def test_log_softmax_backward_with_residual_epilogue():
    torch.manual_seed(8)
    g = torch.randn(50, 44, device="tpu")
    y = F.log_softmax(torch.randn(50, 44, device="tpu"), -1)
    res = torch.randn(50, 44, device="tpu")

    def f(g):
        return torch.ops.aten._log_softmax_backward_data(g * 0.5, y, 1, torch.float32) + res

    ref, out, groups, ops = _twice(f, g, profile=True)
    assert groups >= 1 and "_log_softmax_backward_data" not in ops, ops
    _close(ref, out, rtol=1e-6, atol=1e-7)
    cpu = torch.ops.aten._log_softmax_backward_data(g.cpu() * 0.5, y.cpu(), 1, torch.float32)
    _close(out, cpu + res.cpu())


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_with_residual_epilogue(affine):
    # the backward of a pre-norm block's layer norm: grad_input + the residual's gradient,
    # and its weight and bias gradients (sums over rows, in the library's blocks)
    torch.manual_seed(9)
    B, T, C = 6, 70, 96  # 420 rows: several blocks of the sums over rows
    x = torch.randn(B, T, C, device="tpu") * 2 + 1
    w = torch.randn(C, device="tpu") if affine else None
    b = torch.randn(C, device="tpu") if affine else None
    _, mean, rstd = torch.native_layer_norm(x, [C], w, b, 1e-5)
    res = torch.randn(B, T, C, device="tpu")
    mask = [True, affine, affine]

    def f(dy):
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, [C], mean, rstd, w, b, mask)
        return [dx + res] + ([dw, db] if affine else [])

    dy = torch.randn(B, T, C, device="tpu")
    ref, out, groups, ops = _twice(f, dy, profile=True)
    assert groups >= 1 and "native_layer_norm_backward" not in ops, ops
    _close(ref, out)
    cpu = torch.ops.aten.native_layer_norm_backward(
        dy.cpu(), x.cpu(), [C], mean.cpu(), rstd.cpu(), None if w is None else w.cpu(),
        None if b is None else b.cpu(), mask)
    _close(out[0], cpu[0] + res.cpu(), rtol=1e-4, atol=1e-4)
    if affine:
        _close(out[1:], cpu[1:], rtol=1e-4, atol=1e-3)


def test_compiled_transformer_block_backward_fuses():
    # torch.compile's backward graph: softmax backward with the mask and scale, layer norm
    # backward with the residual gradient run fused
    code = """
import torch, torch.nn as nn, torch.nn.functional as F, torch_tpu, torch_tpu.debug
torch.manual_seed(0)
torch.set_float32_matmul_precision('highest')
class Block(nn.Module):
    def __init__(s, C, T):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        s.register_buffer('mask', torch.tril(torch.ones(T, T)).view(1, 1, T, T))
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // 2) ** 0.5)
        att = F.softmax(att.masked_fill(s.mask[:, :, :T, :T] == 0, float('-inf')), dim=-1)
        x = x + s.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x))))
ref = Block(64, 32)
dev = Block(64, 32)
dev.load_state_dict(ref.state_dict())
dev = dev.to('tpu')
step = torch.compile(dev, backend='tpu')
x = torch.randn(4, 32, 64)
def run():
    for p in dev.parameters():
        p.grad = None
    xd = x.to('tpu').requires_grad_()  # the first layer norm's input gradient too
    (step(xd) ** 2).mean().backward()
    torch.tpu.synchronize()
    return xd.grad
run()
torch_tpu.modes.wait_compiles()
torch_tpu.modes.reset_trace_stats()
with torch_tpu.debug.kernel_profile() as prof:
    gx = run()
xc = x.clone().requires_grad_()
(ref(xc) ** 2).mean().backward()
err = max(((a.cpu() - b).abs().max() / (b.abs().max() + 1e-6)).item() for a, b in
          [(gx, xc.grad)] + [(pd.grad, pr.grad) for pr, pd in zip(ref.parameters(), dev.parameters())])
ops = prof.ops
print(err, torch_tpu.modes.trace_stats()['reduction_groups'],
      ops.get('native_layer_norm_backward', (0, 0))[0], ops.get('_softmax_backward_data', (0, 0))[0])
"""
    r = run_python(code, env={"TORCH_TPU_ASYNC_COMPILE": "0"}, timeout=300)
    assert r.returncode == 0, r.stderr
    err, groups, ln_bwd, sm_bwd = r.stdout.strip().splitlines()[-1].split()
    assert float(err) < 1e-4
    assert int(groups) >= 3  # backward: softmax, 2 layer norms
    assert int(ln_bwd) == 0 and int(sm_bwd) == 0, r.stdout
