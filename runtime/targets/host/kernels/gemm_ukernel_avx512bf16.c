/* AVX-512 BF16 two-step dot products for the AVX-512 micro-kernel's
 * one-bfloat16-pass products: 12 x 32 tiles (24 accumulators of 16 floats,
 * each VDPBF16PS adding two steps), and the packer of bfloat16 step pairs
 * (see gemm_dot2_t in gemm_ukernel.h). Used by matmul.c only on CPUs that
 * have AVX512_BF16 and AVX512BW with the ZMM state enabled by the OS. */
#include "gemm_ukernel.h"

#ifdef TPU_GEMM_HAVE_X86
#include <immintrin.h>

#include "tpu/tensor.h"

#define ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
enum { MR = 12, VL = 16, NR = 2 * VL };
/* steps a packer's loads run ahead of its prefetches */
enum { PACK_AHEAD = 8 };

/* the first n lanes (none for n <= 0) */
static inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* The tile: A's word for row i broadcast, two loads of B per pair of steps. */
ATTR static void dot2_tile(int64_t kp, const uint32_t* restrict a, int64_t lda,
                           const uint32_t* restrict b, float* restrict c, int64_t ldc,
                           bool accumulate, const float* restrict s, int64_t lds,
                           const void* const* pf, int64_t npf) {
  const int64_t ai = lda ? lda : 1, ak = lda ? 1 : MR;
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    acc0[i] = acc1[i] = _mm512_setzero_ps();
    __builtin_prefetch(c + i * ldc, 1);
    __builtin_prefetch(c + i * ldc + NR - 1, 1);
  }
#define DOT2_STEP()                                                     \
  do {                                                                  \
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);                      \
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + VL);                 \
    _Pragma("GCC unroll 16")                                            \
    for (int i = 0; i < MR; i++) {                                      \
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * ai]);        \
      acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);                      \
      acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);                      \
    }                                                                   \
    a += ak;                                                            \
    b += NR;                                                            \
  } while (0)
  int64_t k = 0;
  if (npf > 0) {
    for (; k + GEMM_PF_STEPS <= kp; k += GEMM_PF_STEPS) {
      if (npf > 0) {
        __builtin_prefetch(*pf++);
        npf--;
      }
#pragma GCC unroll 1
      for (int st = 0; st < GEMM_PF_STEPS; st++) DOT2_STEP();
    }
  }
  for (; k < kp; k++) DOT2_STEP();
#undef DOT2_STEP
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    float* ci = c + i * ldc;
    if (accumulate) {
      acc0[i] = _mm512_add_ps(_mm512_loadu_ps(ci), acc0[i]);
      acc1[i] = _mm512_add_ps(_mm512_loadu_ps(ci + VL), acc1[i]);
    }
    if (s) {
      acc0[i] = _mm512_add_ps(acc0[i], _mm512_loadu_ps(s + i * lds));
      acc1[i] = _mm512_add_ps(acc1[i], _mm512_loadu_ps(s + i * lds + VL));
    }
    _mm512_storeu_ps(ci, acc0[i]);
    _mm512_storeu_ps(ci + VL, acc1[i]);
  }
}

/* bfloat16 bits of float32 v in the high half of each lane, low half zero:
 * nearest even, NaN quieted (tpu_f32_to_bf16's bits) */
ATTR static inline __m512i round_hi(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                            _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
}

/* n (<= 16) contiguous values from element `off` of src as bfloat16 bits in
 * the high half of each lane; lanes from n on zero */
ATTR static inline __m512i hi_bits(const void* src, bool bf16, int64_t off, int64_t n) {
  const __mmask16 m = lanes16(n);
  if (bf16) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t*)src + off);
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  }
  return round_hi(_mm512_maskz_loadu_ps(m, (const float*)src + off));
}

/* The word of steps (k, k + 1) of a line whose step k is element `off`. */
static inline uint16_t scalar_bits(const void* src, bool bf16, int64_t off) {
  return bf16 ? ((const uint16_t*)src)[off] : tpu_f32_to_bf16(((const float*)src)[off]);
}

/* Up to 16 words of one line contiguous along k: steps k0 .. k0 + 2n - 1
 * (those from kc on read as 0), from element `off` (step k0) on. */
ATTR static inline __m512i line_words(const void* src, bool bf16, int64_t off, int64_t steps) {
  if (bf16) { /* pairs in memory order: low half step 2j; swap the halves */
    __mmask32 m = steps >= 32 ? 0xffffffffu : (__mmask32)((1u << steps) - 1);
    return _mm512_rol_epi32(_mm512_maskz_loadu_epi16(m, (const uint16_t*)src + off), 16);
  }
  /* as 64-bit lanes (step 2j low, 2j + 1 high): keep 2j's bits in place,
   * bring 2j + 1's down, narrow to 32 bits */
  const __m512i keep = _mm512_set1_epi64(0xffff0000);
  __m512i lo = round_hi(_mm512_maskz_loadu_ps(lanes16(steps), (const float*)src + off));
  __m512i hi = round_hi(_mm512_maskz_loadu_ps(lanes16(steps - 16), (const float*)src + off + 16));
  lo = _mm512_or_si512(_mm512_and_si512(lo, keep), _mm512_srli_epi64(lo, 48));
  hi = _mm512_or_si512(_mm512_and_si512(hi, keep), _mm512_srli_epi64(hi, 48));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)),
                            _mm512_cvtepi64_epi32(hi), 1);
}

/* Transposes the 8 x 8 block of 32-bit words r[0..7] in place. */
ATTR static inline void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

/* Lines contiguous along k (A by rows, B by columns) into panels of w > 1:
 * 16 words of each line at a time, written pair-major through 8 x 8
 * transposes. */
ATTR static void pack_by_lines(uint32_t* restrict d, const void* restrict src, bool bf16,
                               int64_t sl, int64_t rows, int64_t kc, int w, uint16_t pad) {
  const int64_t kp = (kc + 1) / 2;
  uint32_t t[NR][VL];
  for (int64_t l = rows; l < (w + 7) / 8 * 8; l++) _mm512_storeu_si512(t[l], _mm512_setzero_si512());
  for (int64_t j = 0; j < kp; j += VL) {
    const int64_t n = kp - j < VL ? kp - j : VL; /* words */
    for (int64_t l = 0; l < rows; l++) {
      __m512i v = line_words(src, bf16, l * sl + 2 * j, kc - 2 * j);
      if (2 * (j + n) > kc) /* the last word lacks its second step */
        v = _mm512_mask_or_epi32(v, (__mmask16)(1u << (n - 1)), v, _mm512_set1_epi32(pad));
      _mm512_storeu_si512(t[l], v);
    }
    for (int64_t c8 = 0; c8 < n; c8 += 8)
      for (int l0 = 0; l0 < w; l0 += 8) {
        __m256i r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i*)&t[l0 + i][c8]);
        transpose8(r);
        const __mmask8 m = w - l0 >= 8 ? 0xff : (__mmask8)((1u << (w - l0)) - 1);
        for (int64_t i = 0; i < 8 && c8 + i < n; i++)
          _mm256_mask_storeu_epi32(d + (j + c8 + i) * w + l0, m, r[i]);
      }
  }
}

/* Lines contiguous at each step (B by rows, A by columns): a pair of steps'
 * runs of lines makes their words; whole groups of panels at a time, the
 * words of a pair staged in `run` and copied to each panel's slot. */
enum { RUN_WORDS = 512 };

ATTR static void pack_by_steps(uint32_t* restrict dst, const void* restrict src, bool bf16,
                               int64_t sk, int64_t lines, int64_t kc, int w, uint16_t pad) {
  const int64_t kp = (kc + 1) / 2, es = bf16 ? 2 : 4, group = RUN_WORDS / w * w;
  uint32_t run[RUN_WORDS + VL];
  for (int64_t g0 = 0; g0 < lines; g0 += group) {
    const int64_t glines = lines - g0 < group ? lines - g0 : group;
    const int64_t padded = (glines + w - 1) / w * w; /* a last partial panel's zeros */
    for (int64_t j = 0; j < kp; j++) {
      const int64_t k = 2 * j;
      if (k + PACK_AHEAD < kc) /* rows far apart defeat the hardware prefetcher */
        for (int64_t q = 0; q < glines; q += 64 / es)
          __builtin_prefetch((const char*)src + ((k + PACK_AHEAD) * sk + g0 + q) * es);
      for (int64_t h = 0; h < padded; h += VL) {
        const int64_t n = glines - h < VL ? glines - h : VL; /* may be <= 0 */
        __m512i x = hi_bits(src, bf16, k * sk + g0 + h, n);
        __m512i y = k + 1 < kc ? _mm512_srli_epi32(hi_bits(src, bf16, (k + 1) * sk + g0 + h, n), 16)
                               : _mm512_maskz_mov_epi32(lanes16(n), _mm512_set1_epi32(pad));
        _mm512_storeu_si512(run + h, _mm512_or_si512(x, y));
      }
      uint32_t* d = dst + g0 * kp + j * w;
      if (w == NR)
        for (int64_t q = 0; q < padded; q += w, d += w * kp) {
          _mm512_storeu_si512(d, _mm512_loadu_si512(run + q));
          _mm512_storeu_si512(d + VL, _mm512_loadu_si512(run + q + VL));
        }
      else
        for (int64_t q = 0; q < padded; q += w, d += w * kp)
          memcpy(d, run + q, sizeof(uint32_t) * (size_t)w);
    }
  }
}

ATTR static void dot2_pack(uint32_t* restrict dst, const void* restrict src, bool bf16,
                           int64_t sl, int64_t sk, int64_t lines, int64_t kc, int w,
                           uint16_t pad) {
  const int64_t kp = (kc + 1) / 2, es = bf16 ? 2 : 4;
  if (sl == 1 && w <= NR) {
    pack_by_steps(dst, src, bf16, sk, lines, kc, w, pad);
    return;
  }
  for (int64_t q0 = 0; q0 < lines; q0 += w) {
    const int64_t rows = lines - q0 < w ? lines - q0 : w;
    uint32_t* d = dst + q0 * kp;
    if (rows < w) memset(d, 0, sizeof(uint32_t) * (size_t)(w * kp));
    if (sk == 1 && w > 1 && w <= NR) {
      pack_by_lines(d, (const char*)src + q0 * sl * es, bf16, sl, rows, kc, w, pad);
    } else if (sk == 1) { /* lines kept as lines (w 1): words in order */
      for (int64_t l = 0; l < rows; l++)
        for (int64_t j = 0; j < kp; j += VL) {
          const int64_t n = kp - j < VL ? kp - j : VL; /* words */
          __m512i v = line_words(src, bf16, (q0 + l) * sl + 2 * j, kc - 2 * j);
          if (2 * (j + n) > kc) /* the last word lacks its second step */
            v = _mm512_mask_or_epi32(v, (__mmask16)(1u << (n - 1)), v, _mm512_set1_epi32(pad));
          _mm512_mask_storeu_epi32(d + l * kp + j, lanes16(n), v);
        }
    } else {
      for (int64_t l = 0; l < rows; l++)
        for (int64_t j = 0; j < kp; j++) {
          const int64_t off = (q0 + l) * sl + 2 * j * sk;
          const uint32_t lo = 2 * j + 1 < kc ? scalar_bits(src, bf16, off + sk) : pad;
          d[j * w + l] = (uint32_t)scalar_bits(src, bf16, off) << 16 | lo;
        }
    }
  }
}

/* Magnitudes compared as integers (the bits without the sign order like the
 * values, NaN above infinity); zeros count as the largest. */
ATTR static float dot2_min_abs(const void* src, bool bf16, int64_t n) {
  uint32_t best = 0x7f800000u; /* infinity */
  if (bf16) {
    const uint16_t* p = src;
    const __m512i mag = _mm512_set1_epi16(0x7fff);
    __m512i m = _mm512_set1_epi16(0x7f80);
    for (int64_t i = 0; i < n; i += 32) {
      const __mmask32 lanes = n - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (n - i)) - 1);
      __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(lanes, p + i), mag);
      v = _mm512_mask_mov_epi16(v, _mm512_cmpeq_epi16_mask(v, _mm512_setzero_si512()), mag);
      m = _mm512_min_epu16(m, v);
    }
    uint16_t t[32];
    _mm512_storeu_si512(t, m);
    for (int i = 0; i < 32; i++)
      if ((uint32_t)t[i] << 16 < best) best = (uint32_t)t[i] << 16;
  } else {
    const float* p = src;
    const __m512i mag = _mm512_set1_epi32(0x7fffffff);
    __m512i m = _mm512_set1_epi32(0x7f800000);
    for (int64_t i = 0; i < n; i += 16) {
      __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(lanes16(n - i), p + i), mag);
      v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()), mag);
      m = _mm512_min_epu32(m, v);
    }
    uint32_t r = (uint32_t)_mm512_reduce_min_epu32(m);
    if (r < best) best = r;
  }
  return gemm_u2f(best);
}

const gemm_dot2_t tpu_gemm_dot2_avx512bf16 = {dot2_tile, dot2_pack, dot2_min_abs};
#endif
