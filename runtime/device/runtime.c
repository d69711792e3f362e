/* Runtime start-up: devices from the environment, eager mode. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "tpu/trace.h"

#define TPU_MAX_DEVICES 64

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static tpu_status_t g_init_status;
static int g_ndevices;
static tpu_device_state_t* g_devices;
static _Atomic int g_mode = TPU_MODE_STRICT;
static _Atomic int g_initialized;

int64_t tpu_env_int(const char* name, int64_t dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end = NULL;
  long long x = strtoll(v, &end, 10);
  if (end == v) return dflt;
  /* optional binary suffixes for byte sizes */
  if (*end == 'K' || *end == 'k') x <<= 10;
  else if (*end == 'M' || *end == 'm') x <<= 20;
  else if (*end == 'G' || *end == 'g') x <<= 30;
  return x;
}

static bool env_flag(const char* name) {
  const char* v = getenv(name);
  return v && *v && strcmp(v, "0") != 0 && strcmp(v, "false") != 0;
}

static void runtime_init_once(void) {
  int64_t n = tpu_env_int("TORCH_TPU_HOST_DEVICES", 1);
  if (n < 1 || n > TPU_MAX_DEVICES) {
    g_init_status = TPU_ERR(INVALID_ARGUMENT,
                            "TORCH_TPU_HOST_DEVICES=%lld is out of range [1, %d]",
                            (long long)n, TPU_MAX_DEVICES);
    return;
  }
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  int64_t half_ram = (pages > 0 && psize > 0) ? (int64_t)pages * psize / 2 : ((int64_t)16 << 30);
  int64_t dflt = half_ram < ((int64_t)16 << 30) ? half_ram : ((int64_t)16 << 30);
  int64_t cap = tpu_env_int("TORCH_TPU_HBM_BYTES", dflt);
  if (cap <= 0) {
    g_init_status = TPU_ERR(INVALID_ARGUMENT, "TORCH_TPU_HBM_BYTES=%lld must be positive",
                            (long long)cap);
    return;
  }
  g_devices = calloc((size_t)n, sizeof(tpu_device_state_t));
  if (!g_devices) {
    g_init_status = TPU_ERR(RESOURCE_EXHAUSTED, "cannot allocate %lld device records", (long long)n);
    return;
  }
  for (int i = 0; i < n; i++) {
    g_devices[i].index = i;
    tpu_allocator_init(&g_devices[i].alloc, (size_t)cap);
    pthread_mutex_init(&g_devices[i].streams_mu, NULL);
  }
  g_ndevices = (int)n;
  if (env_flag("TORCH_TPU_LAUNCH_BLOCKING") || env_flag("TPU_LAUNCH_BLOCKING"))
    g_mode = TPU_MODE_DEBUG;
  else if (env_flag("TORCH_TPU_DEFER_AND_FUSE"))
    g_mode = TPU_MODE_DEFER;
  tpu_threadpool_init();
  for (int i = 0; i < n; i++) {
    tpu_stream_t* s = NULL;
    tpu_status_t st = tpu_stream_new(i, 0, &s);
    if (st) {
      g_init_status = st;
      return;
    }
    g_devices[i].streams[0] = s;
    g_devices[i].nstreams = 1;
  }
  g_initialized = 1;
}

tpu_status_t tpu_runtime_init(void) {
  pthread_once(&g_once, runtime_init_once);
  if (g_init_status)
    return TPU_ERR(INTERNAL, "TorchTPU runtime failed to start: %s",
                   tpu_status_message(g_init_status));
  return TPU_OK;
}

bool tpu_runtime_is_initialized(void) { return g_initialized != 0; }

int tpu_device_count(void) {
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
    for (int d = 0; d < g_ndevices; d++) TPU_RETURN_IF_ERROR(tpu_trace_flush(d));
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
  if (!d || id < 0) return NULL;
  pthread_mutex_lock(&d->streams_mu);
  tpu_stream_t* s = id < d->nstreams ? d->streams[id] : NULL;
  pthread_mutex_unlock(&d->streams_mu);
  return s;
}

tpu_status_t tpu_stream_create(int device, int64_t* out_id) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "stream create: no device %d", device);
  pthread_mutex_lock(&d->streams_mu);
  if (d->nstreams >= TPU_MAX_STREAMS) {
    pthread_mutex_unlock(&d->streams_mu);
    return TPU_ERR(RESOURCE_EXHAUSTED, "stream create: device %d already has %d streams",
                   device, TPU_MAX_STREAMS);
  }
  int64_t id = d->nstreams;
  tpu_stream_t* s = NULL;
  tpu_status_t st = tpu_stream_new(device, id, &s);
  if (!st) {
    d->streams[id] = s;
    d->nstreams++;
    *out_id = id;
  }
  pthread_mutex_unlock(&d->streams_mu);
  return st;
}

tpu_status_t tpu_device_synchronize(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "synchronize: no device %d", device);
  tpu_status_t first = tpu_trace_flush(device);
  pthread_mutex_lock(&d->streams_mu);
  int n = d->nstreams;
  pthread_mutex_unlock(&d->streams_mu);
  for (int i = 0; i < n; i++) {
    tpu_status_t st = tpu_stream_synchronize(d->streams[i]);
    if (st && !first) first = st;
    else tpu_status_free(st);
  }
  return first;
}
