/* The pjrt target's programs (compose.h). */
#include "targets/pjrt/compose.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lower/lower.h"
#include "targets/pjrt/storage.h"

typedef struct {
  const void* data;
  tpu_dtype_t dt;
  int nd;
  int64_t sz[TPU_MAX_DIMS], st[TPU_MAX_DIMS];
} view_t;

typedef struct {
  view_t* v[2]; /* params, results */
  int n[2], cap[2];
  pj_baked_t* baked; /* numbers the program holds as constants */
  int nbaked, cbaked;
  pj_check_t* checks; /* the device-side checks, in the code's order */
  int nchecks, cchecks;
  bool oom;
} collect_t;

/* Room for one more element in the array *pv of n elements of `elt` bytes
 * (capacity *cap, doubled when full); false (c->oom set) without memory. */
static bool grow(collect_t* c, void* pv, int n, int* cap, size_t elt) {
  if (n < *cap) return true;
  void* v; /* the array pointer, read and written as bytes (pv points to a T*) */
  memcpy(&v, pv, sizeof v);
  int ncap = *cap ? 2 * *cap : 8;
  void* nv = realloc(v, elt * (size_t)ncap);
  if (!nv) {
    c->oom = true;
    return false;
  }
  memcpy(pv, &nv, sizeof nv);
  *cap = ncap;
  return true;
}

static void on_check(void* ctx, int node, int kind, int dim, int64_t size) {
  collect_t* c = ctx;
  if (grow(c, &c->checks, c->nchecks, &c->cchecks, sizeof(pj_check_t)))
    c->checks[c->nchecks++] = (pj_check_t){node, kind, dim, size};
}

static void on_baked(void* ctx, const void* value, size_t bytes) {
  collect_t* c = ctx;
  for (int i = 0; i < c->nbaked; i++)
    if (c->baked[i].data == value) return;
  if (grow(c, &c->baked, c->nbaked, &c->cbaked, sizeof(pj_baked_t)))
    c->baked[c->nbaked++] = (pj_baked_t){value, bytes};
}

static void on_value(void* ctx, bool is_result, int index, const void* data, tpu_dtype_t dt, int nd,
                     const int64_t* sz, const int64_t* st) {
  collect_t* c = ctx;
  int k = is_result ? 1 : 0;
  if (!grow(c, &c->v[k], c->n[k], &c->cap[k], sizeof(view_t))) return;
  view_t* v = &c->v[k][c->n[k]++];
  v->data = data;
  v->dt = dt;
  v->nd = nd;
  if (nd) {
    memcpy(v->sz, sz, sizeof(int64_t) * (size_t)nd);
    memcpy(v->st, st, sizeof(int64_t) * (size_t)nd);
  }
}

/* ---- text ---- */
typedef struct {
  FILE* f;
  int next;
} wr_t;

static const char* et(tpu_dtype_t dt) { return tpu_lower_elt_type(dt); }

/* "tensor<2x3xf32>" into one of a few rotating buffers */
static const char* ty(int nd, const int64_t* sz, tpu_dtype_t dt) {
  static _Thread_local char bufs[4][1400];
  static _Thread_local int which;
  char* b = bufs[which++ & 3];
  size_t k = (size_t)snprintf(b, 64, "tensor<");
  for (int d = 0; d < nd && k < 1300; d++) k += (size_t)snprintf(b + k, 24, "%" PRId64 "x", sz[d]);
  snprintf(b + k, 32, "%s>", et(dt));
  return b;
}

static const char* ty1(int64_t n, tpu_dtype_t dt) { return ty(1, &n, dt); }

/* "array<i64: a, b>" into one of a few rotating buffers */
static const char* arr(int n, const int64_t* v) {
  static _Thread_local char bufs[4][1400];
  static _Thread_local int which;
  char* b = bufs[which++ & 3];
  size_t k = (size_t)snprintf(b, 32, n ? "array<i64: " : "array<i64");
  for (int i = 0; i < n && k < 1300; i++) k += (size_t)snprintf(b + k, 24, "%s%" PRId64, i ? ", " : "", v[i]);
  snprintf(b + k, 4, ">");
  return b;
}

/* %N = "op"(operands) {attrs} : (in types) -> out type; returns N */
static int op(wr_t* w, const char* name, const char* operands, const char* attrs, const char* in_types,
              const char* out_type) {
  int id = w->next++;
  fprintf(w->f, "    %%v%d = \"%s\"(%s)%s%s%s : (%s) -> %s\n", id, name, operands, attrs ? " {" : "",
          attrs ? attrs : "", attrs ? "}" : "", in_types, out_type);
  return id;
}

static const char* zero_lit(tpu_dtype_t dt) {
  if (dt == TPU_BOOL) return "false";
  if (tpu_dtype_is_complex(dt)) return "(0.000000e+00, 0.000000e+00)";
  return tpu_dtype_is_float(dt) ? "0.000000e+00" : "0";
}

static int zeros(wr_t* w, int nd, const int64_t* sz, tpu_dtype_t dt) {
  char a[1500];
  snprintf(a, sizeof a, "value = dense<%s> : %s", zero_lit(dt), ty(nd, sz, dt));
  return op(w, "stablehlo.constant", "", a, "", ty(nd, sz, dt));
}

static int i64_const(wr_t* w, int64_t v) {
  char a[96];
  snprintf(a, sizeof a, "value = dense<%" PRId64 "> : tensor<i64>", v);
  return op(w, "stablehlo.constant", "", a, "", "tensor<i64>");
}

static char* ref(char* b, int id) {
  snprintf(b, 24, "%%v%d", id);
  return b;
}

static int reshape(wr_t* w, int x, int nd0, const int64_t* s0, int nd1, const int64_t* s1, tpu_dtype_t dt) {
  if (nd0 == nd1 && !memcmp(s0, s1, sizeof(int64_t) * (size_t)nd0)) return x;
  char r[24];
  return op(w, "stablehlo.reshape", ref(r, x), NULL, ty(nd0, s0, dt), ty(nd1, s1, dt));
}

/* x[lo:hi] of a rank-nd value, unit steps */
static int slice(wr_t* w, int x, int nd, const int64_t* sz, const int64_t* lo, const int64_t* hi,
                 tpu_dtype_t dt) {
  bool same = true;
  int64_t out[TPU_MAX_DIMS + 1], one[TPU_MAX_DIMS + 1];
  for (int d = 0; d < nd; d++) {
    out[d] = hi[d] - lo[d];
    one[d] = 1;
    if (lo[d] != 0 || hi[d] != sz[d]) same = false;
  }
  if (same) return x;
  char a[4400], r[24];
  snprintf(a, sizeof a, "start_indices = %s, limit_indices = %s, strides = %s", arr(nd, lo), arr(nd, hi),
           arr(nd, one));
  return op(w, "stablehlo.slice", ref(r, x), a, ty(nd, sz, dt), ty(nd, out, dt));
}

/* bytes (tensor<m*es x ui8>) -> tensor<m x dt> */
static int from_bytes(wr_t* w, int x, int64_t m, tpu_dtype_t dt) {
  char r[24], o[64];
  const int64_t es = (int64_t)tpu_dtype_size(dt);
  if (dt == TPU_U8) return x;
  if (dt == TPU_BOOL) {
    int z = zeros(w, 1, &m, TPU_U8);
    snprintf(o, sizeof o, "%%v%d, %%v%d", x, z);
    char in[160];
    snprintf(in, sizeof in, "%s, %s", ty1(m, TPU_U8), ty1(m, TPU_U8));
    return op(w, "stablehlo.compare", o, "comparison_direction = #stablehlo<comparison_direction NE>", in,
              ty1(m, TPU_BOOL));
  }
  if (es == 1) return op(w, "stablehlo.bitcast_convert", ref(r, x), NULL, ty1(m, TPU_U8), ty1(m, dt));
  int64_t s2[2] = {m, es}, n = m * es;
  x = reshape(w, x, 1, &n, 2, s2, TPU_U8);
  return op(w, "stablehlo.bitcast_convert", ref(r, x), NULL, ty(2, s2, TPU_U8), ty1(m, dt));
}

/* tensor<m x dt> -> bytes (tensor<m*es x ui8>) */
static int to_bytes(wr_t* w, int x, int64_t m, tpu_dtype_t dt) {
  char r[24];
  const int64_t es = (int64_t)tpu_dtype_size(dt);
  if (dt == TPU_U8) return x;
  if (dt == TPU_BOOL) return op(w, "stablehlo.convert", ref(r, x), NULL, ty1(m, TPU_BOOL), ty1(m, TPU_U8));
  if (es == 1) return op(w, "stablehlo.bitcast_convert", ref(r, x), NULL, ty1(m, dt), ty1(m, TPU_U8));
  int64_t s2[2] = {m, es}, n = m * es;
  x = op(w, "stablehlo.bitcast_convert", ref(r, x), NULL, ty1(m, dt), ty(2, s2, TPU_U8));
  return reshape(w, x, 2, s2, 1, &n, TPU_U8);
}

static int dus(wr_t* w, int x, int nd, const int64_t* sz, int upd, const int64_t* usz, const int64_t* at,
               tpu_dtype_t dt) {
  int idx[TPU_MAX_DIMS + 1];
  for (int d = 0; d < nd; d++) idx[d] = i64_const(w, at[d]);
  char o[4096], in[8192];
  size_t k = (size_t)snprintf(o, sizeof o, "%%v%d, %%v%d", x, upd);
  size_t j = (size_t)snprintf(in, sizeof in, "%s, %s", ty(nd, sz, dt), ty(nd, usz, dt));
  for (int d = 0; d < nd; d++) {
    k += (size_t)snprintf(o + k, sizeof o - k, ", %%v%d", idx[d]);
    j += (size_t)snprintf(in + j, sizeof in - j, ", tensor<i64>");
  }
  return op(w, "stablehlo.dynamic_update_slice", o, NULL, in, ty(nd, sz, dt));
}

/* ---- view geometry ----
 * A view's dims of size > 1 and nonzero stride, ordered by decreasing
 * stride, form a chain when each stride is a multiple of the next and
 * at least the next dim's extent: the view is then the elements of a
 * dense array of shape [n0, s0/s1, ..., s(k-2)/s(k-1), s(k-1)] (L = n0*s0
 * elements from the view's first one) at indices [i0, i1, ..., i(k-1), 0]. */
typedef struct {
  int k;
  int dim[TPU_MAX_DIMS]; /* view dims in chain order */
  int64_t n[TPU_MAX_DIMS], s[TPU_MAX_DIMS];
  int64_t L;     /* elements of the chain array */
  int64_t last;  /* largest element index the view reads */
  bool dense;    /* the chain is row-major contiguous: L = numel */
  bool zero_stride; /* a dim of size > 1 with stride 0 (broadcast) */
} chain_t;

static bool chain_of(const view_t* v, chain_t* c) {
  memset(c, 0, sizeof(*c));
  for (int d = 0; d < v->nd; d++) {
    if (v->sz[d] <= 1) continue;
    if (v->st[d] == 0) {
      c->zero_stride = true;
      continue;
    }
    if (v->st[d] < 0) return false;
    int i = c->k++;
    while (i > 0 && c->s[i - 1] < v->st[d]) { /* insertion by decreasing stride, stable */
      c->dim[i] = c->dim[i - 1];
      c->n[i] = c->n[i - 1];
      c->s[i] = c->s[i - 1];
      i--;
    }
    c->dim[i] = d;
    c->n[i] = v->sz[d];
    c->s[i] = v->st[d];
  }
  c->last = 0;
  for (int i = 0; i < c->k; i++) c->last += (c->n[i] - 1) * c->s[i];
  for (int i = 0; i + 1 < c->k; i++)
    if (c->s[i] % c->s[i + 1] != 0 || c->s[i] < c->n[i + 1] * c->s[i + 1]) return false;
  c->L = c->k ? c->n[0] * c->s[0] : 1;
  c->dense = c->k == 0 || c->s[c->k - 1] == 1;
  for (int i = 0; i + 1 < c->k && c->dense; i++) c->dense = c->s[i] == c->n[i + 1] * c->s[i + 1];
  return true;
}

static void chain_shape(const chain_t* c, int64_t* shape) { /* k + 1 dims */
  shape[0] = c->n[0];
  for (int i = 1; i < c->k; i++) shape[i] = c->s[i - 1] / c->s[i];
  shape[c->k] = c->s[c->k - 1];
}

static int64_t numel_of(const view_t* v) {
  int64_t n = 1;
  for (int d = 0; d < v->nd; d++) n *= v->sz[d];
  return n;
}

/* A storage's value in a program: tensor<B / size(dt) x dt>. A storage
 * keeps the element type it is mostly used with, so that a read or write of
 * that type (or another of the same width) is a slice or an update in
 * elements; any other access goes through the storage's bytes. */
typedef struct {
  int value; /* SSA value, -1: none yet */
  int64_t B; /* bytes */
  tpu_dtype_t dt;
} store_t;

/* Whether dt reads and writes a storage of type sdt element by element (a
 * same-width bitcast at most). Booleans only their own type. */
static bool same_width(tpu_dtype_t dt, tpu_dtype_t sdt) {
  if (dt == sdt) return true;
  if (dt == TPU_BOOL || sdt == TPU_BOOL) return false;
  return tpu_dtype_size(dt) == tpu_dtype_size(sdt);
}

static int bitcast(wr_t* w, int x, int64_t m, tpu_dtype_t from, tpu_dtype_t to) {
  if (from == to) return x;
  char r[24];
  return op(w, "stablehlo.bitcast_convert", ref(r, x), NULL, ty1(m, from), ty1(m, to));
}

/* m elements of dt from byte `off` of the storage */
static int elements_of(wr_t* w, const store_t* s, int64_t off, tpu_dtype_t dt, int64_t m) {
  const int64_t es = (int64_t)tpu_dtype_size(dt), E = s->B / (int64_t)tpu_dtype_size(s->dt);
  if (same_width(dt, s->dt) && off % es == 0) {
    int64_t lo = off / es, hi = lo + m;
    return bitcast(w, slice(w, s->value, 1, &E, &lo, &hi, s->dt), m, s->dt, dt);
  }
  int64_t B = s->B, lo = off, hi = off + m * es;
  int x = slice(w, to_bytes(w, s->value, E, s->dt), 1, &B, &lo, &hi, TPU_U8);
  return from_bytes(w, x, m, dt);
}

/* The storage with x (m elements of dt) written from byte `off` */
static void put_elements(wr_t* w, store_t* s, int64_t off, tpu_dtype_t dt, int x, int64_t m) {
  const int64_t es = (int64_t)tpu_dtype_size(dt), E = s->B / (int64_t)tpu_dtype_size(s->dt);
  if (same_width(dt, s->dt) && off % es == 0) {
    int64_t at = off / es;
    s->value = dus(w, s->value, 1, &E, bitcast(w, x, m, dt, s->dt), &m, &at, s->dt);
    return;
  }
  int64_t B = s->B, nb = m * es;
  int bytes = dus(w, to_bytes(w, s->value, E, s->dt), 1, &B, to_bytes(w, x, m, dt), &nb, &off, TPU_U8);
  s->value = from_bytes(w, bytes, E, s->dt);
}

/* The elements [0, L) of the chain array from the view's first element:
 * m = min(L, what the storage holds) real ones, zeros after. */
static int chain_elements(wr_t* w, const store_t* s, int64_t off, tpu_dtype_t dt, int64_t L) {
  const int64_t es = (int64_t)tpu_dtype_size(dt);
  int64_t m = (s->B - off) / es;
  if (m > L) m = L;
  int x = elements_of(w, s, off, dt, m);
  if (m < L) {
    char o[64], a[160], in[160];
    int z = zeros(w, 0, NULL, dt);
    snprintf(o, sizeof o, "%%v%d, %%v%d", x, z);
    snprintf(a, sizeof a, "edge_padding_low = array<i64: 0>, edge_padding_high = array<i64: %" PRId64
             ">, interior_padding = array<i64: 0>", L - m);
    snprintf(in, sizeof in, "%s, %s", ty1(m, dt), ty(0, NULL, dt));
    x = op(w, "stablehlo.pad", o, a, in, ty1(L, dt));
  }
  return x;
}

/* Any view: the element index of each view position, sum of iota(d) * stride(d),
 * as tensor<sizes x 1 x i64> for gather/scatter over the view's elements. */
static int view_indices(wr_t* w, const view_t* v) {
  int64_t isz[TPU_MAX_DIMS + 1];
  memcpy(isz, v->sz, sizeof(int64_t) * (size_t)v->nd);
  const char* t = ty(v->nd, v->sz, TPU_I64);
  char tb[1400], a[1500], o[64];
  snprintf(tb, sizeof tb, "%s", t);
  int acc = -1;
  for (int d = 0; d < v->nd; d++) {
    if (v->sz[d] <= 1 || v->st[d] == 0) continue;
    snprintf(a, sizeof a, "iota_dimension = %d : i64", d);
    int io = op(w, "stablehlo.iota", "", a, "", tb);
    snprintf(a, sizeof a, "value = dense<%" PRId64 "> : %s", v->st[d], tb);
    int sc = op(w, "stablehlo.constant", "", a, "", tb);
    char in[2900];
    snprintf(in, sizeof in, "%s, %s", tb, tb);
    snprintf(o, sizeof o, "%%v%d, %%v%d", io, sc);
    int term = op(w, "stablehlo.multiply", o, NULL, in, tb);
    if (acc < 0) {
      acc = term;
    } else {
      snprintf(o, sizeof o, "%%v%d, %%v%d", acc, term);
      acc = op(w, "stablehlo.add", o, NULL, in, tb);
    }
  }
  if (acc < 0) acc = zeros(w, v->nd, v->sz, TPU_I64);
  isz[v->nd] = 1;
  return reshape(w, acc, v->nd, v->sz, v->nd + 1, isz, TPU_I64);
}

/* A complex view as the view of its parts: float32 (float64) with one more
 * dim, of size 2 and stride 1 (XLA bitcasts no complex type, so storages
 * hold the parts and the program combines them). */
static tpu_status_t parts_view(const view_t* v, view_t* out) {
  if (v->nd >= TPU_MAX_DIMS)
    return TPU_ERR(UNIMPLEMENTED, "pjrt target: a complex view of %d dims (at most %d)", v->nd, TPU_MAX_DIMS - 1);
  *out = *v;
  out->dt = tpu_dtype_complex_part(v->dt);
  for (int d = 0; d < v->nd; d++) out->st[d] = 2 * v->st[d];
  out->sz[v->nd] = 2;
  out->st[v->nd] = 1;
  out->nd = v->nd + 1;
  return TPU_OK;
}

static tpu_status_t emit_read(wr_t* w, const store_t* s, int64_t off, const view_t* v, int* out);

/* A complex view read: its parts view, split along the last dim and combined. */
static tpu_status_t read_complex(wr_t* w, const store_t* s, int64_t off, const view_t* v, int* out) {
  view_t pv;
  int x;
  tpu_status_t st = parts_view(v, &pv);
  if (!st) st = emit_read(w, s, off, &pv, &x);
  if (st) return st;
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS], one[TPU_MAX_DIMS];
  memcpy(hi, pv.sz, sizeof(int64_t) * (size_t)pv.nd);
  memcpy(one, v->sz, sizeof(int64_t) * (size_t)v->nd);
  one[v->nd] = 1;
  int part[2];
  for (int k = 0; k < 2; k++) {
    lo[v->nd] = k;
    hi[v->nd] = k + 1;
    part[k] = reshape(w, slice(w, x, pv.nd, pv.sz, lo, hi, pv.dt), pv.nd, one, v->nd, v->sz, pv.dt);
  }
  char o[64], in[2900];
  snprintf(o, sizeof o, "%%v%d, %%v%d", part[0], part[1]);
  snprintf(in, sizeof in, "%s, %s", ty(v->nd, v->sz, pv.dt), ty(v->nd, v->sz, pv.dt));
  *out = op(w, "stablehlo.complex", o, NULL, in, ty(v->nd, v->sz, v->dt));
  return TPU_OK;
}

/* The value of view v (at byte `off` of storage s) read. */
static tpu_status_t emit_read(wr_t* w, const store_t* s, int64_t off, const view_t* v, int* out) {
  const int64_t B = s->B;
  if (tpu_dtype_is_complex(v->dt)) return read_complex(w, s, off, v, out);
  if (numel_of(v) == 0) {
    *out = zeros(w, v->nd, v->sz, v->dt);
    return TPU_OK;
  }
  chain_t c;
  const bool chain = chain_of(v, &c);
  const int64_t es = (int64_t)tpu_dtype_size(v->dt);
  if (!chain) { /* any other view: gather its elements */
    int64_t last = 0;
    for (int d = 0; d < v->nd; d++) {
      if (v->st[d] < 0)
        return TPU_ERR(UNIMPLEMENTED, "pjrt target: a view with negative strides (%s)", arr(v->nd, v->st));
      last += (v->sz[d] - 1) * v->st[d];
    }
    if (off + (last + 1) * es > B)
      return TPU_ERR(OUT_OF_RANGE, "pjrt target: a view reads past the end of its storage (%" PRId64
                     " bytes)", B);
    int64_t m = last + 1;
    int x = chain_elements(w, s, off, v->dt, m);
    int idx = view_indices(w, v);
    int64_t isz[TPU_MAX_DIMS + 1];
    memcpy(isz, v->sz, sizeof(int64_t) * (size_t)v->nd);
    isz[v->nd] = 1;
    char o[64], a[400], in[3000];
    snprintf(o, sizeof o, "%%v%d, %%v%d", x, idx);
    snprintf(a, sizeof a, "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
             "index_vector_dim = %d>, slice_sizes = array<i64: 1>, indices_are_sorted = false", v->nd);
    snprintf(in, sizeof in, "%s, %s", ty1(m, v->dt), ty(v->nd + 1, isz, TPU_I64));
    *out = op(w, "stablehlo.gather", o, a, in, ty(v->nd, v->sz, v->dt));
    return TPU_OK;
  }
  if (off + (c.last + 1) * es > B)
    return TPU_ERR(OUT_OF_RANGE, "pjrt target: a view reads past the end of its storage (%" PRId64
                   " bytes)", B);
  int x = chain_elements(w, s, off, v->dt, c.L);
  int64_t kept[TPU_MAX_DIMS + 1];
  for (int i = 0; i < c.k; i++) kept[i] = c.n[i];
  if (c.k == 0) {
    int64_t one = 1;
    x = reshape(w, x, 1, &one, 0, NULL, v->dt);
  } else {
    int64_t shape[TPU_MAX_DIMS + 1], lo[TPU_MAX_DIMS + 1] = {0}, hi[TPU_MAX_DIMS + 1];
    chain_shape(&c, shape);
    x = reshape(w, x, 1, &c.L, c.k + 1, shape, v->dt);
    for (int i = 0; i < c.k; i++) hi[i] = c.n[i];
    hi[c.k] = 1;
    x = slice(w, x, c.k + 1, shape, lo, hi, v->dt);
    kept[c.k] = 1;
    x = reshape(w, x, c.k + 1, kept, c.k, kept, v->dt);
    /* chain order -> view order */
    int64_t perm[TPU_MAX_DIMS], tsz[TPU_MAX_DIMS], bd[TPU_MAX_DIMS];
    int j = 0;
    for (int d = 0; d < v->nd; d++)
      for (int i = 0; i < c.k; i++)
        if (c.dim[i] == d) {
          perm[j] = i;
          tsz[j] = c.n[i];
          bd[j] = d;
          j++;
        }
    bool ident = true;
    for (int i = 0; i < c.k; i++) ident = ident && perm[i] == i;
    char r[24], a[1500];
    if (!ident) {
      snprintf(a, sizeof a, "permutation = %s", arr(c.k, perm));
      x = op(w, "stablehlo.transpose", ref(r, x), a, ty(c.k, kept, v->dt), ty(c.k, tsz, v->dt));
    }
    memcpy(kept, tsz, sizeof(int64_t) * (size_t)c.k);
    if (c.k != v->nd) {
      snprintf(a, sizeof a, "broadcast_dimensions = %s", arr(c.k, bd));
      x = op(w, "stablehlo.broadcast_in_dim", ref(r, x), a, ty(c.k, kept, v->dt), ty(v->nd, v->sz, v->dt));
    }
    *out = x;
    return TPU_OK;
  }
  if (v->nd) {
    char r[24];
    x = op(w, "stablehlo.broadcast_in_dim", ref(r, x), "broadcast_dimensions = array<i64>", ty(0, NULL, v->dt),
           ty(v->nd, v->sz, v->dt));
  }
  *out = x;
  return TPU_OK;
}

static tpu_status_t emit_write(wr_t* w, store_t* s, int64_t off, const view_t* v, int val);

/* A complex value written: its parts, stacked along a last dim, into the parts view. */
static tpu_status_t write_complex(wr_t* w, store_t* s, int64_t off, const view_t* v, int val) {
  view_t pv;
  tpu_status_t st = parts_view(v, &pv);
  if (st) return st;
  int64_t one[TPU_MAX_DIMS];
  memcpy(one, v->sz, sizeof(int64_t) * (size_t)v->nd);
  one[v->nd] = 1;
  char r[24], o[64], in[2900], a[64];
  int part[2];
  for (int k = 0; k < 2; k++) {
    int x = op(w, k ? "stablehlo.imag" : "stablehlo.real", ref(r, val), NULL, ty(v->nd, v->sz, v->dt),
               ty(v->nd, v->sz, pv.dt));
    part[k] = reshape(w, x, v->nd, v->sz, pv.nd, one, pv.dt);
  }
  snprintf(o, sizeof o, "%%v%d, %%v%d", part[0], part[1]);
  snprintf(in, sizeof in, "%s, %s", ty(pv.nd, one, pv.dt), ty(pv.nd, one, pv.dt));
  snprintf(a, sizeof a, "dimension = %d : i64", v->nd);
  return emit_write(w, s, off, &pv, op(w, "stablehlo.concatenate", o, a, in, ty(pv.nd, pv.sz, pv.dt)));
}

/* Storage s with value val (of view v's shape) written into view v (at
 * byte `off`). */
static tpu_status_t emit_write(wr_t* w, store_t* s, int64_t off, const view_t* v, int val) {
  const int64_t B = s->B;
  if (tpu_dtype_is_complex(v->dt)) return write_complex(w, s, off, v, val);
  const int64_t n = numel_of(v);
  if (n == 0) return TPU_OK;
  chain_t c;
  const bool chain = chain_of(v, &c);
  const int64_t es = (int64_t)tpu_dtype_size(v->dt);
  if (c.zero_stride)
    return TPU_ERR(UNIMPLEMENTED, "pjrt target: a write into a broadcast view (strides %s) is not supported",
                   arr(v->nd, v->st));
  if (!chain) { /* any other view: scatter into its elements */
    int64_t last = 0;
    for (int d = 0; d < v->nd; d++) {
      if (v->st[d] < 0)
        return TPU_ERR(UNIMPLEMENTED, "pjrt target: a write into a view with negative strides (%s)",
                       arr(v->nd, v->st));
      last += (v->sz[d] - 1) * v->st[d];
    }
    if (off + (last + 1) * es > B)
      return TPU_ERR(OUT_OF_RANGE, "pjrt target: a view writes past the end of its storage (%" PRId64
                     " bytes)", B);
    const int64_t m = last + 1;
    int arrv = chain_elements(w, s, off, v->dt, m);
    int idx = view_indices(w, v);
    int64_t isz[TPU_MAX_DIMS + 1];
    memcpy(isz, v->sz, sizeof(int64_t) * (size_t)v->nd);
    isz[v->nd] = 1;
    const char* et_s = ty(0, NULL, v->dt);
    char sc[64];
    snprintf(sc, sizeof sc, "%s", et_s);
    int id = w->next++;
    fprintf(w->f,
            "    %%v%d = \"stablehlo.scatter\"(%%v%d, %%v%d, %%v%d) ({\n"
            "    ^bb0(%%old%d: %s, %%new%d: %s):\n"
            "      \"stablehlo.return\"(%%new%d) : (%s) -> ()\n"
            "    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
            "scatter_dims_to_operand_dims = [0], index_vector_dim = %d>, indices_are_sorted = false, "
            "unique_indices = false} : (%s, %s, %s) -> %s\n",
            id, arrv, idx, val, id, sc, id, sc, id, sc, v->nd, ty1(m, v->dt), ty(v->nd + 1, isz, TPU_I64),
            ty(v->nd, v->sz, v->dt), ty1(m, v->dt));
    put_elements(w, s, off, v->dt, id, m);
    return TPU_OK;
  }
  if (off + (c.last + 1) * es > B)
    return TPU_ERR(OUT_OF_RANGE, "pjrt target: a view writes past the end of its storage (%" PRId64
                   " bytes)", B);
  char r[24], a[1500];
  /* the value in chain order, [n0, ..., n(k-1)] */
  int64_t vsz[TPU_MAX_DIMS], csz[TPU_MAX_DIMS + 1], perm[TPU_MAX_DIMS];
  int j = 0;
  for (int d = 0; d < v->nd; d++)
    if (v->sz[d] > 1) vsz[j++] = v->sz[d];
  int x = reshape(w, val, v->nd, v->sz, c.k, vsz, v->dt);
  for (int i = 0; i < c.k; i++) {
    csz[i] = c.n[i];
    int pos = 0; /* where chain dim i sits among the kept view dims */
    for (int d = 0; d < c.dim[i]; d++)
      if (v->sz[d] > 1) pos++;
    perm[i] = pos;
  }
  bool ident = true;
  for (int i = 0; i < c.k; i++) ident = ident && perm[i] == i;
  if (!ident) {
    snprintf(a, sizeof a, "permutation = %s", arr(c.k, perm));
    x = op(w, "stablehlo.transpose", ref(r, x), a, ty(c.k, vsz, v->dt), ty(c.k, csz, v->dt));
  }
  if (c.dense) {
    put_elements(w, s, off, v->dt, reshape(w, x, c.k, csz, 1, &n, v->dt), n);
    return TPU_OK;
  }
  /* strided: update the chain array, then write it back */
  int64_t shape[TPU_MAX_DIMS + 1], zero[TPU_MAX_DIMS + 1] = {0};
  chain_shape(&c, shape);
  int arrv = chain_elements(w, s, off, v->dt, c.L);
  arrv = reshape(w, arrv, 1, &c.L, c.k + 1, shape, v->dt);
  csz[c.k] = 1;
  x = reshape(w, x, c.k, csz, c.k + 1, csz, v->dt);
  arrv = dus(w, arrv, c.k + 1, shape, x, csz, zero, v->dt);
  arrv = reshape(w, arrv, c.k + 1, shape, 1, &c.L, v->dt);
  int64_t m = (B - off) / es;
  if (m > c.L) m = c.L;
  int64_t lo = 0;
  put_elements(w, s, off, v->dt, slice(w, arrv, 1, &c.L, &lo, &m, v->dt), m);
  return TPU_OK;
}

/* ---- the module ---- */
typedef struct {
  uintptr_t base;
  size_t bytes;
  bool has_buf, read, arg, written;
  bool retype;       /* its buffer is bytes and the program leaves it typed */
  tpu_dtype_t in_dt; /* the buffer's element type (has_buf) */
  store_t s;         /* the program's value of it */
  int arg_index;
} slot_t;

static int slot_of(slot_t* s, int* ns, const pj_block_t* b) {
  for (int i = 0; i < *ns; i++)
    if (s[i].base == b->base) return i;
  s[*ns] = (slot_t){.base = b->base, .bytes = b->bytes, .has_buf = b->buf != NULL,
                    .in_dt = b->buf ? b->buf_dt : TPU_U8,
                    .s = {.value = -1, .B = (int64_t)b->bytes, .dt = TPU_DTYPE_NONE}, .arg_index = -1};
  return (*ns)++;
}

/* The element type a storage holds in the program: its buffer's when that
 * is typed, else that of its first access where it divides the storage
 * (bytes for booleans, which have no same-width peer). */
static tpu_dtype_t storage_type(const slot_t* sl, tpu_dtype_t first) {
  if (sl->has_buf && sl->in_dt != TPU_U8) return sl->in_dt;
  first = tpu_dtype_complex_part(first); /* complex: its parts (parts_view) */
  if (first == TPU_DTYPE_NONE || first == TPU_BOOL) return TPU_U8;
  return sl->bytes % tpu_dtype_size(first) == 0 ? first : TPU_U8;
}

static int64_t elems(const slot_t* sl, tpu_dtype_t dt) { return (int64_t)(sl->bytes / tpu_dtype_size(dt)); }

void pj_program_free(pj_program_t* p) {
  free(p->text);
  free(p->args);
  free(p->outs);
  free(p->out_arg);
  free(p->out_donor);
  free(p->baked);
  free(p->checks);
  memset(p, 0, sizeof(*p));
}

tpu_status_t pj_compose(const tpu_graph_t* g, pj_program_t* out) {
  memset(out, 0, sizeof(*out));
  collect_t c = {0};
  int ncc = 0;
  bool oom = false;
  char* inner = NULL;
  size_t inner_len = 0;
  FILE* fi = open_memstream(&inner, &inner_len);
  if (!fi) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
  tpu_graph_print_opts_t o = {.func_name = "graph", .on_value = on_value, .ctx = &c,
                              .out_custom_calls = &ncc, .out_oom = &oom,
                              .lift_numbers = true, .on_baked = on_baked, .on_check = on_check};
  tpu_graph_print_func(g, fi, &o);
  fclose(fi);
  tpu_status_t st = TPU_OK;
  const int np = c.n[0], nr = c.n[1];
  const bool checked = c.nchecks > 0; /* @graph's last result: the checks' code */
  slot_t* slots = calloc((size_t)(np + nr) + 1, sizeof(slot_t));
  int* pslot = calloc((size_t)np + 1, sizeof(int)); /* -1: host value */
  int* rslot = calloc((size_t)nr + 1, sizeof(int));
  int ns = 0;
  if (oom || c.oom || !inner || !slots || !pslot || !rslot)
    st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
  if (!st && ncc > 0) {
    const char* name = NULL;
    for (int i = 0; i < g->n && !name; i++)
      if (g->nodes[i]->op) name = g->nodes[i]->op->name;
    st = g->n == 1 ? TPU_ERR(UNIMPLEMENTED, "no lowering on the pjrt target yet (set "
                             "TORCH_TPU_CPU_FALLBACK=1 to run unsupported ops on the CPU)")
                   : TPU_ERR(UNIMPLEMENTED, "aten::%s has no lowering on the pjrt target yet", name ? name : "?");
  }
  /* the storages */
  for (int i = 0; i < np && !st; i++) {
    const view_t* v = &c.v[0][i];
    pj_block_t b;
    if (numel_of(v) == 0) { /* reads nothing */
      pslot[i] = -2;
      continue;
    }
    if (!pj_storage_find(v->data, 1, false, &b)) {
      if (numel_of(v) != 1)
        st = TPU_ERR(INVALID_ARGUMENT, "pjrt target: operand %d at %p is not in device memory", i, v->data);
      pslot[i] = -1;
      continue;
    }
    pslot[i] = slot_of(slots, &ns, &b);
    slots[pslot[i]].read = true;
  }
  for (int i = 0; i < nr && !st; i++) {
    const view_t* v = &c.v[1][i];
    pj_block_t b;
    if (!pj_storage_find(v->data, 1, false, &b)) {
      st = TPU_ERR(INVALID_ARGUMENT, "pjrt target: result %d at %p is not in device memory", i, v->data);
      break;
    }
    rslot[i] = slot_of(slots, &ns, &b);
    slots[rslot[i]].written = true;
  }
  for (int s = 0; s < ns && !st; s++) {
    tpu_dtype_t first = TPU_DTYPE_NONE;
    for (int i = 0; i < np && first == TPU_DTYPE_NONE; i++)
      if (pslot[i] == s) first = c.v[0][i].dt;
    for (int i = 0; i < nr && first == TPU_DTYPE_NONE; i++)
      if (rslot[i] == s) first = c.v[1][i].dt;
    slot_t* sl = &slots[s];
    sl->s.dt = storage_type(sl, first);
    sl->retype = sl->has_buf && sl->s.dt != sl->in_dt;
  }
  char* text = NULL;
  size_t len = 0;
  FILE* f = st ? NULL : open_memstream(&text, &len);
  if (!st && !f) st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
  int nargs = 0;
  pj_arg_t* args = st ? NULL : calloc((size_t)(ns + np) + 1, sizeof(pj_arg_t));
  if (!st && !args) st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
  if (!st) {
    /* arguments: storages read (or partly written over contents), then host values */
    fputs("module @tpu_program {\n", f);
    fwrite(inner, 1, inner_len, f);
    fputs("  func.func @main(", f);
    for (int s = 0, k = 0; s < ns; s++) {
      slot_t* sl = &slots[s];
      /* a storage read before anything wrote it (torch.empty's, then scatter_
       * into it) has no buffer: its contents are undefined, zeros here */
      sl->arg = sl->has_buf;
      const int res = k; /* its result's index, if it has one */
      if (sl->written || sl->retype) k++;
      if (!sl->arg) continue;
      fprintf(f, "%s%%s%d: %s", nargs ? ", " : "", s, ty1(elems(sl, sl->in_dt), sl->in_dt));
      /* a storage written in place may give its buffer to its next contents
       * (the run donates it where no other reader holds it) */
      if (sl->written && !sl->retype) fprintf(f, " {tf.aliasing_output = %d : i32}", res);
      sl->arg_index = nargs;
      args[nargs++] = (pj_arg_t){.host = false, .base = sl->base, .bytes = sl->bytes};
    }
    for (int i = 0; i < np; i++) {
      if (pslot[i] != -1) continue;
      const view_t* v = &c.v[0][i];
      fprintf(f, "%s%%h%d: %s", nargs ? ", " : "", i, ty(0, NULL, v->dt));
      args[nargs++] = (pj_arg_t){.host = true, .data = v->data, .dtype = v->dt,
                                 .bytes = tpu_dtype_size(v->dt)};
    }
    fputs(") -> (", f);
    int nouts = 0;
    for (int s = 0; s < ns; s++) {
      const slot_t* sl = &slots[s];
      if (sl->written || sl->retype) fprintf(f, "%s%s", nouts++ ? ", " : "", ty1(elems(sl, sl->s.dt), sl->s.dt));
    }
    if (checked) fprintf(f, "%stensor<i32>", nouts ? ", " : "");
    fputs(") {\n", f);
    wr_t w = {f, 0};
    /* storage arguments as values */
    for (int s = 0; s < ns; s++) {
      slot_t* sl = &slots[s];
      if (!sl->arg && sl->read) {
        const int64_t E = elems(sl, sl->s.dt);
        sl->s.value = zeros(&w, 1, &E, sl->s.dt);
      }
      if (!sl->arg) continue;
      const int64_t E = elems(sl, sl->in_dt);
      char o[24];
      snprintf(o, sizeof o, "%%s%d", s);
      sl->s.value = op(&w, "stablehlo.reshape", o, NULL, ty1(E, sl->in_dt), ty1(E, sl->in_dt));
      if (sl->retype) sl->s.value = from_bytes(&w, sl->s.value, elems(sl, sl->s.dt), sl->s.dt);
    }
    /* the views read */
    int* pv = calloc((size_t)np + 1, sizeof(int));
    if (!pv) st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
    for (int i = 0; i < np && !st; i++) {
      const view_t* v = &c.v[0][i];
      if (pslot[i] == -2) {
        pv[i] = zeros(&w, v->nd, v->sz, v->dt);
        continue;
      }
      if (pslot[i] < 0) {
        char o[24];
        snprintf(o, sizeof o, "%%h%d", i);
        int x = op(&w, "stablehlo.reshape", o, NULL, ty(0, NULL, v->dt), ty(0, NULL, v->dt));
        if (v->nd)
          x = op(&w, "stablehlo.broadcast_in_dim", ref(o, x), "broadcast_dimensions = array<i64>",
                 ty(0, NULL, v->dt), ty(v->nd, v->sz, v->dt));
        pv[i] = x;
        continue;
      }
      slot_t* sl = &slots[pslot[i]];
      st = emit_read(&w, &sl->s, (int64_t)((uintptr_t)v->data - sl->base), v, &pv[i]);
    }
    /* the call */
    int callv = -1;
    if (!st) {
      char* ops_s = NULL;
      size_t ol = 0;
      FILE* fo = open_memstream(&ops_s, &ol);
      char* ins = NULL;
      size_t il = 0;
      FILE* ft = open_memstream(&ins, &il);
      char* outs_t = NULL;
      size_t otl = 0;
      FILE* fr = open_memstream(&outs_t, &otl);
      if (!fo || !ft || !fr) {
        st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
      } else {
        for (int i = 0; i < np; i++) {
          const view_t* v = &c.v[0][i];
          fprintf(fo, "%s%%v%d", i ? ", " : "", pv[i]);
          fprintf(ft, "%s%s", i ? ", " : "", ty(v->nd, v->sz, v->dt));
        }
        for (int i = 0; i < nr; i++) {
          const view_t* v = &c.v[1][i];
          fprintf(fr, "%s%s", i ? ", " : "", ty(v->nd, v->sz, v->dt));
        }
        if (checked) fprintf(fr, "%stensor<i32>", nr ? ", " : "");
      }
      if (fo) fclose(fo);
      if (ft) fclose(ft);
      if (fr) fclose(fr);
      if (!st && (nr || checked)) { /* a graph without results writes nothing: no call */
        callv = w.next++;
        fprintf(f, "    %%v%d:%d = \"func.call\"(%s) {callee = @graph} : (%s) -> (%s)\n", callv, nr + checked,
                ops_s ? ops_s : "", ins ? ins : "", outs_t ? outs_t : "");
      }
      free(ops_s);
      free(ins);
      free(outs_t);
    }
    /* the writes */
    for (int i = 0; i < nr && !st; i++) {
      const view_t* v = &c.v[1][i];
      slot_t* sl = &slots[rslot[i]];
      if (sl->s.value < 0) {
        const int64_t E = elems(sl, sl->s.dt);
        sl->s.value = zeros(&w, 1, &E, sl->s.dt);
      }
      int val = w.next++;
      fprintf(f, "    %%v%d = \"stablehlo.reshape\"(%%v%d#%d) : (%s) -> %s\n", val, callv, i,
              ty(v->nd, v->sz, v->dt), ty(v->nd, v->sz, v->dt));
      st = emit_write(&w, &sl->s, (int64_t)((uintptr_t)v->data - sl->base), v, val);
    }
    free(pv);
    if (!st) {
      fputs("    \"func.return\"(", f);
      int k = 0;
      for (int s = 0; s < ns; s++)
        if (slots[s].written || slots[s].retype) fprintf(f, "%s%%v%d", k++ ? ", " : "", slots[s].s.value);
      if (checked) fprintf(f, "%s%%v%d#%d", k++ ? ", " : "", callv, nr);
      fputs(") : (", f);
      k = 0;
      for (int s = 0; s < ns; s++) {
        const slot_t* sl = &slots[s];
        if (sl->written || sl->retype) fprintf(f, "%s%s", k++ ? ", " : "", ty1(elems(sl, sl->s.dt), sl->s.dt));
      }
      if (checked) fprintf(f, "%stensor<i32>", k++ ? ", " : "");
      fputs(") -> ()\n  }\n}\n", f);
    }
    fclose(f);
    f = NULL;
    if (!st) {
      out->outs = calloc((size_t)nouts + 1, sizeof(uintptr_t));
      out->out_arg = calloc((size_t)nouts + 1, sizeof(int));
      out->out_donor = calloc((size_t)nouts + 1, sizeof(int));
      if (!out->outs || !out->out_arg || !out->out_donor)
        st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory composing a program");
      int k = 0;
      for (int s = 0; s < ns && !st; s++) {
        const slot_t* sl = &slots[s];
        if (!sl->written && !sl->retype) continue;
        out->out_arg[k] = sl->written ? -1 : sl->arg_index;
        out->out_donor[k] = sl->arg && sl->written && !sl->retype ? sl->arg_index : -1;
        out->outs[k++] = sl->base;
      }
      out->nouts = nouts;
    }
  }
  if (f) fclose(f);
  free(inner);
  free(slots);
  free(pslot);
  free(rslot);
  free(c.v[0]);
  free(c.v[1]);
  if (st) {
    free(text);
    free(args);
    free(out->outs);
    free(out->out_arg);
    free(out->out_donor);
    free(c.baked);
    free(c.checks);
    memset(out, 0, sizeof(*out));
    return st;
  }
  out->baked = c.baked;
  out->nbaked = c.nbaked;
  out->checks = c.checks;
  out->nchecks = c.nchecks;
  out->text = text;
  out->len = len;
  out->args = args;
  out->nargs = nargs;
  return TPU_OK;
}
