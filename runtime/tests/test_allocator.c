/* The caching allocator: capacity, out-of-memory recovery, statistics, the
 * owner of a pointer, stream-ordered reuse across a failed request, and a
 * flush's held temporaries.
 * Runs with a small capacity (TORCH_TPU_HBM_BYTES set before start-up). */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "device/internal.h"
#include "test_util.h"

#define MIB ((size_t)1 << 20)

static tpu_memory_stats_t stats(void) {
  tpu_memory_stats_t s;
  tpu_device_memory_stats(0, &s);
  return s;
}

static void test_capacity_and_oom_recovery(void) {
  tpu_device_empty_cache(0);
  tpu_device_reset_accumulated_stats(0);
  tpu_memory_stats_t s0 = stats();
  CHECK(s0.capacity_bytes == (int64_t)(8 * MIB));
  void* a = NULL;
  void* b = NULL;
  CHECK_OK(tpu_device_malloc(0, 5 * MIB, &a));
  CHECK(a != NULL);
  /* 5 + 5 MiB do not fit in 8 MiB: a clear error, nothing handed out */
  tpu_status_t st = tpu_device_malloc(0, 5 * MIB, &b);
  CHECK(st != TPU_OK);
  CHECK(b == NULL);
  if (st) {
    CHECK(tpu_status_code(st) == TPU_CODE_RESOURCE_EXHAUSTED);
    const char* msg = tpu_status_message(st);
    CHECK(strstr(msg, "out of memory") != NULL);
    CHECK(strstr(msg, "5242880") != NULL);            /* the request */
    CHECK(strstr(msg, "capacity of 8388608") != NULL); /* the capacity */
    tpu_status_free(st);
  }
  tpu_memory_stats_t s1 = stats();
  CHECK(s1.num_ooms == 1);
  CHECK(s1.allocated_bytes == (int64_t)(5 * MIB));
  CHECK(s1.active_allocations == 1);
  /* the failed request left the allocator usable: the block still works ... */
  memset(a, 0x5a, 5 * MIB);
  CHECK(((unsigned char*)a)[5 * MIB - 1] == 0x5a);
  /* ... and after a free the same request succeeds */
  tpu_device_free(0, a);
  CHECK_OK(tpu_device_malloc(0, 5 * MIB, &b));
  CHECK(b != NULL);
  CHECK(stats().num_cache_hits >= 1); /* the freed block was reused */
  tpu_device_free(0, b);
}

static void test_cache_released_for_other_sizes(void) {
  /* Cached blocks of another size are given back when a request would not
   * fit otherwise: 6 MiB cached + 4 MiB new > 8 MiB. */
  tpu_device_empty_cache(0);
  void* a = NULL;
  CHECK_OK(tpu_device_malloc(0, 6 * MIB, &a));
  tpu_device_free(0, a);
  CHECK(stats().reserved_bytes == (int64_t)(6 * MIB)); /* cached, still reserved */
  CHECK(stats().allocated_bytes == 0);
  void* b = NULL;
  CHECK_OK(tpu_device_malloc(0, 4 * MIB, &b));
  CHECK(b != NULL);
  tpu_memory_stats_t s = stats();
  CHECK(s.reserved_bytes == (int64_t)(4 * MIB));
  CHECK(s.allocated_bytes == (int64_t)(4 * MIB));
  tpu_device_free(0, b);
  tpu_device_empty_cache(0);
  CHECK(stats().reserved_bytes == 0);
}

static void test_stats_and_peaks(void) {
  tpu_device_empty_cache(0);
  tpu_device_reset_accumulated_stats(0);
  tpu_device_reset_peak_stats(0);
  void* p[3] = {0};
  const size_t sizes[3] = {1000, 100 * 1024, 2 * MIB + 1};
  const int64_t rounded[3] = {1024, 100 * 1024, (int64_t)(2 * MIB + 65536)};
  for (int i = 0; i < 3; i++) CHECK_OK(tpu_device_malloc(0, sizes[i], &p[i]));
  tpu_memory_stats_t s = stats();
  int64_t total = rounded[0] + rounded[1] + rounded[2];
  CHECK(s.allocated_bytes == total);
  CHECK(s.peak_allocated_bytes == total);
  CHECK(s.active_allocations == 3);
  CHECK(s.num_allocs == 3);
  CHECK(s.num_device_alloc == 3);
  for (int i = 0; i < 3; i++) {
    CHECK(((uintptr_t)p[i] & 63) == 0); /* 64-byte aligned */
    tpu_device_free(0, p[i]);
  }
  s = stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.peak_allocated_bytes == total);
  CHECK(s.num_frees == 3);
  CHECK(s.total_allocated_bytes == total && s.total_freed_bytes == total);
  tpu_device_reset_peak_stats(0);
  CHECK(stats().peak_allocated_bytes == 0);
  /* zero bytes: no block, no error */
  void* z = (void*)1;
  CHECK_OK(tpu_device_malloc(0, 0, &z));
  CHECK(z == NULL);
  tpu_device_free(0, NULL);
}

static void test_owner_of_pointer(void) {
  char* p = NULL;
  CHECK_OK(tpu_device_malloc(0, 4096, (void**)&p));
  CHECK(tpu_device_of_ptr(p) == 0);
  CHECK(tpu_device_of_ptr(p + 1) == 0);    /* inside the block */
  CHECK(tpu_device_of_ptr(p + 4095) == 0);
  CHECK(tpu_device_of_ptr(p - 1) == -1);   /* the header in front is not user memory */
  char host[64];
  CHECK(tpu_device_of_ptr(host) == -1);    /* host memory: no read in front of it */
  CHECK(tpu_device_of_ptr(host + 32) == -1);
  CHECK(tpu_device_of_ptr(NULL) == -1);
  tpu_device_free(0, p);
  CHECK(tpu_device_of_ptr(p) == -1);       /* cached, not live */
  tpu_device_empty_cache(0);
  CHECK(tpu_device_of_ptr(p) == -1);       /* returned to the system */
}

/* A request that fails while another stream still holds work on a freed
 * block must not hand that block out early, and must leave the work intact. */
static _Atomic int g_gate;
typedef struct {
  const float* src;
  float seen;
} gated_read_t;
static tpu_status_t gated_read(void* ctx) {
  gated_read_t* g = ctx;
  while (!atomic_load(&g_gate)) usleep(1000);
  g->seen = g->src[0];
  return TPU_OK;
}

static void* open_gate_later(void* arg) {
  (void)arg;
  usleep(50 * 1000);
  atomic_store(&g_gate, 1);
  return NULL;
}

static void test_oom_waits_for_queued_reader(void) {
  tpu_device_empty_cache(0);
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* side = tpu_stream_get(0, id);
  float* p = NULL;
  CHECK_OK(tpu_device_malloc(0, 6 * MIB, (void**)&p));
  p[0] = 3.5f;
  atomic_store(&g_gate, 0);
  gated_read_t g = {p, 0};
  CHECK_OK(tpu_stream_enqueue(side, "gated_read", gated_read, &g, NULL));
  tpu_device_free(0, p); /* cached, fenced on the side stream */
  /* the allocation below needs the cache released, which must wait for the
   * side stream's read: a thread opens the gate a little later */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, open_gate_later, NULL) == 0);
  void* q = NULL;
  CHECK_OK(tpu_device_malloc(0, 4 * MIB, &q)); /* drains, releases the 6 MiB block */
  CHECK(atomic_load(&g_gate) == 1); /* it did wait for the reader */
  pthread_join(t, NULL);
  CHECK_OK(tpu_stream_synchronize(side));
  CHECK(g.seen == 3.5f);
  tpu_device_free(0, q);
}

/* A flush frees a temporary before its graph is queued
 * (tpu_device_free_held): only the same flush (this thread, the graph's
 * stream) may take the block again; another stream, or another thread on
 * the graph's stream, must not get it before the graph has run, since the
 * graph still writes it. An out-of-memory drain keeps it. Once released,
 * the block is fenced behind what the graph's stream has queued. */
typedef struct {
  tpu_stream_t* s;
  void* got;
} other_alloc_t;
static void* alloc_from_thread(void* arg) {
  other_alloc_t* o = arg;
  tpu_status_t st = tpu_device_malloc_on(o->s, 64 * 1024, &o->got);
  CHECK(st == NULL);
  tpu_status_free(st);
  return NULL;
}

static void test_held_temporary_serves_only_its_flush(void) {
  tpu_device_empty_cache(0);
  int64_t ia = 0, ib = 0;
  CHECK_OK(tpu_stream_create(0, &ia));
  CHECK_OK(tpu_stream_create(0, &ib));
  tpu_stream_t* ga = tpu_stream_get(0, ia); /* the graph's stream */
  tpu_stream_t* gb = tpu_stream_get(0, ib);
  CHECK(ga != gb);
  void* p = NULL;
  CHECK_OK(tpu_device_malloc_on(ga, 64 * 1024, &p));
  tpu_device_free_held(p, ga);
  void* q = NULL;
  CHECK_OK(tpu_device_malloc_on(gb, 64 * 1024, &q));
  CHECK(q != p); /* another stream */
  other_alloc_t o = {ga, NULL};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, alloc_from_thread, &o) == 0);
  pthread_join(t, NULL);
  CHECK(o.got != NULL && o.got != p); /* another thread on the graph's stream */
  void* r = NULL;
  CHECK_OK(tpu_device_malloc_on(ga, 64 * 1024, &r));
  CHECK(r == p); /* the flush itself: a later temporary */
  tpu_device_free_held(r, ga);
  tpu_device_free(0, q);
  tpu_device_free(0, o.got);
  tpu_device_empty_cache(0);
  CHECK(stats().reserved_bytes == 64 * 1024); /* a drain keeps it */
  /* the graph: work on ga that a gate holds back */
  atomic_store(&g_gate, 0);
  float one = 1.0f;
  gated_read_t g = {&one, 0};
  CHECK_OK(tpu_stream_enqueue(ga, "gated_read", gated_read, &g, NULL));
  tpu_device_release_held(0);
  CHECK_OK(tpu_device_malloc_on(gb, 64 * 1024, &q));
  CHECK(q != p); /* fenced behind the gated work */
  atomic_store(&g_gate, 1);
  CHECK_OK(tpu_stream_synchronize(ga));
  void* u = NULL;
  CHECK_OK(tpu_device_malloc_on(gb, 64 * 1024, &u));
  CHECK(u == p); /* the fence has passed */
  tpu_device_free(0, u);
  tpu_device_free(0, q);
  tpu_device_empty_cache(0);
  CHECK(stats().reserved_bytes == 0);
}

int main(void) {
  setenv("TORCH_TPU_HBM_BYTES", "8388608", 1);
  CHECK_OK(tpu_runtime_init());
  test_capacity_and_oom_recovery();
  test_cache_released_for_other_sizes();
  test_stats_and_peaks();
  test_owner_of_pointer();
  test_oom_waits_for_queued_reader();
  test_held_temporary_serves_only_its_flush();
  TEST_MAIN_END();
}
