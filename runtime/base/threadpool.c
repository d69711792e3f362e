/* Kernel thread pool: parallel_for over an index range.
 *
 * One job at a time; a caller that finds the pool busy (another stream's
 * worker) runs its range inline. The calling thread takes part in the job.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "tpu/device.h"

int64_t tpu_env_int(const char* name, int64_t dflt);

static int g_nthreads = 1;
static pthread_mutex_t g_job_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
static uint64_t g_generation;
static void (*g_fn)(void*, int64_t, int64_t);
static void* g_ctx;
static int64_t g_n, g_chunk;
static _Atomic int64_t g_next;
static int g_active;

static void run_chunks(void) {
  for (;;) {
    int64_t b = atomic_fetch_add(&g_next, g_chunk);
    if (b >= g_n) break;
    int64_t e = b + g_chunk < g_n ? b + g_chunk : g_n;
    g_fn(g_ctx, b, e);
  }
}

static void* pool_main(void* arg) {
  (void)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (g_generation == seen) pthread_cond_wait(&g_cv, &g_mu);
    seen = g_generation;
    pthread_mutex_unlock(&g_mu);
    run_chunks();
    pthread_mutex_lock(&g_mu);
    if (--g_active == 0) pthread_cond_broadcast(&g_done_cv);
  }
  return NULL;
}

void tpu_threadpool_init(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t n = tpu_env_int("TORCH_TPU_NUM_THREADS", ncpu > 0 ? ncpu : 1);
  if (n < 1) n = 1;
  if (n > 256) n = 256;
  g_nthreads = (int)n;
  for (int i = 1; i < g_nthreads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, pool_main, NULL) != 0) {
      g_nthreads = i;
      break;
    }
    pthread_detach(t);
  }
}

int tpu_num_threads(void) { return g_nthreads; }

void tpu_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (g_nthreads <= 1 || n <= grain || pthread_mutex_trylock(&g_job_mu) != 0) {
    fn(ctx, 0, n);
    return;
  }
  int64_t chunk = (n + g_nthreads * 4 - 1) / (g_nthreads * 4);
  if (chunk < grain) chunk = grain;
  pthread_mutex_lock(&g_mu);
  g_fn = fn;
  g_ctx = ctx;
  g_n = n;
  g_chunk = chunk;
  atomic_store(&g_next, 0);
  g_active = g_nthreads - 1;
  g_generation++;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  run_chunks();
  pthread_mutex_lock(&g_mu);
  while (g_active > 0) pthread_cond_wait(&g_done_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_unlock(&g_job_mu);
}
