"""Fine-tunes a Hugging Face causal LM on device "tpu" with a tqdm progress bar, tokens/s,
peak device memory and a PNG loss curve.

    python examples/hf_finetune.py                       # a tiny Llama-style model, 2 min or less
    python examples/hf_finetune.py --model PATH          # any local causal LM checkpoint
    python examples/hf_finetune.py --device cpu          # the same on CPU, to compare

With no --model, the model is a small Llama-style config built by transformers from scratch
with a byte-level vocabulary, since this example must not download anything; with --model it
loads `from_pretrained(PATH, device_map=device)` and that checkpoint's own tokenizer. The text is
examples/data/tiny_text.txt (or --text). Nothing here is TPU specific beyond the device string.
"""
import argparse
import math
import os
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 (what a model built from scratch can use offline)."""
    vocab_size = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def build(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    if args.model:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, device_map=args.device)
        encode = lambda s: tok(s)["input_ids"]  # noqa: E731
        return model, encode, tok.decode
    tok = ByteTokenizer()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=args.width,
                      intermediate_size=4 * args.width, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
                      max_position_embeddings=args.block_size, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg).to(args.device)
    return model, tok.encode, tok.decode


def save_curve(losses, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(losses)), losses, lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory_module(device):
    return torch.get_device_module(torch.device(device).type) if device != "cpu" else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="tpu")
    p.add_argument("--model", default=None, help="a local causal LM checkpoint directory")
    p.add_argument("--text", default=os.path.join(HERE, "data", "tiny_text.txt"))
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (backend tpu)")
    p.add_argument("--plot", default="hf_finetune_loss.png", help="PNG loss curve ('' for none)")
    args = p.parse_args()
    from tqdm import tqdm

    model, encode, decode = build(args)
    data = torch.tensor(encode(open(args.text, encoding="utf-8").read()), dtype=torch.long)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters on {args.device}; text: {len(data)} tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model, backend="tpu" if args.device.startswith("tpu") else "inductor")
    gen = torch.Generator().manual_seed(args.seed)
    mem = memory_module(args.device)
    if mem is not None:
        mem.reset_peak_memory_stats()
    model.train()
    losses, tokens, t0 = [], 0, time.perf_counter()
    bar = tqdm(range(args.steps), desc="fine-tune", unit="step")
    for step in bar:
        starts = torch.randint(0, len(data) - args.block_size - 1, (args.batch_size,), generator=gen)
        x = torch.stack([data[s:s + args.block_size] for s in starts]).to(args.device)
        loss = step_fn(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the step's value: also the synchronization point
        tokens += x.numel()
        rate = tokens / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:.0f}")
        if args.max_seconds and time.perf_counter() - t0 > args.max_seconds:
            bar.close()
            print(f"stopping at the {args.max_seconds:.0f} s limit")
            break
    elapsed = time.perf_counter() - t0
    peak = mem.max_memory_allocated() if mem is not None else 0
    print(f"done: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
          f"(uniform guess {math.log(model.config.vocab_size):.3f}), {tokens / elapsed:.0f} tokens/s, "
          f"peak device memory {peak / 2**20:.1f} MiB")
    model.eval()
    prompt = torch.tensor([encode("The lamp")], dtype=torch.long).to(args.device)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=40, do_sample=False)
    print("sample:", repr(decode(out[0].tolist())))
    if args.plot:
        save_curve(losses, args.plot, f"{type(model).__name__} on {args.device}")
        print(f"loss curve: {args.plot}")


if __name__ == "__main__":
    main()
