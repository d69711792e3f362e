/* Element-wise engine: broadcasting, conversions, promotion, errors. */
#include "test_util.h"

static void test_add_broadcast(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, o[6];
  int64_t s23[2] = {2, 3}, s3[1] = {3};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 2, s23), tb = tt_make(b, TPU_F32, 1, s3),
               to = tt_make(o, TPU_F32, 2, s23);
  tpu_arg_t args[3] = {ta_t(&ta), ta_t(&tb), ta_d(2.0)};
  CHECK_OK(tt_run("add.Tensor", args, 3, &to, 1));
  for (int i = 0; i < 6; i++) CHECK_NEAR(o[i], a[i] + 2 * b[i % 3], 0);
}

static void test_bf16_and_transpose(void) {
  uint16_t a[6], o[6];
  for (int i = 0; i < 6; i++) a[i] = tpu_f32_to_bf16((float)i + 0.5f);
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  tpu_tensor_t ta = tt_make(a, TPU_BF16, 2, s23);
  /* transposed view as input */
  tpu_tensor_t tt = ta;
  tt.sizes[0] = 3; tt.sizes[1] = 2; tt.strides[0] = 1; tt.strides[1] = 3;
  tpu_tensor_t to = tt_make(o, TPU_BF16, 2, s32);
  tpu_arg_t args[1] = {ta_t(&tt)};
  CHECK_OK(tt_run("neg", args, 1, &to, 1));
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) CHECK_NEAR(tpu_bf16_to_f32(o[i * 2 + j]), -((float)(j * 3 + i) + 0.5f), 0);
}

static void test_int_div_zero(void) {
  int64_t a[2] = {4, 5}, b[2] = {2, 0}, o[2];
  int64_t s2[1] = {2};
  tpu_tensor_t ta = tt_make(a, TPU_I64, 1, s2), tb = tt_make(b, TPU_I64, 1, s2), to = tt_make(o, TPU_I64, 1, s2);
  tpu_arg_t args[3] = {ta_t(&ta), ta_t(&tb), ta_s("floor")};
  tpu_status_t st = tt_run("div.Tensor_mode", args, 3, &to, 1);
  CHECK(st != TPU_OK);
  CHECK(st && strstr(tpu_status_message(st), "ZeroDivisionError"));
  tpu_status_free(st);
}

static void test_promotion(void) {
  tpu_tensor_t i32 = {0}, f_wrapped = {0}, f64_0d = {0};
  i32.dtype = TPU_I32; i32.ndim = 1; i32.sizes[0] = 2;
  f_wrapped.dtype = TPU_F64; f_wrapped.flags = TPU_TENSOR_WRAPPED_NUMBER;
  f64_0d.dtype = TPU_F64;
  const tpu_tensor_t* a[2] = {&i32, &f_wrapped};
  CHECK(tpu_result_type(a, 2) == TPU_F32);
  const tpu_tensor_t* b[2] = {&i32, &f64_0d};
  CHECK(tpu_result_type(b, 2) == TPU_F64);
  CHECK(tpu_dtype_promote(TPU_U8, TPU_I8) == TPU_I16);
  CHECK(tpu_dtype_promote(TPU_F16, TPU_BF16) == TPU_F32);
}

static void test_f16_roundtrip(void) {
  float vals[] = {0.f, 1.f, -2.5f, 65504.f, 1e-7f, 6.1e-5f, 3.14159f};
  for (unsigned i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    float r = tpu_f16_to_f32(tpu_f32_to_f16(vals[i]));
    CHECK(fabsf(r - vals[i]) <= fabsf(vals[i]) * 1e-3f + 6e-8f);
  }
  CHECK(isinf(tpu_f16_to_f32(tpu_f32_to_f16(1e6f))));
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_add_broadcast();
  test_bf16_and_transpose();
  test_int_div_zero();
  test_promotion();
  test_f16_roundtrip();
  TEST_MAIN_END();
}
