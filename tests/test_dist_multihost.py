"""Two "hosts" on this machine: two network namespaces joined by a veth pair (addresses
10.213.x.1/2 on that pair only), 2 processes in each, started by `torchrun --nnodes 2` inside
each namespace. DDP on the example-style model gives one process's losses, and the
hierarchical path ran: every rank counts hierarchical all_reduces (shared memory within the
host, Gloo between the hosts' leaders) and no all_reduce over shared memory alone.
all_gather_into_tensor and reduce_scatter_tensor (and coalesced) give the expected values with
every rank counting hierarchical ones and no call on the Gloo group of all ranks, and FSDP2 on
the GPT gives one process's losses. Needs root (ip netns); skipped otherwise. Also:
`python -m tests.test_dist_multihost [ddp|hier]` runs one alone."""
import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.dist import launch

ROOT = launch.ROOT


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def make_hosts(tag):
    """Creates namespaces tpuA<tag>, tpuB<tag> joined by a veth pair; returns their names and
    addresses."""
    a, b = f"tpuA{tag}", f"tpuB{tag}"
    net = 10 + (os.getpid() % 200)
    ips = (f"10.213.{net}.1", f"10.213.{net}.2")
    _ip("netns", "add", a)
    _ip("netns", "add", b)
    _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
    _ip("link", "set", f"va{tag}", "netns", a)
    _ip("link", "set", f"vb{tag}", "netns", b)
    for ns, dev, ip in ((a, f"va{tag}", ips[0]), (b, f"vb{tag}", ips[1])):
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    return (a, b), (f"va{tag}", f"vb{tag}"), ips


def drop_hosts(names):
    for ns in names:
        _ip("netns", "del", ns, check=False)


_runs = itertools.count()


def run_two_hosts(out_dir, scenario="ddp", timeout=300):
    # each run its own namespaces, link names and port: a run right after another must not
    # meet the previous one's leftovers (a store port in TIME_WAIT, a namespace being removed)
    run = next(_runs)
    tag = f"{os.getpid() % 10000}x{run}"
    names, devs, ips = make_hosts(tag)
    try:
        port = 29000 + (os.getpid() * 7 + run * 101) % 3000
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        procs = []
        for node in range(2):
            # a generous group timeout: under a loaded CI machine one rank's torch.compile can
            # keep the others waiting in a collective for a long time
            env = dict(os.environ, TORCH_TPU_DIST_HOST_ID=f"host{node}",
                       GLOO_SOCKET_IFNAME=devs[node], OMP_NUM_THREADS="1",
                       PYTHONPATH=ROOT, TPU_DIST_TEST_TIMEOUT="300", **launch.WORKER_ENV)
            cmd = ["ip", "netns", "exec", names[node], torchrun, "--nnodes", "2",
                   "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr", ips[0],
                   "--master-port", str(port), "-m", "tests.dist.worker", scenario, "strict",
                   out_dir]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                outs.append(p.communicate()[0] + "\n[killed: timeout]")
        return [p.returncode for p in procs], outs
    finally:
        drop_hosts(names)


def explain(out):
    """A failed node's output: its error lines first (the first rank to fail is the cause;
    the others report its exit), then its end."""
    errors = [ln for ln in out.splitlines() if "Error" in ln or "error:" in ln][:40]
    return "\n".join(errors) + "\n...\n" + out[-4000:]


def can_make_namespaces():
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"tpuprobe{os.getpid()}"
    ok = _ip("netns", "add", probe, check=False).returncode == 0
    _ip("netns", "del", probe, check=False)
    return ok


@pytest.mark.skipif(not can_make_namespaces(), reason="needs root and ip netns")
def test_ddp_on_two_hosts_is_hierarchical_and_matches_one_process(tmp_path):
    rcs, outs = run_two_hosts(str(tmp_path))
    assert rcs == [0, 0], "\n".join(explain(o) for o in outs)
    for r in range(4):
        res = json.load(open(tmp_path / f"rank{r}.json"))
        assert res["ok"]
        for name, fig in res.items():
            if name not in ("ok", "stats"):
                assert fig["max_param_diff"] <= 1e-5, (r, name, fig)
        st = res["stats"]
        assert st["hierarchical_all_reduces"] > 0 and st["shm_collectives"] == 0, st


@pytest.mark.skipif(not can_make_namespaces(), reason="needs root and ip netns")
def test_gathers_and_fsdp_on_two_hosts_are_hierarchical(tmp_path):
    rcs, outs = run_two_hosts(str(tmp_path), "hier")
    assert rcs == [0, 0], "\n".join(explain(o) for o in outs)
    for r in range(4):
        res = json.load(open(tmp_path / f"rank{r}.json"))
        assert res["ok"]
        for name, fig in res.items():
            if name not in ("ok", "stats", "stats_gathers"):
                tol = 5e-2 if "bf16" in name else 1e-5
                assert fig["max_param_diff"] <= tol, (r, name, fig)
        st = res["stats_gathers"]
        # the gathers and reductions only: each went through the leaders, none through the
        # Gloo group of all ranks (the worker asserts gloo_calls did not move)
        assert st["hierarchical_all_gathers"] >= 13 and st["hierarchical_reduce_scatters"] >= 24, st
        assert st["gloo_calls"] == 0 and st["shm_collectives"] == 0, st
        assert res["stats"]["hierarchical_all_gathers"] > st["hierarchical_all_gathers"], res


if __name__ == "__main__":
    import tempfile

    d = tempfile.mkdtemp()
    rcs, outs = run_two_hosts(d, sys.argv[1] if len(sys.argv) > 1 else "ddp")
    print("\n".join(o[-2000:] for o in outs))
    for r in range(4):
        p = os.path.join(d, f"rank{r}.json")
        print(r, json.load(open(p))["stats"] if os.path.exists(p) else None)
    sys.exit(0 if rcs == [0, 0] else 1)
