"""Explained differences: mismatches the fuzzer counts as known rather than as failures.

Each entry is already reported (issue 13 or a later one) and says why tpu differs. An entry
matches on the mismatch kind, the op of the line (the fuzzer's short op name), optionally the
modes and a substring of the detail. Keep this table small and remove an entry once the
difference is fixed; a real bug that is not yet reported does not belong here.
"""

KNOWN = [
    # kind, op, modes (None: all), detail substring (None: any), reason
]


def explained(m, mode):
    """the reason string when mismatch m (a worker's dict) is a known difference, else None"""
    for kind, op, modes, sub, reason in KNOWN:
        if m["kind"] == kind and (op is None or m["op"] == op) and (modes is None or mode in modes) \
                and (sub is None or sub in m["detail"]):
            return reason
    return None
