"""The narrow and unsigned dtypes on the pjrt target (XLA's CPU plugin): float8 (all five
formats) and float4_e2m1fn_x2 tensors live on the device, move, view, index and concatenate;
casts give PyTorch CPU's bits (e4m3fn saturates at +-448, e8m0fnu takes the exponent with
PyTorch's rounding, NaNs keep their sign), though XLA's own convert does neither; floats to
narrow integers wrap as on CPU; uint16/32/64 sort as unsigned; and `_scaled_mm` with
per-tensor and per-row scales matches CPU's within its float32 accumulation."""
from tests.test_pjrt_target import pytestmark, run_pjrt  # noqa: F401  (the skip mark)

FORMATS = """
F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
      torch.float8_e8m0fnu]

def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)

def same_bits(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    g, w = bits(got.cpu()), bits(want)
    bad = (g != w).nonzero().flatten()
    assert bad.numel() == 0, (what, bad.numel(), [(int(i), hex(int(w[i])), hex(int(g[i])))
                                                   for i in bad[:5]])
"""


def run(code):
    run_pjrt(FORMATS + code)


def test_float8_casts_are_bit_identical_to_cpu():
    run("""
every_bf16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
g = torch.Generator().manual_seed(0)
sweep = torch.randn(50000, generator=g) * torch.logspace(-45, 38, 50000, base=2.0)
sweep = torch.cat([sweep, torch.tensor([0.0, -0.0, 448.0, 464.0, 480.0, -479.9, 57344.0, 61440.0,
                                        65536.0, 240.0, 248.0, float("inf"), -float("inf"),
                                        float("nan"), -float("nan"), 2.0 ** -127, 1.5, 3.0])])
for dt in F8:
    for src in (every_bf16, sweep, sweep.double()):
        same_bits(src.to("tpu").to(dt), src.to(dt), f"{src.dtype} -> {dt}")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)
    dev = codes.to("tpu")
    same_bits(dev, codes, f"{dt} round trip")
    for wide in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        torch.testing.assert_close(dev.to(wide).cpu(), codes.to(wide), rtol=0, atol=0,
                                   equal_nan=True)
    for other in F8:
        same_bits(dev.to(other), codes.to(other), f"{dt} -> {other}")
    finite = codes.float().isfinite() & (codes.float().abs() < 100)
    for it in (torch.int32, torch.int64, torch.int8, torch.uint8):
        if dt != torch.float8_e8m0fnu:
            assert torch.equal(dev.to(it).cpu()[finite], codes.to(it)[finite]), (dt, it)
""")


def test_floats_to_narrow_integers_wrap_as_on_cpu():
    run("""
x = torch.tensor([-3.0, -1.5, 2.5, 300.0, -300.0, 70000.5, -70000.5, 3e9, -3e9])
for it in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32):
    keep = x.abs() < 2.0 ** 31  # beyond int64's truncation both are implementation-defined
    got, want = x.to("tpu").to(it).cpu(), x.to(it)
    assert torch.equal(got[keep], want[keep]), (it, got, want)
""")


def test_narrow_float_tensors_move_view_index_and_concatenate():
    run("""
g = torch.Generator().manual_seed(1)
for dt in F8:
    c = (torch.randn(6, 8, generator=g) * 20).to(dt)
    d = c.to("tpu")
    same_bits(d.t().contiguous(), c.t().contiguous(), f"{dt} transpose")
    same_bits(d[torch.tensor([4, 0, 2], device="tpu")], c[[4, 0, 2]], f"{dt} index")
    same_bits(torch.cat([d, d[1:3]]), torch.cat([c, c[1:3]]), f"{dt} cat")
    assert torch.equal(d.view(torch.uint8).cpu(), c.view(torch.uint8))
    e = torch.empty(6, 8, dtype=dt, device="tpu")
    e.copy_(d)
    same_bits(e, c, f"{dt} copy_")
p = torch.randint(0, 256, (4, 6), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2)
d = p.to("tpu")
assert d.dtype == torch.float4_e2m1fn_x2
same_bits(d, p, "float4 round trip")
same_bits(torch.cat([d, d[:2]]), torch.cat([p, p[:2]]), "float4 cat")
""")


def test_wide_unsigned_integers():
    run("""
g = torch.Generator().manual_seed(2)
for dt, hi in ((torch.uint16, 2 ** 16), (torch.uint32, 2 ** 32), (torch.uint64, 2 ** 63)):
    c = torch.randint(0, hi - 1, (64,), dtype=torch.int64, generator=g).to(dt)
    d = c.to("tpu")
    assert d.dtype == dt and torch.equal(d.cpu(), c)
    assert torch.equal((d == d[3]).cpu(), c == c[3]), dt
    assert torch.equal(d.sum().cpu(), c.sum()), dt
    assert torch.equal(d[torch.tensor([5, 1], device="tpu")].cpu(), c[[5, 1]])
    assert torch.equal(d.to(torch.float64).cpu(), c.to(torch.float64)), dt
    assert torch.equal(torch.cat([d, d[:3]]).cpu(), torch.cat([c, c[:3]]))
    # sorted as unsigned: the upper half after the lower one (a signed compare puts it first)
    big = torch.cat([c, torch.tensor([hi - 1, 1, hi // 2], dtype=torch.int64).to(dt)])
    db = big.to("tpu")
    for desc in (False, True):
        v, i = db.sort(descending=desc, stable=True)
        wv, wi = big.sort(descending=desc, stable=True)
        assert torch.equal(v.cpu(), wv) and torch.equal(i.cpu(), wi), (dt, desc)
    u, inv, cnt = torch.unique(db, return_inverse=True, return_counts=True)
    wu, winv, wcnt = torch.unique(big, return_inverse=True, return_counts=True)
    assert torch.equal(u.cpu(), wu) and torch.equal(inv.cpu(), winv) and torch.equal(cnt.cpu(), wcnt)
""")


def test_scaled_mm_per_tensor_and_per_row():
    run("""
g = torch.Generator().manual_seed(3)
m, k, n = 24, 64, 40
a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e5m2).t()
bias = torch.randn(n, generator=g).to(torch.bfloat16)
scales = {"tensor": (torch.tensor(0.75), torch.tensor(1.5)),
          "row": (torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5)}
for name, (sa, sb) in scales.items():
    for out_dtype, bias_arg, sr in ((torch.bfloat16, bias, None), (torch.float32, None, None),
                                    (torch.bfloat16, None, None),
                                    (torch.float8_e4m3fn, None, torch.tensor(4.0))):
        if name == "row" and out_dtype == torch.float8_e4m3fn:
            continue  # CPU takes scale_result with per-tensor scales only
        kw = dict(bias=bias_arg, out_dtype=out_dtype)
        if sr is not None:
            kw["scale_result"] = sr
        want = torch._scaled_mm(a, b, sa, sb, **kw)
        dkw = {k2: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for k2, v in kw.items()}
        got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), **dkw)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
        # float32 accumulation in another order: one rounding step of the output at most
        step = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float8_e4m3fn: 0.13}[out_dtype]
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=step, atol=1e-5)
""")


def test_an_op_reading_memory_nothing_wrote():
    # torch.empty's storage has no device buffer yet; scatter_ reads it as its base (unique's
    # inverse is made so): the program starts it from zeros instead of failing to compile
    run("""
perm = torch.tensor([1, 3, 2, 0, 4, 5]); group = torch.tensor([0, 0, 1, 2, 2, 3])
got = torch.empty(6, dtype=torch.long, device="tpu").scatter_(0, perm.to("tpu"), group.to("tpu"))
assert torch.equal(got.cpu(), torch.empty(6, dtype=torch.long).scatter_(0, perm, group))
x = torch.tensor([5.0, 1.0, 3.0, 1.0, 5.0, 9.0])
for a, b in zip(torch.unique(x.to("tpu"), return_inverse=True, return_counts=True),
                torch.unique(x, return_inverse=True, return_counts=True)):
    assert torch.equal(a.cpu(), b), (a, b)
""")


def test_scaled_mm_block_scaled_and_float4():
    """MXFP8, MXFP4 and NVFP4 (block scales in cuBLAS's swizzled layout), through
    torch._scaled_mm and torch.nn.functional.scaled_mm (NVFP4 also two-level, with a
    global scale per operand), against a float64 reference: CPU has no kernel for them."""
    run("""
from torch.testing._internal.common_quantized import to_blocked
from torch.nn.functional import scaled_mm, ScalingType as S, SwizzleType as W
lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
def unpack(p):
    u = p.long()
    return torch.stack([lut[u & 15], lut[u >> 4]], -1).reshape(u.shape[0], -1)
g = torch.Generator().manual_seed(5)
m, k, n = 40, 160, 72
for fmt in ("mxfp8", "mxfp4", "nvfp4", "nvfp4_two_level"):
    block = 32 if fmt.startswith("mx") else 16
    if fmt == "mxfp8":
        a = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn).t()
        av, bv, ad, bd = a.double(), b.double(), a.to("tpu"), b.to("tpu")
    else:
        ap = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        bp = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        av, bv = unpack(ap), unpack(bp).t()
        ad = ap.view(torch.float4_e2m1fn_x2).to("tpu")
        bd = bp.view(torch.float4_e2m1fn_x2).to("tpu").t()
    kb = k // block
    if block == 32:
        sdt = torch.float8_e8m0fnu
        sa = torch.randint(120, 134, (m, kb), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
        sb = torch.randint(120, 134, (n, kb), generator=g, dtype=torch.int32).to(torch.uint8).view(sdt)
    else:
        sdt = torch.float8_e4m3fn
        sa = (torch.rand(m, kb, generator=g) + 0.25).to(sdt)
        sb = (torch.rand(n, kb, generator=g) + 0.25).to(sdt)
    ref = (av * sa.double().repeat_interleave(block, 1)) @ (bv * sb.double().repeat_interleave(block, 1).t())
    bias = torch.randn(n, generator=g).bfloat16()
    if fmt == "nvfp4_two_level":
        recipe, swz = [S.BlockWise1x16, S.TensorWise], [W.SWIZZLE_32_4_4, W.NO_SWIZZLE]
        got = scaled_mm(ad, bd, [to_blocked(sa).to("tpu"), torch.tensor(0.5).to("tpu")], recipe,
                        [to_blocked(sb).to("tpu"), torch.tensor(3.0).to("tpu")], recipe,
                        swizzle_a=swz, swizzle_b=swz, bias=bias.to("tpu"), output_dtype=torch.bfloat16)
        want = ref * 1.5 + bias.double()
    else:
        got = torch._scaled_mm(ad, bd, to_blocked(sa).to("tpu"), to_blocked(sb).to("tpu"),
                               bias=bias.to("tpu"), out_dtype=torch.bfloat16)
        want = ref + bias.double()
    assert got.shape == (m, n) and got.dtype == torch.bfloat16, (got.shape, got.dtype)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))
    got32 = torch._scaled_mm(ad, bd, to_blocked(sa).to("tpu"), to_blocked(sb).to("tpu"),
                             out_dtype=torch.float32)
    torch.testing.assert_close(got32.cpu().double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
""")
