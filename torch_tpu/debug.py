"""Debugging aids."""
import contextlib
import os

from . import _C


def dump_graphs(directory):
    """Writes every graph DeferAndFuse runs from now on as a StableHLO module (MLIR text) into
    `directory` (graph_00000.stablehlo.mlir, ...); None turns it off. The environment
    variable TORCH_TPU_DUMP_GRAPHS=<dir> does the same from start-up."""
    _C.set_dump_dir(None if directory is None else os.fspath(directory))


class KernelProfile:
    """What `kernel_profile()` measured: `ops` maps each runtime op (ATen overload name, or
    "fused.elementwise" / "fused.rows" / "fused.matmul_epilogue" for generated kernels) to
    (calls, seconds of kernel wall time). Filled when the `with` block ends."""

    def __init__(self):
        self.ops = {}

    @property
    def total_seconds(self):
        return sum(s for _, s in self.ops.values())

    def seconds(self, *names):
        """Kernel seconds of the named ops (missing ones count 0)."""
        return sum(self.ops.get(n, (0, 0.0))[1] for n in names)

    def table(self, top=25):
        """The `top` ops by time, one line each: calls, seconds, share of the total."""
        total = self.total_seconds or 1.0
        rows = sorted(self.ops.items(), key=lambda kv: -kv[1][1])[:top]
        lines = [f"{'op':42s} {'calls':>8s} {'seconds':>9s} {'share':>6s}"]
        lines += [f"{n:42s} {c:8d} {s:9.4f} {100 * s / total:5.1f}%" for n, (c, s) in rows]
        return "\n".join(lines)


@contextlib.contextmanager
def kernel_profile():
    """Times every kernel the runtime runs inside the block (all tpu devices and streams):

        with torch_tpu.debug.kernel_profile() as prof:
            train_step()
        print(prof.table())

    Kernel time is measured on the thread that runs the kernel (a stream worker, or the
    caller in Debug mode), from the kernel's start to its end, so it excludes dispatch and
    queueing. The block synchronizes every device when it ends so that the work it queued
    is counted."""
    import torch
    prof = KernelProfile()
    torch.tpu.synchronize()
    _C.profile_reset()
    _C.profile_enable(True)
    try:
        yield prof
    finally:
        for d in range(torch.tpu.device_count()):
            torch.tpu.synchronize(d)
        _C.profile_enable(False)
        prof.ops = dict(_C.profile_entries())
