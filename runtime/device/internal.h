/* Device layer internals shared by runtime.c, allocator.c and stream.c. */
#ifndef TPU_DEVICE_INTERNAL_H_
#define TPU_DEVICE_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>

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

/* Streams of a device: id 0 is the default stream; ids 1..TPU_STREAM_POOL
 * are a fixed pool of worker streams, each started on first use and handed
 * out round-robin by tpu_stream_create (as CUDA's stream pool). */
#define TPU_STREAM_POOL 32
#define TPU_MAX_STREAMS (1 + TPU_STREAM_POOL)

typedef struct tpu_device_state {
  int index;
  tpu_allocator_t alloc;
  pthread_mutex_t streams_mu; /* serializes starting pool streams */
  _Atomic unsigned next_pool; /* round-robin cursor of tpu_stream_create */
  tpu_stream_t* _Atomic streams[TPU_MAX_STREAMS];
} tpu_device_state_t;

tpu_device_state_t* tpu_device_state(int device);
/* Waits until every stream of the device has run what is queued on it; the
 * streams keep their errors for the next synchronization. */
void tpu_device_wait_idle(int device);
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
tpu_status_t tpu_device_malloc_reserved(int device, tpu_stream_t* stream, size_t bytes,
                                        void** out_ptr) TPU_MUST_USE;
void tpu_allocator_init(tpu_allocator_t* a, size_t capacity);
tpu_status_t tpu_stream_new(int device, int64_t id, tpu_stream_t** out);
/* Runtime-wide environment integer with a default. */
/* Every stream started so far, of all devices (streams are never destroyed):
 * their number, and the i-th of them. */
int tpu_stream_registry_count(void);
tpu_stream_t* tpu_stream_registry_at(int i);
/* Stream-ordered lifetime: the number of items queued on s so far, whether s
 * has finished that many, and a wait for it (without taking its errors). */
uint64_t tpu_stream_submitted_count(tpu_stream_t* s);
bool tpu_stream_reached(tpu_stream_t* s, uint64_t target);
void tpu_stream_wait_reached(tpu_stream_t* s, uint64_t target);
int64_t tpu_env_int(const char* name, int64_t dflt);
void tpu_threadpool_init(void);

#endif
