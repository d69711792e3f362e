"""Random numbers on the pjrt target (runtime/lower/random.c) against the host target's.

Both targets follow the counter contract of runtime/base/philox.h, so a seed gives the same
numbers on both: each check runs the same code in a host child and a pjrt child and compares
what they drew (integers, Bernoulli draws and dropout masks exactly, float transforms within
rounding of the f64 math libraries)."""
import os
import subprocess
import sys
import textwrap

import torch

from tests.test_pjrt_target import ROOT, pytestmark, run_pjrt  # noqa: F401 (pytestmark skips)

DRAWS = """
import torch, torch_tpu
import torch.nn.functional as F
out = {}
def put(name, seed, f):
    torch.manual_seed(seed)
    r = f()
    for i, t in enumerate(r if isinstance(r, tuple) else (r,)):
        assert t.device.type == "tpu", (name, t.device)
        out[name + ("" if i == 0 else "#%d" % i)] = t.cpu()
tpu = "tpu"
mean = torch.linspace(-1, 1, 12).reshape(3, 4).to(tpu)
std = torch.linspace(0.1, 2, 4).to(tpu)
probs = torch.linspace(0, 1, 30).reshape(5, 6).to(tpu)
x = torch.randn(7, 9, generator=torch.Generator().manual_seed(0)).to(tpu)
put("rand", 1, lambda: torch.rand(5, 7, device=tpu))
put("rand_f64", 2, lambda: torch.rand(3, 11, dtype=torch.float64, device=tpu))
put("rand_0d", 3, lambda: torch.rand((), device=tpu))
put("randn", 4, lambda: torch.randn(3, 4, 5, device=tpu))
put("randn_f64", 5, lambda: torch.randn(33, dtype=torch.float64, device=tpu))
put("uniform_", 6, lambda: torch.empty(6, 5, device=tpu).uniform_(-2, 3))
put("uniform_view", 7, lambda: torch.zeros(6, 4, device=tpu).t().uniform_())
put("normal_", 8, lambda: torch.empty(40, device=tpu).normal_(1.5, 0.5))
put("normal_TT", 9, lambda: torch.normal(mean, std))
put("normal_Tf", 10, lambda: torch.normal(mean, 0.3))
put("normal_fT", 11, lambda: torch.normal(0.5, std))
put("normal_ff", 12, lambda: torch.normal(2.0, 3.0, size=(4, 6), device=tpu))
put("log_normal_", 13, lambda: torch.empty(25, device=tpu).log_normal_(0.5, 0.75))
put("cauchy_", 14, lambda: torch.empty(25, dtype=torch.float64, device=tpu).cauchy_(1.0, 2.0))
put("exponential_", 15, lambda: torch.empty(8, 8, device=tpu).exponential_(2.5))
put("geometric_", 16, lambda: torch.empty(40, device=tpu).geometric_(0.3))
put("geometric_i64", 17, lambda: torch.empty(40, dtype=torch.int64, device=tpu).geometric_(0.05))
put("bernoulli", 18, lambda: torch.bernoulli(probs))
put("bernoulli_f", 19, lambda: torch.empty(5, 6, device=tpu).bernoulli_(0.3))
put("bernoulli_T", 20, lambda: torch.zeros(5, 6, dtype=torch.int64, device=tpu).bernoulli_(probs))
put("bernoulli_p", 21, lambda: torch.bernoulli(x, 0.7))
put("bernoulli_bool", 22, lambda: torch.zeros(30, dtype=torch.bool, device=tpu).bernoulli_(0.5))
put("random_i64", 23, lambda: torch.empty(50, dtype=torch.int64, device=tpu).random_())
put("random_to", 24, lambda: torch.empty(50, dtype=torch.int64, device=tpu).random_(10))
put("random_from", 25, lambda: torch.empty(50, dtype=torch.int32, device=tpu).random_(-5, 5))
put("random_from_none", 26, lambda: torch.empty(50, dtype=torch.int16, device=tpu).random_(-7, None))
put("random_f32", 27, lambda: torch.empty(50, device=tpu).random_())
put("random_f64_to", 28, lambda: torch.empty(50, dtype=torch.float64, device=tpu).random_(1000))
put("random_u8", 29, lambda: torch.empty(50, dtype=torch.uint8, device=tpu).random_())
put("random_bool", 30, lambda: torch.empty(50, dtype=torch.bool, device=tpu).random_())
put("random_full", 31, lambda: torch.empty(20, dtype=torch.int64, device=tpu).random_(-2**63, 2**63 - 1))
put("randint", 32, lambda: torch.randint(3, 17, (4, 5), device=tpu))
put("native_dropout", 33, lambda: torch.native_dropout(x, 0.25, True))
put("native_dropout_eval", 34, lambda: torch.native_dropout(x, 0.25, False))
put("dropout", 35, lambda: F.dropout(x, 0.4, training=True))
put("dropout_f64", 36, lambda: F.dropout(x.double(), 0.5, training=True))
put("rand_bf16", 37, lambda: torch.rand(300, dtype=torch.bfloat16, device=tpu))
put("randn_f16", 38, lambda: torch.randn(300, dtype=torch.float16, device=tpu))
put("dropout_bf16", 39, lambda: F.dropout(x.bfloat16(), 0.3, training=True))
put("empty", 40, lambda: torch.rand(0, 3, device=tpu))
put("randperm", 41, lambda: torch.randperm(10, device=tpu))
put("randperm_1000", 42, lambda: torch.randperm(1000, dtype=torch.int32, device=tpu))
put("randperm_1", 43, lambda: torch.randperm(1, device=tpu))
torch.save(out, OUT)
"""

EXACT = ("bernoulli", "random", "randint", "randperm", "geometric", "native_dropout#1")


def _child(target, code, path, env=None):
    e = dict(os.environ, TORCH_TPU_TARGET=target, PYTHONPATH=ROOT)
    e.pop("TORCH_TPU_PJRT_PLUGIN", None)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", "OUT = %r\n" % path + textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.load(path)


def _compare(host, pjrt):
    assert sorted(host) == sorted(pjrt)
    for k in host:
        h, p = host[k], pjrt[k]
        assert h.dtype == p.dtype and h.shape == p.shape, (k, h.dtype, p.dtype, h.shape, p.shape)
        if k.startswith(EXACT) or not h.is_floating_point():
            assert torch.equal(h, p), (k, h, p)
        else:
            torch.testing.assert_close(p, h, rtol=1e-6, atol=1e-12, msg=lambda m: k + ": " + m)


def test_same_seed_same_numbers_as_the_host_target(tmp_path):
    host = _child("host", DRAWS, str(tmp_path / "host.pt"))
    pjrt = _child("pjrt", DRAWS, str(tmp_path / "pjrt.pt"))
    _compare(host, pjrt)
    # the draws are random-looking: not constant, in range, and a fresh seed per entry
    assert host["rand"].min() >= 0 and host["rand"].max() < 1 and host["rand"].std() > 0.1
    assert abs(float(host["randn_f64"].mean())) < 1.0 and host["randn_f64"].std() > 0.5
    assert torch.equal(host["randperm_1000"].sort().values, torch.arange(1000, dtype=torch.int32))
    assert not torch.equal(host["randperm_1000"], torch.arange(1000, dtype=torch.int32))
    m = host["native_dropout#1"]
    assert m.dtype == torch.bool and 0 < int(m.sum()) < m.numel()
    assert torch.equal(host["native_dropout_eval"], torch.randn(7, 9, generator=torch.Generator().manual_seed(0)))


def test_dropout_training_steps_in_defer_and_fuse_match_the_host_target(tmp_path):
    # 'highest' matmul precision: both targets then compute the float32 products alike, so
    # only the dropout draws could tell them apart
    code = """
        import warnings
        import torch, torch_tpu
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_float32_matmul_precision("highest")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                    torch.nn.Linear(32, 4))
        data = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(4)]
        model = model.to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(123)
        losses = []
        with torch_tpu.eager_mode("defer_and_fuse"):
            for xb, yb in data:
                loss = (model(xb.to("tpu")) - yb.to("tpu")).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
                torch_tpu.materialize()
        out = {"p%d" % i: p.detach().cpu() for i, p in enumerate(model.parameters())}
        out["loss"] = torch.stack(losses).cpu()
        torch.save(out, OUT)
    """
    host = _child("host", code, str(tmp_path / "host.pt"))
    pjrt = _child("pjrt", code, str(tmp_path / "pjrt.pt"))
    assert sorted(host) == sorted(pjrt)
    for k in host:
        torch.testing.assert_close(pjrt[k], host[k], rtol=1e-6, atol=1e-7, msg=lambda m: k + ": " + m)


def test_manual_seed_reproduces_and_successive_calls_differ():
    run_pjrt("""
        torch.manual_seed(7)
        a = torch.randn(64, device="tpu").cpu()
        b = torch.randn(64, device="tpu").cpu()
        torch.manual_seed(7)
        a2 = torch.randn(64, device="tpu").cpu()
        b2 = torch.randn(64, device="tpu").cpu()
        assert torch.equal(a, a2) and torch.equal(b, b2)
        assert not torch.equal(a, b)
        torch.manual_seed(8)
        assert not torch.equal(torch.randn(64, device="tpu").cpu(), a)
        g = torch.Generator(device="tpu").manual_seed(7)
        assert torch.equal(torch.randn(64, device="tpu", generator=g).cpu(), a)
    """)


def test_repeated_random_calls_reuse_one_program():
    run_pjrt("""
        def stats():
            torch.tpu.synchronize()
            return torch_tpu._C.pjrt_stats()
        for _ in range(3):  # a fresh output storage, then reused ones
            torch.rand(16, device="tpu")
        s0 = stats()
        seen = set()
        for _ in range(20):
            seen.add(tuple(torch.rand(16, device="tpu").cpu().tolist()))
        s1 = stats()
        assert len(seen) == 20
        assert s1["compiles"] == s0["compiles"], (s0, s1)
        assert s1["call_hits"] - s0["call_hits"] >= 20, (s0, s1)
        # a traced training step with dropout: after the first steps every flushed graph
        # finds its program by its call key (nothing composed, nothing compiled)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                    torch.nn.Linear(32, 4)).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        xb, yb = torch.randn(16, 8).to("tpu"), torch.randn(16, 4).to("tpu")
        losses = set()
        with torch_tpu.eager_mode("defer_and_fuse"):
            for step in range(8):
                if step == 4:
                    s0 = stats()
                loss = (model(xb) - yb).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                torch_tpu.materialize()
                losses.add(float(loss))
        s1 = stats()
        assert len(losses) == 8
        assert s1["compiles"] == s0["compiles"], (s0, s1)
        assert s1["runs"] - s0["runs"] == s1["call_hits"] - s0["call_hits"] > 0, (s0, s1)
    """)
