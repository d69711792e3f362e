/* TorchTPU runtime: data types and tensor descriptors.
 *
 * A tpu_tensor_t describes a strided view of device memory; it owns nothing.
 * The numeric values of tpu_dtype_t equal PyTorch's c10::ScalarType values so
 * the bridge converts with a cast (checked by static_asserts there).
 */
#ifndef TPU_TENSOR_H_
#define TPU_TENSOR_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_dtype {
  TPU_U8 = 0,
  TPU_I8 = 1,
  TPU_I16 = 2,
  TPU_I32 = 3,
  TPU_I64 = 4,
  TPU_F16 = 5,
  TPU_F32 = 6,
  TPU_F64 = 7,
  /* complex: (real, imag) pairs of float32 / float64, interleaved */
  TPU_C64 = 9,
  TPU_C128 = 10,
  TPU_BOOL = 11,
  TPU_BF16 = 15,
  /* float8 formats (tpu/float8.h), stored as one byte each */
  TPU_F8E5M2 = 23,
  TPU_F8E4M3FN = 24,
  TPU_F8E5M2FNUZ = 25,
  TPU_F8E4M3FNUZ = 26,
  TPU_U16 = 27,
  TPU_U32 = 28,
  TPU_U64 = 29,
  TPU_F8E8M0FNU = 44,
  /* two float4 e2m1 values per byte; an opaque container for most ops */
  TPU_F4E2M1FNX2 = 45,
  TPU_DTYPE_NONE = -1,
} tpu_dtype_t;

/* Bytes per element; 0 for an unsupported dtype. */
size_t tpu_dtype_size(tpu_dtype_t dt);
/* "float32", "bfloat16", ...; "unsupported" otherwise. */
const char* tpu_dtype_name(tpu_dtype_t dt);
bool tpu_dtype_is_supported(int dt);
/* The float8 and float4 dtypes: storage formats that kernels compute in
 * float32 (float4 only moves). Only the ops that say so take them (see
 * tpu_dtype_narrow_op_takes); tpu_dtype_is_float is true for the float8 ones. */
bool tpu_dtype_is_narrow(tpu_dtype_t dt);
/* Whether ATen op family `base` ("copy", "index_select", "cat") has kernels
 * for the narrow dtypes (and which: float8, float4 too). */
bool tpu_dtype_narrow_op_takes(const char* base, tpu_dtype_t dt);
bool tpu_dtype_is_float(tpu_dtype_t dt);
/* complex64 / complex128. Not float: kernels that take them say so (the
 * family list of tpu_dtype_narrow_op_takes); their real element type is
 * tpu_dtype_complex_part. */
static inline bool tpu_dtype_is_complex(tpu_dtype_t dt) { return dt == 9 || dt == 10; }
/* float32 for complex64, float64 for complex128, dt itself otherwise. */
tpu_dtype_t tpu_dtype_complex_part(tpu_dtype_t dt);
bool tpu_dtype_is_integral(tpu_dtype_t dt, bool include_bool);
/* PyTorch's promoteTypes on the supported dtypes. */
tpu_dtype_t tpu_dtype_promote(tpu_dtype_t a, tpu_dtype_t b);

#define TPU_MAX_DIMS 64

enum {
  /* A 0-d tensor that PyTorch created from a Python number (wrapped number);
   * it takes part in type promotion with the lowest priority. */
  TPU_TENSOR_WRAPPED_NUMBER = 1u << 0,
  /* A 0-d CPU tensor passed to a device op; `data` points at a copy the call
   * owns. */
  TPU_TENSOR_CPU_SCALAR = 1u << 1,
};

typedef struct tpu_tensor {
  void* data;       /* address of the element at index (0, ..., 0) */
  tpu_dtype_t dtype;
  int32_t ndim;
  uint32_t flags;
  int32_t device;
  int64_t sizes[TPU_MAX_DIMS];
  int64_t strides[TPU_MAX_DIMS]; /* in elements, may be 0 or negative-free */
  unsigned char inline_value[16]; /* storage for TPU_TENSOR_CPU_SCALAR */
} tpu_tensor_t;

int64_t tpu_tensor_numel(const tpu_tensor_t* t);
bool tpu_tensor_is_contiguous(const tpu_tensor_t* t);
/* True when t is 0-d; with TPU_TENSOR_CPU_SCALAR or not. */
static inline bool tpu_tensor_is_scalar(const tpu_tensor_t* t) { return t->ndim == 0; }

/* Scalar conversions: bfloat16 and float16 <-> float32. */
static inline float tpu_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* Round to nearest even; a NaN stays a (quiet) NaN. Without branches, so that
 * loops calling it vectorize. */
static inline uint16_t tpu_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
float tpu_f16_to_f32(uint16_t h);
uint16_t tpu_f32_to_f16(float f);

/* Loads element at p (dtype dt) as double / int64; stores v converted. */
double tpu_load_f64(const void* p, tpu_dtype_t dt);
int64_t tpu_load_i64(const void* p, tpu_dtype_t dt);
void tpu_store_f64(void* p, tpu_dtype_t dt, double v);
void tpu_store_i64(void* p, tpu_dtype_t dt, int64_t v);

/* Reads element `linear` (row-major logical index) converted to double /
 * int64. Slow; for tests, scalars and reference paths. */
double tpu_tensor_get_f64(const tpu_tensor_t* t, int64_t linear);
int64_t tpu_tensor_get_i64(const tpu_tensor_t* t, int64_t linear);
/* Byte offset of row-major logical index `linear` in t. */
int64_t tpu_tensor_offset_of(const tpu_tensor_t* t, int64_t linear);
/* Address of element `linear` (row-major logical index). */
void* tpu_tensor_elem_ptr(const tpu_tensor_t* t, int64_t linear);

/* Type promotion of a set of operands as PyTorch's at::result_type does:
 * dimensioned tensors first, then 0-d tensors, then wrapped numbers. */
tpu_dtype_t tpu_result_type(const tpu_tensor_t* const* ts, int n);

#ifdef __cplusplus
}
#endif
#endif /* TPU_TENSOR_H_ */
