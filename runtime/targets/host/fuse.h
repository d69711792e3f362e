/* The host target's fusion planner, code generator and executor (fuse_*.c),
 * called by the host target's graph entries (target.c). */
#ifndef TPU_TARGETS_HOST_FUSE_H_
#define TPU_TARGETS_HOST_FUSE_H_

#include "exec/graph.h"
#include "tpu/target.h"

typedef struct tpu_fusion_plan tpu_fusion_plan_t;

/* Chooses fused groups over g's nodes; *out_plan may be NULL (nothing to
 * fuse: every node runs its library kernel). Owned by the caller. */
tpu_status_t tpu_fusion_plan(tpu_graph_t* g, tpu_fusion_plan_t** out_plan) TPU_MUST_USE;
/* True when the buffer starting at `base` is only an intermediate inside
 * fused kernels (it needs no memory). */
bool tpu_fusion_plan_is_internal(const tpu_fusion_plan_t* p, const void* base);
void tpu_fusion_plan_info(const tpu_fusion_plan_t* p, tpu_target_graph_info_t* out_info);
/* The node at which node's work runs: its fused group's trigger, else the
 * node itself (row groups run at their last node). */
int tpu_fusion_plan_run_position(const tpu_fusion_plan_t* p, int node);
void tpu_fusion_plan_free(tpu_fusion_plan_t* p);
/* Runs the plan's fused kernels and g's other nodes in order (p may be NULL). */
tpu_status_t tpu_fusion_plan_run(const tpu_fusion_plan_t* p, const tpu_graph_t* g,
                                 const char** failed_op);
/* Waits until background compilations finish; the next one-time warning
 * about fusion, or NULL. */
void tpu_fusion_wait_compiles(void);
const char* tpu_fusion_pop_warning(void);

#endif
