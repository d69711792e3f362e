"""Everyday PyTorch features on tpu (issue 17 item 4), each compared with CPU: the profiler,
torch.save/load and safetensors, pinned-memory data loading with non_blocking copies,
activation checkpointing, anomaly detection, deterministic mode, memory summary and
snapshots."""
import io
import json
import os
import pickle
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import torch_tpu

MODES = ["strict", "debug", "defer_and_fuse"]


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 8))


# ---- torch.profiler ----
def _kernel_events(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    return ([e for e in events if e.get("cat") == "kernel"],
            [e for e in events if e.get("cat") == "cpu_op"])


def test_profiler_records_tpu_kernels_and_exports_chrome_trace(tmp_path):
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        y = (x @ x).relu()
        s = y.sum()
        s.item()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels, cpu_ops = _kernel_events(path)
    names = {e["name"] for e in kernels}
    assert {"mm", "relu", "sum"} <= names, names
    assert {"aten::mm", "aten::relu", "aten::sum"} <= {e["name"] for e in cpu_ops}
    for e in kernels:
        assert e["dur"] > 0 and e["pid"] == 0  # device 0's track
    # each kernel is linked to the CPU op that issued it, and starts after it did
    by_corr = {}
    for e in cpu_ops:
        if "External id" in e.get("args", {}):
            by_corr[e["args"]["External id"]] = e
    mm = next(e for e in kernels if e["name"] == "mm")
    op = by_corr[mm["args"]["External id"]]
    assert op["name"] == "aten::mm"
    assert mm["ts"] >= op["ts"] - 50  # us; the two clocks agree to well within that
    # device time reaches the op table
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::mm"].device_time_total > 0
    assert avg["aten::relu"].device_time_total > 0
    assert "TPU" in prof.key_averages().table(row_limit=5)
    torch.testing.assert_close(s.cpu(), (x.cpu() @ x.cpu()).relu().sum(), rtol=1e-2, atol=1e-1)


def test_profiler_use_device_and_fused_kernels(tmp_path):
    x = torch.randn(64, 64, device="tpu")
    with torch.autograd.profiler.profile(use_device="tpu") as prof:
        (x * 2).sum().item()
    assert any(e.key == "aten::mul" and e.device_time_total > 0 for e in prof.key_averages())
    # DeferAndFuse: generated kernels appear under their fused names
    with torch_tpu.eager_mode("defer_and_fuse"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p2:
            ((x * 2 + 1).relu() * 3).sum().item()
    path = tmp_path / "fused.json"
    p2.export_chrome_trace(str(path))
    kernels, _ = _kernel_events(path)
    assert kernels and all(e["dur"] > 0 for e in kernels)


def test_profiler_schedule_records_only_active_steps(tmp_path):
    from torch.profiler import schedule, tensorboard_trace_handler
    x = torch.randn(128, 128, device="tpu")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(5):
            (x @ x).relu().sum().item()
            prof.step()
    (path,) = tmp_path.glob("*.json")
    kernels, _ = _kernel_events(path)
    assert sorted(e["name"] for e in kernels) == ["mm", "mm", "relu", "relu", "sum", "sum"]


def test_profiler_off_records_nothing_and_kernel_profile_still_works():
    x = torch.randn(64, 64, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # no device activity asked
        (x @ x).sum().item()
    assert all(e.device_time_total == 0 for e in prof.key_averages())
    with torch_tpu.debug.kernel_profile() as kp:
        (x @ x).sum().item()
    assert kp.ops["mm"][0] == 1


# ---- torch.save / torch.load / safetensors ----
def test_save_load_tensors_modules_optimizer_state(tmp_path):
    net = _net().to("tpu")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net(torch.randn(4, 16, device="tpu")).sum().backward()
    opt.step()
    t = torch.randn(3, 5, device="tpu")[:, 1:]  # a view: saved with its storage
    path = tmp_path / "ckpt.pt"
    torch.save({"t": t, "model": net.state_dict(), "opt": opt.state_dict()}, path)

    back = torch.load(path, weights_only=True)  # tensors come back on tpu
    assert back["t"].device.type == "tpu"
    assert torch.equal(back["t"].cpu(), t.cpu())
    on_cpu = torch.load(path, map_location="cpu", weights_only=True)
    assert on_cpu["model"]["0.weight"].device.type == "cpu"

    net2 = _net(seed=1).to("tpu")
    net2.load_state_dict(back["model"])
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-2)
    opt2.load_state_dict(back["opt"])
    st = opt2.state_dict()["state"][0]
    assert st["exp_avg"].device.type == "tpu"
    # one more identical step on both: same parameters
    x = torch.randn(4, 16, device="tpu")
    for n, o in ((net, opt), (net2, opt2)):
        n.eval()
        o.zero_grad()
        n(x).sum().backward()
        o.step()
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a.cpu(), b.cpu())

    # a CPU checkpoint loaded straight onto tpu
    cpu_net = _net(seed=2)
    buf = io.BytesIO()
    torch.save(cpu_net.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, map_location="tpu", weights_only=True)
    assert all(v.device.type == "tpu" for v in sd.values())
    for k, v in cpu_net.state_dict().items():
        assert torch.equal(sd[k].cpu(), v)


def test_safetensors_roundtrip(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    net = _net().to("tpu")
    sd = {k: v.contiguous() for k, v in net.state_dict().items()}
    path = str(tmp_path / "w.safetensors")
    save_file(sd, path)
    for device in ("tpu", "tpu:0", torch.device("tpu", 0), 0):
        back = load_file(path, device=device)
        assert all(v.device == torch.device("tpu", 0) for v in back.values()), device
        for k in sd:
            assert torch.equal(back[k].cpu(), sd[k].cpu())
    with safe_open(path, framework="pt", device="tpu") as f:
        assert f.get_tensor("0.weight").device.type == "tpu"
    assert load_file(path)["0.bias"].device.type == "cpu"  # other devices untouched


# ---- data loading ----
@pytest.mark.filterwarnings("ignore:pin_memory_device is deprecated")  # 2.13: it is the accelerator
def test_dataloader_pin_memory_and_non_blocking_copies_overlap_compute():
    data = torch.randn(64, 16)
    labels = torch.randint(0, 8, (64,))
    ds = torch.utils.data.TensorDataset(data, labels)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, pin_memory=True,
                                         pin_memory_device="tpu")
    net = _net().to("tpu").eval()
    copy_stream = torch.tpu.Stream()
    outs = []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        with torch.tpu.stream(copy_stream):
            xt = xb.to("tpu", non_blocking=True)
            yt = yb.to("tpu", non_blocking=True)
        torch.tpu.current_stream().wait_stream(copy_stream)
        outs.append(F.cross_entropy(net(xt), yt))
    got = torch.stack(outs).cpu()
    ref = torch.stack([F.cross_entropy(net.cpu()(data[i:i + 16]), labels[i:i + 16])
                       for i in range(0, 64, 16)])
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)

    # a non_blocking copy does not wait for queued compute: it returns while a long
    # matmul is still running on the default stream, and its own stream finishes first
    net.to("tpu")
    a = torch.randn(1024, 1024, device="tpu")
    big = torch.randn(1 << 20).pin_memory()
    torch.tpu.synchronize()
    for _ in range(8):
        a = a @ a * 1e-3
    with torch.tpu.stream(copy_stream):
        t0 = time.perf_counter()
        moved = big.to("tpu", non_blocking=True)
        issued = time.perf_counter() - t0
        done = torch.tpu.Event()
        done.record()
    done.synchronize()
    overlapped = not torch.tpu.current_stream().query()
    torch.tpu.synchronize()
    assert torch.equal(moved.cpu(), big)
    assert overlapped or issued < 0.05, "the copy waited for the compute stream"


# ---- activation checkpointing ----
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_with_dropout_matches_plain_backward(mode, reentrant):
    from torch.utils.checkpoint import checkpoint
    net = _net().to("tpu").train()
    x0 = torch.randn(8, 16)

    def run(use_ckpt):
        x = x0.to("tpu").requires_grad_()
        net.zero_grad()
        torch.tpu.manual_seed(123)
        out = checkpoint(net, x, use_reentrant=reentrant) if use_ckpt else net(x)
        out.square().sum().backward()
        return out.detach().cpu(), x.grad.cpu(), [p.grad.cpu() for p in net.parameters()]

    with torch_tpu.eager_mode(mode):
        plain = run(False)
        ckpt = run(True)
        torch.tpu.synchronize()
    assert torch.equal(plain[0], ckpt[0])
    assert torch.equal(plain[1], ckpt[1])
    for a, b in zip(plain[2], ckpt[2]):
        assert torch.equal(a, b)
    # the RNG state moved on exactly as without checkpointing
    torch.tpu.manual_seed(123)
    s0 = torch.tpu.get_rng_state()
    with torch.random.fork_rng(device_type="tpu"):
        torch.rand(10, device="tpu")
    assert torch.equal(torch.tpu.get_rng_state(), s0)


@pytest.mark.filterwarnings("ignore::torch_tpu.precision.TpuPerformanceWarning")
def test_checkpoint_grads_match_cpu():
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    x = torch.randn(6, 16)
    def grads(model, inp):
        inp = inp.clone().requires_grad_()
        model.zero_grad()
        checkpoint(model, inp, use_reentrant=False).sum().backward()
        return [inp.grad] + [p.grad for p in model.parameters()]

    ref = [g.clone() for g in grads(net, x)]  # (the move below takes .grad along)
    with torch.tpu.precision("highest"):  # float32 matmuls as CPU's
        got = grads(net.to("tpu"), x.to("tpu"))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.cpu(), r, rtol=2e-2, atol=2e-3)


# ---- anomaly detection, deterministic algorithms ----
@pytest.mark.parametrize("mode", MODES)
def test_detect_anomaly_names_the_op(mode):
    with torch_tpu.eager_mode(mode):
        x = torch.tensor([1.0, 0.0, 4.0], device="tpu", requires_grad=True)
        with pytest.warns(UserWarning), torch.autograd.detect_anomaly():
            y = (x.sqrt() * 0).sum()  # d sqrt(0) = inf, times 0: NaN
            with pytest.raises(RuntimeError, match="SqrtBackward0.*nan"):
                y.backward()
        # forward NaNs are not errors; grads are fine without the NaN
        z = torch.tensor([1.0, 4.0], device="tpu", requires_grad=True)
        with torch.autograd.detect_anomaly():
            z.sqrt().sum().backward()
        torch.testing.assert_close(z.grad.cpu(), torch.tensor([0.5, 0.25]))


def test_deterministic_algorithms():
    torch.use_deterministic_algorithms(True)
    try:
        g = torch.Generator().manual_seed(0)
        xc = torch.randn(32, 32, generator=g)
        idx_c = torch.randint(0, 32, (64,), generator=g)
        src_c = torch.randn(64, generator=g)

        def run(dev):
            x = xc.to(dev, copy=True).requires_grad_()
            idx = idx_c.to(dev)
            out = {}
            out["index_add"] = torch.zeros(32, device=dev).index_add_(0, idx, src_c.to(dev))
            out["scatter_add"] = torch.zeros(32, device=dev).scatter_add_(0, idx, src_c.to(dev))
            out["index_put"] = torch.zeros(32, device=dev).index_put_((idx,), src_c.to(dev),
                                                                      accumulate=True)
            out["histc"] = torch.histc(src_c.to(dev), bins=10, min=-2, max=2)
            out["median"] = xc.to(dev).median(dim=1).values
            out["cumsum"] = src_c.to(dev).cumsum(0)
            emb = F.embedding(idx, x)
            up = F.interpolate(x[None, None], scale_factor=2, mode="bilinear")
            (emb.sum() + up.sum() + x[idx].sum()).backward()
            out["grad"] = x.grad
            return out

        cpu, tpu = run("cpu"), run("tpu")
        tpu2 = run("tpu")
        for k in cpu:
            torch.testing.assert_close(tpu[k].cpu(), cpu[k], rtol=1e-4, atol=1e-4, msg=k)
            assert torch.equal(tpu[k].cpu(), tpu2[k].cpu()), k  # bitwise repeatable
    finally:
        torch.use_deterministic_algorithms(False)


# ---- memory summary and snapshots ----
def _alloc_here(n):
    return torch.empty(n, device="tpu")


def test_memory_summary_and_snapshot_readable_by_memory_viz(tmp_path):
    from torch.cuda import _memory_viz
    torch.tpu.synchronize()
    torch.tpu.memory._record_memory_history(max_entries=10000)
    try:
        keep = _alloc_here(1 << 20)  # 4 MiB: a large block
        tmp = _alloc_here(100)
        del tmp
        snap = torch.tpu.memory._snapshot()
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)
    # segments with blocks
    seg = next(s for s in snap["segments"] if s["address"] == keep.data_ptr())
    assert seg["total_size"] == 4 << 20 and seg["segment_type"] == "large"
    (blk,) = seg["blocks"]
    assert blk["state"] == "active_allocated" and blk["requested_size"] == 4 << 20
    assert any(f["name"] == "_alloc_here" for f in blk["frames"])
    # the trace: alloc, free_requested, free_completed, with frames naming this file
    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    for a in ("alloc", "free_requested", "free_completed"):
        assert a in actions, actions
    alloc = next(e for e in trace if e["action"] == "alloc" and e["addr"] == keep.data_ptr())
    assert alloc["size"] == 4 << 20
    assert any(f["filename"].endswith("test_everyday.py") for f in alloc["frames"])
    assert all(set(e) >= {"action", "addr", "size", "stream", "time_us", "frames"} for e in trace)
    # PyTorch's visualizer tools read it
    assert "segment" in _memory_viz.segsum(snap)
    text = _memory_viz.trace(snap)
    assert "Device 0" in text and "del " in text
    flame = _memory_viz.memory(snap, format_flamegraph=lambda lines: lines)
    assert "_alloc_here" in flame
    assert "<html>" in _memory_viz.segment_plot(snap)
    assert "<html>" in _memory_viz.trace_plot(snap)
    path = tmp_path / "snap.pickle"
    torch.tpu.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        assert set(pickle.load(f)) >= {"segments", "device_traces"}
    # summary
    text = torch.tpu.memory_summary()
    assert "Allocated memory" in text and "Reserved memory" in text
    assert torch.tpu.memory.memory_summary(abbreviated=True).count("\n") < text.count("\n")
    assert torch.tpu.memory_snapshot() and torch.tpu.memory.memory_allocated() > 0
    # recording off: the history is gone and nothing more is recorded
    _alloc_here(10)
    assert torch.tpu.memory._snapshot()["device_traces"][0] == []
    del keep


def test_memory_history_state_only_and_oom_event():
    torch.tpu.memory._record_memory_history("state")
    try:
        x = _alloc_here(1000)
        snap = torch.tpu.memory._snapshot()
        assert snap["device_traces"][0] == []  # no events, only the live blocks' stacks
        blk = next(s for s in snap["segments"] if s["address"] == x.data_ptr())["blocks"][0]
        assert any(f["name"] == "_alloc_here" for f in blk["frames"])
    finally:
        torch.tpu.memory._record_memory_history(None)
    cap = torch.tpu.get_device_properties().total_memory
    torch.tpu.memory._record_memory_history(max_entries=100)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(cap // 4 + 1024, device="tpu")  # float32: more than the capacity
        ooms = [e for e in torch.tpu.memory._snapshot()["device_traces"][0]
                if e["action"] == "oom"]
        assert ooms and ooms[0]["size"] >= cap and "device_free" in ooms[0]
    finally:
        torch.tpu.memory._record_memory_history(None)


@pytest.mark.parametrize("deterministic", [False, True])
def test_meta_kernels_keep_pytorch_checks(deterministic):
    # the alert-free meta kernels (torch_tpu/_everyday.py) still check their arguments
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        for dev in ("meta", "tpu"):
            x = torch.ones(2, 3, device=dev)
            with pytest.raises(RuntimeError, match="bins must be > 0"):
                torch.histc(x, bins=0)
            with pytest.raises(RuntimeError, match="max must be larger than min"):
                torch.histc(x, bins=3, min=2, max=1)
            with pytest.raises(IndexError, match="Dimension out of range"):
                x.median(dim=2)
            assert x.median(dim=-1, keepdim=True)[0].shape == (2, 1)
            assert x.mode(dim=0)[1].shape == (3,) and x.mode(dim=0)[1].dtype == torch.long
            s = torch.tensor(2.5, device=dev)  # a scalar's dim 0 / -1, keepdim or not: a scalar
            for d, keep in ((0, True), (-1, False)):
                v, i = s.median(dim=d, keepdim=keep)
                assert v.shape == () and i.shape == (), (d, keep, v.shape, i.shape)
                if dev == "tpu":
                    assert v.item() == 2.5 and i.item() == 0
            with pytest.raises(IndexError, match="Dimension out of range"):
                s.nanmedian(dim=1)
    finally:
        torch.use_deterministic_algorithms(old)
