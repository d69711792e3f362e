/* Special functions and the remaining element-wise math: erfinv, digamma,
 * polygamma, Hurwitz zeta, multivariate lgamma, modified Bessel functions
 * I0/I1 (plain and exponentially scaled), sinc, xlog1py, entr, logaddexp(2),
 * heaviside, gcd/lcm, nextafter, frexp and signbit.
 *
 * The transcendental functions are evaluated in double for every floating
 * dtype (float results are then rounded once), with PyTorch's conventions at
 * poles and special values. Loop bodies run on the element-wise engine.
 */
#include <stdatomic.h>
#include <tgmath.h>

#include "kernels.h"

typedef struct {
  int64_t n;       /* polygamma order, mvlgamma p */
  int mode;        /* nextafter: 0 native, 1 bfloat16 steps, 2 float16 steps; gcd/lcm: bits */
  _Atomic int err; /* mvlgamma: an element out of the domain */
} sp_ctx_t;

/* ---- scalar functions (double) ---- */
#define PI_ 3.14159265358979323846

/* Inverse error function: a closed-form first guess (relative error about
 * 2e-3), then Halley steps on erf(y) = |x|, written as (1 - |x|) - erfc(y)
 * above 0.5 where 1 - |x| is exact. */
static double erfinv_d(double x) {
  double a = fabs(x);
  if (!(a <= 1)) return NAN;
  if (a == 1) return copysign(INFINITY, x);
  if (a == 0) return x;
  double l = log((1 - a) * (1 + a));
  double t = 2 / (PI_ * 0.147) + l / 2;
  double y = sqrt(sqrt(t * t - l / 0.147) - t);
  for (int i = 0; i < 4; i++) {
    double f = a < 0.5 ? erf(y) - a : (1 - a) - erfc(y);
    double d = 1.12837916709551257390 * exp(-y * y); /* erf'(y) */
    double step = f / (d + f * y);                    /* Halley: erf'' = -2y erf' */
    y -= step;
    if (fabs(step) <= 1e-16 * y) break;
  }
  return copysign(y, x);
}

/* psi(x): reflection below 0, recurrence up to 10, then the asymptotic
 * series ln x - 1/(2x) - sum B_2k / (2k x^2k). psi(+-0) = -+inf and psi of
 * a negative integer is nan, as in PyTorch. */
static double digamma_d(double x) {
  if (x == 0) return copysign(INFINITY, -x);
  if (x < 0) {
    if (x == trunc(x)) return NAN;
    /* tan(pi r) of the fractional part r is more accurate than tan(pi x) */
    return digamma_d(1 - x) - PI_ / tan(PI_ * (x - trunc(x)));
  }
  double acc = 0;
  while (x < 10) {
    acc -= 1 / x;
    x += 1;
  }
  double z = 1 / (x * x);
  double series =
      z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 -
           z * (691.0 / 32760 - z / 12))))));
  return acc + log(x) - 0.5 / x - series;
}

/* B_2j / (2j)! for the Euler-Maclaurin tail of zeta */
static const double kBernoulliOverFact[] = {
    8.333333333333333e-02,  -1.388888888888889e-03, 3.306878306878307e-05,
    -8.267195767195768e-07, 2.08767569878681e-08,   -5.284190138687493e-10,
    1.3382536530684679e-11, -3.3896802963225827e-13, 8.586062056277845e-15,
    -2.174868698558062e-16, 5.5090028283602295e-18, -1.3954464685812522e-19};

/* Hurwitz zeta(s, q) = sum_k (q + k)^-s: direct terms until q + k >= 10
 * (at least ten), then the Euler-Maclaurin tail. Domain as in PyTorch:
 * inf at s = 1 and at non-positive integer q, nan for s < 1 and for
 * non-integer s with q <= 0. */
static double zeta_d(double s, double q) {
  if (s == 1) return INFINITY;
  if (!(s > 1)) return NAN;
  if (q <= 0) {
    if (q == floor(q)) return INFINITY;
    if (s != floor(s)) return NAN;
  }
  double sum = 0, w = q;
  for (int k = 0; k < 10 || w < 10; k++, w += 1) {
    double t = pow(w, -s);
    sum += t;
    if (fabs(t) < 1e-17 * fabs(sum)) return sum; /* never for a zero sum: inf stays inf */
  }
  double ws = pow(w, -s);
  double tail = w * ws / (s - 1) + 0.5 * ws;
  /* term j: B_2j/(2j)! * s (s+1) ... (s+2j-2) * w^(-s-2j+1) */
  double poch = s, wp = ws / w;
  for (int j = 0; j < 12; j++) {
    double t = kBernoulliOverFact[j] * poch * wp;
    tail += t;
    if (fabs(t) < 1e-17 * fabs(sum + tail)) break;
    poch *= (s + 2 * j + 1) * (s + 2 * j + 2);
    wp /= w * w;
  }
  return sum + tail;
}

/* polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 2 */
static double polygamma_d(int64_t n, double x) {
  double sign = (n % 2) ? 1.0 : -1.0;
  return sign * exp(lgamma((double)n + 1.0)) * zeta_d((double)n + 1.0, x);
}

/* psi'(x) for x >= 0.5: recurrence up to 10, then the asymptotic series
 * 1/x + 1/(2x^2) + sum B_2k / x^(2k+1) */
static double trigamma_pos(double x) {
  double acc = 0;
  while (x < 10) {
    acc += 1 / (x * x);
    x += 1;
  }
  double z = 1 / (x * x);
  double series = z * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z * (1.0 / 30 - z * 5.0 / 66))));
  return acc + (1 + 0.5 / x + series) / x;
}

/* psi'(x) with the reflection psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x)
 * below 0.5. The reflection term is evaluated in the loop's type like
 * PyTorch's (so float results near the poles agree, and poles give large
 * finite values). */
#define TRIGAMMA(T, NAME)                                       \
  static double NAME(T x) {                                     \
    if (!(x < (T)0.5)) return trigamma_pos(x);                  \
    const T pi = (T)PI_;                                        \
    T s = sin(pi * x);                                          \
    return (double)(pi * pi / (s * s)) - trigamma_pos(1 - (double)x); \
  }
TRIGAMMA(float, trigamma_f)
TRIGAMMA(double, trigamma_d)
#define POLYGAMMA(n, x)                          \
  ((n) == 0   ? digamma_d(x)                     \
   : (n) == 1 ? _Generic((x), float: trigamma_f, default: trigamma_d)(x) \
              : polygamma_d(n, x))

/* exp(-ax) I_nu(ax), ax >= 0, from the asymptotic expansion
 * e^x / sqrt(2 pi x) sum_k (-1)^k prod_{i<=k} (mu - (2i-1)^2) / (k! (8x)^k),
 * mu = 4 nu^2; its terms shrink to below double precision before they
 * diverge when ax > 30. */
static double bessel_i_scaled_asym(int nu, double ax) {
  double mu = 4.0 * nu * nu, t = 1, sum = 1;
  for (int k = 1; k < 60; k++) {
    double odd = 2.0 * k - 1;
    t *= -(mu - odd * odd) / (k * 8 * ax);
    sum += t;
    if (fabs(t) <= 1e-17 * fabs(sum)) break;
  }
  return sum / sqrt(2 * PI_ * ax);
}

/* I_nu(ax), ax <= 30: the power series (ax/2)^nu sum (ax^2/4)^k / (k! (k+nu)!)
 * (positive terms, no cancellation) */
static double bessel_i_series(int nu, double ax) {
  double q = ax * ax / 4, term = nu ? ax / 2 : 1, sum = term;
  for (int k = 1; term > 1e-17 * sum; k++) {
    term *= q / (k * (double)(k + nu));
    sum += term;
  }
  return sum;
}

/* I_nu(x) for nu = 0, 1; `scaled` multiplies by exp(-|x|). I1 is odd.
 * PyTorch's I0 and I1 are nan at +-inf (inf / inf in their large-x form). */
static double bessel_i(int nu, double x, bool scaled) {
  double ax = fabs(x), v;
  if (isinf(ax)) {
    v = scaled ? 0 : NAN;
  } else if (!(ax > 30)) { /* nan takes this branch and stays nan */
    v = bessel_i_series(nu, ax);
    if (scaled) v *= exp(-ax);
  } else {
    v = bessel_i_scaled_asym(nu, ax);
    if (!scaled) v *= exp(ax); /* inf from |x| > 709.78 on, like PyTorch's (I0 itself lasts to 713.98) */
  }
  return nu && x < 0 ? -v : v;
}

static double sinc_d(double x) {
  if (x == 0) return 1;
  double px = PI_ * x;
  return sin(px) / px;
}

static double xlog1py_d(double x, double y) {
  if (y != y) return y;
  if (x == 0) return 0;
  return x * log1p(y);
}

static double entr_d(double x) {
  if (x != x) return x;
  if (x > 0) return -x * log(x);
  return x == 0 ? 0 : -INFINITY;
}

/* log(e^a + e^b); log2(2^a + 2^b) with base2 */
static double logaddexp_d(double a, double b, bool base2) {
  if (isinf(a) && a == b) return a;
  double m = a < b ? b : a, d = -fabs(a - b);
  return base2 ? m + log1p(exp2(d)) / 0.69314718055994530942 : m + log1p(exp(d));
}

/* mvlgamma(x, p) = p (p - 1) / 4 log(pi) + sum_{i < p} lgamma(x - i / 2) */
static double mvlgamma_d(sp_ctx_t* cx, double x) {
  int64_t p = cx->n;
  if (!(x > 0.5 * (double)(p - 1))) cx->err = 1;
  double s = (double)p * (double)(p - 1) / 4 * 1.14472988584940017414; /* log(pi) */
  for (int64_t i = 0; i < p; i++) s += lgamma(x - 0.5 * (double)i);
  return s;
}

/* The neighbour of a towards b in bfloat16 (bf16) or float16 steps; a and
 * b hold values of that type. */
static float nextafter16(float a, float b, bool bf16) {
  if (a != a || b != b) return a + b;
  if (a == b) return b;
  uint16_t h = bf16 ? tpu_f32_to_bf16(a) : tpu_f32_to_f16(a);
  if (a == 0) h = (uint16_t)((b < 0 ? 0x8000u : 0u) | 1u);
  else if ((b > a) == (a > 0)) h++; /* away from zero */
  else h--;
  return bf16 ? tpu_bf16_to_f32(h) : tpu_f16_to_f32(h);
}

/* frexp(x): mantissa in [0.5, 1) (x itself for 0, inf, nan) and exponent */
static double frexp_d(double x, int* exp_out) {
  int e = 0;
  double m = frexp(x, &e);
  if (exp_out) *exp_out = e;
  return m;
}
static double frexp_exponent_d(double x) {
  int e = 0;
  frexp_d(x, &e);
  return e;
}

/* The value of the low `bits` bits of v as a signed integer of that width. */
static int64_t wrap_bits(uint64_t v, int bits) {
  if (bits >= 64) return (int64_t)v;
  uint64_t sign = (uint64_t)1 << (bits - 1), low = v & ((sign << 1) - 1);
  return (int64_t)(low ^ sign) - (int64_t)sign;
}

/* -a for a != INT64_MIN; INT64_MIN for it (two's complement, no overflow) */
static int64_t neg_wrap(int64_t a) { return (int64_t)(0 - (uint64_t)a); }

/* Euclid's gcd in the arithmetic of an integer type of `bits` bits, as
 * PyTorch computes it: |x| wraps at that width (|min| = min), remainders
 * keep the dividend's sign. */
static int64_t gcd_i(int64_t a, int64_t b, int bits) {
  if (a < 0) a = wrap_bits((uint64_t)neg_wrap(a), bits);
  if (b < 0) b = wrap_bits((uint64_t)neg_wrap(b), bits);
  while (a != 0) {
    int64_t t = a;
    a = b % a; /* never INT64_MIN % -1: a divisor of -1 needs a dividend in range */
    b = t;
  }
  return b;
}

/* |a / gcd * b|; the product wraps like PyTorch's: 8- and 16-bit operands
 * promote to int, 32- and 64-bit ones wrap at their width. */
static int64_t lcm_i(int64_t a, int64_t b, int bits) {
  int64_t g = gcd_i(a, b, bits);
  if (g == 0) return 0;
  int64_t q = g == -1 ? neg_wrap(a) : a / g;
  int64_t p = (int64_t)((uint64_t)q * (uint64_t)b);
  if (bits == 32) p = wrap_bits((uint64_t)p, 32);
  return p < 0 ? neg_wrap(p) : p;
}

/* ---- loop bodies ----
 * a, b: the current elements of in[0], in[1] in the loop's type T (float or
 * double; int64 for the integer ops). */
#define SP_LOOP(FN, T, K, EXPR)                                                \
  static void FN(void* c_, int64_t n, void* o_, const void* const* in) {      \
    sp_ctx_t* cx = c_;                                                         \
    T* o = o_;                                                                 \
    const T* x = in[0];                                                        \
    const T* y = K > 1 ? (const T*)in[1] : x;                                  \
    (void)cx;                                                                  \
    for (int64_t i = 0; i < n; i++) {                                          \
      const T a = x[i], b = y[i];                                              \
      (void)b;                                                                 \
      o[i] = (T)(EXPR);                                                        \
    }                                                                          \
  }
#define SP_F(K, NAME, EXPR)                                                    \
  SP_LOOP(NAME##_f32, float, K, EXPR)                                          \
  SP_LOOP(NAME##_f64, double, K, EXPR)                                         \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NULL, NULL};
#define SP_FI(K, NAME, FEXPR, IEXPR)                                           \
  SP_LOOP(NAME##_f32, float, K, FEXPR)                                         \
  SP_LOOP(NAME##_f64, double, K, FEXPR)                                        \
  SP_LOOP(NAME##_i64, int64_t, K, IEXPR)                                       \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NAME##_i64, NULL};
#define SP_I(K, NAME, IEXPR)                                                   \
  SP_LOOP(NAME##_i64, int64_t, K, IEXPR)                                       \
  static const tpu_loop_set_t NAME##_loops = {NULL, NULL, NAME##_i64, NULL};

SP_F(1, erfinv, erfinv_d(a))
SP_F(1, digamma, digamma_d(a))
SP_F(1, polygamma, POLYGAMMA(cx->n, a))
SP_F(1, mvlgamma, mvlgamma_d(cx, a))
SP_F(1, sinc, sinc_d(a))
SP_F(1, i0, bessel_i(0, a, false))
SP_F(1, i0e, bessel_i(0, a, true))
SP_F(1, i1, bessel_i(1, a, false))
SP_F(1, i1e, bessel_i(1, a, true))
SP_F(1, entr, entr_d(a))
SP_F(2, zeta, zeta_d(a, b))
SP_F(2, xlog1py, xlog1py_d(a, b))
SP_F(2, logaddexp, logaddexp_d(a, b, false))
SP_F(2, logaddexp2, logaddexp_d(a, b, true))
SP_F(2, nextafter, cx->mode ? nextafter16((float)a, (float)b, cx->mode == 1) : nextafter(a, b))
SP_F(1, frexp_mantissa, frexp_d(a, NULL))
SP_F(1, frexp_exponent, frexp_exponent_d(a))
SP_FI(2, heaviside, a == 0 ? b : (a > 0), a == 0 ? b : (a > 0))
SP_FI(1, signbit, signbit(a) != 0, a < 0)
SP_I(2, gcd, gcd_i(a, b, cx->mode))
SP_I(2, lcm, lcm_i(a, b, cx->mode))

/* ---- kernels ---- */
/* out = f(ins) computed in the output's compute type */
static tpu_status_t run(const char* op, const tpu_call_t* c, const tpu_tensor_t* const* ins,
                        int nin, const tpu_loop_set_t* loops, sp_ctx_t* cx) {
  return tpu_elementwise_set(op, &c->outs[0], ins, nin, tpu_ctype_of(c->outs[0].dtype), loops, cx);
}

static tpu_status_t unary(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops) {
  sp_ctx_t cx = {0};
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return run(op, c, ins, 1, loops, &cx);
}

static tpu_status_t binary(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops,
                           sp_ctx_t* cx) {
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return run(op, c, ins, 2, loops, cx);
}

static tpu_status_t binary_plain(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops) {
  sp_ctx_t cx = {0};
  return binary(op, c, loops, &cx);
}

tpu_status_t tpu_k_erfinv(const tpu_call_t* c) { return unary("erfinv", c, &erfinv_loops); }
tpu_status_t tpu_k_digamma(const tpu_call_t* c) { return unary("digamma", c, &digamma_loops); }
tpu_status_t tpu_k_sinc(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  return unary("sinc", c, &sinc_loops);
}
tpu_status_t tpu_k_i0(const tpu_call_t* c) { return unary("i0", c, &i0_loops); }
tpu_status_t tpu_k_i0e(const tpu_call_t* c) { return unary("special_i0e", c, &i0e_loops); }
tpu_status_t tpu_k_i1(const tpu_call_t* c) { return unary("special_i1", c, &i1_loops); }
tpu_status_t tpu_k_i1e(const tpu_call_t* c) { return unary("special_i1e", c, &i1e_loops); }
tpu_status_t tpu_k_entr(const tpu_call_t* c) { return unary("special_entr", c, &entr_loops); }
tpu_status_t tpu_k_xlog1py(const tpu_call_t* c) {
  return binary_plain("special_xlog1py", c, &xlog1py_loops);
}
tpu_status_t tpu_k_logaddexp(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  return binary_plain("logaddexp", c, &logaddexp_loops);
}
tpu_status_t tpu_k_logaddexp2(const tpu_call_t* c) {
  return binary_plain("logaddexp2", c, &logaddexp2_loops);
}

tpu_status_t tpu_k_zeta(const tpu_call_t* c) {
  tpu_dtype_t dt = c->outs[0].dtype;
  if (dt == TPU_BF16 || dt == TPU_F16)
    return TPU_ERR(UNIMPLEMENTED, "special_zeta: not implemented for %s", tpu_dtype_name(dt));
  return binary_plain("special_zeta", c, &zeta_loops);
}

/* polygamma(int n, Tensor self) and polygamma_(Tensor self, int n) */
tpu_status_t tpu_k_polygamma(const tpu_call_t* c) {
  bool self_first = c->args[0].kind == TPU_ARG_TENSOR;
  sp_ctx_t cx = {.n = tpu_arg_i64(c, self_first ? 1 : 0, 0)};
  if (cx.n < 0)
    return TPU_ERR(INVALID_ARGUMENT, "polygamma(n, x) does not support negative n (got %lld).",
                   (long long)cx.n);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, self_first ? 0 : 1)};
  return run("polygamma", c, ins, 1, &polygamma_loops, &cx);
}

/* mvlgamma.out(self, p) */
tpu_status_t tpu_k_mvlgamma(const tpu_call_t* c) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  sp_ctx_t cx = {.n = tpu_arg_i64(c, 1, 1)};
  if (self->dtype == TPU_BOOL)
    return TPU_ERR(UNIMPLEMENTED, "mvlgamma: not implemented for 'Bool'");
  if (cx.n < 1)
    return TPU_ERR(INVALID_ARGUMENT, "mvlgamma: p has to be greater than or equal to 1 (got %lld)",
                   (long long)cx.n);
  const tpu_tensor_t* ins[1] = {self};
  TPU_RETURN_IF_ERROR(run("mvlgamma", c, ins, 1, &mvlgamma_loops, &cx));
  if (cx.err)
    return TPU_ERR(INVALID_ARGUMENT, "mvlgamma: All elements must be greater than (p-1)/2 = %g",
                   0.5 * (double)(cx.n - 1));
  return TPU_OK;
}

tpu_status_t tpu_k_heaviside(const tpu_call_t* c) {
  const tpu_tensor_t* a = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* b = tpu_arg_tensor(c, 1);
  if (a->dtype != b->dtype)
    return TPU_ERR(INVALID_ARGUMENT,
                   "heaviside is not yet implemented for tensors with different dtypes (%s, %s)",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
  return binary_plain("heaviside", c, &heaviside_loops);
}

/* gcd/lcm: the loops get the width of the integer type */
static tpu_status_t gcd_lcm(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops) {
  tpu_dtype_t dt = c->outs[0].dtype;
  if (dt == TPU_BOOL || tpu_dtype_is_float(dt))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for %s", op, tpu_dtype_name(dt));
  sp_ctx_t cx = {.mode = (int)(8 * tpu_dtype_size(dt))};
  return binary(op, c, loops, &cx);
}
tpu_status_t tpu_k_gcd(const tpu_call_t* c) { return gcd_lcm("gcd", c, &gcd_loops); }
tpu_status_t tpu_k_lcm(const tpu_call_t* c) { return gcd_lcm("lcm", c, &lcm_loops); }

tpu_status_t tpu_k_nextafter(const tpu_call_t* c) {
  tpu_dtype_t dt = c->outs[0].dtype;
  sp_ctx_t cx = {.mode = dt == TPU_BF16 ? 1 : dt == TPU_F16 ? 2 : 0};
  return binary("nextafter", c, &nextafter_loops, &cx);
}

/* frexp.Tensor_out(self, *, mantissa, exponent) */
tpu_status_t tpu_k_frexp(const tpu_call_t* c) {
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  if (c->nouts < 2) return TPU_ERR(INTERNAL, "frexp: expected mantissa and exponent outputs");
  if (!tpu_dtype_is_float(ins[0]->dtype))
    return TPU_ERR(INVALID_ARGUMENT,
                   "torch.frexp() only supports floating-point dtypes, but got %s",
                   tpu_dtype_name(ins[0]->dtype));
  sp_ctx_t cx = {0};
  TPU_RETURN_IF_ERROR(run("frexp", c, ins, 1, &frexp_mantissa_loops, &cx));
  return tpu_elementwise_set("frexp", &c->outs[1], ins, 1, tpu_ctype_of(ins[0]->dtype),
                             &frexp_exponent_loops, &cx);
}

tpu_status_t tpu_k_signbit(const tpu_call_t* c) {
  sp_ctx_t cx = {0};
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return tpu_elementwise_set("signbit", &c->outs[0], ins, 1, tpu_ctype_of(ins[0]->dtype),
                             &signbit_loops, &cx);
}
