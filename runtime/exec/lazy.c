/* Lazily backed device buffers (DeferAndFuse).
 *
 * A placeholder is an address inside a reserved, inaccessible region of the
 * address space: slot i covers [region + i * SPAN, region + (i + 1) * SPAN),
 * so any interior pointer (a view's data pointer) finds its slot with a
 * subtraction and a shift. No memory stands behind the region; touching it
 * faults, so a path that forgot to resolve a placeholder fails loudly in
 * tests instead of reading garbage.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device/internal.h"
#include "exec/internal.h"

#define SLOT_SHIFT 31 /* 2 GiB per placeholder at most */
#define SPAN ((uintptr_t)1 << SLOT_SHIFT)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uintptr_t g_base, g_end;
static tpu_lazy_slot_t g_slots[TPU_LAZY_SLOTS];
static int g_free[TPU_LAZY_SLOTS];
static int g_nfree;
static _Atomic int g_used;
/* slots with a recipe (tpu_lazy_set_recipe), under g_mu */
static int g_recipes[TPU_LAZY_SLOTS];
static _Atomic int g_nrecipes;

static void reserve_region(void) {
  tpu_exec_register_hooks(); /* placeholders exist from here on */
  size_t len = (size_t)TPU_LAZY_SLOTS << SLOT_SHIFT;
  void* p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return; /* no placeholders: every buffer is backed at once */
  g_base = (uintptr_t)p;
  g_end = g_base + len;
  for (int i = 0; i < TPU_LAZY_SLOTS; i++) g_free[i] = TPU_LAZY_SLOTS - 1 - i;
  g_nfree = TPU_LAZY_SLOTS;
}

bool tpu_is_lazy(const void* p) {
  uintptr_t a = (uintptr_t)p;
  return a >= g_base && a < g_end;
}

int tpu_lazy_slot_of(const void* p) {
  return tpu_is_lazy(p) ? (int)(((uintptr_t)p - g_base) >> SLOT_SHIFT) : -1;
}

tpu_lazy_slot_t* tpu_lazy_slot(int id) { return &g_slots[id]; }

void* tpu_lazy_slot_base(int id) { return (void*)(g_base + ((uintptr_t)id << SLOT_SHIFT)); }

void* tpu_lazy_alloc(int device, size_t bytes) {
  pthread_once(&g_once, reserve_region);
  if (!g_base || bytes == 0 || bytes > SPAN) return NULL;
  /* The bytes count against the capacity now, as in Strict: when they do not
   * fit, the caller's real allocation drains the device or raises. */
  tpu_status_t rs = tpu_device_reserve(device, bytes, false);
  if (rs) {
    tpu_status_free(rs);
    return NULL;
  }
  pthread_mutex_lock(&g_mu);
  if (g_nfree == 0) {
    pthread_mutex_unlock(&g_mu);
    tpu_device_unreserve(device, bytes);
    return NULL;
  }
  int id = g_free[--g_nfree];
  tpu_lazy_slot_t* s = &g_slots[id];
  memset(s, 0, sizeof *s);
  s->state = TPU_LAZY_LIVE;
  s->device = device;
  s->bytes = bytes;
  s->reserved = true;
  atomic_fetch_add(&g_used, 1);
  pthread_mutex_unlock(&g_mu);
  return (void*)(g_base + ((uintptr_t)id << SLOT_SHIFT));
}

static void unpin_locked(tpu_call_t* recipe);

/* Caller holds g_mu: takes slot id's recipe (NULL when none) off the list. */
static tpu_call_t* unlist_recipe_locked(int id) {
  tpu_call_t* r = g_slots[id].recipe;
  if (!r) return NULL;
  g_slots[id].recipe = NULL;
  const int n = atomic_load(&g_nrecipes);
  for (int k = 0; k < n; k++)
    if (g_recipes[k] == id) {
      g_recipes[k] = g_recipes[n - 1];
      atomic_store(&g_nrecipes, n - 1);
      break;
    }
  return r;
}

/* Caller holds g_mu: drops slot id's recipe, if any, and its pins. */
static void drop_recipe_locked(int id) {
  tpu_call_t* r = unlist_recipe_locked(id);
  if (!r) return;
  unpin_locked(r);
  free(r);
}

/* Caller holds g_mu. */
static void release_locked(int id) {
  tpu_lazy_slot_t* s = &g_slots[id];
  drop_recipe_locked(id);
  if (s->reserved) tpu_device_unreserve(s->device, s->bytes);
  if (s->real && !s->detached) tpu_device_free(s->device, s->real);
  memset(s, 0, sizeof *s);
  g_free[g_nfree++] = id;
  atomic_fetch_sub(&g_used, 1);
}

void tpu_lazy_free(void* base) {
  int id = tpu_lazy_slot_of(base);
  if (id < 0) return;
  if (tpu_runtime_in_bad_fork()) return; /* a forked child: g_mu may be held */
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  if (s->state == TPU_LAZY_LIVE) {
    if ((s->in_trace && !s->detached) || s->pins) {
      /* the next flush releases it. An unbacked one keeps its reservation:
       * the pending trace still computes it (as a graph temporary), so its
       * bytes are in use when the trace runs, as they were in Strict at the
       * op. A later allocation that does not fit then flushes the trace
       * instead of being admitted ahead of it (and failing it). A pinned
       * one keeps its memory for the recipes that read it. */
      s->state = TPU_LAZY_DEAD;
    } else {
      release_locked(id);
    }
  }
  pthread_mutex_unlock(&g_mu);
}

void tpu_lazy_release_dead(int id) {
  pthread_mutex_lock(&g_mu);
  g_slots[id].in_trace = false;
  if (g_slots[id].state == TPU_LAZY_DEAD && !g_slots[id].pins) release_locked(id);
  pthread_mutex_unlock(&g_mu);
}

/* ---- recomputation ---- */
typedef struct {
  int self, delta;
} pin_walk_t;

/* Counts (delta +1) or ends (-1) a recipe's pin on each placeholder it
 * reads; an input the host dropped and nothing else holds goes. */
static void pin_input(void* ctx, tpu_tensor_t* t, bool write) {
  const pin_walk_t* w = ctx;
  const int id = tpu_lazy_slot_of(t->data);
  if (write || id < 0 || id == w->self) return;
  tpu_lazy_slot_t* s = &g_slots[id];
  s->pins += w->delta;
  if (!s->pins && s->state == TPU_LAZY_DEAD && !s->in_trace) release_locked(id);
}

static void unpin_locked(tpu_call_t* recipe) {
  pin_walk_t w = {-1, -1};
  tpu_call_visit_tensors(recipe, pin_input, &w);
}

void tpu_lazy_set_recipe(int id, tpu_call_t* recipe) {
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  pin_walk_t w = {id, +1};
  tpu_call_visit_tensors(recipe, pin_input, &w);
  drop_recipe_locked(id);
  s->recipe = recipe;
  const int n = atomic_load(&g_nrecipes);
  g_recipes[n] = id;
  atomic_store(&g_nrecipes, n + 1);
  if (s->reserved) { /* no memory, and none promised, until it is recomputed */
    tpu_device_unreserve(s->device, s->bytes);
    s->reserved = false;
  }
  pthread_mutex_unlock(&g_mu);
}

/* The real bytes [begin, end) of slot id's memory overlap [lo, hi). */
static bool slot_overlaps(const tpu_lazy_slot_t* s, const char* lo, const char* hi) {
  const char* b = s->real;
  return b && lo < b + s->bytes && b < hi;
}

typedef struct {
  const char *lo, *hi; /* written memory (real addresses) */
  int written;         /* or the written placeholder slot, -1 */
  bool hit;
} reads_walk_t;

static void reads_written(void* ctx, tpu_tensor_t* t, bool write) {
  reads_walk_t* w = ctx;
  if (write || w->hit) return;
  const int id = tpu_lazy_slot_of(t->data);
  if (id >= 0) w->hit = id == w->written || slot_overlaps(&g_slots[id], w->lo, w->hi);
}

int tpu_lazy_recipes_for(const tpu_tensor_t* t, bool write, int* out, int cap) {
  if (!atomic_load_explicit(&g_nrecipes, memory_order_relaxed) || !t->data) return 0;
  int n = 0;
  pthread_mutex_lock(&g_mu);
  const int id = tpu_lazy_slot_of(t->data);
  if (id >= 0 && g_slots[id].recipe && n < cap) out[n++] = id;
  if (write) {
    reads_walk_t w = {NULL, NULL, id, false};
    if (id < 0) { /* real memory: its span (an over-estimate for a strided view) */
      int64_t last = 0;
      for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] > 0) last += (t->sizes[d] - 1) * (t->strides[d] < 0 ? 0 : t->strides[d]);
      w.lo = t->data;
      w.hi = w.lo + (size_t)(last + 1) * tpu_dtype_size(t->dtype);
    }
    const int nr = atomic_load(&g_nrecipes);
    for (int k = 0; k < nr && n < cap; k++) {
      w.hit = false;
      tpu_call_visit_tensors(g_slots[g_recipes[k]].recipe, reads_written, &w);
      if (w.hit && g_recipes[k] != id) out[n++] = g_recipes[k];
    }
  }
  pthread_mutex_unlock(&g_mu);
  return n;
}

bool tpu_lazy_has_recipes(void) { return atomic_load_explicit(&g_nrecipes, memory_order_relaxed) > 0; }

tpu_call_t* tpu_lazy_take_recipe(int id) {
  pthread_mutex_lock(&g_mu);
  tpu_call_t* r = unlist_recipe_locked(id);
  if (r) g_slots[id].no_recompute = true;
  pthread_mutex_unlock(&g_mu);
  return r;
}

void tpu_lazy_unpin_inputs(tpu_call_t* recipe) {
  pthread_mutex_lock(&g_mu);
  unpin_locked(recipe);
  pthread_mutex_unlock(&g_mu);
}

size_t tpu_lazy_take_dead(int id) {
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  size_t bytes = s->bytes;
  if (s->state == TPU_LAZY_DEAD && s->reserved) {
    tpu_device_unreserve(s->device, s->bytes); /* the temporary takes its place */
    s->reserved = false;
  }
  pthread_mutex_unlock(&g_mu);
  return bytes;
}

void tpu_lazy_unrealize(int id) {
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  if (s->real && !s->detached) {
    tpu_device_free_unused(s->real);
    s->real = NULL;
    if (s->state == TPU_LAZY_LIVE && !s->reserved) {
      tpu_status_free(tpu_device_reserve(s->device, s->bytes, true));
      s->reserved = true;
    }
  }
  pthread_mutex_unlock(&g_mu);
}

void tpu_lazy_lock(void) { pthread_mutex_lock(&g_mu); }
void tpu_lazy_unlock(void) { pthread_mutex_unlock(&g_mu); }

void* tpu_lazy_resolve(const void* p) {
  int id = tpu_lazy_slot_of(p);
  if (id < 0) return (void*)p;
  void* real = g_slots[id].real;
  return real ? (char*)real + (((uintptr_t)p - g_base) & (SPAN - 1)) : NULL;
}

/* The allocation runs without g_mu: when memory is short the allocator
 * drains the device, which flushes the trace, and a flush takes g_mu. The
 * slot cannot be released meanwhile: the caller holds its tensor, or is the
 * flush of a trace that names it. */
tpu_status_t tpu_lazy_realize(const void* p, void** out) { return tpu_lazy_realize_on(p, NULL, out); }

/* Before memory is used outside a trace (a copy, a Strict call, another
 * library): a value left without memory is computed now, and so are the
 * values computed from memory that may be about to change. */
static tpu_status_t run_recipes_touching(const void* p, tpu_stream_t* stream) {
  if (!tpu_lazy_has_recipes()) return TPU_OK;
  tpu_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = (void*)p;
  t.dtype = TPU_U8;
  t.ndim = 1;
  t.sizes[0] = t.strides[0] = 1;
  tpu_call_t c;
  memset(&c, 0, sizeof c);
  c.nouts = 1;
  c.outs = &t;
  bool ran = false;
  TPU_RETURN_IF_ERROR(tpu_trace_run_recipes_for(&c, stream, &ran));
  if (!ran || stream) return TPU_OK; /* queued on `stream`, before the caller's use */
  const int device = tpu_is_lazy(p) ? g_slots[tpu_lazy_slot_of(p)].device : tpu_device_of_ptr(p);
  return device < 0 ? TPU_OK : tpu_stream_synchronize(tpu_stream_get(device, 0));
}

tpu_status_t tpu_lazy_realize_on(const void* p, tpu_stream_t* stream, void** out) {
  TPU_RETURN_IF_ERROR(run_recipes_touching(p, stream));
  int id = tpu_lazy_slot_of(p);
  if (id < 0) {
    *out = (void*)p;
    return TPU_OK;
  }
  const uintptr_t offset = ((uintptr_t)p - g_base) & (SPAN - 1);
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  if (s->state == TPU_LAZY_FREE) {
    pthread_mutex_unlock(&g_mu);
    return TPU_ERR(INTERNAL, "placeholder %p names a released buffer", p);
  }
  if (s->real) {
    *out = (char*)s->real + offset;
    pthread_mutex_unlock(&g_mu);
    return TPU_OK;
  }
  const bool reserved = s->reserved; /* this call takes the reservation */
  const int device = s->device;
  const size_t bytes = s->bytes;
  s->reserved = false;
  pthread_mutex_unlock(&g_mu);
  void* mem = NULL;
  const bool own_stream = stream && tpu_stream_device(stream) == device;
  tpu_status_t st = reserved    ? tpu_device_malloc_reserved(device, stream, bytes, &mem)
                    : own_stream ? tpu_device_malloc_on(stream, bytes, &mem)
                                 : tpu_device_malloc(device, bytes, &mem);
  pthread_mutex_lock(&g_mu);
  if (st) {
    if (reserved) { /* the allocator kept it: give it back to the slot */
      if (s->state == TPU_LAZY_LIVE && !s->real && !s->reserved) s->reserved = true;
      else tpu_device_unreserve(device, bytes);
    }
    pthread_mutex_unlock(&g_mu);
    return st;
  }
  if (s->real) tpu_device_free_unused(mem); /* another thread backed it meanwhile */
  else s->real = mem;
  *out = (char*)s->real + offset;
  pthread_mutex_unlock(&g_mu);
  return TPU_OK;
}

void* tpu_lazy_detach(void* base) {
  int id = tpu_lazy_slot_of(base);
  if (id < 0) return NULL;
  pthread_mutex_lock(&g_mu);
  tpu_lazy_slot_t* s = &g_slots[id];
  void* real = NULL;
  if (s->state == TPU_LAZY_LIVE && s->real && !s->in_trace && !s->detached && !s->pins) {
    s->detached = true;
    real = s->real;
  }
  pthread_mutex_unlock(&g_mu);
  return real;
}

int tpu_lazy_count(void) { return atomic_load(&g_used); }
