/* Reductions: sum/mean/amax/amin/prod/max/min over dims, var/std, logsumexp,
 * vector norms, any/all, argmax/argmin, the scans cumsum/cumprod, histc, mode,
 * segment_reduce and the pairwise distances cdist/pdist.
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

/* the identity of max (mx) or min over dtype dt */
static double extreme_init(tpu_dtype_t dt, bool mx) {
  return tpu_dtype_is_float(dt) ? (mx ? -INFINITY : INFINITY)
         : dt == TPU_BOOL       ? (mx ? 0 : 1)
         : dt == TPU_U8         ? (mx ? 0 : 255)
         : dt == TPU_I8         ? (mx ? -128 : 127)
         : dt == TPU_I16        ? (mx ? -32768 : 32767)
         : dt == TPU_I32        ? (mx ? -2147483648.0 : 2147483647.0)
                                : (mx ? -9223372036854775807.0 - 1 : 9223372036854775807.0);
}

/* An index larger than any position (INT64_MAX does not survive a double). */
#define BIG_INDEX 4611686018427387904.0

/* a bitwise not where an integer minimum is wanted: it reverses the order of
 * every integer type, so that the minimum is the not of the maximum of the
 * nots (INT64_MAX, min's identity, is no double) */
static bool int_min(tpu_dtype_t dt, bool mx) { return !mx && !tpu_dtype_is_float(dt) && dt != TPU_BOOL; }

/* max (mx) or min of a over dims */
static ref_t reduce_extreme(em_t* e, ref_t a, int nr, const int64_t* dims, bool mx) {
  if (int_min(a.dt, mx))
    return unop(e, "stablehlo.not", reduce(e, unop(e, "stablehlo.not", a), nr, dims, "stablehlo.maximum",
                                          extreme_init(a.dt, true)));
  ref_t r = reduce(e, a, nr, dims, mx ? "stablehlo.maximum" : "stablehlo.minimum", extreme_init(a.dt, mx));
  if (!tpu_dtype_is_float(a.dt)) return r;
  /* a NaN anywhere makes the result NaN, as on CPU (XLA's CPU reduction may skip it) */
  ref_t nan = reduce(e, compare(e, "NE", a, a), nr, dims, "stablehlo.or", 0);
  return select3(e, nan, cst_like(e, r.dt, NAN, r.nd, r.sz), r);
}

static bool lower_sum(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  /* reductions: (self, dim, keepdim, dtype) or (self, dtype) */
  if (!strcmp(base, "sum") || !strcmp(base, "nansum") || !strcmp(base, "mean") || !strcmp(base, "amax") ||
      !strcmp(base, "amin") ||
      !strcmp(base, "prod") || ((!strcmp(base, "max") || !strcmp(base, "min")) && c->nouts == 1 &&
                                !is_tensor(n, 1) && c->nargs <= 2)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    /* (self, dim, keepdim, ...) rather than (self, dtype) */
    const bool has_dims = (c->nargs > 1 && c->args[1].kind == TPU_ARG_INTLIST) ||
                          (c->nargs > 2 && c->args[2].kind == TPU_ARG_BOOL);
    int nr = red_dims(n, has_dims ? 1 : -1, x->ndim, dims);
    tpu_dtype_t ct = odt;
    if (!strcmp(base, "sum") || !strcmp(base, "nansum") || !strcmp(base, "mean") || !strcmp(base, "prod"))
      ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t r;
    if (base[0] == 'n' && tpu_dtype_is_float(ct)) /* nansum: NaNs count as 0 */
      a = select3(e, compare(e, "NE", a, a), cst_like(e, ct, 0, a.nd, a.sz), a);
    if (base[0] == 's' || base[0] == 'n') r = reduce(e, a, nr, dims, "stablehlo.add", 0);
    else if (base[0] == 'p') r = reduce(e, a, nr, dims, "stablehlo.multiply", 1);
    else if (!strcmp(base, "mean")) {
      int64_t cnt = 1;
      for (int k = 0; k < nr; k++) cnt *= x->sizes[dims[k]];
      r = scalar_op(e, "stablehlo.divide", reduce(e, a, nr, dims, "stablehlo.add", 0), (double)cnt);
    } else {
      r = reduce_extreme(e, a, nr, dims, !strcmp(base, "amax") || !strcmp(base, "max"));
    }
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  return false;
}

/* the mean of one real part m (kept dims) as CPU's Welford pass leaves it: NaN
 * where more than one value is reduced and one of a's is infinite (an
 * infinite running mean meets inf - inf at the next value) */
static ref_t welford_part(em_t* e, ref_t a, ref_t m, int nr, const int64_t* dims) {
  ref_t inf = compare(e, "EQ", unop(e, "stablehlo.abs", a), cst_like(e, a.dt, INFINITY, a.nd, a.sz));
  ref_t any = reduce_keep(e, convert(e, inf, a.dt), nr, dims, "stablehlo.maximum", 0);
  return select3(e, compare(e, "GT", any, cst_like(e, a.dt, 0, any.nd, any.sz)), cst_like(e, m.dt, NAN, m.nd, m.sz), m);
}

static bool lower_var(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  /* ---- reductions ---- */
  if ((!strcmp(base, "var") || !strcmp(base, "std") || !strcmp(base, "var_mean") || !strcmp(base, "std_mean")) &&
      tpu_dtype_is_float(odt) && !strcmp(ovl, "correction")) {
    /* (self, dim?, correction?, keepdim) -> var or std (, mean) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS], cnt = 1;
    int nr = red_dims(n, 1, x->ndim, dims);
    for (int k = 0; k < nr; k++) cnt *= x->sizes[dims[k]];
    const double corr = tpu_arg_is_none(c, 2) ? 1.0 : tpu_arg_f64(c, 2, 1.0);
    /* complex: the mean of the values, the squares of the magnitudes (a real result) */
    tpu_dtype_t ct = tpu_dtype_is_complex(x->dtype) ? x->dtype : acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    ref_t mean, xc;
    ref_t ss = centred_sum_squares(e, a, nr, dims, (double)cnt, &mean, &xc);
    double div = (double)cnt - corr;
    ref_t v = scalar_op(e, "stablehlo.divide", ss, div > 0 ? div : 0.0);
    if (!strncmp(base, "std", 3)) v = unop(e, "stablehlo.sqrt", v);
    outs[0] = reshape(e, convert(e, v, odt), o->ndim, o->sizes);
    if (c->nouts > 1) {
      if (cnt > 1 && tpu_dtype_is_complex(ct))
        mean = make_complex(e, welford_part(e, re_part(e, a), re_part(e, mean), nr, dims),
                            welford_part(e, im_part(e, a), im_part(e, mean), nr, dims));
      else if (cnt > 1)
        mean = welford_part(e, a, mean, nr, dims);
      outs[1] = reshape(e, convert(e, mean, c->outs[1].dtype), c->outs[1].ndim, c->outs[1].sizes);
    }
    return true;
  }
  return false;
}

static bool lower_logsumexp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

/* the p-norm of x over dims */
static ref_t pnorm(em_t* e, ref_t x, double p, int nr, const int64_t* dims) {
  ref_t a = unop(e, "stablehlo.abs", x);
  if (isinf(p))
    return reduce(e, a, nr, dims, p > 0 ? "stablehlo.maximum" : "stablehlo.minimum", p > 0 ? 0 : INFINITY);
  if (p == 0)
    return reduce(e, convert(e, compare(e, "NE", a, cst_like(e, a.dt, 0, a.nd, a.sz)), a.dt), nr, dims, "stablehlo.add", 0);
  if (p == 1) return reduce(e, a, nr, dims, "stablehlo.add", 0);
  if (p == 2)
    return unop(e, "stablehlo.sqrt", reduce(e, binop(e, "stablehlo.multiply", a, a), nr, dims, "stablehlo.add", 0));
  ref_t s = reduce(e, binop(e, "stablehlo.power", a, cst_like(e, a.dt, p, a.nd, a.sz)), nr, dims, "stablehlo.add", 0);
  return binop(e, "stablehlo.power", s, cst_like(e, a.dt, 1.0 / p, s.nd, s.sz));
}

static bool lower_linalg_vector_norm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "linalg_vector_norm") ||
       (!strcmp(base, "norm") && (!strcmp(ovl, "Scalar") || !strcmp(ovl, "ScalarOpt_dim") ||
                                  !strcmp(ovl, "ScalarOpt_dim_dtype")))) &&
      tpu_dtype_is_float(odt) && (base[0] == 'l' || tpu_dtype_is_float(c->args[0].v.t->dtype))) {
    /* linalg_vector_norm (self, ord, dim?, keepdim, dtype?); norm (self, p?, dim, keepdim, dtype?) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 2, x->ndim, dims);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = arg(n, 0);
    if (tpu_dtype_is_complex(a.dt)) a = abs_of(e, a); /* the norm of the magnitudes */
    ref_t r = pnorm(e, convert(e, a, ct), tpu_arg_f64(c, 1, 2), nr, dims);
    outs[0] = reshape(e, convert(e, r, odt), o->ndim, o->sizes);
    return true;
  }
  return false;
}

static bool lower_count_nonzero(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "count_nonzero") && is_tensor(n, 0)) { /* (self, dim? or dims) -> int64 */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 1, x->ndim, dims);
    ref_t a = arg(n, 0);
    ref_t nz = convert(e, compare(e, "NE", a, cst_like(e, a.dt, 0, a.nd, a.sz)), TPU_I64);
    outs[0] = reshape(e, convert(e, reduce(e, nz, nr, dims, "stablehlo.add", 0), odt), o->ndim, o->sizes);
    return true;
  }
  return false;
}

static bool lower_trace(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "trace") && is_tensor(n, 0) && c->args[0].v.t->ndim == 2) { /* sum of the diagonal */
    ref_t a = convert(e, arg(n, 0), acc_type(odt));
    ref_t row = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, a.sz), "iota_dimension = 0 : i64");
    ref_t col = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, a.sz), "iota_dimension = 1 : i64");
    ref_t d = select3(e, compare(e, "EQ", row, col), a, cst_like(e, a.dt, 0, 2, a.sz));
    int64_t all[2] = {0, 1};
    outs[0] = reshape(e, convert(e, reduce(e, d, 2, all, "stablehlo.add", 0), odt), o->ndim, o->sizes);
    return true;
  }
  return false;
}

static bool lower_aminmax(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "aminmax") && c->nouts == 2 && is_tensor(n, 0)) { /* (self, dim?, keepdim) -> (min, max) */
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 1, x->ndim, dims);
    ref_t a = arg(n, 0);
    for (int k = 0; k < 2; k++)
      outs[k] = reshape(e, reduce_extreme(e, a, nr, dims, k), c->outs[k].ndim, c->outs[k].sizes);
    return true;
  }
  return false;
}

static bool lower_renorm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "renorm") && tpu_dtype_is_float(odt) && o->ndim > 0) {
    /* (self, p, dim, maxnorm): each slice along dim whose p-norm tops maxnorm is
     * scaled by maxnorm / (norm + 1e-7) */
    const int dim = norm_dim(tpu_arg_i64(c, 2, 0), o->ndim);
    const double maxnorm = tpu_arg_f64(c, 3, 1);
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct);
    int64_t dims[TPU_MAX_DIMS], ksz[TPU_MAX_DIMS];
    int nr = 0;
    for (int d = 0; d < x.nd; d++) {
      ksz[d] = d == dim ? x.sz[d] : 1;
      if (d != dim) dims[nr++] = d;
    }
    ref_t nm = reshape(e, pnorm(e, x, tpu_arg_f64(c, 1, 2), nr, dims), x.nd, ksz);
    ref_t over = compare(e, "GT", nm, cst_like(e, ct, maxnorm, x.nd, ksz));
    ref_t f = binop(e, "stablehlo.divide", cst_like(e, ct, maxnorm, x.nd, ksz), scalar_op(e, "stablehlo.add", nm, 1e-7));
    f = select3(e, over, f, cst_like(e, ct, 1, x.nd, ksz));
    outs[0] = convert(e, binop(e, "stablehlo.multiply", x, bcast(e, f, x.nd, x.sz)), odt);
    return true;
  }
  return false;
}

static bool lower_any(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_argmax(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "argmax") || !strcmp(base, "argmin") ||
       ((!strcmp(base, "max") || !strcmp(base, "min")) && c->nouts == 2)) && is_tensor(n, 0)) {
    /* argmax(self, dim?, keepdim) / max.dim(self, dim, keepdim) -> (values, indices) */
    const tpu_tensor_t* x = c->args[0].v.t;
    const bool mx = !strcmp(base, "argmax") || !strcmp(base, "max");
    const bool has_dim = c->nargs > 1 && c->args[1].kind == TPU_ARG_INT;
    if (tpu_dtype_is_complex(x->dtype) || (!tpu_dtype_is_float(x->dtype) && x->dtype != TPU_BOOL &&
                                            x->dtype != TPU_U8 && x->dtype != TPU_I8 && x->dtype != TPU_I16 &&
                                            x->dtype != TPU_I32 && x->dtype != TPU_I64))
      return false;
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
    ref_t in[2] = {a, idx}, init[2] = {cst(e, a.dt, extreme_init(a.dt, mx)), cst(e, TPU_I64, BIG_INDEX)};
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
  return false;
}

/* log(exp(a) + exp(b)), exact where both are the same infinity */
static void logaddexp_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out) {
  ref_t hi = binop(e, "stablehlo.maximum", acc[0], x[0]), lo = binop(e, "stablehlo.minimum", acc[0], x[0]);
  ref_t r = binop(e, "stablehlo.add", hi,
                  unop(e, "stablehlo.log_plus_one", unop(e, "stablehlo.exponential", binop(e, "stablehlo.subtract", lo, hi))));
  ref_t same_inf = binop(e, "stablehlo.and", compare(e, "EQ", lo, hi),
                         compare(e, "EQ", unop(e, "stablehlo.abs", lo), cst(e, lo.dt, INFINITY)));
  out[0] = select3(e, same_inf, lo, r);
}

static bool lower_cumsum(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool lse = !strcmp(base, "logcumsumexp"), ext = !strcmp(base, "cummax") || !strcmp(base, "cummin");
  if ((!strcmp(base, "cumsum") || !strcmp(base, "cumprod") || (lse && tpu_dtype_is_float(odt)) ||
       (ext && c->nouts == 2)) &&
      is_tensor(n, 0)) {
    /* (self, dim, dtype?): a window over everything before along dim; cummax / cummin
     * also give the index of the last extreme (the last NaN once one was seen) */
    const tpu_tensor_t* x = c->args[0].v.t;
    tpu_dtype_t ct = tpu_dtype_is_float(odt) && !ext ? acc_type(odt) : odt;
    ref_t a = convert(e, arg(n, 0), ct);
    if (a.nd == 0) {
      outs[0] = convert(e, a, odt);
      if (ext) outs[1] = cst_like(e, c->outs[1].dtype, 0, 0, NULL);
      return true;
    }
    const int dim = norm_dim(tpu_arg_i64(c, 1, 0), x->ndim);
    window_t w;
    prefix_window(&a, dim, &w);
    if (ext) { /* the first-extreme pair order over negated indices picks the last */
      const bool mx = base[4] == 'a', inv = int_min(ct, mx);
      ref_t idx = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, a.nd, a.sz), "iota_dimension = %d : i64", dim);
      ref_t in[2] = {inv ? unop(e, "stablehlo.not", a) : a, unop(e, "stablehlo.negate", idx)};
      ref_t init[2] = {cst(e, ct, extreme_init(ct, mx || inv)), cst(e, TPU_I64, BIG_INDEX)}, r[2];
      reduce_window_n(e, 2, in, init, &w, mx || inv ? argmax_first_body : argmin_first_body, r);
      outs[0] = inv ? emit(e, "stablehlo.not", 1, &r[0], mkref(ct, a.nd, a.sz), NULL) : r[0];
      /* (a subtraction: unop would keep r[1]'s result number) */
      outs[1] = convert(e, binop(e, "stablehlo.subtract", cst_like(e, TPU_I64, 0, a.nd, a.sz), r[1]), c->outs[1].dtype);
      return true;
    }
    const bool sum = base[3] == 's';
    ref_t init = cst(e, ct, lse ? -INFINITY : sum ? 0 : 1), r;
    reduce_window_n(e, 1, &a, &init, &w, lse ? logaddexp_body : sum ? sum_body : prod_body, &r);
    outs[0] = convert(e, r, odt);
    return true;
  }
  return false;
}

/* histc(self, bins, min, max): counts of the elements in [min, max] per
 * equal-width bin, the last bin closed; min == max takes the data's range
 * (widened by 1 each way when that is one value). The bin is
 * trunc((x - min) * bins / (max - min)) with each step rounded to the element
 * type, as CPU computes it. */
static bool lower_histc(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!is_tensor(n, 0) || odt == TPU_BOOL || o->ndim != 1) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  const int64_t nb = o->sizes[0], total = tpu_tensor_numel(t);
  const double lo0 = tpu_arg_f64(c, 2, 0), hi0 = tpu_arg_f64(c, 3, 0);
  if (nb <= 0 || t->dtype != odt || !(lo0 <= hi0) || isinf(lo0) || isinf(hi0)) return false; /* the kernel's errors */
  if (!tpu_dtype_is_float(odt) && (int64_t)lo0 > (int64_t)hi0) return false;
  if (total == 0) {
    outs[0] = cst_like(e, odt, 0, 1, &nb);
    return true;
  }
  ref_t x = reshape(e, arg(n, 0), 1, &total);
  ref_t in, pos;
  if (!tpu_dtype_is_float(odt)) {
    /* integers, as CUDA counts them: min and max truncated, the bin
     * (x - min) * bins / (max - min) in integer arithmetic */
    int64_t d0[1] = {0};
    ref_t xi = convert(e, x, TPU_I64);
    ref_t lo = cst(e, TPU_I64, (double)(int64_t)lo0), hi = cst(e, TPU_I64, (double)(int64_t)hi0);
    if ((int64_t)lo0 == (int64_t)hi0) { /* the data's range */
      lo = reduce(e, xi, 1, d0, "stablehlo.minimum", 9.2e18);
      hi = reduce(e, xi, 1, d0, "stablehlo.maximum", -9.2e18);
      ref_t same = compare(e, "EQ", lo, hi);
      lo = select3(e, same, binop(e, "stablehlo.subtract", lo, cst(e, TPU_I64, 1)), lo);
      hi = select3(e, same, binop(e, "stablehlo.add", hi, cst(e, TPU_I64, 1)), hi);
    }
    ref_t lob = bcast(e, lo, 1, &total), hib = bcast(e, hi, 1, &total);
    in = binop(e, "stablehlo.and", compare(e, "GE", xi, lob), compare(e, "LE", xi, hib));
    ref_t num = binop(e, "stablehlo.multiply", binop(e, "stablehlo.subtract", xi, lob),
                      cst_like(e, TPU_I64, (double)nb, 1, &total));
    pos = binop(e, "stablehlo.divide", num,
                bcast(e, binop(e, "stablehlo.subtract", hi, lo), 1, &total));
    pos = select3(e, in, pos, cst_like(e, TPU_I64, 0, 1, &total));
    pos = binop(e, "stablehlo.minimum", pos, cst_like(e, TPU_I64, (double)(nb - 1), 1, &total));
  } else {
  ref_t lo = cst(e, odt, lo0), hi = cst(e, odt, hi0);
  if (lo0 == hi0) { /* the data's range */
    int64_t d0[1] = {0};
    lo = reduce(e, x, 1, d0, "stablehlo.minimum", INFINITY);
    hi = reduce(e, x, 1, d0, "stablehlo.maximum", -INFINITY);
    ref_t same = compare(e, "EQ", lo, hi);
    lo = select3(e, same, binop(e, "stablehlo.subtract", lo, cst(e, odt, 1)), lo);
    hi = select3(e, same, binop(e, "stablehlo.add", hi, cst(e, odt, 1)), hi);
  }
  ref_t lob = bcast(e, lo, 1, &total), hib = bcast(e, hi, 1, &total);
  in = binop(e, "stablehlo.and", compare(e, "GE", x, lob), compare(e, "LE", x, hib));
  ref_t width = binop(e, "stablehlo.subtract", hi, lo);
  ref_t scaled = scalar_op(e, "stablehlo.multiply", binop(e, "stablehlo.subtract", x, lob), (double)nb);
  ref_t q = binop(e, "stablehlo.divide", scaled, bcast(e, width, 1, &total));
  q = select3(e, in, q, cst_like(e, odt, 0, 1, &total)); /* no conversion of out-of-range values */
  pos = convert(e, unop(e, "stablehlo.floor", q), TPU_I64);
  pos = binop(e, "stablehlo.minimum", pos, cst_like(e, TPU_I64, (double)(nb - 1), 1, &total));
  pos = binop(e, "stablehlo.maximum", pos, cst_like(e, TPU_I64, 0, 1, &total));
  }
  const int64_t hsz[2] = {total, nb};
  ref_t bins = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, hsz), "iota_dimension = 1 : i64");
  int64_t d0[1] = {0};
  ref_t hit = binop(e, "stablehlo.and", compare(e, "EQ", bins, bcast_dims(e, pos, 2, hsz, d0)),
                    bcast_dims(e, in, 2, hsz, d0));
  outs[0] = reduce(e, convert(e, hit, odt), 1, d0, "stablehlo.add", 0);
  return true;
}

/* segment_reduce(data, reduce, lengths?, indices?, offsets?, axis, unsafe,
 * initial?) along axis 0 with 1-D lengths or offsets: segment s covers
 * [start_s, end_s); an initial value takes part as one more element (mean:
 * (initial + sum) / length, the initial alone where the segment is empty) */
static bool lower_segment_reduce(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!is_tensor(n, 0) || !tpu_dtype_is_float(odt) || c->nargs < 8) return false;
  const char* how = tpu_arg_str(c, 1, NULL);
  const bool by_len = is_tensor(n, 2), by_off = !by_len && is_tensor(n, 4);
  if (!how || (!by_len && !by_off) || is_tensor(n, 3) || tpu_arg_i64(c, 5, 0) != 0) return false;
  const tpu_tensor_t* x = c->args[0].v.t;
  const tpu_tensor_t* ls = c->args[by_len ? 2 : 4].v.t;
  if (x->ndim < 1 || ls->ndim != 1 || o->ndim != x->ndim) return false;
  const int nd = x->ndim;
  const int64_t N = x->sizes[0], S = o->sizes[0];
  const bool mx = !strcmp(how, "max"), mn = !strcmp(how, "min"), sm = !strcmp(how, "sum"), mean = !strcmp(how, "mean"),
             pr = !strcmp(how, "prod");
  if (!(mx || mn || sm || mean || pr)) return false;
  const bool has_init = is_number(n, 7);
  const double init = tpu_arg_f64(c, 7, 0);
  if (tpu_tensor_numel(o) == 0) {
    outs[0] = cst_like(e, odt, 0, o->ndim, o->sizes);
    return true;
  }
  /* starts and ends, [S] int64 */
  ref_t lv = convert(e, arg(n, by_len ? 2 : 4), TPU_I64), st, en;
  if (by_len) {
    en = scan_dim(e, lv, 0, true);
    st = binop(e, "stablehlo.subtract", en, lv);
  } else {
    int64_t lo[1] = {0}, hi[1] = {S};
    st = slice(e, lv, lo, hi);
    lo[0] = 1;
    hi[0] = S + 1;
    en = slice(e, lv, lo, hi);
  }
  /* [S, N, rest...] */
  int64_t sz[TPU_MAX_DIMS + 1], d0[1] = {0};
  sz[0] = S;
  for (int d = 0; d < nd; d++) sz[d + 1] = x->sizes[d];
  ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd + 1, sz), "iota_dimension = 1 : i64");
  ref_t in = binop(e, "stablehlo.and", compare(e, "GE", pos, bcast_dims(e, st, nd + 1, sz, d0)),
                   compare(e, "LT", pos, bcast_dims(e, en, nd + 1, sz, d0)));
  int64_t xd[TPU_MAX_DIMS];
  for (int d = 0; d < nd; d++) xd[d] = d + 1;
  ref_t xb = bcast_dims(e, convert(e, arg(n, 0), odt), nd + 1, sz, xd);
  const double id = mx ? -INFINITY : mn ? INFINITY : pr ? 1 : 0;
  const char* op = mx ? "stablehlo.maximum" : mn ? "stablehlo.minimum" : pr ? "stablehlo.multiply" : "stablehlo.add";
  int64_t r1[1] = {1};
  ref_t r = reduce(e, select3(e, in, xb, cst_like(e, odt, id, nd + 1, sz)), 1, r1, op, id);
  if (has_init) r = binop(e, op, r, cst_like(e, odt, init, r.nd, r.sz));
  if (mean) {
    ref_t len = convert(e, reshape(e, binop(e, "stablehlo.subtract", en, st), 1, &S), odt);
    ref_t lb = bcast_dims(e, len, r.nd, r.sz, d0);
    ref_t q = binop(e, "stablehlo.divide", r, lb);
    r = has_init ? select3(e, compare(e, "EQ", lb, cst_like(e, odt, 0, r.nd, r.sz)), cst_like(e, odt, init, r.nd, r.sz), q) : q;
  }
  (void)N;
  outs[0] = r;
  return true;
}

/* p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]
 * (equal batch dims): [..., P, R], from the differences directly */
static ref_t pair_distances(em_t* e, ref_t x1, ref_t x2, double p) {
  const int nd = x1.nd;
  int64_t sz[TPU_MAX_DIMS], d1[TPU_MAX_DIMS], d2[TPU_MAX_DIMS];
  for (int d = 0; d < nd - 2; d++) sz[d] = x1.sz[d], d1[d] = d2[d] = d;
  sz[nd - 2] = x1.sz[nd - 2];
  sz[nd - 1] = x2.sz[nd - 2];
  sz[nd] = x1.sz[nd - 1];
  d1[nd - 2] = nd - 2, d1[nd - 1] = nd;
  d2[nd - 2] = nd - 1, d2[nd - 1] = nd;
  ref_t a = unop(e, "stablehlo.abs", binop(e, "stablehlo.subtract", bcast_dims(e, x1, nd + 1, sz, d1),
                                            bcast_dims(e, x2, nd + 1, sz, d2)));
  int64_t rd[1] = {nd};
  if (p == 0) return reduce(e, convert(e, compare(e, "NE", a, cst_like(e, a.dt, 0, a.nd, a.sz)), a.dt), 1, rd, "stablehlo.add", 0);
  if (isinf(p)) return reduce(e, a, 1, rd, "stablehlo.maximum", 0);
  if (p == 1) return reduce(e, a, 1, rd, "stablehlo.add", 0);
  if (p == 2) return unop(e, "stablehlo.sqrt", reduce(e, binop(e, "stablehlo.multiply", a, a), 1, rd, "stablehlo.add", 0));
  ref_t s = reduce(e, binop(e, "stablehlo.power", a, cst_like(e, a.dt, p, a.nd, a.sz)), 1, rd, "stablehlo.add", 0);
  return binop(e, "stablehlo.power", s, cst_like(e, s.dt, 1.0 / p, s.nd, s.sz));
}

/* _cdist_forward(x1, x2, p, compute_mode); _pdist_forward(self, p): the
 * upper triangle (i < j) of the rows' distances, row by row */
static bool lower_cdist(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !tpu_dtype_is_float(odt)) return false;
  const tpu_tensor_t* a = c->args[0].v.t;
  if (a->ndim < 2 || tpu_tensor_numel(o) == 0) {
    if (a->ndim < 2) return false;
    outs[0] = cst_like(e, odt, 0, o->ndim, o->sizes);
    return true;
  }
  if (!strcmp(base, "_pdist_forward")) {
    if (a->ndim != 2) return false;
    const double p = tpu_arg_f64(c, 1, 2);
    if (p < 0) return false;
    ref_t x = convert(e, arg(n, 0), odt);
    const int64_t nr = a->sizes[0], nn = nr * nr, np = o->sizes[0];
    ref_t d = reshape(e, pair_distances(e, x, x, p), 1, &nn);
    int64_t* idx = malloc(sizeof(int64_t) * (size_t)(np ? np : 1));
    if (!idx) return false;
    int64_t k = 0;
    for (int64_t i = 0; i < nr; i++)
      for (int64_t j = i + 1; j < nr && k < np; j++) idx[k++] = i * nr + j;
    ref_t at = cst_i64_list(e, k, idx);
    free(idx);
    outs[0] = take_along(e, d, 0, at);
    return true;
  }
  if (!is_tensor(n, 1)) return false;
  const tpu_tensor_t* b = c->args[1].v.t;
  if (b->ndim != a->ndim || memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)(a->ndim - 2)) ||
      a->sizes[a->ndim - 1] != b->sizes[b->ndim - 1])
    return false;
  const double p = tpu_arg_f64(c, 2, 2);
  if (p < 0) return false;
  outs[0] = pair_distances(e, convert(e, arg(n, 0), odt), convert(e, arg(n, 1), odt), p);
  return true;
}

/* mode(self, dim, keepdim) -> (values, indices), as the host kernel: the
 * smallest of the most frequent values along dim, with the last index it
 * occurs at; NaNs never equal each other (each counts once), so a NaN is the
 * mode only of all-NaN slices (the first one). Counts by pairwise compares
 * ([..., n, n]). */
static bool lower_mode(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!is_tensor(n, 0) || c->nouts != 2) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  if (!tpu_dtype_is_float(t->dtype) && t->dtype != TPU_I64 && t->dtype != TPU_I32) return false;
  if (t->ndim == 0 || tpu_tensor_numel(t) == 0) {
    if (tpu_tensor_numel(t) == 0 && t->ndim) return false; /* the kernel's error */
    outs[0] = arg(n, 0);
    outs[1] = cst_like(e, c->outs[1].dtype, 0, 0, NULL);
    return true;
  }
  const int nd = t->ndim, dim = norm_dim(tpu_arg_i64(c, 1, -1), nd);
  const int64_t len = t->sizes[dim];
  if (len > 4096) return false; /* the pairwise counts grow as len^2 */
  int64_t perm[TPU_MAX_DIMS];
  for (int d = 0, k = 0; d < nd; d++)
    if (d != dim) perm[k++] = d;
  perm[nd - 1] = dim;
  ref_t x = transpose(e, arg(n, 0), perm); /* [..., len] */
  int64_t sz[TPU_MAX_DIMS + 1], di[TPU_MAX_DIMS], dj[TPU_MAX_DIMS];
  for (int d = 0; d < nd - 1; d++) sz[d] = x.sz[d], di[d] = dj[d] = d;
  sz[nd - 1] = sz[nd] = len;
  di[nd - 1] = nd - 1;
  dj[nd - 1] = nd;
  ref_t xi = bcast_dims(e, x, nd + 1, sz, di), xj = bcast_dims(e, x, nd + 1, sz, dj);
  int64_t last[1] = {nd}, red[1] = {nd - 1};
  ref_t cnt = reduce(e, convert(e, compare(e, "EQ", xi, xj), TPU_I64), 1, last, "stablehlo.add", 0);
  const bool fl = tpu_dtype_is_float(x.dt);
  ref_t nan = fl ? compare(e, "NE", x, x) : cst_like(e, TPU_BOOL, 0, x.nd, x.sz);
  if (fl) cnt = binop(e, "stablehlo.add", cnt, convert(e, nan, TPU_I64));
  ref_t mc = reduce_keep(e, cnt, 1, red, "stablehlo.maximum", 0);
  ref_t real = binop(e, "stablehlo.and", compare(e, "EQ", cnt, bcast(e, mc, x.nd, x.sz)), unop(e, "stablehlo.not", nan));
  const double top = fl ? INFINITY : (x.dt == TPU_I64 ? 9.2233720368547758e18 : 2147483647.0);
  ref_t vmin = reduce_keep(e, select3(e, real, x, cst_like(e, x.dt, top, x.nd, x.sz)), 1, red, "stablehlo.minimum", top);
  ref_t anyreal = reduce_keep(e, real, 1, red, "stablehlo.or", 0);
  ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, x.nd, x.sz), "iota_dimension = %d : i64", nd - 1);
  ref_t hit = binop(e, "stablehlo.and", compare(e, "EQ", x, bcast(e, vmin, x.nd, x.sz)), unop(e, "stablehlo.not", nan));
  ref_t lastpos = reduce_keep(e, select3(e, hit, pos, cst_like(e, TPU_I64, -1, x.nd, x.sz)), 1, red, "stablehlo.maximum", -1);
  ref_t firstnan = reduce_keep(e, select3(e, nan, pos, cst_like(e, TPU_I64, (double)len, x.nd, x.sz)), 1, red,
                               "stablehlo.minimum", (double)len);
  ref_t idx = select3(e, anyreal, lastpos, firstnan);
  ref_t val = fl ? select3(e, anyreal, vmin, cst_like(e, x.dt, NAN, vmin.nd, vmin.sz)) : vmin;
  outs[0] = convert(e, val, odt);
  outs[1] = convert(e, idx, c->outs[1].dtype);
  return true;
}

/* the former chain tried these in turn; the first that lowers wins */
static bool lower_max_any(node_t* n, const char* base, ref_t* outs) {
  return lower_sum(n, base, outs) || lower_argmax(n, base, outs);
}

/* the former chain tried these in turn; the first that lowers wins */
static bool lower_min_any(node_t* n, const char* base, ref_t* outs) {
  return lower_sum(n, base, outs) || lower_argmax(n, base, outs);
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_cdist_forward", lower_cdist},
    {"_pdist_forward", lower_cdist},
    {"all", lower_any},
    {"amax", lower_sum},
    {"amin", lower_sum},
    {"aminmax", lower_aminmax},
    {"any", lower_any},
    {"argmax", lower_argmax},
    {"argmin", lower_argmax},
    {"count_nonzero", lower_count_nonzero},
    {"cummax", lower_cumsum},
    {"cummin", lower_cumsum},
    {"cumprod", lower_cumsum},
    {"cumsum", lower_cumsum},
    {"histc", lower_histc},
    {"linalg_vector_norm", lower_linalg_vector_norm},
    {"logcumsumexp", lower_cumsum},
    {"logsumexp", lower_logsumexp},
    {"max", lower_max_any},
    {"mean", lower_sum},
    {"min", lower_min_any},
    {"mode", lower_mode},
    {"nansum", lower_sum},
    {"norm", lower_linalg_vector_norm},
    {"prod", lower_sum},
    {"renorm", lower_renorm},
    {"segment_reduce", lower_segment_reduce},
    {"std", lower_var},
    {"std_mean", lower_var},
    {"sum", lower_sum},
    {"trace", lower_trace},
    {"var", lower_var},
    {"var_mean", lower_var},
};

const tpu_lower_table_t tpu_lower_reduce = {k_entries, sizeof k_entries / sizeof k_entries[0]};
