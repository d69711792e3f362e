/* Random-number kernels (Philox counter contract, distributions, dropout,
 * randperm, multinomial) and sorting/selection kernels. */
#include "base/philox.h"
#include "test_util.h"

/* Runs a random op with an explicit seed and counter offset. */
static tpu_status_t run_rng(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* outs,
                            int nouts, uint64_t seed, uint64_t offset) {
  tpu_call_t base = {0};
  base.rng_seed = seed;
  base.rng_offset = offset;
  return tt_run_with(name, args, nargs, outs, nouts, &base);
}

static void test_philox_known_answers(void) {
  tpu_philox_block_t b = tpu_philox4x32_10(0, 0, 0);
  CHECK(b.w[0] == 0x6627e8d5u && b.w[1] == 0xe169c58du && b.w[2] == 0xbc57ac4cu &&
        b.w[3] == 0x9b00dbd8u);
  b = tpu_philox4x32_10(UINT64_MAX, UINT64_MAX, UINT64_MAX);
  CHECK(b.w[0] == 0x408f276du && b.w[1] == 0x41c83b0eu && b.w[2] == 0xa20bc7c6u &&
        b.w[3] == 0x6d5451fdu);
  b = tpu_philox4x32_10(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  CHECK(b.w[0] == 0xd16cfe09u && b.w[1] == 0x94fdccebu && b.w[2] == 0x5001e420u &&
        b.w[3] == 0x24126ea1u);
  CHECK(tpu_random_counters_used(12345) == 12345);
  CHECK(tpu_random_counters_used(0) == 0);
}

/* ---- determinism ---- */
#define NDET 100000
typedef struct {
  float* out;
  tpu_status_t st;
} serial_ctx_t;

static void uniform_into(float* out, int64_t n, uint64_t seed, uint64_t offset, tpu_status_t* st) {
  tpu_tensor_t t = tt_make(out, TPU_F32, 1, &n);
  tpu_arg_t args[3] = {ta_t(&t), ta_d(-1.0), ta_d(1.0)};
  *st = run_rng("uniform_", args, 3, &t, 1, seed, offset);
}

/* Inside a parallel_for body the pool is busy, so the kernel runs serially. */
static void serial_body(void* arg, int64_t begin, int64_t end) {
  serial_ctx_t* s = arg;
  if (begin == 0) uniform_into(s->out, NDET, 42, 1000, &s->st);
}

static void test_determinism(void) {
  static float a[NDET], b[NDET], c[NDET], d[NDET];
  tpu_status_t st;
  uniform_into(a, NDET, 42, 1000, &st);
  CHECK_OK(st);
  serial_ctx_t s = {b, TPU_OK};
  tpu_parallel_for(2, 1, serial_body, &s);
  CHECK_OK(s.st);
  CHECK(memcmp(a, b, sizeof a) == 0);
  /* the same numbers in two calls split at 30000 with offsets advanced */
  uniform_into(c, 30000, 42, 1000, &st);
  CHECK_OK(st);
  uniform_into(c + 30000, NDET - 30000, 42, 1000 + 30000, &st);
  CHECK_OK(st);
  CHECK(memcmp(a, c, sizeof a) == 0);
  /* another offset: different numbers (element i is element i + 1 of offset 1000) */
  uniform_into(d, NDET, 42, 1001, &st);
  CHECK_OK(st);
  int same = 0;
  for (int i = 0; i < NDET; i++) same += a[i] == d[i];
  CHECK(same < 10);
  CHECK(memcmp(d, a + 1, sizeof(float) * (NDET - 1)) == 0);
  /* another seed: different numbers */
  uniform_into(d, NDET, 43, 1000, &st);
  CHECK_OK(st);
  same = 0;
  for (int i = 0; i < NDET; i++) same += a[i] == d[i];
  CHECK(same < 10);
}

/* A strided output is filled by logical index; the gaps are untouched. */
static void test_strided_output(void) {
  float dense[64], buf[128];
  int64_t n = 64;
  tpu_status_t st;
  uniform_into(dense, n, 7, 5, &st);
  CHECK_OK(st);
  for (int i = 0; i < 128; i++) buf[i] = -42.f;
  int64_t s2[2] = {8, 8};
  tpu_tensor_t t = tt_make(buf, TPU_F32, 2, s2);
  t.strides[0] = 16; /* rows of 8 elements, every other row of 8 skipped */
  tpu_arg_t args[3] = {ta_t(&t), ta_d(-1.0), ta_d(1.0)};
  CHECK_OK(run_rng("uniform_", args, 3, &t, 1, 7, 5));
  for (int r = 0; r < 8; r++)
    for (int col = 0; col < 8; col++) {
      CHECK(buf[r * 16 + col] == dense[r * 8 + col]);
      CHECK(buf[r * 16 + 8 + col] == -42.f);
    }
}

/* ---- distributions ---- */
#define NS 100000
static void moments_f64(const tpu_tensor_t* t, double* mean, double* var) {
  int64_t n = tpu_tensor_numel(t);
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = tpu_tensor_get_f64(t, i);
    s += v;
    s2 += v * v;
  }
  *mean = s / (double)n;
  *var = s2 / (double)n - *mean * *mean;
}

static void test_uniform(void) {
  static float f[NS];
  static uint16_t h[NS];
  int64_t n = NS;
  tpu_tensor_t t = tt_make(f, TPU_F32, 1, &n);
  tpu_arg_t args[3] = {ta_t(&t), ta_d(2.0), ta_d(5.0)};
  CHECK_OK(run_rng("uniform_", args, 3, &t, 1, 1, 0));
  double mean, var;
  moments_f64(&t, &mean, &var);
  CHECK_NEAR(mean, 3.5, 0.02);
  CHECK_NEAR(var, 0.75, 0.02);
  float lo = 10, hi = -10;
  for (int i = 0; i < NS; i++) {
    lo = f[i] < lo ? f[i] : lo;
    hi = f[i] > hi ? f[i] : hi;
  }
  CHECK(lo >= 2.f && lo < 2.01f && hi < 5.f && hi > 4.99f);
  /* bf16 rounds many values near 1 up to 1: the range must stay [0, 1) */
  tpu_tensor_t tb = tt_make(h, TPU_BF16, 1, &n);
  tpu_arg_t bargs[3] = {ta_t(&tb), ta_d(0.0), ta_d(1.0)};
  CHECK_OK(run_rng("uniform_", bargs, 3, &tb, 1, 1, 0));
  int bad = 0;
  for (int i = 0; i < NS; i++) {
    float v = tpu_bf16_to_f32(h[i]);
    bad += !(v >= 0.f && v < 1.f);
  }
  CHECK(bad == 0);
  moments_f64(&tb, &mean, &var);
  CHECK_NEAR(mean, 0.5, 0.01);
  /* errors: from > to, integer output */
  tpu_arg_t e1[3] = {ta_t(&t), ta_d(3.0), ta_d(1.0)};
  tpu_status_t st = run_rng("uniform_", e1, 3, &t, 1, 1, 0);
  CHECK(st && strstr(tpu_status_message(st), "from=3"));
  tpu_status_free(st);
  int64_t iv[4];
  int64_t n4 = 4;
  tpu_tensor_t ti = tt_make(iv, TPU_I64, 1, &n4);
  tpu_arg_t e2[3] = {ta_t(&ti), ta_d(0.0), ta_d(1.0)};
  st = run_rng("uniform_", e2, 3, &ti, 1, 1, 0);
  CHECK(st && tpu_status_code(st) == TPU_CODE_UNIMPLEMENTED);
  tpu_status_free(st);
}

static void test_normal(void) {
  static double d[NS];
  static float f[NS];
  int64_t n = NS;
  tpu_tensor_t t = tt_make(d, TPU_F64, 1, &n);
  tpu_arg_t args[3] = {ta_t(&t), ta_d(1.0), ta_d(2.0)};
  CHECK_OK(run_rng("normal_", args, 3, &t, 1, 9, 3));
  double mean, var;
  moments_f64(&t, &mean, &var);
  CHECK_NEAR(mean, 1.0, 0.03);
  CHECK_NEAR(sqrt(var), 2.0, 0.03);
  /* normal.Tensor_Tensor: mean [2] and 0-d std broadcast to [N/2, 2] */
  float mv[2] = {-5.f, 5.f};
  double sv = 0.5;
  int64_t s1[1] = {2}, s2[2] = {NS / 2, 2};
  tpu_tensor_t tm = tt_make(mv, TPU_F32, 1, s1), tsd = tt_make(&sv, TPU_F64, 0, NULL),
               to = tt_make(f, TPU_F32, 2, s2);
  tpu_arg_t targs[3] = {ta_t(&tm), ta_t(&tsd), ta_none()};
  CHECK_OK(run_rng("normal.Tensor_Tensor", targs, 3, &to, 1, 9, 3));
  double col[2] = {0, 0}, col2[2] = {0, 0};
  for (int i = 0; i < NS; i++) {
    col[i % 2] += f[i];
    col2[i % 2] += (double)f[i] * f[i];
  }
  for (int k = 0; k < 2; k++) {
    double m = col[k] / (NS / 2), sd = sqrt(col2[k] / (NS / 2) - m * m);
    CHECK_NEAR(m, mv[k], 0.02);
    CHECK_NEAR(sd, 0.5, 0.02);
  }
  tpu_arg_t e[3] = {ta_t(&t), ta_d(0.0), ta_d(-1.0)};
  tpu_status_t st = run_rng("normal_", e, 3, &t, 1, 1, 0);
  CHECK(st && strstr(tpu_status_message(st), "std >= 0.0"));
  tpu_status_free(st);
}

static void test_exponential_geometric(void) {
  static float f[NS];
  static int32_t g[NS];
  int64_t n = NS;
  tpu_tensor_t t = tt_make(f, TPU_F32, 1, &n);
  tpu_arg_t args[2] = {ta_t(&t), ta_d(4.0)};
  CHECK_OK(run_rng("exponential_", args, 2, &t, 1, 5, 0));
  double mean, var;
  moments_f64(&t, &mean, &var);
  CHECK_NEAR(mean, 0.25, 0.005);
  int nonpos = 0;
  for (int i = 0; i < NS; i++) nonpos += f[i] <= 0;
  CHECK(nonpos == 0);
  tpu_tensor_t tg = tt_make(g, TPU_I32, 1, &n);
  tpu_arg_t gargs[2] = {ta_t(&tg), ta_d(0.25)};
  CHECK_OK(run_rng("geometric_", gargs, 2, &tg, 1, 5, 0));
  moments_f64(&tg, &mean, &var);
  CHECK_NEAR(mean, 4.0, 0.06);
  int below1 = 0;
  for (int i = 0; i < NS; i++) below1 += g[i] < 1;
  CHECK(below1 == 0);
}

static void test_bernoulli(void) {
  static float f[NS];
  static uint8_t b[NS];
  int64_t n = NS;
  tpu_tensor_t t = tt_make(f, TPU_F32, 1, &n);
  tpu_arg_t args[2] = {ta_t(&t), ta_d(0.3)};
  CHECK_OK(run_rng("bernoulli_.float", args, 2, &t, 1, 11, 0));
  double mean, var;
  moments_f64(&t, &mean, &var);
  CHECK_NEAR(mean, 0.3, 0.01);
  /* p tensor [2] = {0, 1} broadcast over bool [N/2, 2] */
  double pv[2] = {0.0, 1.0};
  int64_t s1[1] = {2}, s2[2] = {NS / 2, 2};
  tpu_tensor_t tp = tt_make(pv, TPU_F64, 1, s1), tb = tt_make(b, TPU_BOOL, 2, s2);
  tpu_arg_t targs[2] = {ta_t(&tb), ta_t(&tp)};
  CHECK_OK(run_rng("bernoulli_.Tensor", targs, 2, &tb, 1, 11, 0));
  int wrong = 0;
  for (int i = 0; i < NS; i++) wrong += b[i] != (i % 2);
  CHECK(wrong == 0);
  /* bernoulli(self): self holds p */
  for (int i = 0; i < NS; i++) f[i] = (i % 2) ? 0.9f : 0.1f;
  static float o[NS];
  tpu_tensor_t tout = tt_make(o, TPU_F32, 1, &n);
  tpu_arg_t sargs[2] = {ta_t(&t), ta_none()};
  CHECK_OK(run_rng("bernoulli", sargs, 2, &tout, 1, 11, 0));
  double odd = 0, even = 0;
  for (int i = 0; i < NS; i++) *(i % 2 ? &odd : &even) += o[i];
  CHECK_NEAR(odd / (NS / 2), 0.9, 0.01);
  CHECK_NEAR(even / (NS / 2), 0.1, 0.01);
  /* errors: p out of [0, 1] as a number and inside a tensor */
  tpu_arg_t e[2] = {ta_t(&t), ta_d(1.5)};
  tpu_status_t st = run_rng("bernoulli_.float", e, 2, &t, 1, 1, 0);
  CHECK(st && strstr(tpu_status_message(st), "p=1.5"));
  tpu_status_free(st);
  pv[1] = 2.0;
  st = run_rng("bernoulli_.Tensor", targs, 2, &tb, 1, 11, 0);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
}

static void test_dropout(void) {
  static float in[NS], out[NS];
  static uint8_t mask[NS];
  int64_t n = NS;
  for (int i = 0; i < NS; i++) in[i] = (float)(i % 7) - 3.f;
  tpu_tensor_t ti = tt_make(in, TPU_F32, 1, &n);
  tpu_tensor_t outs[2] = {tt_make(out, TPU_F32, 1, &n), tt_make(mask, TPU_BOOL, 1, &n)};
  tpu_arg_t args[3] = {ta_t(&ti), ta_d(0.25), ta_none()}; /* train None: training */
  CHECK_OK(run_rng("native_dropout", args, 3, outs, 2, 3, 77));
  int kept = 0, bad = 0;
  for (int i = 0; i < NS; i++) {
    kept += mask[i];
    float want = mask[i] ? in[i] / 0.75f : 0.f;
    bad += fabsf(out[i] - want) > 1e-6f;
  }
  CHECK(bad == 0);
  CHECK_NEAR((double)kept / NS, 0.75, 0.01);
  /* eval: a copy and an all-true mask */
  args[2] = ta_b(false);
  memset(mask, 0, sizeof mask);
  CHECK_OK(run_rng("native_dropout", args, 3, outs, 2, 3, 77));
  bad = 0;
  for (int i = 0; i < NS; i++) bad += out[i] != in[i] || mask[i] != 1;
  CHECK(bad == 0);
  /* p = 1 drops everything */
  args[1] = ta_d(1.0);
  args[2] = ta_b(true);
  CHECK_OK(run_rng("native_dropout", args, 3, outs, 2, 3, 77));
  bad = 0;
  for (int i = 0; i < NS; i++) bad += out[i] != 0.f || mask[i] != 0;
  CHECK(bad == 0);
  /* 0-size input */
  int64_t z = 0;
  tpu_tensor_t tz = tt_make(in, TPU_F32, 1, &z);
  tpu_tensor_t zouts[2] = {tt_make(out, TPU_F32, 1, &z), tt_make(mask, TPU_BOOL, 1, &z)};
  tpu_arg_t zargs[3] = {ta_t(&tz), ta_d(0.5), ta_b(true)};
  CHECK_OK(run_rng("native_dropout", zargs, 3, zouts, 2, 3, 77));
}

static void test_random_ranges(void) {
  static int8_t i8[NS];
  static int64_t i64[NS];
  int64_t n = NS;
  tpu_tensor_t t8 = tt_make(i8, TPU_I8, 1, &n);
  tpu_arg_t args[4] = {ta_t(&t8), ta_i(-5), ta_i(10), ta_none()};
  CHECK_OK(run_rng("random_.from", args, 4, &t8, 1, 8, 0));
  int seen[15] = {0}, out_of_range = 0;
  for (int i = 0; i < NS; i++) {
    if (i8[i] < -5 || i8[i] >= 10) out_of_range++;
    else seen[i8[i] + 5] = 1;
  }
  CHECK(out_of_range == 0);
  for (int k = 0; k < 15; k++) CHECK(seen[k]);
  /* int64 [-2^40, 2^40) */
  tpu_tensor_t t64 = tt_make(i64, TPU_I64, 1, &n);
  int64_t lo = -((int64_t)1 << 40), hi = (int64_t)1 << 40;
  tpu_arg_t a64[4] = {ta_t(&t64), ta_i(lo), ta_i(hi), ta_none()};
  CHECK_OK(run_rng("random_.from", a64, 4, &t64, 1, 8, 0));
  int neg = 0;
  out_of_range = 0;
  for (int i = 0; i < NS; i++) {
    out_of_range += i64[i] < lo || i64[i] >= hi;
    neg += i64[i] < 0;
  }
  CHECK(out_of_range == 0);
  CHECK_NEAR((double)neg / NS, 0.5, 0.01);
  /* random_.from with to None on int8: [100, 127] */
  tpu_arg_t anone[4] = {ta_t(&t8), ta_i(100), ta_none(), ta_none()};
  CHECK_OK(run_rng("random_.from", anone, 4, &t8, 1, 8, 0));
  int hit_max = 0;
  out_of_range = 0;
  for (int i = 0; i < NS; i++) {
    out_of_range += i8[i] < 100;
    hit_max += i8[i] == 127;
  }
  CHECK(out_of_range == 0 && hit_max > 0);
  /* random_() on int8: [0, 127]; on bool: 0 and 1 */
  tpu_arg_t adef[2] = {ta_t(&t8), ta_none()};
  CHECK_OK(run_rng("random_", adef, 2, &t8, 1, 8, 0));
  out_of_range = 0;
  for (int i = 0; i < NS; i++) out_of_range += i8[i] < 0;
  CHECK(out_of_range == 0);
  uint8_t bl[1000];
  int64_t nb = 1000;
  tpu_tensor_t tb = tt_make(bl, TPU_BOOL, 1, &nb);
  tpu_arg_t abool[2] = {ta_t(&tb), ta_none()};
  CHECK_OK(run_rng("random_", abool, 2, &tb, 1, 8, 0));
  int ones = 0, other = 0;
  for (int i = 0; i < 1000; i++) {
    ones += bl[i] == 1;
    other += bl[i] > 1;
  }
  CHECK(other == 0 && ones > 400 && ones < 600);
  /* random_.to on bf16: integers in [0, 100) */
  uint16_t h[1000];
  tpu_tensor_t th = tt_make(h, TPU_BF16, 1, &nb);
  tpu_arg_t ato[3] = {ta_t(&th), ta_i(100), ta_none()};
  CHECK_OK(run_rng("random_.to", ato, 3, &th, 1, 8, 0));
  int bad = 0;
  for (int i = 0; i < 1000; i++) {
    float v = tpu_bf16_to_f32(h[i]);
    bad += v < 0 || v >= 100 || v != floorf(v);
  }
  CHECK(bad == 0);
  /* errors: from out of int8 bounds, from >= to */
  tpu_arg_t e1[4] = {ta_t(&t8), ta_i(-200), ta_i(5), ta_none()};
  tpu_status_t st = run_rng("random_.from", e1, 4, &t8, 1, 8, 0);
  CHECK(st && strstr(tpu_status_message(st), "out of bounds for int8"));
  tpu_status_free(st);
  tpu_arg_t e2[4] = {ta_t(&t8), ta_i(5), ta_i(5), ta_none()};
  st = run_rng("random_.from", e2, 4, &t8, 1, 8, 0);
  CHECK(st && strstr(tpu_status_message(st), "from=5 >= to=5"));
  tpu_status_free(st);
}

static void test_randperm_multinomial(void) {
  int64_t perm[1000];
  int64_t n = 1000;
  tpu_tensor_t tp = tt_make(perm, TPU_I64, 1, &n);
  tpu_arg_t args[2] = {ta_i(1000), ta_t(&tp)};
  CHECK_OK(run_rng("randperm.out", args, 2, &tp, 1, 2, 0));
  int seen[1000] = {0}, fixed = 0;
  for (int i = 0; i < 1000; i++) {
    if (perm[i] >= 0 && perm[i] < 1000) seen[perm[i]]++;
    fixed += perm[i] == i;
  }
  for (int i = 0; i < 1000; i++) CHECK(seen[i] == 1);
  CHECK(fixed < 10);
  /* with replacement: frequencies follow the weights; zero weight never drawn */
  float w[4] = {1.f, 0.f, 3.f, 4.f};
  static int64_t draws[NS];
  int64_t s4[1] = {4}, sn[1] = {NS};
  tpu_tensor_t tw = tt_make(w, TPU_F32, 1, s4), td = tt_make(draws, TPU_I64, 1, sn);
  tpu_arg_t margs[4] = {ta_t(&tw), ta_i(NS), ta_b(true), ta_none()};
  CHECK_OK(run_rng("multinomial", margs, 4, &td, 1, 4, 0));
  int count[4] = {0}, bad = 0;
  for (int i = 0; i < NS; i++) {
    if (draws[i] < 0 || draws[i] > 3) bad++;
    else count[draws[i]]++;
  }
  CHECK(bad == 0 && count[1] == 0);
  CHECK_NEAR((double)count[0] / NS, 0.125, 0.01);
  CHECK_NEAR((double)count[3] / NS, 0.5, 0.01);
  /* without replacement over 2 rows: distinct categories, positive weights first */
  float w2[8] = {0.f, 1.f, 0.f, 2.f, 5.f, 5.f, 5.f, 5.f};
  int64_t s24[2] = {2, 4}, o24[8];
  tpu_tensor_t tw2 = tt_make(w2, TPU_F32, 2, s24), to2 = tt_make(o24, TPU_I64, 2, s24);
  tpu_arg_t nargs[4] = {ta_t(&tw2), ta_i(4), ta_b(false), ta_none()};
  CHECK_OK(run_rng("multinomial", nargs, 4, &to2, 1, 4, 0));
  for (int r = 0; r < 2; r++) {
    int hit[4] = {0};
    for (int s = 0; s < 4; s++) hit[o24[r * 4 + s] & 3]++;
    for (int k = 0; k < 4; k++) CHECK(hit[k] == 1);
  }
  CHECK((o24[0] == 1 || o24[0] == 3) && (o24[1] == 1 || o24[1] == 3));
  /* error: negative weight */
  w[1] = -1.f;
  tpu_status_t st = run_rng("multinomial", margs, 4, &td, 1, 4, 0);
  CHECK(st && strstr(tpu_status_message(st), "element < 0"));
  tpu_status_free(st);
}

/* ---- sorting ---- */
static void test_sort(void) {
  float x[8] = {3.f, NAN, 1.f, 3.f, -0.f, 0.f, NAN, -2.f};
  float v[8];
  int64_t idx[8], n = 8;
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, &n);
  tpu_tensor_t outs[2] = {tt_make(v, TPU_F32, 1, &n), tt_make(idx, TPU_I64, 1, &n)};
  /* ascending: NaN last, ties in index order */
  tpu_arg_t args[3] = {ta_t(&tx), ta_i(0), ta_b(false)};
  CHECK_OK(tt_run("sort", args, 3, outs, 2));
  int64_t want_a[8] = {7, 4, 5, 2, 0, 3, 1, 6};
  for (int i = 0; i < 8; i++) CHECK(idx[i] == want_a[i]);
  CHECK(v[0] == -2.f && v[5] == 3.f && isnan(v[6]) && isnan(v[7]));
  CHECK(signbit(v[1]) && !signbit(v[2])); /* -0.0 ties with 0.0 and comes first */
  /* descending (stable): NaN first, ties still in index order */
  tpu_arg_t dargs[4] = {ta_t(&tx), ta_b(true), ta_i(-1), ta_b(true)};
  CHECK_OK(tt_run("sort.stable", dargs, 4, outs, 2));
  int64_t want_d[8] = {1, 6, 0, 3, 2, 4, 5, 7};
  for (int i = 0; i < 8; i++) CHECK(idx[i] == want_d[i]);
  CHECK(isnan(v[0]) && v[2] == 3.f && v[7] == -2.f);
  /* a transposed int32 [3, 2] view sorted along dim 0 */
  int32_t m[6] = {5, 1, 4, 2, 1, 9}; /* storage [2, 3]: rows {5,1,4}, {2,1,9} */
  int32_t mv[6];
  int64_t mi[6], s32[2] = {3, 2};
  tpu_tensor_t tm = {0};
  tm = tt_make(m, TPU_I32, 2, s32);
  tm.strides[0] = 1;
  tm.strides[1] = 3; /* view[i][j] = storage[j][i] */
  tpu_tensor_t mouts[2] = {tt_make(mv, TPU_I32, 2, s32), tt_make(mi, TPU_I64, 2, s32)};
  tpu_arg_t margs[3] = {ta_t(&tm), ta_i(0), ta_b(false)};
  CHECK_OK(tt_run("sort", margs, 3, mouts, 2));
  int32_t want_mv[6] = {1, 1, 4, 2, 5, 9};
  int64_t want_mi[6] = {1, 1, 2, 0, 0, 2};
  for (int i = 0; i < 6; i++) CHECK(mv[i] == want_mv[i] && mi[i] == want_mi[i]);
  /* bf16 descending */
  uint16_t b[4], bv[4];
  float bsrc[4] = {0.5f, -1.f, 2.f, 0.25f};
  for (int i = 0; i < 4; i++) b[i] = tpu_f32_to_bf16(bsrc[i]);
  int64_t n4 = 4, bi[4];
  tpu_tensor_t tb = tt_make(b, TPU_BF16, 1, &n4);
  tpu_tensor_t bouts[2] = {tt_make(bv, TPU_BF16, 1, &n4), tt_make(bi, TPU_I64, 1, &n4)};
  tpu_arg_t bargs[3] = {ta_t(&tb), ta_i(0), ta_b(true)};
  CHECK_OK(tt_run("sort", bargs, 3, bouts, 2));
  CHECK(tpu_bf16_to_f32(bv[0]) == 2.f && tpu_bf16_to_f32(bv[3]) == -1.f);
  CHECK(bi[0] == 2 && bi[1] == 0 && bi[2] == 3 && bi[3] == 1);
  /* values written over the input itself: sort(x, out=(x, idx)) */
  float y[5] = {2.f, -1.f, 7.f, 0.5f, 2.f};
  int64_t n5 = 5, yi[5];
  tpu_tensor_t ty = tt_make(y, TPU_F32, 1, &n5);
  tpu_tensor_t youts[2] = {ty, tt_make(yi, TPU_I64, 1, &n5)};
  tpu_arg_t yargs[5] = {ta_t(&ty), ta_i(0), ta_b(false), ta_t(&youts[0]), ta_t(&youts[1])};
  CHECK_OK(tt_run("sort.values", yargs, 5, youts, 2));
  CHECK(y[0] == -1.f && y[1] == 0.5f && y[2] == 2.f && y[3] == 2.f && y[4] == 7.f);
  CHECK(yi[0] == 1 && yi[1] == 3 && yi[2] == 0 && yi[3] == 4 && yi[4] == 2);
  /* 0-size */
  int64_t z = 0;
  tpu_tensor_t tz = tt_make(x, TPU_F32, 1, &z);
  tpu_tensor_t zouts[2] = {tt_make(v, TPU_F32, 1, &z), tt_make(idx, TPU_I64, 1, &z)};
  tpu_arg_t zargs[3] = {ta_t(&tz), ta_i(0), ta_b(false)};
  CHECK_OK(tt_run("sort", zargs, 3, zouts, 2));
  /* error: dim out of range */
  tpu_arg_t eargs[3] = {ta_t(&tx), ta_i(2), ta_b(false)};
  tpu_status_t st = tt_run("sort", eargs, 3, outs, 2);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
}

/* Long slices go through the quickselect path; compare with a full sort. */
static void test_sort_large(void) {
  enum { N = 5000 };
  static double x[N], v[N], tv[10];
  static int64_t idx[N], ti[10];
  uint64_t s = 12345;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (double)(s >> 54) / 8.0; /* 1024 distinct values: many ties */
  }
  int64_t n = N, k = 10;
  tpu_tensor_t tx = tt_make(x, TPU_F64, 1, &n);
  tpu_tensor_t outs[2] = {tt_make(v, TPU_F64, 1, &n), tt_make(idx, TPU_I64, 1, &n)};
  /* unstable: values in order, each index once, pointing at its value */
  static char seen[N];
  tpu_arg_t args[3] = {ta_t(&tx), ta_i(0), ta_b(true)};
  CHECK_OK(tt_run("sort", args, 3, outs, 2));
  int order = 0;
  for (int i = 0; i < N; i++) {
    order += (i > 0 && v[i - 1] < v[i]) || idx[i] < 0 || idx[i] >= N || seen[idx[i]] ||
             x[idx[i]] != v[i];
    if (idx[i] >= 0 && idx[i] < N) seen[idx[i]] = 1;
  }
  CHECK(order == 0);
  /* stable: ties in index order as well */
  tpu_arg_t sargs[4] = {ta_t(&tx), ta_b(true), ta_i(0), ta_b(true)};
  CHECK_OK(tt_run("sort.stable", sargs, 4, outs, 2));
  order = 0;
  for (int i = 1; i < N; i++)
    order += v[i - 1] < v[i] || (v[i - 1] == v[i] && idx[i - 1] > idx[i]) || x[idx[i]] != v[i];
  CHECK(order == 0);
  tpu_tensor_t touts[2] = {tt_make(tv, TPU_F64, 1, &k), tt_make(ti, TPU_I64, 1, &k)};
  tpu_arg_t targs[5] = {ta_t(&tx), ta_i(10), ta_i(0), ta_b(true), ta_b(true)};
  CHECK_OK(tt_run("topk", targs, 5, touts, 2));
  for (int i = 0; i < 10; i++) CHECK(tv[i] == v[i] && x[ti[i]] == tv[i]);
  /* median over all elements: the lower median */
  double med;
  tpu_tensor_t tmed = tt_make(&med, TPU_F64, 0, NULL);
  tpu_arg_t margs[1] = {ta_t(&tx)};
  CHECK_OK(tt_run("median", margs, 1, &tmed, 1));
  CHECK(med == v[N - 1 - (N - 1) / 2]);
}

static void test_topk_noncontiguous(void) {
  /* storage [4, 3]; the op sees its transpose [3, 4] and selects along dim 1 */
  float s[12] = {1, 9, 5, /**/ 7, 2, 8, /**/ 3, 6, 4, /**/ 0, 10, 11};
  int64_t s34[2] = {3, 4}, s32[2] = {3, 2};
  tpu_tensor_t t = tt_make(s, TPU_F32, 2, s34);
  t.strides[0] = 1;
  t.strides[1] = 3; /* rows: {1,7,3,0}, {9,2,6,10}, {5,8,4,11} */
  float v[6];
  int64_t idx[6];
  tpu_tensor_t outs[2] = {tt_make(v, TPU_F32, 2, s32), tt_make(idx, TPU_I64, 2, s32)};
  tpu_arg_t args[5] = {ta_t(&t), ta_i(2), ta_i(1), ta_b(true), ta_b(true)};
  CHECK_OK(tt_run("topk", args, 5, outs, 2));
  float want_v[6] = {7, 3, 10, 9, 11, 8};
  int64_t want_i[6] = {1, 2, 3, 0, 3, 1};
  for (int i = 0; i < 6; i++) CHECK(v[i] == want_v[i] && idx[i] == want_i[i]);
  /* smallest, into a transposed output [3, 2] with storage [2, 3] */
  float vt[6];
  int64_t it[6];
  tpu_tensor_t o0 = tt_make(vt, TPU_F32, 2, s32), o1 = tt_make(it, TPU_I64, 2, s32);
  o0.strides[0] = o1.strides[0] = 1;
  o0.strides[1] = o1.strides[1] = 3;
  tpu_tensor_t touts[2] = {o0, o1};
  args[3] = ta_b(false);
  CHECK_OK(tt_run("topk", args, 5, touts, 2));
  float want_sv[6] = {0, 2, 4, 1, 6, 5}; /* storage: row 0 = smallest of each row */
  int64_t want_si[6] = {3, 1, 2, 0, 2, 0};
  for (int i = 0; i < 6; i++) CHECK(vt[i] == want_sv[i] && it[i] == want_si[i]);
  /* error: k larger than the dimension */
  args[1] = ta_i(5);
  tpu_status_t st = tt_run("topk", args, 5, outs, 2);
  CHECK(st && strstr(tpu_status_message(st), "k out of range"));
  tpu_status_free(st);
}

static void test_selection(void) {
  /* [2, 5]: row 0 has a NaN */
  float x[10] = {4, NAN, 1, 3, 1, /**/ 2, 2, 7, 5, 2};
  float v[2];
  int64_t idx[2], s25[2] = {2, 5}, s2[1] = {2};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s25);
  tpu_tensor_t outs[2] = {tt_make(v, TPU_F32, 1, s2), tt_make(idx, TPU_I64, 1, s2)};
  tpu_arg_t args[4] = {ta_t(&tx), ta_i(2), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("kthvalue", args, 4, outs, 2));
  /* among equal values, the index CPU's quickselect reports */
  CHECK(v[0] == 1.f && idx[0] == 4 && v[1] == 2.f && idx[1] == 0);
  tpu_arg_t margs[3] = {ta_t(&tx), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("median.dim", margs, 3, outs, 2));
  CHECK(isnan(v[0]) && idx[0] == 1 && v[1] == 2.f && idx[1] == 4);
  CHECK_OK(tt_run("nanmedian.dim", margs, 3, outs, 2));
  CHECK(v[0] == 1.f && v[1] == 2.f); /* lower median of {4, 1, 3, 1} */
  CHECK_OK(tt_run("mode", margs, 3, outs, 2));
  CHECK(v[0] == 1.f && idx[0] == 4 && v[1] == 2.f && idx[1] == 4);
  /* keepdim output [2, 1] */
  int64_t s21[2] = {2, 1};
  tpu_tensor_t kouts[2] = {tt_make(v, TPU_F32, 2, s21), tt_make(idx, TPU_I64, 2, s21)};
  tpu_arg_t kargs[3] = {ta_t(&tx), ta_i(-1), ta_b(true)};
  CHECK_OK(tt_run("mode", kargs, 3, kouts, 2));
  CHECK(v[0] == 1.f && v[1] == 2.f);
  /* full median of a non-contiguous view (column 2 and 3 of each row) */
  int64_t s22[2] = {2, 2};
  tpu_tensor_t view = tt_make(x + 2, TPU_F32, 2, s22);
  view.strides[0] = 5; /* {1, 3}, {7, 5} */
  float med;
  tpu_tensor_t tmed = tt_make(&med, TPU_F32, 0, NULL);
  tpu_arg_t fargs[1] = {ta_t(&view)};
  CHECK_OK(tt_run("median", fargs, 1, &tmed, 1));
  CHECK(med == 3.f);
  /* empty input: NaN; empty reduction dim: error */
  int64_t z = 0;
  tpu_tensor_t tz = tt_make(x, TPU_F32, 1, &z);
  tpu_arg_t zargs[1] = {ta_t(&tz)};
  CHECK_OK(tt_run("median", zargs, 1, &tmed, 1));
  CHECK(isnan(med));
  int64_t s20[2] = {2, 0};
  tpu_tensor_t tz2 = tt_make(x, TPU_F32, 2, s20);
  tpu_arg_t eargs[3] = {ta_t(&tz2), ta_i(1), ta_b(false)};
  tpu_status_t st = tt_run("mode", eargs, 3, outs, 2);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_philox_known_answers();
  test_determinism();
  test_strided_output();
  test_uniform();
  test_normal();
  test_exponential_geometric();
  test_bernoulli();
  test_dropout();
  test_random_ranges();
  test_randperm_multinomial();
  test_sort();
  test_sort_large();
  test_topk_noncontiguous();
  test_selection();
  TEST_MAIN_END();
}
