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
              "--fp8-weights", "--fp4-weights", "mxfp4", "--fp4-weights", "nvfp4")
    assert "greedy: tpu/cpu tokens/s" in out and "tokens equal: True" in out.split("sampled:")[0], out
    assert "time to first token" in out
    # the float8 KV cache: half the bytes of the bfloat16 one, logits close to its
    line = next(l for l in out.splitlines() if l.startswith("fp8 KV cache on tpu"))
    assert "(0.50x)" in line, line
    assert float(line.split("bf16 cache ")[1].split(" ")[0]) < 0.05, line
    # FP8 weights from safetensors through torch._scaled_mm: about half the bf16 bytes
    line = next(l for l in out.splitlines() if l.startswith("fp8 weights on tpu"))
    assert "(0.53x)" in line and float(line.split("bf16 weights ")[1].split(" ")[0]) < 0.1, line
    for fmt in ("mxfp4", "nvfp4"):  # 4.25 / 4.5 bits a weight with the scales: under 0.3x bf16
        line = next(l for l in out.splitlines() if l.startswith(f"{fmt} weights on tpu"))
        assert float(line.split("(")[-1].split("x)")[0]) <= 0.3, line


def test_diffusion_images_equal_cpu(tmp_path):
    png = tmp_path / "d.png"
    out = run("diffusion.py", "--steps", "3", "--batch", "2", "--size", "16", "--out", str(png))
    assert "images equal to CPU's within" in out and ": True;" in out, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_serve_fp4_weights_quantize_and_multiply(fmt):
    """serve.py's MXFP4/NVFP4 path on tpu: its quantization decodes back within FP4's error,
    and torch._scaled_mm on the packed operands equals the product of the decoded values."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import serve
    finally:
        sys.path.pop(0)
    block = 32 if fmt == "mxfp4" else 16
    lut = torch.tensor(serve.E2M1 + tuple(-v for v in serve.E2M1))

    def decode(q, s, g, rows, k):  # packed codes and swizzled scales back to float32
        u = q.cpu().view(torch.uint8).long()
        vals = torch.stack([lut[u & 15], lut[u >> 4]], -1).reshape(rows, k)
        kb = k // block
        rt, kt = -(-rows // 128), -(-kb // 4)
        su = s.cpu().view(torch.uint8).reshape(rt, kt, 32, 4, 4).permute(0, 3, 2, 1, 4)
        su = su.reshape(rt * 128, kt * 4)[:rows, :kb]
        sv = torch.exp2(su.float() - 127) if fmt == "mxfp4" else su.view(torch.float8_e4m3fn).float()
        return vals * sv.repeat_interleave(block, 1) * g.cpu()

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=g) * 0.05, torch.randn(136, 64, generator=g) * 0.05
    xq, xs, xg = serve.quantize_fp4(x.to("tpu"), fmt)
    wq, ws, wg = serve.quantize_fp4(w.to("tpu"), fmt)
    assert xq.dtype == torch.float4_e2m1fn_x2 and xq.shape == (8, 32)
    xd, wd = decode(xq, xs, xg, 8, 64), decode(wq, ws, wg, 136, 64)
    for got, want in ((xd, x), (wd, w)):
        assert (got - want).norm() / want.norm() < 0.15  # FP4 keeps ~3 bits of mantissa
    y = torch._scaled_mm(xq, wq.t(), xs, ws, out_dtype=torch.float32).cpu() * (xg * wg).cpu()
    torch.testing.assert_close(y, xd @ wd.t(), rtol=1e-5, atol=1e-6)
