"""Runs PyTorch's device-generic test files for device cpu and tpu and compares them.

Used by scripts/pytorch_device_tests.sh (see there and docs/design.md). Each file runs in
its own pytest process per device, with one pytest-xdist worker that is replaced when it
dies (crash isolation), pytest-timeout per test and the shim's hard watchdog. Writes, under
the output folder: <file>.<device>.xml (junit), <file>.<device>.log, summary.md (the table)
and results.json (per comparable test name: cpu and tpu outcome and the tpu failure text).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FILES = ["test_view_ops", "test_indexing", "test_shape_ops", "test_sort_and_select",
         "test_type_promotion", "test_tensor_creation_ops", "test_reductions",
         "test_binary_ufuncs", "test_unary_ufuncs", "test_torch", "test_nn"]

# dtypes that another issue owns: complex, the wide unsigned integers, float8, quantized
_OOS = re.compile(r"(complex|cfloat|cdouble|chalf|uint16|uint32|uint64|float8|qint|quint)")



def comparable(classname, name):
    from pt_device_names import comparable_name

    return comparable_name(classname.rsplit(".", 1)[-1], name)


def run_file(test_dir, fname, sample, device, out, args):
    xml = os.path.join(out, f"{fname}.{device}.xml")
    log = os.path.join(out, f"{fname}.{device}.log")
    state = os.path.join(out, "state", f"{fname}.{device}")
    for old in glob.glob(os.path.join(state, "hang-*.txt")):
        os.unlink(old)
    env = dict(os.environ)
    env["PT_DEVICE_TESTS_DEVICE"] = device
    env["PT_DEVICE_TESTS_STATE"] = state
    env["PT_DEVICE_TESTS_HARD_TIMEOUT"] = str(args.timeout + 60)
    env["PT_DEVICE_TESTS_SAMPLE"] = str(sample)
    if args.matmul_precision:
        env["PT_DEVICE_TESTS_MATMUL_PRECISION"] = args.matmul_precision
    env["PYTHONPATH"] = os.pathsep.join(
        [HERE, args.repo, test_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # cpu: the baseline without the backend; tpu: the shim registers it itself
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cmd = [sys.executable, "-m", "pytest", os.path.join(test_dir, fname + ".py"),
           "--noconftest", "-p", "no:cacheprovider", "-p", "pt_device_shim",
           "-q", "-rN", "--tb=line", "-o", "junit_family=xunit1", f"--junitxml={xml}",
           f"--timeout={args.timeout}", "--timeout-method=signal",
           "-n", "1", f"--max-worker-restart={args.max_restarts}",
           "-W", "ignore"]
    if args.k:
        cmd += ["-k", args.k]
    t0 = time.time()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                             cwd=out)
    return rc, time.time() - t0


def hang_nodes(out, fname, device):
    names = set()
    for p in glob.glob(os.path.join(out, "state", f"{fname}.{device}", "hang-*.txt")):
        text = open(p, errors="replace").read()
        m = re.match(r"NODEID (\S+)", text)
        if m and "Timeout (" in text:
            names.add(m.group(1).split("::", 1)[-1])
    return names


def parse(out, fname, device):
    """Maps comparable name -> (outcome, message). outcome: pass fail skip crash hang."""
    xml = os.path.join(out, f"{fname}.{device}.xml")
    res = {}
    if not os.path.exists(xml):
        return None
    hangs = hang_nodes(out, fname, device)
    for tc in ET.parse(xml).getroot().iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        key = comparable(cls, name)
        outcome, msg = "pass", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                msg = (child.get("message") or "") + "\n" + (child.text or "")
                if "crashed while running" in msg or "worker" in msg and "crashed" in msg:
                    short = cls.rsplit(".", 1)[-1] + "::" + name
                    outcome = "hang" if short in hangs else "crash"
                elif "Timeout (>" in msg or "Timeout >" in msg:
                    outcome = "hang"
                else:
                    outcome = "fail"
                break
            if child.tag == "skipped":
                outcome, msg = "skip", child.get("message") or ""
                break
        # a test may be listed twice (call failure + teardown error): keep the worst
        if key in res and res[key][0] != "pass":
            continue
        res[key] = (outcome, msg[:2000])
    return res


_OOS_MSG = re.compile(r"(does not support dtype (Complex\w*|UInt16|UInt32|UInt64|Float8\w*)"
                      r"|not (implemented|supported) for '?(Complex|UInt16|UInt32|UInt64|Float8)"
                      r"|does not support complex scalars|aten::view_as_(real|complex)'"
                      r"|Quantized\w*tpu|quantize_per_tensor|_empty_affine_quantized)")


def out_of_scope(key, msg):
    """Complex, uint16/32/64, float8 and quantized variants: by dtype in the name, or by the
    failure naming one (or a complex-only op such as view_as_real)."""
    return bool(_OOS.search(key) or _OOS_MSG.search(msg or ""))


def summarize(out, files, samples):
    """The table. Comparisons count only tests that ran on tpu (a tpu skip, e.g. an
    @onlyCPU test, is neither a pass nor a failure) and passed on cpu."""
    rows, results = [], {}
    keys = ("ran", "cpu", "tpu", "both", "cpu_in", "both_in", "oos", "crash", "hang", "skip")
    tot = dict.fromkeys(keys, 0)
    for fname in files:
        cpu, tpu = parse(out, fname, "cpu"), parse(out, fname, "tpu")
        if cpu is None or tpu is None:
            continue
        ran = {k for k, v in tpu.items() if v[0] != "skip"}
        pc = {k for k, v in cpu.items() if v[0] == "pass"} & ran
        pt = {k for k, v in tpu.items() if v[0] == "pass"}
        oos = {k for k in pc - pt if out_of_scope(k, tpu[k][1])}
        r = dict(ran=len(ran), cpu=len(pc), tpu=len(pt), both=len(pc & pt),
                 cpu_in=len(pc - oos), both_in=len(pc & pt), oos=len(oos),
                 crash=sum(v[0] == "crash" for v in tpu.values()),
                 hang=sum(v[0] == "hang" for v in tpu.values()),
                 skip=sum(v[0] == "skip" for v in tpu.values()))
        for k in tot:
            tot[k] += r[k]
        rows.append((fname if samples.get(fname, 1) == 1 else f"{fname} (1 in {samples[fname]})", r))
        for k in set(cpu) | set(tpu):
            c, t = cpu.get(k, ("absent", "")), tpu.get(k, ("absent", ""))
            results[f"{fname}::{k}"] = dict(cpu=c[0], tpu=t[0], msg=t[1] if t[0] != "pass" else "",
                                            oos=out_of_scope(k, t[1]))
    rows.append(("total", tot))

    def pct(a, b):
        return f"{100.0 * a / b:.1f}%" if b else "-"

    lines = ["| file | run on tpu | skipped on tpu | pass cpu (of those run) | pass tpu | "
             "tpu passes among cpu passes | same, complex/uint16-64/float8/quantized failures left out "
             "(their number) | crashes | hangs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for fname, r in rows:
        lines.append(f"| {fname} | {r['ran']} | {r['skip']} | {r['cpu']} | {r['tpu']} | "
                     f"{r['both']}/{r['cpu']} {pct(r['both'], r['cpu'])} | "
                     f"{r['both_in']}/{r['cpu_in']} {pct(r['both_in'], r['cpu_in'])} ({r['oos']}) | "
                     f"{r['crash']} | {r['hang']} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=0, sort_keys=True)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--test-dir", required=True, help="PyTorch's test/ folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(HERE)))
    ap.add_argument("--devices", default="cpu,tpu")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per test")
    ap.add_argument("--max-restarts", type=int, default=200)
    ap.add_argument("--sample", type=int, default=1, help="run a stable 1-in-N subset")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--matmul-precision", default=None, choices=["medium", "high", "highest"],
                    help="torch.set_float32_matmul_precision for the run (default: the "
                         "device's own, medium on tpu)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("files", nargs="*", default=None,
                    help="file names without .py; NAME:N runs a 1-in-N sample of that file")
    args = ap.parse_args()
    files, samples = [], {}
    for spec in args.files or FILES:
        name, _, n = spec.partition(":")
        files.append(name)
        samples[name] = int(n) if n else args.sample
    os.makedirs(args.out, exist_ok=True)
    if not args.summary_only:
        for fname in files:
            for device in args.devices.split(","):
                rc, dt = run_file(args.test_dir, fname, samples[fname], device, args.out, args)
                print(f"{fname} [{device}]: pytest exit {rc} in {dt:.0f} s", flush=True)
    print(summarize(args.out, files, samples))


if __name__ == "__main__":
    main()
