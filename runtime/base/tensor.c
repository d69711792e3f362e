/* Data types, tensor descriptors, type promotion, element conversions and
 * element access. */
#include "tpu/tensor.h"

#include <string.h>

#include "tpu/float8.h"

size_t tpu_dtype_size(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_U8: case TPU_I8: case TPU_BOOL: return 1;
    case TPU_F8E5M2: case TPU_F8E4M3FN: case TPU_F8E5M2FNUZ: case TPU_F8E4M3FNUZ:
    case TPU_F8E8M0FNU: case TPU_F4E2M1FNX2: return 1;
    case TPU_I16: case TPU_F16: case TPU_BF16: case TPU_U16: return 2;
    case TPU_I32: case TPU_F32: case TPU_U32: return 4;
    case TPU_I64: case TPU_F64: case TPU_U64: case TPU_C64: return 8;
    case TPU_C128: return 16;
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
    case TPU_C64: return "complex64";
    case TPU_C128: return "complex128";
    case TPU_BF16: return "bfloat16";
    case TPU_F8E5M2: return "float8_e5m2";
    case TPU_F8E4M3FN: return "float8_e4m3fn";
    case TPU_F8E5M2FNUZ: return "float8_e5m2fnuz";
    case TPU_F8E4M3FNUZ: return "float8_e4m3fnuz";
    case TPU_F8E8M0FNU: return "float8_e8m0fnu";
    case TPU_F4E2M1FNX2: return "float4_e2m1fn_x2";
    case TPU_U16: return "uint16";
    case TPU_U32: return "uint32";
    case TPU_U64: return "uint64";
    default: return "unsupported";
  }
}

bool tpu_dtype_is_supported(int dt) { return tpu_dtype_size((tpu_dtype_t)dt) != 0; }

bool tpu_dtype_is_float(tpu_dtype_t dt) {
  return dt == TPU_F16 || dt == TPU_F32 || dt == TPU_F64 || dt == TPU_BF16 ||
         (tpu_dtype_is_narrow(dt) && dt != TPU_F4E2M1FNX2);
}

tpu_dtype_t tpu_dtype_complex_part(tpu_dtype_t dt) {
  return dt == TPU_C64 ? TPU_F32 : dt == TPU_C128 ? TPU_F64 : dt;
}

bool tpu_dtype_is_narrow(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F8E5M2: case TPU_F8E4M3FN: case TPU_F8E5M2FNUZ: case TPU_F8E4M3FNUZ:
    case TPU_F8E8M0FNU: case TPU_F4E2M1FNX2: return true;
    default: return false;
  }
}

/* The op families whose host kernels handle the narrow dtypes, as PyTorch CPU
 * does: element-wise ones convert through float32 (iter.c, tpu/float8.h),
 * copies of one dtype and the indexing/shape ops move bytes. Sorted. The
 * second column: 1 when float4_e2m1fn_x2, which only moves, is taken too. The
 * bridge asks CPU first, so an op CPU refuses for a dtype is refused with
 * CPU's message even when it is listed here. */
static const struct {
  const char* base;
  bool f4;
} k_narrow_ops[] = {
    {"_index_put_impl", false}, {"_to_copy", true},  {"abs", false},
    {"cat", true},              {"clone", true},     {"constant_pad_nd", false},
    {"copy", true},             {"eq", true},        {"equal", false},
    {"fill", false},            {"flip", true},      {"index", false},
    {"index_put", false},       {"index_select", true}, {"isnan", true},
    {"masked_select", false},
    {"mm", false},              {"narrow_copy", true},
    {"ne", true},               {"repeat", true},    {"roll", true},
    {"stack", true},            {"where", true},     {"zero", true},
};

/* The unsigned 16/32/64-bit integers: PyTorch CPU has kernels for a few ops
 * only; these (sorted) run on tpu, in 64-bit integer arithmetic that wraps as
 * theirs (uint64 loads as its bits; to float it converts as unsigned). */
static const char* const k_uint_ops[] = {
    "_to_copy", "bitwise_and", "bitwise_or", "bitwise_xor", "cat",  "clone", "copy",
    "cumprod",  "cumsum",      "div",        "eq",          "fill", "index", "mul",
    "ne",       "prod",        "sort",       "stack",       "sum",  "zero",
};

/* The complex dtypes: the families whose host kernels take complex operands
 * (complex.c, fft.c, and the byte-moving shape and index kernels). Sorted. */
static const char* const k_complex_ops[] = {
    "_cholesky_solve_helper", "_conj_physical", "_fft_c2c", "_fft_c2r", "_fft_r2c",
    "_index_put_impl", "_linalg_det", "_linalg_eigh", "_linalg_eigvals", "_linalg_slogdet",
    "_linalg_solve_ex", "_linalg_svd", "_to_copy", "abs", "acos", "acosh", "add", "addbmm",
    "addcdiv", "addcmul", "addmm", "addmv", "angle", "asin", "asinh", "atan", "atanh", "baddbmm",
    "bmm", "cat", "cholesky", "cholesky_inverse", "clone", "complex", "conj_physical",
    "constant_pad_nd", "copy", "cos", "cosh", "cumprod", "cumsum", "div", "dot", "eq", "exp",
    "exp2", "expm1", "fill", "flip", "geqrf", "index", "index_put", "index_select", "isfinite",
    "isinf", "isnan", "lerp", "linalg_cholesky_ex", "linalg_cross", "linalg_eig",
    "linalg_householder_product", "linalg_inv_ex", "linalg_ldl_factor_ex",
    "linalg_ldl_solve", "linalg_lstsq", "linalg_lu", "linalg_lu_factor_ex",
    "linalg_lu_solve", "linalg_matrix_exp", "linalg_qr", "linalg_solve_triangular",
    "linalg_vector_norm", "linspace", "log", "log10", "log1p", "log2", "logaddexp",
    "logcumsumexp", "logspace", "logsumexp", "lu_unpack", "masked_fill", "masked_select", "mean",
    "mm", "mul", "mv", "narrow_copy", "ne", "neg", "norm", "normal", "ormqr", "polar", "pow",
    "prod", "reciprocal", "renorm", "repeat", "roll", "rsqrt", "rsub", "sgn", "sigmoid", "silu",
    "sin", "sinc", "sinh", "sqrt", "stack", "std", "std_mean", "sub", "sum", "tan", "tanh",
    "trace", "triangular_solve", "uniform", "var", "var_mean", "vdot", "where", "zero",
};

/* More complex families: the data-movement kernels that take any element size
 * or split a complex tensor into its real parts (index.c, shape.c, pads,
 * im2col), and the truth-value ops (nonzero, any/all, logical_*: a complex is
 * true when its real or imaginary part is nonzero). Sorted. */
static const char* const k_complex_move_ops[] = {
    "all", "any", "channel_shuffle", "col2im", "count_nonzero", "eye", "gather", "im2col",
    "index_add", "index_copy", "index_fill", "logical_and", "logical_not", "logical_or",
    "logical_xor", "masked_scatter", "nonzero", "nonzero_static", "put", "reflection_pad1d",
    "reflection_pad1d_backward", "reflection_pad2d", "reflection_pad2d_backward",
    "reflection_pad3d", "reflection_pad3d_backward", "replication_pad1d",
    "replication_pad1d_backward", "replication_pad2d", "replication_pad2d_backward",
    "replication_pad3d", "replication_pad3d_backward", "scatter", "scatter_add",
    "scatter_reduce", "take", "tril", "triu",
};

/* Whether `base` is one of the n sorted names of `list`. */
static bool in_sorted(const char* const* list, int n, const char* base) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2, c = strcmp(base, list[mid]);
    if (c == 0) return true;
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return false;
}

bool tpu_dtype_narrow_op_takes(const char* base, tpu_dtype_t dt) {
  if (base && tpu_dtype_is_complex(dt))
    return in_sorted(k_complex_ops, (int)(sizeof k_complex_ops / sizeof k_complex_ops[0]), base) ||
           in_sorted(k_complex_move_ops,
                     (int)(sizeof k_complex_move_ops / sizeof k_complex_move_ops[0]), base);
  if (base && (dt == TPU_U16 || dt == TPU_U32 || dt == TPU_U64)) {
    for (size_t i = 0; i < sizeof k_uint_ops / sizeof k_uint_ops[0]; i++)
      if (strcmp(base, k_uint_ops[i]) == 0) return true;
    return false;
  }
  if (!base || !tpu_dtype_is_narrow(dt)) return false;
  int lo = 0, hi = (int)(sizeof k_narrow_ops / sizeof k_narrow_ops[0]) - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2, c = strcmp(base, k_narrow_ops[mid].base);
    if (c == 0) return dt != TPU_F4E2M1FNX2 || k_narrow_ops[mid].f4;
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return false;
}

bool tpu_dtype_is_integral(tpu_dtype_t dt, bool include_bool) {
  switch (dt) {
    case TPU_U8: case TPU_I8: case TPU_I16: case TPU_I32: case TPU_I64: return true;
    case TPU_U16: case TPU_U32: case TPU_U64: return true;
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
  if (tpu_dtype_is_complex(a) || tpu_dtype_is_complex(b)) {
    /* complex128 when either side holds float64 precision */
    const bool wide = a == TPU_C128 || b == TPU_C128 || a == TPU_F64 || b == TPU_F64;
    return wide ? TPU_C128 : TPU_C64;
  }
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

/* category order: bool < integral < float < complex */
static int category(tpu_dtype_t dt) {
  if (dt == TPU_DTYPE_NONE) return -1;
  if (tpu_dtype_is_complex(dt)) return 3;
  if (tpu_dtype_is_float(dt)) return 2;
  return dt == TPU_BOOL ? 0 : 1;
}

static tpu_dtype_t combine_categories(tpu_dtype_t higher, tpu_dtype_t lower) {
  if (category(lower) > category(higher)) {
    /* a float tensor with a complex scalar: complex of the tensor's precision */
    if (tpu_dtype_is_complex(lower) && tpu_dtype_is_float(higher))
      return higher == TPU_F64 ? TPU_C128 : TPU_C64;
    if (tpu_dtype_is_complex(lower) || tpu_dtype_is_float(lower)) return tpu_dtype_promote(higher, lower);
  }
  if (higher != TPU_DTYPE_NONE && (tpu_dtype_is_float(higher) || tpu_dtype_is_complex(higher)))
    return higher;
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
      if (tpu_dtype_is_complex(dt)) dt = TPU_C64;
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

/* ---- element conversions and access ---- */
float tpu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t tpu_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (a < 0x38800000u) { /* subnormal or zero in half */
    if (a < 0x33000000u) return (uint16_t)sign; /* below half of the smallest */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    int shift = (int)(126 - e); /* value = m * 2^(e-150); half ulp is 2^-24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15, keep 23-bit mantissa */
  uint32_t lower = r & 0x1fffu;
  r >>= 13;
  if (lower > 0x1000u || (lower == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

double tpu_load_f64(const void* p, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_U8: return *(const uint8_t*)p;
    case TPU_I8: return *(const int8_t*)p;
    case TPU_I16: return *(const int16_t*)p;
    case TPU_I32: return *(const int32_t*)p;
    case TPU_I64: return (double)*(const int64_t*)p;
    case TPU_U16: return *(const uint16_t*)p;
    case TPU_U32: return *(const uint32_t*)p;
    case TPU_U64: return (double)*(const uint64_t*)p;
    case TPU_F16: return tpu_f16_to_f32(*(const uint16_t*)p);
    case TPU_BF16: return tpu_bf16_to_f32(*(const uint16_t*)p);
    case TPU_F32: return *(const float*)p;
    case TPU_F64: return *(const double*)p;
    case TPU_C64: return *(const float*)p; /* the real part */
    case TPU_C128: return *(const double*)p;
    case TPU_BOOL: return *(const uint8_t*)p ? 1.0 : 0.0;
    case TPU_F8E5M2: return tpu_f8e5m2_to_f32(*(const uint8_t*)p);
    case TPU_F8E4M3FN: return tpu_f8e4m3fn_to_f32(*(const uint8_t*)p);
    case TPU_F8E5M2FNUZ: return tpu_f8e5m2fnuz_to_f32(*(const uint8_t*)p);
    case TPU_F8E4M3FNUZ: return tpu_f8e4m3fnuz_to_f32(*(const uint8_t*)p);
    case TPU_F8E8M0FNU: return tpu_f8e8m0fnu_to_f32(*(const uint8_t*)p);
    case TPU_F4E2M1FNX2: return *(const uint8_t*)p; /* the byte: a container */
    default: return 0;
  }
}

int64_t tpu_load_i64(const void* p, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_U8: return *(const uint8_t*)p;
    case TPU_I8: return *(const int8_t*)p;
    case TPU_I16: return *(const int16_t*)p;
    case TPU_I32: return *(const int32_t*)p;
    case TPU_I64: return *(const int64_t*)p;
    case TPU_U16: return *(const uint16_t*)p;
    case TPU_U32: return *(const uint32_t*)p;
    case TPU_U64: return (int64_t)*(const uint64_t*)p; /* the bits */
    case TPU_BOOL: return *(const uint8_t*)p != 0;
    default: return (int64_t)tpu_load_f64(p, dt);
  }
}

void tpu_store_f64(void* p, tpu_dtype_t dt, double v) {
  switch (dt) {
    case TPU_U8: *(uint8_t*)p = (uint8_t)(int64_t)v; break;
    case TPU_I8: *(int8_t*)p = (int8_t)(int64_t)v; break;
    case TPU_I16: *(int16_t*)p = (int16_t)(int64_t)v; break;
    case TPU_I32: *(int32_t*)p = (int32_t)(int64_t)v; break;
    case TPU_I64: *(int64_t*)p = (int64_t)v; break;
    case TPU_U16: *(uint16_t*)p = (uint16_t)(int64_t)v; break;
    case TPU_U32: *(uint32_t*)p = (uint32_t)(int64_t)v; break;
    case TPU_U64: *(uint64_t*)p = v >= 0x1p63 ? (uint64_t)v : (uint64_t)(int64_t)v; break;
    case TPU_F16: *(uint16_t*)p = tpu_f32_to_f16((float)v); break;
    case TPU_BF16: *(uint16_t*)p = tpu_f32_to_bf16((float)v); break;
    case TPU_F32: *(float*)p = (float)v; break;
    case TPU_F64: *(double*)p = v; break;
    case TPU_C64: ((float*)p)[0] = (float)v; ((float*)p)[1] = 0; break;
    case TPU_C128: ((double*)p)[0] = v; ((double*)p)[1] = 0; break;
    case TPU_BOOL: *(uint8_t*)p = v != 0; break;
    case TPU_F8E5M2: *(uint8_t*)p = tpu_f32_to_f8e5m2((float)v); break;
    case TPU_F8E4M3FN: *(uint8_t*)p = tpu_f32_to_f8e4m3fn((float)v); break;
    case TPU_F8E5M2FNUZ: *(uint8_t*)p = tpu_f32_to_f8e5m2fnuz((float)v); break;
    case TPU_F8E4M3FNUZ: *(uint8_t*)p = tpu_f32_to_f8e4m3fnuz((float)v); break;
    case TPU_F8E8M0FNU: *(uint8_t*)p = tpu_f32_to_f8e8m0fnu((float)v); break;
    case TPU_F4E2M1FNX2: *(uint8_t*)p = (uint8_t)(int64_t)v; break;
    default: break;
  }
}

void tpu_store_i64(void* p, tpu_dtype_t dt, int64_t v) {
  switch (dt) {
    case TPU_U8: *(uint8_t*)p = (uint8_t)v; break;
    case TPU_I8: *(int8_t*)p = (int8_t)v; break;
    case TPU_I16: *(int16_t*)p = (int16_t)v; break;
    case TPU_I32: *(int32_t*)p = (int32_t)v; break;
    case TPU_I64: *(int64_t*)p = v; break;
    case TPU_U16: *(uint16_t*)p = (uint16_t)v; break;
    case TPU_U32: *(uint32_t*)p = (uint32_t)v; break;
    case TPU_U64: *(uint64_t*)p = (uint64_t)v; break;
    case TPU_BOOL: *(uint8_t*)p = v != 0; break;
    default: tpu_store_f64(p, dt, (double)v); break;
  }
}

int64_t tpu_tensor_offset_of(const tpu_tensor_t* t, int64_t linear) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t s = t->sizes[d];
    if (s == 0) return 0;
    off += (linear % s) * t->strides[d];
    linear /= s;
  }
  return off * (int64_t)tpu_dtype_size(t->dtype);
}

void* tpu_tensor_elem_ptr(const tpu_tensor_t* t, int64_t linear) {
  return (char*)t->data + tpu_tensor_offset_of(t, linear);
}

double tpu_tensor_get_f64(const tpu_tensor_t* t, int64_t linear) {
  return tpu_load_f64(tpu_tensor_elem_ptr(t, linear), t->dtype);
}

int64_t tpu_tensor_get_i64(const tpu_tensor_t* t, int64_t linear) {
  return tpu_load_i64(tpu_tensor_elem_ptr(t, linear), t->dtype);
}
