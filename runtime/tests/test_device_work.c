/* The device layer on its own: streams run opaque work items in order, keep
 * the first error for the next synchronization, release every item once, run
 * inline only when idle, and reach the layer above only through its hooks. */
#include <stdatomic.h>
#include <unistd.h>

#include "device/internal.h"
#include "test_util.h"

typedef struct {
  tpu_work_t work;
  int index;
  int* log;
  int* nlog;
  bool fail;
} item_t;

static _Atomic int g_released;
static _Atomic int g_gate = 1;

static tpu_status_t item_run(tpu_work_t* w) {
  item_t* it = (item_t*)w;
  while (!atomic_load(&g_gate)) usleep(1000);
  it->log[(*it->nlog)++] = it->index;
  return it->fail ? TPU_ERR(INVALID_ARGUMENT, "item %d failed", it->index) : TPU_OK;
}

static void item_release(tpu_work_t* w) {
  atomic_fetch_add(&g_released, 1);
  free(w);
}

static void push_item(tpu_stream_t* s, const char* what, int index, int* log, int* nlog, bool fail) {
  item_t* it = calloc(1, sizeof(*it));
  it->work.what = what;
  it->work.run = item_run;
  it->work.release = item_release;
  it->index = index;
  it->log = log;
  it->nlog = nlog;
  it->fail = fail;
  tpu_stream_push(s, &it->work);
}

static void test_order_errors_release(void) {
  tpu_stream_t* s = tpu_stream_get(0, 0);
  enum { N = 300 };
  static int log[N];
  int nlog = 0;
  atomic_store(&g_released, 0);
  for (int i = 0; i < N; i++) push_item(s, i == 7 || i == 9 ? "bad_op" : "op", i, log, &nlog, i == 7 || i == 9);
  tpu_status_t st = tpu_stream_synchronize(s);
  CHECK(st != NULL);
  if (st) { /* the first error, named after its item; later items still ran */
    CHECK(strstr(tpu_status_message(st), "aten::bad_op") != NULL);
    CHECK(strstr(tpu_status_message(st), "item 7 failed") != NULL);
    tpu_status_free(st);
  }
  CHECK(nlog == N);
  for (int i = 0; i < N && i < nlog; i++) CHECK(log[i] == i);
  CHECK(atomic_load(&g_released) == N);
  CHECK_OK(tpu_stream_synchronize(s)); /* the error was taken */
}

static int g_inline_runs;
static tpu_status_t inline_fn(const void* ctx) {
  g_inline_runs++;
  return *(const bool*)ctx ? TPU_ERR(INTERNAL, "inline failed") : TPU_OK;
}

static void test_run_if_idle(void) {
  int64_t id = 0;
  CHECK_OK(tpu_stream_create(0, &id));
  tpu_stream_t* s = tpu_stream_get(0, id);
  CHECK_OK(tpu_stream_synchronize(s));
  bool fail = true;
  g_inline_runs = 0;
  CHECK(tpu_stream_run_if_idle(s, "inline_op", inline_fn, &fail));
  CHECK(g_inline_runs == 1);
  tpu_status_t st = tpu_stream_synchronize(s); /* the inline error waits for the sync */
  CHECK(st && strstr(tpu_status_message(st), "aten::inline_op") != NULL);
  tpu_status_free(st);
  /* busy stream: nothing runs on the caller */
  static int log[1];
  int nlog = 0;
  atomic_store(&g_gate, 0);
  push_item(s, "gated", 0, log, &nlog, false);
  fail = false;
  CHECK(!tpu_stream_run_if_idle(s, "inline_op", inline_fn, &fail));
  CHECK(g_inline_runs == 1);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpu_stream_synchronize(s));
  CHECK(nlog == 1);
}

/* A stand-in for the execution layer: `g_pending` calls wait outside the
 * streams; the fake address g_fake stands for the buffer g_real. */
static int g_pending, g_flushes;
static float g_real[4];
static char g_fake_region[64];
static void* const g_fake = g_fake_region + 16;

static int fake_pending(int device) { return device == 0 ? g_pending : 0; }
static tpu_status_t fake_flush(int device) {
  g_flushes++;
  g_pending = 0;
  return TPU_OK;
}
static tpu_status_t fake_realize(const void* p, tpu_stream_t* s, void** out) {
  *out = p == g_fake ? (void*)g_real : (void*)p;
  return TPU_OK;
}
static const tpu_device_hooks_t g_fake_hooks = {
    .pending = fake_pending, .flush = fake_flush, .realize = fake_realize};

static void test_hooks(void) {
  tpu_stream_t* s = tpu_stream_get(0, 0);
  /* no hooks: nothing pending, every address is real */
  CHECK(tpu_device_pending_work(0) == 0);
  CHECK_OK(tpu_device_flush_pending(0));
  void* out = NULL;
  CHECK_OK(tpu_device_realize(g_fake, s, &out));
  CHECK(out == g_fake);
  tpu_device_set_hooks(&g_fake_hooks);
  g_flushes = 0;
  CHECK_OK(tpu_stream_synchronize(s)); /* nothing pending: no flush */
  CHECK(g_flushes == 0);
  g_pending = 3;
  CHECK_OK(tpu_stream_synchronize(s));
  CHECK(g_flushes == 1 && g_pending == 0);
  g_pending = 1;
  CHECK_OK(tpu_device_synchronize(0));
  CHECK(g_flushes == 2);
  /* copies flush first and touch the real buffer behind a placeholder */
  g_pending = 1;
  const float src[4] = {1, 2, 3, 4};
  CHECK_OK(tpu_stream_copy_h2d(s, g_fake, src, sizeof src));
  CHECK(g_flushes == 3);
  CHECK_OK(tpu_stream_synchronize(s));
  CHECK(g_real[0] == 1 && g_real[3] == 4);
  float back[4] = {0};
  g_real[2] = 30;
  CHECK_OK(tpu_stream_copy_d2h(s, back, g_fake, sizeof back));
  CHECK(back[2] == 30 && back[3] == 4);
  tpu_device_set_hooks(NULL);
  g_pending = 5;
  CHECK(tpu_device_pending_work(0) == 0);
  g_pending = 0;
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_order_errors_release();
  test_run_if_idle();
  test_hooks();
  if (g_failures) {
    fprintf(stderr, "test_device_work: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_device_work: ok\n");
  return 0;
}
