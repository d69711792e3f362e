/* Runtime start-up: devices from the registered target, eager mode from the
 * environment. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "tpu/target.h"

#define TPU_MAX_DEVICES 64

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static tpu_status_t g_init_status;
static int g_ndevices;
static tpu_device_state_t* g_devices;
static _Atomic int g_mode = TPU_MODE_STRICT;
static _Atomic int g_initialized;
static _Atomic int g_started;  /* init began: worker threads may exist */
static _Atomic int g_bad_fork; /* this process was forked after g_started */

/* Every stream started, of all devices, for the allocator's fences. */
#define TPU_REGISTRY_MAX (TPU_MAX_DEVICES * TPU_MAX_STREAMS)
static tpu_stream_t* _Atomic g_registry[TPU_REGISTRY_MAX];
static _Atomic int g_nregistry;
static pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;

static void stream_register(tpu_stream_t* s) {
  pthread_mutex_lock(&g_registry_mu);
  int n = atomic_load(&g_nregistry);
  if (n < TPU_REGISTRY_MAX) {
    atomic_store(&g_registry[n], s);
    atomic_store(&g_nregistry, n + 1);
  }
  pthread_mutex_unlock(&g_registry_mu);
}

int tpu_stream_registry_count(void) { return atomic_load(&g_nregistry); }
tpu_stream_t* tpu_stream_registry_at(int i) { return atomic_load(&g_registry[i]); }

/* fork(): the child has none of the parent's threads (stream workers, the
 * kernel pool), and a lock another thread held at the fork stays held. Like
 * CUDA, a child of a started runtime refuses to use it; the parent and a
 * child forked before the start are unaffected. */
static void on_fork_child(void) {
  if (atomic_load(&g_started)) atomic_store(&g_bad_fork, 1);
}

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(NULL, NULL, on_fork_child); }

bool tpu_runtime_in_bad_fork(void) { return atomic_load_explicit(&g_bad_fork, memory_order_relaxed) != 0; }

static void runtime_init_once(void) {
  pthread_once(&g_atfork_once, atfork_register);
  atomic_store(&g_started, 1);
  const tpu_target_t* target = tpu_target_get();
  int n = 0;
  g_init_status = target->iface->device_count(target->ctx, &n);
  if (g_init_status) return;
  if (n < 1 || n > TPU_MAX_DEVICES) {
    g_init_status = TPU_ERR(INVALID_ARGUMENT, "target %s has %d devices, outside [1, %d]",
                            target->iface->name, n, TPU_MAX_DEVICES);
    return;
  }
  g_devices = calloc((size_t)n, sizeof(tpu_device_state_t));
  if (!g_devices) {
    g_init_status = TPU_ERR(RESOURCE_EXHAUSTED, "cannot allocate %lld device records", (long long)n);
    return;
  }
  for (int i = 0; i < n; i++) {
    tpu_target_device_props_t props;
    g_init_status = target->iface->device_props(target->ctx, i, &props);
    if (g_init_status) return;
    g_devices[i].index = i;
    tpu_allocator_init(&g_devices[i].alloc, (size_t)props.memory_bytes);
    pthread_mutex_init(&g_devices[i].streams_mu, NULL);
  }
  g_ndevices = (int)n;
  if (tpu_env_bool("TORCH_TPU_LAUNCH_BLOCKING", false) || tpu_env_bool("TPU_LAUNCH_BLOCKING", false))
    g_mode = TPU_MODE_DEBUG;
  else if (tpu_env_bool("TORCH_TPU_DEFER_AND_FUSE", false))
    g_mode = TPU_MODE_DEFER;
  tpu_threadpool_init();
  for (int i = 0; i < n; i++) {
    tpu_stream_t* s = NULL;
    tpu_status_t st = tpu_stream_new(i, 0, &s);
    if (st) {
      g_init_status = st;
      return;
    }
    atomic_store(&g_devices[i].streams[0], s);
    stream_register(s);
  }
  g_initialized = 1;
}

#define TPU_BAD_FORK_MESSAGE                                                          \
  "Cannot re-initialize TPU in forked subprocess. To use TPU with multiprocessing, " \
  "you must use the 'spawn' start method (the tpu runtime had started in the "     \
  "parent process before fork, and its worker threads do not exist in the child)"

tpu_status_t tpu_runtime_init(void) {
  if (tpu_runtime_in_bad_fork()) return TPU_ERR(INTERNAL, TPU_BAD_FORK_MESSAGE);
  if (!tpu_target_get()) /* not latched: the program may still choose one */
    return TPU_ERR(INTERNAL, "TorchTPU runtime cannot start: no target is registered (the program "
                   "chooses one first: tpu_targets_select_from_env, TORCH_TPU_TARGET)");
  pthread_once(&g_atfork_once, atfork_register);
  pthread_once(&g_once, runtime_init_once);
  if (g_init_status)
    return TPU_ERR(INTERNAL, "TorchTPU runtime failed to start: %s",
                   tpu_status_message(g_init_status));
  return TPU_OK;
}

bool tpu_runtime_is_initialized(void) { return g_initialized != 0; }

int tpu_device_count(void) {
  if (tpu_runtime_in_bad_fork()) return g_ndevices; /* as the parent saw it */
  tpu_status_t st = tpu_runtime_init();
  if (st) {
    tpu_status_free(st);
    return 0;
  }
  return g_ndevices;
}

tpu_device_state_t* tpu_device_state(int device) {
  if (device < 0 || device >= g_ndevices) return NULL;
  return &g_devices[device];
}

static _Atomic int g_precision = TPU_PRECISION_MEDIUM;
tpu_precision_t tpu_get_matmul_precision(void) { return (tpu_precision_t)g_precision; }
void tpu_set_matmul_precision(tpu_precision_t p) { g_precision = p; }

/* The process-wide mode, and a per-thread override (-1: none) that
 * tpu_set_thread_eager_mode sets for scoped use (torch_tpu.eager_mode). */
static _Thread_local int t_mode = -1;

tpu_eager_mode_t tpu_get_eager_mode(void) {
  return (tpu_eager_mode_t)(t_mode >= 0 ? t_mode : g_mode);
}

static tpu_status_t flush_if_leaving_defer(tpu_eager_mode_t next) {
  if (tpu_get_eager_mode() == TPU_MODE_DEFER && next != TPU_MODE_DEFER)
    for (int d = 0; d < g_ndevices; d++) TPU_RETURN_IF_ERROR(tpu_device_flush_pending(d));
  return TPU_OK;
}

tpu_status_t tpu_set_eager_mode(tpu_eager_mode_t mode) {
  if (mode < TPU_MODE_STRICT || mode > TPU_MODE_DEFER)
    return TPU_ERR(INVALID_ARGUMENT, "set_eager_mode: unknown mode %d", (int)mode);
  TPU_RETURN_IF_ERROR(flush_if_leaving_defer(mode));
  g_mode = mode;
  t_mode = -1;
  return TPU_OK;
}

tpu_status_t tpu_set_thread_eager_mode(int mode, int* previous) {
  if (mode < -1 || mode > TPU_MODE_DEFER)
    return TPU_ERR(INVALID_ARGUMENT, "set_thread_eager_mode: unknown mode %d", mode);
  TPU_RETURN_IF_ERROR(flush_if_leaving_defer(mode >= 0 ? (tpu_eager_mode_t)mode
                                                       : (tpu_eager_mode_t)g_mode));
  if (previous) *previous = t_mode;
  t_mode = mode;
  return TPU_OK;
}

tpu_stream_t* tpu_stream_get(int device, int64_t id) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d || id < 0 || id >= TPU_MAX_STREAMS) return NULL;
  return atomic_load_explicit(&d->streams[id], memory_order_acquire);
}

tpu_status_t tpu_stream_create(int device, int64_t* out_id) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "stream create: no device %d", device);
  const int64_t id = 1 + (int64_t)(atomic_fetch_add(&d->next_pool, 1u) % TPU_STREAM_POOL);
  if (atomic_load_explicit(&d->streams[id], memory_order_acquire)) {
    *out_id = id;
    return TPU_OK;
  }
  pthread_mutex_lock(&d->streams_mu);
  tpu_status_t st = TPU_OK;
  if (!atomic_load(&d->streams[id])) {
    tpu_stream_t* s = NULL;
    st = tpu_stream_new(device, id, &s);
    if (!st) {
      atomic_store_explicit(&d->streams[id], s, memory_order_release);
      stream_register(s);
    }
  }
  pthread_mutex_unlock(&d->streams_mu);
  if (!st) *out_id = id;
  return st;
}

tpu_status_t tpu_device_synchronize(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "synchronize: no device %d", device);
  tpu_status_t first = tpu_device_flush_pending(device);
  for (int i = 0; i < TPU_MAX_STREAMS; i++) {
    tpu_stream_t* s = atomic_load(&d->streams[i]);
    if (!s) continue;
    tpu_status_t st = tpu_stream_synchronize(s);
    if (st && !first) first = st;
    else tpu_status_free(st);
  }
  return first;
}

void tpu_device_wait_idle(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  for (int i = 0; i < TPU_MAX_STREAMS; i++) {
    tpu_stream_t* s = atomic_load(&d->streams[i]);
    if (s) tpu_stream_wait_reached(s, tpu_stream_submitted_count(s));
  }
}
