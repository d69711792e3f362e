/* The graph printer: a flushed graph as a StableHLO module (MLIR text in the
 * generic op syntax, which every StableHLO version parses).
 *
 *   module @tpu_graph attributes {tpu.custom_calls = [...]} {
 *     func.func @main(%arg0: tensor<2x8xf32> {tpu.buffer = "0x...", ...}, ...)
 *         -> (tensor<2x4xf32> {tpu.buffer = "0x..."}) { ... }
 *   }
 *
 * Values are buffers. The trace names memory, not values: an argument reads
 * whatever was last written where its view points. The printer keeps the
 * values it knows with their memory geometry (address, sizes, strides):
 *   - a read of exactly a known view uses that value;
 *   - a read of a view inside a known dense value derives it: flatten the
 *     value in memory order, reshape it to the view's stride chain, slice,
 *     transpose, broadcast (views such as t(), transpose, narrow, expand
 *     never become nodes, so this is how they reach the text);
 *   - a read of memory nothing in the graph wrote is a parameter;
 *   - a write into part of a known value updates that value
 *     (dynamic_update_slice) so later reads of the whole see it.
 * Results are the last values written to memory visible after the graph
 * (live buffers, or memory that existed before it).
 *
 * Each ATen op with a mapping expands into StableHLO ops (softmax, layer norm
 * and gelu into their arithmetic; matmuls into dot_general with the call's
 * precision); the mappings live in the per-family files of this layer
 * (lower/elementwise.c, shape.c, matmul.c, reduce.c, nn.c, index.c, linalg.c,
 * special.c), found
 * through lower/lower.c, and build their ops with the helpers this file
 * exports through lower/emit.h. Anything else becomes stablehlo.custom_call @aten.<name> with
 * the right types, and is listed in the module's tpu.custom_calls. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"
#include "lower/lower.h"

static bool lifting(const em_t* e); /* the printer lifts numbers (numbers as values, below) */





/* ---- printing helpers ---- */
static const char* elt_type(tpu_dtype_t dt) { return tpu_lower_elt_type(dt); }

const char* tpu_lower_elt_type(tpu_dtype_t dt) {
  switch ((int)dt) {
    case TPU_U16: return "ui16";
    case TPU_U32: return "ui32";
    case TPU_U64: return "ui64";
    case TPU_F8E5M2: return "f8E5M2";
    case TPU_F8E4M3FN: return "f8E4M3FN";
    case TPU_F8E5M2FNUZ: return "f8E5M2FNUZ";
    case TPU_F8E4M3FNUZ: return "f8E4M3FNUZ";
    case TPU_F8E8M0FNU: return "f8E8M0FNU";
    case TPU_F4E2M1FNX2: return "ui8"; /* two codes a byte, moved as bytes */
    case TPU_F32: return "f32";
    case TPU_F64: return "f64";
    case TPU_F16: return "f16";
    case TPU_BF16: return "bf16";
    case TPU_I64: return "i64";
    case TPU_I32: return "i32";
    case TPU_I16: return "i16";
    case TPU_I8: return "i8";
    case TPU_U8: return "ui8";
    case TPU_BOOL: return "i1";
    case TPU_C64: return "complex<f32>";
    case TPU_C128: return "complex<f64>";
    default: return "none";
  }
}

void ptype(FILE* f, const ref_t* r) {
  fputs("tensor<", f);
  for (int d = 0; d < r->nd; d++) fprintf(f, "%" PRId64 "x", r->sz[d]);
  fprintf(f, "%s>", elt_type(r->dt));
}

void pname(FILE* f, const ref_t* r) {
  if (r->id < 0) fprintf(f, "%%arg%d", -r->id - 1);
  else if (r->sub >= 0) fprintf(f, "%%%d#%d", r->id, r->sub);
  else fprintf(f, "%%%d", r->id);
}

/* "n0, n1, ..." (names) or "t0, t1, ..." (types) of n values */
void plist(FILE* f, int n, const ref_t* r, bool types) {
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    if (types) ptype(f, &r[i]);
    else pname(f, &r[i]);
  }
}

/* "a, b, c" of n int64 into buf */
const char* ints(char* buf, size_t cap, int n, const int64_t* v) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < n && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", v[i]);
  return buf;
}

/* "array<i64: a, b>" ("array<i64>" when empty) */
const char* i64arr(char* buf, size_t cap, int n, const int64_t* v) {
  char tmp[512];
  snprintf(buf, cap, n ? "array<i64: %s>" : "array<i64>", ints(tmp, sizeof tmp, n, v));
  return buf;
}

int64_t numel(const ref_t* r) {
  int64_t n = 1;
  for (int d = 0; d < r->nd; d++) n *= r->sz[d];
  return n;
}

ref_t mkref(tpu_dtype_t dt, int nd, const int64_t* sz) {
  ref_t r = {NO_REF, -1, dt, nd, {0}};
  if (nd && sz) memcpy(r.sz, sz, sizeof(int64_t) * (size_t)nd);
  return r;
}

static bool same_shape(const ref_t* a, int nd, const int64_t* sz) {
  return a->nd == nd && !memcmp(a->sz, sz, sizeof(int64_t) * (size_t)nd);
}

/* %N = "op"(ins) {attrs} : (types) -> result */
ref_t emit(em_t* e, const char* op, int n, const ref_t* in, ref_t res, const char* fmt, ...) {
  res.id = e->next++;
  res.sub = -1; /* a single result, whatever the template (a multi-result input) was */
  fprintf(e->f, "    %%%d = \"%s\"(", res.id, op);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", e->f);
    pname(e->f, &in[i]);
  }
  fputc(')', e->f);
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    fputs(" {", e->f);
    vfprintf(e->f, fmt, ap);
    fputc('}', e->f);
    va_end(ap);
  }
  fputs(" : (", e->f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", e->f);
    ptype(e->f, &in[i]);
  }
  fputs(") -> ", e->f);
  ptype(e->f, &res);
  fputc('\n', e->f);
  return res;
}

/* ---- constants and shape ops ---- */
static void float_literal(FILE* f, tpu_dtype_t dt, double v) {
  if (isfinite(v)) {
    fprintf(f, "%.17e", dt == TPU_F64 ? v : (double)(float)v);
    return;
  }
  /* MLIR takes non-finite floats as their bit patterns */
  const bool neg = signbit(v);
  switch (dt) {
    case TPU_F64: fputs(isnan(v) ? "0x7FF8000000000000" : neg ? "0xFFF0000000000000" : "0x7FF0000000000000", f); break;
    case TPU_F16: fputs(isnan(v) ? "0x7E00" : neg ? "0xFC00" : "0x7C00", f); break;
    case TPU_BF16: fputs(isnan(v) ? "0x7FC0" : neg ? "0xFF80" : "0x7F80", f); break;
    default: fputs(isnan(v) ? "0x7FC00000" : neg ? "0xFF800000" : "0x7F800000", f); break;
  }
}

/* Closes a constant whose value text is written: the dense attribute's
 * closing `close`, then its type and the result type. */
static ref_t end_constant(em_t* e, ref_t r, const char* close) {
  fprintf(e->f, "%s : ", close);
  ptype(e->f, &r);
  fputs("} : () -> ", e->f);
  ptype(e->f, &r);
  fputc('\n', e->f);
  return r;
}

ref_t cst(em_t* e, tpu_dtype_t dt, double v) {
  if (tpu_dtype_is_complex(dt)) return cst_complex(e, dt, v, 0);
  ref_t r = mkref(dt, 0, NULL);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<", r.id);
  if (dt == TPU_BOOL) fputs(v != 0 ? "true" : "false", e->f);
  else if (tpu_dtype_is_float(dt)) float_literal(e->f, dt, v);
  else if (v >= 9223372036854775807.0) fprintf(e->f, "%" PRId64, INT64_MAX); /* (int64_t)2^63 overflows */
  else fprintf(e->f, "%" PRId64, (int64_t)v);
  return end_constant(e, r, ">");
}

/* complex constant re + im i (dense<(re, im)>) of a complex dtype */
ref_t cst_complex(em_t* e, tpu_dtype_t dt, double re, double im) {
  const tpu_dtype_t part = tpu_dtype_complex_part(dt);
  ref_t r = mkref(dt, 0, NULL);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<(", r.id);
  float_literal(e->f, part, re);
  fputs(", ", e->f);
  float_literal(e->f, part, im);
  return end_constant(e, r, ")>");
}

ref_t reshape(em_t* e, ref_t a, int nd, const int64_t* sz) {
  if (same_shape(&a, nd, sz)) return a;
  return emit(e, "stablehlo.reshape", 1, &a, mkref(a.dt, nd, sz), NULL);
}

ref_t transpose(em_t* e, ref_t a, const int64_t* perm) {
  bool id = true;
  ref_t r = mkref(a.dt, a.nd, NULL);
  for (int d = 0; d < a.nd; d++) {
    r.sz[d] = a.sz[perm[d]];
    id &= perm[d] == d;
  }
  if (id) return a;
  char b[600];
  return emit(e, "stablehlo.transpose", 1, &a, r, "permutation = %s", i64arr(b, sizeof b, a.nd, perm));
}

/* operand dim i goes to result dim dims[i] */
ref_t bcast_dims(em_t* e, ref_t a, int nd, const int64_t* sz, const int64_t* dims) {
  if (same_shape(&a, nd, sz)) {
    bool id = true;
    for (int i = 0; i < a.nd; i++) id &= dims[i] == i;
    if (id) return a;
  }
  char b[600];
  return emit(e, "stablehlo.broadcast_in_dim", 1, &a, mkref(a.dt, nd, sz),
              "broadcast_dimensions = %s", i64arr(b, sizeof b, a.nd, dims));
}

/* NumPy broadcasting: trailing dims line up */
ref_t bcast(em_t* e, ref_t a, int nd, const int64_t* sz) {
  if (same_shape(&a, nd, sz)) return a;
  int64_t dims[TPU_MAX_DIMS];
  for (int i = 0; i < a.nd; i++) dims[i] = nd - a.nd + i;
  return bcast_dims(e, a, nd, sz, dims);
}

static ref_t bitcast(em_t* e, ref_t a, tpu_dtype_t dt) {
  return emit(e, "stablehlo.bitcast_convert", 1, &a, mkref(dt, a.nd, a.sz), NULL);
}

static ref_t u32_op(em_t* e, const char* op, ref_t a, uint32_t v) {
  return binop(e, op, a, cst_like(e, TPU_U32, (double)v, a.nd, a.sz));
}

/* float32 -> e8m0fnu with PyTorch's rule (tpu/float8.h): the exponent field,
 * one up when the mantissa's top bit is set and a lower bit or the exponent
 * field is nonzero; the sign ignored; NaN and infinities 0xff. A plain
 * convert would give NaN for zero and negative numbers. */
static ref_t f32_to_e8m0(em_t* e, ref_t x) {
  ref_t u = bitcast(e, x, TPU_U32);
  ref_t ex = u32_op(e, "stablehlo.and", u32_op(e, "stablehlo.shift_right_logical", u, 23), 0xff);
  ref_t zero = cst_like(e, TPU_U32, 0, x.nd, x.sz);
  ref_t top = compare(e, "NE", u32_op(e, "stablehlo.and", u, 0x400000u), zero);
  ref_t low = compare(e, "NE", u32_op(e, "stablehlo.and", u, 0x3fffffu), zero);
  ref_t up = binop(e, "stablehlo.and", top, binop(e, "stablehlo.or", low, compare(e, "NE", ex, zero)));
  ref_t code = binop(e, "stablehlo.add", ex, convert(e, up, TPU_U32));
  code = select3(e, compare(e, "EQ", ex, cst_like(e, TPU_U32, 0xff, x.nd, x.sz)), ex, code);
  return bitcast(e, convert(e, code, TPU_U8), TPU_F8E8M0FNU);
}

/* float32 -> a float8 format as PyTorch converts (tpu/float8.h): e4m3fn
 * saturates at +-448 (infinities too) where a plain convert gives NaN, and a
 * NaN keeps its sign in the formats that have signed NaNs. e8m0fnu above. */
static ref_t f32_to_f8(em_t* e, ref_t x, tpu_dtype_t dt) {
  if (dt == TPU_F8E8M0FNU) return f32_to_e8m0(e, x);
  ref_t v = x;
  if (dt == TPU_F8E4M3FN)
    v = select3(e, compare(e, "NE", x, x), x,
                emit(e, "stablehlo.clamp", 3,
                     (ref_t[]){cst_like(e, TPU_F32, -448.0, x.nd, x.sz), x,
                               cst_like(e, TPU_F32, 448.0, x.nd, x.sz)},
                     mkref(TPU_F32, x.nd, x.sz), NULL));
  ref_t r = emit(e, "stablehlo.convert", 1, &v, mkref(dt, x.nd, x.sz), NULL);
  if (dt != TPU_F8E4M3FN && dt != TPU_F8E5M2) return r; /* fnuz: one NaN, 0x80 */
  /* NaN: sign | 0x7f, as PyTorch (a convert's NaN need not keep the sign) */
  ref_t sign = u32_op(e, "stablehlo.shift_right_logical",
                      u32_op(e, "stablehlo.and", bitcast(e, x, TPU_U32), 0x80000000u), 24);
  ref_t nan = convert(e, u32_op(e, "stablehlo.or", sign, 0x7f), TPU_U8);
  /* chosen between the bytes: XLA's CPU backend computes a select on float8
   * in a wider float, whose NaN comes back unsigned */
  return bitcast(e, select3(e, compare(e, "NE", x, x), nan, bitcast(e, r, TPU_U8)), dt);
}

/* the narrow dtypes that convert as values (float4_x2 only moves) */
static bool is_f8(tpu_dtype_t dt) { return tpu_dtype_is_narrow(dt) && dt != TPU_F4E2M1FNX2; }

/* ---- complex values ---- */
ref_t re_part(em_t* e, ref_t a) {
  if (!tpu_dtype_is_complex(a.dt)) return a;
  return emit(e, "stablehlo.real", 1, &a, mkref(tpu_dtype_complex_part(a.dt), a.nd, a.sz), NULL);
}

ref_t im_part(em_t* e, ref_t a) {
  if (!tpu_dtype_is_complex(a.dt)) return cst_like(e, a.dt, 0, a.nd, a.sz);
  return emit(e, "stablehlo.imag", 1, &a, mkref(tpu_dtype_complex_part(a.dt), a.nd, a.sz), NULL);
}

ref_t make_complex(em_t* e, ref_t re, ref_t im) {
  ref_t in[2] = {re, im};
  return emit(e, "stablehlo.complex", 2, in, mkref(re.dt == TPU_F64 ? TPU_C128 : TPU_C64, re.nd, re.sz), NULL);
}

ref_t conj_of(em_t* e, ref_t a) {
  if (!tpu_dtype_is_complex(a.dt)) return a;
  return make_complex(e, re_part(e, a), unop(e, "stablehlo.negate", im_part(e, a)));
}

ref_t abs_of(em_t* e, ref_t a) {
  ref_t r = emit(e, "stablehlo.abs", 1, &a, mkref(tpu_dtype_complex_part(a.dt), a.nd, a.sz), NULL);
  if (!tpu_dtype_is_complex(a.dt)) return r;
  /* C's hypot, as PyTorch's std::abs: infinite when a part is, else NaN when
   * a part is (XLA's can drop a NaN part) */
  ref_t re = unop(e, "stablehlo.abs", re_part(e, a)), im = unop(e, "stablehlo.abs", im_part(e, a));
  ref_t inf = cst_like(e, r.dt, INFINITY, r.nd, r.sz);
  ref_t nan = binop(e, "stablehlo.or", compare(e, "NE", re, re), compare(e, "NE", im, im));
  ref_t any_inf = binop(e, "stablehlo.or", compare(e, "EQ", re, inf), compare(e, "EQ", im, inf));
  r = select3(e, nan, binop(e, "stablehlo.add", re, im), r);
  return select3(e, any_inf, inf, r);
}

ref_t convert(em_t* e, ref_t a, tpu_dtype_t dt) {
  if (a.dt == dt) return a;
  /* complex: through the parts (XLA converts neither complex -> real nor
   * between complex widths); complex -> real keeps the real part, real ->
   * complex has a zero imaginary part, as PyTorch */
  if (tpu_dtype_is_complex(dt)) {
    const tpu_dtype_t part = tpu_dtype_complex_part(dt);
    ref_t re = convert(e, re_part(e, a), part);
    return make_complex(e, re, tpu_dtype_is_complex(a.dt) ? convert(e, im_part(e, a), part)
                                                          : cst_like(e, part, 0, a.nd, a.sz));
  }
  if (tpu_dtype_is_complex(a.dt)) return convert(e, re_part(e, a), dt);
  if (is_f8(dt)) /* PyTorch converts through float32 */
    return f32_to_f8(e, convert(e, a, TPU_F32), dt);
  if (is_f8(a.dt) && !tpu_dtype_is_float(dt) && dt != TPU_F32) /* to integers through float32 */
    return convert(e, convert(e, a, TPU_F32), dt);
  /* floats to integers narrower than 64 bits as PyTorch CPU: truncated to
   * int64, then the low bits (300.0 -> uint8 44, -3.0 -> 253), where a plain
   * convert saturates */
  if (tpu_dtype_is_float(a.dt) && dt != TPU_BOOL && !tpu_dtype_is_float(dt) && dt != TPU_I64 &&
      dt != TPU_U64)
    return convert(e, convert(e, a, TPU_I64), dt);
  return emit(e, "stablehlo.convert", 1, &a, mkref(dt, a.nd, a.sz), NULL);
}

ref_t cst_like(em_t* e, tpu_dtype_t dt, double v, int nd, const int64_t* sz) {
  return bcast(e, cst(e, dt, v), nd, sz);
}

ref_t slice(em_t* e, ref_t a, const int64_t* start, const int64_t* limit) {
  ref_t r = mkref(a.dt, a.nd, NULL);
  bool full = true;
  int64_t ones[TPU_MAX_DIMS];
  for (int d = 0; d < a.nd; d++) {
    r.sz[d] = limit[d] - start[d];
    full &= start[d] == 0 && limit[d] == a.sz[d];
    ones[d] = 1;
  }
  if (full) return a;
  char b1[600], b2[600], b3[600];
  return emit(e, "stablehlo.slice", 1, &a, r,
              "start_indices = %s, limit_indices = %s, strides = %s", i64arr(b1, sizeof b1, a.nd, start),
              i64arr(b2, sizeof b2, a.nd, limit), i64arr(b3, sizeof b3, a.nd, ones));
}

ref_t binop(em_t* e, const char* op, ref_t a, ref_t b) {
  ref_t in[2] = {a, b};
  return emit(e, op, 2, in, mkref(a.dt, a.nd, a.sz), NULL);
}

ref_t unop(em_t* e, const char* op, ref_t a) { return emit(e, op, 1, &a, a, NULL); }

static const char* cmp_type(tpu_dtype_t dt) {
  if (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) return "FLOAT";
  return dt == TPU_U8 || dt == TPU_U16 || dt == TPU_U32 || dt == TPU_U64 || dt == TPU_BOOL
             ? "UNSIGNED"
             : "SIGNED";
}

ref_t compare(em_t* e, const char* dir, ref_t a, ref_t b) {
  ref_t in[2] = {a, b};
  return emit(e, "stablehlo.compare", 2, in, mkref(TPU_BOOL, a.nd, a.sz),
              "comparison_direction = #stablehlo<comparison_direction %s>, "
              "compare_type = #stablehlo<comparison_type %s>",
              dir, cmp_type(a.dt));
}

ref_t select3(em_t* e, ref_t p, ref_t a, ref_t b) {
  ref_t in[3] = {p, a, b};
  return emit(e, "stablehlo.select", 3, in, mkref(a.dt, a.nd, a.sz), NULL);
}

ref_t scalar_op(em_t* e, const char* op, ref_t a, double v) {
  /* a complex value times (over) a real number: each part, as PyTorch's
   * complex-by-real operators (a complex product would make inf * 0 = NaN) */
  if (tpu_dtype_is_complex(a.dt) && (!strcmp(op, "stablehlo.multiply") || !strcmp(op, "stablehlo.divide")))
    return make_complex(e, scalar_op(e, op, re_part(e, a), v), scalar_op(e, op, im_part(e, a), v));
  return binop(e, op, a, cst_like(e, a.dt, v, a.nd, a.sz));
}

/* Reduction over dims with a body op ("stablehlo.add", ...) and its identity. */
ref_t reduce(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init) {
  if (n == 0) return a;
  ref_t in[2] = {a, cst(e, a.dt, init)};
  ref_t r = mkref(a.dt, 0, NULL);
  for (int d = 0; d < a.nd; d++) {
    bool red = false;
    for (int k = 0; k < n; k++) red |= dims[k] == d;
    if (!red) r.sz[r.nd++] = a.sz[d];
  }
  r.id = e->next++;
  ref_t s = mkref(a.dt, 0, NULL);
  FILE* f = e->f;
  fprintf(f, "    %%%d = \"stablehlo.reduce\"(", r.id);
  pname(f, &in[0]);
  fputs(", ", f);
  pname(f, &in[1]);
  fprintf(f, ") ({\n    ^bb0(%%x%d: ", r.id);
  ptype(f, &s);
  fprintf(f, ", %%y%d: ", r.id);
  ptype(f, &s);
  fprintf(f, "):\n      %%z%d = \"%s\"(%%x%d, %%y%d) : (", r.id, body, r.id, r.id);
  ptype(f, &s);
  fputs(", ", f);
  ptype(f, &s);
  fputs(") -> ", f);
  ptype(f, &s);
  fprintf(f, "\n      \"stablehlo.return\"(%%z%d) : (", r.id);
  ptype(f, &s);
  char b[600];
  fprintf(f, ") -> ()\n    }) {dimensions = %s} : (", i64arr(b, sizeof b, n, dims));
  ptype(f, &in[0]);
  fputs(", ", f);
  ptype(f, &in[1]);
  fputs(") -> ", f);
  ptype(f, &r);
  fputc('\n', f);
  return r;
}

/* reduce, then put the reduced dims back as size 1 (for broadcasting) */
ref_t reduce_keep(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init) {
  ref_t r = reduce(e, a, n, dims, body, init);
  int64_t sz[TPU_MAX_DIMS];
  for (int d = 0; d < a.nd; d++) {
    sz[d] = a.sz[d];
    for (int k = 0; k < n; k++)
      if (dims[k] == d) sz[d] = 1;
  }
  return reshape(e, r, a.nd, sz);
}

/* A block argument of a region (printed %argN with N past any function
 * argument), scalar of dtype dt. */
ref_t block_arg(em_t* e, tpu_dtype_t dt) {
  ref_t r = mkref(dt, 0, NULL);
  r.id = -(1000000 + e->next++) - 1;
  return r;
}

static ref_t window_result(ref_t a, const window_t* w, tpu_dtype_t dt) {
  ref_t r = mkref(dt, a.nd, NULL);
  for (int d = 0; d < a.nd; d++) {
    int64_t span = w->dil[d] * (w->win[d] - 1) + 1, len = a.sz[d] + w->lo[d] + w->hi[d];
    r.sz[d] = len < span ? 0 : (len - span) / w->str[d] + 1;
  }
  return r;
}

/* reduce_window's attributes for w over nd dims, into buf. */
static const char* window_attrs(char* buf, size_t cap, int nd, const window_t* w) {
  char b1[300], b2[300], b3[300];
  size_t k = (size_t)snprintf(buf, cap, "{window_dimensions = %s, window_strides = %s, window_dilations = %s, padding = dense<[",
                              i64arr(b1, sizeof b1, nd, w->win), i64arr(b2, sizeof b2, nd, w->str),
                              i64arr(b3, sizeof b3, nd, w->dil));
  for (int d = 0; d < nd && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, "%s[%" PRId64 ", %" PRId64 "]", d ? ", " : "", w->lo[d], w->hi[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]> : tensor<%dx2xi64>}", nd);
  return buf;
}

/* A reduction with a region ("stablehlo.reduce" or "stablehlo.reduce_window")
 * over n operands with their inits; `body` prints the region's ops from block
 * arguments (n accumulators, then n new elements) and returns its n results.
 * res[i] holds result i's type on entry and its name on return. */
static void region_reduce(em_t* e, const char* op, int n, const ref_t* a, const ref_t* init,
                          window_body_t body, const char* attrs, ref_t* res) {
  FILE* f = e->f;
  ref_t acc[2], x[2], out[2];
  for (int i = 0; i < n; i++) {
    acc[i] = block_arg(e, a[i].dt);
    x[i] = block_arg(e, a[i].dt);
  }
  const int id = e->next++;
  fprintf(f, "    %%%d:%d = \"%s\"(", id, n, op);
  for (int i = 0; i < 2 * n; i++) {
    if (i) fputs(", ", f);
    pname(f, i < n ? &a[i] : &init[i - n]);
  }
  fputs(") ({\n    ^bb0(", f);
  for (int i = 0; i < 2 * n; i++) {
    const ref_t* r = i < n ? &acc[i] : &x[i - n];
    if (i) fputs(", ", f);
    pname(f, r);
    fputs(": ", f);
    ptype(f, r);
  }
  fputs("):\n", f);
  body(e, acc, x, out);
  fputs("      \"stablehlo.return\"(", f);
  plist(f, n, out, false);
  fputs(") : (", f);
  plist(f, n, out, true);
  fprintf(f, ") -> ()\n    }) %s : (", attrs);
  for (int i = 0; i < 2 * n; i++) {
    if (i) fputs(", ", f);
    ptype(f, i < n ? &a[i] : &init[i - n]);
  }
  fputs(") -> (", f);
  for (int i = 0; i < n; i++) {
    res[i].id = id;
    res[i].sub = i;
    if (i) fputs(", ", f);
    ptype(f, &res[i]);
  }
  fputs(")\n", f);
}

void reduce_window_n(em_t* e, int n, const ref_t* a, const ref_t* init, const window_t* w,
                            window_body_t body, ref_t* res) {
  char attrs[1200];
  for (int i = 0; i < n; i++) res[i] = window_result(a[i], w, a[i].dt);
  region_reduce(e, "stablehlo.reduce_window", n, a, init, body, window_attrs(attrs, sizeof attrs, a[0].nd, w), res);
}

void sum_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  out[0] = binop(e, "stablehlo.add", acc[0], x[0]);
}

/* (value, index) pairs: the greater (smaller with !mx) value wins, NaN above
 * all, the smaller index among equal values; among NaNs the larger index with
 * last_nan, else the smaller. A total order, so the result does not depend on
 * XLA's reduction order. argmax / argmin / max.dim / min.dim pick the first
 * NaN; PyTorch's CPU max pooling, the last. */
static void arg_extreme_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out, bool mx,
                             bool last_nan) {
  ref_t a_nan = compare(e, "NE", acc[0], acc[0]), b_nan = compare(e, "NE", x[0], x[0]);
  ref_t better = compare(e, mx ? "GT" : "LT", x[0], acc[0]), eq = compare(e, "EQ", x[0], acc[0]);
  ref_t ilt = compare(e, "LT", x[1], acc[1]);
  ref_t nan_order = last_nan ? compare(e, "GT", x[1], acc[1]) : ilt;
  ref_t plain = binop(e, "stablehlo.or", better, binop(e, "stablehlo.and", eq, ilt));
  ref_t yes = cst(e, TPU_BOOL, 1);
  ref_t take = select3(e, a_nan, binop(e, "stablehlo.and", b_nan, nan_order), select3(e, b_nan, yes, plain));
  out[0] = select3(e, take, x[0], acc[0]);
  out[1] = select3(e, take, x[1], acc[1]);
}
void argmax_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, true, false);
}
void argmin_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, false, false);
}
void max_pool_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, true, true);
}

/* stablehlo.reduce of two operands (values and indices) over dims. */
void reduce_pair(em_t* e, const ref_t* a, const ref_t* init, int nr, const int64_t* dims,
                        window_body_t body, ref_t* res) {
  for (int i = 0; i < 2; i++) {
    res[i] = mkref(a[i].dt, 0, NULL);
    for (int d = 0; d < a[i].nd; d++) {
      bool red = false;
      for (int k = 0; k < nr; k++) red |= dims[k] == d;
      if (!red) res[i].sz[res[i].nd++] = a[i].sz[d];
    }
  }
  char b[600], attrs[700];
  snprintf(attrs, sizeof attrs, "{dimensions = %s}", i64arr(b, sizeof b, nr, dims));
  region_reduce(e, "stablehlo.reduce", 2, a, init, body, attrs, res);
}

void prod_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  out[0] = binop(e, "stablehlo.multiply", acc[0], x[0]);
}

/* A 1-D int64 constant with the given values. */
ref_t cst_i64_list(em_t* e, int64_t n, const int64_t* v) {
  ref_t r = mkref(TPU_I64, 1, &n);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<[", r.id);
  for (int64_t i = 0; i < n; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", v[i]);
  return end_constant(e, r, "]>");
}

/* A 1-D float32 constant with the given values. */
ref_t cst_f32_list(em_t* e, int64_t n, const float* v) {
  ref_t r = mkref(TPU_F32, 1, &n);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<[", r.id);
  for (int64_t i = 0; i < n; i++) {
    if (i) fputs(", ", e->f);
    float_literal(e->f, TPU_F32, v[i]);
  }
  return end_constant(e, r, "]>");
}

/* x's slices along dim at the positions of the 1-D int index idx. */
ref_t take_along(em_t* e, ref_t x, int dim, ref_t idx) {
  int64_t offs[TPU_MAX_DIMS] = {0}, ssz[TPU_MAX_DIMS] = {0};
  int no = 0;
  ref_t r = x;
  for (int d = 0; d < x.nd; d++) {
    if (d != dim) offs[no++] = d;
    ssz[d] = d == dim ? 1 : x.sz[d];
  }
  r.sz[dim] = idx.sz[0];
  ref_t in[2] = {x, idx};
  char b1[256], b2[256];
  return emit(e, "stablehlo.gather", 2, in, r,
              "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%d], "
              "start_index_map = [%d], index_vector_dim = 1>, slice_sizes = %s, "
              "indices_are_sorted = false",
              ints(b1, sizeof b1, no, offs), dim, dim, i64arr(b2, sizeof b2, x.nd, ssz));
}

/* Full coordinates of the elements of an index tensor idx (nd dims) used
 * along dim: [idx.shape..., nd], coordinate d the element's own position for
 * d != dim and its index value for dim (gather / scatter along a dim). */
ref_t dim_coords(em_t* e, ref_t idx, int dim) {
  const int nd = idx.nd;
  int64_t isz[TPU_MAX_DIMS + 1], csz[TPU_MAX_DIMS + 1];
  memcpy(isz, idx.sz, sizeof(int64_t) * (size_t)nd);
  memcpy(csz, idx.sz, sizeof(int64_t) * (size_t)nd);
  isz[nd] = 1;
  csz[nd] = nd;
  ref_t parts[TPU_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    ref_t p = d == dim ? idx
                       : emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, idx.sz), "iota_dimension = %d : i64", d);
    parts[d] = reshape(e, p, nd + 1, isz);
  }
  return nd == 1 ? parts[0]
                 : emit(e, "stablehlo.concatenate", nd, parts, mkref(TPU_I64, nd + 1, csz), "dimension = %d : i64", nd);
}

/* The inclusive running sum (or product) of a along dim: a window over
 * everything before. */
void prefix_window(const ref_t* a, int dim, window_t* w) {
  for (int d = 0; d < a->nd; d++) {
    w->win[d] = w->str[d] = w->dil[d] = 1;
    w->lo[d] = w->hi[d] = 0;
  }
  w->win[dim] = a->sz[dim];
  w->lo[dim] = a->sz[dim] - 1;
}

ref_t scan_dim(em_t* e, ref_t a, int dim, bool sum) {
  window_t w;
  prefix_window(&a, dim, &w);
  ref_t init = cst(e, a.dt, sum ? 0 : 1), r;
  reduce_window_n(e, 1, &a, &init, &w, sum ? sum_body : prod_body, &r);
  return r;
}

/* x rolled by `shift` along dim: its last shift slices first. */
ref_t roll_dim(em_t* e, ref_t x, int dim, int64_t shift) {
  const int64_t len = x.sz[dim];
  if (len == 0) return x;
  shift = ((shift % len) + len) % len;
  if (shift == 0) return x;
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
  memcpy(hi, x.sz, sizeof(int64_t) * (size_t)x.nd);
  lo[dim] = len - shift;
  ref_t tail = slice(e, x, lo, hi);
  lo[dim] = 0;
  hi[dim] = len - shift;
  ref_t head = slice(e, x, lo, hi);
  ref_t in[2] = {tail, head};
  return emit(e, "stablehlo.concatenate", 2, in, x, "dimension = %d : i64", dim);
}

/* stablehlo.sort of x with its indices along dim (stable): ascending puts
 * NaN last, descending first, as PyTorch orders them. */
void sort_with_indices(em_t* e, ref_t x, int dim, bool descending, ref_t* res) {
  FILE* f = e->f;
  ref_t idx = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, x.nd, x.sz), "iota_dimension = %d : i64", dim);
  ref_t a = block_arg(e, x.dt), b = block_arg(e, x.dt), ia = block_arg(e, TPU_I64), ib = block_arg(e, TPU_I64);
  const int id = e->next++;
  fprintf(f, "    %%%d:2 = \"stablehlo.sort\"(", id);
  pname(f, &x);
  fputs(", ", f);
  pname(f, &idx);
  fputs(") ({\n    ^bb0(", f);
  const ref_t* bargs[4] = {&a, &b, &ia, &ib};
  for (int i = 0; i < 4; i++) {
    if (i) fputs(", ", f);
    pname(f, bargs[i]);
    fputs(": ", f);
    ptype(f, bargs[i]);
  }
  fputs("):\n", f);
  ref_t before;
  if (tpu_dtype_is_float(x.dt)) {
    ref_t a_nan = compare(e, "NE", a, a), b_nan = compare(e, "NE", b, b);
    ref_t no = cst(e, TPU_BOOL, 0), yes = cst(e, TPU_BOOL, 1);
    ref_t plain = compare(e, descending ? "GT" : "LT", a, b);
    /* ascending: a first if a < b, or b is NaN and a is not; descending: a
     * first if a > b, or a is NaN and b is not */
    before = descending ? select3(e, a_nan, select3(e, b_nan, no, yes), plain)
                        : select3(e, b_nan, select3(e, a_nan, no, yes), plain);
  } else {
    before = compare(e, descending ? "GT" : "LT", a, b);
  }
  fputs("      \"stablehlo.return\"(", f);
  pname(f, &before);
  fputs(") : (tensor<i1>) -> ()\n    }) ", f);
  fprintf(f, "{dimension = %d : i64, is_stable = true} : (", dim);
  ptype(f, &x);
  fputs(", ", f);
  ptype(f, &idx);
  fputs(") -> (", f);
  res[0] = x;
  res[1] = idx;
  ptype(f, &res[0]);
  fputs(", ", f);
  ptype(f, &res[1]);
  fputs(")\n", f);
  for (int i = 0; i < 2; i++) {
    res[i].id = id;
    res[i].sub = i;
  }
}

/* ---- stablehlo.while (declared in lower/emit.h) ---- */
static void region_args(em_t* e, int n, const ref_t* init, ref_t* args) {
  for (int i = 0; i < n; i++) {
    args[i] = block_arg(e, init[i].dt);
    args[i].nd = init[i].nd;
    memcpy(args[i].sz, init[i].sz, sizeof init[i].sz);
    if (i) fputs(", ", e->f);
    pname(e->f, &args[i]);
    fputs(": ", e->f);
    ptype(e->f, &args[i]);
  }
}

#define LOOP_MAX 12
void while_loop(em_t* e, int n, ref_t* vals, loop_cond_t cond, loop_body_t body, void* ctx) {
  FILE* f = e->f;
  ref_t args[LOOP_MAX], next[LOOP_MAX];
  const int id = e->next++;
  fprintf(f, "    %%%d:%d = \"stablehlo.while\"(", id, n);
  plist(f, n, vals, false);
  fputs(") ({\n    ^bb0(", f);
  region_args(e, n, vals, args);
  fputs("):\n", f);
  ref_t c = cond(e, args, ctx);
  fputs("      \"stablehlo.return\"(", f);
  pname(f, &c);
  fputs(") : (tensor<i1>) -> ()\n    }, {\n    ^bb0(", f);
  region_args(e, n, vals, args);
  fputs("):\n", f);
  body(e, args, next, ctx);
  fputs("      \"stablehlo.return\"(", f);
  plist(f, n, next, false);
  fputs(") : (", f);
  plist(f, n, next, true);
  fputs(") -> ()\n    }) : (", f);
  plist(f, n, vals, true);
  fputs(") -> (", f);
  plist(f, n, vals, true);
  fputs(")\n", f);
  for (int i = 0; i < n; i++) {
    vals[i].id = id;
    vals[i].sub = i;
  }
}

/* any element of a boolean tensor */
ref_t any_of(em_t* e, ref_t b) {
  int64_t dims[TPU_MAX_DIMS];
  for (int d = 0; d < b.nd; d++) dims[d] = d;
  return reduce(e, b, b.nd, dims, "stablehlo.or", 0);
}

/* The pooling window of a [.., H, W]-like input from PyTorch's arguments:
 * kernel (args[ik]), stride (args[is], empty = kernel), padding, dilation
 * (ids < 0: none) over the last k dims, plus ceil mode's extra high padding
 * so that the window count is the output's. */
void pool_window(const tpu_call_t* c, int k, int ik, int is, int ip, int idl,
                        const tpu_tensor_t* out, window_t* w) {
  const tpu_tensor_t* x = c->args[0].v.t;
  for (int d = 0; d < x->ndim; d++) {
    w->win[d] = w->str[d] = w->dil[d] = 1;
    w->lo[d] = w->hi[d] = 0;
  }
  for (int j = 0; j < k; j++) {
    int d = x->ndim - k + j;
    const tpu_arg_t* ka = &c->args[ik];
    w->win[d] = ka->v.ilist[ka->n == 1 ? 0 : j];
    const tpu_arg_t* sa = &c->args[is];
    w->str[d] = sa->n ? sa->v.ilist[sa->n == 1 ? 0 : j] : w->win[d];
    if (ip >= 0 && c->args[ip].kind == TPU_ARG_INTLIST && c->args[ip].n)
      w->lo[d] = w->hi[d] = c->args[ip].v.ilist[c->args[ip].n == 1 ? 0 : j];
    if (idl >= 0 && c->args[idl].kind == TPU_ARG_INTLIST && c->args[idl].n)
      w->dil[d] = c->args[idl].v.ilist[c->args[idl].n == 1 ? 0 : j];
    /* ceil mode: pad high so that the last window the output has fits */
    int64_t need = (out->sizes[d] - 1) * w->str[d] + w->dil[d] * (w->win[d] - 1) + 1;
    int64_t have = x->sizes[d] + w->lo[d] + w->hi[d];
    if (need > have) w->hi[d] += need - have;
  }
}

/* Over dims (cnt elements per result): the mean, kept with size-1 dims; the
 * centred values a - mean; returns their sum of squares, kept likewise
 * (layer / group / batch norm, var and std divide it as they need). */
ref_t centred_sum_squares(em_t* e, ref_t a, int nr, const int64_t* dims, double cnt,
                                 ref_t* mean, ref_t* xc) {
  *mean = scalar_op(e, "stablehlo.divide", reduce_keep(e, a, nr, dims, "stablehlo.add", 0), cnt);
  *xc = binop(e, "stablehlo.subtract", a, bcast(e, *mean, a.nd, a.sz));
  if (tpu_dtype_is_complex(a.dt)) { /* |xc|^2, a real sum */
    ref_t re = re_part(e, *xc), im = im_part(e, *xc);
    return reduce_keep(e, binop(e, "stablehlo.add", binop(e, "stablehlo.multiply", re, re),
                                binop(e, "stablehlo.multiply", im, im)),
                       nr, dims, "stablehlo.add", 0);
  }
  return reduce_keep(e, binop(e, "stablehlo.multiply", *xc, *xc), nr, dims, "stablehlo.add", 0);
}

ref_t dot_general(em_t* e, ref_t a, ref_t b, int nbatch, int ca, int cb, ref_t res,
                         tpu_precision_t p) {
  /* complex64 follows the float32 mode, as the host's four real products do */
  const char* prec = tpu_dtype_complex_part(a.dt) != TPU_F32 || p == TPU_PRECISION_MEDIUM ? "DEFAULT"
                     : p == TPU_PRECISION_HIGH                     ? "HIGH"
                                                                   : "HIGHEST";
  char batch[320] = "";
  if (nbatch) {
    int64_t bd[TPU_MAX_DIMS];
    for (int i = 0; i < nbatch; i++) bd[i] = i;
    char l[96];
    ints(l, sizeof l, nbatch, bd);
    snprintf(batch, sizeof batch, "lhs_batching_dimensions = [%s], rhs_batching_dimensions = [%s], ", l, l);
  }
  ref_t in[2] = {a, b};
  return emit(e, "stablehlo.dot_general", 2, in, res,
              "dot_dimension_numbers = #stablehlo.dot<%slhs_contracting_dimensions = [%d], "
              "rhs_contracting_dimensions = [%d]>, precision_config = [#stablehlo<precision %s>, "
              "#stablehlo<precision %s>]",
              batch, ca, cb, prec, prec);
}

/* ---- values: buffers and views ---- */
static void geom_range(const tpu_tensor_t* t, uintptr_t* lo, uintptr_t* hi) {
  int64_t n = tpu_tensor_numel(t);
  if (!n) {
    *lo = *hi = (uintptr_t)t->data;
    return;
  }
  int64_t span = 0;
  for (int d = 0; d < t->ndim; d++) span += (t->sizes[d] - 1) * t->strides[d];
  size_t es = tpu_dtype_size(t->dtype);
  *lo = (uintptr_t)t->data;
  *hi = *lo + (uintptr_t)(span + 1) * es;
}

static int val_push(em_t* e, ref_t r, const tpu_tensor_t* t) {
  if (e->nv == e->cv) {
    int cap = e->cv ? 2 * e->cv : 64;
    val_t* v = realloc(e->v, sizeof(val_t) * (size_t)cap);
    if (!v) {
      e->oom = true;
      return -1;
    }
    e->v = v;
    e->cv = cap;
  }
  val_t* v = &e->v[e->nv];
  memset(v, 0, sizeof *v);
  v->r = r;
  v->data = t->data;
  if (t->ndim) memcpy(v->st, t->strides, sizeof(int64_t) * (size_t)t->ndim);
  geom_range(t, &v->lo, &v->hi);
  return e->nv++;
}

/* the geometry of a value as a tensor descriptor */
static tpu_tensor_t val_tensor(const val_t* v) {
  tpu_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = (void*)v->data;
  t.dtype = v->r.dt;
  t.ndim = v->r.nd;
  memcpy(t.sizes, v->r.sz, sizeof(int64_t) * (size_t)v->r.nd);
  memcpy(t.strides, v->st, sizeof(int64_t) * (size_t)v->r.nd);
  return t;
}

/* same view: strides of size-1 dims do not matter */
static bool same_view(const val_t* v, const tpu_tensor_t* t) {
  if (v->data != t->data || v->r.dt != t->dtype || !same_shape(&v->r, t->ndim, t->sizes)) return false;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] != v->st[d]) return false;
  return true;
}

/* The dims of t that address memory (size > 1, stride != 0), ordered by
 * decreasing stride; false when two of them share a stride (overlap). */
static bool real_dims(const tpu_tensor_t* t, int* order, int* m) {
  *m = 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] != 0) order[(*m)++] = d;
  for (int i = 1; i < *m; i++) /* insertion sort, stable */
    for (int j = i; j > 0 && t->strides[order[j]] > t->strides[order[j - 1]]; j--) {
      int x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  for (int i = 1; i < *m; i++)
    if (t->strides[order[i]] == t->strides[order[i - 1]] || t->strides[order[i]] < 0) return false;
  return true;
}

/* dense: the real dims tile memory without gaps in their stride order */
static bool is_dense(const tpu_tensor_t* t, const int* order, int m) {
  int64_t expect = 1;
  for (int i = m - 1; i >= 0; i--) {
    if (t->strides[order[i]] != expect) return false;
    expect *= t->sizes[order[i]];
  }
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] == 0) return false;
  return true;
}

/* How view t sits inside the flat memory (N elements) of a dense value:
 * reshape the flat memory to R, slice [c, c + s) (one element of the last
 * dim), then the sliced dims are t's real dims in stride order. */
typedef struct {
  int m; /* real dims of t */
  int order[TPU_MAX_DIMS];
  int nr; /* dims of R: m, or m + 1 when the innermost stride is not 1 */
  int64_t R[TPU_MAX_DIMS + 1], c[TPU_MAX_DIMS + 1], s[TPU_MAX_DIMS + 1];
} placement_t;

static bool place(const tpu_tensor_t* t, int64_t off, int64_t N, placement_t* p) {
  if (!real_dims(t, p->order, &p->m)) return false;
  const int m = p->m;
  if (m == 0) { /* one element */
    p->nr = 1;
    p->R[0] = N;
    p->c[0] = off;
    p->s[0] = 1;
    return off >= 0 && off < N;
  }
  const int64_t* st = t->strides;
  if (N % st[p->order[0]]) return false;
  int64_t rem = off;
  for (int i = 0; i < m; i++) {
    const int64_t stride = st[p->order[i]];
    p->R[i] = i == 0 ? N / stride : st[p->order[i - 1]] / stride;
    if (i > 0 && st[p->order[i - 1]] % stride) return false;
    p->c[i] = rem / stride;
    rem %= stride;
    p->s[i] = t->sizes[p->order[i]];
    if (p->c[i] + p->s[i] > p->R[i]) return false;
  }
  const int64_t inner = st[p->order[m - 1]];
  p->nr = m;
  if (inner != 1) {
    if (m == TPU_MAX_DIMS) return false; /* no room for the element dim */
    p->R[m] = inner;
    p->c[m] = rem;
    p->s[m] = 1;
    p->nr = m + 1;
  }
  return true;
}

/* Position among t's size>1 dims (in dim order) of each real dim in stride
 * order; true when that is the identity (memory order = dim order). */
static bool mem_perm(const tpu_tensor_t* t, const int* order, int m, int64_t* perm) {
  bool id = true;
  for (int i = 0; i < m; i++) {
    int pos = 0;
    for (int d = 0; d < order[i]; d++) pos += t->sizes[d] > 1;
    perm[i] = pos;
    id &= pos == i;
  }
  return id;
}

/* A dense value's elements in memory order, reshaped to (nd, sz). */
static ref_t memory_order(em_t* e, const val_t* v, int nd, const int64_t* sz) {
  tpu_tensor_t t = val_tensor(v);
  int order[TPU_MAX_DIMS], m;
  real_dims(&t, order, &m);
  int64_t perm[TPU_MAX_DIMS];
  if (mem_perm(&t, order, m, perm)) return reshape(e, v->r, nd, sz);
  int64_t rs[TPU_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < t.ndim; d++)
    if (t.sizes[d] > 1) rs[k++] = t.sizes[d];
  ref_t a = transpose(e, reshape(e, v->r, k, rs), perm);
  return reshape(e, a, nd, sz);
}

/* inverse of memory_order: elements in memory order back to v's shape */
static ref_t unflatten(em_t* e, ref_t flat, const val_t* v) {
  tpu_tensor_t t = val_tensor(v);
  int order[TPU_MAX_DIMS], m;
  real_dims(&t, order, &m);
  int64_t mem[TPU_MAX_DIMS], perm[TPU_MAX_DIMS], inv[TPU_MAX_DIMS];
  if (mem_perm(&t, order, m, perm)) return reshape(e, flat, v->r.nd, v->r.sz);
  for (int i = 0; i < m; i++) mem[i] = t.sizes[order[i]];
  ref_t a = reshape(e, flat, m, mem);
  for (int i = 0; i < m; i++) inv[perm[i]] = i;
  a = transpose(e, a, inv);
  return reshape(e, a, v->r.nd, v->r.sz);
}

static bool val_dense(const val_t* v) {
  tpu_tensor_t t = val_tensor(v);
  int order[TPU_MAX_DIMS], m;
  return real_dims(&t, order, &m) && is_dense(&t, order, m);
}

/* view t of dense value v; r.id == NO_REF when it cannot be expressed */
static ref_t derive(em_t* e, const val_t* v, const tpu_tensor_t* t) {
  ref_t bad = mkref(t->dtype, 0, NULL);
  const size_t es = tpu_dtype_size(t->dtype);
  if (!val_dense(v) || ((const char*)t->data - v->data) % (ptrdiff_t)es) return bad;
  int64_t off = ((const char*)t->data - v->data) / (ptrdiff_t)es;
  placement_t p;
  if (!place(t, off, numel(&v->r), &p)) return bad;
  ref_t a = memory_order(e, v, p.nr, p.R);
  int64_t lim[TPU_MAX_DIMS + 1];
  for (int i = 0; i < p.nr; i++) lim[i] = p.c[i] + p.s[i];
  a = slice(e, a, p.c, lim);
  int64_t sz[TPU_MAX_DIMS], perm[TPU_MAX_DIMS], dims[TPU_MAX_DIMS];
  for (int i = 0; i < p.m; i++) sz[i] = p.s[i];
  a = reshape(e, a, p.m, sz);
  /* stride order -> t's dim order */
  int k = 0;
  for (int d = 0; d < t->ndim; d++)
    for (int i = 0; i < p.m; i++)
      if (p.order[i] == d) {
        perm[k] = i;
        dims[k++] = d;
      }
  a = transpose(e, a, perm);
  return bcast_dims(e, a, t->ndim, t->sizes, dims);
}

/* v with view t replaced by w (t inside v); NO_REF when not expressible */
static ref_t update(em_t* e, const val_t* v, const tpu_tensor_t* t, ref_t w) {
  ref_t bad = mkref(v->r.dt, 0, NULL);
  const size_t es = tpu_dtype_size(t->dtype);
  if (!val_dense(v) || ((const char*)t->data - v->data) % (ptrdiff_t)es) return bad;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] == 0) return bad;
  int64_t off = ((const char*)t->data - v->data) / (ptrdiff_t)es;
  placement_t p;
  if (!place(t, off, numel(&v->r), &p)) return bad;
  int64_t sz[TPU_MAX_DIMS], perm[TPU_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1) sz[k++] = t->sizes[d];
  w = reshape(e, w, k, sz); /* t's real dims in dim order */
  for (int i = 0; i < p.m; i++) {
    int pos = 0;
    for (int d = 0; d < p.order[i]; d++) pos += t->sizes[d] > 1;
    perm[i] = pos;
  }
  w = transpose(e, w, perm); /* stride order */
  w = reshape(e, w, p.nr, p.s);
  ref_t base = memory_order(e, v, p.nr, p.R);
  ref_t in[2 + TPU_MAX_DIMS];
  in[0] = base;
  in[1] = w;
  for (int i = 0; i < p.nr; i++) in[2 + i] = cst(e, TPU_I64, (double)p.c[i]);
  ref_t u = emit(e, "stablehlo.dynamic_update_slice", 2 + p.nr, in, base, NULL);
  return unflatten(e, u, v);
}

static void note_custom(em_t* e, const char* target) {
  for (int i = 0; i < e->ncc; i++)
    if (!strcmp(e->cc[i], target)) return;
  if (e->ncc == e->ccc) {
    int cap = e->ccc ? 2 * e->ccc : 16;
    char** cc = realloc(e->cc, sizeof(char*) * (size_t)cap);
    if (!cc) {
      e->oom = true;
      return;
    }
    e->cc = cc;
    e->ccc = cap;
  }
  e->cc[e->ncc] = strdup(target);
  if (e->cc[e->ncc]) e->ncc++;
}

static ref_t new_param(em_t* e, const tpu_tensor_t* t) {
  if (e->np == e->cp) {
    int cap = e->cp ? 2 * e->cp : 16;
    int* p = realloc(e->params, sizeof(int) * (size_t)cap);
    if (!p) {
      e->oom = true;
      return mkref(t->dtype, t->ndim, t->sizes);
    }
    e->params = p;
    e->cp = cap;
  }
  ref_t r = mkref(t->dtype, t->ndim, t->sizes);
  r.id = -(e->np + 1);
  int k = val_push(e, r, t);
  if (k >= 0) e->params[e->np++] = k;
  return r;
}

/* The parameter a read of t (nothing in the graph wrote it) comes from: t
 * without its broadcast dims, in memory order when it is dense. */
static ref_t param_for(em_t* e, const tpu_tensor_t* t) {
  tpu_tensor_t p = *t;
  p.ndim = 0;
  for (int d = 0; d < t->ndim; d++)
    if (!(t->sizes[d] > 1 && t->strides[d] == 0)) {
      p.sizes[p.ndim] = t->sizes[d];
      p.strides[p.ndim++] = t->strides[d];
    }
  int order[TPU_MAX_DIMS], m;
  if (tpu_tensor_numel(t) == 0) return new_param(e, t); /* nothing to put in memory order */
  if (real_dims(&p, order, &m) && is_dense(&p, order, m)) {
    bool in_order = true;
    for (int i = 1; i < m; i++) in_order &= order[i] > order[i - 1];
    if (!in_order) { /* a permuted dense view: the parameter in memory order */
      int64_t s = 1;
      for (int i = m - 1; i >= 0; i--) {
        p.sizes[i] = t->sizes[order[i]];
        p.strides[i] = s;
        s *= p.sizes[i];
      }
      p.ndim = m;
    }
  }
  return new_param(e, &p);
}

static bool overlaps(const val_t* v, uintptr_t lo, uintptr_t hi) { return v->lo < hi && lo < v->hi; }

static bool same_geometry(const tpu_tensor_t* a, const tpu_tensor_t* b) {
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d])) return false;
  return true;
}

/* whether access t (a write when `write`) after the write w is one the value
 * model carries: disjoint, the same view, inside w, or a read or dense write
 * holding all of w */
static bool access_is_exact(const tpu_tensor_t* t, bool write, const tpu_tensor_t* w) {
  uintptr_t lo, hi, wlo, whi;
  geom_range(t, &lo, &hi);
  geom_range(w, &wlo, &whi);
  if (!(lo < whi && wlo < hi) || same_geometry(t, w)) return true;
  if (t->dtype != w->dtype) return true; /* a retyped read: read_retyped */
  if (wlo <= lo && hi <= whi) return true;
  return lo <= wlo && whi <= hi && (!write || tpu_tensor_is_contiguous(t));
}

bool tpu_lower_graph_is_exact(const tpu_graph_t* g) {
  for (int i = 1; i < g->n; i++) {
    const tpu_call_t* c = g->nodes[i];
    for (int j = 0; j < i; j++) {
      const tpu_call_t* p = g->nodes[j];
      for (int k = 0; k < p->nouts; k++) {
        const tpu_tensor_t* w = &p->outs[k];
        for (int a = 0; a < c->nargs; a++)
          if (c->args[a].kind == TPU_ARG_TENSOR &&
              !access_is_exact(c->args[a].v.t, a < 64 && (c->mutated_args >> a & 1), w))
            return false;
        for (int o = 0; o < c->nouts; o++)
          if (!access_is_exact(&c->outs[o], true, w)) return false;
      }
    }
  }
  return true;
}

/* The n elements of 1-D `flat` (a value's memory in order) as elements of dt,
 * the same bytes: a complex value as its (real, imag) pairs, widths changed
 * by bitcast_convert. NO_REF for booleans (no bit pattern to reinterpret) or
 * bytes that dt's elements do not divide. */
static ref_t reinterpret_flat(em_t* e, ref_t flat, tpu_dtype_t dt) {
  const int64_t n = flat.sz[0];
  ref_t bad = mkref(dt, 0, NULL);
  if (flat.dt == dt) return flat;
  if (flat.dt == TPU_BOOL || dt == TPU_BOOL) return bad;
  if (tpu_dtype_is_complex(flat.dt)) { /* the parts, interleaved */
    const int64_t one[2] = {n, 1}, two[2] = {n, 2}, m = 2 * n;
    ref_t in[2] = {reshape(e, re_part(e, flat), 2, one), reshape(e, im_part(e, flat), 2, one)};
    ref_t pairs = emit(e, "stablehlo.concatenate", 2, in, mkref(in[0].dt, 2, two), "dimension = 1 : i64");
    return reinterpret_flat(e, reshape(e, pairs, 1, &m), dt);
  }
  if (tpu_dtype_is_complex(dt)) { /* pairs of the part type combined */
    ref_t p = reinterpret_flat(e, flat, tpu_dtype_complex_part(dt));
    if (p.id == NO_REF || p.sz[0] % 2) return bad;
    const int64_t two[2] = {p.sz[0] / 2, 2};
    p = reshape(e, p, 2, two);
    ref_t part[2];
    for (int k = 0; k < 2; k++)
      part[k] = reshape(e, slice(e, p, (int64_t[]){0, k}, (int64_t[]){two[0], k + 1}), 1, two);
    return make_complex(e, part[0], part[1]);
  }
  const int64_t sa = (int64_t)tpu_dtype_size(flat.dt), sb = (int64_t)tpu_dtype_size(dt);
  if ((n * sa) % sb) return bad;
  const int64_t m = n * sa / sb;
  if (sa == sb) return bitcast(e, flat, dt);
  if (sa > sb) /* each element into sa / sb narrower ones */
    return reshape(e, emit(e, "stablehlo.bitcast_convert", 1, &flat, mkref(dt, 2, (int64_t[]){n, sa / sb}), NULL), 1, &m);
  ref_t groups = reshape(e, flat, 2, (int64_t[]){m, sb / sa});
  return emit(e, "stablehlo.bitcast_convert", 1, &groups, mkref(dt, 1, &m), NULL);
}

/* View t read as another dtype than the value the graph last wrote around it
 * (view_as_real of a complex result, x.view(torch.int32) of a float one):
 * the value's memory reinterpreted, then t derived from it. NO_REF when no
 * such value holds all of t or the bytes do not reinterpret. */
static ref_t read_retyped(em_t* e, const tpu_tensor_t* t, uintptr_t lo, uintptr_t hi) {
  ref_t bad = mkref(t->dtype, 0, NULL);
  for (int i = e->nv - 1; i >= 0; i--) {
    const val_t* v = &e->v[i];
    if (v->superseded || v->alias || !v->written || v->r.dt == t->dtype || !(v->lo <= lo && hi <= v->hi && lo < hi))
      continue;
    if (!val_dense(v)) return bad;
    const int64_t N = numel(&v->r);
    ref_t flat = reinterpret_flat(e, memory_order(e, v, 1, &N), t->dtype);
    if (flat.id == NO_REF) return bad;
    val_t w = *v; /* the same memory, as flat elements of t's dtype */
    w.r = flat;
    w.st[0] = 1;
    return derive(e, &w, t);
  }
  return bad;
}

/* the value a tensor argument reads */
ref_t read_tensor(em_t* e, const tpu_tensor_t* t) {
  if ((t->flags & TPU_TENSOR_CPU_SCALAR) && tpu_dtype_is_complex(t->dtype)) {
    const char* p = tpu_tensor_elem_ptr(t, 0);
    const tpu_dtype_t part = tpu_dtype_complex_part(t->dtype);
    return cst_complex(e, t->dtype, tpu_load_f64(p, part), tpu_load_f64(p + tpu_dtype_size(part), part));
  }
  if ((t->flags & TPU_TENSOR_CPU_SCALAR) && !(lifting(e) && tpu_lower_lifts_scalar(t)))
    return cst(e, t->dtype, tpu_tensor_get_f64(t, 0));
  for (int i = e->nv - 1; i >= 0; i--)
    if (!e->v[i].superseded && same_view(&e->v[i], t)) return e->v[i].r;
  uintptr_t lo, hi;
  geom_range(t, &lo, &hi);
  int base = -1;
  for (int i = e->nv - 1; i >= 0 && base < 0; i--) {
    const val_t* v = &e->v[i];
    if (!v->superseded && !v->alias && v->r.dt == t->dtype && v->lo <= lo && hi <= v->hi && lo < hi)
      base = i;
  }
  if (base < 0) { /* written by the graph as another dtype? */
    ref_t r = read_retyped(e, t, lo, hi);
    if (r.id != NO_REF) {
      int k = val_push(e, r, t);
      if (k >= 0) e->v[k].alias = true;
      return r;
    }
  }
  if (base < 0) { /* memory from before the graph: a parameter */
    param_for(e, t);
    if (e->oom) return mkref(t->dtype, t->ndim, t->sizes);
    base = e->nv - 1;
    const int n0 = base;
    tpu_tensor_t pt = val_tensor(&e->v[base]);
    /* writes the graph made inside it before this read */
    for (int i = 0; i < n0 && !e->oom; i++) {
      val_t* w = &e->v[i];
      if (w->superseded || !w->written || w->alias || w->r.dt != t->dtype) continue;
      if (!(e->v[base].lo <= w->lo && w->hi <= e->v[base].hi)) continue;
      tpu_tensor_t wt = val_tensor(w);
      ref_t u = update(e, &e->v[base], &wt, w->r);
      if (u.id == NO_REF) continue;
      int k = val_push(e, u, &pt);
      if (k < 0) break;
      e->v[base].superseded = true;
      e->v[k].written = true;
      e->v[k].visible = true;
      w->alias = true;
      base = k;
    }
    if (same_view(&e->v[base], t)) return e->v[base].r;
  }
  ref_t r = derive(e, &e->v[base], t);
  if (r.id == NO_REF) { /* a view the printer cannot express */
    note_custom(e, "tpu.strided_view");
    r = emit(e, "stablehlo.custom_call", 1, &e->v[base].r, mkref(t->dtype, t->ndim, t->sizes),
             "call_target_name = \"tpu.strided_view\"");
  }
  int k = val_push(e, r, t);
  if (k >= 0) e->v[k].alias = true;
  return r;
}

/* node output t now holds w */
void write_tensor(em_t* e, const tpu_tensor_t* t, ref_t w, bool visible) {
  uintptr_t lo, hi;
  geom_range(t, &lo, &hi);
  bool into_base = false;
  const int n = e->nv;
  for (int i = 0; i < n && !e->oom; i++) {
    val_t* v = &e->v[i];
    if (v->superseded || !overlaps(v, lo, hi)) continue;
    if (!same_view(v, t) && !v->alias && v->r.dt == t->dtype && v->lo <= lo && hi <= v->hi) {
      ref_t u = update(e, v, t, w);
      v = &e->v[i];
      if (u.id != NO_REF) {
        tpu_tensor_t vt = val_tensor(v);
        bool vis = visible || v->visible || !v->written;
        int k = val_push(e, u, &vt);
        if (k >= 0) {
          e->v[k].written = true;
          e->v[k].visible = vis;
        }
        into_base = true;
      }
    }
    e->v[i].superseded = true;
  }
  int k = val_push(e, w, t);
  if (k >= 0) {
    e->v[k].written = true;
    e->v[k].visible = visible;
    e->v[k].alias = into_base;
  }
}

/* ---- ops ---- */

bool is_tensor(const node_t* n, int i) {
  return i < n->c->nargs && n->c->args[i].kind == TPU_ARG_TENSOR;
}
bool is_number(const node_t* n, int i) {
  if (i >= n->c->nargs) return false;
  tpu_arg_kind_t k = n->c->args[i].kind;
  return k == TPU_ARG_INT || k == TPU_ARG_DOUBLE || k == TPU_ARG_BOOL || k == TPU_ARG_COMPLEX;
}

ref_t arg(node_t* n, int i) { return read_tensor(n->e, n->c->args[i].v.t); }

/* ---- numbers as values ---- */
/* The printer of this thread (numbers read by value are reported to it). */
static _Thread_local em_t* tls_em;

bool tpu_lower_lifts_scalar(const tpu_tensor_t* t) {
  return (t->flags & TPU_TENSOR_CPU_SCALAR) && tpu_dtype_is_float(t->dtype);
}

static bool lifting(const em_t* e) { return e && e->o && e->o->lift_numbers; }

/* a liftable number's value read as a constant of the program */
static void note_baked(const em_t* e, const tpu_arg_t* a) {
  if (!lifting(e) || !e->o->on_baked) return;
  if (a->kind == TPU_ARG_DOUBLE) e->o->on_baked(e->o->ctx, &a->v.d, sizeof a->v.d);
  else if (a->kind == TPU_ARG_TENSOR && tpu_lower_lifts_scalar(a->v.t))
    e->o->on_baked(e->o->ctx, a->v.t->data, tpu_dtype_size(a->v.t->dtype));
}

static void note_read(const tpu_call_t* c, int i) {
  if (i >= 0 && i < c->nargs) note_baked(tls_em, &c->args[i]);
}
/* (name) calls the function, not the macro of emit.h */
double lower_arg_f64(const tpu_call_t* c, int i, double dflt) {
  note_read(c, i);
  return (tpu_arg_f64)(c, i, dflt);
}
int64_t lower_arg_i64(const tpu_call_t* c, int i, int64_t dflt) {
  note_read(c, i);
  return (tpu_arg_i64)(c, i, dflt);
}
bool lower_arg_bool(const tpu_call_t* c, int i, bool dflt) {
  note_read(c, i);
  return (tpu_arg_bool)(c, i, dflt);
}
bool lower_arg_complex(const tpu_call_t* c, int i, double out_c[2]) {
  note_read(c, i);
  return (tpu_arg_complex)(c, i, out_c);
}

/* whether argument i (a floating number, or a floating CPU scalar) is read as a parameter */
static bool lifted(const node_t* n, int i) {
  if (!lifting(n->e) || i >= n->c->nargs) return false;
  const tpu_arg_t* a = &n->c->args[i];
  return a->kind == TPU_ARG_DOUBLE || (a->kind == TPU_ARG_TENSOR && tpu_lower_lifts_scalar(a->v.t));
}

/* number argument i as a 0-d f64 parameter over the call's argument */
static ref_t number_param(node_t* n, int i) {
  tpu_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = (void*)&n->c->args[i].v.d;
  t.dtype = TPU_F64;
  return read_tensor(n->e, &t);
}

/* argument i (tensor or number) as dt, broadcast to (nd, sz) */
ref_t arg_as(node_t* n, int i, tpu_dtype_t dt, int nd, const int64_t* sz) {
  if (is_tensor(n, i)) return bcast(n->e, convert(n->e, arg(n, i), dt), nd, sz);
  if (lifted(n, i)) return bcast(n->e, convert(n->e, number_param(n, i), dt), nd, sz); /* a number */
  if (tpu_dtype_is_complex(dt) && i < n->c->nargs && n->c->args[i].kind == TPU_ARG_COMPLEX) {
    double v[2]; /* a complex number: a constant, keyed by value (targets/pjrt/progcache.c) */
    tpu_arg_complex(n->c, i, v);
    return bcast(n->e, cst_complex(n->e, dt, v[0], v[1]), nd, sz);
  }
  return cst_like(n->e, dt, tpu_arg_f64(n->c, i, 0), nd, sz);
}

ref_t scale_by(node_t* n, int i, ref_t x, double dflt) {
  if (lifted(n, i) || (i < n->c->nargs && n->c->args[i].kind == TPU_ARG_COMPLEX))
    return binop(n->e, "stablehlo.multiply", x, arg_as(n, i, x.dt, x.nd, x.sz));
  const double v = tpu_arg_f64(n->c, i, dflt);
  return v == 1.0 ? x : scalar_op(n->e, "stablehlo.multiply", x, v);
}

ref_t arg_out(node_t* n, int i, tpu_dtype_t dt) { return arg_as(n, i, dt, n->o->ndim, n->o->sizes); }

ref_t out_ref(const node_t* n, tpu_dtype_t dt) { return mkref(dt, n->o->ndim, n->o->sizes); }

/* dtype two operands compare/compute in (PyTorch's result_type) */
tpu_dtype_t common_type(node_t* n, int a, int b) {
  const tpu_tensor_t* ts[2];
  int k = 0;
  tpu_tensor_t tmp;
  if (is_tensor(n, a)) ts[k++] = n->c->args[a].v.t;
  if (is_tensor(n, b)) ts[k++] = n->c->args[b].v.t;
  if (k == 1 && is_number(n, b)) { /* a Python number takes part as a wrapped number */
    memset(&tmp, 0, sizeof tmp);
    tpu_arg_kind_t kind = n->c->args[b].kind;
    tmp.dtype = kind == TPU_ARG_DOUBLE ? TPU_F64 : kind == TPU_ARG_BOOL ? TPU_BOOL : kind == TPU_ARG_COMPLEX ? TPU_C128 : TPU_I64;
    tmp.flags = TPU_TENSOR_WRAPPED_NUMBER;
    ts[k++] = &tmp;
  }
  return k ? tpu_result_type(ts, k) : TPU_F32;
}

int norm_dim(int64_t d, int nd) { return (int)(d < 0 ? d + (nd ? nd : 1) : d); }

/* reduction dims from argument i (a list, an int, or absent/empty = all) */
int red_dims(const node_t* n, int i, int nd, int64_t* dims) {
  int k = 0;
  if (i >= 0 && i < n->c->nargs && n->c->args[i].kind == TPU_ARG_INTLIST && n->c->args[i].n > 0) {
    for (int j = 0; j < n->c->args[i].n && k < TPU_MAX_DIMS; j++)
      dims[k++] = norm_dim(n->c->args[i].v.ilist[j], nd);
  } else if (i >= 0 && i < n->c->nargs && n->c->args[i].kind == TPU_ARG_INT) {
    dims[k++] = norm_dim(n->c->args[i].v.i, nd);
  } else {
    for (int d = 0; d < nd; d++) dims[k++] = d;
  }
  /* sorted, unique */
  for (int a = 1; a < k; a++)
    for (int b = a; b > 0 && dims[b] < dims[b - 1]; b--) {
      int64_t x = dims[b];
      dims[b] = dims[b - 1];
      dims[b - 1] = x;
    }
  int u = 0;
  for (int a = 0; a < k; a++)
    if (!u || dims[u - 1] != dims[a]) dims[u++] = dims[a];
  return nd ? u : 0;
}

static bool is_half(tpu_dtype_t dt) { return dt == TPU_BF16 || dt == TPU_F16; }
tpu_dtype_t acc_type(tpu_dtype_t dt) { return is_half(dt) ? TPU_F32 : dt; }

ref_t gelu(em_t* e, ref_t x, const char* approx) {
  ref_t half = scalar_op(e, "stablehlo.multiply", x, 0.5);
  ref_t inner;
  if (approx && !strcmp(approx, "tanh")) {
    ref_t x3 = binop(e, "stablehlo.multiply", binop(e, "stablehlo.multiply", x, x), x);
    ref_t s = binop(e, "stablehlo.add", x, scalar_op(e, "stablehlo.multiply", x3, 0.044715));
    inner = unop(e, "stablehlo.tanh", scalar_op(e, "stablehlo.multiply", s, sqrt(2.0 / M_PI)));
  } else {
    inner = unop(e, "chlo.erf", scalar_op(e, "stablehlo.multiply", x, M_SQRT1_2));
  }
  ref_t y = binop(e, "stablehlo.multiply", half, scalar_op(e, "stablehlo.add", inner, 1.0));
  if (approx && !strcmp(approx, "tanh")) return y;
  /* -inf * (1 + erf(-inf)) is -inf * 0, NaN, as on CPU; XLA's float32 erf stops short of -1 */
  ref_t ninf = compare(e, "EQ", x, cst_like(e, x.dt, -INFINITY, x.nd, x.sz));
  return select3(e, ninf, cst_like(e, x.dt, NAN, x.nd, x.sz), y);
}

/* d gelu(x) / dx */
ref_t gelu_grad(em_t* e, ref_t x, const char* approx) {
  if (approx && !strcmp(approx, "tanh")) {
    const double k = sqrt(2.0 / M_PI);
    ref_t x2 = binop(e, "stablehlo.multiply", x, x);
    ref_t u = scalar_op(e, "stablehlo.multiply",
                        binop(e, "stablehlo.add", x,
                              scalar_op(e, "stablehlo.multiply", binop(e, "stablehlo.multiply", x2, x), 0.044715)),
                        k);
    ref_t t = unop(e, "stablehlo.tanh", u);
    ref_t left = scalar_op(e, "stablehlo.multiply", scalar_op(e, "stablehlo.add", t, 1.0), 0.5);
    ref_t one_m_t2 = binop(e, "stablehlo.subtract", cst_like(e, x.dt, 1.0, x.nd, x.sz), binop(e, "stablehlo.multiply", t, t));
    ref_t du = scalar_op(e, "stablehlo.multiply", scalar_op(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", x2, 3 * 0.044715), 1.0), k);
    ref_t right = scalar_op(e, "stablehlo.multiply", binop(e, "stablehlo.multiply", x, binop(e, "stablehlo.multiply", one_m_t2, du)), 0.5);
    return binop(e, "stablehlo.add", left, right);
  }
  ref_t cdf = scalar_op(e, "stablehlo.multiply",
                        scalar_op(e, "stablehlo.add", unop(e, "chlo.erf", scalar_op(e, "stablehlo.multiply", x, M_SQRT1_2)), 1.0),
                        0.5);
  ref_t pdf = scalar_op(e, "stablehlo.multiply",
                        unop(e, "stablehlo.exponential", scalar_op(e, "stablehlo.multiply", binop(e, "stablehlo.multiply", x, x), -0.5)),
                        1.0 / sqrt(2.0 * M_PI));
  return binop(e, "stablehlo.add", cdf, binop(e, "stablehlo.multiply", x, pdf));
}

/* one-hot of integer `target` over `n` classes, the class dim inserted at `axis` */
ref_t one_hot(em_t* e, ref_t target, int64_t n, int axis) {
  ref_t r = mkref(TPU_BOOL, target.nd + 1, NULL);
  int64_t dims[TPU_MAX_DIMS];
  for (int d = 0, k = 0; d < r.nd; d++) {
    if (d == axis) {
      r.sz[d] = n;
      continue;
    }
    dims[k] = d;
    r.sz[d] = target.sz[k++];
  }
  ref_t iota = emit(e, "stablehlo.iota", 0, NULL, mkref(target.dt, r.nd, r.sz), "iota_dimension = %d : i64", axis);
  return compare(e, "EQ", iota, bcast_dims(e, target, r.nd, r.sz, dims));
}

/* Emits node n; false when the op has no mapping. outs[k] gets output k. */
/* One ATen op through its lowering (runtime/lower/lower.c's tables), or false for
 * the custom_call fallback. */
static bool emit_op(node_t* n, const char* base, ref_t* outs) {
  if (!n->o) return false;
  const tpu_lower_entry_t* l = tpu_lower_find_id(n->c->op->id);
  return l && l->fn(n, base, outs);
}

/* base name of an overload: "add_.Tensor" -> "add" */
void base_name(const char* op, char* out, size_t cap) { tpu_op_base_name(op, out, cap); }

static bool is_inplace(const char* op) {
  size_t len = strcspn(op, ".");
  return len > 1 && op[len - 1] == '_';
}

/* the node's results: its outputs, or for ops returning nothing, the
 * tensors it mutates */
typedef struct {
  const tpu_tensor_t* t[64];
  int n;
} results_t;

static void node_results(const tpu_call_t* c, results_t* r) {
  r->n = 0;
  for (int o = 0; o < c->nouts && r->n < 64; o++)
    if (c->outs[o].dtype != TPU_DTYPE_NONE) r->t[r->n++] = &c->outs[o];
  if (r->n) return;
  for (int a = 0; a < c->nargs && a < 64; a++) {
    if (!(c->mutated_args >> a & 1)) continue;
    if (c->args[a].kind == TPU_ARG_TENSOR && r->n < 64) r->t[r->n++] = c->args[a].v.t;
    else if (c->args[a].kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < c->args[a].n && r->n < 64; k++)
        if (c->args[a].v.tlist[k].dtype != TPU_DTYPE_NONE) r->t[r->n++] = &c->args[a].v.tlist[k];
  }
}

static void custom_call(em_t* e, const tpu_call_t* c, const results_t* res, ref_t* outs) {
  ref_t in[256];
  int n = 0;
  const bool inplace = is_inplace(c->op->name);
  for (int a = 0; a < c->nargs; a++) {
    if ((c->mutated_args >> a & 1) && !inplace) continue; /* out= buffers are not read */
    const tpu_arg_t* x = &c->args[a];
    if (x->kind == TPU_ARG_TENSOR && n < 256) in[n++] = read_tensor(e, x->v.t);
    else if (x->kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < x->n && n < 256; k++)
        if (x->v.tlist[k].dtype != TPU_DTYPE_NONE) in[n++] = read_tensor(e, &x->v.tlist[k]);
  }
  char target[160];
  snprintf(target, sizeof target, "aten.%s", c->op->name);
  note_custom(e, target);
  const int id = e->next;
  if (res->n) e->next++;
  FILE* f = e->f;
  fputs("    ", f);
  if (res->n == 1) fprintf(f, "%%%d = ", id);
  else if (res->n > 1) fprintf(f, "%%%d:%d = ", id, res->n);
  fputs("\"stablehlo.custom_call\"(", f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    pname(f, &in[i]);
  }
  fprintf(f, ") {call_target_name = \"%s\", has_side_effect = %s", target,
          res->n ? "false" : "true");
  /* the non-tensor arguments, for readers */
  bool any = false;
  for (int a = 0; a < c->nargs; a++) {
    const tpu_arg_t* x = &c->args[a];
    if (x->kind == TPU_ARG_TENSOR || x->kind == TPU_ARG_TENSORLIST || x->kind == TPU_ARG_NONE) continue;
    fputs(any ? ", " : ", tpu.args = {", f);
    any = true;
    fprintf(f, "arg%d = ", a);
    switch (x->kind) {
      case TPU_ARG_INT: fprintf(f, "%" PRId64 " : i64", x->v.i); break;
      case TPU_ARG_DOUBLE:
        note_read(c, a);
        float_literal(f, TPU_F64, x->v.d);
        fputs(" : f64", f);
        break;
      case TPU_ARG_BOOL: fputs(x->v.b ? "true" : "false", f); break;
      case TPU_ARG_STRING: fprintf(f, "\"%s\"", x->v.s); break;
      case TPU_ARG_INTLIST:
        fputs("array<i64", f);
        for (int k = 0; k < x->n; k++) fprintf(f, "%s %" PRId64, k ? "," : ":", x->v.ilist[k]);
        fputs(">", f);
        break;
      case TPU_ARG_DOUBLELIST:
        fputs("array<f64", f);
        for (int k = 0; k < x->n; k++) {
          fputs(k ? ", " : ": ", f);
          float_literal(f, TPU_F64, x->v.dlist[k]);
        }
        fputs(">", f);
        break;
      case TPU_ARG_BOOLLIST:
        fputs("array<i1", f);
        for (int k = 0; k < x->n; k++) fprintf(f, "%s %s", k ? "," : ":", x->v.blist[k] ? "true" : "false");
        fputs(">", f);
        break;
      default: fputs("unit", f); break;
    }
  }
  if (any) fputs("}", f);
  fputs("} : (", f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    ptype(f, &in[i]);
  }
  fputs(") -> ", f);
  if (res->n != 1) fputs("(", f);
  for (int k = 0; k < res->n; k++) {
    if (k) fputs(", ", f);
    outs[k] = mkref(res->t[k]->dtype, res->t[k]->ndim, res->t[k]->sizes);
    ptype(f, &outs[k]);
  }
  if (res->n != 1) fputs(")", f);
  fputc('\n', f);
  for (int k = 0; k < res->n; k++) {
    outs[k].id = id;
    outs[k].sub = res->n > 1 ? k : -1;
  }
}

static void emit_node(em_t* e, const tpu_graph_t* g, int i) {
  const tpu_call_t* c = g->nodes[i];
  if ((c->op->flags & TPU_OP_CUSTOM) && lower_custom_node(e, g, i)) return;
  results_t res;
  node_results(c, &res);
  ref_t outs[64];
  char base[128];
  base_name(c->op->name, base, sizeof base);
  node_t n = {e, c, res.n && c->nouts ? &c->outs[0] : NULL};
  fprintf(e->f, "    // aten::%s\n", c->op->name);
  /* emit_op fills outs by output index; a custom call by result */
  for (int k = 0; k < 64; k++) outs[k].id = NO_REF;
  bool ok = res.n > 0 && c->nouts > 0 && emit_op(&n, base, outs);
  for (int k = 0; k < res.n && ok; k++) ok = outs[res.t[k] - c->outs].id != NO_REF;
  ref_t cc[64];
  if (!ok) custom_call(e, c, &res, cc);
  for (int k = 0; k < res.n; k++) {
    const tpu_tensor_t* t = res.t[k];
    ref_t r = convert(e, ok ? outs[t - c->outs] : cc[k], t->dtype);
    if (!same_shape(&r, t->ndim, t->sizes))
      r = numel(&r) == tpu_tensor_numel(t) ? reshape(e, r, t->ndim, t->sizes) : bcast(e, r, t->ndim, t->sizes);
    bool vis = true;
    if (c->nouts && g->visible) {
      int o = (int)(t - c->outs);
      vis = (g->visible[i] >> (o < 31 ? o : 31)) & 1;
    }
    write_tensor(e, t, r, vis);
  }
}

static void print_attr_value(FILE* f, const val_t* v) {
  fprintf(f, "{tpu.buffer = \"%p\"", (const void*)v->data);
  bool contiguous = true;
  int64_t s = 1;
  for (int d = v->r.nd - 1; d >= 0; d--) {
    if (v->r.sz[d] > 1 && v->st[d] != s) contiguous = false;
    s *= v->r.sz[d];
  }
  if (!contiguous) {
    char b[600];
    fprintf(f, ", tpu.strides = %s", i64arr(b, sizeof b, v->r.nd, v->st));
  }
  fputc('}', f);
}

/* Whether the printer is asked for checks; makes room for one more. */
static bool check_room(em_t* e) {
  if (!e->o || !e->o->on_check) return false;
  if (e->nchk == e->cchk) {
    int cap = e->cchk ? 2 * e->cchk : 8;
    ref_t* v = realloc(e->chk, sizeof(*v) * (size_t)cap);
    if (!v) {
      e->oom = true;
      return false;
    }
    e->chk = v;
    e->cchk = cap;
  }
  return true;
}

void check_range(em_t* e, ref_t idx, int64_t lo, int64_t size, int dim, bool index_error) {
  if (numel(&idx) == 0 || !check_room(e)) return;
  ref_t i = idx.dt == TPU_I64 ? idx : convert(e, idx, TPU_I64);
  ref_t below = compare(e, "LT", i, cst_like(e, TPU_I64, (double)lo, i.nd, i.sz));
  ref_t above = compare(e, "GE", i, cst_like(e, TPU_I64, (double)size, i.nd, i.sz));
  e->chk[e->nchk++] = any_of(e, binop(e, "stablehlo.or", below, above));
  e->o->on_check(e->o->ctx, e->node, index_error ? TPU_CHECK_INDEX : TPU_CHECK_INDEX_RT, dim, size);
}

void check_prob(em_t* e, ref_t p) {
  if (numel(&p) == 0 || !check_room(e)) return;
  ref_t ok = binop(e, "stablehlo.and", compare(e, "GE", p, cst_like(e, p.dt, 0, p.nd, p.sz)),
                   compare(e, "LE", p, cst_like(e, p.dt, 1, p.nd, p.sz)));
  e->chk[e->nchk++] = any_of(e, unop(e, "stablehlo.not", ok));
  e->o->on_check(e->o->ctx, e->node, TPU_CHECK_PROB, -1, 0);
}

/* The checks' verdict (tpu_graph_print_opts_t.on_check): 0, or 1 + the first
 * check that failed. */
static ref_t check_code(em_t* e) {
  ref_t code = cst(e, TPU_I32, 0);
  for (int k = e->nchk - 1; k >= 0; k--) code = select3(e, e->chk[k], cst(e, TPU_I32, k + 1), code);
  return code;
}

/* A result of the function: the last value written to memory visible after
 * the graph (a zero-element value carries nothing and has no address). */
static bool is_result(const val_t* v) {
  return v->written && v->visible && !v->superseded && !v->alias && numel(&v->r) > 0;
}

static void print_impl(const tpu_graph_t* g, FILE* f, const tpu_graph_print_opts_t* o) {
  em_t e = {0};
  e.o = o;
  em_t* const outer = tls_em;
  tls_em = &e;
  char* body = NULL;
  size_t len = 0;
  e.f = open_memstream(&body, &len);
  if (!e.f) {
    fprintf(f, "// TorchTPU graph: out of host memory printing %d nodes\n", g->n);
    tls_em = outer;
    return;
  }
  for (int i = 0; i < g->n && !e.oom; i++) {
    e.node = i;
    emit_node(&e, g, i);
  }
  /* results: the last values written to visible memory, then the checks' code */
  const bool checked = e.nchk > 0;
  ref_t code = checked ? check_code(&e) : (ref_t){0};
  int nres = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (is_result(v)) nres++;
  }
  fputs("    \"func.return\"(", e.f);
  int k = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (!is_result(v)) continue;
    if (k++) fputs(", ", e.f);
    pname(e.f, &v->r);
  }
  if (checked) {
    if (k++) fputs(", ", e.f);
    pname(e.f, &code);
  }
  fputs(") : (", e.f);
  k = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (!is_result(v)) continue;
    if (k++) fputs(", ", e.f);
    ptype(e.f, &v->r);
  }
  if (checked) {
    if (k++) fputs(", ", e.f);
    ptype(e.f, &code);
  }
  fputs(") -> ()\n", e.f);
  fclose(e.f);

  if (o) {
    for (int i = 0; i < e.np && o->on_value; i++) {
      const val_t* v = &e.v[e.params[i]];
      o->on_value(o->ctx, false, i, v->data, v->r.dt, v->r.nd, v->r.sz, v->st);
    }
    k = 0;
    for (int i = 0; i < e.nv && o->on_value; i++) {
      const val_t* v = &e.v[i];
      if (is_result(v)) o->on_value(o->ctx, true, k++, v->data, v->r.dt, v->r.nd, v->r.sz, v->st);
    }
    if (o->out_custom_calls) *o->out_custom_calls = e.ncc;
    if (o->out_oom) *o->out_oom = e.oom;
  }
  const bool whole = !o || !o->func_name;
  if (whole) {
    fprintf(f, "// TorchTPU DeferAndFuse graph: %d nodes on tpu:%d, %d parameters, %d results%s\n", g->n, g->device,
            e.np, nres, e.oom ? " (INCOMPLETE: out of host memory)" : "");
    fputs("module @tpu_graph", f);
    if (e.ncc) {
      fputs(" attributes {tpu.custom_calls = [", f);
      for (int i = 0; i < e.ncc; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", e.cc[i]);
      fputs("]}", f);
    }
    fputs(" {\n  func.func @main(", f);
  } else {
    fprintf(f, "  func.func private @%s(", o->func_name);
  }
  for (int i = 0; i < e.np; i++) {
    const val_t* v = &e.v[e.params[i]];
    fprintf(f, "%s%%arg%d: ", i ? ", " : "", i);
    ptype(f, &v->r);
    if (whole) { /* a composed function's text must not depend on addresses */
      fputc(' ', f);
      print_attr_value(f, v);
    }
  }
  fputs(") -> (", f);
  k = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (!is_result(v)) continue;
    if (k++) fputs(", ", f);
    ptype(f, &v->r);
    if (whole) {
      fputc(' ', f);
      print_attr_value(f, v);
    }
  }
  if (checked) {
    if (k++) fputs(", ", f);
    ptype(f, &code);
  }
  fputs(") {\n", f);
  if (body) fwrite(body, 1, len, f);
  fputs("  }\n", f);
  print_custom_functions(&e, f);
  if (whole) fputs("}\n", f);
  tls_em = outer;
  free(body);
  free(e.v);
  free(e.params);
  free(e.chk);
  free(e.fns);
  for (int i = 0; i < e.ncc; i++) free(e.cc[i]);
  free(e.cc);
}

void tpu_graph_print(const tpu_graph_t* g, FILE* f) { print_impl(g, f, NULL); }

void tpu_graph_print_func(const tpu_graph_t* g, FILE* f, const tpu_graph_print_opts_t* o) {
  print_impl(g, f, o);
}
