/* Vectorizable float32 math, 16-bit float conversions, and the run-time
 * choice of instruction set.
 *
 * The functions below are branch-free scalar code (range reduction,
 * polynomial, selects) that GCC vectorizes when they are inlined into a
 * loop compiled with TPU_VEC_PORTABLE or TPU_VEC_AVX2. libm's expf/logf/...
 * are calls the vectorizer cannot widen. Accuracy, measured against double
 * precision over float32 inputs (every 97th bit pattern, plus sweeps): exp
 * and log within 1 ulp, tanh and erf within 1.5, sigmoid within 2.5 (1/(1 +
 * e^-x) like PyTorch's, so 0 where the result would be subnormal); special
 * values (inf, nan, -0, 0, subnormal inputs) follow C99 Annex F.
 *
 * The polynomial coefficients are weighted least-squares fits with Lawson
 * reweighting (near minimax) computed for this file, rounded to float.
 *
 * Instruction set: loops are compiled twice, for the baseline ISA and for
 * AVX2+FMA, and tpu_host_isa() picks one at run time from CPUID. The
 * environment variable TORCH_TPU_ISA=portable forces the baseline copies
 * (TORCH_TPU_ISA=avx2 asks for AVX2 and still falls back when the CPU lacks
 * it). Results of the two copies may differ in the last bit (FMA contraction).
 */
#ifndef TPU_HOST_VECMATH_H_
#define TPU_HOST_VECMATH_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_isa { TPU_ISA_PORTABLE = 0, TPU_ISA_AVX2 = 1 } tpu_isa_t;

/* The instruction set vectorized loops use: TORCH_TPU_ISA, else the best the
 * CPU supports. Cached after the first call. */
tpu_isa_t tpu_host_isa(void);
/* Forces an ISA (tests); -1 returns to the automatic choice. An ISA the CPU
 * or the build lacks falls back to portable. */
void tpu_host_isa_override(int isa);
const char* tpu_isa_name(tpu_isa_t isa);

/* Function attributes for loops meant to vectorize. O3 turns on the loop
 * vectorizer; no-math-errno lets sqrt and friends vectorize; no-trapping-math
 * lets conditional floating-point expressions become selects. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TPU_HAVE_AVX2_BUILD 1
#define TPU_VEC_OPTS "O3", "no-math-errno", "no-trapping-math"
#define TPU_VEC_PORTABLE __attribute__((optimize(TPU_VEC_OPTS)))
#define TPU_VEC_AVX2 \
  __attribute__((target("avx2,fma"), optimize(TPU_VEC_OPTS, "fp-contract=fast")))
#elif defined(__GNUC__) && !defined(__clang__)
#define TPU_VEC_PORTABLE __attribute__((optimize("O3", "no-math-errno", "no-trapping-math")))
#else
#define TPU_VEC_PORTABLE
#endif

#if defined(__GNUC__)
#define TPU_VM_INLINE static inline __attribute__((always_inline))
#else
#define TPU_VM_INLINE static inline
#endif

TPU_VM_INLINE uint32_t tpu_vm_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
TPU_VM_INLINE float tpu_vm_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* 16-bit float conversions, branch-free so that runs of them vectorize.
 * Same results as tpu_f16_to_f32 & co. in kernels.h (round to nearest even,
 * overflow to inf, subnormals), except that NaN payloads may differ. */
TPU_VM_INLINE float tpu_vm_bf16_to_f32(uint16_t h) { return tpu_vm_float((uint32_t)h << 16); }
TPU_VM_INLINE uint16_t tpu_vm_f32_to_bf16(float f) {
  uint32_t u = tpu_vm_bits(f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* round to nearest even */
  return (uint16_t)(f != f ? (u >> 16) | 0x40u : r);   /* quiet nan */
}
TPU_VM_INLINE float tpu_vm_f16_to_f32(uint16_t h) {
  uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
  /* exponent and mantissa in place: scaling by 2^(127-15) rebiases normals
   * and normalizes subnormals exactly */
  uint32_t mag = tpu_vm_bits(tpu_vm_float(em) * 0x1p112f);
  mag = em >= (0x1fu << 23) ? em | 0x7f800000u : mag; /* inf, nan */
  return tpu_vm_float(mag | (uint32_t)(h & 0x8000u) << 16);
}
TPU_VM_INLINE uint16_t tpu_vm_f32_to_f16(float f) {
  uint32_t u = tpu_vm_bits(f), a = u & 0x7fffffffu;
  /* normal half: rebias 127 -> 15 and round the 13 dropped bits to even */
  uint32_t r = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  /* subnormal half: adding 0.5 rounds to a multiple of 2^-24 (to even) */
  uint32_t sub = tpu_vm_bits(tpu_vm_float(a) + 0.5f) - 0x3f000000u;
  r = a < 0x38800000u ? sub : r;
  r = a >= 0x477ff000u ? 0x7c00u : r; /* rounds to inf */
  r = a > 0x7f800000u ? 0x7e00u : r;  /* nan */
  return (uint16_t)((u >> 16 & 0x8000u) | r);
}

/* ln 2 split so that k * LN2_HI is exact for |k| < 512 */
#define TPU_VM_LN2_HI 0x1.62e4p-1f
#define TPU_VM_LN2_LO 0x1.7f7d1cp-20f

/* e^r for x = k ln2 + r, |r| <= ln2/2, as 1 + r + r^2 Q(r); *t receives
 * k + 1.5 * 2^23, whose low mantissa bits hold k (|x| < 2^21). */
TPU_VM_INLINE float tpu_vm_exp_reduced(float x, float* t) {
  const float shifter = 0x1.8p23f; /* adding it rounds to an integer */
  *t = x * 0x1.715476p+0f + shifter; /* log2(e) */
  float k = *t - shifter;
  float r = x - k * TPU_VM_LN2_HI;
  r = r - k * TPU_VM_LN2_LO;
  float q = 0x1.6a2416p-10f;
  q = q * r + 0x1.1239f2p-7f;
  q = q * r + 0x1.5558f2p-5f;
  q = q * r + 0x1.555492p-3f;
  q = q * r + 0x1.fffffcp-2f;
  return (r * r * q + r) + 1.0f;
}

/* e^x for x in [-87, 88] (normal results) and nan: no range handling.
 * Callers bound the argument. */
TPU_VM_INLINE float tpu_vm_exp_normal(float x) {
  float t, p = tpu_vm_exp_reduced(x, &t);
  return p * tpu_vm_float((tpu_vm_bits(t) - tpu_vm_bits(0x1.8p23f) + 127u) << 23);
}

/* exp(x) over the whole range: 2^k is applied in two steps so that
 * subnormal results round once. */
TPU_VM_INLINE float tpu_vm_expf(float x) {
  x = x > 89.0f ? 89.0f : x; /* e^89 overflows, e^-104 rounds to 0; NaN stays */
  x = x < -104.0f ? -104.0f : x;
  float t, p = tpu_vm_exp_reduced(x, &t);
  int32_t n = (int32_t)(tpu_vm_bits(t) - tpu_vm_bits(0x1.8p23f));
  int32_t n1 = n / 2, n2 = n - n1;
  return p * tpu_vm_float((uint32_t)(n1 + 127) << 23) * tpu_vm_float((uint32_t)(n2 + 127) << 23);
}

/* log(x): x = 2^e m, m in [sqrt(1/2), sqrt(2)); f = m - 1, s = f / (2 + f),
 * log(m) = 2 atanh(s) = f - s (f - s^2 P(s^2)). */
TPU_VM_INLINE float tpu_vm_logf(float x) {
  int sub = x < 0x1p-126f; /* subnormal (or not positive: fixed below) */
  float xs = sub ? x * 0x1p23f : x;
  uint32_t u = tpu_vm_bits(xs) + (0x3f800000u - 0x3f3504f3u); /* 0x3f3504f3: sqrt(1/2) */
  float e = (float)((int32_t)(u >> 23) - 127 - (sub ? 23 : 0));
  float f = tpu_vm_float((u & 0x7fffffu) + 0x3f3504f3u) - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s;
  float pz = 0x1.e2f7e4p-3f;
  pz = pz * z + 0x1.2438cep-2f;
  pz = pz * z + 0x1.999a7ap-2f;
  pz = pz * z + 0x1.555554p-1f;
  float r = f - s * (f - z * pz);
  float res = (e * TPU_VM_LN2_LO + r) + e * TPU_VM_LN2_HI;
  res = x < 0.0f ? NAN : res;
  res = x == 0.0f ? -INFINITY : res;
  res = x == INFINITY ? INFINITY : res;
  return x != x ? x : res;
}

/* tanh(x): an odd polynomial below 0.625, else 1 - 2 / (e^2|x| + 1) with
 * |x| capped at 9.125, where that rounds to exactly 1 (so tanh(+-inf) and
 * of huge inputs is exactly +-1). */
TPU_VM_INLINE float tpu_vm_tanhf(float x) {
  float a = fabsf(x), z = x * x;
  float ac = a > 9.125f ? 9.125f : a; /* nan stays */
  float pz = -0x1.a627c4p-11f;
  pz = pz * z + 0x1.a792bcp-9f;
  pz = pz * z - 0x1.1ed214p-7f;
  pz = pz * z + 0x1.65ffaap-6f;
  pz = pz * z - 0x1.ba17eap-5f;
  pz = pz * z + 0x1.111106p-3f;
  pz = pz * z - 0x1.555556p-2f;
  float small = a + a * z * pz;
  float big = 1.0f - 2.0f / (tpu_vm_exp_normal(2.0f * ac) + 1.0f);
  return copysignf(a < 0.625f ? small : big, x);
}

TPU_VM_INLINE float tpu_vm_sigmoidf(float x) { return 1.0f / (1.0f + tpu_vm_expf(-x)); }

/* erf(x): x (1 + P(x^2)) below 0.921875; above, 1 - erfc(|x|) with
 * erfc(a) = exp(G(a) - a^2), G a polynomial in a - 2.4609375 fitted to
 * log(erfc(a)) + a^2 on [0.921875, 4]. |x| is capped at 4, where erfc is
 * below half an ulp of 1 (so erf of huge inputs is exactly +-1). */
TPU_VM_INLINE float tpu_vm_erff(float x) {
  float a = fabsf(x), z = x * x;
  float ac = a > 4.0f ? 4.0f : a; /* nan stays */
  float pz = -0x1.3a17d6p-11f;
  pz = pz * z + 0x1.473ba6p-8f;
  pz = pz * z - 0x1.b68b52p-6f;
  pz = pz * z + 0x1.ce1a6ap-4f;
  pz = pz * z - 0x1.8126e6p-2f;
  pz = pz * z + 0x1.06eba6p-3f;
  float small = a + a * pz;
  float t = ac - 2.4609375f;
  float g = 0x1.98635ap-13f;
  g = g * t - 0x1.479fc4p-13f;
  g = g * t + 0x1.50b2d6p-9f;
  g = g * t - 0x1.69e94cp-7f;
  g = g * t + 0x1.d64e4ep-5f;
  g = g * t - 0x1.6db330p-2f;
  g = g * t - 0x1.8aff20p+0f;
  float big = 1.0f - tpu_vm_exp_normal(g - ac * ac);
  return copysignf(a < 0.921875f ? small : big, x);
}

/* ---- bfloat16 <-> float32 in blocks of 16, AVX2 ----
 * Generic per-element conversions vectorize into long lane-crossing
 * sequences; these use one unpack per 8 values on load and one pack per 16
 * on store. The "_il" pair keeps the interleaved order that unpack/pack give
 * within each 128-bit lane (block elements 0-3 and 8-11 in the first vector,
 * 4-7 and 12-15 in the second): element-wise loops may compute in that order
 * because every operand and the result share it, and storing with the
 * matching pack restores the memory order. The "_row" functions keep memory
 * order, for rows whose positions matter. Rounding is the same as
 * tpu_vm_f32_to_bf16 (nearest even, NaN quieted). Only call these from
 * functions compiled for AVX2 (TPU_VEC_AVX2) after tpu_host_isa() chose it. */
#ifdef TPU_HAVE_AVX2_BUILD
#include <immintrin.h>
#define TPU_VM_AVX2_INLINE \
  static inline __attribute__((always_inline, target("avx2,fma")))

TPU_VM_AVX2_INLINE void tpu_vm_bf16x16_load_il(const uint16_t* p, __m256* lo, __m256* hi) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p), z = _mm256_setzero_si256();
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h));
}
/* the bfloat16 bits of v, rounded, in the low half of each 32-bit lane */
TPU_VM_AVX2_INLINE __m256i tpu_vm_bf16x8_round(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
  __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000)); /* quiet nan */
  r = _mm256_blendv_epi8(r, q, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm256_srli_epi32(r, 16);
}
TPU_VM_AVX2_INLINE void tpu_vm_bf16x16_store_il(uint16_t* p, __m256 lo, __m256 hi) {
  __m256i h = _mm256_packus_epi32(tpu_vm_bf16x8_round(lo), tpu_vm_bf16x8_round(hi));
  _mm256_storeu_si256((__m256i*)p, h);
}

/* dst[0, n) = bfloat16 src[0, n), in memory order */
static inline __attribute__((target("avx2,fma"))) void tpu_vm_bf16_row_load_avx2(
    float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i*)(src + i));
    _mm256_storeu_si256((__m256i*)(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; i++) dst[i] = tpu_vm_bf16_to_f32(src[i]);
}
/* dst[0, n) = src[0, n) rounded to bfloat16, in memory order */
static inline __attribute__((target("avx2,fma"))) void tpu_vm_bf16_row_store_avx2(
    uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_packus_epi32(tpu_vm_bf16x8_round(_mm256_loadu_ps(src + i)),
                                    tpu_vm_bf16x8_round(_mm256_loadu_ps(src + i + 8)));
    _mm256_storeu_si256((__m256i*)(dst + i), _mm256_permute4x64_epi64(h, 0xd8));
  }
  for (; i < n; i++) dst[i] = tpu_vm_f32_to_bf16(src[i]);
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* TPU_HOST_VECMATH_H_ */
