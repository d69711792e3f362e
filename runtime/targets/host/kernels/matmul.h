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

/* Batched: a: B x M x K, b: B x K x N, c: B x M x N, self: NULL or
 * broadcastable to B x M x N. */
tpu_status_t tpu_gemm_batched(const tpu_tensor_t* a, const tpu_tensor_t* b,
                              const tpu_tensor_t* c, double alpha, double beta,
                              const tpu_tensor_t* self);

/* Selects the float micro-kernel: true (the default) uses the AVX2/FMA one
 * where the CPU has it, false the portable one. For tests and benchmarks. */
void tpu_gemm_set_simd(bool enable);

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
