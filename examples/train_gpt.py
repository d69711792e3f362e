"""Trains a small character-level GPT with AdamW on device "tpu" (or "cpu").

    python examples/train_gpt.py --device tpu --max-seconds 120

Data, fully sharded or tensor parallel over several processes (one chip each), under torchrun:

    torchrun --nproc-per-node 2 examples/train_gpt.py --parallel ddp|fsdp|tp --steps 50

Each rank trains on its slice of the global batch (--batch-size); rank 0 prints.

Nothing here is TPU specific beyond the device string: the same script runs
on CPU with --device cpu. It prints the loss, tokens/s and peak device memory.
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEXT = os.path.join(HERE, "data", "tiny_text.txt")


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_out = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.drop(self.proj(y))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        x = x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size=64, n_layer=4, n_embd=128, n_head=4, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def load_text(path=DEFAULT_TEXT):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    return data, chars


def batches(data, block_size, batch_size, seed):
    """Yields (x, y) CPU batches from a seeded CPU generator (device-independent)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[i:i + block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])
        yield x, y


def make_model(vocab_size, args, seed):
    torch.manual_seed(seed)  # same initial weights on every device
    return GPT(vocab_size, args.block_size, args.n_layer, args.n_embd, args.n_head, args.dropout)


def peak_memory(device):
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    mod = getattr(torch, dev.type)
    return mod.max_memory_allocated()


def synchronize(device):
    dev = torch.device(device)
    if dev.type != "cpu":
        getattr(torch, dev.type).synchronize()


def parallelize(model, args, device):
    """Wraps the model for --parallel (the process group is up). Returns (model, the slice
    of each global batch this rank trains on)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} ranks")
    part = slice(rank * args.batch_size // world, (rank + 1) * args.batch_size // world)
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), part
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for blk in model.blocks:
            fully_shard(blk)
        return fully_shard(model), part
    # tensor parallel: the MLPs split by columns then rows, the head by columns
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    plan = {"head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.fc"] = ColwiseParallel()
        plan[f"blocks.{i}.fc_out"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan), slice(None)  # every rank: the whole batch


def train(args, log=print):
    """Trains and returns the list of per-step losses (floats)."""
    data, chars = load_text(args.text)
    device = torch.device(args.device)
    part = slice(None)
    parallel = getattr(args, "parallel", None)
    if parallel:
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type != "cpu" and device.index is None:
            # one chip per process: its own chip is tpu:0 unless the process sees several
            device = torch.device(device.type, local % getattr(torch, device.type).device_count())
        dist.init_process_group(device_id=device if device.type != "cpu" else None)
        if dist.get_rank() != 0:
            log = lambda *a, **k: None  # noqa: E731
    model = make_model(len(chars), args, args.seed).to(device)
    if parallel:
        model, part = parallelize(model, args, device)
    # DTensor and plain parameters side by side (tensor parallel): no foreach kernels
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            foreach=False if parallel == "tp" else None)
    losses = []
    tokens = 0
    t0 = time.perf_counter()
    t_window = t0
    tok_window = 0
    for step, (x, y) in enumerate(batches(data, args.block_size, args.batch_size, args.seed)):
        if step >= args.steps or (args.max_seconds and time.perf_counter() - t0 > args.max_seconds):
            break
        x, y = x[part].to(device), y[part].to(device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        tokens += x.numel()
        tok_window += x.numel()
        if step % args.log_every == 0 or step == args.steps - 1:
            if parallel:  # the mean over ranks: the loss of the global batch
                loss_all = loss.detach().clone()
                torch.distributed.all_reduce(loss_all, op=torch.distributed.ReduceOp.AVG)
                value = loss_all.item()
            else:
                value = loss.item()  # synchronizes
            now = time.perf_counter()
            rate = tok_window / max(now - t_window, 1e-9)
            t_window, tok_window = now, 0
            log(f"step {step:5d}  loss {value:.4f}  tokens/s {rate:9.0f}")
        losses.append(loss.detach())
    synchronize(device)
    elapsed = time.perf_counter() - t0
    losses = [float(v) for v in losses]
    peak = peak_memory(device)
    peak_s = "n/a" if peak is None else f"{peak / 2**20:.1f} MiB"
    log(f"done: {len(losses)} steps, {tokens / elapsed:.0f} tokens/s on {device}"
        f"{' (this rank)' if parallel else ''}, peak device memory {peak_s}, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if parallel:
        torch.distributed.destroy_process_group()
    return losses


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="tpu")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--precision", default=None, choices=[None, "highest", "high", "medium"],
                   help="torch.set_float32_matmul_precision")
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--parallel", default=None, choices=[None, "ddp", "fsdp", "tp"],
                   help="under torchrun: DistributedDataParallel, FSDP2 fully_shard or tensor "
                        "parallel over the ranks (backend tpu_dist for device tpu)")
    return p


def main():
    args = parser().parse_args()
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
    train(args)


if __name__ == "__main__":
    main()
