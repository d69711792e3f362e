/* Narrow floats: the float8 conversions of tpu/float8.h (round trips, the
 * rounding and overflow rules at each format's edges), the copy kernel over
 * float8 (casts, byte-exact copies within a dtype) and scaled products of
 * float4 operands with block scales on every micro-kernel the CPU has.
 * tests/test_float8.py compares the same conversions bit for bit with
 * PyTorch; this checks them without it. */
#include <math.h>
#include <stdlib.h>

#include "targets/host/kernels/matmul.h"
#include "test_util.h"
#include "tpu/float8.h"

typedef struct {
  tpu_dtype_t dt;
  float (*dec)(uint8_t);
  uint8_t (*enc)(float);
} fmt_t;

static const fmt_t k_fmts[] = {
    {TPU_F8E4M3FN, tpu_f8e4m3fn_to_f32, tpu_f32_to_f8e4m3fn},
    {TPU_F8E5M2, tpu_f8e5m2_to_f32, tpu_f32_to_f8e5m2},
    {TPU_F8E4M3FNUZ, tpu_f8e4m3fnuz_to_f32, tpu_f32_to_f8e4m3fnuz},
    {TPU_F8E5M2FNUZ, tpu_f8e5m2fnuz_to_f32, tpu_f32_to_f8e5m2fnuz},
    {TPU_F8E8M0FNU, tpu_f8e8m0fnu_to_f32, tpu_f32_to_f8e8m0fnu},
};

/* every code decodes to a value that encodes back to it (NaNs to a NaN) */
static void test_round_trips(void) {
  for (size_t f = 0; f < sizeof k_fmts / sizeof k_fmts[0]; f++) {
    const fmt_t* m = &k_fmts[f];
    for (int c = 0; c < 256; c++) {
      const float v = m->dec((uint8_t)c);
      const uint8_t back = m->enc(v);
      if (isnan(v)) CHECK(isnan(m->dec(back)));
      else CHECK(back == c);
      const uint8_t byte = (uint8_t)c;
      CHECK(tpu_load_f64(&byte, m->dt) == v || isnan(v));
    }
  }
}

static void test_edges(void) {
  /* e4m3fn: saturates to 448, also from infinity; ties to even */
  CHECK(tpu_f32_to_f8e4m3fn(448.0f) == 0x7e);
  CHECK(tpu_f32_to_f8e4m3fn(470.0f) == 0x7e);
  CHECK(tpu_f32_to_f8e4m3fn(1e9f) == 0x7e);
  CHECK(tpu_f32_to_f8e4m3fn(-INFINITY) == 0xfe);
  CHECK(tpu_f32_to_f8e4m3fn(NAN) == 0x7f);
  CHECK(tpu_f32_to_f8e4m3fn(17.0f) == 0x58);      /* 16 + half a step: even, 16 */
  CHECK(tpu_f32_to_f8e4m3fn(0x1p-10f) == 0x00);   /* half the smallest subnormal: even, 0 */
  CHECK(tpu_f32_to_f8e4m3fn(0x1.8p-9f) == 0x02);  /* 1.5 steps: even, 2 */
  CHECK(tpu_f32_to_f8e4m3fn(-0.0f) == 0x80);
  /* e5m2: IEEE overflow to infinity */
  CHECK(tpu_f32_to_f8e5m2(57344.0f) == 0x7b);
  CHECK(tpu_f32_to_f8e5m2(61440.0f) == 0x7c);
  CHECK(tpu_f32_to_f8e5m2(-INFINITY) == 0xfc);
  CHECK(isinf(tpu_f8e5m2_to_f32(0x7c)) && isnan(tpu_f8e5m2_to_f32(0x7d)));
  /* fnuz: one NaN (0x80), no negative zero */
  CHECK(tpu_f32_to_f8e4m3fnuz(240.0f) == 0x7f);
  CHECK(tpu_f32_to_f8e4m3fnuz(250.0f) == 0x80); /* rounds past 240 */
  CHECK(tpu_f32_to_f8e4m3fnuz(INFINITY) == 0x80);
  CHECK(tpu_f32_to_f8e4m3fnuz(-0.0f) == 0x00);
  CHECK(tpu_f32_to_f8e5m2fnuz(-1e-30f) == 0x00);
  CHECK(isnan(tpu_f8e4m3fnuz_to_f32(0x80)) && isnan(tpu_f8e5m2fnuz_to_f32(0x80)));
  /* e8m0: powers of two, sign ignored */
  CHECK(tpu_f32_to_f8e8m0fnu(1.0f) == 127 && tpu_f32_to_f8e8m0fnu(-2.0f) == 128);
  CHECK(tpu_f32_to_f8e8m0fnu(1.5f) == 128);  /* the grid's tie, rounded up */
  CHECK(tpu_f32_to_f8e8m0fnu(1.25f) == 127);
  CHECK(tpu_f32_to_f8e8m0fnu(INFINITY) == 255);
  CHECK(tpu_f8e8m0fnu_to_f32(0) == 0x1p-127f);
  /* float4 e2m1 */
  CHECK(tpu_f4e2m1_to_f32(0x7) == 6.0f && tpu_f4e2m1_to_f32(0x9) == -0.5f);
}

/* the copy kernel: float32 -> float8 -> float32, and a strided float8 copy
 * that keeps every byte (NaN payloads included) */
static void test_copy_kernel(void) {
  float src[8] = {0.1f, -3.3f, 500.0f, NAN, 1e-4f, 2.0f, -0.0f, 448.0f}, back[8];
  uint8_t f8[8], codes[16], out[16];
  int64_t s8[1] = {8};
  tpu_tensor_t ts = tt_make(src, TPU_F32, 1, s8), t8 = tt_make(f8, TPU_F8E4M3FN, 1, s8),
               tb = tt_make(back, TPU_F32, 1, s8);
  CHECK_OK(tpu_copy_strided(&t8, &ts));
  for (int i = 0; i < 8; i++) CHECK(f8[i] == tpu_f32_to_f8e4m3fn(src[i]));
  CHECK_OK(tpu_copy_strided(&tb, &t8));
  for (int i = 0; i < 8; i++)
    CHECK(back[i] == tpu_f8e4m3fn_to_f32(f8[i]) || (isnan(back[i]) && i == 3));
  for (int i = 0; i < 16; i++) codes[i] = (uint8_t)(0x7d + i * 9); /* e5m2 NaNs among them */
  int64_t s44[2] = {4, 4};
  tpu_tensor_t tc = tt_make(codes, TPU_F8E5M2, 2, s44), to = tt_make(out, TPU_F8E5M2, 2, s44);
  tc.strides[0] = 1; /* a transposed view */
  tc.strides[1] = 4;
  CHECK_OK(tpu_copy_strided(&to, &tc));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) CHECK(out[i * 4 + j] == codes[j * 4 + i]);
}

/* ---- float4 products with block scales (tpu_gemm_scaled) ---- */
static uint64_t g_seed = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  g_seed ^= g_seed << 13;
  g_seed ^= g_seed >> 7;
  g_seed ^= g_seed << 17;
  return (uint32_t)(g_seed >> 24);
}

/* cuBLAS's block-scaled layout: scale (l, kb) of a lines x kblocks grid in
 * 128 x 4 tiles, each tile's line 32 * a + b at b * 16 + a * 4 + kb % 4 */
static int64_t swizzle(int64_t l, int64_t kb, int64_t kblocks) {
  const int64_t tile = (l / 128) * ((kblocks + 3) / 4) + kb / 4, r = l % 128;
  return tile * 512 + (r % 32) * 16 + (r / 32) * 4 + kb % 4;
}

/* c = (a * sa) @ (b * sb) for m x k x n with float4 codes (A row- or
 * column-major as M x K/2 bytes, B as K/2 x N bytes either way) against a
 * double sum of the same float32 scaled values. */
static void scaled_f4_case(int64_t m, int64_t k, int64_t n, bool nv, bool a_cols, bool b_rows) {
  const int64_t kh = k / 2, blk = nv ? 16 : 32, kblocks = (k + blk - 1) / blk;
  const int64_t kpad = (kblocks + 3) / 4 * 4;
  const tpu_dtype_t sdt = nv ? TPU_F8E4M3FN : TPU_F8E8M0FNU;
  uint8_t* a = malloc((size_t)(m * kh));
  uint8_t* b = malloc((size_t)(kh * n));
  uint8_t* sa = calloc((size_t)((m + 127) / 128 * 128 * kpad), 1);
  uint8_t* sb = calloc((size_t)((n + 127) / 128 * 128 * kpad), 1);
  float* c = malloc(sizeof(float) * (size_t)(m * n));
  for (int64_t i = 0; i < m * kh; i++) a[i] = (uint8_t)rnd();
  for (int64_t i = 0; i < kh * n; i++) b[i] = (uint8_t)rnd();
  for (int s = 0; s < 2; s++) {
    const int64_t lines = s ? n : m;
    uint8_t* dst = s ? sb : sa;
    for (int64_t l = 0; l < lines; l++)
      for (int64_t kb = 0; kb < kblocks; kb++)
        dst[swizzle(l, kb, kblocks)] =
            nv ? tpu_f32_to_f8e4m3fn(0.25f + (float)(rnd() % 1000) / 1000.0f)
               : (uint8_t)(122 + rnd() % 10);
  }
  /* element (i, j) of A: byte i * kh + j / 2 (rows) or (j / 2) * m + i (columns) */
  tpu_tensor_t at, bt, ct;
  const int64_t as[2] = {m, kh}, bs[2] = {kh, n}, cs[2] = {m, n};
  tpu_tensor_make_contig(&at, a, TPU_F4E2M1FNX2, 2, as);
  tpu_tensor_make_contig(&bt, b, TPU_F4E2M1FNX2, 2, bs);
  tpu_tensor_make_contig(&ct, c, TPU_F32, 2, cs);
  if (a_cols) {
    at.strides[0] = 1;
    at.strides[1] = m;
  }
  if (!b_rows) { /* column-major, as cuBLAS wants it */
    bt.strides[0] = 1;
    bt.strides[1] = kh;
  }
  tpu_gemm_scale_t sca = {.blk = blk, .codes = sa, .code_dtype = sdt, .kblocks = kblocks};
  tpu_gemm_scale_t scb = {.blk = blk, .codes = sb, .code_dtype = sdt, .kblocks = kblocks};
  CHECK_OK(tpu_gemm_scaled(&at, &bt, &ct, &sca, &scb, NULL));
  int bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double sum = 0, mag = 0;
      for (int64_t q = 0; q < k; q++) {
        const uint8_t ab = a[at.strides[0] * i + at.strides[1] * (q / 2)];
        const uint8_t bb = b[bt.strides[0] * (q / 2) + bt.strides[1] * j];
        const uint8_t sac = sa[swizzle(i, q / blk, kblocks)], sbc = sb[swizzle(j, q / blk, kblocks)];
        const float va = tpu_f4e2m1_to_f32((uint8_t)(q % 2 ? ab >> 4 : ab)) *
                         (nv ? tpu_f8e4m3fn_to_f32(sac) : tpu_f8e8m0fnu_to_f32(sac));
        const float vb = tpu_f4e2m1_to_f32((uint8_t)(q % 2 ? bb >> 4 : bb)) *
                         (nv ? tpu_f8e4m3fn_to_f32(sbc) : tpu_f8e8m0fnu_to_f32(sbc));
        sum += (double)va * vb;
        mag += fabs((double)va * vb);
      }
      if (!(fabs(c[i * n + j] - sum) <= 1e-6 * mag + 1e-30)) bad++;
    }
  if (bad)
    fprintf(stderr, "scaled float4 %lldx%lldx%lld (%s, A %s, B %s, %s): %d wrong\n", (long long)m,
            (long long)k, (long long)n, nv ? "nvfp4" : "mxfp4", a_cols ? "cols" : "rows",
            b_rows ? "rows" : "cols", tpu_gemm_isa_name(), bad);
  CHECK(bad == 0);
  free(a);
  free(b);
  free(sa);
  free(sb);
  free(c);
}

/* Shapes: k blocks starting mid-byte (K = 1040: blocks of 347 steps),
 * several A blocks and B panels, matrix-vector products either way. */
static void test_scaled_float4(void) {
  static const int64_t shapes[][3] = {{5, 1040, 37}, {130, 64, 40}, {1, 96, 33}, {20, 64, 1}};
  for (int isa = TPU_GEMM_ISA_AVX512; isa >= TPU_GEMM_ISA_PORTABLE; isa--) {
    if (!tpu_gemm_set_isa((tpu_gemm_isa_t)isa)) continue; /* not on this CPU: skipped */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int v = 0; v < 8; v++)
        scaled_f4_case(shapes[s][0], shapes[s][1], shapes[s][2], v & 1, v & 2, v & 4);
  }
  CHECK(tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO));
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_round_trips();
  test_edges();
  test_copy_kernel();
  test_scaled_float4();
  TEST_MAIN_END();
}
