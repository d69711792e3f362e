"""The runtime's layers (tools/check_layers.py): base < device < exec < cache < targets.

The checker runs on this checkout (includes always; symbols of the built objects when
build/runtime exists), and on small made-up trees to show that it catches an upward
include, an upward call and a stale exception.
"""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKER = os.path.join(ROOT, "tools", "check_layers.py")


def run_checker(*args):
    return subprocess.run([sys.executable, CHECKER, *args], capture_output=True, text=True,
                          timeout=120)


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_includes_follow_the_layers():
    r = run_checker()
    assert r.returncode == 0, r.stdout + r.stderr


def test_symbols_follow_the_layers():
    objects = os.path.join(ROOT, "build", "runtime")
    if not os.path.isdir(objects) or shutil.which("nm") is None:
        pytest.skip("runtime not built here (make runtime) or no nm")
    r = run_checker("--objects", objects)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_runtime_file_reads_the_environment_itself():
    """base/env.c is the one reader of environment variables in the runtime."""
    offenders = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "runtime")):
        rel_dir = os.path.relpath(dirpath, ROOT)
        if rel_dir.startswith(os.path.join("runtime", "tests")):
            continue
        for f in files:
            rel = os.path.join(rel_dir, f)
            if not f.endswith((".c", ".h")) or rel == os.path.join("runtime", "base", "env.c"):
                continue
            with open(os.path.join(ROOT, rel)) as fh:
                for n, line in enumerate(fh, 1):
                    code = line.split("//")[0]
                    if "getenv(" in code and not code.lstrip().startswith(("*", "/*")):
                        offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_checker_finds_upward_includes(tmp_path):
    root = str(tmp_path)
    write(root, "runtime/include/tpu/device.h", "")
    write(root, "runtime/include/tpu/status.h", "")
    write(root, "runtime/device/internal.h", '#include "tpu/status.h"\n')
    write(root, "runtime/exec/internal.h", "")
    write(root, "runtime/targets/host/k.h", "")
    write(root, "runtime/base/a.c", '#include "tpu/status.h"\n#include "tpu/device.h"\n')
    write(root, "runtime/device/b.c", '#include "internal.h"\n#include "../exec/internal.h"\n')
    write(root, "runtime/cache/c.c", '#include "device/internal.h"\n')  # downward: fine
    write(root, "torch_tpu/csrc/d.cpp", '#include "targets/host/k.h"\n')
    r = run_checker("--root", root)
    assert r.returncode == 1
    lines = sorted(r.stdout.splitlines())
    assert lines == [
        "runtime/base/a.c (base): includes runtime/include/tpu/device.h (device)",
        "runtime/device/b.c (device): includes runtime/exec/internal.h (exec)",
        "torch_tpu/csrc/d.cpp: the bridge includes a target's file runtime/targets/host/k.h",
    ], r.stdout


def test_checker_finds_stale_exceptions(tmp_path, monkeypatch):
    """An exception whose include is gone must be dropped from the list."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_layers", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    root = str(tmp_path)
    write(root, "torch_tpu/csrc/ops.cpp", "// includes nothing from targets any more\n")
    monkeypatch.setattr(mod, "INCLUDE_EXCEPTIONS",
                        {("torch_tpu/csrc/ops.cpp", "runtime/targets/host/kernels/index.h")})
    errors = mod.check_includes(root)
    assert errors == ["torch_tpu/csrc/ops.cpp: no longer includes "
                      "runtime/targets/host/kernels/index.h; drop its exception"], errors


def test_no_exceptions_are_left():
    """Issue 14 items 1 and 3 removed the last upward includes and calls."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_layers", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.INCLUDE_EXCEPTIONS == set() and mod.SYMBOL_EXCEPTIONS == []


def test_exec_reaches_targets_only_through_the_interface(tmp_path):
    """The op table and the trace once named the host target directly (issue 14 item 1);
    an include of a target's file from exec is an upward include again."""
    root = str(tmp_path)
    write(root, "runtime/targets/host/kernels/ops_all.def", "")
    write(root, "runtime/exec/op_table.c", '#include "../targets/host/kernels/ops_all.def"\n')
    r = run_checker("--root", root)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "runtime/exec/op_table.c (exec): includes runtime/targets/host/kernels/ops_all.def "
        "(targets)"], r.stdout


def test_checker_finds_upward_calls(tmp_path):
    """A hand-written declaration hides an upward call from the include check."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm")
    root = str(tmp_path / "src")
    objects = str(tmp_path / "obj")
    write(root, "runtime/device/env.c", "long lower_env(void) { return 1; }\n")
    write(root, "runtime/base/pool.c",
          "long upper_fn(void);\nlong pool(void) { return upper_fn(); }\n")
    write(root, "runtime/exec/up.c",
          "long lower_env(void);\nlong upper_fn(void) { return lower_env(); }\n")
    for rel in ("device/env", "base/pool", "exec/up"):
        os.makedirs(os.path.join(objects, os.path.dirname(rel)), exist_ok=True)
        subprocess.run([cc, "-c", os.path.join(root, "runtime", rel + ".c"), "-o",
                        os.path.join(objects, rel + ".o")], check=True)
    r = run_checker("--root", root, "--objects", objects)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "runtime/base/pool.o (base): uses upper_fn, defined in exec"], r.stdout
