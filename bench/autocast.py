"""bf16 autocast vs float32 on the example GPT's training step (AdamW), at the same float32
matmul precision, in alternating pairs; issue 19's goal: autocast >= 1.2x float32.

    .venv/bin/python bench/autocast.py [--pairs 3] [--steps 8] [--warmup 3]
        [--precision medium] [--modes strict,defer_and_fuse,compiled] [--loss-steps 3]
        [--n-layer 6] [--n-embd 384] [--n-head 6] [--batch-size 8] [--block-size 128]

Each pair runs float32 and `torch.autocast("tpu", dtype=torch.bfloat16)` around forward and
loss (bench/gpt_step.py --autocast) in fresh processes, the order reversed every other pair
so that a change in the machine's load touches both alike; the ratio is autocast tokens/s
over float32 tokens/s per pair, then the median over pairs, with PASS/FAIL against 1.2 for
each mode (Strict by default). Then each configuration's kernels split into matrix-unit ops
and the rest (kernel_profile of the last pair), and the losses of the first --loss-steps
steps against CPU's (float32 and CPU's own bf16 autocast, the same initial weights and
batches).
"""
import argparse
import os
import statistics
import tempfile

from gpt_step import add_model_args, kernel_split, model_options, run, tokens_per_second

GOAL = 1.2
MODES = {"strict": ("strict", "none"), "defer_and_fuse": ("defer_and_fuse", "none"),
         "compiled": ("strict", "tpu")}
AMP = ["--autocast", "bfloat16"]


def main():
    p = argparse.ArgumentParser()
    add_model_args(p, steps=8, warmup=3)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--precision", default="medium", choices=["medium", "high", "highest"])
    p.add_argument("--modes", default="strict",
                   help="comma-separated: " + ", ".join(MODES))
    p.add_argument("--loss-steps", type=int, default=3, help="0: no loss check against CPU")
    p.set_defaults(block_size="128")
    a = p.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    extra = model_options(a) + ["--precision", a.precision]
    tmp = tempfile.mkdtemp(prefix="tpu_autocast_")
    env = {"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": tmp}
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps "
          f"{a.steps} (first {a.warmup} not timed)  pairs {a.pairs}")
    verdict = True
    for key in modes:
        mode, comp = MODES[key]
        if mode != "strict" or comp != "none":  # fill the fused-kernel caches first
            run(mode, comp, 2, extra, env)
            run(mode, comp, 2, extra + AMP, env)
        rates = {"float32": [], "autocast": []}
        last = {}
        for i in range(a.pairs):
            order = [("float32", []), ("autocast", AMP)]
            for name, opt in (order if i % 2 == 0 else order[::-1]):
                last[name] = run(mode, comp, a.steps, extra + opt, env)
                rates[name].append(tokens_per_second(last[name], a.warmup))
        ratios = [b / f for b, f in zip(rates["autocast"], rates["float32"])]
        med = statistics.median(ratios)
        ok = med >= GOAL
        verdict &= ok
        print(f"{key}: float32 {statistics.median(rates['float32']):.0f} tokens/s, bf16 "
              f"autocast {statistics.median(rates['autocast']):.0f} tokens/s; autocast/float32 "
              f"median {med:.2f} (pairs: {' '.join(f'{r:.2f}' for r in ratios)})  "
              f"{'PASS' if ok else 'FAIL'} (goal >= {GOAL})")
        for name in ("float32", "autocast"):
            total, mm, share = kernel_split(last[name])
            r = last[name]
            print(f"    {name:9s} last pair: step {1e3 * r['tokens'] / tokens_per_second(r, a.warmup):7.1f}"
                  f" ms, kernels {total:7.1f} ms, matmul {mm:7.1f} ms ({100 * share:.0f}%), "
                  f"peak {r['peak'] / 2**20:.0f} MiB")
            print("        top kernels: " + "; ".join(
                f"{n} {1e3 * t / r['kernels']['steps']:.1f} ms"
                for n, _, t in r["kernels"]["ops"][:7]))
    if a.loss_steps:
        n = a.loss_steps
        losses = {(dev, amp): run(dev, "none", n, extra + (AMP if amp else []), env)["losses"]
                  for dev in ("strict", "cpu") for amp in (False, True)}
        for amp, label in ((False, "float32"), (True, "bf16 autocast")):
            t, c = losses[("strict", amp)], losses[("cpu", amp)]
            diff = max(abs(x - y) / abs(y) for x, y in zip(t, c))
            print(f"losses, {label:13s}: tpu {' '.join(f'{v:.4f}' for v in t)}  cpu "
                  f"{' '.join(f'{v:.4f}' for v in c)}  max relative difference {diff:.1e}")
    print("PASS" if verdict else "FAIL")


if __name__ == "__main__":
    main()
