"""The `torch.tpu` module: devices, synchronization, RNG, memory, streams."""
import contextlib
from typing import Any, Dict, Optional, Union

import torch

from . import _C

_DeviceLike = Union[int, str, torch.device, None]


def _index(device: _DeviceLike = None) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {d}")
    return _C.current_device() if d.index is None else d.index


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    return _C.is_initialized()


def init() -> None:
    _C._init()


def _lazy_init() -> None:
    _C._init()


def _is_in_bad_fork() -> bool:
    """True in a process forked after the tpu runtime started (there, any tpu
    work raises "Cannot re-initialize TPU in forked subprocess")."""
    return _C._is_in_bad_fork()


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    idx = _index(device)
    if idx >= 0:
        _C.set_device(idx)


class device:
    """Context manager that changes the current tpu device."""

    def __init__(self, device: _DeviceLike):
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = _C.current_device()
        if self.idx >= 0:
            _C.set_device(self.idx)

    def __exit__(self, *exc):
        _C.set_device(self.prev)
        return False


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all queued work on the device; raises the first asynchronous error.
    In DeferAndFuse mode it first runs what was deferred."""
    _C.synchronize(_index(device))
    _emit_runtime_warnings()


def _emit_runtime_warnings():
    import warnings
    for msg in _C.pop_warnings():
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def compilation_cache_stats() -> dict:
    """Counters of the compiled-executable cache: tier1_hits (process memory),
    tier2_hits (machine shared memory), tier3_hits (persistent directory), misses,
    compiles, compile_seconds, corrupt_entries, store_failures, and the tier
    directories in use; and the torch.compile graph counts of torch_tpu.dynamic.stats()
    (dynamo_graphs, aot_graphs, dynamic_graphs, bucket_graphs, graphs_per_bucket,
    padded_runs, exact_runs, pad_fallbacks)."""
    from . import dynamic
    s = dict(_C.compilation_cache_stats())
    s.update(dynamic.stats())
    return s


def reset_compilation_cache_stats() -> None:
    from . import dynamic
    _C.reset_compilation_cache_stats()
    dynamic.reset_stats()


def clear_compilation_cache(tier: int = None) -> None:
    """Clears one tier (1, 2 or 3) of the compiled-executable cache, or all of them."""
    if tier not in (None, 0, 1, 2, 3):
        raise ValueError(f"clear_compilation_cache: tier must be 1, 2, 3 or None, got {tier!r}")
    _C.clear_compilation_cache(int(tier or 0))


def get_device_name(device: _DeviceLike = None) -> str:
    idx = _index(device)
    if _C.target() == "host":
        return f"TorchTPU host chip {idx}"
    return f"TorchTPU {_C.target()} {_C.device_kind(idx)} {idx}"


class _DeviceProperties:
    def __init__(self, idx: int):
        self.name = get_device_name(idx)
        self.total_memory = _C.memory_stats(idx)["capacity_bytes"]
        self.index = idx
        self.type = "tpu"
        self.target = _C.target()
        self.num_threads = _C.num_threads()

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', total_memory="
                f"{self.total_memory // (1 << 20)}MB, target='{self.target}')")


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def get_device_capability(device: _DeviceLike = None):
    return (1, 0)


# ---- random numbers ----
def _generator(device: _DeviceLike = None) -> torch.Generator:
    return _C.default_generator(_index(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    s = _generator(0).seed()
    for i in range(1, device_count()):
        _generator(i).manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: _DeviceLike = "tpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "tpu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


default_generators = property(lambda self: tuple(_generator(i) for i in range(device_count())))


# ---- memory ----
def memory_stats(device: _DeviceLike = None) -> Dict[str, Any]:
    return dict(sorted(_C.memory_stats(_index(device)).items()))


def memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes.all.peak"]


def memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes.all.current"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    _C.empty_cache()


def mem_get_info(device: _DeviceLike = None):
    s = _C.memory_stats(_index(device))
    # DeferAndFuse's unbacked placeholders are no memory, but their bytes are promised
    used = s["reserved_bytes.all.current"] + s["promised_bytes.all.current"]
    return (max(s["capacity_bytes"] - used, 0), s["capacity_bytes"])


# ---- streams and events ----
class Stream(torch.Stream):
    """An in-order queue of device work with its own worker."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs):
        if kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
    """A torch.Event on the current tpu device."""
    return torch.Event(device=torch.device("tpu", current_device()), enable_timing=enable_timing,
                       blocking=blocking, interprocess=interprocess)


def current_stream(device: _DeviceLike = None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    idx = _index(device)
    cur = torch.accelerator.current_stream(idx)
    return torch.Stream(stream_id=0, device_index=idx, device_type=cur.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream: Optional[torch.Stream]):
    """Runs the body with `stream` as the current stream of its device."""
    if stream is None:
        yield
        return
    prev = torch.accelerator.current_stream(stream.device_index)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)


# ---- matmul precision ----
from .precision import TpuPerformanceWarning, get_precision, precision  # noqa: E402,F401

# ---- autocast ----
def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_compiled() -> bool:
    return True


# ---- memory summary and snapshots (torch.tpu.memory) ----
from . import memory  # noqa: E402,F401
from .memory import (_dump_snapshot, _record_memory_history, _snapshot,  # noqa: E402,F401
                     memory_snapshot, memory_summary)


def __getattr__(name):
    # `_initialized` as torch.cuda has it: torch.utils.checkpoint saves and restores the
    # device's RNG state only when its device module says it is initialized.
    if name == "_initialized":
        return _C.is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
