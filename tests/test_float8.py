"""float8 and float4 dtypes on tpu against PyTorch CPU: casts bit for bit (every
bfloat16 input, a float32 sweep of boundaries, halfway cases and specials),
creation, copies, views, indexing, cat, the element-wise ops CPU allows,
refusals, and torch._scaled_mm per tensor, per row and with MX block scales."""
import math

import pytest
import torch

import torch_tpu  # noqa: F401

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
      torch.float8_e8m0fnu]
F4 = torch.float4_e2m1fn_x2
DEV = "tpu"


def bits(t):
    return t.cpu().contiguous().view(torch.uint8)


def all_codes(dt):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)


def float_bits_equal(a, b):
    """Equal bit patterns, except that any NaN matches any NaN (CPU's NaN payloads
    differ between its own scalar and vector conversions)."""
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a.double()), torch.isnan(b.double())
    assert torch.equal(nan_a, nan_b)
    ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ok = (a.view(ib) == b.view(ib)) | nan_a
    bad = (~ok).nonzero().flatten()[:5]
    assert bool(ok.all()), f"{len((~ok).nonzero())} differ, first at {bad.tolist()}: " \
                           f"{a[bad].tolist()} vs {b[bad].tolist()}"


def f32_sweep():
    """Every float8 value of every format, the midpoints between neighbours and the
    floats just beside them, powers of two across float32's range (subnormals
    included), the formats' overflow points, specials, and random bit patterns."""
    vals = []
    for dt in F8:
        v = all_codes(dt).float()
        v = v[torch.isfinite(v)].unique()
        vals.append(v)
        mid = (v[1:].double() + v[:-1].double()) / 2
        mid = mid.float()
        vals += [mid, torch.nextafter(mid, torch.full_like(mid, math.inf)),
                 torch.nextafter(mid, torch.full_like(mid, -math.inf))]
        top = v.abs().max()
        vals.append(torch.tensor([float(top) * f for f in (1.03125, 1.0625, 1.125, 1.5, 2, 4)]))
    vals.append(torch.tensor([2.0 ** e for e in range(-149, 128)]))
    vals.append(torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, 464.0, 480.0,
                              240.0, 248.0, 256.0, 57344.0, 61440.0, 65536.0, 3.4e38, 1e-45]))
    vals.append(torch.tensor([0x7fc00000, 0x7f800001, 0xffc00000 - 2 ** 32, 0x7fa00000,
                              0x00400000, 0x00000001, 0x3fc00000, 0x3fa00000, 0x3fe00000],
                             dtype=torch.int64).to(torch.int32).view(torch.float32))
    g = torch.Generator().manual_seed(0)
    vals.append(torch.randint(-2 ** 31, 2 ** 31, (1 << 18,), generator=g,
                              dtype=torch.int64).to(torch.int32).view(torch.float32))
    vals.append(torch.randn(1 << 16, generator=g) * 100)
    v = torch.cat([x.float().flatten() for x in vals])
    return torch.cat([v, -v])


# ---- casts ----

@pytest.mark.parametrize("dt", F8, ids=str)
def test_cast_every_bfloat16(dt):
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    ref = x.to(dt)
    got = x.to(DEV).to(dt)
    assert got.device.type == DEV and got.dtype == dt
    assert torch.equal(bits(got), bits(ref))


@pytest.mark.parametrize("dt", F8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.float64], ids=str)
def test_cast_float_sweep(dt, src):
    x = f32_sweep().to(src)
    assert torch.equal(bits(x.to(DEV).to(dt)), bits(x.to(dt)))


@pytest.mark.parametrize("dt", F8, ids=str)
@pytest.mark.parametrize("to", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=str)
def test_decode_every_code(dt, to):
    x = all_codes(dt)
    float_bits_equal(x.to(DEV).to(to), x.to(to))
    if to == torch.float32:  # the exact float32 bits, NaN payloads included
        assert torch.equal(x.to(DEV).float().cpu().view(torch.int32), x.float().view(torch.int32))


@pytest.mark.parametrize("dt", F8, ids=str)
@pytest.mark.parametrize("other", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                   torch.bool], ids=str)
def test_cast_integers(dt, other):
    codes = all_codes(dt)
    got, ref = codes.to(DEV).to(other), codes.to(other)
    finite = torch.isfinite(codes.float())
    if other != torch.bool:
        # NaN -> integer is undefined in C++; compare where CPU is defined
        assert torch.equal(got.cpu()[finite], ref[finite])
    else:
        assert torch.equal(got.cpu(), ref)
    if other == torch.bool:
        vals = torch.tensor([0, 1], dtype=torch.bool)
    elif other == torch.uint8:
        vals = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    else:
        vals = torch.cat([torch.arange(-600, 601), torch.tensor([1 << 20, -(1 << 24) - 1, 65535,
                                                                  57344, 61439, 61440])])
        vals = vals.to(other) if other == torch.int64 else vals.clamp(
            torch.iinfo(other).min, torch.iinfo(other).max).to(other)
    assert torch.equal(bits(vals.to(DEV).to(dt)), bits(vals.to(dt)))


@pytest.mark.parametrize("dt", F8, ids=str)
@pytest.mark.parametrize("to", F8, ids=str)
def test_cast_between_float8(dt, to):
    x = all_codes(dt)
    assert torch.equal(bits(x.to(DEV).to(to)), bits(x.to(to)))


@pytest.mark.parametrize("dt", F8, ids=str)
def test_copy_and_move_keep_bits(dt):
    x = all_codes(dt).reshape(16, 16)
    d = x.to(DEV)
    assert torch.equal(bits(d), bits(x))  # to device and back
    assert torch.equal(bits(d.t().contiguous()), bits(x.t().contiguous()))  # strided copy
    assert torch.equal(bits(d.clone()), bits(x))
    e = torch.empty(16, 16, dtype=dt, device=DEV)
    e.copy_(d.t())
    assert torch.equal(bits(e), bits(x.t()))
    f = torch.empty(16, 16, dtype=torch.float32, device=DEV)
    f.copy_(d)
    float_bits_equal(f, x.float())
    g = torch.empty(16, 16, dtype=dt, device=DEV)
    g.copy_(f)  # float32 -> float8 through copy_
    assert torch.equal(bits(g), bits(x.float().to(dt)))
    g2 = torch.empty(16, 16, dtype=dt, device=DEV).copy_(x)  # cpu float8 -> tpu
    assert torch.equal(bits(g2), bits(x))


# ---- creation ----

@pytest.mark.parametrize("dt", F8, ids=str)
def test_creation(dt):
    assert torch.empty(3, 5, dtype=dt, device=DEV).shape == (3, 5)
    for make in (lambda d: torch.zeros(4, 3, dtype=dt, device=d),
                 lambda d: torch.ones(4, 3, dtype=dt, device=d),
                 lambda d: torch.full((4, 3), 3.3, dtype=dt, device=d),
                 lambda d: torch.full((7,), 0.3, dtype=dt, device=d),
                 lambda d: torch.zeros(2, dtype=dt, device=d).fill_(2.5),
                 lambda d: torch.ones(5, dtype=dt, device=d).zero_(),
                 lambda d: torch.zeros_like(torch.ones(3, dtype=dt, device=d)),
                 lambda d: torch.full_like(torch.ones(3, dtype=dt, device=d), 0.75)):
        got, ref = make(DEV), make("cpu")
        assert got.device.type == DEV and got.dtype == dt
        assert torch.equal(bits(got), bits(ref))


def test_float4_container():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    x = raw.view(F4)
    d = x.to(DEV)
    assert d.dtype == F4 and torch.equal(bits(d), raw)
    assert torch.equal(bits(d.t().contiguous()), raw.t().contiguous())
    assert torch.equal(bits(d.clone()), raw)
    assert torch.equal(bits(torch.zeros(3, 4, dtype=F4, device=DEV)), torch.zeros(3, 4, dtype=torch.uint8))
    assert torch.equal(bits(torch.cat([d, d[:3]])), torch.cat([raw, raw[:3]]))
    assert torch.equal(bits(torch.stack([d, d.t()])), torch.stack([raw, raw.t()]))
    m = (raw % 3 == 0)
    assert torch.equal(bits(torch.where(m.to(DEV), d, d.t())), bits(torch.where(m, x, x.t())))
    assert torch.equal((d == d.t()).cpu(), x == x.t())
    assert torch.equal((d != d.t()).cpu(), x != x.t())
    assert torch.equal(d.view(torch.uint8).cpu(), raw)
    assert torch.equal(bits(raw.to(DEV).view(F4)), raw)
    e = torch.empty(16, 16, dtype=F4, device=DEV)
    e.copy_(d.t())
    assert torch.equal(bits(e), raw.t())
    # what CPU refuses, tpu refuses
    assert torch.equal(bits(d.index_select(0, torch.tensor([3, 1], device=DEV))), raw[[3, 1]])
    assert torch.equal(bits(d.flip(0)), raw.flip(0))
    for bad in (lambda t: t.float(), lambda t: torch.ones(2, dtype=F4, device=t.device),
                lambda t: t[torch.tensor([0, 2], device=t.device)],
                lambda t: t.to(torch.float8_e4m3fn)):
        with pytest.raises((NotImplementedError, RuntimeError)):
            bad(x)
        with pytest.raises((NotImplementedError, RuntimeError), match="Float4_e2m1fn_x2"):
            bad(d)


# ---- views, indexing, shape ops ----

def _pair(dt, shape=(6, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 4).to(dt)
    return x, x.to(DEV)


@pytest.mark.parametrize("dt", F8, ids=str)
def test_views(dt):
    x, d = _pair(dt)
    for f in (lambda t: t.view(torch.uint8), lambda t: t.view(torch.int8),
              lambda t: t.reshape(4, 12), lambda t: t.t(), lambda t: t[1:5:2, ::3],
              lambda t: t.transpose(0, 1)[2], lambda t: t.unsqueeze(0).expand(3, 6, 8),
              lambda t: t.view(torch.bfloat16), lambda t: t.view(torch.float32),
              lambda t: t.flatten()[3:40:5], lambda t: t.narrow(1, 2, 4), lambda t: t.diagonal(),
              lambda t: t.unfold(1, 3, 2), lambda t: t.as_strided((3, 3), (2, 5), 1)):
        got, ref = f(d), f(x)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(bits(got) if got.element_size() == 1 else got.cpu().view(torch.uint8),
                           bits(ref) if ref.element_size() == 1 else ref.view(torch.uint8))
    u = torch.arange(48, dtype=torch.int32).to(torch.uint8).reshape(6, 8)
    assert torch.equal(bits(u.to(DEV).view(dt)), bits(u.view(dt)))


@pytest.mark.parametrize("dt", F8, ids=str)
def test_indexing(dt):
    x, d = _pair(dt)
    idx = torch.tensor([4, 0, 4, 2])
    mask = torch.tensor([True, False, True, True, False, True])
    cases = [lambda t, i, m: t.index_select(0, i), lambda t, i, m: t.index_select(1, i),
             lambda t, i, m: t[i], lambda t, i, m: t[:, i], lambda t, i, m: t[m],
             lambda t, i, m: t[i, i + 1], lambda t, i, m: t.t()[i],
             lambda t, i, m: t.masked_select(m.unsqueeze(1))]
    for f in cases:
        assert torch.equal(bits(f(d, idx.to(DEV), mask.to(DEV))), bits(f(x, idx, mask)))
    if dt != torch.float8_e8m0fnu:  # CPU's index_put has no e8m0 kernel
        y, dy = _pair(dt, (2, 8), seed=1)
        a, b = x.clone(), d.clone()
        a[torch.tensor([1, 3])] = y
        b[torch.tensor([1, 3], device=DEV)] = dy
        assert torch.equal(bits(b), bits(a))
        a[mask] = x[0].unsqueeze(0).expand(4, 8)
        b[mask.to(DEV)] = d[0].unsqueeze(0).expand(4, 8)
        assert torch.equal(bits(b), bits(a))
        a.index_put_((torch.tensor([0, 0, 5]),), y[0, :3].reshape(3, 1), accumulate=True)
        b.index_put_((torch.tensor([0, 0, 5], device=DEV),), dy[0, :3].reshape(3, 1),
                     accumulate=True)
        assert torch.equal(bits(b), bits(a))
    else:
        with pytest.raises((NotImplementedError, RuntimeError), match="Float8_e8m0fnu"):
            d[torch.tensor([1], device=DEV)] = d[:1]


@pytest.mark.parametrize("dt", F8, ids=str)
def test_cat_stack_where_compare(dt):
    x, d = _pair(dt)
    y, dy = _pair(dt, seed=2)
    assert torch.equal(bits(torch.cat([d, dy[:2], d[:, :0].reshape(0, 8)])),
                       bits(torch.cat([x, y[:2], x[:, :0].reshape(0, 8)])))
    assert torch.equal(bits(torch.cat([d.t(), dy.t()], 1)), bits(torch.cat([x.t(), y.t()], 1)))
    assert torch.equal(bits(torch.stack([d, dy], 1)), bits(torch.stack([x, y], 1)))
    m = torch.rand(6, 8, generator=torch.Generator().manual_seed(3)) > 0.5
    assert torch.equal(bits(torch.where(m.to(DEV), d, dy)), bits(torch.where(m, x, y)))
    c = all_codes(dt)
    dc = c.to(DEV)
    rev = torch.arange(255, -1, -1)
    assert torch.equal((dc == dc[rev.to(DEV)]).cpu(), c == c[rev])
    assert torch.equal(bits(d.flip(0)), bits(x.flip(0)))  # CPU flips float8 along dim 0 only
    assert torch.equal((dc == dc).cpu(), c == c)  # NaN != NaN, -0 == 0
    assert torch.equal((dc != dc).cpu(), c != c)
    assert torch.equal(dc.isnan().cpu(), c.isnan())
    assert torch.equal(d, d.clone()) == torch.equal(x, x.clone())
    assert torch.equal(bits(torch.roll(d, 3, 1)), bits(torch.roll(x, 3, 1)))
    assert torch.equal(bits(d.repeat(2, 1)), bits(x.repeat(2, 1)))
    assert torch.equal(bits(d.narrow_copy(0, 1, 3)), bits(x.narrow_copy(0, 1, 3)))
    if dt != torch.float8_e8m0fnu:
        assert torch.equal(bits(torch.nn.functional.pad(d, (1, 2))),
                           bits(torch.nn.functional.pad(x, (1, 2))))
        # CPU's abs keeps -0 and NaN payloads in its vectorized loop, not in its scalar one
        torch.testing.assert_close(dc.abs().cpu().float(), c.abs().float(), rtol=0, atol=0,
                                   equal_nan=True)
    assert d[1, 2].item() == x[1, 2].item() or math.isnan(x[1, 2].item())
    assert repr(d.cpu()) == repr(x)
    assert str(d).startswith("tensor(")


@pytest.mark.parametrize("dt", F8[:4], ids=str)
def test_mm(dt):
    """CPU multiplies float8 matrices (float32 sums, one rounding); small integers keep the
    sums exact, so the bits must match."""
    g = torch.Generator().manual_seed(4)
    a = torch.randint(-3, 4, (9, 40), generator=g).float().to(dt)
    b = torch.randint(-3, 4, (40, 7), generator=g).float().to(dt)
    assert torch.equal(bits(a.to(DEV) @ b.to(DEV)), bits(a @ b))
    assert torch.equal(bits(a.to(DEV) @ b.t().contiguous().to(DEV).t()), bits(a @ b))


def test_defer_and_fuse_mode():
    """The same casts and moves under DeferAndFuse (placeholders resolved by the trace)."""
    from conftest import run_python
    code = ("import torch\n"
            "x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)\n"
            "ok = True\n"
            "for dt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):\n"
            "    d = x.to('tpu').to(dt)\n"
            "    e = torch.cat([d[::2], d[1::2]]).view(torch.uint8)\n"
            "    r = torch.cat([x.to(dt)[::2], x.to(dt)[1::2]]).view(torch.uint8)\n"
            "    ok = ok and torch.equal(e.cpu(), r) and torch.equal(d.float().cpu().isnan(), x.to(dt).float().isnan())\n"
            "print('OK' if ok else 'MISMATCH')\n")
    r = run_python(code, env={"TORCH_TPU_DEFER_AND_FUSE": "1"})
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e8m0fnu], ids=str)
def test_refusals_name_op_and_dtype(dt):
    x, d = _pair(dt)
    i = torch.tensor([[0, 1]])
    # CPU refuses these for float8; so does tpu, naming the dtype
    for f in (lambda t: t.sum(), lambda t: t + t, lambda t: t.gather(0, i.to(t.device)),
              lambda t: t.sort(), lambda t: t.masked_fill(t != t, 1.0),
              lambda t: torch.exp(t)):
        with pytest.raises((NotImplementedError, RuntimeError)):
            f(x)
        with pytest.raises((NotImplementedError, RuntimeError), match=str(dt).split(".")[1].replace("float8", "Float8")):
            f(d)
    # promotion with other dtypes is refused before any kernel
    with pytest.raises(RuntimeError, match="Promotion for Float8 Types is not supported"):
        torch.cat([d, d.float()])


# ---- _scaled_mm ----

def _fp8_operands(m, k, n, dt_a=torch.float8_e4m3fn, dt_b=torch.float8_e4m3fn, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 3).to(dt_a)
    b = (torch.randn(n, k, generator=g) * 3).to(dt_b).t()  # column-major, as cuBLAS wants
    return a, b


def _close(got, ref, k):
    got, ref = got.cpu().double(), ref.double()
    tol = 2e-6 * k * ref.abs().max().clamp_min(1)
    assert got.shape == ref.shape
    diff = (got - ref).abs()
    if got.dtype in (torch.float64,) and ref.numel():
        assert float(diff.max()) <= float(tol) + 1e-2 * float(ref.abs().max()), float(diff.max())


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16,
                                       torch.float8_e4m3fn, None], ids=str)
@pytest.mark.parametrize("mode", ["tensor", "row"])
def test_scaled_mm_vs_cpu(out_dtype, mode):
    m, k, n = 33, 96, 48
    a, b = _fp8_operands(m, k, n)
    g = torch.Generator().manual_seed(5)
    if mode == "tensor":
        sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    else:
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    kw = {} if out_dtype is None else {"out_dtype": out_dtype}
    ref = torch._scaled_mm(a, b, sa, sb, **kw)
    got = torch._scaled_mm(a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV), **kw)
    assert got.dtype == ref.dtype and got.shape == ref.shape and got.device.type == DEV
    ref64 = (a.double() * sa.double()) @ (b.double() * sb.double())
    if ref.dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5 * float(ref64.abs().max()))
    else:
        # one rounding of the float32 sum to the output dtype: equal to CPU's but where
        # the float32 sums straddle a rounding boundary (rare)
        same = (bits(got) == bits(ref)) if ref.element_size() == 1 else \
            (got.cpu().view(torch.int16) == ref.view(torch.int16))
        assert float(same.float().mean()) > 0.97
        torch.testing.assert_close(got.cpu().double(), ref.double(), rtol=0.13, atol=1e-3)


def test_scaled_mm_bias_layouts_formats():
    m, k, n = 16, 64, 32
    for dt_a, dt_b in [(torch.float8_e4m3fn, torch.float8_e5m2),
                       (torch.float8_e5m2, torch.float8_e5m2),
                       (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz)]:
        a, b = _fp8_operands(m, k, n, dt_a, dt_b, seed=3)
        one = torch.tensor(1.0)
        for bias in (None, torch.randn(n), torch.randn(n).bfloat16()):
            out_dtype = torch.float32 if bias is None or bias.dtype == torch.float32 else torch.bfloat16
            ref = torch._scaled_mm(a, b, one, one, bias=bias, out_dtype=out_dtype)
            got = torch._scaled_mm(a.to(DEV), b.to(DEV), one.to(DEV), one.to(DEV),
                                   bias=None if bias is None else bias.to(DEV), out_dtype=out_dtype)
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-2, atol=1e-2)
    # b row-major (CPU accepts it), empty K, scale_result with a float8 output
    a, b = _fp8_operands(m, k, n)
    one = torch.tensor(1.0)
    ref = torch._scaled_mm(a, b.contiguous(), one, one, out_dtype=torch.float32)
    got = torch._scaled_mm(a.to(DEV), b.contiguous().to(DEV), one.to(DEV), one.to(DEV),
                           out_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), ref)
    sr = torch.tensor(4.0)
    ref = torch._scaled_mm(a, b, one, one, scale_result=sr, out_dtype=torch.float8_e4m3fn)
    got = torch._scaled_mm(a.to(DEV), b.to(DEV), one.to(DEV), one.to(DEV), scale_result=sr.to(DEV),
                           out_dtype=torch.float8_e4m3fn)
    assert float((bits(got) == bits(ref)).float().mean()) > 0.97
    z = torch._scaled_mm(a[:, :0].to(DEV), b[:0].to(DEV), one.to(DEV), one.to(DEV),
                         out_dtype=torch.float32)
    assert torch.equal(z.cpu(), torch.zeros(m, n))


def test_scaled_mm_errors():
    a, b = _fp8_operands(16, 32, 16)
    d = dict(out_dtype=torch.float32)
    with pytest.raises(RuntimeError):  # a bfloat16 scale, as on CPU
        torch._scaled_mm(a.to(DEV), b.to(DEV), torch.tensor(1.0).bfloat16().to(DEV),
                         torch.tensor(1.0).to(DEV), **d)
    with pytest.raises(RuntimeError):  # not float8 inputs
        torch._scaled_mm(a.float().to(DEV), b.to(DEV), torch.tensor(1.0).to(DEV),
                         torch.tensor(1.0).to(DEV), **d)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        torch._scaled_mm(a.to(DEV), b[:16].to(DEV), torch.tensor(1.0).to(DEV),
                         torch.tensor(1.0).to(DEV), **d)


def _mx_reference(a, b, sa_plain, sb_plain, block):
    """float64 product of a (M x K) and b (K x N) with per-(row, k block) scales."""
    af = a.double() * sa_plain.double().repeat_interleave(block, 1)[:, :a.shape[1]]
    bf = b.double() * sb_plain.double().repeat_interleave(block, 1)[:, :b.shape[0]].t()
    return af @ bf


def _unpack_fp4(packed):
    """float4_e2m1fn_x2 bytes (M x K/2) -> values (M x K): element 2i in the low nibble."""
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
    u = packed.view(torch.uint8).long()
    return torch.stack([lut[u & 15], lut[u >> 4]], -1).reshape(u.shape[0], -1)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(40, 128, 136), (3, 1040, 70), (1, 96, 33), (20, 64, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_blockwise(fmt, shape):
    """MX block scales (block 32 along K, float8_e8m0fnu) and NVFP4's (block 16,
    float8_e4m3fn) in the swizzled layout cuBLAS takes (to_blocked); CPU has no
    kernel for these, so the reference is float64. K = 1040 splits into k blocks of
    347 steps: float4 k blocks that start in the middle of a byte; M = 1 and N = 1 run
    the matrix-vector path."""
    from torch.testing._internal.common_quantized import to_blocked
    m, k, n = shape
    g = torch.Generator().manual_seed(7)
    block = 16 if fmt == "nvfp4" else 32
    if fmt == "mxfp8":
        a, b = _fp8_operands(m, k, n)
        a_val, b_val = a.double(), b.double()
        a_dev, b_dev = a.to(DEV), b.to(DEV)
    else:
        ap = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        bp = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        a_val, b_val = _unpack_fp4(ap), _unpack_fp4(bp).t()
        a_dev = ap.view(F4).to(DEV)
        b_dev = bp.view(F4).to(DEV).t()
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    kb = (k + block - 1) // block
    if sdt == torch.float8_e8m0fnu:
        sa = torch.randint(120, 134, (m, kb), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
        sb = torch.randint(120, 134, (n, kb), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
    else:
        sa = (torch.rand(m, kb, generator=g) + 0.25).to(sdt)
        sb = (torch.rand(n, kb, generator=g) + 0.25).to(sdt)
    ref = _mx_reference(a_val, b_val, sa.float(), sb.float(), block)
    for out_dtype in (torch.float32, torch.bfloat16):
        got = torch._scaled_mm(a_dev, b_dev, to_blocked(sa).to(DEV), to_blocked(sb).to(DEV),
                               out_dtype=out_dtype)
        assert got.shape == (m, n) and got.dtype == out_dtype
        tol = 1e-5 if out_dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.cpu().double(), ref, rtol=tol, atol=tol * float(ref.abs().max()))


def _peak_rss_reset():
    """Resets the process's peak resident set (VmHWM) and returns the current size in
    bytes; None where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_bytes("VmRSS")


def _status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8"])
def test_scaled_mm_large_weight_no_float32_copy(fmt):
    """A 4096 x 8192 weight: its float32 copy would take 128 MiB. The GEMM decodes the
    codes (and their scales) while it packs its panels, so neither device memory nor the
    process's peak resident set grows by anything near that: device memory holds the
    inputs and the output only, and the host scratch is the GEMM's packed blocks."""
    from torch.testing._internal.common_quantized import to_blocked
    m, k, n = 64, 8192, 4096
    g = torch.Generator().manual_seed(11)
    if fmt == "fp8":
        a = (torch.randn(m, k, generator=g)).to(torch.float8_e4m3fn).to(DEV)
        b = (torch.randn(n, k, generator=g)).to(torch.float8_e4m3fn).to(DEV).t()
        sa, sb = torch.tensor(0.5).to(DEV), torch.tensor(2.0).to(DEV)
    else:
        block, sdt = (16, torch.float8_e4m3fn) if fmt == "nvfp4" else (32, torch.float8_e8m0fnu)
        a = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8).view(F4).to(DEV)
        b = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8).view(F4).to(DEV).t()
        sa = to_blocked(torch.full((m, k // block), 0.5).to(sdt)).to(DEV)
        sb = to_blocked(torch.full((n, k // block), 2.0).to(sdt)).to(DEV)
    torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)  # threads and pools started
    torch.tpu.synchronize()
    f32_copy = n * k * 4
    torch.tpu.reset_peak_memory_stats()
    base_dev = torch.tpu.memory_allocated()
    rss0 = _peak_rss_reset()
    out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    torch.tpu.synchronize()
    rss_growth = None if rss0 is None else _status_bytes("VmHWM") - rss0
    dev_growth = torch.tpu.max_memory_allocated() - base_dev
    assert dev_growth <= m * n * 4 + (1 << 20), dev_growth
    if rss_growth is not None:
        print(f"{fmt}: peak resident set +{rss_growth / 2**20:.1f} MiB, device memory "
              f"+{dev_growth / 2**20:.1f} MiB (a float32 copy of the weight: {f32_copy / 2**20:.0f} MiB)")
        assert rss_growth < f32_copy // 4, (rss_growth, f32_copy)
    # values: the first rows against a float64 reference of the decoded operands
    if fmt == "fp8":
        ref = (a[:4].cpu().double() * 0.5) @ (b.cpu().double() * 2.0)
    else:
        ref = _unpack_fp4(a[:4].cpu()) @ _unpack_fp4(b.t().cpu()).t()  # scales multiply to 1
    torch.testing.assert_close(out[:4].cpu().double(), ref, rtol=1e-5, atol=1e-3)


# ---- torch.nn.functional.scaled_mm (_scaled_mm_v2) ----

def _v2(*args, **kw):
    from torch.nn.functional import scaled_mm
    return scaled_mm(*args, **kw)


def _to_dev(x):
    if isinstance(x, torch.Tensor):
        return x.to(DEV)
    if isinstance(x, list):
        return [_to_dev(y) for y in x]
    return x


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, None],
                         ids=str)
def test_scaled_mm_v2_vs_cpu(out_dtype):
    """TensorWise and RowWise recipes, bias, contraction dims: CPU's results and dtypes
    (the v2 default output dtype is bfloat16, not mat_a's)."""
    from torch.nn.functional import ScalingType as S
    m, k, n = 33, 96, 48
    a, b = _fp8_operands(m, k, n)
    g = torch.Generator().manual_seed(9)
    kw = {} if out_dtype is None else {"output_dtype": out_dtype}
    cases = [
        (a, b, torch.tensor(0.75), S.TensorWise, torch.tensor(1.5), S.TensorWise, {}),
        (a, b, torch.rand(m, 1, generator=g) + 0.5, S.RowWise,
         torch.rand(1, n, generator=g) + 0.5, S.RowWise, {}),
        # contraction dims are checked against the sizes, the product stays a @ b (CPU's)
        (a, b, torch.tensor(2.0), S.TensorWise, torch.tensor(0.5), S.TensorWise,
         {"contraction_dim": [1, 0]}),
    ]
    if out_dtype in (torch.float32, torch.bfloat16):
        cases.append((a, b, torch.tensor(1.0), S.TensorWise, torch.tensor(1.0), S.TensorWise,
                      {"bias": torch.randn(n, generator=g).to(out_dtype)}))
    for ma, mb, sa, ra, sb, rb, extra in cases:
        ref = _v2(ma, mb, sa, ra, sb, rb, **kw, **extra)
        got = _v2(ma.to(DEV), mb.to(DEV), sa.to(DEV), ra, sb.to(DEV), rb, **kw,
                  **{k2: _to_dev(v) for k2, v in extra.items()})
        assert got.dtype == ref.dtype and got.shape == ref.shape == (m, n)
        if ref.dtype == torch.float32:
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-4)
        else:
            same = (bits(got) == bits(ref)) if ref.element_size() == 1 else \
                (got.cpu().view(torch.int16) == ref.view(torch.int16))
            assert float(same.float().mean()) > 0.97


def test_scaled_mm_v2_errors_as_cpu():
    from torch.nn.functional import ScalingType as S
    a, b = _fp8_operands(16, 32, 16)
    one = torch.tensor(1.0)
    bad = [
        ((a, b, one, S.TensorWise, torch.ones(1, 16), S.RowWise), ValueError,
         "Invalid scaling configuration"),
        ((a.bfloat16(), b.bfloat16(), one, S.TensorWise, one, S.TensorWise), ValueError,
         "Invalid scaling configuration"),
        ((a, b, one, S.TensorWise, one, S.TensorWise), ValueError, "with contraction dims"),
        ((a, b[:16], one, S.TensorWise, one, S.TensorWise), ValueError, r"\(16x32 and 16x16\)$"),
    ]
    for i, (args, exc, msg) in enumerate(bad):
        kw = {"contraction_dim": [0, 0]} if i == 2 else {}  # 16 rows of a, 32 of b
        with pytest.raises(exc, match=msg):
            _v2(*args, **kw)
        with pytest.raises(exc, match=msg):
            _v2(*[_to_dev(x) for x in args], **kw)
    # the device keeps working
    got = _v2(a.to(DEV), b.to(DEV), one.to(DEV), S.TensorWise, one.to(DEV), S.TensorWise,
              output_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), _v2(a, b, one, S.TensorWise, one, S.TensorWise,
                                               output_dtype=torch.float32))


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4", "nvfp4_two_level"])
def test_scaled_mm_v2_block_scaled(fmt):
    """MX (BlockWise1x32) and NVFP4 (BlockWise1x16, optionally with a TensorWise global
    scale per operand: the product times both, then the bias) with SWIZZLE_32_4_4
    scales, against a float64 reference (CPU has no kernel for these); unswizzled
    block scales raise CUDA's ValueError."""
    from torch.nn.functional import ScalingType as S, SwizzleType as W
    from torch.testing._internal.common_quantized import to_blocked
    m, k, n = 40, 128, 72
    g = torch.Generator().manual_seed(11)
    block = 32 if fmt.startswith("mx") else 16
    if fmt == "mxfp8":
        a, b = _fp8_operands(m, k, n)
        a_val, b_val, a_dev, b_dev = a.double(), b.double(), a.to(DEV), b.to(DEV)
    else:
        ap = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        bp = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        a_val, b_val = _unpack_fp4(ap), _unpack_fp4(bp).t()
        a_dev, b_dev = ap.view(F4).to(DEV), bp.view(F4).to(DEV).t()
    sdt = torch.float8_e8m0fnu if fmt.startswith("mx") else torch.float8_e4m3fn
    if sdt == torch.float8_e8m0fnu:
        sa = torch.randint(120, 134, (m, k // block), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
        sb = torch.randint(120, 134, (n, k // block), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
    else:
        sa = (torch.rand(m, k // block, generator=g) + 0.25).to(sdt)
        sb = (torch.rand(n, k // block, generator=g) + 0.25).to(sdt)
    ref = _mx_reference(a_val, b_val, sa.float(), sb.float(), block)
    recipe = S.BlockWise1x32 if fmt.startswith("mx") else S.BlockWise1x16
    scale_a, scale_b = [to_blocked(sa).to(DEV)], [to_blocked(sb).to(DEV)]
    recipe_a, swz = [recipe], [W.SWIZZLE_32_4_4]
    bias = torch.randn(n, generator=g).bfloat16()
    if fmt == "nvfp4_two_level":
        scale_a.append(torch.tensor(0.25).to(DEV))
        scale_b.append(torch.tensor(3.0).to(DEV))
        recipe_a, swz = [recipe, S.TensorWise], [W.SWIZZLE_32_4_4, W.NO_SWIZZLE]
        ref = ref * 0.75
    ref = ref + bias.double()
    got = _v2(a_dev, b_dev, scale_a, recipe_a, scale_b, list(recipe_a), swizzle_a=swz,
              swizzle_b=list(swz), bias=bias.to(DEV), output_dtype=torch.bfloat16)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-2, atol=1e-2 * float(ref.abs().max()))
    with pytest.raises(ValueError, match="SWIZZLE_32_4_4"):
        _v2(a_dev, b_dev, scale_a[:1], [recipe], scale_b[:1], [recipe], output_dtype=torch.bfloat16)
