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
import os
import tempfile

from gpt_step import add_model_args, kernel_split, mfu_lines, model_options, run, tokens_per_second


def main():
    p = argparse.ArgumentParser()
    add_model_args(p, steps=20, warmup=5)
    a = p.parse_args()
    extra = model_options(a)
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps {a.steps}")
    tmp = tempfile.mkdtemp(prefix="tpu_bench_cache_")
    cache = {"TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
             "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(tmp, "t3")}
    sync = dict(cache, TORCH_TPU_ASYNC_COMPILE="0")
    strict = run("strict", "none", a.steps, extra)
    cold = run("defer_and_fuse", "none", a.steps, extra, sync)       # empty cache, compiles now
    warm = run("defer_and_fuse", "none", a.steps, extra, sync)       # fresh process, warm tier 3
    cache_bg = dict(cache, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=os.path.join(tmp, "bg"))
    bg = run("defer_and_fuse", "none", a.steps, extra, cache_bg)     # empty cache, background

    rs, rd = tokens_per_second(strict, a.warmup), tokens_per_second(warm, a.warmup)
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
    for name, r in (("strict", strict), ("defer_and_fuse", warm)):
        total, mm, share = kernel_split(r)
        print(f"kernel time per step, {name:14s}: {total:7.1f} ms, matmul {mm:7.1f} ms "
              f"({100 * share:.0f}%), other kernels {total - mm:6.1f} ms")
    total, mm, share = kernel_split(strict)
    print(f"bound: a step whose non-matmul kernels took no time at all would run at most "
          f"{1 / share:.2f}x Strict's kernel time (the matmuls are the same library GEMM)")
    for line in mfu_lines({"strict": strict, "defer_and_fuse": warm},
                          [("strict", "tpu eager strict"),
                           ("defer_and_fuse", "tpu DeferAndFuse")], a.warmup):
        print(line)
    t = warm["trace"]
    print(f"trace: {t['flushes']} flushes, {t['nodes']} nodes, {t['nodes_fused']} fused, "
          f"{t['nodes_dropped']} dropped, {t['repeat_cuts']} repeated-block cuts, "
          f"{t['elided_bytes'] / 2**20:.0f} MiB of intermediates never allocated, "
          f"{t.get('reduction_groups', 0)} reduction groups, {t.get('epilogue_groups', 0)} "
          f"matmul-epilogue groups")


if __name__ == "__main__":
    main()
