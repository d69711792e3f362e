"""Eager execution modes.

- "strict" (default): every op is queued asynchronously, one at a time.
- "debug" (TORCH_TPU_LAUNCH_BLOCKING=1 or TPU_LAUNCH_BLOCKING=1): ops run synchronously
  with extra checks, so an error points at the op that caused it.
- "defer_and_fuse" (TORCH_TPU_DEFER_AND_FUSE=1): ops are traced and run as fused graphs at
  materialization points (.cpu(), .item(), printing, torch.tpu.synchronize(), ops whose
  output shape depends on data, torch_tpu.materialize(), a cap on graph size, the end of a
  repeated block). Intermediates that Python has already dropped by then never get device
  memory, and work whose results nobody can observe is not run (so its errors are not
  raised either).

The mode is per thread: `eager_mode(...)` blocks (and torch.compile's graphs) affect the
calling thread only; other threads follow the process-wide mode that `set_eager_mode`
and the environment set. Threads in different modes may use a device at once.
"""
import contextlib

from . import _C

MODES = ("strict", "debug", "defer_and_fuse")


def set_eager_mode(mode: str) -> None:
    """Selects the process-wide eager mode for subsequent ops: "strict", "debug" or
    "defer_and_fuse". Threads inside an `eager_mode(...)` block keep theirs; the calling
    thread drops its own. Leaving "defer_and_fuse" materializes what was deferred."""
    _C.set_eager_mode(mode)


def get_eager_mode() -> str:
    """The calling thread's mode: that of its innermost `eager_mode` block, else the
    process-wide one."""
    return _C.get_eager_mode()


@contextlib.contextmanager
def eager_mode(mode: str):
    """Runs its body in `mode` on the calling thread only (like torch.no_grad), restoring
    the thread's previous mode after. Other threads are not affected."""
    old = _C.set_thread_eager_mode(mode)
    try:
        yield
    finally:
        _C.set_thread_eager_mode(old)


def materialize() -> None:
    """Runs everything deferred so far (DeferAndFuse) without waiting for it."""
    _C.materialize()
    from .device import _emit_runtime_warnings
    _emit_runtime_warnings()


def wait_compiles() -> None:
    """Waits until fused kernels compiling in the background are ready."""
    _C.wait_compiles()


def trace_stats() -> dict:
    """DeferAndFuse counters: flushes, nodes traced / dropped / fused, temporaries,
    bytes of dead intermediates that never got memory, repeated-block cuts."""
    return dict(_C.trace_stats())


def reset_trace_stats() -> None:
    _C.reset_trace_stats()
