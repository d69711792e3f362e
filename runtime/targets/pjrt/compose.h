/* The pjrt target's programs: a graph (one Strict call, or a flushed
 * DeferAndFuse trace) as a StableHLO module over storage buffers.
 *
 *   func.func private @graph(views read...) -> (values written...)
 *       the lowering layer's function (tpu_graph_print_func)
 *   func.func @main(%s0: tensor<E0xT0>, ..., %h0: tensor<f32>, ...)
 *       -> (tensor<E0xT0>, ...)
 *       reads each view out of its storage (slice, bitcast_convert, pad,
 *       reshape, slice, transpose, broadcast), calls @graph, writes each
 *       value back into its storage (dynamic_update_slice) and returns the
 *       storages' next contents
 *
 * A storage is a 1-D buffer of its element type (bytes until a program
 * first uses it, which leaves it typed: compose.c, store_t).
 *
 * Host values (0-d CPU tensors a call passes by address, and the floating
 * numbers the lowering uses as values: tpu_graph_print_opts_t.lift_numbers)
 * are arguments of their own type; the numbers it holds as constants instead
 * are listed (baked). A storage that is written but never read and holds
 * nothing yet starts from zeros instead of being an argument. */
#ifndef TPU_TARGETS_PJRT_COMPOSE_H_
#define TPU_TARGETS_PJRT_COMPOSE_H_

#include <stdint.h>

#include "exec/graph.h"

typedef struct pj_arg {
  bool host;          /* a host value (else a storage) */
  uintptr_t base;     /* storage: its block's base */
  size_t bytes;       /* storage: block bytes; host: element bytes */
  const void* data;   /* host: the value */
  tpu_dtype_t dtype;  /* host: its dtype */
} pj_arg_t;

/* a number a program holds as a constant: where the call keeps it */
typedef struct pj_baked {
  const void* data;
  size_t bytes; /* at most 16 */
} pj_baked_t;

/* A device-side check of the program (tpu_graph_print_opts_t.on_check) of
 * node `node`: a tpu_check_kind_t; for an index, along `dim` (-1: flat) of
 * `size`. */
typedef struct pj_check {
  int node, kind, dim;
  int64_t size;
} pj_check_t;

typedef struct pj_program {
  char* text; /* the module (MLIR text), NUL-terminated */
  size_t len;
  pj_arg_t* args; /* execution arguments in order */
  int nargs;
  uintptr_t* outs; /* the storage (block base) each result replaces, in order */
  int* out_arg;    /* per result: -1, or the argument whose buffer it replaces only
                      while that is still the storage's (a storage the program
                      only read, left typed: nothing another writer did is lost) */
  int nouts;
  int* out_donor; /* per result: -1, or the argument (the same storage) whose buffer
                     the program may reuse for it (tf.aliasing_output) */
  pj_baked_t* baked; /* the numbers whose values the text holds */
  int nbaked;
  /* when nchecks > 0 the executable has one more result after the nouts
   * storages: a tensor<i32>, 0 or 1 + the check that failed */
  pj_check_t* checks;
  int nchecks;
} pj_program_t;

/* Composes g's module. UNIMPLEMENTED naming the op when a node has no
 * lowering (the printer's custom_call fallback); INVALID_ARGUMENT for a
 * view the composition cannot express. */
tpu_status_t pj_compose(const tpu_graph_t* g, pj_program_t* out) TPU_MUST_USE;
void pj_program_free(pj_program_t* p);

#endif
