"""The package as a user gets it: a wheel built from a clean clone, installed
elsewhere, with the clone gone (the long test, TORCH_TPU_TEST_PACKAGE=1), and
the headers embedded for fused kernels equal to the files in the tree (fast)."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import torch_tpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fuse_header_paths():
    """The headers the Makefile embeds (FUSE_HEADERS)."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    m = re.search(r"^FUSE_HEADERS := \$\(addprefix ([^,]+),([^)]*)\)", text, re.M)
    assert m, "Makefile has no FUSE_HEADERS line"
    return [os.path.join(ROOT, m.group(1), n) for n in m.group(2).split()]


def test_embedded_headers_match_tree():
    """The library holds each header's text verbatim (a NUL-terminated byte
    array): a _C.so built before a header changed fails here."""
    so = torch_tpu._C.__file__
    with open(so, "rb") as f:
        blob = f.read()
    paths = fuse_header_paths()
    assert len(paths) >= 3
    for p in paths:
        with open(p, "rb") as f:
            text = f.read()
        assert text + b"\0" in blob, f"{so} embeds a stale or missing copy of {p}: rebuild (make bridge)"


def test_generated_source_includes_only_embedded_headers():
    """Every quoted #include in the generated kernel source is an embedded header."""
    with open(os.path.join(ROOT, "runtime/targets/host/fuse_codegen.c")) as f:
        src = f.read()
    included = set(re.findall(r'#include \\"([^"\\]+)\\"', src))
    assert included, "no generated #include found in fuse_codegen.c"
    assert included <= {os.path.basename(p) for p in fuse_header_paths()}, included


CHECK = textwrap.dedent("""
    import json, sys
    import torch                      # autoloads the device: no import of torch_tpu here
    x = torch.ones(2, device="tpu")
    ones = x.cpu().tolist()
    tt = sys.modules["torch_tpu"]
    a = torch.randn(64, 64, device="tpu")
    with tt.eager_mode("defer_and_fuse"):
        for _ in range(2):
            y = torch.tanh(a * 2.0 + 1.0) * 3.0 - a
            torch.tpu.synchronize()
            tt.modes.wait_compiles()
    ref = torch.tanh(a.cpu() * 2.0 + 1.0) * 3.0 - a.cpu()
    print(json.dumps({"ones": ones, "file": tt.__file__, "so": tt._C.__file__,
                      "fused": tt.modes.trace_stats()["nodes_fused"],
                      "diff": (y.cpu() - ref).abs().max().item()}))
""")


@pytest.mark.skipif(os.environ.get("TORCH_TPU_TEST_PACKAGE") != "1",
                    reason="builds the whole package (minutes): set TORCH_TPU_TEST_PACKAGE=1")
def test_wheel_from_clean_clone_works_elsewhere(tmp_path):
    import json
    src = tmp_path / "src"
    subprocess.check_call(["git", "clone", "-q", ROOT, str(src)])
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               TORCH_TPU_BUILD_JOBS=os.environ.get("TORCH_TPU_BUILD_JOBS", "2"))
    env.pop("PYTHONPATH", None)
    dist = tmp_path / "dist"
    # python -m build when pypa's build is installed (not the checkout's build/ folder, which
    # would import as a namespace package), else pip wheel
    import importlib.util
    if importlib.util.find_spec("build.__main__") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
               "-w", str(dist), "."]
    subprocess.run(cmd, cwd=src, env=env, check=True, stdout=subprocess.DEVNULL)
    wheels = list(dist.glob("torch_tpu-*.whl"))
    assert len(wheels) == 1, wheels
    assert "linux" in wheels[0].name, wheels[0].name  # a platform wheel, not py3-none-any
    shutil.rmtree(src)
    site = tmp_path / "site"
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--disable-pip-version-check", "--target", str(site), str(wheels[0])])
    run = tmp_path / "elsewhere"
    run.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TORCH_TPU_") and k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(PYTHONPATH=str(site), TORCH_TPU_COMPILE_DELAY_MS="0",
               TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path / "cache3"),
               TORCH_TPU_TIER2_COMPILATION_CACHE="pkgtest_%d" % os.getpid())
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=run, env=env, check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ones"] == [1.0, 1.0]
    assert r["file"].startswith(str(site)) and r["so"].startswith(str(site)), r
    assert r["fused"] > 0, r
    assert r["diff"] < 1e-4, r
