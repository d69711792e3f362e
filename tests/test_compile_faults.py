"""Faults of the fused-kernel compiler and the compilation cache (issue 13):
a compiler that hangs, crashes, writes garbage or is killed; a process that
exits or is killed while a compile runs; Ctrl-C during a background compile;
corrupt entries and unwritable cache directories.

Every scenario runs in a fresh interpreter with its own cache directories and
TMPDIR, and a fake compiler (a shell script named by TORCH_TPU_CC) that notes
its pid (and its child's) in a marker file so the test can check that they
are gone. Results are compared with PyTorch's CPU results."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

# A workload with an elementwise chain and a row group; prints JSON with the
# differences from CPU, the fused-group counts and the runtime warnings.
WORKLOAD = r"""
import json, os, sys, warnings
import torch, torch_tpu, torch.nn.functional as F
warnings.simplefilter("always")
torch.manual_seed(0)
x = torch.randn(8, 64, device="tpu")
with warnings.catch_warnings(record=True) as caught:
    torch_tpu.modes.reset_trace_stats()
    torch_tpu.set_eager_mode("defer_and_fuse")
    y = F.softmax(x * 0.5 - 1.0, dim=-1)
    z = torch.tanh(x * 2.0 + 1.0) * 3.0 - x
    torch.tpu.synchronize()
    torch_tpu.modes.wait_compiles()
    y2 = F.softmax(x * 0.5 - 1.0, dim=-1)  # after the compile: fused when it worked
    z2 = torch.tanh(x * 2.0 + 1.0) * 3.0 - x
    torch.tpu.synchronize()
    torch_tpu.set_eager_mode("strict")
    stats = torch_tpu.modes.trace_stats()
xc = x.cpu()
ry = F.softmax(xc * 0.5 - 1.0, dim=-1)
rz = torch.tanh(xc * 2.0 + 1.0) * 3.0 - xc
diff = max((a.cpu() - r).abs().max().item() for a, r in ((y, ry), (z, rz), (y2, ry), (z2, rz)))
print(json.dumps({"diff": diff, "fused": stats["nodes_fused"],
                  "cache": {k: v for k, v in torch.tpu.compilation_cache_stats().items()
                            if isinstance(v, int)},
                  "warnings": [str(w.message) for w in caught
                               if "TorchTPU" in str(w.message)]}))
"""

HANG = """#!/bin/sh
echo $$ >> "$FAKE_CC_MARK"
sleep 1000 &
echo $! >> "$FAKE_CC_MARK"
wait
"""
CRASH = """#!/bin/sh
kill -SEGV $$
"""
GARBAGE = """#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then out="$2"; fi
  shift
done
echo "this is not a shared object" > "$out"
"""


def _script(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    p.chmod(0o755)
    return str(p)


def _env(tmp_path, cc=None, **extra):
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    e = {"TORCH_TPU_TIER2_COMPILATION_CACHE": str(tmp_path / "t2"),
         "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path / "t3"),
         "TMPDIR": str(tmp), "FAKE_CC_MARK": str(tmp_path / "mark"),
         "TORCH_TPU_COMPILE_DELAY_MS": "0", "PYTHONPATH": ROOT}
    if cc:
        e["TORCH_TPU_CC"] = cc
    e.update({k: str(v) for k, v in extra.items()})
    env = dict(os.environ)
    env.update(e)
    return env


def _run(code, env, timeout=180):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _result(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _marked_pids(tmp_path, want=2, deadline=60.0):
    """The fake compiler's pids once it runs (it writes its own and its child's)."""
    mark = tmp_path / "mark"
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if mark.exists():
            pids = [int(p) for p in mark.read_text().split()]
            if len(pids) >= want:
                return pids
        time.sleep(0.05)
    raise AssertionError("the fake compiler never ran")


def _wait_dead(pids, deadline=30.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    alive = [p for p in pids if _alive(p)]
    for p in alive:  # do not leave them behind even when the test fails
        os.kill(p, signal.SIGKILL)
    return alive


def _cc_dirs(tmp_path):
    return sorted(n for n in os.listdir(tmp_path / "tmp") if n.startswith("torch_tpu_cc_"))


def test_hanging_compiler_times_out_sync(tmp_path):
    cc = _script(tmp_path, "hang.sh", HANG)
    env = _env(tmp_path, cc, TORCH_TPU_ASYNC_COMPILE=0, TORCH_TPU_COMPILE_TIMEOUT_S=2)
    try:
        r = _run(WORKLOAD, env, timeout=120)
    finally:
        pids = [int(p) for p in (tmp_path / "mark").read_text().split()] \
            if (tmp_path / "mark").exists() else []
        alive = _wait_dead(pids)
    out = _result(r)
    assert out["diff"] < 1e-5
    assert out["fused"] == 0
    assert len(out["warnings"]) == 1 and "timed out" in out["warnings"][0], out["warnings"]
    assert pids and not alive  # the compiler and its child were killed
    assert _cc_dirs(tmp_path) == []


def test_hanging_compiler_times_out_async(tmp_path):
    cc = _script(tmp_path, "hang.sh", HANG)
    env = _env(tmp_path, cc, TORCH_TPU_COMPILE_TIMEOUT_S=2)
    r = _run(WORKLOAD, env, timeout=120)
    out = _result(r)
    assert out["diff"] < 1e-5 and out["fused"] == 0
    assert len(out["warnings"]) == 1 and "timed out" in out["warnings"][0], out["warnings"]
    assert not _wait_dead([int(p) for p in (tmp_path / "mark").read_text().split()])


LOCK_HOLDER = r"""
import torch, torch_tpu, torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(8, 64, device="tpu")
torch_tpu.set_eager_mode("defer_and_fuse")
y = F.softmax(x * 0.5 - 1.0, dim=-1)
z = torch.tanh(x * 2.0 + 1.0) * 3.0 - x
torch.tpu.synchronize()
"""


def test_lock_wait_is_bounded(tmp_path):
    """A process whose compile hangs holds the per-key lock; a second process
    with a working compiler must not wait for it forever."""
    hang = _script(tmp_path, "hang.sh", HANG)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER], cwd=ROOT,
                              env=_env(tmp_path, hang, TORCH_TPU_ASYNC_COMPILE=0,
                                       TORCH_TPU_COMPILE_TIMEOUT_S=1000),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = _marked_pids(tmp_path)
        r = _run(WORKLOAD, _env(tmp_path, None, TORCH_TPU_ASYNC_COMPILE=0,
                                TORCH_TPU_COMPILE_TIMEOUT_S=3), timeout=150)
        out = _result(r)
        assert out["diff"] < 1e-5
        assert out["fused"] > 0  # it compiled by itself after the bounded wait
        assert out["warnings"] == []
    finally:
        holder.kill()
        holder.wait()
    assert not _wait_dead(pids)


EXIT_CODE = r"""
import os, sys, time, torch, torch_tpu
x = torch.randn(4096, device="tpu")
torch_tpu.set_eager_mode("defer_and_fuse")
y = (x * 2.0 + 1.0).tanh() * 3.0
torch.tpu.synchronize()
mark = os.environ["FAKE_CC_MARK"]
while not (os.path.exists(mark) and len(open(mark).read().split()) >= 2):
    time.sleep(0.02)
print("compiling", flush=True)
how = sys.argv[1]
if how == "exit":
    sys.exit(0)
if how == "raise":
    raise ValueError("boom")
time.sleep(1000)  # killed by the test
"""


@pytest.mark.parametrize("how", ["exit", "raise", "sigterm", "sigkill"])
def test_background_compiler_dies_with_process(tmp_path, how):
    cc = _script(tmp_path, "hang.sh", HANG)
    p = subprocess.Popen([sys.executable, "-c", EXIT_CODE, how], cwd=ROOT,
                         env=_env(tmp_path, cc, TORCH_TPU_COMPILE_TIMEOUT_S=1000),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = _marked_pids(tmp_path)
        if how == "sigterm":
            p.send_signal(signal.SIGTERM)
        elif how == "sigkill":
            p.send_signal(signal.SIGKILL)
        p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == {"exit": 0, "raise": 1, "sigterm": -signal.SIGTERM,
                            "sigkill": -signal.SIGKILL}[how]
    assert not _wait_dead(pids)  # the compiler and its child are gone
    # and so is its temporary directory (removed by the compile's own guard)
    end = time.monotonic() + 30
    while _cc_dirs(tmp_path) and time.monotonic() < end:
        time.sleep(0.05)
    assert _cc_dirs(tmp_path) == []


def test_stale_temp_dirs_cleaned_at_start(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp / f"torch_tpu_cc_{dead.pid}_AbC123"
    stale.mkdir()
    (stale / "k.c").write_text("int x;")
    live = tmp / f"torch_tpu_cc_{os.getpid()}_XyZ789"  # this test process runs
    live.mkdir()
    (live / "k.c").write_text("int x;")
    other = tmp / "torch_tpu_cc_notapid"
    other.mkdir()
    r = _run(WORKLOAD, _env(tmp_path, None, TORCH_TPU_ASYNC_COMPILE=0))
    out = _result(r)
    assert out["diff"] < 1e-5 and out["fused"] > 0
    assert not stale.exists()
    assert live.exists() and (live / "k.c").exists()
    assert other.exists()


INTERRUPT_CODE = r"""
import os, torch, torch_tpu
x = torch.randn(4096, device="tpu")
torch_tpu.set_eager_mode("defer_and_fuse")
i = 0
while True:
    y = (x * 2.0 + 1.0).tanh() * 3.0
    torch.tpu.synchronize()
    i += 1
"""


def test_ctrl_c_during_background_compile(tmp_path):
    cc = _script(tmp_path, "hang.sh", HANG)
    p = subprocess.Popen([sys.executable, "-c", INTERRUPT_CODE], cwd=ROOT,
                         env=_env(tmp_path, cc, TORCH_TPU_COMPILE_TIMEOUT_S=1000),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = _marked_pids(tmp_path)
        time.sleep(0.2)  # the loop keeps running while the compiler hangs
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "KeyboardInterrupt" in err, err[-2000:]
    assert p.returncode != 0
    assert not _wait_dead(pids)


@pytest.mark.parametrize("kind", ["crash", "garbage"])
def test_broken_compiler_runs_unfused(tmp_path, kind):
    cc = _script(tmp_path, kind + ".sh", CRASH if kind == "crash" else GARBAGE)
    for mode in ("0", "1"):
        out = _result(_run(WORKLOAD, _env(tmp_path, cc, TORCH_TPU_ASYNC_COMPILE=mode)))
        assert out["diff"] < 1e-5 and out["fused"] == 0
        assert len(out["warnings"]) == 1, out["warnings"]
        assert "compiler" in out["warnings"][0]
    # nothing unloadable stays in the cache for the next process to trip over
    for tier in ("t2", "t3"):
        for root, _, files in os.walk(tmp_path / tier):
            assert not [f for f in files if f.endswith(".so")], (root, files)


def test_corrupt_entries_recompiled(tmp_path):
    env = _env(tmp_path, None, TORCH_TPU_ASYNC_COMPILE=0)
    first = _result(_run(WORKLOAD, env))
    assert first["diff"] < 1e-5 and first["fused"] > 0 and first["cache"]["compiles"] > 0
    entries = [os.path.join(root, f) for tier in ("t2", "t3")
               for root, _, files in os.walk(tmp_path / tier) for f in files if f.endswith(".so")]
    assert entries
    for i, path in enumerate(entries):
        data = bytearray(open(path, "rb").read())
        if i % 2:
            data = data[: len(data) // 2]  # truncated
        else:
            data[len(data) // 3] ^= 0xFF  # one flipped byte
        open(path, "wb").write(bytes(data))
    second = _result(_run(WORKLOAD, env))
    assert second["diff"] < 1e-5 and second["fused"] > 0
    assert second["cache"]["corrupt_entries"] > 0 and second["cache"]["compiles"] > 0
    assert second["warnings"] == []
    third = _result(_run(WORKLOAD, env))  # the recompiled entries are good again
    assert third["cache"]["compiles"] == 0 and third["cache"]["corrupt_entries"] == 0


def test_unwritable_cache_dirs(tmp_path):
    blocker = tmp_path / "a_file"  # no directory can be made below a file, even by root
    blocker.write_text("x")
    env = _env(tmp_path, None, TORCH_TPU_ASYNC_COMPILE=0,
               TORCH_TPU_TIER2_COMPILATION_CACHE=blocker / "t2",
               TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=blocker / "t3")
    out = _result(_run(WORKLOAD, env))
    assert out["diff"] < 1e-5 and out["fused"] > 0  # compiled and loaded from the temp dir
    assert len(out["warnings"]) == 2 and all("cannot create" in w for w in out["warnings"])
    assert _cc_dirs(tmp_path) == []


def test_compiler_with_arguments(tmp_path):
    """TORCH_TPU_CC is split at blanks (no shell): a wrapper with arguments works."""
    rec = _script(tmp_path, "wrap.sh", '#!/bin/sh\necho "$1" >> "$FAKE_CC_MARK"\nshift\nexec "$@"\n')
    env = _env(tmp_path, f"{rec} --tag=x  cc -DTPU_FAULT_TEST=1", TORCH_TPU_ASYNC_COMPILE=0)
    out = _result(_run(WORKLOAD, env))
    assert out["diff"] < 1e-5 and out["fused"] > 0 and out["warnings"] == []
    assert set((tmp_path / "mark").read_text().split()) == {"--tag=x"}
