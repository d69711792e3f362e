/* Execution layer internals shared by call.c, lazy.c, trace.c, graph.c and
 * the targets' graph entries (exec/graph.h). */
#ifndef TPU_EXEC_INTERNAL_H_
#define TPU_EXEC_INTERNAL_H_

#include "tpu/trace.h"

#define TPU_LAZY_SLOTS 8192

typedef enum { TPU_LAZY_FREE = 0, TPU_LAZY_LIVE, TPU_LAZY_DEAD } tpu_lazy_state_t;

typedef struct tpu_lazy_slot {
  tpu_lazy_state_t state; /* LIVE: the host holds it; DEAD: dropped, a trace still names it */
  int device;
  size_t bytes;
  void* real;    /* device memory once backed */
  bool in_trace; /* an unflushed node names it */
  bool detached; /* real memory handed to the host (tpu_lazy_detach) */
  bool reserved; /* its bytes are reserved in the allocator (unbacked; live or dead) */
} tpu_lazy_slot_t;

/* Slot index of a pointer inside a placeholder, -1 otherwise. */
int tpu_lazy_slot_of(const void* p);
/* Slot access under tpu_lazy_lock(). */
tpu_lazy_slot_t* tpu_lazy_slot(int id);
/* The placeholder address that starts slot id. */
void* tpu_lazy_slot_base(int id);
void tpu_lazy_lock(void);
void tpu_lazy_unlock(void);
/* While a flush backs its temporaries: the bytes of slot id, whose
 * reservation (held since a dead slot was freed) is given up for the
 * temporary the flush allocates in its place. */
size_t tpu_lazy_take_dead(int id);
/* After a flush: releases a dead slot, or clears in_trace of a live one. */
void tpu_lazy_release_dead(int id);
/* After a failed flush: gives back the memory the flush backed slot id with
 * (nothing ran on it) and, if the host still holds it, reserves it again. */
void tpu_lazy_unrealize(int id);

/* Op calls (call.c). A deep copy of a call in one malloc'ed block (free()
 * releases it). */
tpu_call_t* tpu_call_clone(const tpu_call_t* call);
/* The same into caller-provided memory: `storage` (8-byte aligned) must hold
 * tpu_call_deep_size(src) bytes, which dst's lists and tensors then use. */
size_t tpu_call_deep_size(const tpu_call_t* src);
void tpu_call_copy_deep(tpu_call_t* dst, const tpu_call_t* src, void* storage);

/* Calls fn on every tensor descriptor of a call (arguments, list entries
 * and outputs that are present), with whether the call writes it. */
void tpu_call_visit_tensors(tpu_call_t* call, void (*fn)(void* ctx, tpu_tensor_t* t, bool write),
                            void* ctx);

/* Replaces placeholder pointers of backed buffers with real addresses;
 * backs unbacked ones when `realize` (Strict calls on DeferAndFuse-made
 * tensors). */
tpu_status_t tpu_call_resolve_lazy(tpu_call_t* call, bool realize) TPU_MUST_USE;

/* Registers the hooks through which the device layer flushes the trace and
 * backs placeholders (call.c); called by the trace's and the placeholders'
 * start-up, before either exists. */
void tpu_exec_register_hooks(void);
#endif
