"""Fuzzer worker: runs programs on cpu and on tpu and compares them.

Protocol (one JSON object per line): stdin gets {"lines": [src, ...], "ops": [...],
"dd": [...], "mode": "strict" | "debug" | "defer_and_fuse" | "compile"}; stdout answers
{"mismatches": [{"kind", "line", "op", "detail"}, ...], "cpu_errors": n}. The parent
(tests/fuzz/run.py) runs each worker as a subprocess with a timeout, so a crash or a hang of
the backend is seen as the worker dying or not answering.
"""
import json
import os
import re
import sys
import traceback

import torch

from tests.fuzz.gen import PRELUDE, RANK_DTYPES

# (atol, rtol) per dtype; atol scales with the largest magnitude of the expected tensor
TOL = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-4, 1e-4),
       torch.bfloat16: (4e-2, 4e-2), torch.float16: (4e-3, 4e-3)}


def _base_ns(dev):
    ns = {}
    exec(PRELUDE, ns)
    ns["dev"] = dev
    return ns


def run_eager(lines, dev):
    """runs the lines one by one; returns (namespace, per-line exception or None, final error)"""
    ns = _base_ns(dev)
    errs = []
    for src in lines:
        try:
            exec(src, ns)
            errs.append(None)
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            errs.append(e)
    final = None
    outs = {}
    if dev != "cpu":
        try:
            torch.tpu.synchronize()
        except Exception as e:  # noqa: BLE001
            final = e
    for k, v in list(ns.items()):
        if isinstance(v, torch.Tensor):
            try:
                outs[k] = v.cpu() if dev != "cpu" else v
            except Exception as e:  # noqa: BLE001
                final = final or e
    return outs, errs, final


def compare_tensor(a, e, loose=1.0, low=0):
    """None when the tpu tensor a (already on cpu) matches the cpu tensor e, else (kind, detail);
    low: the coarsest float precision class in the value's history (gen.RANK)"""
    if a.dtype != e.dtype:
        return "dtype", f"{a.dtype} vs cpu {e.dtype}"
    if a.shape != e.shape:
        return "shape", f"{tuple(a.shape)} vs cpu {tuple(e.shape)}"
    if e.numel() == 0:
        return None
    if e.dtype.is_floating_point:
        atol, rtol = max(TOL[e.dtype], TOL[getattr(torch, RANK_DTYPES[low])])
        ad, ed = a.double(), e.double()
        scale = max(1.0, float(ed.nan_to_num(0, 0, 0).abs().max()))
        ok = torch.isclose(ad, ed, rtol=rtol * loose, atol=atol * loose * scale, equal_nan=True)
        inf = torch.isinf(ed) | torch.isinf(ad)
        ok = torch.where(inf, ad == ed, ok)
    else:
        ok = a == e
    if bool(ok.all()):
        return None
    bad = (~ok).nonzero()
    i = tuple(bad[0].tolist())
    return "value", (f"{int(bad.shape[0])}/{e.numel()} elements differ, first at {i}: tpu "
                     f"{a[i].item()!r} cpu {e[i].item()!r}")


def compare_outputs(tpu, cpu, ops_of, loose=1.0, tol=None):
    out = []
    tol = tol or {}
    for k, e in cpu.items():
        if k not in tpu:
            out.append({"kind": "missing_output", "line": None, "op": ops_of.get(k, "?"),
                        "detail": k})
            continue
        r = compare_tensor(tpu[k], e, loose, tol.get(k, 0))
        if r is not None:
            out.append({"kind": r[0], "line": None, "op": ops_of.get(k, "?"), "detail": f"{k}: {r[1]}"})
    return out


def _ename(e):
    return None if e is None else type(e).__name__


def _msg(e):
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else ""


def check_eager(lines, ops, dd, mode, tol=None):
    cpu, cerr, _ = run_eager(lines, "cpu")
    import torch_tpu
    with torch_tpu.eager_mode(mode):
        tpu, terr, final = run_eager(lines, "tpu")
    mism = []
    pending = None  # a cpu error that tpu has not raised yet: (line, type, data-dependent)
    for i, (c, t) in enumerate(zip(cerr, terr)):
        cn, tn = _ename(c), _ename(t)
        if cn == tn:
            continue
        if cn is None:
            kind = "unsupported" if tn == "NotImplementedError" else "spurious_error"
            if pending is not None and tn == pending[1]:
                kind = "late_error"
            mism.append({"kind": kind, "line": i, "op": ops[i], "detail": f"{tn}: {_msg(t)}"})
            break
        if tn is None:
            pending = (i, cn, dd[i], c)
            continue
        mism.append({"kind": "wrong_error_type", "line": i, "op": ops[i],
                     "detail": f"tpu {tn}: {_msg(t)} / cpu {cn}: {_msg(c)}"})
        break
    if not mism:
        fn = _ename(final)
        if pending is not None:
            i, cn, is_dd, c = pending
            if fn == cn and is_dd and mode != "debug":
                pass  # a data-dependent error may surface at the next synchronization
            elif fn == cn:
                mism.append({"kind": "late_error", "line": i, "op": ops[i],
                             "detail": f"raised at synchronization, not at the op: {cn}: {_msg(c)}"})
            elif fn is None:
                mism.append({"kind": "missing_error", "line": i, "op": ops[i],
                             "detail": f"cpu raised {cn}: {_msg(c)}"})
            else:
                mism.append({"kind": "wrong_error_type", "line": i, "op": ops[i],
                             "detail": f"tpu {fn} (at sync): {_msg(final)} / cpu {cn}: {_msg(c)}"})
        elif final is not None:
            mism.append({"kind": "spurious_error", "line": "sync", "op": "sync",
                         "detail": f"{fn}: {_msg(final)}"})
    if not mism and not any(c is not None and d for c, d in zip(cerr, dd)):
        # (after a data-dependent error the failing op's partial writes are unspecified)
        mism = compare_outputs(tpu, cpu, _ops_of(lines, ops), tol=tol)
        mism = _explain_all(mism, lines, tpu, cpu, mode, tol)
    return mism, sum(e is not None for e in cerr)


AMPLIFIED = "[cpu on tpu's inputs: the same]"
F64_SAME = "[tpu agrees with cpu in float64]"


def _snapshot(lines, upto, dev, mode=None):
    """the program's tensors (as cpu copies) after lines[:upto] on dev, and the namespace"""
    import contextlib
    import torch_tpu
    ns = _base_ns(dev)
    ctx = torch_tpu.eager_mode(mode) if dev != "cpu" else contextlib.nullcontext()
    with ctx:
        for src in lines[:upto]:
            try:
                exec(src, ns)
            except Exception:  # noqa: BLE001 - the first run compared the errors
                pass
        snap = {n: v.detach().cpu().clone() for n, v in ns.items() if isinstance(v, torch.Tensor)}
    return snap, ns


def _run_line_on_cpu(src, tensors, k, f64=False):
    """line src run on cpu with the given tensors bound to their names; k's value or None"""
    ns = _base_ns("cpu")
    for n, v in tensors.items():
        ns[n] = v.double() if f64 and v.is_floating_point() else v.clone()
    try:
        exec(src, ns)
    except Exception:  # noqa: BLE001
        return None
    v = ns.get(k)
    return v if isinstance(v, torch.Tensor) else None


def explain_value(lines, k, actual, expected, mode, low=0):
    """why tpu's value `actual` of variable k may differ from CPU's `expected` without a tpu
    defect, as a tag for tests/fuzz/known.py, or "". Only for a floating variable that no later
    line mentions, at the last line L that assigns it:
    - AMPLIFIED: CPU's op run on tpu's inputs to L (a re-run of lines[:L] in the same eager
      mode; in strict for a compiled program), which matched CPU's within tolerance, gives
      tpu's value: the op is right and amplifies an earlier rounding difference (cos of a
      large sum, a cumsum crossing float16's overflow, atan2 of CPU's rounding residue -5e-7
      where tpu's layer_norm of a constant row gives exactly 0);
    - F64_SAME: CPU's op in float64 on CPU's own inputs agrees with tpu and not with CPU's
      result: CPU's own float kernel rounds more (a float32 L1 norm accumulated in lanes)."""
    if not expected.is_floating_point():
        return ""
    L = max((i for i, src in enumerate(lines) if k in _assigned(src)), default=None)
    if L is None or any(re.search(rf"\b{k}\b", src) for src in lines[L + 1:]):
        return ""
    tsnap, _ = _snapshot(lines, L, "tpu", "strict" if mode == "compile" else mode)
    r = _run_line_on_cpu(lines[L], tsnap, k)
    if r is not None and r.dtype == actual.dtype and compare_tensor(actual, r, low=low) is None:
        return " " + AMPLIFIED
    if expected.dtype == torch.float64:
        return ""  # (no wider type to check CPU's rounding with)
    csnap, _ = _snapshot(lines, L, "cpu")
    r = _run_line_on_cpu(lines[L], csnap, k, f64=True)
    if r is not None and r.shape == actual.shape:
        r = r.to(actual.dtype)
        if compare_tensor(actual, r, low=low) is None and compare_tensor(expected, r, low=low):
            return " " + F64_SAME
    return ""


def _assigned(src):
    """the names a line assigns (`a, b = ...`)"""
    lhs = src.split("=")[0] if "=" in src.split("(")[0] else ""
    return [n for n in lhs.replace(" ", "").split(",") if n.isidentifier()]


def _explain_all(mism, lines, tpu, cpu, mode, tol):
    for m in mism:
        if m["kind"] != "value":
            continue
        k = m["detail"].split(":")[0]
        if k in tpu and k in cpu:
            m["detail"] += explain_value(lines, k, tpu[k], cpu[k], mode, (tol or {}).get(k, 0))
    return mism


def _ops_of(lines, ops):
    """variable name -> op of the last line assigning it"""
    m = {}
    for src, op in zip(lines, ops):
        for n in _assigned(src):
            m[n] = op
    return m


def compile_source(lines, ops, names):
    """the body of a program as a function of its inputs, for torch.compile"""
    ins = [src.split("=")[0].strip() for src, op in zip(lines, ops) if op == "input"]
    body = [src for src, op in zip(lines, ops) if op != "input"]
    src = f"def prog({', '.join(ins)}):\n"
    src += "".join(f"    {b}\n" for b in body) or "    pass\n"
    src += f"    return ({''.join(n + ', ' for n in names)})\n"
    return ins, src


AOT_SAME = "[aot_eager on cpu: the same]"


def _compiled(lines, ops, names, dev, backend):
    """the program's outputs under torch.compile(backend) on dev (name -> cpu tensor)"""
    ins, src = compile_source(lines, ops, names)
    ns = _base_ns(dev)
    for s, op in zip(lines, ops):
        if op == "input":
            exec(s, ns)
    exec(src, ns)
    import torch._dynamo
    try:
        res = torch.compile(ns["prog"], backend=backend)(*[ns[n] for n in ins])
        if dev != "cpu":
            torch.tpu.synchronize()
        return {n: r.cpu() for n, r in zip(names, res) if isinstance(r, torch.Tensor)}
    finally:
        torch._dynamo.reset()


def check_compile(lines, ops, tol=None):
    """compiled on tpu vs eager on cpu; a difference that PyTorch's own compile stack makes on
    CPU too (torch.compile(backend="aot_eager") raises the same exception type (and inner
    exception type), or its output
    differs from eager at the same variable) is marked AOT_SAME (tests/fuzz/known.py)"""
    cpu, cerr, _ = run_eager(lines, "cpu")
    if any(e is not None for e in cerr):
        return [], sum(e is not None for e in cerr)
    names = sorted(cpu, key=lambda n: int(n[1:]) if n[1:].isdigit() else 0)

    def aot():
        try:
            return _compiled(lines, ops, names, "cpu", "aot_eager"), None
        except Exception as e:  # noqa: BLE001
            return None, e
    try:
        tpu = _compiled(lines, ops, names, "tpu", "tpu")
    except Exception as e:  # noqa: BLE001
        _, ae = aot()
        inner = [type(getattr(x, "inner_exception", None)) for x in (e, ae)]
        same = f" {AOT_SAME}" if ae is not None and type(ae) is type(e) and inner[0] is inner[1] else ""
        return [{"kind": "compile_error", "line": None, "op": "compile",
                 "detail": f"{type(e).__name__}: {_msg(e)}{same}"}], 0
    mism = compare_outputs(tpu, cpu, _ops_of(lines, ops), loose=2.0, tol=tol)
    if mism:
        ref, _ = aot()
        for m in mism:
            k = m["detail"].split(":")[0]
            if ref is not None and k in ref and k in cpu and \
                    compare_tensor(ref[k], cpu[k], 2.0, (tol or {}).get(k, 0)) is not None:
                m["detail"] += f" {AOT_SAME}"
            elif AOT_SAME not in m["detail"]:
                _explain_all([m], lines, tpu, cpu, "compile", tol)
    return mism, 0


def main():
    import warnings
    warnings.filterwarnings("ignore")
    import torch_tpu  # noqa: F401
    torch.set_float32_matmul_precision("highest")
    # CPU's reference ops are small: one intra-op thread each. With its default pool, every
    # tiny CPU op wakes a second thread that competes with the other worker and the tpu
    # runtime's own threads (measured: 3-10x slower per program on 2 cores).
    torch.set_num_threads(1)
    import faulthandler
    out = sys.stdout
    sys.stdout = sys.stderr  # prints from programs never corrupt the protocol
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for raw in sys.stdin:
        task = json.loads(raw)
        # a hang leaves the Python stacks in stderr before the parent kills the worker
        faulthandler.dump_traceback_later(max(task.get("timeout", 60) - 3, 1), exit=False)
        try:
            if task["mode"] == "compile":
                mism, ncpu = check_compile(task["lines"], task["ops"], task.get("tol"))
            else:
                mism, ncpu = check_eager(task["lines"], task["ops"], task["dd"], task["mode"],
                                         task.get("tol"))
            res = {"mismatches": mism, "cpu_errors": ncpu}
        except Exception as e:  # noqa: BLE001 - a fuzzer bug is reported, not hidden
            res = {"mismatches": [{"kind": "fuzzer_error", "line": None, "op": "?",
                                   "detail": traceback.format_exc()[-600:]}], "cpu_errors": 0}
            del e
        faulthandler.cancel_dump_traceback_later()
        out.write(json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    main()
