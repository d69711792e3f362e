"""DeferAndFuse memory (issue 19): the statistics count real blocks only, and a flush
leaves values that one cheap elementwise node recomputes from kept inputs without memory
(recipes). A training step of a small MLP peaks lower than in Strict, with the same
values; every way of using a recomputed value, or of writing its inputs, sees the right
numbers."""
import torch
import torch.nn.functional as F

import torch_tpu

MiB = 1 << 20


def stats():
    return torch_tpu.modes.trace_stats()


class MLP(torch.nn.Module):
    """GPT's MLP stack: Linear -> GELU -> Linear with a residual, layer norm first."""

    def __init__(self, width=128, layers=4):
        super().__init__()
        self.ln = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(layers))
        self.fc = torch.nn.ModuleList(torch.nn.Linear(width, 4 * width) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(4 * width, width) for _ in range(layers))

    def forward(self, x):
        for ln, fc, out in zip(self.ln, self.fc, self.out):
            x = x + out(F.gelu(fc(ln(x))))
        return x


def train_steps(mode, steps=3):
    """Peak memory of the last step above its start, the losses and the weights."""
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(256, 128, generator=g) for _ in range(steps)]
    losses = []
    with torch_tpu.eager_mode(mode):
        for x in data:
            torch.tpu.synchronize()
            base = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            loss = model(x.to("tpu")).square().mean()
            opt.zero_grad(set_to_none=True)  # after the forward, as examples/train_gpt.py
            loss.backward()
            opt.step()
            losses.append(loss.item())
            torch.tpu.synchronize()
            peak = torch.tpu.max_memory_allocated() - base
    return peak, losses, [p.detach().cpu() for p in model.parameters()]


def test_training_step_peaks_below_strict():
    strict_peak, strict_losses, strict_w = train_steps("strict")
    before = stats()
    defer_peak, defer_losses, defer_w = train_steps("defer_and_fuse")
    after = stats()
    assert defer_losses == strict_losses
    for a, b in zip(defer_w, strict_w):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # the four 512 KiB GELU outputs of each forward were left to recompute, and each
    # backward recomputed them for the second linear layer's weight gradient
    assert after["recipes"] - before["recipes"] >= 4 * 3
    assert after["recomputed"] - before["recomputed"] >= 4 * 3
    # memory is deterministic: Strict holds every GELU output and every intermediate;
    # DeferAndFuse holds neither (5.26 MiB against 3.76 MiB, 0.71x, when written)
    assert defer_peak <= 0.8 * strict_peak, (defer_peak, strict_peak)


def make_recipe(n=1 << 18):
    """a (kept) and g = gelu(a), with g left to recompute by a flush: 1 MiB each."""
    torch.manual_seed(0)
    a_cpu = torch.randn(n)
    a = a_cpu.to("tpu") * 1.0  # a placeholder computed in the trace
    g = F.gelu(a)
    s = g.sum()  # read in the same graph, so g is computed there
    before = stats()["recipes"]
    torch_tpu.materialize()
    assert stats()["recipes"] == before + 1
    return a_cpu, a, g, s


def test_recipe_value_read_later(defer):
    a_cpu, a, g, s = make_recipe()
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.testing.assert_close(s.cpu(), F.gelu(a_cpu).sum(), rtol=1e-5, atol=1e-2)
    h = g * 2  # a traced read: the recipe runs first in the same graph
    torch.testing.assert_close(h.cpu(), F.gelu(a_cpu) * 2)
    torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))  # backed now (recomputed once)
    assert torch.tpu.memory_allocated() - base == 2 * MiB  # g and h


def test_recipe_input_written_in_place(defer):
    a_cpu, a, g, _ = make_recipe()
    a.add_(1)  # the recipe reads a: it runs before the write
    torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))
    torch.testing.assert_close(a.cpu(), a_cpu + 1)


def test_recipe_input_written_through_a_view_and_a_copy(defer):
    a_cpu, a, g, _ = make_recipe()
    a[10:20].zero_()
    torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))
    a_cpu, a, g, _ = make_recipe()
    a.copy_(torch.zeros_like(a_cpu))  # a host-to-device copy into a
    torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))
    assert a.abs().sum().item() == 0


def test_recipe_input_dropped_by_the_host(defer):
    a_cpu, a, g, _ = make_recipe()
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    del a  # the recipe still reads it: its memory stays
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base
    torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base  # a went, g came


def test_recipe_dropped_releases_its_input(defer):
    a_cpu, a, g, s = make_recipe()
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    del a
    del g
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base - MiB
    torch.testing.assert_close(s.cpu(), F.gelu(a_cpu).sum(), rtol=1e-5, atol=1e-2)


def test_recipe_used_in_strict_mode(defer):
    a_cpu, a, g, _ = make_recipe()
    with torch_tpu.eager_mode("strict"):
        torch.testing.assert_close((g + 1).cpu(), F.gelu(a_cpu) + 1)  # a strict read
    a_cpu, a, g, _ = make_recipe()
    with torch_tpu.eager_mode("strict"):
        a.mul_(3)  # a strict write of the input
        torch.testing.assert_close(g.cpu(), F.gelu(a_cpu))
        torch.testing.assert_close(a.cpu(), a_cpu * 3)
