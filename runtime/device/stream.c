/* Streams (in-order queues of opaque work items, one worker thread each),
 * events, host copies. What a work item does is its creator's business
 * (exec/call.c queues op calls, exec/graph.c graphs); pending upper-layer
 * work is reached through the hooks in internal.h. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "tpu/observe.h"
#include "tpu/target.h"

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

/* The stream whose item this thread runs (tpu/observe.h). */
static _Thread_local tpu_stream_t* t_running;

struct tpu_stream* tpu_stream_running(void) { return t_running; }

static void* stream_main(void* arg) {
  tpu_stream_t* s = arg;
  t_running = s;
  for (;;) {
    tpu_work_t* w = pop_work(s);
    tpu_status_t st = w->run(w);
    const char* what = w->what;
    w->release(w);
    pthread_mutex_lock(&s->mu);
    record_error_locked(s, st, what);
    complete_locked(s);
    pthread_mutex_unlock(&s->mu);
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

/* Appends w under s->mu. */
static void push_locked(tpu_stream_t* s, tpu_work_t* w) {
  w->next = NULL;
  if (s->tail) s->tail->next = w;
  else s->head = w;
  s->tail = w;
  atomic_fetch_add_explicit(&s->submitted, 1, memory_order_release);
  if (s->sleeping) pthread_cond_signal(&s->work_cv);
}

void tpu_stream_push(tpu_stream_t* s, tpu_work_t* w) {
  pthread_mutex_lock(&s->mu);
  push_locked(s, w);
  pthread_mutex_unlock(&s->mu);
}

/* ---- work items of a function and its context ---- */
typedef struct {
  tpu_work_t work;
  tpu_status_t (*fn)(void*);
  void* ctx;
  void (*destroy)(void*);
} fn_work_t;

static tpu_status_t fn_work_run(tpu_work_t* w) {
  fn_work_t* f = (fn_work_t*)w;
  return f->fn(f->ctx);
}

static void fn_work_release(tpu_work_t* w) {
  fn_work_t* f = (fn_work_t*)w;
  if (f->destroy) f->destroy(f->ctx);
  free(f);
}

static fn_work_t* fn_work_new(const char* what, tpu_status_t (*fn)(void*), void* ctx,
                              void (*destroy)(void*)) {
  fn_work_t* f = malloc(sizeof(*f));
  if (!f) return NULL;
  f->work.next = NULL;
  f->work.what = what;
  f->work.run = fn_work_run;
  f->work.release = fn_work_release;
  f->fn = fn;
  f->ctx = ctx;
  f->destroy = destroy;
  return f;
}

/* ---- hooks of the execution layer ---- */
static const tpu_device_hooks_t* _Atomic g_hooks;

void tpu_device_set_hooks(const tpu_device_hooks_t* hooks) {
  atomic_store_explicit(&g_hooks, hooks, memory_order_release);
}

int tpu_device_pending_work(int device) {
  const tpu_device_hooks_t* h = atomic_load_explicit(&g_hooks, memory_order_acquire);
  return h ? h->pending(device) : 0;
}

tpu_status_t tpu_device_flush_pending(int device) {
  const tpu_device_hooks_t* h = atomic_load_explicit(&g_hooks, memory_order_acquire);
  return h ? h->flush(device) : TPU_OK;
}

tpu_status_t tpu_device_realize(const void* p, tpu_stream_t* s, void** out_ptr) {
  const tpu_device_hooks_t* h = atomic_load_explicit(&g_hooks, memory_order_acquire);
  if (h) return h->realize(p, s, out_ptr);
  *out_ptr = (void*)p;
  return TPU_OK;
}

/* Queues the device's pending upper-layer work (the DeferAndFuse trace) so
 * that work queued outside it (copies, events, host functions) keeps
 * program order. */
static tpu_status_t flush_before(tpu_stream_t* s) {
  if (tpu_device_pending_work(s->device) == 0) return TPU_OK;
  return tpu_device_flush_pending(s->device);
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

bool tpu_stream_run_if_idle(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(const void*),
                            const void* ctx) {
  pthread_mutex_lock(&s->mu);
  if (s->head || atomic_load(&s->submitted) != atomic_load(&s->completed)) {
    pthread_mutex_unlock(&s->mu);
    return false;
  }
  atomic_fetch_add(&s->submitted, 1);
  tpu_stream_t* outer = t_running;
  t_running = s;
  tpu_status_t st = fn(ctx);
  t_running = outer;
  record_error_locked(s, st, what);
  complete_locked(s);
  pthread_mutex_unlock(&s->mu);
  return true;
}

/* flush: queue the upper layer's pending work first; debug_wait: in Debug
 * mode, wait for the work (its error is raised at the call) */
static tpu_status_t enqueue_fn(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                               void* ctx, void (*destroy)(void*), bool flush, bool debug_wait) {
  if (flush) {
    tpu_status_t fst = flush_before(s);
    if (fst) {
      if (destroy) destroy(ctx);
      return fst;
    }
  }
  fn_work_t* f = fn_work_new(what, fn, ctx, destroy);
  if (!f) {
    if (destroy) destroy(ctx);
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory queueing work", what);
  }
  tpu_stream_push(s, &f->work);
  if (debug_wait && tpu_get_eager_mode() == TPU_MODE_DEBUG) return tpu_stream_synchronize(s);
  return TPU_OK;
}

tpu_status_t tpu_stream_enqueue(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                                void* ctx, void (*destroy)(void*)) {
  return enqueue_fn(s, what, fn, ctx, destroy, true, true);
}

tpu_status_t tpu_stream_enqueue_nowait(tpu_stream_t* s, const char* what,
                                       tpu_status_t (*fn)(void*), void* ctx,
                                       void (*destroy)(void*)) {
  return enqueue_fn(s, what, fn, ctx, destroy, true, false);
}

tpu_status_t tpu_stream_enqueue_raw(tpu_stream_t* s, const char* what, tpu_status_t (*fn)(void*),
                                    void* ctx, void (*destroy)(void*)) {
  return enqueue_fn(s, what, fn, ctx, destroy, false, true);
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
  fn_work_t* w = m ? fn_work_new("event_record", marker_fn, m, marker_free) : NULL;
  if (!w) {
    free(m);
    return TPU_ERR(RESOURCE_EXHAUSTED, "event record: out of host memory");
  }
  pthread_mutex_lock(&s->mu); /* target must equal the marker's position */
  if (!s->head && atomic_load(&s->submitted) == atomic_load(&s->completed)) {
    /* an idle stream: the event is reached now (no worker to wake for it) */
    pthread_mutex_lock(&e->mu);
    e->stream = s;
    e->target = atomic_load(&s->submitted);
    e->recorded = 1;
    e->time = now_seconds();
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&s->mu);
    free(m); /* the marker was not needed */
    free(w);
    return TPU_OK;
  }
  atomic_fetch_add(&e->refs, 1); /* the marker's */
  pthread_mutex_lock(&e->mu);
  e->stream = s;
  e->target = atomic_load(&s->submitted) + 1;
  e->recorded = 1;
  m->e = e;
  m->target = e->target;
  pthread_mutex_unlock(&e->mu);
  push_locked(s, &w->work);
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
  if (atomic_load(&es->completed) >= t) return TPU_OK; /* reached: nothing to wait for */
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

/* ---- host copies, through the target ---- */
/* A small copy onto an idle stream runs on the calling thread, as a small call does
 * (exec/call.c): nothing is pending before it, so the order is the same, and an op
 * that follows finds the stream idle too (its data-dependent error raises at the op). */
#define TPU_INLINE_COPY_BYTES (256u * 1024u)

typedef struct {
  const tpu_target_t* t;
  int device;
  void* dst;
  const void* src;
  size_t bytes;
} h2d_direct_t;

static tpu_status_t h2d_direct_fn(const void* ctx) {
  const h2d_direct_t* c = ctx;
  return c->t->iface->copy_h2d(c->t->ctx, c->device, c->dst, c->src, c->bytes);
}

tpu_status_t tpu_stream_copy_h2d(tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return TPU_OK;
  TPU_RETURN_IF_ERROR(flush_before(s));
  TPU_RETURN_IF_ERROR(tpu_device_realize(dst, s, &dst));
  const tpu_target_t* t = tpu_target_get();
  if (!t) return TPU_ERR(INTERNAL, "copy to tpu: no target is registered");
  if (bytes <= TPU_INLINE_COPY_BYTES) {
    const h2d_direct_t d = {t, tpu_stream_device(s), dst, src, bytes};
    if (tpu_stream_run_if_idle(s, "copy_h2d", h2d_direct_fn, &d)) return TPU_OK;
  }
  return t->iface->copy_h2d_async(t->ctx, s, dst, src, bytes);
}

tpu_status_t tpu_stream_copy_d2h(tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  TPU_RETURN_IF_ERROR(flush_before(s));
  TPU_RETURN_IF_ERROR(tpu_stream_synchronize(s));
  void* real = NULL;
  TPU_RETURN_IF_ERROR(tpu_device_realize(src, NULL, &real));
  if (!bytes) return TPU_OK;
  const tpu_target_t* t = tpu_target_get();
  if (!t) return TPU_ERR(INTERNAL, "copy from tpu: no target is registered");
  return t->iface->copy_d2h(t->ctx, tpu_stream_device(s), dst, real, bytes);
}

tpu_status_t tpu_stream_copy_d2d(tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return TPU_OK;
  TPU_RETURN_IF_ERROR(flush_before(s));
  void* real_src = NULL;
  TPU_RETURN_IF_ERROR(tpu_device_realize(dst, s, &dst));
  TPU_RETURN_IF_ERROR(tpu_device_realize(src, s, &real_src));
  const tpu_target_t* t = tpu_target_get();
  if (!t) return TPU_ERR(INTERNAL, "copy between tpu buffers: no target is registered");
  return t->iface->copy_d2d_async(t->ctx, s, dst, real_src, bytes);
}
