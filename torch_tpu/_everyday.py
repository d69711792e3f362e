"""Small adjustments that make everyday PyTorch features work on tpu.

- Deterministic mode: the bridge infers output shapes with PyTorch's meta kernels, called
  on meta tensors. A few of PyTorch's Python meta kernels (histc, median/nanmedian/mode
  with a dim) raise "... does not have a deterministic implementation" under
  `torch.use_deterministic_algorithms(True)` because they cannot tell a meta tensor from a
  CUDA one. The tpu kernels of these ops are deterministic (fixed reduction order), so the
  bridge uses shape-only meta kernels for them instead.
- Argument checks: for a few ops (linalg.eig/eigvals) CPU checks arguments that PyTorch's
  Python meta kernel does not; on meta tensors the bridge runs CPU's checks first.
  `meta_for_bridge` picks the meta kernel the bridge registers for an op, with either
  adjustment.
- safetensors: its loader accepts a fixed list of device names and, for any other
  accelerator, the device index. `load_file(path, device="tpu")` and
  `safe_open(path, "pt", device="tpu:1")` are passed on with the index (`_install`).
"""
import torch


def _reduced(x, dim, keepdim):
    """The shape of reducing x over `dim`, which is checked as PyTorch checks it."""
    from torch._prims_common import reduction_dims
    dims = reduction_dims(x.shape, (dim,))  # IndexError for a dim out of range
    if x.dim() == 0:  # dim 0 or -1 of a scalar: a scalar, keepdim or not
        return ()
    shape = list(x.shape)
    for d in dims:
        if keepdim:
            shape[d] = 1
    return tuple(shape) if keepdim else tuple(n for i, n in enumerate(shape) if i not in dims)


def _histc(input, bins=100, min=0, max=0):
    # PyTorch's checks and messages (torch/_meta_registrations.py meta_histc), less the alert
    from numbers import Number
    torch._check(isinstance(bins, int), lambda: f"histc(): argument 'bins' must be int, not "
                                                f"{type(bins)}")
    torch._check(bins > 0, lambda: f"histc(): bins must be > 0, but got {bins}")
    torch._check(isinstance(min, Number) and isinstance(max, Number),
                 lambda: "histc(): arguments 'min' and 'max' must be Numbers")
    torch._check(max >= min, lambda: "histc(): max must be larger than min")
    return input.new_empty(bins)


def _values_indices(input, dim=-1, keepdim=False):
    shape = _reduced(input, dim, keepdim)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.long)


_SHAPE_ONLY = {
    "aten::histc": _histc,
    "aten::median.dim": _values_indices,
    "aten::nanmedian.dim": _values_indices,
    "aten::mode": _values_indices,
}


_C10_NAMES = {torch.float16: "Half", torch.float32: "Float", torch.float64: "Double",
              torch.bfloat16: "BFloat16", torch.complex32: "ComplexHalf",
              torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
              torch.int8: "Char", torch.uint8: "Byte", torch.int16: "Short", torch.int32: "Int",
              torch.int64: "Long", torch.bool: "Bool"}


def _c10_name(dt):
    return _C10_NAMES.get(dt, str(dt).removeprefix("torch."))


def _check_complex(real, imag, *, out=None):
    # CPU's checks (ATen's complex_check_dtype), which PyTorch's Python meta kernel lacks
    ok = (torch.float16, torch.float32, torch.float64)
    torch._check(real.dtype in ok and imag.dtype in ok,
                 lambda: f"Expected both inputs to be Half, Float or Double tensors but got "
                         f"{_c10_name(real.dtype)} and {_c10_name(imag.dtype)}")
    torch._check(real.dtype == imag.dtype,
                 lambda: f"Expected object of scalar type {_c10_name(real.dtype)} but got scalar "
                         f"type {_c10_name(imag.dtype)} for second argument")
    if out is not None:
        want = {torch.float16: torch.complex32, torch.float32: torch.complex64,
                torch.float64: torch.complex128}[real.dtype]
        torch._check(out.dtype == want,
                     lambda: f"Expected object of scalar type {_c10_name(want)} but got scalar "
                             f"type {_c10_name(out.dtype)} for argument 'out'")


def _check_matrix(name):
    def check(input, *args, **kwargs):
        # the Python meta kernel's check raises AssertionError; CPU's a RuntimeError
        torch._check(input.dim() >= 2,
                     lambda: f"{name}: The input tensor A must have at least 2 dimensions.")
    return check


# checks CPU makes that PyTorch's Python meta kernel does not, run before it on meta tensors
_CHECKED = {
    "aten::complex": _check_complex,
    "aten::complex.out": _check_complex,
    "aten::linalg_eig": _check_matrix("linalg.eig"),
    "aten::linalg_eig.out": _check_matrix("linalg.eig"),
    "aten::_linalg_eigvals": _check_matrix("linalg.eigvals"),
}


def meta_for_bridge(qual_name, fn):
    """The meta kernel the bridge should use for `qual_name` ("aten::histc", with the
    overload when not default): for the ops whose Python meta kernel raises PyTorch's CUDA
    determinism alert on a meta tensor, one that checks the arguments and computes the shape
    the same way without the alert, for meta tensors only (fake tensors of a real device,
    cuda's included, keep PyTorch's kernel); `fn` itself for every other op."""
    shape_only = _SHAPE_ONLY.get(qual_name.replace(".default", ""))
    check = _CHECKED.get(qual_name.replace(".default", ""))
    if check is not None:
        def checked(*args, **kwargs):
            if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
                check(*args, **kwargs)
            return fn(*args, **kwargs)
        return checked
    if shape_only is None:
        return fn

    def meta(input, *args, **kwargs):
        if isinstance(input, torch.Tensor) and input.device.type == "meta":
            return shape_only(input, *args, **kwargs)
        return fn(input, *args, **kwargs)
    return meta


def _tpu_index(device):
    """The index of a tpu device given as "tpu", "tpu:N" or torch.device; None otherwise."""
    if isinstance(device, torch.device):
        d = device
    elif isinstance(device, str) and (device == "tpu" or device.startswith("tpu:")):
        d = torch.device(device)
    else:
        return None
    if d.type != "tpu":
        return None
    return torch.tpu.current_device() if d.index is None else d.index


def _install_safetensors():
    try:
        import safetensors
        import safetensors.torch as st
    except ImportError:
        return
    orig = getattr(safetensors, "safe_open", None)
    if orig is None or getattr(orig, "_torch_tpu", False):
        return

    def safe_open(filename, framework, device="cpu", *args, **kwargs):
        idx = _tpu_index(device)
        return orig(filename, framework, idx if idx is not None else device, *args, **kwargs)

    safe_open.__doc__ = orig.__doc__
    safe_open._torch_tpu = True
    safetensors.safe_open = safe_open
    if getattr(st, "safe_open", None) is orig:
        st.safe_open = safe_open  # load_file() looks it up here


def _install():
    _install_safetensors()
