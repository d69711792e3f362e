/* The per-device trace and its flush (DeferAndFuse).
 *
 * Appending copies the call and resolves placeholders that are already
 * backed. A flush takes the trace, and in one pass over its nodes:
 *   1. liveness: which placeholders the host still holds (LIVE) and which
 *      it dropped (DEAD);
 *   2. dead-code removal, last node first: a node is kept when it writes real
 *      memory, a live placeholder, or a placeholder a kept node reads later;
 *   3. preparation by the target (tpu/target.h: graph_prepare; the host
 *      target's fusion planner makes chains of elementwise nodes one kernel),
 *      buffers only the target's kernels touch never get memory;
 *   4. backing in node order: live placeholders get device memory at their
 *      first use (turning their reservation into memory); dead ones a kept
 *      node still needs get graph-scoped temporaries, allocated and freed in
 *      node order so that temporaries with disjoint lifetimes share blocks;
 *   5. the graph is queued on the stream as one unit of work.
 * A flush that fails before step 5 (out of memory) runs nothing and loses
 * nothing: the kept nodes go back into the trace and what it backed is
 * released, so the same flush succeeds once memory has been freed.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "device/internal.h"
#include "exec/graph.h"
#include "exec/internal.h"

/* Ownership: one trace per device, shared by every thread that traces on it.
 * `mu` is held across a whole append and a whole flush (planning, backing,
 * queueing, releasing dead placeholders and deferred frees), so program
 * order is the order of appends, a flush by any thread takes everything
 * traced before it (also other threads' ops on shared tensors), and the
 * placeholders' in_trace flags and the allocator's deferred frees always
 * belong to the one trace that is pending. `length` stays non-zero until the
 * flushed graph is queued: frees of memory the graph names are deferred. A
 * flush re-entered on the flushing thread (the allocator drains the device
 * when memory runs short) has nothing to do and returns at once. */
typedef struct {
  pthread_mutex_t mu;
  tpu_call_t** nodes;
  int n, cap;
  tpu_stream_t* stream;
  _Atomic int length;
  _Atomic uint64_t epoch;
  _Atomic bool held;
  pthread_t owner; /* valid while held */
  tpu_repeat_t repeat;
} trace_t;

#define MAX_TRACE_DEVICES 64
static trace_t g_traces[MAX_TRACE_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_max_nodes;
static bool g_repeat_on;
static bool g_recompute_on;
static _Atomic int g_whole_graph; /* > 0: a compiled graph is being traced: no cuts */

void tpu_trace_set_whole_graph(bool on) { atomic_fetch_add(&g_whole_graph, on ? 1 : -1); }

static struct {
  _Atomic int64_t flushes, nodes, dropped, fused, temps, temp_bytes, elided, repeat_cuts,
      reduction_groups, epilogue_groups, recipes, recipe_bytes, recomputed;
} g_stats;

static void traces_init(void) {
  for (int i = 0; i < MAX_TRACE_DEVICES; i++) pthread_mutex_init(&g_traces[i].mu, NULL);
  g_max_nodes = (int)tpu_env_int("TORCH_TPU_DEFER_MAX_NODES", 2048);
  if (g_max_nodes < 1) g_max_nodes = 1;
  g_repeat_on = tpu_env_int("TORCH_TPU_DEFER_REPEAT", 1) != 0;
  g_recompute_on = tpu_env_int("TORCH_TPU_DEFER_RECOMPUTE", 1) != 0;
  tpu_graph_init_dump_from_env();
  tpu_exec_register_hooks();
}

static trace_t* trace_of(int device) {
  pthread_once(&g_once, traces_init);
  return device >= 0 && device < MAX_TRACE_DEVICES ? &g_traces[device] : NULL;
}

int tpu_trace_length(int device) {
  trace_t* t = trace_of(device);
  return t ? atomic_load(&t->length) : 0;
}

uint64_t tpu_trace_epoch(int device) {
  trace_t* t = trace_of(device);
  return t ? atomic_load(&t->epoch) : 0;
}

static void mark_in_trace(void* ctx, tpu_tensor_t* t, bool write) {
  int id = tpu_lazy_slot_of(t->data);
  if (id >= 0) tpu_lazy_slot(id)->in_trace = true;
}

static bool held_by_me(trace_t* tr) {
  return atomic_load(&tr->held) && pthread_equal(tr->owner, pthread_self());
}

static void trace_lock(trace_t* tr) {
  pthread_mutex_lock(&tr->mu);
  tr->owner = pthread_self();
  atomic_store(&tr->held, true);
}

static void trace_unlock(trace_t* tr) {
  atomic_store(&tr->held, false);
  pthread_mutex_unlock(&tr->mu);
}

static tpu_status_t flush_locked(trace_t* tr, int device);

/* Appends node c (taken) to the held trace, for stream s. */
static tpu_status_t push_node(trace_t* tr, tpu_stream_t* s, tpu_call_t* c) {
  if (tr->n == tr->cap) {
    int cap = tr->cap ? 2 * tr->cap : 256;
    tpu_call_t** nodes = realloc(tr->nodes, sizeof(*nodes) * (size_t)cap);
    if (!nodes)
      return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory tracing the op", c->op->name);
    tr->nodes = nodes;
    tr->cap = cap;
  }
  tpu_lazy_lock();
  tpu_call_visit_tensors(c, mark_in_trace, NULL);
  tpu_lazy_unlock();
  tr->nodes[tr->n++] = c;
  tr->stream = s;
  atomic_store(&tr->length, tr->n);
  return TPU_OK;
}

/* ---- recomputation (see tpu_lazy_set_recipe) ---- */
#define RECIPE_BATCH 64

typedef struct {
  int ids[RECIPE_BATCH];
  int n;
} recipe_ids_t;

static void collect_recipes(void* ctx, tpu_tensor_t* t, bool write) {
  recipe_ids_t* r = ctx;
  int got[RECIPE_BATCH];
  const int k = tpu_lazy_recipes_for(t, write, got, RECIPE_BATCH);
  for (int i = 0; i < k; i++) {
    bool dup = false;
    for (int j = 0; j < r->n && !dup; j++) dup = r->ids[j] == got[i];
    if (!dup && r->n < RECIPE_BATCH) r->ids[r->n++] = got[i];
  }
}

/* Appends slot id's recipe, if it still has one, to the held trace: the node
 * computes the value again; the inputs' pins end once the trace names them
 * (a dropped input's memory is then freed behind the trace). */
static tpu_status_t push_recipe(trace_t* tr, tpu_stream_t* s, int id) {
  tpu_call_t* r = tpu_lazy_take_recipe(id);
  if (!r) return TPU_OK;
  tpu_call_t* node = tpu_call_clone(r); /* resolved; r keeps the pinned placeholders */
  tpu_status_t st = node ? tpu_call_resolve_lazy(node, false)
                         : TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory");
  if (!st) st = push_node(tr, s, node);
  else free(node);
  tpu_lazy_unpin_inputs(r);
  free(r);
  if (st) /* the value is lost: nothing can compute it any more */
    return tpu_status_annotate(st, "recomputing a value left without memory");
  atomic_fetch_add(&g_stats.recomputed, 1);
  return TPU_OK;
}

/* Before node c joins the held trace: the recipes of the values it reads
 * and of those computed from memory it writes run first. */
static tpu_status_t append_recipes_for(trace_t* tr, tpu_stream_t* s, tpu_call_t* c) {
  if (!tpu_lazy_has_recipes()) return TPU_OK;
  for (;;) { /* in batches: a pushed recipe leaves the list */
    recipe_ids_t r = {.n = 0};
    tpu_call_visit_tensors(c, collect_recipes, &r);
    if (!r.n) return TPU_OK;
    for (int i = 0; i < r.n; i++) TPU_RETURN_IF_ERROR(push_recipe(tr, s, r.ids[i]));
  }
}

/* Runs the recipes ids[0..n) now: per device, appended to its trace, which
 * is then flushed on stream s (NULL or another device's: the default one). */
static tpu_status_t run_recipes(const int* ids, int n, tpu_stream_t* s) {
  bool done[RECIPE_BATCH] = {false};
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    tpu_lazy_lock();
    const int device = tpu_lazy_slot(ids[i])->device;
    tpu_lazy_unlock();
    trace_t* tr = trace_of(device);
    if (!tr) continue;
    if (held_by_me(tr))
      return TPU_ERR(INTERNAL, "a value left without memory is needed while its trace flushes");
    tpu_stream_t* on = s && tpu_stream_device(s) == device ? s : tpu_stream_get(device, 0);
    trace_lock(tr);
    tpu_status_t st = tr->n && tr->stream != on ? flush_locked(tr, device) : TPU_OK;
    for (int j = i; j < n && !st; j++) {
      tpu_lazy_lock();
      const bool same = tpu_lazy_slot(ids[j])->device == device;
      tpu_lazy_unlock();
      if (same && !done[j]) {
        done[j] = true;
        st = push_recipe(tr, on, ids[j]);
      }
    }
    if (!st) st = flush_locked(tr, device);
    trace_unlock(tr);
    TPU_RETURN_IF_ERROR(st);
  }
  return TPU_OK;
}

tpu_status_t tpu_trace_run_recipes_for(tpu_call_t* call, tpu_stream_t* s, bool* out_ran) {
  if (out_ran) *out_ran = false;
  while (tpu_lazy_has_recipes()) { /* in batches: a run recipe leaves the list */
    recipe_ids_t r = {.n = 0};
    tpu_call_visit_tensors(call, collect_recipes, &r);
    if (!r.n) break;
    if (out_ran) *out_ran = true;
    TPU_RETURN_IF_ERROR(run_recipes(r.ids, r.n, s));
  }
  return TPU_OK;
}

tpu_status_t tpu_trace_append(tpu_stream_t* s, const tpu_call_t* call) {
  const int device = tpu_stream_device(s);
  trace_t* tr = trace_of(device);
  if (!tr) return TPU_ERR(INVALID_ARGUMENT, "trace: no device %d", device);
  if (held_by_me(tr)) return TPU_ERR(INTERNAL, "%s: traced while its device's trace is flushing",
                                     call->op->name);
  tpu_call_t* c = tpu_call_clone(call);
  if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory tracing the op", call->op->name);
  trace_lock(tr);
  tpu_status_t st = TPU_OK;
  if (tr->n && tr->stream != s) st = flush_locked(tr, device); /* one stream per graph */
  if (!st) st = tpu_call_resolve_lazy(c, false);
  if (!st) st = append_recipes_for(tr, s, c);
  if (!st) st = push_node(tr, s, c);
  if (st) {
    trace_unlock(tr);
    free(c);
    return st;
  }
  const bool whole = atomic_load(&g_whole_graph) > 0;
  const bool cut = !whole && g_repeat_on && tpu_repeat_observe(&tr->repeat, c->op);
  const bool full = !whole && tr->n >= g_max_nodes;
  atomic_fetch_add(&g_stats.nodes, 1);
  if (cut) atomic_fetch_add(&g_stats.repeat_cuts, 1);
  if (cut || full) st = flush_locked(tr, device);
  trace_unlock(tr);
  return st;
}

/* ---- flush ---- */
typedef struct {
  int slot;
  int first, last; /* kept nodes that name it */
  int writers, last_write; /* kept nodes that write it, the last one */
  size_t bytes;
  bool live, observed, backed, temp, freed, fused_only;
  bool realized; /* backed by this flush (undone if it fails) */
  bool no_recompute;
  tpu_call_t* recipe; /* live, but only a temporary here: recomputed when used */
  void* real;
} entry_t;

typedef struct {
  entry_t* e;
  int n, cap;
  int* index; /* slot -> entry + 1 */
} entries_t;

static int entry_of(entries_t* es, int slot) {
  int k = es->index[slot];
  if (k) return k - 1;
  if (es->n == es->cap) {
    int cap = es->cap ? 2 * es->cap : 64;
    entry_t* e = realloc(es->e, sizeof(entry_t) * (size_t)cap);
    if (!e) return -1;
    es->e = e;
    es->cap = cap;
  }
  entry_t* x = &es->e[es->n];
  memset(x, 0, sizeof *x);
  x->slot = slot;
  x->first = x->last_write = -1;
  es->index[slot] = ++es->n;
  return es->n - 1;
}

/* What the flush steps below share while visiting the tensors of a node. */
typedef struct {
  entries_t* es;
  int node;
  bool needed, oom;
} walk_t;

/* The collected entry of the placeholder slot t points into; NULL when t is
 * real memory. */
static entry_t* placeholder_entry(walk_t* w, const tpu_tensor_t* t) {
  int slot = tpu_lazy_slot_of(t->data);
  return slot < 0 ? NULL : &w->es->e[w->es->index[slot] - 1];
}

static void visit_nodes(tpu_call_t** nodes, int n, void (*fn)(void*, tpu_tensor_t*, bool), walk_t* w) {
  for (int i = 0; i < n; i++) {
    w->node = i;
    tpu_call_visit_tensors(nodes[i], fn, w);
  }
}

/* Collect: one entry for each placeholder slot the trace names. */
static void collect_slot(void* ctx, tpu_tensor_t* t, bool write) {
  (void)write;
  walk_t* w = ctx;
  int slot = tpu_lazy_slot_of(t->data);
  if (slot >= 0 && entry_of(w->es, slot) < 0) w->oom = true;
}

/* Needed test: a node is needed when it writes host-visible memory, a live
 * placeholder, or one a later kept node reads. */
static void test_needed(void* ctx, tpu_tensor_t* t, bool write) {
  walk_t* w = ctx;
  if (!write) return;
  int slot = tpu_lazy_slot_of(t->data);
  if (slot < 0) {
    w->needed = true; /* writes memory the host can see */
    return;
  }
  int k = w->es->index[slot] - 1;
  if (k < 0 || w->es->e[k].live || w->es->e[k].observed) w->needed = true;
}

/* Mark reads: what a kept node reads makes its writers needed. */
static void mark_read(void* ctx, tpu_tensor_t* t, bool write) {
  if (write) return;
  entry_t* e = placeholder_entry(ctx, t);
  if (e) e->observed = true;
}

/* Note uses: widen an entry's use span (first and last kept node naming it)
 * to the node w->node. Run over the kept nodes in order, then again at the
 * node where the fused group of each member runs. */
static void note_use(void* ctx, tpu_tensor_t* t, bool write) {
  (void)write;
  walk_t* w = ctx;
  entry_t* e = placeholder_entry(w, t);
  if (!e) return;
  if (e->first < 0 || w->node < e->first) e->first = w->node;
  if (w->node > e->last) e->last = w->node;
}

/* Note writes: count an entry's writers and its last writer. */
static void note_write(void* ctx, tpu_tensor_t* t, bool write) {
  walk_t* w = ctx;
  entry_t* e = write ? placeholder_entry(w, t) : NULL;
  if (!e) return;
  e->writers++;
  e->last_write = w->node;
}

/* Recomputation: a live value that one cheap elementwise node computes from
 * inputs the host keeps (which stay unchanged in this graph) is worth no
 * memory until it is used again: this flush gives it a temporary and leaves
 * the node as its recipe (tpu_lazy_set_recipe). Autograd's pre-activation
 * and activation are the case: a GELU's input and output are both saved for
 * the backward, and the output is the GELU of the input. */
#define RECOMPUTE_MIN_BYTES ((size_t)256 << 10)

static bool cheap_elementwise(const tpu_op_t* op) {
  if (op->flags & (TPU_OP_RANDOM | TPU_OP_CUSTOM)) return false;
  switch (op->id) {
    case TPU_OPID_gelu: case TPU_OPID_relu: case TPU_OPID_silu: case TPU_OPID_sigmoid:
    case TPU_OPID_tanh: case TPU_OPID_mish: case TPU_OPID_hardswish:
    case TPU_OPID_hardsigmoid: case TPU_OPID_leaky_relu: case TPU_OPID_elu:
    case TPU_OPID_softplus:
      return true;
    default:
      return false;
  }
}

typedef struct {
  walk_t* w;
  const entry_t* out;
  bool ok;
} inputs_walk_t;

/* Each input must be a placeholder the host keeps, backed after this graph,
 * written by no later node. */
static void check_recipe_input(void* ctx, tpu_tensor_t* t, bool write) {
  inputs_walk_t* iw = ctx;
  if (write || (t->flags & TPU_TENSOR_CPU_SCALAR)) return;
  const entry_t* e = placeholder_entry(iw->w, t);
  if (!e || e == iw->out || !e->live || e->recipe || e->last_write > iw->w->node) iw->ok = false;
}

static void choose_recipes(tpu_call_t** nodes, int m, walk_t* w) {
  for (int i = 0; i < m; i++) {
    tpu_call_t* c = nodes[i];
    if (c->nouts != 1 || c->mutated_args || !cheap_elementwise(c->op)) continue;
    const tpu_tensor_t* t = &c->outs[0];
    entry_t* e = placeholder_entry(w, t);
    if (!e || !e->live || e->backed || e->writers != 1 || e->no_recompute ||
        e->bytes < RECOMPUTE_MIN_BYTES || t->data != tpu_lazy_slot_base(e->slot) ||
        !tpu_tensor_is_contiguous(t) ||
        (size_t)tpu_tensor_numel(t) * tpu_dtype_size(t->dtype) != e->bytes)
      continue;
    inputs_walk_t iw = {w, e, true};
    w->node = i;
    tpu_call_visit_tensors(c, check_recipe_input, &iw);
    if (iw.ok) e->recipe = tpu_call_clone(c); /* before the addresses are patched */
  }
}

/* Patch: a placeholder address becomes the same offset in its real block. */
static void patch_address(void* ctx, tpu_tensor_t* t, bool write) {
  (void)write;
  entry_t* e = placeholder_entry(ctx, t);
  if (e && e->real) t->data = (char*)e->real + ((char*)t->data - (char*)tpu_lazy_slot_base(e->slot));
}

typedef struct {
  int node, is_free, entry;
} temp_event_t;

static int temp_event_cmp(const void* a, const void* b) {
  const temp_event_t *x = a, *y = b;
  if (x->node != y->node) return x->node < y->node ? -1 : 1;
  if (x->is_free != y->is_free) return x->is_free - y->is_free;
  return x->entry - y->entry;
}

/* Real memory the kept nodes of a flush name, as sorted disjoint
 * [begin, end) spans, built the first time a flush runs short of memory:
 * deferred frees outside them can go back to the cache at once. */
typedef struct {
  const char *begin, *end;
} span_t;

typedef struct {
  tpu_call_t** nodes;
  int m;
  span_t* v;
  int n, cap;
  bool built, oom;
} named_t;

static void note_span(void* ctx, tpu_tensor_t* t, bool write) {
  (void)write;
  named_t* nm = ctx;
  if (!t->data || tpu_is_lazy(t->data) || (t->flags & TPU_TENSOR_CPU_SCALAR)) return;
  int64_t last = 0; /* offset of the last element */
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) return;
    last += (t->sizes[d] - 1) * t->strides[d];
  }
  if (nm->n == nm->cap) {
    int cap = nm->cap ? 2 * nm->cap : 64;
    span_t* v = realloc(nm->v, sizeof(span_t) * (size_t)cap);
    if (!v) {
      nm->oom = true;
      return;
    }
    nm->v = v;
    nm->cap = cap;
  }
  const char* b = t->data;
  nm->v[nm->n++] = (span_t){b, b + (size_t)(last + 1) * tpu_dtype_size(t->dtype)};
}

static int span_cmp(const void* a, const void* b) {
  const span_t *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static bool trace_names(const void* begin, const void* end, void* ctx) {
  named_t* nm = ctx;
  if (!nm->built) {
    nm->built = true;
    for (int i = 0; i < nm->m; i++) tpu_call_visit_tensors(nm->nodes[i], note_span, nm);
    if (nm->n) qsort(nm->v, (size_t)nm->n, sizeof(span_t), span_cmp);
    int k = 0; /* merge overlapping spans */
    for (int i = 0; i < nm->n; i++) {
      if (k && nm->v[i].begin <= nm->v[k - 1].end) {
        if (nm->v[i].end > nm->v[k - 1].end) nm->v[k - 1].end = nm->v[i].end;
      } else {
        nm->v[k++] = nm->v[i];
      }
    }
    nm->n = k;
  }
  if (nm->oom) return true; /* unknown: keep it deferred */
  int lo = 0, hi = nm->n; /* first span ending after begin */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (nm->v[mid].end <= (const char*)begin) lo = mid + 1;
    else hi = mid;
  }
  return lo < nm->n && nm->v[lo].begin < (const char*)end;
}

/* After an out-of-memory error while backing: puts the deferred frees that
 * the graph does not name back into the cache. True (and *st cleared) when
 * that released anything, so the allocation is worth one more try. */
static bool release_unnamed(tpu_status_t* st, int device, named_t* nm) {
  if (tpu_status_code(*st) != TPU_CODE_RESOURCE_EXHAUSTED) return false;
  if (!tpu_device_release_deferred_unnamed(device, trace_names, nm)) return false;
  tpu_status_free(*st);
  *st = TPU_OK;
  return true;
}

tpu_status_t tpu_trace_flush(int device) {
  trace_t* tr = trace_of(device);
  if (!tr || !atomic_load(&tr->length)) return TPU_OK;
  if (held_by_me(tr)) return TPU_OK; /* re-entered from this flush: its nodes are taken */
  trace_lock(tr);
  tpu_status_t st = flush_locked(tr, device);
  trace_unlock(tr);
  return st;
}

/* Undoes a flush that failed before its graph was queued: the kept nodes go
 * back into the trace unchanged (they still name placeholders), what this
 * flush backed is unbacked again, dead placeholders and deferred frees stay
 * as they were. Nothing ran, so a later flush (after the caller freed
 * memory) computes the same values. */
static void restore_trace(trace_t* tr, tpu_call_t** nodes, int n, int cap, entries_t* es) {
  for (int k = 0; es->e && k < es->n; k++) {
    entry_t* e = &es->e[k];
    if (e->realized) tpu_lazy_unrealize(e->slot);
  }
  tr->nodes = nodes;
  tr->n = n;
  tr->cap = cap;
  atomic_store(&tr->length, n);
}

static tpu_status_t flush_locked(trace_t* tr, int device) {
  if (!tr->n) return TPU_OK;
  tpu_call_t** nodes = tr->nodes;
  const int n = tr->n, cap = tr->cap;
  tpu_stream_t* s = tr->stream;
  tr->nodes = NULL;
  tr->n = tr->cap = 0; /* length stays n until the graph is queued */
  tpu_repeat_reset_window(&tr->repeat);
  atomic_fetch_add(&g_stats.flushes, 1);

  tpu_status_t st = TPU_OK;
  entries_t es = {0};
  es.index = calloc(TPU_LAZY_SLOTS, sizeof(int));
  bool* needed = calloc((size_t)n, sizeof(bool));
  int m = n; /* nodes still held in `nodes` */
  tpu_graph_t g = {nodes, 0, device, NULL, NULL};
  if (!es.index || !needed) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "trace flush: out of host memory");
    goto failed;
  }
  walk_t w = {&es, 0, false, false};
  visit_nodes(nodes, n, collect_slot, &w);
  if (w.oom) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "trace flush: out of host memory");
    goto failed;
  }
  /* 1. liveness */
  tpu_lazy_lock();
  for (int k = 0; k < es.n; k++) {
    tpu_lazy_slot_t* sl = tpu_lazy_slot(es.e[k].slot);
    es.e[k].live = sl->state == TPU_LAZY_LIVE;
    es.e[k].backed = sl->real != NULL;
    es.e[k].bytes = sl->bytes;
    es.e[k].no_recompute = sl->no_recompute;
    if (es.e[k].backed) es.e[k].real = sl->real;
  }
  tpu_lazy_unlock();
  /* 2. dead-code removal, last node first */
  int kept = 0;
  for (int i = n - 1; i >= 0; i--) {
    w.needed = false;
    bool writes = false;
    for (int o = 0; o < nodes[i]->nouts; o++) writes |= nodes[i]->outs[o].dtype != TPU_DTYPE_NONE;
    if (!writes && !nodes[i]->mutated_args) w.needed = true; /* effects we cannot see */
    tpu_call_visit_tensors(nodes[i], test_needed, &w);
    needed[i] = w.needed;
    if (!w.needed) continue;
    kept++;
    tpu_call_visit_tensors(nodes[i], mark_read, &w);
  }
  atomic_fetch_add(&g_stats.dropped, n - kept);
  /* compact the kept nodes */
  m = 0;
  for (int i = 0; i < n; i++) {
    if (needed[i]) nodes[m++] = nodes[i];
    else free(nodes[i]);
  }
  visit_nodes(nodes, m, note_use, &w);
  /* 3. the target prepares the graph: entries only its kernels touch need
   * no memory */
  g.n = m;
  st = tpu_graph_prepare(&g);
  if (st) goto failed;
  /* a fused group runs its members' work at its trigger node: their
   * buffers must be held from there to their last use */
  for (int i = 0; i < m; i++) {
    int pos = tpu_graph_run_position(&g, i);
    if (pos == i) continue;
    w.node = pos;
    tpu_call_visit_tensors(nodes[i], note_use, &w);
  }
  for (int k = 0; k < es.n; k++) {
    entry_t* e = &es.e[k];
    if (e->first < 0) continue;
    if (!e->live && !e->backed && tpu_graph_is_internal(&g, tpu_lazy_slot_base(e->slot)))
      e->fused_only = true;
  }
  const bool dumping = tpu_graph_dumping();
  /* values to recompute when used again, not kept (the printer names values
   * by their memory, so not while printing) */
  if (g_recompute_on && !dumping && !atomic_load(&g_whole_graph)) {
    visit_nodes(nodes, m, note_write, &w);
    choose_recipes(nodes, m, &w);
  }
  /* 4. backing in node order, as eager execution would allocate: a live
   * placeholder gets its memory at its first use and keeps it; a dead one a
   * kept node needs, or a live one to recompute, gets a temporary from its
   * first to its last use. Events sorted by (node, allocation before free,
   * entry). */
  int nev = 0;
  temp_event_t* ev = malloc(sizeof(temp_event_t) * (size_t)(2 * es.n + 1));
  if (!ev && !st) st = TPU_ERR(RESOURCE_EXHAUSTED, "trace flush: out of host memory");
  for (int k = 0; k < es.n && ev; k++) {
    const entry_t* e = &es.e[k];
    if (e->first < 0 || e->backed || e->fused_only) continue;
    ev[nev++] = (temp_event_t){e->first, 0, k};
    if (!e->live || e->recipe) ev[nev++] = (temp_event_t){e->last, 1, k};
  }
  if (ev) qsort(ev, (size_t)nev, sizeof *ev, temp_event_cmp);
  named_t named = {nodes, m, NULL, 0, 0, false, false};
  for (int q = 0; q < nev && !st; q++) {
    entry_t* e = &es.e[ev[q].entry];
    if (ev[q].is_free) {
      /* graph-scoped: a later temporary of this flush may reuse the block,
       * nothing else until the graph is queued (tpu_device_free_held). Not
       * when the graph is printed: the printer names values by their
       * memory, so a reused block would read as an update of the dead
       * value; the free is deferred until the graph is queued. */
      if (dumping) tpu_device_free(device, e->real);
      else tpu_device_free_held(e->real, s);
      e->freed = true;
      continue;
    }
    if (e->live && !e->recipe) {
      st = tpu_lazy_realize_on(tpu_lazy_slot_base(e->slot), s, &e->real); /* graph's stream */
      if (st && release_unnamed(&st, device, &named))
        st = tpu_lazy_realize_on(tpu_lazy_slot_base(e->slot), s, &e->real);
      e->realized = !st;
      continue;
    }
    /* (a value to recompute keeps its reservation until the graph is queued) */
    size_t bytes = e->recipe ? e->bytes : tpu_lazy_take_dead(e->slot);
    st = tpu_device_malloc_on(s, bytes, &e->real); /* for the graph's stream */
    if (st && release_unnamed(&st, device, &named)) st = tpu_device_malloc_on(s, bytes, &e->real);
    if (!st) {
      e->temp = true;
      atomic_fetch_add(&g_stats.temps, 1);
      atomic_fetch_add(&g_stats.temp_bytes, (int64_t)bytes);
    }
  }
  free(ev);
  free(named.v);
  for (int k = 0; k < es.n; k++)
    if (es.e[k].fused_only || (es.e[k].first < 0 && !es.e[k].live)) {
      tpu_lazy_lock();
      atomic_fetch_add(&g_stats.elided, (int64_t)tpu_lazy_slot(es.e[k].slot)->bytes);
      tpu_lazy_unlock();
    }
  if (st) {
    /* a failed plan runs nothing: free what was taken */
    for (int k = 0; k < es.n; k++)
      if (es.e[k].temp && !es.e[k].freed) tpu_device_free_unused(es.e[k].real);
    goto failed;
  }

  /* for the printer: which outputs outlive the graph */
  if (dumping) {
    g.visible = calloc((size_t)m + 1, sizeof(uint32_t));
    for (int i = 0; i < m && g.visible; i++)
      for (int o = 0; o < nodes[i]->nouts && o < 32; o++) {
        const tpu_tensor_t* t = &nodes[i]->outs[o];
        if (t->dtype == TPU_DTYPE_NONE) continue;
        int slot = tpu_lazy_slot_of(t->data);
        if (slot < 0 || es.e[es.index[slot] - 1].live) g.visible[i] |= 1u << o;
      }
  }
  /* patch placeholders into real addresses */
  visit_nodes(nodes, m, patch_address, &w);
  /* 5. queue */
  tpu_target_graph_info_t info;
  tpu_graph_info(&g, &info);
  atomic_fetch_add(&g_stats.fused, info.fused_nodes);
  atomic_fetch_add(&g_stats.reduction_groups, info.reduction_groups);
  atomic_fetch_add(&g_stats.epilogue_groups, info.epilogue_groups);
  st = tpu_graph_enqueue(&g, s); /* takes the nodes, also when it fails */
  atomic_store(&tr->length, 0);
  for (int k = 0; k < es.n; k++) {
    entry_t* e = &es.e[k];
    if (!e->recipe) continue;
    if (st) {
      free(e->recipe);
      continue;
    }
    tpu_lazy_set_recipe(e->slot, e->recipe); /* the slot stays unbacked */
    atomic_fetch_add(&g_stats.recipes, 1);
    atomic_fetch_add(&g_stats.recipe_bytes, (int64_t)e->bytes);
  }
  for (int k = 0; k < es.n; k++) tpu_lazy_release_dead(es.e[k].slot);
  free(es.e);
  free(es.index);
  free(needed);
  tpu_device_release_held(device);     /* fenced behind the graph now queued */
  tpu_device_release_deferred(device); /* queued after the graph: safe to reuse */
  atomic_fetch_add(&tr->epoch, 1);
  return st;
failed:
  for (int k = 0; es.e && k < es.n; k++) free(es.e[k].recipe);
  tpu_device_release_held(device); /* nothing was queued: no work names them */
  tpu_graph_release_exe(&g);
  restore_trace(tr, nodes, m, cap, &es);
  free(es.e);
  free(es.index);
  free(needed);
  return st;
}

void tpu_trace_get_stats(tpu_trace_stats_t* out) {
  out->flushes = atomic_load(&g_stats.flushes);
  out->nodes = atomic_load(&g_stats.nodes);
  out->nodes_dropped = atomic_load(&g_stats.dropped);
  out->nodes_fused = atomic_load(&g_stats.fused);
  out->temps = atomic_load(&g_stats.temps);
  out->temp_bytes = atomic_load(&g_stats.temp_bytes);
  out->elided_bytes = atomic_load(&g_stats.elided);
  out->repeat_cuts = atomic_load(&g_stats.repeat_cuts);
  out->reduction_groups = atomic_load(&g_stats.reduction_groups);
  out->epilogue_groups = atomic_load(&g_stats.epilogue_groups);
  out->recipes = atomic_load(&g_stats.recipes);
  out->recipe_bytes = atomic_load(&g_stats.recipe_bytes);
  out->recomputed = atomic_load(&g_stats.recomputed);
}

void tpu_trace_reset_stats(void) {
  atomic_store(&g_stats.flushes, 0);
  atomic_store(&g_stats.nodes, 0);
  atomic_store(&g_stats.dropped, 0);
  atomic_store(&g_stats.fused, 0);
  atomic_store(&g_stats.temps, 0);
  atomic_store(&g_stats.temp_bytes, 0);
  atomic_store(&g_stats.elided, 0);
  atomic_store(&g_stats.repeat_cuts, 0);
  atomic_store(&g_stats.reduction_groups, 0);
  atomic_store(&g_stats.epilogue_groups, 0);
  atomic_store(&g_stats.recipes, 0);
  atomic_store(&g_stats.recipe_bytes, 0);
  atomic_store(&g_stats.recomputed, 0);
}
