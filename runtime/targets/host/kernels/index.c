/* Indexing kernels: index_select, gather, scatter (+ reduce variants),
 * index_add/copy/fill, take/put, advanced indexing (index.Tensor and
 * index_put), nonzero and masked_scatter.
 *
 * All of them run on one strided walker that visits every position of a walk
 * shape with byte pointers into its operands, by convention:
 *   operand 0: the "indexed" tensor, whose position along the indexed dims
 *              comes from index values (read by gather-like ops, written by
 *              scatter-like ops);
 *   operand 1: the "direct" tensor, addressed by the walk position;
 *   operands 2..: the index tensors, addressed by the walk position.
 * Every index tensor is range-checked before anything is written. Writes that
 * may collide (scatter, index_add, index_put) walk the colliding dims in
 * order inside one task and split only the other dims between threads, so
 * results never depend on the thread split.
 */
#include "index.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"
#include "zvalue.h"

#define WALK_MAX_OPS (TPU_MAX_DIMS + 2)
#define WALK_GRAIN 16384 /* elements per parallel task at least */

typedef void (*visit_fn_t)(void* ctx, char* const* p);

typedef struct walk {
  int ndim, nops;
  int64_t sizes[TPU_MAX_DIMS];
  int64_t st[WALK_MAX_OPS][TPU_MAX_DIMS]; /* byte strides per operand */
  char* base[WALK_MAX_OPS];
  uint64_t serial_dims; /* bit d: dim d is walked in order within one task */
  bool serial;          /* the whole walk runs in order on the calling thread */
  visit_fn_t visit;
  void* ctx;
} walk_t;

/* The walk split into outer dims (spread over tasks) and inner dims (walked
 * in full, in order, for each task). */
typedef struct {
  const walk_t* w;
  int no, ni;
  int64_t osz[TPU_MAX_DIMS], isz[TPU_MAX_DIMS];
  int64_t ost[WALK_MAX_OPS][TPU_MAX_DIMS], ist[WALK_MAX_OPS][TPU_MAX_DIMS];
  int64_t inner_n;
} walk_plan_t;

/* Advances a row-major counter over `sz` and the operands' offsets. */
static void counter_step(int n, const int64_t* sz, int64_t* c, int nops,
                         int64_t (*st)[TPU_MAX_DIMS], int64_t* off) {
  for (int d = n - 1; d >= 0; d--) {
    c[d]++;
    for (int k = 0; k < nops; k++) off[k] += st[k][d];
    if (c[d] < sz[d]) return;
    for (int k = 0; k < nops; k++) off[k] -= st[k][d] * sz[d];
    c[d] = 0;
  }
}

/* Outer positions [p0, p1): for each inner position (in order), visit the
 * outer positions of the range; each outer position sees its inner ones in
 * order. */
static void walk_chunk(void* arg, int64_t p0, int64_t p1) {
  walk_plan_t* pl = arg;
  const walk_t* w = pl->w;
  int nops = w->nops;
  int64_t oc0[TPU_MAX_DIMS], oo0[WALK_MAX_OPS] = {0};
  int64_t rem = p0;
  for (int d = pl->no - 1; d >= 0; d--) {
    oc0[d] = rem % pl->osz[d];
    rem /= pl->osz[d];
    for (int k = 0; k < nops; k++) oo0[k] += oc0[d] * pl->ost[k][d];
  }
  int64_t ic[TPU_MAX_DIMS] = {0}, io[WALK_MAX_OPS] = {0};
  char* p[WALK_MAX_OPS];
  for (int64_t q = 0; q < pl->inner_n; q++) {
    int64_t oc[TPU_MAX_DIMS], oo[WALK_MAX_OPS];
    memcpy(oc, oc0, sizeof(oc));
    memcpy(oo, oo0, sizeof(oo));
    for (int64_t pos = p0; pos < p1; pos++) {
      for (int k = 0; k < nops; k++) p[k] = w->base[k] + oo[k] + io[k];
      w->visit(w->ctx, p);
      counter_step(pl->no, pl->osz, oc, nops, pl->ost, oo);
    }
    counter_step(pl->ni, pl->isz, ic, nops, pl->ist, io);
  }
}

static void walk_run(const walk_t* w) {
  walk_plan_t pl;
  pl.w = w;
  pl.no = pl.ni = 0;
  int64_t outer_n = 1;
  pl.inner_n = 1;
  for (int d = 0; d < w->ndim; d++) {
    bool inner = (w->serial_dims >> d) & 1u;
    int i = inner ? pl.ni++ : pl.no++;
    (inner ? pl.isz : pl.osz)[i] = w->sizes[d];
    for (int k = 0; k < w->nops; k++) (inner ? pl.ist : pl.ost)[k][i] = w->st[k][d];
    if (inner) pl.inner_n *= w->sizes[d];
    else outer_n *= w->sizes[d];
  }
  if (outer_n == 0 || pl.inner_n == 0) return;
  if (w->serial) {
    walk_chunk(&pl, 0, outer_n);
    return;
  }
  int64_t grain = WALK_GRAIN / pl.inner_n;
  tpu_parallel_for(outer_n, grain > 0 ? grain : 1, walk_chunk, &pl);
}

/* Sets operand k to tensor t whose dims line up with the walk's dims. */
static void walk_operand(walk_t* w, int k, const tpu_tensor_t* t) {
  int64_t esz = (int64_t)tpu_dtype_size(t->dtype);
  w->base[k] = t->data;
  for (int d = 0; d < w->ndim; d++) w->st[k][d] = t->strides[d] * esz;
}

/* ---- element helpers ---- */
static inline void copy_elem(char* dst, const char* src, size_t esz) {
  switch (esz) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 16: memcpy(dst, src, 16); break; /* complex128 */
    default: memcpy(dst, src, 8); break;
  }
}

static inline int64_t load_index(const char* p, tpu_dtype_t dt) {
  if (dt == TPU_I64) return *(const int64_t*)p;
  if (dt == TPU_I32) return *(const int32_t*)p;
  return tpu_load_i64(p, dt);
}

typedef enum { RED_COPY, RED_ADD, RED_MUL, RED_MAX, RED_MIN } red_t;

/* Shared by the visitors: how to turn index values into operand 0's offset
 * and what to do with the element. */
typedef struct {
  int nidx;
  tpu_dtype_t idx_dt[TPU_MAX_DIMS];
  int64_t idx_size[TPU_MAX_DIMS]; /* size of each indexed dim (negative indices wrap) */
  int64_t idx_st[TPU_MAX_DIMS];   /* byte stride of each indexed dim in operand 0 */
  const tpu_tensor_t* linear;     /* take/put: the index is a row-major position in this */
  tpu_dtype_t dt;                 /* operand 0 */
  tpu_dtype_t src_dt;             /* operand 1 (equal to dt for RED_COPY) */
  size_t esz;
  red_t red;
  double alpha;   /* RED_ADD: dst += alpha * src */
  double alpha_im; /* complex dtypes: alpha's imaginary part */
  int64_t ialpha;
} index_ctx_t;

static int64_t indexed_offset(const index_ctx_t* cx, char* const* p) {
  if (cx->linear) {
    int64_t v = load_index(p[2], cx->idx_dt[0]);
    return tpu_tensor_offset_of(cx->linear, v < 0 ? v + cx->idx_size[0] : v);
  }
  int64_t off = 0;
  for (int j = 0; j < cx->nidx; j++) {
    int64_t v = load_index(p[2 + j], cx->idx_dt[j]);
    off += (v < 0 ? v + cx->idx_size[j] : v) * cx->idx_st[j];
  }
  return off;
}

/* dst = dst (op) src, stored in dst's dtype; floats combine in double,
 * complex values in double complex (sum and product only), integers with
 * two's complement wrap-around, NaN propagates through max/min. */
static void combine(char* dst, const char* src, const index_ctx_t* cx) {
  tpu_dtype_t dt = cx->dt;
  if (cx->red == RED_COPY) {
    copy_elem(dst, src, cx->esz);
  } else if (tpu_dtype_is_complex(dt)) {
    zc_t a = tpu_load_z(dst, dt), b = tpu_load_z(src, cx->src_dt);
    tpu_store_z(dst, dt, cx->red == RED_MUL ? a * b : a + CMPLX(cx->alpha, cx->alpha_im) * b);
  } else if (tpu_dtype_is_float(dt)) {
    double a = tpu_load_f64(dst, dt), b = tpu_load_f64(src, cx->src_dt), r;
    switch (cx->red) {
      case RED_ADD: r = a + cx->alpha * b; break;
      case RED_MUL: r = a * b; break;
      case RED_MAX: r = (b != b || a < b) ? b : a; break;
      default: r = (b != b || b < a) ? b : a; break;
    }
    tpu_store_f64(dst, dt, r);
  } else {
    int64_t a = tpu_load_i64(dst, dt), b = tpu_load_i64(src, cx->src_dt), r;
    switch (cx->red) {
      case RED_ADD: r = (int64_t)((uint64_t)a + (uint64_t)cx->ialpha * (uint64_t)b); break;
      case RED_MUL: r = (int64_t)((uint64_t)a * (uint64_t)b); break;
      case RED_MAX: r = a < b ? b : a; break;
      default: r = b < a ? b : a; break;
    }
    tpu_store_i64(dst, dt, r);
  }
}

/* operand 1 = operand 0 at the indexed position */
static void gather_visit(void* c, char* const* p) {
  const index_ctx_t* cx = c;
  copy_elem(p[1], p[0] + indexed_offset(cx, p), cx->esz);
}

/* operand 0 at the indexed position (op)= operand 1 */
static void scatter_visit(void* c, char* const* p) {
  const index_ctx_t* cx = c;
  combine(p[0] + indexed_offset(cx, p), p[1], cx);
}

/* ---- argument helpers ---- */
tpu_status_t tpu_index_wrap_dim(const char* op, int64_t dim, int ndim, int* out) {
  int64_t n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return TPU_ERR(OUT_OF_RANGE,
                   "%s: Dimension out of range (expected to be in range of [%lld, %lld], but got "
                   "%lld)",
                   op, (long long)-n, (long long)(n - 1), (long long)dim);
  *out = (int)(dim < 0 ? dim + n : dim);
  return TPU_OK;
}

/* t, or a one-element 1-D view of it when t is 0-d (the dim-based ops treat
 * scalars as [1]). */
static const tpu_tensor_t* as_nd(const tpu_tensor_t* t, tpu_tensor_t* tmp) {
  if (t->ndim > 0) return t;
  *tmp = *t;
  tmp->ndim = 1;
  tmp->sizes[0] = 1;
  tmp->strides[0] = 1;
  return tmp;
}

/* A 0-d descriptor holding scalar argument i (a number or a 0-d tensor)
 * converted to dt; as a walk operand it broadcasts (ndim 0). */
static const tpu_tensor_t* scalar_desc(const tpu_call_t* c, int i, tpu_dtype_t dt,
                                       tpu_tensor_t* tmp) {
  memset(tmp, 0, sizeof(*tmp));
  tmp->dtype = dt;
  tmp->data = tmp->inline_value;
  const tpu_arg_t* a = &c->args[i];
  if (tpu_dtype_is_complex(dt)) {
    double z[2] = {0, 0};
    (void)tpu_arg_complex(c, i, z);
    tpu_store_z(tmp->data, dt, CMPLX(z[0], z[1]));
    return tmp;
  }
  bool as_float = a->kind == TPU_ARG_DOUBLE ||
                  (a->kind == TPU_ARG_TENSOR && tpu_dtype_is_float(a->v.t->dtype));
  if (as_float) tpu_store_f64(tmp->data, dt, tpu_arg_f64(c, i, 0));
  else tpu_store_i64(tmp->data, dt, tpu_arg_i64(c, i, 0));
  return tmp;
}

/* CPU refuses a complex scalar argument i with an imaginary part for a real
 * dtype dt (it does not drop the imaginary part). */
static tpu_status_t check_real_scalar(const char* op, const tpu_call_t* c, int i, tpu_dtype_t dt) {
  const tpu_arg_t* a = &c->args[i];
  if (i >= c->nargs || a->kind != TPU_ARG_COMPLEX || a->v.c[1] == 0 || tpu_dtype_is_complex(dt))
    return TPU_OK;
  return TPU_ERR(INVALID_ARGUMENT, "%s: value cannot be converted to type %s without overflow", op,
                 tpu_dtype_name(dt));
}

static void shape_str(char* buf, size_t cap, int nd, const int64_t* sizes) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < nd && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, d ? ", %lld" : "%lld", (long long)sizes[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The preallocated output must have the shape the kernel computes. */
static tpu_status_t check_out_shape(const char* op, const tpu_tensor_t* out, int nd,
                                    const int64_t* sizes) {
  bool ok = out->ndim == nd;
  for (int d = 0; ok && d < nd; d++) ok = out->sizes[d] == sizes[d];
  if (ok) return TPU_OK;
  char a[200], b[200];
  shape_str(a, sizeof a, out->ndim, out->sizes);
  shape_str(b, sizeof b, nd, sizes);
  return TPU_ERR(INVALID_ARGUMENT, "%s: output has shape %s but the result has shape %s", op, a, b);
}

static tpu_status_t check_same_dtype(const char* op, const tpu_tensor_t* self,
                                     const tpu_tensor_t* other, const char* what) {
  if (self->dtype == other->dtype) return TPU_OK;
  return TPU_ERR(INVALID_ARGUMENT, "%s: expected self (%s) and %s (%s) to have the same dtype", op,
                 tpu_dtype_name(self->dtype), what, tpu_dtype_name(other->dtype));
}

static tpu_status_t check_index_dtype(const char* op, const tpu_tensor_t* index) {
  if (index->dtype == TPU_I64 || index->dtype == TPU_I32) return TPU_OK;
  return TPU_ERR(INVALID_ARGUMENT, "%s: expected an int64 or int32 index tensor but got %s", op,
                 tpu_dtype_name(index->dtype));
}

/* gather/scatter check the index dtype only when there are indices (CPU
 * accepts an empty index of any dtype) */
static tpu_status_t check_gather_index_dtype(const char* op, const tpu_tensor_t* index) {
  return tpu_tensor_numel(index) == 0 ? TPU_OK : check_index_dtype(op, index);
}

typedef struct {
  tpu_dtype_t dt;
  int64_t lo, hi; /* valid range [lo, hi) */
  bool bad;
  int64_t bad_value;
} range_check_t;

static void range_visit(void* c, char* const* p) {
  range_check_t* rc = c;
  if (rc->bad) return;
  int64_t v = load_index(p[0], rc->dt);
  if (v < rc->lo || v >= rc->hi) {
    rc->bad = true;
    rc->bad_value = v;
  }
}

/* Every value of `index` must address a dim of `size` (in [-size, size) when
 * negative indices wrap); dim < 0 means a row-major position among `size`
 * elements (take/put). Reports the first bad value in row-major order with
 * `code`: PyTorch's CPU kernels raise IndexError (OUT_OF_RANGE) for some ops
 * (index_select, index_copy, index_fill, take, put, advanced indexing) and
 * RuntimeError (INVALID_ARGUMENT) for others (gather, scatter*, index_add). */
static tpu_status_t check_index_range_code(const char* op, const tpu_tensor_t* index,
                                           int64_t size, int dim, bool wrap_negative,
                                           tpu_status_code_t code) {
  range_check_t rc = {index->dtype, wrap_negative ? -size : 0, size, false, 0};
  if (index->ndim == 1 && index->dtype == TPU_I64) { /* the common case, without the walker */
    const int64_t* v = index->data;
    int64_t st = index->strides[0], lo = rc.lo, hi = rc.hi, n = index->sizes[0], bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= v[i * st] < lo || v[i * st] >= hi;
    for (int64_t i = 0; bad && i < n; i++) {
      if (v[i * st] < lo || v[i * st] >= hi) {
        rc.bad = true;
        rc.bad_value = v[i * st];
        break;
      }
    }
  } else {
    walk_t w = {0};
    w.ndim = index->ndim;
    w.nops = 1;
    memcpy(w.sizes, index->sizes, sizeof(w.sizes));
    walk_operand(&w, 0, index);
    w.serial = true;
    w.visit = range_visit;
    w.ctx = &rc;
    walk_run(&w);
  }
  if (!rc.bad) return TPU_OK;
  if (dim < 0)
    return tpu_status_make(code,
                           "%s: out of range: tried to access index %lld on a tensor of %lld "
                           "elements",
                           op, (long long)rc.bad_value, (long long)size);
  return tpu_status_make(code, "%s: index %lld is out of bounds for dimension %d with size %lld",
                         op, (long long)rc.bad_value, dim, (long long)size);
}

/* check_index_range_code raising IndexError */
static tpu_status_t check_index_range(const char* op, const tpu_tensor_t* index, int64_t size,
                                      int dim, bool wrap_negative) {
  return check_index_range_code(op, index, size, dim, wrap_negative, TPU_CODE_OUT_OF_RANGE);
}

/* check_index_range_code raising RuntimeError */
static tpu_status_t check_index_range_rt(const char* op, const tpu_tensor_t* index, int64_t size,
                                         int dim) {
  return check_index_range_code(op, index, size, dim, false, TPU_CODE_INVALID_ARGUMENT);
}

/* out = self, unless out already is self (in-place overloads). Broadcasts
 * self to out's shape. */
static tpu_status_t copy_self(const tpu_tensor_t* out, const tpu_tensor_t* self) {
  bool same = out->data == self->data && out->ndim == self->ndim && out->dtype == self->dtype;
  for (int d = 0; same && d < out->ndim; d++)
    same = out->sizes[d] == self->sizes[d] && out->strides[d] == self->strides[d];
  return same ? TPU_OK : tpu_copy_strided(out, self);
}

/* A view of t with shape (nd, sizes) (same number of elements, row-major
 * order); copies t into *scratch (host memory the caller frees) when its
 * strides do not allow a view. */
static tpu_status_t reshape_view(const tpu_tensor_t* t, int nd, const int64_t* sizes,
                                 tpu_tensor_t* view, void** scratch) {
  *scratch = NULL;
  bool same = t->ndim == nd;
  for (int d = 0; same && d < nd; d++) same = t->sizes[d] == sizes[d];
  if (same) {
    *view = *t;
    return TPU_OK;
  }
  void* data = t->data;
  if (!tpu_tensor_is_contiguous(t)) {
    size_t bytes = (size_t)tpu_tensor_numel(t) * tpu_dtype_size(t->dtype);
    *scratch = malloc(bytes ? bytes : 1);
    if (!*scratch) return TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory (%zu bytes)", bytes);
    tpu_tensor_t tmp;
    tpu_tensor_make_contig(&tmp, *scratch, t->dtype, t->ndim, t->sizes);
    tpu_status_t st = tpu_copy_strided(&tmp, t);
    if (st) {
      free(*scratch);
      *scratch = NULL;
      return st;
    }
    data = *scratch;
  }
  tpu_tensor_make_contig(view, data, t->dtype, nd, sizes);
  return TPU_OK;
}

/* ---- dim-based ops ---- */

/* Walk of `shape` for an op along `dim`: operand 0 = `indexed` (its position
 * along dim comes from the index), operand 1 = `direct` (a 0-d descriptor
 * broadcasts), operand 2 = `index`, strided like the walk when `index_full`
 * (gather/scatter), else a 1-D index along dim (index_select/add/copy/fill). */
static void dim_walk(walk_t* w, index_ctx_t* cx, int ndim, const int64_t* shape, int dim,
                     const tpu_tensor_t* indexed, const tpu_tensor_t* direct,
                     const tpu_tensor_t* index, bool index_full) {
  memset(w, 0, sizeof(*w));
  w->ndim = ndim;
  w->nops = 3;
  memcpy(w->sizes, shape, sizeof(int64_t) * (size_t)ndim);
  walk_operand(w, 0, indexed);
  w->st[0][dim] = 0;
  if (direct->ndim > 0) walk_operand(w, 1, direct);
  else w->base[1] = direct->data;
  if (index_full) {
    walk_operand(w, 2, index);
  } else {
    w->base[2] = index->data;
    w->st[2][dim] = index->strides[0] * (int64_t)tpu_dtype_size(index->dtype);
  }
  memset(cx, 0, sizeof(*cx));
  cx->nidx = 1;
  cx->idx_dt[0] = index->dtype;
  cx->idx_size[0] = indexed->sizes[dim];
  cx->dt = indexed->dtype;
  cx->src_dt = direct->dtype;
  cx->esz = tpu_dtype_size(indexed->dtype);
  cx->idx_st[0] = indexed->strides[dim] * (int64_t)cx->esz;
  cx->alpha = 1;
  cx->ialpha = 1;
  w->ctx = cx;
}

/* ---- index_select by blocks ----
 * When the dims after `dim` form one contiguous block in both self and out
 * (the usual case: rows of a matrix, embedding lookups), each selected
 * position is a single memcpy of that block. Items are (outer position,
 * index entry) pairs; the dims before `dim` may have any strides. */
typedef struct {
  const char* src;
  char* dst;
  const char* idx;
  tpu_dtype_t idx_dt;
  int64_t idx_st;          /* bytes */
  int64_t nidx;            /* index entries */
  int no;                  /* outer dims */
  int64_t osz[TPU_MAX_DIMS], ost_src[TPU_MAX_DIMS], ost_dst[TPU_MAX_DIMS]; /* bytes */
  int64_t src_dim_st, dst_dim_st; /* bytes along dim */
  size_t block;            /* bytes per selected block */
} select_blocks_t;

static void select_blocks_range(void* arg, int64_t b, int64_t e) {
  const select_blocks_t* s = arg;
  int64_t o = b / s->nidx, j = b % s->nidx;
  while (b < e) {
    int64_t so = 0, dof = 0, rem = o;
    for (int d = s->no - 1; d >= 0; d--) {
      int64_t i = rem % s->osz[d];
      rem /= s->osz[d];
      so += i * s->ost_src[d];
      dof += i * s->ost_dst[d];
    }
    const char* src = s->src + so;
    char* dst = s->dst + dof;
    int64_t jend = s->nidx < j + (e - b) ? s->nidx : j + (e - b);
    if (s->block == 4 && s->dst_dim_st == 4) {
      for (int64_t k = j; k < jend; k++) {
        int64_t v = load_index(s->idx + k * s->idx_st, s->idx_dt);
        memcpy(dst + k * 4, src + v * s->src_dim_st, 4);
      }
    } else {
      for (int64_t k = j; k < jend; k++) {
        int64_t v = load_index(s->idx + k * s->idx_st, s->idx_dt);
        memcpy(dst + k * s->dst_dim_st, src + v * s->src_dim_st, s->block);
      }
    }
    b += jend - j;
    j = 0;
    o++;
  }
}

/* Whether dims (dim, ndim) of t are one row-major block (size-1 dims
 * ignored). */
static bool tail_is_block(const tpu_tensor_t* t, int dim) {
  int64_t expect = 1;
  for (int d = t->ndim - 1; d > dim; d--) {
    if (t->sizes[d] == 1) continue;
    if (t->strides[d] != expect) return false;
    expect *= t->sizes[d];
  }
  return true;
}

/* Runs index_select by blocks when the layout allows; false otherwise. */
static bool select_blocks(const tpu_tensor_t* self, const tpu_tensor_t* index,
                          const tpu_tensor_t* out, int dim) {
  if (!tail_is_block(self, dim) || !tail_is_block(out, dim)) return false;
  select_blocks_t s;
  int64_t esz = (int64_t)tpu_dtype_size(self->dtype), inner = 1, outer = 1;
  for (int d = dim + 1; d < self->ndim; d++) inner *= self->sizes[d];
  s.src = self->data;
  s.dst = out->data;
  s.idx = index->data;
  s.idx_dt = index->dtype;
  s.idx_st = index->strides[0] * (int64_t)tpu_dtype_size(index->dtype);
  s.nidx = index->sizes[0];
  s.no = dim;
  for (int d = 0; d < dim; d++) {
    s.osz[d] = self->sizes[d];
    s.ost_src[d] = self->strides[d] * esz;
    s.ost_dst[d] = out->strides[d] * esz;
    outer *= self->sizes[d];
  }
  s.src_dim_st = self->strides[dim] * esz;
  s.dst_dim_st = out->strides[dim] * esz;
  s.block = (size_t)(inner * esz);
  int64_t items = outer * s.nidx;
  if (items == 0 || inner == 0) return true;
  int64_t grain = WALK_GRAIN / inner;
  tpu_parallel_for(items, grain > 0 ? grain : 1, select_blocks_range, &s);
  return true;
}

tpu_status_t tpu_k_index_select(const tpu_call_t* c) {
  const char* op = "index_select()";
  tpu_tensor_t t0, t1, t2;
  const tpu_tensor_t* self = as_nd(tpu_arg_tensor(c, 0), &t0);
  const tpu_tensor_t* index = tpu_arg_tensor(c, 2);
  const tpu_tensor_t* out = as_nd(&c->outs[0], &t2);
  int dim;
  TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, tpu_arg_i64(c, 1, 0), self->ndim, &dim));
  TPU_RETURN_IF_ERROR(check_index_dtype(op, index));
  if (index->ndim > 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: Index is supposed to be a vector, got %d dims", op,
                   index->ndim);
  index = as_nd(index, &t1);
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, self->sizes, sizeof(shape));
  shape[dim] = index->sizes[0];
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, self->ndim, shape));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  /* PyTorch's CPU kernel, for 2+ dims: an empty index checks nothing; an
   * empty self, and dim 1 into a contiguous out, check the index with
   * RuntimeError; otherwise (and for 0-1 dims) IndexError. */
  tpu_status_code_t code = TPU_CODE_OUT_OF_RANGE;
  if (tpu_arg_tensor(c, 0)->ndim > 1) {
    if (index->sizes[0] == 0) return TPU_OK;
    if (tpu_tensor_numel(self) == 0) {
      if (self->sizes[dim] == 0)
        return TPU_ERR(INVALID_ARGUMENT, "%s: self indexing axis dim should be positive", op);
      return check_index_range_code(op, index, self->sizes[dim], dim, false,
                                    TPU_CODE_INVALID_ARGUMENT);
    }
    if (dim == 1 && tpu_tensor_is_contiguous(&c->outs[0])) code = TPU_CODE_INVALID_ARGUMENT;
  }
  TPU_RETURN_IF_ERROR(check_index_range_code(op, index, self->sizes[dim], dim, false, code));
  if (select_blocks(self, index, out, dim)) return TPU_OK;
  walk_t w;
  index_ctx_t cx;
  dim_walk(&w, &cx, self->ndim, shape, dim, self, out, index, false);
  w.visit = gather_visit;
  walk_run(&w);
  return TPU_OK;
}

tpu_status_t tpu_k_gather(const tpu_call_t* c) {
  const char* op = "gather()";
  tpu_tensor_t t0, t1, t2;
  const tpu_tensor_t* self = as_nd(tpu_arg_tensor(c, 0), &t0);
  const tpu_tensor_t* index = as_nd(tpu_arg_tensor(c, 2), &t1);
  const tpu_tensor_t* out = as_nd(&c->outs[0], &t2);
  int dim;
  TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, tpu_arg_i64(c, 1, 0), self->ndim, &dim));
  /* CPU checks neither the dtype nor the shape of an empty index (the
   * output, index-shaped, is empty) */
  if (tpu_tensor_numel(index) == 0) return TPU_OK;
  TPU_RETURN_IF_ERROR(check_gather_index_dtype(op, index));
  if (index->ndim != self->ndim)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Index tensor must have the same number of dimensions as input tensor", op);
  for (int d = 0; d < self->ndim; d++)
    if (d != dim && index->sizes[d] > self->sizes[d])
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: Size does not match at dimension %d: index has size %lld but self has "
                     "size %lld apart from dimension %d",
                     op, d, (long long)index->sizes[d], (long long)self->sizes[d], dim);
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, index->ndim, index->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  TPU_RETURN_IF_ERROR(check_index_range_rt(op, index, self->sizes[dim], dim));
  walk_t w;
  index_ctx_t cx;
  dim_walk(&w, &cx, index->ndim, index->sizes, dim, self, out, index, true);
  w.visit = gather_visit;
  walk_run(&w);
  return TPU_OK;
}

/* out[index] (red)= src along dim, for scatter-like ops; out, index and src
 * are at least 1-D (src may be a broadcasting 0-d scalar descriptor). */
static tpu_status_t scatter_into(const char* op, const tpu_tensor_t* out, int dim,
                                 const tpu_tensor_t* index, const tpu_tensor_t* src, red_t red) {
  if (tpu_tensor_numel(index) == 0) return TPU_OK;
  if (index->ndim != out->ndim || (src->ndim > 0 && src->ndim != out->ndim))
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Index tensor must have the same number of dimensions as self and src", op);
  for (int d = 0; d < out->ndim; d++) {
    if ((src->ndim > 0 && index->sizes[d] > src->sizes[d]) ||
        (d != dim && index->sizes[d] > out->sizes[d]))
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: index has size %lld at dimension %d, larger than src or self (apart "
                     "from dimension %d)",
                     op, (long long)index->sizes[d], d, dim);
  }
  TPU_RETURN_IF_ERROR(check_index_range_rt(op, index, out->sizes[dim], dim));
  walk_t w;
  index_ctx_t cx;
  dim_walk(&w, &cx, index->ndim, index->sizes, dim, out, src, index, true);
  cx.red = red;
  w.serial_dims = 1ull << dim;
  w.visit = scatter_visit;
  walk_run(&w);
  return TPU_OK;
}

/* Operands shared by the scatter kernels: (self, dim, index, src-or-value). */
typedef struct {
  const tpu_tensor_t *self, *index, *src, *out;
  int dim;
  tpu_tensor_t t_self, t_index, t_src, t_out;
} scatter_args_t;

static tpu_status_t scatter_args(const char* op, const tpu_call_t* c, scatter_args_t* a) {
  a->out = as_nd(&c->outs[0], &a->t_out);
  a->self = as_nd(tpu_arg_tensor(c, 0), &a->t_self);
  a->index = as_nd(tpu_arg_tensor(c, 2), &a->t_index);
  TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, tpu_arg_i64(c, 1, 0), a->self->ndim, &a->dim));
  TPU_RETURN_IF_ERROR(check_gather_index_dtype(op, a->index));
  TPU_RETURN_IF_ERROR(check_out_shape(op, a->out, a->self->ndim, a->self->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, a->self, a->out, "out"));
  if (c->args[3].kind == TPU_ARG_TENSOR) {
    a->src = as_nd(c->args[3].v.t, &a->t_src);
    TPU_RETURN_IF_ERROR(check_same_dtype(op, a->self, a->src, "src"));
  } else {
    TPU_RETURN_IF_ERROR(check_real_scalar(op, c, 3, a->out->dtype));
    a->src = scalar_desc(c, 3, a->out->dtype, &a->t_src);
  }
  return copy_self(a->out, a->self);
}

/* Stores the lowest (or highest) value of dt: -inf/+inf for floats. */
static void store_extreme(void* p, tpu_dtype_t dt, bool highest) {
  int64_t lo, hi;
  switch (dt) {
    case TPU_U8: lo = 0; hi = UINT8_MAX; break;
    case TPU_I8: lo = INT8_MIN; hi = INT8_MAX; break;
    case TPU_I16: lo = INT16_MIN; hi = INT16_MAX; break;
    case TPU_I32: lo = INT32_MIN; hi = INT32_MAX; break;
    case TPU_BOOL: lo = 0; hi = 1; break;
    case TPU_I64: lo = INT64_MIN; hi = INT64_MAX; break;
    default: tpu_store_f64(p, dt, highest ? INFINITY : -INFINITY); return;
  }
  tpu_store_i64(p, dt, highest ? hi : lo);
}

/* mean: operand 0 = the sums, operand 1 = the int64 counts */
static void mean_visit(void* c, char* const* p) {
  const index_ctx_t* cx = c;
  int64_t n = *(const int64_t*)p[1];
  if (n == 0) n = 1;
  if (tpu_dtype_is_complex(cx->dt)) {
    tpu_store_z(p[0], cx->dt, tpu_load_z(p[0], cx->dt) / (double)n);
  } else if (tpu_dtype_is_float(cx->dt)) {
    tpu_store_f64(p[0], cx->dt, tpu_load_f64(p[0], cx->dt) / (double)n);
  } else { /* floor division like PyTorch for integral means */
    int64_t a = tpu_load_i64(p[0], cx->dt), q = a / n;
    if (a % n != 0 && ((a < 0) != (n < 0))) q--;
    tpu_store_i64(p[0], cx->dt, q);
  }
}

/* Divides out by the number of values each element received (+1 with
 * include_self), counted by scattering ones into an int64 scratch tensor. */
static tpu_status_t scatter_mean_finish(const char* op, const tpu_tensor_t* out, int dim,
                                        const tpu_tensor_t* index, bool include_self) {
  int64_t n = tpu_tensor_numel(out);
  int64_t* counts = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  if (!counts) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for counts", op);
  for (int64_t i = 0; i < n; i++) counts[i] = include_self ? 1 : 0;
  tpu_tensor_t cnt, one;
  tpu_tensor_make_contig(&cnt, counts, TPU_I64, out->ndim, out->sizes);
  memset(&one, 0, sizeof(one));
  one.dtype = TPU_I64;
  one.data = one.inline_value;
  *(int64_t*)one.inline_value = 1;
  tpu_status_t st = scatter_into(op, &cnt, dim, index, &one, RED_ADD);
  if (!st) {
    walk_t w = {0};
    index_ctx_t cx = {0};
    cx.dt = out->dtype;
    w.ndim = out->ndim;
    w.nops = 2;
    memcpy(w.sizes, out->sizes, sizeof(w.sizes));
    walk_operand(&w, 0, out);
    walk_operand(&w, 1, &cnt);
    w.visit = mean_visit;
    w.ctx = &cx;
    walk_run(&w);
  }
  free(counts);
  return st;
}

/* Accumulation target for reductions: out itself, or for f16/bf16 outputs
 * (when `use_float`) a float32 copy of out rounded back once by acc_end,
 * which is how PyTorch's CPU kernels accumulate those dtypes. */
typedef struct {
  tpu_tensor_t t;
  void* buf;
} acc_t;

static tpu_status_t acc_begin(const char* op, const tpu_tensor_t* out, bool use_float, acc_t* acc) {
  acc->t = *out;
  acc->buf = NULL;
  if (!use_float || (out->dtype != TPU_F16 && out->dtype != TPU_BF16)) return TPU_OK;
  int64_t n = tpu_tensor_numel(out);
  acc->buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!acc->buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op);
  tpu_tensor_make_contig(&acc->t, acc->buf, TPU_F32, out->ndim, out->sizes);
  tpu_status_t st = tpu_copy_strided(&acc->t, out);
  if (st) {
    free(acc->buf);
    acc->buf = NULL;
  }
  return st;
}

/* Rounds the float32 copy back into out (unless st is an error); frees it. */
static tpu_status_t acc_end(const tpu_tensor_t* out, acc_t* acc, tpu_status_t st) {
  if (!st && acc->buf) st = tpu_copy_strided(out, &acc->t);
  free(acc->buf);
  return st;
}

/* out[index] (red)= src after scatter_args; reductions of f16/bf16 go through
 * a float32 accumulator. Without include_self, the scattered positions start
 * from the reduction's identity; `mean` divides by the number of
 * contributions. */
static tpu_status_t scatter_reduce_run(const char* op, const scatter_args_t* a, red_t red,
                                       bool include_self, bool mean) {
  acc_t acc;
  TPU_RETURN_IF_ERROR(acc_begin(op, a->out, red != RED_COPY, &acc));
  tpu_status_t st = TPU_OK;
  if (!include_self) {
    tpu_tensor_t ident;
    memset(&ident, 0, sizeof(ident));
    ident.dtype = acc.t.dtype;
    ident.data = ident.inline_value;
    if (red == RED_MAX || red == RED_MIN) store_extreme(ident.data, ident.dtype, red == RED_MIN);
    else tpu_store_i64(ident.data, ident.dtype, red == RED_MUL ? 1 : 0);
    st = scatter_into(op, &acc.t, a->dim, a->index, &ident, RED_COPY);
  }
  if (!st) st = scatter_into(op, &acc.t, a->dim, a->index, a->src, red);
  if (!st && mean) st = scatter_mean_finish(op, &acc.t, a->dim, a->index, include_self);
  return acc_end(a->out, &acc, st);
}

static tpu_status_t scatter_kernel(const char* op, const tpu_call_t* c, red_t red) {
  scatter_args_t a;
  TPU_RETURN_IF_ERROR(scatter_args(op, c, &a));
  return scatter_reduce_run(op, &a, red, true, false);
}

/* scatter.src/.value/.reduce/.value_reduce (+ in-place, out=): args[4] is the
 * reduce string when there is one. */
tpu_status_t tpu_k_scatter(const tpu_call_t* c) {
  const char* reduce = tpu_arg_str(c, 4, NULL);
  red_t red = RED_COPY;
  if (reduce) {
    if (!strcmp(reduce, "add")) red = RED_ADD;
    else if (!strcmp(reduce, "multiply")) red = RED_MUL;
    else
      return TPU_ERR(INVALID_ARGUMENT,
                     "scatter(): reduce argument must be either add or multiply, got '%s'", reduce);
  }
  return scatter_kernel("scatter()", c, red);
}

tpu_status_t tpu_k_scatter_add(const tpu_call_t* c) { return scatter_kernel("scatter_add()", c, RED_ADD); }

/* scatter_reduce.two(self, dim, index, src, reduce, include_self) */
tpu_status_t tpu_k_scatter_reduce(const tpu_call_t* c) {
  const char* op = "scatter_reduce()";
  const char* reduce = tpu_arg_str(c, 4, "");
  bool include_self = tpu_arg_bool(c, 5, true);
  red_t red;
  if (!strcmp(reduce, "sum") || !strcmp(reduce, "mean")) red = RED_ADD;
  else if (!strcmp(reduce, "prod")) red = RED_MUL;
  else if (!strcmp(reduce, "amax")) red = RED_MAX;
  else if (!strcmp(reduce, "amin")) red = RED_MIN;
  else
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: reduce argument must be either sum, prod, mean, amax or amin, got %s", op,
                   reduce);
  scatter_args_t a;
  TPU_RETURN_IF_ERROR(scatter_args(op, c, &a));
  if (a.src->ndim == 0) return TPU_ERR(INVALID_ARGUMENT, "%s: src must be a tensor", op);
  if ((red == RED_MAX || red == RED_MIN) && tpu_dtype_is_complex(a.out->dtype))
    return TPU_ERR(UNIMPLEMENTED, "\"scatter_gather_tensor_cpu_reduce_%s\" not implemented for '%s'",
                   reduce, a.out->dtype == TPU_C64 ? "ComplexFloat" : "ComplexDouble");
  return scatter_reduce_run(op, &a, red, include_self, !strcmp(reduce, "mean"));
}

/* Operands shared by index_add/copy/fill: (self, dim, index, ...) with a 1-D
 * index; the walk covers out's shape with dim resized to the index length. */
typedef struct {
  const tpu_tensor_t *self, *index, *out;
  int dim;
  int64_t shape[TPU_MAX_DIMS];
  tpu_tensor_t t_self, t_index, t_out;
} index_dim_args_t;

static tpu_status_t index_dim_args(const char* op, const tpu_call_t* c, index_dim_args_t* a) {
  a->out = as_nd(&c->outs[0], &a->t_out);
  a->self = as_nd(tpu_arg_tensor(c, 0), &a->t_self);
  const tpu_tensor_t* index = tpu_arg_tensor(c, 2);
  TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, tpu_arg_i64(c, 1, 0), a->self->ndim, &a->dim));
  TPU_RETURN_IF_ERROR(check_index_dtype(op, index));
  if (index->ndim > 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: Index should have dimension 1 or 0 (got %d)", op,
                   index->ndim);
  a->index = as_nd(index, &a->t_index);
  TPU_RETURN_IF_ERROR(check_out_shape(op, a->out, a->self->ndim, a->self->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, a->self, a->out, "out"));
  memcpy(a->shape, a->self->sizes, sizeof(a->shape));
  a->shape[a->dim] = a->index->sizes[0];
  return TPU_OK;
}

/* index_add(self, dim, index, source, alpha) / index_copy(self, dim, index, source) */
static tpu_status_t index_accumulate(const char* op, const tpu_call_t* c, red_t red) {
  index_dim_args_t a;
  TPU_RETURN_IF_ERROR(index_dim_args(op, c, &a));
  tpu_tensor_t t_src;
  const tpu_tensor_t* src = as_nd(tpu_arg_tensor(c, 3), &t_src);
  TPU_RETURN_IF_ERROR(check_same_dtype(op, a.self, src, "source"));
  bool ok = src->ndim == a.self->ndim;
  for (int d = 0; ok && d < src->ndim; d++) ok = src->sizes[d] == a.shape[d];
  if (!ok) {
    char s[200], e[200];
    shape_str(s, sizeof s, src->ndim, src->sizes);
    shape_str(e, sizeof e, a.self->ndim, a.shape);
    return TPU_ERR(INVALID_ARGUMENT, "%s: source has shape %s but expected %s", op, s, e);
  }
  /* index_add's alpha (index_copy.out has out there) */
  double alpha = red == RED_ADD ? tpu_arg_f64(c, 4, 1.0) : 1.0;
  int64_t ialpha = red == RED_ADD ? tpu_arg_i64(c, 4, 1) : 1;
  double zalpha[2] = {alpha, 0};
  if (red == RED_ADD) {
    TPU_RETURN_IF_ERROR(check_real_scalar(op, c, 4, a.out->dtype));
    (void)tpu_arg_complex(c, 4, zalpha);
  }
  /* PyTorch's CPU index_add runs as scatter_add when alpha is 1 and the
   * index int64 along the first or last dim of a tensor with 2+ dims: then
   * it accumulates f16/bf16 in float and raises RuntimeError for a bad
   * index; otherwise it adds in the dtype and raises IndexError. With 2+
   * dims and nothing to add or nothing to add into it checks no index. */
  int nd = tpu_arg_tensor(c, 0)->ndim;
  bool scatter_path = red == RED_ADD && alpha == 1.0 && zalpha[1] == 0 && nd > 1 && (a.dim == 0 || a.dim == nd - 1) &&
                      a.index->dtype == TPU_I64;
  if (red == RED_ADD && nd > 1 &&
      (tpu_tensor_numel(a.index) == 0 || tpu_tensor_numel(tpu_arg_tensor(c, 0)) == 0))
    return copy_self(a.out, a.self);
  /* CPU: index_copy raises IndexError */
  TPU_RETURN_IF_ERROR(check_index_range_code(
      op, a.index, a.self->sizes[a.dim], a.dim, false,
      scatter_path ? TPU_CODE_INVALID_ARGUMENT : TPU_CODE_OUT_OF_RANGE));
  TPU_RETURN_IF_ERROR(copy_self(a.out, a.self));
  bool use_float = scatter_path;
  acc_t acc;
  TPU_RETURN_IF_ERROR(acc_begin(op, a.out, use_float, &acc));
  walk_t w;
  index_ctx_t cx;
  dim_walk(&w, &cx, a.self->ndim, a.shape, a.dim, &acc.t, src, a.index, false);
  cx.red = red;
  cx.alpha = alpha;
  cx.alpha_im = zalpha[1];
  cx.ialpha = ialpha;
  w.serial_dims = 1ull << a.dim;
  w.visit = scatter_visit;
  walk_run(&w);
  return acc_end(a.out, &acc, TPU_OK);
}

tpu_status_t tpu_k_index_add(const tpu_call_t* c) { return index_accumulate("index_add()", c, RED_ADD); }
tpu_status_t tpu_k_index_copy(const tpu_call_t* c) { return index_accumulate("index_copy()", c, RED_COPY); }

/* index_fill.int_Scalar / .int_Tensor (self, dim, index, value); negative
 * indices wrap. */
tpu_status_t tpu_k_index_fill(const tpu_call_t* c) {
  const char* op = "index_fill()";
  index_dim_args_t a;
  TPU_RETURN_IF_ERROR(index_dim_args(op, c, &a));
  if (c->args[3].kind == TPU_ARG_TENSOR && c->args[3].v.t->ndim != 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: only supports a 0-dimensional value tensor, but got tensor with %d "
                   "dimension(s)",
                   op, c->args[3].v.t->ndim);
  /* CPU fills through self restrided to index.numel() elements along dim:
   * an empty self checks its indices (against size 0) only when that view
   * has elements, i.e. when dim is self's only empty dim */
  if (tpu_tensor_numel(a.self) == 0) {
    int64_t rest = tpu_tensor_numel(a.index);
    for (int d = 0; d < a.self->ndim; d++)
      if (d != a.dim) rest *= a.self->sizes[d];
    if (rest == 0) return TPU_OK;
    return check_index_range(op, a.index, 0, a.dim, true);
  }
  TPU_RETURN_IF_ERROR(check_index_range(op, a.index, a.self->sizes[a.dim], a.dim, true));
  TPU_RETURN_IF_ERROR(copy_self(a.out, a.self));
  tpu_tensor_t t_val;
  const tpu_tensor_t* value = scalar_desc(c, 3, a.out->dtype, &t_val);
  walk_t w;
  index_ctx_t cx;
  dim_walk(&w, &cx, a.self->ndim, a.shape, a.dim, a.out, value, a.index, false);
  w.serial_dims = 1ull << a.dim;
  w.visit = scatter_visit;
  walk_run(&w);
  return TPU_OK;
}

/* ---- take / put: indices into the row-major flattening ---- */

/* Walk of index's shape where operand 0 = `flat` addressed by the index as a
 * row-major position, operand 1 = `direct` with index's shape. */
static void linear_walk(walk_t* w, index_ctx_t* cx, const tpu_tensor_t* flat,
                        const tpu_tensor_t* direct, const tpu_tensor_t* index) {
  memset(w, 0, sizeof(*w));
  memset(cx, 0, sizeof(*cx));
  w->ndim = index->ndim;
  w->nops = 3;
  memcpy(w->sizes, index->sizes, sizeof(w->sizes));
  w->base[0] = flat->data;
  walk_operand(w, 1, direct);
  walk_operand(w, 2, index);
  cx->nidx = 1;
  cx->idx_dt[0] = index->dtype;
  cx->idx_size[0] = tpu_tensor_numel(flat);
  cx->linear = flat;
  cx->dt = flat->dtype;
  cx->src_dt = direct->dtype;
  cx->esz = tpu_dtype_size(flat->dtype);
  cx->alpha = 1;
  cx->ialpha = 1;
  w->ctx = cx;
}

tpu_status_t tpu_k_take(const tpu_call_t* c) {
  const char* op = "take()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* index = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_index_dtype(op, index));
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, index->ndim, index->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  TPU_RETURN_IF_ERROR(check_index_range(op, index, tpu_tensor_numel(self), -1, true));
  walk_t w;
  index_ctx_t cx;
  linear_walk(&w, &cx, self, out, index);
  w.visit = gather_visit;
  walk_run(&w);
  return TPU_OK;
}

/* put(self, index, source, accumulate): source is read in row-major order;
 * runs serially so duplicate indices apply in order. */
tpu_status_t tpu_k_put(const tpu_call_t* c) {
  const char* op = "put()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* index = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* source = tpu_arg_tensor(c, 2);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_index_dtype(op, index));
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, self->ndim, self->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, source, "source"));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  if (tpu_tensor_numel(source) != tpu_tensor_numel(index))
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Expected source and index to have the same number of elements, but got "
                   "source.numel() = %lld, index.numel() = %lld",
                   op, (long long)tpu_tensor_numel(source), (long long)tpu_tensor_numel(index));
  TPU_RETURN_IF_ERROR(check_index_range(op, index, tpu_tensor_numel(self), -1, true));
  TPU_RETURN_IF_ERROR(copy_self(out, self));
  tpu_tensor_t src;
  void* scratch;
  TPU_RETURN_IF_ERROR(reshape_view(source, index->ndim, index->sizes, &src, &scratch));
  walk_t w;
  index_ctx_t cx;
  linear_walk(&w, &cx, out, &src, index);
  cx.red = tpu_arg_bool(c, 3, false) ? RED_ADD : RED_COPY;
  w.serial = true;
  w.visit = scatter_visit;
  walk_run(&w);
  free(scratch);
  return TPU_OK;
}

/* ---- advanced indexing ---- */

/* self[indices]: the result shape and, per result dim, where it comes from. */
typedef struct {
  int nidx;
  const tpu_tensor_t* idx[TPU_MAX_DIMS];
  int idx_dim[TPU_MAX_DIMS]; /* the self dim each index tensor indexes */
  int nb;
  int64_t bshape[TPU_MAX_DIMS]; /* broadcast shape of the index tensors */
  int nres;
  int64_t rshape[TPU_MAX_DIMS];
  int rdim_self[TPU_MAX_DIMS]; /* result dim -> self dim (a full slice), or -1 */
  int rdim_b[TPU_MAX_DIMS];    /* result dim -> broadcast dim, or -1 */
} adv_plan_t;

/* PyTorch's rules: the index tensors broadcast together; when they index
 * adjacent dims the broadcast dims replace those dims in place, otherwise they
 * come first, followed by the sliced dims in order. */
static tpu_status_t adv_plan(const char* op, const tpu_tensor_t* self, const tpu_arg_t* list,
                             adv_plan_t* pl) {
  memset(pl, 0, sizeof(*pl));
  if (list->kind != TPU_ARG_TENSORLIST)
    return TPU_ERR(INVALID_ARGUMENT, "%s: indices must be a list of tensors", op);
  int n = list->n;
  if (n > self->ndim)
    return TPU_ERR(OUT_OF_RANGE, "%s: too many indices for tensor of dimension %d (got %d)", op,
                   self->ndim, n);
  int first = -1, last = -1;
  bool indexed[TPU_MAX_DIMS] = {false};
  for (int i = 0; i < n; i++) {
    const tpu_tensor_t* t = &list->v.tlist[i];
    if (t->dtype == TPU_DTYPE_NONE) continue;
    if (t->dtype != TPU_I64 && t->dtype != TPU_I32)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: tensors used as indices must be int64 or int32 (masks are converted "
                     "before the kernel), got %s",
                     op, tpu_dtype_name(t->dtype));
    if (t->ndim > pl->nb) {
      /* shift the broadcast shape right to make room for more leading dims */
      int grow = t->ndim - pl->nb;
      memmove(pl->bshape + grow, pl->bshape, sizeof(int64_t) * (size_t)pl->nb);
      for (int d = 0; d < grow; d++) pl->bshape[d] = 1;
      pl->nb = t->ndim;
    }
    for (int d = 0; d < t->ndim; d++) {
      int64_t* b = &pl->bshape[pl->nb - t->ndim + d];
      int64_t s = t->sizes[d];
      if (*b == 1) *b = s;
      else if (s != 1 && s != *b)
        return TPU_ERR(INVALID_ARGUMENT,
                       "%s: shape mismatch: indexing tensors could not be broadcast together "
                       "(size %lld vs %lld)",
                       op, (long long)s, (long long)*b);
    }
    pl->idx[pl->nidx] = t;
    pl->idx_dim[pl->nidx++] = i;
    indexed[i] = true;
    if (first < 0) first = i;
    last = i;
  }
  bool adjacent = pl->nidx == 0 || last - first + 1 == pl->nidx;
  int nres = (pl->nidx > 0 ? pl->nb : 0) + self->ndim - pl->nidx;
  if (nres > TPU_MAX_DIMS)
    return TPU_ERR(INVALID_ARGUMENT, "%s: the result would have %d dims (at most %d)", op, nres,
                   TPU_MAX_DIMS);
  int r = 0;
  int slice_from = 0; /* adjacent: self dims before the indexed block come first */
  if (pl->nidx > 0 && adjacent) {
    for (; slice_from < first; slice_from++, r++) {
      pl->rdim_self[r] = slice_from;
      pl->rdim_b[r] = -1;
    }
  }
  for (int b = 0; pl->nidx > 0 && b < pl->nb; b++, r++) {
    pl->rdim_self[r] = -1;
    pl->rdim_b[r] = b;
  }
  for (int d = slice_from; d < self->ndim; d++) {
    if (indexed[d]) continue;
    pl->rdim_self[r] = d;
    pl->rdim_b[r++] = -1;
  }
  pl->nres = r;
  for (int k = 0; k < r; k++)
    pl->rshape[k] = pl->rdim_self[k] >= 0 ? self->sizes[pl->rdim_self[k]] : pl->bshape[pl->rdim_b[k]];
  /* CPU checks each index as its element is read or written: an empty
   * result reads and writes nothing, so checks nothing */
  int64_t cells = 1;
  for (int k = 0; k < r; k++) cells *= pl->rshape[k];
  for (int j = 0; cells > 0 && j < pl->nidx; j++)
    TPU_RETURN_IF_ERROR(check_index_range(op, pl->idx[j], self->sizes[pl->idx_dim[j]],
                                          pl->idx_dim[j], true));
  return TPU_OK;
}

/* Walk of the result shape: operand 0 = `indexed` (self for index, out for
 * index_put), operand 1 = `direct` broadcast to the result shape, operands
 * 2.. = the index tensors broadcast over the result's broadcast dims. */
static tpu_status_t adv_walk(const char* op, const adv_plan_t* pl, walk_t* w, index_ctx_t* cx,
                             const tpu_tensor_t* indexed, const tpu_tensor_t* direct) {
  memset(w, 0, sizeof(*w));
  memset(cx, 0, sizeof(*cx));
  w->ndim = pl->nres;
  w->nops = 2 + pl->nidx;
  memcpy(w->sizes, pl->rshape, sizeof(w->sizes));
  int64_t esz = (int64_t)tpu_dtype_size(indexed->dtype);
  int64_t desz = (int64_t)tpu_dtype_size(direct->dtype);
  w->base[0] = indexed->data;
  w->base[1] = direct->data;
  int lead = direct->ndim - pl->nres; /* extra leading dims of direct must be 1 */
  for (int d = 0; d < lead; d++)
    if (direct->sizes[d] != 1) goto mismatch;
  for (int r = 0; r < pl->nres; r++) {
    if (pl->rdim_self[r] >= 0) w->st[0][r] = indexed->strides[pl->rdim_self[r]] * esz;
    int dd = r + lead; /* direct broadcasts from the right */
    if (dd >= 0) {
      if (direct->sizes[dd] == pl->rshape[r]) w->st[1][r] = direct->strides[dd] * desz;
      else if (direct->sizes[dd] != 1) goto mismatch;
    }
    int b = pl->rdim_b[r];
    for (int j = 0; b >= 0 && j < pl->nidx; j++) {
      const tpu_tensor_t* t = pl->idx[j];
      int td = b - (pl->nb - t->ndim);
      if (td >= 0 && t->sizes[td] != 1)
        w->st[2 + j][r] = t->strides[td] * (int64_t)tpu_dtype_size(t->dtype);
    }
  }
  for (int j = 0; j < pl->nidx; j++) {
    w->base[2 + j] = pl->idx[j]->data;
    cx->idx_dt[j] = pl->idx[j]->dtype;
    cx->idx_size[j] = indexed->sizes[pl->idx_dim[j]];
    cx->idx_st[j] = indexed->strides[pl->idx_dim[j]] * esz;
  }
  cx->nidx = pl->nidx;
  cx->dt = indexed->dtype;
  cx->src_dt = direct->dtype;
  cx->esz = (size_t)esz;
  cx->alpha = 1;
  cx->ialpha = 1;
  w->ctx = cx;
  return TPU_OK;
mismatch:;
  char a[200], e[200];
  shape_str(a, sizeof a, direct->ndim, direct->sizes);
  shape_str(e, sizeof e, pl->nres, pl->rshape);
  return TPU_ERR(INVALID_ARGUMENT,
                 "%s: shape mismatch: tensor of shape %s cannot be broadcast to indexing result "
                 "of shape %s",
                 op, a, e);
}

/* index.Tensor(self, indices) (+ out=, hacked_twin) */
tpu_status_t tpu_k_index(const tpu_call_t* c) {
  const char* op = "index()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  adv_plan_t pl;
  TPU_RETURN_IF_ERROR(adv_plan(op, self, &c->args[1], &pl));
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, pl.nres, pl.rshape));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  walk_t w;
  index_ctx_t cx;
  TPU_RETURN_IF_ERROR(adv_walk(op, &pl, &w, &cx, self, out));
  w.visit = gather_visit;
  walk_run(&w);
  return TPU_OK;
}

/* index_put / index_put_ / _index_put_impl_ (self, indices, values,
 * accumulate[, unsafe]). The broadcast dims are walked in order inside one
 * task, so duplicates accumulate (or overwrite) in row-major order. */
tpu_status_t tpu_k_index_put(const tpu_call_t* c) {
  const char* op = "index_put()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* values = tpu_arg_tensor(c, 2);
  const tpu_tensor_t* out = &c->outs[0];
  if (values->dtype != self->dtype)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Index put requires the source and destination dtypes match, got %s for "
                   "the destination and %s for the source.",
                   op, tpu_dtype_name(self->dtype), tpu_dtype_name(values->dtype));
  TPU_RETURN_IF_ERROR(check_out_shape(op, out, self->ndim, self->sizes));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  adv_plan_t pl;
  TPU_RETURN_IF_ERROR(adv_plan(op, self, &c->args[1], &pl));
  walk_t w;
  index_ctx_t cx;
  TPU_RETURN_IF_ERROR(adv_walk(op, &pl, &w, &cx, out, values));
  TPU_RETURN_IF_ERROR(copy_self(out, self));
  cx.red = tpu_arg_bool(c, 3, false) ? RED_ADD : RED_COPY;
  for (int r = 0; r < pl.nres; r++)
    if (pl.rdim_b[r] >= 0) w.serial_dims |= 1ull << r;
  w.visit = scatter_visit;
  walk_run(&w);
  return TPU_OK;
}

/* ---- masked_scatter ---- */
typedef struct {
  const char* src; /* 1-D source */
  int64_t src_st;  /* its byte stride */
  size_t esz;
  int64_t next; /* source elements consumed */
} masked_ctx_t;

static inline bool mask_set(const char* p) { return *(const uint8_t*)p != 0; }

static void mask_count_visit(void* c, char* const* p) {
  if (mask_set(p[1])) ((masked_ctx_t*)c)->next++;
}

static void masked_scatter_visit(void* c, char* const* p) {
  masked_ctx_t* mc = c;
  if (mask_set(p[1])) copy_elem(p[0], mc->src + mc->next++ * mc->src_st, mc->esz);
}

/* masked_scatter(self, mask, source): the masked positions of out, in
 * row-major order, take consecutive elements of source. */
tpu_status_t tpu_k_masked_scatter(const tpu_call_t* c) {
  const char* op = "masked_scatter()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* mask = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* source = tpu_arg_tensor(c, 2);
  const tpu_tensor_t* out = &c->outs[0];
  if (mask->dtype != TPU_BOOL && mask->dtype != TPU_U8)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a bool mask but got %s", op,
                   tpu_dtype_name(mask->dtype));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, source, "source"));
  TPU_RETURN_IF_ERROR(check_same_dtype(op, self, out, "out"));
  walk_t w = {0};
  w.ndim = out->ndim;
  w.nops = 2;
  memcpy(w.sizes, out->sizes, sizeof(w.sizes));
  walk_operand(&w, 0, out);
  w.base[1] = mask->data;
  if (mask->ndim > out->ndim) goto mismatch;
  for (int d = 0; d < out->ndim; d++) {
    int md = d - (out->ndim - mask->ndim);
    if (md < 0) continue;
    if (mask->sizes[md] == out->sizes[d]) w.st[1][d] = mask->strides[md]; /* 1-byte elements */
    else if (mask->sizes[md] != 1) goto mismatch;
  }
  masked_ctx_t mc = {NULL, 0, tpu_dtype_size(out->dtype), 0};
  w.serial = true;
  w.ctx = &mc;
  w.visit = mask_count_visit;
  walk_run(&w);
  int64_t nsrc = tpu_tensor_numel(source);
  if (mc.next > nsrc)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Number of elements of source (%lld) < number of ones in mask (%lld)", op,
                   (long long)nsrc, (long long)mc.next);
  TPU_RETURN_IF_ERROR(copy_self(out, self));
  tpu_tensor_t flat;
  void* scratch;
  TPU_RETURN_IF_ERROR(reshape_view(source, 1, &nsrc, &flat, &scratch));
  mc.src = flat.data;
  mc.src_st = flat.strides[0] * (int64_t)mc.esz;
  mc.next = 0;
  w.visit = masked_scatter_visit;
  walk_run(&w);
  free(scratch);
  return TPU_OK;
mismatch:;
  char a[200], b[200];
  shape_str(a, sizeof a, mask->ndim, mask->sizes);
  shape_str(b, sizeof b, out->ndim, out->sizes);
  return TPU_ERR(INVALID_ARGUMENT, "%s: mask of shape %s cannot be broadcast to shape %s", op, a,
                 b);
}

/* ---- nonzero ---- */
#define NZ_BLOCK 32768 /* elements per block; blocks are fixed, independent of threads */

static inline bool elem_nonzero(const char* p, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F16:
    case TPU_BF16: return (*(const uint16_t*)p & 0x7fffu) != 0; /* -0 is zero, NaN is not */
    case TPU_I16: return *(const int16_t*)p != 0;
    case TPU_F32: return *(const float*)p != 0;
    case TPU_I32: return *(const int32_t*)p != 0;
    case TPU_F64: return *(const double*)p != 0;
    case TPU_I64: return *(const int64_t*)p != 0;
    case TPU_C64: return ((const float*)p)[0] != 0 || ((const float*)p)[1] != 0;
    case TPU_C128: return ((const double*)p)[0] != 0 || ((const double*)p)[1] != 0;
    default: return *(const uint8_t*)p != 0;
  }
}

/* Visits t's elements [begin, end) in row-major order; counts the nonzero
 * ones and, with `out`, writes their coordinates from row `row` on. */
static int64_t nz_block(const tpu_tensor_t* t, int64_t begin, int64_t end, const tpu_tensor_t* out,
                        int64_t row) {
  int nd = t->ndim;
  size_t esz = tpu_dtype_size(t->dtype), oesz = out ? tpu_dtype_size(out->dtype) : 0;
  int64_t coord[TPU_MAX_DIMS], off = 0, rem = begin, n = 0;
  for (int d = nd - 1; d >= 0; d--) {
    coord[d] = rem % t->sizes[d];
    rem /= t->sizes[d];
    off += coord[d] * t->strides[d];
  }
  for (int64_t i = begin; i < end; i++) {
    if (elem_nonzero((const char*)t->data + off * (int64_t)esz, t->dtype)) {
      if (out) {
        char* o = (char*)out->data + (row + n) * out->strides[0] * (int64_t)oesz;
        for (int d = 0; d < nd; d++)
          tpu_store_i64(o + d * out->strides[1] * (int64_t)oesz, out->dtype, coord[d]);
      }
      n++;
    }
    for (int d = nd - 1; d >= 0; d--) {
      off += t->strides[d];
      if (++coord[d] < t->sizes[d]) break;
      off -= t->strides[d] * t->sizes[d];
      coord[d] = 0;
    }
  }
  return n;
}

typedef struct {
  const tpu_tensor_t* t;
  const tpu_tensor_t* out; /* NULL: count pass */
  int64_t numel;
  int64_t* counts; /* per block; the fill pass reads the first row of each block */
} nz_ctx_t;

static void nz_blocks(void* arg, int64_t b0, int64_t b1) {
  nz_ctx_t* cx = arg;
  for (int64_t b = b0; b < b1; b++) {
    int64_t begin = b * NZ_BLOCK, end = begin + NZ_BLOCK < cx->numel ? begin + NZ_BLOCK : cx->numel;
    if (cx->out) nz_block(cx->t, begin, end, cx->out, cx->counts[b]);
    else cx->counts[b] = nz_block(cx->t, begin, end, NULL, 0);
  }
}

/* Counts per block into a new array (caller frees); NULL when out of memory. */
static int64_t* nz_count_blocks(const tpu_tensor_t* t, int64_t numel, int64_t nblocks) {
  int64_t* counts = malloc((size_t)(nblocks > 0 ? nblocks : 1) * sizeof(int64_t));
  if (!counts) return NULL;
  nz_ctx_t cx = {t, NULL, numel, counts};
  tpu_parallel_for(nblocks, 1, nz_blocks, &cx);
  return counts;
}

int64_t tpu_count_nonzero_all(const tpu_tensor_t* t) {
  int64_t numel = tpu_tensor_numel(t), nblocks = (numel + NZ_BLOCK - 1) / NZ_BLOCK;
  int64_t* counts = nz_count_blocks(t, numel, nblocks);
  if (!counts) return nz_block(t, 0, numel, NULL, 0);
  int64_t total = 0;
  for (int64_t b = 0; b < nblocks; b++) total += counts[b];
  free(counts);
  return total;
}

/* nonzero(self): out is preallocated [count, ndim] (count from
 * tpu_count_nonzero_all); coordinates in row-major order. */
tpu_status_t tpu_k_nonzero(const tpu_call_t* c) {
  const char* op = "nonzero()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (out->ndim != 2 || out->sizes[1] != self->ndim || tpu_dtype_is_float(out->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an integer output of shape [n, %d]", op,
                   self->ndim);
  int64_t numel = tpu_tensor_numel(self), nblocks = (numel + NZ_BLOCK - 1) / NZ_BLOCK;
  int64_t* counts = nz_count_blocks(self, numel, nblocks);
  if (!counts) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op);
  int64_t total = 0;
  for (int64_t b = 0; b < nblocks; b++) { /* counts -> first output row of each block */
    int64_t n = counts[b];
    counts[b] = total;
    total += n;
  }
  if (total != out->sizes[0]) {
    free(counts);
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: output has %lld rows but the input has %lld nonzero elements", op,
                   (long long)out->sizes[0], (long long)total);
  }
  nz_ctx_t cx = {self, out, numel, counts};
  tpu_parallel_for(nblocks, 1, nz_blocks, &cx);
  free(counts);
  return TPU_OK;
}

/* ---- truth values of complex operands ---- */
#define TRUTH_MAX_ARGS 16

static void truth_visit(void* c, char* const* p) {
  *(uint8_t*)p[0] = elem_nonzero(p[1], *(const tpu_dtype_t*)c);
}

/* A new contiguous bool tensor of t's shape in *out, holding t's truth values
 * when `fill`; *buf receives the memory (caller frees). */
static tpu_status_t truth_tensor(const char* op, const tpu_tensor_t* t, bool fill, tpu_tensor_t* out,
                                 void** buf) {
  int64_t n = tpu_tensor_numel(t);
  *buf = malloc((size_t)(n > 0 ? n : 1));
  if (!*buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for %lld truth values", op,
                            (long long)n);
  tpu_tensor_make_contig(out, *buf, TPU_BOOL, t->ndim, t->sizes);
  out->flags = t->flags & TPU_TENSOR_WRAPPED_NUMBER;
  if (!fill) return TPU_OK;
  walk_t w = {0};
  w.ndim = t->ndim;
  w.nops = 2;
  memcpy(w.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  walk_operand(&w, 0, out);
  walk_operand(&w, 1, t);
  tpu_dtype_t dt = t->dtype;
  w.ctx = &dt;
  w.visit = truth_visit;
  walk_run(&w);
  return TPU_OK;
}

tpu_status_t tpu_complex_on_truth(const tpu_call_t* c) {
  const char* op = c->op ? c->op->name : "complex op";
  if (c->nargs > TRUTH_MAX_ARGS || c->nouts > TRUTH_MAX_ARGS)
    return TPU_ERR(INTERNAL, "%s: too many arguments for a complex truth-value call", op);
  tpu_arg_t args[TRUTH_MAX_ARGS];
  tpu_tensor_t ins[TRUTH_MAX_ARGS], outs[TRUTH_MAX_ARGS];
  void* bufs[2 * TRUTH_MAX_ARGS];
  int nbufs = 0;
  memcpy(args, c->args, sizeof(tpu_arg_t) * (size_t)c->nargs);
  memcpy(outs, c->outs, sizeof(tpu_tensor_t) * (size_t)c->nouts);
  tpu_status_t st = TPU_OK;
  for (int i = 0; i < c->nargs && !st; i++) {
    if (args[i].kind == TPU_ARG_COMPLEX) {
      bool b = args[i].v.c[0] != 0 || args[i].v.c[1] != 0;
      args[i].kind = TPU_ARG_BOOL;
      args[i].v.b = b;
    } else if (args[i].kind == TPU_ARG_TENSOR && tpu_dtype_is_complex(args[i].v.t->dtype)) {
      st = truth_tensor(op, args[i].v.t, true, &ins[i], &bufs[nbufs]);
      if (!st) nbufs++;
      args[i].v.t = &ins[i];
    }
  }
  for (int o = 0; o < c->nouts && !st; o++) {
    if (!tpu_dtype_is_complex(outs[o].dtype)) continue;
    st = truth_tensor(op, &c->outs[o], false, &outs[o], &bufs[nbufs]);
    if (!st) nbufs++;
  }
  if (!st) {
    tpu_call_t c2 = *c;
    c2.args = args;
    c2.outs = outs;
    st = c->op->fn(&c2);
  }
  for (int o = 0; o < c->nouts && !st; o++)
    if (tpu_dtype_is_complex(c->outs[o].dtype)) st = tpu_copy_strided(&c->outs[o], &outs[o]);
  for (int k = 0; k < nbufs; k++) free(bufs[k]);
  return st;
}
