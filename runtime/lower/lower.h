/* The lowering layer: each ATen op with a StableHLO mapping, found by op id.
 *
 * The graph printer (tpu_graph_print, exec/graph.h) lowers each node through
 * these tables; an op without an entry becomes stablehlo.custom_call
 * @aten.<overload>. The entries are kept per op family (runtime/lower/:
 * elementwise.c, shape.c, matmul.c, reduce.c, nn.c, index.c, linalg.c,
 * special.c, random.c, fft.c), each table sorted by name. */
#ifndef TPU_LOWER_LOWER_H
#define TPU_LOWER_LOWER_H

#include <stdbool.h>
#include <stddef.h>

#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether an ATen op has a lowering, by its overload name ("add.Tensor",
 * "sum.dim_IntList", "add_.Tensor") or its base name ("mm"): the entry is
 * found by the base name, without the overload and the in-place underscore,
 * as the printer looks it up. A lowering can still decline one call (a dtype
 * or arity it does not map) and leave it to the custom_call fallback; this
 * answers whether one exists. NULL answers false. */
bool tpu_lower_supports(const char* aten_name);

/* Whether an ATen op (overload or base name) is one of the random ops that
 * lower/random.c lowers: the target flags it TPU_OP_RANDOM so that its call
 * carries a seed and an offset (base/philox.h). NULL answers false. */
bool tpu_lower_is_random(const char* aten_name);

/* Whether the printer reads CPU scalar t (a wrapped Python number, a 0-d CPU
 * tensor) as a parameter when it lifts numbers (tpu_graph_print_opts_t.
 * lift_numbers): the floating ones; the others are constants of the program. */
bool tpu_lower_lifts_scalar(const tpu_tensor_t* t);

/* Whether one program of graph g gives what its nodes give in turn: false when
 * a node reads or writes memory that an earlier node of g wrote through
 * another view, in a way the printer's value model does not carry (the ranges
 * overlap without one view lying inside the other, or a strided write spans an
 * earlier write's range); the target then runs g node by node. */
struct tpu_graph;
bool tpu_lower_graph_is_exact(const struct tpu_graph* g);

/* The StableHLO element type of a dtype ("f32", "bf16", "ui8", "i1"),
 * "none" for one without. */
const char* tpu_lower_elt_type(tpu_dtype_t dt);

/* The number of lowered base names, and name i of them (0 <= i < count) in
 * strcmp order; NULL for i out of range. The strings are static. */
size_t tpu_lower_count(void);
const char* tpu_lower_name(size_t i);

/* Checks the tables: each sorted by strcmp, every name in one entry only, and
 * every name an op family with an id (tpu/op_ids.def; a new family needs
 * `make opids`). Returns 0 when they are, else the position (from 1) of the
 * first entry that is not, in its table or in the merged list, and writes its
 * name to *out_name when given. */
int tpu_lower_check(const char** out_name);

#ifdef __cplusplus
}
#endif

#endif
