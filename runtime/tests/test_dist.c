/* The shared-memory collective transport (runtime/dist/shm.c): W forked
 * processes run each collective on every dtype class, against results
 * computed here; mismatched sizes fail on every rank; a dead peer and a
 * timeout fail the others instead of hanging; no segment is left behind. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"
#include "tpu/dist.h"

#define CHECK_FAILS_WITH(expr, text)                                         \
  do {                                                                       \
    tpu_status_t st_ = (expr);                                               \
    CHECK(st_ != NULL);                                                      \
    if (st_) {                                                               \
      if (!strstr(tpu_status_message(st_), text))                            \
        fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__, \
                tpu_status_message(st_), text);                              \
      CHECK(strstr(tpu_status_message(st_), text) != NULL);                  \
      tpu_status_free(st_);                                                  \
    }                                                                        \
  } while (0)

static int count_segments(void) {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  struct dirent* e;
  char mine[64];
  snprintf(mine, sizeof mine, "tpu_dist.%d.", (int)getpid());
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, mine, strlen(mine))) n++;
  closedir(d);
  return n;
}

/* Runs body(comm) in W processes; returns the number of failing ranks. */
typedef void (*body_fn)(tpu_dist_comm_t* c);
static int run_ranks(int W, size_t slot, int64_t timeout_ms, body_fn body) {
  char name[96];
  tpu_dist_make_name(name, sizeof name);
  pid_t pids[16];
  for (int r = 0; r < W; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      tpu_dist_options_t o = {.slot_bytes = slot, .timeout_ms = timeout_ms};
      tpu_dist_comm_t* c = NULL;
      tpu_status_t st = tpu_dist_comm_create(name, r, W, &o, &c);
      if (st) {
        fprintf(stderr, "rank %d: %s\n", r, tpu_status_message(st));
        _exit(99);
      }
      body(c);
      tpu_dist_comm_destroy(c);
      _exit(g_failures ? 1 : 0);
    }
  }
  int bad = 0;
  /* in rank order: a rank that exits early stays a zombie meanwhile, which
   * its peers must see as gone */
  for (int r = 0; r < W; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
  }
  return bad;
}

/* Rank r's value at element k: distinct per rank and element, exact in every dtype. */
static double val(int r, int64_t k) { return (double)((r * 7 + k * 3) % 11) - 3.0; }

static const tpu_dtype_t kDtypes[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16, TPU_I8,
                                      TPU_U8,  TPU_I16, TPU_I32,  TPU_I64, TPU_BOOL};

static void fill(void* p, tpu_dtype_t dt, int r, int64_t n) {
  const size_t es = tpu_dtype_size(dt);
  for (int64_t k = 0; k < n; k++) {
    double v = val(r, k);
    if (dt == TPU_U8) v = v + 3.0;
    if (dt == TPU_BOOL) v = v > 0;
    tpu_store_f64((char*)p + k * es, dt, v);
  }
}

static double expect_reduce(tpu_dtype_t dt, tpu_dist_redop_t op, int W, int64_t k) {
  double acc = 0;
  for (int r = 0; r < W; r++) {
    double v = val(r, k);
    if (dt == TPU_U8) v = v + 3.0;
    if (dt == TPU_BOOL) v = v > 0;
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (op) {
      case TPU_DIST_SUM: acc = dt == TPU_BOOL ? (acc || v) : acc + v; break;
      case TPU_DIST_MAX: acc = v > acc ? v : acc; break;
      case TPU_DIST_MIN: acc = v < acc ? v : acc; break;
      case TPU_DIST_PRODUCT: acc = dt == TPU_BOOL ? (acc && v) : acc * v; break;
      case TPU_DIST_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
      default: break;
    }
  }
  return acc;
}

static int g_W;

/* The direct copies ran unless TORCH_TPU_DIST_DIRECT=0 (then none did). */
static void check_path(tpu_dist_comm_t* c) {
  const char* d = getenv("TORCH_TPU_DIST_DIRECT");
  const bool want = !(d && !strcmp(d, "0"));
  CHECK(tpu_dist_comm_direct(c) == want);
  if (want) CHECK(tpu_dist_comm_direct_count(c) > 0);
  else CHECK(tpu_dist_comm_direct_count(c) == 0);
}

/* all_reduce over several rounds (the slot is small) for every dtype and op */
static void body_all_reduce(tpu_dist_comm_t* c) {
  const int64_t n = 5000; /* > one 16 KiB slot of float64 */
  const int r = tpu_dist_comm_rank(c);
  const tpu_dist_redop_t ops[] = {TPU_DIST_SUM, TPU_DIST_MAX, TPU_DIST_MIN, TPU_DIST_PRODUCT,
                                  TPU_DIST_BXOR};
  for (size_t d = 0; d < sizeof kDtypes / sizeof kDtypes[0]; d++) {
    const tpu_dtype_t dt = kDtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      if (!tpu_dist_redop_supported(ops[o], dt)) continue;
      void* buf = malloc((size_t)n * 8);
      fill(buf, dt, r, n);
      CHECK_OK(tpu_dist_all_reduce(c, buf, n, dt, ops[o], 1.0));
      int wrong = 0;
      for (int64_t k = 0; k < n; k++) {
        const double want = expect_reduce(dt, ops[o], g_W, k);
        double got = tpu_load_f64((char*)buf + k * tpu_dtype_size(dt), dt);
        if (dt == TPU_I8 || dt == TPU_U8) { /* wraps */
          double w = fmod(want, 256.0);
          double gw = fmod(got, 256.0);
          if (w < 0) w += 256;
          if (gw < 0) gw += 256;
          if (w != gw) wrong++;
        } else if (got != want) {
          wrong++;
        }
      }
      if (wrong)
        fprintf(stderr, "rank %d all_reduce %s %s: %d wrong\n", r, tpu_dtype_name(dt),
                tpu_dist_redop_name(ops[o]), wrong);
      CHECK(wrong == 0);
      free(buf);
    }
  }
  /* AVG, PREMUL_SUM on float32 */
  float x[3] = {(float)r, 2.0f * r, 1.0f};
  CHECK_OK(tpu_dist_all_reduce(c, x, 3, TPU_F32, TPU_DIST_AVG, 1.0));
  CHECK_NEAR(x[0], (g_W - 1) / 2.0, 1e-6);
  CHECK_NEAR(x[2], 1.0, 1e-6);
  float y[1] = {1.0f + r};
  CHECK_OK(tpu_dist_all_reduce(c, y, 1, TPU_F32, TPU_DIST_PREMUL_SUM, 0.5));
  CHECK_NEAR(y[0], 0.5 * g_W * (g_W + 1) / 2.0, 1e-6);
  int32_t iv[1] = {r + 1};
  CHECK_OK(tpu_dist_all_reduce(c, iv, 1, TPU_I32, TPU_DIST_AVG, 1.0));
  CHECK(iv[0] == (g_W * (g_W + 1) / 2) / g_W);
  /* unsupported: bitwise on floats fails on every rank, and the group goes on */
  CHECK_FAILS_WITH(tpu_dist_all_reduce(c, x, 3, TPU_F32, TPU_DIST_BAND, 1.0), "BAND");
  CHECK_OK(tpu_dist_barrier(c));
  check_path(c);
}

/* float32 sums: every rank gets the same bits, the rank-order sum */
static void body_bits(tpu_dist_comm_t* c) {
  const int64_t n = 4099;
  const int r = tpu_dist_comm_rank(c);
  float* a = malloc((size_t)n * 4);
  for (int64_t k = 0; k < n; k++) a[k] = (float)(sin((double)k * (r + 1)) * 1e3) + 1e-3f * r;
  CHECK_OK(tpu_dist_all_reduce(c, a, n, TPU_F32, TPU_DIST_SUM, 1.0));
  int wrong = 0;
  for (int64_t k = 0; k < n; k++) {
    float want = 0;
    for (int i = 0; i < g_W; i++) {
      float v = (float)(sin((double)k * (i + 1)) * 1e3) + 1e-3f * i;
      want = i == 0 ? v : want + v;
    }
    if (memcmp(&want, &a[k], 4)) wrong++;
  }
  CHECK(wrong == 0);
  free(a);
}

static void body_moves(tpu_dist_comm_t* c) {
  const int r = tpu_dist_comm_rank(c), W = g_W;
  const int64_t n = 3001;
  /* broadcast from the last rank */
  int32_t* b = malloc((size_t)n * 4);
  for (int64_t k = 0; k < n; k++) b[k] = r == W - 1 ? (int32_t)(k * 5) : -1;
  CHECK_OK(tpu_dist_broadcast(c, b, n, TPU_I32, W - 1));
  int wrong = 0;
  for (int64_t k = 0; k < n; k++) wrong += b[k] != (int32_t)(k * 5);
  CHECK(wrong == 0);
  /* all_gather and gather to rank 0 */
  int32_t* outs_mem = malloc((size_t)n * 4 * W);
  void* outs[16];
  for (int i = 0; i < W; i++) outs[i] = outs_mem + (size_t)i * n;
  for (int64_t k = 0; k < n; k++) b[k] = (int32_t)(r * 100000 + k);
  CHECK_OK(tpu_dist_all_gather(c, b, outs, n, TPU_I32));
  wrong = 0;
  for (int i = 0; i < W; i++)
    for (int64_t k = 0; k < n; k++) wrong += ((int32_t*)outs[i])[k] != (int32_t)(i * 100000 + k);
  CHECK(wrong == 0);
  memset(outs_mem, 0, (size_t)n * 4 * W);
  CHECK_OK(tpu_dist_gather(c, b, r == 0 ? outs : NULL, n, TPU_I32, 0));
  if (r == 0) {
    wrong = 0;
    for (int i = 0; i < W; i++)
      for (int64_t k = 0; k < n; k++) wrong += ((int32_t*)outs[i])[k] != (int32_t)(i * 100000 + k);
    CHECK(wrong == 0);
  }
  /* scatter from rank 1 % W: piece j holds j */
  const void* ins[16];
  for (int j = 0; j < W; j++) {
    for (int64_t k = 0; k < n; k++) ((int32_t*)outs[j])[k] = (int32_t)(j * 7 + k);
    ins[j] = outs[j];
  }
  CHECK_OK(tpu_dist_scatter(c, r == 1 % W ? ins : NULL, b, n, TPU_I32, 1 % W));
  wrong = 0;
  for (int64_t k = 0; k < n; k++) wrong += b[k] != (int32_t)(r * 7 + k);
  CHECK(wrong == 0);
  /* reduce_scatter: rank r receives sum over i of rank i's piece r */
  float* pieces = malloc((size_t)n * 4 * W);
  const void* pin[16];
  for (int j = 0; j < W; j++) {
    for (int64_t k = 0; k < n; k++) pieces[(size_t)j * n + k] = (float)(j * 1000 + k + r);
    pin[j] = pieces + (size_t)j * n;
  }
  float* rs = malloc((size_t)n * 4);
  CHECK_OK(tpu_dist_reduce_scatter(c, pin, rs, n, TPU_F32, TPU_DIST_SUM, 1.0));
  wrong = 0;
  for (int64_t k = 0; k < n; k++) {
    double want = 0;
    for (int i = 0; i < W; i++) want += r * 1000 + k + i;
    wrong += rs[k] != (float)want;
  }
  CHECK(wrong == 0);
  /* reduce to rank 0 (MAX): others keep their input */
  for (int64_t k = 0; k < n; k++) rs[k] = (float)(r - k);
  CHECK_OK(tpu_dist_reduce(c, rs, n, TPU_F32, TPU_DIST_MAX, 1.0, 0));
  wrong = 0;
  for (int64_t k = 0; k < n; k++) wrong += rs[k] != (float)((r == 0 ? W - 1 : r) - k);
  CHECK(wrong == 0);
  /* all_to_all with uneven splits: rank i sends (i + j) % 3 * 1500 + 1 elements to j */
  int64_t inc[16], outc[16];
  const void* ains[16];
  void* aouts[16];
  for (int j = 0; j < W; j++) {
    inc[j] = (r + j) % 3 * 1500 + 1;
    outc[j] = (j + r) % 3 * 1500 + 1;
    int32_t* p = malloc((size_t)inc[j] * 4);
    for (int64_t k = 0; k < inc[j]; k++) p[k] = (int32_t)(r * 1000000 + j * 10000 + k);
    ains[j] = p;
    aouts[j] = malloc((size_t)outc[j] * 4);
  }
  CHECK_OK(tpu_dist_all_to_all(c, ains, inc, aouts, outc, TPU_I32));
  wrong = 0;
  for (int i = 0; i < W; i++)
    for (int64_t k = 0; k < outc[i]; k++)
      wrong += ((int32_t*)aouts[i])[k] != (int32_t)(i * 1000000 + r * 10000 + k);
  CHECK(wrong == 0);
  /* the same from one input buffer (pieces back to back: direct copies) */
  int64_t total = 0;
  for (int j = 0; j < W; j++) total += inc[j];
  int32_t* flat = malloc((size_t)total * 4);
  const void* fins[16];
  for (int j = 0, at = 0; j < W; at += (int)inc[j], j++) {
    memcpy(flat + at, ains[j], (size_t)inc[j] * 4);
    fins[j] = flat + at;
  }
  for (int i = 0; i < W; i++) memset(aouts[i], 0, (size_t)outc[i] * 4);
  CHECK_OK(tpu_dist_all_to_all(c, fins, inc, aouts, outc, TPU_I32));
  wrong = 0;
  for (int i = 0; i < W; i++)
    for (int64_t k = 0; k < outc[i]; k++)
      wrong += ((int32_t*)aouts[i])[k] != (int32_t)(i * 1000000 + r * 10000 + k);
  CHECK(wrong == 0);
  free(flat);
  /* a split that disagrees fails on every rank */
  if (r == 0) outc[W - 1] += 1;
  CHECK_FAILS_WITH(tpu_dist_all_to_all(c, ains, inc, aouts, outc, TPU_I32), "expects");
  for (int j = 0; j < W; j++) {
    free((void*)ains[j]);
    free(aouts[j]);
  }
  CHECK_OK(tpu_dist_barrier(c));
  check_path(c);
  free(b);
  free(outs_mem);
  free(pieces);
  free(rs);
}

/* sizes that differ between ranks fail on every rank, naming both */
static void body_mismatch(tpu_dist_comm_t* c) {
  const int r = tpu_dist_comm_rank(c);
  float x[8] = {0};
  CHECK_FAILS_WITH(tpu_dist_all_reduce(c, x, r == 0 ? 8 : 6, TPU_F32, TPU_DIST_SUM, 1.0),
                   "ranks disagree");
  /* and different collectives */
  tpu_status_t st = r == 0 ? tpu_dist_barrier(c) : tpu_dist_broadcast(c, x, 8, TPU_F32, 0);
  CHECK_FAILS_WITH(st, "different collectives");
  /* the group still works */
  x[0] = 1;
  CHECK_OK(tpu_dist_all_reduce(c, x, 1, TPU_F32, TPU_DIST_SUM, 1.0));
  CHECK(x[0] == g_W);
}

/* rank 1 exits: the others fail quickly, naming it */
static void body_death(tpu_dist_comm_t* c) {
  if (tpu_dist_comm_rank(c) == 1) _exit(0);
  float x[4] = {0};
  CHECK_FAILS_WITH(tpu_dist_all_reduce(c, x, 4, TPU_F32, TPU_DIST_SUM, 1.0), "exited");
  /* and later collectives fail at once */
  CHECK_FAILS_WITH(tpu_dist_barrier(c), "failed earlier");
}

/* a rank that never comes: the timeout */
static void body_timeout(tpu_dist_comm_t* c) {
  if (tpu_dist_comm_rank(c) == 1) {
    sleep(2);
    return;
  }
  CHECK_FAILS_WITH(tpu_dist_barrier(c), "timed out");
}

/* send/recv: a message of several channel buffers each way, then a size
 * mismatch that fails both sides */
static void body_p2p(tpu_dist_comm_t* c) {
  const int r = tpu_dist_comm_rank(c);
  const int64_t n = 20000; /* 80 KB > the 16 KiB channel buffer */
  int32_t* a = malloc((size_t)n * 4);
  int32_t* b = malloc((size_t)n * 4);
  for (int64_t k = 0; k < n; k++) a[k] = (int32_t)(r * 1000000 + k);
  if (r == 0) {
    CHECK_OK(tpu_dist_send(c, a, n * 4, 1, 7));
    CHECK_OK(tpu_dist_recv(c, b, n * 4, 1, 7));
  } else {
    CHECK_OK(tpu_dist_recv(c, b, n * 4, 0, 7));
    CHECK_OK(tpu_dist_send(c, a, n * 4, 0, 7));
  }
  int wrong = 0;
  for (int64_t k = 0; k < n; k++) wrong += b[k] != (int32_t)((1 - r) * 1000000 + k);
  CHECK(wrong == 0);
  /* an empty message, then collectives still work beside */
  if (r == 0) CHECK_OK(tpu_dist_send(c, a, 0, 1, 0));
  else CHECK_OK(tpu_dist_recv(c, b, 0, 0, 0));
  CHECK_OK(tpu_dist_barrier(c));
  CHECK_FAILS_WITH(tpu_dist_send(c, a, 8, r, 0), "cannot send");
  /* sizes that differ: the receiver names both, the sender fails too */
  if (r == 0) CHECK_FAILS_WITH(tpu_dist_send(c, a, 40, 1, 0), "expected 32 bytes");
  else CHECK_FAILS_WITH(tpu_dist_recv(c, b, 32, 0, 0), "expected 32 bytes");
  free(a);
  free(b);
}

static void test_reduce_block(void) {
  /* bfloat16 accumulates in float32 and rounds once: 256 + 1 + 1 */
  uint16_t a = tpu_f32_to_bf16(256.0f), b = tpu_f32_to_bf16(1.0f), out = 0;
  const void* srcs[3] = {&a, &b, &b};
  CHECK_OK(tpu_dist_reduce_block(&out, srcs, 3, 1, TPU_BF16, TPU_DIST_SUM, 1.0, 0));
  CHECK(tpu_bf16_to_f32(out) == 258.0f);
  /* bfloat16 rounding on every pattern: x + 0 is x (NaNs quiet, -0 + 0 = +0) */
  {
    static uint16_t all[65536], zero[65536], got[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    const void* s2[2] = {all, zero};
    CHECK_OK(tpu_dist_reduce_block(got, s2, 2, 65536, TPU_BF16, TPU_DIST_SUM, 1.0, 0));
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
      const float x = tpu_bf16_to_f32((uint16_t)i);
      const uint16_t want = x != x ? (uint16_t)(i | 0x40) : x == 0 ? 0 : (uint16_t)i;
      bad += got[i] != want;
    }
    CHECK(bad == 0);
  }
  /* the sums, against the definition (in rank order, float32, rounded once),
   * on lengths that end in a partial vector, with NaN, infinities and ties */
  {
    enum { N = 1003, S = 3 };
    static float f[S][N], fo[N];
    static uint16_t h[S][N], ho[N];
    uint32_t seed = 12345;
    for (int i = 0; i < S; i++)
      for (int k = 0; k < N; k++) {
        seed = seed * 1664525u + 1013904223u;
        float v = (float)((int32_t)(seed >> 8) % 100000) / 64.0f;
        if (k % 97 == 5) v = NAN;
        if (k % 89 == 7) v = i == 1 ? -INFINITY : INFINITY;
        f[i][k] = v;
        h[i][k] = tpu_f32_to_bf16(v);
      }
    const void* fs3[S] = {f[0], f[1], f[2]};
    const void* hs3[S] = {h[0], h[1], h[2]};
    const tpu_dist_redop_t sops[] = {TPU_DIST_SUM, TPU_DIST_AVG, TPU_DIST_PREMUL_SUM};
    for (int o = 0; o < 3; o++) {
      const float fac = 0.3f;
      CHECK_OK(tpu_dist_reduce_block(fo, fs3, S, N, TPU_F32, sops[o], fac, S));
      CHECK_OK(tpu_dist_reduce_block(ho, hs3, S, N, TPU_BF16, sops[o], fac, S));
      int bad = 0;
      for (int k = 0; k < N; k++) {
        float af = 0, ah = 0;
        for (int i = 0; i < S; i++) {
          float xf = f[i][k], xh = tpu_bf16_to_f32(h[i][k]);
          if (sops[o] == TPU_DIST_PREMUL_SUM) {
            xf = fac * xf;
            xh = fac * xh;
          }
          af = i ? af + xf : xf;
          ah = i ? ah + xh : xh;
        }
        if (sops[o] == TPU_DIST_AVG) {
          af /= (float)S;
          ah /= (float)S;
        }
        const uint16_t wh = tpu_f32_to_bf16(ah);
        bad += memcmp(&af, &fo[k], 4) != 0 && !(af != af && fo[k] != fo[k]);
        bad += ho[k] != wh;
      }
      if (bad) fprintf(stderr, "reduce_block %s: %d wrong\n", tpu_dist_redop_name(sops[o]), bad);
      CHECK(bad == 0);
    }
  }
  /* NaN wins min/max */
  float n = NAN, one = 1.0f, r = 0;
  const void* fs[2] = {&one, &n};
  CHECK_OK(tpu_dist_reduce_block(&r, fs, 2, 1, TPU_F32, TPU_DIST_MIN, 1.0, 0));
  CHECK(isnan(r));
  CHECK(!tpu_dist_redop_supported(TPU_DIST_AVG, TPU_BOOL));
  CHECK(!tpu_dist_redop_supported(TPU_DIST_BOR, TPU_F16));
  CHECK(tpu_dist_redop_supported(TPU_DIST_BOR, TPU_I64));
  CHECK(!tpu_dist_redop_supported(TPU_DIST_SUM, TPU_F8E4M3FN)); /* moved, never reduced */
  CHECK(!tpu_dist_redop_supported(TPU_DIST_MAX, TPU_U32));
}

int main(int argc, char** argv) {
  (void)argc;
  /* direct copies for every size (by default only from 1 MiB) */
  if (!getenv("TORCH_TPU_DIST_DIRECT")) setenv("TORCH_TPU_DIST_DIRECT_MIN_BYTES", "0", 1);
  test_reduce_block();
  const int sizes[] = {1, 2, 3};
  for (int s = 0; s < 3; s++) {
    g_W = sizes[s];
    /* 16 KiB slots: several rounds for every collective */
    CHECK(run_ranks(g_W, 16384 * (g_W > 2 ? 2 : 1), 20000, body_all_reduce) == 0);
    CHECK(run_ranks(g_W, 16384, 20000, body_bits) == 0);
    CHECK(run_ranks(g_W, 16384, 20000, body_moves) == 0);
    if (g_W > 1) CHECK(run_ranks(g_W, 16384, 20000, body_mismatch) == 0);
  }
  g_W = 2;
  CHECK(run_ranks(2, 16384, 20000, body_p2p) == 0);
  g_W = 3;
  /* rank 1 exits with 0 after the others fail: all succeed when they noticed */
  CHECK(run_ranks(3, 16384, 20000, body_death) == 0);
  g_W = 2;
  CHECK(run_ranks(2, 16384, 500, body_timeout) == 0);
  CHECK(count_segments() == 0);
  if (g_failures) {
    fprintf(stderr, "test_dist: %d failure(s)\n", g_failures);
    return 1;
  }
  const char* isa = getenv("TORCH_TPU_ISA");
  printf("test_dist: ok (%s reduction loops, %s)\n", isa ? isa : "best",
         getenv("TORCH_TPU_DIST_DIRECT") ? "staged through the slots" : "direct copies");
  if (!isa) { /* and again with the portable loops, staging through the slots */
    fflush(stdout);
    setenv("TORCH_TPU_ISA", "portable", 1);
    setenv("TORCH_TPU_DIST_DIRECT", "0", 1);
    execv(argv[0], argv);
    perror("execv");
    return 1;
  }
  return 0;
}
