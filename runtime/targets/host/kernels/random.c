/* Random-number kernels: uniform, normal, log_normal, cauchy, exponential,
 * geometric, bernoulli, random_, native_dropout, randperm and multinomial.
 *
 * Every op here is flagged TPU_OP_RANDOM and follows the counter contract of
 * base/philox.h: output element i (row-major logical index, whatever the
 * output's strides) is computed from the Philox block at counter
 * rng_offset + i alone, so results do not depend on the thread split.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "../../../base/philox.h"
#include "kernels.h"

#define TWO_PI 6.283185307179586476925
#define PI 3.141592653589793238463

/* ---- uniform variates from block words ---- */
static inline uint64_t bits64(uint32_t hi, uint32_t lo) { return ((uint64_t)hi << 32) | lo; }
/* [0, 1) with 53 random bits */
static inline double u01(uint32_t hi, uint32_t lo) {
  return (double)(bits64(hi, lo) >> 11) * 0x1p-53;
}
/* (0, 1): never 0 or 1, safe for log() */
static inline double u01_open(uint32_t hi, uint32_t lo) {
  return ((double)(bits64(hi, lo) >> 11) + 0.5) * 0x1p-53;
}
/* A standard normal from all four words (Box-Muller in double). */
static inline double std_normal(const uint32_t* w) {
  return sqrt(-2.0 * log(u01_open(w[0], w[1]))) * cos(TWO_PI * u01(w[2], w[3]));
}

/* ---- the element walker ----
 * Operand 0 is the output that defines the shape; further operands (a second
 * output, inputs) broadcast to it. `fn` computes one element from its block;
 * p[k] points at operand k's element. */
#define RNG_MAX_OPS 4
typedef struct rng_job rng_job_t;
typedef void (*rng_elem_fn_t)(rng_job_t* j, const uint32_t* w, char* const* p);

struct rng_job {
  const char* op; /* for error messages */
  uint64_t seed, offset;
  int ndim;
  int64_t sizes[TPU_MAX_DIMS];
  int nops;
  char* data[RNG_MAX_OPS];
  tpu_dtype_t dt[RNG_MAX_OPS];
  int64_t st[RNG_MAX_OPS][TPU_MAX_DIMS]; /* bytes; 0 along broadcast dims */
  rng_elem_fn_t fn;
  double a, b;    /* distribution parameters */
  int64_t from;   /* random_: from + bits % range ... */
  uint64_t range; /* ... where range 0 stands for 2^64 */
  _Atomic int invalid; /* an element-wise parameter outside its domain */
};

static tpu_status_t job_add(rng_job_t* j, const tpu_tensor_t* t) {
  int k = j->nops;
  if (!tpu_dtype_is_supported(t->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: dtype %d is not supported on tpu", j->op, (int)t->dtype);
  if (t->ndim > j->ndim)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: operand with %d dims cannot broadcast to the output's %d dims", j->op,
                   t->ndim, j->ndim);
  int64_t esz = (int64_t)tpu_dtype_size(t->dtype);
  for (int d = 0; d < j->ndim; d++) {
    int td = d - (j->ndim - t->ndim);
    int64_t size = td >= 0 ? t->sizes[td] : 1;
    if (size != j->sizes[d] && size != 1)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: the size of an operand (%lld) must match the output's size (%lld) at "
                     "dimension %d",
                     j->op, (long long)size, (long long)j->sizes[d], d);
    j->st[k][d] = (td >= 0 && size == j->sizes[d]) ? t->strides[td] * esz : 0;
  }
  j->data[k] = t->data;
  j->dt[k] = t->dtype;
  j->nops++;
  return TPU_OK;
}

static tpu_status_t job_init(rng_job_t* j, const char* op, const tpu_call_t* c,
                             const tpu_tensor_t* out, rng_elem_fn_t fn) {
  memset(j, 0, sizeof(*j));
  j->op = op;
  j->seed = c->rng_seed;
  j->offset = c->rng_offset;
  j->ndim = out->ndim;
  memcpy(j->sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
  j->fn = fn;
  return job_add(j, out);
}

static void rng_range(void* arg, int64_t begin, int64_t end) {
  rng_job_t* j = arg;
  int nd = j->ndim, nops = j->nops;
  int64_t idx[TPU_MAX_DIMS];
  char* p[RNG_MAX_OPS];
  for (int k = 0; k < nops; k++) p[k] = j->data[k];
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = rem % j->sizes[d];
    rem /= j->sizes[d];
    for (int k = 0; k < nops; k++) p[k] += idx[d] * j->st[k][d];
  }
  for (int64_t i = begin; i < end; i++) {
    tpu_philox_block_t b = tpu_philox_element(j->seed, j->offset, i);
    j->fn(j, b.w, p);
    for (int d = nd - 1; d >= 0; d--) { /* next row-major index */
      for (int k = 0; k < nops; k++) p[k] += j->st[k][d];
      if (++idx[d] < j->sizes[d]) break;
      for (int k = 0; k < nops; k++) p[k] -= j->st[k][d] * j->sizes[d];
      idx[d] = 0;
    }
  }
}

static void job_run(rng_job_t* j) {
  int64_t numel = 1;
  for (int d = 0; d < j->ndim; d++) numel *= j->sizes[d];
  tpu_parallel_for(numel, 4096, rng_range, j);
}

/* A 0-d float64 descriptor over *v, for scalar parameters. */
static tpu_tensor_t scalar_tensor(double* v) {
  tpu_tensor_t t;
  tpu_tensor_make_contig(&t, v, TPU_F64, 0, NULL);
  return t;
}

static tpu_status_t check_float_out(const char* op, const tpu_tensor_t* out) {
  if (!tpu_dtype_is_float(out->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for %s tensors", op,
                   tpu_dtype_name(out->dtype));
  return TPU_OK;
}

/* Runs a one-operand distribution with parameters a, b on outs[0]. */
static tpu_status_t run_dist(const char* op, const tpu_call_t* c, rng_elem_fn_t fn, double a,
                             double b) {
  rng_job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, op, c, &c->outs[0], fn));
  j.a = a;
  j.b = b;
  job_run(&j);
  return TPU_OK;
}

/* ---- continuous distributions ---- */
static void uniform_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  double v = tpu_round_f64(j->dt[0], j->a + u01(w[0], w[1]) * (j->b - j->a));
  if (v >= j->b && j->b > j->a) v = j->a; /* rounding reached `to`: keep [from, to) */
  tpu_store_f64(p[0], j->dt[0], v);
}

/* uniform(self, from, to) and uniform_ / uniform.out */
tpu_status_t tpu_k_uniform(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  double from = tpu_arg_f64(c, 1, 0.0), to = tpu_arg_f64(c, 2, 1.0);
  TPU_RETURN_IF_ERROR(check_float_out("uniform_", &c->outs[0]));
  if (!(from <= to))
    return TPU_ERR(INVALID_ARGUMENT,
                   "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", from,
                   to);
  if (!isfinite(to - from))
    return TPU_ERR(INVALID_ARGUMENT, "uniform_ expects to-from to be finite, but found to-from=%g",
                   to - from);
  return run_dist("uniform_", c, uniform_elem, from, to);
}

/* operands: out, mean, std */
static void normal_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  double mean = tpu_load_f64(p[1], j->dt[1]), sd = tpu_load_f64(p[2], j->dt[2]);
  if (!(sd >= 0)) j->invalid = 1;
  tpu_store_f64(p[0], j->dt[0], mean + sd * std_normal(w));
}

/* mean and std: each a tensor broadcast to the output or a number. */
static tpu_status_t normal_impl(const tpu_call_t* c, int mean_arg) {
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_float_out("normal", out));
  double mean_v = tpu_arg_f64(c, mean_arg, 0.0), std_v = tpu_arg_f64(c, mean_arg + 1, 1.0);
  tpu_tensor_t mean_s = scalar_tensor(&mean_v), std_s = scalar_tensor(&std_v);
  const tpu_tensor_t* mean = tpu_arg_tensor(c, mean_arg);
  const tpu_tensor_t* sd = tpu_arg_tensor(c, mean_arg + 1);
  if (!sd && !(std_v >= 0))
    return TPU_ERR(INVALID_ARGUMENT, "normal expects std >= 0.0, but found std %g", std_v);
  rng_job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "normal", c, out, normal_elem));
  TPU_RETURN_IF_ERROR(job_add(&j, mean ? mean : &mean_s));
  TPU_RETURN_IF_ERROR(job_add(&j, sd ? sd : &std_s));
  job_run(&j);
  if (j.invalid) return TPU_ERR(INVALID_ARGUMENT, "normal expects all elements of std >= 0.0");
  return TPU_OK;
}

/* normal_(self, mean, std) and normal.out(self, mean, std, out) */
tpu_status_t tpu_k_normal_self(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  return normal_impl(c, 1);
}
/* normal.Tensor_float / float_Tensor / Tensor_Tensor / float_float_out and
 * their out= forms: (mean, std, ...) */
tpu_status_t tpu_k_normal(const tpu_call_t* c) { return normal_impl(c, 0); }

static void log_normal_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  tpu_store_f64(p[0], j->dt[0], exp(j->a + j->b * std_normal(w)));
}

/* log_normal(self, mean, std) */
tpu_status_t tpu_k_log_normal(const tpu_call_t* c) {
  double mean = tpu_arg_f64(c, 1, 1.0), sd = tpu_arg_f64(c, 2, 2.0);
  TPU_RETURN_IF_ERROR(check_float_out("log_normal_", &c->outs[0]));
  if (!(sd > 0))
    return TPU_ERR(INVALID_ARGUMENT, "log_normal_ expects std > 0.0, but found std=%g", sd);
  return run_dist("log_normal_", c, log_normal_elem, mean, sd);
}

static void cauchy_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  tpu_store_f64(p[0], j->dt[0], j->a + j->b * tan(PI * (u01_open(w[0], w[1]) - 0.5)));
}

/* cauchy(self, median, sigma) */
tpu_status_t tpu_k_cauchy(const tpu_call_t* c) {
  double median = tpu_arg_f64(c, 1, 0.0), sigma = tpu_arg_f64(c, 2, 1.0);
  TPU_RETURN_IF_ERROR(check_float_out("cauchy_", &c->outs[0]));
  if (!(sigma > 0))
    return TPU_ERR(INVALID_ARGUMENT, "cauchy_ expects sigma > 0.0, but found sigma=%g", sigma);
  return run_dist("cauchy_", c, cauchy_elem, median, sigma);
}

static void exponential_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  tpu_store_f64(p[0], j->dt[0], -log(u01_open(w[0], w[1])) / j->a);
}

/* exponential(self, lambd) */
tpu_status_t tpu_k_exponential(const tpu_call_t* c) {
  double lambd = tpu_arg_f64(c, 1, 1.0);
  TPU_RETURN_IF_ERROR(check_float_out("exponential_", &c->outs[0]));
  /* lambd = inf is allowed, as on CPU: every sample is 0 */
  if (!(lambd > 0))
    return TPU_ERR(INVALID_ARGUMENT, "exponential_ expects lambda > 0.0, but found lambda=%g",
                   lambd);
  return run_dist("exponential_", c, exponential_elem, lambd, 0);
}

/* number of Bernoulli(p) trials up to the first success; a = log1p(-p) */
static void geometric_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  tpu_store_f64(p[0], j->dt[0], ceil(log(u01_open(w[0], w[1])) / j->a));
}

/* geometric(self, p): any dtype */
tpu_status_t tpu_k_geometric(const tpu_call_t* c) {
  double prob = tpu_arg_f64(c, 1, 0.5);
  if (!(prob > 0 && prob < 1))
    return TPU_ERR(INVALID_ARGUMENT, "geometric_ expects p to be in (0, 1), but got p=%g", prob);
  return run_dist("geometric_", c, geometric_elem, log1p(-prob), 0);
}

/* ---- bernoulli ---- */
/* operands: out, p */
static void bernoulli_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  double prob = tpu_load_f64(p[1], j->dt[1]);
  if (!(prob >= 0 && prob <= 1)) j->invalid = 1;
  tpu_store_i64(p[0], j->dt[0], u01(w[0], w[1]) < prob);
}

static tpu_status_t bernoulli_impl(const tpu_call_t* c, const tpu_tensor_t* prob) {
  rng_job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "bernoulli_", c, &c->outs[0], bernoulli_elem));
  TPU_RETURN_IF_ERROR(job_add(&j, prob));
  job_run(&j);
  if (j.invalid)
    return TPU_ERR(INVALID_ARGUMENT, "bernoulli_ expects all elements of p to be in [0, 1]");
  return TPU_OK;
}

/* bernoulli(self) and bernoulli.out: self holds the probabilities. */
tpu_status_t tpu_k_bernoulli_self(const tpu_call_t* c) {
  return bernoulli_impl(c, tpu_arg_tensor(c, 0));
}

/* bernoulli.p / bernoulli_.float / bernoulli.float_out (p a number) and
 * bernoulli.Tensor / bernoulli_.Tensor / bernoulli.Tensor_out (p a tensor
 * broadcast to self). */
tpu_status_t tpu_k_bernoulli(const tpu_call_t* c) {
  const tpu_tensor_t* prob = tpu_arg_tensor(c, 1);
  if (prob) return bernoulli_impl(c, prob);
  double pv = tpu_arg_f64(c, 1, 0.5);
  if (!(pv >= 0 && pv <= 1))
    return TPU_ERR(INVALID_ARGUMENT, "bernoulli_ expects p to be in [0, 1], but got p=%g", pv);
  tpu_tensor_t ps = scalar_tensor(&pv);
  return bernoulli_impl(c, &ps);
}

/* ---- random_ ---- */
static void random_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  uint64_t bits = bits64(w[0], w[1]);
  uint64_t r = j->range ? bits % j->range : bits;
  tpu_store_i64(p[0], j->dt[0], (int64_t)((uint64_t)j->from + r));
}

/* Significand bits of float dtypes (std::numeric_limits::digits). */

/* Draws from [from, to_inc] (inclusive); from == INT64_MIN with to_inc ==
 * INT64_MAX covers all 64 bits. */
static tpu_status_t random_range(const tpu_call_t* c, int64_t from, int64_t to_inc) {
  const tpu_tensor_t* out = &c->outs[0];
  if (!tpu_dtype_is_supported(out->dtype))
    return TPU_ERR(UNIMPLEMENTED, "random_: dtype %d is not supported on tpu", (int)out->dtype);
  double lo, hi;
  tpu_random_dtype_bounds(out->dtype, &lo, &hi);
  if ((double)from < lo || (double)from > hi)
    return TPU_ERR(INVALID_ARGUMENT, "random_: from is out of bounds for %s (from=%lld)",
                   tpu_dtype_name(out->dtype), (long long)from);
  if ((double)to_inc < lo || (double)to_inc > hi)
    return TPU_ERR(INVALID_ARGUMENT, "random_: to - 1 is out of bounds for %s (to - 1=%lld)",
                   tpu_dtype_name(out->dtype), (long long)to_inc);
  rng_job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "random_", c, out, random_elem));
  j.from = from;
  j.range = (uint64_t)to_inc - (uint64_t)from + 1; /* wraps to 0 for the full range */
  job_run(&j);
  return TPU_OK;
}

/* random(self) / random_ / random.out: [0, 2^digits] for floats, [0, max]
 * for integers. */
tpu_status_t tpu_k_random(const tpu_call_t* c) {
  return random_range(c, 0, tpu_random_default_to_inc(c->outs[0].dtype));
}

/* random.from(self, from, to?) and forms: [from, to), or [from, default]
 * when to is None. */
tpu_status_t tpu_k_random_from(const tpu_call_t* c) {
  int64_t from = tpu_arg_i64(c, 1, 0);
  if (tpu_arg_is_none(c, 2)) {
    int64_t to_inc = tpu_random_default_to_inc(c->outs[0].dtype);
    if (from > to_inc)
      return TPU_ERR(INVALID_ARGUMENT,
                     "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                     "casted to dtype, but got from=%lld > to_inc=%lld",
                     (long long)from, (long long)to_inc);
    return random_range(c, from, to_inc);
  }
  int64_t to = tpu_arg_i64(c, 2, 0);
  if (from >= to)
    return TPU_ERR(INVALID_ARGUMENT,
                   "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                   (long long)from, (long long)to);
  return random_range(c, from, to - 1);
}

/* random.to(self, to) and forms: [0, to) */
tpu_status_t tpu_k_random_to(const tpu_call_t* c) {
  int64_t to = tpu_arg_i64(c, 1, 1);
  if (to <= 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "random_ expects 'from' to be less than 'to', but got from=0 >= to=%lld",
                   (long long)to);
  return random_range(c, 0, to - 1);
}

/* ---- dropout ---- */
/* operands: output, mask, input; a = keep probability, b = 1 / a (0 if a = 0) */
static void dropout_elem(rng_job_t* j, const uint32_t* w, char* const* p) {
  bool keep = u01(w[0], w[1]) < j->a;
  double x = tpu_load_f64(p[2], j->dt[2]);
  tpu_store_f64(p[0], j->dt[0], x * (keep ? 1.0 : 0.0) * j->b);
  tpu_store_i64(p[1], j->dt[1], keep);
}

static void ones_i64(void* ctx, int64_t n, void* out, const void* const* in) {
  int64_t* o = out;
  for (int64_t i = 0; i < n; i++) o[i] = 1;
}

/* native_dropout(input, p, train?) -> (output, mask): train None means
 * training. In training each element is kept with probability 1 - p and
 * scaled by 1 / (1 - p); otherwise output copies input and mask is all true. */
tpu_status_t tpu_k_native_dropout(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t *out = &c->outs[0], *mask = &c->outs[1];
  double p = tpu_arg_f64(c, 1, 0.5);
  bool train = tpu_arg_is_none(c, 2) || tpu_arg_bool(c, 2, true);
  if (!(p >= 0 && p <= 1))
    return TPU_ERR(INVALID_ARGUMENT,
                   "dropout probability has to be between 0 and 1, but got %g", p);
  if (!train) {
    TPU_RETURN_IF_ERROR(tpu_copy_strided(out, in));
    return tpu_elementwise(mask, NULL, 0, TPU_CT_I64, ones_i64, NULL);
  }
  rng_job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "native_dropout", c, out, dropout_elem));
  TPU_RETURN_IF_ERROR(job_add(&j, mask));
  TPU_RETURN_IF_ERROR(job_add(&j, in));
  j.a = 1.0 - p;
  j.b = j.a == 0 ? 0.0 : 1.0 / j.a;
  job_run(&j);
  return TPU_OK;
}

/* ---- randperm ---- */
/* randperm.out(n, out) / randperm.generator_out(n, generator, out):
 * Fisher-Yates, serial; the swap partner of position i comes from block i. */
tpu_status_t tpu_k_randperm(const tpu_call_t* c) {
  int64_t n = tpu_arg_i64(c, 0, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (n < 0)
    return TPU_ERR(INVALID_ARGUMENT, "randperm: n must be non-negative, got %lld", (long long)n);
  if (out->ndim != 1 || out->sizes[0] != n)
    return TPU_ERR(INVALID_ARGUMENT, "randperm: expected a 1-d output of %lld elements",
                   (long long)n);
  if (n == 0) return TPU_OK;
  int64_t* perm = malloc((size_t)n * sizeof(int64_t));
  if (!perm)
    return TPU_ERR(RESOURCE_EXHAUSTED, "randperm: out of host memory for n=%lld", (long long)n);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    tpu_philox_block_t b = tpu_philox_element(c->rng_seed, c->rng_offset, i);
    int64_t k = (int64_t)(bits64(b.w[0], b.w[1]) % (uint64_t)(i + 1));
    int64_t t = perm[i];
    perm[i] = perm[k];
    perm[k] = t;
  }
  size_t esz = tpu_dtype_size(out->dtype);
  for (int64_t i = 0; i < n; i++)
    tpu_store_i64((char*)out->data + (size_t)(i * out->strides[0]) * esz, out->dtype, perm[i]);
  free(perm);
  return TPU_OK;
}

/* ---- multinomial ---- */
typedef struct {
  const tpu_call_t* call;
  const tpu_tensor_t *probs, *out;
  int64_t ncat, nsamples;
  bool replacement;
  _Atomic int err; /* 1: bad probability, 2: zero sum, 3: out of memory */
} multinomial_job_t;

/* Category whose cumulative weight interval holds x: the first with
 * cdf > x, skipping zero-weight categories (cdf is non-decreasing). */
static int64_t search_cdf(const double* cdf, int64_t n, double x) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (cdf[mid] > x) hi = mid;
    else lo = mid + 1;
  }
  while (lo > 0 && cdf[lo] == cdf[lo - 1]) lo--; /* x at the top edge: last positive weight */
  return lo;
}

/* Draws without replacement: `w` holds the remaining weights, -1 marks
 * categories already drawn; when only zero weights remain, a uniformly
 * chosen remaining category is drawn. */
static int64_t draw_without_replacement(double* w, int64_t n, int64_t remaining,
                                        const uint32_t* words) {
  double total = 0;
  for (int64_t c = 0; c < n; c++)
    if (w[c] > 0) total += w[c];
  int64_t pick = -1;
  if (total > 0) {
    double x = u01(words[0], words[1]) * total, acc = 0;
    for (int64_t c = 0; c < n; c++) {
      if (w[c] <= 0) continue;
      pick = c; /* also the fallback when rounding leaves acc <= x at the end */
      acc += w[c];
      if (acc > x) break;
    }
  } else {
    int64_t m = (int64_t)(bits64(words[2], words[3]) % (uint64_t)remaining);
    for (int64_t c = 0; c < n; c++)
      if (w[c] == 0 && m-- == 0) {
        pick = c;
        break;
      }
  }
  w[pick] = -1;
  return pick;
}

static void multinomial_rows(void* arg, int64_t begin, int64_t end) {
  multinomial_job_t* j = arg;
  const tpu_tensor_t *pr = j->probs, *out = j->out;
  int64_t n = j->ncat, ns = j->nsamples;
  double* w = malloc((size_t)n * sizeof(double));
  if (!w) {
    j->err = 3;
    return;
  }
  size_t pesz = tpu_dtype_size(pr->dtype), oesz = tpu_dtype_size(out->dtype);
  int64_t pst = pr->strides[pr->ndim - 1], ost = out->strides[out->ndim - 1];
  for (int64_t r = begin; r < end; r++) {
    int64_t prow = pr->ndim == 2 ? r * pr->strides[0] : 0;
    int64_t orow_off = out->ndim == 2 ? r * out->strides[0] : 0;
    const char* row = (const char*)pr->data + prow * (int64_t)pesz;
    char* orow = (char*)out->data + orow_off * (int64_t)oesz;
    double total = 0;
    for (int64_t c = 0; c < n; c++) {
      w[c] = tpu_load_f64(row + c * pst * (int64_t)pesz, pr->dtype);
      if (!(w[c] >= 0) || isinf(w[c])) j->err = 1;
      total += w[c];
      if (j->replacement) w[c] = total; /* running sum: the cdf */
    }
    if (j->err) break;
    if (!(total > 0)) {
      j->err = 2;
      break;
    }
    for (int64_t s = 0; s < ns; s++) {
      tpu_philox_block_t b =
          tpu_philox_element(j->call->rng_seed, j->call->rng_offset, r * ns + s);
      int64_t pick = j->replacement ? search_cdf(w, n, u01(b.w[0], b.w[1]) * total)
                                    : draw_without_replacement(w, n, n - s, b.w);
      tpu_store_i64(orow + s * ost * (int64_t)oesz, out->dtype, pick);
    }
  }
  free(w);
}

/* multinomial(self, num_samples, replacement) and multinomial.out: self is
 * [categories] or [rows, categories] of non-negative weights. */
tpu_status_t tpu_k_multinomial(const tpu_call_t* c) {
  multinomial_job_t j = {0};
  j.call = c;
  j.probs = tpu_arg_tensor(c, 0);
  j.out = &c->outs[0];
  j.nsamples = tpu_arg_i64(c, 1, 1);
  j.replacement = tpu_arg_bool(c, 2, false);
  const tpu_tensor_t* pr = j.probs;
  if (pr->ndim < 1 || pr->ndim > 2)
    return TPU_ERR(INVALID_ARGUMENT, "multinomial: prob_dist must be 1 or 2 dim, got %d",
                   pr->ndim);
  if (!tpu_dtype_is_float(pr->dtype))
    return TPU_ERR(INVALID_ARGUMENT,
                   "multinomial only supports floating-point dtypes for input, got %s",
                   tpu_dtype_name(pr->dtype));
  j.ncat = pr->sizes[pr->ndim - 1];
  int64_t rows = pr->ndim == 2 ? pr->sizes[0] : 1;
  if (j.nsamples <= 0)
    return TPU_ERR(INVALID_ARGUMENT, "multinomial: cannot sample n_sample <= 0 samples (got %lld)",
                   (long long)j.nsamples);
  if (!j.replacement && j.nsamples > j.ncat)
    return TPU_ERR(INVALID_ARGUMENT,
                   "multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
                   "replacement (%lld > %lld)",
                   (long long)j.nsamples, (long long)j.ncat);
  if (j.ncat == 0)
    return TPU_ERR(INVALID_ARGUMENT, "multinomial: number of categories cannot be zero");
  const tpu_tensor_t* out = j.out;
  if (out->ndim != pr->ndim || out->sizes[out->ndim - 1] != j.nsamples ||
      (out->ndim == 2 && out->sizes[0] != rows))
    return TPU_ERR(INVALID_ARGUMENT, "multinomial: output shape does not match [%lld, %lld]",
                   (long long)rows, (long long)j.nsamples);
  if (rows == 0) return TPU_OK;
  tpu_parallel_for(rows, 1, multinomial_rows, &j);
  switch (j.err) {
    case 1:
      return TPU_ERR(INVALID_ARGUMENT,
                     "multinomial: probability tensor contains either `inf`, `nan` or element < 0");
    case 2:
      return TPU_ERR(INVALID_ARGUMENT,
                     "multinomial: invalid multinomial distribution (sum of probabilities <= 0)");
    case 3:
      return TPU_ERR(RESOURCE_EXHAUSTED, "multinomial: out of host memory for %lld categories",
                     (long long)j.ncat);
    default: return TPU_OK;
  }
}
