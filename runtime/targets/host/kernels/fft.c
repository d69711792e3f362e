/* Discrete Fourier transforms: PyTorch's _fft_c2c, _fft_r2c and _fft_c2r.
 *
 * A 1-D transform of length n runs as a Stockham autosort FFT (no bit
 * reversal: every stage reads one buffer and writes the other) over the
 * factors of n: radix 4, 2, 3 and 5 butterflies, and a direct odd-radix
 * butterfly for primes up to 13. A length with a larger prime factor is
 * computed by Bluestein's algorithm: the transform as a convolution with a
 * chirp, done by FFTs of a 2^a 3^b 5^c length of at least 2n - 1.
 * Everything computes in double complex; complex64 rounds once on store.
 *
 * A transform over several dims applies the 1-D transform along each dim in
 * turn; every line along a dim is gathered into a contiguous buffer, so
 * inputs and outputs may have any strides. Lines are split across the thread
 * pool. Real input (r2c) enters as complex with imaginary part 0; a real
 * output (c2r) is the real part of the inverse of the Hermitian extension of
 * its half spectrum. Normalization 0 is none, 1 scales by 1/sqrt(n) and 2 by
 * 1/n, n the signal length of each transformed dim.
 */
#include <complex.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "zvalue.h"
#include "tpu/parallel.h"


#define FFT_MAX_FACTORS 64
#define FFT_MAX_DIRECT_RADIX 13

typedef struct fft_plan {
  int64_t n;
  int nf;
  int fac[FFT_MAX_FACTORS];
  zc_t* tw; /* per stage: m * (r - 1) twiddles, exp(-2 pi i p j / len) */
  /* Bluestein (n has a prime factor above FFT_MAX_DIRECT_RADIX): */
  struct fft_plan* sub; /* length m */
  int64_t m;
  zc_t* chirp; /* exp(-pi i k^2 / n), k < n */
  zc_t* bfft;  /* FFT of the conjugate chirp, divided by m */
} fft_plan_t;

/* Products written out: C's complex `*` checks for infinities (a call to
 * __muldc3 per product), which would dominate the butterflies. */
static inline zc_t zmul(zc_t a, zc_t b) {
  const double ar = creal(a), ai = cimag(a), br = creal(b), bi = cimag(b);
  return CMPLX(ar * br - ai * bi, ar * bi + ai * br);
}
static inline zc_t rot_neg_i(zc_t a) { return CMPLX(cimag(a), -creal(a)); } /* -i * a */

static zc_t unit(int64_t num, int64_t den) { /* exp(-2 pi i num / den) */
  const double a = -2.0 * M_PI * (double)(num % den) / (double)den;
  return CMPLX(cos(a), sin(a));
}

static void plan_free(fft_plan_t* p) {
  if (!p) return;
  free(p->tw);
  free(p->chirp);
  free(p->bfft);
  plan_free(p->sub);
  free(p);
}

static int64_t smooth_at_least(int64_t n) {
  for (int64_t m = n;; m++) {
    int64_t r = m;
    while (r % 2 == 0) r /= 2;
    while (r % 3 == 0) r /= 3;
    while (r % 5 == 0) r /= 5;
    if (r == 1) return m;
  }
}

static void plan_exec(const fft_plan_t* p, zc_t* x, zc_t* work);

static fft_plan_t* plan_make(int64_t n) {
  fft_plan_t* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  int64_t r = n;
  while (r % 4 == 0 && p->nf < FFT_MAX_FACTORS) { p->fac[p->nf++] = 4; r /= 4; }
  while (r % 2 == 0 && p->nf < FFT_MAX_FACTORS) { p->fac[p->nf++] = 2; r /= 2; }
  for (int64_t f = 3; r > 1; f += 2) {
    if (f * f > r) f = r; /* what is left is prime */
    while (r % f == 0 && p->nf < FFT_MAX_FACTORS) {
      p->fac[p->nf++] = (int)(f < INT32_MAX ? f : INT32_MAX);
      r /= f;
    }
  }
  bool direct = true;
  for (int i = 0; i < p->nf; i++) direct = direct && p->fac[i] <= FFT_MAX_DIRECT_RADIX;
  if (!direct) {
    p->nf = 0;
    p->m = smooth_at_least(2 * n - 1);
    p->sub = plan_make(p->m);
    p->chirp = malloc((size_t)n * sizeof(zc_t));
    p->bfft = calloc((size_t)p->m, sizeof(zc_t));
    zc_t* work = malloc((size_t)p->m * 2 * sizeof(zc_t));
    if (!p->sub || !p->chirp || !p->bfft || !work) {
      free(work);
      plan_free(p);
      return NULL;
    }
    for (int64_t k = 0; k < n; k++) p->chirp[k] = unit((k * k) % (2 * n), 2 * n);
    p->bfft[0] = conj(p->chirp[0]);
    for (int64_t k = 1; k < n; k++) p->bfft[k] = p->bfft[p->m - k] = conj(p->chirp[k]);
    plan_exec(p->sub, p->bfft, work);
    for (int64_t k = 0; k < p->m; k++) p->bfft[k] /= (double)p->m;
    free(work);
    return p;
  }
  p->tw = malloc((size_t)(2 * n + 1) * sizeof(zc_t));
  if (!p->tw) {
    plan_free(p);
    return NULL;
  }
  zc_t* t = p->tw;
  int64_t len = n;
  for (int i = 0; i < p->nf; i++) {
    const int rr = p->fac[i];
    const int64_t m = len / rr;
    for (int64_t q = 0; q < m; q++)
      for (int j = 1; j < rr; j++) *t++ = unit(q * j, len);
    len = m;
  }
  return p;
}

/* One Stockham stage: len = r * m, s lines interleaved (stride s). */
static void stage(int r, int64_t m, int64_t s, const zc_t* tw, const zc_t* x, zc_t* y) {
  const double c3 = -0.5, s3 = 0.86602540378443864676; /* cos, sin(2 pi / 3) */
  const double c51 = 0.30901699437494742410, c52 = -0.80901699437494742410;
  const double s51 = 0.95105651629515357212, s52 = 0.58778525229247312917;
  for (int64_t p = 0; p < m; p++) {
    const zc_t* w = tw + p * (r - 1);
    for (int64_t q = 0; q < s; q++) {
      const zc_t* a = x + q + s * p;
      zc_t* b = y + q + s * r * p;
      switch (r) {
        case 2: {
          const zc_t a0 = a[0], a1 = a[s * m];
          b[0] = a0 + a1;
          b[s] = zmul(a0 - a1, w[0]);
          break;
        }
        case 4: {
          const zc_t a0 = a[0], a1 = a[s * m], a2 = a[2 * s * m], a3 = a[3 * s * m];
          const zc_t t0 = a0 + a2, t1 = a0 - a2, t2 = a1 + a3, t3 = rot_neg_i(a1 - a3);
          b[0] = t0 + t2;
          b[s] = zmul(t1 + t3, w[0]);
          b[2 * s] = zmul(t0 - t2, w[1]);
          b[3 * s] = zmul(t1 - t3, w[2]);
          break;
        }
        case 3: {
          const zc_t a0 = a[0], a1 = a[s * m], a2 = a[2 * s * m];
          const zc_t t1 = a1 + a2, t2 = a0 + c3 * t1, t3 = rot_neg_i(s3 * (a1 - a2));
          b[0] = a0 + t1;
          b[s] = zmul(t2 + t3, w[0]);
          b[2 * s] = zmul(t2 - t3, w[1]);
          break;
        }
        case 5: {
          const zc_t a0 = a[0], a1 = a[s * m], a2 = a[2 * s * m], a3 = a[3 * s * m],
                     a4 = a[4 * s * m];
          const zc_t t1 = a1 + a4, t2 = a2 + a3, t3 = a1 - a4, t4 = a2 - a3;
          const zc_t u1 = a0 + c51 * t1 + c52 * t2, v1 = rot_neg_i(s51 * t3 + s52 * t4);
          const zc_t u2 = a0 + c52 * t1 + c51 * t2, v2 = rot_neg_i(s52 * t3 - s51 * t4);
          b[0] = a0 + t1 + t2;
          b[s] = zmul(u1 + v1, w[0]);
          b[2 * s] = zmul(u2 + v2, w[1]);
          b[3 * s] = zmul(u2 - v2, w[2]);
          b[4 * s] = zmul(u1 - v1, w[3]);
          break;
        }
        default: { /* direct odd radix */
          zc_t in[FFT_MAX_DIRECT_RADIX], wr[FFT_MAX_DIRECT_RADIX];
          for (int k = 0; k < r; k++) {
            in[k] = a[k * s * m];
            wr[k] = unit(k, r);
          }
          for (int j = 0; j < r; j++) {
            zc_t acc = 0;
            for (int k = 0; k < r; k++) acc += zmul(in[k], wr[(j * k) % r]);
            b[j * s] = j ? zmul(acc, w[j - 1]) : acc;
          }
          break;
        }
      }
    }
  }
}

/* Forward transform of x (length p->n) in place; work holds n (Bluestein:
 * 2m) elements. */
static void plan_exec(const fft_plan_t* p, zc_t* x, zc_t* work) {
  if (p->sub) {
    const int64_t n = p->n, m = p->m;
    zc_t* a = work;
    zc_t* w2 = work + m;
    for (int64_t k = 0; k < n; k++) a[k] = zmul(x[k], p->chirp[k]);
    for (int64_t k = n; k < m; k++) a[k] = 0;
    plan_exec(p->sub, a, w2);
    for (int64_t k = 0; k < m; k++) a[k] = conj(zmul(a[k], p->bfft[k]));
    plan_exec(p->sub, a, w2); /* the inverse, through conjugates */
    for (int64_t k = 0; k < n; k++) x[k] = zmul(conj(a[k]), p->chirp[k]);
    return;
  }
  zc_t* src = x;
  zc_t* dst = work;
  const zc_t* tw = p->tw;
  int64_t len = p->n, s = 1;
  for (int i = 0; i < p->nf; i++) {
    const int r = p->fac[i];
    const int64_t m = len / r;
    stage(r, m, s, tw, src, dst);
    tw += m * (r - 1);
    zc_t* t = src;
    src = dst;
    dst = t;
    len = m;
    s *= r;
  }
  if (src != x) memcpy(x, src, (size_t)p->n * sizeof(zc_t));
}

static size_t work_elems(const fft_plan_t* p) { return (size_t)(p->sub ? 2 * p->m : p->n); }

/* ---- lines along one dim ---- */
typedef enum { K_C2C, K_R2C, K_C2R } fft_kind_t;

typedef struct fft_job {
  const tpu_tensor_t* src;
  const tpu_tensor_t* dst;
  int dim;
  int64_t n; /* signal length */
  fft_kind_t kind;
  bool forward;
  double scale;
  const fft_plan_t* plan;
  int64_t lines;
  _Atomic int failed;
} fft_job_t;

/* Byte offsets of line l's first element in src and dst. */
static void line_offsets(const fft_job_t* j, int64_t l, int64_t* so, int64_t* dof) {
  const tpu_tensor_t *src = j->src, *dst = j->dst;
  int64_t rem = l, s = 0, d = 0;
  for (int k = dst->ndim - 1; k >= 0; k--) {
    if (k == j->dim) continue;
    const int64_t i = rem % dst->sizes[k];
    rem /= dst->sizes[k];
    s += i * src->strides[k];
    d += i * dst->strides[k];
  }
  *so = s * (int64_t)tpu_dtype_size(src->dtype);
  *dof = d * (int64_t)tpu_dtype_size(dst->dtype);
}

static inline zc_t mul_i(zc_t a) { return CMPLX(-cimag(a), creal(a)); } /* i * a */

/* Two real lines as one complex transform: z = x1 + i x2. r2c splits Z into
 * X1 = (Z_k + conj Z_{n-k}) / 2 and X2 = -i (Z_k - conj Z_{n-k}) / 2; c2r
 * inverts Z = X1 + i X2 (each the Hermitian extension of its half, the
 * imaginary parts of its DC and Nyquist terms dropped, as a real inverse
 * ignores them) and takes x1 = Re z, x2 = Im z. */
static void real_pair(const fft_job_t* j, int64_t l, zc_t* buf, zc_t* buf2, zc_t* work) {
  const tpu_tensor_t *src = j->src, *dst = j->dst;
  const int64_t n = j->n, sst = src->strides[j->dim] * (int64_t)tpu_dtype_size(src->dtype);
  const int64_t dstr = dst->strides[j->dim] * (int64_t)tpu_dtype_size(dst->dtype);
  const int64_t slen = src->sizes[j->dim], dlen = dst->sizes[j->dim];
  int64_t so[2], dof[2];
  line_offsets(j, l, &so[0], &dof[0]);
  line_offsets(j, l + 1, &so[1], &dof[1]);
  const char* sp[2] = {(const char*)src->data + so[0], (const char*)src->data + so[1]};
  char* dp[2] = {(char*)dst->data + dof[0], (char*)dst->data + dof[1]};
  if (j->kind == K_R2C) {
    for (int64_t k = 0; k < n; k++)
      buf[k] = k < slen ? CMPLX(tpu_load_f64(sp[0] + k * sst, src->dtype),
                                tpu_load_f64(sp[1] + k * sst, src->dtype))
                        : 0;
    plan_exec(j->plan, buf, work);
    for (int64_t k = 0; k < dlen; k++) {
      const zc_t z = buf[k], zc = conj(buf[k == 0 ? 0 : n - k]);
      tpu_store_z(dp[0] + k * dstr, dst->dtype, (z + zc) * (0.5 * j->scale));
      tpu_store_z(dp[1] + k * dstr, dst->dtype, mul_i(zc - z) * (0.5 * j->scale));
    }
    return;
  }
  /* K_C2R */
  const int64_t half = n / 2, h = half + 1 < slen ? half + 1 : slen;
  for (int64_t k = 0; k <= half; k++) {
    buf[k] = k < h ? tpu_load_z(sp[0] + k * sst, src->dtype) : 0;
    buf2[k] = k < h ? tpu_load_z(sp[1] + k * sst, src->dtype) : 0;
  }
  buf[0] = creal(buf[0]);
  buf2[0] = creal(buf2[0]);
  if (n % 2 == 0) {
    buf[half] = creal(buf[half]);
    buf2[half] = creal(buf2[half]);
  }
  for (int64_t k = half + 1; k < n; k++) buf[k] = conj(buf[n - k]) + mul_i(conj(buf2[n - k]));
  for (int64_t k = 0; k <= half; k++) buf[k] = buf[k] + mul_i(buf2[k]);
  for (int64_t k = 0; k < n; k++) buf[k] = conj(buf[k]);
  plan_exec(j->plan, buf, work);
  for (int64_t k = 0; k < dlen; k++) { /* conj(result): re = x1, -im = x2 */
    tpu_store_z(dp[0] + k * dstr, dst->dtype, creal(buf[k]) * j->scale);
    tpu_store_z(dp[1] + k * dstr, dst->dtype, -cimag(buf[k]) * j->scale);
  }
}

static void lines_range(void* vctx, int64_t begin, int64_t end) {
  fft_job_t* j = vctx;
  const tpu_tensor_t *src = j->src, *dst = j->dst;
  const int64_t n = j->n;
  zc_t* buf = malloc(((size_t)n * 2 + work_elems(j->plan)) * sizeof(zc_t));
  if (!buf) {
    j->failed = 1;
    return;
  }
  zc_t* buf2 = buf + n;
  zc_t* work = buf + 2 * n;
  const int64_t sst = src->strides[j->dim] * (int64_t)tpu_dtype_size(src->dtype);
  const int64_t dstr = dst->strides[j->dim] * (int64_t)tpu_dtype_size(dst->dtype);
  const int64_t slen = src->sizes[j->dim], dlen = dst->sizes[j->dim];
  for (int64_t l = begin; l < end; l++) {
    if (j->kind != K_C2C && l + 1 < end) {
      real_pair(j, l, buf, buf2, work);
      l++;
      continue;
    }
    int64_t so, dof;
    line_offsets(j, l, &so, &dof);
    const char* sp = (const char*)src->data + so;
    char* dp = (char*)dst->data + dof;
    if (j->kind == K_C2R) {
      const int64_t h = n / 2 + 1 < slen ? n / 2 + 1 : slen;
      for (int64_t k = 0; k < h; k++) buf[k] = tpu_load_z(sp + k * sst, src->dtype);
      for (int64_t k = h; k < n; k++) buf[k] = k > n / 2 ? conj(buf[n - k]) : 0;
    } else {
      for (int64_t k = 0; k < n; k++) buf[k] = k < slen ? tpu_load_z(sp + k * sst, src->dtype) : 0;
    }
    if (j->forward) {
      plan_exec(j->plan, buf, work);
    } else {
      for (int64_t k = 0; k < n; k++) buf[k] = conj(buf[k]);
      plan_exec(j->plan, buf, work);
      for (int64_t k = 0; k < n; k++) buf[k] = conj(buf[k]);
    }
    for (int64_t k = 0; k < dlen; k++) tpu_store_z(dp + k * dstr, dst->dtype, buf[k] * j->scale);
  }
  free(buf);
}

static tpu_status_t along(const char* op, const tpu_tensor_t* src, const tpu_tensor_t* dst, int dim,
                          int64_t n, fft_kind_t kind, bool forward, int64_t norm) {
  if (n == 0 || tpu_tensor_numel(dst) == 0) return TPU_OK;
  fft_plan_t* plan = plan_make(n);
  if (!plan) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a length-%lld plan", op, (long long)n);
  fft_job_t j = {src, dst, dim, n, kind, forward, 1.0, plan, 0, 0};
  j.scale = norm == 2 ? 1.0 / (double)n : norm == 1 ? 1.0 / sqrt((double)n) : 1.0;
  j.lines = tpu_tensor_numel(dst) / dst->sizes[dim];
  const int64_t grain = n >= 4096 ? 1 : (4096 + n - 1) / n;
  tpu_parallel_for(j.lines, grain, lines_range, &j);
  plan_free(plan);
  if (j.failed) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a length-%lld line", op, (long long)n);
  return TPU_OK;
}

/* dims argument (index 1) wrapped and checked against t */
static tpu_status_t read_dims(const tpu_call_t* c, const char* op, const tpu_tensor_t* t, int* dims,
                              int* nd) {
  const tpu_arg_t* a = &c->args[1];
  TPU_CHECK_ARG(a->kind == TPU_ARG_INTLIST && a->n <= TPU_MAX_DIMS, "%s: dim must be a list of ints", op);
  *nd = a->n;
  for (int i = 0; i < a->n; i++) {
    int64_t d = a->v.ilist[i] < 0 ? a->v.ilist[i] + t->ndim : a->v.ilist[i];
    TPU_CHECK_ARG(d >= 0 && d < t->ndim, "%s: dim %lld out of range for a %d-D tensor", op,
                  (long long)a->v.ilist[i], (int)t->ndim);
    dims[i] = (int)d;
  }
  return TPU_OK;
}

static tpu_status_t check_dtypes(const char* op, const tpu_tensor_t* in, const tpu_tensor_t* out,
                                 bool in_complex, bool out_complex) {
  const bool ok_in = in_complex ? tpu_dtype_is_complex(in->dtype)
                                : (in->dtype == TPU_F32 || in->dtype == TPU_F64);
  const bool ok_out = out_complex ? tpu_dtype_is_complex(out->dtype)
                                  : (out->dtype == TPU_F32 || out->dtype == TPU_F64);
  if (!ok_in || !ok_out)
    return TPU_ERR(UNIMPLEMENTED, "%s: unsupported dtypes %s -> %s (tpu transforms float32, float64, "
                   "complex64 and complex128)", op, tpu_dtype_name(in->dtype), tpu_dtype_name(out->dtype));
  return TPU_OK;
}

/* _fft_c2c(self, dim, normalization, forward) */
tpu_status_t tpu_k_fft_c2c(const tpu_call_t* c) {
  const char* op = "_fft_c2c";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, true, true));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  const int64_t norm = tpu_arg_i64(c, 2, 0);
  const bool forward = tpu_arg_bool(c, 3, true);
  if (nd == 0) return tpu_copy_strided(out, in);
  for (int i = 0; i < nd; i++)
    TPU_RETURN_IF_ERROR(along(op, i == 0 ? in : out, out, dims[i], out->sizes[dims[i]], K_C2C,
                              forward, norm));
  return TPU_OK;
}

/* _fft_r2c(self, dim, normalization, onesided): the last dim real-to-complex,
 * then the others complex-to-complex, all forward */
tpu_status_t tpu_k_fft_r2c(const tpu_call_t* c) {
  const char* op = "_fft_r2c";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, false, true));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  const int64_t norm = tpu_arg_i64(c, 2, 0);
  if (nd == 0) return tpu_copy_strided(out, in);
  const int last = dims[nd - 1];
  TPU_RETURN_IF_ERROR(along(op, in, out, last, in->sizes[last], K_R2C, true, norm));
  for (int i = 0; i < nd - 1; i++)
    TPU_RETURN_IF_ERROR(along(op, out, out, dims[i], out->sizes[dims[i]], K_C2C, true, norm));
  return TPU_OK;
}

/* _fft_c2r(self, dim, normalization, last_dim_size): the dims but the last
 * complex-to-complex backward (into a temporary: self is not written), then
 * the last complex-to-real */
tpu_status_t tpu_k_fft_c2r(const tpu_call_t* c) {
  const char* op = "_fft_c2r";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, true, false));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  const int64_t norm = tpu_arg_i64(c, 2, 0);
  if (nd == 0) return tpu_copy_strided(out, in);
  const int last = dims[nd - 1];
  const int64_t n = out->sizes[last];
  TPU_CHECK_ARG(n >= 1, "%s: invalid last_dim_size %lld", op, (long long)n);
  if (nd == 1) return along(op, in, out, last, n, K_C2R, false, norm);
  const int64_t numel = tpu_tensor_numel(in);
  void* buf = malloc((size_t)(numel > 0 ? numel : 1) * tpu_dtype_size(in->dtype));
  if (!buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a %lld-element temporary", op,
                           (long long)numel);
  tpu_tensor_t tmp;
  tpu_tensor_make_contig(&tmp, buf, in->dtype, in->ndim, in->sizes);
  tpu_status_t s = TPU_OK;
  for (int i = 0; i < nd - 1 && !s; i++)
    s = along(op, i == 0 ? in : &tmp, &tmp, dims[i], in->sizes[dims[i]], K_C2C, false, norm);
  if (!s) s = along(op, &tmp, out, last, n, K_C2R, false, norm);
  free(buf);
  return s;
}
