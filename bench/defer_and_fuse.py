"""DeferAndFuse vs Strict on the example GPT's training step, one run, ratios.

    .venv/bin/python bench/defer_and_fuse.py [--steps N] [--n-layer 6] [--n-embd 384]

Each measurement runs in a fresh process (so caches and allocator state start clean):
  1. Strict and DeferAndFuse tokens/s (after warm-up steps) and peak device memory;
  2. cold vs warm tier-3 cache with TORCH_TPU_ASYNC_COMPILE=0: time of the first
     training step in a fresh process with an empty cache directory, then in a second
     fresh process that finds the first one's executables (it must compile nothing);
  3. a cold process with background compilation (the default) vs Strict, first step;
  4. losses of DeferAndFuse vs Strict over the steps (max relative difference).
Goals (issue 5): tokens/s >= 1.5x Strict; peak memory <= 0.8x Strict; warm first step
>= 5x faster than cold; background-compiling cold first step no slower than Strict.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, sys, time, torch, torch_tpu
sys.path.insert(0, ROOT + '/examples')
import train_gpt
mode, steps, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
torch_tpu.set_eager_mode(mode)
args = train_gpt.parser().parse_args(['--device', 'tpu', '--steps', str(steps),
                                      '--log-every', '1000000'] + extra)
data, chars = train_gpt.load_text(args.text)
model = train_gpt.make_model(len(chars), args, args.seed).to('tpu')
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
batches = train_gpt.batches(data, args.block_size, args.batch_size, args.seed)
losses, times = [], []
torch.tpu.synchronize()
torch.tpu.reset_peak_memory_stats()
for step in range(steps):
    x, y = next(batches)
    t0 = time.perf_counter()
    x, y = x.to('tpu'), y.to('tpu')
    _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())  # one materialization per step
    times.append(time.perf_counter() - t0)
s = torch.tpu.compilation_cache_stats()
print(json.dumps({'losses': losses, 'times': times, 'tokens': args.batch_size * args.block_size,
                  'peak': torch.tpu.max_memory_allocated(), 'cache': s,
                  'trace': torch_tpu.modes.trace_stats()}))
""".replace("ROOT", repr(ROOT))


def run(mode, steps, extra, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(steps)] + extra, env=e,
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"child failed ({mode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--n-layer", default="6")
    p.add_argument("--n-embd", default="384")
    p.add_argument("--n-head", default="6")
    p.add_argument("--batch-size", default="8")
    p.add_argument("--block-size", default="64")
    a = p.parse_args()
    extra = ["--n-layer", a.n_layer, "--n-embd", a.n_embd, "--n-head", a.n_head,
             "--batch-size", a.batch_size, "--block-size", a.block_size]
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps {a.steps}")
    tmp = tempfile.mkdtemp(prefix="tpu_bench_cache_")
    cache = {"TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
             "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(tmp, "t3")}
    sync = dict(cache, TORCH_TPU_ASYNC_COMPILE="0")
    strict = run("strict", a.steps, extra)
    cold = run("defer_and_fuse", a.steps, extra, sync)       # empty cache, compiles now
    warm = run("defer_and_fuse", a.steps, extra, sync)       # fresh process, warm tier 3
    cache_bg = dict(cache, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=os.path.join(tmp, "bg"))
    bg = run("defer_and_fuse", a.steps, extra, cache_bg)     # empty cache, background

    def rate(r):
        t = r["times"][a.warmup:]
        return r["tokens"] * len(t) / sum(t)

    rs, rd = rate(strict), rate(warm)
    print(f"{'':28s} {'strict':>12s} {'defer_and_fuse':>15s} {'ratio':>7s}")
    print(f"{'tokens/s (steady)':28s} {rs:12.0f} {rd:15.0f} {rd / rs:7.2f}  (goal >= 1.5)")
    print(f"{'peak device memory (MiB)':28s} {strict['peak'] / 2**20:12.1f} "
          f"{warm['peak'] / 2**20:15.1f} {warm['peak'] / strict['peak']:7.2f}  (goal <= 0.8)")
    print(f"first step, cold cache (sync compile): {cold['times'][0]:.3f} s, "
          f"{cold['cache']['compiles']} compiles in {cold['cache']['compile_seconds']:.2f} s")
    print(f"first step, warm tier-3 cache:          {warm['times'][0]:.3f} s, "
          f"{warm['cache']['compiles']} compiles, tier-3 hits {warm['cache']['tier3_hits']}, "
          f"tier-1 hits {warm['cache']['tier1_hits']}, misses {warm['cache']['misses']}  "
          f"-> cold/warm {cold['times'][0] / warm['times'][0]:.1f}x (goal >= 5)")
    print(f"first step, cold with background compile: {bg['times'][0]:.3f} s vs strict "
          f"{strict['times'][0]:.3f} s -> {bg['times'][0] / strict['times'][0]:.2f}x (goal <= 1)")
    diff = max(abs(x - y) / abs(y) for x, y in zip(warm["losses"], strict["losses"]))
    print(f"losses defer vs strict over {a.steps} steps: max relative difference {diff:.2e} "
          f"(goal <= 1e-5)")
    t = warm["trace"]
    print(f"trace: {t['flushes']} flushes, {t['nodes']} nodes, {t['nodes_fused']} fused, "
          f"{t['nodes_dropped']} dropped, {t['repeat_cuts']} repeated-block cuts, "
          f"{t['elided_bytes'] / 2**20:.0f} MiB of intermediates never allocated")


if __name__ == "__main__":
    main()
