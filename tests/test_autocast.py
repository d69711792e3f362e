"""torch.autocast("tpu"): matmul-class ops in bf16, precision-sensitive ops in fp32."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT


def test_autocast_policies():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a = torch.randn(8, 8, device="tpu")
    w = torch.randn(4, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu")
        mm = a @ a
        lin = F.linear(a, w)
        assert mm.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
        assert torch.softmax(mm, -1).dtype == torch.float32     # fp32 policy
        assert F.layer_norm(mm, (8,)).dtype == torch.float32
        assert torch.exp(mm).dtype == torch.float32             # fp32 policy
        assert torch.relu(mm).dtype == torch.bfloat16           # not listed: runs as is
        assert (a + a).dtype == torch.float32
    expected = (a.cpu().bfloat16() @ a.cpu().bfloat16())
    torch.testing.assert_close(mm.cpu(), expected, atol=1e-1, rtol=2e-2)


def test_autocast_training_step_grads_are_fp32():
    model = torch.nn.Linear(8, 3).to("tpu")
    x = torch.randn(5, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, torch.tensor([0, 1, 2, 0, 1], device="tpu"))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert model.weight.grad.dtype == torch.float32
    assert torch.isfinite(model.weight.grad).all().item()


# bfloat16 and precision-medium products through every GEMM path: the AVX-512 BF16 two-step
# dot products, the float tiles (TORCH_TPU_GEMM_DOT2=0), AVX2 and portable micro-kernels. With
# small integer values every sum is exact in float32, so CPU's result is exact and each path
# must equal it bit for bit; random values: within bf16 rounding of CPU's.
GEMM_CHECK = r"""
import torch, torch_tpu
import torch.nn.functional as F
g = torch.Generator().manual_seed(0)
def ints(*shape):
    return torch.randint(-8, 9, shape, generator=g).float()
shapes = [(37, 53, 19), (130, 600, 257), (64, 1025, 129), (8, 3, 40)]
for m, k, n in shapes:
    a, b, bias = ints(m, k), ints(k, n), ints(n)
    for dt in (torch.bfloat16, torch.float32):
        with torch.tpu.precision("medium"):
            for x, y in ((a, b), (a.t().contiguous().t(), b.t().contiguous().t())):
                want = (x.to(dt) @ y.to(dt)).float()
                got = (x.to(dt).to("tpu") @ y.to(dt).to("tpu")).cpu().float()
                assert torch.equal(got, want), (m, k, n, dt)
                want = F.linear(x.to(dt), y.t().to(dt), bias.to(dt)).float()
                got = F.linear(x.to(dt).to("tpu"), y.t().to(dt).to("tpu"), bias.to(dt).to("tpu"))
                assert torch.equal(got.cpu().float(), want), ("linear", m, k, n, dt)
    ab, bb = ints(6, m, k), ints(6, n, k).transpose(1, 2)
    want = (ab.bfloat16() @ bb.bfloat16()).float()
    assert torch.equal((ab.bfloat16().to("tpu") @ bb.bfloat16().to("tpu")).cpu().float(), want)
# random values: bf16 outputs within a rounding of CPU's (CPU sums in another order)
a, b = torch.randn(200, 384, generator=g), torch.randn(384, 300, generator=g)
want = a.bfloat16().float() @ b.bfloat16().float()
got = (a.bfloat16().to("tpu") @ b.bfloat16().to("tpu")).cpu().float()
torch.testing.assert_close(got, want, atol=0.05, rtol=2 ** -7)
with torch.tpu.precision("medium"):
    got = (a.to("tpu") @ b.to("tpu")).cpu()
torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("env", [{}, {"TORCH_TPU_GEMM_DOT2": "0"}, {"TORCH_TPU_ISA": "avx2"},
                                 {"TORCH_TPU_ISA": "portable"}],
                         ids=["auto", "no-dot2", "avx2", "portable"])
def test_bf16_gemm_paths_match_cpu(env):
    r = subprocess.run([sys.executable, "-c", GEMM_CHECK], capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_autocast_gpt_step_matches_cpu():
    """two training steps of a small GPT under bf16 autocast: losses and gradients close
    to CPU's own bf16 autocast from the same weights and batch"""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_gpt
    args = train_gpt.parser().parse_args(["--n-layer", "2", "--n-embd", "64", "--n-head", "4",
                                          "--block-size", "32", "--batch-size", "4"])
    data, chars = train_gpt.load_text(args.text)
    x, y = next(train_gpt.batches(data, args.block_size, args.batch_size, args.seed))
    res = {}
    for dev in ("cpu", "tpu"):
        model = train_gpt.make_model(len(chars), args, args.seed).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        losses = []
        for _ in range(2):
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits, loss = model(x.to(dev), y.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        res[dev] = (losses, model.blocks[0].fc.weight.grad.cpu())
    torch.testing.assert_close(res["tpu"][0], res["cpu"][0], rtol=2e-2, atol=0)
    g_tpu, g_cpu = res["tpu"][1], res["cpu"][1]
    assert g_tpu.dtype == torch.float32
    assert (g_tpu - g_cpu).norm() <= 0.05 * g_cpu.norm()
