/* The target interface (tpu/target.h) on the host target: the start-up
 * choice (unknown names refused with the known ones, chosen once), device
 * count and properties, buffers and the target's memory statistics, copies
 * sync and stream-ordered, the kernel inventory behind the op table, and a
 * graph prepared, run and released through the interface. */
#define TT_NO_TARGET /* this test makes the choice itself */
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "device/internal.h"
#include "exec/graph.h"
#include "test_util.h"

static bool has(const char* text, const char* what) {
  if (text && strstr(text, what)) return true;
  fprintf(stderr, "missing in '%s': %s\n", text ? text : "(null)", what);
  return false;
}

static void expect_error(tpu_status_t st, tpu_status_code_t code, const char* a, const char* b) {
  CHECK(st != NULL);
  if (!st) return;
  CHECK(tpu_status_code(st) == code);
  CHECK(has(tpu_status_message(st), a));
  if (b) CHECK(has(tpu_status_message(st), b));
  tpu_status_free(st);
}

/* Before a target is chosen: no ops, no runtime, and the choice is still open. */
static void test_choice(void) {
  CHECK(tpu_target_get() == NULL);
  CHECK(tpu_target_name() == NULL);
  CHECK(tpu_op_count() == 0);
  CHECK(tpu_op_lookup("add.Tensor") == NULL);
  expect_error(tpu_runtime_init(), TPU_CODE_INTERNAL, "no target is registered", NULL);

  CHECK(tpu_targets_find("host") == tpu_host_target());
  CHECK(tpu_targets_find("pjrt-nonesuch") == NULL);
  CHECK(has(tpu_targets_known(), "host"));
  expect_error(tpu_targets_select("bogus"), TPU_CODE_INVALID_ARGUMENT, "'bogus'", "known targets: host");
  setenv("TORCH_TPU_TARGET", "nope", 1);
  expect_error(tpu_targets_select_from_env(), TPU_CODE_INVALID_ARGUMENT, "TORCH_TPU_TARGET='nope'",
               "known targets: host");
  CHECK(tpu_target_get() == NULL); /* a refused name registers nothing */

  setenv("TORCH_TPU_TARGET", "", 1); /* empty: the default, host */
  CHECK_OK(tpu_targets_select_from_env());
  CHECK(tpu_target_get() == tpu_host_target());
  CHECK(strcmp(tpu_target_name(), "host") == 0);
  CHECK_OK(tpu_targets_select("host")); /* the same again: a no-op */

  /* an incomplete table is refused, naming the missing entry */
  static tpu_target_iface_t half_iface;
  half_iface = *tpu_host_target()->iface;
  half_iface.name = "half";
  half_iface.graph_run = NULL;
  static tpu_target_t half = {&half_iface, NULL};
  expect_error(tpu_target_set(&half), TPU_CODE_INVALID_ARGUMENT, "'half'", "no graph_run entry");
  /* another target after the choice is refused, naming both */
  static tpu_target_iface_t other_iface;
  other_iface = *tpu_host_target()->iface;
  other_iface.name = "other";
  static tpu_target_t other = {&other_iface, NULL};
  expect_error(tpu_target_set(&other), TPU_CODE_INVALID_ARGUMENT, "'host' is running", "'other'");
  CHECK(tpu_target_get() == tpu_host_target());
}

static void test_devices(const tpu_target_t* t) {
  int n = 0;
  CHECK_OK(t->iface->device_count(t->ctx, &n));
  CHECK(n == 2); /* TORCH_TPU_HOST_DEVICES, set in main */
  CHECK(n == tpu_device_count());
  tpu_target_device_props_t p;
  CHECK_OK(t->iface->device_props(t->ctx, 1, &p));
  CHECK(strcmp(p.name, "host") == 0);
  CHECK(p.memory_bytes == ((int64_t)64 << 20)); /* TORCH_TPU_HBM_BYTES */
  CHECK(p.host_addressable);
  CHECK(p.alignment >= 64);
  expect_error(t->iface->device_props(t->ctx, 2, &p), TPU_CODE_INVALID_ARGUMENT, "no device 2", NULL);
  tpu_memory_stats_t ms;
  tpu_device_memory_stats(1, &ms);
  CHECK(ms.capacity_bytes == ((int64_t)64 << 20)); /* the allocator's capacity is the target's */
}

static void test_buffers(const tpu_target_t* t) {
  tpu_target_memory_stats_t before, mid, after;
  t->iface->memory_stats(t->ctx, 0, &before);
  CHECK(before.bytes_limit == ((int64_t)64 << 20));
  void *a = NULL, *b = NULL;
  CHECK_OK(t->iface->buffer_alloc(t->ctx, 0, 1000, &a));
  CHECK_OK(t->iface->buffer_alloc(t->ctx, 0, (size_t)5 << 20, &b));
  CHECK(a && b);
  CHECK((uintptr_t)a % 64 == 0);
  CHECK((uintptr_t)b % ((uintptr_t)2 << 20) == 0); /* large blocks: huge-page aligned */
  t->iface->memory_stats(t->ctx, 0, &mid);
  CHECK(mid.bytes_in_use == before.bytes_in_use + 1000 + ((int64_t)5 << 20));
  CHECK(mid.peak_bytes_in_use >= mid.bytes_in_use);
  CHECK(mid.num_allocs == before.num_allocs + 2);
  memset(a, 0x5a, 1000); /* host-addressable */
  t->iface->buffer_free(t->ctx, 0, a, 1000);
  t->iface->buffer_free(t->ctx, 0, b, (size_t)5 << 20);
  t->iface->memory_stats(t->ctx, 0, &after);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.num_frees == before.num_frees + 2);
  expect_error(t->iface->buffer_alloc(t->ctx, 7, 64, &a), TPU_CODE_INVALID_ARGUMENT, "no device 7", NULL);

  /* the caching allocator takes its new blocks from the target */
  void* p = NULL;
  tpu_device_empty_cache(0);
  t->iface->memory_stats(t->ctx, 0, &before);
  CHECK_OK(tpu_device_malloc(0, 4096, &p));
  t->iface->memory_stats(t->ctx, 0, &mid);
  CHECK(mid.num_allocs == before.num_allocs + 1);
  CHECK(mid.bytes_in_use >= before.bytes_in_use + 4096);
  tpu_device_free(0, p);
  tpu_device_empty_cache(0); /* the cached block goes back to the target */
  t->iface->memory_stats(t->ctx, 0, &after);
  CHECK(after.bytes_in_use == before.bytes_in_use);
}

static void test_sync_copies(const tpu_target_t* t) {
  enum { N = 1000 };
  float host[N], back[N];
  for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
  void *d0 = NULL, *d1 = NULL;
  CHECK_OK(tpu_device_malloc(0, sizeof host, &d0));
  CHECK_OK(tpu_device_malloc(1, sizeof host, &d1));
  CHECK_OK(t->iface->copy_h2d(t->ctx, 0, d0, host, sizeof host));
  CHECK_OK(t->iface->copy_d2d(t->ctx, 1, d1, 0, d0, sizeof host)); /* across devices */
  memset(back, 0, sizeof back);
  CHECK_OK(t->iface->copy_d2h(t->ctx, 1, back, d1, sizeof back));
  CHECK(memcmp(back, host, sizeof host) == 0);
  CHECK_OK(t->iface->copy_h2d(t->ctx, 0, d0, host, 0)); /* zero bytes: nothing */
  tpu_device_free(0, d0);
  tpu_device_free(1, d1);
}

/* A work item that holds the stream until the gate opens, so the copies
 * queued behind it provably have not run when the calls return. */
static _Atomic int g_gate;
static tpu_status_t gate_fn(void* ctx) {
  while (!atomic_load(&g_gate)) usleep(100);
  return TPU_OK;
}

static void test_stream_copies(const tpu_target_t* t) {
  enum { N = 4096 };
  static int32_t src[N], mid[N], dst[N];
  for (int i = 0; i < N; i++) src[i] = i * 7 - 3;
  tpu_stream_t* s = tpu_stream_get(0, 0);
  CHECK(s != NULL);
  void *a = NULL, *b = NULL;
  CHECK_OK(tpu_device_malloc(0, sizeof src, &a));
  CHECK_OK(tpu_device_malloc(0, sizeof src, &b));
  atomic_store(&g_gate, 0);
  CHECK_OK(tpu_stream_enqueue_raw(s, "gate", gate_fn, NULL, NULL));
  CHECK_OK(t->iface->copy_h2d_async(t->ctx, s, a, src, sizeof src));
  for (int i = 0; i < N; i++) src[i] = -1; /* h2d read its source before returning */
  CHECK_OK(t->iface->copy_d2d_async(t->ctx, s, b, a, sizeof src));
  memset(dst, 0, sizeof dst);
  CHECK_OK(t->iface->copy_d2h_async(t->ctx, s, dst, b, sizeof dst));
  CHECK(!tpu_stream_query(s)); /* held by the gate */
  CHECK(dst[5] == 0);          /* nothing ran yet */
  atomic_store(&g_gate, 1);
  CHECK_OK(tpu_stream_synchronize(s));
  bool ok = true;
  for (int i = 0; i < N; i++) ok &= dst[i] == i * 7 - 3;
  CHECK(ok);
  /* the device layer's copies go through the same entries */
  for (int i = 0; i < N; i++) src[i] = 3 * i;
  CHECK_OK(tpu_stream_copy_h2d(s, a, src, sizeof src));
  CHECK_OK(tpu_stream_copy_d2d(s, b, a, sizeof src));
  CHECK_OK(tpu_stream_copy_d2h(s, mid, b, sizeof mid));
  ok = true;
  for (int i = 0; i < N; i++) ok &= mid[i] == 3 * i;
  CHECK(ok);
  tpu_device_free(0, a);
  tpu_device_free(0, b);
}

static void test_ops(const tpu_target_t* t) {
  int n = 0;
  const tpu_op_t* inv = t->iface->ops(t->ctx, &n);
  CHECK(inv != NULL && n > 100);
  CHECK(n == tpu_op_count()); /* the op table is the target's inventory */
  CHECK(t->iface->supports_op(t->ctx, "add.Tensor"));
  CHECK(t->iface->supports_op(t->ctx, "mm"));
  CHECK(!t->iface->supports_op(t->ctx, "no_such_op.Tensor"));
  CHECK(!t->iface->supports_op(t->ctx, NULL));
  const tpu_op_t* add = tpu_op_lookup("add.Tensor");
  CHECK(add != NULL);
  bool found = false;
  for (int i = 0; i < n; i++)
    if (strcmp(inv[i].name, "add.Tensor") == 0) found = add && inv[i].fn == add->fn;
  CHECK(found);
  for (int i = 0; i < n; i++) CHECK(tpu_op_lookup(inv[i].name) != NULL);
  for (int i = 1; i < tpu_op_count(); i++) CHECK(strcmp(tpu_op_name(i - 1), tpu_op_name(i)) < 0);
}

/* A two-node graph (z = x + y; z *= 2) prepared, inspected, run and
 * released through the interface; fusion is off (TORCH_TPU_FUSION=0 in
 * main), so the target prepares no executable and runs the kernels. */
static void test_graph(const tpu_target_t* t) {
  float x[8], y[8], z[8];
  for (int i = 0; i < 8; i++) x[i] = (float)i, y[i] = 1.0f, z[i] = 0;
  const int64_t sz[1] = {8};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, sz), ty = tt_make(y, TPU_F32, 1, sz),
               tz = tt_make(z, TPU_F32, 1, sz);
  tpu_arg_t add_args[3] = {ta_t(&tx), ta_t(&ty), ta_d(1.0)};
  tpu_arg_t mul_args[2] = {ta_t(&tz), ta_d(2.0)};
  tpu_call_t add = {0}, mul = {0};
  add.op = tpu_op_lookup("add.Tensor");
  add.args = add_args;
  add.nargs = 3;
  add.outs = &tz;
  add.nouts = 1;
  mul.op = tpu_op_lookup("mul_.Scalar");
  mul.args = mul_args;
  mul.nargs = 2;
  mul.outs = &tz;
  mul.nouts = 1;
  mul.mutated_args = 1;
  CHECK(add.op && mul.op);
  if (!add.op || !mul.op) return;
  tpu_call_t* nodes[2] = {tpu_call_clone(&add), tpu_call_clone(&mul)};
  tpu_graph_t g = {nodes, 2, 0, NULL, NULL};
  void* exe = (void*)1;
  CHECK_OK(t->iface->graph_prepare(t->ctx, &g, &exe));
  CHECK(exe == NULL);
  tpu_target_graph_info_t info = {1, 1, 1};
  t->iface->graph_info(t->ctx, exe, &info);
  CHECK(info.fused_nodes == 0 && info.reduction_groups == 0 && info.epilogue_groups == 0);
  CHECK(t->iface->graph_run_position(t->ctx, exe, 1) == 1);
  CHECK(!t->iface->graph_buffer_is_internal(t->ctx, exe, z));
  const char* failed = NULL;
  CHECK_OK(t->iface->graph_run(t->ctx, exe, &g, &failed));
  t->iface->graph_release(t->ctx, exe);
  for (int i = 0; i < 8; i++) CHECK(z[i] == 2.0f * ((float)i + 1.0f));
  free(nodes[0]);
  free(nodes[1]);
  t->iface->graph_release(t->ctx, NULL); /* ignored */
}

int main(void) {
  setenv("TORCH_TPU_HOST_DEVICES", "2", 1);
  setenv("TORCH_TPU_HBM_BYTES", "64M", 1);
  setenv("TORCH_TPU_FUSION", "0", 1);
  test_choice();
  const tpu_target_t* t = tpu_target_get();
  if (!t) TEST_MAIN_END();
  CHECK_OK(tpu_runtime_init());
  test_devices(t);
  test_buffers(t);
  test_sync_copies(t);
  test_stream_copies(t);
  test_ops(t);
  test_graph(t);
  TEST_MAIN_END();
}
