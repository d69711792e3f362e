"""torch.autocast("tpu"): matmul-class ops in bf16, precision-sensitive ops in fp32."""
import torch
import torch.nn.functional as F


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
