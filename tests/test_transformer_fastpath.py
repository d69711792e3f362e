"""Inference fast path of nn.MultiheadAttention / nn.TransformerEncoder(Layer) on tpu.

In eval/no_grad with batch_first, PyTorch calls torch._native_multi_head_attention and
torch._transformer_encoder_layer_fwd for device tpu as for cpu (and packs a padded batch into a
nested tensor in TransformerEncoder); each case runs the same module on cpu and on tpu and
compares outputs (values at float32 tolerance under precision "highest", shapes, dtypes)."""
import copy
import itertools

import pytest
import torch
import torch.nn as nn

import torch_tpu

MODES = ["strict", "defer_and_fuse"]
TOL = dict(atol=2e-5, rtol=2e-5, equal_nan=True)  # cpu: a fully masked row is NaN


def close(got, want):
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.device.type == "tpu"
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, **TOL)


def run_both(module, fn, mode, grad=False):
    """fn(module, device) on cpu and on a copy of the module on tpu (eval, inputs made inside)."""
    torch.manual_seed(1)
    module = module.eval()
    tpu_module = copy.deepcopy(module).to("tpu")
    ctx = torch.enable_grad if grad else torch.no_grad
    with ctx():
        want = fn(module, "cpu")
        with torch_tpu.eager_mode(mode), torch.tpu.precision("highest"):
            got = fn(tpu_module, "tpu")
            torch_tpu.materialize()
    return got, want


def inputs(B, T, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=g)


def padding_mask(B, T, kind):
    m = torch.zeros(B, T, dtype=torch.bool)
    if kind == "tail":  # left-aligned: padding at the end
        for b in range(B):
            m[b, T - 1 - (b % max(T - 1, 1)):] = True
        m[0, :] = False
    elif kind == "gaps":
        m[:, ::3] = True
        m[:, 0] = False
    elif kind == "full":  # one sequence entirely padded
        m[:, T - 1] = True
        m[B - 1, :] = True
    return m


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("mask", ["none", "attn_bool", "attn_float", "key_padding", "both",
                                  "key_padding_full"])
@pytest.mark.parametrize("B", [1, 3])
def test_mha_fastpath(mode, need_weights, average, mask, B):
    T, D, H = 5, 8, 2
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    x = inputs(B, T, D)
    attn = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    kpm = padding_mask(B, T, "full" if mask == "key_padding_full" else "tail")
    kw = {}
    if mask in ("attn_bool", "both"):
        kw["attn_mask"] = attn
    if mask == "attn_float":
        kw["attn_mask"] = torch.zeros(T, T).masked_fill(attn, float("-inf"))
    if mask in ("key_padding", "both", "key_padding_full"):
        kw["key_padding_mask"] = kpm

    def fn(m, dev):
        a = {k: v.to(dev) for k, v in kw.items()}
        xx = x.to(dev)
        out, w = m(xx, xx, xx, need_weights=need_weights, average_attn_weights=average, **a)
        return out, w

    got, want = run_both(mha, fn, mode)
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("mode", MODES)
def test_mha_fastpath_cross_attention(mode):
    mha = nn.MultiheadAttention(8, 4, batch_first=True)
    q, k, v = inputs(2, 4, 8, 0), inputs(2, 4, 8, 1), inputs(2, 4, 8, 2)

    def fn(m, dev):
        return m(q.to(dev), k.to(dev), v.to(dev))

    got, want = run_both(mha, fn, mode)
    for g, w in zip(got, want):
        close(g, w)
    got, want = run_both(mha, lambda m, dev: m(q.to(dev), k.to(dev), k.to(dev)), mode)
    for g, w in zip(got, want):
        close(g, w)


def layer(act, norm_first, D=8, H=2):
    return nn.TransformerEncoderLayer(D, H, dim_feedforward=16, dropout=0.1, activation=act,
                                      batch_first=True, norm_first=norm_first, layer_norm_eps=1e-4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("act,norm_first", list(itertools.product(["relu", "gelu"], [False, True])))
@pytest.mark.parametrize("mask", ["none", "key_padding", "key_padding_full", "src_mask"])
@pytest.mark.parametrize("B", [1, 3])
def test_encoder_layer_fastpath(mode, act, norm_first, mask, B):
    T, D = 6, 8
    mod = layer(act, norm_first)
    x = inputs(B, T, D)
    kpm = padding_mask(B, T, "full" if mask == "key_padding_full" else "tail")

    def fn(m, dev):
        kw = {}
        if mask.startswith("key_padding"):
            kw["src_key_padding_mask"] = kpm.to(dev)
        if mask == "src_mask":
            kw["src_mask"] = nn.Transformer.generate_square_subsequent_mask(T).to(dev)
        return (m(x.to(dev), **kw),)

    got, want = run_both(mod, fn, mode)
    close(got[0], want[0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["tail", "gaps", "full", "none"])
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("mask_check", [True, False])
def test_encoder_fastpath(mode, kind, B, mask_check):
    """TransformerEncoder: left-aligned padding masks go through nested tensors (padded positions
    of the output are zeros, as on cpu); other masks run each layer with a padding mask."""
    T, D = 7, 8
    enc = nn.TransformerEncoder(layer("gelu", False), 2, enable_nested_tensor=True,
                                mask_check=mask_check)
    x = inputs(B, T, D)
    kpm = padding_mask(B, T, kind)
    if kind == "gaps" and not mask_check:
        pytest.skip("cpu itself packs the first len tokens of a gapped mask (undefined use)")

    def fn(m, dev):
        kw = {} if kind == "none" else {"src_key_padding_mask": kpm.to(dev)}
        return (m(x.to(dev), **kw),)

    if kind == "full" and B == 1:  # every sequence empty: cpu raises in to_padded_tensor
        with torch.no_grad():
            with pytest.raises(RuntimeError, match="non-zero numel"):
                enc.eval()(x, src_key_padding_mask=kpm)
            t = copy.deepcopy(enc).to("tpu")
            with torch_tpu.eager_mode(mode), pytest.raises(RuntimeError, match="non-zero numel"):
                t(x.to("tpu"), src_key_padding_mask=kpm.to("tpu"))
        return
    got, want = run_both(enc, fn, mode)
    close(got[0], want[0])


@pytest.mark.parametrize("mode", MODES)
def test_encoder_eval_with_grad(mode):
    """eval() alone (grad enabled, parameters requiring grad) takes the ordinary path; values
    still match cpu."""
    enc = nn.TransformerEncoder(layer("relu", True), 2, enable_nested_tensor=False)
    x = inputs(2, 5, 8)
    kpm = padding_mask(2, 5, "tail")
    got, want = run_both(enc, lambda m, dev: (m(x.to(dev), src_key_padding_mask=kpm.to(dev)),),
                         mode, grad=True)
    close(got[0].detach(), want[0].detach())


def test_masked_softmax_ops():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    for mask, mt in [(torch.rand(4, 4) > 0.5, 0), (torch.rand(2, 4) > 0.5, 1),
                     (torch.rand(2, 3, 4, 4) > 0.5, 2), (torch.ones(2, 4, dtype=torch.bool), 1)]:
        want = torch._masked_softmax(x, mask, 3, mt)
        with torch.tpu.precision("highest"):
            got = torch._masked_softmax(x.to("tpu"), mask.to("tpu"), 3, mt)
        close(got, want)
    with pytest.raises(RuntimeError):
        torch._masked_softmax(x.to("tpu"), torch.ones(3, 4, dtype=torch.bool, device="tpu"), 3, 1)
    qkv, bias = torch.randn(2, 3, 24), torch.randn(24)
    want = torch._transform_bias_rescale_qkv(qkv, bias, 2)
    got = torch._transform_bias_rescale_qkv(qkv.to("tpu"), bias.to("tpu"), 2)
    for g, w in zip(got, want):
        close(g, w)
        assert g.stride() == w.stride()


def test_encoder_defer_and_compile_smoke():
    enc = nn.TransformerEncoder(layer("relu", False), 2, enable_nested_tensor=True).eval()
    x = inputs(2, 6, 8)
    kpm = padding_mask(2, 6, "tail")
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=kpm)
        want_nomask = enc(x)
        t = copy.deepcopy(enc).to("tpu")
        with torch_tpu.eager_mode("defer_and_fuse"), torch.tpu.precision("highest"):
            got = t(x.to("tpu"), src_key_padding_mask=kpm.to("tpu"))
            torch_tpu.materialize()
        close(got, want)
        with torch.tpu.precision("highest"):
            c = torch.compile(t, backend="tpu")
            got = c(x.to("tpu"))
        close(got, want_nomask)
