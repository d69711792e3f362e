/* Device layer internals shared by runtime.c, allocator.c and stream.c. */
#ifndef TPU_DEVICE_INTERNAL_H_
#define TPU_DEVICE_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>

#include "base/env.h"
#include "base/threadpool.h"
#include "tpu/device.h"

typedef struct tpu_size_bin tpu_size_bin_t;

typedef struct tpu_allocator {
  pthread_mutex_t mu;
  size_t capacity;
  tpu_memory_stats_t stats;
  /* Reservations of unbacked placeholders (DeferAndFuse): rounded bytes that
   * count against the capacity but are no memory, so not in `stats`. */
  size_t promised;
  tpu_size_bin_t* bins[1024]; /* cached free blocks, hashed by rounded size */
  /* Blocks freed while a DeferAndFuse trace is pending: they return to the
   * cache after the trace is queued, since its nodes may still read them. */
  void** deferred;
  int ndeferred, deferred_cap;
  /* Temporaries a flush freed before its graph is queued (see
   * tpu_device_free_held). */
  struct tpu_block_header** held;
  int nheld, held_cap;
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
/* Frees a flush's temporary whose last use is in the graph being built, not
 * queued yet. Until tpu_device_release_held, only this thread's allocations
 * for stream `s` (the same flush: later temporaries, later placeholders) may
 * reuse the block; any other allocation, on s or elsewhere, would run before
 * the graph that still writes the block. Not released to the target by an
 * out-of-memory drain or empty_cache meanwhile. */
void tpu_device_free_held(void* ptr, tpu_stream_t* s);
/* Ends the calling thread's holds on `device`: each held block is fenced on
 * its stream's work queued so far (the graph, once it is queued) and may
 * serve any stream after that. */
void tpu_device_release_held(int device);
/* Placeholder reservations (DeferAndFuse): `bytes` counted against the
 * capacity without memory behind them, so that allocations beyond the
 * capacity fail at the op as in Strict. They are not memory and the memory
 * statistics (allocated, reserved, peaks) leave them out: those count the
 * blocks a flush really backs, in the graph's node order. tpu_device_reserve
 * fails (RESOURCE_EXHAUSTED) when the bytes do not fit, unless `force`
 * (re-reserving after a failed flush undid a backing). tpu_device_unreserve
 * drops one (the placeholder died unbacked); tpu_device_malloc_reserved turns
 * one into real memory and keeps it when the allocation fails. */
tpu_status_t tpu_device_reserve(int device, size_t bytes, bool force) TPU_MUST_USE;
void tpu_device_unreserve(int device, size_t bytes);
tpu_status_t tpu_device_malloc_reserved(int device, tpu_stream_t* stream, size_t bytes,
                                        void** out_ptr) TPU_MUST_USE;
/* Frees deferred while a trace was pending (tpu_device_release_deferred puts
 * them in the cache once the trace is queued). This puts back now those
 * whose memory [begin, end) `named` says the pending trace does not name:
 * a flush short of memory can then reuse them. Called with the trace held;
 * returns how many it put back. */
int tpu_device_release_deferred_unnamed(int device,
                                        bool (*named)(const void* begin, const void* end, void* ctx),
                                        void* ctx);
void tpu_allocator_init(tpu_allocator_t* a, size_t capacity);
tpu_status_t tpu_stream_new(int device, int64_t id, tpu_stream_t** out);
/* Every stream started so far, of all devices (streams are never destroyed):
 * their number, and the i-th of them. */
int tpu_stream_registry_count(void);
tpu_stream_t* tpu_stream_registry_at(int i);
/* Stream-ordered lifetime: the number of items queued on s so far, whether s
 * has finished that many, and a wait for it (without taking its errors). */
uint64_t tpu_stream_submitted_count(tpu_stream_t* s);
bool tpu_stream_reached(tpu_stream_t* s, uint64_t target);
void tpu_stream_wait_reached(tpu_stream_t* s, uint64_t target);

/* ---- stream work ----
 * A stream runs opaque work items in order; it never looks inside them. The
 * creator allocates an item (usually with its payload in the same block),
 * fills `what`, `run` and `release`, and hands it to the stream. */
typedef struct tpu_work tpu_work_t;
struct tpu_work {
  tpu_work_t* next;                    /* the stream's queue link */
  const char* what;                    /* names the work in errors: "aten::<what>";
                                          must outlive the item (a literal, an op name) */
  tpu_status_t (*run)(tpu_work_t* w);  /* on the stream's worker */
  void (*release)(tpu_work_t* w);      /* after run: frees the item */
};
/* Queues w on s; the stream owns it from here. No trace flush: the caller
 * has ordered it already (exec's submission, the trace's own graphs). */
void tpu_stream_push(tpu_stream_t* s, tpu_work_t* w);
/* tpu_stream_enqueue without flushing pending upper-layer work first. */
tpu_status_t tpu_stream_enqueue_raw(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                                    void* ctx, void (*destroy)(void*)) TPU_MUST_USE;

/* ---- hooks of the execution layer ----
 * Work that the layer above keeps outside the streams (the DeferAndFuse
 * trace) and addresses that stand for memory not yet allocated
 * (placeholders). The device layer calls these to keep program order:
 * before it queues copies, events and host functions, synchronizes, or
 * drains a device for memory, and to turn a placeholder into memory before
 * a copy touches it. The upper layer registers them once (before it makes a
 * trace or a placeholder); until then there is nothing pending and every
 * address is real. */
typedef struct tpu_device_hooks {
  /* Calls waiting outside the streams for the device (0: none). */
  int (*pending)(int device);
  /* Queues them on their stream; returns planning errors. */
  tpu_status_t (*flush)(int device);
  /* The real address of p, backing it for work on stream s (NULL: the
   * device's default stream) when it is a placeholder; p itself otherwise. */
  tpu_status_t (*realize)(const void* p, tpu_stream_t* s, void** out_ptr);
} tpu_device_hooks_t;
/* Sets the hooks (a static table; the last call wins, all callers pass the
 * same one). Thread-safe. */
void tpu_device_set_hooks(const tpu_device_hooks_t* hooks);
/* The hooks, or what they mean when none are set. */
int tpu_device_pending_work(int device);
tpu_status_t tpu_device_flush_pending(int device) TPU_MUST_USE;
tpu_status_t tpu_device_realize(const void* p, tpu_stream_t* s, void** out_ptr) TPU_MUST_USE;

#endif
