"""scaled_dot_product_attention on tpu: the fused host kernel (runtime/targets/host/kernels/
attention.c) against PyTorch CPU's math path, forward and backward, and the backend choice."""
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu

FWD = "_scaled_dot_product_fused_attention_overrideable"
BWD = "_scaled_dot_product_fused_attention_overrideable_backward"
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (4e-3, 4e-3)}


@pytest.fixture(autouse=True)
def fused_at_every_size():
    """These tests exercise the fused kernel at small sizes, where sdpa's default would be
    the math path (TORCH_TPU_SDPA_FUSED_MIN_SCORES; test_short_sequences_default_to_math)."""
    prev = torch_tpu._C.set_sdpa_fused_min_scores(0)
    yield
    torch_tpu._C.set_sdpa_fused_min_scores(prev)


def rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def fused_calls(fn):
    """Runs fn() and returns (its result, calls of the fused forward, of its backward)."""
    with torch_tpu.debug.kernel_profile() as prof:
        r = fn()
    calls = lambda name: prof.ops.get(name, (0, 0))[0]  # noqa: E731
    return r, calls(FWD), calls(BWD)


def run(q, k, v, grad, device, **kw):
    """sdpa on `device` (leaf copies of q, k, v); returns output and the three grads."""
    leaves = [t.to(device).detach().requires_grad_() for t in (q, k, v)]
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = mask.to(device)
    o = F.scaled_dot_product_attention(*leaves, attn_mask=mask, **kw)
    o.backward(grad.to(device))
    return [o] + [t.grad for t in leaves]


def check_close(got, want, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
    assert got.device.type == "tpu"
    g = got.cpu()
    assert g.dtype == want.dtype and g.shape == want.shape
    torch.testing.assert_close(g.double(), want.double(), atol=atol * scale, rtol=rtol * scale)


def same_layout(a, b):
    """Equal strides along the dims of more than one element."""
    return all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)


def reference(q, k, v, grad, dtype, **kw):
    """CPU math path: float32 inputs as they are; 16-bit ones computed in float32 (the fused
    kernel sums in float32) and rounded back."""
    up = dtype if dtype == torch.float32 else torch.float32
    mask = kw.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        kw = dict(kw, attn_mask=mask.to(up))
    with sdpa_kernel(SDPBackend.MATH):
        outs = run(q.to(up), k.to(up), v.to(up), grad.to(up), "cpu", **kw)
    return [t.to(dtype) for t in outs]


CASES = [
    # B, H, Hk, Tq, Tk, E, Ev
    (2, 3, 3, 67, 67, 16, 16),
    (1, 2, 2, 1, 1, 8, 8),
    (1, 2, 2, 7, 7, 32, 32),
    (1, 1, 1, 129, 129, 64, 64),
    (2, 2, 2, 7, 67, 16, 24),
    (1, 2, 2, 67, 7, 16, 16),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_highest_matches_cpu(case, causal):
    B, H, Hk, Tq, Tk, E, Ev = case
    q, k, v = rand((B, H, Tq, E), torch.float32, 1), rand((B, Hk, Tk, E), torch.float32, 2), \
        rand((B, Hk, Tk, Ev), torch.float32, 3)
    grad = rand((B, H, Tq, Ev), torch.float32, 4)
    with torch.tpu.precision("highest"):
        got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", is_causal=causal))
    want = reference(q, k, v, grad, torch.float32, is_causal=causal)
    assert (nf, nb) == (1, 1)
    for g, w in zip(got, want):
        check_close(g, w, torch.float32)
    # layouts: those of CPU's default backend (its flash kernel where it takes the inputs)
    for g, d in zip(got, run(q, k, v, grad, "cpu", is_causal=causal)):
        assert same_layout(g, d), (g.stride(), d.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "bool_bcast", "additive"])
def test_dtypes_and_masks(dtype, mask_kind):
    B, H, T, E = 2, 2, 67, 32
    q, k, v = (rand((B, H, T, E), dtype, s) for s in (5, 6, 7))
    grad = rand((B, H, T, E), dtype, 8)
    kw = {}
    if mask_kind == "causal":
        kw["is_causal"] = True
    elif mask_kind == "bool":
        m = torch.rand(B, H, T, T, generator=torch.Generator().manual_seed(9)) > 0.3
        m[..., 0] = True  # every row sees a key
        kw["attn_mask"] = m
    elif mask_kind == "bool_bcast":
        kw["attn_mask"] = torch.ones(T, T, dtype=torch.bool).tril()
    elif mask_kind == "additive":
        kw["attn_mask"] = rand((1, H, T, T), dtype, 10)
    with torch.tpu.precision("highest"):
        got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", **dict(kw)))
    want = reference(q, k, v, grad, dtype, **kw)
    assert (nf, nb) == (1, 1)
    for g, w in zip(got, want):
        check_close(g, w, dtype, scale=2.0)


@pytest.mark.parametrize("precision", ["medium", "high"])
def test_precision_modes(precision):
    """medium rounds the products' inputs to bfloat16, high splits them (bf16x3)."""
    B, H, T, E = 1, 2, 129, 64
    q, k, v = (rand((B, H, T, E), torch.float32, s) for s in (11, 12, 13))
    grad = rand((B, H, T, E), torch.float32, 14)
    with torch.tpu.precision(precision):
        got = run(q, k, v, grad, "tpu", is_causal=True)
    want = reference(q, k, v, grad, torch.float32, is_causal=True)
    tol = 3e-2 if precision == "medium" else 1e-4
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, atol=tol, rtol=tol)
    if precision == "medium":  # not the float32 result: the inputs were rounded
        assert not torch.allclose(got[0].cpu(), want[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("Hk", [1, 2])
def test_gqa(dtype, Hk):
    B, H, T, E = 2, 4, 67, 16
    q, k, v = rand((B, H, T, E), dtype, 15), rand((B, Hk, T, E), dtype, 16), \
        rand((B, Hk, T, E), dtype, 17)
    grad = rand((B, H, T, E), dtype, 18)
    with torch.tpu.precision("highest"):
        got, nf, nb = fused_calls(
            lambda: run(q, k, v, grad, "tpu", is_causal=True, enable_gqa=True))
    want = reference(q, k, v, grad, dtype, is_causal=True, enable_gqa=True)
    assert (nf, nb) == (1, 1)
    for g, w in zip(got, want):
        check_close(g, w, dtype, scale=2.0)
    assert got[2].shape == (B, Hk, T, E) and got[3].shape == (B, Hk, T, E)


def test_3d_strided_inputs_and_scale():
    """(H, T, E) inputs, views of a (T, H, E) layout, an explicit scale."""
    H, T, E = 3, 67, 16
    base = [rand((T, H, E), torch.float32, s) for s in (19, 20, 21)]
    q, k, v = (t.transpose(0, 1) for t in base)
    grad = rand((H, T, E), torch.float32, 22)

    def tpu_run():
        leaves = [t.to("tpu").detach().requires_grad_() for t in base]
        views = [t.transpose(0, 1) for t in leaves]
        o = F.scaled_dot_product_attention(*views, scale=0.3)
        o.backward(grad.to("tpu"))
        return [o] + [t.grad.transpose(0, 1) for t in leaves]

    with torch.tpu.precision("highest"):
        got, nf, nb = fused_calls(tpu_run)
    want = reference(q, k, v, grad, torch.float32, scale=0.3)
    assert (nf, nb) == (1, 1)
    assert got[0].stride() == (E, H * E, 1)  # the query's layout (the meta kernel's)
    for g, w in zip(got, want):
        check_close(g, w, torch.float32)


def test_fully_masked_row_gives_zero():
    B, H, T, E = 1, 1, 7, 8
    q, k, v = (rand((B, H, T, E), torch.float32, s) for s in (23, 24, 25))
    grad = rand((B, H, T, E), torch.float32, 26)
    m = torch.ones(T, T, dtype=torch.bool)
    m[3] = False
    with torch.tpu.precision("highest"):
        got = run(q, k, v, grad, "tpu", attn_mask=m)
    want = reference(q, k, v, grad, torch.float32, attn_mask=m)
    for g, w in zip(got, want):
        check_close(g, w, torch.float32)
    assert (got[0][0, 0, 3].cpu() == 0).all()


def dropout_reference(q, k, v, grad, p, keep, **kw):
    """Math path on CPU with the kept positions given (float64)."""
    leaves = [t.double().detach().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) / math.sqrt(q.shape[-1])
    if kw.get("is_causal"):
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    a = torch.softmax(s, -1) * keep / (1 - p)
    o = a @ leaves[2]
    o.backward(grad.double())
    return [o] + [t.grad for t in leaves]


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_reconstructed_mask(causal):
    """The kernel keeps element (b, h, i, j) when the Philox block at offset + its index gives a
    uniform below 1 - p: torch.rand(float64) from the same seed draws the same uniforms."""
    B, H, T, E, p = 2, 2, 67, 16, 0.3
    q, k, v = (rand((B, H, T, E), torch.float32, s) for s in (27, 28, 29))
    grad = rand((B, H, T, E), torch.float32, 30)
    with torch.tpu.precision("highest"):
        torch.tpu.manual_seed(1234)
        got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", dropout_p=p, is_causal=causal))
        torch.tpu.manual_seed(1234)
        u = torch.rand(B, H, T, T, dtype=torch.float64, device="tpu").cpu()
    assert (nf, nb) == (1, 1)
    keep = u < 1 - p
    assert 0.6 < keep.double().mean().item() < 0.8
    want = dropout_reference(q, k, v, grad, p, keep, is_causal=causal)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu().double(), w, atol=2e-5, rtol=2e-5)


def test_dropout_same_in_every_mode():
    B, H, T, E, p = 1, 2, 67, 16, 0.5
    q, k, v = (rand((B, H, T, E), torch.float32, s) for s in (31, 32, 33))
    grad = rand((B, H, T, E), torch.float32, 34)
    results = {}
    for mode in ("strict", "debug", "defer_and_fuse"):
        torch.tpu.synchronize()
        with torch_tpu.eager_mode(mode):
            torch.tpu.manual_seed(77)
            got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", dropout_p=p))
            results[mode] = [t.cpu() for t in got]
        torch.tpu.synchronize()
        assert (nf, nb) == (1, 1), mode
    for mode in ("debug", "defer_and_fuse"):
        for a, b in zip(results["strict"], results[mode]):
            assert torch.equal(a, b), mode
    # another seed, another mask
    torch.tpu.manual_seed(78)
    other = run(q, k, v, grad, "tpu", dropout_p=p)[0].cpu()
    assert not torch.equal(other, results["strict"][0])


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_modes_match_strict(mode):
    B, H, T, E = 1, 2, 67, 16
    q, k, v = (rand((B, H, T, E), torch.bfloat16, s) for s in (35, 36, 37))
    grad = rand((B, H, T, E), torch.bfloat16, 38)
    strict = [t.cpu() for t in run(q, k, v, grad, "tpu", is_causal=True)]
    torch.tpu.synchronize()
    with torch_tpu.eager_mode(mode):
        other = [t.cpu() for t in run(q, k, v, grad, "tpu", is_causal=True)]
    torch.tpu.synchronize()
    for a, b in zip(strict, other):
        assert torch.equal(a, b)


def test_math_backend_and_variable_choose_the_math_path(monkeypatch):
    B, H, T, E = 1, 2, 7, 8
    q, k, v = (rand((B, H, T, E), torch.float32, s) for s in (39, 40, 41))
    grad = rand((B, H, T, E), torch.float32, 42)
    with torch.tpu.precision("highest"):
        with sdpa_kernel(SDPBackend.MATH):
            got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", is_causal=True))
        assert (nf, nb) == (0, 0)
        want = reference(q, k, v, grad, torch.float32, is_causal=True)
        for g, w in zip(got, want):
            check_close(g, w, torch.float32)
        monkeypatch.setenv("TORCH_TPU_SDPA_MATH", "1")
        _, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu"))
        assert (nf, nb) == (0, 0)
        monkeypatch.delenv("TORCH_TPU_SDPA_MATH")
        _, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu"))
        assert (nf, nb) == (1, 1)
        # only the fused backends enabled: nothing can run these inputs
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            with pytest.raises(RuntimeError):
                F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"))


def run_bias(q, k, v, bias, grad, device, causal=False):
    """sdpa with an additive mask that requires grad; returns output and the four grads. On
    tpu with causal the fused ops are called directly (sdpa refuses a mask with is_causal); on
    CPU causal hides the upper triangle of the mask with -inf (zero gradient there)."""
    leaves = [t.to(device).detach().requires_grad_() for t in (q, k, v, bias)]
    if device == "tpu" and causal:
        aten = torch.ops.aten
        fwd = aten._scaled_dot_product_fused_attention_overrideable(*leaves, is_causal=True)
        o = fwd[0]
        grads = aten._scaled_dot_product_fused_attention_overrideable_backward(
            grad.to(device), *leaves, [True] * 4, o, fwd[1], None, None, fwd[4], fwd[5], 0.0,
            True, fwd[6], fwd[7])
        return [o] + list(grads)
    mask = leaves[3]
    if causal:
        T = q.shape[-2]
        mask = mask.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = F.scaled_dot_product_attention(*leaves[:3], attn_mask=mask)
    o.backward(grad.to(device))
    return [o] + [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ["tt", "b1tt", "bhtt", "1htt"])
@pytest.mark.parametrize("causal", [False, True])
def test_additive_mask_gradient(dtype, shape, causal, monkeypatch):
    """The fused backward gives an additive mask's gradient (dS summed over its broadcast
    dims), in the whole-pair and the split backward, against CPU's math path."""
    B, H, T, E = 2, 3, 131, 16
    q, k, v = (rand((B, H, T, E), dtype, s) for s in (43, 44, 45))
    grad = rand((B, H, T, E), dtype, 46)
    sizes = {"tt": (T, T), "b1tt": (B, 1, T, T), "bhtt": (B, H, T, T), "1htt": (1, H, T, T)}
    bias = rand(sizes[shape], dtype, 47)
    up = torch.float32
    with sdpa_kernel(SDPBackend.MATH):
        want = [t.to(dtype) for t in run_bias(q.to(up), k.to(up), v.to(up), bias.to(up),
                                                grad.to(up), "cpu", causal)]
    for split in ("0", "1"):
        monkeypatch.setenv("TORCH_TPU_SDPA_BWD_SPLIT", split)
        with torch.tpu.precision("highest"):
            got, nf, nb = fused_calls(lambda: run_bias(q, k, v, bias, grad, "tpu", causal))
        assert (nf, nb) == (1, 1)
        assert got[4].shape == bias.shape and got[4].dtype == dtype
        for g, w in zip(got, want):
            check_close(g, w, dtype, scale=2.0)


def test_no_grad_and_large_t_memory():
    """Forward only, T = 1024: peak device memory stays at the inputs and the output (the
    scores alone would take B * H * T * T * 4 = 8 MiB)."""
    B, H, T, E = 1, 2, 1024, 64
    q, k, v = (rand((B, H, T, E), torch.float32, s).to("tpu") for s in (47, 48, 49))
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    with torch.no_grad():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.tpu.synchronize()
    peak = torch.tpu.max_memory_allocated() - base
    assert peak < 2 * o.numel() * 4 + B * H * T * 4 + (1 << 16)
    with torch.tpu.precision("highest"):
        want = F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), is_causal=True)
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_split_gives_the_same_bits(monkeypatch, causal):
    """Few (batch, kv head) pairs split the backward by key blocks, then query blocks; the sums
    run in the same order as the one-pass backward, so the gradients are bitwise equal."""
    B, H, Hk, T, E = 2, 4, 2, 129, 16
    q, k, v = rand((B, H, T, E), torch.float32, 50), rand((B, Hk, T, E), torch.float32, 51), \
        rand((B, Hk, T, E), torch.float32, 52)
    grad = rand((B, H, T, E), torch.float32, 53)
    mask = rand((T, T), torch.float32, 54)
    kw = dict(is_causal=causal, enable_gqa=True) if causal else dict(attn_mask=mask, enable_gqa=True)
    whole = [t.cpu() for t in run(q, k, v, grad, "tpu", **dict(kw))]
    monkeypatch.setenv("TORCH_TPU_SDPA_BWD_SPLIT", "1")
    split, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", **dict(kw)))
    assert (nf, nb) == (1, 1)
    for a, b in zip(whole, split):
        assert torch.equal(a, b.cpu())
    # one (batch, kv head) pair: split by default on several threads; equal to its part above
    monkeypatch.delenv("TORCH_TPU_SDPA_BWD_SPLIT")
    one = run(q[:1, :2], k[:1, :1], v[:1, :1], grad[:1, :2], "tpu", **dict(kw))
    for a, b, h in zip(whole, one, (2, 2, 1, 1)):
        assert torch.equal(a[:1, :h], b.cpu())


def test_backward_inside_sdpa_kernel_overrideable_only():
    """The gradients' layout asks CPU's backend choice, which has no answer here."""
    q = rand((1, 2, 7, 8), torch.float32, 55).to("tpu").requires_grad_()
    with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
        (o, nf, nb) = fused_calls(lambda: F.scaled_dot_product_attention(q, q, q))
        o.sum().backward()
    assert nf == 1 and q.grad.shape == q.shape


# ---- attention in compiled graphs and DeferAndFuse traces ----

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class HandAttention(torch.nn.Module):
    """Attention written out as models write it: matmul, scale, mask, softmax, dropout,
    matmul (the mask styles of GPT-2, of an additive bias and of a boolean buffer)."""

    def __init__(self, style, T, H, p=0.0):
        super().__init__()
        self.style, self.p = style, p
        g = torch.Generator().manual_seed(60)
        self.register_buffer("hide", torch.rand(T, T, generator=g) > 0.7)
        self.bias = torch.nn.Parameter(torch.randn(H, T, T, generator=g))  # learned, as ALiBi's

    def forward(self, q, k, v):
        T, E = q.shape[-2], q.shape[-1]
        if self.style == "gpt2":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(E))
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            att = att.masked_fill(~causal, float("-inf"))
            att = F.softmax(att, dim=-1)
        elif self.style == "hf":  # Hugging Face's eager attention
            att = torch.matmul(q, k.transpose(2, 3)) * 0.25
            att = att + self.bias[:1, :T, :T].unsqueeze(0)
            att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
            att = F.dropout(att, p=self.p, training=self.training)
            return torch.matmul(att, v)
        elif self.style == "additive":
            att = q @ k.transpose(-1, -2) / math.sqrt(E) + self.bias
            att = att.softmax(-1)
        else:
            att = torch.matmul(q, k.transpose(2, 3)) * 0.3
            att = att.masked_fill(self.hide, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, self.p, self.training)
        return att @ v


def _grads_close(got, want, atol=2e-5, rtol=2e-5):
    for g, w in zip(got, want):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), w, atol=atol, rtol=rtol)


def _qkv(B, H, T, E, seed):
    return [rand((B, H, T, E), torch.float32, seed + i) for i in range(4)]


def _fwd_bwd(fn, q, k, v, grad, device):
    leaves = [t.to(device).detach().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(grad.to(device))
    return [o] + [t.grad for t in leaves]


@pytest.mark.parametrize("style", ["gpt2", "additive", "bool", "hf"])
def test_compiled_hand_written_attention_runs_fused(style):
    """torch.compile(backend="tpu") replaces the hand-written pattern by sdpa, whose graph
    nodes are the fused forward and backward: one kernel call each, no softmax, results of
    CPU's eager module (the learned additive mask's gradient too)."""
    torch._dynamo.reset()
    B, H, T, E = 2, 3, 67, 16
    q, k, v, grad = _qkv(B, H, T, E, 61)
    mod = HandAttention(style, T, H)
    want = _fwd_bwd(mod, q, k, v, grad, "cpu")
    tmod = HandAttention(style, T, H).to("tpu")
    before = torch.tpu.compilation_cache_stats()["attention_patterns"]
    f = torch.compile(tmod, backend="tpu")
    with torch.tpu.precision("highest"):
        with torch_tpu.debug.kernel_profile() as prof:
            got = _fwd_bwd(f, q, k, v, grad, "tpu")
            torch.tpu.synchronize()
    assert torch.tpu.compilation_cache_stats()["attention_patterns"] == before + 1
    assert prof.ops[FWD][0] == 1 and prof.ops[BWD][0] == 1
    assert not any("softmax" in name for name in prof.ops), sorted(prof.ops)
    _grads_close(got, want)
    if style in ("additive", "hf"):
        torch.testing.assert_close(tmod.bias.grad.cpu(), mod.bias.grad, atol=2e-5, rtol=2e-5)
    torch._dynamo.reset()


def test_compiled_gpt_block_matches_cpu():
    """The example GPT's block (causal masked_fill, dropout module) compiled, forward and
    backward against CPU eager: every parameter's gradient."""
    import copy
    import sys
    sys.path.insert(0, EXAMPLES)
    try:
        import train_gpt
    finally:
        sys.path.remove(EXAMPLES)
    torch._dynamo.reset()
    torch.manual_seed(62)
    blk = train_gpt.Block(64, 4, 0.1).eval()  # eval: dropout off, comparable with CPU
    x = rand((2, 33, 64), torch.float32, 63)
    ref = blk(x)
    ref.square().sum().backward()
    tb = copy.deepcopy(blk).to("tpu")
    for p in tb.parameters():
        p.grad = None
    f = torch.compile(tb, backend="tpu")
    with torch.tpu.precision("highest"):
        with torch_tpu.debug.kernel_profile() as prof:
            out = f(x.to("tpu"))
            out.square().sum().backward()
            torch.tpu.synchronize()
    assert prof.ops[FWD][0] == 1 and prof.ops[BWD][0] == 1
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=2e-5)
    for (name, p), tp in zip(blk.named_parameters(), tb.parameters()):
        torch.testing.assert_close(tp.grad.cpu(), p.grad, atol=5e-5, rtol=5e-5, msg=name)
    torch._dynamo.reset()


def test_compiled_dropout_attention_uses_the_fused_dropout():
    """In training the pattern's dropout becomes sdpa's dropout_p: the same mask in the
    forward and the backward (a finite, non-trivial gradient; output equal to eager fused
    sdpa with the same seed)."""
    torch._dynamo.reset()
    B, H, T, E = 1, 2, 40, 16
    q, k, v, grad = _qkv(B, H, T, E, 64)
    f = torch.compile(HandAttention("gpt2", T, H, p=0.5).train().to("tpu"), backend="tpu")
    torch.tpu.manual_seed(5)
    got, nf, nb = fused_calls(lambda: _fwd_bwd(f, q, k, v, grad, "tpu"))
    assert (nf, nb) == (1, 1)
    torch.tpu.manual_seed(5)
    eager = _fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, dropout_p=0.5, is_causal=True), q, k, v, grad, "tpu")
    for a, b in zip(got, eager):
        assert torch.equal(a.cpu(), b.cpu())
    torch._dynamo.reset()


def test_compiled_attention_never_holds_the_scores():
    """Forward and backward of compiled hand-written attention at T = 512: peak device memory
    above the inputs stays far below one T x T score matrix per head (4 MiB here)."""
    torch._dynamo.reset()
    B, H, T, E = 1, 4, 512, 16
    q, k, v, grad = (t.to("tpu") for t in _qkv(B, H, T, E, 65))
    f = torch.compile(HandAttention("gpt2", T, H).to("tpu"), backend="tpu")
    for _ in range(2):  # the first call compiles
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        f(*leaves).backward(grad)
        torch.tpu.synchronize()
        peak = torch.tpu.max_memory_allocated() - base
    scores = B * H * T * T * 4
    assert peak < scores // 4, (peak, scores)
    torch._dynamo.reset()


def test_defer_and_fuse_gpt_attention_matches_cpu():
    """A GPT attention written with sdpa, in DeferAndFuse: one fused node each way in the
    trace, results of CPU's math path, and no T x T buffer."""
    B, H, T, E = 1, 4, 512, 16
    q, k, v, grad = _qkv(B, H, T, E, 66)

    def attn(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)

    want = _fwd_bwd(attn, q, k, v, grad, "cpu")
    qt, kt, vt, gt = (t.to("tpu") for t in (q, k, v, grad))
    torch.tpu.synchronize()
    with torch.tpu.precision("highest"), torch_tpu.eager_mode("defer_and_fuse"):
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        got, nf, nb = fused_calls(lambda: [t.cpu() for t in _fwd_bwd(attn, qt, kt, vt, gt, "tpu")])
        peak = torch.tpu.max_memory_allocated() - base
    torch.tpu.synchronize()
    assert (nf, nb) == (1, 1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
    assert peak < B * H * T * T * 4 // 4, peak


def test_short_sequences_default_to_math():
    """With every backend enabled, fewer than TORCH_TPU_SDPA_FUSED_MIN_SCORES queries x keys
    (default 512 x 512) take the math path, which is faster there on the host target; the
    fused kernel still runs where the user asks for it, with dropout, and from that size."""
    prev = torch_tpu._C.set_sdpa_fused_min_scores(256 * 256)
    try:
        _short_sequences_take_math()
    finally:
        torch_tpu._C.set_sdpa_fused_min_scores(prev)


def _short_sequences_take_math():
    q, k, v = (rand((1, 2, 64, 16), torch.float32, s) for s in (1, 2, 3))
    grad = rand((1, 2, 64, 16), torch.float32, 4)
    want = reference(q, k, v, grad, torch.float32, is_causal=True)
    with torch.tpu.precision("highest"):
        got, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", is_causal=True))
        assert (nf, nb) == (0, 0)
        for g, w in zip(got, want):
            check_close(g, w, torch.float32)
        with sdpa_kernel(SDPBackend.OVERRIDEABLE):
            _, nf, nb = fused_calls(lambda: run(q, k, v, grad, "tpu", is_causal=True))
        assert (nf, nb) == (1, 1)
        _, nf, _ = fused_calls(lambda: run(q, k, v, grad, "tpu", dropout_p=0.5))
        assert nf == 1
        q2, k2, v2 = (rand((1, 1, 256, 8), torch.float32, s) for s in (5, 6, 7))
        _, nf, nb = fused_calls(lambda: run(q2, k2, v2, rand((1, 1, 256, 8), torch.float32, 8),
                                            "tpu", is_causal=True))
        assert (nf, nb) == (1, 1)
