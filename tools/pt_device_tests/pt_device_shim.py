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
* skips, on tpu only, the few tests listed in NOT_APPLICABLE, whose expectations hold for
  CPU and CUDA alone (each with its reason; they count as skipped, never as passed);
* arms a hard watchdog per test (PT_DEVICE_TESTS_HARD_TIMEOUT seconds): a test stuck in
  native code, where pytest-timeout's SIGALRM cannot interrupt it, gets its stacks dumped
  to PT_DEVICE_TESTS_STATE/hang-<pid>.txt and its process ended; pytest-xdist then
  reports the test as crashed and starts a new worker, and the runner counts it as a hang.
"""
import faulthandler
import os
import re
import zlib

DEVICE = os.environ.get("PT_DEVICE_TESTS_DEVICE", "cpu")
os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = DEVICE

import torch  # noqa: E402

if DEVICE == "tpu":
    import torch_tpu  # noqa: F401,E402  (renames PrivateUse1 to "tpu", registers torch.tpu)

    torch_tpu._register()
    # tpu's float32 matmuls default to precision "medium" (one bfloat16 pass); PyTorch's
    # default, which the tests' tolerances assume, is "highest". Unset: the device default.
    if os.environ.get("PT_DEVICE_TESTS_MATMUL_PRECISION"):
        torch.set_float32_matmul_precision(os.environ["PT_DEVICE_TESTS_MATMUL_PRECISION"])


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

# (class without device suffix, regular expression matched at the start of the test's
# name) -> reason.
# Only tests whose expectation is written for CPU or CUDA by name and contradicts what
# PyTorch itself does for a PrivateUse1 device.
NOT_APPLICABLE = {
    ("TestSortAndSelect", r"test_stable_sort_against_numpy_"):
        "returns early on CUDA: its later samples index_fill a device tensor with a CPU index "
        "tensor, which every non-CPU device refuses (TensorIterator's same-device rule)",
    ("TestNNDeviceType", r"test_upsamplingBiMode2d_nonsupported_dtypes_.*_mode_(bilinear|bicubic)_uint8_"):
        "expects every device but CPU to lack uint8 bilinear/bicubic interpolation (CUDA's "
        "kernels); tpu computes uint8 as CPU does",
    ("TestTorchDeviceType", r"test_broadcast_fn_map2?_"):
        "returns early on CUDA: Tensor.map_ / map2_ call a Python function per element and "
        "exist for CPU tensors only (TypeError on every other device)",
    ("TestTorchDeviceType", r"test_grad_scaler_deprecated_warning_"):
        "constructs torch.cpu.amp.GradScaler for every device but CUDA, then expects the "
        "warning to name torch.<device>.amp",
    ("TestTorchDeviceType", r"test_grad_scaling_state_dict_"):
        "expects the scale of a non-CUDA device to be a torch.FloatTensor, the legacy CPU "
        "tensor type",
    ("TestTorchDeviceType", r"test_tensor_storage_type_"):
        "expects torch.<T>Storage for every device but CUDA, while PyTorch's own "
        "TypedStorage._get_legacy_storage_class looks the class up in torch.<privateuse1 "
        "name> for a PrivateUse1 device",
}


def _not_applicable(item):
    cls = comparable_name(getattr(item.cls, "__name__", ""), item.name).split("::")[0]
    for (c, pattern), reason in NOT_APPLICABLE.items():
        if cls == c and re.match(pattern, item.name):
            return reason
    return None


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
        if ok and DEVICE == "tpu":
            reason = _not_applicable(item)
            if reason:
                import pytest

                item.add_marker(pytest.mark.skip(reason="not applicable to a PrivateUse1 device: " + reason))
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
