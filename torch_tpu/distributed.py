"""tpu_dist: the torch.distributed backend of device tpu.

Registered at autoload under the names "tpu_dist" and "tpu", as the default
backend of device tpu, so that each of these picks it:

    dist.init_process_group("tpu_dist")
    dist.init_process_group(device_id=torch.device("tpu", local_rank))
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")

The backend itself is C++ (torch_tpu/csrc/dist.cpp) over the runtime's
transport (runtime/dist/): the processes of one host share memory. Rendezvous
and the exchange of the segment's name go through the process group's store
(torchrun's TCPStore). Ranks on several hosts: each host's ranks share memory,
and Gloo (torch's ProcessGroupGloo, on the store; GLOO_SOCKET_IFNAME chooses
the interface) connects them: all_reduce, all_gather_into_tensor and
reduce_scatter_tensor (and their coalesced forms) hierarchically (within the
host over shared memory, between the hosts' leaders, back), the other
operations on a Gloo group of all ranks.
"""
import os
import socket

import torch

BACKEND = "tpu_dist"


def host_identity():
    """What tells hosts apart: TORCH_TPU_DIST_HOST_ID, else the hostname and boot id."""
    v = os.environ.get("TORCH_TPU_DIST_HOST_ID")
    if v:
        return v
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _create(store, rank, size, timeout):
    from . import _C

    store.set(f"tpu_dist/host/{rank}", host_identity())
    hosts = [store.get(f"tpu_dist/host/{r}").decode() for r in range(size)]
    if len(set(hosts)) == 1:
        return _C._create_tpu_dist_backend(store, rank, size, timeout)
    from torch.distributed import PrefixStore, ProcessGroupGloo

    local = [r for r in range(size) if hosts[r] == hosts[rank]]
    leaders = [r for r in range(size) if hosts.index(hosts[r]) == r]  # each host's first rank
    gloo_all = ProcessGroupGloo(PrefixStore("tpu_dist/gloo_all", store), rank, size, timeout)
    gloo_leaders = None
    if rank in leaders:
        gloo_leaders = ProcessGroupGloo(PrefixStore("tpu_dist/gloo_leaders", store),
                                        leaders.index(rank), len(leaders), timeout)
    # Hierarchical all_gather / reduce_scatter need hosts of equal size; they take the ranks
    # host by host (hosts in the order of their first rank), reordering the pieces where that
    # is not 0 .. size - 1 (torchrun numbers ranks host by host, so usually it is).
    groups = [[r for r in range(size) if hosts[r] == hosts[lead]] for lead in leaders]
    host_order = [r for g in groups for r in g] if len({len(g) for g in groups}) == 1 else []
    return _C._create_tpu_dist_backend(store, rank, size, timeout, local, gloo_all, gloo_leaders,
                                       host_order)


def stats():
    """What this process's tpu_dist groups ran: collectives over shared memory only
    (``shm_collectives``; of those, ``direct_collectives`` copied straight between the
    ranks' buffers), hierarchical all_reduces, all_gathers and reduce_scatters (shared
    memory + Gloo between the hosts' leaders), and Gloo calls on the group of all ranks."""
    from . import _C

    return dict(_C._tpu_dist_stats())


def _register():
    if not torch.distributed.is_available():
        return
    from torch.distributed import Backend

    for name in (BACKEND, "tpu"):
        if name.upper() not in Backend.backend_list and name not in Backend.backend_list:
            Backend.register_backend(name, _create, devices=["tpu"])
    Backend.default_device_backend_map["tpu"] = BACKEND
