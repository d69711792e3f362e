/* Reductions and scans: dims and keepdim, indices with ties and NaN,
 * variance corrections, strided inputs, empty reductions, bf16, errors. */
#include "test_util.h"

static void test_sum_mean_dims(void) {
  float a[24], o3[3], o13[3], o1[1];
  for (int i = 0; i < 24; i++) a[i] = (float)i;
  int64_t s234[3] = {2, 3, 4}, s3[1] = {3}, s131[3] = {1, 3, 1};
  int64_t dims[2] = {0, -1};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 3, s234);
  /* sum over dims 0 and 2 (row r of dim 1 sums i*4+k and 12+i*4+k) */
  tpu_tensor_t to = tt_make(o3, TPU_F32, 1, s3);
  tpu_arg_t args[4] = {ta_t(&ta), ta_il(dims, 2), ta_b(false), ta_none()};
  CHECK_OK(tt_run("sum.dim_IntList", args, 4, &to, 1));
  for (int r = 0; r < 3; r++) CHECK_NEAR(o3[r], 2 * (r * 16 + 6) + 48, 0);
  /* keepdim output [1, 3, 1], mean */
  tpu_tensor_t tk = tt_make(o13, TPU_F32, 3, s131);
  args[2] = ta_b(true);
  CHECK_OK(tt_run("mean.dim", args, 4, &tk, 1));
  for (int r = 0; r < 3; r++) CHECK_NEAR(o13[r], (2 * (r * 16 + 6) + 48) / 8.0, 1e-6);
  /* dim=None: all dims, 0-d output */
  tpu_tensor_t t0 = tt_make(o1, TPU_F32, 0, NULL);
  args[1] = ta_none();
  args[2] = ta_b(false);
  CHECK_OK(tt_run("sum.dim_IntList", args, 4, &t0, 1));
  CHECK_NEAR(o1[0], 276, 0);
  /* sum(self, dtype) full overload: args[1] is a dtype, not a dim */
  double od;
  tpu_tensor_t t0d = tt_make(&od, TPU_F64, 0, NULL);
  tpu_arg_t fargs[2] = {ta_t(&ta), ta_i(TPU_F64)};
  CHECK_OK(tt_run("sum", fargs, 2, &t0d, 1));
  CHECK_NEAR(od, 276, 0);
}

static void test_int_sums(void) {
  uint8_t b[5] = {1, 0, 1, 1, 0};
  int32_t v[4] = {3, -2, 5, 7};
  float f[3] = {0.5f, 0.7f, 1.9f};
  int64_t s5[1] = {5}, s4[1] = {4}, s3[1] = {3}, r;
  tpu_tensor_t tb = tt_make(b, TPU_BOOL, 1, s5), tv = tt_make(v, TPU_I32, 1, s4),
               tf = tt_make(f, TPU_F32, 1, s3), tr = tt_make(&r, TPU_I64, 0, NULL);
  tpu_arg_t args[2] = {ta_t(&tb), ta_none()};
  CHECK_OK(tt_run("sum", args, 2, &tr, 1));
  CHECK(r == 3);
  args[0] = ta_t(&tv);
  CHECK_OK(tt_run("prod", args, 2, &tr, 1));
  CHECK(r == -210);
  /* sum(dtype=int64) of floats truncates each element first, like PyTorch */
  args[0] = ta_t(&tf);
  args[1] = ta_i(TPU_I64);
  CHECK_OK(tt_run("sum", args, 2, &tr, 1));
  CHECK(r == 1);
}

static void test_max_dim_ties_nan(void) {
  float a[8] = {1, 3, 3, 0, 2, NAN, 5, NAN};
  float vals[2];
  int64_t idx[2], s24[2] = {2, 4}, s2[1] = {2};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 2, s24);
  tpu_tensor_t outs[2] = {tt_make(vals, TPU_F32, 1, s2), tt_make(idx, TPU_I64, 1, s2)};
  tpu_arg_t args[3] = {ta_t(&ta), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("max.dim", args, 3, outs, 2));
  CHECK(vals[0] == 3 && idx[0] == 1); /* first of the tied maxima */
  CHECK(isnan(vals[1]) && idx[1] == 5 - 4); /* first NaN wins */
  CHECK_OK(tt_run("min.dim", args, 3, outs, 2));
  CHECK(vals[0] == 0 && idx[0] == 3);
  CHECK(isnan(vals[1]) && idx[1] == 1);
  /* argmax over all dims: flattened index of the first NaN */
  int64_t am;
  tpu_tensor_t tam = tt_make(&am, TPU_I64, 0, NULL);
  tpu_arg_t aargs[3] = {ta_t(&ta), ta_none(), ta_b(false)};
  CHECK_OK(tt_run("argmax", aargs, 3, &tam, 1));
  CHECK(am == 5);
  /* amax of int64 keeps exact values beyond double precision */
  int64_t big[3] = {(1LL << 62) + 1, (1LL << 62) + 3, (1LL << 62) + 2}, bm;
  int64_t s3[1] = {3};
  tpu_tensor_t tbig = tt_make(big, TPU_I64, 1, s3), tbm = tt_make(&bm, TPU_I64, 0, NULL);
  int64_t d0[1] = {0};
  tpu_arg_t margs[3] = {ta_t(&tbig), ta_il(d0, 1), ta_b(false)};
  CHECK_OK(tt_run("amax", margs, 3, &tbm, 1));
  CHECK(bm == (1LL << 62) + 3);
}

static void test_var_std(void) {
  double a[4] = {1, 2, 3, 4}, v, m;
  int64_t s4[1] = {4};
  tpu_tensor_t ta = tt_make(a, TPU_F64, 1, s4);
  tpu_tensor_t outs[2] = {tt_make(&v, TPU_F64, 0, NULL), tt_make(&m, TPU_F64, 0, NULL)};
  tpu_arg_t args[4] = {ta_t(&ta), ta_none(), ta_none(), ta_b(false)};
  CHECK_OK(tt_run("var.correction", args, 4, outs, 1));
  CHECK_NEAR(v, 5.0 / 3.0, 1e-12);
  args[2] = ta_d(0.5);
  CHECK_OK(tt_run("var_mean.correction", args, 4, outs, 2));
  CHECK_NEAR(v, 5.0 / 3.5, 1e-12);
  CHECK_NEAR(m, 2.5, 0);
  args[2] = ta_i(0);
  CHECK_OK(tt_run("std_mean.correction", args, 4, outs, 2));
  CHECK_NEAR(v, sqrt(1.25), 1e-12);
  /* one element with correction 1: 0/0 */
  int64_t s1[1] = {1};
  tpu_tensor_t t1 = tt_make(a, TPU_F64, 1, s1);
  args[0] = ta_t(&t1);
  args[2] = ta_none();
  CHECK_OK(tt_run("var.correction", args, 4, outs, 1));
  CHECK(isnan(v));
  /* a large offset stays exact (two-pass chunks merged in double) */
  static float big[100000];
  for (int i = 0; i < 100000; i++) big[i] = 1e4f + (float)(i % 2);
  int64_t sb[1] = {100000};
  tpu_tensor_t tb = tt_make(big, TPU_F32, 1, sb);
  args[0] = ta_t(&tb);
  CHECK_OK(tt_run("var.correction", args, 4, outs, 1));
  CHECK_NEAR(v, 0.25 * 100000 / 99999, 1e-9);
}

static void test_scans(void) {
  int64_t a[6] = {1, 2, 3, 4, 5, 6}, o[6];
  int64_t s23[2] = {2, 3};
  tpu_tensor_t ta = tt_make(a, TPU_I64, 2, s23), to = tt_make(o, TPU_I64, 2, s23);
  tpu_arg_t args[3] = {ta_t(&ta), ta_i(0), ta_none()};
  CHECK_OK(tt_run("cumsum", args, 3, &to, 1));
  int64_t e0[6] = {1, 2, 3, 5, 7, 9};
  for (int i = 0; i < 6; i++) CHECK(o[i] == e0[i]);
  /* in place along the last dim */
  args[1] = ta_i(-1);
  CHECK_OK(tt_run("cumprod_", args, 3, &ta, 1));
  int64_t e1[6] = {1, 2, 6, 4, 20, 120};
  for (int i = 0; i < 6; i++) CHECK(a[i] == e1[i]);
  /* cummax: ties move to the later index, every NaN takes over */
  float x[6] = {1, 3, 3, NAN, 2, NAN}, v[6];
  int64_t idx[6], s6[1] = {6};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, s6);
  tpu_tensor_t outs[2] = {tt_make(v, TPU_F32, 1, s6), tt_make(idx, TPU_I64, 1, s6)};
  tpu_arg_t cargs[2] = {ta_t(&tx), ta_i(0)};
  CHECK_OK(tt_run("cummax", cargs, 2, outs, 2));
  int64_t ei[6] = {0, 1, 2, 3, 3, 5};
  for (int i = 0; i < 6; i++) CHECK(idx[i] == ei[i]);
  CHECK(v[2] == 3 && isnan(v[4]));
  /* _cummax_helper(self, values, indices, dim) writes its arguments */
  tpu_arg_t hargs[4] = {ta_t(&tx), ta_t(&outs[0]), ta_t(&outs[1]), ta_i(0)};
  memset(idx, 0, sizeof idx);
  CHECK_OK(tt_run("_cummin_helper", hargs, 4, NULL, 0));
  int64_t emin[6] = {0, 0, 0, 3, 3, 5};
  for (int i = 0; i < 6; i++) CHECK(idx[i] == emin[i]);
  /* logcumsumexp with -inf */
  double l[3] = {-INFINITY, 0, 0}, lo[3];
  int64_t s3[1] = {3};
  tpu_tensor_t tl = tt_make(l, TPU_F64, 1, s3), tlo = tt_make(lo, TPU_F64, 1, s3);
  tpu_arg_t largs[2] = {ta_t(&tl), ta_i(0)};
  CHECK_OK(tt_run("_logcumsumexp", largs, 2, &tlo, 1));
  CHECK(isinf(lo[0]) && lo[0] < 0);
  CHECK_NEAR(lo[1], 0, 1e-15);
  CHECK_NEAR(lo[2], log(2.0), 1e-15);
}

/* Transposed and sliced views: reduced dims that are not contiguous. */
static void test_strided(void) {
  float a[1000 * 5];
  for (int i = 0; i < 1000; i++)
    for (int j = 0; j < 5; j++) a[i * 5 + j] = (float)((i * 7 + j * 3) % 11);
  /* view t = a.T[:, ::2] -> shape [5, 500], strides [1, 10] */
  tpu_tensor_t tv = {0};
  tv.data = a;
  tv.dtype = TPU_F32;
  tv.ndim = 2;
  tv.sizes[0] = 5; tv.sizes[1] = 500;
  tv.strides[0] = 1; tv.strides[1] = 10;
  float o5[5], o500[500];
  int64_t s5[1] = {5}, s500[1] = {500}, d1[1] = {1}, d0[1] = {0};
  tpu_tensor_t t5 = tt_make(o5, TPU_F32, 1, s5), t500 = tt_make(o500, TPU_F32, 1, s500);
  tpu_arg_t args[4] = {ta_t(&tv), ta_il(d1, 1), ta_b(false), ta_none()};
  CHECK_OK(tt_run("sum.dim_IntList", args, 4, &t5, 1));
  for (int j = 0; j < 5; j++) {
    double e = 0;
    for (int i = 0; i < 1000; i += 2) e += a[i * 5 + j];
    CHECK_NEAR(o5[j], e, 0);
  }
  args[1] = ta_il(d0, 1);
  CHECK_OK(tt_run("amax", args, 3, &t500, 1));
  for (int i = 0; i < 500; i++) {
    float e = 0;
    for (int j = 0; j < 5; j++) e = fmaxf(e, a[2 * i * 5 + j]);
    CHECK(o500[i] == e);
  }
  /* column reduction of the contiguous [1000, 5] tensor */
  tpu_tensor_t tc = tt_make(a, TPU_F32, 2, (int64_t[2]){1000, 5});
  args[0] = ta_t(&tc);
  CHECK_OK(tt_run("mean.dim", args, 4, &t5, 1));
  for (int j = 0; j < 5; j++) {
    double e = 0;
    for (int i = 0; i < 1000; i++) e += a[i * 5 + j];
    CHECK_NEAR(o5[j], e / 1000, 1e-5);
  }
}

static void test_large_full(void) {
  /* long enough for the split path; the sum is exact */
  int64_t n = 1000003;
  float* a = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) a[i] = (float)(i % 7) - 3.0f;
  a[n / 2] = 100;
  double e = 0;
  for (int64_t i = 0; i < n; i++) e += a[i];
  float o;
  int64_t am, sn[1] = {n};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 1, sn), to = tt_make(&o, TPU_F32, 0, NULL),
               tam = tt_make(&am, TPU_I64, 0, NULL);
  tpu_arg_t args[2] = {ta_t(&ta), ta_none()};
  CHECK_OK(tt_run("sum", args, 2, &to, 1));
  CHECK_NEAR(o, e, 0);
  CHECK_OK(tt_run("max", args, 1, &to, 1));
  CHECK(o == 100);
  tpu_arg_t aargs[3] = {ta_t(&ta), ta_none(), ta_b(false)};
  CHECK_OK(tt_run("argmax", aargs, 3, &tam, 1));
  CHECK(am == n / 2);
  free(a);
}

static void test_empty(void) {
  float dummy = 0, o[3];
  int64_t s30[2] = {3, 0}, s3[1] = {3}, d1[1] = {1};
  tpu_tensor_t te = tt_make(&dummy, TPU_F32, 2, s30), to = tt_make(o, TPU_F32, 1, s3);
  tpu_arg_t args[4] = {ta_t(&te), ta_il(d1, 1), ta_b(false), ta_none()};
  CHECK_OK(tt_run("sum.dim_IntList", args, 4, &to, 1));
  CHECK(o[0] == 0 && o[1] == 0 && o[2] == 0);
  CHECK_OK(tt_run("mean.dim", args, 4, &to, 1));
  CHECK(isnan(o[0]));
  tpu_arg_t pargs[3] = {ta_t(&te), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("prod.dim_int", pargs, 3, &to, 1));
  CHECK(o[2] == 1);
  /* max over an empty dim has no identity */
  int64_t idx[3];
  tpu_tensor_t outs[2] = {to, tt_make(idx, TPU_I64, 1, s3)};
  tpu_status_t st = tt_run("max.dim", pargs, 3, outs, 2);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  CHECK(st && strstr(tpu_status_message(st), "max(): Expected reduction dim 1 to have non-zero size"));
  tpu_status_free(st);
  /* bad dim */
  tpu_arg_t bargs[4] = {ta_t(&te), ta_il((int64_t[1]){2}, 1), ta_b(false), ta_none()};
  st = tt_run("sum.dim_IntList", bargs, 4, &to, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
  /* empty outputs: nothing to do */
  int64_t s03[2] = {0, 3}, s0[1] = {0};
  tpu_tensor_t te2 = tt_make(&dummy, TPU_F32, 2, s03), to0 = tt_make(o, TPU_F32, 1, s0);
  tpu_arg_t aargs[3] = {ta_t(&te2), ta_il(d1, 1), ta_b(false)};
  CHECK_OK(tt_run("amax", aargs, 3, &to0, 1));
}

static void test_bf16(void) {
  uint16_t a[4], o;
  float v[4] = {1.5f, 2.25f, -0.75f, 8.0f};
  for (int i = 0; i < 4; i++) a[i] = tpu_f32_to_bf16(v[i]);
  int64_t s4[1] = {4};
  tpu_tensor_t ta = tt_make(a, TPU_BF16, 1, s4), to = tt_make(&o, TPU_BF16, 0, NULL);
  tpu_arg_t args[2] = {ta_t(&ta), ta_none()};
  CHECK_OK(tt_run("sum", args, 2, &to, 1));
  CHECK(tpu_bf16_to_f32(o) == 11.0f);
  CHECK_OK(tt_run("mean", args, 2, &to, 1));
  CHECK(tpu_bf16_to_f32(o) == 2.75f);
  CHECK_OK(tt_run("min", args, 1, &to, 1));
  CHECK(tpu_bf16_to_f32(o) == -0.75f);
}

static void test_logical_norm_lse(void) {
  float a[6] = {0, 1, -2, 0, 3, 4};
  int64_t s23[2] = {2, 3}, s2[1] = {2}, d1[1] = {1};
  uint8_t b2[2];
  tpu_tensor_t ta = tt_make(a, TPU_F32, 2, s23), tb = tt_make(b2, TPU_BOOL, 1, s2);
  tpu_arg_t args[3] = {ta_t(&ta), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("all.dim", args, 3, &tb, 1));
  CHECK(b2[0] == 0 && b2[1] == 0);
  CHECK_OK(tt_run("any.dim", args, 3, &tb, 1));
  CHECK(b2[0] == 1 && b2[1] == 1);
  int64_t cnt[2];
  tpu_tensor_t tc = tt_make(cnt, TPU_I64, 1, s2);
  tpu_arg_t cargs[2] = {ta_t(&ta), ta_il(d1, 1)};
  CHECK_OK(tt_run("count_nonzero.dim_IntList", cargs, 2, &tc, 1));
  CHECK(cnt[0] == 2 && cnt[1] == 2);
  /* vector norms over everything */
  float n;
  tpu_tensor_t tn = tt_make(&n, TPU_F32, 0, NULL);
  double ords[5] = {2, 1, INFINITY, 0, 3};
  double want[5] = {sqrt(30.0), 10, 4, 4, cbrt(1 + 8 + 27 + 64)};
  for (int k = 0; k < 5; k++) {
    tpu_arg_t nargs[5] = {ta_t(&ta), ta_d(ords[k]), ta_none(), ta_b(false), ta_none()};
    CHECK_OK(tt_run("linalg_vector_norm", nargs, 5, &tn, 1));
    CHECK_NEAR(n, want[k], 1e-5);
  }
  /* logsumexp is stable for large inputs */
  double l[3] = {1000, 1000, -INFINITY}, lo;
  int64_t s3[1] = {3}, d0[1] = {0};
  tpu_tensor_t tl = tt_make(l, TPU_F64, 1, s3), tlo = tt_make(&lo, TPU_F64, 0, NULL);
  tpu_arg_t largs[3] = {ta_t(&tl), ta_il(d0, 1), ta_b(false)};
  CHECK_OK(tt_run("logsumexp", largs, 3, &tlo, 1));
  CHECK_NEAR(lo, 1000 + log(2.0), 1e-12);
  /* aminmax */
  float mn, mx;
  tpu_tensor_t mm[2] = {tt_make(&mn, TPU_F32, 0, NULL), tt_make(&mx, TPU_F32, 0, NULL)};
  tpu_arg_t margs[3] = {ta_t(&ta), ta_none(), ta_b(false)};
  CHECK_OK(tt_run("aminmax", margs, 3, mm, 2));
  CHECK(mn == -2 && mx == 4);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_sum_mean_dims();
  test_int_sums();
  test_max_dim_ties_nan();
  test_var_std();
  test_scans();
  test_strided();
  test_large_full();
  test_empty();
  test_bf16();
  test_logical_norm_lse();
  TEST_MAIN_END();
}
