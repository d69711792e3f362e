"""torch.compile(backend="tpu") on the example GPT's training step, one run, ratios.

    .venv/bin/python bench/compile.py [--steps N] [--no-inductor] [--n-layer 6] [--n-embd 384]

Each configuration runs in a fresh process: Strict eager tpu; compiled tpu at medium and
at highest precision; torch.compile with Inductor on CPU float32 tensors (the peer);
compiled tpu again with a warm tier-3 cache (first-step time cold vs warm).
Goals (issue 6): compiled tokens/s >= 3.0x Strict eager and >= 1.0x Inductor on CPU.
"""
import argparse
import os
import tempfile

from gpt_step import add_model_args, kernel_split, mfu_lines, model_options, run, tokens_per_second


def main():
    p = argparse.ArgumentParser()
    add_model_args(p, steps=12, warmup=4)
    p.add_argument("--no-inductor", action="store_true")
    a = p.parse_args()
    extra = model_options(a)
    tmp = tempfile.mkdtemp(prefix="tpu_compile_bench_")
    env = {"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": tmp}
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps {a.steps}")
    res = {"strict": run("strict", "none", a.steps, extra, env)}
    res["tpu_medium"] = run("strict", "tpu", a.steps, extra, env)        # cold cache
    res["tpu_medium_warm"] = run("strict", "tpu", a.steps, extra, env)   # warm tier 3
    res["tpu_highest"] = run("strict", "tpu", a.steps, extra + ["--precision", "highest"], env)
    if not a.no_inductor:
        res["inductor"] = run("cpu", "inductor", a.steps, extra)

    def rate(r):
        return tokens_per_second(r, a.warmup)

    base = rate(res["strict"])
    ind = rate(res["inductor"]) if "inductor" in res else None
    print(f"{'configuration':34s} {'tokens/s':>10s} {'vs strict':>10s} {'vs inductor':>12s}")
    for k, label in [("strict", "tpu eager strict"), ("tpu_medium_warm", "tpu compiled, medium"),
                     ("tpu_highest", "tpu compiled, highest"), ("inductor", "cpu inductor float32")]:
        if k not in res:
            continue
        r = rate(res[k])
        vs_ind = f"{r / ind:12.2f}" if ind else f"{'n/a':>12s}"
        print(f"{label:34s} {r:10.0f} {r / base:10.2f} {vs_ind}")
    for k, label in [("strict", "eager strict"), ("tpu_medium_warm", "compiled, medium")]:
        total, mm, share = kernel_split(res[k])
        step = 1e3 / rate(res[k]) * res[k]["tokens"]
        print(f"tpu {label:17s}: step {step:6.1f} ms, kernels {total:6.1f} ms, matmul {mm:6.1f} ms "
              f"({100 * share:.0f}% of kernel time)")
    if ind:
        total, mm, share = kernel_split(res["tpu_medium_warm"])
        step = 1e3 / ind * res["inductor"]["tokens"]
        print(f"inductor's whole step {step:.1f} ms; tpu's matmul kernels alone take "
              f"{mm / step:.2f}x of it; Strict's kernels bound any fusion at "
              f"{1 / kernel_split(res['strict'])[2]:.2f}x Strict")
    cold, warm = res["tpu_medium"], res["tpu_medium_warm"]
    print(f"first step: cold cache {cold['times'][0]:.2f} s ({cold['cache']['compiles']} compiles, "
          f"{cold['cache']['compile_seconds']:.2f} s compiling), warm tier-3 cache "
          f"{warm['times'][0]:.2f} s ({warm['cache']['compiles']} compiles, "
          f"{warm['cache']['tier3_hits']} tier-3 hits)")
    for line in mfu_lines(res, [("strict", "tpu eager strict"),
                                ("tpu_medium_warm", "tpu compiled, medium"),
                                ("tpu_highest", "tpu compiled, highest"),
                                ("inductor", "cpu inductor float32")], a.warmup):
        print(line)
    print("goals: compiled >= 3.0x strict and >= 1.0x inductor")


if __name__ == "__main__":
    main()
