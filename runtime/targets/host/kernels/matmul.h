/* Host kernel library: general matrix multiply shared by kernel families,
 * and the strided-run conversions it is built on.
 *
 * tpu_gemm computes c = beta * self + alpha * (a @ b) with PyTorch's addmm
 * semantics: beta == 0 ignores self (even NaN or Inf there), alpha == 0 or
 * K == 0 leaves beta * self. Operands may have any strides (transposed views
 * are read through the packing routines) and may overlap c; self may be
 * broadcast to c's shape or be c itself (in-place). Floating types compute in
 * float (float32, bfloat16, float16; rounded once on store) or double
 * (float64); integer types accumulate in 64-bit wrapping arithmetic.
 *
 * Float32 inputs follow the float32 matmul precision of the running call
 * (tpu_kernel_precision(), read on the calling thread): medium multiplies
 * inputs rounded to bfloat16, high the 3-pass bfloat16 split, highest in
 * float32; bfloat16/float16 inputs take one pass in every mode.
 */
#ifndef TPU_HOST_MATMUL_H_
#define TPU_HOST_MATMUL_H_

#include <stdbool.h>

#include "tpu/status.h"
#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* a: M x K, b: K x N, c: M x N (output), self: NULL or broadcastable to
 * M x N. */
tpu_status_t tpu_gemm(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                      double alpha, double beta, const tpu_tensor_t* self);

/* Scales of a product's operand, applied while it is packed: element (l, k)
 * (l a row of A or a column of B, k along K) is multiplied, in float32, by
 * s[l * sl + (k / blk) * sk] (sl = sk = 0: one scale; sk = 0: per row or
 * column; blocks of blk along K otherwise). With `codes` set (s unused) the
 * block scales are float8 codes of code_dtype (float8_e8m0fnu or
 * float8_e4m3fn), kblocks per line, in cuBLAS's swizzled block-scaled layout
 * (128 x 4 tiles of lines x k blocks), decoded as they are used. The caller
 * owns the arrays. */
typedef struct tpu_gemm_scale {
  const float* s;
  int64_t sl, sk, blk;
  const uint8_t* codes;
  tpu_dtype_t code_dtype;
  int64_t kblocks;
} tpu_gemm_scale_t;

/* c = (a * sa) @ (b * sb) + bias, 2-D, with float32 products and sums (the
 * precision mode does not apply), rounded once to c's dtype; a and b any float
 * dtype but float64, or float4_e2m1fn_x2 (two values a byte along K: a is
 * M x K/2 bytes, b K/2 x N); float8 and float4 codes decode while they are
 * packed, so no float32 copy of an operand is made. sa / sb NULL for none,
 * bias NULL or broadcastable to M x N. c may not overlap the inputs.
 * Errors: INVALID_ARGUMENT (dtypes, shapes, overlap), RESOURCE_EXHAUSTED. */
tpu_status_t tpu_gemm_scaled(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                             const tpu_gemm_scale_t* sa, const tpu_gemm_scale_t* sb,
                             const tpu_tensor_t* bias);

/* Batched: a: B x M x K, b: B x K x N, c: B x M x N, self: NULL or
 * broadcastable to B x M x N. */
tpu_status_t tpu_gemm_batched(const tpu_tensor_t* a, const tpu_tensor_t* b,
                              const tpu_tensor_t* c, double alpha, double beta,
                              const tpu_tensor_t* self);

/* Instruction sets of the float micro-kernels. The default is the best one
 * the CPU (and the OS's saved register state) supports, capped by the
 * environment variable TORCH_TPU_ISA=portable|avx2|avx512; with
 * TORCH_TPU_LOG_ISA=1 the choice is printed to stderr once. */
typedef enum tpu_gemm_isa {
  TPU_GEMM_ISA_AUTO = -1,
  TPU_GEMM_ISA_PORTABLE = 0,
  TPU_GEMM_ISA_AVX2 = 1,   /* AVX2 + FMA */
  TPU_GEMM_ISA_AVX512 = 2, /* AVX-512F */
} tpu_gemm_isa_t;

/* Forces the float micro-kernel's ISA (tests, benchmarks); AUTO returns to
 * the default. False, changing nothing, for one this CPU or build lacks. */
bool tpu_gemm_set_isa(tpu_gemm_isa_t isa);
/* Name of the float micro-kernel in use: "portable", "avx2", "avx512". */
const char* tpu_gemm_isa_name(void);
/* Products of one bfloat16 pass (bfloat16 operands, float32 ones at
 * precision medium) run on AVX-512 BF16 two-step dot products where the CPU
 * has them, unless TORCH_TPU_GEMM_DOT2=0. on = 0 / 1 turns them off / on
 * (on only takes effect where the CPU has them; tests, benchmarks), -1
 * returns to the default. */
void tpu_gemm_allow_dot2(int on);

/* Converting copies of strided runs of n elements. `src`/`dst` address the
 * run's first element of storage dtype dt; strides are in elements (may be
 * 0 for loads). The buffer side has the compute type and its own stride.
 * Integer targets truncate like a C cast; bool stores v != 0. */
void tpu_run_load_f32(float* dst, int64_t dstride, const void* src, int64_t sstride,
                      tpu_dtype_t dt, int64_t n);
void tpu_run_load_f64(double* dst, int64_t dstride, const void* src, int64_t sstride,
                      tpu_dtype_t dt, int64_t n);
void tpu_run_load_i64(int64_t* dst, int64_t dstride, const void* src, int64_t sstride,
                      tpu_dtype_t dt, int64_t n);
void tpu_run_store_f32(void* dst, int64_t dstride, tpu_dtype_t dt, const float* src, int64_t n);
void tpu_run_store_f64(void* dst, int64_t dstride, tpu_dtype_t dt, const double* src, int64_t n);
void tpu_run_store_i64(void* dst, int64_t dstride, tpu_dtype_t dt, const int64_t* src, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* TPU_HOST_MATMUL_H_ */
