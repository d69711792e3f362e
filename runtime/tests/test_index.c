/* Indexing and shape kernels against hand-computed results. */
#include "targets/host/kernels/index.h"
#include "test_util.h"

static tpu_arg_t ta_tl(tpu_tensor_t* ts, int n) {
  tpu_arg_t a = {0};
  a.kind = TPU_ARG_TENSORLIST;
  a.v.tlist = ts;
  a.n = n;
  return a;
}

static tpu_tensor_t none_tensor(void) {
  tpu_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.dtype = TPU_DTYPE_NONE;
  return t;
}

/* Expects an error with `code` whose message contains `text`. */
static void check_error(tpu_status_t st, tpu_status_code_t code, const char* text) {
  CHECK(st != TPU_OK);
  if (!st) return;
  if (tpu_status_code(st) != code) {
    fprintf(stderr, "unexpected code %d (want %d): %s\n", (int)tpu_status_code(st), (int)code,
            tpu_status_message(st));
    g_failures++;
  }
  if (!strstr(tpu_status_message(st), text)) {
    fprintf(stderr, "unexpected message: %s\n", tpu_status_message(st));
    g_failures++;
  }
  tpu_status_free(st);
}

static void test_cat(void) {
  /* int32 [2,2] ++ legacy empty [0] ++ float [2,3] (transposed view of [3,2]) -> float [2,5] */
  int32_t a[4] = {1, 2, 3, 4};
  float b[6] = {10, 11, 12, 13, 14, 15}, o[10];
  int64_t s22[2] = {2, 2}, s32[2] = {3, 2}, s25[2] = {2, 5}, s0[1] = {0};
  tpu_tensor_t ts[3];
  ts[0] = tt_make(a, TPU_I32, 2, s22);
  ts[1] = tt_make(NULL, TPU_F64, 1, s0);
  ts[2] = tt_make(b, TPU_F32, 2, s32);
  ts[2].sizes[0] = 2; ts[2].sizes[1] = 3; ts[2].strides[0] = 1; ts[2].strides[1] = 2;
  tpu_tensor_t to = tt_make(o, TPU_F32, 2, s25);
  tpu_arg_t args[2] = {ta_tl(ts, 3), ta_i(-1)};
  CHECK_OK(tt_run("cat", args, 2, &to, 1));
  float want[10] = {1, 2, 10, 12, 14, 3, 4, 11, 13, 15};
  for (int i = 0; i < 10; i++) CHECK_NEAR(o[i], want[i], 0);

  /* bf16 along dim 0 with a 0-size input */
  uint16_t x[2] = {tpu_f32_to_bf16(1.5f), tpu_f32_to_bf16(-2.f)}, y[2] = {tpu_f32_to_bf16(3.f), 0},
           ob[4];
  int64_t s12[2] = {1, 2}, s02[2] = {0, 2};
  tpu_tensor_t tb[3] = {tt_make(x, TPU_BF16, 2, s12), tt_make(NULL, TPU_BF16, 2, s02),
                        tt_make(y, TPU_BF16, 2, s12)};
  tpu_tensor_t tob = tt_make(ob, TPU_BF16, 2, s22);
  tpu_arg_t args2[2] = {ta_tl(tb, 3), ta_i(0)};
  CHECK_OK(tt_run("cat.out", args2, 2, &tob, 1));
  CHECK(ob[0] == x[0] && ob[1] == x[1] && ob[2] == y[0] && ob[3] == y[1]);

  /* mismatched sizes */
  int64_t s23[2] = {2, 3};
  tpu_tensor_t bad[2] = {tt_make(a, TPU_I32, 2, s22), tt_make(b, TPU_F32, 2, s32)};
  tpu_tensor_t tbad = tt_make(o, TPU_F32, 2, s23);
  tpu_arg_t args3[2] = {ta_tl(bad, 2), ta_i(1)};
  check_error(tt_run("cat", args3, 2, &tbad, 1), TPU_CODE_INVALID_ARGUMENT, "Sizes of tensors must match");
}

static void test_index_select(void) {
  float x[6] = {0, 1, 2, 3, 4, 5}, o[4];
  int32_t idx[2] = {2, 0};
  int64_t s23[2] = {2, 3}, s2[1] = {2}, s22[2] = {2, 2};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s23), ti = tt_make(idx, TPU_I32, 1, s2),
               to = tt_make(o, TPU_F32, 2, s22);
  tpu_arg_t args[3] = {ta_t(&tx), ta_i(1), ta_t(&ti)};
  CHECK_OK(tt_run("index_select", args, 3, &to, 1));
  float want[4] = {2, 0, 5, 3};
  for (int i = 0; i < 4; i++) CHECK_NEAR(o[i], want[i], 0);

  /* along dim 1 into a contiguous output CPU raises RuntimeError (its gather
   * path), not IndexError: INVALID_ARGUMENT */
  idx[1] = -1;
  check_error(tt_run("index_select", args, 3, &to, 1), TPU_CODE_INVALID_ARGUMENT,
              "index_select(): index -1 is out of bounds for dimension 1 with size 3");
  idx[1] = 3;
  check_error(tt_run("index_select", args, 3, &to, 1), TPU_CODE_INVALID_ARGUMENT, "index 3 is out of bounds");

  /* empty index -> [2, 0] output */
  int64_t s0[1] = {0}, s20[2] = {2, 0};
  tpu_tensor_t te = tt_make(idx, TPU_I64, 1, s0), toe = tt_make(o, TPU_F32, 2, s20);
  tpu_arg_t args2[3] = {ta_t(&tx), ta_i(1), ta_t(&te)};
  CHECK_OK(tt_run("index_select", args2, 3, &toe, 1));
}

static void test_gather_scatter(void) {
  /* gather dim 1 from a bf16 [2,3] */
  uint16_t x[6], o[4];
  for (int i = 0; i < 6; i++) x[i] = tpu_f32_to_bf16((float)i + 0.5f);
  int64_t idx[4] = {2, 0, 1, 1}, s23[2] = {2, 3}, s22[2] = {2, 2};
  tpu_tensor_t tx = tt_make(x, TPU_BF16, 2, s23), ti = tt_make(idx, TPU_I64, 2, s22),
               to = tt_make(o, TPU_BF16, 2, s22);
  tpu_arg_t ga[4] = {ta_t(&tx), ta_i(1), ta_t(&ti), ta_b(false)};
  CHECK_OK(tt_run("gather", ga, 4, &to, 1));
  float gw[4] = {2.5f, 0.5f, 4.5f, 4.5f};
  for (int i = 0; i < 4; i++) CHECK_NEAR(tpu_bf16_to_f32(o[i]), gw[i], 0);
  /* out of range: RuntimeError (INVALID_ARGUMENT), as CPU's gather raises */
  idx[3] = 3;
  check_error(tt_run("gather", ga, 4, &to, 1), TPU_CODE_INVALID_ARGUMENT,
              "gather(): index 3 is out of bounds for dimension 1 with size 3");

  /* scatter.src (functional) dim 0 */
  float self[6] = {0, 0, 0, 0, 0, 0}, src[6] = {1, 2, 3, 4, 5, 6}, out[6];
  int64_t sidx[3] = {1, 0, 1}, s13[2] = {1, 3};
  tpu_tensor_t tself = tt_make(self, TPU_F32, 2, s23), tsrc = tt_make(src, TPU_F32, 2, s23),
               tsi = tt_make(sidx, TPU_I64, 2, s13), tout = tt_make(out, TPU_F32, 2, s23);
  tpu_arg_t sa[4] = {ta_t(&tself), ta_i(0), ta_t(&tsi), ta_t(&tsrc)};
  CHECK_OK(tt_run("scatter.src", sa, 4, &tout, 1));
  float sw[6] = {0, 2, 0, 1, 0, 3};
  for (int i = 0; i < 6; i++) CHECK_NEAR(out[i], sw[i], 0);

  /* scatter_.value_reduce multiply, in place */
  float m[6] = {1, 2, 3, 4, 5, 6};
  tpu_tensor_t tm = tt_make(m, TPU_F32, 2, s23);
  tpu_arg_t ma[5] = {ta_t(&tm), ta_i(0), ta_t(&tsi), ta_d(10.0), ta_s("multiply")};
  CHECK_OK(tt_run("scatter_.value_reduce", ma, 5, &tm, 1));
  float mw[6] = {1, 20, 3, 40, 5, 60};
  for (int i = 0; i < 6; i++) CHECK_NEAR(m[i], mw[i], 0);

  /* scatter_add with duplicate targets (int64) */
  int64_t acc[3] = {100, 200, 300}, add[4] = {1, 2, 3, 4}, aidx[4] = {2, 0, 2, 2}, s3[1] = {3},
          s4[1] = {4};
  tpu_tensor_t tacc = tt_make(acc, TPU_I64, 1, s3), tadd = tt_make(add, TPU_I64, 1, s4),
               tai = tt_make(aidx, TPU_I64, 1, s4);
  tpu_arg_t aa[4] = {ta_t(&tacc), ta_i(0), ta_t(&tai), ta_t(&tadd)};
  CHECK_OK(tt_run("scatter_add_", aa, 4, &tacc, 1));
  CHECK(acc[0] == 102 && acc[1] == 200 && acc[2] == 308);

  /* scatter_reduce mean / amax without self */
  float rs[3] = {5, -7, 3}, rsrc[4] = {2, 2, 1, 8}, ro[3];
  int64_t ridx[4] = {1, 1, 0, 1};
  tpu_tensor_t trs = tt_make(rs, TPU_F32, 1, s3), trsrc = tt_make(rsrc, TPU_F32, 1, s4),
               tri = tt_make(ridx, TPU_I64, 1, s4), tro = tt_make(ro, TPU_F32, 1, s3);
  tpu_arg_t ra[6] = {ta_t(&trs), ta_i(0), ta_t(&tri), ta_t(&trsrc), ta_s("mean"), ta_b(true)};
  CHECK_OK(tt_run("scatter_reduce.two", ra, 6, &tro, 1));
  CHECK_NEAR(ro[0], 3, 1e-6);
  CHECK_NEAR(ro[1], 5.0 / 4.0, 1e-6);
  CHECK_NEAR(ro[2], 3, 0);
  ra[4] = ta_s("amax");
  ra[5] = ta_b(false);
  CHECK_OK(tt_run("scatter_reduce.two", ra, 6, &tro, 1));
  CHECK(ro[0] == 1 && ro[1] == 8 && ro[2] == 3);
  ra[4] = ta_s("median");
  check_error(tt_run("scatter_reduce.two", ra, 6, &tro, 1), TPU_CODE_INVALID_ARGUMENT, "reduce argument");
}

static void test_index_add_copy_fill(void) {
  /* index_add_ with alpha and a duplicate index, dim 0 of [3,2] */
  double self[6] = {0, 0, 0, 0, 0, 0}, src[6] = {1, 2, 3, 4, 5, 6};
  int64_t idx[3] = {2, 0, 2}, s32[2] = {3, 2}, s3[1] = {3};
  tpu_tensor_t ts = tt_make(self, TPU_F64, 2, s32), tsrc = tt_make(src, TPU_F64, 2, s32),
               ti = tt_make(idx, TPU_I64, 1, s3);
  tpu_arg_t a[5] = {ta_t(&ts), ta_i(0), ta_t(&ti), ta_t(&tsrc), ta_d(2.0)};
  CHECK_OK(tt_run("index_add_", a, 5, &ts, 1));
  double aw[6] = {6, 8, 0, 0, 12, 16};
  for (int i = 0; i < 6; i++) CHECK_NEAR(self[i], aw[i], 0);
  idx[1] = -1; /* alpha != 1: CPU's IndexError path (OUT_OF_RANGE) */
  check_error(tt_run("index_add_", a, 5, &ts, 1), TPU_CODE_OUT_OF_RANGE, "index -1 is out of bounds");
  for (int i = 0; i < 6; i++) CHECK_NEAR(self[i], aw[i], 0); /* untouched on error */

  /* index_copy dim 1 */
  int32_t c[6] = {0}, csrc[4] = {7, 8, 9, 10};
  int64_t cidx[2] = {2, 0}, s23[2] = {2, 3}, s22[2] = {2, 2}, s2[1] = {2};
  tpu_tensor_t tc = tt_make(c, TPU_I32, 2, s23), tcs = tt_make(csrc, TPU_I32, 2, s22),
               tci = tt_make(cidx, TPU_I64, 1, s2);
  tpu_arg_t ca[4] = {ta_t(&tc), ta_i(1), ta_t(&tci), ta_t(&tcs)};
  CHECK_OK(tt_run("index_copy_", ca, 4, &tc, 1));
  int32_t cw[6] = {8, 0, 7, 10, 0, 9};
  for (int i = 0; i < 6; i++) CHECK(c[i] == cw[i]);

  /* index_fill with a negative index (wraps) */
  float f[6] = {0};
  int64_t fidx[1] = {-1}, s1[1] = {1};
  tpu_tensor_t tf = tt_make(f, TPU_F32, 2, s23), tfi = tt_make(fidx, TPU_I64, 1, s1);
  tpu_arg_t fa[4] = {ta_t(&tf), ta_i(0), ta_t(&tfi), ta_d(5.0)};
  CHECK_OK(tt_run("index_fill_.int_Scalar", fa, 4, &tf, 1));
  CHECK(f[0] == 0 && f[2] == 0 && f[3] == 5 && f[5] == 5);
}

static void test_take_put(void) {
  /* take from a transposed view: logical [[0,2,4],[1,3,5]] */
  float x[6] = {0, 1, 2, 3, 4, 5}, o[3];
  int64_t s32[2] = {3, 2}, idx[3] = {-1, 1, 3}, s3[1] = {3};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s32);
  tx.sizes[0] = 2; tx.sizes[1] = 3; tx.strides[0] = 1; tx.strides[1] = 2;
  tpu_tensor_t ti = tt_make(idx, TPU_I64, 1, s3), to = tt_make(o, TPU_F32, 1, s3);
  tpu_arg_t a[2] = {ta_t(&tx), ta_t(&ti)};
  CHECK_OK(tt_run("take", a, 2, &to, 1));
  CHECK(o[0] == 5 && o[1] == 2 && o[2] == 1);
  idx[2] = 6;
  check_error(tt_run("take", a, 2, &to, 1), TPU_CODE_OUT_OF_RANGE, "index 6 on a tensor of 6 elements");

  /* put_ with accumulate and a duplicate index */
  int64_t p[4] = {1, 1, 1, 1}, pidx[3] = {0, 3, 0}, src[3] = {5, 6, 7}, s4[1] = {4};
  tpu_tensor_t tp = tt_make(p, TPU_I64, 1, s4), tpi = tt_make(pidx, TPU_I64, 1, s3),
               tps = tt_make(src, TPU_I64, 1, s3);
  tpu_arg_t pa[4] = {ta_t(&tp), ta_t(&tpi), ta_t(&tps), ta_b(true)};
  CHECK_OK(tt_run("put_", pa, 4, &tp, 1));
  CHECK(p[0] == 13 && p[1] == 1 && p[2] == 1 && p[3] == 7);
}

static void test_advanced_index(void) {
  float x[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  int64_t s234[3] = {2, 3, 4}, s2[1] = {2};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 3, s234);

  /* adjacent: x[:, [0, 2], [1, -1]] -> [2, 2] */
  int64_t i1[2] = {0, 2}, i2[2] = {1, -1};
  tpu_tensor_t idx[3] = {none_tensor(), tt_make(i1, TPU_I64, 1, s2), tt_make(i2, TPU_I64, 1, s2)};
  float o[12];
  int64_t s22[2] = {2, 2};
  tpu_tensor_t to = tt_make(o, TPU_F32, 2, s22);
  tpu_arg_t a[2] = {ta_t(&tx), ta_tl(idx, 3)};
  CHECK_OK(tt_run("index.Tensor", a, 2, &to, 1));
  float w1[4] = {1, 11, 13, 23};
  for (int i = 0; i < 4; i++) CHECK_NEAR(o[i], w1[i], 0);

  /* non-adjacent: x[[0, 1], :, [1, 2]] -> [2, 3] (index dims first) */
  int32_t j0[2] = {0, 1}, j2[2] = {1, 2};
  tpu_tensor_t idx2[3] = {tt_make(j0, TPU_I32, 1, s2), none_tensor(), tt_make(j2, TPU_I32, 1, s2)};
  int64_t s23[2] = {2, 3};
  tpu_tensor_t to2 = tt_make(o, TPU_F32, 2, s23);
  tpu_arg_t a2[2] = {ta_t(&tx), ta_tl(idx2, 3)};
  CHECK_OK(tt_run("index.Tensor", a2, 2, &to2, 1));
  float w2[6] = {1, 5, 9, 14, 18, 22};
  for (int i = 0; i < 6; i++) CHECK_NEAR(o[i], w2[i], 0);

  /* broadcast index tensors, adjacent after a None: x[:, [[0],[2]], [1, 3]] -> [2, 2, 2] */
  int64_t b1[2] = {0, 2}, b2[2] = {1, 3}, s21[2] = {2, 1}, s222[3] = {2, 2, 2};
  tpu_tensor_t idx3[3] = {none_tensor(), tt_make(b1, TPU_I64, 2, s21), tt_make(b2, TPU_I64, 1, s2)};
  float o3[8];
  tpu_tensor_t to3 = tt_make(o3, TPU_F32, 3, s222);
  tpu_arg_t a3[2] = {ta_t(&tx), ta_tl(idx3, 3)};
  CHECK_OK(tt_run("index.Tensor", a3, 2, &to3, 1));
  float w3[8] = {1, 3, 9, 11, 13, 15, 21, 23};
  for (int i = 0; i < 8; i++) CHECK_NEAR(o3[i], w3[i], 0);

  /* out of range */
  i1[1] = 3;
  check_error(tt_run("index.Tensor", a, 2, &to, 1), TPU_CODE_OUT_OF_RANGE,
              "index 3 is out of bounds for dimension 1 with size 3");
}

static void test_index_put(void) {
  /* self [4,2]; self[[1, 3, 1]] += values [3,2] (duplicate row 1) */
  float s[8] = {0}, v[6] = {1, 2, 3, 4, 5, 6};
  int64_t i0[3] = {1, 3, 1}, s42[2] = {4, 2}, s32[2] = {3, 2}, s3[1] = {3};
  tpu_tensor_t ts = tt_make(s, TPU_F32, 2, s42), tv = tt_make(v, TPU_F32, 2, s32);
  tpu_tensor_t idx[1] = {tt_make(i0, TPU_I64, 1, s3)};
  tpu_arg_t a[4] = {ta_t(&ts), ta_tl(idx, 1), ta_t(&tv), ta_b(true)};
  CHECK_OK(tt_run("index_put_", a, 4, &ts, 1));
  float w[8] = {0, 0, 6, 8, 0, 0, 3, 4};
  for (int i = 0; i < 8; i++) CHECK_NEAR(s[i], w[i], 0);
  /* again through _index_put_impl_ (accumulate, unsafe) */
  tpu_arg_t a5[5] = {ta_t(&ts), ta_tl(idx, 1), ta_t(&tv), ta_b(true), ta_b(false)};
  CHECK_OK(tt_run("_index_put_impl_", a5, 5, &ts, 1));
  for (int i = 0; i < 8; i++) CHECK_NEAR(s[i], 2 * w[i], 0);

  /* functional, no accumulate, value broadcast from a 0-d tensor: self[[0, -1], [1, 0]] = 9 */
  int64_t r[2] = {0, -1}, cidx[2] = {1, 0}, s2[1] = {2};
  float nine = 9, out[8];
  tpu_tensor_t tnine = tt_make(&nine, TPU_F32, 0, NULL), tout = tt_make(out, TPU_F32, 2, s42);
  tpu_tensor_t idx2[2] = {tt_make(r, TPU_I64, 1, s2), tt_make(cidx, TPU_I64, 1, s2)};
  tpu_arg_t b[4] = {ta_t(&ts), ta_tl(idx2, 2), ta_t(&tnine), ta_b(false)};
  CHECK_OK(tt_run("index_put", b, 4, &tout, 1));
  float wb[8] = {0, 9, 12, 16, 0, 0, 9, 8};
  for (int i = 0; i < 8; i++) CHECK_NEAR(out[i], wb[i], 0);

  /* values that do not broadcast */
  int64_t s4[1] = {4};
  tpu_tensor_t tv4 = tt_make(v, TPU_F32, 1, s4);
  tpu_arg_t c[4] = {ta_t(&ts), ta_tl(idx2, 2), ta_t(&tv4), ta_b(false)};
  check_error(tt_run("index_put", c, 4, &tout, 1), TPU_CODE_INVALID_ARGUMENT, "shape mismatch");
}

static void test_nonzero(void) {
  /* transposed view of [[0,1,0],[2,0,3]] stored as [3,2] */
  float x[6] = {0, 2, 1, 0, 0, 3};
  int64_t s32[2] = {3, 2};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s32);
  tx.sizes[0] = 2; tx.sizes[1] = 3; tx.strides[0] = 1; tx.strides[1] = 2;
  CHECK(tpu_count_nonzero_all(&tx) == 3);
  int64_t o[6], s[2] = {3, 2};
  tpu_tensor_t to = tt_make(o, TPU_I64, 2, s);
  tpu_arg_t a[1] = {ta_t(&tx)};
  CHECK_OK(tt_run("nonzero", a, 1, &to, 1));
  int64_t w[6] = {0, 1, 1, 0, 1, 2};
  for (int i = 0; i < 6; i++) CHECK(o[i] == w[i]);

  /* many blocks: every 7th element of a large bool tensor */
  int64_t n = 100000;
  uint8_t* big = calloc((size_t)n, 1);
  int64_t* bo = malloc((size_t)n * sizeof(int64_t));
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i += 7) big[i] = 1, cnt++;
  tpu_tensor_t tb = tt_make(big, TPU_BOOL, 1, &n);
  CHECK(tpu_count_nonzero_all(&tb) == cnt);
  int64_t sb[2] = {cnt, 1};
  tpu_tensor_t tbo = tt_make(bo, TPU_I64, 2, sb);
  tpu_arg_t b[1] = {ta_t(&tb)};
  CHECK_OK(tt_run("nonzero", b, 1, &tbo, 1));
  bool ok = true;
  for (int64_t k = 0; k < cnt; k++) ok = ok && bo[k] == 7 * k;
  CHECK(ok);
  free(big);
  free(bo);

  /* bf16 -0.0 is zero */
  uint16_t h[2] = {0x8000, tpu_f32_to_bf16(0.5f)};
  int64_t s2[1] = {2};
  tpu_tensor_t th = tt_make(h, TPU_BF16, 1, s2);
  CHECK(tpu_count_nonzero_all(&th) == 1);
}

static void test_triangle(void) {
  /* [2,3,3] batch, triu diag 1 and tril diag -1 in place */
  float x[18], o[18];
  for (int i = 0; i < 18; i++) x[i] = (float)(i + 1);
  int64_t s[3] = {2, 3, 3};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 3, s), to = tt_make(o, TPU_F32, 3, s);
  tpu_arg_t a[2] = {ta_t(&tx), ta_i(1)};
  CHECK_OK(tt_run("triu", a, 2, &to, 1));
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        int k = b * 9 + i * 3 + j;
        CHECK(o[k] == (j - i >= 1 ? x[k] : 0));
      }
  tpu_arg_t a2[2] = {ta_t(&tx), ta_i(-1)};
  CHECK_OK(tt_run("tril_", a2, 2, &tx, 1));
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        int k = b * 9 + i * 3 + j;
        CHECK(x[k] == (j - i <= -1 ? (float)(k + 1) : 0));
      }
  int64_t s1[1] = {3};
  tpu_tensor_t t1 = tt_make(x, TPU_F32, 1, s1);
  tpu_arg_t a3[2] = {ta_t(&t1), ta_i(0)};
  check_error(tt_run("triu", a3, 2, &to, 1), TPU_CODE_INVALID_ARGUMENT, "at least 2 dimensions");
}

static void test_ranges(void) {
  double o[4];
  int64_t s4[1] = {4};
  tpu_tensor_t to = tt_make(o, TPU_F64, 1, s4);
  tpu_arg_t a[4] = {ta_d(0.5), ta_d(2.0), ta_d(0.4), ta_t(&to)};
  CHECK_OK(tt_run("arange.start_out", a, 4, &to, 1));
  for (int i = 0; i < 4; i++) CHECK(o[i] == 0.5 + 0.4 * i);
  int32_t oi[4];
  tpu_tensor_t toi = tt_make(oi, TPU_I32, 1, s4);
  tpu_arg_t b[4] = {ta_i(10), ta_i(2), ta_i(-2), ta_t(&toi)};
  CHECK_OK(tt_run("arange.start_out", b, 4, &toi, 1));
  CHECK(oi[0] == 10 && oi[1] == 8 && oi[2] == 6 && oi[3] == 4);
  /* range.out (inclusive end) into a 2x2 out: filled in row-major order */
  int64_t s22[2] = {2, 2};
  tpu_tensor_t to22 = tt_make(oi, TPU_I32, 2, s22);
  tpu_arg_t e[4] = {ta_i(0), ta_i(3), ta_i(1), ta_t(&to22)};
  CHECK_OK(tt_run("range.out", e, 4, &to22, 1));
  CHECK(oi[0] == 0 && oi[1] == 1 && oi[2] == 2 && oi[3] == 3);
  b[2] = ta_i(0);
  check_error(tt_run("arange.start_out", b, 4, &toi, 1), TPU_CODE_INVALID_ARGUMENT, "step must be nonzero");

  /* linspace(-3, 10, 6) into int64 truncates like PyTorch: [-3, 0, 2, 4, 7, 10] */
  int64_t ol[6], s6[1] = {6};
  tpu_tensor_t tol = tt_make(ol, TPU_I64, 1, s6);
  tpu_arg_t l[4] = {ta_i(-3), ta_i(10), ta_i(6), ta_t(&tol)};
  CHECK_OK(tt_run("linspace.out", l, 4, &tol, 1));
  int64_t lw[6] = {-3, 0, 2, 4, 7, 10};
  for (int i = 0; i < 6; i++) CHECK(ol[i] == lw[i]);
  float of[4];
  tpu_tensor_t tof = tt_make(of, TPU_F32, 1, s4);
  tpu_arg_t g[5] = {ta_d(0), ta_d(3), ta_i(4), ta_d(2.0), ta_t(&tof)};
  CHECK_OK(tt_run("logspace.out", g, 5, &tof, 1));
  for (int i = 0; i < 4; i++) CHECK_NEAR(of[i], (double)(1 << i), 1e-6);
}

static void test_flip_roll(void) {
  int16_t x[6] = {0, 1, 2, 3, 4, 5}, o[6];
  int64_t s23[2] = {2, 3}, d1[1] = {1}, d01[2] = {0, 1};
  tpu_tensor_t tx = tt_make(x, TPU_I16, 2, s23), to = tt_make(o, TPU_I16, 2, s23);
  tpu_arg_t a[2] = {ta_t(&tx), ta_il(d1, 1)};
  CHECK_OK(tt_run("flip", a, 2, &to, 1));
  int16_t fw[6] = {2, 1, 0, 5, 4, 3};
  for (int i = 0; i < 6; i++) CHECK(o[i] == fw[i]);
  tpu_arg_t a2[2] = {ta_t(&tx), ta_il(d01, 2)};
  CHECK_OK(tt_run("flip", a2, 2, &to, 1));
  for (int i = 0; i < 6; i++) CHECK(o[i] == 5 - i);

  int64_t sh[2] = {1, -1};
  tpu_arg_t r[3] = {ta_t(&tx), ta_il(sh, 2), ta_il(d01, 2)};
  CHECK_OK(tt_run("roll", r, 3, &to, 1));
  int16_t rw[6] = {4, 5, 3, 1, 2, 0};
  for (int i = 0; i < 6; i++) CHECK(o[i] == rw[i]);
  int64_t sh2[1] = {2};
  tpu_arg_t r2[3] = {ta_t(&tx), ta_il(sh2, 1), ta_il(NULL, 0)};
  CHECK_OK(tt_run("roll", r2, 3, &to, 1));
  int16_t rw2[6] = {4, 5, 0, 1, 2, 3};
  for (int i = 0; i < 6; i++) CHECK(o[i] == rw2[i]);
}

static void test_masked_scatter(void) {
  float s[4] = {0, 0, 0, 0}, src[3] = {7, 8, 9}, o[4];
  uint8_t m[2] = {1, 0};
  int64_t s22[2] = {2, 2}, s2[1] = {2}, s3[1] = {3};
  tpu_tensor_t ts = tt_make(s, TPU_F32, 2, s22), tm = tt_make(m, TPU_BOOL, 1, s2),
               tsrc = tt_make(src, TPU_F32, 1, s3), to = tt_make(o, TPU_F32, 2, s22);
  tpu_arg_t a[3] = {ta_t(&ts), ta_t(&tm), ta_t(&tsrc)};
  CHECK_OK(tt_run("masked_scatter", a, 3, &to, 1));
  CHECK(o[0] == 7 && o[1] == 0 && o[2] == 8 && o[3] == 0);
  m[1] = 1; /* needs 4 source elements */
  check_error(tt_run("masked_scatter", a, 3, &to, 1), TPU_CODE_INVALID_ARGUMENT, "Number of elements of source");
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_cat();
  test_index_select();
  test_gather_scatter();
  test_index_add_copy_fill();
  test_take_put();
  test_advanced_index();
  test_index_put();
  test_nonzero();
  test_triangle();
  test_ranges();
  test_flip_roll();
  test_masked_scatter();
  TEST_MAIN_END();
}
