/* Device layer internals shared by runtime.c, allocator.c and stream.c. */
#ifndef TPU_DEVICE_INTERNAL_H_
#define TPU_DEVICE_INTERNAL_H_

#include <pthread.h>

#include "tpu/device.h"

typedef struct tpu_size_bin tpu_size_bin_t;

typedef struct tpu_allocator {
  pthread_mutex_t mu;
  size_t capacity;
  tpu_memory_stats_t stats;
  tpu_size_bin_t* bins[1024]; /* cached free blocks, hashed by rounded size */
  /* Blocks freed while a DeferAndFuse trace is pending: they return to the
   * cache after the trace is queued, since its nodes may still read them. */
  void** deferred;
  int ndeferred, deferred_cap;
} tpu_allocator_t;

#define TPU_MAX_STREAMS 64

typedef struct tpu_device_state {
  int index;
  tpu_allocator_t alloc;
  pthread_mutex_t streams_mu;
  int nstreams;
  tpu_stream_t* streams[TPU_MAX_STREAMS];
} tpu_device_state_t;

tpu_device_state_t* tpu_device_state(int device);
/* Returns blocks freed during a pending trace to the cache (after a flush). */
void tpu_device_release_deferred(int device);
/* Frees memory that no queued or traced work names (a flush's own
 * temporaries, backing undone after a failed flush): straight to the cache,
 * never deferred. */
void tpu_device_free_unused(void* ptr);
/* Placeholder reservations (DeferAndFuse): `bytes` counted as allocated and
 * against the capacity without memory behind them, so that allocations
 * beyond the capacity fail at the op as in Strict and the memory statistics
 * include unbacked buffers. tpu_device_reserve fails (RESOURCE_EXHAUSTED)
 * when the bytes do not fit, unless `force` (re-reserving after a failed
 * flush undid a backing). tpu_device_unreserve drops one (the placeholder
 * died unbacked); tpu_device_malloc_reserved turns one into real memory and
 * keeps it when the allocation fails. */
tpu_status_t tpu_device_reserve(int device, size_t bytes, bool force) TPU_MUST_USE;
void tpu_device_unreserve(int device, size_t bytes);
tpu_status_t tpu_device_malloc_reserved(int device, size_t bytes, void** out_ptr) TPU_MUST_USE;
void tpu_allocator_init(tpu_allocator_t* a, size_t capacity);
tpu_status_t tpu_stream_new(int device, int64_t id, tpu_stream_t** out);
/* Runtime-wide environment integer with a default. */
int64_t tpu_env_int(const char* name, int64_t dflt);
void tpu_threadpool_init(void);

#endif
