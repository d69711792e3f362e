"""One rank of a tpu_dist test: `python -m tests.dist.worker SCENARIO MODE OUT_DIR`, with
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set (by tests/dist/launch.py or torchrun).
Each scenario checks its results against values computed on CPU here and writes
OUT_DIR/rank<r>.json ({"ok": true, ...figures}); an assertion fails the rank (nonzero exit)."""
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_tpu

torch.set_num_threads(1)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def value(rank, shape, dtype, seed=0):
    """Rank `rank`'s input: exact in every dtype, different per rank."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    lo, hi = (0, 5) if dtype == torch.uint8 else (-4, 5)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def reduce_ref(xs, op):
    acc = xs[0].clone()
    for x in xs[1:]:
        if op == dist.ReduceOp.SUM:
            acc = (acc | x) if acc.dtype == torch.bool else acc + x
        elif op == dist.ReduceOp.PRODUCT:
            acc = (acc & x) if acc.dtype == torch.bool else acc * x
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, x)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, x)
        elif op == dist.ReduceOp.BAND:
            acc = acc & x
        elif op == dist.ReduceOp.BOR:
            acc = acc | x
        elif op == dist.ReduceOp.BXOR:
            acc = acc ^ x
    return acc


def same(got, want, what):
    got = got.cpu()
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype.is_floating_point:
        ok = torch.allclose(got.double(), want.double(), rtol=1e-2 if want.dtype in (
            torch.bfloat16, torch.float16) else 1e-6, atol=1e-6)
    else:
        ok = torch.equal(got, want)
    assert ok, f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"


def scenario_collectives(rank, world, out):
    dev = torch.device("tpu", 0)
    n = 1000
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    for dt in DTYPES:
        xs = [value(r, (n,), dt) for r in range(world)]
        for op in ops + ([dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
                         if not dt.is_floating_point else []):
            if op == dist.ReduceOp.PRODUCT and dt.is_floating_point:
                xs_p = [x.clamp(-2, 2) for x in xs]
            else:
                xs_p = xs
            t = xs_p[rank].to(dev)
            dist.all_reduce(t, op=op)
            want = reduce_ref(xs_p, op)
            same(t, want, f"all_reduce {op} {dt}")
        # broadcast, all_gather (list and tensor), reduce_scatter (list and tensor)
        t = xs[rank].to(dev)
        dist.broadcast(t, src=world - 1)
        same(t, xs[world - 1], f"broadcast {dt}")
        outs = [torch.empty(n, dtype=dt, device=dev) for _ in range(world)]
        dist.all_gather(outs, xs[rank].to(dev))
        for r in range(world):
            same(outs[r], xs[r], f"all_gather {dt}")
        flat = torch.empty(world * n, dtype=dt, device=dev)
        dist.all_gather_into_tensor(flat, xs[rank].to(dev))
        same(flat, torch.cat(xs), f"all_gather_into_tensor {dt}")
        if dt != torch.bool:
            big = [value(r, (world * 10,), dt, seed=3) for r in range(world)]
            o = torch.empty(10, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(o, big[rank].to(dev))
            same(o, reduce_ref([b[rank * 10:(rank + 1) * 10] for b in big], dist.ReduceOp.SUM),
                 f"reduce_scatter_tensor {dt}")
            o2 = torch.empty(10, dtype=dt, device=dev)
            dist.reduce_scatter(o2, [c.to(dev) for c in big[rank].chunk(world)])
            same(o2, o.cpu(), f"reduce_scatter {dt}")
    # AVG, PREMUL_SUM (float), integer AVG
    t = torch.full((5,), float(rank + 1), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, torch.full((5,), (world + 1) / 2), "all_reduce AVG")
    t = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    same(t, torch.full((3,), 0.5 * world * (world + 1) / 2), "all_reduce PREMUL_SUM")
    # reduce to a root: others keep their input
    t = torch.full((4,), float(rank), device=dev)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    same(t, torch.full((4,), float(world - 1 if rank == 0 else rank)), "reduce")
    # gather / scatter
    g = [torch.empty(3, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((3,), float(rank), device=dev), g, dst=0)
    if rank == 0:
        for r in range(world):
            same(g[r], torch.full((3,), float(r)), "gather")
    s = torch.empty(2, dtype=torch.int64, device=dev)
    src = ([torch.full((2,), r * 7, dtype=torch.int64, device=dev) for r in range(world)]
           if rank == 1 % world else None)
    dist.scatter(s, src, src=1 % world)
    same(s, torch.full((2,), rank * 7, dtype=torch.int64), "scatter")
    # all_to_all_single with uneven splits: rank i sends i + j + 1 rows to rank j
    ins = [i + rank + 1 for i in range(world)]
    outs_n = [rank + i + 1 for i in range(world)]
    x = torch.cat([torch.full((k, 2), rank * 100 + j, dtype=torch.float32)
                   for j, k in enumerate(ins)])
    y = torch.empty(sum(outs_n), 2, device=dev)
    dist.all_to_all_single(y, x.to(dev), outs_n, ins)
    want = torch.cat([torch.full((k, 2), i * 100 + rank, dtype=torch.float32)
                      for i, k in enumerate(outs_n)])
    same(y, want, "all_to_all_single uneven")
    # all_to_all (lists)
    outl = [torch.empty(2, device=dev) for _ in range(world)]
    dist.all_to_all(outl, [torch.full((2,), float(rank * 10 + j), device=dev)
                           for j in range(world)])
    for i in range(world):
        same(outl[i], torch.full((2,), float(i * 10 + rank)), "all_to_all")
    # coalesced all_gather / reduce_scatter through the coalescing manager
    a = [torch.full((4,), float(rank + k), device=dev) for k in range(3)]
    outs = [torch.empty(4 * world, device=dev) for _ in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, a):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k in range(3):
        same(outs[k], torch.cat([torch.full((4,), float(r + k)) for r in range(world)]),
             "coalesced all_gather")
    # async: the collective overlaps with work queued after it; wait() orders it
    big = torch.ones(1 << 20, device=dev) * (rank + 1)
    work = dist.all_reduce(big, async_op=True)
    other = (torch.ones(256, 256, device=dev) @ torch.ones(256, 256, device=dev)).sum()
    work.wait()
    assert work.is_completed() and work.is_success()
    same(big[:4], torch.full((4,), float(world * (world + 1) / 2)), "async all_reduce")
    assert other.item() == 256 ** 3
    # the future from the work is usable (DDP's comm hooks chain on it)
    t = torch.ones(3, device=dev)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.wait()
    same(res[0], torch.full((3,), float(world)), "future")
    # 0-element tensors and a large tensor through several slot rounds
    e = torch.empty(0, device=dev)
    dist.all_reduce(e)
    z = torch.arange(3_000_000, dtype=torch.float32, device=dev) * (rank + 1)
    dist.all_reduce(z)
    same(z[-3:], torch.arange(2_999_997, 3_000_000, dtype=torch.float32) * (world * (world + 1) / 2),
         "large all_reduce")
    # point-to-point: a ring through batch_isend_irecv (larger than a channel's buffer, so
    # sends wait for receives on the other ranks), then plain send/recv pairs
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dt in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        src = value(rank, (300_000,), dt, seed=9).to(dev)
        got = torch.empty(300_000, dtype=dt, device=dev)
        ops = [dist.P2POp(dist.isend, src, nxt), dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same(got, value(prv, (300_000,), dt, seed=9), f"batch_isend_irecv {dt}")
    if rank == 0:
        for r in range(1, world):
            dist.send(torch.full((5,), float(r), device=dev), dst=r)
        back = torch.empty(world - 1, device=dev)
        for r in range(1, world):
            dist.recv(back[r - 1:r], src=r)
        same(back, torch.arange(1, world, dtype=torch.float32) * 10, "send/recv")
    else:
        x = torch.empty(5, device=dev)
        dist.recv(x, src=0)
        same(x, torch.full((5,), float(rank)), "recv")
        dist.send(x[:1] * 10, dst=0)
    dist.barrier()
    import torch_tpu.distributed as td

    return {"stats": td.stats()}


def scenario_errors(rank, world, out):
    dev = torch.device("tpu", 0)
    # a cpu tensor: a clear error before anything is queued (c10d's own, as with nccl:
    # the group has no backend for device cpu)
    try:
        dist.all_reduce(torch.ones(3))
        raise AssertionError("a cpu tensor was accepted")
    except RuntimeError as e:
        assert "cpu" in str(e), str(e)
    # sizes that differ between ranks: every rank raises, naming the collective and both
    try:
        dist.all_reduce(torch.ones(3 if rank == 0 else 5, device=dev))
        raise AssertionError("a size mismatch was accepted")
    except dist.DistBackendError as e:
        msg = str(e)
        assert "all_reduce" in msg and "disagree" in msg and "3" in msg and "5" in msg, msg
    # dtypes that differ
    try:
        dist.broadcast(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.int32,
                                  device=dev), src=0)
        raise AssertionError("a dtype mismatch was accepted")
    except dist.DistBackendError as e:
        assert "broadcast" in str(e) and "int32" in str(e), str(e)
    # bitwise on floats
    try:
        dist.all_reduce(torch.ones(3, device=dev), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND on float32 was accepted")
    except dist.DistBackendError as e:
        assert "BAND" in str(e), str(e)
    # a receive from any source (unsupported, as with nccl): a clear error, nothing queued
    try:
        dist.recv(torch.empty(2, device=dev))
        raise AssertionError("a receive from any source was accepted")
    except (NotImplementedError, RuntimeError) as e:
        assert "any source" in str(e), str(e)
    # the group still works, and the device too
    t = torch.ones(2, device=dev)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(world)), "after errors")
    # the last rank dies: the others raise within the timeout, naming it
    dist.barrier()
    if rank == world - 1:
        os._exit(0)
    start = time.time()
    try:
        dist.all_reduce(torch.ones(2, device=dev))
        raise AssertionError("a dead rank went unnoticed")
    except dist.DistBackendError as e:
        assert "exited" in str(e) and str(world - 1) in str(e), str(e)
    took = time.time() - start
    assert took < 20, took
    return {"death_noticed_s": took}


class Net(torch.nn.Module):
    """A small MLP; `unused` is a branch that forward leaves out (find_unused_parameters)."""

    def __init__(self, seed=0, unused=False):
        super().__init__()
        torch.manual_seed(seed)
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)
        if unused:
            self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def data(step, batch):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g)


def train_single(steps, batch, accum=1, compile=False, unused=False):
    """The reference: one process, the global batch, on tpu."""
    dev = torch.device("tpu", 0)
    model = Net(unused=unused).to(dev)
    fwd = torch.compile(model, backend="tpu") if compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        tot = 0.0
        for k in range(accum):
            x, y = data(step * accum + k, batch)
            loss = torch.nn.functional.mse_loss(fwd(x.to(dev)), y.to(dev)) / accum
            loss.backward()
            tot += loss.item()
        opt.step()
        losses.append(tot)
    return losses, [p.detach().cpu() for p in model.parameters()]


def scenario_ddp(rank, world, out):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_float32_matmul_precision("highest")
    dev = torch.device("tpu", 0)
    steps, batch = 4, 8 * world
    lo, hi = rank * batch // world, (rank + 1) * batch // world
    figures = {}
    variants = {
        "plain": dict(bucket_cap_mb=0.004),  # several buckets
        "find_unused": dict(find_unused_parameters=True),
        "static_graph": dict(static_graph=True),
        "no_sync": dict(),
        "compile": dict(),
    }
    for name, kw in variants.items():
        accum = 2 if name == "no_sync" else 1
        unused = name == "find_unused"
        ref_losses, ref_params = train_single(steps, batch, accum, compile=name == "compile",
                                              unused=unused)
        model = Net(unused=unused).to(dev)
        ddp = DDP(model, **kw)
        fwd = torch.compile(ddp, backend="tpu") if name == "compile" else ddp
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for step in range(steps):
            opt.zero_grad()
            tot = torch.zeros((), device=dev)
            for k in range(accum):
                x, y = data(step * accum + k, batch)
                ctx = ddp.no_sync() if (name == "no_sync" and k < accum - 1) else _nullctx()
                with ctx:
                    loss = torch.nn.functional.mse_loss(fwd(x[lo:hi].to(dev)), y[lo:hi].to(dev))
                    (loss / accum).backward()
                tot = tot + loss.detach() / accum
            opt.step()
            dist.all_reduce(tot, op=dist.ReduceOp.AVG)
            losses.append(tot.item())
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (name, losses, ref_losses)
        worst = 0.0
        for p, q in zip(model.parameters(), ref_params):
            worst = max(worst, (p.detach().cpu() - q).abs().max().item())
        assert worst <= 1e-5, (name, worst)
        figures[name] = {"losses": losses, "max_param_diff": worst}
    import torch_tpu.distributed as td

    figures["stats"] = td.stats()
    return figures


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def gpt_setup():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import train_gpt

    data, chars = train_gpt.load_text()
    args = type("A", (), dict(block_size=16, n_layer=2, n_embd=32, n_head=2, dropout=0.0))
    return train_gpt, data, len(chars), args


def gpt_batches(train_gpt, data, args, steps, batch):
    it = train_gpt.batches(data, args.block_size, batch, seed=7)
    return [next(it) for _ in range(steps)]


def gpt_train(model, batches, lo, hi, dev, steps, reduce_loss=True, foreach=None):
    # SGD: AdamW divides by sqrt(v), which turns a 1-ulp difference of a near-zero gradient
    # (another summation order) into a step-sized one
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=foreach)
    losses = []
    for x, y in batches[:steps]:
        _, loss = model(x[lo:hi].to(dev), y[lo:hi].to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        d = loss.detach().float()
        if reduce_loss and dist.is_initialized():
            dist.all_reduce(d, op=dist.ReduceOp.AVG)
        losses.append(d.item())
    return losses, opt


def full_params(model):
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = v.detach().float().cpu()
    return out


def compare(name, losses, ref_losses, params, ref_params, tol=1e-5):
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= tol * max(1.0, abs(b)), (name, losses, ref_losses)
    worst = max((params[k] - ref_params[k]).abs().max().item() for k in ref_params)
    assert worst <= tol, (name, worst)
    return {"losses": losses, "ref_losses": ref_losses, "max_param_diff": worst}


def scenario_fsdp(rank, world, out):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.set_float32_matmul_precision("highest")
    dev = torch.device("tpu", 0)
    train_gpt, data, vocab, args = gpt_setup()
    steps, batch = 3, 4 * world
    lo, hi = rank * batch // world, (rank + 1) * batch // world
    bs = gpt_batches(train_gpt, data, args, steps, batch)
    ref = train_gpt.make_model(vocab, args, seed=1).to(dev)
    ref_losses, _ = gpt_train(ref, bs, 0, batch, dev, steps, reduce_loss=False)
    ref_params = full_params(ref)
    figures = {}
    for name, kw, tol in [("reshard", dict(reshard_after_forward=True), 1e-5),
                          ("no_reshard", dict(reshard_after_forward=False), 1e-5),
                          ("bf16_params_fp32_reduce",
                           dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                               reduce_dtype=torch.float32)),
                           5e-2)]:
        model = train_gpt.make_model(vocab, args, seed=1).to(dev)
        for blk in model.blocks:
            fully_shard(blk, **kw)
        fully_shard(model, **kw)
        shard = next(iter(model.parameters()))
        assert shard.to_local().numel() * world >= shard.numel()
        losses, _ = gpt_train(model, bs, lo, hi, dev, steps)
        figures[name] = compare(name, losses, ref_losses, full_params(model), ref_params, tol)
    return figures


def scenario_hier(rank, world, out):
    """Ranks on several hosts: all_gather_into_tensor and reduce_scatter_tensor (and their
    coalesced forms) against values computed here, over the hierarchical path only (no call
    on the Gloo group of all ranks), then FSDP2 on the GPT against one process."""
    import torch_tpu.distributed as td

    gathers = scenario_hier_gathers(rank, world, out)
    figures = scenario_fsdp(rank, world, out)
    figures["stats"] = td.stats()
    figures["stats_gathers"] = gathers["stats_gathers"]
    return figures


def scenario_hier_gathers(rank, world, out):
    """The gathers and reductions of scenario_hier alone."""
    import torch_tpu.distributed as td

    dev = torch.device("tpu", 0)
    before = td.stats()
    for dt in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        for n in (10, 300_000 if dt == torch.float32 else 1000):
            xs = [value(r, (n,), dt, seed=n) for r in range(world)]
            flat = torch.empty(world * n, dtype=dt, device=dev)
            dist.all_gather_into_tensor(flat, xs[rank].to(dev))
            same(flat, torch.cat(xs), f"all_gather_into_tensor {dt} {n}")
            if dt == torch.bool:
                continue
            big = [value(r, (world * n,), dt, seed=n + 1) for r in range(world)]
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX]
            if dt.is_floating_point:
                ops += [dist.ReduceOp.AVG]
            for op in ops:
                inp = big[rank].to(dev)
                o = torch.empty(n, dtype=dt, device=dev)
                dist.reduce_scatter_tensor(o, inp, op=op)
                pieces = [b[rank * n:(rank + 1) * n] for b in big]
                if op == dist.ReduceOp.AVG:
                    want = (reduce_ref([x.double() for x in pieces], dist.ReduceOp.SUM) / world)
                    want = want.to(dt)
                else:
                    want = reduce_ref(pieces, op)
                same(o, want, f"reduce_scatter_tensor {op} {dt} {n}")
                same(inp, big[rank], f"reduce_scatter_tensor's input {dt} {n}")
    t = torch.full((world * 3,), float(rank + 1), device=dev)
    o = torch.empty(3, device=dev)
    dist.reduce_scatter_tensor(o, t, op=dist._make_nccl_premul_sum(0.5))
    same(o, torch.full((3,), 0.5 * world * (world + 1) / 2), "reduce_scatter_tensor PREMUL_SUM")
    # coalesced forms (as FSDP2 issues them)
    a = [torch.full((4 + k,), float(rank + k), device=dev) for k in range(3)]
    outs = [torch.empty((4 + k) * world, device=dev) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, a):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k in range(3):
        same(outs[k], torch.cat([torch.full((4 + k,), float(r + k)) for r in range(world)]),
             "coalesced all_gather_into_tensor")
    ins = [torch.full(((2 + k) * world,), float(rank + k), device=dev) for k in range(3)]
    outs = [torch.empty(2 + k, device=dev) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k in range(3):
        same(outs[k], torch.full((2 + k,), float(sum(r + k for r in range(world)))),
             "coalesced reduce_scatter_tensor")
    after = td.stats()
    assert after["gloo_calls"] == before["gloo_calls"], (before, after)
    return {"stats_gathers": {k: after[k] - before[k] for k in after}}


def scenario_tp(rank, world, out):
    """Tensor parallelism on the GPT's MLPs and head (1-D mesh of 2, or dp x tp on 4 ranks
    with FSDP2 over dp), and sequence parallelism on a LayerNorm/MLP stack."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    torch.set_float32_matmul_precision("highest")
    dev = torch.device("tpu", 0)
    train_gpt, data, vocab, args = gpt_setup()
    tp = 2
    dp = world // tp
    if dp > 1:
        mesh = init_device_mesh("tpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    else:
        tp_mesh, dp_mesh = init_device_mesh("tpu", (tp,), mesh_dim_names=("tp",)), None
    dp_rank = rank // tp
    steps, batch = 3, 4 * dp
    lo, hi = dp_rank * batch // dp, (dp_rank + 1) * batch // dp
    bs = gpt_batches(train_gpt, data, args, steps, batch)
    ref = train_gpt.make_model(vocab, args, seed=1).to(dev)
    ref_losses, _ = gpt_train(ref, bs, 0, batch, dev, steps, reduce_loss=False)
    model = train_gpt.make_model(vocab, args, seed=1).to(dev)
    plan = {"head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(args.n_layer):
        plan[f"blocks.{i}.fc"] = ColwiseParallel()
        plan[f"blocks.{i}.fc_out"] = RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)
    w = model.blocks[0].fc.weight
    assert w.to_local().shape[0] * tp == w.shape[0], (w.to_local().shape, w.shape)
    if dp_mesh is not None:
        for blk in model.blocks:
            fully_shard(blk, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    # DTensor and plain parameters side by side: not in one foreach call
    losses, _ = gpt_train(model, bs, lo, hi, dev, steps, foreach=False if dp == 1 else None)
    figures = {"tp" if dp == 1 else "dp_x_tp": compare("tp", losses, ref_losses,
                                                        full_params(model), full_params(ref))}
    # sequence parallel: LayerNorm on sequence shards, then colwise / rowwise back to shards
    torch.manual_seed(3)
    stack = torch.nn.ModuleDict({"ln": torch.nn.LayerNorm(8), "fc1": torch.nn.Linear(8, 16),
                                 "fc2": torch.nn.Linear(16, 8)}).to(dev)
    torch.manual_seed(3)
    ref_stack = torch.nn.ModuleDict({"ln": torch.nn.LayerNorm(8), "fc1": torch.nn.Linear(8, 16),
                                     "fc2": torch.nn.Linear(16, 8)}).to(dev)
    parallelize_module(stack, tp_mesh, {
        "ln": SequenceParallel(),
        "fc1": ColwiseParallel(input_layouts=Shard(1)),
        "fc2": RowwiseParallel(output_layouts=Shard(1)),
    })
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(5))
    t = rank % tp
    xl = x[:, t * 3:(t + 1) * 3].to(dev).requires_grad_()
    y = stack["fc2"](torch.relu(stack["fc1"](stack["ln"](xl))))
    xr = x.to(dev).requires_grad_()
    yr = ref_stack["fc2"](torch.relu(ref_stack["fc1"](ref_stack["ln"](xr))))
    same(y, yr[:, t * 3:(t + 1) * 3].detach().cpu(), "sequence parallel forward")
    (y.square().sum()).backward()
    (yr.square().sum()).backward()
    g = stack["fc1"].weight.grad.full_tensor()
    assert (g.cpu() - ref_stack["fc1"].weight.grad.cpu()).abs().max().item() <= 1e-5
    same(xl.grad, xr.grad[:, t * 3:(t + 1) * 3].cpu(), "sequence parallel input grad")
    return figures


def _dcp_model(sharded):
    from torch.distributed.fsdp import fully_shard

    dev = torch.device("tpu", 0)
    train_gpt, data, vocab, args = gpt_setup()
    model = train_gpt.make_model(vocab, args, seed=1).to(dev)
    if sharded:
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    bs = gpt_batches(train_gpt, data, args, 2, 4)
    return model, bs, dev


def _full_state(model, opt):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    flat = {f"model.{k}": v.float().cpu() for k, v in m.items()}
    for pid, st in o.get("state", {}).items():  # full state: rank 0 only
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                flat[f"optim.{pid}.{k}"] = v.float().cpu()
    return flat


def scenario_dcp(rank, world, out):
    """torch.distributed.checkpoint: SAVE (train 2 steps, save sharded when world > 1, and
    the full state for comparison) or LOAD (into world ranks, sharded when world > 1), by
    TPU_DIST_DCP=save|load and the folder TPU_DIST_CKPT."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    torch.set_float32_matmul_precision("highest")
    action, ckpt = os.environ["TPU_DIST_DCP"], os.environ["TPU_DIST_CKPT"]
    model, bs, dev = _dcp_model(sharded=world > 1)
    lo, hi = rank * 4 // world, (rank + 1) * 4 // world
    if action == "save":
        _, opt = gpt_train(model, bs, lo, hi, dev, 2)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        full = _full_state(model, opt)
        if rank == 0:
            torch.save(full, os.path.join(ckpt, "full_reference.pt"))
        return {"saved": len(full)}
    # load: an optimizer whose state exists (one step at lr 0), then the checkpoint over it
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _, loss = model(bs[0][0][lo:hi].to(dev), bs[0][1][lo:hi].to(dev))
    loss.backward()
    opt.step()
    opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = _full_state(model, opt)
    if rank != 0:
        return {}
    want = torch.load(os.path.join(ckpt, "full_reference.pt"))
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst == 0.0, worst
    return {"loaded": len(got), "max_diff": worst}


def scenario_init_styles(rank, world, out):
    """The ways a script picks the backend: by name (and alias), from the device, and per
    device type beside Gloo; each group all_reduces a tpu tensor (and, beside Gloo, a cpu one)."""
    figures = {}
    # one store for the four groups (a group per prefix): re-creating torchrun's store on the
    # same port races with the previous group's shutdown
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         rank == 0, timeout=timedelta(seconds=60))
    for k, style in enumerate(("tpu_dist", "tpu", "device_id", "cpu:gloo,tpu:tpu_dist")):
        kw = dict(store=dist.PrefixStore(f"style{k}", base), rank=rank, world_size=world)
        if style == "device_id":
            dist.init_process_group(device_id=torch.device("tpu", 0), **kw)
        else:
            dist.init_process_group(style, **kw)
        figures[style] = str(dist.get_backend())
        t = torch.ones(3, device="tpu")
        dist.all_reduce(t)
        same(t, torch.full((3,), float(world)), f"all_reduce after init {style}")
        if style.startswith("cpu:"):
            c = torch.ones(3)
            dist.all_reduce(c)
            same(c, torch.full((3,), float(world)), "gloo all_reduce beside tpu_dist")
        dist.barrier()
        dist.destroy_process_group()
    return figures


def main():
    scenario, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch_tpu.set_eager_mode(mode)
    timeout = float(os.environ.get("TPU_DIST_TEST_TIMEOUT", "60"))
    if scenario == "init_styles":
        figures = scenario_init_styles(rank, world, out)
        figures["ok"] = True
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(figures, f)
        sys.stdout.flush()
        os._exit(0)
    dist.init_process_group("tpu_dist", timeout=timedelta(seconds=timeout))
    figures = globals()["scenario_" + scenario](rank, world, out) or {}
    figures["ok"] = True
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(figures, f)
    if scenario != "errors":
        dist.destroy_process_group()
    # Known: a rank leaving while its peer still works has, about 1 run in 10 under load,
    # aborted in the interpreter's exit ("terminate called without an active exception",
    # seen after the dcp load scenario); the results are written by then. Leave without the
    # exit-time destructors until that is understood (docs/design.md, tpu_dist).
    if os.environ.get("TPU_DIST_TEST_NORMAL_EXIT"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
