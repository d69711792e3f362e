/* Convolution, pooling and resampling kernels: hand-checked cases and a
 * naive convolution reference for the im2col and direct (1x1) paths. */
#include "test_util.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* uniform in [-1, 1) */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

static tpu_arg_t ta_bl(const bool* v, int n) {
  tpu_arg_t a = {0};
  a.kind = TPU_ARG_BOOLLIST;
  a.v.blist = v;
  a.n = n;
  return a;
}

/* Runs an op like tt_run, with float32 products at full precision. */
static tpu_status_t run_exact(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* outs,
                              int nouts) {
  tpu_call_t base = {0};
  base.debug_checks = true;
  base.precision = TPU_PRECISION_HIGHEST;
  return tt_run_with(name, args, nargs, outs, nouts, &base);
}

static void check_all(const char* what, const float* got, const float* want, int64_t n,
                      double tol) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))) && bad++ < 3)
      fprintf(stderr, "%s[%lld] = %g, want %g\n", what, (long long)i, got[i], want[i]);
  CHECK(bad == 0);
}

/* Runs convolution (2-d, plain) with the given geometry and compares it to
 * a naive seven-loop reference. */
static void conv2d_case(int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh,
                        int64_t kw, int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
  int64_t oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
  int64_t ow = (w + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
  int64_t cg = cin / groups, og = cout / groups;
  int64_t xs[4] = {n, cin, h, w}, ws[4] = {cout, cg, kh, kw}, ys[4] = {n, cout, oh, ow};
  int64_t bs[1] = {cout};
  int64_t nx = n * cin * h * w, nw = cout * cg * kh * kw, ny = n * cout * oh * ow;
  float* x = malloc(sizeof(float) * nx);
  float* wt = malloc(sizeof(float) * nw);
  float* b = malloc(sizeof(float) * cout);
  float* y = malloc(sizeof(float) * ny);
  float* ref = calloc((size_t)ny, sizeof(float));
  for (int64_t i = 0; i < nx; i++) x[i] = (float)urand();
  for (int64_t i = 0; i < nw; i++) wt[i] = (float)urand();
  for (int64_t i = 0; i < cout; i++) b[i] = (float)urand();
  for (int64_t in = 0; in < n; in++)
    for (int64_t co = 0; co < cout; co++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double s = b[co];
          int64_t g = co / og;
          for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t a = 0; a < kh; a++)
              for (int64_t c = 0; c < kw; c++) {
                int64_t ih = i * stride - pad + a * dil, iw = j * stride - pad + c * dil;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                s += (double)x[((in * cin + g * cg + ci) * h + ih) * w + iw] *
                     wt[((co * cg + ci) * kh + a) * kw + c];
              }
          ref[((in * cout + co) * oh + i) * ow + j] = (float)s;
        }
  tpu_tensor_t tx = tt_make(x, TPU_F32, 4, xs), tw = tt_make(wt, TPU_F32, 4, ws);
  tpu_tensor_t tb = tt_make(b, TPU_F32, 1, bs), ty = tt_make(y, TPU_F32, 4, ys);
  int64_t st[2] = {stride, stride}, pd[2] = {pad, pad}, dl[2] = {dil, dil}, op[2] = {0, 0};
  tpu_arg_t args[9] = {ta_t(&tx), ta_t(&tw), ta_t(&tb), ta_il(st, 2), ta_il(pd, 2),
                       ta_il(dl, 2), ta_b(false), ta_il(op, 2), ta_i(groups)};
  CHECK_OK(run_exact("convolution", args, 9, &ty, 1));
  check_all("conv2d", y, ref, ny, 1e-5);
  free(x);
  free(wt);
  free(b);
  free(y);
  free(ref);
}

static void test_conv_paths(void) {
  conv2d_case(2, 4, 7, 6, 6, 3, 3, 2, 1, 1, 2); /* im2col, grouped, strided, padded */
  conv2d_case(1, 3, 9, 8, 4, 2, 3, 1, 1, 2, 1); /* im2col, dilated */
  conv2d_case(3, 5, 4, 5, 7, 1, 1, 1, 0, 1, 1); /* direct: the image is the im2col matrix */
  conv2d_case(2, 6, 5, 5, 6, 3, 3, 1, 1, 1, 6); /* depthwise */
}

/* 3x3 image 1..9, 2x2 kernel of ones: the window sums, and the backward. */
static void test_conv_hand(void) {
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 1, 1, 1}, y[4];
  int64_t xs[4] = {1, 1, 3, 3}, ws[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 2, 2};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 4, xs), tw = tt_make(w, TPU_F32, 4, ws);
  tpu_tensor_t ty = tt_make(y, TPU_F32, 4, ys);
  int64_t one[2] = {1, 1}, zero[2] = {0, 0};
  tpu_arg_t args[9] = {ta_t(&tx), ta_t(&tw), ta_none(), ta_il(one, 2), ta_il(zero, 2),
                       ta_il(one, 2), ta_b(false), ta_il(zero, 2), ta_i(1)};
  CHECK_OK(tt_run("convolution", args, 9, &ty, 1));
  const float want[4] = {12, 16, 24, 28};
  check_all("window sums", y, want, 4, 0);

  /* dy = ones: grad_input counts window coverage, grad_weight the window
   * sums again, grad_bias the number of outputs */
  float dy[4] = {1, 1, 1, 1}, gx[9], gw[4], gb[1];
  int64_t bs[1] = {1};
  tpu_tensor_t tdy = tt_make(dy, TPU_F32, 4, ys);
  tpu_tensor_t outs[3] = {tt_make(gx, TPU_F32, 4, xs), tt_make(gw, TPU_F32, 4, ws),
                          tt_make(gb, TPU_F32, 1, bs)};
  bool mask[3] = {true, true, true};
  tpu_arg_t bargs[11] = {ta_t(&tdy),    ta_t(&tx),    ta_t(&tw),      ta_il(bs, 1),
                         ta_il(one, 2), ta_il(zero, 2), ta_il(one, 2), ta_b(false),
                         ta_il(zero, 2), ta_i(1),      ta_bl(mask, 3)};
  CHECK_OK(tt_run("convolution_backward", bargs, 11, outs, 3));
  const float cover[9] = {1, 2, 1, 2, 4, 2, 1, 2, 1};
  check_all("grad_input", gx, cover, 9, 0);
  check_all("grad_weight", gw, want, 4, 0);
  CHECK(gb[0] == 4);

  /* transposed 1-d, stride 2: [1, 2] spreads [1, 1, 1] kernels at 0 and 2 */
  float xt[2] = {1, 2}, wt[3] = {1, 1, 1}, yt[5];
  int64_t xts[3] = {1, 1, 2}, wts[3] = {1, 1, 3}, yts[3] = {1, 1, 5}, s2[1] = {2}, z1[1] = {0},
          o1[1] = {1};
  tpu_tensor_t txt = tt_make(xt, TPU_F32, 3, xts), twt = tt_make(wt, TPU_F32, 3, wts);
  tpu_tensor_t tyt = tt_make(yt, TPU_F32, 3, yts);
  tpu_arg_t targs[9] = {ta_t(&txt),   ta_t(&twt), ta_none(),    ta_il(s2, 1), ta_il(z1, 1),
                        ta_il(o1, 1), ta_b(true), ta_il(z1, 1), ta_i(1)};
  CHECK_OK(tt_run("convolution", targs, 9, &tyt, 1));
  const float spread[5] = {1, 1, 3, 2, 2};
  check_all("transposed", yt, spread, 5, 0);

  /* mismatched channels are an error, not a crash */
  int64_t ws_bad[4] = {1, 2, 2, 2};
  tpu_tensor_t tw_bad = tt_make(w, TPU_F32, 4, ws_bad);
  args[1] = ta_t(&tw_bad);
  tpu_status_t st = tt_run("convolution", args, 9, &ty, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
}

/* max_pool2d_with_indices on a 4x4 plane, its backward, and a bad index. */
static void test_pool_indices(void) {
  float x[16] = {1, 5, 2, 0,  /* */
                 3, 4, 8, 8,  /* ties keep the first maximum */
                 9, 0, 1, 2,  /* */
                 7, 9, 3, NAN /* NaN wins */};
  float y[4];
  int64_t ind[4];
  int64_t xs[4] = {1, 1, 4, 4}, ys[4] = {1, 1, 2, 2}, k[2] = {2, 2}, zero[2] = {0, 0},
          one[2] = {1, 1};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 4, xs);
  tpu_tensor_t outs[2] = {tt_make(y, TPU_F32, 4, ys), tt_make(ind, TPU_I64, 4, ys)};
  tpu_arg_t args[6] = {ta_t(&tx), ta_il(k, 2), ta_il(k, 2), ta_il(zero, 2), ta_il(one, 2),
                       ta_b(false)};
  CHECK_OK(tt_run("max_pool2d_with_indices", args, 6, outs, 2));
  CHECK(y[0] == 5 && ind[0] == 1);
  CHECK(y[1] == 8 && ind[1] == 6);
  CHECK(y[2] == 9 && ind[2] == 8);
  CHECK(isnan(y[3]) && ind[3] == 15);

  float dy[4] = {1, 2, 3, 4}, dx[16];
  tpu_tensor_t tdy = tt_make(dy, TPU_F32, 4, ys), tind = tt_make(ind, TPU_I64, 4, ys);
  tpu_tensor_t tdx = tt_make(dx, TPU_F32, 4, xs);
  tpu_arg_t bargs[8] = {ta_t(&tdy),     ta_t(&tx),     ta_il(k, 2), ta_il(k, 2),
                        ta_il(zero, 2), ta_il(one, 2), ta_b(false), ta_t(&tind)};
  CHECK_OK(tt_run("max_pool2d_with_indices_backward", bargs, 8, &tdx, 1));
  float want[16] = {0};
  want[1] = 1;
  want[6] = 2;
  want[8] = 3;
  want[15] = 4;
  check_all("max_pool backward", dx, want, 16, 0);

  ind[2] = 16; /* outside the 16-element plane */
  tpu_status_t st = tt_run("max_pool2d_with_indices_backward", bargs, 8, &tdx, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
}

/* avg_pool2d of a 2x2 image with 2x2 windows, stride 1, padding 1 (a 3x3
 * output): count_include_pad and divisor_override. */
static void test_avg_pool(void) {
  float x[4] = {1, 2, 3, 4}, y[9];
  int64_t xs[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 3, 3}, k[2] = {2, 2}, s[2] = {1, 1},
          p[2] = {1, 1};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 4, xs), ty = tt_make(y, TPU_F32, 4, ys);
  tpu_arg_t args[7] = {ta_t(&tx),   ta_il(k, 2), ta_il(s, 2), ta_il(p, 2),
                       ta_b(false), ta_b(true),  ta_none()};
  CHECK_OK(tt_run("avg_pool2d", args, 7, &ty, 1));
  CHECK_NEAR(y[0], 1.0 / 4, 1e-7); /* padded windows count all 4 */
  CHECK_NEAR(y[4], 10.0 / 4, 1e-7);
  args[5] = ta_b(false);
  CHECK_OK(tt_run("avg_pool2d", args, 7, &ty, 1));
  CHECK_NEAR(y[0], 1.0, 1e-7); /* only the real elements */
  CHECK_NEAR(y[1], 3.0 / 2, 1e-7);
  args[6] = ta_i(3);
  CHECK_OK(tt_run("avg_pool2d", args, 7, &ty, 1));
  CHECK_NEAR(y[4], 10.0 / 3, 1e-6);
}

/* Nearest and linear (align_corners) upsampling and reflection padding of
 * tiny inputs. */
static void test_resample(void) {
  float x[4] = {1, 2, 3, 4}, y[16];
  int64_t xs[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 4, 4}, os[2] = {4, 4};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 4, xs), ty = tt_make(y, TPU_F32, 4, ys);
  tpu_arg_t args[4] = {ta_t(&tx), ta_il(os, 2), ta_none(), ta_none()};
  CHECK_OK(tt_run("upsample_nearest2d", args, 4, &ty, 1));
  const float want[16] = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  check_all("nearest", y, want, 16, 0);

  float l[2] = {0, 1}, ly[3];
  int64_t ls[3] = {1, 1, 2}, lys[3] = {1, 1, 3}, lo[1] = {3};
  tpu_tensor_t tl = tt_make(l, TPU_F32, 3, ls), tly = tt_make(ly, TPU_F32, 3, lys);
  tpu_arg_t largs[4] = {ta_t(&tl), ta_il(lo, 1), ta_b(true), ta_none()};
  CHECK_OK(tt_run("upsample_linear1d", largs, 4, &tly, 1));
  const float lwant[3] = {0, 0.5f, 1};
  check_all("linear", ly, lwant, 3, 0);

  /* reflection padding (2, 1) of [1, 2, 3], and its backward */
  float r[3] = {1, 2, 3}, ry[6], rg[3], ones[6] = {1, 1, 1, 1, 1, 1};
  int64_t rs[2] = {1, 3}, rys[2] = {1, 6}, pads[2] = {2, 1};
  tpu_tensor_t tr = tt_make(r, TPU_F32, 2, rs), try_ = tt_make(ry, TPU_F32, 2, rys);
  tpu_arg_t rargs[2] = {ta_t(&tr), ta_il(pads, 2)};
  CHECK_OK(tt_run("reflection_pad1d", rargs, 2, &try_, 1));
  const float rwant[6] = {3, 2, 1, 2, 3, 2};
  check_all("reflection_pad1d", ry, rwant, 6, 0);
  tpu_tensor_t tones = tt_make(ones, TPU_F32, 2, rys), trg = tt_make(rg, TPU_F32, 2, rs);
  tpu_arg_t bargs[3] = {ta_t(&tones), ta_t(&tr), ta_il(pads, 2)};
  CHECK_OK(tt_run("reflection_pad1d_backward", bargs, 3, &trg, 1));
  const float counts[3] = {1, 3, 2};
  check_all("reflection_pad1d_backward", rg, counts, 3, 0);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_conv_paths();
  test_conv_hand();
  test_pool_indices();
  test_avg_pool();
  test_resample();
  TEST_MAIN_END();
}
