/* Narrow floats: the float8 conversions of tpu/float8.h (round trips, the
 * rounding and overflow rules at each format's edges), the copy kernel over
 * float8 (casts, byte-exact copies within a dtype) and a scaled product.
 * tests/test_float8.py compares the same conversions bit for bit with
 * PyTorch; this checks them without it. */
#include <math.h>

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

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_round_trips();
  test_edges();
  test_copy_kernel();
  TEST_MAIN_END();
}
