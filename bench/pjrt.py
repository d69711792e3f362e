"""The pjrt target against the host target, same run: microseconds per Strict op on tiny
tensors with a warm program cache (each target in its own child process, since the target is
chosen once per process).

    .venv/bin/python bench/pjrt.py [--iters N]

Goal (issue 15): a 16-element add on pjrt (XLA CPU plugin) at most 3x the host target's.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch, torch_tpu
iters = int(sys.argv[1])
def per_op_us(fn):
    best = float("inf")
    for _ in range(5):
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.tpu.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best
x = torch.ones(16, device="tpu")
y = torch.ones(16, device="tpu")
w = torch.ones(64, 64, device="tpu")
out = {}
for name, fn in [("x + y", lambda: x + y), ("x.mul_(2)", lambda: x.mul_(2)),
                 ("x.sum()", lambda: x.sum()), ("w @ w (64x64)", lambda: w @ w)]:
    for _ in range(50):
        fn()
    out[name] = per_op_us(fn)
print("RESULT " + json.dumps(out))
"""


def run(target, iters):
    env = dict(os.environ, TORCH_TPU_TARGET=target)
    r = subprocess.run([sys.executable, "-c", CHILD, str(iters)], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"{target}: {r.stderr[-2000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2000)
    args = p.parse_args()
    host = run("host", args.iters)
    pjrt = run("pjrt", args.iters)
    print(f"{'Strict op':<16} {'host us':>9} {'pjrt us':>9} {'pjrt/host':>10}")
    for name in host:
        print(f"{name:<16} {host[name]:9.2f} {pjrt[name]:9.2f} {pjrt[name] / host[name]:10.2f}")


if __name__ == "__main__":
    main()
