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

_EMPTY_DT = ("fuzz report G1: on a 0-element integer tensor CPU's softmax runs no kernel and so "
             "no dtype check; tpu refuses the dtype")
_STD_INT = ("fuzz report G2: std/var accept integer tensors (CPU: RuntimeError 'std and var only "
            "support floating point'), and check the dim before the dtype")
_LN_INT = ("fuzz report G3: layer_norm of an integer tensor raises RuntimeError from mean() "
           "(CPU: NotImplementedError)")
_BOOL = "fuzz report G4: relu/relu_/floor/round accept bool tensors (CPU raises)"
_MM_DT = "fuzz report G5: matmul/mv/linear accept operands of different dtypes (CPU raises)"
_EMPTY_IDX = ("fuzz report G6: index_add_ with an empty index into a tensor with a 0-size dim "
              "raises IndexError from select() (CPU: no-op)")
_EMPTY_PUT = ("fuzz report G7: indexing and index_put_ on a 0-element tensor check the indices "
              "(CPU does not: nothing is read or written)")
_SEL_TYPE = ("fuzz report G8: out-of-range index_select raises IndexError where CPU raises "
             "RuntimeError ('INDICES element is out of DATA bounds', dims other than 0)")
_COPY_EMPTY = ("fuzz report G10: copy_ into a 0-element tensor accepts a source that does not "
               "broadcast to it (CPU raises RuntimeError)")
_MFILL = ("fuzz report G11: masked_fill_ with a mask that broadcasts beyond self is refused by "
          "the kernel, not at the op (Strict/DeferAndFuse raise at the next sync)")
_GATHER_DBG = ("fuzz report G13: gather with an empty index of another rank raises RuntimeError "
               "(at the op in Debug, at the next sync otherwise); CPU accepts it")
_BCAST_IDX = ("fuzz report G9: index_put with index tensors that do not broadcast raises "
              "RuntimeError (CPU: IndexError)")

KNOWN = [
    # kind, op, modes, detail substring, reason
    ("wrong_error_type", "gather", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "take_along_dim", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "scatter_add", None, "tpu IndexError", _IDX_TYPE),
    ("wrong_error_type", "index_add_", None, "tpu IndexError", _IDX_TYPE),
    ("late_error", "index_put", ("strict", "defer_and_fuse"), "shape mismatch", _LATE_PUT),
    ("late_error", "setitem_adv", ("strict", "defer_and_fuse"), "shape mismatch", _LATE_PUT),
    ("late_error", None, ("strict", "defer_and_fuse"), "index_put(): shape mismatch", _LATE_PUT),
    ("late_error", "mask", ("strict", "defer_and_fuse"), "The shape of the mask", _MASK),
    ("wrong_error_type", "mask", None, "The shape of the mask", _MASK),
    ("missing_error", None, None, "more than one element of the written-to tensor", _OVERLAP),
    ("missing_error", None, None, "refer to a single memory location", _OVERLAP),
    ("late_error", None, ("strict", "defer_and_fuse"), "not implemented for", _DTYPE),
    ("unsupported", "softmax", None, "not implemented for int", _EMPTY_DT),
    ("unsupported", "log_softmax", None, "not implemented for int", _EMPTY_DT),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "softmax: not implemented for int", _EMPTY_DT),
    ("unsupported", None, ("strict", "defer_and_fuse"), "softmax: not implemented for int", _EMPTY_DT),
    ("unsupported", None, None, "softmax: not implemented for bool", _EMPTY_DT),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "softmax: not implemented for bool", _EMPTY_DT),
    ("missing_error", "std", None, "std and var only support", _STD_INT),
    ("missing_error", "var", None, "std and var only support", _STD_INT),
    ("wrong_error_type", "std", None, "std and var only support", _STD_INT),
    ("wrong_error_type", "var", None, "std and var only support", _STD_INT),
    ("wrong_error_type", "layer_norm", None, "LayerNormKernelImpl", _LN_INT),
    ("missing_error", "relu", None, "Boolean inputs not supported", _BOOL),
    ("missing_error", "relu_", None, "Boolean inputs not supported", _BOOL),
    ("missing_error", "floor", None, "for 'Bool'", _BOOL),
    ("missing_error", "round", None, "for 'Bool'", _BOOL),
    ("missing_error", "mask", None, "The shape of the mask", _MASK),
    ("late_error", "mask", ("strict", "defer_and_fuse"), "index(): index", _MASK),
    ("missing_error", "copy_", None, "must match the size", _COPY_EMPTY),
    ("missing_error", "copy_", None, "doesn't match the broadcast shape", _COPY_EMPTY),
    ("late_error", None, ("strict", "defer_and_fuse"), "std and var only support", _STD_INT),
    ("late_error", None, ("strict", "defer_and_fuse"), "masked_fill_", _MFILL),
    ("spurious_error", "gather", ("debug",), "Index tensor must have the same number of dimensions",
     _GATHER_DBG),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "Index tensor must have the same number",
     _GATHER_DBG),
    ("spurious_error", None, ("strict", "defer_and_fuse"), "indexing tensors could not be broadcast",
     _BCAST_IDX),
    ("spurious_error", None, ("strict", "defer_and_fuse"), "index_put(): index", _EMPTY_PUT),
    ("late_error", "masked_fill_", ("strict", "defer_and_fuse"), "must match the size", _MFILL),
    ("late_error", "masked_fill_", ("strict", "defer_and_fuse"), "doesn't match the broadcast", _MFILL),
    # a G1 error pending from an earlier line surfaces at a later line's sync
    ("wrong_error_type", None, ("strict", "defer_and_fuse"), "not implemented for", _DTYPE),
    ("spurious_error", "index_fill", None, "index_fill(): index", _EMPTY_PUT),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "index_fill(): index", _EMPTY_PUT),
    ("compile_error", "compile", None, "index_put(): index", _EMPTY_PUT),
    ("missing_error", "matmul", None, "same dtype", _MM_DT),
    ("missing_error", "matmul", None, "expected scalar type", _MM_DT),
    ("missing_error", "linear", None, "same dtype", _MM_DT),
    ("spurious_error", "index_add_", None, "select(): index 0 out of range", _EMPTY_IDX),
    ("spurious_error", "index_put", None, "out of bounds for dimension", _EMPTY_PUT),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "index_put(): index", _EMPTY_PUT),
    ("spurious_error", "adv2", None, "index(): index", _EMPTY_PUT),
    ("spurious_error", "adv", None, "index(): index", _EMPTY_PUT),
    ("spurious_error", "sync", ("strict", "defer_and_fuse"), "index(): index", _EMPTY_PUT),
    ("wrong_error_type", "index_select", None, "INDICES element is out of DATA bounds", _SEL_TYPE),
    ("wrong_error_type", "setitem_adv", None, "indexing tensors could not be broadcast", _BCAST_IDX),
]


def explained(m, mode):
    """the reason string when mismatch m (a worker's dict) is a known difference, else None"""
    for kind, op, modes, sub, reason in KNOWN:
        if m["kind"] == kind and (op is None or m["op"] == op) and (modes is None or mode in modes) \
                and (sub is None or sub in m["detail"]):
            return reason
    return None
