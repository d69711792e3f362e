"""Groups the tests that pass on cpu and fail on tpu by likely cause.

    python tools/pt_device_tests/triage.py OUT_DIR [--examples N]

Reads OUT_DIR/results.json (written by run.py) and prints, most tests first, each cause
with its count and example test names. The causes are regular expressions over the tpu
failure text (the first that matches wins); what matches none is grouped by the first
line of its error.
"""
import argparse
import collections
import json
import os
import re

# (label, pattern over the failure text); order matters: the first match wins
CAUSES = [
    ("out of scope: complex / uint16-64 / float8 / quantized dtype", None),
    ("quantized tensors on tpu (Quantizedtpu / quantize_per_tensor)",
     r"Quantizedtpu|quantize_per_tensor|_empty_affine_quantized"),
    ("error raised late, by a later op (surfaced inside a comparison)",
     r"RuntimeError: Comparing[\s\S]*resulted in the unexpected exception|The above exception was the direct cause[\s\S]*Comparing"),
    ("missing op: {0}", r"operator '(aten::[\w.]+)' is not implemented for the tpu"),
    ("missing DispatchStub kernel (op computed by a stub: kaiser_window, ...)",
     r"DispatchStub: missing kernel for tpu"),
    ("more than 16 dims refused", r"at most 16 dimensions"),
    ("sparse layouts on tpu", r"Sparse|sparse"),
    ("test mixes a CPU tensor into a tpu op (CUDA skips that part)",
     r"Expected all tensors to be on the same device"),
    ("nonzero(out=) not resized / shape checked", r"nonzero\(\): expected an integer output"),
    ("error raised late / not at the op (expected exception not raised)",
     r"(\w+Error|Exception) not raised|Regex didn't match|\"[^\"]*\" does not match"),
    ("index_put dtype mismatch accepted/rejected differently", r"Index put requires the source and destination dtypes"),
    ("deterministic algorithms flags", r"deterministic"),
    ("wrong result dtype", r"dtype.*(are not equal|mismatch)|The values for attribute 'dtype' do not match"),
    ("uint8-mask deprecation warnings not emitted", r"Expected 2 but got 0[\s\S]*byte_mask"),
    ("wrong strides / layout", r"stride.*(not equal|mismatch|do not match)"),
    ("wrong values", r"Tensor-likes are not (close|equal)|Scalars are not (close|equal)|Comparing|are not close"),
    ("timeout", r"Timeout"),
]


def classify(msg):
    for label, pat in CAUSES[1:]:
        m = re.search(pat, msg)
        if m:
            return label.format(*m.groups()) if m.groups() else label
    lines = [l.strip() for l in msg.splitlines() if l.strip()]
    return "other: " + (lines[0][:160] if lines else "(no message)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=3)
    args = ap.parse_args()
    res = json.load(open(os.path.join(args.out, "results.json")))
    groups = collections.defaultdict(list)
    for name, r in res.items():
        if r["cpu"] != "pass" or r["tpu"] in ("pass", "skip", "absent"):
            continue
        label = CAUSES[0][0] if r["oos"] else (
            "crash" if r["tpu"] == "crash" else "hang" if r["tpu"] == "hang" else classify(r["msg"]))
        groups[label].append((name, r["msg"]))
    for label, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        files = collections.Counter(n.split("::")[0] for n, _ in items)
        print(f"## {len(items)}  {label}")
        print("   files: " + ", ".join(f"{f} {c}" for f, c in files.most_common()))
        for n, m in items[: args.examples]:
            first = next((l.strip() for l in m.splitlines() if l.strip()), "")
            print(f"   - {n}: {first[:200]}")


if __name__ == "__main__":
    main()
