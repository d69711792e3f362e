/* Complex kernels: the element-wise ops, reductions, products and copies of
 * complex64 / complex128 tensors.
 *
 * The kernels of the real families (elementwise.c, reduce.c, matmul.c) hand
 * a call with a complex operand, result or scalar here (TPU_ROUTE_COMPLEX,
 * kernels.h); this file picks the computation by the call's op family.
 * Element-wise work runs through one strided engine: operands broadcast to
 * the output, chunks of up to TPU_CHUNK elements are loaded as double
 * complex (real dtypes with imaginary part 0), computed, and stored in the
 * output's dtype (a real output takes the real part: abs, angle, eq).
 * Products are built from the real GEMM (four real products, so they follow
 * the float32 matmul precision like every real product).
 */
#include <complex.h>
#include <stdlib.h>

#include "kernels.h"
#include "zvalue.h"
#include "matmul.h"
#include "tpu/parallel.h"


#define ZMAX_IN 4

/* out = f(in[0..nin-1]) over n contiguous elements */
typedef void (*zbody_t)(const void* ctx, int64_t n, zc_t* out, const zc_t* const* in);

bool tpu_call_has_complex(const tpu_call_t* c) {
  for (int i = 0; i < c->nargs; i++) {
    const tpu_arg_t* a = &c->args[i];
    if (a->kind == TPU_ARG_COMPLEX) return true;
    if (a->kind == TPU_ARG_TENSOR && tpu_dtype_is_complex(a->v.t->dtype)) return true;
  }
  for (int o = 0; o < c->nouts; o++)
    if (tpu_dtype_is_complex(c->outs[o].dtype)) return true;
  return false;
}

/* ---- the element-wise engine ---- */
typedef struct zjob {
  const tpu_tensor_t* out;
  const tpu_tensor_t* in[ZMAX_IN];
  int nin;
  int64_t st[ZMAX_IN + 1][TPU_MAX_DIMS]; /* byte strides over out's dims; [0] = out */
  zbody_t body;
  const void* ctx;
} zjob_t;

static void zjob_range(void* vctx, int64_t begin, int64_t end) {
  const zjob_t* j = vctx;
  const tpu_tensor_t* out = j->out;
  const int nd = out->ndim, nops = j->nin + 1;
  zc_t buf[ZMAX_IN + 1][TPU_CHUNK];
  const zc_t* ins[ZMAX_IN];
  for (int k = 0; k < j->nin; k++) ins[k] = buf[k + 1];
  int64_t idx[TPU_MAX_DIMS];
  for (int64_t lo = begin; lo < end; lo += TPU_CHUNK) {
    const int64_t n = end - lo < TPU_CHUNK ? end - lo : TPU_CHUNK;
    char* ptr[ZMAX_IN + 1];
    int64_t rem = lo;
    for (int d = nd - 1; d >= 0; d--) {
      idx[d] = rem % out->sizes[d];
      rem /= out->sizes[d];
    }
    char* base[ZMAX_IN + 1] = {out->data};
    for (int k = 0; k < j->nin; k++) base[k + 1] = j->in[k]->data;
    for (int k = 0; k < nops; k++) {
      ptr[k] = base[k];
      for (int d = 0; d < nd; d++) ptr[k] += idx[d] * j->st[k][d];
    }
    /* gather the inputs, remembering out's addresses */
    char* oaddr[TPU_CHUNK];
    for (int64_t e = 0; e < n; e++) {
      oaddr[e] = ptr[0];
      for (int k = 0; k < j->nin; k++) buf[k + 1][e] = tpu_load_z(ptr[k + 1], j->in[k]->dtype);
      for (int d = nd - 1; d >= 0; d--) { /* advance the odometer */
        for (int k = 0; k < nops; k++) ptr[k] += j->st[k][d];
        if (++idx[d] < out->sizes[d]) break;
        for (int k = 0; k < nops; k++) ptr[k] -= j->st[k][d] * out->sizes[d];
        idx[d] = 0;
      }
    }
    j->body(j->ctx, n, buf[0], ins);
    for (int64_t e = 0; e < n; e++) tpu_store_z(oaddr[e], out->dtype, buf[0][e]);
  }
}

/* Runs body over out = f(in...) with in broadcast to out's shape. */
static tpu_status_t zmap(const char* op, const tpu_tensor_t* out, const tpu_tensor_t* const* in,
                         int nin, zbody_t body, const void* ctx) {
  zjob_t j;
  memset(&j, 0, sizeof j);
  j.out = out;
  j.nin = nin;
  j.body = body;
  j.ctx = ctx;
  const int nd = out->ndim;
  for (int d = 0; d < nd; d++) j.st[0][d] = out->strides[d] * (int64_t)tpu_dtype_size(out->dtype);
  for (int k = 0; k < nin; k++) {
    const tpu_tensor_t* t = in[k];
    j.in[k] = t;
    TPU_CHECK_ARG(t->ndim <= nd, "%s: operand %d has %d dims, the result %d", op, k,
                  (int)t->ndim, nd);
    const int64_t es = (int64_t)tpu_dtype_size(t->dtype);
    for (int d = 0; d < nd; d++) {
      const int td = d - (nd - t->ndim);
      if (td < 0 || t->sizes[td] == 1) {
        j.st[k + 1][d] = 0;
        continue;
      }
      TPU_CHECK_ARG(t->sizes[td] == out->sizes[d],
                    "%s: operand %d of size %lld at dim %d does not broadcast to %lld", op, k,
                    (long long)t->sizes[td], td, (long long)out->sizes[d]);
      j.st[k + 1][d] = t->strides[td] * es;
    }
  }
  const int64_t n = tpu_tensor_numel(out);
  if (n > 0) tpu_parallel_for(n, 1 << 14, zjob_range, &j);
  return TPU_OK;
}

/* A 0-d tensor holding the complex number z (complex128). */
static const tpu_tensor_t* scalar_z(tpu_tensor_t* tmp, const double z[2]) {
  tpu_tensor_make_contig(tmp, tmp->inline_value, TPU_C128, 0, NULL);
  tmp->flags = TPU_TENSOR_WRAPPED_NUMBER | TPU_TENSOR_CPU_SCALAR;
  memcpy(tmp->inline_value, z, 16);
  return tmp;
}

/* argument i as an operand: the tensor, or the scalar as a 0-d tensor */
static const tpu_tensor_t* operand(const tpu_call_t* c, int i, tpu_tensor_t* tmp) {
  const tpu_tensor_t* t = tpu_arg_tensor(c, i);
  if (t) return t;
  double z[2] = {0, 0};
  (void)tpu_arg_complex(c, i, z);
  return scalar_z(tmp, z);
}

/* ---- bodies ---- */
typedef struct zctx {
  zc_t s;      /* alpha, fill value, weight */
  int op;      /* unary: which function; pow: a special exponent */
  bool single; /* complex64 result: constants (and pow) in float, as CPU */
  zc_t t;      /* beta */
} zctx_t;

/* a * b as c10::complex multiplies (no C99 infinity recovery) */
static inline zc_t zmul(zc_t a, zc_t b) {
  return CMPLX(creal(a) * creal(b) - cimag(a) * cimag(b), creal(a) * cimag(b) + cimag(a) * creal(b));
}

/* a / b as c10::complex divides (Smith's: the ratio of b's smaller part to
 * its larger; a zero b divides each part by zero), whose infinities and NaNs
 * CPU's kernels give (C's division recovers infinities where these are NaN) */
static inline zc_t zdiv(zc_t a, zc_t b) {
  const double ar = creal(a), ai = cimag(a), c = creal(b), d = cimag(b);
  if (fabs(c) >= fabs(d)) {
    if (c == 0 && d == 0) return CMPLX(ar / fabs(c), ai / fabs(d));
    const double rat = d / c, scl = 1.0 / (c + d * rat);
    return CMPLX((ar + ai * rat) * scl, (ai - ar * rat) * scl);
  }
  const double rat = c / d, scl = 1.0 / (d + c * rat);
  return CMPLX((ar * rat + ai) * scl, (ai * rat - ar) * scl);
}

/* log(1 + z) as c10's CPU log1p computes it */
static zc_t zlog1p(zc_t z) {
  const zc_t u = z + 1;
  if (u == 1) return z;
  const zc_t lu = clog(u);
  return u - 1 == z ? lu : lu * (z / (u - 1));
}

/* log(exp(x) + exp(y)) as PyTorch's complex _log_add_exp_helper (logaddexp,
 * logcumsumexp): the operand of larger real part factored out */
static zc_t zlog_add_exp(zc_t x, zc_t y) {
  zc_t lo, hi;
  if (isnan(creal(y)) || isnan(cimag(y))) lo = hi = y;
  else if (isnan(creal(x)) || isnan(cimag(x))) lo = hi = x;
  else if (creal(x) < creal(y)) lo = x, hi = y;
  else lo = y, hi = x;
  if (isnan(creal(lo)) || isnan(cimag(lo))) return CMPLX(NAN, NAN);
  if (!isfinite(creal(lo)) && creal(lo) == creal(hi))
    return creal(lo) < 0 ? lo : clog(cexp(lo) + cexp(hi));
  return zlog1p(cexp(lo - hi)) + hi;
}

static void b_add(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zc_t s = ((const zctx_t*)v)->s;
  for (int64_t i = 0; i < n; i++) o[i] = in[0][i] + s * in[1][i];
}
static void b_mul(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = zmul(in[0][i], in[1][i]);
}
static void b_div(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = zdiv(in[0][i], in[1][i]);
}
/* pow as CPU's kernels: std::pow of the dtype's complex (C's cpowf / cpow),
 * and for a Scalar exponent of 0, 1, 2, 3, -2, 0.5, -0.5 or -1 the fill,
 * copy, products, square roots and reciprocals PyTorch picks instead. */
enum { ZPOW_ANY, ZPOW_ZERO, ZPOW_ONE, ZPOW_SQ, ZPOW_CUBE, ZPOW_INVSQ, ZPOW_SQRT, ZPOW_RSQRT, ZPOW_RECIP };
static zc_t zpow(zc_t a, zc_t b, int how, bool single) {
  switch (how) {
    case ZPOW_ZERO: return 1;
    case ZPOW_ONE: return a;
    case ZPOW_SQ: return zmul(a, a);
    case ZPOW_CUBE: return zmul(zmul(a, a), a);
    case ZPOW_INVSQ: return 1 / zmul(a, a);
    case ZPOW_SQRT: return csqrt(a);
    case ZPOW_RSQRT: return 1 / csqrt(a);
    case ZPOW_RECIP: return 1 / a;
    default: return single ? (zc_t)cpowf((float _Complex)a, (float _Complex)b) : cpow(a, b);
  }
}
static void b_pow(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zctx_t* cx = v;
  for (int64_t i = 0; i < n; i++) o[i] = zpow(in[0][i], in[1][i], cx->op, cx->single);
}
static int pow_special(const tpu_call_t* c) {
  double e[2];
  if (c->nargs < 2 || c->args[1].kind == TPU_ARG_TENSOR || !tpu_arg_complex(c, 1, e) || e[1] != 0)
    return ZPOW_ANY;
  return e[0] == 0 ? ZPOW_ZERO : e[0] == 1 ? ZPOW_ONE : e[0] == 2 ? ZPOW_SQ : e[0] == 3 ? ZPOW_CUBE : e[0] == -2 ? ZPOW_INVSQ
       : e[0] == 0.5 ? ZPOW_SQRT : e[0] == -0.5 ? ZPOW_RSQRT : e[0] == -1 ? ZPOW_RECIP : ZPOW_ANY;
}
/* addcmul: self + value * t1 * t2; addcdiv: self + value * t1 / t2 */
static void b_addcmul(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zc_t s = ((const zctx_t*)v)->s;
  for (int64_t i = 0; i < n; i++) o[i] = in[0][i] + s * in[1][i] * in[2][i];
}
static void b_addcdiv(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zc_t s = ((const zctx_t*)v)->s;
  for (int64_t i = 0; i < n; i++) o[i] = in[0][i] + s * in[1][i] / in[2][i];
}
/* lerp(self, end, weight) by PyTorch's two forms, chosen by |weight| < 0.5;
 * the weight is in[2] or, with two operands, the scalar s */
static void b_lerp(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zctx_t* cx = v;
  for (int64_t i = 0; i < n; i++) {
    const zc_t a = in[0][i], b = in[1][i], w = cx->op ? in[2][i] : cx->s;
    o[i] = cabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w);
  }
}
static void b_logaddexp(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = zlog_add_exp(in[0][i], in[1][i]);
}
/* one component of a cross product: in0 * in1 - in2 * in3 */
static void b_cross(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = in[0][i] * in[1][i] - in[2][i] * in[3][i];
}
static void b_eq(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const bool ne = ((const zctx_t*)v)->op;
  for (int64_t i = 0; i < n; i++) o[i] = (in[0][i] == in[1][i]) != ne;
}
static void b_complex(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = CMPLX(creal(in[0][i]), creal(in[1][i]));
}
static void b_polar(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) {
    const double r = creal(in[0][i]), t = creal(in[1][i]);
    o[i] = CMPLX(r * cos(t), r * sin(t));
  }
}
static void b_where(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  for (int64_t i = 0; i < n; i++) o[i] = creal(in[0][i]) != 0 ? in[1][i] : in[2][i];
}
static void b_fill(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)in;
  const zc_t s = ((const zctx_t*)v)->s;
  for (int64_t i = 0; i < n; i++) o[i] = s;
}
static void b_copy(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  (void)v;
  memcpy(o, in[0], (size_t)n * sizeof(zc_t));
}

/* The unary functions, by the op family that computes them. */
#define ZUNARY(X)                                                           \
  X(neg, -z) X(conj_physical, conj(z)) X(_conj_physical, conj(z))          \
  X(abs, cabs(z)) X(angle, carg(z)) X(sgn, z == 0 ? 0 : z / cabs(z))        \
  X(exp, cexp(z)) X(expm1, cexp(z) - 1) X(log, clog(z))                     \
  X(log2, clog(z) / M_LN2) X(log10, clog(z) / M_LN10) X(log1p, clog(1 + z)) \
  X(sqrt, csqrt(z)) X(rsqrt, 1 / csqrt(z)) X(reciprocal, 1 / z)             \
  X(sin, csin(z)) X(cos, ccos(z)) X(tan, ctan(z)) X(sinh, csinh(z))         \
  X(cosh, ccosh(z)) X(tanh, ctanh(z)) X(asin, casin(z)) X(acos, cacos(z))   \
  X(atan, catan(z)) X(asinh, casinh(z)) X(acosh, cacosh(z))                 \
  X(atanh, catanh(z)) X(sigmoid, 1 / (1 + cexp(-z)))                        \
  X(silu, z / (1 + cexp(-z))) X(exp2, cexp(ZCONST(M_LN2) * z))              \
  X(sinc, z == 0 ? 1 : csin(ZCONST(M_PI) * z) / (ZCONST(M_PI) * z))         \
  X(isnan, isnan(creal(z)) || isnan(cimag(z)))                              \
  X(isfinite, isfinite(creal(z)) && isfinite(cimag(z)))                     \
  X(isinf, isinf(creal(z)) || isinf(cimag(z)))

enum {
#define X(name, expr) ZU_##name,
  ZUNARY(X)
#undef X
  ZU_COUNT
};

/* a constant as CPU holds it: in float for complex64 */
#define ZCONST(k) (single ? (double)(float)(k) : (k))

static void b_unary(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const int op = ((const zctx_t*)v)->op;
  const bool single = ((const zctx_t*)v)->single;
  const zc_t* a = in[0];
  switch (op) {
#define X(name, expr)                                        \
  case ZU_##name:                                            \
    for (int64_t i = 0; i < n; i++) {                        \
      const zc_t z = a[i];                                   \
      o[i] = (expr);                                         \
    }                                                        \
    break;
    ZUNARY(X)
#undef X
    default: break;
  }
  (void)single;
}

static int unary_of(tpu_op_id_t id) {
  switch (id) {
#define X(name, expr) case TPU_OPID_##name: return ZU_##name;
    ZUNARY(X)
#undef X
    default: return -1;
  }
}

/* ---- copies ---- */
tpu_status_t tpu_complex_copy(const tpu_tensor_t* dst, const tpu_tensor_t* src) {
  if (dst->dtype == src->dtype && tpu_tensor_is_contiguous(dst) && tpu_tensor_is_contiguous(src) &&
      tpu_tensor_numel(dst) == tpu_tensor_numel(src)) {
    const size_t bytes = (size_t)tpu_tensor_numel(dst) * tpu_dtype_size(dst->dtype);
    if (bytes && dst->data != src->data) memmove(dst->data, src->data, bytes);
    return TPU_OK;
  }
  const tpu_tensor_t* in[1] = {src};
  return zmap("copy", dst, in, 1, b_copy, NULL);
}

/* ---- reductions over a set of dims ---- */
/* The dims named by args[dim_arg] (int or int list; absent, none or empty:
 * every dim) as a bit mask over nd dims. */
static tpu_status_t zdims(const tpu_call_t* c, const char* op, int dim_arg, int nd, uint64_t* mask) {
  const tpu_arg_t* da = dim_arg >= 0 && dim_arg < c->nargs ? &c->args[dim_arg] : NULL;
  int64_t dl[TPU_MAX_DIMS];
  int ndl = 0;
  if (da && da->kind == TPU_ARG_INT) dl[ndl++] = da->v.i;
  else if (da && da->kind == TPU_ARG_INTLIST)
    for (int k = 0; k < da->n && ndl < TPU_MAX_DIMS; k++) dl[ndl++] = da->v.ilist[k];
  *mask = 0;
  for (int k = 0; k < ndl; k++) {
    const int64_t d = dl[k] < 0 ? dl[k] + nd : dl[k];
    if (nd == 0 && (d == 0 || d == -1)) continue;
    TPU_CHECK_ARG(d >= 0 && d < nd, "%s: dim %lld out of range for a %d-D tensor", op, (long long)dl[k], nd);
    *mask |= 1ull << d;
  }
  if (ndl == 0) *mask = nd ? (nd == 64 ? ~0ull : (1ull << nd) - 1) : 0;
  return TPU_OK;
}

/* Calls visit(ctx, oi, v) for every element v of `in` in row-major order; oi
 * is the element's output index (row-major over the dims not in mask). */
static void zwalk(const tpu_tensor_t* in, uint64_t mask, void (*visit)(void*, int64_t, zc_t),
                  void* ctx) {
  const int nd = in->ndim;
  const int64_t n = tpu_tensor_numel(in), es = (int64_t)tpu_dtype_size(in->dtype);
  int64_t idx[TPU_MAX_DIMS] = {0};
  for (int64_t e = 0; e < n; e++) {
    int64_t off = 0, oi = 0;
    for (int d = 0; d < nd; d++) {
      off += idx[d] * in->strides[d];
      if (!(mask >> d & 1)) oi = oi * in->sizes[d] + idx[d];
    }
    visit(ctx, oi, tpu_load_z((const char*)in->data + off * es, in->dtype));
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < in->sizes[d]) break;
      idx[d] = 0;
    }
  }
}

typedef struct zacc {
  zc_t* acc;
  double* re; /* logsumexp: each output's largest real part, then its shift */
} zacc_t;

static void v_sum(void* v, int64_t oi, zc_t x) { ((zacc_t*)v)->acc[oi] += x; }
static void v_prod(void* v, int64_t oi, zc_t x) { ((zacc_t*)v)->acc[oi] *= x; }
static void v_max_re(void* v, int64_t oi, zc_t x) { /* amax: NaN wins */
  double* m = &((zacc_t*)v)->re[oi];
  if (creal(x) > *m || creal(x) != creal(x)) *m = *m != *m ? *m : creal(x);
}
static void v_sum_exp(void* v, int64_t oi, zc_t x) {
  zacc_t* a = v;
  a->acc[oi] += cexp(x - a->re[oi]);
}

/* sum, mean, prod and logsumexp over the dims of args[dim_arg], accumulated
 * in double complex in input order. logsumexp follows PyTorch's composite:
 * the largest real part m of each output (0 where infinite) shifts the
 * inputs, log(sum(exp(x - m))) + m. */
tpu_status_t tpu_complex_reduce(const tpu_call_t* c, int dim_arg) {
  const tpu_op_id_t id = c->op ? c->op->id : TPU_OPID_NONE;
  const char* op = c->op ? c->op->name : "reduction";
  if (id != TPU_OPID_sum && id != TPU_OPID_mean && id != TPU_OPID_prod && id != TPU_OPID_logsumexp)
    return TPU_ERR(UNIMPLEMENTED, "%s is not implemented for complex dtypes on tpu", op);
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  const int nd = in->ndim;
  uint64_t mask;
  TPU_RETURN_IF_ERROR(zdims(c, op, dim_arg, nd, &mask));
  const int64_t on = tpu_tensor_numel(out);
  const size_t slots = (size_t)(on > 0 ? on : 1);
  zacc_t a = {malloc(slots * sizeof(zc_t)), id == TPU_OPID_logsumexp ? malloc(slots * sizeof(double)) : NULL};
  if (!a.acc || (id == TPU_OPID_logsumexp && !a.re)) {
    free(a.acc);
    free(a.re);
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for %lld accumulators", op, (long long)on);
  }
  const zc_t init = id == TPU_OPID_prod ? 1 : 0;
  for (int64_t i = 0; i < on; i++) a.acc[i] = init;
  if (id == TPU_OPID_logsumexp) {
    for (int64_t i = 0; i < on; i++) a.re[i] = -INFINITY;
    zwalk(in, mask, v_max_re, &a);
    for (int64_t i = 0; i < on; i++) a.re[i] = isinf(a.re[i]) ? 0 : a.re[i];
  }
  zwalk(in, mask, id == TPU_OPID_prod ? v_prod : id == TPU_OPID_logsumexp ? v_sum_exp : v_sum, &a);
  int64_t count = 1;
  for (int d = 0; d < nd; d++)
    if (mask >> d & 1) count *= in->sizes[d];
  for (int64_t i = 0; i < on; i++) {
    zc_t r = a.acc[i];
    if (id == TPU_OPID_mean) r /= (double)count;
    if (id == TPU_OPID_logsumexp) r = clog(r) + a.re[i];
    tpu_store_z(tpu_tensor_elem_ptr(out, i), out->dtype, r);
  }
  free(a.acc);
  free(a.re);
  return TPU_OK;
}

/* ---- products ---- */
/* The real (part 0) or imaginary (part 1) plane of complex t as a real view;
 * a real t is its own real plane. */
static tpu_tensor_t plane(const tpu_tensor_t* t, int part) {
  tpu_tensor_t v = *t;
  if (!tpu_dtype_is_complex(t->dtype)) return v;
  v.dtype = tpu_dtype_complex_part(t->dtype);
  for (int d = 0; d < v.ndim; d++) v.strides[d] *= 2;
  v.data = (char*)t->data + part * (int64_t)tpu_dtype_size(v.dtype);
  return v;
}

/* c = beta * self + alpha * (a @ b), complex, from four real products:
 * re = ar br - ai bi, im = ar bi + ai br. `batched`: 3-D operands. a, b must
 * not overlap c (the caller copies). */
static tpu_status_t zgemm(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                          double alpha, double beta, const tpu_tensor_t* self, bool batched) {
  tpu_status_t (*g)(const tpu_tensor_t*, const tpu_tensor_t*, const tpu_tensor_t*, double, double,
                    const tpu_tensor_t*) = batched ? tpu_gemm_batched : tpu_gemm;
  tpu_tensor_t ar = plane(a, 0), ai = plane(a, 1), br = plane(b, 0), bi = plane(b, 1);
  tpu_tensor_t cr = plane(c, 0), ci = plane(c, 1);
  const bool ca = tpu_dtype_is_complex(a->dtype), cb = tpu_dtype_is_complex(b->dtype);
  tpu_tensor_t sr, si;
  const bool has_self = self && beta != 0;
  if (has_self) {
    sr = plane(self, 0);
    si = plane(self, 1);
  }
  tpu_status_t st;
  /* real part */
  st = g(&ar, &br, &cr, alpha, has_self ? beta : 0, has_self ? &sr : NULL);
  if (!st && ca && cb) st = g(&ai, &bi, &cr, -alpha, 1, &cr);
  /* imaginary part */
  if (!st) {
    if (cb) st = g(&ar, &bi, &ci, alpha, has_self && tpu_dtype_is_complex(self->dtype) ? beta : 0,
                   has_self && tpu_dtype_is_complex(self->dtype) ? &si : NULL);
    else if (ca) st = g(&ai, &br, &ci, alpha, has_self && tpu_dtype_is_complex(self->dtype) ? beta : 0,
                        has_self && tpu_dtype_is_complex(self->dtype) ? &si : NULL);
  }
  if (!st && ca && cb) st = g(&ai, &br, &ci, alpha, 1, &ci);
  return st;
}

static bool overlaps(const tpu_tensor_t* x, const tpu_tensor_t* y) {
  const int64_t nx = tpu_tensor_numel(x), ny = tpu_tensor_numel(y);
  if (!nx || !ny) return false;
  int64_t xlo = 0, xhi = 0, ylo = 0, yhi = 0;
  for (int d = 0; d < x->ndim; d++) xhi += (x->sizes[d] - 1) * x->strides[d];
  for (int d = 0; d < y->ndim; d++) yhi += (y->sizes[d] - 1) * y->strides[d];
  const char* xa = (const char*)x->data + xlo;
  const char* ya = (const char*)y->data + ylo;
  const char* xb = (const char*)x->data + (xhi + 1) * (int64_t)tpu_dtype_size(x->dtype);
  const char* yb = (const char*)y->data + (yhi + 1) * (int64_t)tpu_dtype_size(y->dtype);
  return xa < yb && ya < xb;
}

/* A contiguous copy of t in host memory (freed by the caller) when it
 * overlaps out; t itself otherwise. */
static tpu_status_t separate(const tpu_tensor_t* t, const tpu_tensor_t* out, tpu_tensor_t* tmp,
                             void** owned, const tpu_tensor_t** res) {
  *owned = NULL;
  *res = t;
  if (!overlaps(t, out)) return TPU_OK;
  const int64_t n = tpu_tensor_numel(t);
  *owned = malloc((size_t)n * tpu_dtype_size(t->dtype));
  if (!*owned) return TPU_ERR(RESOURCE_EXHAUSTED, "complex product: no host memory for an operand copy");
  tpu_tensor_make_contig(tmp, *owned, t->dtype, t->ndim, t->sizes);
  *res = tmp;
  return tpu_complex_copy(tmp, t);
}

/* out = beta * self + alpha * p */
static void b_axpby(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zctx_t* cx = v;
  for (int64_t i = 0; i < n; i++) o[i] = cx->t * in[0][i] + cx->s * in[1][i];
}
static void b_scale(const void* v, int64_t n, zc_t* o, const zc_t* const* in) {
  const zc_t s = ((const zctx_t*)v)->s;
  for (int64_t i = 0; i < n; i++) o[i] = s * in[0][i];
}

tpu_status_t tpu_complex_gemm(const char* op, const tpu_tensor_t* a, const tpu_tensor_t* b,
                              const tpu_tensor_t* c, const double alpha[2], const double beta[2],
                              const tpu_tensor_t* self, bool batched) {
  TPU_CHECK_ARG(tpu_dtype_is_complex(c->dtype), "%s: complex operands need a complex result, got %s",
                op, tpu_dtype_name(c->dtype));
  tpu_tensor_t ta, tb, ts, tp;
  void *oa, *ob, *os = NULL, *prod = NULL;
  const tpu_tensor_t *pa, *pb, *ps = self;
  tpu_status_t st = separate(a, c, &ta, &oa, &pa);
  if (!st) st = separate(b, c, &tb, &ob, &pb);
  if (!st && self && self->data != c->data) st = separate(self, c, &ts, &os, &ps);
  if (!st && alpha[1] == 0 && beta[1] == 0) {
    st = zgemm(pa, pb, c, alpha[0], beta[0], ps, batched);
  } else if (!st) { /* a complex scale: the product first, then the sum */
    const int64_t n = tpu_tensor_numel(c);
    prod = malloc((size_t)(n > 0 ? n : 1) * tpu_dtype_size(c->dtype));
    if (!prod) st = TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a %lld-element product", op, (long long)n);
    if (!st) {
      tpu_tensor_make_contig(&tp, prod, c->dtype, c->ndim, c->sizes);
      st = zgemm(pa, pb, &tp, 1, 0, NULL, batched);
    }
    const zctx_t cx = {CMPLX(alpha[0], alpha[1]), 0, false, CMPLX(beta[0], beta[1])};
    const bool use_self = ps && (beta[0] != 0 || beta[1] != 0);
    const tpu_tensor_t* in[2] = {use_self ? ps : &tp, &tp};
    if (!st) st = use_self ? zmap(op, c, in, 2, b_axpby, &cx) : zmap(op, c, in, 1, b_scale, &cx);
  }
  free(oa);
  free(ob);
  free(os);
  free(prod);
  return st;
}

/* dot / vdot: sum of a * b (vdot: conj(a) * b) in double complex */
static tpu_status_t zdot(const tpu_call_t* c, bool conj_a) {
  const tpu_tensor_t* a = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* b = tpu_arg_tensor(c, 1);
  zc_t acc = 0;
  const int64_t n = tpu_tensor_numel(a);
  for (int64_t i = 0; i < n; i++) {
    const zc_t x = tpu_load_z(tpu_tensor_elem_ptr(a, i), a->dtype);
    acc += (conj_a ? conj(x) : x) * tpu_load_z(tpu_tensor_elem_ptr(b, i), b->dtype);
  }
  tpu_store_z(c->outs[0].data, c->outs[0].dtype, acc);
  return TPU_OK;
}

/* t (complex) as the real tensor of its parts: one more dim of size 2 */
static tpu_tensor_t as_real(const tpu_tensor_t* t) {
  tpu_tensor_t v = *t;
  v.dtype = tpu_dtype_complex_part(t->dtype);
  for (int d = 0; d < t->ndim; d++) v.strides[d] = t->strides[d] * 2;
  v.sizes[t->ndim] = 2;
  v.strides[t->ndim] = 1;
  v.ndim = t->ndim + 1;
  return v;
}

/* normal_ / uniform_ of a complex tensor: the real kernel on its parts, as
 * PyTorch does (normal_: each part with std / sqrt(2)) */
static tpu_status_t zrandom(const tpu_call_t* c, bool normal) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  if (!self || !tpu_dtype_is_complex(self->dtype) || self->ndim >= TPU_MAX_DIMS || c->nargs > 8)
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for these complex arguments on tpu", c->op->name);
  tpu_tensor_t rv = as_real(self), ro = as_real(&c->outs[0]);
  tpu_arg_t args[8];
  memcpy(args, c->args, sizeof(tpu_arg_t) * (size_t)c->nargs);
  args[0].v.t = &rv;
  if (normal && c->nargs > 2) {
    args[2].kind = TPU_ARG_DOUBLE;
    args[2].v.d = tpu_arg_f64(c, 2, 1.0) / sqrt(2.0);
  }
  tpu_call_t c2 = *c;
  c2.args = args;
  c2.outs = &ro;
  return c->op->fn(&c2);
}

tpu_status_t tpu_complex_on_abs(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  if (!in || !tpu_dtype_is_complex(in->dtype) || c->nargs > 8)
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for these complex arguments on tpu", c->op->name);
  const int64_t n = tpu_tensor_numel(in);
  const tpu_dtype_t part = tpu_dtype_complex_part(in->dtype);
  void* buf = malloc((size_t)(n > 0 ? n : 1) * tpu_dtype_size(part));
  if (!buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for %lld magnitudes", c->op->name, (long long)n);
  tpu_tensor_t mag;
  tpu_tensor_make_contig(&mag, buf, part, in->ndim, in->sizes);
  zctx_t cx = {0, ZU_abs, false, 0};
  const tpu_tensor_t* ins[1] = {in};
  tpu_status_t st = zmap(c->op->name, &mag, ins, 1, b_unary, &cx);
  if (!st) {
    tpu_arg_t args[8];
    memcpy(args, c->args, sizeof(tpu_arg_t) * (size_t)c->nargs);
    args[0].v.t = &mag;
    tpu_call_t c2 = *c;
    c2.args = args;
    st = c->op->fn(&c2);
  }
  free(buf);
  return st;
}

/* ---- scans: cumsum, cumprod, logcumsumexp ---- */
/* Lines along one dim, each scanned in order from its first element with a
 * double complex accumulator, as CPU's kernels (stored in out's dtype). */
typedef struct zscan {
  const tpu_tensor_t *in, *out;
  int dim;
  tpu_op_id_t id;
} zscan_t;

static void zscan_range(void* v, int64_t begin, int64_t end) {
  const zscan_t* s = v;
  const tpu_tensor_t *in = s->in, *out = s->out;
  const int nd = in->ndim, dim = s->dim;
  const int64_t len = nd ? in->sizes[dim] : 1;
  const int64_t ie = (int64_t)tpu_dtype_size(in->dtype), oe = (int64_t)tpu_dtype_size(out->dtype);
  const int64_t is = nd ? in->strides[dim] * ie : 0, os = nd ? out->strides[dim] * oe : 0;
  for (int64_t line = begin; line < end; line++) {
    int64_t rem = line, ioff = 0, ooff = 0;
    for (int d = nd - 1; d >= 0; d--) {
      if (d == dim) continue;
      const int64_t i = rem % in->sizes[d];
      rem /= in->sizes[d];
      ioff += i * in->strides[d];
      ooff += i * out->strides[d];
    }
    const char* pi = (const char*)in->data + ioff * ie;
    char* po = (char*)out->data + ooff * oe;
    zc_t acc = s->id == TPU_OPID_cumprod ? 1 : s->id == TPU_OPID_logcumsumexp ? -INFINITY : 0;
    for (int64_t t = 0; t < len; t++, pi += is, po += os) {
      const zc_t x = tpu_load_z(pi, in->dtype);
      acc = s->id == TPU_OPID_cumsum ? acc + x
          : s->id == TPU_OPID_cumprod ? zmul(acc, x) : zlog_add_exp(x, acc);
      tpu_store_z(po, out->dtype, acc);
    }
  }
}

/* cumsum(self, dim, *, dtype), cumprod(...), logcumsumexp(self, dim) */
static tpu_status_t zscan(const tpu_call_t* c, const char* op, tpu_op_id_t id) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const int nd = in->ndim;
  int64_t dim = tpu_arg_i64(c, 1, 0);
  if (dim < 0) dim += nd ? nd : 1;
  TPU_CHECK_ARG(dim >= 0 && dim < (nd ? nd : 1), "%s: dim %lld out of range for a %d-D tensor", op,
                (long long)tpu_arg_i64(c, 1, 0), nd);
  zscan_t s = {in, &c->outs[0], (int)dim, id};
  const int64_t n = tpu_tensor_numel(in), len = nd ? in->sizes[dim] : 1;
  if (n == 0) return TPU_OK;
  const int64_t lines = n / len;
  tpu_parallel_for(lines, (1 << 14) / len + 1, zscan_range, &s);
  return TPU_OK;
}

/* ---- var, std and their _mean variants ---- */
/* As CPU: the real kernel's variance of the real and of the imaginary parts,
 * added in the result's dtype (std: then its square root); the means make
 * the complex mean. */
static tpu_status_t zvar(const tpu_call_t* c, bool take_sqrt) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const char* op = c->op->name;
  const int nouts = c->nouts > 1 ? 2 : 1;
  if (!in || !tpu_dtype_is_complex(in->dtype) || c->nargs > 8)
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for these complex arguments on tpu", op);
  tpu_tensor_t parts[2][2]; /* [part][out] */
  void* bufs[2][2] = {{NULL, NULL}, {NULL, NULL}};
  tpu_status_t st = TPU_OK;
  for (int p = 0; p < 2 && !st; p++)
    for (int o = 0; o < nouts && !st; o++) {
      const tpu_tensor_t* out = &c->outs[o];
      const tpu_dtype_t dt = tpu_dtype_is_complex(out->dtype) ? tpu_dtype_complex_part(out->dtype) : out->dtype;
      const int64_t n = tpu_tensor_numel(out);
      bufs[p][o] = malloc((size_t)(n > 0 ? n : 1) * tpu_dtype_size(dt));
      if (!bufs[p][o]) st = TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for %lld results", op, (long long)n);
      else tpu_tensor_make_contig(&parts[p][o], bufs[p][o], dt, out->ndim, out->sizes);
    }
  for (int p = 0; p < 2 && !st; p++) {
    tpu_arg_t args[8];
    memcpy(args, c->args, sizeof(tpu_arg_t) * (size_t)c->nargs);
    tpu_tensor_t pv = plane(in, p);
    args[0].v.t = &pv;
    tpu_call_t c2 = *c;
    c2.args = args;
    c2.outs = parts[p];
    c2.nouts = nouts;
    st = tpu_k_var(&c2);
  }
  if (!st) {
    const tpu_tensor_t* out = &c->outs[0];
    const int64_t n = tpu_tensor_numel(out);
    for (int64_t i = 0; i < n; i++) {
      char* po = tpu_tensor_elem_ptr(out, i);
      tpu_store_f64(po, out->dtype, tpu_tensor_get_f64(&parts[0][0], i) + tpu_tensor_get_f64(&parts[1][0], i));
      if (take_sqrt) tpu_store_f64(po, out->dtype, sqrt(tpu_load_f64(po, out->dtype)));
    }
    if (nouts > 1) {
      const tpu_tensor_t* mean = &c->outs[1];
      for (int64_t i = 0; i < tpu_tensor_numel(mean); i++)
        tpu_store_z(tpu_tensor_elem_ptr(mean, i), mean->dtype,
                    CMPLX(tpu_tensor_get_f64(&parts[0][1], i), tpu_tensor_get_f64(&parts[1][1], i)));
    }
  }
  for (int p = 0; p < 2; p++)
    for (int o = 0; o < 2; o++) free(bufs[p][o]);
  return st;
}

/* ---- linalg_cross(self, other, *, dim=-1) ---- */
/* component k of t along out's dim d: a view of size 1 there (t broadcasts
 * where its dim is missing or of size 1) */
static tpu_tensor_t component(const tpu_tensor_t* t, int nd, int d, int k) {
  tpu_tensor_t v = *t;
  const int td = d - (nd - t->ndim);
  if (td >= 0 && t->sizes[td] != 1) {
    v.sizes[td] = 1;
    v.data = (char*)t->data + (int64_t)k * t->strides[td] * (int64_t)tpu_dtype_size(t->dtype);
  }
  return v;
}

static tpu_status_t zcross(const tpu_call_t* c, const char* op) {
  const tpu_tensor_t *a = tpu_arg_tensor(c, 0), *b = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* out = &c->outs[0];
  const int nd = out->ndim;
  int64_t dim = tpu_arg_i64(c, 2, -1);
  if (dim < 0) dim += nd;
  TPU_CHECK_ARG(dim >= 0 && dim < nd && out->sizes[dim] == 3, "%s: dimension %lld does not have size 3",
                op, (long long)tpu_arg_i64(c, 2, -1));
  for (int k = 0; k < 3; k++) {
    const int k1 = (k + 1) % 3, k2 = (k + 2) % 3;
    tpu_tensor_t ok = component(out, nd, (int)dim, k);
    tpu_tensor_t v[4] = {component(a, nd, (int)dim, k1), component(b, nd, (int)dim, k2),
                         component(a, nd, (int)dim, k2), component(b, nd, (int)dim, k1)};
    const tpu_tensor_t* in[4] = {&v[0], &v[1], &v[2], &v[3]};
    TPU_RETURN_IF_ERROR(zmap(op, &ok, in, 4, b_cross, NULL));
  }
  return TPU_OK;
}

/* ---- linspace / logspace (start, end, steps[, base]) ---- */
/* As CPU: linspace steps from start (first half) or back from end in the
 * dtype's complex arithmetic (complex64: float); logspace takes base to
 * each point as std::pow(double, complex) does: polar(base^re, im ln base). */
static tpu_status_t zspaced(const tpu_call_t* c, const char* op, bool logspace) {
  const tpu_tensor_t* out = &c->outs[0];
  const int64_t steps = tpu_arg_i64(c, 2, 0);
  TPU_CHECK_ARG(steps >= 0, "%s: number of steps must be non-negative", op);
  TPU_CHECK_ARG(tpu_tensor_numel(out) == steps, "%s: expected an output of %lld elements", op,
                (long long)steps);
  const double base = logspace ? tpu_arg_f64(c, 3, 10.0) : 0;
  const bool single = out->dtype == TPU_C64;
#define R(x) (single ? (double)(float)(x) : (x))
  double s0[2] = {0, 0}, s[2], e[2] = {0, 0};
  (void)tpu_arg_complex(c, 0, s0);
  (void)tpu_arg_complex(c, 1, e);
  for (int k = 0; k < 2; k++) s[k] = R(s0[k]), e[k] = R(e[k]);
  double st[2] = {0, 0};
  if (steps > 1)
    for (int k = 0; k < 2; k++) {
      const double diff = R(e[k] - s[k]);
      /* logspace divides by complex(steps - 1): c10's scaled division */
      st[k] = logspace ? R(diff * R(1.0 / (double)R((double)(steps - 1))))
                       : R(diff / R((double)(steps - 1)));
    }
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; i++) {
    double v[2];
    for (int k = 0; k < 2; k++) {
      if (steps == 1) v[k] = logspace ? s0[k] : s[k]; /* CPU: pow(base, start) in double */
      else if (i < half) v[k] = R(s[k] + R(st[k] * R((double)i)));
      else v[k] = R(e[k] - R(st[k] * R((double)(steps - i - 1))));
    }
    zc_t z = CMPLX(v[0], v[1]);
    if (logspace)
      z = base > 0 ? pow(base, v[0]) * CMPLX(cos(v[1] * log(base)), sin(v[1] * log(base)))
                   : cpow(CMPLX(base, 0), z);
    tpu_store_z(tpu_tensor_elem_ptr(out, i), out->dtype, z);
  }
#undef R
  return TPU_OK;
}

/* ---- trace: the diagonal's sum in double complex ---- */
static tpu_status_t ztrace(const tpu_call_t* c, const char* op) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  TPU_CHECK_ARG(self && self->ndim == 2, "%s: expected a matrix, but got tensor with dim %d", op,
                self ? self->ndim : -1);
  const int64_t n = self->sizes[0] < self->sizes[1] ? self->sizes[0] : self->sizes[1];
  const int64_t step = (self->strides[0] + self->strides[1]) * (int64_t)tpu_dtype_size(self->dtype);
  zc_t acc = 0;
  for (int64_t i = 0; i < n; i++) acc += tpu_load_z((const char*)self->data + i * step, self->dtype);
  tpu_store_z(tpu_tensor_elem_ptr(&c->outs[0], 0), c->outs[0].dtype, acc);
  return TPU_OK;
}

/* ---- renorm's complex halves (margin.c computes the factors) ---- */
double* tpu_complex_stage_abs(const tpu_tensor_t* t) {
  const int64_t n = tpu_tensor_numel(t);
  double* m = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  if (!m) return NULL;
  tpu_tensor_t mt;
  tpu_tensor_make_contig(&mt, m, TPU_F64, t->ndim, t->sizes);
  zctx_t cx = {0, ZU_abs, false, 0};
  const tpu_tensor_t* ins[1] = {t};
  if (zmap("abs", &mt, ins, 1, b_unary, &cx)) {
    free(m);
    return NULL;
  }
  return m;
}

tpu_status_t tpu_complex_scale_slices(const tpu_tensor_t* out, const tpu_tensor_t* self, int dim,
                                      const double* factors) {
  tpu_tensor_t f;
  int64_t sizes[TPU_MAX_DIMS];
  for (int d = 0; d < self->ndim; d++) sizes[d] = d == dim ? self->sizes[d] : 1;
  tpu_tensor_make_contig(&f, (void*)factors, TPU_F64, self->ndim, sizes);
  const tpu_tensor_t* in[2] = {self, &f};
  return zmap("renorm", out, in, 2, b_mul, NULL);
}

/* ---- the dispatch ---- */
tpu_status_t tpu_complex_call(const tpu_call_t* c) {
  const tpu_op_id_t id = c->op ? c->op->id : TPU_OPID_NONE;
  const char* op = c->op ? c->op->name : "complex op";
  const tpu_tensor_t* out = c->nouts ? &c->outs[0] : NULL;
  tpu_tensor_t t0, t1, t2;
  zctx_t cx = {0, 0, out && out->dtype == TPU_C64, 0};
  const int u = unary_of(id);
  if (u >= 0) {
    cx.op = u;
    const tpu_tensor_t* in[1] = {tpu_arg_tensor(c, 0)};
    return zmap(op, out, in, 1, b_unary, &cx);
  }
  switch (id) {
    case TPU_OPID_add:
    case TPU_OPID_sub: {
      double al[2] = {1, 0};
      (void)tpu_arg_complex(c, 2, al);
      cx.s = CMPLX(al[0], al[1]) * (id == TPU_OPID_sub ? -1 : 1);
      const tpu_tensor_t* in[2] = {operand(c, 0, &t0), operand(c, 1, &t1)};
      return zmap(op, out, in, 2, b_add, &cx);
    }
    case TPU_OPID_rsub: { /* other - alpha * self */
      double al[2] = {1, 0};
      (void)tpu_arg_complex(c, 2, al);
      cx.s = -CMPLX(al[0], al[1]);
      const tpu_tensor_t* in[2] = {operand(c, 1, &t1), operand(c, 0, &t0)};
      return zmap(op, out, in, 2, b_add, &cx);
    }
    case TPU_OPID_mul:
    case TPU_OPID_div:
    case TPU_OPID_pow:
    case TPU_OPID_logaddexp: {
      if (id == TPU_OPID_div && c->nargs > 2 && c->args[2].kind == TPU_ARG_STRING)
        return TPU_ERR(UNIMPLEMENTED, "%s: rounding_mode is not supported for complex inputs", op);
      if (id == TPU_OPID_pow) cx.op = pow_special(c);
      const tpu_tensor_t* in[2] = {operand(c, 0, &t0), operand(c, 1, &t1)};
      return zmap(op, out, in, 2, id == TPU_OPID_mul ? b_mul : id == TPU_OPID_div ? b_div
                                  : id == TPU_OPID_pow ? b_pow : b_logaddexp, &cx);
    }
    case TPU_OPID_addcmul:
    case TPU_OPID_addcdiv: {
      double v[2] = {1, 0};
      (void)tpu_arg_complex(c, 3, v);
      cx.s = CMPLX(v[0], v[1]);
      const tpu_tensor_t* in[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
      return zmap(op, out, in, 3, id == TPU_OPID_addcmul ? b_addcmul : b_addcdiv, &cx);
    }
    case TPU_OPID_lerp: {
      double w[2] = {0, 0};
      cx.op = c->args[2].kind == TPU_ARG_TENSOR;
      if (!cx.op) (void)tpu_arg_complex(c, 2, w);
      cx.s = CMPLX(w[0], w[1]);
      const tpu_tensor_t* in[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
      return zmap(op, out, in, cx.op ? 3 : 2, b_lerp, &cx);
    }
    case TPU_OPID_cumsum:
    case TPU_OPID_cumprod:
    case TPU_OPID_logcumsumexp:
      return zscan(c, op, id);
    case TPU_OPID_var:
    case TPU_OPID_var_mean:
    case TPU_OPID_std:
    case TPU_OPID_std_mean:
      return zvar(c, id == TPU_OPID_std || id == TPU_OPID_std_mean);
    case TPU_OPID_linalg_cross:
      return zcross(c, op);
    case TPU_OPID_linspace:
    case TPU_OPID_logspace:
      return zspaced(c, op, id == TPU_OPID_logspace);
    case TPU_OPID_trace:
      return ztrace(c, op);
    case TPU_OPID_eq:
    case TPU_OPID_ne: {
      cx.op = id == TPU_OPID_ne;
      const tpu_tensor_t* in[2] = {operand(c, 0, &t0), operand(c, 1, &t1)};
      return zmap(op, out, in, 2, b_eq, &cx);
    }
    case TPU_OPID_complex:
    case TPU_OPID_polar: {
      const tpu_tensor_t* in[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
      return zmap(op, out, in, 2, id == TPU_OPID_complex ? b_complex : b_polar, &cx);
    }
    case TPU_OPID_where: {
      const tpu_tensor_t* in[3] = {tpu_arg_tensor(c, 0), operand(c, 1, &t1), operand(c, 2, &t2)};
      return zmap(op, out, in, 3, b_where, &cx);
    }
    case TPU_OPID_masked_fill: {
      const tpu_tensor_t* in[3] = {tpu_arg_tensor(c, 1), operand(c, 2, &t2), tpu_arg_tensor(c, 0)};
      return zmap(op, out, in, 3, b_where, &cx);
    }
    case TPU_OPID_fill:
    case TPU_OPID_zero: {
      double v[2] = {0, 0};
      if (id == TPU_OPID_fill) (void)tpu_arg_complex(c, 1, v);
      cx.s = CMPLX(v[0], v[1]);
      return zmap(op, out, NULL, 0, b_fill, &cx);
    }
    case TPU_OPID_copy: {
      const tpu_tensor_t* src = tpu_arg_tensor(c, 1);
      const tpu_tensor_t* in[1] = {src};
      if (src->ndim == out->ndim) {
        bool same = true;
        for (int d = 0; d < out->ndim; d++) same = same && src->sizes[d] == out->sizes[d];
        if (same) return tpu_complex_copy(out, src);
      }
      return zmap(op, out, in, 1, b_copy, &cx);
    }
    case TPU_OPID_normal:
    case TPU_OPID_uniform:
      return zrandom(c, id == TPU_OPID_normal);
    case TPU_OPID_dot:
    case TPU_OPID_vdot:
      return zdot(c, id == TPU_OPID_vdot);
    default:
      return TPU_ERR(UNIMPLEMENTED, "%s is not implemented for complex dtypes on tpu", op);
  }
}

/* complex(real, imag), polar(abs, angle), conj_physical(self) */
tpu_status_t tpu_k_complex(const tpu_call_t* c) { return tpu_complex_call(c); }
tpu_status_t tpu_k_polar(const tpu_call_t* c) { return tpu_complex_call(c); }
/* conj_physical of a real tensor is a copy */
tpu_status_t tpu_k_conj_physical(const tpu_call_t* c) {
  if (!tpu_call_has_complex(c)) return tpu_copy_strided(&c->outs[0], tpu_arg_tensor(c, 0));
  return tpu_complex_call(c);
}
