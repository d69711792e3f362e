"""Lists core ATen ops (torch.Tag.core: what torch.compile's decompositions produce) that the
tpu lowering cannot handle yet (no tpu kernel).

    .venv/bin/python tools/lowering_gaps.py
"""
import torch

import torch_tpu  # noqa: F401
from torch_tpu.compile import _has_tpu_kernel


def core_overloads():
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                yield op


def main():
    ops = sorted(set(core_overloads()), key=str)
    missing = [str(op) for op in ops if not _has_tpu_kernel(op)]
    print(f"core ATen overloads: {len(ops)}, lowerable on tpu: {len(ops) - len(missing)}, "
          f"missing: {len(missing)}")
    for m in missing:
        print("  " + m)


if __name__ == "__main__":
    main()
