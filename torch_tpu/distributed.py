"""tpu_dist: the torch.distributed backend of device tpu.

Registered at autoload under the names "tpu_dist" and "tpu", as the default
backend of device tpu, so that each of these picks it:

    dist.init_process_group("tpu_dist")
    dist.init_process_group(device_id=torch.device("tpu", local_rank))
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")

The backend itself is C++ (torch_tpu/csrc/dist.cpp) over the runtime's
transport (runtime/dist/): the processes of one host share memory. Rendezvous
and the exchange of the segment's name go through the process group's store
(torchrun's TCPStore).
"""
import torch

BACKEND = "tpu_dist"


def _create(store, rank, size, timeout):
    from . import _C

    return _C._create_tpu_dist_backend(store, rank, size, timeout)


def _register():
    if not torch.distributed.is_available():
        return
    from torch.distributed import Backend

    for name in (BACKEND, "tpu"):
        if name.upper() not in Backend.backend_list and name not in Backend.backend_list:
            Backend.register_backend(name, _create, devices=["tpu"])
    Backend.default_device_backend_map["tpu"] = BACKEND
