/* Vector GEMM micro-kernel, dot product, float32 packers and precision
 * transforms, written once for any vector width (see gemm_ukernel.h for the
 * contracts). Included by gemm_ukernel_avx2.c and gemm_ukernel_avx512.c,
 * which first define:
 *   ATTR               target attribute of every function here
 *   UK(name)           the instance's name for `name`
 *   MR                 rows of a tile (columns: NR = 2 * VL)
 *   VF, VL             float vector type and its lanes
 *   V_LOAD(p) V_STORE(p, v) V_SET1(x) V_ZERO() V_ADD(a, b) V_SUB(a, b)
 *   V_FMA(a, b, c)     a * b + c, rounded once
 *   VI V_TOI(v) V_TOF(i) VI_SET1(x) VI_AND(a, b) VI_ADD(a, b) VI_SRL16(a)
 *                      integer lanes and bit casts
 *   VM V_CMP(a, b, predicate) V_SELECT(m, a, b) (= m ? b : a) VM_AND(m, n)
 *                      lane masks
 *   V_LOAD_N(p, n)     the first n lanes from p, zeros above (n <= VL)
 *   V_STORE_N(p, v, n) the first n lanes of v to p
 *   V_LOAD_BF16(p)     VL bfloat16 values from p, widened to float32
 * The transforms match the scalar ones in gemm_ukernel.h bit for bit.
 */
#include <math.h>

#include "gemm_ukernel.h"

#define NR (2 * VL)
/* steps a packer's loads run ahead of its prefetches */
#define PACK_AHEAD 8
/* longest run of lines the narrow-panel packer stages at once */
#define PACK_RUN_MAX 256

ATTR static inline VF UK(abs)(VF x) { return V_TOF(VI_AND(V_TOI(x), VI_SET1(0x7fffffff))); }

ATTR static inline VF UK(round_bf16)(VF x) {
  VI u = V_TOI(x);
  VI bias = VI_ADD(VI_AND(VI_SRL16(u), VI_SET1(1)), VI_SET1(0x7fff));
  VI r = VI_AND(VI_ADD(u, bias), VI_SET1((int)0xffff0000u));
  return V_SELECT(V_CMP(x, x, _CMP_UNORD_Q), V_TOF(r), x);
}

ATTR static inline VF UK(split_hi)(VF x) {
  VF r = UK(round_bf16)(x), inf = V_SET1(INFINITY);
  VM overflow = VM_AND(V_CMP(UK(abs)(r), inf, _CMP_EQ_OQ), V_CMP(UK(abs)(x), inf, _CMP_NEQ_UQ));
  return V_SELECT(overflow, r, V_TOF(VI_AND(V_TOI(x), VI_SET1((int)0xffff0000u))));
}

ATTR static inline VF UK(split_lo)(VF x, VF hi) {
  VM finite = V_CMP(UK(abs)(x), V_SET1(INFINITY), _CMP_LT_OQ);
  return V_SELECT(finite, V_ZERO(), UK(round_bf16)(V_SUB(x, hi)));
}

ATTR __attribute__((always_inline)) static inline VF UK(xform)(gemm_xform_t xf, VF x) {
  switch (xf) {
    case GEMM_XF_BF16: return UK(round_bf16)(x);
    case GEMM_XF_HI: return UK(split_hi)(x);
    case GEMM_XF_LO: return UK(split_lo)(x, UK(split_hi)(x));
    case GEMM_XF_HI16: {
      VF hi = UK(split_hi)(x);
      return V_ADD(hi, UK(split_lo)(x, hi));
    }
    default: return x;
  }
}

/* MR x NR tile: 2 * MR vector accumulators, one broadcast of a per row and
 * two loads of b per step. A element (i, k) is at a[i * ai + k * ak]: a
 * packed panel (ai = 1, ak = MR) or rows of A (ai = lda, ak = 1). One line
 * of pf[0..npf) is prefetched every GEMM_PF_STEPS steps. */
ATTR __attribute__((always_inline)) static inline void UK(tile_strided)(
    int64_t kc, const float* restrict a, int64_t ai, int64_t ak, const float* restrict b,
    float* restrict c, int64_t ldc, bool accumulate, const float* restrict s, int64_t lds,
    const void* const* pf, int64_t npf) {
  VF acc0[MR], acc1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    acc0[i] = acc1[i] = V_ZERO();
    /* c's rows are needed at the end: fetch them while the sums run */
    __builtin_prefetch(c + i * ldc, 1);
    __builtin_prefetch(c + i * ldc + NR - 1, 1);
  }
#define TILE_STEP()                               \
  do {                                            \
    VF b0 = V_LOAD(b), b1 = V_LOAD(b + VL);       \
    _Pragma("GCC unroll 16")                      \
    for (int i = 0; i < MR; i++) {                \
      VF av = V_SET1(a[i * ai]);                  \
      acc0[i] = V_FMA(av, b0, acc0[i]);           \
      acc1[i] = V_FMA(av, b1, acc1[i]);           \
    }                                             \
    a += ak;                                      \
    b += NR;                                      \
  } while (0)
  int64_t k = 0;
  if (npf > 0) {
    for (; k + GEMM_PF_STEPS <= kc; k += GEMM_PF_STEPS) {
      if (npf > 0) {
        __builtin_prefetch(*pf++);
        npf--;
      }
#pragma GCC unroll 1 /* unrolled, the accumulators spill */
      for (int s = 0; s < GEMM_PF_STEPS; s++) TILE_STEP();
    }
  }
  for (; k < kc; k++) TILE_STEP();
#undef TILE_STEP
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    float* ci = c + i * ldc;
    if (accumulate) {
      acc0[i] = V_ADD(V_LOAD(ci), acc0[i]);
      acc1[i] = V_ADD(V_LOAD(ci + VL), acc1[i]);
    }
    if (s) {
      acc0[i] = V_ADD(acc0[i], V_LOAD(s + i * lds));
      acc1[i] = V_ADD(acc1[i], V_LOAD(s + i * lds + VL));
    }
    V_STORE(ci, acc0[i]);
    V_STORE(ci + VL, acc1[i]);
  }
}

ATTR static void UK(tile)(int64_t kc, const float* restrict a, const float* restrict b,
                          float* restrict c, int64_t ldc, bool accumulate, const float* s,
                          int64_t lds) {
  UK(tile_strided)(kc, a, 1, MR, b, c, ldc, accumulate, s, lds, NULL, 0);
}

/* The same tile with A read by rows (row i at a + i * lda). */
ATTR static void UK(tile_rows)(int64_t kc, const float* restrict a, int64_t lda,
                               const float* restrict b, float* restrict c, int64_t ldc,
                               bool accumulate, const float* s, int64_t lds,
                               const void* const* pf, int64_t npf) {
  UK(tile_strided)(kc, a, lda, 1, b, c, ldc, accumulate, s, lds, pf, npf);
}

/* The same tile with A read by columns (row i of step k at a + k * lda + i). */
ATTR static void UK(tile_cols)(int64_t kc, const float* restrict a, int64_t lda,
                               const float* restrict b, float* restrict c, int64_t ldc,
                               bool accumulate, const float* s, int64_t lds) {
  UK(tile_strided)(kc, a, 1, lda, b, c, ldc, accumulate, s, lds, NULL, 0);
}

ATTR static float UK(dot)(const float* restrict x, const float* restrict y, int64_t n) {
  VF acc[4] = {V_ZERO(), V_ZERO(), V_ZERO(), V_ZERO()};
  int64_t k = 0;
  for (; k + 4 * VL <= n; k += 4 * VL) {
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++)
      acc[h] = V_FMA(V_LOAD(x + k + h * VL), V_LOAD(y + k + h * VL), acc[h]);
  }
  float lanes[VL];
  V_STORE(lanes, V_ADD(V_ADD(acc[0], acc[1]), V_ADD(acc[2], acc[3])));
  float s = 0;
  for (int l = 0; l < VL; l++) s += lanes[l];
  for (; k < n; k++) s += x[k] * y[k];
  return s;
}

/* Source values for the packers: element i of a float32 (bf16 false) or
 * bfloat16 (bf16 true) run at p, as float32; bf16 is a constant of each
 * inlined copy. Widening bfloat16 is exact, so both share the transforms. */
ATTR __attribute__((always_inline)) static inline float UK(ld1)(const void* p, int64_t i,
                                                               bool bf16) {
  return bf16 ? gemm_u2f((uint32_t)((const uint16_t*)p)[i] << 16) : ((const float*)p)[i];
}
/* VL values from element i on */
ATTR __attribute__((always_inline)) static inline VF UK(ld)(const void* p, int64_t i, bool bf16) {
  return bf16 ? V_LOAD_BF16((const uint16_t*)p + i) : V_LOAD((const float*)p + i);
}
/* the first n (< VL) values from element i on, zeros above */
ATTR __attribute__((always_inline)) static inline VF UK(ld_n)(const void* p, int64_t i, int64_t n,
                                                             bool bf16) {
  if (!bf16) return V_LOAD_N((const float*)p + i, n);
  uint16_t t[VL] = {0};
  memcpy(t, (const uint16_t*)p + i, sizeof(uint16_t) * (size_t)n);
  return V_LOAD_BF16(t);
}

/* Steps [k0, kc) of one panel of `rows` lines, one value at a time. */
ATTR __attribute__((always_inline)) static inline void UK(pack_steps)(
    float* restrict dst, const void* restrict src, bool bf16, int64_t sl, int64_t sk,
    int64_t rows, int64_t k0, int64_t kc, int w, const gemm_xform_t* xf, int np) {
  for (int64_t k = k0; k < kc; k++)
    for (int p = 0; p < np; p++) {
      float* d = dst + (k * np + p) * w;
      int64_t l = 0;
      for (; l < rows; l++) d[l] = gemm_xform(xf[p], UK(ld1)(src, l * sl + k * sk, bf16));
      for (; l < w; l++) d[l] = 0;
    }
}

/* Transposes the 8 x 8 block r[0..7] in place (256-bit AVX, which both
 * instances have). */
ATTR static inline void UK(transpose8)(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* Stores the first n (1..8) lanes of v at d. */
ATTR static inline void UK(store_n)(float* d, __m256 v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(d, v);
    return;
  }
  __m128 h = _mm256_castps256_ps128(v);
  if (n >= 4) {
    _mm_storeu_ps(d, h);
    h = _mm256_extractf128_ps(v, 1);
    d += 4;
    n -= 4;
  }
  if (n >= 2) {
    _mm_storel_pi((__m64*)d, h);
    h = _mm_movehl_ps(h, h);
    d += 2;
    n -= 2;
  }
  if (n) _mm_store_ss(d, h);
}

/* Two layouts: lines contiguous at each step (B stored by rows: step k
 * outermost so that each source row is read front to back across the
 * panels; A stored by columns: runs of MR copied one step at a time); and
 * lines contiguous along k (A stored by rows, B by columns). */
ATTR __attribute__((always_inline)) static inline bool UK(pack_layouts)(
    float* restrict dst, const void* restrict src, bool bf16, int64_t sl, int64_t sk,
    int64_t lines, int64_t kc, int w, const gemm_xform_t* xf, int np) {
  const int64_t kcp = kc * np, es = bf16 ? 2 : 4; /* source bytes per value */
  if (sl == 1) {
    /* step k outermost: each step's run of lines is read front to back */
    const int64_t full = w == NR ? lines / w * w : 0; /* whole panels of two vectors */
    for (int64_t k = 0; k < kc; k++) {
      const void* s = (const char*)src + k * sk * es;
      if (k + PACK_AHEAD < kc) /* rows far apart defeat the hardware prefetcher */
        for (int64_t q = 0; q < lines; q += 64 / es)
          __builtin_prefetch((const char*)s + (PACK_AHEAD * sk + q) * es);
      for (int64_t q = 0; q < full; q += NR) {
        VF v0 = UK(ld)(s, q, bf16), v1 = UK(ld)(s, q + VL, bf16);
#pragma GCC unroll 2 /* the passes share their split */
        for (int p = 0; p < np; p++) {
          float* d = dst + q * kcp + (k * np + p) * NR;
          V_STORE(d, UK(xform)(xf[p], v0));
          V_STORE(d + VL, UK(xform)(xf[p], v1));
        }
      }
      if (w <= VL && lines - full <= PACK_RUN_MAX) {
        /* panels narrower than a vector (A by columns, MR lines): the run
         * is transformed a vector at a time into `run` (zeros past its end),
         * then each panel's w values are stored with one vector store that
         * may spill into the panel's next slot, written later; only the
         * panel's last slot takes a partial store */
        float run[PACK_RUN_MAX + VL];
        const int64_t left = lines - full;
        V_STORE(run + (left + VL - 1) / VL * VL, V_ZERO()); /* read by spilling stores */
        for (int p = 0; p < np; p++) {
          for (int64_t q = 0; q < left; q += VL)
            V_STORE(run + q, UK(xform)(xf[p], q + VL <= left ? UK(ld)(s, full + q, bf16)
                                                             : UK(ld_n)(s, full + q, left - q,
                                                                        bf16)));
          const int64_t slot = k * np + p;
          float* d = dst + full * kcp + slot * w;
          if (slot + 1 < kcp)
            for (int64_t q = 0; q < left; q += w, d += w * kcp) V_STORE(d, V_LOAD(run + q));
          else
            for (int64_t q = 0; q < left; q += w, d += w * kcp) V_STORE_N(d, V_LOAD(run + q), w);
        }
        continue;
      }
      for (int64_t q = full; q < lines; q += w) { /* panels of MR, a last partial panel */
        const int64_t rows = lines - q < w ? lines - q : w;
        for (int64_t h = 0; h < w; h += VL) { /* one or two vectors */
          const int64_t n = rows - h < 0 ? 0 : rows - h < VL ? rows - h : VL;
          /* a whole vector where the run goes on, else zeros beyond n */
          VF v = q + h + VL <= lines ? UK(ld)(s, q + h, bf16) : UK(ld_n)(s, q + h, n, bf16);
#pragma GCC unroll 2
          for (int p = 0; p < np; p++)
            V_STORE_N(dst + q * kcp + (k * np + p) * w + h, UK(xform)(xf[p], v),
                      w - h < VL ? w - h : VL);
        }
      }
    }
    return true;
  }
  if (sk != 1 || w > NR) return false;
  if (w == 1) { /* lines kept as lines (tile_rows): transform only */
    for (int64_t l = 0; l < lines; l++) {
      const void* s = (const char*)src + l * sl * es;
      float* d = dst + l * kcp;
      int64_t k = 0;
      if (np == 1) {
        for (; k + VL <= kc; k += VL) V_STORE(d + k, UK(xform)(xf[0], UK(ld)(s, k, bf16)));
      } else if (np == 2) { /* transforms in vectors, passes interleaved by lane */
#if VL == 8
        for (; k + VL <= kc; k += VL) {
          VF x = UK(ld)(s, k, bf16);
          __m256 p0 = UK(xform)(xf[0], x), p1 = UK(xform)(xf[1], x);
          __m256 lo = _mm256_unpacklo_ps(p0, p1), hi = _mm256_unpackhi_ps(p0, p1);
          _mm256_storeu_ps(d + 2 * k, _mm256_permute2f128_ps(lo, hi, 0x20));
          _mm256_storeu_ps(d + 2 * k + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
#else
        float t0[VL], t1[VL];
        for (; k + VL <= kc; k += VL) {
          VF x = UK(ld)(s, k, bf16);
          V_STORE(t0, UK(xform)(xf[0], x));
          V_STORE(t1, UK(xform)(xf[1], x));
          for (int l = 0; l < VL; l++) {
            d[(k + l) * 2] = t0[l];
            d[(k + l) * 2 + 1] = t1[l];
          }
        }
#endif
      }
      for (; k < kc; k++)
        for (int p = 0; p < np; p++) d[k * np + p] = gemm_xform(xf[p], UK(ld1)(s, k, bf16));
    }
    return true;
  }
  /* VL steps of a panel at a time: transformed into a line-major buffer,
   * then written step-major through 8 x 8 transposes */
  float t[GEMM_MAX_PASSES][NR][VL]; /* [pass][line][step] */
  for (int64_t q = 0; q < lines; q += w) {
    const int64_t rows = lines - q < w ? lines - q : w;
    const void* s = (const char*)src + q * sl * es;
    float* dq = dst + q * kcp;
    for (int p = 0; p < np; p++)
      for (int64_t l = rows; l < (w + 7) / 8 * 8; l++) V_STORE(t[p][l], V_ZERO());
    int64_t k = 0;
    for (; k + VL <= kc; k += VL) {
      for (int64_t l = 0; l < rows; l++) {
        VF v = UK(ld)(s, l * sl + k, bf16);
#pragma GCC unroll 2
        for (int p = 0; p < np; p++) V_STORE(t[p][l], UK(xform)(xf[p], v));
      }
      for (int p = 0; p < np; p++)
        for (int c8 = 0; c8 < VL; c8 += 8)
          for (int l0 = 0; l0 < w; l0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(&t[p][l0 + i][c8]);
            UK(transpose8)(r);
            for (int i = 0; i < 8; i++)
              UK(store_n)(dq + ((k + c8 + i) * np + p) * w + l0, r[i], w - l0);
          }
    }
    UK(pack_steps)(dq, s, bf16, sl, 1, rows, k, kc, w, xf, np);
  }
  return true;
}

/* One copy of the packer per precision level's transforms, so that the
 * transform is fixed in the inner loops. */
ATTR static bool UK(pack_f32)(float* restrict dst, const float* restrict src, int64_t sl,
                              int64_t sk, int64_t lines, int64_t kc, int w,
                              const gemm_xform_t* xf, int np) {
  static const gemm_xform_t exact[1] = {GEMM_XF_EXACT}, bf16[1] = {GEMM_XF_BF16},
                            split_a[2] = {GEMM_XF_HI, GEMM_XF_LO},
                            split_b[2] = {GEMM_XF_HI16, GEMM_XF_HI};
  if (np == 1 && xf[0] == GEMM_XF_EXACT)
    return UK(pack_layouts)(dst, src, false, sl, sk, lines, kc, w, exact, 1);
  if (np == 1 && xf[0] == GEMM_XF_BF16)
    return UK(pack_layouts)(dst, src, false, sl, sk, lines, kc, w, bf16, 1);
  if (np == 2 && xf[0] == GEMM_XF_HI && xf[1] == GEMM_XF_LO)
    return UK(pack_layouts)(dst, src, false, sl, sk, lines, kc, w, split_a, 2);
  if (np == 2 && xf[0] == GEMM_XF_HI16 && xf[1] == GEMM_XF_HI)
    return UK(pack_layouts)(dst, src, false, sl, sk, lines, kc, w, split_b, 2);
  return UK(pack_layouts)(dst, src, false, sl, sk, lines, kc, w, xf, np);
}

/* bfloat16 lines: widened, no transform (every one-pass transform keeps a
 * bfloat16 value as it is); multi-pass layouts go to the generic packer. */
ATTR static bool UK(pack_bf16)(float* restrict dst, const uint16_t* restrict src, int64_t sl,
                               int64_t sk, int64_t lines, int64_t kc, int w,
                               const gemm_xform_t* xf, int np) {
  static const gemm_xform_t exact[1] = {GEMM_XF_EXACT};
  if (np != 1 || (xf[0] != GEMM_XF_EXACT && xf[0] != GEMM_XF_BF16)) return false;
  return UK(pack_layouts)(dst, src, true, sl, sk, lines, kc, w, exact, 1);
}

#undef NR
#undef PACK_AHEAD
#undef PACK_RUN_MAX
