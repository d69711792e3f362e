/* Float GEMM micro-kernels, one set per instruction set, and the input
 * transforms that implement the matmul precision levels (internal to
 * matmul.c and the gemm_ukernel_*.c files).
 *
 * Packed operands. The blocking loops in matmul.c copy A and B into panels:
 * an A panel holds MR rows, a B panel NR columns, stored k-major
 * (element (line l, step k) at panel[k * w + l], w = MR or NR). Each source
 * step k may expand into `np` packed steps (k * np + p) holding transform
 * xf[p] of the value: that is how the multi-pass precision levels become one
 * product over a longer K, whose steps the micro-kernel accumulates in order.
 *
 * Precision levels on float32 inputs (bfloat16/float16 inputs are exact in
 * every transform, so they always take one pass):
 *   medium:  A: bf16(a)            B: bf16(b)               (np = 1)
 *   high:    A: hi(a), lo(a)       B: hi(b) + lo(b), hi(b)  (np = 2)
 *            = a_hi*b_hi + a_hi*b_lo + a_lo*b_hi, the 3-pass bf16 split, in
 *            two float32 passes; hi(b) + lo(b) is exact in float32 and the
 *            product a_hi * (b_hi + b_lo) is rounded at most once, into the
 *            accumulation (fused multiply-add), so the error stays within
 *            float32 accumulation error of the 3-pass sum.
 *   highest: A: a                  B: b                     (np = 1)
 *            true float32 products (more accurate than the 6-pass split,
 *            which drops terms of 2^-24 relative size).
 * bf16(x) rounds to nearest even; hi(x) = bf16(x) except that a finite x
 * that rounds to infinity is truncated instead, so hi(x) + lo(x) stays
 * finite; lo(x) = bf16(x - hi(x)) (x - hi(x) is exact), 0 for infinite x.
 */
#ifndef TPU_HOST_GEMM_UKERNEL_H_
#define TPU_HOST_GEMM_UKERNEL_H_

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gemm_xform {
  GEMM_XF_EXACT = 0, /* the value itself */
  GEMM_XF_BF16,      /* rounded to bfloat16 (nearest even) */
  GEMM_XF_HI,        /* hi(x) */
  GEMM_XF_LO,        /* lo(x) */
  GEMM_XF_HI16,      /* hi(x) + lo(x) */
} gemm_xform_t;

enum { GEMM_MAX_PASSES = 2 };
/* steps of tile_rows per prefetched line */
enum { GEMM_PF_STEPS = 8 };

/* The packed steps one source step expands into, for A and for B. */
typedef struct gemm_passes {
  int np;
  gemm_xform_t a[GEMM_MAX_PASSES], b[GEMM_MAX_PASSES];
} gemm_passes_t;

/* Products of one bfloat16 pass (bfloat16 operands, or float32 ones at
 * precision medium) with two-step dot products (AVX-512 BF16's VDPBF16PS),
 * for the micro-kernel of the same MR x NR that points to it.
 *
 * Packed operands are 32-bit words, each holding two steps of a line as
 * bfloat16: step 2j in the high half, 2j + 1 in the low half; a line of kc
 * steps takes kp = ceil(kc / 2) words (word j of line l of a panel at
 * panel[j * w + l], like a float panel's steps). The instruction adds the
 * high half's product first, so every sum runs over k in order; products of
 * bfloat16 values are exact in float32 and each addition rounds to nearest
 * even, so the sums equal the float tiles' on the same values, except that
 * denormal inputs and sums are flushed to zero (matmul.c uses them only
 * where no input or sum can be denormal: see min_abs). A missing last step
 * is -0 in A and +0 in B: their product, -0, leaves any sum as it is. */
typedef struct gemm_dot2 {
  /* tile_rows on words: c[i * ldc + j] = ((accumulate ? c : 0) + sum_k
   * a_ik * b_kj) + s[i * lds + j] over the mr x nr tile, A a panel
   * (a[j * mr + i], lda 0) or rows (a[i * lda + j]), B a panel; pf/npf as
   * for tile_rows. */
  void (*tile)(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, float* c,
               int64_t ldc, bool accumulate, const float* s, int64_t lds,
               const void* const* pf, int64_t npf);
  /* Packs `lines` lines of kc steps (line l, step k at element l * sl + k *
   * sk of src: float32, rounded to nearest even with NaN quieted, or
   * bfloat16 when bf16) into panels of w words per pair of steps, w <= nr; a
   * last partial panel is padded with zero words, a missing last step with
   * the bits `pad`. */
  void (*pack)(uint32_t* dst, const void* src, bool bf16, int64_t sl, int64_t sk,
               int64_t lines, int64_t kc, int w, uint16_t pad);
  /* The smallest magnitude among the nonzero values of a contiguous run of n
   * float32 (bf16 false) or bfloat16 values, NaN and infinities included
   * (as the largest), as float32; INFINITY where all are zero or n is 0. */
  float (*min_abs)(const void* src, bool bf16, int64_t n);
} gemm_dot2_t;

typedef struct gemm_ukernel {
  const char* name; /* "avx512", "avx2", "portable" */
  int mr, nr;
  /* c[i * ldc + j] = ((accumulate ? c[i * ldc + j] : 0) + sum_k a[k * mr + i] *
   * b[k * nr + j]) + s[i * lds + j] for the mr x nr tile, k over [0, kc);
   * the sum starts from 0 and is added to c once at the end; the epilogue
   * operand s (a bias row when lds is 0) is optional: NULL adds nothing. */
  void (*tile)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
               bool accumulate, const float* s, int64_t lds);
  /* sum_k x[k] * y[k] in a fixed order */
  float (*dot)(const float* x, const float* y, int64_t n);
  /* Packs float32 lines into panels of width w: line l starts at src + l *
   * sl, its step k at + k * sk; line l = q * w + i goes to panel q at dst +
   * q * w * kc * np, as panel[(k * np + p) * w + i] = xf[p](value) for
   * k < kc; a last partial panel is padded with zeros. Returns false for
   * layouts it leaves to the generic packer (matmul.c); NULL: none. */
  bool (*pack_f32)(float* dst, const float* src, int64_t sl, int64_t sk, int64_t lines,
                   int64_t kc, int w, const gemm_xform_t* xf, int np);
  /* tile with A kept by rows: a[i * lda + k] instead of a packed panel
   * (products with few columns, where transposing A into panels would cost
   * more than the columns reuse it); NULL: not provided. Along the way it
   * prefetches the npf cache lines at addresses pf[0..npf), one every
   * GEMM_PF_STEPS steps (npf <= kc / GEMM_PF_STEPS + 1): the caller's next
   * rows, fetched while the sums run instead of in a burst later. */
  void (*tile_rows)(int64_t kc, const float* a, int64_t lda, const float* b, float* c,
                    int64_t ldc, bool accumulate, const float* s, int64_t lds,
                    const void* const* pf, int64_t npf);
  /* pack_f32 for bfloat16 lines (strides in elements), widened exactly;
   * false for layouts or multi-pass transforms it leaves to the generic
   * packer; NULL: none. */
  bool (*pack_bf16)(float* dst, const uint16_t* src, int64_t sl, int64_t sk, int64_t lines,
                    int64_t kc, int w, const gemm_xform_t* xf, int np);
  /* two-step bfloat16 dot products, used only where the CPU has them
   * (matmul.c); NULL: none */
  const gemm_dot2_t* dot2;
  /* tile with A kept by columns: row i of step k at a[k * lda + i] (a
   * packed panel is the case lda == mr), for an A that some other product
   * left in that layout (attention's P^T and dS^T, the probabilities and
   * their gradients computed by query rows), which would otherwise be
   * repacked for every block; NULL: not provided. */
  void (*tile_cols)(int64_t kc, const float* a, int64_t lda, const float* b, float* c,
                    int64_t ldc, bool accumulate, const float* s, int64_t lds);
} gemm_ukernel_t;

extern const gemm_ukernel_t tpu_gemm_ukernel_portable;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define TPU_GEMM_HAVE_X86 1
extern const gemm_ukernel_t tpu_gemm_ukernel_avx2;
extern const gemm_ukernel_t tpu_gemm_ukernel_avx512;
extern const gemm_dot2_t tpu_gemm_dot2_avx512bf16;
#endif

/* ---- scalar transforms (the reference for the vector versions) ---- */
static inline uint32_t gemm_f2u(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float gemm_u2f(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* nearest even bfloat16 value; NaN stays NaN */
static inline float gemm_round_bf16(float x) {
  uint32_t u = gemm_f2u(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  return gemm_u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

static inline float gemm_split_hi(float x) {
  uint32_t u = gemm_f2u(x), r = gemm_f2u(gemm_round_bf16(x));
  bool overflow = (r & 0x7fffffffu) == 0x7f800000u && (u & 0x7fffffffu) != 0x7f800000u;
  return gemm_u2f(overflow ? u & 0xffff0000u : r);
}

static inline float gemm_xform(gemm_xform_t xf, float x) {
  switch (xf) {
    case GEMM_XF_BF16: return gemm_round_bf16(x);
    case GEMM_XF_HI: return gemm_split_hi(x);
    case GEMM_XF_LO:
    case GEMM_XF_HI16: {
      float hi = gemm_split_hi(x);
      float lo = (gemm_f2u(x) & 0x7f800000u) == 0x7f800000u ? 0.0f : gemm_round_bf16(x - hi);
      return xf == GEMM_XF_LO ? lo : hi + lo;
    }
    default: return x;
  }
}

#ifdef __cplusplus
}
#endif
#endif /* TPU_HOST_GEMM_UKERNEL_H_ */
