/* TorchTPU runtime: devices, device memory, streams and events (over the
 * registered target, tpu/target.h).
 *
 * Each virtual chip owns a capacity of device memory behind a caching
 * allocator, and streams. A stream is an in-order queue run by one worker
 * thread. Memory is stream-ordered: when a block is freed, it is fenced on
 * every stream (of any device) that still has queued work, since that work
 * may read or write it; the block is handed out again only for work on a
 * stream whose fence it may ignore (a stream runs its queue in order) once
 * the fences of all other streams have passed. No record_stream is needed
 * for correctness; a tensor allocated for one stream and used on another
 * still needs the usual wait_stream/event before that use, as in CUDA.
 */
#ifndef TPU_DEVICE_H_
#define TPU_DEVICE_H_

#include "tpu/op.h"
#include "tpu/parallel.h" /* the kernel thread pool (base layer) */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_eager_mode {
  TPU_MODE_STRICT = 0, /* asynchronous, one op at a time */
  TPU_MODE_DEBUG = 1,  /* synchronous, extra checks */
  TPU_MODE_DEFER = 2,  /* DeferAndFuse: traced, run as fused graphs at materialization */
} tpu_eager_mode_t;

/* Reads the environment (TORCH_TPU_HOST_DEVICES, TORCH_TPU_HBM_BYTES,
 * TORCH_TPU_LAUNCH_BLOCKING / TPU_LAUNCH_BLOCKING, TORCH_TPU_DEFER_AND_FUSE).
 * Idempotent, thread-safe. */
tpu_status_t tpu_runtime_init(void) TPU_MUST_USE;
bool tpu_runtime_is_initialized(void);
/* True in a process forked from one whose runtime had started: the worker
 * threads do not exist there and the runtime's locks may be held, so
 * tpu_runtime_init fails ("Cannot re-initialize TPU in forked subprocess")
 * and frees of inherited blocks do nothing. A fork before the runtime started
 * leaves the child free to start its own. */
bool tpu_runtime_in_bad_fork(void);
int tpu_device_count(void);
/* The calling thread's mode: its override if it set one, else the
 * process-wide mode. */
tpu_eager_mode_t tpu_get_eager_mode(void);
/* Sets the process-wide mode and clears the calling thread's override.
 * Leaving DeferAndFuse flushes every device's trace first. */
tpu_status_t tpu_set_eager_mode(tpu_eager_mode_t mode) TPU_MUST_USE;
/* Sets (mode >= 0) or clears (-1) the calling thread's override; stores the
 * previous override (-1: none) in *previous when not NULL. Other threads keep
 * their modes; all threads share each device's trace, so ops of threads not
 * deferring first flush what deferring threads traced (program order). */
tpu_status_t tpu_set_thread_eager_mode(int mode, int* previous) TPU_MUST_USE;

/* The float32 matmul precision that the bridge records in each call
 * (process-wide; TPU_PRECISION_MEDIUM until set). */
tpu_precision_t tpu_get_matmul_precision(void);
void tpu_set_matmul_precision(tpu_precision_t p);

/* ---- memory ---- */
typedef struct tpu_memory_stats {
  int64_t allocated_bytes, peak_allocated_bytes;
  int64_t reserved_bytes, peak_reserved_bytes;
  int64_t active_allocations, peak_active_allocations;
  int64_t total_allocated_bytes, total_freed_bytes; /* accumulated */
  int64_t num_allocs, num_frees, num_ooms, num_cache_hits, num_device_alloc,
      num_device_free;
  int64_t capacity_bytes;
  /* DeferAndFuse: bytes promised to placeholders not backed yet. They count
   * against the capacity (an allocation beyond it fails at the op) but are
   * no memory, so the counts above leave them out. */
  int64_t promised_bytes;
} tpu_memory_stats_t;

/* Allocates `bytes` of device memory for work on the device's default
 * stream. bytes == 0 gives *out_ptr == NULL.
 * Fails with TPU_CODE_RESOURCE_EXHAUSTED, naming requested, allocated and
 * capacity bytes, when the device is full even after freeing its cache. */
tpu_status_t tpu_device_malloc(int device, size_t bytes, void** out_ptr) TPU_MUST_USE;
/* The same for work queued on stream s (of s's device): a cached block may
 * be reused while s itself still has queued work that used it. */
typedef struct tpu_stream tpu_stream_t;
tpu_status_t tpu_device_malloc_on(tpu_stream_t* s, size_t bytes, void** out_ptr) TPU_MUST_USE;
/* Returns a block to the device's cache, fenced on the streams that still
 * have queued work (see above). NULL is ignored. */
void tpu_device_free(int device, void* ptr);
/* Waits for the device's streams, then releases cached blocks. */
void tpu_device_empty_cache(int device);
void tpu_device_memory_stats(int device, tpu_memory_stats_t* out_stats);
void tpu_device_reset_peak_stats(int device);
void tpu_device_reset_accumulated_stats(int device);
/* Which device owns ptr (any address inside a live block); -1 if none. */
int tpu_device_of_ptr(const void* ptr);

/* ---- streams ---- */

/* Stream `id` of `device`; id 0 is the default stream. NULL if no such. */
tpu_stream_t* tpu_stream_get(int device, int64_t id);
/* Hands out a stream of the device's pool of TPU_STREAM_POOL (32) worker
 * streams, round-robin, starting its worker on first use; *out_id names it.
 * Never fails for lack of streams: later calls share pool streams. */
tpu_status_t tpu_stream_create(int device, int64_t* out_id) TPU_MUST_USE;
int64_t tpu_stream_id(const tpu_stream_t* s);
int tpu_stream_device(const tpu_stream_t* s);

/* Queues fn(ctx) (then destroy(ctx) if non-NULL); fn returns a status that is
 * handled like a kernel's. `what` names the work in error messages. */
tpu_status_t tpu_stream_enqueue(tpu_stream_t* s, const char* what,
                                tpu_status_t (*fn)(void*), void* ctx,
                                void (*destroy)(void*)) TPU_MUST_USE;
/* tpu_stream_enqueue that does not wait for the work in Debug mode either:
 * for work that can finish only after this thread queues more (a send whose
 * receive this process posts next, or that waits for a peer's own send). Its
 * error is raised at the next synchronization. */
tpu_status_t tpu_stream_enqueue_nowait(tpu_stream_t* s, const char* what,
                                       tpu_status_t (*fn)(void*), void* ctx,
                                       void (*destroy)(void*)) TPU_MUST_USE;
/* When s has no queued or running work, runs fn(ctx) on the calling thread
 * as s's next item (its error is kept for the next synchronization, as a
 * queued item's) and returns true; otherwise runs nothing, returns false.
 * s is held meanwhile: fn must not queue onto s. */
bool tpu_stream_run_if_idle(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(const void*),
                            const void* ctx);
/* Waits until all queued work has run; returns (and clears) the first error
 * raised by queued work since the last synchronization, naming the op. */
tpu_status_t tpu_stream_synchronize(tpu_stream_t* s) TPU_MUST_USE;
/* True when the stream has no queued or running work. */
bool tpu_stream_query(tpu_stream_t* s);
/* Synchronizes every stream of the device; returns the first error. */
tpu_status_t tpu_device_synchronize(int device) TPU_MUST_USE;

/* ---- events ---- */
typedef struct tpu_event tpu_event_t;
tpu_status_t tpu_event_create(tpu_event_t** out_event) TPU_MUST_USE;
void tpu_event_destroy(tpu_event_t* e);
/* Marks the current end of s; the event completes when s reaches it. */
tpu_status_t tpu_event_record(tpu_event_t* e, tpu_stream_t* s) TPU_MUST_USE;
/* Makes s wait (on its worker) until e completes. */
tpu_status_t tpu_stream_wait_event(tpu_stream_t* s, tpu_event_t* e) TPU_MUST_USE;
/* Makes `waiter` wait (on its worker) until `s` has run what is queued on
 * it now; no-op for the same stream. */
tpu_status_t tpu_stream_wait_stream(tpu_stream_t* waiter, tpu_stream_t* s) TPU_MUST_USE;
bool tpu_event_query(tpu_event_t* e);
void tpu_event_synchronize(tpu_event_t* e);
/* Seconds between two completed events' completion times. */
double tpu_event_elapsed_seconds(tpu_event_t* start, tpu_event_t* end);

/* ---- copies (through the target) ---- */
/* Enqueues a copy of `bytes` from host memory into device memory. The source
 * is snapshotted now (the caller may reuse it on return). */
tpu_status_t tpu_stream_copy_h2d(tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes) TPU_MUST_USE;
/* Waits for s, then copies device memory to host memory. */
tpu_status_t tpu_stream_copy_d2h(tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes) TPU_MUST_USE;
/* Enqueues a copy of `bytes` of device memory (src, of any device) into
 * device memory (dst) on s, through the target (tpu/target.h). The caller
 * orders src's writers before s (an event, or a synchronized source device). */
tpu_status_t tpu_stream_copy_d2d(tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes) TPU_MUST_USE;

#ifdef __cplusplus
}
#endif
#endif /* TPU_DEVICE_H_ */
