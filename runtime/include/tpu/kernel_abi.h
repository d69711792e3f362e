/* TorchTPU custom kernel ABI (version 1): what a user's C kernel sees.
 *
 * torch_tpu.kernels.c_op compiles a kernel's source with this header included
 * first (as "torch_tpu_kernel.h"; torch_tpu.kernels.header_path() writes it to
 * disk for editors). The source defines one entry function
 *
 *     int my_kernel(const tpuk_call_t* call);
 *
 * which returns 0 on success, or writes a message with tpuk_fail() and
 * returns its nonzero result. The runtime calls it on the stream's worker
 * thread (or the submitting thread for a small Strict call), after the
 * work queued before it, with
 *   - call->in[]:  the op's tensor arguments in schema order (arguments the op
 *                  declares in mutates_args included; write only those);
 *   - call->out[]: the returned tensors, freshly allocated (contiguous);
 *   - call->num[]: the op's number arguments (int, float, bool) in schema
 *                  order, as double; call->inum[] the same as int64.
 * Tensor memory is the device's: on the host target, ordinary host memory
 * the kernel reads and writes directly. Strides count elements, sizes and
 * strides have ndim entries (none for a 0-d tensor), and an element's
 * address is data + (sum of index[d] * strides[d]) * elem_size.
 *
 * Work over many elements goes to the runtime's thread pool with
 * call->parallel_for (the pool the library kernels use: results must not
 * depend on how the range is split). The library computes bfloat16 and
 * float16 in float32 and rounds once on store (tpuk_f32_to_bf16/_f16 round
 * to nearest even); kernels that do the same match the library's numerics.
 *
 * This header is self-contained (C99 and later, and C++), and its numeric
 * dtype values are PyTorch's c10::ScalarType values.
 */
#ifndef TORCH_TPU_KERNEL_ABI_H_
#define TORCH_TPU_KERNEL_ABI_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPUK_ABI_VERSION 1

/* Exported entry point (kernels are built with default visibility; the macro
 * keeps them exported under -fvisibility=hidden too). */
#define TPUK_EXPORT __attribute__((visibility("default")))

typedef enum tpuk_dtype {
  TPUK_U8 = 0,
  TPUK_I8 = 1,
  TPUK_I16 = 2,
  TPUK_I32 = 3,
  TPUK_I64 = 4,
  TPUK_F16 = 5,
  TPUK_F32 = 6,
  TPUK_F64 = 7,
  TPUK_BOOL = 11,
  TPUK_BF16 = 15,
  /* one-byte float8 formats: storage only, decode them to compute */
  TPUK_F8E5M2 = 23,
  TPUK_F8E4M3FN = 24,
  TPUK_F8E5M2FNUZ = 25,
  TPUK_F8E4M3FNUZ = 26,
  TPUK_U16 = 27,
  TPUK_U32 = 28,
  TPUK_U64 = 29,
  TPUK_F8E8M0FNU = 44,
  TPUK_F4E2M1FNX2 = 45, /* two float4 e2m1 values a byte, element 2i in the low nibble */
} tpuk_dtype_t;

/* One tensor: a strided view of device memory (owned by the caller). */
typedef struct tpuk_tensor {
  void* data;             /* element (0, ..., 0) */
  int32_t dtype;          /* tpuk_dtype_t */
  int32_t ndim;
  const int64_t* sizes;   /* ndim entries */
  const int64_t* strides; /* ndim entries, in elements */
  int64_t numel;
} tpuk_tensor_t;

typedef void (*tpuk_range_fn)(void* ctx, int64_t begin, int64_t end);

typedef struct tpuk_call {
  int32_t abi_version; /* TPUK_ABI_VERSION */
  int32_t n_in, n_out, n_num;
  const tpuk_tensor_t* in;
  const tpuk_tensor_t* out;
  const double* num;
  const int64_t* inum;
  /* Runs fn(ctx, begin, end) over [0, n) in chunks of at least `grain`
   * elements on the runtime's thread pool (inline when n <= grain); returns
   * when every chunk ran. */
  void (*parallel_for)(int64_t n, int64_t grain, tpuk_range_fn fn, void* ctx);
  int32_t num_threads; /* the pool's size */
  const char* name;    /* the op's name ("mylib::scaled_add") */
  char* error;         /* tpuk_fail's message buffer */
  size_t error_cap;
} tpuk_call_t;

/* The entry point's type. */
typedef int (*tpuk_entry_fn)(const tpuk_call_t* call);

/* Writes an error message for the caller (raised as a RuntimeError naming the
 * op) and returns 1, so a kernel can `return tpuk_fail(call, "...", ...);`. */
static inline int tpuk_fail(const tpuk_call_t* call, const char* fmt, ...) {
  if (call->error && call->error_cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->error, call->error_cap, fmt, ap);
    va_end(ap);
  }
  return 1;
}

/* Bytes per element of a dtype (0 for an unknown value). */
static inline size_t tpuk_dtype_size(int32_t dt) {
  switch (dt) {
    case TPUK_U8: case TPUK_I8: case TPUK_BOOL: return 1;
    case TPUK_I16: case TPUK_F16: case TPUK_BF16: return 2;
    case TPUK_I32: case TPUK_F32: return 4;
    case TPUK_I64: case TPUK_F64: return 8;
    default: return 0;
  }
}

/* Whether t's elements are dense in row-major order (strides of size-1 dims
 * do not matter). */
static inline int tpuk_is_contiguous(const tpuk_tensor_t* t) {
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->sizes[d] != 1 && t->strides[d] != expect) return 0;
    expect *= t->sizes[d];
  }
  return 1;
}

/* Element offset (in elements, from data) of row-major logical index i. */
static inline int64_t tpuk_offset(const tpuk_tensor_t* t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    const int64_t n = t->sizes[d];
    if (n > 0) {
      off += (i % n) * t->strides[d];
      i /= n;
    }
  }
  return off;
}

/* ---- element types: bfloat16 and float16 are bit patterns in uint16_t ---- */
static inline float tpuk_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t tpuk_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float tpuk_bf16_to_f32(uint16_t h) { return tpuk_bits_to_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t tpuk_f32_to_bf16(float f) {
  const uint32_t u = tpuk_f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float tpuk_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return tpuk_bits_to_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) { /* zero or subnormal: m * 2^-24 is exact in float */
    const float v = (float)m * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return tpuk_bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even, overflow to infinity, NaN stays a quiet NaN. */
static inline uint16_t tpuk_f32_to_f16(float f) {
  const uint32_t u = tpuk_f32_to_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (a < 0x38800000u) { /* below the smallest normal: a multiple of 2^-24 */
    const float v = tpuk_bits_to_f32(a) * 16777216.0f; /* exact scaling */
    /* round half to even in float arithmetic: adding 2^23 does it */
    const float r = (v + 8388608.0f) - 8388608.0f;
    return (uint16_t)(sign | (uint16_t)r);
  }
  /* normal: drop 13 mantissa bits with round to nearest even */
  const uint32_t rebased = a - 0x38000000u; /* exponent 127 -> 15 */
  const uint32_t r = (rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13;
  return (uint16_t)(sign | r);
}

/* Element i (an offset from tpuk_offset) of t as float / stored from float,
 * for float32, bfloat16, float16 and float64 tensors. */
static inline float tpuk_load_f32(const tpuk_tensor_t* t, int64_t off) {
  switch (t->dtype) {
    case TPUK_F32: return ((const float*)t->data)[off];
    case TPUK_BF16: return tpuk_bf16_to_f32(((const uint16_t*)t->data)[off]);
    case TPUK_F16: return tpuk_f16_to_f32(((const uint16_t*)t->data)[off]);
    case TPUK_F64: return (float)((const double*)t->data)[off];
    default: return 0.0f;
  }
}
static inline void tpuk_store_f32(const tpuk_tensor_t* t, int64_t off, float v) {
  switch (t->dtype) {
    case TPUK_F32: ((float*)t->data)[off] = v; break;
    case TPUK_BF16: ((uint16_t*)t->data)[off] = tpuk_f32_to_bf16(v); break;
    case TPUK_F16: ((uint16_t*)t->data)[off] = tpuk_f32_to_f16(v); break;
    case TPUK_F64: ((double*)t->data)[off] = (double)v; break;
    default: break;
  }
}

#ifdef __cplusplus
}
#endif
#endif /* TORCH_TPU_KERNEL_ABI_H_ */
