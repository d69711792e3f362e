"""Strict, DeferAndFuse and compiled tpu on the example GPT's training step (AdamW), in
alternating rounds, with tokens/s ratios and MFU.

    .venv/bin/python bench/gpt_modes.py [--pairs 3] [--steps 8] [--warmup 3]
        [--n-layer 6] [--n-embd 384] [--n-head 6] [--batch-size 8] [--block-size 128]

Defaults: issue 19's item 1 configuration (width 384, 6 layers, context 128, batch 8). Each
round runs the three configurations in fresh processes (warm fused-kernel cache after the
first round), the order reversed every other round so that a change in the machine's load
touches them alike; ratios are per round, then the median over rounds. MFU: bench/peak.py.
With the peer (default; --no-inductor leaves it out) each round also runs torch.compile with
Inductor on CPU float32 tensors, and the goals of issue 19 are printed with PASS/FAIL:
DeferAndFuse >= 1.1x Strict with peak device memory <= 0.9x Strict and losses equal to
Strict's within 1e-5; compiled >= 1.15x Strict and >= 1.1x Inductor.
"""
import argparse
import os
import statistics
import tempfile

from gpt_step import add_model_args, kernel_split, mfu_lines, model_options, run, tokens_per_second

MODES = [("strict", "strict", "none"), ("defer_and_fuse", "defer_and_fuse", "none"),
         ("compiled", "strict", "tpu")]


def main():
    p = argparse.ArgumentParser()
    add_model_args(p, steps=8, warmup=3)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--no-inductor", action="store_true")
    p.set_defaults(block_size="128")
    a = p.parse_args()
    extra = model_options(a)
    tmp = tempfile.mkdtemp(prefix="tpu_gpt_modes_")
    env = {"TORCH_TPU_ASYNC_COMPILE": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled",
           "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": tmp}
    print(f"load average: {os.getloadavg()[0]:.2f}  config: {' '.join(extra)}  steps "
          f"{a.steps} (first {a.warmup} not timed)  rounds {a.pairs}")
    run("defer_and_fuse", "none", 2, extra, env)  # fill the fused-kernel cache
    run("strict", "tpu", 2, extra, env)
    modes = MODES + ([] if a.no_inductor else [("inductor", "cpu", "inductor")])
    if not a.no_inductor:
        run("cpu", "inductor", 2, extra)  # fill Inductor's own cache
    rates = {k: [] for k, _, _ in modes}
    last = {}
    for i in range(a.pairs):
        order = modes if i % 2 == 0 else modes[::-1]
        for key, mode, comp in order:
            last[key] = run(mode, comp, a.steps, extra, env)
            rates[key].append(tokens_per_second(last[key], a.warmup))
    print(f"{'configuration':16s} {'tokens/s (median)':>18s} {'vs strict (median of rounds)':>30s}")
    for key, _, _ in modes:
        ratios = [r / s for r, s in zip(rates[key], rates["strict"])]
        print(f"{key:16s} {statistics.median(rates[key]):18.0f} "
              f"{statistics.median(ratios):30.2f}   rounds: "
              + " ".join(f"{r:.2f}" for r in ratios))
    for key, _, _ in MODES:
        total, mm, share = kernel_split(last[key])
        step = 1e3 * last[key]["tokens"] / tokens_per_second(last[key], a.warmup)
        print(f"{key:16s} last round: step {step:7.1f} ms, kernels {total:7.1f} ms, matmul "
              f"{mm:7.1f} ms ({100 * share:.0f}%)")
        print("    top kernels: " + "; ".join(
            f"{n} {1e3 * t / last[key]['kernels']['steps']:.1f} ms"
            for n, t in _top(last[key])))
    med = {k: {"times": [1.0] * a.warmup + [last[k]["tokens"] / statistics.median(v)],
               "tokens": last[k]["tokens"], "flops_per_token": last[k]["flops_per_token"]}
           for k, v in rates.items()}
    for line in mfu_lines(med, [(k, f"{'cpu' if k == 'inductor' else 'tpu'} {k} (median)")
                                for k, _, _ in modes], a.warmup):
        print(line)
    _goals(rates, last)


def _ratio(rates, key, base):
    return statistics.median(r / b for r, b in zip(rates[key], rates[base]))


def _goals(rates, last):
    """Issue 19's goals for this configuration, PASS/FAIL."""
    peak = last["defer_and_fuse"]["peak"] / max(last["strict"]["peak"], 1)
    loss = max(abs(a - b) / max(abs(b), 1e-12) for a, b in
               zip(last["defer_and_fuse"]["losses"], last["strict"]["losses"]))
    goals = [("DeferAndFuse tokens/s vs Strict", _ratio(rates, "defer_and_fuse", "strict"), ">=", 1.1),
             ("DeferAndFuse peak device memory vs Strict", peak, "<=", 0.9),
             ("DeferAndFuse losses, max relative difference to Strict", loss, "<=", 1e-5),
             ("compiled tokens/s vs Strict", _ratio(rates, "compiled", "strict"), ">=", 1.15)]
    if "inductor" in rates:
        goals.append(("compiled tokens/s vs Inductor on CPU",
                      _ratio(rates, "compiled", "inductor"), ">=", 1.1))
    for what, value, op, goal in goals:
        ok = value >= goal if op == ">=" else value <= goal
        print(f"goal: {what:56s} {value:10.3g} {op} {goal:<6g} {'PASS' if ok else 'FAIL'}")


def _top(result, n=6):
    """(op, seconds) of the result's n kernels that took longest (profile of the last half)."""
    return [(name, t) for name, _, t in result["kernels"]["ops"][:n]]


if __name__ == "__main__":
    main()
