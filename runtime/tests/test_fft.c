/* Complex kernels and FFTs without PyTorch: _fft_c2c against a direct DFT for
 * lengths of every kind (radix 2/3/4/5, a direct odd radix, Bluestein
 * primes), forward and backward with each norm; the same in float
 * (complex64) and double (complex128), on each instruction set the CPU has,
 * for line counts that fill the 8 x 8 transpose tiles or not, lines along a
 * strided dim (adjacent or not) and more lengths than the plan cache holds;
 * r2c / c2r round trips with odd line counts (two real lines per complex
 * lane); and complex element-wise ops, promotion and products
 * (tests/test_complex.py and tests/test_fft.py compare the same against
 * PyTorch). */
#include <complex.h>
#include <math.h>
#include <stdlib.h>

#include "test_util.h"
#include "targets/host/kernels/vecmath.h"

typedef double _Complex zc_t;

static double frand(unsigned* s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* direct DFT, sign -1 forward (the roots from one table) */
static void dft(const zc_t* x, zc_t* y, int64_t n, int sign) {
  zc_t* root = malloc(sizeof(zc_t) * (size_t)n);
  for (int64_t j = 0; j < n; j++) {
    const double a = sign * 2.0 * M_PI * (double)j / (double)n;
    root[j] = CMPLX(cos(a), sin(a));
  }
  for (int64_t k = 0; k < n; k++) {
    zc_t acc = 0;
    for (int64_t j = 0; j < n; j++) acc += x[j] * root[(j * k) % n];
    y[k] = acc;
  }
  free(root);
}

static void test_c2c_lengths(void) {
  const int64_t lengths[] = {1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 16, 17, 25, 36, 60, 97, 128, 210, 251};
  unsigned seed = 1;
  for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
    const int64_t n = lengths[li];
    zc_t* x = malloc(sizeof(zc_t) * (size_t)n * 2);
    zc_t* y = malloc(sizeof(zc_t) * (size_t)n * 2);
    zc_t* ref = malloc(sizeof(zc_t) * (size_t)n);
    for (int64_t i = 0; i < 2 * n; i++) x[i] = CMPLX(frand(&seed), frand(&seed));
    for (int norm = 0; norm < 3; norm++)
      for (int fwd = 0; fwd < 2; fwd++) {
        int64_t sizes[2] = {2, n}, dims[1] = {1};
        tpu_tensor_t tx = tt_make(x, TPU_C128, 2, sizes), ty = tt_make(y, TPU_C128, 2, sizes);
        tpu_arg_t a[4] = {ta_t(&tx), ta_il(dims, 1), ta_i(norm), ta_b(fwd)};
        CHECK_OK(tt_run("_fft_c2c", a, 4, &ty, 1));
        const double scale = norm == 2 ? 1.0 / (double)n : norm == 1 ? 1.0 / sqrt((double)n) : 1.0;
        for (int row = 0; row < 2; row++) {
          dft(x + row * n, ref, n, fwd ? -1 : 1);
          for (int64_t k = 0; k < n; k++) CHECK(cabs(y[row * n + k] - ref[k] * scale) < 1e-9 * n);
        }
      }
    free(x);
    free(y);
    free(ref);
  }
}

/* _fft_c2c of `lines` lines of length n, along dim 1 of a contiguous
 * [lines, n] tensor (along = 1) or along dim 0 of [n, lines * gap] with
 * every gap-th column taken (gap 1: adjacent lines), against the DFT: the
 * largest error relative to the largest value. */
static double c2c_error(tpu_dtype_t dt, int64_t n, int64_t lines, int along, int64_t gap, bool fwd,
                        unsigned* seed) {
  const bool f32 = dt == TPU_C64;
  const int64_t cols = along == 1 ? n : lines * gap, rows = along == 1 ? lines : n;
  const size_t es = f32 ? 8 : 16;
  char* x = malloc(es * (size_t)(rows * cols));
  char* y = malloc(es * (size_t)(rows * cols));
  zc_t* in = malloc(sizeof(zc_t) * (size_t)n);
  zc_t* ref = malloc(sizeof(zc_t) * (size_t)n);
  for (int64_t i = 0; i < rows * cols; i++) {
    const double re = frand(seed), im = frand(seed);
    if (f32) {
      ((float*)x)[2 * i] = (float)re;
      ((float*)x)[2 * i + 1] = (float)im;
    } else {
      ((double*)x)[2 * i] = re;
      ((double*)x)[2 * i + 1] = im;
    }
  }
  tpu_tensor_t tx, ty;
  if (along == 1) {
    int64_t sizes[2] = {lines, n};
    tx = tt_make(x, dt, 2, sizes);
    ty = tt_make(y, dt, 2, sizes);
  } else { /* [n, lines] views with column stride gap */
    int64_t sizes[2] = {n, lines};
    tx = tt_make(x, dt, 2, sizes);
    ty = tt_make(y, dt, 2, sizes);
    tx.strides[0] = ty.strides[0] = cols;
    tx.strides[1] = ty.strides[1] = gap;
  }
  int64_t dims[1] = {along};
  tpu_arg_t a[4] = {ta_t(&tx), ta_il(dims, 1), ta_i(0), ta_b(fwd)};
  CHECK_OK(tt_run("_fft_c2c", a, 4, &ty, 1));
  double err = 0, big = 0;
  for (int64_t l = 0; l < lines; l++) {
    /* element k of line l */
    const int64_t at0 = along == 1 ? l * n : l * gap, step = along == 1 ? 1 : cols;
    for (int64_t k = 0; k < n; k++) {
      const int64_t i = at0 + k * step;
      in[k] = f32 ? CMPLX(((float*)x)[2 * i], ((float*)x)[2 * i + 1])
                  : CMPLX(((double*)x)[2 * i], ((double*)x)[2 * i + 1]);
    }
    dft(in, ref, n, fwd ? -1 : 1);
    for (int64_t k = 0; k < n; k++) {
      const int64_t i = at0 + k * step;
      const zc_t got = f32 ? CMPLX(((float*)y)[2 * i], ((float*)y)[2 * i + 1])
                           : CMPLX(((double*)y)[2 * i], ((double*)y)[2 * i + 1]);
      err = fmax(err, cabs(got - ref[k]));
      big = fmax(big, cabs(ref[k]));
    }
  }
  free(x);
  free(y);
  free(in);
  free(ref);
  return err / fmax(big, 1e-300);
}

/* float and double, each ISA, lines in blocks full or not, rows or columns */
static void test_c2c_paths(void) {
  const int64_t lengths[] = {1, 2, 8, 12, 45, 49, 64, 77, 100, 143, 256, 1009};
  const int64_t line_counts[] = {1, 8, 19};
  const tpu_isa_t isas[2] = {TPU_ISA_PORTABLE, TPU_ISA_AVX2};
  unsigned seed = 3;
  for (int k = 0; k < 2; k++) {
    tpu_host_isa_override(isas[k]);
    for (int d = 0; d < 2; d++) {
      const tpu_dtype_t dt = d ? TPU_C128 : TPU_C64;
      const double tol = d ? 1e-13 : 3e-6;
      for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
        for (size_t ci = 0; ci < sizeof line_counts / sizeof line_counts[0]; ci++) {
          const int64_t n = lengths[li], lines = line_counts[ci];
          const double e_rows = c2c_error(dt, n, lines, 1, 1, ci % 2 == 0, &seed);
          const double e_cols = c2c_error(dt, n, lines, 0, 1, ci % 2 == 1, &seed);
          const double e_gaps = c2c_error(dt, n, lines, 0, 3, true, &seed);
          if (!(e_rows < tol && e_cols < tol && e_gaps < tol))
            fprintf(stderr, "c2c %s isa %d n %lld lines %lld: errors %g %g %g\n",
                    tpu_dtype_name(dt), (int)isas[k], (long long)n, (long long)lines, e_rows, e_cols,
                    e_gaps);
          CHECK(e_rows < tol && e_cols < tol && e_gaps < tol);
        }
    }
  }
  tpu_host_isa_override(-1);
  /* more lengths than the plan cache holds, then the first again */
  for (int64_t n = 30; n < 70; n++) CHECK(c2c_error(TPU_C64, n, 2, 1, 1, true, &seed) < 3e-6);
  CHECK(c2c_error(TPU_C64, 30, 2, 1, 1, true, &seed) < 3e-6);
}

/* float r2c then c2r gives the input back, for odd and even line counts
 * (the last lane of an odd count holds one real line) and lengths */
static void test_real_round_trip_f32(void) {
  unsigned seed = 11;
  const int64_t lengths[] = {1, 6, 17, 64, 250};
  for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
    for (int64_t lines = 1; lines <= 19; lines += 9) {
      const int64_t n = lengths[li], h = n / 2 + 1;
      float* x = malloc(sizeof(float) * (size_t)(n * lines));
      float* back = malloc(sizeof(float) * (size_t)(n * lines));
      float* spec = malloc(sizeof(float) * 2 * (size_t)(h * lines));
      zc_t* full = malloc(sizeof(zc_t) * (size_t)n);
      zc_t* ref = malloc(sizeof(zc_t) * (size_t)n);
      for (int64_t i = 0; i < n * lines; i++) x[i] = (float)frand(&seed);
      int64_t sn[2] = {lines, n}, sh[2] = {lines, h}, dims[1] = {1};
      tpu_tensor_t tx = tt_make(x, TPU_F32, 2, sn), ts = tt_make(spec, TPU_C64, 2, sh);
      tpu_arg_t a[4] = {ta_t(&tx), ta_il(dims, 1), ta_i(0), ta_b(true)};
      CHECK_OK(tt_run("_fft_r2c", a, 4, &ts, 1));
      for (int64_t l = 0; l < lines; l++) {
        for (int64_t i = 0; i < n; i++) full[i] = x[l * n + i];
        dft(full, ref, n, -1);
        for (int64_t k = 0; k < h; k++) {
          const zc_t got = CMPLX(spec[2 * (l * h + k)], spec[2 * (l * h + k) + 1]);
          CHECK(cabs(got - ref[k]) < 1e-5 * (double)n);
        }
      }
      tpu_tensor_t tb = tt_make(back, TPU_F32, 2, sn);
      tpu_arg_t b[4] = {ta_t(&ts), ta_il(dims, 1), ta_i(2), ta_i(n)};
      CHECK_OK(tt_run("_fft_c2r", b, 4, &tb, 1));
      for (int64_t i = 0; i < n * lines; i++) CHECK_NEAR(back[i], x[i], 1e-5);
      free(x);
      free(back);
      free(spec);
      free(full);
      free(ref);
    }
}

/* rfft then irfft gives the input back; r2c equals c2c on the real input */
static void test_real_round_trip(void) {
  unsigned seed = 7;
  for (int64_t n = 1; n <= 40; n += 3) {
    const int64_t h = n / 2 + 1;
    double* x = malloc(sizeof(double) * (size_t)n);
    double* back = malloc(sizeof(double) * (size_t)n);
    zc_t* spec = malloc(sizeof(zc_t) * (size_t)h);
    zc_t* full = malloc(sizeof(zc_t) * (size_t)n);
    zc_t* ref = malloc(sizeof(zc_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
      x[i] = frand(&seed);
      full[i] = x[i];
    }
    int64_t sn[1] = {n}, sh[1] = {h}, dims[1] = {0};
    tpu_tensor_t tx = tt_make(x, TPU_F64, 1, sn), ts = tt_make(spec, TPU_C128, 1, sh);
    tpu_arg_t a[4] = {ta_t(&tx), ta_il(dims, 1), ta_i(0), ta_b(true)};
    CHECK_OK(tt_run("_fft_r2c", a, 4, &ts, 1));
    dft(full, ref, n, -1);
    for (int64_t k = 0; k < h; k++) CHECK(cabs(spec[k] - ref[k]) < 1e-10 * (double)n);
    tpu_tensor_t tb = tt_make(back, TPU_F64, 1, sn);
    tpu_arg_t b[4] = {ta_t(&ts), ta_il(dims, 1), ta_i(2), ta_i(n)};
    CHECK_OK(tt_run("_fft_c2r", b, 4, &tb, 1));
    for (int64_t i = 0; i < n; i++) CHECK_NEAR(back[i], x[i], 1e-12);
    free(x);
    free(back);
    free(spec);
    free(full);
    free(ref);
  }
}

static void test_complex_ops(void) {
  CHECK(tpu_dtype_size(TPU_C64) == 8 && tpu_dtype_size(TPU_C128) == 16);
  CHECK(tpu_dtype_promote(TPU_C64, TPU_F64) == TPU_C128);
  CHECK(tpu_dtype_promote(TPU_C64, TPU_I64) == TPU_C64);
  CHECK(tpu_dtype_narrow_op_takes("mul", TPU_C64) && !tpu_dtype_narrow_op_takes("cummax", TPU_C128));
  float a[4] = {1, 2, 3, -1}, b[4] = {0.5f, -1, 2, 2}, o[4];
  int64_t s[1] = {2};
  tpu_tensor_t ta = tt_make(a, TPU_C64, 1, s), tb = tt_make(b, TPU_C64, 1, s), to = tt_make(o, TPU_C64, 1, s);
  tpu_arg_t m[2] = {ta_t(&ta), ta_t(&tb)};
  CHECK_OK(tt_run("mul.Tensor", m, 2, &to, 1)); /* (1+2i)(0.5-i) = 2.5 + 0i; (3-i)(2+2i) = 8+4i */
  CHECK_NEAR(o[0], 2.5, 1e-6);
  CHECK_NEAR(o[1], 0.0, 1e-6);
  CHECK_NEAR(o[2], 8.0, 1e-6);
  CHECK_NEAR(o[3], 4.0, 1e-6);
  float ab[2];
  tpu_tensor_t tab = tt_make(ab, TPU_F32, 1, s);
  tpu_arg_t u[1] = {ta_t(&ta)};
  CHECK_OK(tt_run("abs", u, 1, &tab, 1));
  CHECK_NEAR(ab[0], sqrt(5.0), 1e-6);
  /* a complex scalar argument: add.Scalar(self, other, alpha) */
  tpu_arg_t sc = {0};
  sc.kind = TPU_ARG_COMPLEX;
  sc.v.c[0] = 1;
  sc.v.c[1] = -1;
  tpu_arg_t ad[3] = {ta_t(&ta), sc, ta_i(2)};
  CHECK_OK(tt_run("add.Scalar", ad, 3, &to, 1));
  CHECK_NEAR(o[0], 3.0, 1e-6);
  CHECK_NEAR(o[1], 0.0, 1e-6);
  /* a product: [1+2i, 3-i] . [0.5-i, 2+2i] as 1x2 @ 2x1 */
  int64_t s12[2] = {1, 2}, s21[2] = {2, 1}, s11[2] = {1, 1};
  float mo[2];
  tpu_tensor_t ma = tt_make(a, TPU_C64, 2, s12), mb = tt_make(b, TPU_C64, 2, s21), mc = tt_make(mo, TPU_C64, 2, s11);
  tpu_arg_t mm[2] = {ta_t(&ma), ta_t(&mb)};
  tpu_call_t base = {0};
  base.precision = TPU_PRECISION_HIGHEST;
  CHECK_OK(tt_run_with("mm", mm, 2, &mc, 1, &base));
  CHECK_NEAR(mo[0], 10.5, 1e-5);
  CHECK_NEAR(mo[1], 4.0, 1e-5);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_c2c_lengths();
  test_c2c_paths();
  test_real_round_trip();
  test_real_round_trip_f32();
  test_complex_ops();
  TEST_MAIN_END();
}
