"""The example GPT trains on tpu exactly like on CPU."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import train_gpt  # noqa: E402


def _args(device, steps=20):
    return train_gpt.parser().parse_args(["--device", device, "--steps", str(steps),
                                          "--log-every", "1000"])


def test_gpt_losses_match_cpu():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        cpu = train_gpt.train(_args("cpu"), log=lambda *_: None)
        tpu = train_gpt.train(_args("tpu"), log=lambda *_: None)
    finally:
        torch.set_float32_matmul_precision(old)
    assert len(cpu) == len(tpu) == 20
    for step, (c, t) in enumerate(zip(cpu, tpu)):
        assert abs(c - t) <= 1e-4 * abs(c), (step, c, t)
    assert tpu[-1] < tpu[0] - 0.5  # it learns
