/* The op table: ATen overload name -> host kernel, from the *.def inventories. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../targets/host/kernels/kernels.h"

static tpu_op_t g_ops[] = {
#define TPU_OP(name, fn, flags) {name, fn, flags},
#include "../targets/host/kernels/ops_all.def"
#undef TPU_OP
};
static const int g_nops = (int)(sizeof(g_ops) / sizeof(g_ops[0]));
static pthread_once_t g_sorted = PTHREAD_ONCE_INIT;

static int cmp_op(const void* a, const void* b) {
  return strcmp(((const tpu_op_t*)a)->name, ((const tpu_op_t*)b)->name);
}

static void sort_ops(void) { qsort(g_ops, (size_t)g_nops, sizeof(tpu_op_t), cmp_op); }

const tpu_op_t* tpu_op_lookup(const char* name) {
  pthread_once(&g_sorted, sort_ops);
  tpu_op_t key = {name, NULL, 0};
  return bsearch(&key, g_ops, (size_t)g_nops, sizeof(tpu_op_t), cmp_op);
}

int tpu_op_count(void) {
  pthread_once(&g_sorted, sort_ops);
  return g_nops;
}

const char* tpu_op_name(int i) {
  pthread_once(&g_sorted, sort_ops);
  return (i >= 0 && i < g_nops) ? g_ops[i].name : NULL;
}

/* The precision of the call running on this thread, for matmul-class code
 * that kernels reach indirectly (convolution, attention through the GEMM). */
static _Thread_local tpu_precision_t t_precision = TPU_PRECISION_HIGHEST;

tpu_precision_t tpu_kernel_precision(void) { return t_precision; }

/* ---- kernel profile ---- */
static _Atomic bool g_prof_on;
static _Atomic int64_t g_prof_calls[sizeof(g_ops) / sizeof(g_ops[0]) + TPU_PROFILE_FUSED_KINDS];
static _Atomic int64_t g_prof_ns[sizeof(g_ops) / sizeof(g_ops[0]) + TPU_PROFILE_FUSED_KINDS];
static const char* const g_fused_names[TPU_PROFILE_FUSED_KINDS] = {
    "fused.elementwise", "fused.rows", "fused.matmul_epilogue"};
static _Thread_local int t_prof_depth; /* counted runs open on this thread */

void tpu_profile_enable(bool on) { atomic_store(&g_prof_on, on); }

void tpu_profile_reset(void) {
  for (int i = 0; i < g_nops + TPU_PROFILE_FUSED_KINDS; i++) {
    atomic_store_explicit(&g_prof_calls[i], 0, memory_order_relaxed);
    atomic_store_explicit(&g_prof_ns[i], 0, memory_order_relaxed);
  }
}

bool tpu_profile_entry(int i, const char** out_name, int64_t* out_calls, int64_t* out_ns) {
  if (i < 0 || i >= g_nops + TPU_PROFILE_FUSED_KINDS) return false;
  *out_name = i < g_nops ? tpu_op_name(i) : g_fused_names[i - g_nops];
  *out_calls = atomic_load_explicit(&g_prof_calls[i], memory_order_relaxed);
  *out_ns = atomic_load_explicit(&g_prof_ns[i], memory_order_relaxed);
  return true;
}

int64_t tpu_profile_begin(void) {
  if (t_prof_depth++ || !atomic_load_explicit(&g_prof_on, memory_order_relaxed)) return 0;
  return tpu_now_ns();
}

void tpu_profile_end(int entry, int64_t stamp) {
  t_prof_depth--;
  if (!stamp || entry < 0 || entry >= g_nops + TPU_PROFILE_FUSED_KINDS) return;
  int64_t ns = tpu_now_ns() - stamp;
  atomic_fetch_add_explicit(&g_prof_calls[entry], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_prof_ns[entry], ns, memory_order_relaxed);
}

tpu_status_t tpu_call_run(const tpu_call_t* call) {
  tpu_precision_t saved = t_precision;
  t_precision = call->precision;
  int64_t stamp = tpu_profile_begin();
  tpu_status_t st = call->op->fn(call);
  /* entries follow the sorted table: the op's index (ops built elsewhere, if
   * any, are not counted) */
  tpu_profile_end(call->op >= g_ops && call->op < g_ops + g_nops ? (int)(call->op - g_ops) : -1,
                  stamp);
  t_precision = saved;
  return st;
}

double tpu_arg_f64(const tpu_call_t* c, int i, double dflt) {
  if (i >= c->nargs) return dflt;
  const tpu_arg_t* a = &c->args[i];
  switch (a->kind) {
    case TPU_ARG_DOUBLE: return a->v.d;
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
    case TPU_ARG_BOOL: return a->v.b;
    case TPU_ARG_TENSOR: return tpu_tensor_get_i64(a->v.t, 0);
    default: return dflt;
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
