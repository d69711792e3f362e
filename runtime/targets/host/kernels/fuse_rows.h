/* Row helpers for generated reduction kernels (targets/host/fuse.c).
 *
 * Included only by the C source the fusion compiler generates; these follow
 * the float32 row paths of nn.c step for step (same run length, lane layout
 * and summation order; sums of float runs added in double, normalization in
 * float32), so a fused softmax or layer norm gives the library's values to
 * within a few float32 ulps (the same operations; only FMA contraction may
 * differ between the two compilations). */
#ifndef TPU_FUSE_ROWS_H_
#define TPU_FUSE_ROWS_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float tpu_fr_v8f __attribute__((vector_size(32)));
typedef int32_t tpu_fr_v8i __attribute__((vector_size(32)));

#define TPU_FR_RUN 256

static inline float tpu_fr_run_total(tpu_fr_v8f a0, tpu_fr_v8f a1, tpu_fr_v8f a2, tpu_fr_v8f a3) {
  tpu_fr_v8f s = (a0 + a1) + (a2 + a3);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* sum of (x - mh) - ml, or of its square with sq */
static inline double tpu_fr_sum(const float* x, int64_t n, int sq, float mh, float ml) {
  double total = 0;
  int64_t i = 0;
  for (; i + TPU_FR_RUN <= n; i += TPU_FR_RUN) {
    tpu_fr_v8f a[4] = {{0}, {0}, {0}, {0}};
    for (int j = 0; j < TPU_FR_RUN; j += 32)
      for (int q = 0; q < 4; q++) {
        tpu_fr_v8f v;
        memcpy(&v, x + i + j + 8 * q, sizeof v);
        v = (v - mh) - ml;
        a[q] += sq ? v * v : v;
      }
    total += (double)tpu_fr_run_total(a[0], a[1], a[2], a[3]);
  }
  for (; i < n; i++) {
    double v = (double)((x[i] - mh) - ml);
    total += sq ? v * v : v;
  }
  return total;
}

static inline float tpu_fr_max(const float* x, int64_t n) {
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

/* y = softmax(x) (or log_softmax) over a row; tmp holds n floats, may be y
 * but not x */
static inline void tpu_fr_softmax(const float* x, float* y, float* tmp, int64_t n, int take_log) {
  float mx = tpu_fr_max(x, n);
  for (int64_t i = 0; i < n; i++) tmp[i] = tpu_vm_expf(x[i] - mx);
  double sum = tpu_fr_sum(tmp, n, 0, 0, 0);
  if (take_log) {
    float lse = (float)log(sum);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mx) - lse;
  } else {
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) y[i] = tmp[i] * inv;
  }
}

/* layer norm of a row: y = ((x - m) * rstd) * w + b (w, b may be NULL);
 * *mean and *rstd get the row's statistics as the library stores them */
static inline void tpu_fr_layer_norm(const float* x, float* y, int64_t n, double eps,
                                     const float* w, const float* b, float* mean, float* rstd) {
  float x0 = n > 0 && isfinite(x[0]) ? x[0] : 0;
  double m = n > 0 ? (double)x0 + tpu_fr_sum(x, n, 0, x0, 0) / (double)n : 0;
  float mh = (float)m, ml = (float)(m - (double)mh);
  double var = n > 0 ? tpu_fr_sum(x, n, 1, mh, ml) / (double)n : NAN;
  double rsd = 1 / sqrt(var + eps);
  float rs = (float)(1 / sqrt(var + eps));
  *mean = (float)m;
  *rstd = (float)rsd;
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

#endif
