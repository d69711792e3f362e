/* Shape kernels: cat, flip, roll, triu/tril, arange/linspace/logspace and
 * repeat_interleave. Copies between views go through tpu_copy_strided, which
 * converts dtypes, follows any strides (negative ones included) and splits
 * large copies between threads. */
#include <stdlib.h>

#include "index.h"
#include "kernels.h"

#define ROW_GRAIN 16384 /* elements per parallel task at least */

/* The part [start, start + len) of t along dim. */
static tpu_tensor_t narrow(const tpu_tensor_t* t, int dim, int64_t start, int64_t len) {
  tpu_tensor_t v = *t;
  v.data = (char*)t->data + start * t->strides[dim] * (int64_t)tpu_dtype_size(t->dtype);
  v.sizes[dim] = len;
  return v;
}

/* ---- cat ---- */

/* cat(tensors, dim) (+ out=): inputs are converted to out's dtype; 1-D empty
 * tensors are skipped like PyTorch's legacy behaviour. */
tpu_status_t tpu_k_cat(const tpu_call_t* c) {
  const char* op = "cat()";
  const tpu_arg_t* list = &c->args[0];
  const tpu_tensor_t* out = &c->outs[0];
  if (list->kind != TPU_ARG_TENSORLIST)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a list of tensors", op);
  const tpu_tensor_t* ts = list->v.tlist;
  const tpu_tensor_t* ref = NULL; /* the first input that is not skipped */
  int ref_pos = 0;
  for (int i = 0; i < list->n; i++) {
    if (ts[i].ndim == 0)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: zero-dimensional tensor (at position %d) cannot be concatenated", op, i);
    if (!ref && !(ts[i].ndim == 1 && ts[i].sizes[0] == 0)) {
      ref = &ts[i];
      ref_pos = i;
    }
  }
  if (!ref) return TPU_OK; /* only skipped inputs: the output is empty */
  int nd = ref->ndim, dim;
  TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, tpu_arg_i64(c, 1, 0), nd, &dim));
  if (out->ndim != nd)
    return TPU_ERR(INVALID_ARGUMENT, "%s: output has %d dims but the inputs have %d", op, out->ndim,
                   nd);
  int64_t total = 0;
  for (int i = ref_pos; i < list->n; i++) {
    const tpu_tensor_t* t = &ts[i];
    if (t->ndim == 1 && t->sizes[0] == 0) continue;
    if (t->ndim != nd)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: Tensors must have same number of dimensions: got %d and %d", op, nd,
                     t->ndim);
    for (int d = 0; d < nd; d++)
      if (d != dim && t->sizes[d] != out->sizes[d])
        return TPU_ERR(INVALID_ARGUMENT,
                       "%s: Sizes of tensors must match except in dimension %d. Expected size "
                       "%lld but got size %lld for tensor number %d in the list.",
                       op, dim, (long long)out->sizes[d], (long long)t->sizes[d], i);
    total += t->sizes[dim];
  }
  if (total != out->sizes[dim])
    return TPU_ERR(INVALID_ARGUMENT, "%s: output has size %lld in dimension %d, inputs sum to %lld",
                   op, (long long)out->sizes[dim], dim, (long long)total);
  int64_t at = 0;
  for (int i = ref_pos; i < list->n; i++) {
    const tpu_tensor_t* t = &ts[i];
    if (t->ndim == 1 && t->sizes[0] == 0) continue;
    tpu_tensor_t part = narrow(out, dim, at, t->sizes[dim]);
    TPU_RETURN_IF_ERROR(tpu_copy_strided(&part, t));
    at += t->sizes[dim];
  }
  return TPU_OK;
}

/* ---- flip / roll ---- */

static tpu_status_t check_same_shape(const char* op, const tpu_tensor_t* out,
                                     const tpu_tensor_t* self) {
  bool ok = out->ndim == self->ndim && out->dtype == self->dtype;
  for (int d = 0; ok && d < out->ndim; d++) ok = out->sizes[d] == self->sizes[d];
  if (ok) return TPU_OK;
  return TPU_ERR(INVALID_ARGUMENT, "%s: output must have the input's shape and dtype (%s)", op,
                 tpu_dtype_name(self->dtype));
}

/* flip(self, dims): copies a view of self that walks the flipped dims
 * backwards. */
tpu_status_t tpu_k_flip(const tpu_call_t* c) {
  const char* op = "flip()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_same_shape(op, out, self));
  const tpu_arg_t* dims = &c->args[1];
  tpu_tensor_t view = *self;
  bool seen[TPU_MAX_DIMS] = {false};
  int64_t esz = (int64_t)tpu_dtype_size(self->dtype);
  for (int i = 0; i < dims->n; i++) {
    int d;
    TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, dims->v.ilist[i], self->ndim, &d));
    if (seen[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s: dim %d appears multiple times in the list of dims", op,
                     d);
    seen[d] = true;
    if (self->ndim == 0 || self->sizes[d] == 0) continue;
    view.data = (char*)view.data + (self->sizes[d] - 1) * self->strides[d] * esz;
    view.strides[d] = -self->strides[d];
  }
  return tpu_copy_strided(out, &view);
}

/* Rolls along the dims whose shift[d] is nonzero: every combination of the
 * two pieces of each rolled dim is one strided copy. */
static tpu_status_t roll_pieces(const tpu_tensor_t* out, const tpu_tensor_t* self,
                                const int64_t* shift, int d) {
  while (d < self->ndim && shift[d] == 0) d++;
  if (d == self->ndim) return tpu_copy_strided(out, self);
  int64_t n = self->sizes[d], s = shift[d];
  /* out[s:] = self[:n-s], out[:s] = self[n-s:] */
  tpu_tensor_t o1 = narrow(out, d, s, n - s), i1 = narrow(self, d, 0, n - s);
  TPU_RETURN_IF_ERROR(roll_pieces(&o1, &i1, shift, d + 1));
  tpu_tensor_t o2 = narrow(out, d, 0, s), i2 = narrow(self, d, n - s, s);
  return roll_pieces(&o2, &i2, shift, d + 1);
}

static int64_t mod_pos(int64_t a, int64_t n) {
  int64_t r = a % n;
  return r < 0 ? r + n : r;
}

/* roll of the row-major flattening (no dims): a 1-D roll of contiguous
 * copies of self and out. */
static tpu_status_t roll_flat(const tpu_tensor_t* out, const tpu_tensor_t* self, int64_t shift) {
  int64_t n = tpu_tensor_numel(self);
  size_t bytes = (size_t)n * tpu_dtype_size(self->dtype);
  bool self_ok = tpu_tensor_is_contiguous(self), out_ok = tpu_tensor_is_contiguous(out);
  char* scratch = malloc((self_ok ? 0 : bytes) + (out_ok ? 0 : bytes) + 1);
  if (!scratch) return TPU_ERR(RESOURCE_EXHAUSTED, "roll(): out of host memory (%zu bytes)", bytes);
  tpu_tensor_t src, dst;
  tpu_tensor_make_contig(&src, self_ok ? self->data : scratch, self->dtype, 1, &n);
  tpu_tensor_make_contig(&dst, out_ok ? out->data : scratch + (self_ok ? 0 : bytes), out->dtype, 1,
                         &n);
  tpu_status_t st = TPU_OK;
  if (!self_ok) {
    tpu_tensor_t shaped;
    tpu_tensor_make_contig(&shaped, scratch, self->dtype, self->ndim, self->sizes);
    st = tpu_copy_strided(&shaped, self);
  }
  int64_t s = mod_pos(shift, n);
  if (!st) st = roll_pieces(&dst, &src, &s, 0);
  if (!st && !out_ok) {
    tpu_tensor_t shaped;
    tpu_tensor_make_contig(&shaped, dst.data, out->dtype, out->ndim, out->sizes);
    st = tpu_copy_strided(out, &shaped);
  }
  free(scratch);
  return st;
}

/* roll(self, shifts, dims): repeated dims add their shifts. */
tpu_status_t tpu_k_roll(const tpu_call_t* c) {
  const char* op = "roll()";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_same_shape(op, out, self));
  const tpu_arg_t* shifts = &c->args[1];
  const tpu_arg_t* dims = &c->args[2];
  int ndims = tpu_arg_is_none(c, 2) ? 0 : dims->n;
  if (tpu_tensor_numel(self) == 0) return TPU_OK;
  if (ndims == 0) {
    if (shifts->n != 1)
      return TPU_ERR(INVALID_ARGUMENT, "%s: shifts must have one entry when dims is empty", op);
    return roll_flat(out, self, shifts->v.ilist[0]);
  }
  if (shifts->n != ndims)
    return TPU_ERR(INVALID_ARGUMENT, "%s: shifts and dimensions must align. shifts: %d, dims: %d",
                   op, shifts->n, ndims);
  int64_t shift[TPU_MAX_DIMS] = {0};
  for (int i = 0; i < ndims; i++) {
    int d;
    TPU_RETURN_IF_ERROR(tpu_index_wrap_dim(op, dims->v.ilist[i], self->ndim, &d));
    if (self->ndim == 0) continue;
    shift[d] = mod_pos(shift[d] + mod_pos(shifts->v.ilist[i], self->sizes[d]), self->sizes[d]);
  }
  return roll_pieces(out, self, shift, 0);
}

/* ---- triu / tril ---- */
typedef struct {
  const tpu_tensor_t *self, *out;
  int64_t diagonal;
  bool upper, in_place;
} tri_ctx_t;

/* Rows [r0, r1) of the flattened batch x rows: kept elements are copied
 * (unless in place), the others zeroed (all-zero bytes in every dtype). */
static void tri_rows(void* arg, int64_t r0, int64_t r1) {
  const tri_ctx_t* cx = arg;
  const tpu_tensor_t *self = cx->self, *out = cx->out;
  int nd = self->ndim;
  int64_t rows = self->sizes[nd - 2], cols = self->sizes[nd - 1];
  size_t esz = tpu_dtype_size(self->dtype);
  for (int64_t r = r0; r < r1; r++) {
    int64_t rem = r, soff = 0, ooff = 0;
    for (int d = nd - 2; d >= 0; d--) {
      int64_t i = rem % self->sizes[d];
      rem /= self->sizes[d];
      soff += i * self->strides[d];
      ooff += i * out->strides[d];
    }
    int64_t i = r % rows;
    /* kept columns: [i + diagonal, cols) for triu, [0, i + diagonal] for tril */
    int64_t lo = cx->upper ? i + cx->diagonal : 0;
    int64_t hi = cx->upper ? cols : i + cx->diagonal + 1;
    if (lo < 0) lo = 0;
    if (hi > cols) hi = cols;
    for (int64_t j = 0; j < cols; j++) {
      char* o = (char*)out->data + (ooff + j * out->strides[nd - 1]) * (int64_t)esz;
      if (j >= lo && j < hi) {
        if (!cx->in_place)
          memcpy(o, (const char*)self->data + (soff + j * self->strides[nd - 1]) * (int64_t)esz, esz);
      } else {
        memset(o, 0, esz);
      }
    }
  }
}

static tpu_status_t triangle(const char* op, const tpu_call_t* c, bool upper) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (self->ndim < 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: input tensor must have at least 2 dimensions", op);
  TPU_RETURN_IF_ERROR(check_same_shape(op, out, self));
  tri_ctx_t cx = {self, out, tpu_arg_i64(c, 1, 0), upper, out->data == self->data};
  for (int d = 0; cx.in_place && d < self->ndim; d++)
    cx.in_place = out->strides[d] == self->strides[d];
  int64_t cols = self->sizes[self->ndim - 1];
  if (cols == 0) return TPU_OK;
  int64_t nrows = tpu_tensor_numel(self) / cols;
  tpu_parallel_for(nrows, ROW_GRAIN / cols > 0 ? ROW_GRAIN / cols : 1, tri_rows, &cx);
  return TPU_OK;
}

tpu_status_t tpu_k_triu(const tpu_call_t* c) { return triangle("triu()", c, true); }
tpu_status_t tpu_k_tril(const tpu_call_t* c) { return triangle("tril()", c, false); }

/* ---- arange / linspace / logspace ---- */
typedef enum { SEQ_ARANGE, SEQ_LINSPACE, SEQ_LOGSPACE } seq_kind_t;

/* out[i] computed like PyTorch's CPU kernels: arange as start + step * i in
 * double (float for f16/bf16, int64 for integers); linspace from the nearer
 * end (start + step * i for the first half, end - step * (steps - 1 - i)
 * for the rest) in the output's float type, rounding every f16/bf16
 * intermediate to that type, or in double for integer outputs; logspace
 * raises base to such a value computed in double (from start, end and
 * end - start in the output's precision). */
typedef struct {
  seq_kind_t kind;
  const tpu_tensor_t* out;
  double start, end, step, base;
  int64_t steps;
  bool single;           /* compute in float (rounded to out's dtype for linspace) */
  int64_t istart, istep; /* arange into integers */
} seq_t;

/* v rounded to dt's precision (f16/bf16), as float arithmetic in dt does */
static float round_to(tpu_dtype_t dt, float v) {
  if (dt == TPU_BF16) return tpu_bf16_to_f32(tpu_f32_to_bf16(v));
  if (dt == TPU_F16) return tpu_f16_to_f32(tpu_f32_to_f16(v));
  return v;
}

static double seq_value(const seq_t* s, int64_t i) {
  double v;
  if (s->kind == SEQ_ARANGE) {
    if (s->single) return (float)s->start + (float)s->step * (float)i;
    return s->start + s->step * (double)i;
  }
  int64_t half = s->steps / 2;
  if (s->single) {
    tpu_dtype_t dt = s->out->dtype;
#define R(x) round_to(dt, (x))
    float step = (float)s->step;
    v = i < half ? R((float)s->start + R(step * R((float)i)))
                 : R((float)s->end - R(step * R((float)(s->steps - i - 1))));
#undef R
  } else {
    v = i < half ? s->start + s->step * (double)i : s->end - s->step * (double)(s->steps - i - 1);
  }
  return s->kind == SEQ_LOGSPACE ? pow(s->base, v) : v;
}

static void seq_fill(void* arg, int64_t b, int64_t e) {
  const seq_t* s = arg;
  const tpu_tensor_t* out = s->out;
  int64_t st = out->ndim == 1 ? out->strides[0] * (int64_t)tpu_dtype_size(out->dtype) : 0;
  bool int_arange = s->kind == SEQ_ARANGE && !tpu_dtype_is_float(out->dtype);
  for (int64_t i = b; i < e; i++) {
    char* p = out->ndim == 1 ? (char*)out->data + i * st : tpu_tensor_elem_ptr(out, i);
    if (int_arange)
      tpu_store_i64(p, out->dtype, (int64_t)((uint64_t)s->istart + (uint64_t)s->istep * (uint64_t)i));
    else tpu_store_f64(p, out->dtype, seq_value(s, i));
  }
}

/* As CPU's kernels, an out= of the right element count keeps its shape
 * (ATen resizes it to 1-D only when the count differs) and is filled in
 * row-major logical order, also through a non-contiguous view. */
static tpu_status_t seq_run(const char* op, seq_t* s, int64_t n) {
  const tpu_tensor_t* out = s->out;
  if (n < 0 || tpu_tensor_numel(out) != n)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an output of %lld elements", op, (long long)n);
  tpu_parallel_for(n, ROW_GRAIN, seq_fill, s);
  return TPU_OK;
}

/* arange.start_out(start, end, step, out), arange.out(end, out) and
 * range.out(start, end, step, out), the inclusive range: ATen's meta kernels
 * gave out the range's length; the values are start + step * i in CPU's
 * accumulation types. (The overloads without a step, arange.out and
 * range.out_, are left to ATen, which passes them on with step 1: the Python
 * meta kernels of those resize a shaped out= that CPU keeps.) */
tpu_status_t tpu_k_arange(const tpu_call_t* c) {
  const char* op = "arange()";
  bool end_only = c->nargs > 1 && c->args[1].kind == TPU_ARG_TENSOR;
  seq_t s = {SEQ_ARANGE, &c->outs[0], 0, 0, 1, 0, 0, false, 0, 1};
  if (!end_only) { /* integer outputs use integer start/step */
    s.start = tpu_arg_f64(c, 0, 0);
    s.step = tpu_arg_f64(c, 2, 1);
    s.istart = tpu_arg_i64(c, 0, 0);
    s.istep = tpu_arg_i64(c, 2, 1);
  }
  bool is_float = tpu_dtype_is_float(s.out->dtype);
  if (is_float ? s.step == 0 : s.istep == 0)
    return TPU_ERR(INVALID_ARGUMENT, "%s: step must be nonzero", op);
  s.single = s.out->dtype == TPU_F16 || s.out->dtype == TPU_BF16;
  return seq_run(op, &s, tpu_tensor_numel(s.out));
}

/* linspace/logspace (start, end, steps[, base]) in every overload: start and
 * end may be numbers or 0-d tensors. */
static tpu_status_t spaced(const char* op, const tpu_call_t* c, seq_kind_t kind) {
  TPU_ROUTE_COMPLEX(c);
  double base = kind == SEQ_LOGSPACE ? tpu_arg_f64(c, 3, 10.0) : 0; /* linspace.out: arg 3 is out */
  seq_t s = {kind, &c->outs[0], tpu_arg_f64(c, 0, 0), tpu_arg_f64(c, 1, 0), 0, base,
             tpu_arg_i64(c, 2, 0), false, 0, 0};
  if (s.steps < 0) return TPU_ERR(INVALID_ARGUMENT, "%s: number of steps must be non-negative", op);
  tpu_dtype_t dt = s.out->dtype;
  if (!tpu_dtype_is_float(dt)) { /* integer outputs start from integer ends, step in double */
    s.start = (double)tpu_arg_i64(c, 0, 0);
    s.end = (double)tpu_arg_i64(c, 1, 0);
  }
  bool reduced = tpu_dtype_is_float(dt) && dt != TPU_F64;
  if (reduced) { /* start, end and their difference in out's precision */
    s.start = round_to(dt, (float)s.start);
    s.end = round_to(dt, (float)s.end);
  }
  double range = reduced ? round_to(dt, (float)s.end - (float)s.start) : s.end - s.start;
  s.single = reduced && kind == SEQ_LINSPACE;
  if (s.steps == 1) s.end = s.start; /* one point: start (step 0) */
  else if (s.single) s.step = round_to(dt, (float)range / (float)(s.steps - 1));
  else s.step = range / (double)(s.steps - 1);
  return seq_run(op, &s, s.steps);
}

tpu_status_t tpu_k_linspace(const tpu_call_t* c) { return spaced("linspace()", c, SEQ_LINSPACE); }
tpu_status_t tpu_k_logspace(const tpu_call_t* c) { return spaced("logspace()", c, SEQ_LOGSPACE); }

/* ---- repeat_interleave ---- */

/* repeat_interleave.Tensor(repeats, output_size): i repeated repeats[i]
 * times, for a 1-D (or 0-d) repeats tensor. */
tpu_status_t tpu_k_repeat_interleave(const tpu_call_t* c) {
  const char* op = "repeat_interleave()";
  const tpu_tensor_t* rep = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (rep->ndim > 1 || (rep->dtype != TPU_I64 && rep->dtype != TPU_I32))
    return TPU_ERR(INVALID_ARGUMENT, "%s: repeats must be a 1-D int32 or int64 tensor", op);
  int64_t n = tpu_tensor_numel(rep), total = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = tpu_tensor_get_i64(rep, i);
    if (r < 0) return TPU_ERR(INVALID_ARGUMENT, "%s: repeats can not be negative", op);
    total += r;
  }
  if (out->ndim != 1 || out->sizes[0] != total)
    return TPU_ERR(INVALID_ARGUMENT, "%s: output must be 1-D with %lld elements (the sum of repeats)",
                   op, (long long)total);
  int64_t st = out->strides[0] * (int64_t)tpu_dtype_size(out->dtype), k = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t r = tpu_tensor_get_i64(rep, i); r > 0; r--, k++)
      tpu_store_i64((char*)out->data + k * st, out->dtype, i);
  return TPU_OK;
}
