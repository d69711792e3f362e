/* Graph execution, graph dumps, verification and the repeated-sequence
 * detector (see graph.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/env.h"
#include "device/internal.h"
#include "exec/graph.h"

/* ---- the target's executable ---- */
/* No target, or a graph nobody prepared: the nodes run one by one. */
tpu_status_t tpu_graph_prepare(tpu_graph_t* g) {
  g->exe = NULL;
  const tpu_target_t* t = tpu_target_get();
  if (!t) return TPU_ERR(INTERNAL, "graph: no target is registered (tpu_target_set)");
  return t->iface->graph_prepare(t->ctx, g, &g->exe);
}

void tpu_graph_release_exe(tpu_graph_t* g) {
  const tpu_target_t* t = tpu_target_get();
  if (g->exe && t) t->iface->graph_release(t->ctx, g->exe);
  g->exe = NULL;
}

bool tpu_graph_is_internal(const tpu_graph_t* g, const void* base) {
  const tpu_target_t* t = tpu_target_get();
  return t && t->iface->graph_buffer_is_internal &&
         t->iface->graph_buffer_is_internal(t->ctx, g->exe, base);
}

int tpu_graph_run_position(const tpu_graph_t* g, int node) {
  const tpu_target_t* t = tpu_target_get();
  return t && t->iface->graph_run_position ? t->iface->graph_run_position(t->ctx, g->exe, node)
                                           : node;
}

void tpu_graph_info(const tpu_graph_t* g, tpu_target_graph_info_t* out) {
  memset(out, 0, sizeof *out);
  const tpu_target_t* t = tpu_target_get();
  if (t && t->iface->graph_info) t->iface->graph_info(t->ctx, g->exe, out);
}

/* ---- execution ---- */
typedef struct {
  tpu_graph_t g;
} graph_work_t;

static void graph_free(void* ctx) {
  graph_work_t* w = ctx;
  for (int i = 0; i < w->g.n; i++) free(w->g.nodes[i]);
  free(w->g.nodes);
  free(w->g.visible);
  tpu_graph_release_exe(&w->g);
  free(w);
}

static tpu_status_t graph_run(void* ctx) {
  graph_work_t* w = ctx;
  const char* failed = NULL;
  const tpu_target_t* t = tpu_target_get();
  tpu_status_t st = t->iface->graph_run(t->ctx, w->g.exe, &w->g, &failed);
  if (st) {
    char prefix[160];
    snprintf(prefix, sizeof prefix, "aten::%s (in a DeferAndFuse graph)", failed ? failed : "?");
    return tpu_status_annotate(st, prefix);
  }
  return TPU_OK;
}

static pthread_mutex_t g_dump_mu = PTHREAD_MUTEX_INITIALIZER;
static char* g_dump_dir;
static int g_dump_seq;
static _Atomic bool g_dumping; /* g_dump_dir != NULL, read without the lock */

tpu_status_t tpu_graph_enqueue(tpu_graph_t* g, tpu_stream_t* s) {
  pthread_mutex_lock(&g_dump_mu);
  if (g_dump_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/graph_%05d.stablehlo.mlir", g_dump_dir, g_dump_seq++);
    FILE* f = fopen(path, "w");
    if (f) {
      tpu_graph_print(g, f);
      fclose(f);
    }
  }
  pthread_mutex_unlock(&g_dump_mu);
  graph_work_t* w = malloc(sizeof *w);
  if (!w) {
    for (int i = 0; i < g->n; i++) free(g->nodes[i]);
    free(g->nodes);
    free(g->visible);
    tpu_graph_release_exe(g);
    return TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory queueing a graph");
  }
  w->g = *g;
  g->nodes = NULL;
  g->exe = NULL;
  g->visible = NULL;
  return tpu_stream_enqueue_raw(s, "graph", graph_run, w, graph_free);
}

bool tpu_graph_dumping(void) { return atomic_load(&g_dumping); }

tpu_status_t tpu_trace_set_dump_dir(const char* dir) {
  char* copy = NULL;
  if (dir && *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      return TPU_ERR(INVALID_ARGUMENT, "dump_graphs: cannot create directory '%s'", dir);
    copy = strdup(dir);
  }
  pthread_mutex_lock(&g_dump_mu);
  free(g_dump_dir);
  g_dump_dir = copy;
  atomic_store(&g_dumping, copy != NULL);
  pthread_mutex_unlock(&g_dump_mu);
  return TPU_OK;
}

void tpu_graph_init_dump_from_env(void) {
  const char* d = tpu_env_str("TORCH_TPU_DUMP_GRAPHS");
  if (d) tpu_status_free(tpu_trace_set_dump_dir(d));
}

/* ---- verifier ---- */
tpu_status_t tpu_graph_verify(const tpu_graph_t* g) {
  for (int i = 0; i < g->n; i++) {
    const tpu_call_t* c = g->nodes[i];
    if (!c->op || !c->op->fn || tpu_op_lookup(c->op->name) != c->op)
      return TPU_ERR(INTERNAL, "graph verify: node %d has no registered op", i);
    if (c->nargs < 0 || c->nouts < 0 || (c->nargs && !c->args) || (c->nouts && !c->outs))
      return TPU_ERR(INTERNAL, "graph verify: node %d (%s) has malformed arguments", i, c->op->name);
    for (int a = 0; a < c->nargs; a++) {
      const tpu_arg_t* x = &c->args[a];
      if (x->kind < TPU_ARG_NONE || x->kind > TPU_ARG_COMPLEX)
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has kind %d", c->op->name, a, x->kind);
      if (x->kind == TPU_ARG_TENSOR && !tpu_dtype_is_supported(x->v.t->dtype))
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has dtype %d", c->op->name, a,
                       x->v.t->dtype);
      if (x->kind == TPU_ARG_TENSOR && (x->v.t->ndim < 0 || x->v.t->ndim > TPU_MAX_DIMS))
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has %d dims", c->op->name, a,
                       x->v.t->ndim);
    }
    for (int o = 0; o < c->nouts; o++) {
      const tpu_tensor_t* t = &c->outs[o];
      if (t->dtype == TPU_DTYPE_NONE) continue;
      if (!tpu_dtype_is_supported(t->dtype) || t->ndim < 0 || t->ndim > TPU_MAX_DIMS)
        return TPU_ERR(INTERNAL, "graph verify: %s output %d is malformed", c->op->name, o);
      for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] < 0)
          return TPU_ERR(INTERNAL, "graph verify: %s output %d has size %" PRId64, c->op->name, o,
                         t->sizes[d]);
      if (tpu_tensor_numel(t) && !t->data)
        return TPU_ERR(INTERNAL, "graph verify: %s output %d has no buffer", c->op->name, o);
    }
  }
  return TPU_OK;
}

/* ---- repeated sequences ---- */
/* An overload's key: its op is unique in the op table (tpu_op_lookup interns
 * every overload), so its address names it; no string is hashed per op. */
static uint32_t op_key(const tpu_op_t* op) {
  uint64_t x = (uint64_t)(uintptr_t)op;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  const uint32_t h = (uint32_t)x ^ (uint32_t)(x >> 32);
  return h ? h : 1;
}

enum { REPEAT_MIN = 4, REPEAT_MAX = 1024 }; /* block length in ops */

/* A block is a layer, not a run of one op over a list (foreach segments,
 * which the fusion planner wants whole): it needs `k` different ops. */
static bool distinct_at_least(const uint32_t* h, int n, int k) {
  uint32_t seen[8];
  int m = 0;
  for (int i = 0; i < n && m < k; i++) {
    bool dup = false;
    for (int j = 0; j < m && !dup; j++) dup = seen[j] == h[i];
    if (!dup) seen[m++] = h[i];
  }
  return m >= k;
}

bool tpu_repeat_observe(tpu_repeat_t* r, const tpu_op_t* op) {
  if (r->n >= TPU_REPEAT_HIST / 2) return false; /* the upper half keeps the block */
  r->hist[r->n++] = op_key(op);
  const int n = r->n;
  if (r->period) { /* a known block: cut when one more has been traced */
    if (n == r->period) {
      /* same ops as the remembered block? (hist was reset at the cut) */
      return memcmp(r->hist, r->hist + TPU_REPEAT_HIST / 2, sizeof(uint32_t) * (size_t)n) == 0;
    }
    if (n > r->period && n >= 2 * REPEAT_MIN) r->period = 0; /* the pattern broke: search again */
    else return false;
  }
  /* the last p ops equal the p before them */
  for (int p = REPEAT_MIN; 2 * p <= n && p <= REPEAT_MAX && p <= TPU_REPEAT_HIST / 2; p++) {
    if (r->hist[n - 1] != r->hist[n - 1 - p]) continue;
    if (memcmp(r->hist + n - p, r->hist + n - 2 * p, sizeof(uint32_t) * (size_t)p) == 0 &&
        distinct_at_least(r->hist + n - p, p, 3)) {
      r->period = p;
      memcpy(r->hist + TPU_REPEAT_HIST / 2, r->hist + n - p, sizeof(uint32_t) * (size_t)p);
      return true;
    }
  }
  return false;
}

void tpu_repeat_reset_window(tpu_repeat_t* r) { r->n = 0; }
