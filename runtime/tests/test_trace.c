/* The DeferAndFuse trace and its placeholders, through the public API:
 * placeholder addresses and their backing, program order across a flush,
 * liveness (a dropped intermediate becomes a graph temporary, a node whose
 * result nobody can observe is dropped), the epoch, and a flush that fails
 * for lack of memory keeping everything for a retry. Fusion is off so that
 * the test is about the trace, not the code generator. */
#include "test_util.h"
#include "device/internal.h"
#include "tpu/trace.h"

#define N 16

static tpu_stream_t* dflt(void) { return tpu_stream_get(0, 0); }

/* Submits op(args) -> out on the default stream (DeferAndFuse: traced). */
static void submit(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* out) {
  tpu_call_t c = {0};
  c.op = tpu_op_lookup(name);
  CHECK(c.op != NULL);
  c.args = args;
  c.nargs = nargs;
  c.outs = out;
  c.nouts = 1;
  CHECK_OK(tpu_stream_submit(dflt(), &c));
}

static void test_placeholders(void) {
  int before = tpu_lazy_count();
  char* p = tpu_lazy_alloc(0, 4096);
  CHECK(p != NULL);
  if (!p) return;
  CHECK(tpu_is_lazy(p) && tpu_is_lazy(p + 4095));
  char host[8];
  CHECK(!tpu_is_lazy(host));
  CHECK(tpu_lazy_count() == before + 1);
  CHECK(tpu_lazy_resolve(p) == NULL); /* nothing behind it yet */
  tpu_memory_stats_t s;
  tpu_device_memory_stats(0, &s);
  const int64_t alloc_before = s.allocated_bytes;
  CHECK(s.promised_bytes >= 4096); /* reserved against the capacity at once */
  char* real = NULL;
  CHECK_OK(tpu_lazy_realize(p + 100, (void**)&real)); /* an interior pointer */
  CHECK(real != NULL && !tpu_is_lazy(real));
  tpu_device_memory_stats(0, &s); /* memory now: allocated, no longer promised */
  CHECK(s.allocated_bytes >= alloc_before + 4096 && s.promised_bytes == 0);
  char* base = tpu_lazy_resolve(p);
  CHECK(base != NULL && real == base + 100);
  CHECK(tpu_device_of_ptr(base) == 0);
  memset(base, 7, 4096);
  char* owned = tpu_lazy_detach(p);
  CHECK(owned == base);
  tpu_lazy_free(p);
  CHECK(tpu_lazy_count() == before);
  CHECK(owned[4095] == 7); /* the memory is the caller's now */
  tpu_device_free(0, owned);
  /* an unbacked placeholder dropped by the host gives its reservation back */
  tpu_device_memory_stats(0, &s);
  int64_t alloc0 = s.allocated_bytes;
  void* q = tpu_lazy_alloc(0, 1 << 20);
  CHECK(q != NULL);
  tpu_device_memory_stats(0, &s);
  CHECK(s.allocated_bytes == alloc0 && s.promised_bytes == 1 << 20); /* no memory yet */
  tpu_lazy_free(q);
  CHECK_OK(tpu_trace_flush(0));
  tpu_device_memory_stats(0, &s);
  CHECK(s.allocated_bytes == alloc0 && s.promised_bytes == 0);
  CHECK(tpu_lazy_count() == before);
}

static void test_liveness_and_order(void) {
  int64_t n[1] = {N};
  float *x = NULL, *y = NULL;
  CHECK_OK(tpu_device_malloc(0, N * sizeof(float), (void**)&x));
  CHECK_OK(tpu_device_malloc(0, N * sizeof(float), (void**)&y));
  for (int i = 0; i < N; i++) {
    x[i] = (float)i - 8.0f;
    y[i] = 0.5f;
  }
  void *t1 = tpu_lazy_alloc(0, N * 4), *t2 = tpu_lazy_alloc(0, N * 4);
  void *t3 = tpu_lazy_alloc(0, N * 4), *t4 = tpu_lazy_alloc(0, N * 4);
  CHECK(t1 && t2 && t3 && t4);
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, n), ty = tt_make(y, TPU_F32, 1, n);
  tpu_tensor_t o1 = tt_make(t1, TPU_F32, 1, n), o2 = tt_make(t2, TPU_F32, 1, n);
  tpu_tensor_t o3 = tt_make(t3, TPU_F32, 1, n), o4 = tt_make(t4, TPU_F32, 1, n);
  tpu_trace_reset_stats();
  uint64_t epoch = tpu_trace_epoch(0);
  tpu_arg_t a1[3] = {ta_t(&tx), ta_t(&ty), ta_d(1.0)};
  submit("add.Tensor", a1, 3, &o1); /* t1 = x + y */
  tpu_tensor_t i1 = o1, i2 = o2, i1b = o1;
  tpu_arg_t a2[1] = {ta_t(&i1)};
  submit("relu", a2, 1, &o2); /* t2 = relu(t1) */
  tpu_arg_t a3[2] = {ta_t(&i2), ta_d(2.0)};
  submit("mul.Scalar", a3, 2, &o3); /* t3 = 2 t2 */
  tpu_arg_t a4[2] = {ta_t(&i1b), ta_d(5.0)};
  submit("mul.Scalar", a4, 2, &o4); /* t4 = 5 t1: nobody will look */
  CHECK(tpu_trace_length(0) == 4);
  CHECK(tpu_trace_epoch(0) == epoch); /* nothing ran yet */
  /* program order: an in-place op on x traced after the reads above */
  tpu_tensor_t tx2 = tx;
  tpu_arg_t a5[2] = {ta_t(&tx2), ta_d(100.0)};
  tpu_call_t c = {0};
  c.op = tpu_op_lookup("mul_.Scalar");
  CHECK(c.op != NULL);
  c.args = a5;
  c.nargs = 2;
  c.outs = &tx2;
  c.nouts = 1;
  c.mutated_args = 1;
  CHECK_OK(tpu_stream_submit(dflt(), &c)); /* x *= 100, after the reads above */
  tpu_lazy_free(t1); /* dead, but relu needs it: a graph temporary */
  tpu_lazy_free(t4); /* dead, and nothing reads it: its node is dropped */
  CHECK_OK(tpu_trace_flush(0));
  CHECK(tpu_trace_length(0) == 0);
  CHECK(tpu_trace_epoch(0) == epoch + 1);
  CHECK_OK(tpu_stream_synchronize(dflt()));
  tpu_trace_stats_t st;
  tpu_trace_get_stats(&st);
  CHECK(st.flushes == 1);
  CHECK(st.nodes == 5);
  CHECK(st.nodes_dropped == 1);
  CHECK(st.temps == 1 && st.temp_bytes >= N * 4);
  CHECK(st.nodes_fused == 0);
  const float* r2 = tpu_lazy_resolve(t2);
  const float* r3 = tpu_lazy_resolve(t3);
  CHECK(r2 != NULL && r3 != NULL);
  if (r2 && r3) {
    for (int i = 0; i < N; i++) {
      float ref = (float)i - 8.0f + 0.5f;
      ref = ref > 0 ? ref : 0;
      CHECK(r2[i] == ref);
      CHECK(r3[i] == 2 * ref);
      CHECK(x[i] == ((float)i - 8.0f) * 100.0f); /* the in-place op ran last */
    }
  }
  tpu_device_free(0, tpu_lazy_detach(t2));
  tpu_lazy_free(t2);
  tpu_device_free(0, tpu_lazy_detach(t3));
  tpu_lazy_free(t3);
  tpu_device_free(0, x);
  tpu_device_free(0, y);
}

/* A flush that cannot get memory for a temporary fails with
 * RESOURCE_EXHAUSTED, runs nothing and keeps its nodes; once memory is freed
 * the same flush succeeds. Capacity 8 MiB. */
static void test_flush_oom_keeps_trace(void) {
  tpu_device_empty_cache(0);
  const size_t mib2 = (size_t)2 << 20;
  int64_t n[1] = {(int64_t)(mib2 / 4)};
  float* x = NULL;
  CHECK_OK(tpu_device_malloc(0, mib2, (void**)&x)); /* 2 MiB */
  for (int64_t i = 0; i < n[0]; i++) x[i] = 1.0f;
  void* t1 = tpu_lazy_alloc(0, mib2); /* reserved: 4 MiB */
  void* t2 = tpu_lazy_alloc(0, mib2); /* reserved: 6 MiB */
  CHECK(t1 && t2);
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, n), o1 = tt_make(t1, TPU_F32, 1, n);
  tpu_tensor_t o2 = tt_make(t2, TPU_F32, 1, n), i1 = o1;
  tpu_arg_t a1[2] = {ta_t(&tx), ta_d(3.0)};
  submit("mul.Scalar", a1, 2, &o1); /* t1 = 3x */
  tpu_arg_t a2[2] = {ta_t(&i1), ta_d(1.0)};
  submit("add.Scalar", a2, 2, &o2); /* t2 = t1 + 1 */
  tpu_lazy_free(t1); /* dead: the trace still computes it, so it stays reserved */
  void* hog = NULL;
  /* a plain allocation that does not fit beside the reservations flushes
   * the trace first, as Strict would have freed t1 by now */
  CHECK_OK(tpu_device_malloc(0, (size_t)3 << 20, &hog)); /* 2 (x) + 2 (t2) + 3 */
  CHECK(tpu_trace_length(0) == 0);
  CHECK_OK(tpu_stream_synchronize(dflt()));
  CHECK(((const float*)tpu_lazy_resolve(t2))[0] == 4.0f);
  tpu_device_free(0, hog);
  /* the same trace again, with 3 MiB taken past the check (a forced
   * reservation) after t1 died */
  tpu_lazy_free(t2);
  tpu_device_empty_cache(0);
  t1 = tpu_lazy_alloc(0, mib2);
  CHECK(t1 != NULL);
  o1 = tt_make(t1, TPU_F32, 1, n);
  i1 = o1;
  a1[0] = ta_t(&tx);
  a2[0] = ta_t(&i1);
  t2 = tpu_lazy_alloc(0, mib2);
  CHECK(t2 != NULL);
  o2 = tt_make(t2, TPU_F32, 1, n);
  submit("mul.Scalar", a1, 2, &o1);
  submit("add.Scalar", a2, 2, &o2);
  tpu_lazy_free(t1);
  CHECK_OK(tpu_device_reserve(0, (size_t)3 << 20, true)); /* 2 + 2 + 2 + 3 */
  /* the flush backs t2 and a temporary for t1 (in place of its
   * reservation) beside x and the forced 3 MiB: 9 MiB do not fit */
  tpu_status_t st = tpu_trace_flush(0);
  CHECK(st != TPU_OK);
  if (st) {
    CHECK(tpu_status_code(st) == TPU_CODE_RESOURCE_EXHAUSTED);
    tpu_status_free(st);
  }
  CHECK(tpu_trace_length(0) == 2); /* nothing lost */
  CHECK(tpu_lazy_resolve(t2) == NULL);
  CHECK(x[0] == 1.0f);
  tpu_device_unreserve(0, (size_t)3 << 20);
  CHECK_OK(tpu_trace_flush(0)); /* the retry fits */
  CHECK(tpu_trace_length(0) == 0);
  CHECK_OK(tpu_stream_synchronize(dflt()));
  const float* r = tpu_lazy_resolve(t2);
  CHECK(r != NULL);
  if (r) CHECK(r[0] == 4.0f && r[n[0] - 1] == 4.0f);
  tpu_device_free(0, tpu_lazy_detach(t2));
  tpu_lazy_free(t2);
  tpu_device_free(0, x);
}

/* Recomputation: g = relu(a) with a and g both kept, g read in the same
 * graph: the flush leaves g without memory (a recipe) and keeps a. A later
 * node reading g runs the recipe first; the host's drop of a while the
 * recipe still reads it keeps a's memory until then. */
static void test_recompute(void) {
  enum { M = 1 << 16 }; /* 256 KiB: the smallest value worth recomputing */
  const int slots_before = tpu_lazy_count();
  int64_t n[1] = {M};
  float* x = NULL;
  CHECK_OK(tpu_device_malloc(0, M * sizeof(float), (void**)&x));
  for (int i = 0; i < M; i++) x[i] = (float)(i % 7) - 3.0f;
  void *a = tpu_lazy_alloc(0, M * 4), *g = tpu_lazy_alloc(0, M * 4);
  void *s = tpu_lazy_alloc(0, M * 4), *h = tpu_lazy_alloc(0, M * 4);
  CHECK(a && g && s && h);
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, n), ta = tt_make(a, TPU_F32, 1, n);
  tpu_tensor_t tg = tt_make(g, TPU_F32, 1, n), ts = tt_make(s, TPU_F32, 1, n);
  tpu_tensor_t th = tt_make(h, TPU_F32, 1, n), ia = ta, ig = tg, ig2 = tg;
  tpu_trace_reset_stats();
  tpu_arg_t a1[3] = {ta_t(&tx), ta_d(0.5), ta_d(1.0)};
  submit("add.Scalar", a1, 3, &ta); /* a = x + 0.5 */
  tpu_arg_t a2[1] = {ta_t(&ia)};
  submit("relu", a2, 1, &tg); /* g = relu(a) */
  tpu_arg_t a3[2] = {ta_t(&ig), ta_d(2.0)};
  submit("mul.Scalar", a3, 2, &ts); /* s = 2 g */
  CHECK_OK(tpu_trace_flush(0));
  tpu_trace_stats_t st;
  tpu_trace_get_stats(&st);
  CHECK(st.recipes == 1 && st.recipe_bytes == M * 4 && st.recomputed == 0);
  CHECK(tpu_lazy_resolve(g) == NULL); /* no memory: recomputed when used */
  CHECK(tpu_lazy_resolve(a) != NULL && tpu_lazy_detach(a) == NULL); /* pinned */
  tpu_lazy_free(a); /* the recipe still reads it */
  tpu_arg_t a4[2] = {ta_t(&ig2), ta_d(3.0)};
  submit("mul.Scalar", a4, 2, &th); /* h = 3 g: the recipe runs first */
  CHECK_OK(tpu_trace_flush(0));
  CHECK_OK(tpu_stream_synchronize(dflt()));
  tpu_trace_get_stats(&st);
  CHECK(st.recomputed == 1);
  const float *rg = tpu_lazy_resolve(g), *rs = tpu_lazy_resolve(s), *rh = tpu_lazy_resolve(h);
  CHECK(rg && rs && rh);
  if (rg && rs && rh)
    for (int i = 0; i < M; i++) {
      const float v = (float)(i % 7) - 3.0f + 0.5f, r = v > 0 ? v : 0;
      CHECK(rg[i] == r && rs[i] == 2 * r && rh[i] == 3 * r);
    }
  void* bufs[3] = {g, s, h};
  for (int k = 0; k < 3; k++) {
    tpu_device_free(0, tpu_lazy_detach(bufs[k]));
    tpu_lazy_free(bufs[k]);
  }
  CHECK(tpu_lazy_count() == slots_before); /* a went once the recipe ran */
  tpu_device_free(0, x);
}

int main(void) {
  setenv("TORCH_TPU_FUSION", "0", 1);
  setenv("TORCH_TPU_HBM_BYTES", "8388608", 1);
  CHECK_OK(tpu_runtime_init());
  CHECK_OK(tpu_set_eager_mode(TPU_MODE_DEFER));
  test_placeholders();
  test_liveness_and_order();
  test_flush_oom_keeps_trace();
  test_recompute();
  TEST_MAIN_END();
}
