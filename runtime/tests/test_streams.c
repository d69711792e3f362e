/* Streams: the fixed pool, stream-ordered block lifetime, wait_stream, events
 * (record, query, wait, elapsed time) and the per-stream error slot. */
#include <stdatomic.h>
#include <unistd.h>

#include "test_util.h"

static _Atomic int g_gate;

/* Holds its stream until the gate opens, then reads the block. */
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

static void test_pool_round_robin(void) {
  int64_t first = -1;
  for (int i = 0; i < 1000; i++) {
    int64_t id = -1;
    CHECK_OK(tpu_stream_create(0, &id));
    CHECK(id >= 1 && id <= 32);
    if (i == 0) first = id;
    if (i == 32) CHECK(id == first); /* round-robin over 32 */
    CHECK(tpu_stream_get(0, id) != NULL);
  }
  CHECK(tpu_stream_get(0, 33) == NULL);
  CHECK(tpu_stream_get(0, -1) == NULL);
}

static void test_block_waits_for_other_stream(void) {
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* side = tpu_stream_get(0, id);
  tpu_stream_t* dflt = tpu_stream_get(0, 0);
  const size_t bytes = 1 << 16;
  float* p = NULL;
  CHECK_OK(tpu_device_malloc(0, bytes, (void**)&p));
  p[0] = 42.0f;
  atomic_store(&g_gate, 0);
  gated_read_t* g = calloc(1, sizeof(*g));
  g->src = p;
  CHECK_OK(tpu_stream_enqueue(side, "gated_read", gated_read, g, NULL));
  tpu_device_free(0, p); /* the side stream has not read it yet */
  /* same stream: ordered after the read, so the block may be reused */
  void* q = NULL;
  CHECK_OK(tpu_device_malloc_on(side, bytes, &q));
  CHECK(q == p);
  tpu_device_free(0, q);
  /* another stream must not get it while the side stream may still read it */
  void* r = NULL;
  CHECK_OK(tpu_device_malloc_on(dflt, bytes, &r));
  CHECK(r != p);
  if (r) ((float*)r)[0] = -1.0f;
  atomic_store(&g_gate, 1);
  CHECK_OK(tpu_stream_synchronize(side));
  CHECK(g->seen == 42.0f);
  /* once the side stream passed its fence, the default stream may take it */
  void* t = NULL;
  CHECK_OK(tpu_device_malloc_on(dflt, bytes, &t));
  CHECK(t == p);
  tpu_device_free(0, r);
  tpu_device_free(0, t);
  free(g);
}

static void test_wait_stream(void) {
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* side = tpu_stream_get(0, id);
  tpu_stream_t* dflt = tpu_stream_get(0, 0);
  float v = 7.0f;
  gated_read_t g = {&v, 0};
  atomic_store(&g_gate, 0);
  CHECK_OK(tpu_stream_enqueue(side, "gated_read", gated_read, &g, NULL));
  CHECK_OK(tpu_stream_wait_stream(dflt, side));
  usleep(20000);
  CHECK(!tpu_stream_query(dflt)); /* waits behind the side stream */
  atomic_store(&g_gate, 1);
  CHECK_OK(tpu_stream_synchronize(dflt));
  CHECK(g.seen == 7.0f);
  CHECK(tpu_stream_query(side));
}

/* Sleeps, then counts: work of a known duration for the event tests. */
static _Atomic int g_ran;
static tpu_status_t sleep_fn(void* ctx) {
  usleep((useconds_t)(intptr_t)ctx);
  atomic_fetch_add(&g_ran, 1);
  return TPU_OK;
}

static void test_events(void) {
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* side = tpu_stream_get(0, id);
  tpu_stream_t* dflt = tpu_stream_get(0, 0);
  tpu_event_t *start = NULL, *end = NULL, *never = NULL;
  CHECK_OK(tpu_event_create(&start));
  CHECK_OK(tpu_event_create(&end));
  CHECK_OK(tpu_event_create(&never));
  CHECK(tpu_event_query(never)); /* never recorded: complete, as in CUDA */
  tpu_event_synchronize(never);  /* and does not block */
  /* record around gated work: the end event completes only after it */
  atomic_store(&g_gate, 0);
  float v = 1.5f;
  gated_read_t g = {&v, 0};
  CHECK_OK(tpu_event_record(start, side));
  CHECK_OK(tpu_stream_enqueue(side, "gated_read", gated_read, &g, NULL));
  CHECK_OK(tpu_stream_enqueue(side, "sleep", sleep_fn, (void*)(intptr_t)20000, NULL));
  CHECK_OK(tpu_event_record(end, side));
  usleep(20000);
  CHECK(!tpu_event_query(end));
  /* another stream waits on the event, on its worker, not on the caller */
  atomic_store(&g_ran, 0);
  CHECK_OK(tpu_stream_wait_event(dflt, end));
  CHECK_OK(tpu_stream_enqueue(dflt, "after", sleep_fn, (void*)(intptr_t)0, NULL));
  usleep(20000);
  CHECK(atomic_load(&g_ran) == 0); /* neither the side's sleep nor the waiter ran */
  CHECK(!tpu_stream_query(dflt));
  atomic_store(&g_gate, 1);
  tpu_event_synchronize(end);
  CHECK(tpu_event_query(end));
  CHECK(tpu_event_query(start));
  CHECK(g.seen == 1.5f);
  CHECK_OK(tpu_stream_synchronize(dflt));
  CHECK(atomic_load(&g_ran) == 2);
  double dt = tpu_event_elapsed_seconds(start, end);
  CHECK(dt >= 0.015 && dt < 10.0); /* at least the gated wait and the 20 ms sleep */
  /* re-recording moves the event to the stream's new end */
  CHECK_OK(tpu_stream_enqueue(side, "sleep", sleep_fn, (void*)(intptr_t)30000, NULL));
  CHECK_OK(tpu_event_record(end, side));
  CHECK(!tpu_event_query(end));
  tpu_event_synchronize(end);
  CHECK(tpu_event_query(end));
  CHECK(tpu_event_elapsed_seconds(start, end) >= dt + 0.025);
  /* waiting on an event of the same stream is a no-op */
  CHECK_OK(tpu_stream_wait_event(side, end));
  CHECK_OK(tpu_stream_synchronize(side));
  tpu_event_destroy(start);
  tpu_event_destroy(end);
  tpu_event_destroy(never);
}

/* An error raised by queued work is kept for the next synchronization of its
 * stream only, names the work, and does not stop later work or other streams. */
static tpu_status_t fail_fn(void* ctx) {
  (void)ctx;
  return TPU_ERR(INVALID_ARGUMENT, "index 9 is out of bounds");
}

static void test_error_slot(void) {
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* side = tpu_stream_get(0, id);
  tpu_stream_t* dflt = tpu_stream_get(0, 0);
  atomic_store(&g_ran, 0);
  CHECK_OK(tpu_stream_enqueue(side, "gather_op", fail_fn, NULL, NULL));
  CHECK_OK(tpu_stream_enqueue(side, "after", sleep_fn, (void*)(intptr_t)0, NULL));
  CHECK_OK(tpu_stream_enqueue(dflt, "other", sleep_fn, (void*)(intptr_t)0, NULL));
  CHECK_OK(tpu_stream_synchronize(dflt)); /* the other stream is unaffected */
  tpu_status_t st = tpu_stream_synchronize(side);
  CHECK(st != TPU_OK);
  if (st) {
    CHECK(strstr(tpu_status_message(st), "gather_op") != NULL);
    CHECK(strstr(tpu_status_message(st), "index 9 is out of bounds") != NULL);
    tpu_status_free(st);
  }
  CHECK(atomic_load(&g_ran) == 2);
  CHECK_OK(tpu_stream_synchronize(side)); /* taken by the first synchronization */
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_pool_round_robin();
  test_block_waits_for_other_stream();
  test_wait_stream();
  test_events();
  test_error_slot();
  if (g_failures) {
    fprintf(stderr, "test_streams: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_streams: ok\n");
  return 0;
}
