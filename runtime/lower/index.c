/* Indexing lowerings: gather, index.Tensor, scatter/scatter_add, index_select,
 * sort/topk (a sort that carries the indices), nonzero, and max_unpool / max
 * pooling's backward (scatters into zero planes).
 *
 * Each function lowers the ATen ops its table names; it returns false to leave
 * the call to the custom_call fallback (runtime/lower/stablehlo.c). The bodies
 * read n, base and outs and the locals LOWER_LOCALS declares (lower/emit.h). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"

static bool lower_gather(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "gather") && is_tensor(n, 2) && c->args[0].v.t->ndim > 0) {
    /* (self, dim, index, sparse_grad): out[..i..] = self[..index[..i..]..] along dim */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int nd = x->ndim, dim = norm_dim(tpu_arg_i64(c, 1, 0), nd);
    ref_t idx = convert(e, arg(n, 2), TPU_I64);
    check_range(e, idx, 0, x->sizes[dim], dim, false);
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
  return false;
}

static bool lower_sort(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "sort") || !strcmp(base, "topk")) && c->nouts == 2 && is_tensor(n, 0) &&
      odt != TPU_F4E2M1FNX2) { /* integers compare signed or unsigned as their dtype */
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
  return false;
}

/* Advanced indexing of x by the index tensors of list il (None elsewhere):
 * they broadcast to B (nb dims) and the indexed result is x's other dims with
 * B inserted where the indexed dims were when those are adjacent, else first
 * (PyTorch's rule), of rank rnd and sizes rsz. The coordinates are B + [k]
 * (negative indices wrapped), one per indexed dim in x's order. False for index
 * lists this does not express (boolean masks). */
typedef struct {
  int k, nb, bpos;            /* indexed dims, B's rank, B's first dim in the result */
  int64_t dims[TPU_MAX_DIMS]; /* x's indexed dims, ascending */
  ref_t coords;
} index_coords_t;

/* x's indexed dims (il's tensors, not None) into ic->dims and ic->k, and where B
 * goes in the result (ic->bpos); false for none, or a dtype that is no index */
static bool index_dims(const tpu_tensor_t* x, const tpu_arg_t* il, index_coords_t* ic) {
  ic->k = 0;
  for (int i = 0; i < il->n; i++) {
    if (il->v.tlist[i].dtype == TPU_DTYPE_NONE) continue;
    if (il->v.tlist[i].dtype != TPU_I64 && il->v.tlist[i].dtype != TPU_I32) return false;
    ic->dims[ic->k++] = i;
  }
  if (ic->k == 0 || ic->dims[ic->k - 1] >= x->ndim) return false;
  ic->bpos = ic->dims[ic->k - 1] - ic->dims[0] == ic->k - 1 ? (int)ic->dims[0] : 0;
  return true;
}

/* the m-th of x's dims that are not indexed: its dim in the indexed result */
static int kept_dim_pos(const index_coords_t* ic, int m) { return m < ic->bpos ? m : m + ic->nb; }

static bool index_coords(node_t* n, const tpu_tensor_t* x, const tpu_arg_t* il, int rnd, const int64_t* rsz,
                         index_coords_t* ic) {
  em_t* e = n->e;
  if (!index_dims(x, il, ic)) return false;
  const int k = ic->k;
  const int nb = rnd - (x->ndim - k); /* dims of B */
  if (nb < 0 || nb > TPU_MAX_DIMS - 1) return false;
  int64_t bsz[TPU_MAX_DIMS + 1];
  memcpy(bsz, rsz + ic->bpos, sizeof(int64_t) * (size_t)nb);
  bsz[nb] = 1;
  ref_t parts[TPU_MAX_DIMS];
  for (int j = 0; j < k; j++) {
    const int d = (int)ic->dims[j];
    ref_t ix = convert(e, read_tensor(e, &il->v.tlist[d]), TPU_I64);
    check_range(e, ix, -x->sizes[d], x->sizes[d], d, true);
    ix = bcast(e, ix, nb, bsz);
    const double len = (double)x->sizes[d];
    ref_t neg = compare(e, "LT", ix, cst_like(e, TPU_I64, 0, ix.nd, ix.sz));
    ix = select3(e, neg, scalar_op(e, "stablehlo.add", ix, len), ix);
    parts[j] = reshape(e, ix, nb + 1, bsz);
  }
  int64_t csz[TPU_MAX_DIMS + 1];
  memcpy(csz, bsz, sizeof(int64_t) * (size_t)nb);
  csz[nb] = k;
  ic->coords = k == 1 ? parts[0]
                      : emit(e, "stablehlo.concatenate", k, parts, mkref(TPU_I64, nb + 1, csz), "dimension = %d : i64", nb);
  ic->nb = nb;
  return true;
}

/* kthvalue(self, k, dim, keepdim), median(self[, dim, keepdim]),
 * nanmedian(self[, dim, keepdim]): the element at one position of each
 * sorted row (NaN sorts last) and its index. median gives a row with NaN
 * its first NaN; nanmedian takes the lower median of the non-NaN values.
 * Without dim the input is one flat row and only the value is returned. */
static bool lower_select_k(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !(tpu_dtype_is_float(odt) || odt == TPU_I64 || odt == TPU_I32)) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  const bool kth = base[0] == 'k', nan_aware = base[0] == 'n', with_dim = c->nouts == 2;
  ref_t x = arg(n, 0);
  int dim = 0;
  if (!with_dim || t->ndim == 0) {
    const int64_t total = numel(&x);
    if (total == 0) return false;
    x = reshape(e, x, 1, &total);
  } else {
    dim = norm_dim(tpu_arg_i64(c, kth ? 2 : 1, -1), t->ndim);
  }
  const int64_t len = x.sz[dim];
  ref_t s[2];
  sort_with_indices(e, x, dim, false, s);
  int64_t rd[1] = {dim};
  ref_t pos; /* the position per row, i64, x's shape without dim */
  ref_t rzero = reduce(e, cst_like(e, TPU_I64, 0, x.nd, x.sz), 1, rd, "stablehlo.add", 0);
  if (kth) {
    pos = cst_like(e, TPU_I64, (double)(tpu_arg_i64(c, 1, 1) - 1), rzero.nd, rzero.sz);
  } else {
    ref_t nans = tpu_dtype_is_float(x.dt) ? convert(e, compare(e, "NE", x, x), TPU_I64)
                                          : cst_like(e, TPU_I64, 0, x.nd, x.sz);
    ref_t cnt = reduce(e, nans, 1, rd, "stablehlo.add", 0);
    ref_t lenr = cst_like(e, TPU_I64, (double)len, rzero.nd, rzero.sz);
    ref_t valid = binop(e, "stablehlo.subtract", lenr, cnt);
    if (nan_aware) { /* lower median of the valid values (all NaN: the first) */
      ref_t one = cst_like(e, TPU_I64, 1, rzero.nd, rzero.sz);
      pos = scalar_op(e, "stablehlo.divide", binop(e, "stablehlo.subtract",
                                                   binop(e, "stablehlo.maximum", valid, one), one), 2);
    } else { /* a NaN wins: the first NaN of the row sits at len - count */
      ref_t mid = cst_like(e, TPU_I64, (double)((len - 1) / 2), rzero.nd, rzero.sz);
      pos = select3(e, compare(e, "GT", cnt, rzero), valid, mid);
    }
  }
  /* pick position pos of each sorted row: one hit per row, summed */
  ref_t at = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, x.nd, x.sz), "iota_dimension = %d : i64", dim);
  int64_t keep[TPU_MAX_DIMS];
  int nk = 0;
  for (int d = 0; d < x.nd; d++)
    if (d != dim) keep[nk++] = d;
  ref_t hit = compare(e, "EQ", at, bcast_dims(e, pos, x.nd, x.sz, keep));
  ref_t v = reduce(e, select3(e, hit, s[0], cst_like(e, x.dt, 0, x.nd, x.sz)), 1, rd, "stablehlo.add", 0);
  outs[0] = v;
  if (with_dim)
    outs[1] = convert(e, reduce(e, select3(e, hit, s[1], cst_like(e, TPU_I64, 0, x.nd, x.sz)), 1, rd,
                                "stablehlo.add", 0), c->outs[1].dtype);
  return true;
}

static bool lower_index(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "index") && !strcmp(ovl, "Tensor") && is_tensor(n, 0) &&
      c->args[1].kind == TPU_ARG_TENSORLIST) {
    /* (self, indices): a gather of the coordinates */
    const tpu_tensor_t* x = c->args[0].v.t;
    index_coords_t ic;
    if (!index_coords(n, x, &c->args[1], o->ndim, o->sizes, &ic)) return false;
    const int k = ic.k, nb = ic.nb;
    int64_t offs[TPU_MAX_DIMS], ssz[TPU_MAX_DIMS];
    int no = 0;
    for (int d = 0, j = 0; d < x->ndim; d++) {
      const bool indexed = j < k && ic.dims[j] == d;
      j += indexed;
      ssz[d] = indexed ? 1 : x->sizes[d];
      if (!indexed) offs[no] = kept_dim_pos(&ic, no), no++;
    }
    ref_t in[2] = {arg(n, 0), ic.coords};
    char b1[256], b2[256], b3[256], b4[256];
    outs[0] = emit(e, "stablehlo.gather", 2, in, out_ref(n, x->dtype),
                   "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%s], "
                   "start_index_map = [%s], index_vector_dim = %d>, slice_sizes = %s, indices_are_sorted = false",
                   ints(b1, sizeof b1, no, offs), ints(b2, sizeof b2, k, ic.dims), ints(b3, sizeof b3, k, ic.dims), nb,
                   i64arr(b4, sizeof b4, x->ndim, ssz));
    return true;
  }
  return false;
}

/* stablehlo.scatter of upd into operand at idx (dimension numbers dn),
 * combining with `combine` (a binary op; NULL: replacing) */
static ref_t scatter(em_t* e, ref_t operand, ref_t idx, ref_t upd, const char* combine, const char* dn) {
  ref_t acc = block_arg(e, operand.dt), nw = block_arg(e, operand.dt);
  ref_t in[3] = {operand, idx, upd};
  ref_t res = operand;
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
  ref_t v = combine ? binop(e, combine, acc, nw) : nw;
  fputs("      \"stablehlo.return\"(", f);
  pname(f, &v);
  fputs(") : (", f);
  ptype(f, &v);
  fprintf(f, ") -> ()\n    }) {scatter_dimension_numbers = #stablehlo.scatter<%s>, "
             "indices_are_sorted = false, unique_indices = false} : (", dn);
  plist(f, 3, in, true);
  fputs(") -> ", f);
  ptype(f, &res);
  fputc('\n', f);
  return res;
}

/* x with upd reduced into it at idx (dimension numbers dn) by `how` (sum or
 * add, prod or multiply, mean, amax, amin), as scatter_reduce and
 * index_reduce do: without include_self the positions an update reaches
 * start from the updates alone; a mean divides by the number of values
 * (integers: floor division). False for an unknown reduction. */
static bool reduce_into(em_t* e, ref_t x, ref_t idx, ref_t upd, const char* how, bool include_self, const char* dn,
                        ref_t* out) {
  enum { SUM, PROD, MAX, MIN } kind;
  if (!strcmp(how, "sum") || !strcmp(how, "add") || !strcmp(how, "mean")) kind = SUM;
  else if (!strcmp(how, "prod") || !strcmp(how, "multiply")) kind = PROD;
  else if (!strcmp(how, "amax")) kind = MAX;
  else if (!strcmp(how, "amin")) kind = MIN;
  else return false;
  static const char* const k_op[] = {"stablehlo.add", "stablehlo.multiply", "stablehlo.maximum", "stablehlo.minimum"};
  const bool mean = !strcmp(how, "mean");
  const tpu_dtype_t dt = x.dt;
#define K(v) cst_like(e, dt, (v), x.nd, x.sz)
  ref_t start = x, reached = x;
  if (!include_self || mean) /* how many updates reach each position */
    reached = scatter(e, K(0), idx, cst_like(e, dt, 1, upd.nd, upd.sz), "stablehlo.add", dn);
  if (!include_self) { /* sum and product start from their identity, max and min from an update */
    ref_t first = kind == SUM ? K(0) : kind == PROD ? K(1) : scatter(e, x, idx, upd, NULL, dn);
    start = select3(e, compare(e, "NE", reached, K(0)), first, x);
  }
  ref_t r = scatter(e, start, idx, upd, k_op[kind], dn);
  if (mean) {
    ref_t cnt = include_self ? binop(e, "stablehlo.add", reached, K(1)) : binop(e, "stablehlo.maximum", reached, K(1));
    ref_t q = binop(e, "stablehlo.divide", r, cnt);
    if (!tpu_dtype_is_float(dt)) { /* floor division by a positive count */
      ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", binop(e, "stablehlo.remainder", r, cnt), K(0)),
                        compare(e, "LT", r, K(0)));
      q = select3(e, fix, binop(e, "stablehlo.subtract", q, K(1)), q);
    }
    r = q;
  }
#undef K
  *out = r;
  return true;
}

static bool lower_scatter(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool reduce_two = !strcmp(base, "scatter_reduce") && !strcmp(ovl, "two");
  const char* reduce = reduce_two ? tpu_arg_str(c, 4, NULL)
                       : !strcmp(base, "scatter") && c->nargs > 4 ? tpu_arg_str(c, 4, NULL) : NULL;
  if ((!strcmp(base, "scatter") || !strcmp(base, "scatter_add") || reduce_two) && is_tensor(n, 0) &&
      is_tensor(n, 2) && c->args[0].v.t->ndim > 0 &&
      (c->nargs < 5 || c->args[4].kind == TPU_ARG_NONE || reduce)) {
    /* scatter(self, dim, index, src | value[, reduce]) / scatter_add / scatter_reduce.two:
     * element i of index (and of src) goes to self at index[i] along dim */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int nd = x->ndim, dim = norm_dim(tpu_arg_i64(c, 1, 0), nd);
    if (c->args[2].v.t->ndim != nd) return false;
    ref_t idx = convert(e, arg(n, 2), TPU_I64);
    check_range(e, idx, 0, x->sizes[dim], dim, false);
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
    int64_t all[TPU_MAX_DIMS];
    for (int d = 0; d < nd; d++) all[d] = d;
    char b1[256], b2[256], dn[700];
    snprintf(dn, sizeof dn, "update_window_dims = [], inserted_window_dims = [%s], scatter_dims_to_operand_dims = "
             "[%s], index_vector_dim = %d", ints(b1, sizeof b1, nd, all), ints(b2, sizeof b2, nd, all), nd);
    if (!reduce) {
      outs[0] = scatter(e, arg(n, 0), coords, upd, base[7] == '_' ? "stablehlo.add" : NULL, dn);
      return true;
    }
    /* scatter.reduce: "add" | "multiply"; scatter_reduce.two: sum, prod, mean, amax, amin */
    const bool include_self = !reduce_two || !(c->nargs > 5 && c->args[5].kind == TPU_ARG_BOOL && !c->args[5].v.b);
    return reduce_into(e, arg(n, 0), coords, upd, reduce, include_self, dn, &outs[0]);
  }
  return false;
}

static bool lower_index_put(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (is_tensor(n, 0) && is_tensor(n, 2) && c->args[1].kind == TPU_ARG_TENSORLIST) {
    /* (self, indices, values, accumulate): values (broadcast to the indexed
     * shape) go to self at the coordinates, replacing or adding */
    const tpu_tensor_t* x = c->args[0].v.t;
    const tpu_arg_t* il = &c->args[1];
    /* the indexed shape: x's other dims with B, the indices' broadcast, at ic.bpos */
    index_coords_t ic;
    if (!index_dims(x, il, &ic)) return false;
    int64_t bsz[TPU_MAX_DIMS] = {0}, rsz[TPU_MAX_DIMS];
    int bnd = 0;
    const int k = ic.k;
    for (int i = 0; i < il->n; i++) {
      const tpu_tensor_t* t = &il->v.tlist[i];
      if (t->dtype == TPU_DTYPE_NONE) continue;
      if (t->ndim > bnd) {
        memmove(bsz + (t->ndim - bnd), bsz, sizeof(int64_t) * (size_t)bnd);
        for (int d = 0; d < t->ndim - bnd; d++) bsz[d] = 1;
        bnd = t->ndim;
      }
      for (int d = 0; d < t->ndim; d++) {
        int64_t* b = &bsz[bnd - t->ndim + d];
        if (*b == 1) *b = t->sizes[d];
        else if (t->sizes[d] != 1 && t->sizes[d] != *b) return false;
      }
    }
    if (x->ndim - k + bnd > TPU_MAX_DIMS) return false;
    const int rnd = x->ndim - k + bnd;
    ic.nb = bnd;
    memcpy(rsz + ic.bpos, bsz, sizeof(int64_t) * (size_t)bnd);
    for (int d = 0, j = 0, m = 0; d < x->ndim; d++) {
      if (j < k && ic.dims[j] == d) j++;
      else rsz[kept_dim_pos(&ic, m++)] = x->sizes[d];
    }
    if (!index_coords(n, x, il, rnd, rsz, &ic)) return false;
    ref_t upd = bcast(e, convert(e, arg(n, 2), x->dtype), rnd, rsz);
    int64_t win[TPU_MAX_DIMS];
    int nw = 0;
    for (int d = 0; d < rnd; d++)
      if (d < ic.bpos || d >= ic.bpos + ic.nb) win[nw++] = d;
    char b1[256], b2[256], b3[256], dn[900];
    snprintf(dn, sizeof dn, "update_window_dims = [%s], inserted_window_dims = [%s], scatter_dims_to_operand_dims "
             "= [%s], index_vector_dim = %d", ints(b1, sizeof b1, nw, win), ints(b2, sizeof b2, ic.k, ic.dims),
             ints(b3, sizeof b3, ic.k, ic.dims), ic.nb);
    const bool accumulate = c->nargs > 3 && c->args[3].kind == TPU_ARG_BOOL && c->args[3].v.b;
    outs[0] = scatter(e, arg(n, 0), ic.coords, upd, accumulate ? "stablehlo.add" : NULL, dn);
    return true;
  }
  return false;
}

/* Indices along one dim: i64 [k, 1], negative ones wrapped by len. */
static ref_t dim_index(em_t* e, ref_t idx, int64_t len) {
  ref_t ix = convert(e, idx, TPU_I64);
  const int64_t k = numel(&ix);
  ix = reshape(e, ix, 2, (int64_t[]){k, 1});
  ref_t neg = compare(e, "LT", ix, cst_like(e, TPU_I64, 0, 2, ix.sz));
  return select3(e, neg, scalar_op(e, "stablehlo.add", ix, (double)len), ix);
}

/* Dimension numbers of a scatter of slices along dim: the updates are x's
 * shape with dim replaced by the k indices of a [k, 1] index. */
static const char* slice_scatter_dn(char* dn, size_t cap, int nd, int dim) {
  int64_t win[TPU_MAX_DIMS];
  int nw = 0;
  for (int d = 0; d < nd; d++)
    if (d != dim) win[nw++] = d;
  char b1[256];
  snprintf(dn, cap, "update_window_dims = [%s], inserted_window_dims = [%d], scatter_dims_to_operand_dims = [%d], "
           "index_vector_dim = 1", ints(b1, sizeof b1, nw, win), dim, dim);
  return dn;
}

/* index_copy(self, dim, index, source), index_add(self, dim, index, source,
 * alpha), index_reduce(self, dim, index, source, reduce, include_self),
 * index_fill(self, dim, index, value): slices of self along dim, chosen by
 * index, replaced, added to, reduced into or filled. A 0-d self is one slice. */
static bool lower_index_slices(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !is_tensor(n, 2)) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  ref_t x = arg_out(n, 0, odt);
  const int64_t one = 1;
  if (t->ndim == 0) x = reshape(e, x, 1, &one);
  const int nd = x.nd, dim = norm_dim(tpu_arg_i64(c, 1, 0), t->ndim);
  /* CPU's ranges: index_fill wraps negative indices, the others refuse them;
   * index_add raises RuntimeError, the others IndexError */
  const bool fill = !strcmp(base, "index_fill");
  check_range(e, arg(n, 2), fill ? -x.sz[dim] : 0, x.sz[dim], dim, strcmp(base, "index_add") != 0);
  ref_t idx = dim_index(e, arg(n, 2), x.sz[dim]);
  const int64_t k = idx.sz[0];
  ref_t r;
  if (!strcmp(base, "index_fill")) { /* a mask of the chosen positions along dim */
    int64_t msz[2] = {x.sz[dim], k};
    ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, msz), "iota_dimension = 0 : i64");
    ref_t hit = compare(e, "EQ", pos, bcast(e, reshape(e, idx, 1, &k), 2, msz));
    ref_t any = reduce(e, convert(e, hit, TPU_I32), 1, (int64_t[]){1}, "stablehlo.maximum", 0);
    ref_t mask = compare(e, "NE", any, cst_like(e, TPU_I32, 0, 1, any.sz));
    int64_t d1[1] = {dim};
    mask = bcast_dims(e, mask, nd, x.sz, d1);
    r = select3(e, mask, arg_as(n, 3, odt, nd, x.sz), x);
  } else {
    int64_t usz[TPU_MAX_DIMS];
    memcpy(usz, x.sz, sizeof(int64_t) * (size_t)nd);
    usz[dim] = k;
    ref_t upd = convert(e, arg(n, 3), odt);
    upd = numel(&upd) == 1 ? bcast(e, reshape(e, upd, 0, NULL), nd, usz) : reshape(e, upd, nd, usz);
    char dn[600];
    slice_scatter_dn(dn, sizeof dn, nd, dim);
    if (!strcmp(base, "index_copy")) {
      r = scatter(e, x, idx, upd, NULL, dn);
    } else if (!strcmp(base, "index_add")) {
      const double alpha = tpu_arg_f64(c, 4, 1.0);
      if (alpha != 1.0) upd = scalar_op(e, "stablehlo.multiply", upd, alpha);
      r = scatter(e, x, idx, upd, "stablehlo.add", dn);
    } else if (!strcmp(base, "index_reduce")) {
      const char* how = tpu_arg_str(c, 4, NULL);
      const bool include_self = !(c->nargs > 5 && c->args[5].kind == TPU_ARG_BOOL && !c->args[5].v.b);
      if (!how || !reduce_into(e, x, idx, upd, how, include_self, dn, &r)) return false;
    } else {
      return false;
    }
  }
  outs[0] = t->ndim == 0 ? reshape(e, r, 0, NULL) : r;
  return true;
}

/* take(self, index): self's elements in flat order at index (wrapped);
 * put(self, index, source, accumulate): source written (added) there. */
static bool lower_take_put(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !is_tensor(n, 1)) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  const int64_t total = tpu_tensor_numel(t);
  ref_t flat = reshape(e, arg(n, 0), 1, &total);
  check_range(e, arg(n, 1), -total, total, -1, true);
  ref_t idx = dim_index(e, arg(n, 1), total);
  const int64_t k = idx.sz[0];
  if (!strcmp(base, "take")) {
    ref_t in[2] = {flat, idx};
    ref_t g = emit(e, "stablehlo.gather", 2, in, mkref(t->dtype, 1, &k),
                   "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
                   "index_vector_dim = 1>, slice_sizes = array<i64: 1>, indices_are_sorted = false");
    outs[0] = reshape(e, g, o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "put") && is_tensor(n, 2)) {
    ref_t src = reshape(e, convert(e, arg(n, 2), t->dtype), 1, &k);
    const bool acc = c->nargs > 3 && c->args[3].kind == TPU_ARG_BOOL && c->args[3].v.b;
    char dn[300];
    snprintf(dn, sizeof dn, "update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
             "index_vector_dim = 1");
    outs[0] = reshape(e, scatter(e, flat, idx, src, acc ? "stablehlo.add" : NULL, dn), t->ndim, t->sizes);
    return true;
  }
  return false;
}

/* For each value, how many entries of its (sorted) row of seq come before
 * it: those < v, or <= v with `right`. seq is 1-D (every value searches it)
 * or has the values' leading dims (each row of values searches its own). */
static ref_t count_before(em_t* e, ref_t seq, ref_t v, bool right, tpu_dtype_t ct) {
  seq = convert(e, seq, ct);
  v = convert(e, v, ct);
  const int64_t m = seq.nd ? seq.sz[seq.nd - 1] : 1;
  int64_t sz[TPU_MAX_DIMS], vd[TPU_MAX_DIMS], sd[TPU_MAX_DIMS];
  const int nd = v.nd + 1;
  memcpy(sz, v.sz, sizeof(int64_t) * (size_t)v.nd);
  sz[v.nd] = m;
  for (int d = 0; d < v.nd; d++) vd[d] = d;
  ref_t vb = bcast_dims(e, v, nd, sz, vd);
  ref_t sb;
  if (seq.nd <= 1) {
    sd[0] = v.nd;
    sb = bcast_dims(e, reshape(e, seq, 1, &m), nd, sz, sd);
  } else { /* rows: seq's leading dims are v's */
    for (int d = 0; d < seq.nd - 1; d++) sd[d] = d;
    sd[seq.nd - 1] = v.nd;
    sb = bcast_dims(e, seq, nd, sz, sd);
  }
  ref_t before = compare(e, right ? "LE" : "LT", sb, vb);
  int64_t last[1] = {v.nd};
  return reduce(e, convert(e, before, TPU_I64), 1, last, "stablehlo.add", 0);
}

/* bucketize(self, boundaries, out_int32, right), searchsorted(sorted_sequence,
 * self, out_int32, right, side, sorter) */
static bool lower_search(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool bucket = base[0] == 'b';
  const int iseq = bucket ? 1 : 0, ival = bucket ? 0 : 1;
  if (!is_tensor(n, iseq)) return false;
  const tpu_tensor_t* st = c->args[iseq].v.t;
  bool right = tpu_arg_bool(c, 3, false);
  if (!bucket) {
    const char* side = tpu_arg_str(c, 4, NULL);
    if (side) right = !strcmp(side, "right");
  }
  ref_t seq = arg(n, iseq);
  if (!bucket && is_tensor(n, 5)) { /* sorter: the order that sorts each row */
    if (st->ndim != 1) return false;
    seq = take_along(e, seq, 0, reshape(e, convert(e, arg(n, 5), TPU_I64), 2, (int64_t[]){st->sizes[0], 1}));
  }
  const tpu_tensor_t* tmp[2] = {st, is_tensor(n, ival) ? c->args[ival].v.t : st};
  const tpu_dtype_t ct = tpu_result_type(tmp, 2);
  ref_t v = is_tensor(n, ival) ? arg(n, ival) : cst_like(e, ct, tpu_arg_f64(c, ival, 0), 0, NULL);
  if (st->ndim > 1 && st->ndim != v.nd) return false;
  outs[0] = convert(e, count_before(e, seq, v, right, ct), odt);
  return true;
}

/* repeat_interleave.Tensor(repeats, output_size): output j is the index i
 * whose running total of repeats first exceeds j */
static bool lower_repeat_interleave(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (strcmp(ovl, "Tensor") || !is_tensor(n, 0) || c->args[0].v.t->ndim != 1 || o->ndim != 1) return false;
  ref_t total = scan_dim(e, convert(e, arg(n, 0), TPU_I64), 0, true);
  ref_t j = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 1, o->sizes), "iota_dimension = 0 : i64");
  outs[0] = convert(e, count_before(e, total, j, true, TPU_I64), odt);
  return true;
}

/* The flat positions of a mask's true elements among them (0, 1, ...), and
 * `none` where the mask is false. */
static ref_t rank_of_true(em_t* e, ref_t mask_flat, double none) {
  ref_t m = convert(e, mask_flat, TPU_I64);
  ref_t pos = scalar_op(e, "stablehlo.subtract", scan_dim(e, m, 0, true), 1);
  return select3(e, compare(e, "NE", m, cst_like(e, TPU_I64, 0, m.nd, m.sz)), pos,
                 cst_like(e, TPU_I64, none, m.nd, m.sz));
}

/* masked_scatter(self, mask, source): the true positions of mask (broadcast
 * to self) take source's leading elements in order */
static bool lower_masked_scatter(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !is_tensor(n, 1) || !is_tensor(n, 2)) return false;
  const int64_t total = tpu_tensor_numel(o);
  const int64_t ns = tpu_tensor_numel(c->args[2].v.t);
  if (total == 0 || ns == 0) {
    outs[0] = arg_out(n, 0, odt);
    return true;
  }
  ref_t x = reshape(e, arg_out(n, 0, odt), 1, &total);
  ref_t m = reshape(e, arg_out(n, 1, TPU_BOOL), 1, &total);
  ref_t pos = rank_of_true(e, m, 0);
  ref_t src = reshape(e, convert(e, arg(n, 2), odt), 1, &ns);
  ref_t picked = take_along(e, src, 0, reshape(e, pos, 2, (int64_t[]){total, 1}));
  outs[0] = reshape(e, select3(e, m, picked, x), o->ndim, o->sizes);
  return true;
}

/* nonzero_static(self, size, fill_value): the coordinates of the first
 * `size` nonzero elements in order, the rows after them fill_value */
static bool lower_nonzero_static(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || o->ndim != 2) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  const int64_t total = tpu_tensor_numel(t), size = o->sizes[0], nd = o->sizes[1];
  ref_t fill = cst_like(e, TPU_I64, (double)tpu_arg_i64(c, 2, -1), 2, o->sizes);
  if (total == 0 || size == 0 || nd == 0) {
    outs[0] = convert(e, fill, odt);
    return true;
  }
  ref_t x = reshape(e, arg(n, 0), 1, &total);
  ref_t nz = compare(e, "NE", x, cst_like(e, x.dt, 0, 1, &total));
  ref_t pos = rank_of_true(e, nz, (double)size); /* past the end: dropped */
  /* element i's coordinates: (i / stride_d) % size_d */
  ref_t i = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 1, &total), "iota_dimension = 0 : i64");
  ref_t parts[TPU_MAX_DIMS];
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    ref_t q = scalar_op(e, "stablehlo.divide", i, (double)stride);
    parts[d] = reshape(e, binop(e, "stablehlo.remainder", q, cst_like(e, TPU_I64, (double)t->sizes[d], 1, &total)),
                       2, (int64_t[]){total, 1});
    stride *= t->sizes[d];
  }
  ref_t coords = t->ndim == 1 ? parts[0]
                              : emit(e, "stablehlo.concatenate", t->ndim, parts, mkref(TPU_I64, 2, (int64_t[]){total, nd}),
                                     "dimension = 1 : i64");
  char dn[300];
  snprintf(dn, sizeof dn, "update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
           "index_vector_dim = 1");
  outs[0] = convert(e, scatter(e, fill, reshape(e, pos, 2, (int64_t[]){total, 1}), coords, NULL, dn), odt);
  return true;
}

/* max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices,
 * output_size, stride, padding): each plane of the output is zero but at
 * the flat positions its indices name, which take self's values */
/* max_pool2d/3d_with_indices_backward(grad_output, self, kernel, stride,
 * padding, dilation, ceil_mode, indices): the same scatter of grad_output
 * into zero planes of self's shape, adding where windows share an argmax */
static bool lower_max_unpool(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool bwd = strstr(base, "_backward") != NULL;
  const int iidx = bwd ? 7 : 1;
  if (!is_tensor(n, 0) || !is_tensor(n, iidx)) return false;
  const int k = bwd ? base[8] - '0' : base[strlen(base) - 2] - '0';
  const tpu_tensor_t* x = c->args[0].v.t;
  if ((k != 2 && k != 3) || x->ndim < k || o->ndim != x->ndim) return false;
  int64_t sin = 1, sout = 1;
  for (int d = x->ndim - k; d < x->ndim; d++) {
    sin *= x->sizes[d];
    sout *= o->sizes[d];
  }
  const int64_t total = tpu_tensor_numel(x), nout = tpu_tensor_numel(o);
  ref_t zero = cst_like(e, odt, 0, 1, &nout);
  if (total == 0 || nout == 0) {
    outs[0] = reshape(e, zero, o->ndim, o->sizes);
    return true;
  }
  ref_t v = reshape(e, convert(e, arg(n, 0), odt), 1, &total);
  ref_t idx = reshape(e, convert(e, arg(n, iidx), TPU_I64), 1, &total);
  ref_t i = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 1, &total), "iota_dimension = 0 : i64");
  ref_t plane = scalar_op(e, "stablehlo.divide", i, (double)sin);
  ref_t at = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", plane, (double)sout), idx);
  /* an index outside its plane is dropped (PyTorch raises), not written into the next one */
  ref_t bad = binop(e, "stablehlo.or", compare(e, "LT", idx, cst_like(e, TPU_I64, 0, 1, &total)),
                    compare(e, "GE", idx, cst_like(e, TPU_I64, (double)sout, 1, &total)));
  at = select3(e, bad, cst_like(e, TPU_I64, (double)nout, 1, &total), at);
  outs[0] = reshape(e, scatter(e, zero, reshape(e, at, 2, (int64_t[]){total, 1}), v, bwd ? "stablehlo.add" : NULL,
                               "update_window_dims = [], inserted_window_dims = [0], "
                               "scatter_dims_to_operand_dims = [0], index_vector_dim = 1"),
                    o->ndim, o->sizes);
  return true;
}

static bool lower_index_select(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "index_select") && is_tensor(n, 2)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    if (x->ndim == 0) { /* index 0 (or -1) of the one element */
      outs[0] = reshape(e, arg(n, 0), o->ndim, o->sizes);
      return true;
    }
    int dim = norm_dim(tpu_arg_i64(c, 1, 0), x->ndim);
    ref_t in[2] = {arg(n, 0), arg(n, 2)};
    check_range(e, in[1], 0, x->sizes[dim], dim, true);
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

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_index_put_impl", lower_index_put},
    {"bucketize", lower_search},
    {"gather", lower_gather},
    {"index", lower_index},
    {"index_add", lower_index_slices},
    {"index_copy", lower_index_slices},
    {"index_fill", lower_index_slices},
    {"index_put", lower_index_put},
    {"index_reduce", lower_index_slices},
    {"index_select", lower_index_select},
    {"kthvalue", lower_select_k},
    {"masked_scatter", lower_masked_scatter},
    {"max_pool2d_with_indices_backward", lower_max_unpool},
    {"max_pool3d_with_indices_backward", lower_max_unpool},
    {"max_unpool2d", lower_max_unpool},
    {"max_unpool3d", lower_max_unpool},
    {"median", lower_select_k},
    {"nanmedian", lower_select_k},
    {"nonzero", lower_nonzero_static}, /* its output size, the count, is known when it is queued */
    {"nonzero_static", lower_nonzero_static},
    {"put", lower_take_put},
    {"repeat_interleave", lower_repeat_interleave},
    {"scatter", lower_scatter},
    {"scatter_add", lower_scatter},
    {"scatter_reduce", lower_scatter},
    {"searchsorted", lower_search},
    {"sort", lower_sort},
    {"take", lower_take_put},
    {"topk", lower_sort},
};

const tpu_lower_table_t tpu_lower_index = {k_entries, sizeof k_entries / sizeof k_entries[0]};
