/* Streams: the fixed pool, stream-ordered block lifetime, wait_stream. */
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

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_pool_round_robin();
  test_block_waits_for_other_stream();
  test_wait_stream();
  if (g_failures) {
    fprintf(stderr, "test_streams: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_streams: ok\n");
  return 0;
}
