/* Streams (in-order queues, one worker thread each), events, host copies. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "exec/internal.h"

typedef enum { WORK_CALL, WORK_FN } work_kind_t;

typedef struct tpu_work {
  work_kind_t kind;
  struct tpu_work* next;
  const char* what;
  tpu_status_t (*fn)(void*);
  void* ctx;
  void (*destroy)(void*);
  tpu_call_t call; /* WORK_CALL: deep copy, storage follows the struct */
} tpu_work_t;

struct tpu_stream {
  int device;
  int64_t id;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  pthread_cond_t done_cv;
  tpu_work_t* head;
  tpu_work_t* tail;
  _Atomic uint64_t submitted;
  _Atomic uint64_t completed;
  _Atomic int sleeping;
  /* Smallest completed count a waiter sleeps for (UINT64_MAX: none), under
   * mu. The worker wakes waiters only when it reaches that count, so a
   * thread in synchronize() behind a long queue is woken once, not after
   * every op: each wake costs the worker a futex call (~10 us in a VM) and
   * puts the waiter on a core the kernel thread pool wants. */
  uint64_t wake_at;
  tpu_status_t error; /* first asynchronous error since last sync */
};

static double now_seconds(void) { return 1e-9 * (double)tpu_now_ns(); }

#define TPU_SPIN_SECONDS 50e-6

static tpu_work_t* pop_work(tpu_stream_t* s) {
  /* Spin about 50 us before sleeping: queued ops usually arrive microseconds
   * apart, and waking a sleeping thread costs more than that. */
  double deadline = now_seconds() + TPU_SPIN_SECONDS;
  for (int spin = 1;; spin++) {
    if (atomic_load_explicit(&s->submitted, memory_order_acquire) !=
        atomic_load_explicit(&s->completed, memory_order_relaxed))
      break;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if ((spin & 63) == 0 && now_seconds() > deadline) break;
  }
  pthread_mutex_lock(&s->mu);
  while (!s->head) {
    s->sleeping = 1;
    pthread_cond_wait(&s->work_cv, &s->mu);
    s->sleeping = 0;
  }
  tpu_work_t* w = s->head;
  s->head = w->next;
  if (!s->head) s->tail = NULL;
  pthread_mutex_unlock(&s->mu);
  return w;
}

static void record_error_locked(tpu_stream_t* s, tpu_status_t st, const char* what);

/* Counts one finished item; wakes the waiters once one of them is due. */
static void complete_locked(tpu_stream_t* s) {
  uint64_t done = atomic_fetch_add_explicit(&s->completed, 1, memory_order_release) + 1;
  if (done >= s->wake_at) {
    s->wake_at = UINT64_MAX;
    pthread_cond_broadcast(&s->done_cv);
  }
}

/* Blocks until the stream has finished `target` items. */
static void wait_count(tpu_stream_t* s, uint64_t target) {
  if (atomic_load(&s->completed) >= target) return;
  pthread_mutex_lock(&s->mu);
  while (atomic_load(&s->completed) < target) {
    if (target < s->wake_at) s->wake_at = target;
    pthread_cond_wait(&s->done_cv, &s->mu);
  }
  pthread_mutex_unlock(&s->mu);
}

static void* stream_main(void* arg) {
  tpu_stream_t* s = arg;
  for (;;) {
    tpu_work_t* w = pop_work(s);
    tpu_status_t st;
    const char* what;
    if (w->kind == WORK_CALL) {
      st = tpu_call_run(&w->call);
      what = w->call.op ? w->call.op->name : "kernel";
    } else {
      st = w->fn(w->ctx);
      what = w->what;
      if (w->destroy) w->destroy(w->ctx);
    }
    pthread_mutex_lock(&s->mu);
    record_error_locked(s, st, what);
    complete_locked(s);
    pthread_mutex_unlock(&s->mu);
    free(w);
  }
  return NULL;
}

tpu_status_t tpu_stream_new(int device, int64_t id, tpu_stream_t** out) {
  tpu_stream_t* s = calloc(1, sizeof(*s));
  if (!s) return TPU_ERR(RESOURCE_EXHAUSTED, "stream create: out of host memory");
  s->device = device;
  s->id = id;
  s->wake_at = UINT64_MAX;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&s->thread, &attr, stream_main, s);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    free(s);
    return TPU_ERR(INTERNAL, "stream create: cannot start a worker thread (error %d)", rc);
  }
  *out = s;
  return TPU_OK;
}

int64_t tpu_stream_id(const tpu_stream_t* s) { return s->id; }

uint64_t tpu_stream_submitted_count(tpu_stream_t* s) {
  return atomic_load_explicit(&s->submitted, memory_order_acquire);
}
bool tpu_stream_reached(tpu_stream_t* s, uint64_t target) {
  return atomic_load_explicit(&s->completed, memory_order_acquire) >= target;
}
void tpu_stream_wait_reached(tpu_stream_t* s, uint64_t target) { wait_count(s, target); }
int tpu_stream_device(const tpu_stream_t* s) { return s->device; }

static void push_work(tpu_stream_t* s, tpu_work_t* w) {
  w->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = w;
  else s->head = w;
  s->tail = w;
  atomic_fetch_add_explicit(&s->submitted, 1, memory_order_release);
  if (s->sleeping) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- deep copy of a call into one block ---- */
static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

static size_t call_extra_size(const tpu_call_t* c) {
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

static void call_copy_into(tpu_call_t* dst, const tpu_call_t* src, char* p) {
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
  tpu_call_t* c = malloc(sizeof(tpu_call_t) + call_extra_size(call));
  if (c) call_copy_into(c, call, (char*)(c + 1));
  return c;
}

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

/* Flushes the device's DeferAndFuse trace so that work queued outside it
 * (copies, events, host functions) keeps program order. */
static tpu_status_t flush_before(tpu_stream_t* s) {
  if (tpu_get_eager_mode() != TPU_MODE_DEFER && tpu_trace_length(s->device) == 0) return TPU_OK;
  return tpu_trace_flush(s->device);
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

static void record_error_locked(tpu_stream_t* s, tpu_status_t st, const char* what) {
  if (!st) return;
  if (s->error) {
    tpu_status_free(st);
    return;
  }
  char prefix[160];
  snprintf(prefix, sizeof prefix, "aten::%s", what ? what : "?");
  s->error = tpu_status_annotate(st, prefix);
}

/* Strict mode runs a small call on the submitting thread when the stream is
 * idle: the result is the same as queueing it (nothing is pending, errors
 * still surface at the next synchronization) without the hand-off cost. */
#define TPU_INLINE_ELEMENTS 32768

static bool try_run_inline(tpu_stream_t* s, const tpu_call_t* call) {
  if (call_elements(call) > TPU_INLINE_ELEMENTS) return false;
  pthread_mutex_lock(&s->mu);
  if (s->head || atomic_load(&s->submitted) != atomic_load(&s->completed)) {
    pthread_mutex_unlock(&s->mu);
    return false;
  }
  atomic_fetch_add(&s->submitted, 1);
  tpu_status_t st = tpu_call_run(call);
  record_error_locked(s, st, call->op ? call->op->name : NULL);
  complete_locked(s);
  pthread_mutex_unlock(&s->mu);
  return true;
}

tpu_status_t tpu_stream_submit(tpu_stream_t* s, const tpu_call_t* call) {
  const tpu_eager_mode_t mode = tpu_get_eager_mode();
  if (mode == TPU_MODE_DEFER) return tpu_trace_append(s, call);
  /* another thread's deferred ops come first in program order */
  if (tpu_trace_length(s->device) > 0) TPU_RETURN_IF_ERROR(tpu_trace_flush(s->device));
  if (call_has_lazy(call)) { /* tensors made in DeferAndFuse mode, used after it */
    TPU_RETURN_IF_ERROR(flush_before(s));
    tpu_call_t* c = tpu_call_clone(call);
    if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory queueing an op");
    tpu_status_t st = call_resolve_lazy_on(c, true, s);
    if (!st) st = tpu_stream_submit(s, c);
    free(c);
    return st;
  }
  if (mode == TPU_MODE_STRICT && try_run_inline(s, call)) return TPU_OK;
  size_t extra = call_extra_size(call);
  tpu_work_t* w = malloc(sizeof(tpu_work_t) + extra);
  if (!w) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory queueing the op",
                         call->op ? call->op->name : "op");
  w->kind = WORK_CALL;
  w->what = NULL;
  w->fn = NULL;
  w->destroy = NULL;
  call_copy_into(&w->call, call, (char*)(w + 1));
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
  push_work(s, w);
  return TPU_OK;
}

tpu_status_t tpu_stream_enqueue(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                                void* ctx, void (*destroy)(void*)) {
  tpu_status_t fst = flush_before(s);
  if (fst) {
    if (destroy) destroy(ctx);
    return fst;
  }
  return tpu_stream_enqueue_raw(s, what, fn, ctx, destroy);
}

tpu_status_t tpu_stream_enqueue_raw(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                                    void* ctx, void (*destroy)(void*)) {
  tpu_work_t* w = malloc(sizeof(tpu_work_t));
  if (!w) {
    if (destroy) destroy(ctx);
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory queueing work", what);
  }
  memset(w, 0, sizeof(*w));
  w->kind = WORK_FN;
  w->what = what;
  w->fn = fn;
  w->ctx = ctx;
  w->destroy = destroy;
  push_work(s, w);
  if (tpu_get_eager_mode() == TPU_MODE_DEBUG) return tpu_stream_synchronize(s);
  return TPU_OK;
}

tpu_status_t tpu_stream_synchronize(tpu_stream_t* s) {
  TPU_RETURN_IF_ERROR(flush_before(s));
  wait_count(s, atomic_load(&s->submitted));
  if (!s->error) return TPU_OK;
  pthread_mutex_lock(&s->mu);
  tpu_status_t e = s->error;
  s->error = NULL;
  pthread_mutex_unlock(&s->mu);
  return e;
}

bool tpu_stream_query(tpu_stream_t* s) {
  return atomic_load(&s->completed) == atomic_load(&s->submitted);
}

/* ---- events ---- */
/* An event is freed by the last of its owner and its pending markers, so
 * destroying a recorded event does not wait for the stream. */
struct tpu_event {
  pthread_mutex_t mu;
  _Atomic int refs; /* the owner + markers still queued */
  tpu_stream_t* stream;
  uint64_t target; /* stream's completed count that marks the event */
  double time;     /* completion time of the marker */
  int recorded;
};

tpu_status_t tpu_event_create(tpu_event_t** out) {
  tpu_event_t* e = calloc(1, sizeof(*e));
  if (!e) return TPU_ERR(RESOURCE_EXHAUSTED, "event create: out of host memory");
  pthread_mutex_init(&e->mu, NULL);
  atomic_store(&e->refs, 1);
  *out = e;
  return TPU_OK;
}

static void event_unref(tpu_event_t* e) {
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    pthread_mutex_destroy(&e->mu);
    free(e);
  }
}

void tpu_event_destroy(tpu_event_t* e) {
  if (!e) return;
  /* a forked child has no workers: its markers never run, so the event is
   * left as it is */
  if (tpu_runtime_in_bad_fork()) return;
  event_unref(e);
}

typedef struct {
  tpu_event_t* e;
  uint64_t target;
} marker_t;

static tpu_status_t marker_fn(void* ctx) {
  marker_t* m = ctx;
  pthread_mutex_lock(&m->e->mu);
  if (m->e->target == m->target) m->e->time = now_seconds();
  pthread_mutex_unlock(&m->e->mu);
  return TPU_OK;
}

static void marker_free(void* ctx) {
  marker_t* m = ctx;
  event_unref(m->e);
  free(m);
}

tpu_status_t tpu_event_record(tpu_event_t* e, tpu_stream_t* s) {
  TPU_RETURN_IF_ERROR(flush_before(s));
  marker_t* m = malloc(sizeof(*m));
  tpu_work_t* w = calloc(1, sizeof(tpu_work_t));
  if (!m || !w) {
    free(m);
    free(w);
    return TPU_ERR(RESOURCE_EXHAUSTED, "event record: out of host memory");
  }
  atomic_fetch_add(&e->refs, 1); /* the marker's */
  pthread_mutex_lock(&s->mu); /* target must equal the marker's position */
  pthread_mutex_lock(&e->mu);
  e->stream = s;
  e->target = atomic_load(&s->submitted) + 1;
  e->recorded = 1;
  m->e = e;
  m->target = e->target;
  pthread_mutex_unlock(&e->mu);
  w->kind = WORK_FN;
  w->what = "event_record";
  w->fn = marker_fn;
  w->ctx = m;
  w->destroy = marker_free;
  if (s->tail) s->tail->next = w;
  else s->head = w;
  s->tail = w;
  atomic_fetch_add(&s->submitted, 1);
  if (s->sleeping) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return TPU_OK;
}

bool tpu_event_query(tpu_event_t* e) {
  pthread_mutex_lock(&e->mu);
  bool done = !e->recorded || atomic_load(&e->stream->completed) >= e->target;
  pthread_mutex_unlock(&e->mu);
  return done;
}

void tpu_event_synchronize(tpu_event_t* e) {
  pthread_mutex_lock(&e->mu);
  tpu_stream_t* s = e->stream;
  uint64_t t = e->target;
  int rec = e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (rec && s) wait_count(s, t);
}

typedef struct {
  tpu_stream_t* s;
  uint64_t target;
} wait_t;

static tpu_status_t wait_fn(void* ctx) {
  wait_t* w = ctx;
  wait_count(w->s, w->target);
  return TPU_OK;
}

tpu_status_t tpu_stream_wait_event(tpu_stream_t* s, tpu_event_t* e) {
  pthread_mutex_lock(&e->mu);
  tpu_stream_t* es = e->stream;
  uint64_t t = e->target;
  int rec = e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (!rec || es == s) return TPU_OK; /* same stream: already ordered */
  wait_t* w = malloc(sizeof(*w));
  if (!w) return TPU_ERR(RESOURCE_EXHAUSTED, "stream wait: out of host memory");
  w->s = es;
  w->target = t;
  return tpu_stream_enqueue(s, "stream_wait_event", wait_fn, w, free);
}

tpu_status_t tpu_stream_wait_stream(tpu_stream_t* waiter, tpu_stream_t* s) {
  if (waiter == s) return TPU_OK;
  TPU_RETURN_IF_ERROR(flush_before(s));
  const uint64_t target = atomic_load(&s->submitted);
  if (atomic_load(&s->completed) >= target) return TPU_OK;
  wait_t* w = malloc(sizeof(*w));
  if (!w) return TPU_ERR(RESOURCE_EXHAUSTED, "stream wait: out of host memory");
  w->s = s;
  w->target = target;
  return tpu_stream_enqueue(waiter, "stream_wait_stream", wait_fn, w, free);
}

double tpu_event_elapsed_seconds(tpu_event_t* a, tpu_event_t* b) {
  tpu_event_synchronize(a);
  tpu_event_synchronize(b);
  return b->time - a->time;
}

/* ---- host copies ---- */
typedef struct {
  void* dst;
  size_t bytes;
  unsigned char data[];
} h2d_t;

static tpu_status_t h2d_fn(void* ctx) {
  h2d_t* c = ctx;
  memcpy(c->dst, c->data, c->bytes);
  return TPU_OK;
}

tpu_status_t tpu_stream_copy_h2d(tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return TPU_OK;
  TPU_RETURN_IF_ERROR(flush_before(s));
  TPU_RETURN_IF_ERROR(tpu_lazy_realize_on(dst, s, &dst));
  h2d_t* c = malloc(sizeof(h2d_t) + bytes);
  if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "copy to tpu: cannot stage %zu bytes", bytes);
  c->dst = dst;
  c->bytes = bytes;
  memcpy(c->data, src, bytes);
  return tpu_stream_enqueue(s, "copy_h2d", h2d_fn, c, free);
}

tpu_status_t tpu_stream_copy_d2h(tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  TPU_RETURN_IF_ERROR(flush_before(s));
  TPU_RETURN_IF_ERROR(tpu_stream_synchronize(s));
  void* real = NULL;
  TPU_RETURN_IF_ERROR(tpu_lazy_realize(src, &real));
  src = real;
  if (bytes) memcpy(dst, src, bytes);
  return TPU_OK;
}
