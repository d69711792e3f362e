"""The Hugging Face examples run end to end as a newcomer runs them (short settings), and
their own checks against CPU hold: serve.py's greedy tokens, diffusion.py's images."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, timeout=600):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_hf_finetune_trains_and_plots(tmp_path):
    png = tmp_path / "loss.png"
    out = run("hf_finetune.py", "--steps", "12", "--plot", str(png))
    line = next(l for l in out.splitlines() if l.startswith("done:"))
    first, last = (float(v) for v in line.split("loss ")[1].split(" (")[0].split(" -> "))
    assert last < first - 1.0, line  # it learns: from ~ln(256) towards the text's statistics
    assert "tokens/s" in line and "peak device memory" in line
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_greedy_tokens_equal_cpu():
    out = run("serve.py", "--new-tokens", "6", "--repeats", "1", "--width", "64", "--fp8-kv",
              "--fp8-weights")
    assert "greedy: tpu/cpu tokens/s" in out and "tokens equal: True" in out.split("sampled:")[0], out
    assert "time to first token" in out
    # the float8 KV cache: half the bytes of the bfloat16 one, logits close to its
    line = next(l for l in out.splitlines() if l.startswith("fp8 KV cache on tpu"))
    assert "(0.50x)" in line, line
    assert float(line.split("bf16 cache ")[1].split(" ")[0]) < 0.05, line
    # FP8 weights from safetensors through torch._scaled_mm: about half the bf16 bytes
    line = next(l for l in out.splitlines() if l.startswith("fp8 weights on tpu"))
    assert "(0.53x)" in line and float(line.split("bf16 weights ")[1].split(" ")[0]) < 0.1, line


def test_diffusion_images_equal_cpu(tmp_path):
    png = tmp_path / "d.png"
    out = run("diffusion.py", "--steps", "3", "--batch", "2", "--size", "16", "--out", str(png))
    assert "images equal to CPU's within" in out and ": True;" in out, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
