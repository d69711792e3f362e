"""pytest plugin that runs PyTorch's own device-generic test files against this torch.

Loaded with `-p pt_device_shim` (its folder on PYTHONPATH) by
scripts/pytorch_device_tests.sh; never imported by the package itself. It

* registers device "tpu" (import torch_tpu) before the test file imports
  torch.testing._internal.common_device_type, so that PrivateUse1TestBase is among the
  device-type bases and instantiate_device_type_tests creates the ...TPU classes
  (PYTORCH_TESTING_DEVICE_ONLY_FOR then keeps only the device asked for);
* fills in the names the test files of an older release import from the testing
  internals that the installed torch renamed or dropped (see _fill_renamed_names);
* keeps only the tests of device-type classes (PT_DEVICE_TESTS_ALL_CLASSES=1 keeps all),
  optionally a stable 1-in-N sample of them (PT_DEVICE_TESTS_SAMPLE=N);
* arms a hard watchdog per test (PT_DEVICE_TESTS_HARD_TIMEOUT seconds): a test stuck in
  native code, where pytest-timeout's SIGALRM cannot interrupt it, gets its stacks dumped
  to PT_DEVICE_TESTS_STATE/hang-<pid>.txt and its process ended; pytest-xdist then
  reports the test as crashed and starts a new worker, and the runner counts it as a hang.
"""
import faulthandler
import os
import zlib

DEVICE = os.environ.get("PT_DEVICE_TESTS_DEVICE", "cpu")
os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = DEVICE

import torch  # noqa: E402

if DEVICE == "tpu":
    import torch_tpu  # noqa: F401,E402  (renames PrivateUse1 to "tpu", registers torch.tpu)

    torch_tpu._register()


def _fill_renamed_names():
    """Names that PyTorch 2.6's test files import and the installed testing internals lack."""
    from torch.testing._internal import common_cuda, common_methods_invocations, common_mkldnn, common_nn

    cmi = common_methods_invocations
    if not hasattr(cmi, "binary_ufuncs_and_refs"):
        # Newer releases build binary_ufuncs from ops_and_refs, so it holds the refs too.
        cmi.binary_ufuncs_and_refs = tuple(cmi.binary_ufuncs)
    if not hasattr(common_nn, "new_module_tests"):
        common_nn.new_module_tests = common_nn.get_new_module_tests()
    if not hasattr(common_cuda, "tf32_is_not_fp32"):
        # TF32 is a CUDA (Ampere+) matmul mode; without CUDA fp32 is fp32.
        common_cuda.tf32_is_not_fp32 = lambda: False
    if not hasattr(common_mkldnn, "bf32_on_and_off"):
        # Renamed: one decorator now switches oneDNN's reduced fp32 modes (bf32 and tf32).
        def bf32_on_and_off(bf32_precision=1e-5):
            return common_mkldnn.reduced_f32_on_and_off(bf32_precision=bf32_precision)

        common_mkldnn.bf32_on_and_off = bf32_on_and_off


_fill_renamed_names()

from pt_device_names import comparable_name  # noqa: E402


def _is_device_type_test(item):
    from torch.testing._internal.common_device_type import DeviceTypeTestBase

    cls = getattr(item, "cls", None)
    return cls is not None and issubclass(cls, DeviceTypeTestBase)


def pytest_collection_modifyitems(session, config, items):
    keep_all = os.environ.get("PT_DEVICE_TESTS_ALL_CLASSES") == "1"
    sample = int(os.environ.get("PT_DEVICE_TESTS_SAMPLE", "1") or "1")
    kept, dropped = [], []
    for item in items:
        ok = keep_all or _is_device_type_test(item)
        if ok and sample > 1:
            key = comparable_name(getattr(item.cls, "__name__", ""), item.name)
            ok = zlib.crc32(key.encode()) % sample == 0
        (kept if ok else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


_HARD = float(os.environ.get("PT_DEVICE_TESTS_HARD_TIMEOUT", "0") or "0")
_STATE = os.environ.get("PT_DEVICE_TESTS_STATE")
_hang_file = None


def pytest_runtest_setup(item):
    global _hang_file
    if _HARD <= 0 or not _STATE:
        return
    if _hang_file is None:
        os.makedirs(_STATE, exist_ok=True)
        _hang_file = open(os.path.join(_STATE, f"hang-{os.getpid()}.txt"), "w")
    _hang_file.seek(0)
    _hang_file.truncate()
    _hang_file.write(f"NODEID {item.nodeid}\n")
    _hang_file.flush()
    faulthandler.dump_traceback_later(_HARD, exit=True, file=_hang_file)


def pytest_runtest_teardown(item, nextitem):
    if _hang_file is not None:
        faulthandler.cancel_dump_traceback_later()
