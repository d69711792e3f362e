"""Starts the ranks of a tpu_dist test as separate processes, as torchrun would (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT of a TCPStore that rank 0 serves), and waits for
them within a time limit; on timeout every rank is killed, so a hang fails the test."""
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Every rank compiles fused kernels before it runs them: with background compiles a graph runs
# unfused until its kernel is ready, so the reference and the distributed run of one process
# could take different kernels (and round differently) depending on the machine's load.
WORKER_ENV = {"TORCH_TPU_ASYNC_COMPILE": "0"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(module, args, world, out_dir, timeout=180, env=None, rank_env=None):
    """Runs `python -m module *args` in `world` ranks (`rank_env(r)`: variables of rank r
    alone). Returns (exit codes, outputs, per-rank JSON results or None)."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                  "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
        e.update(WORKER_ENV)
        e.update(env or {})
        e.update(rank_env(r) if rank_env else {})
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    deadline = time.time() + timeout
    outs = [None] * world
    for r, p in enumerate(procs):
        try:
            outs[r], _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs[r], _ = p.communicate()
            outs[r] = (outs[r] or "") + f"\n[rank {r} killed after {timeout} s]"
    for r, p in enumerate(procs):
        if outs[r] is None:
            outs[r], _ = p.communicate()
    results = []
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.json")
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    return [p.returncode for p in procs], outs, results
