"""The pjrt target's executables in the compilation cache's tiers 2 and 3 (execache.c),
across processes, against PyTorch's CPU results.

A cold process runs a workload (Strict ops, a DeferAndFuse flush, a torch.compile(backend="tpu")
function) into an empty cache; later processes on the same directories must load every program
instead of compiling it, detect corrupted entries, and compile everything when the cache is off.
Each process checks its own results against CPU and prints its counters."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.test_pjrt_target import pytestmark  # noqa: F401  (the skip mark)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



WORKLOAD = r"""
import json
import torch, torch_tpu
assert torch_tpu._C.target() == "pjrt", torch_tpu._C.target()
torch.set_num_threads(1)

def same(a, e, tol):
    assert a.device.type == "tpu", a.device
    torch.testing.assert_close(a.cpu(), e, atol=tol, rtol=tol)

g = torch.Generator().manual_seed(0)
x = torch.randn(8, 16, generator=g)
w = torch.randn(16, 4, generator=g)
a, b = x.to("tpu"), w.to("tpu")
# Strict: one program per op
same(a @ b, x @ w, 1e-5)
same((a * 2 + 1).exp().sum(0), (x * 2 + 1).exp().sum(0), 1e-4)
same(torch.relu(a - 0.5), torch.relu(x - 0.5), 0)
# DeferAndFuse: the flushed trace is one program
with torch_tpu.eager_mode("defer_and_fuse"):
    y = ((a * 3).tanh() + a.t().t()).mean(1)
    torch_tpu.materialize()
same(y, ((x * 3).tanh() + x).mean(1), 1e-5)
# torch.compile: the FX graph is one program
def f(u, v):
    return torch.softmax(u @ v, dim=-1) * 2 - u.sum(1, keepdim=True)
cf = torch.compile(f, backend="tpu")
same(cf(a, b), f(x, w), 1e-4)
torch.tpu.synchronize()
cache = {k: v for k, v in torch.tpu.compilation_cache_stats().items()
         if isinstance(v, (int, float, str)) or v is None}
print("STATS " + json.dumps({"pjrt": torch_tpu._C.pjrt_stats(), "cache": cache}))
"""


def run_child(code, env):
    e = dict(os.environ, TORCH_TPU_TARGET="pjrt", PYTHONPATH=ROOT)
    for k in ("TORCH_TPU_PJRT_PLUGIN", "TORCH_TPU_TIER2_COMPILATION_CACHE",
              "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "TORCH_TPU_PJRT_DUMP"):
        e.pop(k, None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("STATS ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[-1][len("STATS "):])


def entries(d):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".so")) \
        if os.path.isdir(d) else []


def tier3_dir(root):
    """The runtime version's directory under a tier-3 root (one per runtime version)."""
    subs = [os.path.join(root, n) for n in os.listdir(root)]
    assert len(subs) == 1, subs
    return subs[0]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cold run of WORKLOAD with tier 3 at its default place under XDG_CACHE_HOME."""
    base = tmp_path_factory.mktemp("pjrt_cache")
    xdg = str(base / "xdg")
    s = run_child(WORKLOAD, {"XDG_CACHE_HOME": xdg,
                             "TORCH_TPU_TIER2_COMPILATION_CACHE": str(base / "t2_cold")})
    t3 = tier3_dir(os.path.join(xdg, "torch_tpu"))
    assert s["cache"]["tier3_dir"] == t3, (s, t3)
    return {"base": base, "xdg": xdg, "t3": t3, "t2": str(base / "t2_cold"), "stats": s}


def test_cold_process_compiles_and_stores_each_program(warm):
    s = warm["stats"]
    n = s["pjrt"]["compiles"]
    assert n >= 5, s                                  # 3 Strict ops, 1 flush, 1 compiled graph
    assert s["pjrt"]["cache_loads"] == 0, s
    assert s["cache"]["compiles"] == n and s["cache"]["misses"] == n, s
    assert s["cache"]["store_failures"] == 0, s
    assert len(entries(warm["t3"])) == n, entries(warm["t3"])   # one entry per program
    assert len(entries(warm["t2"])) == n, entries(warm["t2"])


def test_second_process_loads_every_program_from_tier3(warm, tmp_path):
    n = warm["stats"]["pjrt"]["compiles"]
    t2 = str(tmp_path / "t2")                         # empty tier 2: every hit is tier 3's
    s = run_child(WORKLOAD, {"XDG_CACHE_HOME": warm["xdg"], "TORCH_TPU_TIER2_COMPILATION_CACHE": t2})
    assert s["pjrt"]["compiles"] == 0, s
    assert s["cache"]["compiles"] == 0 and s["cache"]["misses"] == 0, s
    assert s["pjrt"]["cache_loads"] == n, s
    assert s["cache"]["tier3_hits"] == n and s["cache"]["tier2_hits"] == 0, s
    assert s["cache"]["corrupt_entries"] == 0, s
    assert len(entries(t2)) == n                      # tier-3 hits were promoted into tier 2


def test_second_process_loads_every_program_from_tier2(warm):
    n = warm["stats"]["pjrt"]["compiles"]
    s = run_child(WORKLOAD, {"TORCH_TPU_TIER2_COMPILATION_CACHE": warm["t2"],
                             "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "disabled"})
    assert s["pjrt"]["compiles"] == 0, s
    assert s["pjrt"]["cache_loads"] == n, s
    assert s["cache"]["tier2_hits"] == n and s["cache"]["tier3_hits"] == 0, s


def test_corrupted_entries_are_detected_and_compiled_again(warm, tmp_path):
    n = warm["stats"]["pjrt"]["compiles"]
    root = str(tmp_path / "t3")
    shutil.copytree(os.path.dirname(warm["t3"]), root)
    files = entries(tier3_dir(root))
    assert len(files) == n >= 3
    before = {}
    with open(files[0], "r+b") as f:                  # truncated
        f.truncate(os.path.getsize(files[0]) // 2)
    for path, where in ((files[1], lambda size: size // 2),     # a payload byte flipped
                        (files[2], lambda size: size - 20)):    # the trailer's checksum
        with open(path, "r+b") as f:
            f.seek(where(os.path.getsize(path)))
            c = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([c[0] ^ 0x41]))
    for p in files[:3]:
        with open(p, "rb") as f:
            before[p] = f.read()
    s = run_child(WORKLOAD, {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": root,
                             "TORCH_TPU_TIER2_COMPILATION_CACHE": str(tmp_path / "t2")})
    assert s["cache"]["corrupt_entries"] == 3, s
    assert s["pjrt"]["compiles"] == 3 and s["cache"]["compiles"] == 3, s
    assert s["pjrt"]["cache_loads"] == n - 3, s
    for p in files[:3]:                               # replaced by good entries
        with open(p, "rb") as f:
            assert f.read() != before[p], p


def test_cache_off_compiles_in_every_process(warm, tmp_path):
    n = warm["stats"]["pjrt"]["compiles"]
    for _ in range(2):  # the default tier-3 place (XDG_CACHE_HOME) is warm, and is not used
        s = run_child(WORKLOAD, {"XDG_CACHE_HOME": warm["xdg"],
                                 "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
                                 "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "disabled"})
        assert s["cache"]["tier2_dir"] is None and s["cache"]["tier3_dir"] is None, s
        assert s["pjrt"]["compiles"] == n, s
        assert s["pjrt"]["cache_loads"] == 0, s
        assert s["cache"]["tier2_hits"] == 0 and s["cache"]["tier3_hits"] == 0, s


KEY_CHILD = r"""
import json, os, sys
dump = os.environ["DUMP_FILE"]
import torch, torch_tpu
x = torch.arange(7, dtype=torch.float32)
a = x.to("tpu")
err = os.dup(2)
fd = os.open(dump, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.dup2(fd, 2)                      # TORCH_TPU_PJRT_DUMP prints each program to stderr
y = a * 3
torch.tpu.synchronize()
os.dup2(err, 2)
torch.testing.assert_close(y.cpu(), x * 3)
text = open(dump).read()
assert text.count("module @") == 1, text
k = torch_tpu._C._pjrt_cache_key
print("STATS " + json.dumps({"key": k(text), "same_platform": k(text, platform="cpu"),
    "other_platform": k(text, platform="tpu"), "other_version": k(text, version="0.0.0-other"),
    "other_text": k(text + " "), "pjrt": torch_tpu._C.pjrt_stats()}))
"""


def test_key_holds_the_plugin_platform_and_version(tmp_path):
    root = str(tmp_path / "t3")
    s = run_child(KEY_CHILD, {"DUMP_FILE": str(tmp_path / "dump.txt"), "TORCH_TPU_PJRT_DUMP": "1",
                              "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
                              "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": root})
    assert s["pjrt"]["compiles"] == 1, s
    names = [os.path.basename(p)[:-3] for p in entries(tier3_dir(root))]
    assert names == [s["key"]], (names, s)            # the key function is the one in use
    assert s["same_platform"] == s["key"], s          # the XLA CPU plugin's platform is "cpu"
    others = {s["other_platform"], s["other_version"], s["other_text"]}
    assert len(others) == 3 and s["key"] not in others, s
