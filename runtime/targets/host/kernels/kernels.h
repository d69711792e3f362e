/* Host target kernel library: shared internals for kernel families.
 *
 * Kernels are `tpu_status_t tpu_k_<name>(const tpu_call_t*)`; the op tables
 * (*.def beside this file) bind ATen overload names to them. Outputs are
 * preallocated by the caller with their final shape, strides and dtype.
 *
 * Element-wise work goes through the chunked iterator below: operands are
 * broadcast to the output's shape, dimensions are coalesced, and each chunk
 * of up to TPU_CHUNK elements is handed to a loop body as contiguous arrays
 * of one compute type (float for f16/bf16/f32, double for f64, int64 for
 * integers and bool). Operands already contiguous in the compute type are
 * passed in place; others are converted through per-thread buffers.
 */
#ifndef TPU_HOST_KERNELS_H_
#define TPU_HOST_KERNELS_H_

#include <math.h>
#include <string.h>

#include "tpu/device.h"
#include "tpu/op.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPU_CHUNK 512
#define TPU_ITER_MAX_OPS 6

typedef enum tpu_ctype { TPU_CT_F32 = 0, TPU_CT_F64 = 1, TPU_CT_I64 = 2 } tpu_ctype_t;

/* Compute type used for a storage dtype. */
tpu_ctype_t tpu_ctype_of(tpu_dtype_t dt);
size_t tpu_ctype_size(tpu_ctype_t ct);

/* Loop body: n elements, out and in[k] are contiguous arrays of the compute
 * type. `ctx` is the kernel's closure (scalars and so on). */
typedef void (*tpu_loop_fn_t)(void* ctx, int64_t n, void* out, const void* const* in);

/* Runs body over out = f(in[0..nin-1]) with broadcasting; computes in `ct`.
 * Inputs may be 0-d CPU scalars. Returns an error for unbroadcastable shapes
 * or unsupported dtypes. */
tpu_status_t tpu_elementwise(const tpu_tensor_t* out, const tpu_tensor_t* const* in,
                             int nin, tpu_ctype_t ct, tpu_loop_fn_t body, void* ctx);

/* Same, with one loop body per compute type (entries may be NULL when a type
 * is not supported: error naming `op`). `bf16`, optional, is the f32 body
 * reading and writing bfloat16 arrays: used instead of converting through
 * float buffers when every operand is bfloat16 with unit inner stride. */
typedef struct tpu_loop_set {
  tpu_loop_fn_t f32, f64, i64;
  tpu_loop_fn_t bf16;
} tpu_loop_set_t;
tpu_status_t tpu_elementwise_set(const char* op, const tpu_tensor_t* out,
                                 const tpu_tensor_t* const* in, int nin, tpu_ctype_t ct,
                                 const tpu_loop_set_t* loops, void* ctx);

/* Strided N-d iteration helper for kernels that are not element-wise:
 * visits every index of `sizes` (row-major) calling fn with the byte offsets
 * of each operand. */
typedef struct tpu_nd_iter {
  int ndim;
  int64_t sizes[TPU_MAX_DIMS];
  int64_t idx[TPU_MAX_DIMS];
} tpu_nd_iter_t;

/* Converting copy of an arbitrary strided tensor into another of the same
 * shape (any dtypes). */
tpu_status_t tpu_copy_strided(const tpu_tensor_t* dst, const tpu_tensor_t* src);

/* A contiguous host copy of t's elements in double (int64 with `as_int`) for
 * kernels that work on small staged operands; NULL when out of memory (or
 * when the copy fails). The caller frees it with free(). */
void* tpu_stage_f64(const tpu_tensor_t* t, bool as_int);
/* Writes the contiguous doubles v (out's shape, row-major) into out. */
tpu_status_t tpu_unstage_f64(const tpu_tensor_t* out, const double* v);

/* v as an element of dtype dt holds it (float dtypes inline; others through
 * a store and a load). */
static inline double tpu_round_f64(tpu_dtype_t dt, double v) {
  switch (dt) {
    case TPU_F64: return v;
    case TPU_F32: return (float)v;
    case TPU_F16: return tpu_f16_to_f32(tpu_f32_to_f16((float)v));
    case TPU_BF16: return tpu_bf16_to_f32(tpu_f32_to_bf16((float)v));
    default: {
      unsigned char b[8];
      tpu_store_f64(b, dt, v);
      return tpu_load_f64(b, dt);
    }
  }
}

/* A tensor descriptor with the same data as t restricted/reshaped; helpers
 * for kernels. `tpu_tensor_make_contig` fills sizes and contiguous strides. */
void tpu_tensor_make_contig(tpu_tensor_t* t, void* data, tpu_dtype_t dt, int ndim,
                            const int64_t* sizes);

/* Kernel-side argument checks with messages naming the op. */
#define TPU_CHECK_ARG(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) return tpu_status_make(TPU_CODE_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

/* Complex operands (complex.c). A kernel of a real family whose op also
 * takes complex64/complex128 (tpu_dtype_narrow_op_takes) starts with
 * TPU_ROUTE_COMPLEX(call): a call with a complex tensor, result or scalar is
 * computed by tpu_complex_call, chosen by the call's op family. */
bool tpu_call_has_complex(const tpu_call_t* call);
tpu_status_t tpu_complex_call(const tpu_call_t* call);
#define TPU_ROUTE_COMPLEX(call)                                         \
  do {                                                                  \
    if (tpu_call_has_complex(call)) return tpu_complex_call(call);      \
  } while (0)
/* sum / mean / prod of complex input; dim_arg: the argument holding the dims
 * (int or int list; none or empty: every dim), -1 for the full reductions. */
tpu_status_t tpu_complex_reduce(const tpu_call_t* call, int dim_arg);
/* A real-valued op of a complex input's magnitudes (linalg_vector_norm):
 * reruns the call's kernel with argument 0 replaced by |self|. */
tpu_status_t tpu_complex_on_abs(const tpu_call_t* call);
/* c = beta * self + alpha * (a @ b) with complex operands or scalars (alpha,
 * beta: real and imaginary parts): four real GEMMs on the parts, so the
 * float32 matmul precision applies; a complex alpha or beta scales the
 * product afterwards. `batched`: 3-D operands. */
tpu_status_t tpu_complex_gemm(const char* op, const tpu_tensor_t* a, const tpu_tensor_t* b,
                              const tpu_tensor_t* c, const double alpha[2], const double beta[2],
                              const tpu_tensor_t* self, bool batched);
/* renorm of complex input: the magnitudes |t| as contiguous doubles (NULL
 * when out of host memory; the caller frees), and out = self * factors[k]
 * for each slice k along dim. */
double* tpu_complex_stage_abs(const tpu_tensor_t* t);
tpu_status_t tpu_complex_scale_slices(const tpu_tensor_t* out, const tpu_tensor_t* self, int dim,
                                      const double* factors);
/* Converting copy where src or dst is complex (tpu_copy_strided's path). */
tpu_status_t tpu_complex_copy(const tpu_tensor_t* dst, const tpu_tensor_t* src);
/* A complex call run by the call's own real kernel twice (complex_parts.c):
 * over the real parts, then the imaginary parts, of every complex tensor
 * argument and result. For ops linear with real weights (padding, im2col);
 * a complex scalar argument is UNIMPLEMENTED. */
tpu_status_t tpu_complex_by_parts(const tpu_call_t* call);
/* A call of a truth-value op (logical_*, any, all, count_nonzero,
 * nonzero_static) with complex operands (index.c): reruns the call's kernel
 * with each complex argument replaced by its truth values (bool: real or
 * imaginary part nonzero); complex results are computed as bool and
 * converted. */
tpu_status_t tpu_complex_on_truth(const tpu_call_t* call);

/* elu with scale / input_scale other than 1 (misc.c), called by elu */
tpu_status_t tpu_elu_scaled(const tpu_call_t* call);

/* Declarations of every kernel, from the op tables. */
#define TPU_OP(name, fn, flags) tpu_status_t fn(const tpu_call_t* call);
#include "ops_all.def"
#undef TPU_OP

#ifdef __cplusplus
}
#endif
#endif /* TPU_HOST_KERNELS_H_ */
