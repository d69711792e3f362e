/* The op table: ATen overload name -> kernel, built once from the
 * registered target's kernel inventory (tpu/target.h: ops). */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tpu/observe.h"
#include "tpu/target.h"

/* Sorted copy of the target's inventory; the calls' op pointers point into
 * it, so a call's profile entry is its offset. Published once (g_table,
 * release) after g_nops and the profile counters are set. */
static tpu_op_t* _Atomic g_table;
static int g_nops;
static pthread_mutex_t g_table_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int64_t* g_prof_calls;
static _Atomic int64_t* g_prof_ns;

/* ---- op ids ---- */
static const char* const k_id_names[TPU_OPID_COUNT] = {
    NULL,
#define TPU_OPID(name) #name,
#include "tpu/op_ids.def"
#undef TPU_OPID
};

const char* tpu_op_id_name(tpu_op_id_t id) {
  return id > TPU_OPID_NONE && id < TPU_OPID_COUNT ? k_id_names[id] : NULL;
}

tpu_op_id_t tpu_op_id_lookup(const char* base) {
  if (!base) return TPU_OPID_NONE;
  int lo = 1, hi = TPU_OPID_COUNT; /* the names are sorted (tools/gen_op_ids.py) */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    int r = strcmp(base, k_id_names[mid]);
    if (!r) return (tpu_op_id_t)mid;
    if (r < 0) hi = mid;
    else lo = mid + 1;
  }
  return TPU_OPID_NONE;
}

void tpu_op_base_name(const char* op, char* out, size_t cap) {
  if (!cap) return;
  size_t len = strcspn(op, ".");
  if (len >= cap) len = cap - 1;
  memcpy(out, op, len);
  out[len] = 0;
  if (len > 1 && out[len - 1] == '_' && out[0] != '_') out[len - 1] = 0;
  else if (len > 2 && out[len - 1] == '_' && out[0] == '_') out[len - 1] = 0;
}

tpu_op_id_t tpu_op_id_of(const char* overload) {
  if (!overload) return TPU_OPID_NONE;
  char base[128];
  tpu_op_base_name(overload, base, sizeof base);
  return tpu_op_id_lookup(base);
}

static int cmp_op(const void* a, const void* b) {
  return strcmp(((const tpu_op_t*)a)->name, ((const tpu_op_t*)b)->name);
}

/* The table, built at the first use after a target is registered; NULL
 * before (no ops) or when the host runs out of memory building it. */
static const tpu_op_t* table_slow(void) {
  pthread_mutex_lock(&g_table_mu);
  tpu_op_t* t = atomic_load(&g_table);
  const tpu_target_t* target = tpu_target_get();
  if (!t && target) {
    int n = 0;
    const tpu_op_t* inv = target->iface->ops(target->ctx, &n);
    if (n < 0) n = 0;
    t = malloc(sizeof(tpu_op_t) * (size_t)(n + 1));
    g_prof_calls = calloc((size_t)n + TPU_PROFILE_FUSED_KINDS, sizeof(int64_t));
    g_prof_ns = calloc((size_t)n + TPU_PROFILE_FUSED_KINDS, sizeof(int64_t));
    if (t && g_prof_calls && g_prof_ns) {
      if (n) memcpy(t, inv, sizeof(tpu_op_t) * (size_t)n);
      qsort(t, (size_t)n, sizeof(tpu_op_t), cmp_op);
      for (int i = 0; i < n; i++) t[i].id = tpu_op_id_of(t[i].name);
      g_nops = n;
      atomic_store_explicit(&g_table, t, memory_order_release);
    } else {
      free(t);
      free((void*)g_prof_calls);
      free((void*)g_prof_ns);
      g_prof_calls = g_prof_ns = NULL;
      t = NULL;
    }
  }
  pthread_mutex_unlock(&g_table_mu);
  return t;
}

static inline const tpu_op_t* table(void) {
  const tpu_op_t* t = atomic_load_explicit(&g_table, memory_order_acquire);
  return t ? t : table_slow();
}

/* Ops the target provides outside its inventory (tpu_target_iface_t's
 * kernel_for), interned on first lookup; never freed (the calls' op
 * pointers point at them). Misses are remembered too (fn NULL). */
typedef struct extra_op {
  tpu_op_t op;
  struct extra_op* next;
  tpu_op_custom_t custom; /* ops made by tpu_op_register (TPU_OP_CUSTOM) */
  char name[];
} extra_op_t;
static extra_op_t* _Atomic g_extra;

static const tpu_op_t* extra_lookup(const char* name) {
  for (extra_op_t* e = atomic_load_explicit(&g_extra, memory_order_acquire); e; e = e->next)
    if (strcmp(e->name, name) == 0) return e->op.fn ? &e->op : NULL;
  const tpu_target_t* target = tpu_target_get();
  if (!target || !target->iface->kernel_for) return NULL;
  pthread_mutex_lock(&g_table_mu);
  extra_op_t* e = atomic_load_explicit(&g_extra, memory_order_acquire);
  for (; e; e = e->next)
    if (strcmp(e->name, name) == 0) break;
  if (!e) {
    size_t len = strlen(name);
    e = malloc(sizeof(*e) + len + 1);
    if (e) {
      memcpy(e->name, name, len + 1);
      uint32_t flags = 0;
      e->op.fn = target->iface->kernel_for(target->ctx, name, &flags);
      e->op.name = e->name;
      e->op.flags = flags;
      e->op.id = tpu_op_id_of(e->name);
      e->next = atomic_load_explicit(&g_extra, memory_order_relaxed);
      atomic_store_explicit(&g_extra, e, memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_table_mu);
  return e && e->op.fn ? &e->op : NULL;
}

const tpu_op_t* tpu_op_lookup(const char* name) {
  const tpu_op_t* t = table();
  if (!t || !name) return NULL;
  tpu_op_t key = {name, NULL, 0, TPU_OPID_NONE};
  const tpu_op_t* op = bsearch(&key, t, (size_t)g_nops, sizeof(tpu_op_t), cmp_op);
  return op ? op : extra_lookup(name);
}

tpu_status_t tpu_op_register(const char* name, tpu_kernel_fn_t fn, uint32_t flags,
                             const tpu_op_custom_t* custom, const tpu_op_t** out_op) {
  *out_op = NULL;
  if (!name || !name[0] || !fn) return TPU_ERR(INVALID_ARGUMENT, "tpu_op_register: no name or kernel");
  const tpu_op_t* t = table();
  tpu_op_t key = {name, NULL, 0, TPU_OPID_NONE};
  if (t && bsearch(&key, t, (size_t)g_nops, sizeof(tpu_op_t), cmp_op))
    return TPU_ERR(INVALID_ARGUMENT, "an op called %s already exists", name);
  pthread_mutex_lock(&g_table_mu);
  extra_op_t* e = atomic_load_explicit(&g_extra, memory_order_acquire);
  for (; e; e = e->next)
    if (strcmp(e->name, name) == 0) break;
  tpu_status_t st = TPU_OK;
  if (e && (e->op.flags & TPU_OP_CUSTOM)) {
    st = TPU_ERR(INVALID_ARGUMENT, "an op called %s already exists", name);
  } else if (e) {
    /* interned by an earlier lookup (a remembered miss, or a target's generic
     * kernel, which any name gets from kernel_for): it becomes the op */
    e->custom = custom ? *custom : (tpu_op_custom_t){0};
    e->op.flags = flags | TPU_OP_CUSTOM;
    atomic_thread_fence(memory_order_release);
    e->op.fn = fn;
  } else {
    size_t len = strlen(name);
    e = malloc(sizeof(*e) + len + 1);
    if (!e) {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory registering op %s", name);
    } else {
      memcpy(e->name, name, len + 1);
      e->custom = custom ? *custom : (tpu_op_custom_t){0};
      e->op.fn = fn;
      e->op.name = e->name;
      e->op.flags = flags | TPU_OP_CUSTOM;
      e->op.id = TPU_OPID_NONE;
      e->next = atomic_load_explicit(&g_extra, memory_order_relaxed);
      atomic_store_explicit(&g_extra, e, memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_table_mu);
  if (!st) *out_op = &e->op;
  return st;
}

const tpu_op_custom_t* tpu_op_custom(const tpu_op_t* op) {
  if (!op || !(op->flags & TPU_OP_CUSTOM)) return NULL;
  const extra_op_t* e = (const extra_op_t*)((const char*)op - offsetof(extra_op_t, op));
  return &e->custom;
}

int tpu_op_count(void) { return table() ? g_nops : 0; }

const char* tpu_op_name(int i) {
  const tpu_op_t* t = table();
  return (t && i >= 0 && i < g_nops) ? t[i].name : NULL;
}

/* The precision of the call running on this thread, for matmul-class code
 * that kernels reach indirectly (convolution, attention through the GEMM). */
static _Thread_local tpu_precision_t t_precision = TPU_PRECISION_HIGHEST;

tpu_precision_t tpu_kernel_precision(void) { return t_precision; }

/* ---- kernel profile ---- */
static _Atomic bool g_prof_on;
static const char* const g_fused_names[TPU_PROFILE_FUSED_KINDS] = {
    "fused.elementwise", "fused.rows", "fused.matmul_epilogue"};
static _Thread_local int t_prof_depth; /* counted runs open on this thread */

void tpu_profile_enable(bool on) {
  table(); /* the counters exist from here */
  atomic_store(&g_prof_on, on);
}

void tpu_profile_reset(void) {
  if (!table()) return;
  for (int i = 0; i < g_nops + TPU_PROFILE_FUSED_KINDS; i++) {
    atomic_store_explicit(&g_prof_calls[i], 0, memory_order_relaxed);
    atomic_store_explicit(&g_prof_ns[i], 0, memory_order_relaxed);
  }
}

bool tpu_profile_entry(int i, const char** out_name, int64_t* out_calls, int64_t* out_ns) {
  if (!table() || i < 0 || i >= g_nops + TPU_PROFILE_FUSED_KINDS) return false;
  *out_name = i < g_nops ? tpu_op_name(i) : g_fused_names[i - g_nops];
  *out_calls = atomic_load_explicit(&g_prof_calls[i], memory_order_relaxed);
  *out_ns = atomic_load_explicit(&g_prof_ns[i], memory_order_relaxed);
  return true;
}

static _Thread_local int t_prof_device = -1; /* the running call's device (timeline) */

int64_t tpu_profile_begin(void) {
  if (t_prof_depth++) return 0;
  if (!atomic_load_explicit(&g_prof_on, memory_order_relaxed) && !tpu_kernel_events_on()) return 0;
  return tpu_now_ns();
}

void tpu_profile_end(int entry, int64_t stamp) {
  t_prof_depth--;
  if (!stamp || !g_prof_calls || entry < 0 || entry >= g_nops + TPU_PROFILE_FUSED_KINDS) return;
  int64_t now = tpu_now_ns();
  if (tpu_kernel_events_on()) tpu_kernel_events_add(entry, t_prof_device, stamp, now);
  if (!atomic_load_explicit(&g_prof_on, memory_order_relaxed)) return;
  atomic_fetch_add_explicit(&g_prof_calls[entry], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_prof_ns[entry], now - stamp, memory_order_relaxed);
}

/* A call's profile entry: the op's index in the sorted table (ops built
 * elsewhere, if any, are not counted). */
static int profile_entry_of(const tpu_op_t* op) {
  const tpu_op_t* t = atomic_load_explicit(&g_table, memory_order_relaxed);
  return t && op >= t && op < t + g_nops ? (int)(op - t) : -1;
}

tpu_status_t tpu_call_run(const tpu_call_t* call) {
  tpu_precision_t saved = t_precision;
  t_precision = call->precision;
  t_prof_device = call->device;
  int64_t stamp = tpu_profile_begin();
  tpu_status_t st = call->op->fn(call);
  if (stamp) tpu_profile_end(profile_entry_of(call->op), stamp);
  else t_prof_depth--;
  t_precision = saved;
  return st;
}

double tpu_arg_f64(const tpu_call_t* c, int i, double dflt) {
  if (i >= c->nargs) return dflt;
  const tpu_arg_t* a = &c->args[i];
  switch (a->kind) {
    case TPU_ARG_DOUBLE: return a->v.d;
    case TPU_ARG_COMPLEX: return a->v.c[0];
    case TPU_ARG_INT: return (double)a->v.i;
    case TPU_ARG_BOOL: return a->v.b ? 1.0 : 0.0;
    case TPU_ARG_TENSOR: return tpu_tensor_get_f64(a->v.t, 0);
    default: return dflt;
  }
}

int64_t tpu_arg_i64(const tpu_call_t* c, int i, int64_t dflt) {
  if (i >= c->nargs) return dflt;
  const tpu_arg_t* a = &c->args[i];
  switch (a->kind) {
    case TPU_ARG_INT: return a->v.i;
    case TPU_ARG_DOUBLE: return (int64_t)a->v.d;
    case TPU_ARG_COMPLEX: return (int64_t)a->v.c[0];
    case TPU_ARG_BOOL: return a->v.b;
    case TPU_ARG_TENSOR: return tpu_tensor_get_i64(a->v.t, 0);
    default: return dflt;
  }
}

bool tpu_arg_complex(const tpu_call_t* c, int i, double out_c[2]) {
  if (i >= c->nargs) return false;
  const tpu_arg_t* a = &c->args[i];
  switch (a->kind) {
    case TPU_ARG_COMPLEX: out_c[0] = a->v.c[0]; out_c[1] = a->v.c[1]; return true;
    case TPU_ARG_DOUBLE: case TPU_ARG_INT: case TPU_ARG_BOOL:
      out_c[0] = tpu_arg_f64(c, i, 0);
      out_c[1] = 0;
      return true;
    case TPU_ARG_TENSOR: {
      const tpu_tensor_t* t = a->v.t;
      const void* p = tpu_tensor_elem_ptr(t, 0);
      out_c[0] = tpu_load_f64(p, t->dtype);
      out_c[1] = t->dtype == TPU_C64 ? ((const float*)p)[1] : t->dtype == TPU_C128 ? ((const double*)p)[1] : 0;
      return true;
    }
    default: return false;
  }
}

bool tpu_arg_bool(const tpu_call_t* c, int i, bool dflt) {
  if (i >= c->nargs) return dflt;
  const tpu_arg_t* a = &c->args[i];
  switch (a->kind) {
    case TPU_ARG_BOOL: return a->v.b;
    case TPU_ARG_INT: return a->v.i != 0;
    case TPU_ARG_DOUBLE: return a->v.d != 0;
    default: return dflt;
  }
}

const char* tpu_arg_str(const tpu_call_t* c, int i, const char* dflt) {
  if (i >= c->nargs || c->args[i].kind != TPU_ARG_STRING) return dflt;
  return c->args[i].v.s;
}
