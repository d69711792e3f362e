"""Compiled GPT training step: the pjrt target (XLA CPU plugin) against PyTorch/XLA on the same
XLA CPU, same run, tokens per second and their ratio (issue 15's goal: >= 1.5x).

    .venv/bin/python bench/pjrt_vs_xla.py --xla-python /path/to/venv/bin/python [--steps N]

PyTorch/XLA needs its own virtual environment (torch 2.9.0 and torch_xla 2.9.0 from PyPI; the CUDA
torch wheel runs on the CPU):
    python3.11 -m venv /tmp/xla_venv && /tmp/xla_venv/bin/pip install torch==2.9.0 torch_xla==2.9.0
The model is the example GPT (examples/train_gpt.py: 6 blocks, width 384, batch 8 x 64 tokens),
AdamW, float32 at matmul precision 'highest' on both sides. PyTorch/XLA runs its usual loop
(lazy tensors, `xm.mark_step()` after the optimizer step, PJRT_DEVICE=CPU); the pjrt target runs
`torch.compile(model, backend="tpu")` for forward and backward, with the optimizer step in the
eager mode given by --modes (DeferAndFuse: one executable per step for it; Strict: one per op).
Each side runs in a fresh child process; the first --warmup steps (compiles) are not timed.
A last pjrt run waits after forward and backward to print each phase's time: forward +
backward is the plugin's own arithmetic, so PyTorch/XLA's step over it bounds the ratio any
runtime on the same compiler can reach.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import torch
import train_gpt
side, mode, steps, warmup = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
split = mode.endswith("+split")  # synchronize after forward and backward: each phase's time
mode = mode.replace("+split", "")
opts = sys.argv[6:]
torch.set_float32_matmul_precision("highest")
if side == "xla":
    import torch_xla.core.xla_model as xm
    dev = xm.xla_device()
    sync = xm.mark_step
else:
    import torch_tpu
    torch_tpu.set_eager_mode(mode)
    dev = torch.device("tpu")
    sync = lambda: None
args = train_gpt.parser().parse_args(["--device", "cpu", "--log-every", "1000000"] + opts)
data, chars = train_gpt.load_text(args.text)
model = train_gpt.make_model(len(chars), args, args.seed).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
step_model = model if side == "xla" else torch.compile(model, backend="tpu")
batches = train_gpt.batches(data, args.block_size, args.batch_size, args.seed)
times, losses, phases = [], [], []
for step in range(steps):
    x, y = next(batches)
    t0 = time.perf_counter()
    x, y = x.to(dev), y.to(dev)
    _, loss = step_model(x, y)
    if split:
        torch.tpu.synchronize(); t1 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if split:
        torch.tpu.synchronize(); t2 = time.perf_counter()
    opt.step()
    sync()
    losses.append(loss.item())
    times.append(time.perf_counter() - t0)
    if split:
        phases.append((t1 - t0, t2 - t1, t0 + times[-1] - t2))
t = times[warmup:]
ph = [sum(p[i] for p in phases[warmup:]) / max(len(t), 1) for i in range(3)] if split else None
print("RESULT " + json.dumps({"tok_s": args.batch_size * args.block_size * len(t) / sum(t),
                              "times": times, "losses": losses, "phases": ph}))
"""


def run(python, side, mode, steps, warmup, opts, env):
    r = subprocess.run([python, "-c", CHILD, ROOT, side, mode, str(steps), str(warmup)] + opts,
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{side}/{mode} failed:\n{r.stderr[-3000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--xla-python", required=True, help="python of a venv with torch_xla 2.9")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="defer_and_fuse,strict")
    p.add_argument("--model", default="--n-layer 6 --n-embd 384 --n-head 6 --batch-size 8 "
                                      "--block-size 64")
    a = p.parse_args()
    opts = a.model.split()
    env = dict(os.environ, PJRT_DEVICE="CPU", TORCH_TPU_TARGET="pjrt")
    xla = run(a.xla_python, "xla", "-", a.steps, a.warmup, opts, env)
    print(f"{'side':<28} {'tokens/s':>9} {'vs XLA':>7}  first losses")
    print(f"{'PyTorch/XLA 2.9 (mark_step)':<28} {xla['tok_s']:9.1f} {1.0:7.2f}  "
          f"{[round(v, 4) for v in xla['losses'][:3]]}")
    for mode in a.modes.split(","):
        r = run(sys.executable, "tpu", mode, a.steps, a.warmup, opts, env)
        print(f"{'pjrt compiled + ' + mode:<28} {r['tok_s']:9.1f} {r['tok_s'] / xla['tok_s']:7.2f}  "
              f"{[round(v, 4) for v in r['losses'][:3]]}")
    # The bound: the pjrt side's step with every phase waited for (forward, backward, optimizer
    # step: each is one executable, so this is the plugin's compute plus our per-call cost)
    # against PyTorch/XLA's whole step.
    r = run(sys.executable, "tpu", a.modes.split(",")[0] + "+split", a.steps, a.warmup, opts, env)
    f, b, o = r["phases"]
    xla_step = (sum(xla["times"][a.warmup:]) /
                len(xla["times"][a.warmup:]))
    print(f"pjrt phases, each waited for: forward {f * 1e3:.1f} ms, backward {b * 1e3:.1f} ms, "
          f"optimizer {o * 1e3:.1f} ms = {(f + b + o) * 1e3:.1f} ms; PyTorch/XLA step "
          f"{xla_step * 1e3:.1f} ms: at most {xla_step / (f + b):.2f}x even with a free optimizer "
          f"step and no overhead of ours")


if __name__ == "__main__":
    main()
