/* Element-wise kernels: arithmetic, math, comparisons, logic, activations
 * and their backward formulas. Each op has loop bodies per compute type
 * generated from one expression (tgmath picks float or double functions;
 * EXP/LOG/TANH/ERF use the vectorizable float32 versions of vecmath.h for
 * float and libm for double). Every body is compiled for the baseline ISA
 * and for AVX2+FMA, and the one for tpu_host_isa() runs. */
#include <stdatomic.h>
#include <stdlib.h>

#include "vecmath.h"
#include <tgmath.h>

#include "kernels.h"

typedef struct {
  double s0, s1;  /* scalar operands (alpha, value, min, max ...) as float */
  int64_t i0, i1; /* the same, as integers */
  bool has0, has1;
  _Atomic int err; /* integer division by zero, etc. */
} ew_ctx_t;

/* float32 math from vecmath.h, libm for double; `exp` etc. without an
 * argument list name the libm double functions, not the tgmath macros */
#define EXP(x) _Generic((x), float: tpu_vm_expf, default: exp)(x)
#define LOG(x) _Generic((x), float: tpu_vm_logf, default: log)(x)
#define TANH(x) _Generic((x), float: tpu_vm_tanhf, default: tanh)(x)
#define ERF(x) _Generic((x), float: tpu_vm_erff, default: erf)(x)

/* ---- loop body generators ----
 * In expressions: a, b, c are the current elements of in[0..2]; s0/s1 and
 * i0/i1 the context scalars in the loop's type; LIT(v) is the constant v in
 * the loop's type (a bare 0.5 would promote float expressions to double). */
#define LIT(v) ((elem_t)(v))
/* S is the storage type of the arrays, LD/ST convert between it and T:
 * the plain bodies store T itself, the bf16 bodies keep bfloat16 arrays and
 * compute in float (the same values the float body gives for converted
 * operands, rounded once on store). */
#define LOOP1_S(FN, ATTR, T, S, LD, ST, EXPR)                                 \
  ATTR static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    typedef T elem_t; (void)sizeof(elem_t);                                   \
    ew_ctx_t* cx = c_;                                                        \
    S* o = o_;                                                                \
    const S* x = in[0];                                                       \
    const T s0 = (T)cx->s0, s1 = (T)cx->s1;                                   \
    (void)s0; (void)s1; (void)cx;                                             \
    for (int64_t i = 0; i < n; i++) {                                         \
      const T a = LD(x[i]); (void)a;                                          \
      o[i] = ST((T)(EXPR));                                                   \
    }                                                                         \
  }
/* no inputs (fill): EXPR reads only the scalars */
#define LOOP0_S(FN, ATTR, T, S, LD, ST, EXPR)                                 \
  ATTR static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    typedef T elem_t; (void)sizeof(elem_t);                                   \
    ew_ctx_t* cx = c_;                                                        \
    S* o = o_;                                                                \
    const T s0 = (T)cx->s0, s1 = (T)cx->s1;                                   \
    (void)s0; (void)s1; (void)cx; (void)in;                                   \
    for (int64_t i = 0; i < n; i++) o[i] = ST((T)(EXPR));                     \
  }
#define LOOP2_S(FN, ATTR, T, S, LD, ST, EXPR)                                 \
  ATTR static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    typedef T elem_t; (void)sizeof(elem_t);                                   \
    ew_ctx_t* cx = c_;                                                        \
    S* o = o_;                                                                \
    const S* x = in[0];                                                       \
    const S* y = in[1];                                                       \
    const T s0 = (T)cx->s0, s1 = (T)cx->s1;                                   \
    (void)s0; (void)s1; (void)cx;                                             \
    for (int64_t i = 0; i < n; i++) {                                         \
      const T a = LD(x[i]), b = LD(y[i]);                                     \
      (void)a; (void)b;                                                       \
      o[i] = ST((T)(EXPR));                                                   \
    }                                                                         \
  }
#define LOOP3_S(FN, ATTR, T, S, LD, ST, EXPR)                                 \
  ATTR static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    typedef T elem_t; (void)sizeof(elem_t);                                   \
    ew_ctx_t* cx = c_;                                                        \
    S* o = o_;                                                                \
    const S* x = in[0];                                                       \
    const S* y = in[1];                                                       \
    const S* z = in[2];                                                       \
    const T s0 = (T)cx->s0, s1 = (T)cx->s1;                                   \
    (void)s0; (void)s1; (void)cx;                                             \
    for (int64_t i = 0; i < n; i++) {                                         \
      const T a = LD(x[i]), b = LD(y[i]), c = LD(z[i]);                       \
      o[i] = ST((T)(EXPR));                                                   \
    }                                                                         \
  }
#define SAME_(v) (v)
#define LOOP0(FN, ATTR, T, EXPR) LOOP0_S(FN, ATTR, T, T, SAME_, SAME_, EXPR)
#define LOOP1(FN, ATTR, T, EXPR) LOOP1_S(FN, ATTR, T, T, SAME_, SAME_, EXPR)
#define LOOP2(FN, ATTR, T, EXPR) LOOP2_S(FN, ATTR, T, T, SAME_, SAME_, EXPR)
#define LOOP3(FN, ATTR, T, EXPR) LOOP3_S(FN, ATTR, T, T, SAME_, SAME_, EXPR)
#define LOOP0_BF16(FN, ATTR, T, EXPR) \
  LOOP0_S(FN, ATTR, float, uint16_t, tpu_vm_bf16_to_f32, tpu_vm_f32_to_bf16, EXPR)
#define LOOP1_BF16(FN, ATTR, T, EXPR) \
  LOOP1_S(FN, ATTR, float, uint16_t, tpu_vm_bf16_to_f32, tpu_vm_f32_to_bf16, EXPR)
#define LOOP2_BF16(FN, ATTR, T, EXPR) \
  LOOP2_S(FN, ATTR, float, uint16_t, tpu_vm_bf16_to_f32, tpu_vm_f32_to_bf16, EXPR)
#define LOOP3_BF16(FN, ATTR, T, EXPR) \
  LOOP3_S(FN, ATTR, float, uint16_t, tpu_vm_bf16_to_f32, tpu_vm_f32_to_bf16, EXPR)
/* integer bodies (K inputs, K >= 0) take their scalars from i0/i1 */
#define ILOOP(FN, ATTR, K, EXPR)                                              \
  ATTR static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    ew_ctx_t* cx = c_;                                                        \
    int64_t* o = o_;                                                          \
    static const int64_t zero_ = 0;                                           \
    const int64_t* x = K > 0 ? (const int64_t*)in[0] : &zero_;                \
    const int64_t* y = K > 1 ? (const int64_t*)in[1] : x;                    \
    const int64_t* z = K > 2 ? (const int64_t*)in[2] : x;                    \
    const int64_t s0 = cx->i0, s1 = cx->i1;                                   \
    (void)s0; (void)s1; (void)y; (void)z; (void)cx;                           \
    for (int64_t i = 0; i < n; i++) {                                         \
      const int64_t a = x[K > 0 ? i : 0], b = y[K > 1 ? i : 0];               \
      const int64_t c = z[K > 2 ? i : 0];                                     \
      (void)a; (void)b; (void)c;                                              \
      o[i] = (int64_t)(EXPR);                                                 \
    }                                                                         \
  }

/* FN: a loop body (tpu_loop_fn_t) that runs FN_p or FN_a for the ISA */
#ifdef TPU_HAVE_AVX2_BUILD
#define ISA_LOOPS(FN, LOOP, T, EXPR)              \
  LOOP(FN##_p, TPU_VEC_PORTABLE, T, EXPR)         \
  LOOP(FN##_a, TPU_VEC_AVX2, T, EXPR)             \
  static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    (tpu_host_isa() == TPU_ISA_AVX2 ? FN##_a : FN##_p)(c_, n, o_, in);  \
  }
#else
#define ISA_LOOPS(FN, LOOP, T, EXPR) LOOP(FN, TPU_VEC_PORTABLE, T, EXPR)
#endif
#define BODY0(NAME, T, SUF, EXPR) ISA_LOOPS(NAME##_##SUF, LOOP0, T, EXPR)
#define BODY1(NAME, T, SUF, EXPR) ISA_LOOPS(NAME##_##SUF, LOOP1, T, EXPR)
#define BODY2(NAME, T, SUF, EXPR) ISA_LOOPS(NAME##_##SUF, LOOP2, T, EXPR)
#define BODY3(NAME, T, SUF, EXPR) ISA_LOOPS(NAME##_##SUF, LOOP3, T, EXPR)
#ifdef TPU_HAVE_AVX2_BUILD
/* AVX2 bfloat16 bodies: blocks of BF16_BLOCK elements are widened into float
 * arrays with the interleaved conversions of vecmath.h, EXPR runs over the
 * arrays as float code (which vectorizes cleanly), and the results are
 * rounded back; the tail runs element by element. Same values as LOOPk_BF16,
 * faster than vectorizing the per-element conversions. */
#define BF16_BLOCK 32
#define BF16_WIDEN(K_, ARR, SRC)                                        \
  if (K_) {                                                             \
    __m256 lo_, hi_;                                                    \
    tpu_vm_bf16x16_load_il((SRC) + i + j, &lo_, &hi_);                  \
    _mm256_store_ps(ARR + j, lo_);                                      \
    _mm256_store_ps(ARR + j + 8, hi_);                                  \
  }
#define LOOPK_BF16_AVX2(FN, K, EXPR)                                                  \
  TPU_VEC_AVX2 static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    typedef float elem_t; (void)sizeof(elem_t);                                       \
    ew_ctx_t* cx = c_;                                                                \
    uint16_t* o = o_;                                                                 \
    const uint16_t* x = in[0];                                                        \
    const uint16_t* y = K > 1 ? (const uint16_t*)in[1] : x;                           \
    const uint16_t* z = K > 2 ? (const uint16_t*)in[2] : x;                           \
    const float s0 = (float)cx->s0, s1 = (float)cx->s1;                               \
    (void)s0; (void)s1; (void)cx;                                                     \
    int64_t i = 0;                                                                    \
    for (; i + BF16_BLOCK <= n; i += BF16_BLOCK) {                                    \
      _Alignas(32) float va[BF16_BLOCK], vb[BF16_BLOCK], vc[BF16_BLOCK];              \
      for (int j = 0; j < BF16_BLOCK; j += 16) {                                      \
        BF16_WIDEN(1, va, x) BF16_WIDEN(K > 1, vb, y) BF16_WIDEN(K > 2, vc, z)        \
      }                                                                               \
      for (int j = 0; j < BF16_BLOCK; j++) {                                          \
        const float a = va[j], b = K > 1 ? vb[j] : 0.0f, c = K > 2 ? vc[j] : 0.0f;    \
        (void)a; (void)b; (void)c;                                                    \
        va[j] = (float)(EXPR);                                                        \
      }                                                                               \
      for (int j = 0; j < BF16_BLOCK; j += 16)                                        \
        tpu_vm_bf16x16_store_il(o + i + j, _mm256_load_ps(va + j),                    \
                                _mm256_load_ps(va + j + 8));                          \
    }                                                                                 \
    for (; i < n; i++) {                                                              \
      const float a = tpu_vm_bf16_to_f32(x[i]), b = tpu_vm_bf16_to_f32(y[i]);         \
      const float c = tpu_vm_bf16_to_f32(z[i]);                                       \
      (void)a; (void)b; (void)c;                                                      \
      o[i] = tpu_vm_f32_to_bf16((float)(EXPR));                                       \
    }                                                                                 \
  }
#define ISA_LOOPS_BF16(FN, K, EXPR)                                      \
  LOOP##K##_BF16(FN##_p, TPU_VEC_PORTABLE, float, EXPR)                  \
  LOOPK_BF16_AVX2(FN##_a, K, EXPR)                                       \
  static void FN(void* c_, int64_t n, void* o_, const void* const* in) { \
    (tpu_host_isa() == TPU_ISA_AVX2 ? FN##_a : FN##_p)(c_, n, o_, in);  \
  }
#else
#define ISA_LOOPS_BF16(FN, K, EXPR) LOOP##K##_BF16(FN, TPU_VEC_PORTABLE, float, EXPR)
#endif
/* nothing to widen without inputs: both ISAs run the plain body */
#define BODY0_BF16(NAME, EXPR) ISA_LOOPS(NAME##_bf16, LOOP0_BF16, float, EXPR)
#define BODY1_BF16(NAME, EXPR) ISA_LOOPS_BF16(NAME##_bf16, 1, EXPR)
#define BODY2_BF16(NAME, EXPR) ISA_LOOPS_BF16(NAME##_bf16, 2, EXPR)
#define BODY3_BF16(NAME, EXPR) ISA_LOOPS_BF16(NAME##_bf16, 3, EXPR)
#define IBODY(K, NAME, EXPR) ISA_LOOPS(NAME##_i64, ILOOP, K, EXPR)

#define FLOAT_OP(K, NAME, EXPR)                                                 \
  BODY##K(NAME, float, f32, EXPR) BODY##K(NAME, double, f64, EXPR)              \
  BODY##K##_BF16(NAME, EXPR)
/* an op defined for floats and integers with separate expressions */
#define OP_FI(K, NAME, FEXPR, IEXPR) \
  FLOAT_OP(K, NAME, FEXPR) IBODY(K, NAME, IEXPR) \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NAME##_i64, NAME##_bf16};
#define OP_F(K, NAME, FEXPR) \
  FLOAT_OP(K, NAME, FEXPR) \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NULL, NAME##_bf16};
#define OP_I(K, NAME, IEXPR) \
  IBODY(K, NAME, IEXPR) static const tpu_loop_set_t NAME##_loops = {NULL, NULL, NAME##_i64, NULL};

/* wrapping integer arithmetic (two's complement like PyTorch) */
#define UADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define USUB(a, b) ((int64_t)((uint64_t)(a) - (uint64_t)(b)))
#define UMUL(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

static inline int64_t idiv_trunc(ew_ctx_t* cx, int64_t a, int64_t b) {
  if (b == 0) { cx->err = 1; return 0; }
  if (b == -1) return USUB(0, a);
  return a / b;
}
static inline int64_t idiv_floor(ew_ctx_t* cx, int64_t a, int64_t b) {
  if (b == 0) { cx->err = 1; return 0; }
  if (b == -1) return USUB(0, a);
  int64_t q = a / b, r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) q--;
  return q;
}
static inline int64_t imod_floor(ew_ctx_t* cx, int64_t a, int64_t b) {
  if (b == 0) { cx->err = 1; return 0; }
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
static inline int64_t imod_trunc(ew_ctx_t* cx, int64_t a, int64_t b) {
  if (b == 0) { cx->err = 1; return 0; }
  if (b == -1) return 0;
  return a % b;
}
#define FLOOR_DIV(T, a, b) floor_div_##T(a, b)
static inline double floor_div_d(double a, double b) {
  if (b == 0) return a / b;
  double mod = fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  double fl;
  if (div != 0) {
    fl = floor(div);
    if (div - fl > 0.5) fl += 1;
  } else {
    fl = copysign(0.0, a / b);
  }
  return fl;
}
static inline double fmod_floor(double a, double b) {
  double m = fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
static inline int64_t ipow(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  int64_t r = 1;
  while (b) {
    if (b & 1) r = UMUL(r, a);
    a = UMUL(a, a);
    b >>= 1;
  }
  return r;
}
static inline int64_t isign(int64_t a) { return (a > 0) - (a < 0); }
/* max(a, lo) / min(a, hi) keeping a NaN `a` (one maxps/minps on x86) */
#define MAX_KEEP(a, lo) ((lo) > (a) ? (lo) : (a))
#define MIN_KEEP(a, hi) ((hi) < (a) ? (hi) : (a))
#define NANPROP_MAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : ((a) > (b) ? (a) : (b)))
#define NANPROP_MIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : ((a) < (b) ? (a) : (b)))
#include "ew_exprs.h" /* SIGMOID, GELU, ...: shared with generated fused kernels */

/* The loop sets, one per row of the element-wise inventory (tpu/ew_ops.def,
 * which the fusion planner and the StableHLO lowering read too): NAME_loops. */
#define EW_ROW_FI(K, NAME, FEXPR, IEXPR) OP_FI(K, NAME, FEXPR, IEXPR)
#define EW_ROW_F(K, NAME, FEXPR, IEXPR) OP_F(K, NAME, FEXPR)
#define EW_ROW_I(K, NAME, FEXPR, IEXPR) OP_I(K, NAME, IEXPR)
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) EW_ROW_##KIND(K, NAME, FEXPR, IEXPR)
#include "tpu/ew_ops.def"
#undef TPU_EW

/* the inventory's rows and where their scalars s0, s1 come from */
enum {
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) EW_##NAME,
#include "tpu/ew_ops.def"
#undef TPU_EW
  EW_COUNT
};
typedef struct {
  int8_t arg[2]; /* schema argument of s0, s1; -1: none */
  double dflt[2];
} ew_scalars_t;
#define EW_SCALARS_(arg0, dflt0, arg1, dflt1) {{arg0, arg1}, {dflt0, dflt1}}
static const ew_scalars_t k_scalars[EW_COUNT] = {
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) [EW_##NAME] = EW_SCALARS_ SCALARS,
#include "tpu/ew_ops.def"
#undef TPU_EW
};
/* scalar k (0: s0, 1: s1) of inventory row `row` as call c passes it */
static double ew_scalar(const tpu_call_t* c, int row, int k) {
  const ew_scalars_t* s = &k_scalars[row];
  return s->arg[k] < 0 ? s->dflt[k] : tpu_arg_f64(c, s->arg[k], s->dflt[k]);
}
/* s0, s1 of row NAME for the call `c` in scope */
#define S0_OF(NAME) ew_scalar(c, EW_##NAME, 0)
#define S01_OF(NAME) ew_scalar(c, EW_##NAME, 0), ew_scalar(c, EW_##NAME, 1)

/* ---- helpers for kernels ---- */
static const tpu_tensor_t* scalar_arg_tensor(const tpu_call_t* call, int i, tpu_tensor_t* tmp) {
  const tpu_arg_t* a = &call->args[i];
  if (a->kind == TPU_ARG_TENSOR) return a->v.t;
  memset(tmp, 0, sizeof(*tmp));
  tmp->ndim = 0;
  tmp->flags = TPU_TENSOR_WRAPPED_NUMBER | TPU_TENSOR_CPU_SCALAR;
  tmp->data = tmp->inline_value;
  if (a->kind == TPU_ARG_DOUBLE) {
    tmp->dtype = TPU_F64;
    memcpy(tmp->inline_value, &a->v.d, 8);
  } else if (a->kind == TPU_ARG_BOOL) {
    tmp->dtype = TPU_BOOL;
    tmp->inline_value[0] = a->v.b;
  } else {
    tmp->dtype = TPU_I64;
    int64_t v = tpu_arg_i64(call, i, 0);
    memcpy(tmp->inline_value, &v, 8);
  }
  return tmp;
}

static void ctx_scalars(ew_ctx_t* cx, double s0, double s1) {
  cx->s0 = s0;
  cx->s1 = s1;
  cx->i0 = (int64_t)s0;
  cx->i1 = (int64_t)s1;
}

static tpu_status_t finish(const char* op, ew_ctx_t* cx, tpu_status_t st) {
  if (st) return st;
  if (cx->err) return TPU_ERR(INVALID_ARGUMENT, "%s: ZeroDivisionError (integer division by zero)", op);
  return TPU_OK;
}

/* compute type for the common dtype of the inputs; int->float ops use the
 * output's float type when the inputs are integral */
static tpu_ctype_t common_ct(const tpu_tensor_t* const* ins, int n, const tpu_tensor_t* out,
                             bool int_to_float) {
  tpu_dtype_t dt = tpu_result_type(ins, n);
  if (int_to_float && !tpu_dtype_is_float(dt)) dt = tpu_dtype_is_float(out->dtype) ? out->dtype : TPU_F32;
  return tpu_ctype_of(dt);
}

/* Whether results computed for common dtype dt must be rounded to dt before
 * they are stored into an output of another dtype (an out= of a wider type):
 * PyTorch computes in the common dtype and casts the result, so f16 33000 +
 * 33000 into a float64 out is inf and uint8 5 - 8 is 253. The compute types
 * f32/f64/i64 hold dt's results exactly only for those dtypes themselves. A
 * bool output takes predicates' 0/1, which need no rounding. */
static bool needs_common_rounding(tpu_dtype_t dt, tpu_dtype_t out_dt) {
  return out_dt != dt && out_dt != TPU_BOOL && dt != TPU_F32 && dt != TPU_F64 && dt != TPU_I64;
}

/* PyTorch's TensorIterator casts every input to the common dtype before the
 * kernel runs. Only a 0-d input (a wrapped number or a 0-d tensor) can have a
 * dtype the common one does not hold (bf16 tensor % 0-d float64 tensor is
 * computed with the divisor rounded to bf16; int32 tensor // 0-d int64 with
 * the divisor wrapped to int32), so such an input is cast into `tmp` first.
 * keep1: input 1 keeps its own value when the common dtype is bf16/f16 (CPU's
 * mul and div kernels read a scalar divisor's original value as float). */
static void round_scalar_inputs(const tpu_tensor_t** ins, int n, tpu_dtype_t target, bool keep1,
                                tpu_tensor_t* tmp) {
  for (int k = 0; k < n; k++) {
    const tpu_tensor_t* t = ins[k];
    if (t->ndim != 0 || t->dtype == target || t->dtype == TPU_BOOL) continue;
    if (keep1 && k == 1 && (target == TPU_BF16 || target == TPU_F16)) continue;
    tpu_tensor_make_contig(&tmp[k], tmp[k].inline_value, target, 0, NULL);
    tpu_status_t st = tpu_copy_strided(&tmp[k], t);
    if (st) { /* (a supported dtype's one-element copy does not fail) */
      tpu_status_free(st);
      continue;
    }
    ins[k] = &tmp[k];
  }
}

static tpu_status_t run_ex(const char* op, const tpu_call_t* call, const tpu_tensor_t* const* ins_,
                           int n, const tpu_loop_set_t* loops, double s0, double s1,
                           bool int_to_float, bool keep1) {
  ew_ctx_t cx = {0};
  ctx_scalars(&cx, s0, s1);
  const tpu_tensor_t* out = &call->outs[0];
  tpu_ctype_t ct = common_ct(ins_, n, out, int_to_float);
  tpu_dtype_t dt = tpu_result_type(ins_, n);
  const tpu_tensor_t* ins[TPU_ITER_MAX_OPS];
  tpu_tensor_t rounded[TPU_ITER_MAX_OPS];
  if (n > TPU_ITER_MAX_OPS - 1)
    return TPU_ERR(INTERNAL, "%s: element-wise op with %d inputs exceeds %d", op, n,
                   TPU_ITER_MAX_OPS - 1);
  memcpy(ins, ins_, (size_t)n * sizeof(*ins));
  round_scalar_inputs(ins, n,
                      int_to_float && !tpu_dtype_is_float(dt)
                          ? (tpu_dtype_is_float(out->dtype) ? out->dtype : TPU_F32)
                          : dt,
                      keep1, rounded);
  if ((int_to_float && !tpu_dtype_is_float(dt)) || !needs_common_rounding(dt, out->dtype))
    return finish(op, &cx, tpu_elementwise_set(op, out, ins, n, ct, loops, &cx));
  /* compute into a temporary of the common dtype, then convert into out */
  int64_t numel = tpu_tensor_numel(out);
  if (numel == 0) return TPU_OK;
  void* buf = malloc((size_t)numel * tpu_dtype_size(dt));
  if (!buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a %lld-element temporary", op,
                           (long long)numel);
  tpu_tensor_t tmp;
  tpu_tensor_make_contig(&tmp, buf, dt, out->ndim, out->sizes);
  tpu_status_t st = finish(op, &cx, tpu_elementwise_set(op, &tmp, ins, n, ct, loops, &cx));
  if (!st) st = tpu_copy_strided(out, &tmp);
  free(buf);
  return st;
}

static tpu_status_t run(const char* op, const tpu_call_t* call, const tpu_tensor_t* const* ins,
                        int n, const tpu_loop_set_t* loops, double s0, double s1, bool int_to_float) {
  return run_ex(op, call, ins, n, loops, s0, s1, int_to_float, false);
}

/* self, other (tensor or scalar); keep1 as in round_scalar_inputs */
static tpu_status_t binary_ex(const char* op, const tpu_call_t* call, const tpu_loop_set_t* loops,
                              double s0, bool int_to_float, bool keep1) {
  TPU_ROUTE_COMPLEX(call);
  tpu_tensor_t tmp;
  const tpu_tensor_t* ins[2] = {scalar_arg_tensor(call, 0, &tmp), NULL};
  tpu_tensor_t tmp2;
  ins[1] = scalar_arg_tensor(call, 1, &tmp2);
  return run_ex(op, call, ins, 2, loops, s0, 0, int_to_float, keep1);
}
static tpu_status_t binary(const char* op, const tpu_call_t* call, const tpu_loop_set_t* loops,
                           double s0, bool int_to_float) {
  return binary_ex(op, call, loops, s0, int_to_float, false);
}

/* PyTorch's CPU kernels of the integer-rounding divisions (div with a
 * rounding mode, floor_divide, remainder, fmod) have no bool loop: when both
 * operands promote to bool they raise NotImplementedError naming the kernel;
 * so does tpu, instead of computing in int64 and returning bool. */
static tpu_status_t check_not_bool(const char* cpu_kernel, const tpu_call_t* call) {
  tpu_tensor_t t0, t1;
  const tpu_tensor_t* ins[2] = {scalar_arg_tensor(call, 0, &t0), scalar_arg_tensor(call, 1, &t1)};
  if (tpu_result_type(ins, 2) == TPU_BOOL)
    return TPU_ERR(UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", cpu_kernel);
  return TPU_OK;
}

static tpu_status_t unary(const char* op, const tpu_call_t* call, const tpu_loop_set_t* loops,
                          bool int_to_float) {
  TPU_ROUTE_COMPLEX(call);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(call, 0)};
  return run(op, call, ins, 1, loops, 0, 0, int_to_float);
}

/* ---- kernels ---- */

/* CPU casts alpha to the common dtype: for bool operands any nonzero alpha is
 * True (True + True * -1 is True, fuzz seed 16052) */
static double alpha_in_common_dtype(const tpu_call_t* c) {
  tpu_tensor_t t0, t1;
  const tpu_tensor_t* ins[2] = {scalar_arg_tensor(c, 0, &t0), scalar_arg_tensor(c, 1, &t1)};
  double alpha = S0_OF(add);
  return tpu_result_type(ins, 2) == TPU_BOOL ? (double)(alpha != 0) : alpha;
}

tpu_status_t tpu_k_add(const tpu_call_t* c) {
  return binary("add", c, &add_loops, alpha_in_common_dtype(c), false);
}
tpu_status_t tpu_k_sub(const tpu_call_t* c) { return binary("sub", c, &sub_loops, S0_OF(sub), false); }
tpu_status_t tpu_k_rsub(const tpu_call_t* c) { return binary("rsub", c, &rsub_loops, S0_OF(rsub), false); }
/* mul and the divisions read a 0-d `other` at full precision for bf16/f16
 * (CPU's *_reduced_float kernels); see round_scalar_inputs */
tpu_status_t tpu_k_mul(const tpu_call_t* c) { return binary_ex("mul", c, &mul_loops, 0, false, true); }

tpu_status_t tpu_k_div(const tpu_call_t* c) {
  const char* mode = tpu_arg_str(c, 2, NULL);
  if (!mode) return binary_ex("div", c, &div_loops, 0, true, true);
  if (!strcmp(mode, "trunc") || !strcmp(mode, "floor"))
    TPU_RETURN_IF_ERROR(check_not_bool(mode[0] == 't' ? "div_trunc_cpu" : "div_floor_cpu", c));
  if (!strcmp(mode, "trunc")) {
    tpu_dtype_t od = c->outs[0].dtype;
    tpu_tensor_t t1;
    if ((od == TPU_BF16 || od == TPU_F16) && tpu_tensor_numel(scalar_arg_tensor(c, 1, &t1)) != 1) {
      /* PyTorch rounds the quotient to the 16-bit type before truncating
       * (with a one-element divisor it truncates the float quotient) */
      TPU_RETURN_IF_ERROR(binary("div", c, &div_loops, 0, false));
      const tpu_tensor_t* q[1] = {&c->outs[0]};
      return run("div", c, q, 1, &trunc_loops, 0, 0, false);
    }
    return binary_ex("div", c, &div_trunc_loops, 0, false, true);
  }
  if (!strcmp(mode, "floor")) return binary_ex("div", c, &div_floor_loops, 0, false, true);
  return TPU_ERR(INVALID_ARGUMENT,
                 "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '%s'",
                 mode);
}
tpu_status_t tpu_k_floor_divide(const tpu_call_t* c) {
  TPU_RETURN_IF_ERROR(check_not_bool("div_floor_cpu", c));
  return binary_ex("floor_divide", c, &div_floor_loops, 0, false, true);
}
tpu_status_t tpu_k_remainder(const tpu_call_t* c) {
  TPU_RETURN_IF_ERROR(check_not_bool("remainder_cpu", c));
  return binary("remainder", c, &remainder_loops, 0, false);
}
tpu_status_t tpu_k_fmod(const tpu_call_t* c) {
  TPU_RETURN_IF_ERROR(check_not_bool("fmod_cpu", c));
  return binary("fmod", c, &fmod_loops, 0, false);
}
tpu_status_t tpu_k_pow(const tpu_call_t* c) { return binary("pow", c, &pow_loops, 0, false); }
tpu_status_t tpu_k_maximum(const tpu_call_t* c) { return binary("maximum", c, &maximum_loops, 0, false); }
tpu_status_t tpu_k_minimum(const tpu_call_t* c) { return binary("minimum", c, &minimum_loops, 0, false); }
tpu_status_t tpu_k_fmax(const tpu_call_t* c) { return binary("fmax", c, &fmax_loops, 0, false); }
tpu_status_t tpu_k_fmin(const tpu_call_t* c) { return binary("fmin", c, &fmin_loops, 0, false); }
tpu_status_t tpu_k_atan2(const tpu_call_t* c) { return binary("atan2", c, &atan2_loops, 0, true); }
tpu_status_t tpu_k_hypot(const tpu_call_t* c) { return binary("hypot", c, &hypot_loops, 0, true); }
tpu_status_t tpu_k_xlogy(const tpu_call_t* c) { return binary("xlogy", c, &xlogy_loops, 0, true); }
tpu_status_t tpu_k_copysign(const tpu_call_t* c) { return binary("copysign", c, &copysign_loops, 0, true); }
tpu_status_t tpu_k_eq(const tpu_call_t* c) { return binary("eq", c, &eq_loops, 0, false); }
tpu_status_t tpu_k_ne(const tpu_call_t* c) { return binary("ne", c, &ne_loops, 0, false); }
tpu_status_t tpu_k_lt(const tpu_call_t* c) { return binary("lt", c, &lt_loops, 0, false); }
tpu_status_t tpu_k_le(const tpu_call_t* c) { return binary("le", c, &le_loops, 0, false); }
tpu_status_t tpu_k_gt(const tpu_call_t* c) { return binary("gt", c, &gt_loops, 0, false); }
tpu_status_t tpu_k_ge(const tpu_call_t* c) { return binary("ge", c, &ge_loops, 0, false); }
tpu_status_t tpu_k_logical_and(const tpu_call_t* c) {
  if (tpu_call_has_complex(c)) return tpu_complex_on_truth(c);
  return binary("logical_and", c, &logical_and_loops, 0, false);
}
tpu_status_t tpu_k_logical_or(const tpu_call_t* c) {
  if (tpu_call_has_complex(c)) return tpu_complex_on_truth(c);
  return binary("logical_or", c, &logical_or_loops, 0, false);
}
tpu_status_t tpu_k_logical_xor(const tpu_call_t* c) {
  if (tpu_call_has_complex(c)) return tpu_complex_on_truth(c);
  return binary("logical_xor", c, &logical_xor_loops, 0, false);
}
tpu_status_t tpu_k_logical_not(const tpu_call_t* c) {
  if (tpu_call_has_complex(c)) return tpu_complex_on_truth(c);
  return unary("logical_not", c, &logical_not_loops, false);
}
tpu_status_t tpu_k_bitwise_and(const tpu_call_t* c) { return binary("bitwise_and", c, &bitwise_and_loops, 0, false); }
tpu_status_t tpu_k_bitwise_or(const tpu_call_t* c) { return binary("bitwise_or", c, &bitwise_or_loops, 0, false); }
tpu_status_t tpu_k_bitwise_xor(const tpu_call_t* c) { return binary("bitwise_xor", c, &bitwise_xor_loops, 0, false); }
tpu_status_t tpu_k_lshift(const tpu_call_t* c) { return binary("bitwise_left_shift", c, &lshift_loops, 0, false); }
tpu_status_t tpu_k_rshift(const tpu_call_t* c) { return binary("bitwise_right_shift", c, &rshift_loops, 0, false); }

tpu_status_t tpu_k_bitwise_not(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  return unary("bitwise_not", c, in->dtype == TPU_BOOL ? &bool_not_loops : &bitwise_not_loops, false);
}

#define UNARY_KERNEL(NAME, I2F) \
  tpu_status_t tpu_k_##NAME(const tpu_call_t* c) { return unary(#NAME, c, &NAME##_loops, I2F); }
UNARY_KERNEL(neg, false)
tpu_status_t tpu_k_abs(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  if (tpu_arg_tensor(c, 0)->dtype == TPU_BOOL)
    return TPU_ERR(UNIMPLEMENTED, "abs: not implemented for 'Bool'");
  return unary("abs", c, &abs_loops, false);
}
UNARY_KERNEL(sign, false)
UNARY_KERNEL(square, false)
UNARY_KERNEL(exp, true)
UNARY_KERNEL(exp2, true)
UNARY_KERNEL(expm1, true)
UNARY_KERNEL(log, true)
UNARY_KERNEL(log2, true)
UNARY_KERNEL(log10, true)
UNARY_KERNEL(log1p, true)
UNARY_KERNEL(sqrt, true)
UNARY_KERNEL(rsqrt, true)
UNARY_KERNEL(reciprocal, true)
UNARY_KERNEL(sin, true)
UNARY_KERNEL(angle, true)
UNARY_KERNEL(cos, true)
UNARY_KERNEL(tan, true)
UNARY_KERNEL(asin, true)
UNARY_KERNEL(acos, true)
UNARY_KERNEL(atan, true)
UNARY_KERNEL(sinh, true)
UNARY_KERNEL(cosh, true)
UNARY_KERNEL(tanh, true)
UNARY_KERNEL(asinh, true)
UNARY_KERNEL(acosh, true)
UNARY_KERNEL(atanh, true)
UNARY_KERNEL(erf, true)
UNARY_KERNEL(erfc, true)
UNARY_KERNEL(lgamma, true)
UNARY_KERNEL(sigmoid, true)
UNARY_KERNEL(floor, false)
UNARY_KERNEL(ceil, false)
UNARY_KERNEL(trunc, false)
UNARY_KERNEL(frac, false)
UNARY_KERNEL(relu, false)
UNARY_KERNEL(silu, false)
UNARY_KERNEL(hardsigmoid, false)
UNARY_KERNEL(hardswish, false)
UNARY_KERNEL(mish, false)

/* float-only predicates: integers are never nan/inf and always finite */
static tpu_status_t predicate(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops,
                              double int_value) {
  TPU_ROUTE_COMPLEX(c);
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  if (!tpu_dtype_is_float(in->dtype)) {
    ew_ctx_t cx = {0};
    ctx_scalars(&cx, int_value, 0);
    return tpu_elementwise(&c->outs[0], NULL, 0, TPU_CT_I64, fill_i64, &cx);
  }
  return unary(op, c, loops, false);
}
tpu_status_t tpu_k_isnan(const tpu_call_t* c) { return predicate("isnan", c, &isnan_loops, 0); }
tpu_status_t tpu_k_isinf(const tpu_call_t* c) { return predicate("isinf", c, &isinf_loops, 0); }
tpu_status_t tpu_k_isposinf(const tpu_call_t* c) { return predicate("isposinf", c, &isposinf_loops, 0); }
tpu_status_t tpu_k_isneginf(const tpu_call_t* c) { return predicate("isneginf", c, &isneginf_loops, 0); }
tpu_status_t tpu_k_isfinite(const tpu_call_t* c) { return predicate("isfinite", c, &isfinite_loops, 1); }

tpu_status_t tpu_k_logit(const tpu_call_t* c) {
  /* logit(self, eps=None): clamp to [eps, 1-eps] first */
  if (!tpu_arg_is_none(c, 1)) {
    double eps = tpu_arg_f64(c, 1, 0);
    const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
    TPU_RETURN_IF_ERROR(run("logit", c, ins, 1, &clamp_both_loops, eps, 1 - eps, true));
    const tpu_tensor_t* o[1] = {&c->outs[0]};
    return run("logit", c, o, 1, &logit_loops, 0, 0, true);
  }
  return unary("logit", c, &logit_loops, true);
}

tpu_status_t tpu_k_round(const tpu_call_t* c) {
  int64_t dec = tpu_arg_i64(c, 1, 0);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  if (dec == 0 || tpu_arg_is_none(c, 1)) return unary("round", c, &round_loops, false);
  double p = pow(10.0, (double)(dec > 0 ? dec : -dec));
  return run("round", c, ins, 1, dec > 0 ? &round_dec_loops : &round_negdec_loops, p, 0, false);
}

tpu_status_t tpu_k_nan_to_num(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  double big = in->dtype == TPU_F64 ? 1.7976931348623157e308
             : in->dtype == TPU_F16 ? 65504.0
             : in->dtype == TPU_BF16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  double nan_v = tpu_arg_f64(c, 1, 0.0);
  double pos = tpu_arg_f64(c, 2, big), negv = tpu_arg_f64(c, 3, -big);
  if (!tpu_dtype_is_float(in->dtype)) return tpu_copy_strided(&c->outs[0], in);
  /* two passes keep one body: +inf -> pos; then -inf handled by sign */
  if (pos != -negv) {
    /* general case: elementwise per value */
    int64_t n = tpu_tensor_numel(in);
    for (int64_t i = 0; i < n; i++) {
      double v = tpu_tensor_get_f64(in, i);
      if (v != v) v = nan_v;
      else if (isinf(v)) v = v > 0 ? pos : negv;
      tpu_store_f64(tpu_tensor_elem_ptr(&c->outs[0], i), c->outs[0].dtype, v);
    }
    return TPU_OK;
  }
  const tpu_tensor_t* ins[1] = {in};
  return run("nan_to_num", c, ins, 1, &nan_to_num_loops, nan_v, pos, false);
}

tpu_status_t tpu_k_gelu(const tpu_call_t* c) {
  const char* ap = tpu_arg_str(c, 1, "none");
  return unary("gelu", c, strcmp(ap, "tanh") == 0 ? &gelu_tanh_loops : &gelu_loops, false);
}

tpu_status_t tpu_k_gelu_backward(const tpu_call_t* c) {
  const char* ap = tpu_arg_str(c, 2, "none");
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return run("gelu_backward", c, ins, 2,
             strcmp(ap, "tanh") == 0 ? &gelu_tanh_backward_loops : &gelu_backward_loops, 0, 0, false);
}

static tpu_status_t grad2(const char* op, const tpu_call_t* c, const tpu_loop_set_t* l, double s0,
                          double s1) {
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return run(op, c, ins, 2, l, s0, s1, false);
}
tpu_status_t tpu_k_threshold_backward(const tpu_call_t* c) {
  return grad2("threshold_backward", c, &threshold_backward_loops, S01_OF(threshold_backward));
}
tpu_status_t tpu_k_sigmoid_backward(const tpu_call_t* c) { return grad2("sigmoid_backward", c, &sigmoid_backward_loops, 0, 0); }
tpu_status_t tpu_k_tanh_backward(const tpu_call_t* c) { return grad2("tanh_backward", c, &tanh_backward_loops, 0, 0); }
tpu_status_t tpu_k_silu_backward(const tpu_call_t* c) { return grad2("silu_backward", c, &silu_backward_loops, 0, 0); }
tpu_status_t tpu_k_hardsigmoid_backward(const tpu_call_t* c) { return grad2("hardsigmoid_backward", c, &hardsigmoid_backward_loops, 0, 0); }
tpu_status_t tpu_k_hardswish_backward(const tpu_call_t* c) { return grad2("hardswish_backward", c, &hardswish_backward_loops, 0, 0); }
tpu_status_t tpu_k_mish_backward(const tpu_call_t* c) { return grad2("mish_backward", c, &mish_backward_loops, 0, 0); }
tpu_status_t tpu_k_logit_backward(const tpu_call_t* c) {
  /* logit_backward(grad, self, eps=None); a negative eps counts as none */
  double eps = tpu_arg_is_none(c, 2) ? -1 : tpu_arg_f64(c, 2, -1);
  if (eps < 0) return grad2("logit_backward", c, &logit_backward_loops, 0, 0);
  return grad2("logit_backward", c, &logit_backward_eps_loops, eps, 1 - eps);
}
tpu_status_t tpu_k_leaky_relu_backward(const tpu_call_t* c) {
  return grad2("leaky_relu_backward", c, &leaky_relu_backward_loops, S01_OF(leaky_relu_backward));
}
tpu_status_t tpu_k_hardtanh_backward(const tpu_call_t* c) {
  return grad2("hardtanh_backward", c, &hardtanh_backward_loops, S01_OF(hardtanh_backward));
}
tpu_status_t tpu_k_softplus_backward(const tpu_call_t* c) {
  return grad2("softplus_backward", c, &softplus_backward_loops, S01_OF(softplus_backward));
}
tpu_status_t tpu_k_threshold(const tpu_call_t* c) {
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run("threshold", c, ins, 1, &threshold_loops, S01_OF(threshold), false);
}
tpu_status_t tpu_k_leaky_relu(const tpu_call_t* c) {
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run("leaky_relu", c, ins, 1, &leaky_relu_loops, S01_OF(leaky_relu), false);
}
tpu_status_t tpu_k_hardtanh(const tpu_call_t* c) {
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run("hardtanh", c, ins, 1, &hardtanh_loops, S01_OF(hardtanh), false);
}
tpu_status_t tpu_k_softplus(const tpu_call_t* c) {
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run("softplus", c, ins, 1, &softplus_loops, S01_OF(softplus), false);
}
tpu_status_t tpu_k_elu(const tpu_call_t* c) {
  /* elu(self, alpha, scale, input_scale); other scales: misc.c */
  double alpha = S0_OF(elu), scale = tpu_arg_f64(c, 2, 1), iscale = tpu_arg_f64(c, 3, 1);
  if (scale != 1 || iscale != 1) return tpu_elu_scaled(c);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run("elu", c, ins, 1, &elu_loops, alpha, 0, false);
}

tpu_status_t tpu_k_clamp(const tpu_call_t* c) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  bool has_lo = !tpu_arg_is_none(c, 1), has_hi = !tpu_arg_is_none(c, 2);
  if ((has_lo && c->args[1].kind == TPU_ARG_TENSOR) || (has_hi && c->args[2].kind == TPU_ARG_TENSOR)) {
    const tpu_tensor_t* lo = has_lo ? c->args[1].v.t : NULL;
    const tpu_tensor_t* hi = has_hi ? c->args[2].v.t : NULL;
    if (lo && hi) {
      const tpu_tensor_t* ins[3] = {self, lo, hi};
      return run("clamp", c, ins, 3, &clamp_t_loops, 0, 0, false);
    }
    const tpu_tensor_t* ins[2] = {self, lo ? lo : hi};
    return run("clamp", c, ins, 2, lo ? &clamp_tlo_loops : &clamp_thi_loops, 0, 0, false);
  }
  double lo = tpu_arg_f64(c, 1, 0), hi = tpu_arg_f64(c, 2, 0);
  if (!has_lo && !has_hi)
    return TPU_ERR(INVALID_ARGUMENT, "clamp: At least one of 'min' or 'max' must not be None");
  tpu_tensor_t t1, t2;
  const tpu_tensor_t* ins[3] = {self, has_lo ? scalar_arg_tensor(c, 1, &t1) : NULL,
                                has_hi ? scalar_arg_tensor(c, 2, &t2) : NULL};
  ew_ctx_t cx = {0};
  ctx_scalars(&cx, lo, hi);
  const tpu_tensor_t* pr[3] = {self, ins[1], ins[2]};
  tpu_ctype_t ct = tpu_ctype_of(tpu_result_type(pr, 3));
  if (tpu_ctype_of(c->outs[0].dtype) != ct) ct = tpu_ctype_of(c->outs[0].dtype);
  const tpu_loop_set_t* l = has_lo && has_hi ? &clamp_both_loops : has_lo ? &clamp_lo_loops : &clamp_hi_loops;
  if (ct != TPU_CT_I64 && ((has_lo && lo != lo) || (has_hi && hi != hi))) {
    ctx_scalars(&cx, NAN, NAN);
    return tpu_elementwise(&c->outs[0], NULL, 0, ct, ct == TPU_CT_F32 ? fill_f32 : fill_f64, &cx);
  }
  return tpu_elementwise_set("clamp", &c->outs[0], ins, 1, ct, l, &cx);
}

tpu_status_t tpu_k_clamp_min(const tpu_call_t* c) {
  if (c->args[1].kind == TPU_ARG_TENSOR) {
    const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), c->args[1].v.t};
    return run("clamp_min", c, ins, 2, &clamp_tlo_loops, 0, 0, false);
  }
  tpu_tensor_t t;
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), scalar_arg_tensor(c, 1, &t)};
  ew_ctx_t cx = {0};
  ctx_scalars(&cx, tpu_arg_f64(c, 1, 0), 0);
  tpu_ctype_t ct = tpu_ctype_of(tpu_result_type(ins, 2));
  return tpu_elementwise_set("clamp_min", &c->outs[0], ins, 1, ct, &clamp_lo_loops, &cx);
}

tpu_status_t tpu_k_clamp_max(const tpu_call_t* c) {
  if (c->args[1].kind == TPU_ARG_TENSOR) {
    const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), c->args[1].v.t};
    return run("clamp_max", c, ins, 2, &clamp_thi_loops, 0, 0, false);
  }
  tpu_tensor_t t;
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), scalar_arg_tensor(c, 1, &t)};
  ew_ctx_t cx = {0};
  ctx_scalars(&cx, 0, tpu_arg_f64(c, 1, 0));
  tpu_ctype_t ct = tpu_ctype_of(tpu_result_type(ins, 2));
  return tpu_elementwise_set("clamp_max", &c->outs[0], ins, 1, ct, &clamp_hi_loops, &cx);
}

tpu_status_t tpu_k_where(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  tpu_tensor_t t1, t2;
  const tpu_tensor_t* cond = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* ins[3] = {cond, scalar_arg_tensor(c, 1, &t1), scalar_arg_tensor(c, 2, &t2)};
  ew_ctx_t cx = {0};
  tpu_ctype_t ct = tpu_ctype_of(c->outs[0].dtype);
  return tpu_elementwise_set("where", &c->outs[0], ins, 3, ct, &where_loops, &cx);
}

tpu_status_t tpu_k_masked_fill(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  tpu_tensor_t t;
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), scalar_arg_tensor(c, 2, &t)};
  if (ins[1]->dtype != TPU_BOOL)
    return TPU_ERR(INVALID_ARGUMENT, "masked_fill only supports boolean masks, but got mask with dtype %s",
                   tpu_dtype_name(ins[1]->dtype));
  if (ins[2]->ndim != 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with %d dimension(s)",
                   ins[2]->ndim);
  ew_ctx_t cx = {0};
  return tpu_elementwise_set("masked_fill", &c->outs[0], ins, 3, tpu_ctype_of(c->outs[0].dtype),
                             &masked_fill_loops, &cx);
}

tpu_status_t tpu_k_fill(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  const tpu_arg_t* v = &c->args[1];
  if (v->kind == TPU_ARG_TENSOR) { /* fill_.Tensor: broadcast the 0-d value */
    if (v->v.t->ndim != 0)
      return TPU_ERR(INVALID_ARGUMENT,
                     "fill_ only supports 0-dimension value tensor but got tensor with %d dimensions.",
                     v->v.t->ndim);
    return tpu_copy_strided(&c->outs[0], v->v.t);
  }
  ew_ctx_t cx = {0};
  tpu_ctype_t ct = tpu_ctype_of(c->outs[0].dtype);
  if (ct == TPU_CT_I64 && v->kind == TPU_ARG_INT) {
    cx.i0 = v->v.i;
  } else {
    ctx_scalars(&cx, tpu_arg_f64(c, 1, 0), 0);
  }
  return tpu_elementwise_set("fill_", &c->outs[0], NULL, 0, ct, &fill_loops, &cx);
}

tpu_status_t tpu_k_zero(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  ew_ctx_t cx = {0};
  return tpu_elementwise_set("zero_", &c->outs[0], NULL, 0, tpu_ctype_of(c->outs[0].dtype), &fill_loops, &cx);
}

tpu_status_t tpu_k_lerp(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  if (c->args[2].kind == TPU_ARG_TENSOR) {
    const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), c->args[2].v.t};
    return run("lerp", c, ins, 3, &lerp_t_loops, 0, 0, false);
  }
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return run("lerp", c, ins, 2, &lerp_s_loops, S01_OF(lerp_s), false);
}

tpu_status_t tpu_k_addcmul(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
  return run("addcmul", c, ins, 3, &addcmul_loops, S01_OF(addcmul), false);
}

tpu_status_t tpu_k_addcdiv(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
  if (!tpu_dtype_is_float(ins[1]->dtype) && !tpu_dtype_is_float(ins[2]->dtype))
    return TPU_ERR(INVALID_ARGUMENT,
                   "Integer division with addcdiv is no longer supported, and in a future release "
                   "addcdiv will perform a true division of tensor1 and tensor2.");
  return run("addcdiv", c, ins, 3, &addcdiv_loops, S01_OF(addcdiv), false);
}

tpu_status_t tpu_k_copy_(const tpu_call_t* c) {
  return tpu_copy_strided(&c->outs[0], tpu_arg_tensor(c, 1));
}
