/* The compiler driver of the host target's fusion: turns a group's
 * generated source into a loaded kernel. Executables are found by a key
 * hashing the source, the embedded headers, the compiler command and flags,
 * the ISA and the runtime version: first in the cache's three tiers, else
 * compiled, at once or by a background thread at low priority, in a
 * temporary directory with a time limit. A signature memo in front skips
 * the source and the key for groups seen before. A failing compiler turns
 * fusion off with a one-time warning. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/subprocess.h"
#include "device/internal.h"
#include "targets/host/cc.h"
#include "targets/host/fuse_headers.h"
#include "targets/host/fuse_internal.h"
#include "targets/host/kernels/vecmath.h"
#include "tpu/cache.h"

/* ---- compilation and the cache ---- */
static const char* cc_flags(void) {
  return tpu_host_isa() == TPU_ISA_AVX2
             ? "-O3 -fPIC -shared -std=c11 -mavx2 -mfma -ffp-contract=fast -fno-math-errno "
               "-fno-trapping-math"
             : "-O3 -fPIC -shared -std=c11 -fno-math-errno -fno-trapping-math";
}

/* Hash of the headers embedded in the library (fuse_headers.h), names and
 * texts: the headers a kernel is compiled with are these, never files on
 * disk, so a key names exactly what was compiled. */
static uint64_t g_headers_hash;
static void hash_headers(void) {
  uint64_t h = 0x6865616465727321ull;
  for (int i = 0; i < tpu_fuse_nheaders; i++) {
    const tpu_fuse_header_t* e = &tpu_fuse_headers[i];
    h = tpu_cache_hash64(e->name, strlen(e->name) + 1, h);
    h = tpu_cache_hash64(&e->len, sizeof e->len, h);
    h = tpu_cache_hash64(e->text, e->len, h);
  }
  g_headers_hash = h;
}

/* The key covers the generated source, the embedded headers, the compiler
 * command and its flags, the ISA and the runtime version. */
static void key_of(const char* src, char out[33]) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, hash_headers);
  char extra[4500];
  snprintf(extra, sizeof extra, "|%.4000s|%s|%s|%s|%016" PRIx64 "|", tpu_cc_command(), cc_flags(),
           tpu_isa_name(tpu_host_isa()), TPU_RUNTIME_VERSION, g_headers_hash);
  tpu_cache_make_key(src, strlen(src), extra, out);
}

static pthread_mutex_t g_warn_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_warning[1024];
static bool g_compiler_broken;

static void note_compiler_failure(const char* why) {
  pthread_mutex_lock(&g_warn_mu);
  if (!g_compiler_broken) {
    g_compiler_broken = true;
    snprintf(g_warning, sizeof g_warning,
             "TorchTPU: fused kernels are unavailable (%s); DeferAndFuse graphs run op by op "
             "through the kernel library",
             why);
  }
  pthread_mutex_unlock(&g_warn_mu);
}

const char* tpu_fusion_pop_warning(void) {
  static __thread char copy[1024];
  pthread_mutex_lock(&g_warn_mu);
  bool have = g_warning[0] != 0;
  if (have) {
    memcpy(copy, g_warning, sizeof copy);
    g_warning[0] = 0;
  }
  pthread_mutex_unlock(&g_warn_mu);
  return have ? copy : NULL;
}

static fused_fn_t load_path(const char* key, const char* path, char* why, size_t cap) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    if (why) snprintf(why, cap, "%s", e ? e : "dlopen failed");
    return NULL;
  }
  fused_fn_t fn = (fused_fn_t)dlsym(h, "tpu_fused");
  if (!fn) {
    if (why) snprintf(why, cap, "%.200s has no symbol tpu_fused", path);
    dlclose(h);
    return NULL;
  }
  tpu_cache_tier1_put(key, (void*)fn);
  return fn;
}

/* A tier-2/3 entry for key, loaded; an entry that verifies but does not load
 * (written by a broken compiler) is deleted so it is compiled again. */
static fused_fn_t load_cached(const char* key) {
  char path[4096];
  int tier = 0;
  if (!tpu_cache_find(key, path, sizeof path, &tier)) return NULL;
  fused_fn_t fn = load_path(key, path, NULL, 0);
  if (!fn) tpu_cache_drop(key);
  return fn;
}

/* Compiles src under key (caller checked the tiers); NULL on failure. */
static fused_fn_t compile_now(const char* key, const char* src) {
  if (g_compiler_broken) return NULL;
  const int64_t timeout = tpu_cc_timeout_ms();
  /* A holder that died released the lock; one whose compile hangs holds it
   * until its own timeout: wait that long, then compile without it
   * (publishing is atomic, the lock only saves duplicate work). */
  int lock = tpu_cache_lock_wait(key, timeout > 0 ? timeout + 1000 : -1);
  fused_fn_t fn = NULL;
  if ((fn = load_cached(key))) goto done; /* another process made it */
  const tpu_cc_job_t job = {.headers = tpu_fuse_headers, .nheaders = tpu_fuse_nheaders,
                            .source_name = "k.c", .source = src, .flags = cc_flags()};
  tpu_cc_run_t run;
  tpu_cc_run(&job, &run);
  char why[700], line[200];
  switch (run.outcome) {
    case TPU_CC_SETUP:
      note_compiler_failure(run.why);
      break;
    case TPU_CC_NOT_RUN:
      snprintf(why, sizeof why, "the C compiler cannot be run: %s; set TORCH_TPU_CC", run.why);
      note_compiler_failure(why);
      break;
    case TPU_CC_TIMEOUT:
      snprintf(why, sizeof why,
               "the C compiler '%.100s' timed out after %.1f s and was killed with its process "
               "group; TORCH_TPU_COMPILE_TIMEOUT_S sets the limit",
               run.compiler, 1e-3 * (double)run.timeout_ms);
      note_compiler_failure(why);
      break;
    case TPU_CC_FAILED:
      tpu_cc_log(&run, line, sizeof line);
      line[strcspn(line, "\r\n")] = 0; /* the first line */
      snprintf(why, sizeof why, "the C compiler '%.100s' %s %d%s%.200s; set TORCH_TPU_CC",
               run.compiler, run.exited ? "failed with exit status" : "was killed by signal",
               run.code, line[0] ? ": " : "", line);
      note_compiler_failure(why);
      break;
    case TPU_CC_OK: {
      char pub[4096], err[300] = "";
      tpu_status_t st = tpu_cache_publish(key, run.so_path, pub, sizeof pub);
      if (!st) fn = load_path(key, pub, err, sizeof err);
      else snprintf(err, sizeof err, "%s", tpu_status_message(st));
      tpu_status_free(st);
      if (!fn) {
        tpu_cache_drop(key); /* never leave an unloadable entry for the next process */
        snprintf(why, sizeof why, "the C compiler '%.100s' produced a library that does not "
                 "load: %.300s; set TORCH_TPU_CC", run.compiler, err);
        note_compiler_failure(why);
      }
      break;
    }
  }
  tpu_cc_done(&run);
done:
  if (lock >= 0) tpu_cache_unlock(lock);
  return fn;
}

/* Background compiler: one thread, a queue of (key, source). */
typedef struct job {
  struct job* next;
  char key[33];
  char* src;
  int64_t due_ns; /* not started before this (CLOCK_MONOTONIC) */
} job_t;
static pthread_mutex_t g_job_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_job_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_idle_cv = PTHREAD_COND_INITIALIZER;
static job_t* g_jobs;
static int g_busy;
static bool g_thread_started;
static int g_waiters; /* threads in tpu_fusion_wait_compiles: start jobs at once */

/* A job starts this long after it was queued (TORCH_TPU_COMPILE_DELAY_MS):
 * a process's first steps, which queue every compile, then run at full
 * speed on every core, and the compiles follow at a low priority. */
static int64_t compile_delay_ns(void) {
  static _Atomic int64_t cached = -1;
  int64_t v = atomic_load(&cached);
  if (v < 0) {
    v = tpu_env_int("TORCH_TPU_COMPILE_DELAY_MS", 1000) * 1000000;
    if (v < 0) v = 0;
    atomic_store(&cached, v);
  }
  return v;
}

static void* compiler_main(void* arg) {
  (void)arg;
  /* low priority (inherited by the compiler processes): the steps keep most
   * of their cores. Not the lowest: on a machine whose cores the steps keep
   * busy (2 cores, a training loop) nice 19 starves the compiles for good. */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0) { /* best effort */
  }
  pthread_mutex_lock(&g_job_mu);
  for (;;) {
    while (!g_jobs) pthread_cond_wait(&g_job_cv, &g_job_mu);
    int64_t wait = g_jobs->due_ns - tpu_now_ns();
    if (wait > 0 && !g_waiters) { /* not due yet: sleep until it is (or a waiter comes) */
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      int64_t ns = until.tv_nsec + wait;
      until.tv_sec += ns / 1000000000;
      until.tv_nsec = ns % 1000000000;
      pthread_cond_timedwait(&g_job_cv, &g_job_mu, &until);
      continue;
    }
    job_t* j = g_jobs;
    g_jobs = j->next;
    g_busy++;
    pthread_mutex_unlock(&g_job_mu);
    if (!tpu_cache_tier1_get(j->key)) compile_now(j->key, j->src);
    free(j->src);
    free(j);
    pthread_mutex_lock(&g_job_mu);
    g_busy--;
    if (!g_jobs && !g_busy) pthread_cond_broadcast(&g_idle_cv);
  }
  return NULL;
}

static bool in_flight(const char* key) {
  for (job_t* j = g_jobs; j; j = j->next)
    if (!strcmp(j->key, key)) return true;
  return false;
}

static void compile_later(const char* key, const char* src) {
  pthread_mutex_lock(&g_job_mu);
  if (!in_flight(key)) {
    job_t* j = calloc(1, sizeof *j);
    char* s = strdup(src);
    if (j && s) {
      memcpy(j->key, key, 33);
      j->src = s;
      j->due_ns = tpu_now_ns() + compile_delay_ns();
      job_t** tail = &g_jobs;
      while (*tail) tail = &(*tail)->next;
      *tail = j;
      if (!g_thread_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, compiler_main, NULL) == 0) {
          pthread_detach(t);
          g_thread_started = true;
        }
      }
      pthread_cond_signal(&g_job_cv);
    } else {
      free(j);
      free(s);
    }
  }
  pthread_mutex_unlock(&g_job_mu);
}

void tpu_fusion_wait_compiles(void) {
  pthread_mutex_lock(&g_job_mu);
  g_waiters++;
  pthread_cond_signal(&g_job_cv); /* a delayed job starts now */
  while (g_jobs || g_busy) pthread_cond_wait(&g_idle_cv, &g_job_mu);
  g_waiters--;
  pthread_mutex_unlock(&g_job_mu);
}

/* The executable for src: tier 1, then tiers 2/3, else compile (now or in
 * the background); NULL when it is not available for this run. */
static fused_fn_t executable_for(const char* src, char key[33]) {
  key_of(src, key);
  fused_fn_t fn = (fused_fn_t)tpu_cache_tier1_get(key);
  if (fn) return fn;
  if ((fn = load_cached(key))) return fn;
  tpu_cache_note_miss();
  if (g_compiler_broken) return NULL;
  if (fuse_config()->async) {
    compile_later(key, src);
    return NULL;
  }
  return compile_now(key, src);
}

/* Signature -> executable memo in front of the cache (no source, no key
 * hashing on a hit). */
#define MEMO_SIZE 4096
static struct {
  uint64_t sig;
  fused_fn_t fn;
  char key[33];
} g_memo[MEMO_SIZE];
static pthread_mutex_t g_memo_mu = PTHREAD_MUTEX_INITIALIZER;

fused_fn_t fuse_memo_get(uint64_t sig) {
  fused_fn_t fn = NULL;
  char key[33] = {0};
  pthread_mutex_lock(&g_memo_mu);
  for (int i = 0; i < 8; i++) {
    size_t k = (sig + (uint64_t)i) & (MEMO_SIZE - 1);
    if (g_memo[k].sig == sig && g_memo[k].fn) {
      fn = g_memo[k].fn;
      memcpy(key, g_memo[k].key, 33);
      break;
    }
  }
  pthread_mutex_unlock(&g_memo_mu);
  if (fn && !tpu_cache_tier1_get(key)) fn = NULL; /* tier 1 was cleared */
  return fn;
}

static void memo_put(uint64_t sig, const char* key, fused_fn_t fn) {
  pthread_mutex_lock(&g_memo_mu);
  size_t slot = sig & (MEMO_SIZE - 1);
  for (int i = 0; i < 8; i++) {
    size_t k = (sig + (uint64_t)i) & (MEMO_SIZE - 1);
    if (!g_memo[k].fn || g_memo[k].sig == sig) {
      slot = k;
      break;
    }
  }
  g_memo[slot].sig = sig;
  g_memo[slot].fn = fn;
  memcpy(g_memo[slot].key, key, 33);
  pthread_mutex_unlock(&g_memo_mu);
}

fused_fn_t fuse_executable(uint64_t sig, const char* src) {
  char key[33];
  fused_fn_t fn = executable_for(src, key);
  if (fn) memo_put(sig, key, fn);
  return fn;
}
