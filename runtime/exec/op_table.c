/* The op table: ATen overload name -> host kernel, from the *.def inventories. */
#include <pthread.h>
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

tpu_status_t tpu_call_run(const tpu_call_t* call) {
  tpu_precision_t saved = t_precision;
  t_precision = call->precision;
  tpu_status_t st = call->op->fn(call);
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
