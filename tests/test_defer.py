"""DeferAndFuse: liveness, materialization points, in-place and views, fusion,
the three-tier compile cache across processes, corruption, the repeated-block
heuristic and graph dumps. (The op suites also run in this mode: conftest.)"""
import glob
import re
import os

import pytest
import torch

import torch_tpu
from conftest import run_python


def test_mode_api_and_env():
    assert torch_tpu.get_eager_mode() == "strict"
    with torch_tpu.eager_mode("defer_and_fuse"):
        assert torch_tpu.get_eager_mode() == "defer_and_fuse"
    assert torch_tpu.get_eager_mode() == "strict"
    with pytest.raises(ValueError, match="defer_and_fuse"):
        torch_tpu.set_eager_mode("lazy")
    r = run_python("import torch, torch_tpu; print(torch_tpu.get_eager_mode())",
                   env={"TORCH_TPU_DEFER_AND_FUSE": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "defer_and_fuse", r.stderr


def test_dead_intermediates_allocate_nothing(defer):
    x = torch.randn(1 << 20, device="tpu")  # 4 MiB
    torch_tpu.materialize()
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    y = ((x * 2 + 1).exp() * 0.5).sigmoid()  # four dead intermediates
    # before a materialization nothing has memory: y's bytes are promised (they count
    # against the capacity, as in strict), and the dead intermediates' stay promised until
    # the flush: the trace may still compute them, so an allocation that does not fit
    # beside them flushes first (issue 13)
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.memory_stats()["promised_bytes.all.current"] == 5 * (4 << 20)
    assert torch_tpu._C.trace_length(0) > 0
    torch_tpu.materialize()
    torch.tpu.synchronize()
    # only y got memory; with fusion the intermediates never did, not even for a moment
    assert torch.tpu.memory_allocated() - base == 4 << 20
    assert torch.tpu.max_memory_allocated() - base == 4 << 20
    assert torch.tpu.memory_stats()["promised_bytes.all.current"] == 0
    expected = ((x.cpu() * 2 + 1).exp() * 0.5).sigmoid()
    torch.testing.assert_close(y.cpu(), expected)


def test_unobserved_work_is_dropped(defer):
    torch_tpu.modes.reset_trace_stats()
    x = torch.randn(1000, device="tpu")
    (x * 3).exp()  # result dropped at once
    keep = x + 1
    torch.tpu.synchronize()
    s = torch_tpu.modes.trace_stats()
    assert s["nodes_dropped"] >= 2
    torch.testing.assert_close(keep.cpu(), x.cpu() + 1)


def test_materialization_points(defer):
    x = torch.arange(10.0, device="tpu")
    y = x * 2
    assert torch_tpu._C.trace_length(0) > 0
    assert y.sum().item() == 90.0  # .item()
    assert torch_tpu._C.trace_length(0) == 0
    z = y - 1
    assert z.cpu().tolist()[3] == 5.0  # .cpu()
    m = z > 4
    assert bool(m.any())  # bool()
    assert "tpu" in repr(z)  # printing
    nz = torch.nonzero(z > 10)  # data-dependent shape
    assert nz.shape == (4, 1)
    sel = torch.masked_select(z, z > 10)
    assert sel.tolist() == [11.0, 13.0, 15.0, 17.0]
    u = torch.unique(torch.tensor([3, 1, 3, 2], device="tpu") * 1)
    assert u.tolist() == [1, 2, 3]
    w = z + 1
    torch.tpu.synchronize()
    assert torch_tpu._C.trace_length(0) == 0
    assert w.cpu()[0] == 0


def test_graph_size_cap():
    code = """
import torch, torch_tpu
x = torch.zeros(8, device='tpu')
for i in range(50):
    x = x + 1
print(torch_tpu._C.trace_length(0) <= 16, torch_tpu.modes.trace_stats()['flushes'] >= 3, x.cpu()[0].item())
"""
    r = run_python(code, env={"TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_DEFER_MAX_NODES": "16",
                              "TORCH_TPU_DEFER_REPEAT": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "50.0"]


def test_inplace_and_views_match_strict(defer):
    base = torch.arange(24.0).reshape(4, 6)
    t = base.to("tpu")
    v = t[1:3, ::2]            # a strided view
    v.mul_(10)                 # in place through the view
    t.add_(1)
    row = t[0]
    row.copy_(torch.full((6,), -1.0, device="tpu"))
    w = t.t().contiguous() * 2
    c = base.clone()
    c[1:3, ::2] *= 10
    c += 1
    c[0] = -1
    torch.testing.assert_close(t.cpu(), c)
    torch.testing.assert_close(w.cpu(), c.t().contiguous() * 2)
    assert v.data_ptr() == t.data_ptr() + (6 + 0) * 4  # views still share the storage


def test_errors_surface_and_device_keeps_working(defer):
    x = torch.randn(4, 5, device="tpu")
    idx = torch.tensor([0, 7], device="tpu")
    with pytest.raises(IndexError, match="index_select"):
        r = torch.index_select(x, 0, idx)
        torch.tpu.synchronize()
    ok = x * 2
    torch.testing.assert_close(ok.cpu(), x.cpu() * 2)


def test_fused_kernels_and_scalars_do_not_recompile(defer):
    torch_tpu.modes.wait_compiles()
    torch.tpu.reset_compilation_cache_stats()
    p = torch.randn(4096, device="tpu")
    g = torch.randn(4096, device="tpu")
    outs = []
    for lr in (0.1, 0.01, 0.001, 0.0001):
        outs.append((p - lr * (g * g + 1).sqrt()).cpu())  # a fusible chain, lr changes
        torch_tpu.modes.wait_compiles()
    for lr, o in zip((0.1, 0.01, 0.001, 0.0001), outs):
        torch.testing.assert_close(o, p.cpu() - lr * (g.cpu() * g.cpu() + 1).sqrt())
    s = torch.tpu.compilation_cache_stats()
    assert s["compiles"] <= 1, s  # one kernel, whatever lr is
    assert s["tier1_hits"] >= 2, s
    assert torch_tpu.modes.trace_stats()["nodes_fused"] > 0


CACHE_SCRIPT = """
import torch, torch_tpu
x = torch.linspace(-3, 3, 4096, device='tpu')
y = ((x * 1.5 + 0.25).tanh() * x).exp()
print(y.sum().item())
torch_tpu.modes.wait_compiles()
s = torch.tpu.compilation_cache_stats()
print(s['compiles'], s['tier1_hits'], s['tier2_hits'], s['tier3_hits'], s['misses'],
      s['corrupt_entries'])
"""


def _cache_env(tmp_path, tier2=True):
    return {"TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_ASYNC_COMPILE": "0",
            "TORCH_TPU_TIER2_COMPILATION_CACHE": str(tmp_path / "t2") if tier2 else "disabled",
            "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path / "t3")}


def _run_cache(env):
    r = run_python(CACHE_SCRIPT, env=env)
    assert r.returncode == 0, r.stderr
    value, stats = r.stdout.strip().splitlines()
    return float(value), [int(v) for v in stats.split()]


def test_cache_tiers_across_processes(tmp_path):
    env = _cache_env(tmp_path)
    v1, (compiles, _, t2, t3, misses, _) = _run_cache(env)
    assert compiles == 1 and misses == 1 and t2 == 0 and t3 == 0
    v2, (compiles, _, t2, t3, misses, _) = _run_cache(env)  # same machine: tier 2
    assert compiles == 0 and misses == 0 and t2 == 1
    assert v1 == v2
    env3 = _cache_env(tmp_path, tier2=False)  # "after a restart": tier 3 only
    v3, (compiles, _, t2, t3, misses, _) = _run_cache(env3)
    assert compiles == 0 and t3 == 1 and v3 == v1
    x = torch.linspace(-3, 3, 4096)
    assert abs(v1 - ((x * 1.5 + 0.25).tanh() * x).exp().sum().item()) < 1e-2 * abs(v1)


def test_corrupted_cache_entries_are_recompiled(tmp_path):
    env = _cache_env(tmp_path, tier2=False)
    v1, _ = _run_cache(env)
    entries = glob.glob(str(tmp_path / "t3" / "*" / "*.so"))
    assert len(entries) == 1
    with open(entries[0], "r+b") as f:  # flip a byte in the middle of the payload
        f.seek(os.path.getsize(entries[0]) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    v2, (compiles, _, _, t3, _, corrupt) = _run_cache(env)
    assert corrupt == 1 and compiles == 1 and t3 == 0 and v2 == v1
    with open(entries[0], "r+b") as f:  # truncate
        f.truncate(100)
    v3, (compiles, _, _, t3, _, corrupt) = _run_cache(env)
    assert corrupt == 1 and compiles == 1 and v3 == v1


def test_unwritable_tier3_degrades_with_a_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = _cache_env(tmp_path)
    env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = str(blocker / "cache")
    code = CACHE_SCRIPT + "\nimport warnings\nwith warnings.catch_warnings(record=True) as w:\n" \
        "    warnings.simplefilter('always')\n    torch.tpu.synchronize()\n" \
        "print(any('tier' in str(x.message).lower() or 'cache' in str(x.message).lower() for x in w))\n"
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[2].strip() == "True", r.stdout


def test_clear_compilation_cache(tmp_path):
    env = _cache_env(tmp_path)
    _run_cache(env)
    code = "import torch, torch_tpu\ntorch.tpu.clear_compilation_cache(2)\n" \
           "torch.tpu.clear_compilation_cache(3)\n"
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    assert not glob.glob(str(tmp_path / "t2" / "*.so"))
    assert not glob.glob(str(tmp_path / "t3" / "*" / "*.so"))
    with pytest.raises(ValueError):
        torch.tpu.clear_compilation_cache(7)


def test_no_compiler_falls_back_with_warning(tmp_path):
    env = _cache_env(tmp_path)
    env["TORCH_TPU_CC"] = "/nonexistent/cc"
    code = CACHE_SCRIPT + "\nimport warnings\nwith warnings.catch_warnings(record=True) as w:\n" \
        "    warnings.simplefilter('always')\n    torch.tpu.synchronize()\n" \
        "print(sum('fused kernels are unavailable' in str(x.message) for x in w))\n"
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    x = torch.linspace(-3, 3, 4096)
    assert abs(float(lines[0]) - ((x * 1.5 + 0.25).tanh() * x).exp().sum().item()) < 1e-2 * abs(float(lines[0]))
    assert lines[2] == "1"


def test_repeated_blocks_share_graphs():
    code = """
import torch, torch_tpu
torch.manual_seed(0)
class Block(torch.nn.Module):  # pre-norm MLP block with a residual: 5 ops
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 32)
    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
model = torch.nn.Sequential(*[Block() for _ in range(12)]).to('tpu')
x = torch.randn(8, 32, device='tpu')
torch_tpu.set_eager_mode('defer_and_fuse')
torch_tpu.debug.dump_graphs('GRAPHS')
y = model(x)
y.sum().item()
torch_tpu.debug.dump_graphs(None)
print(torch_tpu.modes.trace_stats()['repeat_cuts'])
"""
    import tempfile
    d = tempfile.mkdtemp()
    r = run_python(code.replace("GRAPHS", d), env={"TORCH_TPU_DEFER_MAX_NODES": "100000"})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 8
    texts = [open(p).read() for p in sorted(glob.glob(os.path.join(d, "*.mlir")))]
    # each block's graph prints the same ops: few distinct graph texts
    shapes = {"\n".join(line.split("=", 1)[-1].split("{")[0].split("(")[0].strip()
                        for line in re.sub(r'tpu\.buffer = "[^"]*"', "", t).splitlines()[2:-2])
              for t in texts}
    assert len(texts) >= 10 and len(shapes) <= 4, (len(texts), len(shapes))
    assert all(t.startswith("// TorchTPU DeferAndFuse graph") and "func.func @main" in t
               for t in texts)
    assert any("stablehlo.dot_general" in t or "aten::addmm" in t for t in texts)


def test_gpt_defer_matches_strict():
    code = """
import sys, torch, torch_tpu
sys.path.insert(0, 'examples')
import train_gpt
def run(mode):
    torch_tpu.set_eager_mode(mode)
    args = train_gpt.parser().parse_args(['--device', 'tpu', '--steps', '20', '--log-every', '100000'])
    losses = train_gpt.train(args)
    torch.tpu.synchronize()
    torch_tpu.set_eager_mode('strict')
    return losses
a = run('strict'); b = run('defer_and_fuse')
print(max(abs(x - y) / abs(x) for x, y in zip(a, b)))
"""
    r = run_python(code, env={"TORCH_TPU_ASYNC_COMPILE": "0"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip().splitlines()[-1]) <= 1e-5


def test_adamw_updates_fuse_per_parameter():
    code = """
import torch, torch_tpu
def run(mode):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to('tpu')
    o = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)
    torch_tpu.set_eager_mode(mode)
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        x = torch.randn(2, 8, generator=g)
        m(x.to('tpu')).sum().backward()
        o.step(); o.zero_grad()
        torch.tpu.synchronize()
    torch_tpu.set_eager_mode('strict')
    return [p.detach().cpu() for p in m.parameters()]
a = run('strict'); b = run('defer_and_fuse')
s = torch_tpu.modes.trace_stats()
print(max((x - y).abs().max().item() for x, y in zip(a, b)), s['nodes_fused'], s['elided_bytes'])
"""
    r = run_python(code, env={"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_DEFER_REPEAT": "0"})
    assert r.returncode == 0, r.stderr
    diff, fused, elided = r.stdout.split()
    assert float(diff) < 1e-6
    # the per-parameter update chains (foreach ops) became fused kernels, and the
    # denominators (exp_avg_sq.sqrt() / bc + eps) never got memory
    assert int(fused) >= 4 * 8 and int(elided) > 0


def test_fused_chains_over_single_elements(defer):
    # a value written and read again inside one fused group, with one element
    # (the group must keep it in the group, not read the never-backed buffer)
    x = torch.tensor(0.5, device="tpu", requires_grad=True)
    y = ((x * 2).exp() * x).erf() * 3
    y.backward()
    xc = torch.tensor(0.5, requires_grad=True)
    yc = ((xc * 2).exp() * xc).erf() * 3
    yc.backward()
    torch.testing.assert_close(y.detach().cpu(), yc.detach())
    torch.testing.assert_close(x.grad.cpu(), xc.grad)
