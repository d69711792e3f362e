"""Fused attention against the math path on tpu, forward + backward, same build, same run.

    .venv/bin/python bench/attention.py [--T 2048] [--heads 6] [--head-dim 64] [--batch 1]
                                        [--pairs 5] [--long 8192] [--dtype float32]
                                        [--precision medium] [--no-causal]

One step is scaled_dot_product_attention(q, k, v, is_causal=True) on (batch, heads, T,
head_dim) tensors and its backward, synchronized. The two paths of one build are chosen per
step with torch.nn.attention.sdpa_kernel: the default (the fused host kernel,
SDPBackend.OVERRIDEABLE on tpu) and SDPBackend.MATH (matmul, softmax, matmul as separate tpu
ops, the scores materialized). Steps alternate fused / math in pairs after a warm-up pair;
the figures are medians over the pairs: time per step, the speed ratio math / fused, and the
peak device memory a step adds above its inputs (torch.tpu.max_memory_allocated after
reset_peak_memory_stats), with the ratio fused / math.

Goals (issue 19, long context): fused >= 1.5x the math path's speed and <= 0.5x its peak
memory at T = 2048, 6 heads of 64 (width 384), batch 1. With --long T2 (default 8192) the
fused step also runs alone at T2 and its peak is printed next to the size the float32 scores
of one layer would need (batch * heads * T2^2 * 4 bytes), which the math path would hold.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu


def make_inputs(args, T, dtype):
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, T, args.head_dim)
    qkv = [torch.randn(shape, generator=g).to(dtype).to("tpu").requires_grad_() for _ in range(3)]
    grad = torch.randn(shape, generator=g).to(dtype).to("tpu")
    torch.tpu.synchronize()
    return qkv, grad


def step(qkv, grad, fused, causal):
    """One forward + backward; returns (seconds, peak bytes above the inputs)."""
    for t in qkv:
        t.grad = None
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    backends = [SDPBackend.OVERRIDEABLE] if fused else [SDPBackend.MATH]
    t0 = time.perf_counter()
    with sdpa_kernel(backends):
        o = F.scaled_dot_product_attention(*qkv, is_causal=causal)
    o.backward(grad)
    torch.tpu.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.tpu.max_memory_allocated() - base
    del o
    return dt, peak


def fused_ran(qkv, grad, causal):
    with torch_tpu.debug.kernel_profile() as prof:
        step(qkv, grad, True, causal)
    return prof.ops.get("_scaled_dot_product_fused_attention_overrideable", (0, 0))[0] == 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--long", type=int, default=8192, help="fused-only length (0: skip)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--precision", default="medium", choices=["medium", "high", "highest"])
    ap.add_argument("--no-causal", action="store_true")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    causal = not args.no_causal
    torch.set_float32_matmul_precision(args.precision)
    print(f"attention fwd+bwd: batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, "
          f"T {args.T}, {args.dtype}, precision {args.precision}, causal {causal}, "
          f"{torch.get_num_threads()} CPU threads, tpu threads "
          f"{torch_tpu._C.num_threads()}")
    qkv, grad = make_inputs(args, args.T, dtype)
    assert fused_ran(qkv, grad, causal), "the fused kernel did not run"
    step(qkv, grad, False, causal)  # warm-up pair
    step(qkv, grad, True, causal)
    ft, mt, fp, mp, ratios = [], [], [], [], []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        r = {}
        for fused in order:
            r[fused] = step(qkv, grad, fused, causal)
        ft.append(r[True][0])
        mt.append(r[False][0])
        fp.append(r[True][1])
        mp.append(r[False][1])
        ratios.append(r[False][0] / r[True][0])
        print(f"  pair {i}: fused {r[True][0] * 1e3:8.1f} ms  math {r[False][0] * 1e3:8.1f} ms  "
              f"ratio {ratios[-1]:.2f}x")
    med = statistics.median
    mib = 1 / 2**20
    print(f"fused  {med(ft) * 1e3:8.1f} ms/step   peak +{med(fp) * mib:8.1f} MiB")
    print(f"math   {med(mt) * 1e3:8.1f} ms/step   peak +{med(mp) * mib:8.1f} MiB")
    print(f"speed fused / math: {med(ratios):.2f}x (median of {args.pairs} pairs; goal >= 1.5x)")
    print(f"peak memory fused / math: {med(fp) / med(mp):.3f}x (goal <= 0.5x)")
    if args.long:
        del qkv, grad
        qkv, grad = make_inputs(args, args.long, dtype)
        dt, peak = step(qkv, grad, True, causal)
        scores = args.batch * args.heads * args.long**2 * 4
        print(f"T={args.long}: fused fwd+bwd {dt:.2f} s, peak +{peak * mib:.1f} MiB above the "
              f"inputs; float32 scores of one layer: {scores / 2**30:.2f} GiB "
              f"(fused peak = {peak / scores:.3f}x of that)")


if __name__ == "__main__":
    main()
