"""This machine's measured multiply-add peak (bench/fma_peak.c: float32 FMAs, or bfloat16
dot products where the CPU has them, which the matrix unit uses at precision medium) and model FLOPs utilization
(MFU) of the example GPT's training step. No torch import: the parent processes of the GPT
benchmarks use it.

MFU = model FLOPs per token x tokens/s / peak, with the model FLOPs of one training step
per token (forward + backward) as PaLM's appendix B counts them:

    6 N + 12 L T d

N: parameters that take part in matrix products (all but the token and position embedding
tables, which are lookups), L layers, T context length, d width: 6 N for the weights'
products (2 forward, 4 backward), 12 L T d for attention's two T x T products (Q K^T and
P V), counted over the whole T x T square as PaLM does (causal attention needs half).
"""
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

FORMULA = ("model FLOPs/token = 6*N + 12*L*T*d (PaLM app. B; N = parameters outside the "
           "embedding tables, attention's T x T products counted in full)")


def measured_peak(tries=3):
    """(GFLOP/s of bench/fma_peak.c on all cores, description): the best of `tries`
    one-second runs (a bound that other load can only lower), or (None, why) where it
    cannot be built."""
    gcc = shutil.which("gcc")
    if not gcc:
        return None, "no gcc"
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "fma_peak")
        build = subprocess.run([gcc, "-O2", "-mavx2", "-mfma", "-pthread",
                                os.path.join(HERE, "fma_peak.c"), "-o", exe],
                               capture_output=True, text=True)
        if build.returncode != 0:
            return None, "fma_peak.c did not build: " + build.stderr.strip()[:200]
        cpu = open("/proc/cpuinfo").read()
        runs = [([exe, str(os.cpu_count()), "1"], "AVX2 FMA")]
        if "avx512f" in cpu:
            runs.append((runs[0][0] + ["--avx512"], "AVX-512 FMA"))
        if "avx512_bf16" in cpu:  # the matrix unit's instruction at precision medium here
            runs.append((runs[0][0] + ["--bf16dot"], "AVX-512 BF16 dot products"))
        best, how = 0.0, ""
        for cmd, what in runs * tries:
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode == 0 and float(out.stdout.strip()) > best:
                best, how = float(out.stdout.strip()), what
        return best, f"{os.cpu_count()} threads, {how}"


def gpt_flops_per_token(matmul_params, n_layer, block_size, n_embd):
    """Model FLOPs of one training step per token (FORMULA)."""
    return 6 * matmul_params + 12 * n_layer * block_size * n_embd


def mfu_line(label, tokens_per_s, flops_per_token, peak_gflops):
    """One printed line: model GFLOP/s and their share of the peak."""
    model = tokens_per_s * flops_per_token / 1e9
    share = f"{100 * model / peak_gflops:5.1f}% of peak" if peak_gflops else "peak n/a"
    return f"MFU {label:30s} {model:8.1f} model GFLOP/s  {share}"
