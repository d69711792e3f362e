/* Neural-network lowerings: softmax and its backward, layer/group/batch norm,
 * activations with parameters, losses, pooling, upsampling and the backward ops of
 * autograd that have a closed form, and grid_sampler_2d.
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

static bool lower_softmax(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_native_layer_norm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "native_layer_norm") && c->nouts == 3) {
    /* (input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
    const tpu_tensor_t* x = c->args[0].v.t;
    const int k = c->args[1].n;
    int64_t dims[TPU_MAX_DIMS], cnt = 1;
    for (int i = 0; i < k; i++) {
      dims[i] = x->ndim - k + i;
      cnt *= x->sizes[dims[i]];
    }
    /* float64 statistics for every float type, as CPU's kernel: a row's mean far from
     * zero keeps its digits */
    tpu_dtype_t ct = tpu_dtype_is_float(odt) ? TPU_F64 : odt;
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
  return false;
}

static bool lower_leaky_relu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  /* ---- activations ---- */
  const bool clamp_int = !tpu_dtype_is_float(odt) && !tpu_dtype_is_complex(odt) && odt != TPU_BOOL &&
                         (!strcmp(base, "hardtanh") || !strcmp(base, "relu6")); /* a clamp of integers too */
  if ((tpu_dtype_is_float(odt) || clamp_int) && is_tensor(n, 0) &&
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
  return false;
}

/* Output 0 of a loss from its per-element values l and its reduction (argument
 * ri: 0 none, 1 mean over the elements, 2 sum); true. */
static bool loss_out(node_t* n, ref_t l, int ri, ref_t* outs) {
  LOWER_LOCALS;
  const int64_t red = tpu_arg_i64(c, ri, 1);
  if (red != 0) {
    int64_t all[TPU_MAX_DIMS];
    for (int d = 0; d < l.nd; d++) all[d] = d;
    const double cnt = (double)numel(&l);
    l = reduce(e, l, l.nd, all, "stablehlo.add", 0);
    if (red == 1) l = scalar_op(e, "stablehlo.divide", l, cnt);
  }
  outs[0] = reshape(e, convert(e, l, odt), o->ndim, o->sizes);
  return true;
}

static bool lower_mse_loss(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "mse_loss") || !strcmp(base, "smooth_l1_loss") || !strcmp(base, "huber_loss")) &&
      tpu_dtype_is_float(odt)) {
    /* (self, target, reduction, beta / delta) */
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct), t = bcast(e, convert(e, arg(n, 1), ct), a.nd, a.sz);
    ref_t d = binop(e, "stablehlo.subtract", a, t), l = binop(e, "stablehlo.multiply", d, d);
    if (base[0] != 'm') {
      /* |d| < b: 0.5 d^2 / beta (smooth_l1) or 0.5 d^2 (huber); else |d| - 0.5 beta or delta (|d| - 0.5 delta) */
      const double b = tpu_arg_f64(c, 3, 1);
      const bool huber = base[0] == 'h';
      ref_t z = unop(e, "stablehlo.abs", d);
      ref_t q = scalar_op(e, "stablehlo.multiply", l, huber ? 0.5 : (b > 0 ? 0.5 / b : 0));
      ref_t lin = scalar_op(e, "stablehlo.subtract", z, 0.5 * b);
      if (huber) lin = scalar_op(e, "stablehlo.multiply", lin, b);
      l = select3(e, compare(e, "LT", z, cst_like(e, ct, b, z.nd, z.sz)), q, lin);
    }
    return loss_out(n, l, 2, outs);
  }
  return false;
}

static bool lower_binary_cross_entropy(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "binary_cross_entropy") && tpu_dtype_is_float(odt)) {
    /* (self, target, weight?, reduction): (t - 1) * max(log(1 - x), -100) - t * max(log(x), -100) */
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct), t = bcast(e, convert(e, arg(n, 1), ct), x.nd, x.sz);
    ref_t lo = cst_like(e, ct, -100, x.nd, x.sz);
    ref_t lx = binop(e, "stablehlo.maximum", unop(e, "stablehlo.log", x), lo);
    ref_t l1x = binop(e, "stablehlo.maximum",
                      unop(e, "stablehlo.log", binop(e, "stablehlo.subtract", cst_like(e, ct, 1, x.nd, x.sz), x)), lo);
    ref_t l = binop(e, "stablehlo.subtract", binop(e, "stablehlo.multiply", scalar_op(e, "stablehlo.subtract", t, 1), l1x),
                    binop(e, "stablehlo.multiply", t, lx));
    if (is_tensor(n, 2)) l = binop(e, "stablehlo.multiply", l, bcast(e, convert(e, arg(n, 2), ct), x.nd, x.sz));
    return loss_out(n, l, 3, outs);
  }
  return false;
}

/* x's entries at the class of each row's target: x [N, C], target [N] -> [N] */
static ref_t pick_class(em_t* e, ref_t x, ref_t hot) {
  int64_t cd = 1;
  return reduce(e, select3(e, hot, x, cst_like(e, x.dt, 0, x.nd, x.sz)), 1, &cd, "stablehlo.add", 0);
}

static bool lower_multi_margin_loss(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "multi_margin_loss") && tpu_dtype_is_float(odt) && is_number(n, 2) && is_number(n, 3)) {
    /* (self [N, C] or [C], target, p, margin, weight?, reduction): per row the sum over
     * classes j != y of max(0, margin - x[y] + x[j])^p (times weight[y]) over C */
    const tpu_tensor_t* xt = c->args[0].v.t;
    const double p = tpu_arg_f64(c, 2, 1), margin = tpu_arg_f64(c, 3, 1);
    if ((p != 1 && p != 2) || xt->ndim > 2) return false;
    const int64_t C = xt->ndim ? xt->sizes[xt->ndim - 1] : 1, N = xt->ndim == 2 ? xt->sizes[0] : 1;
    int64_t sz[2] = {N, C};
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = reshape(e, convert(e, arg(n, 0), ct), 2, sz);
    ref_t tgt = reshape(e, arg(n, 1), 1, &N);
    ref_t hot = one_hot(e, tgt, C, 1);
    ref_t xy = bcast_dims(e, pick_class(e, x, hot), 2, sz, (int64_t[]){0});
    ref_t z = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.subtract", x, -margin), unop(e, "stablehlo.negate", xy));
    z = binop(e, "stablehlo.maximum", z, cst_like(e, ct, 0, 2, sz));
    if (p == 2) z = binop(e, "stablehlo.multiply", z, z);
    z = select3(e, hot, cst_like(e, ct, 0, 2, sz), z);
    if (is_tensor(n, 4)) {
      ref_t w = bcast_dims(e, reshape(e, convert(e, arg(n, 4), ct), 1, &C), 2, sz, (int64_t[]){1});
      z = binop(e, "stablehlo.multiply", z, bcast_dims(e, pick_class(e, w, hot), 2, sz, (int64_t[]){0}));
    }
    int64_t cd = 1;
    ref_t l = scalar_op(e, "stablehlo.divide", reduce(e, z, 1, &cd, "stablehlo.add", 0), (double)C);
    return loss_out(n, l, 5, outs);
  }
  return false;
}

static bool lower_multilabel_margin_loss_forward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "multilabel_margin_loss_forward") && c->nouts == 2 && tpu_dtype_is_float(odt)) {
    /* (self [N, C] or [C], target (same shape), reduction) -> (loss, is_target): the
     * targets of a row are its entries before the first -1; per row the sum over
     * targets k and non-target classes j of max(0, 1 - x[y_k] + x[j]), over C */
    const tpu_tensor_t* xt = c->args[0].v.t;
    if (xt->ndim > 2) return false;
    const int64_t C = xt->ndim ? xt->sizes[xt->ndim - 1] : 1, N = xt->ndim == 2 ? xt->sizes[0] : 1;
    int64_t sz[2] = {N, C}, sz3[3] = {N, C, C}, one = 1;
    tpu_dtype_t ct = acc_type(xt->dtype);
    ref_t x = reshape(e, convert(e, arg(n, 0), ct), 2, sz);
    ref_t tgt = reshape(e, convert(e, arg(n, 1), TPU_I64), 2, sz);
    /* valid[n, k]: k before the row's first negative target */
    ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, sz), "iota_dimension = 1 : i64");
    ref_t neg = compare(e, "LT", tgt, cst_like(e, TPU_I64, 0, 2, sz));
    ref_t first = reduce_keep(e, select3(e, neg, pos, cst_like(e, TPU_I64, (double)C, 2, sz)), 1, &one,
                              "stablehlo.minimum", (double)C);
    ref_t valid = compare(e, "LT", pos, bcast(e, first, 2, sz));
    /* hot[n, k, j]: target k of row n is class j (and valid) */
    ref_t hot = binop(e, "stablehlo.and", one_hot(e, tgt, C, 2), bcast_dims(e, valid, 3, sz3, (int64_t[]){0, 1}));
    int64_t kd = 1, jd = 2;
    ref_t is_t = reduce(e, hot, 1, &kd, "stablehlo.or", 0); /* [N, C] */
    ref_t xb = bcast_dims(e, x, 3, sz3, (int64_t[]){0, 2});
    ref_t xy = reduce(e, select3(e, hot, xb, cst_like(e, ct, 0, 3, sz3)), 1, &jd, "stablehlo.add", 0); /* [N, K] */
    ref_t z = binop(e, "stablehlo.subtract", scalar_op(e, "stablehlo.add", xb, 1),
                    bcast_dims(e, xy, 3, sz3, (int64_t[]){0, 1}));
    z = binop(e, "stablehlo.maximum", z, cst_like(e, ct, 0, 3, sz3));
    ref_t use = binop(e, "stablehlo.and", bcast_dims(e, valid, 3, sz3, (int64_t[]){0, 1}),
                      unop(e, "stablehlo.not", bcast_dims(e, is_t, 3, sz3, (int64_t[]){0, 2})));
    z = select3(e, use, z, cst_like(e, ct, 0, 3, sz3));
    int64_t kj[2] = {1, 2};
    ref_t l = scalar_op(e, "stablehlo.divide", reduce(e, z, 2, kj, "stablehlo.add", 0), (double)C);
    const tpu_tensor_t* it = &c->outs[1];
    outs[1] = reshape(e, convert(e, is_t, it->dtype), it->ndim, it->sizes);
    return loss_out(n, l, 2, outs);
  }
  return false;
}

static bool lower_glu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "glu") && tpu_dtype_is_float(odt) && o->ndim > 0) { /* (self, dim): a * sigmoid(b) */
    const int dim = norm_dim(tpu_arg_i64(c, 1, -1), o->ndim);
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct);
    int64_t st[TPU_MAX_DIMS] = {0}, mid[TPU_MAX_DIMS], lim[TPU_MAX_DIMS];
    for (int d = 0; d < x.nd; d++) mid[d] = lim[d] = x.sz[d];
    mid[dim] = x.sz[dim] / 2;
    ref_t a = slice(e, x, st, mid);
    st[dim] = mid[dim];
    ref_t b = slice(e, x, st, lim);
    outs[0] = convert(e, binop(e, "stablehlo.multiply", a, unop(e, "stablehlo.logistic", b)), odt);
    return true;
  }
  return false;
}

static bool lower_threshold(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "threshold") || !strcmp(base, "softshrink") || !strcmp(base, "hardshrink") ||
       !strcmp(base, "_prelu_kernel")) &&
      is_tensor(n, 0) && (tpu_dtype_is_float(odt) || base[0] == 't')) {
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = arg_out(n, 0, ct), y;
    if (base[0] == 't') { /* (self, threshold, value): value where x <= threshold */
      ref_t le = compare(e, "LE", x, cst_like(e, ct, tpu_arg_f64(c, 1, 0), x.nd, x.sz));
      y = select3(e, le, cst_like(e, ct, tpu_arg_f64(c, 2, 0), x.nd, x.sz), x);
    } else if (base[0] == '_') { /* (self, weight): x > 0 ? x : weight * x */
      ref_t pos = compare(e, "GT", x, cst_like(e, ct, 0, x.nd, x.sz));
      y = select3(e, pos, x, binop(e, "stablehlo.multiply", arg_out(n, 1, ct), x));
    } else {
      const double l = tpu_arg_f64(c, 1, 0.5);
      ref_t hi = compare(e, "GT", x, cst_like(e, ct, l, x.nd, x.sz));
      ref_t lo = compare(e, "LT", x, cst_like(e, ct, -l, x.nd, x.sz));
      if (base[0] == 's') /* x - l above l, x + l below -l, else x * 0 (keeps NaN) */
        y = select3(e, hi, scalar_op(e, "stablehlo.subtract", x, l),
                    select3(e, lo, scalar_op(e, "stablehlo.add", x, l), scalar_op(e, "stablehlo.multiply", x, 0)));
      else /* hardshrink: 0 inside [-l, l] */
        y = select3(e, binop(e, "stablehlo.or", hi, lo), x,
                    select3(e, compare(e, "NE", x, x), x, cst_like(e, ct, 0, x.nd, x.sz)));
    }
    outs[0] = convert(e, y, odt);
    return true;
  }
  return false;
}

static bool lower_upsample_nearest2d(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool exact = base[0] == '_';
  const int k = base[strlen(base) - 2] - '0';
  if ((!strcmp(base, "upsample_nearest1d") || !strcmp(base, "upsample_nearest2d") ||
       !strcmp(base, "upsample_nearest3d") || !strcmp(base, "_upsample_nearest_exact1d") ||
       !strcmp(base, "_upsample_nearest_exact2d") || !strcmp(base, "_upsample_nearest_exact3d")) &&
      strcmp(ovl, "vec") && c->nouts == 1 && is_tensor(n, 0) && c->args[0].v.t->ndim >= k) {
    /* (self, output_size, scales per dim?): per spatial dim, source = min(floor(dst * scale),
     * in - 1) (exact: floor((dst + 0.5) * scale)), scale = 1 / scales when given, else
     * in / out, in float32 as PyTorch; plain nearest copies when out is in or twice in */
    const tpu_tensor_t* x = c->args[0].v.t;
    ref_t a = arg(n, 0);
    for (int j = 0; j < k; j++) {
      const int d = x->ndim - k + j;
      const int64_t in = x->sizes[d], out = o->sizes[d];
      const bool given = c->nargs > 2 + j && is_number(n, 2 + j) && tpu_arg_f64(c, 2 + j, 0) > 0;
      const float scale = given ? (float)(1.0 / tpu_arg_f64(c, 2 + j, 1)) : (float)in / (float)out;
      if (!exact && out == in) continue;
      int64_t* src = malloc(sizeof(int64_t) * (size_t)(out ? out : 1));
      if (!src) {
        e->oom = true;
        return false;
      }
      for (int64_t i = 0; i < out; i++) {
        int64_t s0 = exact ? (int64_t)floorf((float)(((double)i + 0.5) * scale))
                     : out == 2 * in ? i >> 1
                                     : (int64_t)floorf((float)i * scale);
        src[i] = s0 < in - 1 ? s0 : in - 1;
      }
      a = take_along(e, a, d, cst_i64_list(e, out, src));
      free(src);
    }
    outs[0] = a;
    return true;
  }
  return false;
}

static bool lower_native_group_norm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_upsample_bilinear2d(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const int k = base[strlen(base) - 2] - '0';
  if ((!strcmp(base, "upsample_linear1d") || !strcmp(base, "upsample_bilinear2d") ||
       !strcmp(base, "upsample_trilinear3d")) &&
      c->nouts == 1 && is_tensor(n, 0) && tpu_dtype_is_float(odt) && c->args[1].kind == TPU_ARG_INTLIST &&
      c->args[0].v.t->ndim >= k) {
    /* (self, output_size, align_corners, scales per dim?): per spatial dim, the two
     * source rows and the weight of the second, computed in float32 like PyTorch */
    const tpu_tensor_t* x = c->args[0].v.t;
    const bool corners = tpu_arg_bool(c, 2, false);
    tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, 0), ct);
    for (int j = 0; j < k; j++) {
      const int d = x->ndim - k + j;
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
  return false;
}

static bool lower_log_sigmoid_forward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

/* a padded with v: lo[d] / hi[d] cells before / after each dim */
static ref_t pad_edges(em_t* e, ref_t a, double v, const int64_t* lo, const int64_t* hi) {
  ref_t pin[2] = {a, cst(e, a.dt, v)}, r = a;
  int64_t in[TPU_MAX_DIMS] = {0};
  for (int d = 0; d < a.nd; d++) r.sz[d] = a.sz[d] + lo[d] + hi[d];
  r = mkref(a.dt, a.nd, r.sz);
  char bl[600], bh[600], bi[600];
  return emit(e, "stablehlo.pad", 2, pin, r, "edge_padding_low = %s, edge_padding_high = %s, interior_padding = %s",
              i64arr(bl, sizeof bl, a.nd, lo), i64arr(bh, sizeof bh, a.nd, hi), i64arr(bi, sizeof bi, a.nd, in));
}

static bool lower_im2col(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "im2col") && is_tensor(n, 0) && (c->args[0].v.t->ndim == 3 || c->args[0].v.t->ndim == 4)) {
    /* (self [N,] C, H, W, kernel, dilation, padding, stride) -> [N,] C * kh * kw, L: row
     * (c, i, j) holds the padded input at (oh * sh + i * dh, ow * sw + j * dw) */
    ref_t x = arg(n, 0);
    const int nd = x.nd;
    int64_t kk[2], dl[2], pd[2], st[2], osz[2], lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS] = {0};
    int64_t* v[4] = {kk, dl, pd, st};
    for (int a = 0; a < 4; a++) {
      const tpu_arg_t* l = &c->args[1 + a];
      if (l->kind != TPU_ARG_INTLIST || l->n < 1) return false;
      for (int j = 0; j < 2; j++) v[a][j] = l->v.ilist[l->n == 1 ? 0 : j];
    }
    for (int j = 0; j < 2; j++) {
      lo[nd - 2 + j] = hi[nd - 2 + j] = pd[j];
      osz[j] = (x.sz[nd - 2 + j] + 2 * pd[j] - dl[j] * (kk[j] - 1) - 1) / st[j] + 1;
      if (osz[j] <= 0) return false;
    }
    ref_t p = pad_edges(e, x, 0, lo, hi);
    const int nk = (int)(kk[0] * kk[1]);
    ref_t* parts = malloc(sizeof(ref_t) * (size_t)nk);
    if (!parts) {
      e->oom = true;
      return false;
    }
    int64_t one[TPU_MAX_DIMS + 1];
    for (int d = 0; d < nd - 2; d++) one[d] = x.sz[d];
    one[nd - 2] = 1;
    one[nd - 1] = osz[0];
    one[nd] = osz[1];
    for (int i = 0; i < kk[0]; i++)
      for (int j = 0; j < kk[1]; j++) {
        int64_t s0[TPU_MAX_DIMS] = {0}, lim[TPU_MAX_DIMS], str[TPU_MAX_DIMS];
        for (int d = 0; d < nd; d++) {
          lim[d] = p.sz[d];
          str[d] = 1;
        }
        s0[nd - 2] = i * dl[0];
        s0[nd - 1] = j * dl[1];
        for (int q = 0; q < 2; q++) {
          lim[nd - 2 + q] = s0[nd - 2 + q] + (osz[q] - 1) * st[q] + 1;
          str[nd - 2 + q] = st[q];
        }
        ref_t r = mkref(x.dt, nd, x.sz);
        r.sz[nd - 2] = osz[0];
        r.sz[nd - 1] = osz[1];
        char b1[600], b2[600], b3[600];
        ref_t sl = emit(e, "stablehlo.slice", 1, &p, r, "start_indices = %s, limit_indices = %s, strides = %s",
                        i64arr(b1, sizeof b1, nd, s0), i64arr(b2, sizeof b2, nd, lim), i64arr(b3, sizeof b3, nd, str));
        parts[i * kk[1] + j] = reshape(e, sl, nd + 1, one);
      }
    one[nd - 2] = nk;
    ref_t cat = nk == 1 ? parts[0] : emit(e, "stablehlo.concatenate", nk, parts, mkref(x.dt, nd + 1, one), "dimension = %d : i64", nd - 2);
    free(parts);
    outs[0] = reshape(e, cat, o->ndim, o->sizes);
    return true;
  }
  return false;
}

/* The window of adaptive pooling over the last k dims when each input size is a
 * multiple of the output's (window = stride = in / out); false otherwise. */
static bool adaptive_window(const tpu_tensor_t* x, int k, const tpu_tensor_t* out, window_t* w) {
  for (int d = 0; d < x->ndim; d++) {
    w->win[d] = w->str[d] = w->dil[d] = 1;
    w->lo[d] = w->hi[d] = 0;
    if (d < x->ndim - k) continue;
    const int64_t in = x->sizes[d], o = out->sizes[d];
    if (o <= 0 || in % o) return false;
    w->win[d] = w->str[d] = in / o;
  }
  return true;
}

/* Adaptive pooling along dim d of a (in -> out cells) for any sizes: cell i covers
 * [floor(i in / out), ceil((i + 1) in / out)); gathers its taps into a new dim
 * d + 1 of the widest cell's length, the taps past a cell's end repeating its
 * last element. *valid: [out, taps], whether a tap is the cell's own; lens [out]
 * (float32): the cells' lengths. */
static ref_t adaptive_taps(em_t* e, ref_t a, int d, int64_t out, ref_t* valid, ref_t* lens) {
  const int64_t in = a.sz[d];
  int64_t taps = 0;
  for (int64_t i = 0; i < out; i++) {
    int64_t lo = i * in / out, hi = ((i + 1) * in + out - 1) / out;
    if (hi - lo > taps) taps = hi - lo;
  }
  int64_t* idx = malloc(sizeof(int64_t) * 2 * (size_t)(out * taps));
  float* len = malloc(sizeof(float) * (size_t)out);
  if (!idx || !len) {
    free(idx);
    free(len);
    e->oom = true;
    return a;
  }
  int64_t* ok = idx + out * taps;
  for (int64_t i = 0; i < out; i++) {
    int64_t lo = i * in / out, hi = ((i + 1) * in + out - 1) / out;
    len[i] = (float)(hi - lo);
    for (int64_t j = 0; j < taps; j++) {
      idx[i * taps + j] = lo + j < hi ? lo + j : hi - 1;
      ok[i * taps + j] = lo + j < hi;
    }
  }
  ref_t g = take_along(e, a, d, cst_i64_list(e, out * taps, idx));
  int64_t sz[TPU_MAX_DIMS + 1], vsz[2] = {out, taps};
  for (int k = 0, m = 0; k < a.nd; k++) {
    if (k == d) {
      sz[m++] = out;
      sz[m++] = taps;
    } else {
      sz[m++] = a.sz[k];
    }
  }
  g = reshape(e, g, a.nd + 1, sz);
  if (valid) {
    ref_t v = reshape(e, cst_i64_list(e, out * taps, ok), 2, vsz);
    *valid = compare(e, "NE", v, cst_like(e, TPU_I64, 0, 2, vsz));
  }
  if (lens) *lens = cst_f32_list(e, out, len);
  free(idx);
  free(len);
  return g;
}

/* Adaptive average (outs[0]) or max pooling (outs[0], outs[1]: the flat index
 * over the last k dims) whatever the sizes: the taps of every spatial dim
 * gathered (last dim first, so that the dims before keep their places), then one
 * reduction over the tap dims: a sum of the cells' own taps over the cells'
 * areas, or the (value, index) pair order of max pooling. */
static void adaptive_pool(node_t* n, int k, bool mx, ref_t* outs) {
  LOWER_LOCALS;
  if (!tpu_tensor_numel(o)) { /* an empty batch */
    for (int i = 0; i < c->nouts; i++) outs[i] = cst_like(e, c->outs[i].dtype, 0, c->outs[i].ndim, c->outs[i].sizes);
    return;
  }
  tpu_dtype_t ct = mx ? odt : acc_type(odt);
  ref_t x = convert(e, arg(n, 0), ct), idx = x;
  const int nd = x.nd, b0 = nd - k;
  if (mx) {
    idx = cst_like(e, TPU_I64, 0, nd, x.sz);
    for (int d = b0; d < nd; d++) {
      ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, x.sz), "iota_dimension = %d : i64", d);
      idx = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", idx, (double)x.sz[d]), pos);
    }
  }
  ref_t valid[3], lens[3];
  int64_t td[3];
  for (int j = k - 1; j >= 0; j--) {
    const int d = b0 + j;
    x = adaptive_taps(e, x, d, o->sizes[d], &valid[j], &lens[j]);
    if (mx) idx = adaptive_taps(e, idx, d, o->sizes[d], NULL, NULL);
    td[j] = b0 + 2 * j + 1;
  }
  if (mx) {
    ref_t pair[2] = {x, idx};
    ref_t init[2] = {cst(e, ct, tpu_dtype_is_float(ct) ? -INFINITY : (double)INT64_MIN),
                     cst(e, TPU_I64, 4611686018427387904.0)}, r[2];
    reduce_pair(e, pair, init, k, td, max_pool_body, r);
    outs[0] = r[0];
    outs[1] = convert(e, r[1], c->outs[1].dtype);
    return;
  }
  ref_t cnt = cst_like(e, ct, 1, nd, o->sizes);
  for (int j = 0; j < k; j++) {
    int64_t vd[2] = {td[j] - 1, td[j]}, dd = b0 + j;
    x = select3(e, bcast_dims(e, valid[j], x.nd, x.sz, vd), x, cst_like(e, ct, 0, x.nd, x.sz));
    cnt = binop(e, "stablehlo.multiply", cnt, bcast_dims(e, convert(e, lens[j], ct), nd, o->sizes, &dd));
  }
  x = reduce(e, x, k, td, "stablehlo.add", 0);
  outs[0] = convert(e, binop(e, "stablehlo.divide", x, cnt), odt);
}

static bool lower_avg_pool2d(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool adaptive = base[0] == '_';
  const int k = base[strlen(base) - 2] - '0';
  if ((!strcmp(base, "avg_pool2d") || !strcmp(base, "avg_pool3d") || !strcmp(base, "_adaptive_avg_pool2d") ||
       !strcmp(base, "_adaptive_avg_pool3d")) &&
      tpu_dtype_is_float(odt) && c->nouts == 1 && is_tensor(n, 0)) {
    /* (self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
     * adaptive (self, output_size) */
    window_t w;
    if (adaptive && !adaptive_window(c->args[0].v.t, k, o, &w)) {
      if (tpu_tensor_numel(o) && !tpu_tensor_numel(c->args[0].v.t)) return false;
      adaptive_pool(n, k, false, outs);
      return true;
    }
    if (!adaptive) pool_window(c, k, 1, 2, 3, -1, o, &w);
    tpu_dtype_t ct = acc_type(odt);
    ref_t x = convert(e, arg(n, 0), ct), zero = cst(e, ct, 0), sum;
    reduce_window_n(e, 1, &x, &zero, &w, sum_body, &sum);
    ref_t y;
    const int nd = x.nd;
    if (adaptive) {
      double cnt = 1;
      for (int j = 0; j < k; j++) cnt *= (double)w.win[nd - k + j];
      y = scalar_op(e, "stablehlo.divide", sum, cnt);
    } else if (c->nargs > 6 && is_number(n, 6)) {
      y = scalar_op(e, "stablehlo.divide", sum, tpu_arg_f64(c, 6, 1));
    } else {
      /* divisor per window: its cells inside the input, plus the explicit
       * padding with count_include_pad (never ceil mode's overhang): a window
       * sum over ones padded with ones, then with zeros */
      const bool incl = tpu_arg_bool(c, 5, true);
      ref_t ones = cst_like(e, ct, 1, k, x.sz + nd - k);
      window_t w2 = w;
      int64_t lo[3], hi[3];
      for (int j = 0; j < k; j++) {
        int d = nd - k + j;
        int64_t pad = c->args[3].n ? c->args[3].v.ilist[c->args[3].n == 1 ? 0 : j] : 0;
        lo[j] = hi[j] = incl ? pad : 0;
        w2.win[j] = w.win[d];
        w2.str[j] = w.str[d];
        w2.dil[j] = 1;
        w2.lo[j] = w.lo[d] - lo[j];
        w2.hi[j] = w.hi[d] - hi[j];
      }
      if (incl) ones = pad_edges(e, ones, 1, lo, hi);
      ref_t cnt, z2 = cst(e, ct, 0);
      reduce_window_n(e, 1, &ones, &z2, &w2, sum_body, &cnt);
      y = binop(e, "stablehlo.divide", sum, bcast(e, cnt, sum.nd, sum.sz));
    }
    outs[0] = convert(e, y, odt);
    return true;
  }
  return false;
}

static bool lower_max_pool2d_with_indices(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool adaptive = base[0] == 'a';
  const int k = adaptive ? base[strlen(base) - 2] - '0' : base[8] - '0';
  if ((!strcmp(base, "max_pool2d_with_indices") || !strcmp(base, "max_pool3d_with_indices") ||
       !strcmp(base, "adaptive_max_pool2d") || !strcmp(base, "adaptive_max_pool3d")) &&
      c->nouts == 2 && is_tensor(n, 0) && (tpu_dtype_is_float(odt) || odt == TPU_I64 || odt == TPU_I32)) {
    /* (self, kernel, stride, padding, dilation, ceil_mode) or adaptive (self, output_size)
     * -> (out, flat index over the last k dims) */
    window_t w;
    if (adaptive && !adaptive_window(c->args[0].v.t, k, o, &w)) {
      if (tpu_tensor_numel(o) && !tpu_tensor_numel(c->args[0].v.t)) return false;
      adaptive_pool(n, k, true, outs);
      return true;
    }
    if (!adaptive) pool_window(c, k, 1, 2, 3, 4, o, &w);
    ref_t x = arg(n, 0);
    const int nd = x.nd;
    ref_t idx = cst_like(e, TPU_I64, 0, nd, x.sz);
    for (int d = nd - k; d < nd; d++) {
      ref_t pos = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, x.sz), "iota_dimension = %d : i64", d);
      idx = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", idx, (double)x.sz[d]), pos);
    }
    ref_t a[2] = {x, idx};
    /* (an index init above every position: INT64_MAX does not survive a double) */
    ref_t init[2] = {cst(e, x.dt, tpu_dtype_is_float(x.dt) ? -INFINITY : (double)INT64_MIN),
                     cst(e, TPU_I64, 4611686018427387904.0)};
    ref_t r[2];
    reduce_window_n(e, 2, a, init, &w, max_pool_body, r);
    outs[0] = r[0];
    outs[1] = convert(e, r[1], c->outs[1].dtype);
    return true;
  }
  return false;
}

/* grid_sampler_2d(input [N, C, H, W], grid [N, Ho, Wo, 2], interpolation,
 * padding, align_corners) for bilinear (0) and nearest (1) interpolation with
 * zeros (0) or border (1) padding, in the element type as CPU computes it:
 * the corners are gathered from input as [N, H*W, C] rows; a corner outside
 * the image counts as 0. */
static ref_t gs_gather(em_t* e, ref_t rows, ref_t ix, ref_t iy, ref_t w, int64_t H, int64_t W) {
  /* ix, iy, w: [N, P, 1] (float); rows [N, H*W, C] -> w * rows[n, iy*W + ix] (0 outside) */
  const tpu_dtype_t dt = rows.dt;
  ref_t inside = binop(e, "stablehlo.and",
                       binop(e, "stablehlo.and", compare(e, "GE", ix, cst_like(e, dt, 0, ix.nd, ix.sz)),
                             compare(e, "LE", ix, cst_like(e, dt, (double)(W - 1), ix.nd, ix.sz))),
                       binop(e, "stablehlo.and", compare(e, "GE", iy, cst_like(e, dt, 0, iy.nd, iy.sz)),
                             compare(e, "LE", iy, cst_like(e, dt, (double)(H - 1), iy.nd, iy.sz))));
  ref_t cx = emit(e, "stablehlo.clamp", 3, (ref_t[]){cst_like(e, dt, 0, ix.nd, ix.sz), ix, cst_like(e, dt, (double)(W - 1), ix.nd, ix.sz)}, ix, NULL);
  ref_t cy = emit(e, "stablehlo.clamp", 3, (ref_t[]){cst_like(e, dt, 0, iy.nd, iy.sz), iy, cst_like(e, dt, (double)(H - 1), iy.nd, iy.sz)}, iy, NULL);
  ref_t flat = binop(e, "stablehlo.add", scalar_op(e, "stablehlo.multiply", convert(e, cy, TPU_I64), (double)W), convert(e, cx, TPU_I64));
  ref_t nidx = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 3, flat.sz), "iota_dimension = 0 : i64");
  int64_t isz[3] = {flat.sz[0], flat.sz[1], 2};
  ref_t parts[2] = {nidx, flat};
  ref_t idx = emit(e, "stablehlo.concatenate", 2, parts, mkref(TPU_I64, 3, isz), "dimension = 2 : i64");
  const int64_t C = rows.sz[2];
  int64_t gsz[3] = {flat.sz[0], flat.sz[1], C};
  ref_t in[2] = {rows, idx};
  ref_t g = emit(e, "stablehlo.gather", 2, in, mkref(dt, 3, gsz),
                 "dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0, 1], "
                 "start_index_map = [0, 1], index_vector_dim = 2>, slice_sizes = array<i64: 1, 1, %" PRId64 ">, "
                 "indices_are_sorted = false", C);
  ref_t wm = select3(e, inside, w, cst_like(e, dt, 0, w.nd, w.sz));
  return binop(e, "stablehlo.multiply", g, bcast(e, wm, 3, gsz));
}

static bool lower_grid_sampler_2d(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!is_tensor(n, 0) || !is_tensor(n, 1) || (odt != TPU_F32 && odt != TPU_F64)) return false;
  const tpu_tensor_t* x = c->args[0].v.t;
  const tpu_tensor_t* gt = c->args[1].v.t;
  const int64_t mode = tpu_arg_i64(c, 2, 0), pad = tpu_arg_i64(c, 3, 0);
  const bool align = tpu_arg_bool(c, 4, false);
  if (x->ndim != 4 || gt->ndim != 4 || gt->sizes[3] != 2 || mode > 1 || pad > 1 || o->ndim != 4) return false;
  const int64_t N = x->sizes[0], C = x->sizes[1], H = x->sizes[2], W = x->sizes[3], Ho = gt->sizes[1], Wo = gt->sizes[2];
  if (tpu_tensor_numel(o) == 0 || H == 0 || W == 0) {
    outs[0] = cst_like(e, odt, 0, 4, o->sizes);
    return true;
  }
  const int64_t P = Ho * Wo;
  ref_t rows = reshape(e, transpose(e, convert(e, arg(n, 0), odt), (int64_t[]){0, 2, 3, 1}), 3, (int64_t[]){N, H * W, C});
  ref_t g = reshape(e, convert(e, arg(n, 1), odt), 3, (int64_t[]){N, P, 2});
  ref_t gx = slice(e, g, (int64_t[]){0, 0, 0}, (int64_t[]){N, P, 1});
  ref_t gy = slice(e, g, (int64_t[]){0, 0, 1}, (int64_t[]){N, P, 2});
  ref_t crd[2] = {gx, gy};
  const int64_t size[2] = {W, H};
  for (int k = 0; k < 2; k++) { /* unnormalize, then clip for border padding */
    ref_t v = crd[k];
    if (align) v = scalar_op(e, "stablehlo.multiply", scalar_op(e, "stablehlo.divide", scalar_op(e, "stablehlo.add", v, 1), 2), (double)(size[k] - 1));
    else v = scalar_op(e, "stablehlo.divide", scalar_op(e, "stablehlo.subtract", scalar_op(e, "stablehlo.multiply", scalar_op(e, "stablehlo.add", v, 1), (double)size[k]), 1), 2);
    if (pad == 1)
      v = emit(e, "stablehlo.clamp", 3, (ref_t[]){cst_like(e, odt, 0, v.nd, v.sz), v, cst_like(e, odt, (double)(size[k] - 1), v.nd, v.sz)}, v, NULL);
    crd[k] = v;
  }
  ref_t ix = crd[0], iy = crd[1], r;
  if (mode == 1) { /* nearest: round half to even */
    r = gs_gather(e, rows, unop(e, "stablehlo.round_nearest_even", ix), unop(e, "stablehlo.round_nearest_even", iy),
                  cst_like(e, odt, 1, ix.nd, ix.sz), H, W);
  } else {
    ref_t x0 = unop(e, "stablehlo.floor", ix), y0 = unop(e, "stablehlo.floor", iy);
    ref_t x1 = scalar_op(e, "stablehlo.add", x0, 1), y1 = scalar_op(e, "stablehlo.add", y0, 1);
    ref_t dxr = binop(e, "stablehlo.subtract", x1, ix), dxl = binop(e, "stablehlo.subtract", ix, x0);
    ref_t dyb = binop(e, "stablehlo.subtract", y1, iy), dyt = binop(e, "stablehlo.subtract", iy, y0);
    r = gs_gather(e, rows, x0, y0, binop(e, "stablehlo.multiply", dxr, dyb), H, W);
    r = binop(e, "stablehlo.add", r, gs_gather(e, rows, x1, y0, binop(e, "stablehlo.multiply", dxl, dyb), H, W));
    r = binop(e, "stablehlo.add", r, gs_gather(e, rows, x0, y1, binop(e, "stablehlo.multiply", dxr, dyt), H, W));
    r = binop(e, "stablehlo.add", r, gs_gather(e, rows, x1, y1, binop(e, "stablehlo.multiply", dxl, dyt), H, W));
  }
  outs[0] = transpose(e, reshape(e, r, 4, (int64_t[]){N, Ho, Wo, C}), (int64_t[]){0, 3, 1, 2});
  return true;
}

static bool lower_native_batch_norm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  /* native_batch_norm and _native_batch_norm_legit: (input, weight?, bias?,
   * running_mean?, running_var?, training, momentum, eps); _native_batch_norm_legit.no_stats:
   * (input, weight?, bias?, training, momentum, eps); _batch_norm_with_update: (input,
   * weight?, bias?, running_mean, running_var, momentum, eps), training, with a fourth
   * (empty) reserve output. -> (out, save_mean, save_invstd[, reserve]); training updates
   * the running stats */
  const bool legit = !strcmp(base, "_native_batch_norm_legit"), upd4 = !strcmp(base, "_batch_norm_with_update");
  if ((!strcmp(base, "native_batch_norm") || legit || upd4) && c->nouts == 3 + upd4 && tpu_dtype_is_float(odt)) {
    const bool no_stats = legit && c->nargs == 6 && c->args[3].kind == TPU_ARG_BOOL;
    const int it = no_stats ? 3 : 5; /* where training (or for upd4, momentum) is */
    const bool training = upd4 || tpu_arg_bool(c, it, false);
    const double momentum = tpu_arg_f64(c, upd4 ? 5 : it + 1, 0.1), eps = tpu_arg_f64(c, upd4 ? 6 : it + 2, 1e-5);
    const bool has_rs = !no_stats && is_tensor(n, 3) && is_tensor(n, 4);
    if (upd4) outs[3] = cst_like(e, c->outs[3].dtype, 0, c->outs[3].ndim, c->outs[3].sizes);
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
  return false;
}

static bool lower_gelu_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "gelu_backward") && tpu_dtype_is_float(odt)) { /* (grad, self, approximate) */
    tpu_dtype_t ct = acc_type(odt);
    ref_t g = gelu_grad(e, arg_out(n, 1, ct), tpu_arg_str(c, 2, "none"));
    outs[0] = convert(e, binop(e, "stablehlo.multiply", arg_out(n, 0, ct), g), odt);
    return true;
  }
  return false;
}

static bool lower_tanh_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "tanh_backward") || !strcmp(base, "sigmoid_backward")) { /* (grad, output) */
    ref_t g = arg_out(n, 0, odt), y = arg_out(n, 1, odt);
    ref_t one_m = binop(e, "stablehlo.subtract", cst_like(e, odt, 1, y.nd, y.sz), base[0] == 't' ? binop(e, "stablehlo.multiply", y, y) : y);
    ref_t d = base[0] == 't' ? one_m : binop(e, "stablehlo.multiply", y, one_m);
    outs[0] = binop(e, "stablehlo.multiply", g, d);
    return true;
  }
  return false;
}

/* The gradients of the activations hardtanh (zero where self lies outside
 * (min, max)), leaky_relu (scaled by the slope where self is not positive) and
 * silu (s * (1 + x * (1 - s)), s = sigmoid(x)), in float32 for 16-bit floats. */
static bool lower_act_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!tpu_dtype_is_float(odt) || !is_tensor(n, 0) || !is_tensor(n, 1)) return false;
  tpu_dtype_t ct = acc_type(odt);
  ref_t g = arg_out(n, 0, ct), x = arg_out(n, 1, ct), r;
  if (!strcmp(base, "hardtanh_backward")) { /* (grad, self, min_val, max_val) */
    ref_t out = binop(e, "stablehlo.or", compare(e, "LE", x, cst_like(e, ct, tpu_arg_f64(c, 2, -1), x.nd, x.sz)),
                      compare(e, "GE", x, cst_like(e, ct, tpu_arg_f64(c, 3, 1), x.nd, x.sz)));
    r = select3(e, out, cst_like(e, ct, 0, g.nd, g.sz), g);
  } else if (!strcmp(base, "leaky_relu_backward")) { /* (grad, self, negative_slope, self_is_result) */
    ref_t pos = compare(e, "GT", x, cst_like(e, ct, 0, x.nd, x.sz));
    r = select3(e, pos, g, scalar_op(e, "stablehlo.multiply", g, tpu_arg_f64(c, 2, 0.01)));
  } else { /* silu_backward (grad, self) */
    ref_t sg = unop(e, "stablehlo.logistic", x);
    ref_t one_m = binop(e, "stablehlo.subtract", cst_like(e, ct, 1, x.nd, x.sz), sg);
    ref_t d = binop(e, "stablehlo.multiply", sg,
                    scalar_op(e, "stablehlo.add", binop(e, "stablehlo.multiply", x, one_m), 1));
    r = binop(e, "stablehlo.multiply", g, d);
  }
  outs[0] = convert(e, r, odt);
  return true;
}

static bool lower_threshold_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "threshold_backward")) { /* (grad, self, threshold): grad where self > threshold */
    ref_t g = arg_out(n, 0, odt);
    tpu_dtype_t st = c->args[1].v.t->dtype;
    ref_t x = arg_out(n, 1, st);
    ref_t keep = compare(e, "GT", x, cst_like(e, st, tpu_arg_f64(c, 2, 0), x.nd, x.sz));
    outs[0] = select3(e, keep, g, cst_like(e, odt, 0, g.nd, g.sz));
    return true;
  }
  return false;
}

static bool lower_softmax_backward_data(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

static bool lower_nll_loss_forward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "nll_loss_forward") || !strcmp(base, "nll_loss_backward") || !strcmp(base, "nll_loss2d_forward") ||
       !strcmp(base, "nll_loss2d_backward")) &&
      is_tensor(n, 0)) {
    /* forward (self, target, weight?, reduction, ignore_index) -> (output, total_weight);
     * backward (grad_output, self, target, weight?, reduction, ignore_index, total_weight);
     * self [C], [N, C] or (2d) [N, C, H, W], the classes along dim 1 */
    const bool two = base[8] == '2';
    const bool bwd = base[two ? 11 : 9] == 'b';
    const int xi = bwd ? 1 : 0;
    const tpu_tensor_t* x = c->args[xi].v.t;
    if (x->ndim < 1 || x->ndim > (two ? 4 : 2) || (two && x->ndim != 4) || !tpu_dtype_is_float(x->dtype)) return false;
    const int cdim = x->ndim > 1 ? 1 : 0;
    const int64_t C = x->sizes[cdim];
    const int64_t reduction = tpu_arg_i64(c, xi + 3, 1);
    const int64_t ignore = tpu_arg_i64(c, xi + 4, -100);
    tpu_dtype_t ct = x->dtype;
    ref_t tgt = arg(n, xi + 1);
    ref_t hot = one_hot(e, tgt, C, cdim); /* x's shape */
    ref_t valid = compare(e, "NE", tgt, cst_like(e, tgt.dt, (double)ignore, tgt.nd, tgt.sz));
    /* a target other than ignore_index outside [0, C) is CPU's IndexError */
    check_range(e, select3(e, valid, tgt, cst_like(e, tgt.dt, 0, tgt.nd, tgt.sz)), 0, C, cdim, true);
    ref_t w = convert(e, valid, ct); /* per sample: weight[target] if not ignored */
    if (is_tensor(n, xi + 2)) {
      int64_t cd = cdim, cn = C;
      ref_t wt = bcast_dims(e, reshape(e, convert(e, arg(n, xi + 2), ct), 1, &cn), x->ndim, x->sizes, &cd);
      ref_t zero = cst_like(e, ct, 0, x->ndim, x->sizes);
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
      /* CPU leaves total_weight 0 for reduction none over a batch */
      if (c->nouts > 1) outs[1] = reduction == 0 && x->ndim > 1 ? cst_like(e, ct, 0, 0, NULL) : total;
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
  return false;
}

static bool lower_embedding_dense_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "embedding_dense_backward") && is_tensor(n, 1)) {
    /* (grad_output [..., E], indices [...], num_weights, padding_idx, scale_grad): the
     * one-hot of the indices, transposed, times the gradient rows */
    const tpu_tensor_t* gt = c->args[0].v.t;
    if (gt->ndim < 1) return false;
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
    if (tpu_arg_bool(c, 4, false)) { /* scale_grad_by_freq: each row over its index's count */
      ref_t cnt = reduce_keep(e, convert(e, one_hot(e, idx, V, 1), g.dt), 1, (int64_t[]){0}, "stablehlo.add", 0);
      h = binop(e, "stablehlo.divide", h, bcast(e, binop(e, "stablehlo.maximum", cnt, cst_like(e, g.dt, 1, 2, cnt.sz)), 2, h.sz));
    }
    ref_t hT = transpose(e, h, (int64_t[]){1, 0});
    outs[0] = convert(e, dot_general(e, hT, g, 0, 1, 0, mkref(g.dt, 2, (int64_t[]){V, E}), TPU_PRECISION_HIGHEST), odt);
    return true;
  }
  return false;
}

static bool lower_native_layer_norm_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
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
  return false;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_adaptive_avg_pool2d", lower_avg_pool2d},
    {"_adaptive_avg_pool3d", lower_avg_pool2d},
    {"_batch_norm_with_update", lower_native_batch_norm},
    {"_log_softmax", lower_softmax},
    {"_log_softmax_backward_data", lower_softmax_backward_data},
    {"_native_batch_norm_legit", lower_native_batch_norm},
    {"_prelu_kernel", lower_threshold},
    {"_softmax", lower_softmax},
    {"_softmax_backward_data", lower_softmax_backward_data},
    {"_upsample_nearest_exact1d", lower_upsample_nearest2d},
    {"_upsample_nearest_exact2d", lower_upsample_nearest2d},
    {"_upsample_nearest_exact3d", lower_upsample_nearest2d},
    {"adaptive_max_pool2d", lower_max_pool2d_with_indices},
    {"adaptive_max_pool3d", lower_max_pool2d_with_indices},
    {"avg_pool2d", lower_avg_pool2d},
    {"avg_pool3d", lower_avg_pool2d},
    {"binary_cross_entropy", lower_binary_cross_entropy},
    {"elu", lower_leaky_relu},
    {"embedding_dense_backward", lower_embedding_dense_backward},
    {"gelu_backward", lower_gelu_backward},
    {"glu", lower_glu},
    {"grid_sampler_2d", lower_grid_sampler_2d},
    {"hardshrink", lower_threshold},
    {"hardsigmoid", lower_leaky_relu},
    {"hardswish", lower_leaky_relu},
    {"hardtanh", lower_leaky_relu},
    {"hardtanh_backward", lower_act_backward},
    {"huber_loss", lower_mse_loss},
    {"im2col", lower_im2col},
    {"leaky_relu", lower_leaky_relu},
    {"leaky_relu_backward", lower_act_backward},
    {"log_sigmoid_forward", lower_log_sigmoid_forward},
    {"max_pool2d_with_indices", lower_max_pool2d_with_indices},
    {"max_pool3d_with_indices", lower_max_pool2d_with_indices},
    {"mish", lower_leaky_relu},
    {"mse_loss", lower_mse_loss},
    {"multi_margin_loss", lower_multi_margin_loss},
    {"multilabel_margin_loss_forward", lower_multilabel_margin_loss_forward},
    {"native_batch_norm", lower_native_batch_norm},
    {"native_group_norm", lower_native_group_norm},
    {"native_layer_norm", lower_native_layer_norm},
    {"native_layer_norm_backward", lower_native_layer_norm_backward},
    {"nll_loss2d_backward", lower_nll_loss_forward},
    {"nll_loss2d_forward", lower_nll_loss_forward},
    {"nll_loss_backward", lower_nll_loss_forward},
    {"nll_loss_forward", lower_nll_loss_forward},
    {"relu6", lower_leaky_relu},
    {"sigmoid_backward", lower_tanh_backward},
    {"silu_backward", lower_act_backward},
    {"smooth_l1_loss", lower_mse_loss},
    {"softplus", lower_leaky_relu},
    {"softshrink", lower_threshold},
    {"tanh_backward", lower_tanh_backward},
    {"threshold", lower_threshold},
    {"threshold_backward", lower_threshold_backward},
    {"upsample_bilinear2d", lower_upsample_bilinear2d},
    {"upsample_linear1d", lower_upsample_bilinear2d},
    {"upsample_nearest1d", lower_upsample_nearest2d},
    {"upsample_nearest2d", lower_upsample_nearest2d},
    {"upsample_nearest3d", lower_upsample_nearest2d},
    {"upsample_trilinear3d", lower_upsample_bilinear2d},
};

const tpu_lower_table_t tpu_lower_nn = {k_entries, sizeof k_entries / sizeof k_entries[0]};
