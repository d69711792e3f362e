"""Explained differences: mismatches the fuzzer counts as known rather than as failures.

Each entry is already reported (issue 13, or the fuzzer's report on it: group G<n>) and says
why tpu differs. An entry matches on the mismatch kind, the op of the line (the fuzzer's short
op name, None: any), the modes (None: all) and a substring of the detail (None: any). Keep the
table small and delete an entry once its difference is fixed (the fuzzer then checks it again);
a bug that is not reported yet does not belong here.
"""

KNOWN = [
    # kind, op, modes, detail substring, reason
    # (empty: the fuzz report's groups G1-G14 and the issue 13 entries are fixed; see
    # tests/test_fuzz_findings.py)
]


def explained(m, mode):
    """the reason string when mismatch m (a worker's dict) is a known difference, else None"""
    for kind, op, modes, sub, reason in KNOWN:
        if m["kind"] == kind and (op is None or m["op"] == op) and (modes is None or mode in modes) \
                and (sub is None or sub in m["detail"]):
            return reason
    return None
