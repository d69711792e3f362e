/* A flushed trace as a graph: its kept nodes in program order, the fusion
 * plan of the host target, execution on a stream, the StableHLO printer,
 * and the repeated-sequence detector. */
#ifndef TPU_EXEC_GRAPH_H_
#define TPU_EXEC_GRAPH_H_

#include "exec/internal.h"

typedef struct tpu_fusion_plan tpu_fusion_plan_t;

typedef struct tpu_graph {
  tpu_call_t** nodes; /* owned; pointers still placeholders until patched */
  int n;
  int device;
  tpu_fusion_plan_t* plan; /* NULL: every node runs its library kernel */
  uint32_t* visible; /* per node, bit o: output o outlives the graph (live
                        buffer or memory from before it); NULL: all (owned) */
} tpu_graph_t;

/* Chooses fused groups (targets/host/fuse.c); may leave g->plan NULL. */
tpu_status_t tpu_graph_plan(tpu_graph_t* g) TPU_MUST_USE;
/* True when the buffer starting at `base` is only an intermediate inside
 * fused kernels (it needs no memory). */
bool tpu_graph_is_internal(const tpu_graph_t* g, const void* base);
int64_t tpu_graph_fused_nodes(const tpu_graph_t* g);
/* Fused groups built around a row reduction (softmax, layer norm). */
int64_t tpu_graph_reduction_groups(const tpu_graph_t* g);
/* Fused groups of a matmul (mm/addmm) with an elementwise epilogue. */
int64_t tpu_graph_epilogue_groups(const tpu_graph_t* g);
/* The node at which node's work runs: its fused group's trigger, else
 * the node itself (row groups run at their last node). */
int tpu_graph_run_position(const tpu_graph_t* g, int node);
/* Queues the graph on s as one unit of work; takes the nodes and plan. */
tpu_status_t tpu_graph_enqueue(tpu_graph_t* g, tpu_stream_t* s) TPU_MUST_USE;
void tpu_fusion_plan_free(tpu_fusion_plan_t* p);
/* Runs the plan's fused kernels and library nodes in order. */
tpu_status_t tpu_fusion_plan_run(const tpu_graph_t* g, const char** failed_op);

/* Printer (stablehlo.c): the graph as a StableHLO module; parameters are the
 * memory it reads that no node wrote, results the values it leaves in
 * visible memory. */
void tpu_graph_print(const tpu_graph_t* g, FILE* f);
/* Structural checks: known ops, argument kinds, outputs that alias no
 * input they are not meant to, dtypes supported. */
tpu_status_t tpu_graph_verify(const tpu_graph_t* g) TPU_MUST_USE;
void tpu_graph_init_dump_from_env(void);
/* True while graphs are dumped (the flush then records tpu_graph_t.visible). */
bool tpu_graph_dumping(void);

/* Repeated op sequences: the detector watches op names; when the last W ops
 * equal the W before them (a repeating block such as a transformer layer)
 * it asks for a flush at the boundary, so one executable serves every
 * repetition. */
#define TPU_REPEAT_HIST 4096
typedef struct tpu_repeat {
  uint32_t hist[TPU_REPEAT_HIST]; /* op name hashes since the last flush */
  int n;
  int period; /* detected block length, 0 if none */
} tpu_repeat_t;
bool tpu_repeat_observe(tpu_repeat_t* r, const char* op);
void tpu_repeat_reset_window(tpu_repeat_t* r);

#endif
