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
  /* Recomputation (see tpu_lazy_set_recipe): a live value left without
   * memory by a flush, with the node that computes it again from `pins`ed
   * inputs; an input's pins count the recipes naming it. */
  tpu_call_t* recipe;
  int pins;
  bool no_recompute; /* recomputed once already: the next flush backs it */
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

/* Recomputation (DeferAndFuse). A flush may leave a live value without
 * memory when one elementwise node computes it from inputs the host keeps
 * anyway (autograd's pre-activation and activation: only the first needs
 * memory until the backward reads the second). tpu_lazy_set_recipe gives
 * slot id the node (`recipe`, owned now; it names its inputs by placeholder
 * address) and drops its reservation; each input is pinned: it keeps its
 * placeholder (tpu_lazy_resolve answers NULL, tpu_lazy_detach refuses), so
 * every later use of it, a write above all, is seen by the trace or by
 * tpu_lazy_realize_on, and its memory stays while a recipe names it, even
 * after the host dropped it. */
void tpu_lazy_set_recipe(int id, tpu_call_t* recipe);
/* Recipe slots that must run before a node touching tensor t (`write`: the
 * node writes it): t's slot when it has a recipe and, when t is written
 * (placeholder or real memory), the recipes reading that memory. Stores up
 * to `cap` slot ids in out; returns how many. Cheap when there are none. */
int tpu_lazy_recipes_for(const tpu_tensor_t* t, bool write, int* out, int cap);
bool tpu_lazy_has_recipes(void);
/* For users of memory outside a trace (a Strict call, a copy, a realize):
 * queues now, on stream s (NULL: the device's default stream), the recipes
 * that must come before `call` (as tpu_lazy_recipes_for finds them), each
 * appended to its device's trace, which is then flushed; their values get
 * memory. *out_ran (may be NULL): whether any ran. INTERNAL when called from
 * a flush of that trace. */
tpu_status_t tpu_trace_run_recipes_for(tpu_call_t* call, tpu_stream_t* s,
                                       bool* out_ran) TPU_MUST_USE;
/* Takes slot id's recipe for the trace (NULL when it has none); the slot is
 * recomputed from now on (it will not get another recipe). The caller
 * appends a resolved copy of the node, then calls tpu_lazy_unpin_inputs on
 * the recipe itself (which names the pinned placeholders). */
tpu_call_t* tpu_lazy_take_recipe(int id);
/* Ends the pins a taken recipe held on its inputs; an input the host dropped
 * and no trace names is released. */
void tpu_lazy_unpin_inputs(tpu_call_t* recipe);

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
