"""Microseconds per op for tiny tensors: tpu (Strict) vs CPU, same run.

    .venv/bin/python bench/dispatch_overhead.py [--iters N]

Goal (issue 2): tpu at most 2x CPU for `x + y` and `x.mul_(2)` on 16 elements.
"""
import argparse
import time

import torch


def per_op_us(fn, device, iters, repeats=5):
    best = float("inf")
    for _ in range(repeats):
        if device != "cpu":
            torch.tpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if device != "cpu":
            torch.tpu.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    args = p.parse_args()
    rows = []
    for name, make_fn in [
        ("x + y", lambda x, y: (lambda: x + y)),
        ("x.mul_(2)", lambda x, y: (lambda: x.mul_(2))),
        ("x.sum()", lambda x, y: (lambda: x.sum())),
        ("torch.relu(x)", lambda x, y: (lambda: torch.relu(x))),
    ]:
        res = {}
        for dev in ("cpu", "tpu"):
            x = torch.ones(16, device=dev)
            y = torch.ones(16, device=dev)
            fn = make_fn(x, y)
            for _ in range(200):
                fn()
            res[dev] = per_op_us(fn, dev, args.iters)
        rows.append((name, res["cpu"], res["tpu"]))
    print(f"{'op (16 elements)':<16} {'cpu us':>8} {'tpu us':>8} {'tpu/cpu':>8}")
    for name, c, t in rows:
        print(f"{name:<16} {c:8.2f} {t:8.2f} {t / c:8.2f}")


if __name__ == "__main__":
    main()
