/* Caching allocator over the target's device memory (buffer_alloc/free).
 *
 * Blocks are rounded up (512 B below 1 MiB, 64 KiB above) and cached by
 * exact rounded size when freed, like CUDA's caching allocator without block
 * splitting. Each block has a header in host memory, out of band (the
 * target's memory need not be host-addressable: a pjrt target hands out
 * handle addresses), that records its address, size and owner; the sorted
 * block registry maps an address back to its header. The capacity bounds reserved bytes (live plus
 * cached) plus the reservations of unbacked DeferAndFuse placeholders (which
 * the statistics leave out: they are no memory); when a request does not fit, the device's streams are drained and
 * the cache released before giving up with RESOURCE_EXHAUSTED.
 *
 * Reuse is stream-ordered (see block_fence below and tpu/device.h).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tpu/observe.h"
#include "tpu/target.h"

#define TPU_BLOCK_MAGIC 0x7470754d454d0001ull

/* A stream's queue position that a freed block waits for. */
typedef struct tpu_fence {
  tpu_stream_t* stream;
  uint64_t target;
} tpu_fence_t;

#define TPU_INLINE_FENCES 4

typedef struct tpu_block_header {
  uint64_t magic;
  char* user;  /* the target's buffer (what tpu_device_malloc returns) */
  size_t size; /* rounded size */
  int32_t device;
  int32_t live;
  struct tpu_block_header* next_free;
  int32_t held; /* freed by a flush whose graph is not queued yet */
  const tpu_stream_t* held_for; /* while held: the graph's stream */
  pthread_t held_by;            /* while held: the flushing thread */
  int32_t nfences; /* fences still to pass before reuse on another stream */
  int32_t fence_cap;
  tpu_fence_t* fences; /* inline_fences or a malloc'd array */
  tpu_fence_t inline_fences[TPU_INLINE_FENCES];
} tpu_block_header_t;


struct tpu_size_bin {
  size_t size;
  tpu_block_header_t* head;
  struct tpu_size_bin* next;
};

/* Stream-ordered lifetime. Work queued before a free may still read or
 * write the block on any stream of any device (a cross-device copy runs on
 * the target's stream). So a freed block remembers, for every stream with
 * work in flight, the queue position reached at the free; before the block
 * serves a request for stream X it must see every other stream pass its
 * position. Work on X itself is ordered after the free by X's queue. */
static void fences_clear(tpu_block_header_t* h) {
  if (h->fences && h->fences != h->inline_fences) free(h->fences);
  h->fences = h->inline_fences;
  h->fence_cap = TPU_INLINE_FENCES;
  h->nfences = 0;
}

static void fence_add(tpu_block_header_t* h, tpu_stream_t* s, uint64_t target) {
  if (h->nfences == h->fence_cap) {
    int cap = 2 * h->fence_cap;
    tpu_fence_t* f = malloc(sizeof(tpu_fence_t) * (size_t)cap);
    if (!f) { /* no room to remember it: wait for the stream now */
      tpu_stream_wait_reached(s, target);
      return;
    }
    memcpy(f, h->fences, sizeof(tpu_fence_t) * (size_t)h->nfences);
    if (h->fences != h->inline_fences) free(h->fences);
    h->fences = f;
    h->fence_cap = cap;
  }
  h->fences[h->nfences++] = (tpu_fence_t){s, target};
}

/* Fences h on each stream that has queued work now. */
static void block_fence(tpu_block_header_t* h) {
  fences_clear(h);
  const int n = tpu_stream_registry_count();
  for (int i = 0; i < n; i++) {
    tpu_stream_t* s = tpu_stream_registry_at(i);
    if (!s) continue;
    uint64_t target = tpu_stream_submitted_count(s);
    if (!tpu_stream_reached(s, target)) fence_add(h, s, target);
  }
}

/* Whether h may serve work on stream `user` (NULL: any stream); drops the
 * fences that have passed. */
static bool block_ready(tpu_block_header_t* h, const tpu_stream_t* user) {
  if (h->held && !(user == h->held_for && pthread_equal(h->held_by, pthread_self())))
    return false;
  bool ready = true;
  int k = 0;
  for (int i = 0; i < h->nfences; i++) {
    tpu_fence_t f = h->fences[i];
    if (tpu_stream_reached(f.stream, f.target)) continue;
    h->fences[k++] = f;
    if (f.stream != user) ready = false;
  }
  h->nfences = k;
  return ready;
}

/* Every block the allocator holds from the system (live or cached), sorted by
 * address, so that a free finds its header and tpu_device_of_ptr can answer
 * for any pointer, also one into the middle of a block or one that is not
 * device memory at all. Changed only when a block comes from or goes back
 * to the system, not on cache hits. */
static struct {
  pthread_mutex_t mu;
  tpu_block_header_t** v;
  size_t n, cap;
} g_blocks = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static void observe(int device, tpu_mem_action_t action, const void* ptr, size_t size,
                    size_t requested, const tpu_stream_t* s);

/* index of the first block starting above p (caller holds g_blocks.mu) */
static size_t blocks_upper(const void* p) {
  size_t lo = 0, hi = g_blocks.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((const void*)g_blocks.v[mid]->user <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static bool block_register(tpu_block_header_t* h) {
  pthread_mutex_lock(&g_blocks.mu);
  if (g_blocks.n == g_blocks.cap) {
    size_t cap = g_blocks.cap ? 2 * g_blocks.cap : 256;
    tpu_block_header_t** v = realloc(g_blocks.v, cap * sizeof(*v));
    if (!v) {
      pthread_mutex_unlock(&g_blocks.mu);
      return false;
    }
    g_blocks.v = v;
    g_blocks.cap = cap;
  }
  size_t i = blocks_upper(h->user);
  memmove(g_blocks.v + i + 1, g_blocks.v + i, (g_blocks.n - i) * sizeof(*g_blocks.v));
  g_blocks.v[i] = h;
  g_blocks.n++;
  pthread_mutex_unlock(&g_blocks.mu);
  return true;
}

/* Unregisters h and gives its memory back to the target (its fences have
 * passed). */
static void block_return(tpu_block_header_t* h) {
  pthread_mutex_lock(&g_blocks.mu);
  size_t i = blocks_upper(h->user);
  if (i > 0 && g_blocks.v[i - 1] == h) {
    memmove(g_blocks.v + i - 1, g_blocks.v + i, (g_blocks.n - i) * sizeof(*g_blocks.v));
    g_blocks.n--;
  }
  h->magic = 0;
  pthread_mutex_unlock(&g_blocks.mu);
  const tpu_target_t* t = tpu_target_get();
  t->iface->buffer_free(t->ctx, h->device, h->user, h->size);
  observe(h->device, TPU_MEM_SEGMENT_FREE, h->user, h->size, h->size, NULL);
  free(h);
}

/* The header of the block whose buffer starts at ptr, NULL if none. */
static tpu_block_header_t* block_find(const void* ptr) {
  tpu_block_header_t* h = NULL;
  pthread_mutex_lock(&g_blocks.mu);
  size_t i = blocks_upper(ptr);
  if (i > 0 && g_blocks.v[i - 1]->user == (const char*)ptr) h = g_blocks.v[i - 1];
  pthread_mutex_unlock(&g_blocks.mu);
  return h;
}

/* The memory observer (tpu/observe.h); called with no allocator lock held. */
static _Atomic(tpu_mem_observer_t) g_mem_observer;

void tpu_device_set_memory_observer(tpu_mem_observer_t fn) { atomic_store(&g_mem_observer, fn); }

static void observe(int device, tpu_mem_action_t action, const void* ptr, size_t size,
                    size_t requested, const tpu_stream_t* s) {
  tpu_mem_observer_t fn = atomic_load_explicit(&g_mem_observer, memory_order_relaxed);
  if (fn) fn(device, action, ptr, size, requested, s ? tpu_stream_id(s) : 0);
}

void tpu_device_memory_blocks(int device,
                              void (*fn)(void* ctx, const void* ptr, size_t size, bool live),
                              void* ctx) {
  pthread_mutex_lock(&g_blocks.mu);
  for (size_t i = 0; i < g_blocks.n; i++) {
    const tpu_block_header_t* h = g_blocks.v[i];
    if (h->device == device) fn(ctx, h->user, h->size, h->live != 0);
  }
  pthread_mutex_unlock(&g_blocks.mu);
}

void tpu_allocator_init(tpu_allocator_t* a, size_t capacity) {
  memset(a, 0, sizeof(*a));
  pthread_mutex_init(&a->mu, NULL);
  a->capacity = capacity;
  a->stats.capacity_bytes = (int64_t)capacity;
}

static size_t round_size(size_t n) {
  if (n < ((size_t)1 << 20)) return (n + 511) & ~(size_t)511;
  return (n + 65535) & ~(size_t)65535;
}

static tpu_size_bin_t** bin_slot(tpu_allocator_t* a, size_t size) {
  size_t h = (size >> 9) * 0x9E3779B97F4A7C15ull;
  return &a->bins[(h >> 20) & 1023];
}

/* Takes h off the allocator's held list (it serves the flush that held it
 * again). */
static void held_remove(tpu_allocator_t* a, tpu_block_header_t* h) {
  for (int i = 0; i < a->nheld; i++)
    if (a->held[i] == h) {
      a->held[i] = a->held[--a->nheld];
      break;
    }
  h->held = 0;
  h->held_for = NULL;
}

/* Blocks of a bin looked at for one request: the newest first, which are
 * usually fenced only on the requesting stream itself. */
#define TPU_READY_SCAN 16

static tpu_block_header_t* cache_pop(tpu_allocator_t* a, size_t size, const tpu_stream_t* user) {
  for (tpu_size_bin_t* b = *bin_slot(a, size); b; b = b->next) {
    if (b->size != size) continue;
    tpu_block_header_t** link = &b->head;
    for (int n = 0; *link && n < TPU_READY_SCAN; n++) {
      tpu_block_header_t* h = *link;
      if (block_ready(h, user)) {
        *link = h->next_free;
        if (h->held) held_remove(a, h);
        return h;
      }
      link = &h->next_free;
    }
    return NULL;
  }
  return NULL;
}

/* The bin of blocks of exactly `size` bytes, created if missing; NULL when
 * there is no host memory for it. */
static tpu_size_bin_t* bin_get(tpu_allocator_t* a, size_t size) {
  tpu_size_bin_t** slot = bin_slot(a, size);
  tpu_size_bin_t* b = *slot;
  while (b && b->size != size) b = b->next;
  if (!b && (b = calloc(1, sizeof(*b)))) {
    b->size = size;
    b->next = *slot;
    *slot = b;
  }
  return b;
}

static void cache_push(tpu_allocator_t* a, tpu_block_header_t* h) {
  tpu_size_bin_t* b = bin_get(a, h->size);
  if (!b) { /* cannot cache: release to the system after its fences */
    a->stats.reserved_bytes -= (int64_t)h->size;
    a->stats.num_device_free++;
    for (int i = 0; i < h->nfences; i++)
      tpu_stream_wait_reached(h->fences[i].stream, h->fences[i].target);
    fences_clear(h);
    block_return(h);
    return;
  }
  h->next_free = b->head;
  b->head = h;
}

/* Takes every cached block out of the bins (under a->mu), except held ones:
 * a graph not queued yet still names their memory. */
static tpu_block_header_t* cache_take_all_locked(tpu_allocator_t* a) {
  tpu_block_header_t* list = NULL;
  for (int i = 0; i < 1024; i++) {
    for (tpu_size_bin_t* b = a->bins[i]; b; b = b->next) {
      tpu_block_header_t** link = &b->head;
      while (*link) {
        tpu_block_header_t* h = *link;
        if (h->held) {
          link = &h->next_free;
          continue;
        }
        *link = h->next_free;
        a->stats.reserved_bytes -= (int64_t)h->size;
        a->stats.num_device_free++;
        h->next_free = list;
        list = h;
      }
    }
  }
  return list;
}

/* Returns the blocks to the system once queued work that may still use
 * them (on any device's streams) has run. Called without a->mu. */
static void blocks_release(tpu_block_header_t* list) {
  while (list) {
    tpu_block_header_t* h = list;
    list = h->next_free;
    for (int i = 0; i < h->nfences; i++)
      tpu_stream_wait_reached(h->fences[i].stream, h->fences[i].target);
    fences_clear(h);
    block_return(h);
  }
}

static void release_cache(tpu_allocator_t* a) {
  pthread_mutex_lock(&a->mu);
  tpu_block_header_t* list = cache_take_all_locked(a);
  pthread_mutex_unlock(&a->mu);
  blocks_release(list);
}

static void note_alloc(tpu_allocator_t* a, size_t size) {
  tpu_memory_stats_t* s = &a->stats;
  s->allocated_bytes += (int64_t)size;
  if (s->allocated_bytes > s->peak_allocated_bytes) s->peak_allocated_bytes = s->allocated_bytes;
  if (s->reserved_bytes > s->peak_reserved_bytes) s->peak_reserved_bytes = s->reserved_bytes;
  s->active_allocations++;
  if (s->active_allocations > s->peak_active_allocations)
    s->peak_active_allocations = s->active_allocations;
  s->total_allocated_bytes += (int64_t)size;
  s->num_allocs++;
}

/* Caller holds a->mu. A reservation (an unbacked placeholder's promise) is
 * capacity only: it is not device memory, so the statistics (allocated,
 * reserved, their peaks, allocation counts) never see it; the real block that
 * replaces it books itself. */
static void reservation_add(tpu_allocator_t* a, size_t size) { a->promised += size; }

static void reservation_remove(tpu_allocator_t* a, size_t size) { a->promised -= size; }

/* Caller holds a->mu: whether `size` more bytes fit beside the real blocks
 * (live and cached) and the reservations. */
static bool fits_locked(const tpu_allocator_t* a, size_t size) {
  return (size_t)a->stats.reserved_bytes + a->promised + size <= a->capacity;
}

tpu_status_t tpu_device_reserve(int device, size_t bytes, bool force) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "device reserve: no device %d", device);
  tpu_allocator_t* a = &d->alloc;
  size_t size = round_size(bytes);
  pthread_mutex_lock(&a->mu);
  if (!force && (size < bytes || !fits_locked(a, size))) {
    pthread_mutex_unlock(&a->mu);
    return TPU_ERR(RESOURCE_EXHAUSTED, "tpu:%d: %zu bytes do not fit without draining the cache",
                   device, bytes);
  }
  reservation_add(a, size);
  pthread_mutex_unlock(&a->mu);
  return TPU_OK;
}

void tpu_device_unreserve(int device, size_t bytes) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  pthread_mutex_lock(&d->alloc.mu);
  reservation_remove(&d->alloc, round_size(bytes));
  pthread_mutex_unlock(&d->alloc.mu);
}

/* `user`: the stream the block is for (it may reuse blocks whose fences on
 * other streams have passed); `reserved`: the block replaces a reservation
 * made by tpu_device_reserve. */
static tpu_status_t malloc_impl(int device, const tpu_stream_t* user, size_t bytes,
                                bool reserved, void** out_ptr) {
  *out_ptr = NULL;
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return TPU_ERR(INVALID_ARGUMENT, "device malloc: no device %d", device);
  if (bytes == 0) return TPU_OK;
  if (tpu_runtime_in_bad_fork())
    return TPU_ERR(INTERNAL, "device malloc: the tpu runtime is unusable in a "
                   "process forked after it started; use the 'spawn' start method");
  tpu_allocator_t* a = &d->alloc;
  size_t size = round_size(bytes);
  if (size < bytes || size > ((size_t)1 << 60))
    return TPU_ERR(RESOURCE_EXHAUSTED,
                   "tpu:%d out of memory: tried to allocate %zu bytes, which exceeds any "
                   "device capacity (capacity %zu bytes)", device, bytes, a->capacity);
  pthread_mutex_lock(&a->mu);
  if (reserved) reservation_remove(a, size); /* the block takes the reservation's place */
  tpu_block_header_t* h = cache_pop(a, size, user);
  bool fresh = false;
  if (h) {
    a->stats.num_cache_hits++;
  } else {
    if (!fits_locked(a, size)) {
      /* Let the streams drain so cached blocks are truly idle, then free
       * them (their errors stay for the next synchronization). */
      pthread_mutex_unlock(&a->mu);
      tpu_status_free(tpu_device_flush_pending(device));
      tpu_device_wait_idle(device);
      release_cache(a);
      pthread_mutex_lock(&a->mu);
    }
    if (!fits_locked(a, size)) {
      a->stats.num_ooms++;
      if (reserved) reservation_add(a, size); /* kept for a retry */
      const size_t promised = a->promised;
      const size_t alloc = (size_t)a->stats.allocated_bytes + promised;
      pthread_mutex_unlock(&a->mu);
      observe(device, TPU_MEM_OOM, NULL, size, bytes, user);
      return TPU_ERR(RESOURCE_EXHAUSTED,
                     "tpu:%d out of memory: tried to allocate %zu bytes; %zu bytes already "
                     "allocated (%zu of them promised to deferred work), %zu bytes free of a "
                     "capacity of %zu bytes (TORCH_TPU_HBM_BYTES)",
                     device, bytes, alloc, promised,
                     alloc < a->capacity ? a->capacity - alloc : 0, a->capacity);
    }
    /* a new block from the target, its header in host memory */
    void* mem = NULL;
    const tpu_target_t* t = tpu_target_get();
    h = calloc(1, sizeof(*h));
    tpu_status_t st = !t ? TPU_ERR(INTERNAL, "device malloc: no target is registered")
                      : !h ? TPU_ERR(RESOURCE_EXHAUSTED, "tpu:%d out of memory: no host memory "
                                     "to track a block of %zu bytes", device, size)
                           : t->iface->buffer_alloc(t->ctx, device, size, &mem);
    if (st) {
      free(h);
      a->stats.num_ooms++;
      if (reserved) reservation_add(a, size);
      pthread_mutex_unlock(&a->mu);
      return st;
    }
    h->user = mem;
    if (!block_register(h)) {
      free(h);
      t->iface->buffer_free(t->ctx, device, mem, size);
      a->stats.num_ooms++;
      if (reserved) reservation_add(a, size);
      pthread_mutex_unlock(&a->mu);
      return TPU_ERR(RESOURCE_EXHAUSTED, "tpu:%d out of memory: no host memory to track a "
                     "block of %zu bytes", device, size);
    }
    h->fences = h->inline_fences;
    h->fence_cap = TPU_INLINE_FENCES;
    h->nfences = 0;
    h->magic = TPU_BLOCK_MAGIC;
    h->size = size;
    h->device = device;
    a->stats.reserved_bytes += (int64_t)size;
    a->stats.num_device_alloc++;
    fresh = true;
  }
  h->live = 1;
  h->next_free = NULL;
  fences_clear(h);
  note_alloc(a, size);
  pthread_mutex_unlock(&a->mu);
  *out_ptr = h->user;
  if (atomic_load_explicit(&g_mem_observer, memory_order_relaxed)) {
    if (fresh) observe(device, TPU_MEM_SEGMENT_ALLOC, h->user, size, size, user);
    observe(device, TPU_MEM_ALLOC, h->user, size, bytes, user);
  }
  return TPU_OK;
}

static void free_impl(void* ptr, bool may_defer);

tpu_status_t tpu_device_malloc(int device, size_t bytes, void** out_ptr) {
  return malloc_impl(device, tpu_stream_get(device, 0), bytes, false, out_ptr);
}

tpu_status_t tpu_device_malloc_on(tpu_stream_t* s, size_t bytes, void** out_ptr) {
  *out_ptr = NULL;
  if (!s) return TPU_ERR(INVALID_ARGUMENT, "device malloc: no stream");
  return malloc_impl(tpu_stream_device(s), s, bytes, false, out_ptr);
}

tpu_status_t tpu_device_malloc_reserved(int device, tpu_stream_t* s, size_t bytes,
                                        void** out_ptr) {
  if (!s || tpu_stream_device(s) != device) s = tpu_stream_get(device, 0);
  return malloc_impl(device, s, bytes, true, out_ptr);
}

void tpu_device_free(int device, void* ptr) {
  (void)device;
  free_impl(ptr, true);
}

void tpu_device_free_unused(void* ptr) { free_impl(ptr, false); }

/* The live block ptr starts, marked free and counted, with its allocator's
 * mu held; NULL (nothing locked) when ptr is not a live block of ours. */
static tpu_block_header_t* free_begin(void* ptr, tpu_allocator_t** out_a) {
  if (!ptr) return NULL;
  if (tpu_runtime_in_bad_fork()) return NULL; /* a parent's block: its lock may be held */
  tpu_block_header_t* h = block_find(ptr);
  if (!h) return NULL; /* not ours: ignore */
  tpu_device_state_t* d = tpu_device_state(h->device);
  if (!d || h->magic != TPU_BLOCK_MAGIC || !h->live) return NULL;
  tpu_allocator_t* a = &d->alloc;
  pthread_mutex_lock(&a->mu);
  h->live = 0;
  a->stats.allocated_bytes -= (int64_t)h->size;
  a->stats.active_allocations--;
  a->stats.total_freed_bytes += (int64_t)h->size;
  a->stats.num_frees++;
  *out_a = a;
  return h;
}

/* Appends to a->deferred; false when there is no host memory for it. */
static bool defer_push(tpu_allocator_t* a, tpu_block_header_t* h) {
  if (a->ndeferred == a->deferred_cap) {
    int cap = a->deferred_cap ? 2 * a->deferred_cap : 64;
    void** p = realloc(a->deferred, sizeof(void*) * (size_t)cap);
    if (!p) return false;
    a->deferred = p;
    a->deferred_cap = cap;
  }
  a->deferred[a->ndeferred++] = h;
  return true;
}

static void free_impl(void* ptr, bool may_defer) {
  tpu_allocator_t* a = NULL;
  tpu_block_header_t* h = free_begin(ptr, &a);
  if (!h) return;
  const int device = h->device;
  const size_t size = h->size;
  if (may_defer && tpu_device_pending_work(h->device) > 0 && defer_push(a, h)) {
    pthread_mutex_unlock(&a->mu);
  } else {
    /* (no room to defer: the pending trace is flushed before reuse below) */
    block_fence(h);
    cache_push(a, h);
    pthread_mutex_unlock(&a->mu);
  }
  observe(device, TPU_MEM_FREE, ptr, size, size, NULL);
}

void tpu_device_free_held(void* ptr, tpu_stream_t* s) {
  tpu_allocator_t* a = NULL;
  tpu_block_header_t* h = free_begin(ptr, &a);
  if (!h) return;
  const int device = h->device;
  const size_t size = h->size;
  bool room = bin_get(a, h->size) != NULL;
  if (room && a->nheld == a->held_cap) {
    int cap = a->held_cap ? 2 * a->held_cap : 64;
    tpu_block_header_t** v = realloc(a->held, sizeof(*v) * (size_t)cap);
    if (v) {
      a->held = v;
      a->held_cap = cap;
    } else {
      room = false;
    }
  }
  if (!room) {
    /* no host memory to hold it: defer it past the queued graph instead, or
     * (no memory for that either) keep it out of use for good */
    bool kept = !defer_push(a, h);
    if (kept) h->live = 1;
    pthread_mutex_unlock(&a->mu);
    if (!kept) observe(device, TPU_MEM_FREE, ptr, size, size, NULL);
    return;
  }
  block_fence(h); /* work queued before the flush */
  h->held = 1;
  h->held_for = s;
  h->held_by = pthread_self();
  a->held[a->nheld++] = h;
  cache_push(a, h);
  pthread_mutex_unlock(&a->mu);
  observe(device, TPU_MEM_FREE, ptr, size, size, NULL);
}

void tpu_device_release_held(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  tpu_allocator_t* a = &d->alloc;
  pthread_mutex_lock(&a->mu);
  int k = 0;
  for (int i = 0; i < a->nheld; i++) {
    tpu_block_header_t* h = a->held[i];
    if (!pthread_equal(h->held_by, pthread_self())) {
      a->held[k++] = h;
      continue;
    }
    tpu_stream_t* s = (tpu_stream_t*)h->held_for;
    const uint64_t target = tpu_stream_submitted_count(s);
    if (!tpu_stream_reached(s, target)) fence_add(h, s, target);
    h->held = 0;
    h->held_for = NULL;
  }
  a->nheld = k;
  pthread_mutex_unlock(&a->mu);
}

void tpu_device_release_deferred(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  tpu_allocator_t* a = &d->alloc;
  pthread_mutex_lock(&a->mu);
  /* the trace that may use them is queued now: fence them behind it */
  for (int i = 0; i < a->ndeferred; i++) {
    tpu_block_header_t* h = a->deferred[i];
    block_fence(h);
    cache_push(a, h);
  }
  a->ndeferred = 0;
  pthread_mutex_unlock(&a->mu);
}

int tpu_device_release_deferred_unnamed(int device,
                                        bool (*named)(const void* begin, const void* end, void* ctx),
                                        void* ctx) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return 0;
  tpu_allocator_t* a = &d->alloc;
  pthread_mutex_lock(&a->mu);
  int k = 0;
  for (int i = 0; i < a->ndeferred; i++) {
    tpu_block_header_t* h = a->deferred[i];
    if (named(h->user, h->user + h->size, ctx)) {
      a->deferred[k++] = h; /* the pending trace may use it: still deferred */
      continue;
    }
    block_fence(h); /* fenced on the work queued so far, like any free */
    cache_push(a, h);
  }
  int released = a->ndeferred - k;
  a->ndeferred = k;
  pthread_mutex_unlock(&a->mu);
  return released;
}

void tpu_device_empty_cache(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  tpu_status_free(tpu_device_flush_pending(device));
  tpu_device_wait_idle(device);
  release_cache(&d->alloc);
}

void tpu_device_memory_stats(int device, tpu_memory_stats_t* out) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) {
    memset(out, 0, sizeof(*out));
    return;
  }
  pthread_mutex_lock(&d->alloc.mu);
  *out = d->alloc.stats;
  out->promised_bytes = (int64_t)d->alloc.promised;
  pthread_mutex_unlock(&d->alloc.mu);
}

void tpu_device_reset_peak_stats(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  pthread_mutex_lock(&d->alloc.mu);
  tpu_memory_stats_t* s = &d->alloc.stats;
  s->peak_allocated_bytes = s->allocated_bytes;
  s->peak_reserved_bytes = s->reserved_bytes;
  s->peak_active_allocations = s->active_allocations;
  pthread_mutex_unlock(&d->alloc.mu);
}

void tpu_device_reset_accumulated_stats(int device) {
  tpu_device_state_t* d = tpu_device_state(device);
  if (!d) return;
  pthread_mutex_lock(&d->alloc.mu);
  tpu_memory_stats_t* s = &d->alloc.stats;
  s->total_allocated_bytes = s->total_freed_bytes = 0;
  s->num_allocs = s->num_frees = s->num_ooms = s->num_cache_hits = 0;
  s->num_device_alloc = s->num_device_free = 0;
  pthread_mutex_unlock(&d->alloc.mu);
}

int tpu_device_of_ptr(const void* ptr) {
  if (!ptr || tpu_runtime_in_bad_fork()) return -1; /* the lock may be held by a dead thread */
  int device = -1;
  pthread_mutex_lock(&g_blocks.mu);
  size_t i = blocks_upper(ptr);
  if (i > 0) {
    const tpu_block_header_t* h = g_blocks.v[i - 1];
    const char* user = h->user;
    const char* p = ptr;
    /* inside the user part of a live block; its end only for an empty view */
    if (p >= user && p < user + (h->size ? h->size : 1) && h->live) device = h->device;
  }
  pthread_mutex_unlock(&g_blocks.mu);
  return device;
}
