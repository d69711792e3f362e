/* Base layer: environment readers, the CPU-feature detector, element access. */
#include "base/cpu.h"
#include "base/env.h"
#include "test_util.h"

static void test_env(void) {
  unsetenv("TPU_TEST_ENV");
  CHECK(tpu_env_str("TPU_TEST_ENV") == NULL);
  CHECK(tpu_env_int("TPU_TEST_ENV", 7) == 7);
  CHECK(tpu_env_bool("TPU_TEST_ENV", true));
  CHECK(tpu_env_double("TPU_TEST_ENV", 2.5) == 2.5);
  setenv("TPU_TEST_ENV", "", 1); /* empty reads as unset */
  CHECK(tpu_env_str("TPU_TEST_ENV") == NULL);
  CHECK(tpu_env_int("TPU_TEST_ENV", 7) == 7);
  CHECK(!tpu_env_bool("TPU_TEST_ENV", false));
  setenv("TPU_TEST_ENV", "12K", 1);
  CHECK(strcmp(tpu_env_str("TPU_TEST_ENV"), "12K") == 0);
  CHECK(tpu_env_int("TPU_TEST_ENV", 0) == 12 * 1024);
  setenv("TPU_TEST_ENV", "3G", 1);
  CHECK(tpu_env_int("TPU_TEST_ENV", 0) == ((int64_t)3 << 30));
  setenv("TPU_TEST_ENV", "-4", 1);
  CHECK(tpu_env_int("TPU_TEST_ENV", 0) == -4);
  setenv("TPU_TEST_ENV", "abc", 1); /* not a number: the default */
  CHECK(tpu_env_int("TPU_TEST_ENV", 9) == 9);
  CHECK(tpu_env_double("TPU_TEST_ENV", 1.5) == 1.5);
  CHECK(tpu_env_bool("TPU_TEST_ENV", false)); /* any other value is true */
  setenv("TPU_TEST_ENV", "0.25", 1);
  CHECK(tpu_env_double("TPU_TEST_ENV", 0) == 0.25);
  setenv("TPU_TEST_ENV", "0", 1);
  CHECK(!tpu_env_bool("TPU_TEST_ENV", true));
  setenv("TPU_TEST_ENV", "false", 1);
  CHECK(!tpu_env_bool("TPU_TEST_ENV", true));
  setenv("TPU_TEST_ENV", "1", 1);
  CHECK(tpu_env_bool("TPU_TEST_ENV", false));
  unsetenv("TPU_TEST_ENV");
}

static void test_cpu_features(void) {
  const tpu_cpu_features_t* f = tpu_cpu_features();
  CHECK(f != NULL && f == tpu_cpu_features());
  /* implications of the definitions */
  CHECK(!f->avx2 || f->avx);
  CHECK(!f->fma || f->avx);
  CHECK(!(f->avx512bw || f->avx512dq || f->avx512vl) || f->avx512f);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  /* libgcc's detector (which also checks XCR0) as an independent reference */
  __builtin_cpu_init();
  CHECK(f->avx2 == (bool)__builtin_cpu_supports("avx2"));
  CHECK(f->fma == (bool)__builtin_cpu_supports("fma"));
  CHECK(f->avx512f == (bool)__builtin_cpu_supports("avx512f"));
  CHECK(f->avx512bw == (bool)__builtin_cpu_supports("avx512bw"));
  CHECK(f->avx512dq == (bool)__builtin_cpu_supports("avx512dq"));
  CHECK(f->avx512vl == (bool)__builtin_cpu_supports("avx512vl"));
  printf("cpu: avx2 %d fma %d avx512f %d bw %d dq %d vl %d\n", f->avx2, f->fma, f->avx512f,
         f->avx512bw, f->avx512dq, f->avx512vl);
#endif
}

static void test_element_access(void) {
  /* a 2 x 3 bfloat16 tensor viewed transposed (strides 1, 3) */
  uint16_t b[6];
  for (int i = 0; i < 6; i++) b[i] = tpu_f32_to_bf16((float)i - 2.5f);
  tpu_tensor_t t = {0};
  t.data = b;
  t.dtype = TPU_BF16;
  t.ndim = 2;
  t.sizes[0] = 3;
  t.sizes[1] = 2;
  t.strides[0] = 1;
  t.strides[1] = 3;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) CHECK(tpu_tensor_get_f64(&t, i * 2 + j) == (double)(j * 3 + i) - 2.5);
  CHECK(tpu_tensor_get_i64(&t, 1) == 0); /* 0.5 truncates */
  CHECK(tpu_tensor_offset_of(&t, 1) == 3 * 2);
  uint16_t h = tpu_f32_to_f16(65504.0f);
  CHECK(tpu_f16_to_f32(h) == 65504.0f);
  CHECK(tpu_f16_to_f32(tpu_f32_to_f16(1e6f)) == INFINITY);
  int32_t x = 0;
  tpu_store_f64(&x, TPU_I32, -7.9);
  CHECK(x == -7 && tpu_load_i64(&x, TPU_I32) == -7);
}

int main(void) {
  test_env();
  test_cpu_features();
  test_element_access();
  if (g_failures) {
    fprintf(stderr, "test_base: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_base: ok\n");
  return 0;
}
