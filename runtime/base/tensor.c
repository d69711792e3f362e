/* Data types, tensor descriptors, type promotion. */
#include "tpu/tensor.h"

#include <string.h>

size_t tpu_dtype_size(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_U8: case TPU_I8: case TPU_BOOL: return 1;
    case TPU_I16: case TPU_F16: case TPU_BF16: return 2;
    case TPU_I32: case TPU_F32: return 4;
    case TPU_I64: case TPU_F64: return 8;
    default: return 0;
  }
}

const char* tpu_dtype_name(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_U8: return "uint8";
    case TPU_I8: return "int8";
    case TPU_I16: return "int16";
    case TPU_I32: return "int32";
    case TPU_I64: return "int64";
    case TPU_F16: return "float16";
    case TPU_F32: return "float32";
    case TPU_F64: return "float64";
    case TPU_BOOL: return "bool";
    case TPU_BF16: return "bfloat16";
    default: return "unsupported";
  }
}

bool tpu_dtype_is_supported(int dt) { return tpu_dtype_size((tpu_dtype_t)dt) != 0; }

bool tpu_dtype_is_float(tpu_dtype_t dt) {
  return dt == TPU_F16 || dt == TPU_F32 || dt == TPU_F64 || dt == TPU_BF16;
}

bool tpu_dtype_is_integral(tpu_dtype_t dt, bool include_bool) {
  switch (dt) {
    case TPU_U8: case TPU_I8: case TPU_I16: case TPU_I32: case TPU_I64: return true;
    case TPU_BOOL: return include_bool;
    default: return false;
  }
}

/* Rank of each dtype within its category for promotion. */
static int int_rank(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_I8: return 1;
    case TPU_I16: return 2;
    case TPU_I32: return 3;
    case TPU_I64: return 4;
    default: return 0;
  }
}

tpu_dtype_t tpu_dtype_promote(tpu_dtype_t a, tpu_dtype_t b) {
  if (a == TPU_DTYPE_NONE) return b;
  if (b == TPU_DTYPE_NONE) return a;
  if (a == b) return a;
  if (a == TPU_BOOL) return b;
  if (b == TPU_BOOL) return a;
  bool fa = tpu_dtype_is_float(a), fb = tpu_dtype_is_float(b);
  if (fa && fb) {
    if (a == TPU_F64 || b == TPU_F64) return TPU_F64;
    if (a == TPU_F32 || b == TPU_F32) return TPU_F32;
    return TPU_F32; /* f16 with bf16 */
  }
  if (fa) return a;
  if (fb) return b;
  /* both integral, not bool */
  if (a == TPU_U8 || b == TPU_U8) {
    tpu_dtype_t o = a == TPU_U8 ? b : a;
    return o == TPU_I8 ? TPU_I16 : o;
  }
  return int_rank(a) >= int_rank(b) ? a : b;
}

static tpu_dtype_t combine_categories(tpu_dtype_t higher, tpu_dtype_t lower) {
  if (higher != TPU_DTYPE_NONE && tpu_dtype_is_float(higher)) return higher;
  if (higher == TPU_BOOL || (lower != TPU_DTYPE_NONE && tpu_dtype_is_float(lower)))
    return tpu_dtype_promote(higher, lower);
  if (higher != TPU_DTYPE_NONE) return higher;
  return lower;
}

tpu_dtype_t tpu_result_type(const tpu_tensor_t* const* ts, int n) {
  tpu_dtype_t dim = TPU_DTYPE_NONE, zero = TPU_DTYPE_NONE, wrapped = TPU_DTYPE_NONE;
  for (int i = 0; i < n; i++) {
    const tpu_tensor_t* t = ts[i];
    if (!t) continue;
    tpu_dtype_t dt = t->dtype;
    if (t->flags & TPU_TENSOR_WRAPPED_NUMBER) {
      if (tpu_dtype_is_float(dt)) dt = TPU_F32; /* default dtype */
      wrapped = tpu_dtype_promote(wrapped, dt);
    } else if (t->ndim == 0) {
      zero = tpu_dtype_promote(zero, dt);
    } else {
      dim = tpu_dtype_promote(dim, dt);
    }
  }
  return combine_categories(dim, combine_categories(zero, wrapped));
}

int64_t tpu_tensor_numel(const tpu_tensor_t* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->sizes[i];
  return n;
}

bool tpu_tensor_is_contiguous(const tpu_tensor_t* t) {
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->sizes[i] == 0) return true;
    if (t->sizes[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->sizes[i];
  }
  return true;
}
