"""Explained differences: mismatches the fuzzer counts as known rather than as failures.

Each entry is already reported (issue 13, or the fuzzer's report on it: group G<n>) and says
why tpu differs. An entry matches on the mismatch kind, the op of the line (the fuzzer's short
op name, None: any), the modes (None: all) and a substring of the detail (None: any). Keep the
table small and delete an entry once its difference is fixed (the fuzzer then checks it again);
a bug that is not reported yet does not belong here.
"""

_IDX_TYPE = ("issue 13 (minor): out-of-range gather/scatter/index_add raise IndexError "
             "where CPU raises RuntimeError")
_LATE_PUT = ("issue 13 'argument errors surface later': index_put's shape check runs in the "
             "kernel, so Strict/DeferAndFuse raise it at the next synchronization")
_MASK = "issue 13 item 6: a boolean mask's shape is not checked at the op"
_OVERLAP = "issue 13 item 7: no memory-overlap checks for in-place ops (expanded outputs)"
_DTYPE = ("fuzz report G1: a dtype the kernel does not support is refused by the kernel, not "
          "at the op, so Strict/DeferAndFuse raise NotImplementedError at the next sync")

KNOWN = [
    # kind, op, modes, detail substring, reason
    ("wrong_error_type", "gather", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "take_along_dim", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "scatter_add", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "index_add_", None, "tpu IndexError", _IDX_TYPE),
    ("late_error", "index_put", ("strict", "defer_and_fuse"), "shape mismatch", _LATE_PUT),
    ("late_error", "setitem_adv", ("strict", "defer_and_fuse"), "shape mismatch", _LATE_PUT),
    ("late_error", "mask", ("strict", "defer_and_fuse"), "The shape of the mask", _MASK),
    ("wrong_error_type", "mask", None, "The shape of the mask", _MASK),
    ("missing_error", None, None, "more than one element of the written-to tensor", _OVERLAP),
    ("late_error", None, ("strict", "defer_and_fuse"), "not implemented for", _DTYPE),
]


def explained(m, mode):
    """the reason string when mismatch m (a worker's dict) is a known difference, else None"""
    for kind, op, modes, sub, reason in KNOWN:
        if m["kind"] == kind and (op is None or m["op"] == op) and (modes is None or mode in modes) \
                and (sub is None or sub in m["detail"]):
            return reason
    return None
