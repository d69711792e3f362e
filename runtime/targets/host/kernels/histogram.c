/* Histograms, bucketing and membership: histc, histogram (bin count or bin
 * edges) and its D-dimensional form (histogramdd), bucketize, searchsorted, isin and
 * nonzero_static.
 *
 * Operands are read into contiguous host arrays of long double, which holds
 * every value of every supported dtype exactly (64-bit integers included), so
 * comparisons between mixed dtypes are exact. Results are written to a
 * contiguous scratch array and copied into the (possibly strided) output.
 * These kernels are serial: their cost is a sort or a binary search per
 * element, small beside the transfer of their operands. */
#include <stdlib.h>

#include "kernels.h"

typedef long double ld_t;

/* t's elements in row-major order, or NULL when out of host memory */
static ld_t* load_ld(const tpu_tensor_t* t, int64_t* n_out) {
  int64_t n = tpu_tensor_numel(t);
  *n_out = n;
  ld_t* v = malloc(sizeof(ld_t) * (size_t)(n > 0 ? n : 1));
  bool fl = tpu_dtype_is_float(t->dtype);
  void* tmp = tpu_stage_f64(t, !fl);
  if (!v || !tmp) {
    free(v);
    free(tmp);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++)
    v[i] = fl ? (ld_t)((double*)tmp)[i] : (ld_t)((int64_t*)tmp)[i];
  free(tmp);
  return v;
}

/* Copies n contiguous values (double or int64 per `ct`) into out. */
static tpu_status_t store_out(const tpu_tensor_t* out, void* buf, tpu_dtype_t ct) {
  tpu_tensor_t s;
  tpu_tensor_make_contig(&s, buf, ct, out->ndim, out->sizes);
  return tpu_copy_strided(out, &s);
}

#define OOM(op) TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op)

/* ---- binary searches (PyTorch's conventions: a nan key sorts last) ---- */
/* first i in [0, n) with !(seq[i] < key) (left) / !(seq[i] <= key) (right);
 * seq read through the permutation `perm` when given */
static int64_t search(const ld_t* seq, const int64_t* perm, int64_t n, ld_t key, bool right) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    ld_t m = seq[perm ? perm[mid] : mid];
    if (right ? !(m > key) : !(m >= key)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side, sorter)
 * and bucketize.Tensor(self, boundaries, *, out_int32, right) */
static tpu_status_t search_kernel(const char* op, const tpu_call_t* c, const tpu_tensor_t* seq,
                                  const tpu_tensor_t* self, bool right, const tpu_tensor_t* sorter) {
  const tpu_tensor_t* out = &c->outs[0];
  int64_t L = seq->ndim ? seq->sizes[seq->ndim - 1] : 1;
  bool one_d = seq->ndim <= 1;
  if (!one_d) {
    bool same = self->ndim == seq->ndim;
    for (int d = 0; same && d < seq->ndim - 1; d++) same = self->sizes[d] == seq->sizes[d];
    if (!same)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: boundaries tensor should be 1 dimension or the first N-1 dimensions "
                     "of boundaries tensor and input value tensor must match", op);
  }
  int64_t ns, nv;
  ld_t* s = load_ld(seq, &ns);
  ld_t* v = load_ld(self, &nv);
  int64_t* perm = NULL;
  int64_t* res = malloc(8 * (size_t)(nv > 0 ? nv : 1));
  tpu_status_t st = TPU_OK;
  if (!s || !v || !res) {
    st = OOM(op);
    goto done;
  }
  if (sorter) {
    int64_t np;
    ld_t* p = load_ld(sorter, &np);
    perm = malloc(8 * (size_t)(np > 0 ? np : 1));
    if (!p || !perm) {
      free(p);
      st = OOM(op);
      goto done;
    }
    for (int64_t i = 0; i < np; i++) {
      perm[i] = (int64_t)p[i];
      if (perm[i] < 0 || perm[i] >= L) {
        free(p);
        st = TPU_ERR(OUT_OF_RANGE, "%s: sorter index %lld out of range [0, %lld)", op,
                     (long long)perm[i], (long long)L);
        goto done;
      }
    }
    free(p);
  }
  int64_t M = self->ndim ? self->sizes[self->ndim - 1] : 1; /* values per row */
  for (int64_t i = 0; i < nv; i++) {
    int64_t row = (one_d || M == 0) ? 0 : i / M;
    int64_t* pr = perm ? perm + row * L : NULL; /* sorter indices are within a row */
    res[i] = search(s + row * L, pr, L, v[i], right);
  }
  st = store_out(out, res, TPU_I64);
done:
  free(s);
  free(v);
  free(perm);
  free(res);
  return st;
}

tpu_status_t tpu_k_searchsorted(const tpu_call_t* c) {
  const char* op = "searchsorted";
  const tpu_tensor_t* seq = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* self = tpu_arg_tensor(c, 1);
  bool right = tpu_arg_bool(c, 3, false);
  const char* side = tpu_arg_is_none(c, 4) ? NULL : tpu_arg_str(c, 4, NULL);
  if (side) {
    bool r = strcmp(side, "right") == 0;
    if (!r && strcmp(side, "left") != 0)
      return TPU_ERR(INVALID_ARGUMENT, "%s: side can only be 'left' or 'right' but got '%s'", op,
                     side);
    if (right && !r)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: side and right can't be set to opposites, got side of left while "
                     "right was True", op);
    right = r;
  }
  const tpu_tensor_t* sorter = tpu_arg_is_none(c, 5) ? NULL : tpu_arg_tensor(c, 5);
  if (!seq || !self) return TPU_ERR(INVALID_ARGUMENT, "%s: expected tensor arguments", op);
  if (sorter) {
    bool same = sorter->ndim == seq->ndim;
    for (int d = 0; same && d < seq->ndim; d++) same = sorter->sizes[d] == seq->sizes[d];
    if (!same || tpu_dtype_is_float(sorter->dtype))
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: sorter must be an integer tensor of the sorted_sequence's shape", op);
  }
  return search_kernel(op, c, seq, self, right, sorter);
}

tpu_status_t tpu_k_bucketize(const tpu_call_t* c) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* b = tpu_arg_tensor(c, 1);
  if (!self || !b) return TPU_ERR(INVALID_ARGUMENT, "bucketize: expected tensor arguments");
  if (b->ndim != 1)
    return TPU_ERR(INVALID_ARGUMENT,
                   "bucketize: boundaries tensor must be 1 dimension, but got dim(%d)", b->ndim);
  return search_kernel("bucketize", c, b, self, tpu_arg_bool(c, 3, false), NULL);
}

/* ---- isin ---- */
static int cmp_ld(const void* a, const void* b) {
  ld_t x = *(const ld_t*)a, y = *(const ld_t*)b;
  /* nans last */
  if (x != x) return y != y ? 0 : 1;
  if (y != y) return -1;
  return (x > y) - (x < y);
}

/* isin.Tensor_Tensor(elements, test_elements, *, assume_unique, invert) and
 * isin.Tensor_Scalar(elements, test_element, ...) */
tpu_status_t tpu_k_isin(const tpu_call_t* c) {
  const char* op = "isin";
  const tpu_tensor_t* el = tpu_arg_tensor(c, 0);
  bool invert = tpu_arg_bool(c, 3, false);
  int64_t ne, nt;
  ld_t* e = el ? load_ld(el, &ne) : NULL;
  ld_t* t = NULL;
  ld_t one;
  if (c->args[1].kind == TPU_ARG_TENSOR) {
    t = load_ld(c->args[1].v.t, &nt);
  } else {
    one = c->args[1].kind == TPU_ARG_DOUBLE ? (ld_t)c->args[1].v.d
          : c->args[1].kind == TPU_ARG_BOOL ? (ld_t)c->args[1].v.b
                                             : (ld_t)c->args[1].v.i;
    nt = 1;
  }
  ld_t* tv = t ? t : &one;
  int64_t* res = malloc(8 * (size_t)(ne > 0 ? ne : 1));
  tpu_status_t st;
  if (!e || (!t && c->args[1].kind == TPU_ARG_TENSOR) || !res) {
    st = OOM(op);
  } else {
    qsort(tv, (size_t)nt, sizeof(ld_t), cmp_ld);
    int64_t valid = nt;
    while (valid > 0 && tv[valid - 1] != tv[valid - 1]) valid--; /* nan matches nothing */
    for (int64_t i = 0; i < ne; i++) {
      int64_t k = search(tv, NULL, valid, e[i], false);
      bool found = k < valid && tv[k] == e[i];
      res[i] = found != invert;
    }
    st = store_out(&c->outs[0], res, TPU_I64);
  }
  free(e);
  free(t);
  free(res);
  return st;
}

/* ---- histograms ---- */
/* The bin of v among edges[0..nb] (the last bin includes its right edge), -1
 * outside [edges[0], edges[nb]]. `lin`: the bin comes from linear
 * interpolation between the outer edges (histc), otherwise from a search of
 * the edges (within one bin of the interpolated guess when `local`). */
static int64_t bin_of(double v, int64_t nb, const double* edges, bool lin, bool local,
                      tpu_dtype_t dt) {
  double lo = edges[0], hi = edges[nb];
  if (!(v >= lo && v <= hi)) return -1;
  int64_t pos;
  if (lin || local) {
    /* the interpolation rounds each step to the input's dtype, as CPU's does */
    double width = tpu_round_f64(dt, hi - lo), nbd = tpu_round_f64(dt, (double)nb);
    double scaled = tpu_round_f64(dt, tpu_round_f64(dt, v - lo) * nbd);
    pos = (int64_t)tpu_round_f64(dt, scaled / width);
    if (local) {
      int64_t a = pos - 1 < 0 ? 0 : pos - 1, b = pos + 2 > nb + 1 ? nb + 1 : pos + 2;
      while (a < b) { /* upper bound of v in edges[a, b) */
        int64_t m = a + (b - a) / 2;
        if (edges[m] <= v) a = m + 1;
        else b = m;
      }
      pos = a - 1;
    }
  } else {
    int64_t a = 0, b = nb + 1;
    while (a < b) {
      int64_t m = a + (b - a) / 2;
      if (edges[m] <= v) a = m + 1;
      else b = m;
    }
    pos = a - 1;
  }
  if (pos >= nb) pos = nb - 1;
  if (pos < 0) pos = 0;
  return pos;
}

/* Adds each element of x inside [edges[0], edges[nb]] (weights w, or 1) to
 * its bin (bin_of). */
static void fill_hist(double* hist, int64_t nb, const ld_t* x, const ld_t* w, int64_t n,
                      const double* edges, bool lin, bool local, tpu_dtype_t dt) {
  for (int64_t i = 0; i < n; i++) {
    int64_t pos = bin_of((double)x[i], nb, edges, lin, local, dt);
    if (pos >= 0) hist[pos] += w ? (double)w[i] : 1.0;
  }
}

/* data range of x (finite values), for an unspecified range */
static void data_range(const ld_t* x, int64_t n, double* lo, double* hi) {
  double a = INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double v = (double)x[i];
    if (v < a) a = v;
    if (v > b) b = v;
  }
  if (n == 0) a = b = 0;
  *lo = a;
  *hi = b;
}

/* edges = linspace(lo, hi, nb + 1) in dtype dt, as torch.linspace computes it
 * (from both ends toward the middle) */
static void linspace_edges(double* e, int64_t nb, double lo, double hi, tpu_dtype_t dt) {
  bool f32 = dt != TPU_F64;
  float lof = (float)lo, hif = (float)hi, stepf = (hif - lof) / (float)nb;
  double step = (hi - lo) / (double)nb;
  int64_t half = (nb + 1) / 2;
  for (int64_t i = 0; i <= nb; i++) {
    double v = f32 ? (double)(i < half ? lof + stepf * (float)i : hif - stepf * (float)(nb - i))
                   : (i < half ? lo + step * (double)i : hi - step * (double)(nb - i));
    e[i] = tpu_round_f64(dt, v);
  }
}

/* histc of an integer tensor, as CUDA counts it: min and max truncated to
 * integers, bin = (x - min) * bins / (max - min) in integer arithmetic (the
 * last bin holds x == max), values outside [min, max] left out; the counts
 * in the input's dtype. */
static tpu_status_t histc_int(const tpu_call_t* c, const tpu_tensor_t* self, int64_t nb,
                              double lo_f, double hi_f) {
  const char* op = "histc";
  int64_t n = tpu_tensor_numel(self);
  int64_t* x = tpu_stage_f64(self, true); /* int64 values */
  double* hist = calloc((size_t)nb, sizeof(double));
  tpu_status_t st = TPU_OK;
  if (!x || !hist) {
    st = OOM(op);
    goto done;
  }
  int64_t lo = (int64_t)lo_f, hi = (int64_t)hi_f;
  if (lo == hi && n > 0) {
    lo = hi = x[0];
    for (int64_t i = 1; i < n; i++) {
      if (x[i] < lo) lo = x[i];
      if (x[i] > hi) hi = x[i];
    }
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  if (!(lo < hi)) {
    st = TPU_ERR(INVALID_ARGUMENT, "torch.histc(): max must be larger than min");
    goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    if (x[i] < lo || x[i] > hi) continue;
    int64_t b = (int64_t)((__int128)(x[i] - lo) * nb / (hi - lo));
    if (b == nb) b--;
    hist[b] += 1;
  }
  st = store_out(&c->outs[0], hist, TPU_F64);
done:
  free(x);
  free(hist);
  return st;
}

/* histc(self, bins, min, max) */
tpu_status_t tpu_k_histc(const tpu_call_t* c) {
  const char* op = "histc";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  int64_t nb = tpu_arg_i64(c, 1, 100);
  double lo = tpu_arg_f64(c, 2, 0), hi = tpu_arg_f64(c, 3, 0);
  tpu_dtype_t dt = self->dtype;
  if (nb <= 0) return TPU_ERR(INVALID_ARGUMENT, "torch.histc(): bins must be > 0, but got %lld",
                              (long long)nb);
  if (dt == TPU_BOOL)
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for '%s'", op, tpu_dtype_name(dt));
  if (!tpu_dtype_is_float(dt)) return histc_int(c, self, nb, lo, hi);
  if (isinf(lo) || isinf(hi) || lo != lo || hi != hi)
    return TPU_ERR(INVALID_ARGUMENT, "torch.histc(): range of [%g, %g] is not finite", lo, hi);
  if (lo > hi)
    return TPU_ERR(INVALID_ARGUMENT, "torch.histc(): max must be larger than min");
  int64_t n;
  ld_t* x = load_ld(self, &n);
  double* hist = calloc((size_t)nb, sizeof(double));
  double* edges = malloc(sizeof(double) * (size_t)(nb + 1));
  tpu_status_t st;
  if (!x || !hist || !edges) {
    st = OOM(op);
    goto done;
  }
  if (lo == hi && n > 0) data_range(x, n, &lo, &hi);
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  if (isinf(lo) || isinf(hi)) {
    st = TPU_ERR(INVALID_ARGUMENT, "torch.histc(): range of [%g, %g] is not finite", lo, hi);
    goto done;
  }
  lo = tpu_round_f64(dt, lo);
  hi = tpu_round_f64(dt, hi);
  linspace_edges(edges, nb, lo, hi, dt);
  fill_hist(hist, nb, x, NULL, n, edges, true, false, dt);
  st = store_out(&c->outs[0], hist, TPU_F64);
done:
  free(x);
  free(hist);
  free(edges);
  return st;
}

/* histogram.bin_ct(self, bins, *, range, weight, density) and
 * histogram.bins_tensor(self, bins, *, weight, density): outs hist, bin_edges */
tpu_status_t tpu_k_histogram(const tpu_call_t* c) {
  const char* op = "histogram";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  bool edges_given = c->args[1].kind == TPU_ARG_TENSOR;
  int wi = edges_given ? 2 : 3, di = edges_given ? 3 : 4;
  const tpu_tensor_t* wt = tpu_arg_is_none(c, wi) ? NULL : tpu_arg_tensor(c, wi);
  bool density = tpu_arg_bool(c, di, false);
  tpu_dtype_t dt = self->dtype;
  if (c->nouts < 2) return TPU_ERR(INTERNAL, "%s: expected hist and bin_edges outputs", op);
  if (!tpu_dtype_is_float(dt))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for '%s'", op, tpu_dtype_name(dt));
  int64_t nb = edges_given ? tpu_tensor_numel(c->args[1].v.t) - 1 : tpu_arg_i64(c, 1, 100);
  if (nb <= 0) return TPU_ERR(INVALID_ARGUMENT, "%s: bins must be > 0", op);
  int64_t n, nw = 0, ne = 0;
  ld_t* x = load_ld(self, &n);
  ld_t* w = wt ? load_ld(wt, &nw) : NULL;
  ld_t* eg = edges_given ? load_ld(c->args[1].v.t, &ne) : NULL;
  double* hist = calloc((size_t)nb, sizeof(double));
  double* edges = malloc(sizeof(double) * (size_t)(nb + 1));
  tpu_status_t st;
  if (!x || (wt && !w) || (edges_given && !eg) || !hist || !edges) {
    st = OOM(op);
    goto done;
  }
  if (wt && nw != n) {
    st = TPU_ERR(INVALID_ARGUMENT, "%s: weight should have the same shape as input", op);
    goto done;
  }
  if (edges_given) {
    for (int64_t i = 0; i <= nb; i++) edges[i] = (double)eg[i];
  } else {
    double lo, hi;
    if (!tpu_arg_is_none(c, 2)) {
      const tpu_arg_t* r = &c->args[2];
      if (r->kind != TPU_ARG_DOUBLELIST || r->n != 2) {
        st = TPU_ERR(INVALID_ARGUMENT, "%s: range should have 2 elements", op);
        goto done;
      }
      lo = r->v.dlist[0];
      hi = r->v.dlist[1];
    } else {
      data_range(x, n, &lo, &hi);
    }
    if (!(lo <= hi) || isinf(lo) || isinf(hi)) {
      st = TPU_ERR(INVALID_ARGUMENT,
                   "%s: expected a finite range with min <= max, got [%g, %g]", op, lo, hi);
      goto done;
    }
    if (lo == hi) {
      lo -= 0.5;
      hi += 0.5;
    }
    linspace_edges(edges, nb, tpu_round_f64(dt, lo), tpu_round_f64(dt, hi), dt);
  }
  fill_hist(hist, nb, x, w, n, edges, false, !edges_given, dt);
  if (density) {
    double total = 0;
    for (int64_t i = 0; i < nb; i++) total += hist[i];
    for (int64_t i = 0; i < nb; i++) hist[i] /= total * (edges[i + 1] - edges[i]);
  }
  st = store_out(&c->outs[0], hist, TPU_F64);
  if (!st) st = store_out(&c->outs[1], edges, TPU_F64);
done:
  free(x);
  free(w);
  free(eg);
  free(hist);
  free(edges);
  return st;
}

/* nonzero_static(self, *, size, fill_value): the first `size` indices of
 * nonzero elements (row-major), rows past the count filled with fill_value */
tpu_status_t tpu_k_nonzero_static(const tpu_call_t* c) {
  const char* op = "nonzero_static";
  if (tpu_call_has_complex(c)) return tpu_complex_on_truth(c);
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  int64_t size = tpu_arg_i64(c, 1, 0), fill = tpu_arg_i64(c, 2, -1);
  int nd = self->ndim;
  if (size < 0) return TPU_ERR(INVALID_ARGUMENT, "%s: 'size' must be non-negative", op);
  if (out->ndim != 2 || out->sizes[0] != size || out->sizes[1] != nd)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an output of shape [%lld, %d]", op,
                   (long long)size, nd);
  int64_t n;
  ld_t* x = load_ld(self, &n);
  int64_t* res = malloc(8 * (size_t)(size * nd > 0 ? size * nd : 1));
  tpu_status_t st;
  if (!x || !res) {
    st = OOM(op);
  } else {
    int64_t row = 0;
    for (int64_t i = 0; i < n && row < size; i++) {
      if (x[i] == 0) continue;
      int64_t r = i;
      for (int d = nd - 1; d >= 0; d--) {
        res[row * nd + d] = r % self->sizes[d];
        r /= self->sizes[d];
      }
      row++;
    }
    for (int64_t k = row * nd; k < size * nd; k++) res[k] = fill;
    st = store_out(out, res, TPU_I64);
  }
  free(x);
  free(res);
  return st;
}

/* _histogramdd_from_bin_cts(self, bins, *, range, weight, density) and
 * _histogramdd_from_bin_tensors(self, bins, *, weight, density) -> hist: the
 * points are self's rows (last dim D); dim d has bins[d] bins, with edges
 * from a tensor, or spread evenly over range[2d..2d+1] (default: the data's
 * extent in that dim, widened by 0.5 both ways when empty) as histogram's.
 * A point outside any dim's edges is not counted. */
tpu_status_t tpu_k_histogramdd(const tpu_call_t* c) {
  const char* op = "histogramdd";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_arg_t* bins = &c->args[1];
  bool from_tensors = bins->kind == TPU_ARG_TENSORLIST;
  int wi = from_tensors ? 2 : 3, di = from_tensors ? 3 : 4;
  const tpu_tensor_t* wt = tpu_arg_is_none(c, wi) ? NULL : tpu_arg_tensor(c, wi);
  bool density = tpu_arg_bool(c, di, false);
  tpu_dtype_t dt = self->dtype;
  if (!tpu_dtype_is_float(dt))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for '%s'", op, tpu_dtype_name(dt));
  if (self->ndim < 1)
    return TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: input tensor should have at least 1 "
                   "dimension, but got 0");
  int64_t D = self->sizes[self->ndim - 1];
  if (bins->n != D)
    return TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: expected %lld sequences of bin edges for "
                   "each of the %lld dimensions of the input, but got %d", (long long)D,
                   (long long)D, (int)bins->n);
  if (!from_tensors && !tpu_arg_is_none(c, 2) &&
      (c->args[2].kind != TPU_ARG_DOUBLELIST || c->args[2].n != 2 * D))
    return TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: for a %lld-dimensional input, range "
                   "should have %lld elements", (long long)D, (long long)(2 * D));
  int64_t n, nw = 0, total_bins = 1, nedges = 0;
  for (int64_t d = 0; d < D; d++) {
    int64_t nb = from_tensors ? tpu_tensor_numel(&bins->v.tlist[d]) - 1 : bins->v.ilist[d];
    if (nb < 1)
      return TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: bins in dimension %lld must be >= 1",
                     (long long)d);
    total_bins *= nb;
    nedges += nb + 1;
  }
  ld_t* x = load_ld(self, &n);
  ld_t* w = wt ? load_ld(wt, &nw) : NULL;
  double* hist = calloc((size_t)total_bins, sizeof(double));
  double* edges = malloc(sizeof(double) * (size_t)nedges);
  int64_t* eoff = malloc(sizeof(int64_t) * (size_t)(D > 0 ? D : 1));
  int64_t* nbs = malloc(sizeof(int64_t) * (size_t)(D > 0 ? D : 1));
  ld_t* col = malloc(sizeof(ld_t) * (size_t)(n > 0 ? n : 1));
  int64_t npts = D > 0 ? n / D : 0;
  tpu_status_t st = TPU_OK;
  if (!x || (wt && !w) || !hist || !edges || !eoff || !nbs || !col) {
    st = OOM(op);
    goto done;
  }
  if (wt && nw != npts) {
    st = TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: if weight tensor is provided it should "
                 "have the same shape as the input tensor excluding its innermost dimension");
    goto done;
  }
  for (int64_t d = 0, off = 0; d < D; d++) {
    int64_t nb = from_tensors ? tpu_tensor_numel(&bins->v.tlist[d]) - 1 : bins->v.ilist[d];
    eoff[d] = off;
    nbs[d] = nb;
    double* e = edges + off;
    if (from_tensors) {
      int64_t ne;
      ld_t* eg = load_ld(&bins->v.tlist[d], &ne);
      if (!eg) {
        st = OOM(op);
        goto done;
      }
      for (int64_t i = 0; i <= nb; i++) e[i] = (double)eg[i];
      free(eg);
    } else {
      double lo, hi;
      if (!tpu_arg_is_none(c, 2)) {
        lo = c->args[2].v.dlist[2 * d];
        hi = c->args[2].v.dlist[2 * d + 1];
      } else {
        for (int64_t i = 0; i < npts; i++) col[i] = x[i * D + d];
        data_range(col, npts, &lo, &hi);
      }
      if (!(lo <= hi) || isinf(lo) || isinf(hi)) {
        st = TPU_ERR(INVALID_ARGUMENT, "torch.histogramdd: expected a finite range with min <= "
                     "max in dimension %lld, got [%g, %g]", (long long)d, lo, hi);
        goto done;
      }
      if (lo == hi) {
        lo -= 0.5;
        hi += 0.5;
      }
      linspace_edges(e, nb, tpu_round_f64(dt, lo), tpu_round_f64(dt, hi), dt);
    }
    off += nb + 1;
  }
  for (int64_t i = 0; i < npts; i++) {
    int64_t flat = 0;
    bool inside = true;
    for (int64_t d = 0; d < D && inside; d++) {
      int64_t pos = bin_of((double)x[i * D + d], nbs[d], edges + eoff[d], false, !from_tensors, dt);
      inside = pos >= 0;
      flat = flat * nbs[d] + pos;
    }
    if (inside) hist[flat] += w ? (double)w[i] : 1.0;
  }
  if (density) { /* divide by the total, then by each dim's bin widths */
    double total = 0;
    for (int64_t i = 0; i < total_bins; i++) total += hist[i];
    for (int64_t i = 0; i < total_bins; i++) hist[i] /= total;
    for (int64_t i = 0; i < total_bins; i++) {
      int64_t rest = i;
      for (int64_t d = D - 1; d >= 0; d--) {
        int64_t p = rest % nbs[d];
        rest /= nbs[d];
        hist[i] /= edges[eoff[d] + p + 1] - edges[eoff[d] + p];
      }
    }
  }
  st = store_out(&c->outs[0], hist, TPU_F64);
done:
  free(x);
  free(w);
  free(hist);
  free(edges);
  free(eoff);
  free(nbs);
  free(col);
  return st;
}
