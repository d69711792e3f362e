/* Special-function lowerings (torch.special and friends): the orthogonal
 * polynomials (Chebyshev T/U/V/W and their shifted forms, Hermite H/He,
 * Laguerre, Legendre), the modified Bessel functions I0/I1 (plain and
 * exponentially scaled), K0/K1 (plain and scaled), the Bessel functions
 * J0/J1/Y0/Y1, spherical j0, erfcx, log_ndtr, polygamma and frexp.
 *
 * They follow the host kernels (runtime/targets/host/kernels/special.c and
 * specfun.c): the polynomials run their recurrences in the element type (a
 * stablehlo.while over the degree, each element stopping at its own), the
 * Bessel and normal-distribution functions are evaluated in float64 and
 * rounded once. Each function lowers the ATen ops its table names; it returns
 * false to leave the call unlowered. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"

#define PI_ 3.14159265358979323846
#define EULER_ 0.57721566490153286061

/* ---- short forms ---- */
static ref_t kx(em_t* e, ref_t x, double v) { return cst_like(e, x.dt, v, x.nd, x.sz); }
static ref_t add(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.add", a, b); }
static ref_t sub(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.subtract", a, b); }
static ref_t mul(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.multiply", a, b); }
static ref_t dvd(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.divide", a, b); }
static ref_t addk(em_t* e, ref_t a, double v) { return scalar_op(e, "stablehlo.add", a, v); }
static ref_t mulk(em_t* e, ref_t a, double v) { return scalar_op(e, "stablehlo.multiply", a, v); }
static ref_t cmpk(em_t* e, const char* dir, ref_t a, double v) { return compare(e, dir, a, kx(e, a, v)); }
static ref_t band(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.and", a, b); }
static ref_t bor(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.or", a, b); }
static ref_t un(em_t* e, const char* op, ref_t a) { return unop(e, op, a); }
static ref_t sel(em_t* e, ref_t p, ref_t a, ref_t b) { return select3(e, p, a, b); }
static ref_t isnan_(em_t* e, ref_t x) { return compare(e, "NE", x, x); }
static ref_t absx(em_t* e, ref_t x) { return un(e, "stablehlo.abs", x); }

/* sum_k c[k] q^k by Horner's rule (c[0] the constant term) */
static ref_t horner(em_t* e, ref_t q, const double* c, int n) {
  ref_t s = kx(e, q, c[n - 1]);
  for (int k = n - 2; k >= 0; k--) s = addk(e, mul(e, s, q), c[k]);
  return s;
}

/* ---- orthogonal polynomials ----
 * The degree as PyTorch reads it: truncated toward zero, and a value with no
 * int64 equivalent (nan, inf, huge) counts as negative. */
static ref_t degree_of(em_t* e, ref_t nf) {
  ref_t t = sel(e, cmpk(e, "LT", nf, 0), un(e, "stablehlo.ceil", nf), un(e, "stablehlo.floor", nf));
  t = sel(e, cmpk(e, "LT", absx(e, nf), 9.2e18), t, kx(e, nf, -1));
  return convert(e, t, TPU_I64);
}

typedef enum { REC_CHEB, REC_HERMITE_H, REC_HERMITE_HE, REC_LAGUERRE, REC_LEGENDRE } rec_kind_t;

/* carried: k (i64 scalar), kmax (i64 scalar), x, deg (i64), p, q */
typedef struct {
  rec_kind_t kind;
} rec_ctx_t;

static ref_t rec_active(em_t* e, const ref_t* v) {
  ref_t k = bcast(e, v[0], v[3].nd, v[3].sz);
  ref_t live = compare(e, "LE", k, v[3]);
  return band(e, live, compare(e, "EQ", v[5], v[5]));
}

static ref_t rec_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  return band(e, compare(e, "LE", v[0], v[1]), any_of(e, rec_active(e, v)));
}

/* one step k of the recurrence: P_{k} from q = P_{k-1}, p = P_{k-2}, or as
 * the host loops count them (see each case) */
static void rec_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  const rec_ctx_t* rc = ctx;
  ref_t x = v[2], p = v[4], q = v[5];
  ref_t kf = bcast(e, convert(e, v[0], x.dt), x.nd, x.sz), r;
  switch (rc->kind) {
    case REC_CHEB: /* r = 2y q - p */
      r = sub(e, mul(e, add(e, x, x), q), p);
      break;
    case REC_HERMITE_H: /* step j: r = 2x q - 2j p */
      r = sub(e, mul(e, add(e, x, x), q), mul(e, add(e, kf, kf), p));
      break;
    case REC_HERMITE_HE: /* r = x q - k p */
      r = sub(e, mul(e, x, q), mul(e, kf, p));
      break;
    case REC_LAGUERRE: /* r = ((2k + (1 - x)) q - k p) / (k + 1) */
      r = dvd(e, sub(e, mul(e, add(e, add(e, kf, kf), sub(e, kx(e, x, 1), x)), q), mul(e, kf, p)), addk(e, kf, 1));
      break;
    default: /* Legendre: r = ((2k + 1) x q - k p) / (k + 1) */
      r = dvd(e, sub(e, mul(e, mul(e, addk(e, add(e, kf, kf), 1), x), q), mul(e, kf, p)), addk(e, kf, 1));
      break;
  }
  ref_t live = rec_active(e, v);
  nx[0] = add(e, v[0], cst(e, TPU_I64, 1));
  nx[1] = v[1];
  nx[2] = x;
  nx[3] = v[3];
  nx[4] = sel(e, live, q, p);
  nx[5] = sel(e, live, r, q);
}

/* Runs the recurrence from k = k0 while k <= deg where `need` holds;
 * returns the final q. */
static ref_t recurrence(em_t* e, rec_kind_t kind, ref_t x, ref_t deg, ref_t need, ref_t p0, ref_t q0, int64_t k0) {
  ref_t dn = sel(e, need, deg, cst_like(e, TPU_I64, -1, deg.nd, deg.sz));
  int64_t dims[TPU_MAX_DIMS];
  for (int d = 0; d < dn.nd; d++) dims[d] = d;
  ref_t kmax = reduce(e, dn, dn.nd, dims, "stablehlo.maximum", -1);
  ref_t v[6] = {cst(e, TPU_I64, (double)k0), kmax, x, dn, p0, q0};
  rec_ctx_t rc = {kind};
  while_loop(e, 6, v, rec_cond, rec_body, &rc);
  return v[5];
}

/* the parity sign (-1)^n of an i64 degree, in x's type */
static ref_t parity(em_t* e, ref_t deg, ref_t x) {
  ref_t odd = compare(e, "NE", binop(e, "stablehlo.and", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz)),
                      cst_like(e, TPU_I64, 0, deg.nd, deg.sz));
  return sel(e, odd, kx(e, x, -1), kx(e, x, 1));
}

/* Chebyshev kind 0..3 = T, U, V, W at y; degrees above lim with |y| < 1 take
 * the trigonometric form; `shifted`: the W form's value where cos(acos(y)/2)
 * is 1 follows the parity (PyTorch's shifted polynomial). */
static ref_t chebyshev(em_t* e, ref_t y, ref_t deg, int kind, int64_t lim, bool shifted) {
  ref_t nf = convert(e, deg, y.dt), np1 = addk(e, nf, 1), n2p1 = addk(e, add(e, nf, nf), 1);
  ref_t odd = parity(e, deg, y), one = kx(e, y, 1), ay = absx(e, y), pos = cmpk(e, "GT", y, 0);
  /* |y| == 1 */
  ref_t at1;
  switch (kind) {
    case 0: at1 = sel(e, pos, one, odd); break;
    case 1: at1 = sel(e, pos, np1, mul(e, odd, np1)); break;
    case 2: at1 = sel(e, pos, one, mul(e, odd, n2p1)); break;
    default: at1 = sel(e, pos, n2p1, odd); break;
  }
  /* the trigonometric form */
  ref_t th = un(e, "chlo.acos", y), trig;
  ref_t half = mulk(e, th, 0.5), nh = mul(e, addk(e, nf, 0.5), th);
  switch (kind) {
    case 0: trig = un(e, "stablehlo.cosine", mul(e, nf, th)); break;
    case 1: {
      ref_t s = un(e, "stablehlo.sine", th);
      trig = sel(e, cmpk(e, "NE", s, 0), dvd(e, un(e, "stablehlo.sine", mul(e, np1, th)), s),
                 dvd(e, mul(e, np1, un(e, "stablehlo.cosine", mul(e, np1, th))), y));
      break;
    }
    case 2:
      trig = sel(e, cmpk(e, "NE", un(e, "stablehlo.sine", half), 1),
                 dvd(e, un(e, "stablehlo.cosine", nh), un(e, "stablehlo.cosine", half)), mul(e, odd, n2p1));
      break;
    default: {
      ref_t alt = shifted ? odd : sel(e, pos, n2p1, odd);
      trig = sel(e, cmpk(e, "NE", un(e, "stablehlo.cosine", half), 1),
                 dvd(e, un(e, "stablehlo.sine", nh), un(e, "stablehlo.sine", half)), alt);
      break;
    }
  }
  ref_t first;
  switch (kind) {
    case 0: first = y; break;
    case 1: first = add(e, y, y); break;
    case 2: first = addk(e, add(e, y, y), -1); break;
    default: first = addk(e, add(e, y, y), 1); break;
  }
  ref_t is1 = cmpk(e, "EQ", ay, 1);
  ref_t use_trig = band(e, compare(e, "GT", deg, cst_like(e, TPU_I64, (double)lim, deg.nd, deg.sz)), cmpk(e, "LT", ay, 1));
  ref_t zero_i = cst_like(e, TPU_I64, 0, deg.nd, deg.sz);
  ref_t need = band(e, un(e, "stablehlo.not", bor(e, is1, use_trig)), compare(e, "GE", deg, cst_like(e, TPU_I64, 2, deg.nd, deg.sz)));
  ref_t r = recurrence(e, REC_CHEB, y, deg, need, one, first, 2);
  r = sel(e, compare(e, "EQ", deg, zero_i), one, r);
  r = sel(e, use_trig, trig, r);
  r = sel(e, is1, at1, r);
  return sel(e, compare(e, "LT", deg, zero_i), kx(e, y, 0), r);
}

static const struct {
  const char* name;
  int kind;
  int64_t lim;
  bool shifted;
} k_cheb[] = {
    {"special_chebyshev_polynomial_t", 0, 6, false},         {"special_chebyshev_polynomial_u", 1, 8, false},
    {"special_chebyshev_polynomial_v", 2, 8, false},         {"special_chebyshev_polynomial_w", 3, 8, false},
    {"special_shifted_chebyshev_polynomial_t", 0, 6, true},  {"special_shifted_chebyshev_polynomial_u", 1, 6, true},
    {"special_shifted_chebyshev_polynomial_v", 2, 6, true},  {"special_shifted_chebyshev_polynomial_w", 3, 4, true},
};

static bool lower_polynomial(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (odt != TPU_F32 && odt != TPU_F64) return false;
  if (!(is_tensor(n, 0) || is_number(n, 0)) || !(is_tensor(n, 1) || is_number(n, 1))) return false;
  ref_t x = arg_out(n, 0, odt), deg = degree_of(e, arg_out(n, 1, odt));
  ref_t zero_i = cst_like(e, TPU_I64, 0, deg.nd, deg.sz), one = kx(e, x, 1), r;
  ref_t lt0 = compare(e, "LT", deg, zero_i), is0 = compare(e, "EQ", deg, zero_i);
  ref_t is1 = compare(e, "EQ", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz));
  ref_t ge2 = compare(e, "GE", deg, cst_like(e, TPU_I64, 2, deg.nd, deg.sz));
  for (size_t i = 0; i < sizeof k_cheb / sizeof k_cheb[0]; i++)
    if (!strcmp(base, k_cheb[i].name)) {
      ref_t y = k_cheb[i].shifted ? addk(e, add(e, x, x), -1) : x;
      outs[0] = chebyshev(e, y, deg, k_cheb[i].kind, k_cheb[i].lim, k_cheb[i].shifted);
      return true;
    }
  if (!strcmp(base, "special_hermite_polynomial_h") || !strcmp(base, "special_hermite_polynomial_he")) {
    const bool phys = base[strlen(base) - 1] == 'h';
    const int64_t limit = odt == TPU_F32 ? 128 : 512;
    ref_t q1 = phys ? add(e, x, x) : x;
    ref_t big = compare(e, "GT", deg, cst_like(e, TPU_I64, (double)limit, deg.nd, deg.sz));
    /* steps j = 1 .. n-1: run while j <= n - 1 */
    ref_t dm1 = binop(e, "stablehlo.subtract", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz));
    ref_t need = band(e, ge2, un(e, "stablehlo.not", big));
    r = recurrence(e, phys ? REC_HERMITE_H : REC_HERMITE_HE, x, dm1, need, one, q1, 1);
    r = sel(e, big, kx(e, x, NAN), r);
    r = sel(e, is1, q1, r);
  } else if (!strcmp(base, "special_laguerre_polynomial_l")) {
    ref_t q1 = sub(e, one, x);
    ref_t dm1 = binop(e, "stablehlo.subtract", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz));
    r = recurrence(e, REC_LAGUERRE, x, dm1, ge2, one, q1, 1);
    r = sel(e, is1, q1, r);
    r = sel(e, cmpk(e, "EQ", absx(e, x), 0), one, r);
  } else if (!strcmp(base, "special_legendre_polynomial_p")) {
    ref_t dm1 = binop(e, "stablehlo.subtract", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz));
    r = recurrence(e, REC_LEGENDRE, x, dm1, ge2, one, x, 1);
    r = sel(e, is1, x, r);
    ref_t even = compare(e, "EQ", binop(e, "stablehlo.and", deg, cst_like(e, TPU_I64, 1, deg.nd, deg.sz)), zero_i);
    ref_t at1 = sel(e, bor(e, cmpk(e, "GT", x, 0), even), one, kx(e, x, -1));
    r = sel(e, is0, one, r);
    r = sel(e, cmpk(e, "EQ", absx(e, x), 1), at1, r);
    outs[0] = sel(e, lt0, kx(e, x, 0), r);
    return true;
  } else {
    return false;
  }
  r = sel(e, is0, one, r);
  outs[0] = sel(e, lt0, kx(e, x, 0), r);
  return true;
}

/* ---- Bessel functions (evaluated in float64) ---- */
#define NSERIES 48

/* I_nu(ax) for ax <= 30 (or nan): (ax/2)^nu sum_k q^k / (k! (k+nu)!), q = ax^2/4,
 * positive terms (no cancellation) */
static ref_t bessel_i_series(em_t* e, int nu, ref_t ax) {
  double c[NSERIES], f = 1; /* 1 / (k! (k+nu)!) */
  for (int k = 0; k < NSERIES; k++) {
    if (k) f /= (double)k * (double)(k + nu);
    c[k] = f;
  }
  ref_t s = horner(e, mulk(e, mul(e, ax, ax), 0.25), c, NSERIES);
  return nu ? mul(e, s, mulk(e, ax, 0.5)) : s;
}

/* e^-ax I_nu(ax) for ax > 30: the asymptotic expansion
 * sum_k a_k / ax^k / sqrt(2 pi ax), a_k = a_{k-1} (-(mu - (2k-1)^2)) / (8k) */
#define NASYM 40
static ref_t bessel_i_asym(em_t* e, int nu, ref_t ax) {
  double c[NASYM], mu = 4.0 * nu * nu;
  c[0] = 1;
  for (int k = 1; k < NASYM; k++) c[k] = c[k - 1] * -(mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k);
  ref_t s = horner(e, dvd(e, kx(e, ax, 1), ax), c, NASYM);
  return dvd(e, s, un(e, "stablehlo.sqrt", mulk(e, ax, 2 * PI_)));
}

/* I_nu(x), nu = 0, 1 (odd for 1); `scaled` multiplies by e^-|x|; nan at
 * +-inf unscaled, 0 scaled (PyTorch's values) */
static ref_t bessel_i(em_t* e, int nu, ref_t x, bool scaled) {
  ref_t ax = absx(e, x), big = cmpk(e, "GT", ax, 30);
  ref_t ser = bessel_i_series(e, nu, ax), asy = bessel_i_asym(e, nu, ax);
  if (scaled) ser = mul(e, ser, un(e, "stablehlo.exponential", un(e, "stablehlo.negate", ax)));
  else asy = mul(e, asy, un(e, "stablehlo.exponential", ax));
  ref_t v = sel(e, big, asy, ser);
  v = sel(e, cmpk(e, "EQ", ax, INFINITY), kx(e, x, scaled ? 0 : NAN), v);
  return nu ? sel(e, cmpk(e, "LT", x, 0), un(e, "stablehlo.negate", v), v) : v;
}

/* J_nu (nu = 0, 1) and Y_nu of ax > 0 up to 17: the power series (in q =
 * ax^2/4, alternating; cancellation costs at most ~1e-10 there); above,
 * Hankel's asymptotic expansion, whose smallest term there is below 1e-13. */
#define NJ 46
#define NH 36
static ref_t bessel_j_series(em_t* e, int nu, ref_t ax, ref_t q) {
  double c[NJ], f = 1;
  for (int k = 0; k < NJ; k++) {
    if (k) f /= (double)k * (double)(k + nu);
    c[k] = k % 2 ? -f : f;
  }
  ref_t s = horner(e, q, c, NJ);
  return nu ? mul(e, s, mulk(e, ax, 0.5)) : s;
}

/* Y0 = 2/pi (log(x/2) + gamma) J0 + 2/pi sum_{k>=1} (-1)^(k+1) H_k q^k / k!^2;
 * Y1 = -2/(pi x) + 2/pi log(x/2) J1 - x/(2 pi) sum_k (-1)^k (psi(k+1) + psi(k+2)) q^k / (k! (k+1)!) */
static ref_t bessel_y_series(em_t* e, int nu, ref_t ax, ref_t q, ref_t j) {
  double c[NJ], f = 1, h = 0;
  for (int k = 0; k < NJ; k++) {
    if (k) {
      f /= (double)k * (double)(k + nu);
      h += 1.0 / k;
    }
    const double sg = k % 2 ? -1 : 1;
    c[k] = nu ? sg * ((h - EULER_) + (h + 1.0 / (k + 1) - EULER_)) * f : -sg * h * f;
  }
  ref_t s = horner(e, q, c, NJ), lg = un(e, "stablehlo.log", mulk(e, ax, 0.5));
  if (!nu) return add(e, mulk(e, mul(e, addk(e, lg, EULER_), j), 2 / PI_), mulk(e, s, 2 / PI_));
  ref_t r = sub(e, mulk(e, mul(e, lg, j), 2 / PI_), dvd(e, kx(e, ax, 2 / PI_), ax));
  return sub(e, r, mulk(e, mul(e, ax, s), 0.5 / PI_));
}

/* Hankel: P, Q in z = 1/x; J = sqrt(2/(pi x)) (P cos chi - Q sin chi),
 * Y = sqrt(2/(pi x)) (P sin chi + Q cos chi), chi = x - (nu/2 + 1/4) pi */
static ref_t bessel_hankel(em_t* e, int nu, ref_t ax, bool y) {
  double a[NH], pc[NH / 2], qc[NH / 2], mu = 4.0 * nu * nu;
  a[0] = 1;
  for (int k = 1; k < NH; k++) a[k] = a[k - 1] * (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k);
  for (int k = 0; k < NH / 2; k++) {
    pc[k] = k % 2 ? -a[2 * k] : a[2 * k];
    qc[k] = k % 2 ? -a[2 * k + 1] : a[2 * k + 1];
  }
  ref_t z = dvd(e, kx(e, ax, 1), ax), z2 = mul(e, z, z);
  ref_t p = horner(e, z2, pc, NH / 2), qq = mul(e, z, horner(e, z2, qc, NH / 2));
  /* cos / sin of x - phi from those of x */
  const double phi = (nu / 2.0 + 0.25) * PI_;
  ref_t cx = un(e, "stablehlo.cosine", ax), sx = un(e, "stablehlo.sine", ax);
  ref_t cc = add(e, mulk(e, cx, cos(phi)), mulk(e, sx, sin(phi)));
  ref_t ss = sub(e, mulk(e, sx, cos(phi)), mulk(e, cx, sin(phi)));
  ref_t v = y ? add(e, mul(e, p, ss), mul(e, qq, cc)) : sub(e, mul(e, p, cc), mul(e, qq, ss));
  return mul(e, v, un(e, "stablehlo.sqrt", dvd(e, kx(e, ax, 2 / PI_), ax)));
}

static ref_t bessel_jy(em_t* e, int nu, ref_t x, bool y) {
  ref_t ax = absx(e, x), q = mulk(e, mul(e, ax, ax), 0.25), big = cmpk(e, "GT", ax, 17);
  ref_t j = bessel_j_series(e, nu, ax, q);
  ref_t v = sel(e, big, bessel_hankel(e, nu, ax, y), y ? bessel_y_series(e, nu, ax, q, j) : j);
  ref_t inf = cmpk(e, "EQ", ax, INFINITY);
  if (!y) {
    v = sel(e, inf, kx(e, x, NAN), v);
    return nu ? sel(e, cmpk(e, "LT", x, 0), un(e, "stablehlo.negate", v), v) : v;
  }
  v = sel(e, cmpk(e, "EQ", x, 0), kx(e, x, -INFINITY), v);
  return sel(e, bor(e, inf, cmpk(e, "LT", x, 0)), kx(e, x, NAN), v);
}

/* e^x K_nu(x), x > 0, by the trapezoidal rule (step 1/16) on
 * int_0^inf exp(-2x sinh^2(t/2)) cosh(nu t) dt, as the host kernel, in a
 * loop that stops once every element's terms fell below 1e-18 of its sum.
 * carried: k (f64 scalar), x, sum, last term */
static ref_t kloop_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  ref_t big = compare(e, "GE", v[3], mulk(e, v[2], 1e-18));
  return band(e, compare(e, "LT", v[0], cst(e, TPU_F64, 2000)), any_of(e, big));
}
static void kloop_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  const double nu = *(const double*)ctx;
  ref_t t = mulk(e, v[0], 1.0 / 16), s = un(e, "chlo.sinh", mulk(e, t, 0.5));
  ref_t g = mulk(e, mul(e, s, s), -2.0);
  ref_t ch = un(e, "chlo.cosh", mulk(e, t, nu));
  ref_t x = v[1];
  ref_t f = mul(e, un(e, "stablehlo.exponential", mul(e, x, bcast(e, g, x.nd, x.sz))), bcast(e, ch, x.nd, x.sz));
  nx[0] = addk(e, v[0], 1);
  nx[1] = x;
  nx[2] = add(e, v[2], f);
  nx[3] = f;
}
static ref_t bessel_k_scaled(em_t* e, double nu, ref_t x) {
  ref_t v[4] = {cst(e, TPU_F64, 1), x, kx(e, x, 0.5), kx(e, x, 1)};
  while_loop(e, 4, v, kloop_cond, kloop_body, &nu);
  return mulk(e, v[2], 1.0 / 16);
}

/* K0 / K1 (scaled: times e^x): inf at 0, nan below, 0 at inf */
static ref_t bessel_k(em_t* e, int nu, ref_t x, bool scaled) {
  /* the loop runs on x clamped into (0, inf) so that it ends */
  ref_t ok = band(e, cmpk(e, "GT", x, 0), cmpk(e, "LT", x, INFINITY));
  ref_t xs = sel(e, ok, x, kx(e, x, 1));
  ref_t s = bessel_k_scaled(e, nu, xs);
  if (!scaled) s = mul(e, s, un(e, "stablehlo.exponential", un(e, "stablehlo.negate", xs)));
  s = sel(e, cmpk(e, "EQ", x, INFINITY), kx(e, x, 0), s);
  s = sel(e, cmpk(e, "EQ", x, 0), kx(e, x, INFINITY), s);
  s = sel(e, cmpk(e, "LT", x, 0), kx(e, x, NAN), s);
  return sel(e, isnan_(e, x), x, s);
}

/* sin(x)/x: 0 at +-inf, a Maclaurin series below 0.5 */
static ref_t spherical_j0(em_t* e, ref_t x) {
  static const double c[7] = {1, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800.0};
  ref_t ser = horner(e, mul(e, x, x), c, 7);
  ref_t v = sel(e, cmpk(e, "LT", absx(e, x), 0.5), ser, dvd(e, un(e, "stablehlo.sine", x), x));
  return sel(e, cmpk(e, "EQ", absx(e, x), INFINITY), kx(e, x, 0), v);
}

/* ---- the normal distribution (float64) ---- */
/* exp(x^2) erfc(x) for x >= 0: direct up to 26 (x^2 of a float32 x is exact
 * in float64), the asymptotic series beyond, 0 at inf */
static ref_t erfcx_pos(em_t* e, ref_t x) {
  ref_t direct = mul(e, un(e, "stablehlo.exponential", mul(e, x, x)), un(e, "chlo.erfc", x));
  double c[8];
  c[0] = 1;
  for (int k = 1; k < 8; k++) c[k] = c[k - 1] * -(2.0 * k - 1);
  ref_t z = dvd(e, kx(e, x, 0.5), mul(e, x, x));
  ref_t asy = dvd(e, horner(e, z, c, 8), mulk(e, x, sqrt(PI_)));
  ref_t v = sel(e, cmpk(e, "GT", x, 26), asy, direct);
  return sel(e, cmpk(e, "EQ", x, INFINITY), kx(e, x, 0), v);
}

static ref_t erfcx(em_t* e, ref_t x) {
  ref_t ax = absx(e, x), p = erfcx_pos(e, ax);
  ref_t neg = sub(e, mulk(e, un(e, "stablehlo.exponential", mul(e, x, x)), 2), p);
  neg = sel(e, cmpk(e, "LT", x, -26.7), kx(e, x, INFINITY), neg);
  ref_t v = sel(e, cmpk(e, "LT", x, 0), neg, p);
  return sel(e, isnan_(e, x), x, v);
}

/* log Phi(x) */
static ref_t log_ndtr(em_t* e, ref_t x) {
  ref_t t = mulk(e, x, M_SQRT1_2);
  ref_t lo = sub(e, un(e, "stablehlo.log", mulk(e, erfcx(e, un(e, "stablehlo.negate", t)), 0.5)), mul(e, t, t));
  ref_t hi = un(e, "stablehlo.log_plus_one", mulk(e, un(e, "chlo.erfc", t), -0.5));
  return sel(e, cmpk(e, "LT", x, -1), lo, hi);
}

/* ---- polygamma (float64, with the host kernel's conventions) ---- */
/* the terms sum += f(w), w += 1 while w < 10, per element; carried: w, sum.
 * f(w) = w^-s (s > 0 the power). */
static ref_t shift_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  return any_of(e, cmpk(e, "LT", v[0], 10));
}
static void shift_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  const double s = *(const double*)ctx;
  ref_t w = v[0], live = cmpk(e, "LT", w, 10);
  ref_t t = binop(e, "stablehlo.power", w, kx(e, w, -s));
  nx[0] = sel(e, live, addk(e, w, 1), w);
  nx[1] = sel(e, live, add(e, v[1], t), v[1]);
}

/* Hurwitz zeta(s, q) for an integer s >= 2: direct terms until q + k >= 10,
 * then the Euler-Maclaurin tail; inf at non-positive integer q. q is
 * clamped above -1e6 so that the loop ends (the host sums on; such
 * arguments are far outside what float32 resolves anyway). */
static ref_t zeta_int(em_t* e, double s, ref_t q) {
  static const double b2j[12] = {
      8.333333333333333e-02,  -1.388888888888889e-03, 3.306878306878307e-05,
      -8.267195767195768e-07, 2.08767569878681e-08,   -5.284190138687493e-10,
      1.3382536530684679e-11, -3.3896802963225827e-13, 8.586062056277845e-15,
      -2.174868698558062e-16, 5.5090028283602295e-18, -1.3954464685812522e-19};
  ref_t bad = bor(e, isnan_(e, q), cmpk(e, "LT", q, -1e6));
  ref_t v[2] = {sel(e, bad, kx(e, q, 10), q), kx(e, q, 0)};
  while_loop(e, 2, v, shift_cond, shift_body, &s);
  ref_t w = v[0], ws = binop(e, "stablehlo.power", w, kx(e, w, -s));
  ref_t tail = add(e, mulk(e, mul(e, w, ws), 1 / (s - 1)), mulk(e, ws, 0.5));
  ref_t wp = dvd(e, ws, w), w2 = mul(e, w, w);
  double poch = s;
  for (int j = 0; j < 12; j++) {
    tail = add(e, tail, mulk(e, wp, b2j[j] * poch));
    poch *= (s + 2 * j + 1) * (s + 2 * j + 2);
    wp = dvd(e, wp, w2);
  }
  ref_t z = add(e, v[1], tail);
  ref_t pole = band(e, cmpk(e, "LE", q, 0), compare(e, "EQ", q, un(e, "stablehlo.floor", q)));
  z = sel(e, pole, kx(e, q, INFINITY), z);
  return sel(e, bad, kx(e, q, NAN), z);
}

/* psi'(x), x >= 0.5: 1/x^2 terms up to 10, then 1/x + 1/(2x^2) + sum B_2k / x^(2k+1) */
static ref_t trigamma_pos(em_t* e, ref_t x) {
  double two = 2;
  ref_t v[2] = {x, kx(e, x, 0)};
  while_loop(e, 2, v, shift_cond, shift_body, &two);
  ref_t w = v[0], z = dvd(e, kx(e, w, 1), mul(e, w, w));
  static const double c[6] = {0, 1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66};
  ref_t series = horner(e, z, c, 6);
  ref_t t = dvd(e, add(e, addk(e, dvd(e, kx(e, w, 0.5), w), 1), series), w);
  return add(e, v[1], t);
}

static bool lower_polygamma(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if ((odt != TPU_F32 && odt != TPU_F64) || c->args[0].kind != TPU_ARG_INT || !is_tensor(n, 1)) return false;
  const int64_t order = c->args[0].v.i;
  if (order < 0) return false;
  ref_t x = arg_out(n, 1, odt);
  if (order == 0) { /* digamma: -inf at +0, +inf at -0 */
    ref_t neg0 = compare(e, "LT", binop(e, "stablehlo.divide", kx(e, x, 1), x), kx(e, x, 0));
    ref_t at0 = sel(e, neg0, kx(e, x, INFINITY), kx(e, x, -INFINITY));
    outs[0] = sel(e, cmpk(e, "EQ", x, 0), at0, un(e, "chlo.digamma", x));
    return true;
  }
  ref_t xd = convert(e, x, TPU_F64), r;
  if (order == 1) {
    /* below 0.5 the reflection pi^2 / sin^2(pi x) - psi'(1 - x), its first
     * term in the element type (as the host kernel and PyTorch) */
    ref_t low = cmpk(e, "LT", x, 0.5);
    ref_t arg = sel(e, low, sub(e, kx(e, xd, 1), xd), xd);
    ref_t tp = trigamma_pos(e, sel(e, isnan_(e, arg), kx(e, arg, 1), arg));
    tp = sel(e, isnan_(e, arg), arg, tp);
    const double pi = odt == TPU_F32 ? (double)(float)PI_ : PI_;
    ref_t sn = un(e, "stablehlo.sine", mulk(e, x, pi));
    ref_t refl = convert(e, dvd(e, kx(e, x, odt == TPU_F32 ? (double)((float)pi * (float)pi) : pi * pi), mul(e, sn, sn)), TPU_F64);
    r = sel(e, low, sub(e, refl, tp), tp);
  } else {
    double f = 1;
    for (int64_t k = 2; k <= order; k++) f *= (double)k;
    r = mulk(e, zeta_int(e, (double)order + 1, xd), order % 2 ? f : -f);
  }
  outs[0] = convert(e, r, odt);
  return true;
}

/* frexp(x) -> (mantissa in [0.5, 1) with x's sign, exponent int) from the
 * float32 bits alone (XLA's CPU code flushes subnormals in arithmetic):
 * exponent field f > 0: f - 126; subnormals, the highest set bit p of the
 * fraction: p - 148, the fraction shifted up to the implicit bit; 0, inf,
 * nan: (x, 0) */
static ref_t i32k(em_t* e, ref_t like_, int64_t v) { return cst_like(e, TPU_I32, (double)v, like_.nd, like_.sz); }
static bool lower_frexp(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!is_tensor(n, 0) || odt != TPU_F32 || c->nouts != 2 || c->outs[1].dtype == TPU_DTYPE_NONE) return false;
  ref_t x = arg_out(n, 0, TPU_F32);
  ref_t bits = emit(e, "stablehlo.bitcast_convert", 1, &x, mkref(TPU_I32, x.nd, x.sz), NULL);
  ref_t field = binop(e, "stablehlo.and", binop(e, "stablehlo.shift_right_logical", bits, i32k(e, x, 23)), i32k(e, x, 255));
  ref_t frac = binop(e, "stablehlo.and", bits, i32k(e, x, 0x7FFFFF));
  ref_t sign = binop(e, "stablehlo.and", bits, i32k(e, x, INT32_MIN));
  ref_t lz = un(e, "stablehlo.count_leading_zeros", frac);
  ref_t sub = compare(e, "EQ", field, i32k(e, x, 0));
  ref_t ex = sel(e, sub, binop(e, "stablehlo.subtract", i32k(e, x, -117), lz), binop(e, "stablehlo.subtract", field, i32k(e, x, 126)));
  ref_t up = binop(e, "stablehlo.and", binop(e, "stablehlo.shift_left", frac, binop(e, "stablehlo.subtract", lz, i32k(e, x, 8))),
                   i32k(e, x, 0x7FFFFF));
  ref_t mfrac = sel(e, sub, up, frac);
  ref_t mbits = binop(e, "stablehlo.or", binop(e, "stablehlo.or", sign, i32k(e, x, 126 << 23)), mfrac);
  ref_t mant = emit(e, "stablehlo.bitcast_convert", 1, &mbits, mkref(TPU_F32, x.nd, x.sz), NULL);
  ref_t special = bor(e, band(e, sub, compare(e, "EQ", frac, i32k(e, x, 0))), compare(e, "EQ", field, i32k(e, x, 255)));
  outs[0] = sel(e, special, x, mant);
  outs[1] = convert(e, sel(e, special, i32k(e, x, 0), ex), c->outs[1].dtype);
  return true;
}

static bool lower_in_f64(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((odt != TPU_F32 && odt != TPU_F64) || !is_tensor(n, 0)) return false;
  ref_t x = arg_out(n, 0, TPU_F64), r;
  if (!strcmp(base, "i0") || !strcmp(base, "special_modified_bessel_i0")) r = bessel_i(e, 0, x, false);
  else if (!strcmp(base, "special_i0e")) r = bessel_i(e, 0, x, true);
  else if (!strcmp(base, "special_i1") || !strcmp(base, "special_modified_bessel_i1")) r = bessel_i(e, 1, x, false);
  else if (!strcmp(base, "special_i1e")) r = bessel_i(e, 1, x, true);
  else if (!strcmp(base, "special_bessel_j0")) r = bessel_jy(e, 0, x, false);
  else if (!strcmp(base, "special_bessel_j1")) r = bessel_jy(e, 1, x, false);
  else if (!strcmp(base, "special_bessel_y0")) r = bessel_jy(e, 0, x, true);
  else if (!strcmp(base, "special_bessel_y1")) r = bessel_jy(e, 1, x, true);
  else if (!strcmp(base, "special_modified_bessel_k0")) r = bessel_k(e, 0, x, false);
  else if (!strcmp(base, "special_modified_bessel_k1")) r = bessel_k(e, 1, x, false);
  else if (!strcmp(base, "special_scaled_modified_bessel_k0")) r = bessel_k(e, 0, x, true);
  else if (!strcmp(base, "special_scaled_modified_bessel_k1")) r = bessel_k(e, 1, x, true);
  else if (!strcmp(base, "special_spherical_bessel_j0")) r = spherical_j0(e, x);
  else if (!strcmp(base, "special_erfcx")) r = erfcx(e, x);
  else if (!strcmp(base, "special_log_ndtr")) r = log_ndtr(e, x);
  else return false;
  outs[0] = convert(e, r, odt);
  return true;
}

/* ---- table ---- */
static const tpu_lower_entry_t k_entries[] = {
    {"frexp", lower_frexp},
    {"i0", lower_in_f64},
    {"polygamma", lower_polygamma},
    {"special_bessel_j0", lower_in_f64},
    {"special_bessel_j1", lower_in_f64},
    {"special_bessel_y0", lower_in_f64},
    {"special_bessel_y1", lower_in_f64},
    {"special_chebyshev_polynomial_t", lower_polynomial},
    {"special_chebyshev_polynomial_u", lower_polynomial},
    {"special_chebyshev_polynomial_v", lower_polynomial},
    {"special_chebyshev_polynomial_w", lower_polynomial},
    {"special_erfcx", lower_in_f64},
    {"special_hermite_polynomial_h", lower_polynomial},
    {"special_hermite_polynomial_he", lower_polynomial},
    {"special_i0e", lower_in_f64},
    {"special_i1", lower_in_f64},
    {"special_i1e", lower_in_f64},
    {"special_laguerre_polynomial_l", lower_polynomial},
    {"special_legendre_polynomial_p", lower_polynomial},
    {"special_log_ndtr", lower_in_f64},
    {"special_modified_bessel_i0", lower_in_f64},
    {"special_modified_bessel_i1", lower_in_f64},
    {"special_modified_bessel_k0", lower_in_f64},
    {"special_modified_bessel_k1", lower_in_f64},
    {"special_scaled_modified_bessel_k0", lower_in_f64},
    {"special_scaled_modified_bessel_k1", lower_in_f64},
    {"special_shifted_chebyshev_polynomial_t", lower_polynomial},
    {"special_shifted_chebyshev_polynomial_u", lower_polynomial},
    {"special_shifted_chebyshev_polynomial_v", lower_polynomial},
    {"special_shifted_chebyshev_polynomial_w", lower_polynomial},
    {"special_spherical_bessel_j0", lower_in_f64},
};

const tpu_lower_table_t tpu_lower_special = {k_entries, sizeof k_entries / sizeof k_entries[0]};
