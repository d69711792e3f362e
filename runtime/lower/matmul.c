/* Contractions: the matmul family as dot_general with the call's precision,
 * convolutions (plain and transposed) as stablehlo.convolution, and Cholesky
 * factors and triangular solves.
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

static bool lower_mm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  /* matmuls */
  if (!strcmp(base, "mm") || !strcmp(base, "bmm") || !strcmp(base, "addmm") || !strcmp(base, "baddbmm") ||
      !strcmp(base, "mv") || !strcmp(base, "dot") || !strcmp(base, "vdot") || !strcmp(base, "addmv")) {
    /* vdot of real vectors is dot */
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
  return false;
}

static bool lower_convolution(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_convolution_2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

/* the former chain tried these in turn; the first that lowers wins */
static bool lower_convolution_any(node_t* n, const char* base, ref_t* outs) {
  return lower_convolution(n, base, outs) || lower_convolution_2(n, base, outs);
}

/* ---- linear algebra: Cholesky factors and triangular solves ----
 * stablehlo.cholesky (of the lower triangle) and stablehlo.triangular_solve
 * over matrices in the last two dims; batch dims broadcast as in PyTorch. */

static ref_t transpose_last2(em_t* e, ref_t a) {
  int64_t perm[TPU_MAX_DIMS];
  for (int d = 0; d < a.nd; d++) perm[d] = d;
  perm[a.nd - 2] = a.nd - 1;
  perm[a.nd - 1] = a.nd - 2;
  return transpose(e, a, perm);
}

/* the lower (or upper) triangle of a, zeros elsewhere */
static ref_t triangle(em_t* e, ref_t a, bool lower) {
  ref_t r = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, a.nd, a.sz), "iota_dimension = %d : i64", a.nd - 2);
  ref_t k = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, a.nd, a.sz), "iota_dimension = %d : i64", a.nd - 1);
  return select3(e, compare(e, lower ? "GE" : "LE", r, k), a, cst_like(e, a.dt, 0, a.nd, a.sz));
}

/* L with A = L L^T from A's lower triangle (the rest of L zero) */
static ref_t cholesky_lower(em_t* e, ref_t a) {
  return triangle(e, emit(e, "stablehlo.cholesky", 1, &a, a, "lower = true"), true);
}

/* X with op(A) X = B (left) or X op(A) = B; A's other triangle is ignored */
static ref_t tri_solve(em_t* e, ref_t a, ref_t b, bool left, bool lower, bool unit, bool transpose_a) {
  ref_t in[2] = {a, b};
  return emit(e, "stablehlo.triangular_solve", 2, in, b,
              "left_side = %s, lower = %s, unit_diagonal = %s, transpose_a = #stablehlo<transpose %s>",
              left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false",
              transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE");
}

/* a and b with their batch dims (all but the last two) broadcast together */
static bool batch_broadcast(em_t* e, ref_t* a, ref_t* b) {
  const int nb = (a->nd > b->nd ? a->nd : b->nd) - 2;
  if (a->nd < 2 || b->nd < 2 || nb + 2 > TPU_MAX_DIMS) return false;
  int64_t bsz[TPU_MAX_DIMS];
  for (int i = 0; i < nb; i++) {
    const int ia = i - (nb - (a->nd - 2)), ib = i - (nb - (b->nd - 2));
    const int64_t sa = ia >= 0 ? a->sz[ia] : 1, sb = ib >= 0 ? b->sz[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    bsz[i] = sa == 1 ? sb : sa;
  }
  ref_t* v[2] = {a, b};
  for (int j = 0; j < 2; j++) {
    int64_t sz[TPU_MAX_DIMS];
    memcpy(sz, bsz, sizeof(int64_t) * (size_t)nb);
    sz[nb] = v[j]->sz[v[j]->nd - 2];
    sz[nb + 1] = v[j]->sz[v[j]->nd - 1];
    *v[j] = bcast(e, *v[j], nb + 2, sz);
  }
  return true;
}

static bool lower_linalg(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !tpu_dtype_is_float(odt) || odt == TPU_BF16 || odt == TPU_F16) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  if (t->ndim < 2) return false;
  if (tpu_tensor_numel(o) == 0) { /* nothing to factor or solve */
    for (int i = 0; i < c->nouts; i++)
      outs[i] = cst_like(e, c->outs[i].dtype, 0, c->outs[i].ndim, c->outs[i].sizes);
    return true;
  }
  if (!strcmp(base, "linalg_cholesky_ex") || !strcmp(base, "cholesky")) {
    /* (self, upper[, check_errors]) -> L (or U = L^T)[, info] */
    ref_t l = cholesky_lower(e, arg_out(n, 0, odt));
    outs[0] = tpu_arg_bool(c, 1, false) ? transpose_last2(e, l) : l;
    if (c->nouts > 1) { /* info: the order of the first leading minor that is not positive definite */
      const int64_t m = t->sizes[t->ndim - 1];
      ref_t r = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, l.nd, l.sz), "iota_dimension = %d : i64", l.nd - 2);
      ref_t k = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, l.nd, l.sz), "iota_dimension = %d : i64", l.nd - 1);
      ref_t diag = compare(e, "EQ", r, k);
      ref_t ok = binop(e, "stablehlo.and", emit(e, "stablehlo.is_finite", 1, &l, mkref(TPU_BOOL, l.nd, l.sz), NULL),
                       compare(e, "GT", l, cst_like(e, odt, 0, l.nd, l.sz)));
      ref_t bad = binop(e, "stablehlo.and", diag, unop(e, "stablehlo.not", ok));
      ref_t at = select3(e, bad, r, cst_like(e, TPU_I64, (double)m, l.nd, l.sz));
      int64_t last2[2] = {l.nd - 2, l.nd - 1};
      ref_t first = reduce(e, at, 2, last2, "stablehlo.minimum", (double)m);
      ref_t none = cst_like(e, TPU_I64, (double)m, first.nd, first.sz);
      ref_t info = select3(e, compare(e, "EQ", first, none), cst_like(e, TPU_I64, 0, first.nd, first.sz),
                           scalar_op(e, "stablehlo.add", first, 1));
      outs[1] = convert(e, info, c->outs[1].dtype);
    }
    return true;
  }
  if (!strcmp(base, "cholesky_inverse")) { /* (L, upper): (L L^T)^-1 = L^-T L^-1 */
    ref_t l = arg_out(n, 0, odt);
    const bool upper = tpu_arg_bool(c, 1, false);
    if (upper) l = transpose_last2(e, l);
    ref_t r = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, l.nd, l.sz), "iota_dimension = %d : i64", l.nd - 2);
    ref_t k = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, l.nd, l.sz), "iota_dimension = %d : i64", l.nd - 1);
    ref_t eye = convert(e, compare(e, "EQ", r, k), odt);
    ref_t linv = tri_solve(e, l, eye, true, true, false, false);
    outs[0] = dot_general(e, transpose_last2(e, linv), linv, l.nd - 2, l.nd - 1, l.nd - 2, out_ref(n, odt),
                          TPU_PRECISION_HIGHEST);
    return true;
  }
  if (!strcmp(base, "_cholesky_solve_helper") && is_tensor(n, 1)) { /* (B, L, upper): L L^T X = B */
    ref_t b = arg_out(n, 0, odt), l = convert(e, arg(n, 1), odt);
    if (!batch_broadcast(e, &l, &b)) return false;
    const bool upper = tpu_arg_bool(c, 2, false);
    ref_t y = tri_solve(e, l, b, true, !upper, false, upper);
    outs[0] = tri_solve(e, l, y, true, !upper, false, !upper);
    return true;
  }
  if (!strcmp(base, "linalg_solve_triangular") && is_tensor(n, 1)) { /* (A, B, upper, left, unitriangular) */
    ref_t a = convert(e, arg(n, 0), odt), b = convert(e, arg(n, 1), odt);
    if (!batch_broadcast(e, &a, &b)) return false;
    outs[0] = tri_solve(e, a, b, tpu_arg_bool(c, 3, true), !tpu_arg_bool(c, 2, false), tpu_arg_bool(c, 4, false), false);
    return true;
  }
  if (!strcmp(base, "triangular_solve") && is_tensor(n, 1) && c->nouts == 2) {
    /* (B, A, upper, transpose, unitriangular) -> (X, A) */
    ref_t b = arg_out(n, 0, odt), a = convert(e, arg(n, 1), odt);
    ref_t a0 = a;
    if (!batch_broadcast(e, &a, &b)) return false;
    outs[0] = tri_solve(e, a, b, true, !tpu_arg_bool(c, 2, true), tpu_arg_bool(c, 4, false), tpu_arg_bool(c, 3, false));
    outs[1] = bcast(e, a0, c->outs[1].ndim, c->outs[1].sizes);
    return true;
  }
  return false;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_cholesky_solve_helper", lower_linalg},
    {"_convolution", lower_convolution_any},
    {"addmm", lower_mm},
    {"addmv", lower_mm},
    {"baddbmm", lower_mm},
    {"bmm", lower_mm},
    {"cholesky", lower_linalg},
    {"cholesky_inverse", lower_linalg},
    {"convolution", lower_convolution_any},
    {"dot", lower_mm},
    {"linalg_cholesky_ex", lower_linalg},
    {"linalg_solve_triangular", lower_linalg},
    {"mm", lower_mm},
    {"mv", lower_mm},
    {"triangular_solve", lower_linalg},
    {"vdot", lower_mm},
};

const tpu_lower_table_t tpu_lower_matmul = {k_entries, sizeof k_entries / sizeof k_entries[0]};
