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
