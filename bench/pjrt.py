"""The pjrt target against the host target, same run: microseconds per Strict op on tiny
tensors with a warm program cache (each target in its own child process, since the target is
chosen once per process); then the compiled example GPT's first training step on pjrt in a
process with an empty tier-3 cache directory (cold) and in a second process on the directory
the first one filled (warm).

    .venv/bin/python bench/pjrt.py [--iters N] [--n-layer 6 --n-embd 384 ...] [--no-cold-warm]

Goals (issue 15): a 16-element add on pjrt (XLA CPU plugin) at most 3x the host target's; the
warm first step >= 5x faster than the cold one, with 0 compiles.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpt_step  # noqa: E402  (the benchmark's model configuration)

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


# The compiled GPT's first two training steps in a fresh process (Strict eager mode around
# the compiled model: the optimizer runs op by op). Times the step's parts, and from
# Dynamo's own timers how much of it was Dynamo + AOTAutograd capturing the graphs
# (torch.compile's front end, which TorchTPU does not cache).
FIRST_STEP_CHILD = r"""
import json, os, sys, time
import torch, torch_tpu
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import train_gpt
import torch._dynamo.utils as dynamo_utils
args = train_gpt.parser().parse_args(["--device", "tpu", "--steps", "2"] + sys.argv[2:])
torch_tpu.set_eager_mode("strict")
data, chars = train_gpt.load_text(args.text)
model = train_gpt.make_model(len(chars), args, args.seed).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
step_model = torch.compile(model, backend="tpu")
batches = train_gpt.batches(data, args.block_size, args.batch_size, args.seed)
torch.tpu.synchronize()
steps = []
for step in range(2):
    x, y = next(batches)
    t0 = time.perf_counter()
    x, y = x.to("tpu"), y.to("tpu")
    _, loss = step_model(x, y)
    t1 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss = loss.item()
    t2 = time.perf_counter()
    st = dict(torch_tpu._C.pjrt_stats())
    front = sum(dynamo_utils.compilation_time_metrics.get("_compile.compile_inner", []))
    steps.append({"seconds": t2 - t0, "forward_call": t1 - t0, "loss": loss, "pjrt": st,
                  "dynamo_aot": front})
cache = torch.tpu.compilation_cache_stats()
aot = sum(dynamo_utils.compilation_time_metrics.get("create_aot_dispatcher_function", []))
print("RESULT " + json.dumps({"steps": steps, "aot": aot, "tier3_hits": cache["tier3_hits"],
                              "corrupt": cache["corrupt_entries"]}))
"""


def first_step(cache_root, options):
    """One child process on tier-3 root cache_root (tier 2 off, so that warm hits are tier 3's)."""
    env = dict(os.environ, TORCH_TPU_TARGET="pjrt", TORCH_TPU_TIER2_COMPILATION_CACHE="disabled",
               TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=cache_root)
    r = subprocess.run([sys.executable, "-c", FIRST_STEP_CHILD, ROOT] + options, env=env,
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"first step child: {r.stderr[-3000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def cold_warm(args):
    options = gpt_step.model_options(args)
    root = tempfile.mkdtemp(prefix="torch_tpu_bench_t3_")
    try:
        cold = first_step(root, options)
        warm = first_step(root, options)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\ntier-3 cold vs warm: compiled example GPT (n_layer {args.n_layer}, n_embd "
          f"{args.n_embd}, batch {args.batch_size}x{args.block_size}) on pjrt, first steps")
    print(f"{'process':<6} {'step':>4} {'seconds':>8} {'compiles':>8} {'loads':>6} "
          f"{'compile s':>9} {'load s':>7} {'dynamo+aot s':>12}")
    for name, r in (("cold", cold), ("warm", warm)):
        prev = {"compiles": 0, "cache_loads": 0, "compile_seconds": 0.0, "load_seconds": 0.0}
        front_prev = 0.0
        for i, s in enumerate(r["steps"]):
            p = s["pjrt"]
            print(f"{name:<6} {i + 1:>4} {s['seconds']:8.2f} {p['compiles'] - prev['compiles']:>8} "
                  f"{p['cache_loads'] - prev['cache_loads']:>6} "
                  f"{p['compile_seconds'] - prev['compile_seconds']:9.2f} "
                  f"{p['load_seconds'] - prev['load_seconds']:7.2f} "
                  f"{s['dynamo_aot'] - front_prev:12.2f}")
            prev, front_prev = p, s["dynamo_aot"]
    c, w = cold["steps"][0], warm["steps"][0]
    same = [a["loss"] for a in cold["steps"]] == [b["loss"] for b in warm["steps"]]
    ratio = c["seconds"] / w["seconds"]
    rest = (c["seconds"] - c["dynamo_aot"]) / max(w["seconds"] - w["dynamo_aot"], 1e-9)
    print(f"first step cold/warm: {ratio:.2f}x with {w['pjrt']['compiles']} compiles in the warm "
          f"process ({warm['tier3_hits']} tier-3 hits, losses {'equal' if same else 'DIFFER'}); "
          f"without Dynamo + AOTAutograd (warm: {w['dynamo_aot']:.2f} s, of it AOTAutograd "
          f"{warm['aot']:.2f} s): {rest:.2f}x")
    print(f"goal: >= 5x with 0 compiles: {'met' if ratio >= 5 and w['pjrt']['compiles'] == 0 else 'MISSED'}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--no-cold-warm", action="store_true", help="skip the tier-3 cold/warm section")
    gpt_step.add_model_args(p, steps=2, warmup=0)
    args = p.parse_args()
    host = run("host", args.iters)
    pjrt = run("pjrt", args.iters)
    print(f"{'Strict op':<16} {'host us':>9} {'pjrt us':>9} {'pjrt/host':>10}")
    for name in host:
        print(f"{name:<16} {host[name]:9.2f} {pjrt[name]:9.2f} {pjrt[name] / host[name]:10.2f}")
    if not args.no_cold_warm:
        cold_warm(args)


if __name__ == "__main__":
    main()
