/* The host target (tpu/target.h): virtual devices backed by host memory,
 * the kernel library of kernels/ (its inventory, ops_all.def), and the
 * fusion of fuse_*.c (planner, code generator, compiler, executor) for graphs.
 *
 * Devices: TORCH_TPU_HOST_DEVICES of them (default 1), each with a capacity
 * of TORCH_TPU_HBM_BYTES (default half the RAM, at most 16 GiB); read once,
 * at the runtime's start-up. Memory is host memory, so every copy is a
 * memcpy and the host may address device memory directly. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/env.h"
#include "device/internal.h"
#include "targets/host/fuse.h"
#include "targets/host/kernels/kernels.h"
#include "tpu/targets.h"

#define HOST_MAX_DEVICES 64

/* ---- devices ---- */
typedef struct {
  _Atomic int64_t in_use, peak, allocs, frees;
} host_mem_t;

typedef struct {
  pthread_once_t once;
  tpu_status_t status; /* of reading the environment */
  int ndevices;
  int64_t capacity;
  host_mem_t mem[HOST_MAX_DEVICES];
} host_t;

static host_t g_host = {.once = PTHREAD_ONCE_INIT};

static void host_read_env(void) {
  int64_t n = tpu_env_int("TORCH_TPU_HOST_DEVICES", 1);
  if (n < 1 || n > HOST_MAX_DEVICES) {
    g_host.status = TPU_ERR(INVALID_ARGUMENT, "TORCH_TPU_HOST_DEVICES=%lld is out of range [1, %d]",
                            (long long)n, HOST_MAX_DEVICES);
    return;
  }
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  int64_t half_ram = (pages > 0 && psize > 0) ? (int64_t)pages * psize / 2 : ((int64_t)16 << 30);
  int64_t dflt = half_ram < ((int64_t)16 << 30) ? half_ram : ((int64_t)16 << 30);
  int64_t cap = tpu_env_int("TORCH_TPU_HBM_BYTES", dflt);
  if (cap <= 0) {
    g_host.status = TPU_ERR(INVALID_ARGUMENT, "TORCH_TPU_HBM_BYTES=%lld must be positive",
                            (long long)cap);
    return;
  }
  /* the chips are alike: visibility only chooses how many this process has */
  int map[HOST_MAX_DEVICES], visible = 0;
  tpu_status_t vs = tpu_env_visible_devices((int)n, map, &visible);
  if (vs) {
    g_host.status = vs;
    return;
  }
  g_host.ndevices = visible;
  g_host.capacity = cap;
}

static host_t* host_of(void* ctx) {
  host_t* h = ctx;
  pthread_once(&h->once, host_read_env);
  return h;
}

static tpu_status_t host_device_count(void* ctx, int* out_count) {
  host_t* h = host_of(ctx);
  *out_count = 0;
  if (h->status) return tpu_status_make(tpu_status_code(h->status), "%s",
                                        tpu_status_message(h->status));
  *out_count = h->ndevices;
  return TPU_OK;
}

static tpu_status_t host_device_props(void* ctx, int device, tpu_target_device_props_t* out) {
  host_t* h = host_of(ctx);
  memset(out, 0, sizeof *out);
  if (h->status || device < 0 || device >= h->ndevices)
    return TPU_ERR(INVALID_ARGUMENT, "host target: no device %d", device);
  out->name = "host";
  out->memory_bytes = h->capacity;
  out->alignment = 64;
  out->host_addressable = true;
  return TPU_OK;
}

/* ---- buffers ---- */
static tpu_status_t host_buffer_alloc(void* ctx, int device, size_t bytes, void** out_ptr) {
  host_t* h = host_of(ctx);
  *out_ptr = NULL;
  if (device < 0 || device >= h->ndevices)
    return TPU_ERR(INVALID_ARGUMENT, "host target: no device %d", device);
  /* Large blocks start on a 2 MiB boundary and ask for transparent huge
   * pages: streaming kernels then take far fewer TLB misses, and the
   * hardware prefetchers, which stop at page boundaries, run longer. */
  const bool huge = bytes >= ((size_t)4 << 20);
  void* mem = NULL;
  if (posix_memalign(&mem, huge ? ((size_t)2 << 20) : 64, bytes) != 0 || !mem)
    return TPU_ERR(RESOURCE_EXHAUSTED,
                   "tpu:%d out of memory: the host could not back %zu bytes of device memory",
                   device, bytes);
#ifdef MADV_HUGEPAGE
  if (huge) madvise(mem, bytes, MADV_HUGEPAGE); /* advice only: errors ignored */
#endif
  host_mem_t* m = &h->mem[device];
  int64_t now = atomic_fetch_add_explicit(&m->in_use, (int64_t)bytes, memory_order_relaxed) +
                (int64_t)bytes;
  int64_t peak = atomic_load_explicit(&m->peak, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&m->peak, &peak, now, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
  atomic_fetch_add_explicit(&m->allocs, 1, memory_order_relaxed);
  *out_ptr = mem;
  return TPU_OK;
}

static void host_buffer_free(void* ctx, int device, void* ptr, size_t bytes) {
  host_t* h = ctx;
  if (!ptr) return;
  free(ptr);
  if (device < 0 || device >= HOST_MAX_DEVICES) return;
  atomic_fetch_sub_explicit(&h->mem[device].in_use, (int64_t)bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->mem[device].frees, 1, memory_order_relaxed);
}

static void host_memory_stats(void* ctx, int device, tpu_target_memory_stats_t* out) {
  host_t* h = host_of(ctx);
  memset(out, 0, sizeof *out);
  if (device < 0 || device >= h->ndevices) return;
  const host_mem_t* m = &h->mem[device];
  out->bytes_in_use = atomic_load_explicit(&m->in_use, memory_order_relaxed);
  out->peak_bytes_in_use = atomic_load_explicit(&m->peak, memory_order_relaxed);
  out->num_allocs = atomic_load_explicit(&m->allocs, memory_order_relaxed);
  out->num_frees = atomic_load_explicit(&m->frees, memory_order_relaxed);
  out->bytes_limit = h->capacity;
}

/* ---- copies ---- */
static tpu_status_t host_copy_h2d(void* ctx, int device, void* dst, const void* src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return TPU_OK;
}

static tpu_status_t host_copy_d2h(void* ctx, int device, void* dst, const void* src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return TPU_OK;
}

static tpu_status_t host_copy_d2d(void* ctx, int dst_device, void* dst, int src_device,
                                  const void* src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return TPU_OK;
}

/* A queued copy; h2d snapshots its source into `data`. */
typedef struct {
  void* dst;
  const void* src;
  size_t bytes;
  unsigned char data[];
} host_copy_t;

static tpu_status_t host_copy_fn(void* ctx) {
  host_copy_t* c = ctx;
  memmove(c->dst, c->src ? c->src : c->data, c->bytes);
  return TPU_OK;
}

static tpu_status_t host_enqueue_copy(tpu_stream_t* s, const char* what, void* dst,
                                      const void* src, size_t bytes, bool snapshot) {
  if (bytes == 0) return TPU_OK;
  host_copy_t* c = malloc(sizeof(host_copy_t) + (snapshot ? bytes : 0));
  if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: cannot stage %zu bytes", what, bytes);
  c->dst = dst;
  c->bytes = bytes;
  c->src = snapshot ? NULL : src;
  if (snapshot) memcpy(c->data, src, bytes);
  return tpu_stream_enqueue_raw(s, what, host_copy_fn, c, free);
}

static tpu_status_t host_copy_h2d_async(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                        size_t bytes) {
  return host_enqueue_copy(s, "copy_h2d", dst, src, bytes, true);
}

static tpu_status_t host_copy_d2h_async(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                        size_t bytes) {
  return host_enqueue_copy(s, "copy_d2h", dst, src, bytes, false);
}

static tpu_status_t host_copy_d2d_async(void* ctx, tpu_stream_t* s, void* dst, const void* src,
                                        size_t bytes) {
  return host_enqueue_copy(s, "copy_d2d", dst, src, bytes, false);
}

/* ---- ops: the kernel library's inventory ---- */
static const tpu_op_t g_host_ops[] = {
#define TPU_OP(name, fn, flags) {name, fn, flags, TPU_OPID_NONE}, /* id: set by the op table */
#include "targets/host/kernels/ops_all.def"
#undef TPU_OP
};
enum { HOST_NOPS = (int)(sizeof(g_host_ops) / sizeof(g_host_ops[0])) };

static const tpu_op_t* host_ops(void* ctx, int* out_count) {
  *out_count = HOST_NOPS;
  return g_host_ops;
}

static bool host_supports_op(void* ctx, const char* name) {
  if (!name) return false;
  for (int i = 0; i < HOST_NOPS; i++)
    if (strcmp(g_host_ops[i].name, name) == 0) return true;
  return false;
}

/* ---- graphs: the fusion planner's plan is the executable ---- */
static tpu_status_t host_graph_prepare(void* ctx, struct tpu_graph* g, void** out_exe) {
  tpu_fusion_plan_t* p = NULL;
  tpu_status_t st = tpu_fusion_plan(g, &p);
  *out_exe = p;
  return st;
}

static tpu_status_t host_graph_run(void* ctx, void* exe, const struct tpu_graph* g,
                                   const char** out_failed_op) {
  return tpu_fusion_plan_run(exe, g, out_failed_op);
}

static void host_graph_release(void* ctx, void* exe) { tpu_fusion_plan_free(exe); }

static void host_graph_info(void* ctx, const void* exe, tpu_target_graph_info_t* out) {
  tpu_fusion_plan_info(exe, out);
}

static int host_graph_run_position(void* ctx, const void* exe, int node) {
  return tpu_fusion_plan_run_position(exe, node);
}

static bool host_graph_buffer_is_internal(void* ctx, const void* exe, const void* base) {
  return tpu_fusion_plan_is_internal(exe, base);
}

static void host_wait_compiles(void* ctx) { tpu_fusion_wait_compiles(); }
static const char* host_pop_warning(void* ctx) { return tpu_fusion_pop_warning(); }

static const tpu_target_iface_t g_host_iface = {
    .name = "host",
    .device_count = host_device_count,
    .device_props = host_device_props,
    .buffer_alloc = host_buffer_alloc,
    .buffer_free = host_buffer_free,
    .copy_h2d = host_copy_h2d,
    .copy_d2h = host_copy_d2h,
    .copy_d2d = host_copy_d2d,
    .copy_h2d_async = host_copy_h2d_async,
    .copy_d2h_async = host_copy_d2h_async,
    .copy_d2d_async = host_copy_d2d_async,
    .ops = host_ops,
    .supports_op = host_supports_op,
    .graph_prepare = host_graph_prepare,
    .graph_run = host_graph_run,
    .graph_release = host_graph_release,
    .graph_info = host_graph_info,
    .graph_run_position = host_graph_run_position,
    .graph_buffer_is_internal = host_graph_buffer_is_internal,
    .memory_stats = host_memory_stats,
    .wait_compiles = host_wait_compiles,
    .pop_warning = host_pop_warning,
};

static const tpu_target_t g_host_target = {&g_host_iface, &g_host};

const tpu_target_t* tpu_host_target(void) { return &g_host_target; }
