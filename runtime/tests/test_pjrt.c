/* The pjrt target's plugin client against a real PJRT plugin (the XLA CPU
 * plugin of the xla-cpu-pjrt package, or TORCH_TPU_PJRT_PLUGIN): loading and
 * its errors, devices, buffers both ways, compiling StableHLO text and
 * running it on every device, bad input turned into errors, and executables
 * serialized into the compilation cache's tiers 2 and 3 (execache.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "targets/pjrt/execache.h"
#include "targets/pjrt/pjrt_client.h"
#include "tpu/cache.h"

static int g_failures;
#define CHECK(c)                                                              \
  do {                                                                        \
    if (!(c)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);   \
      g_failures++;                                                           \
    }                                                                         \
  } while (0)
#define CHECK_OK(e)                                                           \
  do {                                                                        \
    tpu_status_t st_ = (e);                                                   \
    if (st_) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #e,              \
              tpu_status_message(st_));                                       \
      tpu_status_free(st_);                                                   \
      g_failures++;                                                           \
    }                                                                         \
  } while (0)

/* Expects an error whose message contains `want`. */
static void check_error(tpu_status_t st, const char* want, int line) {
  if (!st) {
    fprintf(stderr, "test_pjrt.c:%d: expected an error containing '%s'\n", line, want);
    g_failures++;
    return;
  }
  if (!strstr(tpu_status_message(st), want)) {
    fprintf(stderr, "test_pjrt.c:%d: error '%s' lacks '%s'\n", line, tpu_status_message(st), want);
    g_failures++;
  }
  tpu_status_free(st);
}
#define CHECK_ERROR(e, want) check_error((e), (want), __LINE__)

static const char k_add[] =
    "module @add {\n"
    "  func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {\n"
    "    %0 = stablehlo.add %a, %b : tensor<2x3xf32>\n"
    "    return %0 : tensor<2x3xf32>\n"
    "  }\n"
    "}\n";

/* two results of different types from one argument */
static const char k_two[] =
    "module @two {\n"
    "  func.func @main(%a: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi1>) {\n"
    "    %0 = stablehlo.multiply %a, %a : tensor<4xi64>\n"
    "    %z = stablehlo.constant dense<0> : tensor<4xi64>\n"
    "    %1 = stablehlo.compare GT, %a, %z : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi1>\n"
    "    return %0, %1 : tensor<4xi64>, tensor<4xi1>\n"
    "  }\n"
    "}\n";

static void test_load_errors(void) {
  tpu_pjrt_t* p = (tpu_pjrt_t*)1;
  CHECK_ERROR(tpu_pjrt_open("/nonexistent/libplugin.so", &p), "/nonexistent/libplugin.so");
  CHECK(p == NULL);
  CHECK_ERROR(tpu_pjrt_open("libm.so.6", &p), "not a PJRT plugin");
  CHECK_ERROR(tpu_pjrt_open("", &p), "no plugin path");
}

static void test_devices(tpu_pjrt_t* p) {
  CHECK(strcmp(tpu_pjrt_platform(p), "cpu") == 0 || getenv("TORCH_TPU_PJRT_PLUGIN"));
  CHECK(tpu_pjrt_platform_version(p) != NULL);
  int major = -1, minor = -1;
  tpu_pjrt_api_version(p, &major, &minor);
  CHECK(major == 0 && minor > 0);
  int n = tpu_pjrt_device_count(p);
  CHECK(n >= 1);
  for (int i = 0; i < n; i++) CHECK(tpu_pjrt_device_kind(p, i) && *tpu_pjrt_device_kind(p, i));
  CHECK(tpu_pjrt_device_kind(p, n) == NULL);
  CHECK(tpu_pjrt_device_kind(p, -1) == NULL);
  int64_t used, limit;
  tpu_status_t st = tpu_pjrt_device_memory(p, 0, &used, &limit);
  /* the CPU plugin keeps no statistics: UNIMPLEMENTED, not a crash */
  if (st) {
    CHECK(tpu_status_code(st) == TPU_CODE_UNIMPLEMENTED || tpu_status_code(st) == TPU_CODE_INTERNAL);
    tpu_status_free(st);
  } else {
    CHECK(used >= 0);
  }
  CHECK_ERROR(tpu_pjrt_device_memory(p, n, &used, &limit), "does not exist");
}

static void test_buffers(tpu_pjrt_t* p) {
  const int64_t dims[2] = {2, 3};
  const float x[6] = {1, -2, 3.5f, 0, 1e30f, -0.0f};
  tpu_pjrt_buffer_t* b = NULL;
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, x, TPU_F32, 2, dims, &b));
  CHECK(b != NULL);
  if (!b) return;
  CHECK(tpu_pjrt_buffer_dtype(p, b) == TPU_F32);
  int64_t got[4] = {0};
  CHECK(tpu_pjrt_buffer_dims(p, b, got, 4) == 2 && got[0] == 2 && got[1] == 3);
  float y[6] = {0};
  CHECK_OK(tpu_pjrt_buffer_to_host(p, b, y, sizeof y));
  CHECK(memcmp(x, y, sizeof x) == 0); /* bit-exact, -0.0 included */
  float small[5];
  CHECK_ERROR(tpu_pjrt_buffer_to_host(p, b, small, sizeof small), "24-byte buffer into 20 bytes");
  tpu_pjrt_buffer_free(p, b);
  /* other dtypes, a scalar and an empty buffer */
  const uint16_t h[3] = {0x3f80, 0xc000, 0x7fc0}; /* bf16 1, -2, nan */
  const int64_t d3[1] = {3};
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, h, TPU_BF16, 1, d3, &b));
  uint16_t h2[3] = {0};
  if (b) {
    CHECK(tpu_pjrt_buffer_dtype(p, b) == TPU_BF16);
    CHECK_OK(tpu_pjrt_buffer_to_host(p, b, h2, sizeof h2));
    CHECK(memcmp(h, h2, sizeof h) == 0);
    tpu_pjrt_buffer_free(p, b);
  }
  const int64_t s = -7;
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, &s, TPU_I64, 0, NULL, &b));
  if (b) {
    int64_t s2 = 0;
    CHECK(tpu_pjrt_buffer_dims(p, b, got, 4) == 0);
    CHECK_OK(tpu_pjrt_buffer_to_host(p, b, &s2, sizeof s2));
    CHECK(s2 == -7);
    tpu_pjrt_buffer_free(p, b);
  }
  const int64_t d0[1] = {0};
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, NULL, TPU_F32, 1, d0, &b));
  if (b) {
    CHECK_OK(tpu_pjrt_buffer_to_host(p, b, NULL, 0));
    tpu_pjrt_buffer_free(p, b);
  }
  /* bad input is an error */
  const int64_t neg[1] = {-1};
  CHECK_ERROR(tpu_pjrt_buffer_from_host(p, 0, x, TPU_F32, 1, neg, &b), "negative dimension");
  CHECK_ERROR(tpu_pjrt_buffer_from_host(p, tpu_pjrt_device_count(p), x, TPU_F32, 2, dims, &b),
              "does not exist");
}

static void test_compile_and_run(tpu_pjrt_t* p) {
  tpu_pjrt_exe_t* e = NULL;
  CHECK_OK(tpu_pjrt_compile(p, k_add, strlen(k_add), &e));
  if (!e) return;
  CHECK(tpu_pjrt_exe_num_outputs(p, e) == 1);
  const int64_t dims[2] = {2, 3};
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {10, 20, 30, 40, 50, 60.5f};
  /* one portable executable, every device */
  for (int d = 0; d < tpu_pjrt_device_count(p); d++) {
    tpu_pjrt_buffer_t* args[2] = {NULL, NULL};
    CHECK_OK(tpu_pjrt_buffer_from_host(p, d, a, TPU_F32, 2, dims, &args[0]));
    CHECK_OK(tpu_pjrt_buffer_from_host(p, d, b, TPU_F32, 2, dims, &args[1]));
    tpu_pjrt_buffer_t* out = NULL;
    CHECK_OK(tpu_pjrt_execute(p, e, d, args, 2, &out, 1));
    float y[6] = {0};
    if (out) CHECK_OK(tpu_pjrt_buffer_to_host(p, out, y, sizeof y));
    for (int i = 0; i < 6; i++) CHECK(y[i] == a[i] + b[i]);
    /* the wrong output count is refused before the plugin sees it */
    tpu_pjrt_buffer_t* two[2];
    CHECK_ERROR(tpu_pjrt_execute(p, e, d, args, 2, two, 2), "has 1 outputs, not 2");
    tpu_pjrt_buffer_free(p, out);
    tpu_pjrt_buffer_free(p, args[0]);
    tpu_pjrt_buffer_free(p, args[1]);
  }
  tpu_pjrt_exe_free(p, e);
  /* several results, integer and boolean types */
  CHECK_OK(tpu_pjrt_compile(p, k_two, strlen(k_two), &e));
  if (!e) return;
  CHECK(tpu_pjrt_exe_num_outputs(p, e) == 2);
  const int64_t v[4] = {-3, 0, 5, 1LL << 31}, d4[1] = {4};
  tpu_pjrt_buffer_t* arg = NULL;
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, v, TPU_I64, 1, d4, &arg));
  tpu_pjrt_buffer_t* outs[2] = {NULL, NULL};
  CHECK_OK(tpu_pjrt_execute(p, e, 0, &arg, 1, outs, 2));
  int64_t sq[4] = {0};
  unsigned char gt[4] = {9, 9, 9, 9};
  if (outs[0] && outs[1]) {
    CHECK(tpu_pjrt_buffer_dtype(p, outs[1]) == TPU_BOOL);
    CHECK_OK(tpu_pjrt_buffer_to_host(p, outs[0], sq, sizeof sq));
    CHECK_OK(tpu_pjrt_buffer_to_host(p, outs[1], gt, sizeof gt));
  }
  for (int i = 0; i < 4; i++) {
    CHECK(sq[i] == v[i] * v[i]);
    CHECK(gt[i] == (v[i] > 0));
  }
  tpu_pjrt_buffer_free(p, outs[0]);
  tpu_pjrt_buffer_free(p, outs[1]);
  tpu_pjrt_buffer_free(p, arg);
  tpu_pjrt_exe_free(p, e);
}

static void test_compile_errors(tpu_pjrt_t* p) {
  tpu_pjrt_exe_t* e = NULL;
  CHECK_ERROR(tpu_pjrt_compile(p, "this is not mlir", 16, &e), "pjrt compile");
  CHECK(e == NULL);
  static const char bad_types[] =
      "module @bad {\n"
      "  func.func @main(%a: tensor<2xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {\n"
      "    %0 = stablehlo.add %a, %b : (tensor<2xf32>, tensor<3xf32>) -> tensor<2xf32>\n"
      "    return %0 : tensor<2xf32>\n"
      "  }\n"
      "}\n";
  CHECK_ERROR(tpu_pjrt_compile(p, bad_types, strlen(bad_types), &e), "pjrt compile");
  CHECK_ERROR(tpu_pjrt_compile(p, "", 0, &e), "empty module");
  /* the client still works after the errors */
  CHECK_OK(tpu_pjrt_compile(p, k_add, strlen(k_add), &e));
  tpu_pjrt_exe_free(p, e);
}

/* Runs k_add's executable on device 0 and checks its sums. */
static void check_add_runs(tpu_pjrt_t* p, tpu_pjrt_exe_t* e) {
  const int64_t dims[2] = {2, 3};
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0.5f, -2, 30, 4, 5e3f, 6};
  tpu_pjrt_buffer_t* args[2] = {NULL, NULL};
  tpu_pjrt_buffer_t* out = NULL;
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, a, TPU_F32, 2, dims, &args[0]));
  CHECK_OK(tpu_pjrt_buffer_from_host(p, 0, b, TPU_F32, 2, dims, &args[1]));
  if (args[0] && args[1]) CHECK_OK(tpu_pjrt_execute(p, e, 0, args, 2, &out, 1));
  float y[6] = {0};
  if (out) CHECK_OK(tpu_pjrt_buffer_to_host(p, out, y, sizeof y));
  for (int i = 0; i < 6; i++) CHECK(y[i] == a[i] + b[i]);
  tpu_pjrt_buffer_free(p, out);
  tpu_pjrt_buffer_free(p, args[0]);
  tpu_pjrt_buffer_free(p, args[1]);
}

/* The key depends on the text and on every field of the identity. */
static void test_exe_cache_key(tpu_pjrt_t* p) {
  pj_exe_ident_t id;
  pj_exe_ident_of(p, &id);
  CHECK(id.platform && !strcmp(id.platform, tpu_pjrt_platform(p)));
  CHECK(id.api_major >= 0 && id.api_minor >= 0);
  char k0[33], k[33];
  pj_exe_cache_key(&id, k_add, strlen(k_add), k0);
  CHECK(tpu_cache_key_valid(k0));
  pj_exe_cache_key(&id, k_add, strlen(k_add), k);
  CHECK(!strcmp(k, k0)); /* deterministic */
  pj_exe_cache_key(&id, k_two, strlen(k_two), k);
  CHECK(strcmp(k, k0));
  pj_exe_ident_t o = id;
  o.platform = "tpu";
  pj_exe_cache_key(&o, k_add, strlen(k_add), k);
  CHECK(strcmp(k, k0));
  o = id;
  o.version = "another version";
  pj_exe_cache_key(&o, k_add, strlen(k_add), k);
  CHECK(strcmp(k, k0));
  o = id;
  o.api_minor++;
  pj_exe_cache_key(&o, k_add, strlen(k_add), k);
  CHECK(strcmp(k, k0));
  o = id;
  o.device_kind = "TPU v5 lite";
  pj_exe_cache_key(&o, k_add, strlen(k_add), k);
  CHECK(strcmp(k, k0));
  o = id;
  o.options_hash ^= 1;
  pj_exe_cache_key(&o, k_add, strlen(k_add), k);
  CHECK(strcmp(k, k0));
  /* fields do not run into each other: ("a|b", "c") is not ("a", "b|c") */
  pj_exe_ident_t x = id, y = id;
  x.platform = "a|b";
  x.version = "c";
  y.platform = "a";
  y.version = "b|c";
  char kx[33], ky[33];
  pj_exe_cache_key(&x, k_add, strlen(k_add), kx);
  pj_exe_cache_key(&y, k_add, strlen(k_add), ky);
  CHECK(strcmp(kx, ky));
}

/* Tier 2 in a fresh directory (tier 3 off): the first request compiles and
 * stores, the next loads the stored executable (which runs), a corrupted
 * entry is counted and compiled again, and with both tiers off every request
 * compiles. */
static void test_exe_cache_tiers(tpu_pjrt_t* p) {
  char dir[] = "/tmp/tpu_test_pjrt_cacheXXXXXX";
  if (!mkdtemp(dir)) {
    fprintf(stderr, "test_pjrt: mkdtemp failed\n");
    g_failures++;
    return;
  }
  setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", dir, 1);
  setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "disabled", 1);
  tpu_cache_reload_config();
  tpu_cache_reset_stats();
  CHECK(tpu_cache_dir(2) && !strcmp(tpu_cache_dir(2), dir));
  CHECK(!tpu_cache_dir(3));
  tpu_pjrt_exe_t* e = NULL;
  bool compiled = false;
  CHECK_OK(pj_exe_load_or_compile(p, k_add, strlen(k_add), &e, &compiled));
  CHECK(e && compiled);
  if (e) check_add_runs(p, e);
  tpu_pjrt_exe_free(p, e);
  e = NULL;
  CHECK_OK(pj_exe_load_or_compile(p, k_add, strlen(k_add), &e, &compiled));
  CHECK(e && !compiled);
  if (e) check_add_runs(p, e);
  tpu_pjrt_exe_free(p, e);
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.compiles == 1 && s.tier2_hits == 1 && s.corrupt_entries == 0);
  /* flip a byte in the middle of the entry: detected, compiled again */
  pj_exe_ident_t id;
  pj_exe_ident_of(p, &id);
  char key[33], path[512];
  pj_exe_cache_key(&id, k_add, strlen(k_add), key);
  snprintf(path, sizeof path, "%s/%s.so", dir, key);
  FILE* f = fopen(path, "r+b");
  CHECK(f != NULL);
  if (f) {
    CHECK(fseek(f, 0, SEEK_END) == 0);
    const long n = ftell(f);
    CHECK(n > 64);
    CHECK(fseek(f, n / 2, SEEK_SET) == 0);
    const int c = fgetc(f);
    CHECK(fseek(f, n / 2, SEEK_SET) == 0);
    fputc(c ^ 0x5a, f);
    fclose(f);
  }
  e = NULL;
  CHECK_OK(pj_exe_load_or_compile(p, k_add, strlen(k_add), &e, &compiled));
  CHECK(e && compiled);
  if (e) check_add_runs(p, e);
  tpu_pjrt_exe_free(p, e);
  tpu_cache_get_stats(&s);
  CHECK(s.compiles == 2 && s.corrupt_entries == 1);
  CHECK(access(path, R_OK) == 0); /* stored again */
  /* both tiers off: every request compiles */
  setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", "disabled", 1);
  tpu_cache_reload_config();
  for (int i = 0; i < 2; i++) {
    e = NULL;
    CHECK_OK(pj_exe_load_or_compile(p, k_add, strlen(k_add), &e, &compiled));
    CHECK(e && compiled);
    tpu_pjrt_exe_free(p, e);
  }
  tpu_cache_get_stats(&s);
  CHECK(s.compiles == 4);
  unlink(path);
  snprintf(path, sizeof path, "%s/%s.lock", dir, key);
  unlink(path);
  rmdir(dir);
  while (tpu_cache_pop_warning()) {
  }
}

int main(void) {
  if (!tpu_pjrt_available()) {
    tpu_pjrt_t* p = NULL;
    CHECK_ERROR(tpu_pjrt_open("x.so", &p), "no pjrt target");
    printf("test_pjrt: built without the PJRT C API header: only the error path checked\n");
    return g_failures ? 1 : 0;
  }
  const char* path = getenv("TORCH_TPU_PJRT_PLUGIN");
#ifdef TPU_PJRT_TEST_PLUGIN
  if (!path || !*path) path = TPU_PJRT_TEST_PLUGIN;
#endif
  if (!path || !*path) {
    fprintf(stderr, "test_pjrt: no plugin: set TORCH_TPU_PJRT_PLUGIN\n");
    return 1;
  }
  test_load_errors();
  tpu_pjrt_t* p = NULL;
  CHECK_OK(tpu_pjrt_open(path, &p));
  if (!p) return 1;
  test_devices(p);
  test_buffers(p);
  test_compile_and_run(p);
  test_compile_errors(p);
  test_exe_cache_key(p);
  test_exe_cache_tiers(p);
  tpu_pjrt_close(p);
  if (g_failures) {
    fprintf(stderr, "test_pjrt: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_pjrt: ok\n");
  return 0;
}
