/* Element-wise engine: broadcasting, conversions, promotion, errors; the
 * vectorized float32 math and 16-bit conversions on every ISA path. */
#include "test_util.h"
#include "targets/host/kernels/vecmath.h"

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

/* The ISA paths this machine can run (portable always). */
static int isa_paths(tpu_isa_t out[2]) {
  int n = 0;
  out[n++] = TPU_ISA_PORTABLE;
  tpu_host_isa_override(TPU_ISA_AVX2);
  if (tpu_host_isa() == TPU_ISA_AVX2) out[n++] = TPU_ISA_AVX2;
  tpu_host_isa_override(-1);
  return n;
}

static void test_isa_override(void) {
  tpu_host_isa_override(TPU_ISA_PORTABLE);
  CHECK(tpu_host_isa() == TPU_ISA_PORTABLE);
  CHECK(strcmp(tpu_isa_name(tpu_host_isa()), "portable") == 0);
  tpu_host_isa_override(TPU_ISA_AVX2); /* honoured only where the CPU has it */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  CHECK(tpu_host_isa() == (has ? TPU_ISA_AVX2 : TPU_ISA_PORTABLE));
#endif
  tpu_host_isa_override(-1);
}

/* |got - want| in units of the float32 ulp at want (subnormal ulp floor) */
static double ulp_error(float got, double want) {
  if (isnan(want)) return isnan(got) ? 0 : INFINITY;
  if (isinf((float)want) || isinf(got)) return (double)got == (double)(float)want ? 0 : INFINITY;
  int e;
  frexp(want, &e);
  double ulp = ldexp(1.0, e - 24);
  if (ulp < 0x1p-149) ulp = 0x1p-149;
  return fabs((double)got - want) / ulp;
}

static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* exp, log, tanh, sigmoid and erf kernels on float32 against double libm,
 * over a sweep and the special values, on each ISA path */
static void test_vecmath_ops(void) {
  enum { N = 20000 };
  static float x[N], o[N];
  struct {
    const char* op;
    double (*ref)(double);
    double lo, hi, max_ulp;
  } cases[] = {
      {"exp", exp, -104, 89, 1},         {"log", log, 1e-38, 1e38, 1},
      {"tanh", tanh, -10, 10, 2},        {"sigmoid", ref_sigmoid, -80, 40, 3},
      {"erf", erf, -5, 5, 2},
  };
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, -1.0f, 88.7f,
                            -103.5f, 3.921875f, 0.921875f, 0.625f, 1e-30f, 1e20f, -3e38f,
                            9.0f, 9.125f, -4.0f};
  const int ns = (int)(sizeof specials / sizeof specials[0]);
  int64_t size[1] = {N};
  tpu_isa_t isas[2];
  int nisa = isa_paths(isas);
  for (int k = 0; k < nisa; k++) {
    tpu_host_isa_override(isas[k]);
    for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      bool logscale = cases[c].lo > 0;
      for (int i = 0; i < N - ns; i++) {
        double t = (double)i / (N - ns - 1);
        x[i] = (float)(logscale ? cases[c].lo * pow(cases[c].hi / cases[c].lo, t)
                                : cases[c].lo + (cases[c].hi - cases[c].lo) * t);
      }
      memcpy(x + N - ns, specials, sizeof specials);
      tpu_tensor_t tx = tt_make(x, TPU_F32, 1, size), to = tt_make(o, TPU_F32, 1, size);
      tpu_arg_t args[1] = {ta_t(&tx)};
      CHECK_OK(tt_run(cases[c].op, args, 1, &to, 1));
      double worst = 0;
      int at = 0;
      for (int i = 0; i < N; i++) {
        double want = cases[c].ref((double)x[i]);
        /* 1/(1+inf) = 0 where sigmoid is a subnormal: PyTorch's formula too */
        if (!strcmp(cases[c].op, "sigmoid") && x[i] < -88) continue;
        if (isinf(x[i])) /* saturated results are exact */
          CHECK(isnan(want) ? isnan(o[i]) : (double)o[i] == want);
        double err = ulp_error(o[i], want);
        if (err > worst) {
          worst = err;
          at = i;
        }
      }
      if (worst > cases[c].max_ulp)
        fprintf(stderr, "%s (%s): %.2f ulp at %a: got %a want %a\n", cases[c].op,
                tpu_isa_name(isas[k]), worst, x[at], o[at], cases[c].ref(x[at]));
      CHECK(worst <= cases[c].max_ulp);
    }
  }
  tpu_host_isa_override(-1);
}

/* every bfloat16/float16 bit pattern converts to float32 exactly, and
 * float32 values round to them like the scalar reference, on each path */
static void test_half_conversions(void) {
  enum { N = 1 << 16 };
  static uint16_t h[N], back[N];
  static float f[N];
  int64_t size[1] = {N};
  tpu_isa_t isas[2];
  int nisa = isa_paths(isas);
  for (int k = 0; k < nisa; k++) {
    tpu_host_isa_override(isas[k]);
    for (int bf = 0; bf < 2; bf++) {
      tpu_dtype_t dt = bf ? TPU_BF16 : TPU_F16;
      for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
      tpu_tensor_t th = tt_make(h, dt, 1, size), tf = tt_make(f, TPU_F32, 1, size);
      CHECK_OK(tpu_copy_strided(&tf, &th));
      int bad = 0;
      for (int i = 0; i < N; i++) {
        float want = bf ? tpu_bf16_to_f32(h[i]) : tpu_f16_to_f32(h[i]);
        bad += isnan(want) ? !isnan(f[i]) : memcmp(&want, &f[i], 4) != 0;
      }
      CHECK(bad == 0);
      /* float32 values: each pattern nudged up and down (ties, overflow,
       * subnormals) */
      for (int i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        u += (uint32_t)((i * 2654435761u) % (bf ? 0x10000u : 0x2000u)) - (bf ? 0x8000u : 0x1000u);
        memcpy(&f[i], &u, 4);
      }
      tpu_tensor_t tb = tt_make(back, dt, 1, size);
      CHECK_OK(tpu_copy_strided(&tb, &tf));
      bad = 0;
      for (int i = 0; i < N; i++) {
        uint16_t want = bf ? tpu_f32_to_bf16(f[i]) : tpu_f32_to_f16(f[i]);
        float wf = bf ? tpu_bf16_to_f32(want) : tpu_f16_to_f32(want);
        bad += isnan(wf) ? !isnan(bf ? tpu_bf16_to_f32(back[i]) : tpu_f16_to_f32(back[i]))
                         : back[i] != want;
      }
      if (bad) fprintf(stderr, "%s %s: %d mismatches\n", bf ? "bf16" : "f16", tpu_isa_name(isas[k]), bad);
      CHECK(bad == 0);
    }
  }
  tpu_host_isa_override(-1);
}

/* chunked (converted, broadcast, strided) and direct runs longer than a
 * chunk, in place and out of place */
static void test_long_runs(void) {
  enum { R = 7, C = 3001 };
  static uint16_t a[R * C], o[R * C];
  static float b[C], f[R * C];
  int64_t s2[2] = {R, C}, s1[1] = {C};
  for (int i = 0; i < R * C; i++) a[i] = tpu_f32_to_bf16((float)(i % 97) * 0.25f - 12);
  for (int j = 0; j < C; j++) b[j] = (float)(j % 13) - 6;
  tpu_isa_t isas[2];
  int nisa = isa_paths(isas);
  for (int k = 0; k < nisa; k++) {
    tpu_host_isa_override(isas[k]);
    tpu_tensor_t ta = tt_make(a, TPU_BF16, 2, s2), tb = tt_make(b, TPU_F32, 1, s1),
                 to = tt_make(o, TPU_BF16, 2, s2), tf = tt_make(f, TPU_F32, 2, s2);
    tpu_arg_t args[3] = {ta_t(&ta), ta_t(&tb), ta_d(1.0)};
    to.dtype = TPU_F32;
    to.data = f;
    CHECK_OK(tt_run("add.Tensor", args, 3, &to, 1)); /* bf16 + f32 -> f32 */
    int bad = 0;
    for (int i = 0; i < R * C; i++) bad += f[i] != tpu_bf16_to_f32(a[i]) + b[i % C];
    CHECK(bad == 0);
    /* in place on the float32 result (direct path), then a strided read */
    tpu_arg_t args2[3] = {ta_t(&tf), ta_t(&tf), ta_d(-1.0)};
    CHECK_OK(tt_run("add.Tensor", args2, 3, &tf, 1));
    bad = 0;
    for (int i = 0; i < R * C; i++) bad += f[i] != 0;
    CHECK(bad == 0);
    tpu_tensor_t col = ta; /* column 5 of a as a (R,) strided view */
    col.ndim = 1;
    col.sizes[0] = R;
    col.strides[0] = C;
    col.data = a + 5;
    int64_t sr[1] = {R};
    tpu_tensor_t tr = tt_make(o, TPU_BF16, 1, sr);
    tpu_arg_t args3[1] = {ta_t(&col)};
    CHECK_OK(tt_run("neg", args3, 1, &tr, 1));
    for (int r = 0; r < R; r++) CHECK(tpu_bf16_to_f32(o[r]) == -tpu_bf16_to_f32(a[r * C + 5]));
  }
  tpu_host_isa_override(-1);
}

/* fill_ and zero_ over every compute type: the loops take no input (an
 * UBSAN build reports a loop that loads one) */
static void test_fill_every_type(void) {
  const tpu_dtype_t dts[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16, TPU_I64, TPU_I32, TPU_BOOL};
  int64_t n[1] = {37};
  for (unsigned k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    double buf[37];
    tpu_tensor_t o = tt_make(buf, dts[k], 1, n);
    tpu_arg_t a[2] = {ta_t(&o), ta_d(1.0)};
    CHECK_OK(tt_run("fill_.Scalar", a, 2, &o, 1));
    for (int i = 0; i < 37; i++) CHECK(tpu_tensor_get_f64(&o, i) == 1.0);
    CHECK_OK(tt_run("zero_", a, 1, &o, 1));
    for (int i = 0; i < 37; i++) CHECK(tpu_tensor_get_f64(&o, i) == 0.0);
  }
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_add_broadcast();
  test_bf16_and_transpose();
  test_int_div_zero();
  test_promotion();
  test_f16_roundtrip();
  test_isa_override();
  test_vecmath_ops();
  test_half_conversions();
  test_long_runs();
  test_fill_every_type();
  TEST_MAIN_END();
}
