"""Tokens/s of the example GPT training step on tpu and on CPU, same run.

    .venv/bin/python bench/gpt_tokens.py [--steps N] [train_gpt options...]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import torch  # noqa: E402

import train_gpt  # noqa: E402


def tokens_per_second(device, extra, steps):
    args = train_gpt.parser().parse_args(["--device", device, "--steps", str(steps),
                                          "--log-every", "100000"] + extra)
    warm = train_gpt.parser().parse_args(["--device", device, "--steps", "3",
                                          "--log-every", "100000"] + extra)
    train_gpt.train(warm, log=lambda *_: None)
    t0 = time.perf_counter()
    losses = train_gpt.train(args, log=lambda *_: None)
    dt = time.perf_counter() - t0
    return steps * args.batch_size * args.block_size / dt, losses[-1]


def main():
    steps = 30
    extra = sys.argv[1:]
    if "--steps" in extra:
        i = extra.index("--steps")
        steps = int(extra[i + 1])
        del extra[i:i + 2]
    rows = [(dev,) + tokens_per_second(dev, extra, steps) for dev in ("cpu", "tpu")]
    print(f"{'device':<8} {'tokens/s':>10} {'final loss':>11}")
    for dev, tps, loss in rows:
        print(f"{dev:<8} {tps:10.0f} {loss:11.4f}")
    print(f"tpu/cpu tokens/s ratio: {rows[1][1] / rows[0][1]:.2f}"
          f"  (torch threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
