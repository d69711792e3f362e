/* TorchTPU runtime: the target interface.
 *
 * A target is what executes: it owns device memory, moves bytes between the
 * host and its devices, provides the kernels of the ops it implements, and
 * turns a flushed DeferAndFuse graph into something it runs. The layers
 * below it (device: streams and the caching allocator; exec: calls, traces,
 * graphs; cache) reach it only through this table, so a target is a module
 * added under runtime/targets/, not code threaded through every folder.
 *
 * A target is a vtable plus an opaque context (IREE's HAL drivers, ggml's
 * backend `iface`): implementations are `static` functions in a `static
 * const tpu_target_iface_t` filled with designated initializers. Entries
 * marked "optional" may be NULL; the text says what NULL means. Every other
 * entry is required. `ctx` is the target's own state, passed back as the
 * first argument of every entry.
 *
 * One target serves the whole process. The layer above the runtime chooses
 * it once at start-up (runtime/include/tpu/targets.h: TORCH_TPU_TARGET,
 * default "host") and registers it with tpu_target_set before anything else
 * runs; the device and execution layers then call tpu_target_get().
 *
 * Streams are the device layer's in-order queues (tpu/device.h). A
 * "stream-ordered" entry queues its work on the stream (the target may use
 * the device layer's work items for that) and returns; the work runs after
 * everything queued on the stream before it. A "sync" entry acts now on the
 * calling thread: the caller has ordered it (no queued work touches the
 * memory).
 */
#ifndef TPU_TARGET_H_
#define TPU_TARGET_H_

#include "tpu/device.h"
#include "tpu/op.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tpu_graph; /* the execution layer's flushed graph (exec/graph.h) */

/* What a device of the target is. Zero-initialisable. */
typedef struct tpu_target_device_props {
  const char* name;        /* the target's name for the device: "host" */
  int64_t memory_bytes;    /* device memory capacity */
  size_t alignment;        /* of buffer_alloc's addresses, bytes */
  bool host_addressable;   /* the host may read and write device memory directly */
} tpu_target_device_props_t;

/* The target's own view of a device's memory: the buffers it handed out
 * through buffer_alloc (the caching allocator's blocks, not tensors). */
typedef struct tpu_target_memory_stats {
  int64_t bytes_in_use, peak_bytes_in_use;
  int64_t num_allocs, num_frees;
  int64_t bytes_limit; /* memory_bytes of the device */
} tpu_target_memory_stats_t;

/* Facts about a prepared graph, for the trace statistics. */
typedef struct tpu_target_graph_info {
  int64_t fused_nodes;      /* nodes that run inside generated kernels */
  int64_t reduction_groups; /* fused groups around a row reduction */
  int64_t epilogue_groups;  /* matmuls fused with an elementwise epilogue */
} tpu_target_graph_info_t;

typedef struct tpu_target_iface {
  const char* name; /* "host" */

  /* ---- devices ---- */
  /* The number of devices (>= 1), or an error naming the setting that is
   * wrong. Called once, by the runtime's start-up. */
  tpu_status_t (*device_count)(void* ctx, int* out_count);
  /* Properties of device `device` (0 <= device < count). */
  tpu_status_t (*device_props)(void* ctx, int device, tpu_target_device_props_t* out_props);

  /* ---- buffers ---- */
  /* `bytes` (> 0) of device memory on `device`, aligned to the device's
   * alignment. RESOURCE_EXHAUSTED when the target cannot provide them. The
   * caching allocator (device layer) calls this for new blocks only. */
  tpu_status_t (*buffer_alloc)(void* ctx, int device, size_t bytes, void** out_ptr);
  /* Frees a buffer_alloc'ed address of `bytes` (the same count). No queued
   * work may still use it (the allocator has waited for its fences). */
  void (*buffer_free)(void* ctx, int device, void* ptr, size_t bytes);

  /* ---- copies (sync) ---- */
  tpu_status_t (*copy_h2d)(void* ctx, int device, void* dst, const void* src, size_t bytes);
  tpu_status_t (*copy_d2h)(void* ctx, int device, void* dst, const void* src, size_t bytes);
  /* Device memory to device memory, possibly of another device. */
  tpu_status_t (*copy_d2d)(void* ctx, int dst_device, void* dst, int src_device,
                           const void* src, size_t bytes);

  /* ---- copies (stream-ordered, queued on s of the destination device for
   * h2d/d2d, of the source device for d2h) ---- */
  /* The source is read before the call returns (the caller may reuse it). */
  tpu_status_t (*copy_h2d_async)(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes);
  /* dst must stay valid until s has run the copy (synchronize s to read it). */
  tpu_status_t (*copy_d2h_async)(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes);
  tpu_status_t (*copy_d2d_async)(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                 size_t bytes);

  /* ---- ops ---- */
  /* The target's kernel inventory: *out_count entries (ATen overload name,
   * kernel, flags), owned by the target and immutable for its lifetime. The
   * execution layer's op table (tpu_op_lookup) is built from it once; a
   * kernel runs one call on the calling thread (a stream worker, or inline). */
  const tpu_op_t* (*ops)(void* ctx, int* out_count);
  /* Whether the target runs the ATen overload `name` ("add.Tensor"). */
  bool (*supports_op)(void* ctx, const char* name);
  /* Optional: a kernel for an ATen overload outside ops()'s inventory, for
   * a target that lowers ops generically (pjrt compiles each call). NULL
   * return: the target has none. The op table asks once per name and keeps
   * the answer for the process. NULL entry: the inventory is all. */
  tpu_kernel_fn_t (*kernel_for)(void* ctx, const char* name, uint32_t* out_flags);

  /* ---- graphs ---- */
  /* Prepares a flushed graph (its kept nodes, placeholders not yet patched)
   * for execution: plans, compiles, or looks up an executable. *out_exe is
   * the target's object for it (NULL allowed: run the nodes one by one),
   * owned by the caller from here and given back to graph_release. Runs on
   * the flushing thread; nothing has run yet, and a failure runs nothing. */
  tpu_status_t (*graph_prepare)(void* ctx, struct tpu_graph* g, void** out_exe);
  /* Runs a prepared graph (addresses patched to real memory by now) on the
   * worker of the stream it was queued on, in that stream's order. On error
   * *out_failed_op names the node's op (NULL: unknown). */
  tpu_status_t (*graph_run)(void* ctx, void* exe, const struct tpu_graph* g,
                            const char** out_failed_op);
  /* Releases what graph_prepare made (NULL is ignored). */
  void (*graph_release)(void* ctx, void* exe);
  /* Optional: statistics of a prepared graph. NULL: all zero. */
  void (*graph_info)(void* ctx, const void* exe, tpu_target_graph_info_t* out_info);
  /* Optional: the node at which node `node`'s work runs (its fused group's
   * trigger); the flush holds its buffers from there on. NULL: the node. */
  int (*graph_run_position)(void* ctx, const void* exe, int node);
  /* Optional: whether the buffer starting at `base` lives only inside the
   * prepared graph's own kernels (it then gets no memory). NULL: never. */
  bool (*graph_buffer_is_internal)(void* ctx, const void* exe, const void* base);

  /* ---- memory ---- */
  void (*memory_stats)(void* ctx, int device, tpu_target_memory_stats_t* out_stats);

  /* ---- background work (optional) ---- */
  /* Waits until the target's background compilations finish. NULL: none. */
  void (*wait_compiles)(void* ctx);
  /* The next one-time warning of the target, or NULL. NULL: none. */
  const char* (*pop_warning)(void* ctx);
} tpu_target_iface_t;

typedef struct tpu_target {
  const tpu_target_iface_t* iface;
  void* ctx;
} tpu_target_t;

/* Registers the process's target. The first call wins; a later call with the
 * same target is a no-op, with another one INVALID_ARGUMENT (the target is
 * chosen once, at start-up). A table without a name or with a required entry
 * NULL is refused (INVALID_ARGUMENT naming the entry). `t` must stay valid
 * for the process. */
tpu_status_t tpu_target_set(const tpu_target_t* t) TPU_MUST_USE;
/* The registered target, NULL before tpu_target_set. Thread-safe. */
const tpu_target_t* tpu_target_get(void);
/* The registered target's name, NULL before tpu_target_set. */
const char* tpu_target_name(void);
/* The registered target's optional entries, as no-ops without a target. */
void tpu_target_wait_compiles(void);
const char* tpu_target_pop_warning(void);

#ifdef __cplusplus
}
#endif
#endif /* TPU_TARGET_H_ */
