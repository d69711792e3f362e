/* Reductions: sum/mean/amax/amin/prod/max/min over dims, var/std, logsumexp,
 * vector norms, any/all, argmax/argmin, and the scans cumsum/cumprod.
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

static bool lower_sum(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
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

static bool lower_linalg_vector_norm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_cumsum(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
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
    {"all", lower_any},
    {"amax", lower_sum},
    {"amin", lower_sum},
    {"any", lower_any},
    {"argmax", lower_argmax},
    {"argmin", lower_argmax},
    {"cumprod", lower_cumsum},
    {"cumsum", lower_cumsum},
    {"linalg_vector_norm", lower_linalg_vector_norm},
    {"logsumexp", lower_logsumexp},
    {"max", lower_max_any},
    {"mean", lower_sum},
    {"min", lower_min_any},
    {"prod", lower_sum},
    {"std", lower_var},
    {"std_mean", lower_var},
    {"sum", lower_sum},
    {"var", lower_var},
    {"var_mean", lower_var},
};

const tpu_lower_table_t tpu_lower_reduce = {k_entries, sizeof k_entries / sizeof k_entries[0]};
