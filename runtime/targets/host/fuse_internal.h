/* Private to the host target's fusion, shared by its four files:
 *   fuse_plan.c     which calls fuse, into which groups (the planner)
 *   fuse_codegen.c  a group's buffers, signature and generated C source
 *   fuse_compile.c  the generated source to a loaded kernel (compiler
 *                   driver, on-disk cache, background compiles, memo)
 *   fuse_run.c      a plan's groups and other nodes, in order (executor)
 * The public interface is fuse.h.
 *
 * One cut is not clean: a group's buffer analysis (roles, internal
 * buffers, signature) and its source emission are a single walk over its
 * nodes, each node's operand names coming from the buffers' state at that
 * node, and the planner runs that walk first without emitting (the
 * signature finds a memoized kernel) and then with it. The walk,
 * build_group and build_row_group, stays whole in fuse_codegen.c; the
 * planner calls it through fuse_build_group. */

/* Fusion for the host target: chains of float32 elementwise nodes become one
 * generated C kernel; so do row reductions (softmax, log_softmax, layer norm
 * over the last dim, and their backward passes) with their elementwise
 * prologue and epilogue ("row groups", fuse_plan.c), and mm/addmm run block
 * by block with the generated kernel of their elementwise epilogue ("matmul
 * epilogues", fuse_plan.c).
 * Row groups are planned first, then foreach blocks, epilogues and plain
 * chains over the nodes left. TORCH_TPU_FUSE_REDUCTIONS=0 /
 * TORCH_TPU_FUSE_EPILOGUES=0 turn the two new kinds off.
 *
 * Planning walks the graph's nodes in order and groups consecutive fusible
 * nodes over the same number of elements. A node is fusible when its op has
 * an expression in fuse_plan.c's tables, every tensor is float32 and either
 * contiguous with the output's shape or a single element, and the output is
 * contiguous. Within a group each buffer is named by its address; a buffer
 * the group writes is kept in a register for later nodes of the group and
 * stored at the end unless it is internal (a dead placeholder nobody outside
 * the group names), in which case it never gets memory.
 *
 * Code generation emits a loop over chunks of 512 elements; inside a chunk
 * each node is its own inner loop computing the node's expression (the same
 * macros as the library kernels, ew_exprs.h and vecmath.h) into an L1-sized
 * array, so a fused chain rounds exactly like the library kernels run one by
 * one (no multiply-add contraction across nodes) while its intermediates
 * never leave the cache. It compiles with the system C compiler into a shared object,
 * and loads it. Scalars (alpha, a learning rate, a CPU scalar operand) are
 * inputs of the kernel, not part of its source, so new values do not
 * recompile. Executables are looked up in the three-tier cache by a hash of
 * their source, flags, ISA and runtime version. A miss compiles in the
 * background while the group runs unfused (TORCH_TPU_ASYNC_COMPILE=0
 * compiles synchronously); without a working compiler every group runs
 * unfused, with a one-time warning. */

#ifndef TPU_TARGETS_HOST_FUSE_INTERNAL_H_
#define TPU_TARGETS_HOST_FUSE_INTERNAL_H_

#include <stdbool.h>
#include <stdint.h>

#include "exec/graph.h"
#include "targets/host/fuse.h"

/* a generated elementwise kernel: elements [begin, end) */
typedef void (*fused_fn_t)(const float* const* in, float* const* out, const float* s,
                           int64_t begin, int64_t end);

/* a generated row kernel: rows [r0, r1) of `len` elements; per[k] is
 * buffer k's period in rows; column sums (sums over rows) add rows r of
 * block r / blk into part[r / blk][column][len], in float32 (r0 and r1 are
 * block bounds); nonzero when its scratch rows could not be allocated */
typedef int (*rows_fn_t)(const void* const* in, void* const* out, const float* s, int64_t r0,
                         int64_t r1, int64_t len, const int64_t* per, int64_t blk, float* part);

/* a fusible op: a row of the element-wise inventory (tpu/ew_ops.def, as
 * fuse_plan.c reads it) */
typedef struct {
  const char* name; /* the inventory row */
  const char* expr; /* over a, b, c (tensor or number operands) and s0, s1 (scalars) */
  int8_t t[3];      /* argument index of a, b, c (-1: none) */
  int8_t s[2];      /* argument index of s0, s1 (-1: none) */
  float sdef[2];    /* defaults when the argument is absent */
} fop_t;

/* ---- the plan ---- */
enum { IN_FULL, IN_DEVSCALAR, IN_HOSTSCALAR };

typedef struct {
  const void* addr; /* buffer identity (placeholder or real address at plan time) */
  tpu_tensor_t* t;  /* a descriptor naming it (patched in place before running) */
  int kind;
  int var;      /* register holding its current value in the group, -1 if none */
  bool loaded;  /* read from memory in the group */
  bool written; /* written by the group */
  bool internal;
  int in_slot, out_slot;
  /* row groups: rows in the buffer's period (row r reads row r % per);
   * bool: a mask operand; rowstat: one value per row (layer norm's mean
   * and rstd), held in scalar u<var> when the group writes it, else read
   * as p<k>[r]; col >= 0: a column sum, partial `col` of each block */
  int64_t per;
  bool is_bool, rowstat;
  int col;
} gbuf_t;

typedef struct {
  int* nodes;      /* member nodes in program order */
  int nnodes;
  int trigger;     /* the group runs when execution reaches this node */
  int64_t n;       /* elements */
  uint64_t sig;    /* structure: ops, buffer roles, internal buffers */
  gbuf_t* bufs;
  int nbufs;
  float* scalars;
  int nscalars;
  char* src; /* generated source (until compiled) */
  fused_fn_t fn;
  int nin, nout;
  /* G_ROWS: rows x len, each row computed through all nodes at once;
   * ncols column sums (in blocks of rows, tpu_fr_col_block) */
  int kind;
  int64_t rows, len;
  int ncols;
  /* G_MM: the mm/addmm node whose output the chain reads; its output
   * buffer's entry, and whether that output needs no memory (then each
   * row block of the product goes to a scratch block) */
  tpu_call_t* mm;
  int mm_buf;
} group_t;

enum { G_FLAT = 0, G_ROWS, G_MM };

struct tpu_fusion_plan {
  group_t* groups; /* in trigger order */
  int ngroups;
  int64_t fused_nodes;
  int64_t reduction_groups, epilogue_groups;
  bool* fused; /* per node: it runs inside a group */
  int* runpos; /* per node: where its work runs (its group's trigger) */
};

/* reductions a row group takes: over each row (softmax, log_softmax, layer
 * norm and their backward passes; layer norm's backward also sums its weight
 * and bias gradients over the rows: column sums) */
enum {
  RED_NONE = 0,
  RED_SOFTMAX,
  RED_LOG_SOFTMAX,
  RED_LAYER_NORM,
  RED_SOFTMAX_BWD,
  RED_LOG_SOFTMAX_BWD,
  RED_LAYER_NORM_BWD
};

/* TORCH_TPU_FUSION, TORCH_TPU_ASYNC_COMPILE, TORCH_TPU_FUSE_REDUCTIONS,
 * TORCH_TPU_FUSE_EPILOGUES and TORCH_TPU_EPILOGUE_ROWS, read once */
typedef struct {
  bool enabled, async, rows, epilogues;
  int64_t epi_rows;
} fuse_config_t;
const fuse_config_t* fuse_config(void);

static inline bool fuse_is_scalar_tensor(const tpu_tensor_t* t) {
  return tpu_tensor_numel(t) == 1;
}

/* ---- fuse_plan.c: what fuses ---- */
/* The fusible op of c, NULL if none. */
const fop_t* fuse_find_op(const tpu_call_t* c);
/* Whether schema argument `arg` of c is a number (a Scalar overload's
 * operand, add.Scalar's other): the generated kernel takes it as a scalar. */
bool fuse_operand_is_number(const tpu_call_t* c, int arg);
/* The same for the elementwise nodes of row groups, which also take masks;
 * *bool_operand: the index (0..2) of the bool operand, -1 if none. */
const fop_t* fuse_find_row_op(const tpu_call_t* c, int* bool_operand);
/* The reduction kind of c (RED_*) with its rows *R and row length *L,
 * RED_NONE if it is not one the row groups take. */
int fuse_row_reduction(const tpu_call_t* c, int64_t* R, int64_t* L);
/* Whether output k of c is computed: it has a dtype and the bool list at
 * argument mask_arg (an output_mask), if any, does not say false for it. */
bool fuse_output_wanted(const tpu_call_t* c, int mask_arg, int k);
/* Period in rows of operand t of a node whose output o has R rows of L;
 * false when t is not broadcast over o's leading dims only. */
bool fuse_operand_period(const tpu_tensor_t* t, const tpu_tensor_t* o, int64_t R, int64_t L,
                         int64_t* per);

/* ---- fuse_codegen.c ---- */
/* Builds g over its nodes (g->kind says which kind): buffers, scalars,
 * internal buffers and signature, and with `emit` the source in g->src;
 * false when the group cannot be formed or memory ran out. */
bool fuse_build_group(tpu_graph_t* gr, group_t* g, bool emit);

/* ---- fuse_compile.c ---- */
/* The kernel memoized for signature sig, NULL if none (or tier 1 lost it). */
fused_fn_t fuse_memo_get(uint64_t sig);
/* The kernel for src, memoized under sig when there is one; NULL when it
 * is not available for this run (compiling in the background, or no
 * compiler). */
fused_fn_t fuse_executable(uint64_t sig, const char* src);

#endif /* TPU_TARGETS_HOST_FUSE_INTERNAL_H_ */
