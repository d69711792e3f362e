"""`torch.tpu.memory`: memory statistics, a printable summary, and snapshots of
the caching allocator in the format of `torch.cuda.memory._snapshot()`, which
PyTorch's memory visualizer (https://pytorch.org/memory_viz,
`torch.cuda._memory_viz`) reads.

    torch.tpu.memory._record_memory_history(max_entries=100000)
    train_step()
    torch.tpu.memory._dump_snapshot("snapshot.pickle")   # drag into pytorch.org/memory_viz

The runtime's allocator rounds requests up (512 B, 64 KiB above 1 MiB) and does not split
blocks, so each block the allocator holds is one segment with one block in the snapshot;
a freed block stays in the cache (state "inactive") until `empty_cache()`.
"""
import pickle
import sys
from typing import Any, Dict, List, Optional

import torch

from . import _C

__all__ = ["memory_summary", "memory_snapshot", "memory_stats", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache",
           "reset_peak_memory_stats", "mem_get_info"]

_LARGE = 1 << 20  # blocks from 1 MiB are rounded to 64 KiB: the "large" pool


def _dev():
    from . import device
    return device


def memory_stats(device=None) -> Dict[str, Any]:
    return _dev().memory_stats(device)


def memory_allocated(device=None) -> int:
    return _dev().memory_allocated(device)


def max_memory_allocated(device=None) -> int:
    return _dev().max_memory_allocated(device)


def memory_reserved(device=None) -> int:
    return _dev().memory_reserved(device)


def max_memory_reserved(device=None) -> int:
    return _dev().max_memory_reserved(device)


def reset_peak_memory_stats(device=None) -> None:
    _dev().reset_peak_memory_stats(device)


def empty_cache() -> None:
    _dev().empty_cache()


def mem_get_info(device=None):
    return _dev().mem_get_info(device)


# ---- summary ----
def _fmt_bytes(n: int) -> str:
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6d} {unit}" if unit == "B " else f"{n:6.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the device's allocator statistics (current, peak, allocated and freed
    in total), like `torch.cuda.memory_summary()`."""
    idx = _dev()._index(device)
    s = _dev().memory_stats(idx)
    blocks = _blocks(idx)
    cached = [b for b in blocks if not b[3]]
    width = 77
    rule = "|" + "=" * (width - 2) + "|"
    thin = "|" + "-" * (width - 2) + "|"
    head = f"| {'Metric':<25}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | {'Tot Freed':>10} |"

    def row(name, cur, peak, alloc, freed, fmt):
        cells = [fmt(v) if v is not None else "" for v in (cur, peak, alloc, freed)]
        return f"| {name:<25}| {cells[0]:>10} | {cells[1]:>10} | {cells[2]:>10} | {cells[3]:>10} |"

    count = lambda v: str(int(v))  # noqa: E731
    lines = [rule,
             f"| {'TorchTPU memory summary, device ID ' + str(idx):<{width - 4}} |",
             f"| {'capacity ' + _fmt_bytes(s['capacity_bytes']).strip() + ', target ' + _C.target():<{width - 4}} |",
             thin, head, rule,
             row("Allocated memory", s["allocated_bytes.all.current"],
                 s["allocated_bytes.all.peak"], s["allocated_bytes.all.allocated"],
                 s["allocated_bytes.all.freed"], _fmt_bytes),
             row("Reserved memory", s["reserved_bytes.all.current"],
                 s["reserved_bytes.all.peak"], None, None, _fmt_bytes),
             row("Promised (deferred)", s["promised_bytes.all.current"], None, None, None,
                 _fmt_bytes),
             row("Cached (inactive) memory", sum(b[2] for b in cached), None, None, None,
                 _fmt_bytes),
             thin,
             row("Allocations", s["active.all.current"], s["active.all.peak"],
                 s["allocation.all.allocated"], s["allocation.all.freed"], count),
             row("Reserved blocks", len(blocks), None, s["num_device_alloc"],
                 s["num_device_free"], count)]
    if not abbreviated:
        small = [b for b in blocks if b[2] < _LARGE]
        large = [b for b in blocks if b[2] >= _LARGE]
        lines += [row("  small pool (< 1 MiB)", sum(b[2] for b in small), None, None, None,
                      _fmt_bytes),
                  row("  large pool", sum(b[2] for b in large), None, None, None, _fmt_bytes),
                  thin,
                  row("Cache hits", s["num_cache_hits"], None, None, None, count),
                  row("OOMs", s["num_ooms"], None, None, None, count)]
    lines.append(rule)
    return "\n".join(lines) + "\n"


# ---- snapshots ----
def _blocks(idx: Optional[int] = None):
    blocks, _ = _C._memory_raw_snapshot()
    return [b for b in blocks if idx is None or b[0] == idx]


def _record_memory_history(enabled="all", context="all", stacks="python",
                           max_entries: int = sys.maxsize, device=None, **kwargs) -> None:
    """Starts (or, with enabled=None/False, stops) recording the allocator's history for
    `_snapshot()`, as `torch.cuda.memory._record_memory_history` does.

    enabled: "all" (events and live blocks' stacks) or "state" (live blocks' stacks only);
    None/False stops and drops the history. context: None records no Python stacks.
    max_entries: events kept (the newest). Stacks are Python frames only (stacks="all" is
    accepted and records the same). The history covers every tpu device; `device` and the
    other keywords of the CUDA function are accepted and ignored."""
    if enabled is True:
        enabled = "all"
    if enabled not in (None, False, "state", "all"):
        raise ValueError(f"_record_memory_history: enabled must be None, 'state' or 'all', "
                         f"got {enabled!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"_record_memory_history: stacks must be 'python' or 'all', got {stacks!r}")
    on = enabled in ("state", "all")
    keep = min(int(max_entries), 1 << 62) if enabled == "all" else 0
    _C._memory_record(on, context is not None and on, keep if on else 0)


def _frames(frames):
    return [dict(f) for f in frames]


def _snapshot(device=None) -> Dict[str, Any]:
    """The allocator's state and recorded history, in the dict format of
    `torch.cuda.memory._snapshot()`: "segments" (each with its "blocks") and
    "device_traces" (one list of events per device: alloc, free_requested,
    free_completed, segment_alloc, segment_free, oom; each with addr, size, stream,
    time_us and the Python frames)."""
    blocks, traces = _C._memory_raw_snapshot()
    segments = []
    for dev, addr, size, live, requested, frames in blocks:
        fr = _frames(frames)
        segments.append({
            "device": dev,
            "address": addr,
            "total_size": size,
            "allocated_size": size if live else 0,
            "active_size": size if live else 0,
            "requested_size": requested if live else 0,
            "stream": 0,
            "segment_type": "large" if size >= _LARGE else "small",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": fr,
            "blocks": [{
                "address": addr,
                "size": size,
                "requested_size": requested if live else 0,
                "state": "active_allocated" if live else "inactive",
                "frames": fr,
            }],
        })
    device_traces: List[List[Dict[str, Any]]] = []
    for dev, events in enumerate(traces):
        out = []
        for action, addr, size, requested, stream, t_us, frames in events:
            base = {"addr": addr, "size": size, "stream": stream, "time_us": t_us,
                    "frames": _frames(frames), "compile_context": "", "user_metadata": ""}
            if action == "free":
                # the block is fenced on busy streams and reused in stream order: requested
                # and completed are one moment from Python's point of view
                out.append(dict(base, action="free_requested"))
                out.append(dict(base, action="free_completed"))
            elif action == "oom":
                s = _C.memory_stats(dev)
                out.append(dict(base, action="oom", size=requested,
                                device_free=s["capacity_bytes"] - s["reserved_bytes.all.current"]
                                - s["promised_bytes.all.current"]))
            else:
                out.append(dict(base, action=action))
        device_traces.append(out)
    return {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": {"PYTORCH_TPU_ALLOC_CONF": "", "round_small_bytes": 512,
                               "round_large_bytes": 65536, "expandable_segments": False},
        "external_annotations": [],
    }


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles `_snapshot()` into `filename` (the file pytorch.org/memory_viz opens)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def memory_snapshot() -> List[Dict[str, Any]]:
    """The allocator's segments (as `torch.cuda.memory_snapshot()`)."""
    return _snapshot()["segments"]
