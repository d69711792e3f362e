/* More special functions (torch.special): the orthogonal polynomials
 * (Chebyshev T/U/V/W and their shifted forms, Hermite H/He, Laguerre,
 * Legendre), Bessel J0/J1/Y0/Y1, modified Bessel K0/K1 (plain and scaled),
 * Airy Ai, spherical j0, the normal quantile ndtri, log_ndtr, erfcx and the
 * regularized incomplete gamma functions igamma / igammac.
 *
 * Polynomials run their recurrences in the loop's type (float for float32,
 * like PyTorch's CPU kernels, so long recurrences round the same way); the
 * Bessel, Airy and normal-distribution functions are evaluated in double and
 * rounded once. Loop bodies run on the element-wise engine. */
#include <tgmath.h>

#include "kernels.h"

#define PI_ 3.14159265358979323846
#define SQRT2_ 1.41421356237309504880
#define SQRTPI_ 1.77245385090551602730

/* The degree argument as PyTorch reads it: truncated toward zero; a value
 * without an int64 equivalent (nan, inf, huge) counts as negative. */
static int64_t degree_of(double n) { return fabs(n) < 9.2e18 ? (int64_t)n : -1; }

/* ---- Chebyshev families ----
 * kind 0..3 = T, U, V, W evaluated at y (y = 2x - 1 for the shifted forms).
 * `lim` is the degree above which |y| < 1 takes the trigonometric form, and
 * `shifted` selects PyTorch's shifted-form value where cos(acos(y)/2) == 1
 * in the W form (parity based instead of 2n+1). */
#define CHEBYSHEV(T, NAME)                                                     \
  static T NAME(T y, int64_t n, int kind, int64_t lim, int shifted) {          \
    if (n < 0) return 0;                                                       \
    const T odd = (T)(n % 2 ? -1 : 1); /* (-1)^n */                            \
    if (fabs(y) == 1) {                                                        \
      switch (kind) {                                                          \
        case 0: return y > 0 ? (T)1 : odd;                                     \
        case 1: return y > 0 ? (T)(n + 1) : odd * (T)(n + 1);                  \
        case 2: return y > 0 ? (T)1 : odd * (T)(n + n + 1);                    \
        default: return y > 0 ? (T)(n + n + 1) : odd;                          \
      }                                                                        \
    }                                                                          \
    if (n > lim && fabs(y) < 1) {                                              \
      T th = acos(y);                                                          \
      switch (kind) {                                                          \
        case 0: return cos((T)n * th);                                         \
        case 1:                                                                \
          if (sin(th) != 0) return sin((T)(n + 1) * th) / sin(th);             \
          return (T)(n + 1) * cos((T)(n + 1) * th) / y;                        \
        case 2:                                                                \
          if (sin(th / 2) != 1) return cos(((T)n + (T)0.5) * th) / cos(th / 2); \
          return odd * (T)(n + n + 1);                                         \
        default:                                                               \
          if (cos(th / 2) != 1) return sin(((T)n + (T)0.5) * th) / sin(th / 2); \
          return (!shifted && y > 0) ? (T)(n + n + 1) : odd;                   \
      }                                                                        \
    }                                                                          \
    if (n == 0) return 1;                                                      \
    const T first[4] = {y, y + y, y + y - 1, y + y + 1};                       \
    T p = 1, q = first[kind], r = q;                                           \
    for (int64_t k = 2; k <= n && q == q; k++) {                               \
      r = (y + y) * q - p;                                                     \
      p = q;                                                                   \
      q = r;                                                                   \
    }                                                                          \
    return r;                                                                  \
  }
CHEBYSHEV(float, cheb_f)
CHEBYSHEV(double, cheb_d)

/* Hermite H_n (physicists', h = 1) and He_n (probabilists', h = 0); nan above
 * degree 128 (float) / 512 (double), as PyTorch. */
#define HERMITE(T, NAME, LIMIT)                                                \
  static T NAME(T x, int64_t n, int phys) {                                    \
    if (n < 0) return 0;                                                       \
    if (n == 0) return 1;                                                      \
    if (n == 1) return phys ? x + x : x;                                       \
    if (n > LIMIT) return NAN;                                                 \
    T p = 1, q = phys ? x + x : x, r = 0;                                      \
    if (phys) {                                                                \
      for (int64_t k = 2; k < n + n; k += 2) {                                 \
        r = (x + x) * q - (T)k * p;                                            \
        p = q;                                                                 \
        q = r;                                                                 \
      }                                                                        \
    } else {                                                                   \
      for (int64_t k = 1; k < n; k++) {                                        \
        r = x * q - (T)k * p;                                                  \
        p = q;                                                                 \
        q = r;                                                                 \
      }                                                                        \
    }                                                                          \
    return r;                                                                  \
  }
HERMITE(float, hermite_f, 128)
HERMITE(double, hermite_d, 512)

/* Laguerre L_n: (k + 1) L_{k+1} = (2k + 1 - x) L_k - k L_{k-1} */
#define LAGUERRE(T, NAME)                                                      \
  static T NAME(T x, int64_t n) {                                              \
    if (n < 0) return 0;                                                       \
    if (fabs(x) == 0 || n == 0) return 1;                                      \
    T p = 1, q = 1 - x, r = q;                                                 \
    for (int64_t k = 1; k < n && q == q; k++) {                                \
      r = (((T)(k + k) + (1 - x)) * q - (T)k * p) / (T)(k + 1);                \
      p = q;                                                                   \
      q = r;                                                                   \
    }                                                                          \
    return r;                                                                  \
  }
LAGUERRE(float, laguerre_f)
LAGUERRE(double, laguerre_d)

/* Legendre P_n: (k + 1) P_{k+1} = (2k + 1) x P_k - k P_{k-1} */
#define LEGENDRE(T, NAME)                                                      \
  static T NAME(T x, int64_t n) {                                              \
    if (n < 0) return 0;                                                       \
    if (fabs(x) == 1) return (x > 0 || n % 2 == 0) ? (T)1 : (T)-1;             \
    if (n == 0) return 1;                                                      \
    T p = 1, q = x, r = q;                                                     \
    for (int64_t k = 1; k < n && q == q; k++) {                                \
      r = ((T)(k + k + 1) * x * q - (T)k * p) / (T)(k + 1);                    \
      p = q;                                                                   \
      q = r;                                                                   \
    }                                                                          \
    return r;                                                                  \
  }
LEGENDRE(float, legendre_f)
LEGENDRE(double, legendre_d)

/* ---- Bessel functions (double) ---- */
/* glibc's j0/j1/y0/y1, with PyTorch's values outside their domain (nan at
 * +-inf, where the phase of the oscillation is undefined) */
static double bessel_j_d(int nu, double x) {
  if (isinf(x)) return NAN;
  return nu ? j1(x) : j0(x);
}
static double bessel_y_d(int nu, double x) {
  if (x != x || isinf(x)) return NAN;
  if (x == 0) return -INFINITY;
  if (x < 0) return NAN;
  return nu ? y1(x) : y0(x);
}

/* e^x K_nu(x), x > 0, from K_nu(x) = int_0^inf exp(-x cosh t) cosh(nu t) dt:
 * the scaled integrand exp(-2x sinh^2(t/2)) cosh(nu t) is analytic and
 * decays double-exponentially, so the trapezoidal rule with step h converges
 * like exp(-pi^2 / (2h)); h = 1/16 is far below double precision. */
static double bessel_k_scaled(double nu, double x) {
  const double h = 1.0 / 16;
  double sum = 0.5; /* t = 0: weight 1/2, integrand 1 */
  for (int k = 1; k < 100000; k++) {
    double t = k * h, s = sinh(t / 2);
    double f = exp(-2 * x * s * s) * cosh(nu * t);
    sum += f;
    if (f < 1e-18 * sum) break;
  }
  return sum * h;
}

/* K0 / K1 (scaled: times e^x); inf at 0, nan below */
static double bessel_k_d(int nu, double x, int scaled) {
  if (x != x) return x;
  if (x == 0) return INFINITY;
  if (x < 0) return NAN;
  if (isinf(x)) return 0;
  double s = bessel_k_scaled(nu, x);
  return scaled ? s : s * exp(-x);
}

/* Airy Ai. |x| small: the Maclaurin series Ai = c1 f(x) - c2 g(x) (its
 * cancellation costs at most ~7 digits on [-8, 2]); x > 2: Ai(x) =
 * sqrt(x/3)/pi K_{1/3}(zeta), zeta = 2/3 x^{3/2}; x < -8: the oscillating
 * asymptotic expansion, whose smallest term is below 1e-13 there. */
static double airy_ai_d(double x) {
  if (x != x) return x;
  if (isinf(x)) return NAN; /* as PyTorch's */
  if (x > 2) {
    double zeta = 2.0 / 3 * x * sqrt(x);
    if (zeta > 800) return 0;
    return sqrt(x / 3) / PI_ * bessel_k_scaled(1.0 / 3, zeta) * exp(-zeta);
  }
  if (x >= -8) {
    const double c1 = 0.355028053887817239260, c2 = 0.258819403792806798405;
    double x3 = x * x * x, f = 1, g = x, tf = 1, tg = x;
    for (int k = 1; k < 200; k++) {
      tf *= x3 / ((3.0 * k - 1) * (3.0 * k));
      tg *= x3 / ((3.0 * k) * (3.0 * k + 1));
      f += tf;
      g += tg;
      if (fabs(tf) < 1e-18 * fabs(f) && fabs(tg) < 1e-18 * (fabs(g) + 1e-300)) break;
    }
    return c1 * f - c2 * g;
  }
  double z = -x, zeta = 2.0 / 3 * z * sqrt(z);
  /* u_k = (6k-5)(6k-3)(6k-1) / ((2k-1) 216 k) u_{k-1} */
  double u = 1, p = 0, q = 0, zp = 1, prev = INFINITY;
  for (int k = 0; k < 60; k++) {
    if (k > 0) u *= (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) / ((2.0 * k - 1) * 216 * k);
    double term = u / zp;
    if (term > prev) break; /* the asymptotic series started to grow */
    prev = term;
    double sgn = (k / 2) % 2 ? -1 : 1;
    if (k % 2 == 0) p += sgn * term;
    else q += sgn * term;
    zp *= zeta;
  }
  double ph = zeta - PI_ / 4;
  return (cos(ph) * p + sin(ph) * q) / (SQRTPI_ * sqrt(sqrt(z)));
}

static double spherical_j0_d(double x) {
  if (isinf(x)) return 0;
  if (fabs(x) < 0.5) {
    double z = x * x;
    return 1 + z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880 +
               z * (-1.0 / 39916800 + z * (1.0 / 6227020800.0))))));
  }
  return sin(x) / x;
}

/* ---- normal distribution ---- */
/* exp(x^2) erfc(x): e^{x^2} is formed from x^2 split into hi + lo (exact);
 * beyond 26, where erfc underflows, the asymptotic series. */
static double erfcx_d(double x) {
  if (x != x) return x;
  if (x < 0) {
    if (x < -26.7) return INFINITY;
    double hi = x * x, lo = fma(x, x, -hi);
    return 2 * exp(hi) * exp(lo) - erfcx_d(-x);
  }
  if (x > 26) {
    if (isinf(x)) return 0;
    double z = 1 / (2 * x * x), s = 1, t = 1;
    for (int k = 1; k < 8; k++) {
      t *= -(2.0 * k - 1) * z;
      s += t;
    }
    return s / (x * SQRTPI_);
  }
  double hi = x * x, lo = fma(x, x, -hi);
  return exp(hi) * exp(lo) * erfc(x);
}

/* log Phi(x) */
static double log_ndtr_d(double x) {
  double t = x / SQRT2_;
  if (x < -1) return log(erfcx_d(-t) / 2) - t * t;
  return log1p(-erfc(t) / 2);
}

/* Phi^{-1}(p): a rational first guess (Abramowitz-Stegun 26.2.23) refined
 * with Halley steps on Phi(x) = erfc(-x / sqrt2) / 2, which is accurate in
 * the lower tail; p > 1/2 by symmetry (1 - p is exact there). */
static double ndtri_d(double p) {
  if (p != p || p < 0 || p > 1) return NAN;
  if (p == 0) return -INFINITY;
  if (p == 1) return INFINITY;
  if (p > 0.5) return -ndtri_d(1 - p);
  if (p == 0.5) return 0;
  double t = sqrt(-2 * log(p));
  double x = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) /
                       (1 + t * (1.432788 + t * (0.189269 + t * 0.001308))));
  for (int i = 0; i < 6; i++) {
    double cdf = 0.5 * erfc(-x / SQRT2_);
    double pdf = exp(-0.5 * x * x) / (SQRT2_ * SQRTPI_);
    if (!(pdf > 0)) break;
    double r = (cdf - p) / pdf;
    double step = r / (1 + 0.5 * x * r);
    x -= step;
    if (fabs(step) <= 1e-16 * fabs(x)) break;
  }
  return x;
}

/* ---- regularized incomplete gamma ----
 * P(a, x) (igamma) and Q(a, x) = 1 - P (igammac) in double. The power series
 *   P = x^a e^-x / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n))
 * converges fast for x < a + 1; above that, Q comes from its continued
 * fraction (evaluated with Lentz's method), and whichever of P, Q is small
 * is computed directly so it keeps its relative precision. The special
 * cases (a or x at 0, infinity, negative) follow PyTorch's values. */
/* log(x^a e^-x / Gamma(a + 1)). For large a the direct sum of a log x, -x
 * and -lgamma(a + 1) cancels to a small number and loses the absolute
 * precision of its terms, so it is rearranged as
 *   a (log1p(d) - d) - log(2 pi a) / 2 - stirling(a),  d = (x - a) / a
 * with Stirling's series for the remainder of lgamma(a + 1). */
static double igam_log_prefix(double a, double x) {
  if (a < 30) return a * log(x) - x - lgamma(a + 1);
  double d = (x - a) / a, r = 1 / a, r2 = r * r;
  double stirling = r * (1.0 / 12 - r2 * (1.0 / 360 - r2 * (1.0 / 1260 - r2 / 1680)));
  return a * (log1p(d) - d) - 0.5 * log(2 * PI_ * a) - stirling;
}

/* terms either sum needs: about sqrt(a) per decade near x = a */
static int igam_max_terms(double a) {
  double n = 2000 + 60 * sqrt(a);
  return n < 5e7 ? (int)n : 50000000;
}

static double igam_series(double a, double x) {
  double term = 1, sum = 1;
  int lim = igam_max_terms(a);
  for (int n = 1; n < lim; n++) {
    term *= x / (a + n);
    sum += term;
    if (term <= sum * 1e-17) break;
  }
  return sum * exp(igam_log_prefix(a, x));
}

static double igamc_fraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1 - a, cc = 1 / tiny, d = 1 / b, h = d;
  int lim = igam_max_terms(a);
  for (int i = 1; i < lim; i++) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (fabs(d) < tiny) d = tiny;
    cc = b + an / cc;
    if (fabs(cc) < tiny) cc = tiny;
    d = 1 / d;
    double del = d * cc;
    h *= del;
    if (fabs(del - 1) <= 1e-16) break;
  }
  /* x^a e^-x / Gamma(a) = a * x^a e^-x / Gamma(a + 1) */
  return h * a * exp(igam_log_prefix(a, x));
}

/* upper = 0: P(a, x); upper = 1: Q(a, x) */
static double igamma_d(double a, double x, int upper) {
  if (isnan(a) || isnan(x) || x < 0 || a < 0) return NAN;
  if (a == 0) return x > 0 ? (double)!upper : NAN;
  if (x == 0) return (double)upper;
  if (isinf(a)) return isinf(x) ? NAN : (double)upper;
  if (isinf(x)) return (double)!upper;
  if (x < a + 1) {
    double p = igam_series(a, x);
    return upper ? 1 - p : p;
  }
  double q = igamc_fraction(a, x);
  return upper ? q : 1 - q;
}

/* ---- loop bodies ---- */
#define SF_LOOP(FN, T, K, EXPR)                                                \
  static void FN(void* c_, int64_t n, void* o_, const void* const* in) {      \
    (void)c_;                                                                  \
    T* o = o_;                                                                 \
    const T* xs = in[0];                                                       \
    const T* ns = K > 1 ? (const T*)in[1] : xs;                                \
    for (int64_t i = 0; i < n; i++) {                                          \
      const T x = xs[i];                                                       \
      const int64_t deg = K > 1 ? degree_of((double)ns[i]) : 0;                \
      (void)deg;                                                               \
      o[i] = (T)(EXPR);                                                        \
    }                                                                          \
  }
/* FE / DE: the float and double expressions */
#define SF(K, NAME, FE, DE)                                                    \
  SF_LOOP(NAME##_f32, float, K, FE)                                            \
  SF_LOOP(NAME##_f64, double, K, DE)                                           \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NULL, NULL};
#define SF_D(NAME, EXPR) SF(1, NAME, EXPR, EXPR)

SF(2, cheb_t, cheb_f(x, deg, 0, 6, 0), cheb_d(x, deg, 0, 6, 0))
SF(2, cheb_u, cheb_f(x, deg, 1, 8, 0), cheb_d(x, deg, 1, 8, 0))
SF(2, cheb_v, cheb_f(x, deg, 2, 8, 0), cheb_d(x, deg, 2, 8, 0))
SF(2, cheb_w, cheb_f(x, deg, 3, 8, 0), cheb_d(x, deg, 3, 8, 0))
SF(2, scheb_t, cheb_f(x + x - 1, deg, 0, 6, 1), cheb_d(x + x - 1, deg, 0, 6, 1))
SF(2, scheb_u, cheb_f(x + x - 1, deg, 1, 6, 1), cheb_d(x + x - 1, deg, 1, 6, 1))
SF(2, scheb_v, cheb_f(x + x - 1, deg, 2, 6, 1), cheb_d(x + x - 1, deg, 2, 6, 1))
SF(2, scheb_w, cheb_f(x + x - 1, deg, 3, 4, 1), cheb_d(x + x - 1, deg, 3, 4, 1))
SF(2, hermite_h, hermite_f(x, deg, 1), hermite_d(x, deg, 1))
SF(2, hermite_he, hermite_f(x, deg, 0), hermite_d(x, deg, 0))
SF(2, laguerre, laguerre_f(x, deg), laguerre_d(x, deg))
SF(2, legendre, legendre_f(x, deg), legendre_d(x, deg))
SF_D(bessel_j0, bessel_j_d(0, x))
SF_D(bessel_j1, bessel_j_d(1, x))
SF_D(bessel_y0, bessel_y_d(0, x))
SF_D(bessel_y1, bessel_y_d(1, x))
SF_D(bessel_k0, bessel_k_d(0, x, 0))
SF_D(bessel_k1, bessel_k_d(1, x, 0))
SF_D(bessel_k0e, bessel_k_d(0, x, 1))
SF_D(bessel_k1e, bessel_k_d(1, x, 1))
SF_D(airy_ai, airy_ai_d(x))
SF_D(spherical_j0, spherical_j0_d(x))
SF_D(erfcx, erfcx_d(x))
SF_D(log_ndtr, log_ndtr_d(x))
SF_D(ndtri, ndtri_d(x))
/* igamma(self = a, other = x) */
SF(2, igamma, igamma_d(x, ns[i], 0), igamma_d(x, ns[i], 0))
SF(2, igammac, igamma_d(x, ns[i], 1), igamma_d(x, ns[i], 1))

/* ---- kernels ---- */
static tpu_status_t sf_run(const char* op, const tpu_call_t* c, int nin,
                           const tpu_loop_set_t* loops) {
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  for (int i = 0; i < nin; i++)
    if (!ins[i]) return TPU_ERR(INVALID_ARGUMENT, "%s: expected a tensor argument %d", op, i);
  tpu_dtype_t dt = c->outs[0].dtype;
  if (!tpu_dtype_is_float(dt))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for %s", op, tpu_dtype_name(dt));
  return tpu_elementwise_set(op, &c->outs[0], ins, nin, tpu_ctype_of(dt), loops, NULL);
}

#define SF_KERNEL(FN, OP, NIN, LOOPS) \
  tpu_status_t FN(const tpu_call_t* c) { return sf_run(OP, c, NIN, &LOOPS); }
SF_KERNEL(tpu_k_chebyshev_t, "special_chebyshev_polynomial_t", 2, cheb_t_loops)
SF_KERNEL(tpu_k_chebyshev_u, "special_chebyshev_polynomial_u", 2, cheb_u_loops)
SF_KERNEL(tpu_k_chebyshev_v, "special_chebyshev_polynomial_v", 2, cheb_v_loops)
SF_KERNEL(tpu_k_chebyshev_w, "special_chebyshev_polynomial_w", 2, cheb_w_loops)
SF_KERNEL(tpu_k_shifted_chebyshev_t, "special_shifted_chebyshev_polynomial_t", 2, scheb_t_loops)
SF_KERNEL(tpu_k_shifted_chebyshev_u, "special_shifted_chebyshev_polynomial_u", 2, scheb_u_loops)
SF_KERNEL(tpu_k_shifted_chebyshev_v, "special_shifted_chebyshev_polynomial_v", 2, scheb_v_loops)
SF_KERNEL(tpu_k_shifted_chebyshev_w, "special_shifted_chebyshev_polynomial_w", 2, scheb_w_loops)
SF_KERNEL(tpu_k_hermite_h, "special_hermite_polynomial_h", 2, hermite_h_loops)
SF_KERNEL(tpu_k_hermite_he, "special_hermite_polynomial_he", 2, hermite_he_loops)
SF_KERNEL(tpu_k_laguerre_l, "special_laguerre_polynomial_l", 2, laguerre_loops)
SF_KERNEL(tpu_k_legendre_p, "special_legendre_polynomial_p", 2, legendre_loops)
SF_KERNEL(tpu_k_bessel_j0, "special_bessel_j0", 1, bessel_j0_loops)
SF_KERNEL(tpu_k_bessel_j1, "special_bessel_j1", 1, bessel_j1_loops)
SF_KERNEL(tpu_k_bessel_y0, "special_bessel_y0", 1, bessel_y0_loops)
SF_KERNEL(tpu_k_bessel_y1, "special_bessel_y1", 1, bessel_y1_loops)
SF_KERNEL(tpu_k_modified_bessel_k0, "special_modified_bessel_k0", 1, bessel_k0_loops)
SF_KERNEL(tpu_k_modified_bessel_k1, "special_modified_bessel_k1", 1, bessel_k1_loops)
SF_KERNEL(tpu_k_scaled_modified_bessel_k0, "special_scaled_modified_bessel_k0", 1, bessel_k0e_loops)
SF_KERNEL(tpu_k_scaled_modified_bessel_k1, "special_scaled_modified_bessel_k1", 1, bessel_k1e_loops)
SF_KERNEL(tpu_k_airy_ai, "special_airy_ai", 1, airy_ai_loops)
SF_KERNEL(tpu_k_spherical_bessel_j0, "special_spherical_bessel_j0", 1, spherical_j0_loops)
SF_KERNEL(tpu_k_erfcx, "special_erfcx", 1, erfcx_loops)
SF_KERNEL(tpu_k_log_ndtr, "special_log_ndtr", 1, log_ndtr_loops)
SF_KERNEL(tpu_k_ndtri, "special_ndtri", 1, ndtri_loops)
SF_KERNEL(tpu_k_igamma, "igamma", 2, igamma_loops)
SF_KERNEL(tpu_k_igammac, "igammac", 2, igammac_loops)
