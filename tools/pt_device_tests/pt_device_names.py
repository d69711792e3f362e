"""Test names without their device, shared by the shim and the runner (no torch import)."""
import re

_DEVICE_CLASS_SUFFIX = re.compile(r"(CPU|TPU|PRIVATEUSE1)$")
_DEVICE_TOKEN = re.compile(r"_(cpu|tpu|privateuse1)(?=_|$)")


def comparable_name(cls_name, test_name):
    """The test's name with its device removed, equal for the cpu and the tpu instance."""
    cls_name = _DEVICE_CLASS_SUFFIX.sub("", cls_name or "")
    matches = list(_DEVICE_TOKEN.finditer(test_name))
    if matches:
        m = matches[-1]
        test_name = test_name[: m.start()] + "_DEV" + test_name[m.end():]
    return f"{cls_name}::{test_name}"
