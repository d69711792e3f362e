"""tpu_dist collectives against torch's Gloo on CPU tensors, same run, 2 processes on this host.

    .venv/bin/python bench/collectives.py [--world 2] [--max-mib 256] [--dtypes float32,bfloat16]

One process group "cpu:gloo,tpu:tpu_dist" per rank: the same call goes to Gloo for a cpu
tensor and to tpu_dist for a tpu tensor. For each size (4 KiB .. --max-mib, per rank's input
for all_reduce, per rank's shard for all_gather_into_tensor and reduce_scatter_tensor ... the
message size as nccl-tests count it: the larger buffer), the median time of several
iterations, the bus bandwidth (nccl-tests' definition: all_reduce algbw x 2(n-1)/n, the
others algbw x (n-1)/n), and the ratio tpu_dist / Gloo. Also: this machine's single-thread
memcpy bandwidth (64 MiB, torch's copy_ on one thread), all_reduce at 64 MiB as a fraction of
it, and the 4 KiB all_reduce latency of both.
Goals (issue 16): >= 3x Gloo's bus bandwidth at >= 1 MiB; all_reduce at 64 MiB >= 50% of the
single-thread memcpy bandwidth.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def bench_rank(args):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")
    sizes = []
    b = 4096
    while b <= args.max_mib << 20:
        sizes.append(b)
        b *= 4 if b < (1 << 20) else 2
    rows = []

    def timed(fn, sync, nbytes, dev):
        """Seconds per call: ranks lined up by a barrier, then `reps` calls back to back
        (as nccl-tests time them), the slowest rank's time."""
        fn()
        sync()
        reps = 50 if nbytes <= 1 << 20 else 10 if nbytes <= 16 << 20 else 4
        best = float("inf")
        for _ in range(3):
            line = torch.zeros(1, device=dev)
            dist.all_reduce(line)
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            best = min(best, (time.perf_counter() - t0) / reps)
        t = torch.tensor([best], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        es = torch.empty((), dtype=dtype).element_size()
        for nbytes in sizes:
            n = nbytes // es
            for coll in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
                res = {}
                for dev in ("cpu", "tpu"):
                    sync = (lambda: torch.tpu.synchronize()) if dev == "tpu" else (lambda: None)
                    if coll == "all_reduce":
                        x = torch.ones(n, dtype=dtype, device=dev)
                        fn = lambda x=x: dist.all_reduce(x)  # noqa: E731
                    elif coll == "all_gather_into_tensor":
                        shard = torch.ones(n // world, dtype=dtype, device=dev)
                        out = torch.empty(n // world * world, dtype=dtype, device=dev)
                        fn = lambda o=out, s=shard: dist.all_gather_into_tensor(o, s)  # noqa: E731
                    else:
                        inp = torch.ones(n // world * world, dtype=dtype, device=dev)
                        out = torch.empty(n // world, dtype=dtype, device=dev)
                        fn = lambda o=out, i=inp: dist.reduce_scatter_tensor(o, i)  # noqa: E731
                    t = timed(fn, sync, nbytes, dev)
                    alg = nbytes / t
                    factor = 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world
                    res[dev] = {"s": t, "busbw": alg * factor}
                rows.append({"coll": coll, "dtype": str(dtype).split(".")[1], "bytes": nbytes,
                             "gloo": res["cpu"], "tpu_dist": res["tpu"]})
    memcpy = None
    if rank == 0:
        a = torch.ones(64 << 18)  # 64 MiB
        b2 = torch.empty_like(a)
        b2.copy_(a)
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            b2.copy_(a)
            ts.append(time.perf_counter() - t0)
        memcpy = (64 << 20) / min(ts)
    dist.barrier()
    dist.destroy_process_group()
    return rows, memcpy


def fmt_bytes(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--_out", default=None)
    args = p.parse_args()
    if "RANK" in os.environ:
        rows, memcpy = bench_rank(args)
        if int(os.environ["RANK"]) == 0:
            with open(args._out, "w") as f:
                json.dump({"rows": rows, "memcpy": memcpy}, f)
        return
    import socket
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    procs = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--max-mib",
                                       str(args.max_mib), "--dtypes", args.dtypes, "--_out", out],
                                      env=env))
    rc = [p.wait() for p in procs]
    if any(rc):
        raise SystemExit(f"ranks failed: {rc}")
    data = json.load(open(out))
    os.unlink(out)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.world} processes on this host; "
          f"bus bandwidth in GB/s (nccl-tests' definition), time of the slowest rank")
    print(f"{'collective':24} {'dtype':9} {'size':>8} {'gloo GB/s':>10} {'tpu_dist GB/s':>14} "
          f"{'ratio':>7}")
    big = []
    for r in data["rows"]:
        g, t = r["gloo"]["busbw"], r["tpu_dist"]["busbw"]
        print(f"{r['coll']:24} {r['dtype']:9} {fmt_bytes(r['bytes']):>8} {g / 1e9:10.2f} "
              f"{t / 1e9:14.2f} {t / g:6.2f}x")
        if r["bytes"] >= 1 << 20:
            big.append(t / g)
    memcpy = data["memcpy"]
    print(f"\nsingle-thread memcpy (64 MiB, torch copy_ on one thread): {memcpy / 1e9:.2f} GB/s")
    for r in data["rows"]:
        if r["coll"] == "all_reduce" and r["bytes"] == 64 << 20:
            bw = r["tpu_dist"]["busbw"]
            print(f"all_reduce {r['dtype']} 64 MiB: {bw / 1e9:.2f} GB/s bus bandwidth = "
                  f"{100 * bw / memcpy:.0f}% of memcpy (goal >= 50%)")
        if r["coll"] == "all_reduce" and r["bytes"] == 4096:
            print(f"all_reduce {r['dtype']} 4 KiB latency: tpu_dist "
                  f"{r['tpu_dist']['s'] * 1e6:.0f} us, gloo {r['gloo']['s'] * 1e6:.0f} us")
    if big:
        print(f"tpu_dist / gloo at >= 1 MiB: min {min(big):.2f}x, median "
              f"{statistics.median(big):.2f}x (goal >= 3x)")


if __name__ == "__main__":
    main()
