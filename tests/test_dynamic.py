"""Bounded dynamism of torch.compile(backend="tpu"): dynamic sizes run padded to buckets with
masking (torch_tpu/dynamic.py); results equal eager CPU at the real sizes, and a run over
many lengths builds at most one graph per bucket."""
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from torch_tpu import dynamic


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    torch.tpu.reset_compilation_cache_stats()
    yield
    torch._dynamo.reset()


class TinyLM(nn.Module):
    """Embedding, layer norm, causal attention (explicit softmax or SDPA), MLP, head."""

    def __init__(self, vocab=29, width=16, heads=2, sdpa=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(512, width)
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.head = nn.Linear(width, vocab)
        self.heads, self.sdpa = heads, sdpa

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            a = att.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        logits = self.head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _pair(make):
    torch.manual_seed(0)
    ref = make()
    dev = make()
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to("tpu")


def test_bucket_of():
    assert dynamic.bucket_of(17) == (32, 17)
    assert dynamic.bucket_of(32) == (32, 17)
    assert dynamic.bucket_of(33) == (64, 33)
    assert dynamic.bucket_of(2) == (2, 2)
    assert dynamic.bucket_of(100, (64, 128, 256)) == (128, 65)
    assert dynamic.bucket_of(300, (64, 128, 256)) == (None, None)


@pytest.mark.parametrize("sdpa", [False, True])
def test_fifty_lengths_one_graph_per_bucket(sdpa):
    ref, dev = _pair(lambda: TinyLM(sdpa=sdpa).eval())
    f = torch.compile(dev, backend="tpu", dynamic=True)
    rng = random.Random(0)
    lengths = [17, 512] + rng.sample(range(18, 512), 48)
    buckets = {dynamic.bucket_of(t)[0] for t in lengths}
    assert len(lengths) == 50 and len(buckets) == 5
    with torch.no_grad(), torch.tpu.precision("highest"):
        for T in lengths:
            g = torch.Generator().manual_seed(T)
            idx = torch.randint(0, 29, (2, T), generator=g)
            tgt = torch.randint(0, 29, (2, T), generator=g)
            want_logits, want_loss = ref(idx, tgt)
            logits, loss = f(idx.to("tpu"), tgt.to("tpu"))
            assert logits.shape == (2, T, 29)
            torch.testing.assert_close(logits.cpu(), want_logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(loss.cpu(), want_loss, rtol=1e-5, atol=1e-5)
    s = torch.tpu.compilation_cache_stats()
    assert s["dynamo_graphs"] == 1, s  # one dynamic graph, no recompile
    assert s["pad_fallbacks"] == {}, s["pad_fallbacks"]
    per = s["graphs_per_bucket"]
    assert len(per) == len(buckets) and all(n == 1 for n in per.values()), per
    assert s["bucket_graphs"] == len(buckets)
    assert s["padded_runs"] >= 49


def _check_fn(fn, shapes, dims=(1,), atol=1e-5, **compile_kw):
    f = torch.compile(fn, backend="tpu", **compile_kw)
    for shape in shapes:
        x = torch.randn(shape)
        if not compile_kw.get("dynamic"):
            xd = x.to("tpu")
            for d in dims:
                torch._dynamo.mark_dynamic(xd, d)
        else:
            xd = x.to("tpu")
        with torch.tpu.precision("highest"):
            got = f(xd)
        want = fn(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=atol)


def _reductions(x):
    # x: (B, T, C) with T dynamic; every op mixes elements along T
    return (x.sum(1), x.mean(1), x.amax(1), x.amin(1), x.var(1), x.std(1, keepdim=True),
            x.softmax(1), F.log_softmax(x, 1), x.logsumexp(1), x.argmax(1),
            (x > 0).any(1), x.prod(1), x.cumsum(1), x.mean(), x.sum(), x.max(1).values,
            x.transpose(1, 2) @ x, x[:, -1], x[:, 1:] - x[:, :-1])


def test_reductions_over_the_dynamic_dim():
    shapes = [(3, t, 5) for t in (19, 40, 23, 64, 33)]
    _check_fn(_reductions, shapes, dynamic=True)
    s = torch.tpu.compilation_cache_stats()
    assert s["padded_runs"] >= 4 and s["pad_fallbacks"] == {}, s


def test_windows_buffers_and_views_of_inputs():
    mask = torch.randn(64, 64).tril()

    def fn(x):
        m = mask.to(x.device)[:x.shape[1], :x.shape[1]]  # a static buffer cut to the length
        y = x * 2
        return (x[:, -4:], x[:, -1], x[:, 2:], x[:, :-3].sum(1), x.transpose(0, 1), x[1],
                (m @ x[0]).softmax(0), y, y[:, 3:], y.transpose(1, 2), x.roll(3, 1))
    shapes = [(3, t, 5) for t in (19, 40, 23, 63)]
    f = torch.compile(fn, backend="tpu", dynamic=True)
    for shape in shapes:
        x = torch.randn(shape)
        with torch.tpu.precision("highest"):
            got = f(x.to("tpu"))
        for g, w in zip(got, fn(x)):
            assert g.shape == w.shape
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    s = torch.tpu.compilation_cache_stats()
    assert s["padded_runs"] == 4 and s["pad_fallbacks"] == {}, s


def test_mark_dynamic_path():
    def fn(x):
        w = torch.softmax(x @ x.transpose(-1, -2), -1)
        return (w @ x).mean(-2), x.mean(-2)
    _check_fn(fn, [(4, t, 8) for t in (20, 37, 50, 45)], dims=(1,))
    s = torch.tpu.compilation_cache_stats()
    assert s["dynamo_graphs"] == 1 and s["padded_runs"] == 4, s
    assert set(s["graphs_per_bucket"]) == {"s1=32", "s1=64"} or len(s["graphs_per_bucket"]) == 2


def test_buckets_option_and_validation():
    fn = lambda x: (x.exp().sum(0), x.softmax(0))  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True, options={"buckets": [48, 96]})
    for n in (20, 47, 48, 60, 96, 130):
        x = torch.randn(n, 3)
        for g, w in zip(f(x.to("tpu")), fn(x)):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    s = torch.tpu.compilation_cache_stats()
    assert s["bucket_graphs"] == 2 and s["padded_runs"] == 5 and s["exact_runs"] == 1, s
    for bad in ([], [64, 32], [0, 8], "64", [16.0]):
        torch._dynamo.reset()
        g = torch.compile(fn, backend="tpu", options={"buckets": bad})
        with pytest.raises(Exception, match="option buckets"):
            g(torch.randn(4, 3, device="tpu"))


def test_unpaddable_graph_runs_exact_and_is_counted():
    fn = lambda x: torch.sort(x, dim=0).values * 2  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True)
    for n in (20, 27):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x.to("tpu")).cpu(), fn(x))
    s = torch.tpu.compilation_cache_stats()
    assert s["exact_runs"] == 2 and any("sort" in k for k in s["pad_fallbacks"]), s


def test_training_step_with_dynamic_length_matches_cpu():
    ref, dev = _pair(TinyLM)
    f = torch.compile(dev, backend="tpu", dynamic=True)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1)
    with torch.tpu.precision("highest"):
        for B, T in ((3, 21), (3, 50), (2, 37), (3, 120)):  # B=3 pads to 4: B*T has 2 factors
            g = torch.Generator().manual_seed(T)
            idx = torch.randint(0, 29, (B, T), generator=g)
            tgt = torch.randint(0, 29, (B, T), generator=g)
            _, lr_ = ref(idx, tgt)
            _, ld = f(idx.to("tpu"), tgt.to("tpu"))
            opt_r.zero_grad()
            opt_d.zero_grad()
            lr_.backward()
            ld.backward()
            torch.testing.assert_close(ld.cpu(), lr_, rtol=1e-5, atol=1e-5)
            for (n, pr), pd in zip(ref.named_parameters(), dev.parameters()):
                torch.testing.assert_close(pd.grad.cpu(), pr.grad, rtol=1e-4, atol=1e-5, msg=n)
            opt_r.step()
            opt_d.step()
    s = torch.tpu.compilation_cache_stats()
    assert s["pad_fallbacks"] == {}, s["pad_fallbacks"]
    assert s["padded_runs"] >= 6, s  # forward and backward of the dynamic graph, padded


def test_automatic_dynamic_recompile_is_bucketed():
    def fn(x):
        return torch.softmax(x, -1).sum(-1), F.layer_norm(x.transpose(0, 1), (x.shape[0],))
    f = torch.compile(fn, backend="tpu")  # static first, Dynamo's dynamic recompile after
    for n in (20, 24, 30, 50, 60):
        x = torch.randn(6, n)
        for g, w in zip(f(x.to("tpu")), fn(x)):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    s = torch.tpu.compilation_cache_stats()
    assert s["dynamo_graphs"] == 2 and s["padded_runs"] == 4 and s["bucket_graphs"] == 2, s


def test_pad_dynamic_off_and_validation():
    fn = lambda x: x.softmax(0)  # noqa: E731
    f = torch.compile(fn, backend="tpu", dynamic=True, options={"pad_dynamic": False})
    x = torch.randn(20, 3)
    torch.testing.assert_close(f(x.to("tpu")).cpu(), fn(x))
    assert torch.tpu.compilation_cache_stats()["padded_runs"] == 0
    torch._dynamo.reset()
    g = torch.compile(fn, backend="tpu", options={"pad_dynamic": "yes"})
    with pytest.raises(Exception, match="option pad_dynamic"):
        g(x.to("tpu"))
