/* Elementwise lowerings: unary and binary maps, comparisons, arithmetic with
 * scalars (alpha, rounding modes), logical ops, where/masked_fill, clamps and the
 * elementwise activations that are one formula (relu, silu, gelu).
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

static const struct {
  const char *aten, *hlo;
} k_unary[] = {
    {"neg", "stablehlo.negate"},        {"exp", "stablehlo.exponential"},
    {"log", "stablehlo.log"},           {"tanh", "stablehlo.tanh"},
    {"sqrt", "stablehlo.sqrt"},         {"rsqrt", "stablehlo.rsqrt"},
    {"abs", "stablehlo.abs"},           {"sigmoid", "stablehlo.logistic"},
    {"sin", "stablehlo.sine"},          {"cos", "stablehlo.cosine"},
    {"tan", "stablehlo.tan"},           {"floor", "stablehlo.floor"},
    {"ceil", "stablehlo.ceil"},         {"sign", "stablehlo.sign"},
    {"sgn", "stablehlo.sign"},          {"log1p", "stablehlo.log_plus_one"},
    {"expm1", "stablehlo.exponential_minus_one"}, {"erf", "chlo.erf"},
    {"bitwise_not", "stablehlo.not"},   {"atan", "chlo.atan"},
    {"asin", "chlo.asin"},              {"acos", "chlo.acos"},
    {"sinh", "chlo.sinh"},              {"cosh", "chlo.cosh"},
    {"lgamma", "chlo.lgamma"},          {"digamma", "chlo.digamma"},
    {"erfinv", "chlo.erf_inv"},
};

static const struct {
  const char *aten, *hlo;
} k_binary[] = {
    {"mul", "stablehlo.multiply"},     {"maximum", "stablehlo.maximum"},
    {"minimum", "stablehlo.minimum"},  {"pow", "stablehlo.power"},
    {"atan2", "stablehlo.atan2"},      {"fmod", "stablehlo.remainder"},
    {"bitwise_and", "stablehlo.and"},  {"bitwise_or", "stablehlo.or"},
    {"bitwise_xor", "stablehlo.xor"},
};

static const struct {
  const char *aten, *dir;
} k_compare[] = {{"eq", "EQ"}, {"ne", "NE"}, {"lt", "LT"}, {"le", "LE"}, {"gt", "GT"}, {"ge", "GE"}};


static bool lower_unary(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  for (size_t i = 0; i < sizeof k_unary / sizeof k_unary[0]; i++)
    if (!strcmp(base, k_unary[i].aten) && is_tensor(n, 0)) {
      outs[0] = unop(e, k_unary[i].hlo, arg_out(n, 0, odt));
      return true;
    }
  return false;
}

static bool lower_binary(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  for (size_t i = 0; i < sizeof k_binary / sizeof k_binary[0]; i++)
    if (!strcmp(base, k_binary[i].aten) && (is_tensor(n, 0) || is_number(n, 0)) &&
        (is_tensor(n, 1) || is_number(n, 1))) {
      outs[0] = binop(e, k_binary[i].hlo, arg_out(n, 0, odt), arg_out(n, 1, odt));
      return true;
    }
  return false;
}

static bool lower_compare(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  for (size_t i = 0; i < sizeof k_compare / sizeof k_compare[0]; i++)
    if (!strcmp(base, k_compare[i].aten)) {
      tpu_dtype_t ct = common_type(n, 0, 1);
      outs[0] = compare(e, k_compare[i].dir, arg_out(n, 0, ct), arg_out(n, 1, ct));
      return true;
    }
  return false;
}

static bool lower_add(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "add") || !strcmp(base, "sub") || !strcmp(base, "rsub")) {
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    double alpha = tpu_arg_f64(c, 2, 1.0);
    if (!strcmp(base, "rsub")) {
      ref_t t = a;
      a = b;
      b = t;
    }
    if (alpha != 1.0) b = scalar_op(e, "stablehlo.multiply", b, alpha);
    outs[0] = binop(e, strcmp(base, "add") ? "stablehlo.subtract" : "stablehlo.add", a, b);
    return true;
  }
  return false;
}

static bool lower_div(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "div")) {
    const char* mode = tpu_arg_str(c, 2, NULL);
    if (mode && tpu_dtype_is_integral(odt, true)) return false;
    ref_t q = binop(e, "stablehlo.divide", arg_out(n, 0, odt), arg_out(n, 1, odt));
    if (mode && !strcmp(mode, "floor")) q = unop(e, "stablehlo.floor", q);
    else if (mode && !strcmp(mode, "trunc"))
      q = select3(e, compare(e, "LT", q, cst_like(e, odt, 0, q.nd, q.sz)), unop(e, "stablehlo.ceil", q),
                  unop(e, "stablehlo.floor", q));
    outs[0] = q;
    return true;
  }
  return false;
}

static bool lower_reciprocal(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "reciprocal")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.divide", cst_like(e, odt, 1, x.nd, x.sz), x);
    return true;
  }
  return false;
}

static bool lower_square(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "square")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.multiply", x, x);
    return true;
  }
  return false;
}

static bool lower_log2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "log2") || !strcmp(base, "log10")) {
    ref_t x = unop(e, "stablehlo.log", arg_out(n, 0, odt));
    outs[0] = scalar_op(e, "stablehlo.divide", x, log(!strcmp(base, "log2") ? 2.0 : 10.0));
    return true;
  }
  return false;
}

static bool lower_exp2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "exp2")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.power", cst_like(e, odt, 2, x.nd, x.sz), x);
    return true;
  }
  return false;
}

static bool lower_round(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "round") && strncmp(ovl, "decimals", 8) && tpu_dtype_is_float(odt)) {
    outs[0] = unop(e, "stablehlo.round_nearest_even", arg_out(n, 0, odt));
    return true;
  }
  return false;
}

static bool lower_trunc(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "trunc") && tpu_dtype_is_float(odt)) {
    ref_t q = arg_out(n, 0, odt);
    outs[0] = select3(e, compare(e, "LT", q, cst_like(e, odt, 0, q.nd, q.sz)), unop(e, "stablehlo.ceil", q),
                      unop(e, "stablehlo.floor", q));
    return true;
  }
  return false;
}

static bool lower_relu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "relu")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.maximum", x, cst_like(e, odt, 0, x.nd, x.sz));
    return true;
  }
  return false;
}

static bool lower_silu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "silu")) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.multiply", x, unop(e, "stablehlo.logistic", x));
    return true;
  }
  return false;
}

static bool lower_gelu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "gelu") && tpu_dtype_is_float(odt)) {
    ref_t x = arg_out(n, 0, acc_type(odt));
    outs[0] = convert(e, gelu(e, x, tpu_arg_str(c, 1, "none")), odt);
    return true;
  }
  return false;
}

static bool lower_isnan(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "isnan")) {
    ref_t x = arg(n, 0);
    outs[0] = compare(e, "NE", x, x);
    return true;
  }
  return false;
}

static bool lower_logical_not(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "logical_not") && is_tensor(n, 0)) {
    outs[0] = unop(e, "stablehlo.not", compare(e, "NE", arg(n, 0), cst_like(e, n->c->args[0].v.t->dtype, 0, n->c->args[0].v.t->ndim, n->c->args[0].v.t->sizes)));
    return true;
  }
  return false;
}

static bool lower_logical_and(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "logical_and") || !strcmp(base, "logical_or") || !strcmp(base, "logical_xor")) {
    ref_t a = arg_out(n, 0, TPU_BOOL), b = arg_out(n, 1, TPU_BOOL);
    outs[0] = binop(e, base[8] == 'a' ? "stablehlo.and" : base[8] == 'o' ? "stablehlo.or" : "stablehlo.xor", a, b);
    return true;
  }
  return false;
}

static bool lower_where(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "where") && is_tensor(n, 0)) {
    ref_t p = arg_out(n, 0, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 1, odt), arg_out(n, 2, odt));
    return true;
  }
  return false;
}

static bool lower_masked_fill(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "masked_fill")) {
    ref_t p = arg_out(n, 1, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 2, odt), arg_out(n, 0, odt));
    return true;
  }
  return false;
}

static bool lower_clamp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "clamp") || !strcmp(base, "clamp_min") || !strcmp(base, "clamp_max")) {
    ref_t x = arg_out(n, 0, odt);
    bool has_min = strcmp(base, "clamp_max") && !tpu_arg_is_none(c, 1);
    int imax = !strcmp(base, "clamp_max") ? 1 : 2;
    bool has_max = strcmp(base, "clamp_min") && !tpu_arg_is_none(c, imax);
    if (has_min) x = binop(e, "stablehlo.maximum", x, arg_out(n, 1, odt));
    if (has_max) x = binop(e, "stablehlo.minimum", x, arg_out(n, imax, odt));
    outs[0] = x;
    return true;
  }
  return false;
}

static bool lower_addcmul(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "addcmul") || !strcmp(base, "addcdiv")) {
    ref_t t = binop(e, base[4] == 'm' ? "stablehlo.multiply" : "stablehlo.divide", arg_out(n, 1, odt),
                    arg_out(n, 2, odt));
    double v = tpu_arg_f64(c, 3, 1.0);
    if (v != 1.0) t = scalar_op(e, "stablehlo.multiply", t, v);
    outs[0] = binop(e, "stablehlo.add", arg_out(n, 0, odt), t);
    return true;
  }
  return false;
}

static bool lower_lerp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "lerp")) { /* self + weight * (end - self) */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt), w = arg_out(n, 2, odt);
    outs[0] = binop(e, "stablehlo.add", a, binop(e, "stablehlo.multiply", w, binop(e, "stablehlo.subtract", b, a)));
    return true;
  }
  return false;
}

static bool lower_isneginf(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "isneginf") || !strcmp(base, "isposinf") || !strcmp(base, "isinf")) && is_tensor(n, 0)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    if (!tpu_dtype_is_float(x->dtype)) {
      outs[0] = cst_like(e, TPU_BOOL, 0, o->ndim, o->sizes);
      return true;
    }
    ref_t a = arg(n, 0);
    ref_t v = base[2] == 'i' ? unop(e, "stablehlo.abs", a) : a;
    outs[0] = compare(e, "EQ", v, cst_like(e, a.dt, base[2] == 'n' ? -INFINITY : INFINITY, a.nd, a.sz));
    return true;
  }
  return false;
}

static bool lower_remainder(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "remainder") && tpu_dtype_is_float(odt)) { /* a - floor(a / b) * b */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t q = unop(e, "stablehlo.floor", binop(e, "stablehlo.divide", a, b));
    outs[0] = binop(e, "stablehlo.subtract", a, binop(e, "stablehlo.multiply", q, b));
    return true;
  }
  return false;
}

static bool lower_remainder_2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "remainder") && (odt == TPU_I64 || odt == TPU_I32 || odt == TPU_I16 || odt == TPU_I8)) {
    /* the truncated remainder, moved to the divisor's sign (Python's %) */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t r = binop(e, "stablehlo.remainder", a, b), zero = cst_like(e, odt, 0, r.nd, r.sz);
    ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", r, zero),
                      compare(e, "NE", compare(e, "LT", r, zero), compare(e, "LT", b, zero)));
    outs[0] = select3(e, fix, binop(e, "stablehlo.add", r, b), r);
    return true;
  }
  return false;
}

/* the former chain tried these in turn; the first that lowers wins */
static bool lower_remainder_any(node_t* n, const char* base, ref_t* outs) {
  return lower_remainder(n, base, outs) || lower_remainder_2(n, base, outs);
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"abs", lower_unary},
    {"acos", lower_unary},
    {"add", lower_add},
    {"addcdiv", lower_addcmul},
    {"addcmul", lower_addcmul},
    {"asin", lower_unary},
    {"atan", lower_unary},
    {"atan2", lower_binary},
    {"bitwise_and", lower_binary},
    {"bitwise_not", lower_unary},
    {"bitwise_or", lower_binary},
    {"bitwise_xor", lower_binary},
    {"ceil", lower_unary},
    {"clamp", lower_clamp},
    {"clamp_max", lower_clamp},
    {"clamp_min", lower_clamp},
    {"cos", lower_unary},
    {"cosh", lower_unary},
    {"digamma", lower_unary},
    {"div", lower_div},
    {"eq", lower_compare},
    {"erf", lower_unary},
    {"erfinv", lower_unary},
    {"exp", lower_unary},
    {"exp2", lower_exp2},
    {"expm1", lower_unary},
    {"floor", lower_unary},
    {"fmod", lower_binary},
    {"ge", lower_compare},
    {"gelu", lower_gelu},
    {"gt", lower_compare},
    {"isinf", lower_isneginf},
    {"isnan", lower_isnan},
    {"isneginf", lower_isneginf},
    {"isposinf", lower_isneginf},
    {"le", lower_compare},
    {"lerp", lower_lerp},
    {"lgamma", lower_unary},
    {"log", lower_unary},
    {"log10", lower_log2},
    {"log1p", lower_unary},
    {"log2", lower_log2},
    {"logical_and", lower_logical_and},
    {"logical_not", lower_logical_not},
    {"logical_or", lower_logical_and},
    {"logical_xor", lower_logical_and},
    {"lt", lower_compare},
    {"masked_fill", lower_masked_fill},
    {"maximum", lower_binary},
    {"minimum", lower_binary},
    {"mul", lower_binary},
    {"ne", lower_compare},
    {"neg", lower_unary},
    {"pow", lower_binary},
    {"reciprocal", lower_reciprocal},
    {"relu", lower_relu},
    {"remainder", lower_remainder_any},
    {"round", lower_round},
    {"rsqrt", lower_unary},
    {"rsub", lower_add},
    {"sgn", lower_unary},
    {"sigmoid", lower_unary},
    {"sign", lower_unary},
    {"silu", lower_silu},
    {"sin", lower_unary},
    {"sinh", lower_unary},
    {"sqrt", lower_unary},
    {"square", lower_square},
    {"sub", lower_add},
    {"tan", lower_unary},
    {"tanh", lower_unary},
    {"trunc", lower_trunc},
    {"where", lower_where},
};

const tpu_lower_table_t tpu_lower_elementwise = {k_entries, sizeof k_entries / sizeof k_entries[0]};
