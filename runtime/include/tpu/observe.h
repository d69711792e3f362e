/* Observing the runtime from outside: a timeline of kernel runs (for
 * torch.profiler) and a feed of allocator events (for memory snapshots).
 * Both are off by default and cost one relaxed atomic load per kernel or
 * allocation while off. */
#ifndef TPU_OBSERVE_H_
#define TPU_OBSERVE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernel timeline ----
 * While recording, every run counted by the kernel profile (tpu/op.h: one
 * op call or one fused group, outermost only) appends one event. Times are
 * CLOCK_MONOTONIC nanoseconds (tpu_now_ns), taken on the thread that runs
 * the kernel. `tag` is the value the submitting thread had set with
 * tpu_profile_set_tag when it submitted the call (carried through the
 * stream's queue); 0 for work that no tagged call submitted (fused groups
 * built at a DeferAndFuse flush). */
typedef struct tpu_kernel_event {
  int32_t entry;   /* kernel profile entry: tpu_profile_entry(entry, ...) names it */
  int32_t device;  /* -1 when unknown */
  int64_t stream;  /* stream id; -1 for a run outside any stream */
  int64_t start_ns;
  int64_t end_ns;
  uint64_t tag;
} tpu_kernel_event_t;

/* Starts (dropping earlier events) or stops recording. */
void tpu_kernel_events_record(bool on);
bool tpu_kernel_events_recording(void);
/* Moves up to cap recorded events, oldest first, into out; returns how many.
 * Events that did not fit stay for the next call. */
size_t tpu_kernel_events_take(tpu_kernel_event_t* out, size_t cap);
/* Events dropped because the buffer (TPU_KERNEL_EVENTS_MAX) was full. */
uint64_t tpu_kernel_events_dropped(void);
enum { TPU_KERNEL_EVENTS_MAX = 1 << 22 };

/* The calling thread's tag, stamped on the calls it submits from now on. */
void tpu_profile_set_tag(uint64_t tag);
uint64_t tpu_profile_tag(void);

/* For the runtime's runners: whether the timeline wants a stamp, and adding
 * one event for a run on this thread (its device and stream come from the
 * running stream, else from `device`). */
bool tpu_kernel_events_on(void);
void tpu_kernel_events_add(int entry, int device, int64_t start_ns, int64_t end_ns);

/* ---- allocator events ----
 * The observer is called after the allocator's own locks are released, on
 * the thread that allocates or frees (a stream worker for memory the
 * runtime backs itself). `requested` is the caller's byte count for an
 * alloc, else the block size; `size` is the block's (rounded) size. */
typedef enum tpu_mem_action {
  TPU_MEM_ALLOC = 0,
  TPU_MEM_FREE = 1,
  TPU_MEM_SEGMENT_ALLOC = 2, /* a block obtained from the target */
  TPU_MEM_SEGMENT_FREE = 3,  /* a block given back to the target */
  TPU_MEM_OOM = 4,           /* a request that failed: requested bytes */
} tpu_mem_action_t;
typedef void (*tpu_mem_observer_t)(int device, tpu_mem_action_t action, const void* ptr,
                                   size_t size, size_t requested, int64_t stream_id);
/* Installs (NULL: removes) the process's one observer. */
void tpu_device_set_memory_observer(tpu_mem_observer_t fn);

/* Calls fn for every block the allocator holds on `device` (live or cached),
 * in address order: its address, rounded size and whether it is live. fn
 * runs under the block registry's lock: it must not allocate or free device
 * memory. */
void tpu_device_memory_blocks(int device,
                              void (*fn)(void* ctx, const void* ptr, size_t size, bool live),
                              void* ctx);

/* Waits (queuing nothing) until the device's streams have run what is queued,
 * leaving any asynchronous error for the next synchronization. */
void tpu_device_wait_idle(int device);

/* The stream whose work the calling thread is running (its worker, or a
 * caller running an item inline), NULL otherwise. */
struct tpu_stream;
struct tpu_stream* tpu_stream_running(void);

#ifdef __cplusplus
}
#endif

#endif /* TPU_OBSERVE_H_ */
