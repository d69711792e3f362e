/* The pjrt target's executables in the compilation cache (see execache.h). */
#include "targets/pjrt/execache.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "tpu/cache.h"
#include "tpu/parallel.h"

void pj_exe_ident_of(tpu_pjrt_t* c, pj_exe_ident_t* out) {
  memset(out, 0, sizeof *out);
  out->api_major = out->api_minor = -1;
  tpu_pjrt_api_version(c, &out->api_major, &out->api_minor);
  size_t olen = 0;
  const void* opts = tpu_pjrt_compile_options(&olen);
  out->options_hash = tpu_cache_hash64(opts, olen, 0);
  out->device_kind = tpu_pjrt_device_count(c) > 0 ? tpu_pjrt_device_kind(c, 0) : NULL;
  out->platform = tpu_pjrt_platform(c);
  out->version = tpu_pjrt_platform_version(c);
}

/* The key material besides the text: a field's length precedes it, so no
 * two identities print the same (a version ending in '|' cannot pass for
 * another platform); strings longer than the buffer allows are hashed. */
static void ident_text(const pj_exe_ident_t* id, char* out, size_t cap) {
  const char* f[3] = {id->platform ? id->platform : "", id->version ? id->version : "",
                      id->device_kind ? id->device_kind : ""};
  char h[3][17];
  for (int i = 0; i < 3; i++) {
    const size_t n = strlen(f[i]);
    if (n > 200) {
      snprintf(h[i], sizeof h[i], "%016" PRIx64, tpu_cache_hash64(f[i], n, n));
      f[i] = h[i];
    }
  }
  snprintf(out, cap, "|pjrt|%zu:%s|%zu:%s|%d.%d|%zu:%s|%016" PRIx64 "|%s|", strlen(f[0]), f[0],
           strlen(f[1]), f[1], id->api_major, id->api_minor, strlen(f[2]), f[2], id->options_hash,
           TPU_RUNTIME_VERSION);
}

void pj_exe_cache_key(const pj_exe_ident_t* id, const char* text, size_t len, char key[33]) {
  char how[768];
  ident_text(id, how, sizeof how);
  tpu_cache_make_key(text, len, how, key);
}

/* The target has one client per process: its identity is computed once. */
static pthread_once_t g_ident_once = PTHREAD_ONCE_INIT;
static tpu_pjrt_t* g_ident_client;
static pj_exe_ident_t g_ident;

static void make_ident(void) { pj_exe_ident_of(g_ident_client, &g_ident); }

static void key_of(tpu_pjrt_t* c, const char* text, size_t len, char key[33]) {
  g_ident_client = c;
  pthread_once(&g_ident_once, make_ident);
  pj_exe_cache_key(&g_ident, text, len, key);
}

/* The entry under key, loaded; NULL on a miss. An entry that verifies but
 * does not load (another plugin build wrote it under a colliding name, or a
 * plugin bug) is dropped so that it is compiled again. */
static tpu_pjrt_exe_t* load_cached(tpu_pjrt_t* c, const char* key) {
  void* data = NULL;
  size_t len = 0;
  if (!tpu_cache_find_bytes(key, &data, &len, NULL)) return NULL;
  tpu_pjrt_exe_t* e = NULL;
  tpu_status_t st = tpu_pjrt_exe_deserialize(c, data, len, &e);
  free(data);
  if (st) {
    if (tpu_env_bool("TORCH_TPU_PJRT_VERBOSE", false))
      fprintf(stderr, "TorchTPU pjrt: cache entry %s does not load (%s); compiling it again\n",
              key, tpu_status_message(st));
    tpu_status_free(st);
    tpu_cache_drop(key);
    return NULL;
  }
  return e;
}

/* Serializes e into tiers 2 and 3; failures are the cache's warnings. */
static void store(tpu_pjrt_t* c, const char* key, tpu_pjrt_exe_t* e) {
  static atomic_bool warned;
  void* data = NULL;
  size_t len = 0;
  tpu_status_t st = tpu_pjrt_exe_serialize(c, e, &data, &len);
  if (!st) st = tpu_cache_publish_bytes(key, data, len);
  else if (!atomic_exchange(&warned, true))
    tpu_cache_note_store_failure(
        "TorchTPU compilation cache: pjrt executables are not stored in tiers 2 and 3 (%s); "
        "each process compiles its programs",
        tpu_status_message(st));
  tpu_status_free(st);
  free(data);
}

/* How long to wait for another process compiling the same key:
 * TORCH_TPU_COMPILE_TIMEOUT_S (default 120; 0 or less: as long as it takes).
 * After that, compile without the lock (publishing is atomic; the lock only
 * saves duplicate work). */
static int64_t lock_timeout_ms(void) {
  const double s = tpu_env_double("TORCH_TPU_COMPILE_TIMEOUT_S", 120);
  return s > 0 ? (int64_t)(s * 1000 + 0.5) : -1;
}

tpu_status_t pj_exe_load_or_compile(tpu_pjrt_t* c, const char* text, size_t len,
                                    tpu_pjrt_exe_t** out, bool* compiled) {
  *out = NULL;
  *compiled = false;
  const bool tiers = tpu_cache_dir(2) || tpu_cache_dir(3);
  char key[33];
  int lock = -1;
  if (tiers) {
    key_of(c, text, len, key);
    if ((*out = load_cached(c, key))) return TPU_OK;
  }
  tpu_cache_note_miss();
  if (tiers) {
    lock = tpu_cache_lock_wait(key, lock_timeout_ms());
    if (lock >= 0 && (*out = load_cached(c, key))) { /* another process made it */
      tpu_cache_unlock(lock);
      return TPU_OK;
    }
  }
  const int64_t t0 = tpu_now_ns();
  tpu_status_t st = tpu_pjrt_compile(c, text, len, out);
  if (!st) {
    tpu_cache_note_compile(1e-9 * (double)(tpu_now_ns() - t0));
    *compiled = true;
    if (tiers) store(c, key, *out);
  }
  if (lock >= 0) tpu_cache_unlock(lock);
  return st;
}
