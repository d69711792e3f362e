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

/* The ops one StableHLO op lowers: the recipes of the element-wise inventory
 * (tpu/ew_ops.def, the rows the host kernels and fusion are built from), and a
 * few ops whose host kernels are not inventory rows. Indexed by op id. */
enum { R_NONE = 0, R_UNARY, R_BINARY, R_COMPARE };
typedef struct {
  int kind;
  const char* op; /* the stablehlo/chlo op, or the comparison direction */
} recipe_t;
#define RECIPE_NOHLO(NAME, OP)
#define RECIPE_UNARY(NAME, OP) [TPU_OPID_##NAME] = {R_UNARY, OP},
#define RECIPE_BINARY(NAME, OP) [TPU_OPID_##NAME] = {R_BINARY, OP},
#define RECIPE_COMPARE(NAME, OP) [TPU_OPID_##NAME] = {R_COMPARE, OP},
static const recipe_t k_recipes[TPU_OPID_COUNT] = {
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) RECIPE_##HLO(NAME, HLO_OP)
#include "tpu/ew_ops.def"
#undef TPU_EW
    [TPU_OPID_sgn] = {R_UNARY, "stablehlo.sign"},
    [TPU_OPID_erfinv] = {R_UNARY, "chlo.erf_inv"},
    [TPU_OPID_nextafter] = {R_BINARY, "chlo.next_after"},
    [TPU_OPID_special_zeta] = {R_BINARY, "chlo.zeta"},
};

/* whether the node n being lowered is of family NAME (its op id) */
#define IS_OP(NAME) (n->c->op->id == TPU_OPID_##NAME)

/* the recipe of n's op when it is of the kind asked for, else NULL */
static const recipe_t* recipe_of(const node_t* n, int kind) {
  const tpu_op_id_t id = n->c->op->id;
  return id > TPU_OPID_NONE && id < TPU_OPID_COUNT && k_recipes[id].kind == kind ? &k_recipes[id] : NULL;
}

static ref_t like(em_t* e, ref_t x, double v) { return cst_like(e, x.dt, v, x.nd, x.sz); }
static ref_t is_nan(em_t* e, ref_t x) { return compare(e, "NE", x, x); }

static ref_t trunc_of(em_t* e, ref_t q) {
  return select3(e, compare(e, "LT", q, like(e, q, 0)), unop(e, "stablehlo.ceil", q), unop(e, "stablehlo.floor", q));
}

static ref_t sign_bit(em_t* e, ref_t x);

/* a / b rounded down, as CPU's floating floor division: (a - fmod(a, b)) / b,
 * one less where the remainder's sign differs from b's, rounded to the nearest
 * integer; a signed zero for a zero quotient; a / b where b is 0 */
static ref_t floor_div_float(em_t* e, ref_t a, ref_t b) {
  ref_t zero = like(e, a, 0), q = binop(e, "stablehlo.divide", a, b);
  ref_t mod = binop(e, "stablehlo.remainder", a, b);
  ref_t div = binop(e, "stablehlo.divide", binop(e, "stablehlo.subtract", a, mod), b);
  ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", mod, zero),
                    compare(e, "NE", compare(e, "LT", b, zero), compare(e, "LT", mod, zero)));
  div = select3(e, fix, binop(e, "stablehlo.subtract", div, like(e, div, 1)), div);
  ref_t fl = unop(e, "stablehlo.floor", div);
  ref_t up = compare(e, "GT", binop(e, "stablehlo.subtract", div, fl), like(e, div, 0.5));
  fl = select3(e, up, binop(e, "stablehlo.add", fl, like(e, fl, 1)), fl);
  fl = select3(e, compare(e, "EQ", div, zero), select3(e, sign_bit(e, q), like(e, q, -0.0), zero), fl);
  return select3(e, compare(e, "EQ", b, zero), q, fl);
}

/* Complex op `op` of x with C's signed zeros on its branch cuts, which XLA's
 * square root and inverse functions ignore. Each is conjugate-symmetric,
 * f(conj z) = conj f(z), and the odd ones f(-z) = -f(z) too: f is computed
 * where the imaginary part (odd: both parts) is nonnegative, and a part of
 * the result negated where that of x has its sign bit. */
static ref_t on_branch_cut(em_t* e, const char* op, ref_t x, bool odd) {
  ref_t re = re_part(e, x), im = im_part(e, x);
  ref_t f = unop(e, op, make_complex(e, odd ? unop(e, "stablehlo.abs", re) : re, unop(e, "stablehlo.abs", im)));
  ref_t fr = re_part(e, f), fi = im_part(e, f);
  if (odd) fr = select3(e, sign_bit(e, re), unop(e, "stablehlo.negate", fr), fr);
  fi = select3(e, sign_bit(e, im), unop(e, "stablehlo.negate", fi), fi);
  return make_complex(e, fr, fi);
}

static ref_t is_finite(em_t* e, ref_t x) {
  return emit(e, "stablehlo.is_finite", 1, &x, mkref(TPU_BOOL, x.nd, x.sz), NULL);
}
static ref_t is_inf(em_t* e, ref_t x) { return compare(e, "EQ", unop(e, "stablehlo.abs", x), like(e, x, INFINITY)); }
static ref_t mul(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.multiply", a, b); }
static ref_t and2(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.and", a, b); }
static ref_t not1(em_t* e, ref_t a) { return unop(e, "stablehlo.not", a); }

/* The complex exp, sin and cos below follow C99 Annex G (glibc's cexp, csin,
 * ccos, as PyTorch CPU) where a part is infinite, NaN or a signed zero: the
 * textbook real formulas, which give C's value everywhere else, with the
 * cases where they make a NaN or lose a zero's sign overridden by selects.
 * (XLA's complex versions give NaN parts where C keeps an infinity or a zero,
 * and its sin/cos lose tiny imaginary parts.) */

/* e^(x + iy) = e^x cos y + i e^x sin y; y = 0 gives (e^x, y); x = +inf with
 * y infinite or NaN gives (inf, NaN), x = -inf gives (0, +-0 by y's sign) */
static ref_t complex_exp(em_t* e, ref_t z) {
  ref_t x = re_part(e, z), y = im_part(e, z), ex = unop(e, "stablehlo.exponential", x);
  ref_t re = mul(e, ex, unop(e, "stablehlo.cosine", y)), im = mul(e, ex, unop(e, "stablehlo.sine", y));
  ref_t y0 = compare(e, "EQ", y, like(e, y, 0)), ynf = not1(e, is_finite(e, y));
  re = select3(e, y0, ex, re);
  im = select3(e, y0, y, im);
  ref_t pinf = and2(e, compare(e, "EQ", x, like(e, x, INFINITY)), ynf);
  ref_t minf = and2(e, compare(e, "EQ", x, like(e, x, -INFINITY)), ynf);
  re = select3(e, pinf, like(e, re, INFINITY), select3(e, minf, like(e, re, 0), re));
  im = select3(e, minf, select3(e, sign_bit(e, y), like(e, im, -0.0), like(e, im, 0)), im);
  return make_complex(e, re, im);
}

/* sin(x + iy) = sin x cosh y + i cos x sinh y; x = 0 keeps its zero as the
 * real part; x infinite or NaN gives y as the imaginary part where y is 0 or
 * infinite */
static ref_t complex_sin(em_t* e, ref_t z) {
  ref_t x = re_part(e, z), y = im_part(e, z);
  ref_t re = mul(e, unop(e, "stablehlo.sine", x), unop(e, "chlo.cosh", y));
  ref_t im = mul(e, unop(e, "stablehlo.cosine", x), unop(e, "chlo.sinh", y));
  re = select3(e, compare(e, "EQ", x, like(e, x, 0)), x, re);
  ref_t keep = binop(e, "stablehlo.or", compare(e, "EQ", y, like(e, y, 0)), is_inf(e, y));
  im = select3(e, and2(e, not1(e, is_finite(e, x)), keep), y, im);
  return make_complex(e, re, im);
}

/* cos(x + iy) = cos x cosh y - i sin x sinh y; x = 0 with an infinite
 * product gives -x sign(y) (x where y is NaN) as the imaginary part; x
 * infinite or NaN gives +0 there where y = 0, and (inf, NaN) where y is
 * infinite */
static ref_t complex_cos(em_t* e, ref_t z) {
  ref_t x = re_part(e, z), y = im_part(e, z);
  ref_t re = mul(e, unop(e, "stablehlo.cosine", x), unop(e, "chlo.cosh", y));
  ref_t im = unop(e, "stablehlo.negate", mul(e, unop(e, "stablehlo.sine", x), unop(e, "chlo.sinh", y)));
  ref_t x0 = and2(e, compare(e, "EQ", x, like(e, x, 0)), is_nan(e, im));
  im = select3(e, x0, select3(e, is_nan(e, y), x, unop(e, "stablehlo.negate", mul(e, x, unop(e, "stablehlo.sign", y)))), im);
  ref_t xnf = not1(e, is_finite(e, x));
  im = select3(e, and2(e, xnf, compare(e, "EQ", y, like(e, y, 0))), like(e, im, 0), im);
  re = select3(e, and2(e, xnf, is_inf(e, y)), like(e, re, INFINITY), re);
  return make_complex(e, re, im);
}

/* log z, XLA's where both parts are finite; else C's: log|z| (inf where a
 * part is infinite, else NaN) as the real part */
static ref_t complex_log(em_t* e, ref_t z) {
  ref_t l = unop(e, "stablehlo.log", z);
  ref_t fin = and2(e, is_finite(e, re_part(e, z)), is_finite(e, im_part(e, z)));
  return make_complex(e, select3(e, fin, re_part(e, l), unop(e, "stablehlo.log", abs_of(e, z))), im_part(e, l));
}

/* y = sqrt(z) with C's values where a part of z is infinite or NaN: (inf,
 * b) for an infinite imaginary part b; for a NaN one, (inf, NaN) where the
 * real part is +inf, (NaN, inf) where it is -inf, else NaN + i NaN */
static ref_t sqrt_specials(em_t* e, ref_t z, ref_t y) {
  ref_t a = re_part(e, z), b = im_part(e, z), re = re_part(e, y), im = im_part(e, y);
  ref_t bnan = is_nan(e, b), binf = is_inf(e, b), nan = like(e, re, NAN), inf = like(e, re, INFINITY);
  ref_t pinf = compare(e, "EQ", a, like(e, a, INFINITY)), minf = compare(e, "EQ", a, like(e, a, -INFINITY));
  re = select3(e, binf, inf, select3(e, bnan, select3(e, pinf, inf, nan), re));
  im = select3(e, binf, b, select3(e, bnan, select3(e, minf, inf, nan), im));
  return make_complex(e, re, im);
}

/* a / b as c10::complex's division (Smith's: the ratio of the smaller part
 * of b to the larger), which PyTorch CPU's kernels agree with on infinities
 * and NaNs: (0, 0) divides each part by the zero magnitudes */
static ref_t complex_div(em_t* e, ref_t a, ref_t b) {
  ref_t ar = re_part(e, a), ai = im_part(e, a), c = re_part(e, b), d = im_part(e, b);
  ref_t ac = unop(e, "stablehlo.abs", c), ad = unop(e, "stablehlo.abs", d);
  ref_t big = compare(e, "GE", ac, ad);
  ref_t rat = binop(e, "stablehlo.divide", select3(e, big, d, c), select3(e, big, c, d));
  ref_t den = binop(e, "stablehlo.add", select3(e, big, c, d), mul(e, select3(e, big, d, c), rat));
  ref_t scl = binop(e, "stablehlo.divide", like(e, den, 1), den);
  /* big: (ar + ai rat, ai - ar rat); else (ar rat + ai, ai rat - ar) */
  ref_t re = select3(e, big, binop(e, "stablehlo.add", ar, mul(e, ai, rat)), binop(e, "stablehlo.add", mul(e, ar, rat), ai));
  ref_t im = select3(e, big, binop(e, "stablehlo.subtract", ai, mul(e, ar, rat)),
                     binop(e, "stablehlo.subtract", mul(e, ai, rat), ar));
  re = mul(e, re, scl);
  im = mul(e, im, scl);
  ref_t zero = and2(e, compare(e, "EQ", ac, like(e, ac, 0)), compare(e, "EQ", ad, like(e, ad, 0)));
  re = select3(e, zero, binop(e, "stablehlo.divide", ar, ac), re);
  im = select3(e, zero, binop(e, "stablehlo.divide", ai, ad), im);
  return make_complex(e, re, im);
}

/* whether tensor argument i is complex */
static bool complex_arg(const node_t* n, int i) {
  return is_tensor(n, i) && tpu_dtype_is_complex(n->c->args[i].v.t->dtype);
}

static bool lower_unary(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const recipe_t* r = recipe_of(n, R_UNARY);
  if (!r || !is_tensor(n, 0)) return false;
  if (complex_arg(n, 0) && !tpu_dtype_is_complex(odt)) { /* abs: the magnitude, of the part type */
    if (!IS_OP(abs)) return false;
    outs[0] = abs_of(e, arg(n, 0));
    return true;
  }
  if (tpu_dtype_is_complex(odt)) { /* complex64 in complex128, rounded once, as the host kernels */
    const bool odd = IS_OP(asin) || IS_OP(asinh) || IS_OP(atan) || IS_OP(atanh);
    ref_t x = arg_out(n, 0, IS_OP(neg) ? odt : TPU_C128), y;
    if (IS_OP(exp)) {
      y = complex_exp(e, x);
    } else if (IS_OP(sin) || IS_OP(cos)) {
      y = IS_OP(sin) ? complex_sin(e, x) : complex_cos(e, x);
    } else if (IS_OP(log)) {
      y = complex_log(e, x);
    } else if (IS_OP(sgn)) { /* z / |z|, 0 at 0, as PyTorch's sgn (XLA's sign drops a NaN part) */
      ref_t m = abs_of(e, x);
      y = make_complex(e, binop(e, "stablehlo.divide", re_part(e, x), m), binop(e, "stablehlo.divide", im_part(e, x), m));
      y = select3(e, compare(e, "EQ", x, like(e, x, 0)), like(e, x, 0), y);
    } else if (odd || IS_OP(sqrt) || IS_OP(rsqrt) || IS_OP(acos) || IS_OP(acosh)) {
      y = on_branch_cut(e, r->op, x, odd);
      if (IS_OP(sqrt)) y = sqrt_specials(e, x, y);
    } else {
      y = unop(e, r->op, x);
    }
    outs[0] = convert(e, y, odt);
    return true;
  }
  if (IS_OP(abs) && (odt == TPU_U8 || odt == TPU_BOOL)) { /* stablehlo.abs takes signed types only */
    outs[0] = arg_out(n, 0, odt);
    return true;
  }
  ref_t x = arg_out(n, 0, acc_type(odt)); /* 16-bit floats in float32, rounded once, as CPU's kernels */
  if ((IS_OP(sign) || IS_OP(sgn)) && tpu_dtype_is_float(odt)) { /* (x > 0) - (x < 0): +0 for -0 and NaN, as CPU */
    ref_t pos = convert(e, compare(e, "GT", x, like(e, x, 0)), x.dt);
    outs[0] = convert(e, binop(e, "stablehlo.subtract", pos, convert(e, compare(e, "LT", x, like(e, x, 0)), x.dt)), odt);
    return true;
  }
  outs[0] = convert(e, unop(e, r->op, x), odt);
  return true;
}

static bool lower_binary(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const recipe_t* r = recipe_of(n, R_BINARY);
  if (!r || !(is_tensor(n, 0) || is_number(n, 0)) || !(is_tensor(n, 1) || is_number(n, 1))) return false;
  outs[0] = binop(e, r->op, arg_out(n, 0, odt), arg_out(n, 1, odt));
  return true;
}

/* Integer shifts (__lshift__, bitwise_left_shift and the right ones): a shift
 * by a negative count or by the width or more gives 0 (left) or the sign fill
 * (right), as StableHLO's shifts do. */
static bool lower_shift(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (tpu_dtype_is_float(odt) || tpu_dtype_is_complex(odt) || odt == TPU_BOOL) return false;
  const bool left = strstr(base, "lshift") || strstr(base, "left");
  const char* op = left ? "stablehlo.shift_left" : odt == TPU_U8 ? "stablehlo.shift_right_logical"
                                                                   : "stablehlo.shift_right_arithmetic";
  outs[0] = binop(e, op, arg_out(n, 0, odt), arg_out(n, 1, odt));
  return true;
}

static bool lower_compare(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const recipe_t* r = recipe_of(n, R_COMPARE);
  if (!r) return false;
  tpu_dtype_t ct = common_type(n, 0, 1);
  outs[0] = compare(e, r->op, arg_out(n, 0, ct), arg_out(n, 1, ct));
  return true;
}

static bool lower_add(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(add) || IS_OP(sub) || IS_OP(rsub)) {
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    if (IS_OP(rsub)) {
      ref_t t = a;
      a = b;
      b = t;
    }
    b = scale_by(n, 2, b, 1.0);
    outs[0] = binop(e, !IS_OP(add) ? "stablehlo.subtract" : "stablehlo.add", a, b);
    return true;
  }
  return false;
}

static bool lower_div(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(div) || IS_OP(floor_divide)) {
    const char* mode = IS_OP(floor_divide) ? "floor" : tpu_arg_str(c, 2, NULL);
    if (mode && (odt == TPU_BOOL || tpu_dtype_is_complex(odt))) return false;
    /* 16-bit floats in float32 and floor division of floats in float64, as CPU's kernels */
    const bool ffloor = tpu_dtype_is_float(odt) && mode && !strcmp(mode, "floor");
    const tpu_dtype_t ct = ffloor ? TPU_F64 : acc_type(odt);
    ref_t a = arg_out(n, 0, ct), b = arg_out(n, 1, ct);
    if (ffloor) {
      outs[0] = convert(e, floor_div_float(e, a, b), odt);
      return true;
    }
    ref_t q = tpu_dtype_is_complex(odt) ? complex_div(e, a, b) : binop(e, "stablehlo.divide", a, b); /* integers: truncated */
    if (!tpu_dtype_is_float(odt) && !tpu_dtype_is_complex(odt)) {
      if (!mode) return false; /* true division of integers is float (odt says so) */
      if (!strcmp(mode, "floor")) { /* one less where the remainder is nonzero and the signs differ */
        ref_t r = binop(e, "stablehlo.remainder", a, b), zero = like(e, r, 0);
        ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", r, zero),
                          compare(e, "NE", compare(e, "LT", a, zero), compare(e, "LT", b, zero)));
        q = select3(e, fix, binop(e, "stablehlo.subtract", q, like(e, q, 1)), q);
      }
    } else if (mode && !strcmp(mode, "trunc")) { /* of the quotient rounded to odt, as CPU */
      q = trunc_of(e, convert(e, q, odt));
    }
    outs[0] = convert(e, q, odt);
    return true;
  }
  return false;
}

static bool lower_reciprocal(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(reciprocal)) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.divide", cst_like(e, odt, 1, x.nd, x.sz), x);
    return true;
  }
  return false;
}

static bool lower_square(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(square)) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.multiply", x, x);
    return true;
  }
  return false;
}

static bool lower_log2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(log2) || IS_OP(log10)) {
    ref_t x = unop(e, "stablehlo.log", arg_out(n, 0, odt));
    outs[0] = scalar_op(e, "stablehlo.divide", x, log(IS_OP(log2) ? 2.0 : 10.0));
    return true;
  }
  return false;
}

static bool lower_exp2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(exp2)) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.power", cst_like(e, odt, 2, x.nd, x.sz), x);
    return true;
  }
  return false;
}

static bool lower_round(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(round) && strncmp(ovl, "decimals", 8) && tpu_dtype_is_float(odt)) {
    outs[0] = unop(e, "stablehlo.round_nearest_even", arg_out(n, 0, odt));
    return true;
  }
  return false;
}

static bool lower_trunc(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(trunc) && tpu_dtype_is_float(odt)) {
    outs[0] = trunc_of(e, arg_out(n, 0, odt));
    return true;
  }
  return false;
}

static bool lower_relu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(relu)) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.maximum", x, cst_like(e, odt, 0, x.nd, x.sz));
    return true;
  }
  return false;
}

static bool lower_silu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(silu)) {
    ref_t x = arg_out(n, 0, acc_type(odt));
    outs[0] = convert(e, binop(e, "stablehlo.multiply", x, unop(e, "stablehlo.logistic", x)), odt);
    return true;
  }
  return false;
}

static bool lower_gelu(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(gelu) && tpu_dtype_is_float(odt)) {
    ref_t x = arg_out(n, 0, acc_type(odt));
    outs[0] = convert(e, gelu(e, x, tpu_arg_str(c, 1, "none")), odt);
    return true;
  }
  return false;
}

static bool lower_isnan(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(isnan)) {
    ref_t x = arg(n, 0);
    outs[0] = compare(e, "NE", x, x);
    return true;
  }
  return false;
}

static bool lower_logical_not(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(logical_not) && is_tensor(n, 0)) {
    outs[0] = unop(e, "stablehlo.not", compare(e, "NE", arg(n, 0), cst_like(e, n->c->args[0].v.t->dtype, 0, n->c->args[0].v.t->ndim, n->c->args[0].v.t->sizes)));
    return true;
  }
  return false;
}

static bool lower_logical_and(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(logical_and) || IS_OP(logical_or) || IS_OP(logical_xor)) {
    ref_t a = arg_out(n, 0, TPU_BOOL), b = arg_out(n, 1, TPU_BOOL);
    outs[0] = binop(e, IS_OP(logical_and) ? "stablehlo.and" : IS_OP(logical_or) ? "stablehlo.or" : "stablehlo.xor", a, b);
    return true;
  }
  return false;
}

static bool lower_where(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(where) && is_tensor(n, 0)) {
    ref_t p = arg_out(n, 0, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 1, odt), arg_out(n, 2, odt));
    return true;
  }
  return false;
}

static bool lower_masked_fill(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(masked_fill)) {
    ref_t p = arg_out(n, 1, TPU_BOOL);
    outs[0] = select3(e, p, arg_out(n, 2, odt), arg_out(n, 0, odt));
    return true;
  }
  return false;
}

static bool lower_clamp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(clamp) || IS_OP(clamp_min) || IS_OP(clamp_max)) {
    ref_t x = arg_out(n, 0, odt);
    bool has_min = !IS_OP(clamp_max) && !tpu_arg_is_none(c, 1);
    int imax = IS_OP(clamp_max) ? 1 : 2;
    bool has_max = !IS_OP(clamp_min) && !tpu_arg_is_none(c, imax);
    if (has_min) x = binop(e, "stablehlo.maximum", x, arg_out(n, 1, odt));
    if (has_max) x = binop(e, "stablehlo.minimum", x, arg_out(n, imax, odt));
    outs[0] = x;
    return true;
  }
  return false;
}

static bool lower_addcmul(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(addcmul) || IS_OP(addcdiv)) {
    ref_t t = binop(e, IS_OP(addcmul) ? "stablehlo.multiply" : "stablehlo.divide", arg_out(n, 1, odt),
                    arg_out(n, 2, odt));
    t = scale_by(n, 3, t, 1.0);
    outs[0] = binop(e, "stablehlo.add", arg_out(n, 0, odt), t);
    return true;
  }
  return false;
}

static bool lower_lerp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(lerp)) { /* self + weight * (end - self) */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt), w = arg_out(n, 2, odt);
    outs[0] = binop(e, "stablehlo.add", a, binop(e, "stablehlo.multiply", w, binop(e, "stablehlo.subtract", b, a)));
    return true;
  }
  return false;
}

static bool lower_isneginf(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((IS_OP(isinf) || IS_OP(isfinite)) && complex_arg(n, 0)) { /* either part infinite; both finite */
    ref_t x = arg(n, 0), part[2] = {re_part(e, x), im_part(e, x)}, f[2];
    for (int k = 0; k < 2; k++)
      f[k] = IS_OP(isinf) ? compare(e, "EQ", unop(e, "stablehlo.abs", part[k]), like(e, part[k], INFINITY))
                          : emit(e, "stablehlo.is_finite", 1, &part[k], mkref(TPU_BOOL, x.nd, x.sz), NULL);
    outs[0] = binop(e, IS_OP(isinf) ? "stablehlo.or" : "stablehlo.and", f[0], f[1]);
    return true;
  }
  if (IS_OP(isfinite) && is_tensor(n, 0)) {
    ref_t x = arg(n, 0);
    outs[0] = tpu_dtype_is_float(x.dt) ? emit(e, "stablehlo.is_finite", 1, &x, mkref(TPU_BOOL, x.nd, x.sz), NULL)
                                       : cst_like(e, TPU_BOOL, 1, o->ndim, o->sizes);
    return true;
  }
  if ((IS_OP(isneginf) || IS_OP(isposinf) || IS_OP(isinf)) && is_tensor(n, 0)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    if (!tpu_dtype_is_float(x->dtype)) {
      outs[0] = cst_like(e, TPU_BOOL, 0, o->ndim, o->sizes);
      return true;
    }
    ref_t a = arg(n, 0);
    ref_t v = IS_OP(isinf) ? unop(e, "stablehlo.abs", a) : a;
    outs[0] = compare(e, "EQ", v, cst_like(e, a.dt, IS_OP(isneginf) ? -INFINITY : INFINITY, a.nd, a.sz));
    return true;
  }
  return false;
}

/* ---- formulas of a few ops each ---- */

/* x's sign bit (true for -0.0 and negative NaNs), as PyTorch's signbit */
static ref_t sign_bit(em_t* e, ref_t x) {
  if (!tpu_dtype_is_float(x.dt)) return compare(e, "LT", x, like(e, x, 0));
  const size_t es = tpu_dtype_size(x.dt);
  const tpu_dtype_t it = es == 8 ? TPU_I64 : es == 4 ? TPU_I32 : TPU_I16;
  ref_t bits = emit(e, "stablehlo.bitcast_convert", 1, &x, mkref(it, x.nd, x.sz), NULL);
  return compare(e, "LT", bits, cst_like(e, it, 0, x.nd, x.sz));
}

/* the largest finite value of a float dtype */
static double float_max(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F64: return 1.7976931348623157e308;
    case TPU_F16: return 65504.0;
    case TPU_BF16: return 3.3895313892515355e38;
    default: return 3.4028234663852886e38;
  }
}

/* digamma, with PyTorch's values at zero: -inf at +0, +inf at -0 */
static ref_t digamma(em_t* e, ref_t x) {
  ref_t at0 = select3(e, sign_bit(e, x), like(e, x, INFINITY), like(e, x, -INFINITY));
  return select3(e, compare(e, "EQ", x, like(e, x, 0)), at0, unop(e, "chlo.digamma", x));
}

static bool lower_formula(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0)) return false;
  const bool fl = tpu_dtype_is_float(odt);
  if (IS_OP(frac) && fl) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = binop(e, "stablehlo.subtract", x, trunc_of(e, x));
  } else if (IS_OP(signbit)) {
    outs[0] = c->args[0].v.t->dtype == TPU_BOOL ? cst_like(e, TPU_BOOL, 0, o->ndim, o->sizes) : sign_bit(e, arg(n, 0));
  } else if (IS_OP(sinc) && fl) { /* sin(pi x) / (pi x), 1 at 0 */
    ref_t x = arg_out(n, 0, acc_type(odt)), px = scalar_op(e, "stablehlo.multiply", x, M_PI);
    ref_t r = binop(e, "stablehlo.divide", unop(e, "stablehlo.sine", px), px);
    outs[0] = convert(e, select3(e, compare(e, "EQ", x, like(e, x, 0)), like(e, x, 1), r), odt);
  } else if (IS_OP(logit) && fl) { /* log(x / (1 - x)), x clamped to [eps, 1 - eps] */
    ref_t x = arg_out(n, 0, odt);
    if (c->nargs > 1 && c->args[1].kind == TPU_ARG_DOUBLE) {
      const double eps = tpu_arg_f64(c, 1, 0);
      x = binop(e, "stablehlo.minimum", binop(e, "stablehlo.maximum", x, like(e, x, eps)), like(e, x, 1 - eps));
    }
    outs[0] = unop(e, "stablehlo.log", binop(e, "stablehlo.divide", x, binop(e, "stablehlo.subtract", like(e, x, 1), x)));
  } else if (IS_OP(nan_to_num)) {
    ref_t x = arg_out(n, 0, odt);
    if (fl) {
      const double big = float_max(odt);
      ref_t pinf = c->nargs > 2 && c->args[2].kind == TPU_ARG_DOUBLE ? like(e, x, tpu_arg_f64(c, 2, 0)) : like(e, x, big);
      ref_t ninf = c->nargs > 3 && c->args[3].kind == TPU_ARG_DOUBLE ? like(e, x, tpu_arg_f64(c, 3, 0)) : like(e, x, -big);
      x = select3(e, is_nan(e, x), like(e, x, tpu_arg_f64(c, 1, 0)), x);
      x = select3(e, compare(e, "EQ", x, like(e, x, INFINITY)), pinf, x);
      x = select3(e, compare(e, "EQ", x, like(e, x, -INFINITY)), ninf, x);
    }
    outs[0] = x;
  } else if (IS_OP(angle) && complex_arg(n, 0)) { /* atan2(imag, real) */
    ref_t x = arg(n, 0);
    outs[0] = binop(e, "stablehlo.atan2", im_part(e, x), re_part(e, x));
  } else if (IS_OP(angle) && fl) { /* real input: 0, pi below zero, NaN kept */
    ref_t x = arg_out(n, 0, odt);
    outs[0] = select3(e, is_nan(e, x), x, select3(e, compare(e, "LT", x, like(e, x, 0)), like(e, x, M_PI), like(e, x, 0)));
  } else if (IS_OP(special_entr) && fl) { /* -x log x; 0 at 0, -inf below */
    ref_t x = arg_out(n, 0, odt);
    ref_t r = unop(e, "stablehlo.negate", binop(e, "stablehlo.multiply", x, unop(e, "stablehlo.log", x)));
    r = select3(e, compare(e, "EQ", x, like(e, x, 0)), like(e, x, 0), r);
    r = select3(e, compare(e, "LT", x, like(e, x, 0)), like(e, x, -INFINITY), r);
    outs[0] = select3(e, is_nan(e, x), x, r);
  } else if ((IS_OP(xlogy) || IS_OP(special_xlog1py)) && fl) {
    /* x * log(y) (log1p), 0 where x is 0 unless y is NaN */
    ref_t x = arg_out(n, 0, odt), y = arg_out(n, 1, odt);
    ref_t r = binop(e, "stablehlo.multiply", x, unop(e, IS_OP(xlogy) ? "stablehlo.log" : "stablehlo.log_plus_one", y));
    r = select3(e, compare(e, "EQ", x, like(e, x, 0)), like(e, x, 0), r);
    outs[0] = select3(e, is_nan(e, y), y, r);
  } else if (IS_OP(copysign) && fl) {
    ref_t a = unop(e, "stablehlo.abs", arg_out(n, 0, odt)), b = arg_out(n, 1, odt);
    outs[0] = select3(e, sign_bit(e, b), unop(e, "stablehlo.negate", a), a);
  } else if (IS_OP(fmax) || IS_OP(fmin)) { /* NaN only where both are */
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t m = binop(e, IS_OP(fmax) ? "stablehlo.maximum" : "stablehlo.minimum", a, b);
    if (fl) m = select3(e, is_nan(e, a), b, select3(e, is_nan(e, b), a, m));
    outs[0] = m;
  } else if (IS_OP(hypot) && fl) {
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    outs[0] = unop(e, "stablehlo.sqrt", binop(e, "stablehlo.add", binop(e, "stablehlo.multiply", a, a),
                                                    binop(e, "stablehlo.multiply", b, b)));
  } else if (IS_OP(heaviside)) { /* x == 0 ? v : x > 0 */
    ref_t x = arg_out(n, 0, odt), v = arg_out(n, 1, odt);
    outs[0] = select3(e, compare(e, "EQ", x, like(e, x, 0)), v, convert(e, compare(e, "GT", x, like(e, x, 0)), odt));
  } else if ((IS_OP(logaddexp) || IS_OP(logaddexp2)) && fl) {
    /* max + log1p(exp(-|a - b|)) (base 2 for logaddexp2); equal infinities stay */
    const bool two = IS_OP(logaddexp2);
    ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
    ref_t d = unop(e, "stablehlo.negate", unop(e, "stablehlo.abs", binop(e, "stablehlo.subtract", a, b)));
    ref_t t = two ? binop(e, "stablehlo.power", like(e, d, 2), d) : unop(e, "stablehlo.exponential", d);
    t = unop(e, "stablehlo.log_plus_one", t);
    if (two) t = scalar_op(e, "stablehlo.divide", t, M_LN2);
    ref_t r = binop(e, "stablehlo.add", binop(e, "stablehlo.maximum", a, b), t);
    ref_t inf_eq = binop(e, "stablehlo.and", compare(e, "EQ", a, b),
                         compare(e, "EQ", unop(e, "stablehlo.abs", a), like(e, a, INFINITY)));
    outs[0] = select3(e, inf_eq, a, r);
  } else if (IS_OP(digamma) && fl) {
    outs[0] = digamma(e, arg_out(n, 0, odt));
  } else if (IS_OP(special_ndtri) && fl) { /* sqrt(2) erfinv(2p - 1) */
    ref_t p = arg_out(n, 0, odt);
    ref_t t = binop(e, "stablehlo.subtract", scalar_op(e, "stablehlo.multiply", p, 2), like(e, p, 1));
    outs[0] = scalar_op(e, "stablehlo.multiply", unop(e, "chlo.erf_inv", t), M_SQRT2);
  } else if (IS_OP(round) && !strcmp(ovl, "decimals") && fl) {
    /* as the CPU kernel: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d */
    const int64_t d = tpu_arg_i64(c, 1, 0);
    const double p10 = pow(10.0, (double)(d >= 0 ? d : -d));
    ref_t x = arg_out(n, 0, odt);
    if (d >= 0) x = scalar_op(e, "stablehlo.divide", unop(e, "stablehlo.round_nearest_even",
                                                           scalar_op(e, "stablehlo.multiply", x, p10)), p10);
    else x = scalar_op(e, "stablehlo.multiply", unop(e, "stablehlo.round_nearest_even",
                                                      scalar_op(e, "stablehlo.divide", x, p10)), p10);
    outs[0] = x;
  } else {
    return false;
  }
  return true;
}

/* pow on complex values as PyTorch's CPU kernel: a number exponent of 0
 * fills ones, 1 copies, 2, 3 and -2 multiply, 0.5, -0.5 and -1 are sqrt,
 * rsqrt and reciprocal; anything else is C's cpow, exp(w log z) */
static bool lower_pow_complex(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  ref_t z = arg_out(n, 0, odt);
  double w[2] = {0, 1};
  if (is_number(n, 1) && tpu_arg_complex(c, 1, w) && w[1] == 0) {
    const double p = w[0];
    ref_t sq = p == 2 || p == 3 || p == -2 ? binop(e, "stablehlo.multiply", z, z) : z;
    if (p == 0) outs[0] = like(e, z, 1);
    else if (p == 1) outs[0] = z;
    else if (p == 2) outs[0] = sq;
    else if (p == 3) outs[0] = binop(e, "stablehlo.multiply", sq, z);
    else if (p == -2) outs[0] = binop(e, "stablehlo.divide", like(e, z, 1), sq);
    else if (p == 0.5) outs[0] = on_branch_cut(e, "stablehlo.sqrt", z, false);
    else if (p == -0.5) outs[0] = on_branch_cut(e, "stablehlo.rsqrt", z, false);
    else if (p == -1) outs[0] = binop(e, "stablehlo.divide", like(e, z, 1), z);
    if (p == 0 || p == 1 || p == 2 || p == 3 || p == -2 || p == 0.5 || p == -0.5 || p == -1) return true;
  }
  /* in complex128, rounded once, as the unary math */
  ref_t y = complex_exp(e, binop(e, "stablehlo.multiply", arg_out(n, 1, TPU_C128),
                                 unop(e, "stablehlo.log", convert(e, z, TPU_C128))));
  outs[0] = convert(e, y, odt);
  return true;
}

static bool lower_pow(node_t* n, const char* base, ref_t* outs) {
  return tpu_dtype_is_complex(n->o->dtype) ? lower_pow_complex(n, base, outs) : lower_binary(n, base, outs);
}

/* conj_physical: the imaginary part negated (a copy of a real tensor);
 * complex(real, imag); polar(abs, angle) = abs (cos angle + i sin angle), as
 * PyTorch's CPU kernel computes it */
static bool lower_complex(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0)) return false;
  if (IS_OP(conj_physical) || IS_OP(_conj_physical)) {
    ref_t x = arg_out(n, 0, odt);
    outs[0] = conj_of(e, x);
    return true;
  }
  if (!tpu_dtype_is_complex(odt) || !is_tensor(n, 1)) return false;
  const tpu_dtype_t part = tpu_dtype_complex_part(odt);
  ref_t a = arg_out(n, 0, part), b = arg_out(n, 1, part);
  if (IS_OP(complex)) outs[0] = make_complex(e, a, b);
  else if (IS_OP(polar))
    outs[0] = make_complex(e, binop(e, "stablehlo.multiply", a, unop(e, "stablehlo.cosine", b)),
                           binop(e, "stablehlo.multiply", a, unop(e, "stablehlo.sine", b)));
  else return false;
  return true;
}

/* linalg_cross(a, b, dim): the cross product of 3-vectors along dim (the
 * operands broadcast to the output's shape) */
static bool lower_cross(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!IS_OP(linalg_cross) || o->ndim == 0) return false;
  const int dim = norm_dim(tpu_arg_i64(c, 2, -1), o->ndim);
  if (o->sizes[dim] != 3) return false;
  ref_t a = arg_out(n, 0, odt), b = arg_out(n, 1, odt);
  ref_t ca[3], cb[3];
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
  memcpy(hi, o->sizes, sizeof(int64_t) * (size_t)o->ndim);
  for (int i = 0; i < 3; i++) {
    lo[dim] = i;
    hi[dim] = i + 1;
    ca[i] = slice(e, a, lo, hi);
    cb[i] = slice(e, b, lo, hi);
  }
  ref_t part[3];
  for (int i = 0; i < 3; i++) { /* a[i+1] b[i+2] - a[i+2] b[i+1] */
    const int j = (i + 1) % 3, k = (i + 2) % 3;
    part[i] = binop(e, "stablehlo.subtract", binop(e, "stablehlo.multiply", ca[j], cb[k]),
                    binop(e, "stablehlo.multiply", ca[k], cb[j]));
  }
  outs[0] = emit(e, "stablehlo.concatenate", 3, part, mkref(odt, o->ndim, o->sizes), "dimension = %d : i64", dim);
  return true;
}

/* isin(elements, test_elements, assume_unique, invert): whether each element
 * equals one of the test elements (the Tensor_Tensor, Tensor_Scalar and
 * Scalar_Tensor overloads) */
static bool lower_isin(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!IS_OP(isin) || (!is_tensor(n, 0) && !is_tensor(n, 1))) return false;
  const tpu_dtype_t ct = common_type(n, 0, 1);
  ref_t x = is_tensor(n, 0) ? convert(e, arg(n, 0), ct) : cst_like(e, ct, tpu_arg_f64(c, 0, 0), 0, NULL);
  ref_t t = is_tensor(n, 1) ? convert(e, arg(n, 1), ct) : cst_like(e, ct, tpu_arg_f64(c, 1, 0), 0, NULL);
  const int64_t m = numel(&t), nx = numel(&x);
  const bool invert = tpu_arg_bool(c, 3, false);
  if (m == 0) {
    outs[0] = cst_like(e, TPU_BOOL, invert, o->ndim, o->sizes);
    return true;
  }
  int64_t sz[2] = {nx, m};
  ref_t xb = bcast_dims(e, reshape(e, x, 1, &nx), 2, sz, (int64_t[]){0});
  ref_t tb = bcast_dims(e, reshape(e, t, 1, &m), 2, sz, (int64_t[]){1});
  ref_t any = reduce(e, convert(e, compare(e, "EQ", xb, tb), TPU_I32), 1, (int64_t[]){1}, "stablehlo.maximum", 0);
  ref_t r = compare(e, invert ? "EQ" : "NE", any, cst_like(e, TPU_I32, 0, 1, &nx));
  outs[0] = reshape(e, r, o->ndim, o->sizes);
  return true;
}

static bool lower_remainder(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (IS_OP(remainder) && (tpu_dtype_is_float(odt) || odt == TPU_I64 || odt == TPU_I32 || odt == TPU_I16 ||
                           odt == TPU_I8)) {
    /* the truncated remainder (fmod), moved to the divisor's sign (Python's %), as
     * CPU computes it; 16-bit floats in float32 */
    const tpu_dtype_t ct = acc_type(odt);
    ref_t a = arg_out(n, 0, ct), b = arg_out(n, 1, ct);
    ref_t r = binop(e, "stablehlo.remainder", a, b), zero = cst_like(e, ct, 0, r.nd, r.sz);
    ref_t fix = binop(e, "stablehlo.and", compare(e, "NE", r, zero),
                      compare(e, "NE", compare(e, "LT", r, zero), compare(e, "LT", b, zero)));
    outs[0] = convert(e, select3(e, fix, binop(e, "stablehlo.add", r, b), r), odt);
    return true;
  }
  return false;
}

static bool lower_round_any(node_t* n, const char* base, ref_t* outs) {
  return lower_round(n, base, outs) || lower_formula(n, base, outs);
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"__ilshift_", lower_shift},
    {"__irshift_", lower_shift},
    {"__lshift_", lower_shift},
    {"__rshift_", lower_shift},
    {"_conj_physical", lower_complex},
    {"abs", lower_unary},
    {"acos", lower_unary},
    {"acosh", lower_unary},
    {"add", lower_add},
    {"addcdiv", lower_addcmul},
    {"addcmul", lower_addcmul},
    {"angle", lower_formula},
    {"asin", lower_unary},
    {"asinh", lower_unary},
    {"atan", lower_unary},
    {"atan2", lower_binary},
    {"atanh", lower_unary},
    {"bitwise_and", lower_binary},
    {"bitwise_left_shift", lower_shift},
    {"bitwise_not", lower_unary},
    {"bitwise_or", lower_binary},
    {"bitwise_right_shift", lower_shift},
    {"bitwise_xor", lower_binary},
    {"ceil", lower_unary},
    {"clamp", lower_clamp},
    {"clamp_max", lower_clamp},
    {"clamp_min", lower_clamp},
    {"complex", lower_complex},
    {"conj_physical", lower_complex},
    {"copysign", lower_formula},
    {"cos", lower_unary},
    {"cosh", lower_unary},
    {"digamma", lower_formula},
    {"div", lower_div},
    {"eq", lower_compare},
    {"erf", lower_unary},
    {"erfc", lower_unary},
    {"erfinv", lower_unary},
    {"exp", lower_unary},
    {"exp2", lower_exp2},
    {"expm1", lower_unary},
    {"floor", lower_unary},
    {"floor_divide", lower_div},
    {"fmax", lower_formula},
    {"fmin", lower_formula},
    {"fmod", lower_binary},
    {"frac", lower_formula},
    {"ge", lower_compare},
    {"gelu", lower_gelu},
    {"gt", lower_compare},
    {"heaviside", lower_formula},
    {"hypot", lower_formula},
    {"isfinite", lower_isneginf},
    {"isin", lower_isin},
    {"isinf", lower_isneginf},
    {"isnan", lower_isnan},
    {"isneginf", lower_isneginf},
    {"isposinf", lower_isneginf},
    {"le", lower_compare},
    {"lerp", lower_lerp},
    {"lgamma", lower_unary},
    {"linalg_cross", lower_cross},
    {"log", lower_unary},
    {"log10", lower_log2},
    {"log1p", lower_unary},
    {"log2", lower_log2},
    {"logaddexp", lower_formula},
    {"logaddexp2", lower_formula},
    {"logical_and", lower_logical_and},
    {"logical_not", lower_logical_not},
    {"logical_or", lower_logical_and},
    {"logical_xor", lower_logical_and},
    {"logit", lower_formula},
    {"lt", lower_compare},
    {"masked_fill", lower_masked_fill},
    {"maximum", lower_binary},
    {"minimum", lower_binary},
    {"mul", lower_binary},
    {"nan_to_num", lower_formula},
    {"ne", lower_compare},
    {"neg", lower_unary},
    {"nextafter", lower_binary},
    {"polar", lower_complex},
    {"pow", lower_pow},
    {"reciprocal", lower_reciprocal},
    {"relu", lower_relu},
    {"remainder", lower_remainder},
    {"round", lower_round_any},
    {"rsqrt", lower_unary},
    {"rsub", lower_add},
    {"sgn", lower_unary},
    {"sigmoid", lower_unary},
    {"sign", lower_unary},
    {"signbit", lower_formula},
    {"silu", lower_silu},
    {"sin", lower_unary},
    {"sinc", lower_formula},
    {"sinh", lower_unary},
    {"special_entr", lower_formula},
    {"special_ndtri", lower_formula},
    {"special_xlog1py", lower_formula},
    {"special_zeta", lower_binary},
    {"sqrt", lower_unary},
    {"square", lower_square},
    {"sub", lower_add},
    {"tan", lower_unary},
    {"tanh", lower_unary},
    {"trunc", lower_trunc},
    {"where", lower_where},
    {"xlogy", lower_formula},
};

const tpu_lower_table_t tpu_lower_elementwise = {k_entries, sizeof k_entries / sizeof k_entries[0]};
