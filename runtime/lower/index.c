/* Indexing lowerings: gather, index.Tensor, scatter/scatter_add, index_select,
 * and sort/topk (a sort that carries the indices).
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
  return false;
}

/* Advanced indexing of x by the index tensors of list il on adjacent dims
 * p..p+k-1 (None elsewhere): they broadcast to B (nb dims, the indexed
 * result being x.shape[:p] + B + x.shape[p+k:], of rank rnd), and the
 * coordinates are B + [k] (negative indices wrapped). False for index lists
 * this does not express (boolean masks, indices not adjacent). */
typedef struct {
  int p, k, nb;
  ref_t coords;
} index_coords_t;

static bool index_coords(node_t* n, const tpu_tensor_t* x, const tpu_arg_t* il, int rnd, const int64_t* rsz,
                         index_coords_t* ic) {
  em_t* e = n->e;
  int p = -1, k = 0;
  for (int i = 0; i < il->n; i++) {
    if (il->v.tlist[i].dtype == TPU_DTYPE_NONE) continue;
    if (p < 0) p = i;
    else if (i != p + k) return false; /* not adjacent: B would go first */
    if (il->v.tlist[i].dtype != TPU_I64 && il->v.tlist[i].dtype != TPU_I32) return false;
    k++;
  }
  if (p < 0 || p + k > x->ndim) return false;
  const int nb = rnd - (x->ndim - k); /* dims of B */
  if (nb < 0 || nb > TPU_MAX_DIMS - 1) return false;
  int64_t bsz[TPU_MAX_DIMS + 1];
  memcpy(bsz, rsz + p, sizeof(int64_t) * (size_t)nb);
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
  ic->coords = k == 1 ? parts[0]
                      : emit(e, "stablehlo.concatenate", k, parts, mkref(TPU_I64, nb + 1, csz), "dimension = %d : i64", nb);
  ic->p = p;
  ic->k = k;
  ic->nb = nb;
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
    const int p = ic.p, k = ic.k, nb = ic.nb;
    ref_t coords = ic.coords;
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
  return false;
}

/* stablehlo.scatter of upd into operand at idx (dimension numbers dn),
 * replacing or, with add, adding */
static ref_t scatter(em_t* e, ref_t operand, ref_t idx, ref_t upd, bool add, const char* dn) {
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
  ref_t v = add ? binop(e, "stablehlo.add", acc, nw) : nw;
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

static bool lower_scatter(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
    int64_t all[TPU_MAX_DIMS];
    for (int d = 0; d < nd; d++) all[d] = d;
    char b1[256], b2[256], dn[700];
    snprintf(dn, sizeof dn, "update_window_dims = [], inserted_window_dims = [%s], scatter_dims_to_operand_dims = "
             "[%s], index_vector_dim = %d", ints(b1, sizeof b1, nd, all), ints(b2, sizeof b2, nd, all), nd);
    outs[0] = scatter(e, arg(n, 0), coords, upd, base[7] == '_', dn);
    return true;
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
    /* the indexed shape: x.shape[:p] + B + x.shape[p+k:], B the indices' broadcast */
    int64_t bsz[TPU_MAX_DIMS] = {0}, rsz[TPU_MAX_DIMS];
    int bnd = 0, p = -1, k = 0;
    for (int i = 0; i < il->n; i++) {
      const tpu_tensor_t* t = &il->v.tlist[i];
      if (t->dtype == TPU_DTYPE_NONE) continue;
      if (p < 0) p = i;
      k++;
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
    if (p < 0 || x->ndim - k + bnd > TPU_MAX_DIMS) return false;
    const int rnd = x->ndim - k + bnd;
    memcpy(rsz, x->sizes, sizeof(int64_t) * (size_t)p);
    memcpy(rsz + p, bsz, sizeof(int64_t) * (size_t)bnd);
    memcpy(rsz + p + bnd, x->sizes + p + k, sizeof(int64_t) * (size_t)(x->ndim - p - k));
    index_coords_t ic;
    if (!index_coords(n, x, il, rnd, rsz, &ic)) return false;
    ref_t upd = bcast(e, convert(e, arg(n, 2), x->dtype), rnd, rsz);
    int64_t win[TPU_MAX_DIMS], ins[TPU_MAX_DIMS];
    int nw = 0;
    for (int d = 0; d < rnd; d++)
      if (d < ic.p || d >= ic.p + ic.nb) win[nw++] = d;
    for (int j = 0; j < ic.k; j++) ins[j] = ic.p + j;
    char b1[256], b2[256], b3[256], dn[900];
    snprintf(dn, sizeof dn, "update_window_dims = [%s], inserted_window_dims = [%s], scatter_dims_to_operand_dims "
             "= [%s], index_vector_dim = %d", ints(b1, sizeof b1, nw, win), ints(b2, sizeof b2, ic.k, ins),
             ints(b3, sizeof b3, ic.k, ins), ic.nb);
    const bool accumulate = c->nargs > 3 && c->args[3].kind == TPU_ARG_BOOL && c->args[3].v.b;
    outs[0] = scatter(e, arg(n, 0), ic.coords, upd, accumulate, dn);
    return true;
  }
  return false;
}

static bool lower_index_select(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_index_put_impl", lower_index_put},
    {"gather", lower_gather},
    {"index", lower_index},
    {"index_put", lower_index_put},
    {"index_select", lower_index_select},
    {"scatter", lower_scatter},
    {"scatter_add", lower_scatter},
    {"sort", lower_sort},
    {"topk", lower_sort},
};

const tpu_lower_table_t tpu_lower_index = {k_entries, sizeof k_entries / sizeof k_entries[0]};
