"""Helpers comparing an op on tpu against PyTorch's CPU result."""
import pytest
import torch

FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


def make(shape, dtype, low=-3, high=3, seed=0, noncontig=False):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_floating_point:
        t = (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    else:
        lo = 0 if dtype == torch.uint8 else low
        t = torch.randint(lo, high + 1, shape, generator=g).to(dtype)
    if noncontig and t.dim() >= 2:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, column-major
    return t


def crand(shape, dtype=torch.complex64, seed=0, scale=1.0):
    """Complex values with independent standard normal parts (times scale), made in float64."""
    g = torch.Generator().manual_seed(seed)
    re = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    im = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return torch.complex(re, im).to(dtype)


def gelu(x, approximate="none"):
    """F.gelu; on CPU, for float32 and narrower, computed in float64 and rounded back: PyTorch's
    AVX-512 kernels return NaN for gelu(+inf) (its AVX2 and float64 paths give inf), so the
    reference would depend on the machine."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.nn.functional.gelu(x.double(), approximate=approximate).to(x.dtype)
    return torch.nn.functional.gelu(x, approximate=approximate)


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.to("tpu")
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(v) for v in x)
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def assert_same(actual, expected, atol=None, rtol=None, check_stride=True, equal_nan=True):
    """actual: tpu result (tensor/tuple); expected: CPU result."""
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol, rtol, check_stride, equal_nan)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.device.type == "tpu", actual.device
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if check_stride and expected.numel() > 1:
        assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    kw = {}
    if atol is not None:
        kw = dict(atol=atol, rtol=rtol if rtol is not None else 0)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=equal_nan, **kw)


def check_op(fn, *inputs, grad=False, atol=None, rtol=None, check_stride=True, grad_atol=None):
    """Runs fn on CPU inputs and on their tpu copies; compares outputs and,
    with grad=True, the gradients of floating and complex inputs for one
    upstream grad (complex where the output is: PyTorch's Wirtinger convention)."""
    def differentiable(x):
        return grad and (x.is_floating_point() or x.is_complex())
    cpu_in = [x.detach().clone().requires_grad_(differentiable(x))
              if isinstance(x, torch.Tensor) else x for x in inputs]
    tpu_in = [x.detach().to("tpu").requires_grad_(differentiable(x))
              if isinstance(x, torch.Tensor) else x for x in inputs]
    try:
        expected = fn(*cpu_in)
    except Exception as e:  # CPU refuses: tpu must refuse with the same exception type
        try:
            out = fn(*tpu_in)  # kept alive: DeferAndFuse drops work nobody can observe
            torch.tpu.synchronize()  # kernel errors surface at synchronization
            del out
        except type(e):
            return None
        raise AssertionError(f"CPU raised {type(e).__name__}: {e}; tpu did not")
    actual = fn(*tpu_in)
    assert_same(actual, expected, atol, rtol, check_stride)
    if grad:
        outs_c = expected if isinstance(expected, (list, tuple)) else [expected]
        outs_t = actual if isinstance(actual, (list, tuple)) else [actual]
        pairs = [(c, t) for c, t in zip(outs_c, outs_t) if c.requires_grad]
        g = torch.Generator().manual_seed(7)
        ups = [torch.randn(c.shape, generator=g, dtype=torch.complex128 if c.is_complex()
                           else torch.float64).to(c.dtype) for c, _ in pairs]
        torch.autograd.backward([c for c, _ in pairs], ups)
        torch.autograd.backward([t for _, t in pairs], [u.to("tpu") for u in ups])
        for c, t in zip(cpu_in, tpu_in):
            if isinstance(c, torch.Tensor) and c.requires_grad:
                assert t.grad is not None, "no gradient reached the tpu input"
                a = grad_atol if grad_atol is not None else atol
                assert_same(t.grad, c.grad, a, rtol if a is not None else None, check_stride=False)
    return actual


def raises_like_cpu(fn, *args, match=None):
    """CPU raises; tpu raises the same exception type (at the op or at the
    next synchronization) with a message naming the problem."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    dev = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(type(cpu.value), match=match):
        out = fn(*dev)
        torch.tpu.synchronize()
        del out
