/* Fusion planning and fused execution for the host target. */
#include <stdlib.h>

#include "exec/graph.h"

struct tpu_fusion_plan {
  int64_t fused_nodes;
};

tpu_status_t tpu_graph_plan(tpu_graph_t* g) {
  g->plan = NULL;
  return TPU_OK;
}

bool tpu_graph_is_internal(const tpu_graph_t* g, const void* base) { return false; }

int64_t tpu_graph_fused_nodes(const tpu_graph_t* g) { return g->plan ? g->plan->fused_nodes : 0; }

void tpu_fusion_plan_free(tpu_fusion_plan_t* p) { free(p); }

tpu_status_t tpu_fusion_plan_run(const tpu_graph_t* g, const char** failed_op) {
  tpu_status_t first = TPU_OK;
  for (int i = 0; i < g->n; i++) {
    tpu_status_t st = tpu_call_run(g->nodes[i]);
    if (st && !first) {
      first = st;
      *failed_op = g->nodes[i]->op->name;
    } else {
      tpu_status_free(st);
    }
  }
  return first;
}
