"""TPU matmul precision.

The matrix unit multiplies bfloat16 inputs and accumulates in float32. A float32
matmul on tpu takes one of PyTorch's precision levels:

- "medium" (the tpu default): inputs rounded to bfloat16, exact products, float32 sums;
- "high": the 3-pass bfloat16 split (~3x the cost on TPU hardware; the host target takes
  two float32 passes within the same error bound, ~2x);
- "highest": the 6-pass split or true float32 (~6x on TPU hardware; the host target uses
  true float32, ~1x).

`torch.set_float32_matmul_precision(...)` selects it for tpu; until a program calls it, tpu
uses "medium" whatever PyTorch's own default. `torch.tpu.precision(...)` overrides it locally
(context manager or decorator); `torch.tpu.get_precision()` reports the level in effect.
"""
import contextlib
import functools
import threading
import warnings

import torch

from . import _C

_LEVELS = ("medium", "high", "highest")
_COST = {"high": "~3x", "highest": "~6x"}       # on the TPU matrix unit
_HOST_COST = {"high": "~2x", "highest": "~1x"}  # host target: measured by bench/gemm.py
_lock = threading.Lock()
_explicit = None   # the level last given to torch.set_float32_matmul_precision
_overrides = []    # stack of torch.tpu.precision(...) levels
_warned = set()


class TpuPerformanceWarning(UserWarning):
    """A setting that makes tpu work markedly slower."""


def _check(level):
    if level not in _LEVELS:
        raise ValueError(f"unknown tpu matmul precision {level!r}: expected one of {_LEVELS}")


def _warn_cost(level):
    if level in _COST and level not in _warned:
        _warned.add(level)
        warnings.warn(f"tpu matmul precision '{level}' runs float32 matmuls in several bfloat16 "
                      f"passes: {_COST[level]} slower than 'medium' on TPU hardware "
                      f"({_HOST_COST[level]} on the host target)", TpuPerformanceWarning,
                      stacklevel=3)


def get_precision() -> str:
    """The float32 matmul precision tpu ops use now."""
    if _overrides:
        return _overrides[-1]
    return _explicit or "medium"


def _apply():
    _C.set_matmul_precision(get_precision())


@contextlib.contextmanager
def _scope(level):
    with _lock:
        _overrides.append(level)
        _apply()
    try:
        yield
    finally:
        with _lock:
            _overrides.pop()
            _apply()


class precision(contextlib.ContextDecorator):
    """Runs the body (or decorated function) with tpu matmul precision `level`."""

    def __init__(self, level: str):
        _check(level)
        self.level = level
        self._cm = None

    def __enter__(self):
        _warn_cost(self.level)
        self._cm = _scope(self.level)
        return self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def _install():
    """Routes torch.set_float32_matmul_precision to tpu as well."""
    original = torch.set_float32_matmul_precision
    if getattr(original, "_torch_tpu", False):
        return

    @functools.wraps(original)
    def set_float32_matmul_precision(level):
        original(level)
        global _explicit
        _check(level)
        _warn_cost(level)
        with _lock:
            _explicit = level
            _apply()

    set_float32_matmul_precision._torch_tpu = True
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    _apply()
