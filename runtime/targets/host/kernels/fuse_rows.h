/* Float32 row kernels of softmax, log_softmax and layer norm and of their
 * backward passes, shared by the
 * library (nn.c) and the C source the fusion compiler generates
 * (targets/host/fuse_codegen.c), so that a fused row gives the library's
 * values: the same run length, lane layout and summation order (runs of
 * float lanes added in double), normalization in float32. Only FMA
 * contraction may differ between the two compilations.
 *
 * Needs vecmath.h. A includer may define TPU_FR_INLINE (nn.c makes these
 * always_inline so that each ISA copy of its callers gets its own). */
#ifndef TPU_FUSE_ROWS_H_
#define TPU_FUSE_ROWS_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef TPU_FR_INLINE
#define TPU_FR_INLINE static inline
#endif

typedef float tpu_fr_v8f __attribute__((vector_size(32)));
typedef int32_t tpu_fr_v8i __attribute__((vector_size(32)));

/* Row sums add runs of up to TPU_FR_RUN elements in float32 across four
 * eight-lane vectors (at most eight additions per lane, far below float
 * precision), and the run totals in double: double accuracy for long rows at
 * float speed. A row's last run may be shorter (whole chunks of 32); the
 * last n % 32 elements add in double one at a time. */
#define TPU_FR_RUN 256
#define TPU_FR_CHUNK 32

TPU_FR_INLINE float tpu_fr_run_total(const tpu_fr_v8f a[4]) {
  tpu_fr_v8f s = (a[0] + a[1]) + (a[2] + a[3]);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* end of the run starting at i among the whole chunks [0, nc) */
TPU_FR_INLINE int64_t tpu_fr_run_end(int64_t i, int64_t nc) {
  return i + TPU_FR_RUN < nc ? i + TPU_FR_RUN : nc;
}

/* Sum over a row, in runs as above, of x * y, or without y of d = (x - mh)
 * - ml (d^2 with sq): the shift mh + ml keeps the float partials small for
 * rows far from zero. */
TPU_FR_INLINE double tpu_fr_accum(const float* x, const float* y, int64_t n, int sq, float mh,
                                  float ml) {
  double total = 0;
  const int64_t nc = n - n % TPU_FR_CHUNK;
  int64_t i = 0;
  while (i < nc) {
    tpu_fr_v8f a[4] = {{0}, {0}, {0}, {0}};
    for (const int64_t end = tpu_fr_run_end(i, nc); i < end; i += TPU_FR_CHUNK)
      for (int q = 0; q < 4; q++) {
        tpu_fr_v8f v, w;
        memcpy(&v, x + i + 8 * q, sizeof v);
        if (y) {
          memcpy(&w, y + i + 8 * q, sizeof w);
          a[q] += v * w;
        } else {
          v = (v - mh) - ml;
          a[q] += sq ? v * v : v;
        }
      }
    total += (double)tpu_fr_run_total(a);
  }
  for (; i < n; i++) {
    if (y) {
      total += (double)x[i] * (double)y[i];
    } else {
      double v = (double)((x[i] - mh) - ml);
      total += sq ? v * v : v;
    }
  }
  return total;
}

/* sum of d = (x - mh) - ml, or with sq of d^2 */
TPU_FR_INLINE double tpu_fr_sum(const float* x, int64_t n, int sq, float mh, float ml) {
  return tpu_fr_accum(x, NULL, n, sq, mh, ml);
}

/* sum of x * y (y NULL: of x) */
TPU_FR_INLINE double tpu_fr_dot(const float* x, const float* y, int64_t n) {
  return tpu_fr_accum(x, y, n, 0, 0, 0);
}

/* max of x ignoring NaN (a NaN still reaches softmax's result through exp);
 * -inf for an empty row */
TPU_FR_INLINE float tpu_fr_max(const float* x, int64_t n) {
  tpu_fr_v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    tpu_fr_v8f v;
    memcpy(&v, x + i, sizeof v);
    tpu_fr_v8i gt = v > m;
    m = (tpu_fr_v8f)(((tpu_fr_v8i)v & gt) | ((tpu_fr_v8i)m & ~gt));
  }
  float r = -INFINITY;
  for (int k = 0; k < 8; k++) r = m[k] > r ? m[k] : r;
  for (; i < n; i++) r = x[i] > r ? x[i] : r;
  return r;
}

/* e^x for x <= 0 (an element minus its row's maximum), NaN kept: 0 where
 * the result would be subnormal (below 2^-126, under float32 tolerance of
 * any softmax), which spares the two-step scaling of tpu_vm_expf */
TPU_FR_INLINE float tpu_fr_exp_nonpos(float x) {
  float e = tpu_vm_exp_normal(x < -87.0f ? -87.0f : x);
  return x < -87.0f ? 0.0f : e;
}

/* sum of e^(x - mx) over a row in tpu_fr_sum's order; with keep, the terms
 * also go to tmp */
TPU_FR_INLINE double tpu_fr_exp_sum(const float* x, float* tmp, int64_t n, float mx, int keep) {
  double total = 0;
  const int64_t nc = n - n % TPU_FR_CHUNK;
  int64_t i = 0;
  while (i < nc) {
    tpu_fr_v8f a[4] = {{0}, {0}, {0}, {0}};
    for (const int64_t end = tpu_fr_run_end(i, nc); i < end; i += TPU_FR_CHUNK) {
      float e[TPU_FR_CHUNK];
      for (int k = 0; k < TPU_FR_CHUNK; k++) e[k] = tpu_fr_exp_nonpos(x[i + k] - mx);
      if (keep) memcpy(tmp + i, e, sizeof e);
      for (int q = 0; q < 4; q++) {
        tpu_fr_v8f v;
        memcpy(&v, e + 8 * q, sizeof v);
        a[q] += v;
      }
    }
    total += (double)tpu_fr_run_total(a);
  }
  for (; i < n; i++) {
    float e = tpu_fr_exp_nonpos(x[i] - mx);
    if (keep) tmp[i] = e;
    total += (double)e;
  }
  return total;
}

/* The row sum of log_softmax as PyTorch's CPU kernel holds it before the
 * log: rounded to float32, and for rows along the last dim of a bfloat16 or
 * float16 tensor (round16 = 1 or 2) further to that dtype. A row whose
 * maximum dominates (every other term below half an ulp of 1) then gives
 * exactly 0 at the maximum, where the log of the double sum gives a tiny
 * negative value, whose sign flips atan2 and the like against CPU. */
TPU_FR_INLINE double tpu_fr_lse_sum(double sum, int round16) {
  float s = (float)sum;
  if (round16 == 1) s = tpu_vm_bf16_to_f32(tpu_vm_f32_to_bf16(s));
  else if (round16 == 2) s = tpu_vm_f16_to_f32(tpu_vm_f32_to_f16(s));
  return (double)s;
}

/* y = softmax(x) or log_softmax(x) over a row; tmp holds n floats and may be
 * y but not x. exp in float32, the sum in float runs added in double, the
 * final scaling (or shift) in float32, like PyTorch's CPU kernel; round16 as
 * in tpu_fr_lse_sum. */
TPU_FR_INLINE void tpu_fr_softmax_r(const float* x, float* y, float* tmp, int64_t n, int take_log,
                                    int round16) {
  float mx = tpu_fr_max(x, n);
  double sum = tpu_fr_exp_sum(x, tmp, n, mx, !take_log);
  if (take_log) {
    float lse = (float)log(tpu_fr_lse_sum(sum, round16));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mx) - lse;
  } else {
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) y[i] = tmp[i] * inv;
  }
}

TPU_FR_INLINE void tpu_fr_softmax(const float* x, float* y, float* tmp, int64_t n, int take_log) {
  tpu_fr_softmax_r(x, y, tmp, n, take_log, 0);
}

/* Mean and biased variance of a row in double, and the mean split as
 * mh + ml in float: x - m is computed as (x - mh) - ml, so rows whose mean
 * is large against their spread keep their digits. The mean's sum is
 * shifted by the row's first element for the same reason. */
TPU_FR_INLINE void tpu_fr_row_stats(const float* x, int64_t n, double* mean, double* var,
                                    float* mh, float* ml) {
  float x0 = n > 0 && isfinite(x[0]) ? x[0] : 0;
  double m = n > 0 ? (double)x0 + tpu_fr_sum(x, n, 0, x0, 0) / (double)n : 0;
  *mh = (float)m;
  *ml = (float)(m - (double)*mh);
  *mean = m;
  *var = n > 0 ? tpu_fr_sum(x, n, 1, *mh, *ml) / (double)n : NAN;
}

/* y = (((x - mh) - ml) * rs) * w + b in float32 (w, b may be NULL) */
TPU_FR_INLINE void tpu_fr_normalize(const float* x, float* y, int64_t n, float mh, float ml,
                                    float rs, const float* w, const float* b) {
  if (w && b) {
    for (int64_t i = 0; i < n; i++) y[i] = (((x[i] - mh) - ml) * rs) * w[i] + b[i];
  } else if (w) {
    for (int64_t i = 0; i < n; i++) y[i] = (((x[i] - mh) - ml) * rs) * w[i];
  } else if (b) {
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - mh) - ml) * rs + b[i];
  } else {
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - mh) - ml) * rs;
  }
}

/* layer norm of a row; *mean and *rstd get the row's statistics as the
 * library stores them */
TPU_FR_INLINE void tpu_fr_layer_norm(const float* x, float* y, int64_t n, double eps,
                                     const float* w, const float* b, float* mean, float* rstd) {
  double m, var;
  float mh, ml;
  tpu_fr_row_stats(x, n, &m, &var, &mh, &ml);
  double rsd = 1 / sqrt(var + eps);
  *mean = (float)m;
  *rstd = (float)rsd;
  tpu_fr_normalize(x, y, n, mh, ml, (float)rsd, w, b);
}

/* Rows per block of a column sum (a sum over `rows` rows of `len` columns,
 * as layer norm's weight and bias gradients): each block adds its rows in
 * float32, the blocks' partials then add in double in block order. From
 * the shape only (at most 64 blocks, at most 2^21 partials of each sum), so
 * a fused kernel and the library sum alike at any thread count. */
TPU_FR_INLINE int64_t tpu_fr_col_block(int64_t rows, int64_t len) {
  int64_t nblk = (int64_t)1 << 22;
  nblk = len > 0 ? nblk / (2 * len) : nblk;
  if (nblk > 64) nblk = 64;
  if (nblk > rows) nblk = rows;
  if (nblk < 1) nblk = 1;
  const int64_t blk = (rows + nblk - 1) / nblk;
  return blk < 1 ? 1 : blk;
}

/* The backward of softmax (gi = y * (g - sum(g * y))) or log_softmax
 * (gi = g - exp(y) * sum(g)) over a row: the sum in tpu_fr_dot's order,
 * split as sh + sl in float so that g - sh keeps its digits where it
 * cancels, the rest in float32. gi may be g's row (it is written after
 * the sum). */
TPU_FR_INLINE void tpu_fr_softmax_backward(const float* g, const float* y, float* gi, int64_t n,
                                           int take_log) {
  const double s = take_log ? tpu_fr_dot(g, NULL, n) : tpu_fr_dot(g, y, n);
  const float sh = (float)s, sl = (float)(s - (double)sh);
  if (take_log) {
    for (int64_t i = 0; i < n; i++) {
      const float e = tpu_vm_expf(y[i]);
      gi[i] = (g[i] - e * sh) - e * sl;
    }
  } else {
    for (int64_t i = 0; i < n; i++) gi[i] = y[i] * ((g[i] - sh) - sl);
  }
}

/* One row's terms of layer norm's backward: x_hat = (x - mu) * rs (xh holds
 * x on entry), g = dy * w (w may be NULL), g * x_hat, and the weight and
 * bias partials pw += dy * x_hat, pb += dy, all in float32. */
TPU_FR_INLINE void tpu_fr_norm_bwd_terms(const float* restrict dy, const float* restrict w,
                                         float mu, float rs, float* restrict xh,
                                         float* restrict g, float* restrict gx,
                                         float* restrict pw, float* restrict pb, int64_t n) {
  if (w) {
    for (int64_t i = 0; i < n; i++) {
      const float h = (xh[i] - mu) * rs, gi = dy[i] * w[i];
      xh[i] = h;
      g[i] = gi;
      gx[i] = gi * h;
      pw[i] += dy[i] * h;
      pb[i] += dy[i];
    }
  } else {
    for (int64_t i = 0; i < n; i++) {
      const float h = (xh[i] - mu) * rs;
      xh[i] = h;
      g[i] = dy[i];
      gx[i] = dy[i] * h;
      pw[i] += dy[i] * h;
      pb[i] += dy[i];
    }
  }
}

/* dx = rs * ((g - mean(g)) - x_hat * mean(g * x_hat)) of a row from its
 * terms, the means in tpu_fr_dot's order; dx may be gx's row */
TPU_FR_INLINE void tpu_fr_norm_bwd_dx(const float* g, const float* gx, const float* xh, float rs,
                                      float* dx, int64_t n) {
  const float mg = (float)(tpu_fr_dot(g, NULL, n) / (double)n);
  const float mgx = (float)(tpu_fr_dot(gx, NULL, n) / (double)n);
  for (int64_t i = 0; i < n; i++) dx[i] = rs * ((g[i] - mg) - xh[i] * mgx);
}

/* layer norm's backward of a row x (statistics mu, rs): dx, and the weight
 * and bias partials added to pw and pb; tmp holds three rows */
TPU_FR_INLINE void tpu_fr_layer_norm_backward(const float* dy, const float* x, const float* w,
                                              float mu, float rs, float* dx, float* tmp,
                                              float* pw, float* pb, int64_t n) {
  float *xh = tmp, *g = tmp + n, *gx = tmp + 2 * n;
  memcpy(xh, x, sizeof(float) * (size_t)n);
  tpu_fr_norm_bwd_terms(dy, w, mu, rs, xh, g, gx, pw, pb, n);
  tpu_fr_norm_bwd_dx(g, gx, xh, rs, dx, n);
}

#endif
