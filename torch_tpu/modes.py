"""Eager execution modes: "strict" (asynchronous, default) and "debug"
(synchronous with extra checks; TORCH_TPU_LAUNCH_BLOCKING=1)."""
import contextlib

from . import _C


def set_eager_mode(mode: str) -> None:
    """Selects the eager mode for subsequent ops: "strict" or "debug"."""
    _C.set_eager_mode(mode)


def get_eager_mode() -> str:
    return _C.get_eager_mode()


@contextlib.contextmanager
def eager_mode(mode: str):
    """Context manager running its body in `mode`, restoring the previous one."""
    old = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(old)
