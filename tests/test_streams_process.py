"""Streams, events, memory lifetime across streams and devices, threads and
processes (fork, spawn, DataLoader workers). Most cases run in a fresh
interpreter with a timeout, since a failure there is a hang or a crash."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu  # noqa: F401

# the children import the torch_tpu this process imported
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torch_tpu.__file__)))

MODES = ["strict", "debug", "defer_and_fuse"]


def run_script(tmp_path, code, env=None, timeout=240, name="script.py"):
    """Runs `code` from a file (spawn children re-import it) in a fresh
    interpreter; returns CompletedProcess. A hang fails as a timeout."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG_ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    try:
        return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              env=e, timeout=timeout, cwd=str(tmp_path))
    except subprocess.TimeoutExpired as ex:
        pytest.fail(f"script hung (timeout {timeout}s); output so far:\n{ex.stdout}\n{ex.stderr}")


def ok(r):
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


# ---------------------------------------------------------------------------
# Stream-ordered lifetime: a block freed while queued work may still use it
# must not be handed to other work before that work has run.

LIFETIME_PRELUDE = """
import torch, torch_tpu
torch_tpu.set_eager_mode(MODE)
N = 1 << 18

def keep_busy(device, n=6):
    # queues matmuls on the device's current stream, which then runs behind them
    w = torch.randn(384, 384, device=device)
    return [w @ w for _ in range(n)]

def refill(device, value):
    # a new block of the same size on the device, written at once
    return torch.full((N,), value, device=device)
"""


@pytest.mark.parametrize("mode", MODES)
def test_cross_device_copy_source_freed(tmp_path, mode):
    code = LIFETIME_PRELUDE.replace("MODE", repr(mode)) + """
expect = torch.arange(N, dtype=torch.float32)
for it in range(3):
    x = expect.to("tpu:0")
    torch.tpu.synchronize(0)
    busy = keep_busy("tpu:1")
    y = x.to("tpu:1")
    del x
    z = refill("tpu:0", -1.0)
    torch.tpu.synchronize(0)
    got = y.cpu()
    assert torch.equal(got, expect), (it, got[:4], (got != expect).sum().item())
    assert torch.equal(z.cpu(), torch.full((N,), -1.0))
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, env={"TORCH_TPU_HOST_DEVICES": "2"}))


@pytest.mark.parametrize("mode", MODES)
def test_cross_device_copy_source_written_after(tmp_path, mode):
    """an in-place write to the source after the copy is queued must not
    overtake the copy's read (the source chip's stream waits for the copy)"""
    code = LIFETIME_PRELUDE.replace("MODE", repr(mode)) + """
expect = torch.arange(N, dtype=torch.float32)
x = expect.to("tpu:0")
torch.tpu.synchronize(0)
busy = keep_busy("tpu:1")
y = x.to("tpu:1")
x.fill_(-1.0)
got = y.cpu()
assert torch.equal(got, expect), (got[:4], (got != expect).sum().item())
assert torch.equal(x.cpu(), torch.full((N,), -1.0))
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, env={"TORCH_TPU_HOST_DEVICES": "2"}))


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_side_stream_use_then_free(tmp_path, mode, record):
    """a tensor read on a busy side stream, then freed: the default stream
    must not get its block before the side stream has read it (with or
    without record_stream)"""
    code = LIFETIME_PRELUDE.replace("MODE", repr(mode)) + f"""
expect = torch.arange(N, dtype=torch.float32)
s = torch.tpu.Stream()
for it in range(3):
    x = expect.to("tpu")
    s.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s):
        busy = keep_busy("tpu")
        y = x * 1.0
        if {record}:
            x.record_stream(s)
    del x
    z = refill("tpu", -1.0)
    torch.tpu.current_stream().wait_stream(s)
    got = y.cpu()
    assert torch.equal(got, expect), (it, got[:4], (got != expect).sum().item())
    assert torch.equal(z.cpu(), torch.full((N,), -1.0))
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code))


@pytest.mark.parametrize("mode", MODES)
def test_default_stream_use_then_free_side_stream_alloc(tmp_path, mode):
    """the other way round: queued default-stream work reads a freed block
    while a side stream allocates and writes one of the same size"""
    code = LIFETIME_PRELUDE.replace("MODE", repr(mode)) + """
expect = torch.arange(N, dtype=torch.float32)
s = torch.tpu.Stream()
for it in range(3):
    x = expect.to("tpu")
    busy = keep_busy("tpu")
    y = x * 1.0
    del x
    with torch.tpu.stream(s):
        z = refill("tpu", -1.0)
    torch.tpu.current_stream().wait_stream(s)
    got = y.cpu()
    assert torch.equal(got, expect), (it, got[:4], (got != expect).sum().item())
    assert torch.equal(z.cpu(), torch.full((N,), -1.0))
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code))


@pytest.mark.parametrize("mode", MODES)
def test_host_copies_around_busy_streams(tmp_path, mode):
    """host->device into a non-contiguous view (through a staging block) and
    device->host, while another device and a side stream are busy"""
    code = LIFETIME_PRELUDE.replace("MODE", repr(mode)) + """
base = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
s = torch.tpu.Stream()
for it in range(3):
    busy1 = keep_busy("tpu:1")
    with torch.tpu.stream(s):
        busy0 = keep_busy("tpu:0")
    d = torch.zeros(64, 64, device="tpu:0").t()
    d.copy_(base)               # staged: contiguous block, then a strided copy
    junk = [torch.full((64, 64), -7.0, device="tpu:0") for _ in range(4)]
    e = d.to("tpu:1")
    del d
    junk += [torch.full((64, 64), -9.0, device="tpu:0") for _ in range(4)]
    assert torch.equal(e.cpu(), base), it
    torch.tpu.current_stream(0).wait_stream(s)
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, env={"TORCH_TPU_HOST_DEVICES": "2"}))


def test_freed_blocks_still_reused_on_one_stream():
    """stream order keeps same-stream reuse: a loop of temporaries on a busy
    stream does not grow the reserved memory without bound"""
    torch.tpu.synchronize()
    w = torch.randn(256, 256, device="tpu")
    x = torch.randn(1 << 16, device="tpu")
    before = torch.tpu.memory_reserved()
    for _ in range(200):
        _ = w @ w
        x = (x * 1.0001).sin()
    torch.tpu.synchronize()
    assert torch.tpu.memory_reserved() - before < 64 * (1 << 16) * 4
    assert torch.isfinite(x.cpu()).all()


# ---------------------------------------------------------------------------
# Streams: a fixed pool per device, handed out round-robin.

def test_thousands_of_streams():
    streams = [torch.tpu.Stream() for _ in range(2000)]
    ids = {s.stream_id for s in streams}
    assert 0 not in ids and 1 < len(ids) <= 32
    x = torch.arange(1000, dtype=torch.float32)
    outs = []
    xt = x.to("tpu")
    torch.tpu.synchronize()
    for i, s in enumerate(streams[:100]):
        with torch.tpu.stream(s):
            outs.append(xt * i)
    torch.tpu.synchronize()
    for i, o in enumerate(outs):
        assert torch.equal(o.cpu(), x * i)
    for s in streams[:40]:
        s.synchronize()
        assert s.query()


def test_stream_priorities_accepted():
    hi = torch.tpu.Stream(priority=-1)
    lo = torch.tpu.Stream(priority=0)
    for s in (hi, lo):
        with torch.tpu.stream(s):
            y = torch.ones(10, device="tpu") * 3
        s.synchronize()
        assert y.sum().item() == 30


def test_current_stream_is_per_thread():
    import threading
    s = torch.tpu.Stream()
    seen = {}
    entered = threading.Event()
    release = threading.Event()

    def other():
        entered.wait(30)
        seen["other"] = torch.tpu.current_stream()
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with torch.tpu.stream(s):
        entered.set()
        release.wait(30)
        seen["main"] = torch.tpu.current_stream()
    t.join(30)
    assert seen["main"] == s
    assert seen["other"] == torch.tpu.default_stream()
    assert torch.tpu.current_stream() == torch.tpu.default_stream()


@pytest.mark.parametrize("mode", MODES)
def test_events_across_threads(tmp_path, mode):
    """a producer thread records an event after its work on its stream; a
    consumer thread makes its own stream wait on it and reads the result"""
    code = f"""
import threading, torch, torch_tpu
torch_tpu.set_eager_mode({mode!r})
ROUNDS = 20
produced = [None] * ROUNDS
events = [None] * ROUNDS
ready = [threading.Event() for _ in range(ROUNDS)]
errors = []
w = torch.randn(256, 256, device="tpu")

def producer():
    try:
        s = torch.tpu.Stream()
        with torch.tpu.stream(s):
            s.wait_stream(torch.tpu.default_stream())
            for i in range(ROUNDS):
                busy = [w @ w for _ in range(2)]
                produced[i] = torch.full((5000,), float(i), device="tpu") + busy[0][0, 0] * 0
                ev = torch.tpu.Event()
                ev.record()
                events[i] = ev
                ready[i].set()
    except Exception as e:
        errors.append(repr(e))

def consumer(out):
    try:
        s = torch.tpu.Stream()
        with torch.tpu.stream(s):
            for i in range(ROUNDS):
                assert ready[i].wait(60)
                torch.tpu.current_stream().wait_event(events[i])
                out.append((produced[i] * 2).sum())
        s.synchronize()
        out[:] = [v.item() for v in out]
    except Exception as e:
        errors.append(repr(e))

outs = [[], []]
ts = [threading.Thread(target=producer)] + [threading.Thread(target=consumer, args=(o,)) for o in outs]
for t in ts: t.start()
for t in ts: t.join(120)
assert not any(t.is_alive() for t in ts), "threads hung"
assert not errors, errors
for o in outs:
    assert o == [2.0 * i * 5000 for i in range(ROUNDS)], o
for e in events:
    e.synchronize()
    assert e.query()
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code))


# ---------------------------------------------------------------------------
# Several Python threads on the device at once.

STRESS = """
import threading, torch, torch_tpu
torch_tpu.set_eager_mode(MODE)
torch.set_float32_matmul_precision("highest")
THREADS, ITERS = 4, 12
errors = []

def chain(a, w, i):
    return ((a @ w).tanh().softmax(-1).index_select(0, i).cumsum(0) + a[:50] * .5).sum(0)

def own_tensors(k, use_stream):
    try:
        g = torch.Generator().manual_seed(k)
        a = torch.randn(200, 64, generator=g)
        w = torch.randn(64, 64, generator=g)
        i = torch.randint(0, 200, (50,), generator=g)
        expect = chain(a, w, i)
        at, wt, it = a.to("tpu"), w.to("tpu"), i.to("tpu")
        s = torch.tpu.Stream() if use_stream else None
        for n in range(ITERS):
            with torch.tpu.stream(s):
                if s is not None:
                    s.wait_stream(torch.tpu.default_stream())
                got = chain(at, wt, it)
                big = (torch.ones(40000, device="tpu") * n).sum()
                ev = torch.tpu.Event()
                ev.record()
            ev.synchronize()
            got = got.cpu()
            assert torch.allclose(got, expect, atol=1e-4, rtol=1e-4), (k, n, (got - expect).abs().max())
            assert big.item() == 40000 * n
    except Exception as e:
        errors.append(f"thread {k}: {e!r}")

shared = torch.zeros(1000, device="tpu")
lock = threading.Lock()

def shared_tensor(k):
    try:
        for n in range(ITERS):
            with lock:
                shared.add_(1)
                shared.mul_(1)
            local = (shared.clone() * 0 + k).sum().item()
            assert local == 1000 * k
    except Exception as e:
        errors.append(f"shared {k}: {e!r}")

ts = [threading.Thread(target=own_tensors, args=(k, k % 2 == 1)) for k in range(THREADS)]
ts += [threading.Thread(target=shared_tensor, args=(k,)) for k in range(2)]
for t in ts: t.start()
for t in ts: t.join(300)
assert not any(t.is_alive() for t in ts), "threads hung"
assert not errors, errors
torch.tpu.synchronize()
assert torch.equal(shared.cpu(), torch.full((1000,), 2.0 * ITERS)), shared.cpu()[:4]
print("OK")
"""


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_threads_stress(tmp_path, mode):
    for rep in range(2):
        r = run_script(tmp_path, STRESS.replace("MODE", repr(mode)), timeout=400)
        assert "OK" in ok(r), rep


# ---------------------------------------------------------------------------
# Processes

FORK_AFTER_START = """
import os, sys, torch, torch_tpu
x = torch.ones(40000, device="tpu")
assert x.sum().item() == 40000  # the runtime (and its threads) started

def child_touches():
    assert torch.tpu._is_in_bad_fork()
    assert not torch.tpu.is_initialized()
    msgs = []
    for fn in (lambda: torch.ones(40000, device="tpu").sum().item(),
               lambda: (x + 1).cpu(),
               lambda: x.cpu(),
               lambda: torch.tpu.synchronize(),
               lambda: torch.tpu.Stream()):
        try:
            fn()
            msgs.append("no error")
        except RuntimeError as e:
            msgs.append(str(e))
    return msgs

def child_cpu_only():
    import gc
    assert torch.tpu.device_count() >= 1
    y = torch.arange(100000).sum().item()
    global x
    del x             # a tpu block inherited from the parent: freeing it is a no-op
    gc.collect()
    return y

for which in ("touch", "cpu"):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = repr(child_touches() if which == "touch" else child_cpu_only())
        except BaseException as e:
            out = "EXC " + repr(e)
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    print(which, data.decode())
# the parent is unaffected
assert (x * 2).sum().item() == 80000
print("PARENT OK")
"""


def test_fork_after_start(tmp_path):
    out = ok(run_script(tmp_path, FORK_AFTER_START, timeout=120))
    lines = dict(l.split(" ", 1) for l in out.splitlines() if l.startswith(("touch", "cpu")))
    msgs = eval(lines["touch"])
    assert len(msgs) == 5
    for m in msgs:
        assert "Cannot re-initialize TPU in forked subprocess" in m and "spawn" in m, m
    assert lines["cpu"].strip() == repr(sum(range(100000)))
    assert "PARENT OK" in out


def test_fork_before_start(tmp_path):
    code = """
import os, torch, torch_tpu
assert not torch.tpu.is_initialized()
pid = os.fork()
if pid == 0:
    ok = torch.ones(40000, device="tpu").sum().item() == 40000
    ok = ok and (torch.arange(50000, device="tpu") * 2).sum().item() == 2 * sum(range(50000))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
assert torch.ones(40000, device="tpu").sum().item() == 40000
print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, timeout=120))


def test_multiprocessing_fork_child_error(tmp_path):
    code = """
import multiprocessing as mp, torch, torch_tpu

def work(q):
    try:
        q.put(("ok", torch.ones(40000, device="tpu").sum().item()))
    except RuntimeError as e:
        q.put(("err", str(e)))

def cpu_work(q):
    q.put(("ok", torch.ones(40000).sum().item()))

if __name__ == "__main__":
    torch.ones(3, device="tpu").sum().item()
    ctx = mp.get_context("fork")
    for fn in (work, cpu_work):
        q = ctx.Queue()
        p = ctx.Process(target=fn, args=(q,))
        p.start()
        print(fn.__name__, q.get(timeout=60))
        p.join(60)
        assert p.exitcode == 0, p.exitcode
"""
    out = ok(run_script(tmp_path, code, timeout=120))
    assert "work ('err', \"Cannot re-initialize TPU in forked subprocess" in out
    assert "cpu_work ('ok', 40000.0)" in out


def test_multiprocessing_spawn_children(tmp_path):
    code = """
import multiprocessing as mp, torch, torch_tpu

def roundtrip(t):
    y = (t.to("tpu") * 2 + 1).softmax(0)
    return y.cpu()

if __name__ == "__main__":
    torch.ones(3, device="tpu").sum().item()    # started in the parent too
    xs = [torch.randn(40000 + k) for k in range(3)]
    with mp.get_context("spawn").Pool(2) as pool:
        outs = pool.map(roundtrip, xs)
    for x, o in zip(xs, outs):
        assert torch.allclose(o, (x * 2 + 1).softmax(0), atol=1e-6), (o - (x * 2 + 1).softmax(0)).abs().max()
    print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, timeout=300))


def test_dataloader_workers_pin_memory(tmp_path):
    code = """
import torch, torch_tpu
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    X, Y = torch.randn(96, 16), torch.randn(96, 4)
    model = torch.nn.Linear(16, 4)
    ref = [torch.nn.functional.mse_loss(model(xb), yb).item()
           for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=16)]
    tmodel = torch.nn.Linear(16, 4).to("tpu")
    tmodel.load_state_dict(model.state_dict())
    loader = DataLoader(TensorDataset(X, Y), batch_size=16, num_workers=2, pin_memory=True)
    got = []
    for epoch in range(2):
        got = []
        for xb, yb in loader:
            xb, yb = xb.to("tpu", non_blocking=True), yb.to("tpu", non_blocking=True)
            got.append(torch.nn.functional.mse_loss(tmodel(xb), yb).item())
    assert len(got) == len(ref)
    assert all(abs(a - b) < 1e-5 for a, b in zip(got, ref)), (got, ref)
    print("OK")
"""
    assert "OK" in ok(run_script(tmp_path, code, timeout=300))


def test_pin_memory():
    x = torch.arange(10.0)
    p = x.pin_memory()
    assert p.device.type == "cpu"
    assert p.is_pinned() and p[2:].is_pinned() and not x.is_pinned()
    assert torch.equal(p, x)
    assert torch.equal(p.to("tpu", non_blocking=True).cpu(), x)
