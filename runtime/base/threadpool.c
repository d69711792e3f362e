/* Kernel thread pool: parallel_for over an index range.
 *
 * One job at a time; a caller that finds the pool busy (another stream's
 * worker) runs its range inline. The calling thread takes part in the job.
 *
 * Kernels issue parallel_for back to back (a GEMM packs, multiplies, packs
 * again), so both sides spin briefly before sleeping: workers watch the job
 * generation, the caller watches the count of workers still inside. Waking a
 * thread sleeping on a condition variable costs tens of microseconds, which
 * is most of a 1024 x 1024 product's per-block time. The spin is bounded in
 * time, so an idle pool sleeps.
 */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/threadpool.h"

/* Spin budget (TORCH_TPU_POOL_SPIN_US): a worker after a job, and the
 * caller per job. Past POOL_PAUSE_NS the spinner yields the core between
 * checks, so a runnable thread (the Python thread tracing the next ops)
 * is not kept waiting by a pool thread that has nothing to do yet. */
static int64_t g_spin_ns = 1000000;
#define POOL_PAUSE_NS 100000

static int g_nthreads = 1;
static pthread_mutex_t g_job_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;     /* guards the sleeps */
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
static _Atomic uint64_t g_generation;
static void (*g_fn)(void*, int64_t, int64_t);
static void* g_ctx;
static int64_t g_n, g_chunk;
static _Atomic int64_t g_next;
/* JOB_OPEN while workers may still join the current job, plus the number of
 * workers inside it. The caller closes the job when it runs out of chunks
 * and waits only for workers that joined: a worker the scheduler has not run
 * yet (a loaded machine) finds the job closed and costs the caller nothing. */
#define JOB_OPEN (1u << 30)
static _Atomic unsigned g_state;

int64_t tpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

static void run_chunks(void) {
  for (;;) {
    int64_t b = atomic_fetch_add(&g_next, g_chunk);
    if (b >= g_n) break;
    int64_t e = b + g_chunk < g_n ? b + g_chunk : g_n;
    g_fn(g_ctx, b, e);
  }
}

/* Spins until cond(arg) holds or the spin budget runs out; returns cond. */
static int spin_until(int (*cond)(uint64_t), uint64_t arg) {
  int64_t start = 0;
  bool yield = false;
  for (int i = 1;; i++) {
    if (cond(arg)) return 1;
    if (yield) sched_yield();
    else cpu_relax();
    if ((i & 63) == 0 || yield) {
      int64_t t = tpu_now_ns();
      if (!start) start = t;
      else if (t - start > g_spin_ns) return 0;
      else yield = t - start > POOL_PAUSE_NS;
    }
  }
}

static int new_job(uint64_t seen) { return atomic_load(&g_generation) != seen; }
static int job_done(uint64_t unused) {
  (void)unused;
  return atomic_load(&g_state) == 0;
}

/* Enters the open job, if any; the job's fields are stable while inside. */
static int job_join(void) {
  unsigned st = atomic_load(&g_state);
  while (st & JOB_OPEN)
    if (atomic_compare_exchange_weak(&g_state, &st, st + 1)) return 1;
  return 0;
}

static void job_leave(void) {
  if (atomic_fetch_sub(&g_state, 1) == 1) { /* the last one out of a closed job */
    pthread_mutex_lock(&g_mu);
    pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
  }
}

static void* pool_main(void* arg) {
  (void)arg;
  uint64_t seen = 0;
  for (;;) {
    if (!spin_until(new_job, seen)) {
      pthread_mutex_lock(&g_mu);
      while (atomic_load(&g_generation) == seen) pthread_cond_wait(&g_cv, &g_mu);
      pthread_mutex_unlock(&g_mu);
    }
    seen = atomic_load(&g_generation);
    if (job_join()) {
      run_chunks();
      job_leave();
    }
  }
  return NULL;
}

void tpu_threadpool_init(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t n = tpu_env_int("TORCH_TPU_NUM_THREADS", ncpu > 0 ? ncpu : 1);
  if (n < 1) n = 1;
  if (n > 256) n = 256;
  g_nthreads = (int)n;
  g_spin_ns = tpu_env_int("TORCH_TPU_POOL_SPIN_US", g_spin_ns / 1000) * 1000;
  if (g_spin_ns < 0) g_spin_ns = 0;
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
  g_fn = fn;
  g_ctx = ctx;
  g_n = n;
  g_chunk = chunk;
  atomic_store(&g_next, 0);
  atomic_store(&g_state, JOB_OPEN);
  /* publish, then wake sleepers; a worker re-checks the generation under
   * g_mu before it sleeps, so the broadcast cannot be missed */
  atomic_fetch_add(&g_generation, 1);
  pthread_mutex_lock(&g_mu);
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  run_chunks();
  if ((atomic_fetch_and(&g_state, ~JOB_OPEN) & ~JOB_OPEN) != 0 && !spin_until(job_done, 0)) {
    pthread_mutex_lock(&g_mu);
    while (atomic_load(&g_state) != 0) pthread_cond_wait(&g_done_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
  }
  pthread_mutex_unlock(&g_job_mu);
}
