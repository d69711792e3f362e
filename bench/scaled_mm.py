"""torch._scaled_mm on tpu (float8 and float4 operands) next to a bfloat16 matmul of the same shape.

    .venv/bin/python bench/scaled_mm.py [--shapes 1024,tokens,decode] [--repeats N]

For each shape M x K x N (C[M, N] = A[M, K] @ B[K, N], B column-major as cuBLAS wants it,
the way a weight W[N, K] enters as W.t()) it times, in one run and taking turns, a bf16
torch.mm and _scaled_mm with float8_e4m3fn operands (one float32 scale per tensor), MXFP8
(e8m0 scales per 32 values of K), MXFP4 (float4_e2m1fn_x2, e8m0 scales per 32) and NVFP4
(float4, e4m3fn scales per 16), all with a bfloat16 output. It prints the best time per
call, the ratio to the bf16 matmul, and the growth of the process's peak resident set
during each variant's first call (Linux; the GEMM decodes the narrow codes while packing its
panels, so no float32 copy of an operand appears: the growth, the GEMM's packed blocks and
the first call's thread stacks, stays far below K * N * 4 bytes).

_scaled_mm's products and sums are float32 (as CPU's emulation), while bf16 mm multiplies
bfloat16 values in one pass, so the ratio shows what the decode and float32 panels cost.
The machine may be shared: the load average is printed first.
"""
import argparse
import os
import sys

os.environ.setdefault("TORCH_TPU_LOG_ISA", "1")  # the runtime names its micro-kernel once

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm import best_times  # noqa: E402

import torch_tpu  # noqa: E402,F401

DEV = "tpu"
# (group, label, M, K, N)
SHAPES = [
    ("1024", "square 1024", 1024, 1024, 1024),
    ("tokens", "256 tokens x W[4096, 4096]", 256, 4096, 4096),
    ("decode", "16 tokens x W[4096, 4096]", 16, 4096, 4096),
]


def peak_growth(fn):
    """Bytes the peak resident set grows by during fn() (after a reset), or None."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None

    def field(name):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    before = field("VmRSS")
    fn()
    torch.tpu.synchronize()
    return field("VmHWM") - before


def variants(m, k, n):
    from torch.testing._internal.common_quantized import to_blocked
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    xb, wb = x.bfloat16().to(DEV), w.bfloat16().to(DEV)
    out = {"bf16 mm": lambda: torch.mm(xb, wb.t())}
    a8, b8 = x.to(torch.float8_e4m3fn).to(DEV), w.to(torch.float8_e4m3fn).to(DEV).t()
    one = torch.tensor(1.0).to(DEV)
    out["fp8 tensor"] = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)

    def blocked(rows, block, dt):
        return to_blocked(torch.ones(rows, k // block).to(dt)).to(DEV)
    e8 = torch.float8_e8m0fnu
    sa32, sb32 = blocked(m, 32, e8), blocked(n, 32, e8)
    out["mxfp8"] = lambda: torch._scaled_mm(a8, b8, sa32, sb32, out_dtype=torch.bfloat16)
    a4 = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    b4 = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    a4, b4 = a4.to(DEV), b4.to(DEV).t()
    out["mxfp4"] = lambda: torch._scaled_mm(a4, b4, sa32, sb32, out_dtype=torch.bfloat16)
    sa16, sb16 = blocked(m, 16, torch.float8_e4m3fn), blocked(n, 16, torch.float8_e4m3fn)
    out["nvfp4"] = lambda: torch._scaled_mm(a4, b4, sa16, sb16, out_dtype=torch.bfloat16)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1024,tokens,decode", help="groups: 1024, tokens, decode")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    groups = set(args.shapes.split(","))
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'shape':28} {'M x K x N':>16} | {'variant':10} {'ms':>8} {'/bf16':>6} | peak RSS +MiB "
          f"(f32 copy of B: MiB)")
    for group, label, m, k, n in SHAPES:
        if group not in groups:
            continue
        vs = variants(m, k, n)
        torch.tpu.synchronize()
        grows = {name: peak_growth(fn) for name, fn in vs.items()}  # first calls
        best = best_times({name: (fn, torch.tpu.synchronize) for name, fn in vs.items()},
                          args.repeats)
        for name, fn in vs.items():
            grow = grows[name]
            mem = "n/a" if grow is None else f"{grow / 2**20:.1f}"
            print(f"{label:28} {f'{m}x{k}x{n}':>16} | {name:10} {best[name] * 1e3:8.2f} "
                  f"{best[name] / best['bf16 mm']:6.2f} | {mem:>6} ({k * n * 4 / 2**20:.0f})",
                  flush=True)


if __name__ == "__main__":
    main()
