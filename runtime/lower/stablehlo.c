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
 * precision). Anything else becomes stablehlo.custom_call @aten.<name> with
 * the right types, and is listed in the module's tpu.custom_calls. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exec/graph.h"

typedef struct {
  int id;  /* >= 0: %id; < 0: %arg(-id-1) */
  int sub; /* >= 0: result `sub` of a multi-result op (%id#sub) */
  tpu_dtype_t dt;
  int nd;
  int64_t sz[TPU_MAX_DIMS];
} ref_t;

typedef struct {
  ref_t r;
  const char* data;
  int64_t st[TPU_MAX_DIMS]; /* memory strides (elements) of r's dims */
  uintptr_t lo, hi;         /* bytes it covers */
  bool written;             /* a node of the graph produced it */
  bool visible;             /* its memory outlives the graph */
  bool superseded;          /* a later write changed (part of) its memory */
  bool alias;               /* a derived view of another value */
} val_t;

typedef struct {
  FILE* f; /* function body */
  int next;
  val_t* v;
  int nv, cv;
  int* params; /* value index of %argK */
  int np, cp;
  char** cc; /* custom call targets, unique */
  int ncc, ccc;
  bool oom;
} em_t;

#define NO_REF (-1000000000)

/* ---- printing helpers ---- */
static const char* elt_type(tpu_dtype_t dt) {
  switch (dt) {
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
    default: return "none";
  }
}

static void ptype(FILE* f, const ref_t* r) {
  fputs("tensor<", f);
  for (int d = 0; d < r->nd; d++) fprintf(f, "%" PRId64 "x", r->sz[d]);
  fprintf(f, "%s>", elt_type(r->dt));
}

static void pname(FILE* f, const ref_t* r) {
  if (r->id < 0) fprintf(f, "%%arg%d", -r->id - 1);
  else if (r->sub >= 0) fprintf(f, "%%%d#%d", r->id, r->sub);
  else fprintf(f, "%%%d", r->id);
}

/* "n0, n1, ..." (names) or "t0, t1, ..." (types) of n values */
static void plist(FILE* f, int n, const ref_t* r, bool types) {
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    if (types) ptype(f, &r[i]);
    else pname(f, &r[i]);
  }
}

/* "a, b, c" of n int64 into buf */
static const char* ints(char* buf, size_t cap, int n, const int64_t* v) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < n && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", v[i]);
  return buf;
}

/* "array<i64: a, b>" ("array<i64>" when empty) */
static const char* i64arr(char* buf, size_t cap, int n, const int64_t* v) {
  char tmp[512];
  snprintf(buf, cap, n ? "array<i64: %s>" : "array<i64>", ints(tmp, sizeof tmp, n, v));
  return buf;
}

static int64_t numel(const ref_t* r) {
  int64_t n = 1;
  for (int d = 0; d < r->nd; d++) n *= r->sz[d];
  return n;
}

static ref_t mkref(tpu_dtype_t dt, int nd, const int64_t* sz) {
  ref_t r = {NO_REF, -1, dt, nd, {0}};
  if (nd && sz) memcpy(r.sz, sz, sizeof(int64_t) * (size_t)nd);
  return r;
}

static bool same_shape(const ref_t* a, int nd, const int64_t* sz) {
  return a->nd == nd && !memcmp(a->sz, sz, sizeof(int64_t) * (size_t)nd);
}

/* %N = "op"(ins) {attrs} : (types) -> result */
static ref_t emit(em_t* e, const char* op, int n, const ref_t* in, ref_t res, const char* fmt, ...) {
  res.id = e->next++;
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

static ref_t cst(em_t* e, tpu_dtype_t dt, double v) {
  ref_t r = mkref(dt, 0, NULL);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<", r.id);
  if (dt == TPU_BOOL) fputs(v != 0 ? "true" : "false", e->f);
  else if (tpu_dtype_is_float(dt)) float_literal(e->f, dt, v);
  else fprintf(e->f, "%" PRId64, (int64_t)v);
  return end_constant(e, r, ">");
}

static ref_t reshape(em_t* e, ref_t a, int nd, const int64_t* sz) {
  if (same_shape(&a, nd, sz)) return a;
  return emit(e, "stablehlo.reshape", 1, &a, mkref(a.dt, nd, sz), NULL);
}

static ref_t transpose(em_t* e, ref_t a, const int64_t* perm) {
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
static ref_t bcast_dims(em_t* e, ref_t a, int nd, const int64_t* sz, const int64_t* dims) {
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
static ref_t bcast(em_t* e, ref_t a, int nd, const int64_t* sz) {
  if (same_shape(&a, nd, sz)) return a;
  int64_t dims[TPU_MAX_DIMS];
  for (int i = 0; i < a.nd; i++) dims[i] = nd - a.nd + i;
  return bcast_dims(e, a, nd, sz, dims);
}

static ref_t convert(em_t* e, ref_t a, tpu_dtype_t dt) {
  if (a.dt == dt) return a;
  return emit(e, "stablehlo.convert", 1, &a, mkref(dt, a.nd, a.sz), NULL);
}

static ref_t cst_like(em_t* e, tpu_dtype_t dt, double v, int nd, const int64_t* sz) {
  return bcast(e, cst(e, dt, v), nd, sz);
}

static ref_t slice(em_t* e, ref_t a, const int64_t* start, const int64_t* limit) {
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

static ref_t binop(em_t* e, const char* op, ref_t a, ref_t b) {
  ref_t in[2] = {a, b};
  return emit(e, op, 2, in, mkref(a.dt, a.nd, a.sz), NULL);
}

static ref_t unop(em_t* e, const char* op, ref_t a) { return emit(e, op, 1, &a, a, NULL); }

static const char* cmp_type(tpu_dtype_t dt) {
  if (tpu_dtype_is_float(dt)) return "FLOAT";
  return dt == TPU_U8 || dt == TPU_BOOL ? "UNSIGNED" : "SIGNED";
}

static ref_t compare(em_t* e, const char* dir, ref_t a, ref_t b) {
  ref_t in[2] = {a, b};
  return emit(e, "stablehlo.compare", 2, in, mkref(TPU_BOOL, a.nd, a.sz),
              "comparison_direction = #stablehlo<comparison_direction %s>, "
              "compare_type = #stablehlo<comparison_type %s>",
              dir, cmp_type(a.dt));
}

static ref_t select3(em_t* e, ref_t p, ref_t a, ref_t b) {
  ref_t in[3] = {p, a, b};
  return emit(e, "stablehlo.select", 3, in, mkref(a.dt, a.nd, a.sz), NULL);
}

static ref_t scalar_op(em_t* e, const char* op, ref_t a, double v) {
  return binop(e, op, a, cst_like(e, a.dt, v, a.nd, a.sz));
}

/* Reduction over dims with a body op ("stablehlo.add", ...) and its identity. */
static ref_t reduce(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init) {
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
static ref_t reduce_keep(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init) {
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
static ref_t block_arg(em_t* e, tpu_dtype_t dt) {
  ref_t r = mkref(dt, 0, NULL);
  r.id = -(1000000 + e->next++) - 1;
  return r;
}

/* Window geometry of a pooling op over a's dims: sizes, strides, window
 * dilations, low/high padding. */
typedef struct {
  int64_t win[TPU_MAX_DIMS], str[TPU_MAX_DIMS], dil[TPU_MAX_DIMS], lo[TPU_MAX_DIMS],
      hi[TPU_MAX_DIMS];
} window_t;

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
typedef void (*window_body_t)(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);

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

static void reduce_window_n(em_t* e, int n, const ref_t* a, const ref_t* init, const window_t* w,
                            window_body_t body, ref_t* res) {
  char attrs[1200];
  for (int i = 0; i < n; i++) res[i] = window_result(a[i], w, a[i].dt);
  region_reduce(e, "stablehlo.reduce_window", n, a, init, body, window_attrs(attrs, sizeof attrs, a[0].nd, w), res);
}

static void sum_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
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
static void argmax_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, true, false);
}
static void argmin_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, false, false);
}
static void max_pool_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  arg_extreme_body(e, acc, x, out, true, true);
}

/* stablehlo.reduce of two operands (values and indices) over dims. */
static void reduce_pair(em_t* e, const ref_t* a, const ref_t* init, int nr, const int64_t* dims,
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

static void prod_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  out[0] = binop(e, "stablehlo.multiply", acc[0], x[0]);
}

/* A 1-D int64 constant with the given values. */
static ref_t cst_i64_list(em_t* e, int64_t n, const int64_t* v) {
  ref_t r = mkref(TPU_I64, 1, &n);
  r.id = e->next++;
  fprintf(e->f, "    %%%d = \"stablehlo.constant\"() {value = dense<[", r.id);
  for (int64_t i = 0; i < n; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", v[i]);
  return end_constant(e, r, "]>");
}

/* A 1-D float32 constant with the given values. */
static ref_t cst_f32_list(em_t* e, int64_t n, const float* v) {
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
static ref_t take_along(em_t* e, ref_t x, int dim, ref_t idx) {
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
static ref_t dim_coords(em_t* e, ref_t idx, int dim) {
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

/* x rolled by `shift` along dim: its last shift slices first. */
static ref_t roll_dim(em_t* e, ref_t x, int dim, int64_t shift) {
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
static void sort_with_indices(em_t* e, ref_t x, int dim, bool descending, ref_t* res) {
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

/* The pooling window of a [.., H, W]-like input from PyTorch's arguments:
 * kernel (args[ik]), stride (args[is], empty = kernel), padding, dilation
 * (ids < 0: none) over the last k dims, plus ceil mode's extra high padding
 * so that the window count is the output's. */
static void pool_window(const tpu_call_t* c, int k, int ik, int is, int ip, int idl,
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
static ref_t centred_sum_squares(em_t* e, ref_t a, int nr, const int64_t* dims, double cnt,
                                 ref_t* mean, ref_t* xc) {
  *mean = scalar_op(e, "stablehlo.divide", reduce_keep(e, a, nr, dims, "stablehlo.add", 0), cnt);
  *xc = binop(e, "stablehlo.subtract", a, bcast(e, *mean, a.nd, a.sz));
  return reduce_keep(e, binop(e, "stablehlo.multiply", *xc, *xc), nr, dims, "stablehlo.add", 0);
}

static ref_t dot_general(em_t* e, ref_t a, ref_t b, int nbatch, int ca, int cb, ref_t res,
                         tpu_precision_t p) {
  const char* prec = a.dt != TPU_F32 || p == TPU_PRECISION_MEDIUM ? "DEFAULT"
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

/* the value a tensor argument reads */
static ref_t read_tensor(em_t* e, const tpu_tensor_t* t) {
  if (t->flags & TPU_TENSOR_CPU_SCALAR) return cst(e, t->dtype, tpu_tensor_get_f64(t, 0));
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
static void write_tensor(em_t* e, const tpu_tensor_t* t, ref_t w, bool visible) {
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
typedef struct {
  em_t* e;
  const tpu_call_t* c;
  const tpu_tensor_t* o; /* first output */
} node_t;

static bool is_tensor(const node_t* n, int i) {
  return i < n->c->nargs && n->c->args[i].kind == TPU_ARG_TENSOR;
}
static bool is_number(const node_t* n, int i) {
  if (i >= n->c->nargs) return false;
  tpu_arg_kind_t k = n->c->args[i].kind;
  return k == TPU_ARG_INT || k == TPU_ARG_DOUBLE || k == TPU_ARG_BOOL;
}

static ref_t arg(node_t* n, int i) { return read_tensor(n->e, n->c->args[i].v.t); }

/* argument i (tensor or number) as dt, broadcast to (nd, sz) */
static ref_t arg_as(node_t* n, int i, tpu_dtype_t dt, int nd, const int64_t* sz) {
  if (is_tensor(n, i)) return bcast(n->e, convert(n->e, arg(n, i), dt), nd, sz);
  return cst_like(n->e, dt, tpu_arg_f64(n->c, i, 0), nd, sz);
}

static ref_t arg_out(node_t* n, int i, tpu_dtype_t dt) { return arg_as(n, i, dt, n->o->ndim, n->o->sizes); }

static ref_t out_ref(const node_t* n, tpu_dtype_t dt) { return mkref(dt, n->o->ndim, n->o->sizes); }

/* dtype two operands compare/compute in (PyTorch's result_type) */
static tpu_dtype_t common_type(node_t* n, int a, int b) {
  const tpu_tensor_t* ts[2];
  int k = 0;
  tpu_tensor_t tmp;
  if (is_tensor(n, a)) ts[k++] = n->c->args[a].v.t;
  if (is_tensor(n, b)) ts[k++] = n->c->args[b].v.t;
  if (k == 1 && is_number(n, b)) { /* a Python number takes part as a wrapped number */
    memset(&tmp, 0, sizeof tmp);
    tpu_arg_kind_t kind = n->c->args[b].kind;
    tmp.dtype = kind == TPU_ARG_DOUBLE ? TPU_F64 : kind == TPU_ARG_BOOL ? TPU_BOOL : TPU_I64;
    tmp.flags = TPU_TENSOR_WRAPPED_NUMBER;
    ts[k++] = &tmp;
  }
  return k ? tpu_result_type(ts, k) : TPU_F32;
}

static int norm_dim(int64_t d, int nd) { return (int)(d < 0 ? d + (nd ? nd : 1) : d); }

/* reduction dims from argument i (a list, an int, or absent/empty = all) */
static int red_dims(const node_t* n, int i, int nd, int64_t* dims) {
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
static tpu_dtype_t acc_type(tpu_dtype_t dt) { return is_half(dt) ? TPU_F32 : dt; }

static const struct {
  const char *aten, *hlo;
} k_unary[] = {
    {"neg", "stablehlo.negate"},        {"exp", "stablehlo.exponential"},
    {"log", "stablehlo.log"},           {"tanh", "stablehlo.tanh"},
    {"sqrt", "stablehlo.sqrt"},         {"rsqrt", "stablehlo.rsqrt"},
    {"abs", "stablehlo.abs"},           {"sigmoid", "stablehlo.logistic"},
    {"sin", "stablehlo.sine"},          {"cos", "stablehlo.cosine"},
    {"tan", "stablehlo.tan"},           {"floor", "stablehlo.floor"},
    {"ceil", "stablehlo.ceil"},         {"sign", "stablehlo.sign"},
    {"sgn", "stablehlo.sign"},          {"log1p", "stablehlo.log_plus_one"},
    {"expm1", "stablehlo.exponential_minus_one"}, {"erf", "chlo.erf"},
    {"bitwise_not", "stablehlo.not"},   {"atan", "chlo.atan"},
    {"asin", "chlo.asin"},              {"acos", "chlo.acos"},
    {"sinh", "chlo.sinh"},              {"cosh", "chlo.cosh"},
    {"lgamma", "chlo.lgamma"},          {"digamma", "chlo.digamma"},
    {"erfinv", "chlo.erf_inv"},
};

static const struct {
  const char *aten, *hlo;
} k_binary[] = {
    {"mul", "stablehlo.multiply"},     {"maximum", "stablehlo.maximum"},
    {"minimum", "stablehlo.minimum"},  {"pow", "stablehlo.power"},
    {"atan2", "stablehlo.atan2"},      {"fmod", "stablehlo.remainder"},
    {"bitwise_and", "stablehlo.and"},  {"bitwise_or", "stablehlo.or"},
    {"bitwise_xor", "stablehlo.xor"},
};

static const struct {
  const char *aten, *dir;
} k_compare[] = {{"eq", "EQ"}, {"ne", "NE"}, {"lt", "LT"}, {"le", "LE"}, {"gt", "GT"}, {"ge", "GE"}};

static ref_t gelu(em_t* e, ref_t x, const char* approx) {
  ref_t half = scalar_op(e, "stablehlo.multiply", x, 0.5);
  ref_t inner;
  if (approx && !strcmp(approx, "tanh")) {
    ref_t x3 = binop(e, "stablehlo.multiply", binop(e, "stablehlo.multiply", x, x), x);
    ref_t s = binop(e, "stablehlo.add", x, scalar_op(e, "stablehlo.multiply", x3, 0.044715));
    inner = unop(e, "stablehlo.tanh", scalar_op(e, "stablehlo.multiply", s, sqrt(2.0 / M_PI)));
  } else {
    inner = unop(e, "chlo.erf", scalar_op(e, "stablehlo.multiply", x, M_SQRT1_2));
  }
  return binop(e, "stablehlo.multiply", half, scalar_op(e, "stablehlo.add", inner, 1.0));
}

/* d gelu(x) / dx */
static ref_t gelu_grad(em_t* e, ref_t x, const char* approx) {
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
static ref_t one_hot(em_t* e, ref_t target, int64_t n, int axis) {
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
static bool emit_op(node_t* n, const char* base, ref_t* outs) {
  em_t* e = n->e;
  const tpu_call_t* c = n->c;
  const tpu_tensor_t* o = n->o;
  const tpu_dtype_t odt = o ? o->dtype : TPU_DTYPE_NONE;
  const char* ovl = strchr(c->op->name, '.');
  ovl = ovl ? ovl + 1 : "";
  if (!o) return false;

  for (size_t i = 0; i < sizeof k_unary / sizeof k_unary[0]; i++)
    if (!strcmp(base, k_unary[i].aten) && is_tensor(n, 0)) {
      outs[0] = unop(e, k_unary[i].hlo, arg_out(n, 0, odt));
      return true;
    }
  for (size_t i = 0; i < sizeof k_binary / sizeof k_binary[0]; i++)
    if (!strcmp(base, k_binary[i].aten) && (is_tensor(n, 0) || is_number(n, 0)) &&
        (is_tensor(n, 1) || is_number(n, 1))) {
      outs[0] = binop(e, k_binary[i].hlo, arg_out(n, 0, odt), arg_out(n, 1, odt));
      return true;
    }
  for (size_t i = 0; i < sizeof k_compare / sizeof k_compare[0]; i++)
    if (!strcmp(base, k_compare[i].aten)) {
      tpu_dtype_t ct = common_type(n, 0, 1);
      outs[0] = compare(e, k_compare[i].dir, arg_out(n, 0, ct), arg_out(n, 1, ct));
      return true;
    }
  if (!strcmp(base, "add") || !strcmp(base, "sub") || !strcmp(base, "rsub")) {
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    double alpha = tpu_arg_f64(c, 2, 1.0);
    if (!strcmp(base, "rsub")) {
      ref_t t = a;
      a = b;
      b = t;
    }
    if (alpha != 1.0) b = scalar_op(e, "stablehlo.multiply", b, alpha);
    outs[0] = binop(e, strcmp(base, "add") ? "stablehlo.subtract" : "stablehlo.add", a, b);
    return true;
  }
  if (!strcmp(base, "div")) {
    const char* mode = tpu_arg_str(c, 2, NULL);
    if (mode && tpu_dtype_is_integral(odt, true)) return false;
    ref_t q = binop(e, "stablehlo.divide", arg_out(n, 0, odt), arg_out(n, 1, odt));
    if (mode && !strcmp(mode, "floor")) q = unop(e, "stablehlo.floor", q);
    else if (mode && !strcmp(mode, "trunc"))
      q = select3(e, compare(e, "LT", q, cst_like(e, odt, 0, q.nd, q.sz)), unop(e, "stablehlo.ceil", q),
                  unop(e, "stablehlo.floor", q));
    outs[0] = q;
    return true;
  }
  if (!strcmp(base, "reciprocal")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.divide", cst_like(e, odt, 1, x.nd, x.sz), x);
    return true;
  }
  if (!strcmp(base, "square")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.multiply", x, x);
    return true;
  }
  if (!strcmp(base, "log2") || !strcmp(base, "log10")) {
    ref_t x = unop(e, "stablehlo.log", arg_out(n, 0, odt));
    outs[0] = scalar_op(e, "stablehlo.divide", x, log(!strcmp(base, "log2") ? 2.0 : 10.0));
    return true;
  }
  if (!strcmp(base, "exp2")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.power", cst_like(e, odt, 2, x.nd, x.sz), x);
    return true;
  }
  if (!strcmp(base, "round") && strncmp(ovl, "decimals", 8) && tpu_dtype_is_float(odt)) {
    outs[0] = unop(e, "stablehlo.round_nearest_even", arg_out(n, 0, odt));
    return true;
  }
  if (!strcmp(base, "trunc") && tpu_dtype_is_float(odt)) {
    ref_t q = arg_out(n, 0, odt);
    outs[0] = select3(e, compare(e, "LT", q, cst_like(e, odt, 0, q.nd, q.sz)), unop(e, "stablehlo.ceil", q),
                      unop(e, "stablehlo.floor", q));
    return true;
  }
  if (!strcmp(base, "relu")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.maximum", x, cst_like(e, odt, 0, x.nd, x.sz));
    return true;
  }
  if (!strcmp(base, "silu")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.multiply", x, unop(e, "stablehlo.logistic", x));
    return true;
  }
  if (!strcmp(base, "gelu") && tpu_dtype_is_float(odt)) {
    ref_t x = arg_out(n, 0, acc_type(odt));
    outs[0] = convert(e, gelu(e, x, tpu_arg_str(c, 1, "none")), odt);
    return true;
  }
  if (!strcmp(base, "isnan")) {
    ref_t x = arg(n, 0);
    outs[0] = compare(e, "NE", x, x);
    return true;
  }
  if (!strcmp(base, "logical_not") && is_tensor(n, 0)) {
    outs[0] = unop(e, "stablehlo.not", compare(e, "NE", arg(n, 0), cst_like(e, n->c->args[0].v.t->dtype, 0, n->c->args[0].v.t->ndim, n->c->args[0].v.t->sizes)));
    return true;
  }
  if (!strcmp(base, "logical_and") || !strcmp(base, "logical_or") || !strcmp(base, "logical_xor")) {
    ref_t a = arg_out(n, 0, TPU_BOOL), b = arg_out(n, 1, TPU_BOOL);
    outs[0] = binop(e, base[8] == 'a' ? "stablehlo.and" : base[8] == 'o' ? "stablehlo.or" : "stablehlo.xor", a, b);
    return true;
  }
  if (!strcmp(base, "where") && is_tensor(n, 0)) {
    ref_t p = arg_out(n, 0, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 1, odt), arg_out(n, 2, odt));
    return true;
  }
  if (!strcmp(base, "masked_fill")) {
    ref_t p = arg_out(n, 1, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 2, odt), arg_out(n, 0, odt));
    return true;
  }
  if (!strcmp(base, "clamp") || !strcmp(base, "clamp_min") || !strcmp(base, "clamp_max")) {
    ref_t x = arg_out(n, 0, odt);
    bool has_min = strcmp(base, "clamp_max") && !tpu_arg_is_none(c, 1);
    int imax = !strcmp(base, "clamp_max") ? 1 : 2;
    bool has_max = strcmp(base, "clamp_min") && !tpu_arg_is_none(c, imax);
    if (has_min) x = binop(e, "stablehlo.maximum", x, arg_out(n, 1, odt));
    if (has_max) x = binop(e, "stablehlo.minimum", x, arg_out(n, imax, odt));
    outs[0] = x;
    return true;
  }
  if (!strcmp(base, "addcmul") || !strcmp(base, "addcdiv")) {
    ref_t t = binop(e, base[4] == 'm' ? "stablehlo.multiply" : "stablehlo.divide", arg_out(n, 1, odt),
                    arg_out(n, 2, odt));
    double v = tpu_arg_f64(c, 3, 1.0);
    if (v != 1.0) t = scalar_op(e, "stablehlo.multiply", t, v);
    outs[0] = binop(e, "stablehlo.add", arg_out(n, 0, odt), t);
    return true;
  }
  if (!strcmp(base, "lerp")) { /* self + weight * (end - self) */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt), w = arg_out(n, 2, odt);
    outs[0] = binop(e, "stablehlo.add", a, binop(e, "stablehlo.multiply", w, binop(e, "stablehlo.subtract", b, a)));
    return true;
  }
  if (!strcmp(base, "_to_copy") || !strcmp(base, "clone") || !strcmp(base, "alias_copy") ||
      !strcmp(base, "lift_fresh_copy")) {
    outs[0] = arg_out(n, 0, odt);
    return true;
  }
  if (!strcmp(base, "copy")) { /* copy_(self, src): self takes src's values */
    outs[0] = arg_out(n, 1, odt);
    return true;
  }
  if (!strcmp(base, "fill") || !strcmp(base, "full") || !strcmp(base, "full_like")) {
    /* fill(self, value), full(size, value), full_like(self, value) */
    outs[0] = arg_out(n, 1, odt);
    return true;
  }
  if (!strcmp(base, "zero") || !strcmp(base, "zeros") || !strcmp(base, "zeros_like") ||
      !strcmp(base, "ones") || !strcmp(base, "ones_like")) {
    outs[0] = cst_like(e, odt, base[0] == 'o' ? 1 : 0, o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "arange") && o->ndim == 1) {
    double start = 0, step = 1;
    if (!strcmp(ovl, "start") || !strcmp(ovl, "start_step") || !strcmp(ovl, "start_out")) start = tpu_arg_f64(c, 0, 0);
    if (!strcmp(ovl, "start_step") || !strcmp(ovl, "start_out")) step = tpu_arg_f64(c, 2, 1);
    tpu_dtype_t ct = tpu_dtype_is_float(odt) ? TPU_F64 : TPU_I64;
    ref_t i = emit(e, "stablehlo.iota", 0, NULL, mkref(ct, 1, o->sizes), "iota_dimension = 0 : i64");
    if (step != 1) i = scalar_op(e, "stablehlo.multiply", i, step);
    if (start != 0) i = scalar_op(e, "stablehlo.add", i, start);
    outs[0] = convert(e, i, odt);
    return true;
  }
  if ((!strcmp(base, "tril") || !strcmp(base, "triu")) && o->ndim >= 2) {
    ref_t x = arg_out(n, 0, odt);
    int64_t k = tpu_arg_i64(c, 1, 0);
    const int nd = o->ndim;
    ref_t row = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, o->sizes), "iota_dimension = %d : i64", nd - 2);
    ref_t col = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, o->sizes), "iota_dimension = %d : i64", nd - 1);
    ref_t diff = scalar_op(e, "stablehlo.subtract", binop(e, "stablehlo.subtract", col, row), (double)k);
    ref_t keep = compare(e, base[2] == 'i' && base[3] == 'l' ? "LE" : "GE", diff, cst_like(e, TPU_I64, 0, nd, o->sizes));
    outs[0] = select3(e, keep, x, cst_like(e, odt, 0, nd, o->sizes));
    return true;
  }
  /* matmuls */
  if (!strcmp(base, "mm") || !strcmp(base, "bmm") || !strcmp(base, "addmm") || !strcmp(base, "baddbmm") ||
      !strcmp(base, "mv") || !strcmp(base, "dot") || !strcmp(base, "addmv")) {
    const bool add = base[0] == 'a' || (base[0] == 'b' && base[1] == 'a');
    const int i0 = add ? 1 : 0;
    /* half inputs accumulate in f32 (dot_general's result type) and round once at the end,
     * bias included, as PyTorch does */
    const tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, i0), odt), b = convert(e, arg(n, i0 + 1), odt);
    const bool batched = strstr(base, "bmm") != NULL;
    ref_t r = dot_general(e, a, b, batched ? 1 : 0, a.nd - 1, batched ? 1 : 0, out_ref(n, ct), c->precision);
    if (add) {
      double beta = tpu_arg_f64(c, i0 + 2, 1.0), alpha = tpu_arg_f64(c, i0 + 3, 1.0);
      if (alpha != 1.0) r = scalar_op(e, "stablehlo.multiply", r, alpha);
      if (beta != 0.0) {
        ref_t s = arg_out(n, 0, ct);
        if (beta != 1.0) s = scalar_op(e, "stablehlo.multiply", s, beta);
        r = binop(e, "stablehlo.add", s, r);
      }
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  /* reductions: (self, dim, keepdim, dtype) or (self, dtype) */
  if (!strcmp(base, "sum") || !strcmp(base, "mean") || !strcmp(base, "amax") || !strcmp(base, "amin") ||
      !strcmp(base, "prod") || ((!strcmp(base, "max") || !strcmp(base, "min")) && c->nouts == 1 &&
                                !is_tensor(n, 1) && c->nargs <= 2)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    /* (self, dim, keepdim, ...) rather than (self, dtype) */
    const bool has_dims = (c->nargs > 1 && c->args[1].kind == TPU_ARG_INTLIST) ||
                          (c->nargs > 2 && c->args[2].kind == TPU_ARG_BOOL);
    int nr = red_dims(n, has_dims ? 1 : -1, x->ndim, dims);
    tpu_dtype_t ct = odt;
    if (!strcmp(base, "sum") || !strcmp(base, "mean") || !strcmp(base, "prod")) ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t r;
    if (base[0] == 's') r = reduce(e, a, nr, dims, "stablehlo.add", 0);
    else if (base[0] == 'p') r = reduce(e, a, nr, dims, "stablehlo.multiply", 1);
    else if (!strcmp(base, "mean")) {
      int64_t cnt = 1;
      for (int k = 0; k < nr; k++) cnt *= x->sizes[dims[k]];
      r = scalar_op(e, "stablehlo.divide", reduce(e, a, nr, dims, "stablehlo.add", 0), (double)cnt);
    } else {
      bool mx = !strcmp(base, "amax") || !strcmp(base, "max");
      double init = tpu_dtype_is_float(ct) ? (mx ? -INFINITY : INFINITY)
                    : ct == TPU_BOOL       ? (mx ? 0 : 1)
                    : ct == TPU_U8         ? (mx ? 0 : 255)
                    : ct == TPU_I8         ? (mx ? -128 : 127)
                    : ct == TPU_I16        ? (mx ? -32768 : 32767)
                    : ct == TPU_I32        ? (mx ? -2147483648.0 : 2147483647.0)
                                           : (mx ? -9223372036854775807.0 - 1 : 9223372036854775807.0);
      r = reduce(e, a, nr, dims, mx ? "stablehlo.maximum" : "stablehlo.minimum", init);
    }
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "_softmax") || !strcmp(base, "_log_softmax")) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dim = norm_dim(tpu_arg_i64(c, 1, -1), x->ndim);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    if (x->ndim == 0) {
      outs[0] = convert(e, cst_like(e, ct, base[1] == 'l' ? 0 : 1, 0, NULL), odt);
      return true;
    }
    ref_t m = bcast(e, reduce_keep(e, a, 1, &dim, "stablehlo.maximum", -INFINITY), a.nd, a.sz);
    ref_t z = binop(e, "stablehlo.subtract", a, m);
    ref_t ez = unop(e, "stablehlo.exponential", z);
    ref_t s = bcast(e, reduce_keep(e, ez, 1, &dim, "stablehlo.add", 0), a.nd, a.sz);
    ref_t r = base[1] == 'l' ? binop(e, "stablehlo.subtract", z, unop(e, "stablehlo.log", s))
                             : binop(e, "stablehlo.divide", ez, s);
    outs[0] = convert(e, r, odt);
    return true;
  }
  if (!strcmp(base, "native_layer_norm") && c->nouts == 3) {
    /* (input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int k = c->args[1].n;
    int64_t dims[TPU_MAX_DIMS], cnt = 1;
    for (int i = 0; i < k; i++) {
      dims[i] = x->ndim - k + i;
      cnt *= x->sizes[dims[i]];
    }
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t mean, xc;
    ref_t var = scalar_op(e, "stablehlo.divide", centred_sum_squares(e, a, k, dims, (double)cnt, &mean, &xc),
                          (double)cnt);
    ref_t rstd = unop(e, "stablehlo.rsqrt", scalar_op(e, "stablehlo.add", var, tpu_arg_f64(c, 4, 1e-5)));
    ref_t y = binop(e, "stablehlo.multiply", xc, bcast(e, rstd, a.nd, a.sz));
    if (is_tensor(n, 2)) y = binop(e, "stablehlo.multiply", y, arg_as(n, 2, ct, a.nd, a.sz));
    if (is_tensor(n, 3)) y = binop(e, "stablehlo.add", y, arg_as(n, 3, ct, a.nd, a.sz));
    outs[0] = convert(e, y, odt);
    outs[1] = convert(e, reshape(e, mean, c->outs[1].ndim, c->outs[1].sizes), c->outs[1].dtype);
    outs[2] = convert(e, reshape(e, rstd, c->outs[2].ndim, c->outs[2].sizes), c->outs[2].dtype);
    return true;
  }
  /* ---- activations ---- */
  if (tpu_dtype_is_float(odt) && is_tensor(n, 0) &&
      (!strcmp(base, "leaky_relu") || !strcmp(base, "elu") || !strcmp(base, "hardswish") ||
       !strcmp(base, "softplus") || !strcmp(base, "mish") || !strcmp(base, "hardsigmoid") ||
       !strcmp(base, "hardtanh") || !strcmp(base, "relu6"))) {
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = arg_out(n, 0, ct), zero = cst_like(e, ct, 0, x.nd, x.sz), y;
    ref_t pos = compare(e, "GT", x, zero);
    if (!strcmp(base, "leaky_relu")) {
      y = select3(e, pos, x, scalar_op(e, "stablehlo.multiply", x, tpu_arg_f64(c, 1, 0.01)));
    } else if (!strcmp(base, "elu")) { /* (self, alpha, scale, input_scale) */
      double alpha = tpu_arg_f64(c, 1, 1), scale = tpu_arg_f64(c, 2, 1), in_scale = tpu_arg_f64(c, 3, 1);
      ref_t neg = scalar_op(e, "stablehlo.multiply",
                            unop(e, "stablehlo.exponential_minus_one", scalar_op(e, "stablehlo.multiply", x, in_scale)),
                            alpha * scale);
      y = select3(e, pos, scalar_op(e, "stablehlo.multiply", x, scale), neg);
    } else if (!strcmp(base, "hardswish") || !strcmp(base, "hardsigmoid")) {
      ref_t in3[3] = {zero, scalar_op(e, "stablehlo.add", x, 3), cst_like(e, ct, 6, x.nd, x.sz)};
      ref_t r6 = emit(e, "stablehlo.clamp", 3, in3, x, NULL);
      ref_t hs = scalar_op(e, "stablehlo.divide", r6, 6);
      y = !strcmp(base, "hardswish") ? binop(e, "stablehlo.multiply", x, hs) : hs;
    } else if (!strcmp(base, "hardtanh") || !strcmp(base, "relu6")) {
      double lo = base[0] == 'r' ? 0 : tpu_arg_f64(c, 1, -1), hi = base[0] == 'r' ? 6 : tpu_arg_f64(c, 2, 1);
      ref_t in3[3] = {cst_like(e, ct, lo, x.nd, x.sz), x, cst_like(e, ct, hi, x.nd, x.sz)};
      y = emit(e, "stablehlo.clamp", 3, in3, x, NULL);
    } else { /* softplus (self, beta, threshold) and mish = x * tanh(softplus(x)) */
      double beta = base[0] == 's' ? tpu_arg_f64(c, 1, 1) : 1, thr = base[0] == 's' ? tpu_arg_f64(c, 2, 20) : 20;
      ref_t bx = scalar_op(e, "stablehlo.multiply", x, beta);
      ref_t sp = scalar_op(e, "stablehlo.divide", unop(e, "stablehlo.log_plus_one", unop(e, "stablehlo.exponential", bx)), beta);
      sp = select3(e, compare(e, "GT", bx, cst_like(e, ct, thr, x.nd, x.sz)), x, sp);
      y = base[0] == 's' ? sp : binop(e, "stablehlo.multiply", x, unop(e, "stablehlo.tanh", sp));
    }
    outs[0] = convert(e, y, odt);
    return true;
  }
  if ((!strcmp(base, "isneginf") || !strcmp(base, "isposinf") || !strcmp(base, "isinf")) && is_tensor(n, 0)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    if (!tpu_dtype_is_float(x->dtype)) {
      outs[0] = cst_like(e, TPU_BOOL, 0, o->ndim, o->sizes);
      return true;
    }
    ref_t a = arg(n, 0);
    ref_t v = base[2] == 'i' ? unop(e, "stablehlo.abs", a) : a;
    outs[0] = compare(e, "EQ", v, cst_like(e, a.dt, base[2] == 'n' ? -INFINITY : INFINITY, a.nd, a.sz));
    return true;
  }
  if (!strcmp(base, "remainder") && tpu_dtype_is_float(odt)) { /* a - floor(a / b) * b */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t q = unop(e, "stablehlo.floor", binop(e, "stablehlo.divide", a, b));
    outs[0] = binop(e, "stablehlo.subtract", a, binop(e, "stablehlo.multiply", q, b));
    return true;
  }
  if (!strcmp(base, "remainder") && (odt == TPU_I64 || odt == TPU_I32 || odt == TPU_I16 || odt == TPU_I8)) {
    /* the truncated remainder, moved to the divisor's sign (Python's %) */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t r = binop(e, "stablehlo.remainder", a, b), zero = cst_like(e, odt, 0, r.nd, r.sz);
    ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", r, zero),
                      compare(e, "NE", compare(e, "LT", r, zero), compare(e, "LT", b, zero)));
    outs[0] = select3(e, fix, binop(e, "stablehlo.add", r, b), r);
    return true;
  }
  if (!strcmp(base, "flip") && is_tensor(n, 0)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 1, x->ndim, dims);
    char b[600];
    ref_t a = arg(n, 0);
    outs[0] = nr ? emit(e, "stablehlo.reverse", 1, &a, a, "dimensions = %s", i64arr(b, sizeof b, nr, dims)) : a;
    return true;
  }
  /* ---- reductions ---- */
  if ((!strcmp(base, "var") || !strcmp(base, "std") || !strcmp(base, "var_mean") || !strcmp(base, "std_mean")) &&
      tpu_dtype_is_float(odt) && !strcmp(ovl, "correction")) {
    /* (self, dim?, correction?, keepdim) -> var or std (, mean) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS], cnt = 1;
    int nr = red_dims(n, 1, x->ndim, dims);
    for (int k = 0; k < nr; k++) cnt *= x->sizes[dims[k]];
    const double corr = tpu_arg_is_none(c, 2) ? 1.0 : tpu_arg_f64(c, 2, 1.0);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t mean, xc;
    ref_t ss = centred_sum_squares(e, a, nr, dims, (double)cnt, &mean, &xc);
    double div = (double)cnt - corr;
    ref_t v = scalar_op(e, "stablehlo.divide", ss, div > 0 ? div : 0.0);
    if (!strncmp(base, "std", 3)) v = unop(e, "stablehlo.sqrt", v);
    outs[0] = reshape(e, convert(e, v, odt), o->ndim, o->sizes);
    if (c->nouts > 1)
      outs[1] = reshape(e, convert(e, mean, c->outs[1].dtype), c->outs[1].ndim, c->outs[1].sizes);
    return true;
  }
  if (!strcmp(base, "logsumexp") && tpu_dtype_is_float(odt)) { /* (self, dim, keepdim) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 1, x->ndim, dims);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t m = reduce_keep(e, a, nr, dims, "stablehlo.maximum", -INFINITY);
    /* an infinite max shifts by 0 (keeps inf and -inf rows exact) */
    ref_t finite = compare(e, "LT", unop(e, "stablehlo.abs", m), cst_like(e, ct, INFINITY, m.nd, m.sz));
    m = select3(e, finite, m, cst_like(e, ct, 0, m.nd, m.sz));
    ref_t sh = unop(e, "stablehlo.exponential", binop(e, "stablehlo.subtract", a, bcast(e, m, a.nd, a.sz)));
    ref_t r = binop(e, "stablehlo.add", unop(e, "stablehlo.log", reduce_keep(e, sh, nr, dims, "stablehlo.add", 0)), m);
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "linalg_vector_norm") && tpu_dtype_is_float(odt)) {
    /* (self, ord, dim?, keepdim, dtype?) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 2, x->ndim, dims);
    const double p = tpu_arg_f64(c, 1, 2);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = unop(e, "stablehlo.abs", convert(e, arg(n, 0), ct)), r;
    if (isinf(p)) {
      r = reduce(e, a, nr, dims, p > 0 ? "stablehlo.maximum" : "stablehlo.minimum", p > 0 ? 0 : INFINITY);
    } else if (p == 0) {
      r = reduce(e, convert(e, compare(e, "NE", a, cst_like(e, ct, 0, a.nd, a.sz)), ct), nr, dims, "stablehlo.add", 0);
    } else if (p == 1) {
      r = reduce(e, a, nr, dims, "stablehlo.add", 0);
    } else if (p == 2) {
      r = unop(e, "stablehlo.sqrt", reduce(e, binop(e, "stablehlo.multiply", a, a), nr, dims, "stablehlo.add", 0));
    } else {
      ref_t s2 = reduce(e, binop(e, "stablehlo.power", a, cst_like(e, ct, p, a.nd, a.sz)), nr, dims, "stablehlo.add", 0);
      r = binop(e, "stablehlo.power", s2, cst_like(e, ct, 1.0 / p, s2.nd, s2.sz));
    }
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  if ((!strcmp(base, "any") || !strcmp(base, "all")) && is_tensor(n, 0) && c->nouts == 1) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, c->nargs > 1 && (c->args[1].kind == TPU_ARG_INT || c->args[1].kind == TPU_ARG_INTLIST) ? 1 : -1,
                      x->ndim, dims);
    ref_t a = arg(n, 0);
    ref_t nz = a.dt == TPU_BOOL ? a : compare(e, "NE", a, cst_like(e, a.dt, 0, a.nd, a.sz));
    ref_t r = reduce(e, nz, nr, dims, base[1] == 'n' ? "stablehlo.or" : "stablehlo.and", base[1] == 'n' ? 0 : 1);
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  if ((!strcmp(base, "argmax") || !strcmp(base, "argmin") ||
       ((!strcmp(base, "max") || !strcmp(base, "min")) && c->nouts == 2)) && is_tensor(n, 0)) {
    /* argmax(self, dim?, keepdim) / max.dim(self, dim, keepdim) -> (values, indices) */
    const tpu_tensor_t* x = c->args[0].v.t;
    const bool mx = !strcmp(base, "argmax") || !strcmp(base, "max");
    const bool has_dim = c->nargs > 1 && c->args[1].kind == TPU_ARG_INT;
    if (!tpu_dtype_is_float(x->dtype) && x->dtype != TPU_BOOL && x->dtype != TPU_I64) return false;
    ref_t a = arg(n, 0);
    if (!has_dim) { /* over the flattened tensor */
      int64_t flat[1] = {numel(&a)};
      a = reshape(e, a, 1, flat);
    }
    const int dim = has_dim ? norm_dim(c->args[1].v.i, x->ndim) : 0;
    int64_t dims[1] = {dim};
    if (a.nd == 0) {
      int64_t one[1] = {1};
      a = reshape(e, a, 1, one);
      dims[0] = 0;
    }
    ref_t idx = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, a.nd, a.sz), "iota_dimension = %d : i64", (int)dims[0]);
    double init_v = tpu_dtype_is_float(a.dt) ? (mx ? -INFINITY : INFINITY)
                    : a.dt == TPU_BOOL ? (mx ? 0 : 1) : (mx ? -9223372036854775807.0 - 1 : 9223372036854775807.0);
    ref_t in[2] = {a, idx}, init[2] = {cst(e, a.dt, init_v), cst(e, TPU_I64, (double)INT64_MAX)};
    ref_t r[2];
    reduce_pair(e, in, init, 1, dims, mx ? argmax_first_body : argmin_first_body, r);
    if (c->nouts == 2) {
      outs[0] = reshape(e, convert(e, r[0], odt), o->ndim, o->sizes);
      outs[1] = reshape(e, convert(e, r[1], c->outs[1].dtype), c->outs[1].ndim, c->outs[1].sizes);
    } else {
      outs[0] = reshape(e, convert(e, r[1], odt), o->ndim, o->sizes);
    }
    return true;
  }
  if ((!strcmp(base, "cumsum") || !strcmp(base, "cumprod")) && is_tensor(n, 0)) {
    /* (self, dim, dtype?): a window over everything before along dim */
    const tpu_tensor_t* x = c->args[0].v.t;
    tpu_dtype_t ct = tpu_dtype_is_float(odt) ? acc_type(odt) : odt;
    ref_t a = convert(e, arg(n, 0), ct);
    if (a.nd == 0) {
      outs[0] = convert(e, a, odt);
      return true;
    }
    const int dim = norm_dim(tpu_arg_i64(c, 1, 0), x->ndim);
    window_t w;
    for (int d = 0; d < a.nd; d++) {
      w.win[d] = w.str[d] = w.dil[d] = 1;
      w.lo[d] = w.hi[d] = 0;
    }
    w.win[dim] = a.sz[dim];
    w.lo[dim] = a.sz[dim] - 1;
    const bool sum = base[3] == 's';
    ref_t init = cst(e, ct, sum ? 0 : 1), r;
    reduce_window_n(e, 1, &a, &init, &w, sum ? sum_body : prod_body, &r);
    outs[0] = convert(e, r, odt);
    return true;
  }
  if (!strcmp(base, "mse_loss") && tpu_dtype_is_float(odt)) { /* (self, target, reduction) */
    tpu_dtype_t ct = acc_type(odt);
    const tpu_tensor_t* x = c->args[0].v.t;
    ref_t a = convert(e, arg(n, 0), ct), t = bcast(e, convert(e, arg(n, 1), ct), a.nd, a.sz);
    ref_t d = binop(e, "stablehlo.subtract", a, t), sq = binop(e, "stablehlo.multiply", d, d);
    const int64_t red = tpu_arg_i64(c, 2, 1);
    if (red != 0) {
      int64_t dims[TPU_MAX_DIMS];
      int nr = red_dims(n, -1, x->ndim, dims);
      sq = reduce(e, sq, nr, dims, "stablehlo.add", 0);
      if (red == 1) sq = scalar_op(e, "stablehlo.divide", sq, (double)tpu_tensor_numel(x));
    }
    outs[0] = reshape(e, convert(e, sq, odt), o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "roll") && is_tensor(n, 0)) { /* (self, shifts, dims) */
    const tpu_arg_t* sh = &c->args[1];
    const tpu_arg_t* dm = c->nargs > 2 ? &c->args[2] : NULL;
    const bool flat = !dm || dm->kind != TPU_ARG_INTLIST || dm->n == 0;
    if (!flat && (sh->kind != TPU_ARG_INTLIST || sh->n != dm->n)) return false; /* checked before emitting */
    ref_t a = arg(n, 0);
    if (flat) { /* over the flattened tensor */
      int64_t flat[1] = {numel(&a)};
      outs[0] = reshape(e, roll_dim(e, reshape(e, a, 1, flat), 0, sh->n ? sh->v.ilist[0] : 0), o->ndim, o->sizes);
      return true;
    }
    for (int k = 0; k < dm->n; k++) a = roll_dim(e, a, norm_dim(dm->v.ilist[k], a.nd), sh->v.ilist[k]);
    outs[0] = a;
    return true;
  }
  if (!strcmp(base, "gather") && is_tensor(n, 2) && c->args[0].v.t->ndim > 0) {
    /* (self, dim, index, sparse_grad): out[..i..] = self[..index[..i..]..] along dim */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int nd = x->ndim, dim = norm_dim(tpu_arg_i64(c, 1, 0), nd);
    ref_t idx = convert(e, arg(n, 2), TPU_I64);
    ref_t coords = dim_coords(e, idx, dim);
    int64_t all[TPU_MAX_DIMS], ones[TPU_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
      all[d] = d;
      ones[d] = 1;
    }
    ref_t in[2] = {arg(n, 0), coords};
    char b1[256], b2[256], b3[256];
    outs[0] = emit(e, "stablehlo.gather", 2, in, mkref(x->dtype, nd, idx.sz),
                   "dimension_numbers = #stablehlo.gather<offset_dims = [], collapsed_slice_dims = [%s], "
                   "start_index_map = [%s], index_vector_dim = %d>, slice_sizes = %s, indices_are_sorted = false",
                   ints(b1, sizeof b1, nd, all), ints(b2, sizeof b2, nd, all), nd, i64arr(b3, sizeof b3, nd, ones));
    return true;
  }
  if (!strcmp(base, "upsample_nearest2d") && c->nouts == 1 && is_tensor(n, 0)) {
    /* (self, output_size, scales_h?, scales_w?): source = min(floor(dst * scale), in - 1),
     * scale = 1 / scales when given, else in / out (float32 arithmetic, as PyTorch) */
    const tpu_tensor_t* x = c->args[0].v.t;
    ref_t a = arg(n, 0);
    for (int j = 0; j < 2; j++) {
      const int d = x->ndim - 2 + j;
      const int64_t in = x->sizes[d], out = o->sizes[d];
      const bool given = c->nargs > 2 + j && is_number(n, 2 + j) && tpu_arg_f64(c, 2 + j, 0) > 0;
      const float scale = given ? (float)(1.0 / tpu_arg_f64(c, 2 + j, 1)) : (float)in / (float)out;
      int64_t* src = malloc(sizeof(int64_t) * (size_t)(out ? out : 1));
      if (!src) {
        e->oom = true;
        return false;
      }
      for (int64_t i = 0; i < out; i++) {
        int64_t s0 = (int64_t)floorf((float)i * scale);
        src[i] = s0 < in - 1 ? s0 : in - 1;
      }
      if (in != out || given) a = take_along(e, a, d, cst_i64_list(e, out, src));
      free(src);
    }
    outs[0] = a;
    return true;
  }
  if (!strcmp(base, "native_group_norm") && c->nouts == 3 && tpu_dtype_is_float(odt)) {
    /* (input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean [N, G], rstd [N, G]) */
    const int64_t N = tpu_arg_i64(c, 3, 0), C = tpu_arg_i64(c, 4, 0), HW = tpu_arg_i64(c, 5, 0),
                  G = tpu_arg_i64(c, 6, 1);
    if (G <= 0 || C % G || N * C * HW == 0) return false;
    const double eps = tpu_arg_f64(c, 7, 1e-5);
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct);
    int64_t gsz[3] = {N, G, C / G * HW}, red[1] = {2};
    ref_t xg = reshape(e, x, 3, gsz);
    ref_t mean, xc;
    ref_t var = scalar_op(e, "stablehlo.divide", centred_sum_squares(e, xg, 1, red, (double)gsz[2], &mean, &xc),
                          (double)gsz[2]);
    ref_t rstd = unop(e, "stablehlo.rsqrt", scalar_op(e, "stablehlo.add", var, eps));
    ref_t y = binop(e, "stablehlo.multiply", xc, bcast(e, rstd, 3, gsz));
    int64_t csz[3] = {N, C, HW}, cdim[1] = {1}, cvec[1] = {C};
    y = reshape(e, y, 3, csz);
    if (is_tensor(n, 1))
      y = binop(e, "stablehlo.multiply", y, bcast_dims(e, reshape(e, convert(e, arg(n, 1), ct), 1, cvec), 3, csz, cdim));
    if (is_tensor(n, 2))
      y = binop(e, "stablehlo.add", y, bcast_dims(e, reshape(e, convert(e, arg(n, 2), ct), 1, cvec), 3, csz, cdim));
    outs[0] = reshape(e, convert(e, y, odt), o->ndim, o->sizes);
    outs[1] = reshape(e, convert(e, mean, c->outs[1].dtype), c->outs[1].ndim, c->outs[1].sizes);
    outs[2] = reshape(e, convert(e, rstd, c->outs[2].dtype), c->outs[2].ndim, c->outs[2].sizes);
    return true;
  }
  if ((!strcmp(base, "sort") || !strcmp(base, "topk")) && c->nouts == 2 && is_tensor(n, 0) &&
      (tpu_dtype_is_float(odt) || odt == TPU_I64 || odt == TPU_I32)) {
    /* sort(self, dim, descending) / sort.stable(self, stable?, dim, descending);
     * topk(self, k, dim, largest, sorted): the first k of a sort */
    const tpu_tensor_t* x = c->args[0].v.t;
    const bool topk = base[0] == 't';
    const bool stable_ovl = !strcmp(ovl, "stable");
    const int dim_arg = topk ? 2 : stable_ovl ? 2 : 1;
    const int dim = x->ndim ? norm_dim(tpu_arg_i64(c, dim_arg, -1), x->ndim) : 0;
    const bool desc = topk ? tpu_arg_bool(c, 3, true) : tpu_arg_bool(c, dim_arg + 1, false);
    ref_t a = arg(n, 0);
    if (a.nd == 0) {
      outs[0] = a;
      outs[1] = cst_like(e, c->outs[1].dtype, 0, 0, NULL);
      return true;
    }
    ref_t r[2];
    sort_with_indices(e, a, dim, desc, r);
    if (topk) {
      int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
      memcpy(hi, a.sz, sizeof(int64_t) * (size_t)a.nd);
      hi[dim] = tpu_arg_i64(c, 1, a.sz[dim]);
      r[0] = slice(e, r[0], lo, hi);
      r[1] = slice(e, r[1], lo, hi);
    }
    outs[0] = r[0];
    outs[1] = convert(e, r[1], c->outs[1].dtype);
    return true;
  }
  if (!strcmp(base, "constant_pad_nd") && is_tensor(n, 0)) { /* (self, pad, value) */
    const tpu_arg_t* pd = &c->args[1];
    if (pd->kind != TPU_ARG_INTLIST || pd->n % 2 || pd->n / 2 > c->args[0].v.t->ndim) return false;
    ref_t a = arg(n, 0);
    int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS] = {0}, in[TPU_MAX_DIMS] = {0};
    for (int j = 0; j < pd->n / 2; j++) { /* pairs from the last dim backwards */
      lo[a.nd - 1 - j] = pd->v.ilist[2 * j];
      hi[a.nd - 1 - j] = pd->v.ilist[2 * j + 1];
    }
    ref_t pin[2] = {a, cst(e, a.dt, tpu_arg_f64(c, 2, 0))};
    char bl[300], bh[300], bi[300];
    outs[0] = emit(e, "stablehlo.pad", 2, pin, out_ref(n, a.dt),
                   "edge_padding_low = %s, edge_padding_high = %s, interior_padding = %s",
                   i64arr(bl, sizeof bl, a.nd, lo), i64arr(bh, sizeof bh, a.nd, hi), i64arr(bi, sizeof bi, a.nd, in));
    return true;
  }
  if ((!strncmp(base, "reflection_pad", 14) || !strncmp(base, "replication_pad", 15)) && is_tensor(n, 0) &&
      c->args[1].kind == TPU_ARG_INTLIST && strcmp(base + strlen(base) - 8, "backward")) {
    /* (self, padding): each padded dim is a gather of source positions */
    const bool reflect = base[2] == 'f';
    const tpu_arg_t* pd = &c->args[1];
    const tpu_tensor_t* x = c->args[0].v.t;
    if (pd->n % 2 || pd->n / 2 > x->ndim) return false;
    for (int j = 0; j < pd->n / 2; j++) { /* every dim checked before anything is emitted */
      const int64_t len = x->sizes[x->ndim - 1 - j];
      if (len <= 0 || len + pd->v.ilist[2 * j] + pd->v.ilist[2 * j + 1] <= 0) return false;
    }
    ref_t a = arg(n, 0);
    for (int j = 0; j < pd->n / 2; j++) {
      const int d = a.nd - 1 - j;
      const int64_t len = a.sz[d], pl = pd->v.ilist[2 * j], pr = pd->v.ilist[2 * j + 1], out = len + pl + pr;
      int64_t* src = malloc(sizeof(int64_t) * (size_t)out);
      if (!src) {
        e->oom = true;
        return false;
      }
      for (int64_t i = 0; i < out; i++) {
        int64_t p = i - pl;
        if (reflect) p = p < 0 ? -p : p >= len ? 2 * (len - 1) - p : p;
        else p = p < 0 ? 0 : p >= len ? len - 1 : p;
        src[i] = p;
      }
      a = take_along(e, a, d, cst_i64_list(e, out, src));
      free(src);
    }
    outs[0] = a;
    return true;
  }
  if (!strcmp(base, "upsample_bilinear2d") && c->nouts == 1 && is_tensor(n, 0) && tpu_dtype_is_float(odt) &&
      c->args[1].kind == TPU_ARG_INTLIST) {
    /* (self, output_size, align_corners, scales_h?, scales_w?): per spatial dim, the two
     * source rows and the weight of the second, computed in float32 like PyTorch */
    const tpu_tensor_t* x = c->args[0].v.t;
    const bool corners = tpu_arg_bool(c, 2, false);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    for (int j = 0; j < 2; j++) {
      const int d = x->ndim - 2 + j;
      const int64_t in = x->sizes[d], out = o->sizes[d];
      const bool given = c->nargs > 3 + j && is_number(n, 3 + j) && tpu_arg_f64(c, 3 + j, 0) > 0;
      float scale;
      if (corners) scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
      else scale = given ? (float)(1.0 / tpu_arg_f64(c, 3 + j, 1)) : (float)in / (float)out;
      int64_t* i0 = malloc(sizeof(int64_t) * 2 * (size_t)out);
      float* lam = malloc(sizeof(float) * 2 * (size_t)out);
      if (!i0 || !lam) {
        free(i0);
        free(lam);
        e->oom = true;
        return false;
      }
      int64_t* i1 = i0 + out;
      float* lam0 = lam + out;
      for (int64_t i = 0; i < out; i++) {
        float src = corners ? scale * (float)i : scale * ((float)i + 0.5f) - 0.5f;
        if (!corners && src < 0) src = 0;
        int64_t f0 = (int64_t)src;
        if (f0 > in - 1) f0 = in - 1;
        i0[i] = f0;
        i1[i] = f0 < in - 1 ? f0 + 1 : f0;
        lam[i] = src - (float)f0;
        lam0[i] = 1.0f - lam[i];
      }
      ref_t lo = take_along(e, a, d, cst_i64_list(e, out, i0));
      ref_t hi = take_along(e, a, d, cst_i64_list(e, out, i1));
      int64_t dd[1] = {d};
      ref_t w1 = bcast_dims(e, convert(e, cst_f32_list(e, out, lam), ct), lo.nd, lo.sz, dd);
      ref_t w0 = bcast_dims(e, convert(e, cst_f32_list(e, out, lam0), ct), lo.nd, lo.sz, dd);
      a = binop(e, "stablehlo.add", binop(e, "stablehlo.multiply", w0, lo), binop(e, "stablehlo.multiply", w1, hi));
      free(i0);
      free(lam);
    }
    outs[0] = convert(e, a, odt);
    return true;
  }
  if (!strcmp(base, "index") && !strcmp(ovl, "Tensor") && is_tensor(n, 0) &&
      c->args[1].kind == TPU_ARG_TENSORLIST) {
    /* (self, indices): advanced indexing with index tensors on adjacent dims
     * p..p+k-1 (None elsewhere); they broadcast to B and the result is
     * self.shape[:p] + B + self.shape[p+k:]. Negative indices wrap. */
    const tpu_tensor_t* x = c->args[0].v.t;
    const tpu_arg_t* il = &c->args[1];
    int p = -1, k = 0;
    for (int i = 0; i < il->n; i++) {
      if (il->v.tlist[i].dtype == TPU_DTYPE_NONE) continue;
      if (p < 0) p = i;
      else if (i != p + k) return false; /* not adjacent: B would go first */
      if (il->v.tlist[i].dtype != TPU_I64 && il->v.tlist[i].dtype != TPU_I32) return false;
      k++;
    }
    if (p < 0 || p + k > x->ndim) return false;
    const int nb = o->ndim - (x->ndim - k); /* dims of B */
    if (nb < 0 || nb > TPU_MAX_DIMS - 1) return false;
    int64_t bsz[TPU_MAX_DIMS + 1];
    memcpy(bsz, o->sizes + p, sizeof(int64_t) * (size_t)nb);
    bsz[nb] = 1;
    ref_t parts[TPU_MAX_DIMS];
    for (int j = 0; j < k; j++) {
      ref_t ix = convert(e, read_tensor(e, &il->v.tlist[p + j]), TPU_I64);
      ix = bcast(e, ix, nb, bsz);
      const double len = (double)x->sizes[p + j];
      ref_t neg = compare(e, "LT", ix, cst_like(e, TPU_I64, 0, ix.nd, ix.sz));
      ix = select3(e, neg, scalar_op(e, "stablehlo.add", ix, len), ix);
      parts[j] = reshape(e, ix, nb + 1, bsz);
    }
    int64_t csz[TPU_MAX_DIMS + 1];
    memcpy(csz, bsz, sizeof(int64_t) * (size_t)nb);
    csz[nb] = k;
    ref_t coords = k == 1 ? parts[0]
                          : emit(e, "stablehlo.concatenate", k, parts, mkref(TPU_I64, nb + 1, csz), "dimension = %d : i64", nb);
    int64_t offs[TPU_MAX_DIMS], coll[TPU_MAX_DIMS], ssz[TPU_MAX_DIMS];
    int no = 0;
    for (int d = 0; d < x->ndim; d++) {
      const bool indexed = d >= p && d < p + k;
      ssz[d] = indexed ? 1 : x->sizes[d];
      if (indexed) coll[d - p] = d;
      else offs[no++] = d < p ? d : d - k + nb;
    }
    ref_t in[2] = {arg(n, 0), coords};
    char b1[256], b2[256], b3[256], b4[256];
    outs[0] = emit(e, "stablehlo.gather", 2, in, out_ref(n, x->dtype),
                   "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%s], "
                   "start_index_map = [%s], index_vector_dim = %d>, slice_sizes = %s, indices_are_sorted = false",
                   ints(b1, sizeof b1, no, offs), ints(b2, sizeof b2, k, coll), ints(b3, sizeof b3, k, coll), nb,
                   i64arr(b4, sizeof b4, x->ndim, ssz));
    return true;
  }
  if ((!strcmp(base, "scatter") || !strcmp(base, "scatter_add")) && is_tensor(n, 0) && is_tensor(n, 2) &&
      c->args[0].v.t->ndim > 0 && (c->nargs < 5 || c->args[4].kind == TPU_ARG_NONE)) {
    /* scatter(self, dim, index, src | value) / scatter_add(self, dim, index, src):
     * element i of index (and of src) goes to self at index[i] along dim */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int nd = x->ndim, dim = norm_dim(tpu_arg_i64(c, 1, 0), nd);
    if (c->args[2].v.t->ndim != nd) return false;
    ref_t idx = convert(e, arg(n, 2), TPU_I64);
    if (numel(&idx) == 0) {
      outs[0] = arg(n, 0);
      return true;
    }
    ref_t coords = dim_coords(e, idx, dim);
    ref_t upd;
    if (is_tensor(n, 3)) { /* src: its leading index-shaped block */
      ref_t src = convert(e, arg(n, 3), x->dtype);
      int64_t lo[TPU_MAX_DIMS] = {0};
      upd = slice(e, src, lo, idx.sz);
    } else {
      upd = cst_like(e, x->dtype, tpu_arg_f64(c, 3, 0), nd, idx.sz);
    }
    ref_t acc = block_arg(e, x->dtype), nw = block_arg(e, x->dtype);
    ref_t in[3] = {arg(n, 0), coords, upd};
    ref_t res = mkref(x->dtype, nd, x->sizes);
    res.id = e->next++;
    FILE* f = e->f;
    fprintf(f, "    %%%d = \"stablehlo.scatter\"(", res.id);
    plist(f, 3, in, false);
    fputs(") ({\n    ^bb0(", f);
    pname(f, &acc);
    fputs(": ", f);
    ptype(f, &acc);
    fputs(", ", f);
    pname(f, &nw);
    fputs(": ", f);
    ptype(f, &nw);
    fputs("):\n", f);
    ref_t v = base[7] == '_' ? binop(e, "stablehlo.add", acc, nw) : nw;
    fputs("      \"stablehlo.return\"(", f);
    pname(f, &v);
    fputs(") : (", f);
    ptype(f, &v);
    int64_t all[TPU_MAX_DIMS];
    for (int d = 0; d < nd; d++) all[d] = d;
    char b1[256], b2[256];
    fprintf(f, ") -> ()\n    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [], "
               "inserted_window_dims = [%s], scatter_dims_to_operand_dims = [%s], index_vector_dim = %d>, "
               "indices_are_sorted = false, unique_indices = false} : (",
            ints(b1, sizeof b1, nd, all), ints(b2, sizeof b2, nd, all), nd);
    plist(f, 3, in, true);
    fputs(") -> ", f);
    ptype(f, &res);
    fputc('\n', f);
    outs[0] = res;
    return true;
  }
  if (!strcmp(base, "log_sigmoid_forward") && c->nouts == 2 && tpu_dtype_is_float(odt)) {
    /* (self) -> (output, buffer): buffer = exp(-|x|), output = -(max(0, -x) + log1p(buffer)),
     * what PyTorch's CPU kernel stores (its backward reads the buffer) */
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = arg_out(n, 0, ct);
    ref_t z = unop(e, "stablehlo.exponential", unop(e, "stablehlo.negate", unop(e, "stablehlo.abs", x)));
    ref_t m = binop(e, "stablehlo.maximum", cst_like(e, ct, 0, x.nd, x.sz), unop(e, "stablehlo.negate", x));
    outs[0] = convert(e, unop(e, "stablehlo.negate", binop(e, "stablehlo.add", m, unop(e, "stablehlo.log_plus_one", z))), odt);
    const tpu_tensor_t* bt = &c->outs[1];
    outs[1] = tpu_tensor_numel(bt) == numel(&x) ? reshape(e, convert(e, z, bt->dtype), bt->ndim, bt->sizes)
                                               : cst_like(e, bt->dtype, 0, bt->ndim, bt->sizes);
    return true;
  }
  if (!strcmp(base, "avg_pool2d") && tpu_dtype_is_float(odt) && c->nouts == 1) {
    /* (self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override) */
    window_t w;
    pool_window(c, 2, 1, 2, 3, -1, o, &w);
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct), zero = cst(e, ct, 0), sum;
    reduce_window_n(e, 1, &x, &zero, &w, sum_body, &sum);
    ref_t y;
    if (c->nargs > 6 && is_number(n, 6)) {
      y = scalar_op(e, "stablehlo.divide", sum, tpu_arg_f64(c, 6, 1));
    } else {
      /* divisor per window: its cells inside the input, plus the explicit
       * padding with count_include_pad (never ceil mode's overhang): a window
       * sum over ones padded with ones, then with zeros */
      const int nd = x.nd;
      const bool incl = tpu_arg_bool(c, 5, true);
      ref_t ones = cst_like(e, ct, 1, 2, x.sz + nd - 2);
      window_t w2 = w;
      int64_t lo[2], hi[2], in[2] = {0, 0};
      for (int j = 0; j < 2; j++) {
        int d = nd - 2 + j;
        int64_t pad = c->args[3].n ? c->args[3].v.ilist[c->args[3].n == 1 ? 0 : j] : 0;
        lo[j] = hi[j] = incl ? pad : 0;
        w2.win[j] = w.win[d];
        w2.str[j] = w.str[d];
        w2.dil[j] = 1;
        w2.lo[j] = w.lo[d] - lo[j];
        w2.hi[j] = w.hi[d] - hi[j];
      }
      if (incl) {
        ref_t pin[2] = {ones, cst(e, ct, 1)};
        char bl[200], bh[200], bi[200];
        ref_t padded = mkref(ct, 2, NULL);
        for (int j = 0; j < 2; j++) padded.sz[j] = ones.sz[j] + lo[j] + hi[j];
        ones = emit(e, "stablehlo.pad", 2, pin, padded,
                    "edge_padding_low = %s, edge_padding_high = %s, interior_padding = %s",
                    i64arr(bl, sizeof bl, 2, lo), i64arr(bh, sizeof bh, 2, hi),
                    i64arr(bi, sizeof bi, 2, in));
      }
      ref_t cnt, z2 = cst(e, ct, 0);
      reduce_window_n(e, 1, &ones, &z2, &w2, sum_body, &cnt);
      y = binop(e, "stablehlo.divide", sum, bcast(e, cnt, sum.nd, sum.sz));
    }
    outs[0] = convert(e, y, odt);
    return true;
  }
  if (!strcmp(base, "max_pool2d_with_indices") && c->nouts == 2 &&
      (tpu_dtype_is_float(odt) || odt == TPU_I64 || odt == TPU_I32)) {
    /* (self, kernel, stride, padding, dilation, ceil_mode) -> (out, flat index in H*W) */
    window_t w;
    pool_window(c, 2, 1, 2, 3, 4, o, &w);
    ref_t x = arg(n, 0);
    const int nd = x.nd;
    ref_t row = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, x.sz), "iota_dimension = %d : i64", nd - 2);
    ref_t col = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, x.sz), "iota_dimension = %d : i64", nd - 1);
    ref_t idx = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", row, (double)x.sz[nd - 1]), col);
    ref_t a[2] = {x, idx};
    ref_t init[2] = {cst(e, x.dt, tpu_dtype_is_float(x.dt) ? -INFINITY : (double)INT64_MIN),
                     cst(e, TPU_I64, (double)INT64_MAX)};
    ref_t r[2];
    reduce_window_n(e, 2, a, init, &w, max_pool_body, r);
    outs[0] = r[0];
    outs[1] = convert(e, r[1], c->outs[1].dtype);
    return true;
  }
  if (!strcmp(base, "native_batch_norm") && c->nouts == 3 && tpu_dtype_is_float(odt)) {
    /* (input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
     * -> (out, save_mean, save_invstd); training updates the running stats */
    const bool training = tpu_arg_bool(c, 5, false);
    const double momentum = tpu_arg_f64(c, 6, 0.1), eps = tpu_arg_f64(c, 7, 1e-5);
    const bool has_rs = is_tensor(n, 3) && is_tensor(n, 4);
    if (!training && !has_rs) return false;
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct);
    const int nd = x.nd;
    int64_t dims[TPU_MAX_DIMS], nred = 0, cnt = 1, csz[1] = {nd > 1 ? x.sz[1] : 1};
    for (int d = 0; d < nd; d++)
      if (d != 1) {
        dims[nred++] = d;
        cnt *= x.sz[d];
      }
    int64_t chan_dim[1] = {1};
    ref_t mean, var, xc; /* mean, var: [C] */
    if (training) {
      ref_t ss = centred_sum_squares(e, x, (int)nred, dims, (double)cnt, &mean, &xc);
      mean = reshape(e, mean, 1, csz);
      var = reshape(e, scalar_op(e, "stablehlo.divide", ss, (double)cnt), 1, csz);
    } else {
      mean = reshape(e, convert(e, arg(n, 3), ct), 1, csz);
      var = reshape(e, convert(e, arg(n, 4), ct), 1, csz);
      xc = binop(e, "stablehlo.subtract", x, bcast_dims(e, mean, nd, x.sz, chan_dim));
    }
    ref_t invstd = unop(e, "stablehlo.rsqrt", scalar_op(e, "stablehlo.add", var, eps));
    ref_t y = binop(e, "stablehlo.multiply", xc, bcast_dims(e, invstd, nd, x.sz, chan_dim));
    if (is_tensor(n, 1))
      y = binop(e, "stablehlo.multiply", y,
                bcast_dims(e, reshape(e, convert(e, arg(n, 1), ct), 1, csz), nd, x.sz, chan_dim));
    if (is_tensor(n, 2))
      y = binop(e, "stablehlo.add", y,
                bcast_dims(e, reshape(e, convert(e, arg(n, 2), ct), 1, csz), nd, x.sz, chan_dim));
    outs[0] = convert(e, y, odt);
    for (int k = 1; k < 3; k++) { /* eval mode returns empty statistics, like CPU */
      const tpu_tensor_t* t = &c->outs[k];
      outs[k] = training && tpu_tensor_numel(t) == csz[0]
                    ? reshape(e, convert(e, k == 1 ? mean : invstd, t->dtype), t->ndim, t->sizes)
                    : cst_like(e, t->dtype, 0, t->ndim, t->sizes);
    }
    if (training && has_rs) { /* running = (1 - m) * running + m * batch (variance unbiased) */
      for (int k = 3; k <= 4; k++) {
        const tpu_tensor_t* rt = c->args[k].v.t;
        ref_t cur = reshape(e, convert(e, arg(n, k), ct), 1, csz);
        ref_t b = k == 3 ? mean : scalar_op(e, "stablehlo.multiply", var, cnt > 1 ? (double)cnt / (double)(cnt - 1) : 1.0);
        ref_t upd = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", cur, 1.0 - momentum),
                          scalar_op(e, "stablehlo.multiply", b, momentum));
        write_tensor(e, rt, reshape(e, convert(e, upd, rt->dtype), rt->ndim, rt->sizes), true);
      }
    }
    return true;
  }
  if (!strcmp(base, "gelu_backward") && tpu_dtype_is_float(odt)) { /* (grad, self, approximate) */
    tpu_dtype_t ct = acc_type(odt);
    ref_t g = gelu_grad(e, arg_out(n, 1, ct), tpu_arg_str(c, 2, "none"));
    outs[0] = convert(e, binop(e, "stablehlo.multiply", arg_out(n, 0, ct), g), odt);
    return true;
  }
  if (!strcmp(base, "tanh_backward") || !strcmp(base, "sigmoid_backward")) { /* (grad, output) */
    ref_t g = arg_out(n, 0, odt), y = arg_out(n, 1, odt);
    ref_t one_m = binop(e, "stablehlo.subtract", cst_like(e, odt, 1, y.nd, y.sz), base[0] == 't' ? binop(e, "stablehlo.multiply", y, y) : y);
    ref_t d = base[0] == 't' ? one_m : binop(e, "stablehlo.multiply", y, one_m);
    outs[0] = binop(e, "stablehlo.multiply", g, d);
    return true;
  }
  if (!strcmp(base, "threshold_backward")) { /* (grad, self, threshold): grad where self > threshold */
    ref_t g = arg_out(n, 0, odt);
    tpu_dtype_t st = c->args[1].v.t->dtype;
    ref_t x = arg_out(n, 1, st);
    ref_t keep = compare(e, "GT", x, cst_like(e, st, tpu_arg_f64(c, 2, 0), x.nd, x.sz));
    outs[0] = select3(e, keep, g, cst_like(e, odt, 0, g.nd, g.sz));
    return true;
  }
  if ((!strcmp(base, "_softmax_backward_data") || !strcmp(base, "_log_softmax_backward_data")) && o->ndim > 0) {
    /* (grad_output, output, dim, input_dtype) */
    int64_t dim = norm_dim(tpu_arg_i64(c, 2, -1), o->ndim);
    tpu_dtype_t ct = acc_type(odt);
    ref_t g = arg_out(n, 0, ct), y = arg_out(n, 1, ct);
    ref_t r;
    if (base[1] == 's') { /* y * (g - sum(g * y)) */
      ref_t s = bcast(e, reduce_keep(e, binop(e, "stablehlo.multiply", g, y), 1, &dim, "stablehlo.add", 0), g.nd, g.sz);
      r = binop(e, "stablehlo.multiply", y, binop(e, "stablehlo.subtract", g, s));
    } else { /* g - exp(y) * sum(g) */
      ref_t s = bcast(e, reduce_keep(e, g, 1, &dim, "stablehlo.add", 0), g.nd, g.sz);
      r = binop(e, "stablehlo.subtract", g, binop(e, "stablehlo.multiply", unop(e, "stablehlo.exponential", y), s));
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  if ((!strcmp(base, "nll_loss_forward") || !strcmp(base, "nll_loss_backward")) && is_tensor(n, 0)) {
    /* forward (self, target, weight?, reduction, ignore_index) -> (output, total_weight);
     * backward (grad_output, self, target, weight?, reduction, ignore_index, total_weight) */
    const bool bwd = base[9] == 'b';
    const int xi = bwd ? 1 : 0;
    const tpu_tensor_t* x = c->args[xi].v.t;
    if (x->ndim < 1 || x->ndim > 2 || !tpu_dtype_is_float(x->dtype)) return false;
    const int cdim = x->ndim - 1;
    const int64_t C = x->sizes[cdim];
    const int64_t reduction = tpu_arg_i64(c, xi + 3, 1);
    const int64_t ignore = tpu_arg_i64(c, xi + 4, -100);
    tpu_dtype_t ct = x->dtype;
    ref_t tgt = arg(n, xi + 1);
    ref_t hot = one_hot(e, tgt, C, cdim); /* x's shape */
    ref_t valid = compare(e, "NE", tgt, cst_like(e, tgt.dt, (double)ignore, tgt.nd, tgt.sz));
    ref_t w = convert(e, valid, ct); /* per sample: weight[target] if not ignored */
    if (is_tensor(n, xi + 2)) {
      ref_t wt = arg_as(n, xi + 2, ct, x->ndim, x->sizes);
      ref_t zero = cst_like(e, ct, 0, x->ndim, x->sizes);
      int64_t cd = cdim;
      ref_t wsel = reduce(e, select3(e, hot, wt, zero), 1, &cd, "stablehlo.add", 0);
      w = binop(e, "stablehlo.multiply", w, wsel);
    }
    int64_t all[TPU_MAX_DIMS];
    for (int d = 0; d < tgt.nd; d++) all[d] = d;
    ref_t total = reduce(e, w, tgt.nd, all, "stablehlo.add", 0);
    ref_t xr = convert(e, arg(n, xi), ct);
    if (!bwd) {
      int64_t cd = cdim;
      ref_t picked = reduce(e, select3(e, hot, xr, cst_like(e, ct, 0, x->ndim, x->sizes)), 1, &cd, "stablehlo.add", 0);
      ref_t loss = unop(e, "stablehlo.negate", binop(e, "stablehlo.multiply", picked, w));
      if (reduction != 0) {
        loss = reduce(e, loss, tgt.nd, all, "stablehlo.add", 0);
        if (reduction == 1) loss = binop(e, "stablehlo.divide", loss, total);
      }
      outs[0] = loss;
      if (c->nouts > 1) outs[1] = total;
      return true;
    }
    ref_t g = convert(e, arg(n, 0), ct);
    if (reduction == 1) g = binop(e, "stablehlo.divide", g, convert(e, arg(n, 6), ct));
    /* per sample factor -w * g, spread on the target class */
    ref_t f = unop(e, "stablehlo.negate", binop(e, "stablehlo.multiply", w, bcast(e, g, w.nd, w.sz)));
    int64_t dims[TPU_MAX_DIMS];
    for (int d = 0, k = 0; d < x->ndim; d++)
      if (d != cdim) dims[k++] = d;
    ref_t fb = bcast_dims(e, f, x->ndim, x->sizes, dims);
    outs[0] = select3(e, hot, fb, cst_like(e, ct, 0, x->ndim, x->sizes));
    return true;
  }
  if (!strcmp(base, "embedding_dense_backward") && is_tensor(n, 1)) {
    /* (grad_output [..., E], indices [...], num_weights, padding_idx, scale_grad): the
     * one-hot of the indices, transposed, times the gradient rows */
    const tpu_tensor_t* gt = c->args[0].v.t;
    if (tpu_arg_bool(c, 4, false) || gt->ndim < 1) return false;
    const int64_t V = tpu_arg_i64(c, 2, 0), E = gt->sizes[gt->ndim - 1];
    ref_t idx = arg(n, 1);
    int64_t nrow = numel(&idx);
    idx = reshape(e, idx, 1, &nrow);
    ref_t hot = one_hot(e, idx, V, 1); /* [N, V] */
    const int64_t pad = tpu_arg_i64(c, 3, -1);
    if (pad >= 0) {
      ref_t keep = compare(e, "NE", idx, cst_like(e, idx.dt, (double)pad, 1, &nrow));
      hot = binop(e, "stablehlo.and", hot, bcast_dims(e, keep, 2, hot.sz, (int64_t[]){0}));
    }
    ref_t g = reshape(e, arg(n, 0), 2, (int64_t[]){nrow, E});
    ref_t h = convert(e, hot, g.dt);
    ref_t hT = transpose(e, h, (int64_t[]){1, 0});
    outs[0] = convert(e, dot_general(e, hT, g, 0, 1, 0, mkref(g.dt, 2, (int64_t[]){V, E}), TPU_PRECISION_HIGHEST), odt);
    return true;
  }
  if (!strcmp(base, "native_layer_norm_backward") && c->nouts == 3 && is_tensor(n, 3) && is_tensor(n, 4)) {
    /* (grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
     * -> (grad_input, grad_weight, grad_bias) */
    const tpu_tensor_t* x = c->args[1].v.t;
    const int k = c->args[2].n;
    int64_t nd_[TPU_MAX_DIMS], bd[TPU_MAX_DIMS], cnt = 1;
    int nb = 0;
    for (int d = 0; d < x->ndim; d++) {
      if (d >= x->ndim - k) {
        nd_[d - (x->ndim - k)] = d;
        cnt *= x->sizes[d];
      } else {
        bd[nb++] = d;
      }
    }
    tpu_dtype_t ct = acc_type(x->dtype);
    ref_t g = arg_as(n, 0, ct, x->ndim, x->sizes), xr = arg_as(n, 1, ct, x->ndim, x->sizes);
    ref_t mean = arg_as(n, 3, ct, x->ndim, x->sizes), rstd = arg_as(n, 4, ct, x->ndim, x->sizes);
    ref_t xhat = binop(e, "stablehlo.multiply", binop(e, "stablehlo.subtract", xr, mean), rstd);
    ref_t gx = is_tensor(n, 5) ? binop(e, "stablehlo.multiply", g, arg_as(n, 5, ct, x->ndim, x->sizes)) : g;
    ref_t s1 = bcast(e, reduce_keep(e, gx, k, nd_, "stablehlo.add", 0), x->ndim, x->sizes);
    ref_t s2 = bcast(e, reduce_keep(e, binop(e, "stablehlo.multiply", gx, xhat), k, nd_, "stablehlo.add", 0),
                     x->ndim, x->sizes);
    ref_t inner = binop(e, "stablehlo.subtract",
                        binop(e, "stablehlo.subtract", scalar_op(e, "stablehlo.multiply", gx, (double)cnt), s1),
                        binop(e, "stablehlo.multiply", xhat, s2));
    ref_t gi = scalar_op(e, "stablehlo.divide", binop(e, "stablehlo.multiply", rstd, inner), (double)cnt);
    outs[0] = c->outs[0].dtype != TPU_DTYPE_NONE ? gi : mkref(ct, 0, NULL);
    outs[1] = reduce(e, binop(e, "stablehlo.multiply", g, xhat), nb, bd, "stablehlo.add", 0);
    outs[2] = reduce(e, g, nb, bd, "stablehlo.add", 0);
    return true;
  }
  if ((!strcmp(base, "convolution") || !strcmp(base, "_convolution")) && is_tensor(n, 0) && is_tensor(n, 1) &&
      tpu_arg_bool(c, 6, false) && c->args[0].v.t->ndim >= 3 && c->args[0].v.t->ndim <= 5) {
    /* transposed: a convolution of the input dilated by the stride, padded by
     * dilation * (k - 1) - padding (+ output_padding high), with the kernel
     * flipped and its in/out channels swapped within each group */
    const int k = c->args[0].v.t->ndim - 2;
    const tpu_tensor_t* wt = c->args[1].v.t; /* [Cin, Cout / g, k...] */
    const int64_t g = tpu_arg_i64(c, 8, 1), cin = wt->sizes[0], coutg = wt->sizes[1];
    if (g <= 0 || cin % g) return false;
    int64_t stride[3], dil[3], one[3] = {1, 1, 1};
    char pad[200] = "", sp[16] = "", b1[64], b2[64], b3[64];
    size_t pl = 0;
    for (int i = 0; i < k; i++) {
      const tpu_arg_t *st = &c->args[3], *pd = &c->args[4], *dl = &c->args[5], *op = &c->args[7];
      stride[i] = st->kind == TPU_ARG_INTLIST && st->n ? st->v.ilist[st->n == 1 ? 0 : i] : 1;
      dil[i] = dl->kind == TPU_ARG_INTLIST && dl->n ? dl->v.ilist[dl->n == 1 ? 0 : i] : 1;
      int64_t p = pd->kind == TPU_ARG_INTLIST && pd->n ? pd->v.ilist[pd->n == 1 ? 0 : i] : 0;
      int64_t opad = op->kind == TPU_ARG_INTLIST && op->n ? op->v.ilist[op->n == 1 ? 0 : i] : 0;
      int64_t lo = dil[i] * (wt->sizes[2 + i] - 1) - p;
      pl += (size_t)snprintf(pad + pl, sizeof pad - pl, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", lo, lo + opad);
      snprintf(sp + 3 * i, sizeof sp - 3 * (size_t)i, ", %d", i);
    }
    const tpu_dtype_t ct = acc_type(odt);
    ref_t w = convert(e, arg(n, 1), odt);
    /* [Cin, Cout/g, k..] -> [g, Cin/g, Cout/g, k..] -> [g, Cout/g, Cin/g, k..] -> [Cout, Cin/g, k..] */
    int64_t s5[6] = {g, cin / g, coutg}, perm[6] = {0, 2, 1}, s4[5] = {g * coutg, cin / g};
    for (int i = 0; i < k; i++) {
      s5[3 + i] = wt->sizes[2 + i];
      perm[3 + i] = 3 + i;
      s4[2 + i] = wt->sizes[2 + i];
    }
    w = reshape(e, transpose(e, reshape(e, w, 3 + k, s5), perm), 2 + k, s4);
    int64_t sdims[3];
    for (int i = 0; i < k; i++) sdims[i] = 2 + i;
    w = emit(e, "stablehlo.reverse", 1, &w, w, "dimensions = %s", i64arr(b3, sizeof b3, k, sdims));
    ref_t in[2] = {convert(e, arg(n, 0), odt), w};
    const char* prec = odt != TPU_F32 || c->precision == TPU_PRECISION_MEDIUM ? "DEFAULT"
                       : c->precision == TPU_PRECISION_HIGH                   ? "HIGH"
                                                                              : "HIGHEST";
    char b4[64];
    ref_t r = emit(e, "stablehlo.convolution", 2, in, out_ref(n, ct),
                   "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f%s]x[o, i%s]->[b, f%s]>, "
                   "feature_group_count = %" PRId64 " : i64, padding = dense<[%s]> : tensor<%dx2xi64>, "
                   "lhs_dilation = %s, rhs_dilation = %s, window_strides = %s, "
                   "precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]",
                   sp, sp, sp, g, pad, k, i64arr(b1, sizeof b1, k, stride), i64arr(b2, sizeof b2, k, dil),
                   i64arr(b4, sizeof b4, k, one), prec, prec);
    if (is_tensor(n, 2)) {
      ref_t bias = convert(e, arg(n, 2), ct);
      r = binop(e, "stablehlo.add", r, bcast_dims(e, bias, r.nd, r.sz, (int64_t[]){1}));
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  if ((!strcmp(base, "convolution") || !strcmp(base, "_convolution")) && is_tensor(n, 0) && is_tensor(n, 1) &&
      !tpu_arg_bool(c, 6, false) && c->args[0].v.t->ndim >= 3 && c->args[0].v.t->ndim <= 5) {
    /* (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups),
     * channels-first, not transposed */
    const int k = c->args[0].v.t->ndim - 2;
    int64_t stride[3], dil[3];
    char pad[200] = "", sp[16] = "", b1[64], b2[64];
    size_t pl = 0;
    for (int i = 0; i < k; i++) {
      const tpu_arg_t* st = &c->args[3], *pd = &c->args[4], *dl = &c->args[5];
      stride[i] = st->kind == TPU_ARG_INTLIST && st->n ? st->v.ilist[st->n == 1 ? 0 : i] : 1;
      dil[i] = dl->kind == TPU_ARG_INTLIST && dl->n ? dl->v.ilist[dl->n == 1 ? 0 : i] : 1;
      int64_t p = pd->kind == TPU_ARG_INTLIST && pd->n ? pd->v.ilist[pd->n == 1 ? 0 : i] : 0;
      pl += (size_t)snprintf(pad + pl, sizeof pad - pl, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", p, p);
      snprintf(sp + 3 * i, sizeof sp - 3 * (size_t)i, ", %d", i);
    }
    const tpu_dtype_t ct = acc_type(odt);
    ref_t in[2] = {convert(e, arg(n, 0), odt), convert(e, arg(n, 1), odt)};
    const char* prec = odt != TPU_F32 || c->precision == TPU_PRECISION_MEDIUM ? "DEFAULT"
                       : c->precision == TPU_PRECISION_HIGH                   ? "HIGH"
                                                                              : "HIGHEST";
    ref_t r = emit(e, "stablehlo.convolution", 2, in, out_ref(n, ct),
                   "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f%s]x[o, i%s]->[b, f%s]>, "
                   "feature_group_count = %" PRId64 " : i64, padding = dense<[%s]> : tensor<%dx2xi64>, "
                   "rhs_dilation = %s, window_strides = %s, "
                   "precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]",
                   sp, sp, sp, tpu_arg_i64(c, 8, 1), pad, k, i64arr(b1, sizeof b1, k, dil),
                   i64arr(b2, sizeof b2, k, stride), prec, prec);
    if (is_tensor(n, 2)) { /* bias over the channel dim */
      ref_t bias = convert(e, arg(n, 2), ct);
      r = binop(e, "stablehlo.add", r, bcast_dims(e, bias, r.nd, r.sz, (int64_t[]){1}));
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  if (!strcmp(base, "cat") && c->nargs >= 1 && c->args[0].kind == TPU_ARG_TENSORLIST) {
    int dim = norm_dim(tpu_arg_i64(c, 1, 0), o->ndim);
    ref_t in[256];
    int k = 0;
    for (int i = 0; i < c->args[0].n && k < 256; i++) {
      const tpu_tensor_t* t = &c->args[0].v.tlist[i];
      if (t->dtype == TPU_DTYPE_NONE || (t->ndim == 1 && t->sizes[0] == 0)) continue; /* legacy empty */
      in[k++] = convert(e, read_tensor(e, t), odt);
    }
    if (k == 0 || k == 256) return false;
    outs[0] = k == 1 ? in[0] : emit(e, "stablehlo.concatenate", k, in, out_ref(n, odt), "dimension = %d : i64", dim);
    return true;
  }
  if (!strcmp(base, "index_select") && is_tensor(n, 2)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    if (x->ndim == 0) return false;
    int dim = norm_dim(tpu_arg_i64(c, 1, 0), x->ndim);
    ref_t in[2] = {arg(n, 0), arg(n, 2)};
    if (in[1].nd == 0) in[1] = reshape(e, in[1], 1, (int64_t[]){1});
    int64_t offs[TPU_MAX_DIMS], ssz[TPU_MAX_DIMS];
    int no = 0;
    for (int d = 0; d < x->ndim; d++) {
      if (d != dim) offs[no++] = d;
      ssz[d] = d == dim ? 1 : x->sizes[d];
    }
    char b1[256], b2[256];
    outs[0] = emit(e, "stablehlo.gather", 2, in, out_ref(n, odt),
                   "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%d], "
                   "start_index_map = [%d], index_vector_dim = 1>, slice_sizes = %s, "
                   "indices_are_sorted = false",
                   ints(b1, sizeof b1, no, offs), dim, dim, i64arr(b2, sizeof b2, x->ndim, ssz));
    return true;
  }
  return false;
}

/* base name of an overload: "add_.Tensor" -> "add" */
static void base_name(const char* op, char* out, size_t cap) {
  size_t len = strcspn(op, ".");
  if (len >= cap) len = cap - 1;
  memcpy(out, op, len);
  out[len] = 0;
  if (len > 1 && out[len - 1] == '_' && out[0] != '_') out[len - 1] = 0;
  else if (len > 2 && out[len - 1] == '_' && out[0] == '_' && strcmp(out, "_to_copy")) out[len - 1] = 0;
}

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

/* A result of the function: the last value written to memory visible after
 * the graph (a zero-element value carries nothing and has no address). */
static bool is_result(const val_t* v) {
  return v->written && v->visible && !v->superseded && !v->alias && numel(&v->r) > 0;
}

void tpu_graph_print(const tpu_graph_t* g, FILE* f) {
  em_t e = {0};
  char* body = NULL;
  size_t len = 0;
  e.f = open_memstream(&body, &len);
  if (!e.f) {
    fprintf(f, "// TorchTPU graph: out of host memory printing %d nodes\n", g->n);
    return;
  }
  for (int i = 0; i < g->n && !e.oom; i++) emit_node(&e, g, i);
  /* results: the last values written to visible memory */
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
  fputs(") : (", e.f);
  k = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (!is_result(v)) continue;
    if (k++) fputs(", ", e.f);
    ptype(e.f, &v->r);
  }
  fputs(") -> ()\n", e.f);
  fclose(e.f);

  fprintf(f, "// TorchTPU DeferAndFuse graph: %d nodes on tpu:%d, %d parameters, %d results%s\n", g->n, g->device, e.np,
          nres, e.oom ? " (INCOMPLETE: out of host memory)" : "");
  fputs("module @tpu_graph", f);
  if (e.ncc) {
    fputs(" attributes {tpu.custom_calls = [", f);
    for (int i = 0; i < e.ncc; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", e.cc[i]);
    fputs("]}", f);
  }
  fputs(" {\n  func.func @main(", f);
  for (int i = 0; i < e.np; i++) {
    const val_t* v = &e.v[e.params[i]];
    fprintf(f, "%s%%arg%d: ", i ? ", " : "", i);
    ptype(f, &v->r);
    fputc(' ', f);
    print_attr_value(f, v);
  }
  fputs(") -> (", f);
  k = 0;
  for (int i = 0; i < e.nv; i++) {
    const val_t* v = &e.v[i];
    if (!is_result(v)) continue;
    if (k++) fputs(", ", f);
    ptype(f, &v->r);
    fputc(' ', f);
    print_attr_value(f, v);
  }
  fputs(") {\n", f);
  if (body) fwrite(body, 1, len, f);
  fputs("  }\n}\n", f);
  free(body);
  free(e.v);
  free(e.params);
  for (int i = 0; i < e.ncc; i++) free(e.cc[i]);
  free(e.cc);
}
