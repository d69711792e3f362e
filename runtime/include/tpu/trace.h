/* TorchTPU runtime: lazily backed buffers, the per-device trace and graphs.
 *
 * Every op call becomes a node of its device's trace. Strict and Debug run
 * the one-node trace at once (tpu_stream_submit); DeferAndFuse appends it and
 * runs the trace as one graph at a materialization point (tpu_trace_flush).
 *
 * In DeferAndFuse mode new device buffers are lazily backed: the allocator
 * hands out a placeholder address that no memory stands behind. At a flush,
 * placeholders still referenced by the host (live) get device memory, dead
 * ones that the graph still needs become graph-scoped temporaries, and nodes
 * whose results nobody can observe are dropped. The bridge then swaps each
 * live storage's placeholder for its real memory (tpu_lazy_detach).
 */
#ifndef TPU_TRACE_H_
#define TPU_TRACE_H_

#include <stdio.h>

#include "tpu/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- op submission ---- */
/* Submits a kernel call on stream s; the call is deep-copied. DeferAndFuse
 * appends it to the device's trace. Strict and Debug first flush a pending
 * trace (program order) and back the placeholders the call names; Strict
 * then queues it (a small call on an idle stream runs on the calling thread)
 * and its errors surface at the next synchronization; Debug waits for the
 * stream, runs it with extra checks and returns the kernel's error directly. */
tpu_status_t tpu_stream_submit(tpu_stream_t* s, const tpu_call_t* call) TPU_MUST_USE;

/* ---- lazily backed buffers ---- */
/* A placeholder for `bytes` of device memory, or NULL when none is available
 * (the caller then allocates real memory). */
void* tpu_lazy_alloc(int device, size_t bytes);
/* True when p lies inside a placeholder (a cheap range check). */
bool tpu_is_lazy(const void* p);
/* The host dropped the placeholder that starts at `base`. */
void tpu_lazy_free(void* base);
/* Real address for p (inside a placeholder) if it is backed, else NULL. */
void* tpu_lazy_resolve(const void* p);
/* Real address for p, backing its placeholder now if needed. */
tpu_status_t tpu_lazy_realize(const void* p, void** out) TPU_MUST_USE;
/* The same, backing the slot for work queued on stream s (NULL: the
 * device's default stream; see tpu_device_malloc_on). */
tpu_status_t tpu_lazy_realize_on(const void* p, tpu_stream_t* s, void** out) TPU_MUST_USE;
/* Hands the placeholder's memory to the caller (who frees it with
 * tpu_device_free); NULL when it is not backed. tpu_lazy_free(base) must
 * still follow and then releases only the placeholder. */
void* tpu_lazy_detach(void* base);
/* Placeholders in use (live or awaiting a flush). */
int tpu_lazy_count(void);

/* ---- the trace ---- */
/* Appends a call to its device's trace (DeferAndFuse). The call is copied. */
tpu_status_t tpu_trace_append(tpu_stream_t* s, const tpu_call_t* call) TPU_MUST_USE;
/* Materializes the device's trace: liveness, backing, planning, and queues
 * the graph on its stream. Returns errors of planning (e.g. out of memory);
 * kernel errors surface at the next synchronization as in Strict. */
tpu_status_t tpu_trace_flush(int device) TPU_MUST_USE;
/* Nodes waiting in the device's trace. */
int tpu_trace_length(int device);
/* While on (nesting counts), traces are not cut at repeated blocks or at
 * the size cap: torch.compile's whole forward / backward graphs. */
void tpu_trace_set_whole_graph(bool on);
/* Counts flushes of the device's trace (the bridge swaps placeholders after
 * each one). */
uint64_t tpu_trace_epoch(int device);

typedef struct tpu_trace_stats {
  int64_t flushes;          /* graphs materialized */
  int64_t nodes;            /* nodes traced */
  int64_t nodes_dropped;    /* nodes no live result depended on */
  int64_t nodes_fused;      /* nodes that ran inside a fused kernel */
  int64_t temps;            /* dead intermediates that needed a temporary */
  int64_t temp_bytes;       /* their bytes */
  int64_t elided_bytes;     /* bytes of dead intermediates that never got memory */
  int64_t repeat_cuts;      /* flushes at a repeated-sequence boundary */
  int64_t reduction_groups; /* fused kernels around a softmax / layer norm */
  int64_t epilogue_groups;  /* matmuls run with a fused elementwise epilogue */
  int64_t recipes;          /* live values a flush left without memory, to recompute */
  int64_t recipe_bytes;     /* their bytes */
  int64_t recomputed;       /* recipes run again (a later use needed the value) */
} tpu_trace_stats_t;
void tpu_trace_get_stats(tpu_trace_stats_t* out);
void tpu_trace_reset_stats(void);

/* Writes each flushed graph as StableHLO-style text into `dir` (NULL: off).
 * TORCH_TPU_DUMP_GRAPHS=<dir> sets it at start-up. */
tpu_status_t tpu_trace_set_dump_dir(const char* dir) TPU_MUST_USE;


#ifdef __cplusplus
}
#endif
#endif /* TPU_TRACE_H_ */
