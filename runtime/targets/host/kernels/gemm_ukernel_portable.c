/* Portable scalar GEMM micro-kernel: the reference the vector ones are
 * checked against, and the path on CPUs without them. Plain C for any
 * target (the compiler may vectorize the fixed-size inner loops). */
#include "gemm_ukernel.h"

enum { MR = 4, NR = 8 };

/* A element (row i, step k) at a[i * ai + k * ak]: a packed panel (1, MR),
 * rows (lda, 1) or columns (1, lda) of A. */
static inline void tile_strided_portable(int64_t kc, const float* restrict a, int64_t ai,
                                         int64_t ak, const float* restrict b, float* restrict c,
                                         int64_t ldc, bool accumulate, const float* restrict s,
                                         int64_t lds) {
  float acc[MR][NR] = {{0}};
  for (int64_t k = 0; k < kc; k++) {
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += a[i * ai] * b[j];
    a += ak;
    b += NR;
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float v = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j];
      c[i * ldc + j] = s ? v + s[i * lds + j] : v;
    }
}

static void tile_portable(int64_t kc, const float* restrict a, const float* restrict b,
                          float* restrict c, int64_t ldc, bool accumulate,
                          const float* restrict s, int64_t lds) {
  tile_strided_portable(kc, a, 1, MR, b, c, ldc, accumulate, s, lds);
}

/* no prefetches: the portable target leaves memory to the hardware */
static void tile_rows_portable(int64_t kc, const float* restrict a, int64_t lda,
                               const float* restrict b, float* restrict c, int64_t ldc,
                               bool accumulate, const float* restrict s, int64_t lds,
                               const void* const* pf, int64_t npf) {
  (void)pf;
  (void)npf;
  tile_strided_portable(kc, a, lda, 1, b, c, ldc, accumulate, s, lds);
}

static void tile_cols_portable(int64_t kc, const float* restrict a, int64_t lda,
                               const float* restrict b, float* restrict c, int64_t ldc,
                               bool accumulate, const float* restrict s, int64_t lds) {
  tile_strided_portable(kc, a, 1, lda, b, c, ldc, accumulate, s, lds);
}

/* four partial sums over interleaved steps, added in a fixed order */
static float dot_portable(const float* restrict x, const float* restrict y, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4)
    for (int h = 0; h < 4; h++) s[h] += x[k + h] * y[k + h];
  float t = (s[0] + s[1]) + (s[2] + s[3]);
  for (; k < n; k++) t += x[k] * y[k];
  return t;
}

const gemm_ukernel_t tpu_gemm_ukernel_portable = {"portable", MR, NR, tile_portable,
                                                  dot_portable, NULL, tile_rows_portable,
                                                  NULL, NULL, tile_cols_portable};
