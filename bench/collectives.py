"""tpu_dist collectives against torch's Gloo on CPU tensors, same run, 2 processes on this host.

    .venv/bin/python bench/collectives.py [--world 2] [--max-mib 256] [--dtypes float32,bfloat16]
                                          [--repeat 3]

One process group "cpu:gloo,tpu:tpu_dist" per rank: the same call goes to Gloo for a cpu
tensor and to tpu_dist for a tpu tensor. For each size (4 KiB .. --max-mib: per rank's input
for all_reduce, the larger buffer for all_gather_into_tensor and reduce_scatter_tensor, as
nccl-tests count it), Gloo and tpu_dist are timed one after the other (so both see the same
load on a shared machine): ranks lined up, calls back to back, the best of 3 tries, the
slowest rank's time. Bus bandwidth is nccl-tests' (all_reduce algbw x 2(n-1)/n, the others
algbw x (n-1)/n). The whole sweep runs --repeat times; every figure printed is the median of
the sweeps. This machine's single-thread memcpy bandwidth (64 MiB, torch copy_ on one thread)
is measured in every sweep right after the 64 MiB all_reduces.

Goals (issue 16), each with a PASS/FAIL line at the end:
  - all_reduce, all_gather_into_tensor, reduce_scatter_tensor: bus bandwidth >= 3x Gloo's at
    every size >= 1 MiB, for every dtype;
  - all_reduce at 64 MiB: bus bandwidth >= 50% of the single-thread memcpy bandwidth;
  - 4 KiB all_reduce latency printed beside Gloo's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COLLS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
MEMCPY_BYTES = 64 << 20


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

    def timed(fn, sync, nbytes, dev):
        """Seconds per call: ranks lined up by an all_reduce, then `reps` calls back to back
        (as nccl-tests time them), the best of 3 tries; the slowest rank's time."""
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

    def memcpy_bw():
        """Rank 0's single-thread copy of 64 MiB (the best of 10), the others waiting."""
        bw = torch.zeros(1, dtype=torch.float64)
        if rank == 0:
            a = torch.ones(MEMCPY_BYTES // 4)
            b2 = torch.empty_like(a)
            b2.copy_(a)
            ts = []
            for _ in range(10):
                t0 = time.perf_counter()
                b2.copy_(a)
                ts.append(time.perf_counter() - t0)
            bw[0] = MEMCPY_BYTES / min(ts)
        dist.all_reduce(bw)  # gloo: also lines the ranks up again
        return bw.item()

    sweeps = []
    for sweep in range(args.repeat):
        rows, memcpy = [], []
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            es = torch.empty((), dtype=dtype).element_size()
            for nbytes in sizes:
                n = nbytes // es
                for coll in COLLS:
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
                        fn = x = shard = out = inp = None
                        factor = 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world
                        res[dev] = {"s": t, "busbw": nbytes / t * factor}
                    rows.append({"coll": coll, "dtype": str(dtype).split(".")[1], "bytes": nbytes,
                                 "gloo": res["cpu"], "tpu_dist": res["tpu"]})
                if nbytes == MEMCPY_BYTES:
                    memcpy.append(memcpy_bw())
        if not memcpy:
            memcpy.append(memcpy_bw())
        sweeps.append({"rows": rows, "memcpy": statistics.median(memcpy),
                       "load": os.getloadavg()[0]})
    dist.barrier()
    dist.destroy_process_group()
    return sweeps


def fmt_bytes(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def summarize(sweeps, world):
    """Medians over the sweeps of every figure; the table and the goal lines."""
    med = statistics.median
    rows = []
    for k, r in enumerate(sweeps[0]["rows"]):
        all_k = [s["rows"][k] for s in sweeps]
        g = med(x["gloo"]["busbw"] for x in all_k)
        t = med(x["tpu_dist"]["busbw"] for x in all_k)
        rows.append({**r, "gloo_busbw": g, "tpu_busbw": t,
                     "ratio": med(x["tpu_dist"]["busbw"] / x["gloo"]["busbw"] for x in all_k),
                     "gloo_s": med(x["gloo"]["s"] for x in all_k),
                     "tpu_s": med(x["tpu_dist"]["s"] for x in all_k)})
    memcpy = med(s["memcpy"] for s in sweeps)
    loads = ", ".join(f"{s['load']:.2f}" for s in sweeps)
    lines = [f"{world} processes on this host; {len(sweeps)} sweeps (load average after each: "
             f"{loads}); medians over the sweeps; bus bandwidth in GB/s (nccl-tests' definition),"
             f" time of the slowest rank", ""]
    lines.append(f"{'collective':24} {'dtype':9} {'size':>8} {'gloo us':>10} {'tpu_dist us':>12} "
                 f"{'gloo GB/s':>10} {'tpu_dist GB/s':>14} {'ratio':>8}")
    for r in rows:
        mark = "" if r["bytes"] < 1 << 20 or r["ratio"] >= 3 else "  < 3x"
        lines.append(f"{r['coll']:24} {r['dtype']:9} {fmt_bytes(r['bytes']):>8} "
                     f"{r['gloo_s'] * 1e6:10.0f} {r['tpu_s'] * 1e6:12.0f} "
                     f"{r['gloo_busbw'] / 1e9:10.2f} {r['tpu_busbw'] / 1e9:14.2f} "
                     f"{r['ratio']:7.2f}x{mark}")
    lines += ["", f"single-thread memcpy (64 MiB, torch copy_ on one thread): {memcpy / 1e9:.2f} GB/s",
              ""]
    dtypes = sorted({r["dtype"] for r in rows}, key=[r["dtype"] for r in rows].index)
    for coll in COLLS:
        big = [r for r in rows if r["coll"] == coll and r["bytes"] >= 1 << 20]
        if not big:
            continue
        worst = min(big, key=lambda r: r["ratio"])
        ok = worst["ratio"] >= 3
        lines.append(f"{'PASS' if ok else 'FAIL'}  {coll}: bus bandwidth >= 3x Gloo at every size "
                     f">= 1 MiB ({', '.join(dtypes)}): lowest {worst['ratio']:.2f}x "
                     f"({worst['dtype']}, {fmt_bytes(worst['bytes'])}), median "
                     f"{statistics.median(r['ratio'] for r in big):.2f}x")
    ar64 = [r for r in rows if r["coll"] == "all_reduce" and r["bytes"] == 64 << 20]
    if ar64:
        ok = all(r["tpu_busbw"] >= 0.5 * memcpy for r in ar64)
        figs = ", ".join(f"{r['dtype']} {r['tpu_busbw'] / 1e9:.2f} GB/s = "
                         f"{100 * r['tpu_busbw'] / memcpy:.0f}%" for r in ar64)
        lines.append(f"{'PASS' if ok else 'FAIL'}  all_reduce 64 MiB >= 50% of single-thread memcpy"
                     f" ({memcpy / 1e9:.2f} GB/s): {figs}")
    for r in rows:
        if r["coll"] == "all_reduce" and r["bytes"] == 4096:
            lines.append(f"INFO  all_reduce 4 KiB latency ({r['dtype']}): tpu_dist "
                         f"{r['tpu_s'] * 1e6:.0f} us, gloo {r['gloo_s'] * 1e6:.0f} us "
                         f"({r['gloo_s'] / r['tpu_s']:.0f}x less)")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeat", type=int, default=3, help="sweeps; figures are their medians")
    p.add_argument("--json", default=None, help="also write every sweep's raw figures here")
    p.add_argument("--_out", default=None)
    args = p.parse_args()
    if "RANK" in os.environ:
        sweeps = bench_rank(args)
        if int(os.environ["RANK"]) == 0:
            with open(args._out, "w") as f:
                json.dump(sweeps, f)
        return
    import socket
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    procs = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--max-mib",
                                       str(args.max_mib), "--dtypes", args.dtypes, "--repeat",
                                       str(args.repeat), "--_out", out], env=env))
    rc = [p.wait() for p in procs]
    if any(rc):
        raise SystemExit(f"ranks failed: {rc}")
    with open(out) as f:
        sweeps = json.load(f)
    os.unlink(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sweeps, f)
    print(summarize(sweeps, args.world))


if __name__ == "__main__":
    main()
