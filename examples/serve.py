"""Batched generation with a static KV cache, compiled, on device "tpu" beside CPU: time to
first token and tokens/s for greedy and sampled decoding of several prompts.

    python examples/serve.py                     # a 2-layer Llama-style model, random weights
    python examples/serve.py --model PATH        # any local causal LM checkpoint and tokenizer

transformers compiles the decoding step of a static cache with torch.compile on accelerators
(backend "tpu" on device tpu); on CPU it decodes eagerly with the same static cache, which is
what a CPU user gets from `generate(cache_implementation="static")`. The first call on each
device warms up (compiles); the figures are from the calls after it. With the default model
the matmul precision is "highest", so greedy tokens must equal CPU's; the script checks.
"""
import argparse
import statistics
import time

import torch

PROMPTS = ["The lamp by the harbour", "Every sailor knows", "When the wind is high",
           "the Heron, the Wren,"]


class ByteTokenizer:
    vocab_size = 257  # bytes, then the padding id 256

    pad = 256

    def batch(self, texts):
        ids = [list(t.encode("utf-8")) for t in texts]
        n = max(map(len, ids))
        input_ids = torch.tensor([[self.pad] * (n - len(i)) + i for i in ids])  # left padding
        mask = (input_ids != self.pad).long()
        return {"input_ids": input_ids, "attention_mask": mask}

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class FirstToken:
    """A generate() streamer noting when the first generated token arrives."""

    def __init__(self):
        self.t_first = None
        self.calls = 0

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.t_first is None:  # call 1 is the prompt
            self.t_first = time.perf_counter()

    def end(self):
        pass


def fp8_cache(model, max_len):
    """A static KV cache holding keys and values as float8_e4m3fn (one byte each, half of a
    bfloat16 cache) with one float32 scale per sequence and head, set from the prompt's
    largest magnitude; later tokens saturate at the format's largest value (448 * scale)."""
    from transformers.cache_utils import Cache, StaticLayer

    fp8, fp8_max = torch.float8_e4m3fn, torch.finfo(torch.float8_e4m3fn).max

    class Fp8Layer(StaticLayer):
        def lazy_initialization(self, key_states, value_states):
            self.device, self.dtype = key_states.device, key_states.dtype
            b, h, _, d = key_states.shape

            def store(states):  # uint8 storage seen as float8 (index_copy_ on bytes)
                return torch.zeros(b, h, self.max_cache_len, states.shape[-1],
                                   dtype=torch.uint8, device=self.device)

            def scale(states):
                amax = states.detach().abs().float().amax(dim=(2, 3), keepdim=True)
                return (amax / fp8_max).clamp_min(1e-12)
            self.keys, self.values = store(key_states), store(value_states)
            self.k_scale, self.v_scale = scale(key_states), scale(value_states)
            self.cumulative_length = self.cumulative_length.to(self.device)
            for t in (self.keys, self.values, self.k_scale, self.v_scale, self.cumulative_length):
                torch._dynamo.mark_static_address(t)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            pos = torch.arange(n, device=self.device) + self.cumulative_length
            self.cumulative_length.add_(n)

            def put(store, states, scale):
                q = (states.float() / scale).clamp(-fp8_max, fp8_max).to(fp8)
                store.index_copy_(2, pos, q.view(torch.uint8))
                return store.view(fp8).to(self.dtype) * scale.to(self.dtype)
            return (put(self.keys, key_states, self.k_scale),
                    put(self.values, value_states, self.v_scale))

    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[Fp8Layer(max_cache_len=max_len) for _ in range(n_layers)])


def cache_bytes(cache):
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values))


def compare_fp8_kv(model, batch, device, new_tokens):
    """Greedy decoding in bfloat16 with a bfloat16 static cache and with the float8 one: the
    logits' largest error (over the steps before the tokens first differ) and the KV bytes."""
    from transformers import StaticCache
    m = model.to(device=device, dtype=torch.bfloat16)
    inputs = {k: v.to(device) for k, v in batch.items()}
    max_len = inputs["input_ids"].shape[1] + new_tokens
    results = {}
    for name, cache in (("bf16", StaticCache(config=m.config, max_cache_len=max_len)),
                        ("fp8", fp8_cache(m, max_len))):
        out = m.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, cache=cache, return_dict_in_generate=True,
                         output_logits=True)
        results[name] = (out.sequences.cpu(), torch.stack(out.logits, 1).float().cpu(),
                         cache_bytes(cache))
    (tb, lb, bb), (tf, lf, bf) = results["bf16"], results["fp8"]
    n0 = inputs["input_ids"].shape[1]
    differ = (tb[:, n0:] != tf[:, n0:]).any(0).nonzero()
    steps = int(differ[0]) + 1 if len(differ) else new_tokens  # the first differing step counts
    err = (lb[:, :steps] - lf[:, :steps]).abs().max().item()
    scale = lb[:, :steps].abs().max().item()
    print(f"fp8 KV cache on {device}: max |logit error| against the bf16 cache {err:.4f} "
          f"(logits up to {scale:.2f}; {err / scale:.2%}), over {steps} steps; greedy tokens "
          f"equal: {torch.equal(tb, tf)}; KV memory {bf / 2**10:.0f} KiB vs {bb / 2**10:.0f} KiB "
          f"({bf / bb:.2f}x)")
    model.to(dtype=torch.float32)
    return err, bf / bb


class Fp8Linear(torch.nn.Module):
    """A linear layer over a float8_e4m3fn weight with one float32 scale per output row (an
    FP8 checkpoint's layout). Each call quantizes the activations per row to float8 too and
    multiplies with torch._scaled_mm, which accumulates in float32 and applies both scales:
    the weight is never expanded to a full-precision copy."""

    def __init__(self, weight_fp8, weight_scale, bias=None):
        super().__init__()
        self.register_buffer("weight", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)  # (out_features, 1) float32
        self.bias = bias

    def forward(self, x):
        fmax = torch.finfo(torch.float8_e4m3fn).max
        rows = x.reshape(-1, x.shape[-1])
        x_scale = (rows.abs().float().amax(-1, keepdim=True) / fmax).clamp_min(1e-12)
        xq = (rows.float() / x_scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, self.weight.t(), x_scale, self.weight_scale.t(),
                             out_dtype=x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)


def quantize_fp8(model):
    """The model's linear weights (not the embedding or the head) as an FP8 state dict."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            w = mod.weight.detach().float().cpu()
            scale = (w.abs().amax(-1, keepdim=True) / fmax).clamp_min(1e-12)
            out[name + ".weight"] = (w / scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn)
            out[name + ".weight_scale"] = scale
    return out


def load_fp8(model, path, device):
    """Replaces the model's linear layers by Fp8Linear over the checkpoint at `path`, loaded
    straight onto `device` (safetensors)."""
    from safetensors.torch import load_file
    state = load_file(path, device=str(device))
    for name, mod in list(model.named_modules()):
        if name + ".weight" in state:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf,
                    Fp8Linear(state[name + ".weight"], state[name + ".weight_scale"], mod.bias))
    return model


def linear_bytes(model):
    return sum(b.numel() * b.element_size() for n, m in model.named_modules()
               if isinstance(m, (torch.nn.Linear, Fp8Linear)) and "lm_head" not in n
               for b in (m.weight,))


def greedy_logit_error(base, q, inputs, new_tokens):
    """Greedy decoding with both models: the logits' largest difference over the steps before
    their tokens first differ (that step counts), the largest logit there, and the steps."""
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              return_dict_in_generate=True, output_logits=True)
    ref, got = base.generate(**inputs, **kw), q.generate(**inputs, **kw)
    lb, lq = torch.stack(ref.logits, 1).float().cpu(), torch.stack(got.logits, 1).float().cpu()
    n0 = inputs["input_ids"].shape[1]
    differ = (ref.sequences[:, n0:] != got.sequences[:, n0:]).any(0).nonzero().cpu()
    steps = int(differ[0]) + 1 if len(differ) else new_tokens
    err = (lb[:, :steps] - lq[:, :steps]).abs().max().item()
    return err, lb[:, :steps].abs().max().item(), steps


def compare_fp8_weights(model, batch, device, new_tokens):
    """Saves the model's linear weights as an FP8 safetensors checkpoint, loads it on the device
    and decodes greedily: logit error and linear-weight memory against the bfloat16 model."""
    import copy
    import tempfile
    from safetensors.torch import save_file
    base = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)
    inputs = {k: v.to(device) for k, v in batch.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/fp8.safetensors"
        save_file(quantize_fp8(base), path)
        q = load_fp8(copy.deepcopy(base), path, device)
    err, scale, steps = greedy_logit_error(base, q, inputs, new_tokens)
    mem_b, mem_q = linear_bytes(base), sum(
        m.weight.numel() * m.weight.element_size() + m.weight_scale.numel() * 4
        for m in q.modules() if isinstance(m, Fp8Linear))
    print(f"fp8 weights on {device}: max |logit error| against bf16 weights {err:.4f} (logits "
          f"up to {scale:.2f}; {err / scale:.2%}) over {steps} steps; linear weights "
          f"{mem_q / 2**10:.0f} KiB vs {mem_b / 2**10:.0f} KiB ({mem_q / mem_b:.2f}x)")
    return err, mem_q / mem_b


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # float4_e2m1's magnitudes, by code


def to_e2m1(v):
    """Codes (uint8, 0..15: sign bit 8) of float4_e2m1 values nearest to v (saturating at 6)."""
    mids = torch.tensor([(a + b) / 2 for a, b in zip(E2M1, E2M1[1:])], device=v.device)
    code = (v.abs().unsqueeze(-1) > mids).sum(-1)
    return (code + 8 * (v < 0)).to(torch.uint8)


def pack_fp4(codes):
    """Two codes a byte along the last dim (element 2i in the low nibble): float4_e2m1fn_x2."""
    c = codes.reshape(*codes.shape[:-1], -1, 2).to(torch.int32)
    return (c[..., 0] + 16 * c[..., 1]).to(torch.uint8).view(torch.float4_e2m1fn_x2)


def swizzle(scales):
    """A [rows, k blocks] scale grid in the 128 x 4 tiled layout _scaled_mm takes for block
    scales (cuBLAS's): tile (row tile, k tile) holds row 32 * a + b, block c at b * 16 + a * 4 + c."""
    rows, kb = scales.shape
    rt, kt = -(-rows // 128), -(-kb // 4)
    u = scales.view(torch.uint8)
    u = torch.nn.functional.pad(u, (0, kt * 4 - kb, 0, rt * 128 - rows))
    u = u.reshape(rt, 4, 32, kt, 4).permute(0, 3, 2, 1, 4).contiguous()
    return u.reshape(-1).view(scales.dtype)


def quantize_fp4(x, fmt):
    """x [rows, K] -> (packed float4 [rows, K/2], swizzled block scales, global float scale).
    mxfp4: blocks of 32 with a power-of-two float8_e8m0fnu scale (OCP MX); nvfp4: blocks of
    16 with a float8_e4m3fn scale under one float32 scale for the tensor."""
    block = 32 if fmt == "mxfp4" else 16
    rows, k = x.shape
    xb = x.float().reshape(rows, k // block, block)
    amax = xb.abs().amax(-1)
    if fmt == "mxfp4":
        exp = torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2  # 6 = 1.5 * 2^2
        scale = torch.exp2(exp)
        codes = (exp + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
        g = torch.ones((), device=x.device)
    else:
        g = (amax.amax() / (6 * 448)).clamp_min(1e-12)
        codes = (amax / 6 / g).to(torch.float8_e4m3fn)
        scale = codes.float() * g
    q = to_e2m1(xb / scale.clamp_min(1e-30).unsqueeze(-1)).reshape(rows, k)
    return pack_fp4(q), swizzle(codes), g


class Fp4Linear(torch.nn.Module):
    """A linear layer over a float4 (MXFP4 or NVFP4) weight: the activations are quantized to
    the same format per block on each call (W4A4) and torch._scaled_mm multiplies them with
    block scales, accumulating in float32."""

    def __init__(self, packed, scales, g, fmt, bias=None):
        super().__init__()
        self.fmt = fmt
        self.register_buffer("weight", packed)  # [out, in / 2] float4_e2m1fn_x2
        self.register_buffer("weight_scale", scales)
        self.register_buffer("weight_global", g)
        self.bias = bias

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        xq, xs, xg = quantize_fp4(rows, self.fmt)
        y = torch._scaled_mm(xq, self.weight.t(), xs, self.weight_scale, out_dtype=torch.float32)
        y = (y * (xg * self.weight_global)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)


def quantize_model_fp4(model, fmt):
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            q, s, g = quantize_fp4(mod.weight.detach().float().cpu(), fmt)
            out.update({name + ".weight": q, name + ".weight_scale": s,
                        name + ".weight_global": g})
    return out


def compare_fp4_weights(model, batch, device, new_tokens, fmt):
    """Saves the linear weights as an MXFP4/NVFP4 safetensors checkpoint, loads it on the
    device and decodes greedily: logit error and weight memory against the bfloat16 model."""
    import copy
    import tempfile
    from safetensors.torch import load_file, save_file
    base = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)
    inputs = {k: v.to(device) for k, v in batch.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/{fmt}.safetensors"
        save_file(quantize_model_fp4(base, fmt), path)
        state = load_file(path, device=str(device))
    q = copy.deepcopy(base)
    for name, mod in list(q.named_modules()):
        if name + ".weight" in state:
            parent, _, leaf = name.rpartition(".")
            setattr(q.get_submodule(parent), leaf, Fp4Linear(
                state[name + ".weight"], state[name + ".weight_scale"],
                state[name + ".weight_global"], fmt, mod.bias))
    err, scale, steps = greedy_logit_error(base, q, inputs, new_tokens)
    mem_q = sum(t.numel() * t.element_size() for m in q.modules() if isinstance(m, Fp4Linear)
                for t in (m.weight, m.weight_scale, m.weight_global))
    mem_b = linear_bytes(base)
    print(f"{fmt} weights on {device}: max |logit error| against bf16 weights {err:.4f} (logits "
          f"up to {scale:.2f}; {err / scale:.2%}) over {steps} steps; linear weights "
          f"{mem_q / 2**10:.0f} KiB vs {mem_b / 2**10:.0f} KiB ({mem_q / mem_b:.2f}x)")
    return err, mem_q / mem_b


def build(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    if args.model:
        tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(args.model).eval()
        return model, lambda texts: dict(tok(texts, return_tensors="pt", padding=True)), \
            lambda ids: tok.decode(ids, skip_special_tokens=True)
    tok = ByteTokenizer()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=args.width,
                      intermediate_size=4 * args.width, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=tok.pad, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval(), tok.batch, tok.decode


def run(model, batch, device, sample, new_tokens, seed):
    inputs = {k: v.to(device) for k, v in batch.items()}
    streamer = FirstToken()
    kw = dict(do_sample=True, temperature=0.8, top_k=20) if sample else dict(do_sample=False)
    torch.manual_seed(seed)
    if device != "cpu":
        torch.get_device_module(device).manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         cache_implementation="static", streamer=streamer, **kw)
    out = out.cpu()  # the tokens on the host: the end of the request
    t1 = time.perf_counter()
    n_new = out.shape[1] - inputs["input_ids"].shape[1]
    return out, streamer.t_first - t0, out.shape[0] * n_new / (t1 - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--devices", default="tpu,cpu")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="highest", choices=["medium", "high", "highest"])
    p.add_argument("--fp8-kv", action="store_true",
                   help="also decode in bfloat16 with a float8 KV cache: logit error and memory "
                        "against a bfloat16 cache")
    p.add_argument("--fp8-weights", action="store_true",
                   help="also decode with the linear layers' weights from an FP8 safetensors "
                        "checkpoint (per-row scales, torch._scaled_mm): logit error and memory")
    p.add_argument("--fp4-weights", choices=["mxfp4", "nvfp4"], action="append", default=[],
                   help="also decode with MXFP4 / NVFP4 linear weights from safetensors "
                        "(block scales, torch._scaled_mm): logit error and memory")
    args = p.parse_args()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision(args.precision)
    from transformers.utils import logging
    logging.set_verbosity_error()

    model, tokenize, decode = build(args)
    batch = tokenize(PROMPTS)
    print(f"{len(PROMPTS)} prompts, {args.new_tokens} new tokens each, static KV cache, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    results = {}
    for device in args.devices.split(","):
        m = model.to(device)
        for sample in (False, True):
            t = time.perf_counter()
            run(m, batch, device, sample, args.new_tokens, seed=1)  # warm-up: compiles on tpu
            warm = time.perf_counter() - t
            runs = [run(m, batch, device, sample, args.new_tokens, seed=1)
                    for _ in range(args.repeats)]
            out = runs[-1][0]
            ttft = statistics.median(r[1] for r in runs)
            rate = statistics.median(r[2] for r in runs)
            kind = "sampled" if sample else "greedy"
            results[device, kind] = (out, ttft, rate)
            print(f"{device:4s} {kind:8s} first call {warm:6.2f} s; then time to first token "
                  f"{ttft * 1e3:7.1f} ms, {rate:7.1f} tokens/s")
        model = m.to("cpu")
    devs = args.devices.split(",")
    if len(devs) == 2:
        a, b = devs
        for kind in ("greedy", "sampled"):
            ra, rb = results[a, kind], results[b, kind]
            same = torch.equal(ra[0], rb[0])
            print(f"{kind}: {a}/{b} tokens/s {ra[2] / rb[2]:.2f}x, time to first token "
                  f"{rb[1] / ra[1]:.2f}x faster on {a}; tokens equal: {same}"
                  + ("" if kind == "greedy" else " (each device samples with its own generator)"))
    if args.fp8_kv:
        compare_fp8_kv(model, batch, devs[0], args.new_tokens)
    if args.fp8_weights:
        compare_fp8_weights(model, batch, devs[0], args.new_tokens)
    for fmt in args.fp4_weights:
        compare_fp4_weights(model, batch, devs[0], args.new_tokens, fmt)
    out = results[devs[0], "greedy"][0]
    for prompt, row in zip(PROMPTS, out):
        print(f"  {prompt!r} -> {decode(row.tolist())!r}")


if __name__ == "__main__":
    main()
