/* Op calls in the execution layer: deep copies, tensor visits, placeholder
 * resolution, and submission to a stream (trace it, run it inline, or queue
 * it as an opaque work item of the device layer). Also registers the hooks
 * through which the device layer reaches the trace and the placeholders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/internal.h"
#include "exec/internal.h"
#include "tpu/observe.h"

/* ---- deep copy of a call into one block ---- */
static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

size_t tpu_call_deep_size(const tpu_call_t* c) {
  size_t n = align8(sizeof(tpu_arg_t) * (size_t)c->nargs) +
             align8(sizeof(tpu_tensor_t) * (size_t)c->nouts);
  for (int i = 0; i < c->nargs; i++) {
    const tpu_arg_t* a = &c->args[i];
    switch (a->kind) {
      case TPU_ARG_TENSOR: n += align8(sizeof(tpu_tensor_t)); break;
      case TPU_ARG_INTLIST: n += align8(sizeof(int64_t) * (size_t)a->n); break;
      case TPU_ARG_DOUBLELIST: n += align8(sizeof(double) * (size_t)a->n); break;
      case TPU_ARG_BOOLLIST: n += align8(sizeof(bool) * (size_t)a->n); break;
      case TPU_ARG_STRING: n += align8(strlen(a->v.s) + 1); break;
      case TPU_ARG_TENSORLIST: n += align8(sizeof(tpu_tensor_t) * (size_t)a->n); break;
      default: break;
    }
  }
  return n;
}

static void fix_scalar(tpu_tensor_t* t) {
  if (t->flags & TPU_TENSOR_CPU_SCALAR) {
    size_t sz = tpu_dtype_size(t->dtype);
    if (t->data != t->inline_value) memcpy(t->inline_value, t->data, sz);
    t->data = t->inline_value;
  }
}

void tpu_call_copy_deep(tpu_call_t* dst, const tpu_call_t* src, void* storage) {
  char* p = storage;
  *dst = *src;
  dst->args = (tpu_arg_t*)p;
  p += align8(sizeof(tpu_arg_t) * (size_t)src->nargs);
  memcpy(dst->args, src->args, sizeof(tpu_arg_t) * (size_t)src->nargs);
  dst->outs = (tpu_tensor_t*)p;
  p += align8(sizeof(tpu_tensor_t) * (size_t)src->nouts);
  memcpy(dst->outs, src->outs, sizeof(tpu_tensor_t) * (size_t)src->nouts);
  for (int i = 0; i < src->nargs; i++) {
    tpu_arg_t* a = &dst->args[i];
    size_t sz = 0;
    switch (a->kind) {
      case TPU_ARG_TENSOR:
        memcpy(p, a->v.t, sizeof(tpu_tensor_t));
        a->v.t = (tpu_tensor_t*)p;
        fix_scalar(a->v.t);
        p += align8(sizeof(tpu_tensor_t));
        break;
      case TPU_ARG_INTLIST: sz = sizeof(int64_t) * (size_t)a->n; goto copy;
      case TPU_ARG_DOUBLELIST: sz = sizeof(double) * (size_t)a->n; goto copy;
      case TPU_ARG_BOOLLIST: sz = sizeof(bool) * (size_t)a->n; goto copy;
      case TPU_ARG_STRING: sz = strlen(a->v.s) + 1; goto copy;
      case TPU_ARG_TENSORLIST: {
        tpu_tensor_t* ts = (tpu_tensor_t*)p;
        memcpy(ts, a->v.tlist, sizeof(tpu_tensor_t) * (size_t)a->n);
        for (int k = 0; k < a->n; k++) fix_scalar(&ts[k]);
        a->v.tlist = ts;
        p += align8(sizeof(tpu_tensor_t) * (size_t)a->n);
        break;
      }
      copy:
        if (sz) memcpy(p, a->v.ilist, sz);
        a->v.ilist = (const int64_t*)p;
        p += align8(sz);
        break;
      default: break;
    }
  }
}

tpu_call_t* tpu_call_clone(const tpu_call_t* call) {
  tpu_call_t* c = malloc(sizeof(tpu_call_t) + tpu_call_deep_size(call));
  if (c) tpu_call_copy_deep(c, call, c + 1);
  return c;
}

/* ---- tensors of a call ---- */
void tpu_call_visit_tensors(tpu_call_t* c, void (*fn)(void*, tpu_tensor_t*, bool), void* ctx) {
  for (int i = 0; i < c->nargs; i++) {
    tpu_arg_t* a = &c->args[i];
    bool w = i < 64 && ((c->mutated_args >> i) & 1);
    if (a->kind == TPU_ARG_TENSOR) fn(ctx, a->v.t, w);
    else if (a->kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < a->n; k++)
        if (a->v.tlist[k].dtype != TPU_DTYPE_NONE) fn(ctx, &a->v.tlist[k], w);
  }
  for (int i = 0; i < c->nouts; i++)
    if (c->outs[i].dtype != TPU_DTYPE_NONE) fn(ctx, &c->outs[i], true);
}

typedef struct {
  bool realize;
  tpu_stream_t* stream; /* where the call will run (NULL: default stream) */
  tpu_status_t st;
} resolve_ctx_t;

static void resolve_one(void* ctx, tpu_tensor_t* t, bool write) {
  resolve_ctx_t* r = ctx;
  if (r->st || !tpu_is_lazy(t->data)) return;
  void* real = tpu_lazy_resolve(t->data);
  if (!real && r->realize) r->st = tpu_lazy_realize_on(t->data, r->stream, &real);
  if (real) t->data = real;
}

static tpu_status_t call_resolve_lazy_on(tpu_call_t* call, bool realize, tpu_stream_t* s) {
  resolve_ctx_t r = {realize, s, TPU_OK};
  tpu_call_visit_tensors(call, resolve_one, &r);
  return r.st;
}

tpu_status_t tpu_call_resolve_lazy(tpu_call_t* call, bool realize) {
  return call_resolve_lazy_on(call, realize, NULL);
}

static void find_lazy(void* ctx, tpu_tensor_t* t, bool write) {
  if (tpu_is_lazy(t->data)) *(bool*)ctx = true;
}

static bool call_has_lazy(const tpu_call_t* call) {
  bool any = false;
  tpu_call_visit_tensors((tpu_call_t*)call, find_lazy, &any);
  return any;
}

/* Elements a call touches (tensor arguments and outputs). */
static int64_t call_elements(const tpu_call_t* c) {
  int64_t n = 0;
  for (int i = 0; i < c->nouts; i++)
    if (c->outs[i].dtype != TPU_DTYPE_NONE) n += tpu_tensor_numel(&c->outs[i]);
  for (int i = 0; i < c->nargs; i++) {
    const tpu_arg_t* a = &c->args[i];
    if (a->kind == TPU_ARG_TENSOR) n += tpu_tensor_numel(a->v.t);
    else if (a->kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < a->n; k++)
        if (a->v.tlist[k].dtype != TPU_DTYPE_NONE) n += tpu_tensor_numel(&a->v.tlist[k]);
  }
  return n;
}

/* ---- submission ---- */
/* A queued call: the stream's work header, then the call's deep copy. */
typedef struct {
  tpu_work_t work;
  uint64_t tag;    /* the submitter's profile tag (tpu/observe.h) */
  tpu_call_t call; /* its storage follows the struct */
} call_work_t;

static tpu_status_t call_work_run(tpu_work_t* w) {
  call_work_t* cw = (call_work_t*)w;
  tpu_profile_set_tag(cw->tag);
  tpu_status_t st = tpu_call_run(&cw->call);
  tpu_profile_set_tag(0);
  return st;
}
static void call_work_release(tpu_work_t* w) { free(w); }
/* An inline run keeps the call's status for its submitter instead of leaving it on
 * the stream: the op that failed raises itself, as on CPU (an index out of range in
 * the data), and the stream carries no error for a later synchronization. */
typedef struct {
  const tpu_call_t* call;
  tpu_status_t status;
} call_inline_t;

static tpu_status_t call_run_inline(const void* ctx) {
  call_inline_t* r = (call_inline_t*)ctx;
  r->status = tpu_call_run(r->call);
  return TPU_OK;
}

/* Strict mode runs a small call on the submitting thread when the stream is
 * idle: the result is the same as queueing it (nothing is pending) without the
 * hand-off cost, and its error, if any, is returned by the submission. */
#define TPU_INLINE_ELEMENTS 32768

tpu_status_t tpu_stream_submit(tpu_stream_t* s, const tpu_call_t* call) {
  const tpu_eager_mode_t mode = tpu_get_eager_mode();
  const int device = tpu_stream_device(s);
  if (mode == TPU_MODE_DEFER) return tpu_trace_append(s, call);
  /* another thread's deferred ops come first in program order */
  if (tpu_trace_length(device) > 0) TPU_RETURN_IF_ERROR(tpu_trace_flush(device));
  /* values left without memory that the call reads, or whose inputs it writes */
  TPU_RETURN_IF_ERROR(tpu_trace_run_recipes_for((tpu_call_t*)call, s, NULL));
  if (call_has_lazy(call)) { /* tensors made in DeferAndFuse mode, used after it */
    TPU_RETURN_IF_ERROR(tpu_trace_flush(device)); /* another thread may have traced since */
    tpu_call_t* c = tpu_call_clone(call);
    if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory queueing an op");
    tpu_status_t st = call_resolve_lazy_on(c, true, s);
    if (!st) st = tpu_stream_submit(s, c);
    free(c);
    return st;
  }
  if (mode == TPU_MODE_STRICT && call_elements(call) <= TPU_INLINE_ELEMENTS) {
    call_inline_t r = {.call = call, .status = TPU_OK};
    if (tpu_stream_run_if_idle(s, call->op ? call->op->name : NULL, call_run_inline, &r)) {
      if (!r.status) return TPU_OK;
      char prefix[160];
      snprintf(prefix, sizeof prefix, "aten::%s", call->op ? call->op->name : "?");
      return tpu_status_annotate(r.status, prefix);
    }
  }
  call_work_t* w = malloc(sizeof(call_work_t) + tpu_call_deep_size(call));
  if (!w) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory queueing the op",
                         call->op ? call->op->name : "op");
  w->work.what = call->op ? call->op->name : "kernel";
  w->work.run = call_work_run;
  w->work.release = call_work_release;
  w->tag = tpu_profile_tag();
  tpu_call_copy_deep(&w->call, call, w + 1);
  if (tpu_get_eager_mode() == TPU_MODE_DEBUG) {
    w->call.debug_checks = true;
    /* Debug: run now on this thread, after the queued work. */
    tpu_status_t st = tpu_stream_synchronize(s);
    if (st) {
      free(w);
      return st;
    }
    st = tpu_call_run(&w->call);
    free(w);
    if (st) {
      char prefix[160];
      snprintf(prefix, sizeof prefix, "aten::%s", call->op ? call->op->name : "?");
      return tpu_status_annotate(st, prefix);
    }
    return TPU_OK;
  }
  tpu_stream_push(s, &w->work);
  return TPU_OK;
}

/* ---- the device layer's view of this one ---- */
static const tpu_device_hooks_t g_exec_hooks = {
    .pending = tpu_trace_length,
    .flush = tpu_trace_flush,
    .realize = tpu_lazy_realize_on,
};

void tpu_exec_register_hooks(void) { tpu_device_set_hooks(&g_exec_hooks); }
