"""Shared by bench/defer_and_fuse.py and bench/compile.py: the example GPT's training step
timed in a fresh process per configuration.

As a script (the child): gpt_step.py MODE COMPILE STEPS [--autocast DTYPE] [train_gpt options...]
  MODE     eager mode of tpu: strict | debug | defer_and_fuse; "cpu" runs on CPU tensors
  COMPILE  none | tpu | inductor (torch.compile backend for the model)
  --autocast bfloat16|float16: forward and loss under torch.autocast(device, dtype)
prints one JSON line: per-step times and losses, tokens per step, peak device memory,
compile-cache and trace statistics, and (tpu) the kernel time of the last half of the steps
split into matrix-unit ops and the rest (torch_tpu.debug.kernel_profile).
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from peak import FORMULA, gpt_flops_per_token, measured_peak, mfu_line  # noqa: E402


# runtime ops that run on the matrix unit (their time is GEMM time)
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "fused.matmul_epilogue",
              "convolution",
              "convolution_backward")


def kernel_split(result):
    """(kernel ms per step, matmul ms per step, matmul share) of a tpu child's result."""
    k = result["kernels"]
    per = 1e3 / k["steps"]
    return k["total"] * per, k["matmul"] * per, k["matmul"] / max(k["total"], 1e-12)


def add_model_args(p, steps, warmup):
    """The benchmark's model configuration (the example at 6 blocks, width 384)."""
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--n-layer", default="6")
    p.add_argument("--n-embd", default="384")
    p.add_argument("--n-head", default="6")
    p.add_argument("--batch-size", default="8")
    p.add_argument("--block-size", default="64")


def model_options(a):
    return ["--n-layer", a.n_layer, "--n-embd", a.n_embd, "--n-head", a.n_head,
            "--batch-size", a.batch_size, "--block-size", a.block_size]


def mfu_lines(results, labels, warmup):
    """Lines giving each result's model FLOPs/s and its share of the FMA peak measured now
    (bench/peak.py), the formula first."""
    peak, how = measured_peak()
    lines = [FORMULA, f"FMA peak (bench/fma_peak.c, {how}): "
             f"{peak if peak else float('nan'):.1f} GFLOP/s"]
    for key, label in labels:
        if key in results:
            r = results[key]
            lines.append(mfu_line(label, tokens_per_second(r, warmup), r["flops_per_token"],
                                  peak))
    return lines


def run(mode, compile_with, steps, options, env=None):
    """Runs the child in a fresh process; returns its JSON result."""
    e = dict(os.environ)
    e.update(env or {})
    cmd = [sys.executable, os.path.abspath(__file__), mode, compile_with, str(steps)] + options
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"{mode}/{compile_with} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tokens_per_second(result, warmup):
    t = result["times"][warmup:]
    return result["tokens"] * len(t) / sum(t)


def _child(mode, compile_with, steps, options):
    import argparse
    import contextlib
    import torch
    import torch_tpu
    import torch_tpu.debug
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_gpt
    device = "cpu" if mode == "cpu" else "tpu"
    if device == "tpu":
        torch_tpu.set_eager_mode(mode)
    amp = argparse.ArgumentParser(add_help=False)
    amp.add_argument("--autocast", default=None, choices=["bfloat16", "float16"])
    amp, options = amp.parse_known_args(options)
    args = train_gpt.parser().parse_args(["--device", device, "--steps", str(steps),
                                          "--log-every", "1000000"] + options)
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
    data, chars = train_gpt.load_text(args.text)
    model = train_gpt.make_model(len(chars), args, args.seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step_model = model
    if compile_with == "tpu":
        step_model = torch.compile(model, backend="tpu")
    elif compile_with == "inductor":
        step_model = torch.compile(model)
    batches = train_gpt.batches(data, args.block_size, args.batch_size, args.seed)
    times, losses = [], []
    if device == "tpu":
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
    profile = contextlib.nullcontext()
    for step in range(steps):
        if device == "tpu" and step == steps // 2:
            profile = torch_tpu.debug.kernel_profile()
            prof = profile.__enter__()
        x, y = next(batches)
        t0 = time.perf_counter()
        x, y = x.to(device), y.to(device)
        with (torch.autocast(device, dtype=getattr(torch, amp.autocast)) if amp.autocast
              else contextlib.nullcontext()):
            _, loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # one materialization per step
        times.append(time.perf_counter() - t0)
    kernels = None
    if device == "tpu":
        profile.__exit__(None, None, None)
        kernels = {"steps": steps - steps // 2, "total": prof.total_seconds,
                   "matmul": prof.seconds(*MATMUL_OPS), "top": prof.table(12),
                   "ops": sorted(([n, c, t] for n, (c, t) in prof.ops.items()),
                                 key=lambda r: -r[2])[:12]}
    print(json.dumps({"times": times, "losses": losses, "kernels": kernels,
                      "tokens": args.batch_size * args.block_size,
                      "flops_per_token": gpt_flops_per_token(
                          sum(p.numel() for n, p in model.named_parameters()
                              if not n.startswith(("tok.", "pos."))),
                          args.n_layer, args.block_size, args.n_embd),
                      "peak": torch.tpu.max_memory_allocated() if device == "tpu" else 0,
                      "cache": torch.tpu.compilation_cache_stats(),
                      "trace": torch_tpu.modes.trace_stats()}))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
