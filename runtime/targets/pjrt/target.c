/* The pjrt target (tpu/target.h): devices of a PJRT plugin (the XLA CPU
 * plugin, libtpu, the CUDA plugin).
 *
 * Plugin: TORCH_TPU_PJRT_PLUGIN names its shared library (the Python
 * package's discovery sets it when the user did not; torch_tpu/pjrt_plugins.py),
 * loaded once at the runtime's start-up.
 * Memory: storages are PJRT buffers behind handle addresses (storage.h).
 * Ops: every call is a program (compose.h): the lowering layer's function
 * for the call, wrapped to read its views from and write its results into
 * storage buffers. Programs are compiled once per text and kept for the
 * process (and serialized into the compilation cache's tiers 2 and 3 for the
 * next process, execache.h), and a graph seen before finds its executable by its call key
 * without composing (progcache.h); a call whose op has no lowering fails with UNIMPLEMENTED naming
 * it. A flushed DeferAndFuse graph is one program; when part of it has no
 * lowering, its nodes run one by one (and the first such node fails). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "device/internal.h"
#include "lower/lower.h"
#include "targets/pjrt/compose.h"
#include "targets/pjrt/execache.h"
#include "targets/pjrt/pjrt_client.h"
#include "targets/pjrt/progcache.h"
#include "targets/pjrt/storage.h"
#include "tpu/targets.h"

#define PJ_MAX_DEVICES 64

typedef struct {
  pthread_once_t once;
  tpu_status_t status; /* of opening the plugin */
  tpu_pjrt_t* client;
  int ndevices;
  int64_t capacity[PJ_MAX_DEVICES];
  _Atomic int64_t in_use[PJ_MAX_DEVICES], peak[PJ_MAX_DEVICES], allocs[PJ_MAX_DEVICES],
      frees[PJ_MAX_DEVICES];
  /* the program caches (progcache.h), guarded by cache_mu */
  pthread_mutex_t cache_mu;
  pj_table_t texts; /* module text -> tpu_pjrt_exe_t* */
  pj_table_t calls; /* call key -> pj_call_plan_t* */
  _Atomic int64_t compiles, loads, hits, call_hits, runs;
  _Atomic int64_t compile_ns, load_ns; /* in pj_exe_load_or_compile, by outcome */
  _Atomic int64_t donated; /* input buffers a run reused for its results */
} pj_t;

static pj_t g_pj = {.once = PTHREAD_ONCE_INIT, .cache_mu = PTHREAD_MUTEX_INITIALIZER};

static void pj_open(void) {
  const char* path = tpu_env_str("TORCH_TPU_PJRT_PLUGIN");
  if (!path || !*path) {
    g_pj.status = TPU_ERR(INVALID_ARGUMENT,
                          "TORCH_TPU_TARGET=pjrt needs a PJRT plugin: set TORCH_TPU_PJRT_PLUGIN to its "
                          "shared library, or install one (pip install xla-cpu-pjrt, libtpu)");
    return;
  }
  tpu_status_t st = tpu_pjrt_open(path, &g_pj.client);
  if (st) {
    g_pj.status = st;
    return;
  }
  int n = tpu_pjrt_device_count(g_pj.client);
  if (n < 1) {
    g_pj.status = TPU_ERR(INVALID_ARGUMENT, "PJRT plugin %s has no addressable devices", path);
    return;
  }
  if (n > PJ_MAX_DEVICES) n = PJ_MAX_DEVICES;
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  int64_t half_ram = (pages > 0 && psize > 0) ? (int64_t)pages * psize / 2 : ((int64_t)16 << 30);
  int64_t dflt = half_ram < ((int64_t)16 << 30) ? half_ram : ((int64_t)16 << 30);
  int64_t cap_env = tpu_env_int("TORCH_TPU_HBM_BYTES", 0);
  for (int d = 0; d < n; d++) {
    int64_t in_use = 0, limit = 0;
    tpu_status_t ms = tpu_pjrt_device_memory(g_pj.client, d, &in_use, &limit);
    tpu_status_free(ms);
    int64_t cap = !ms && limit > 0 ? limit : dflt;
    if (cap_env > 0 && cap_env < cap) cap = cap_env; /* a smaller budget, never a larger one */
    g_pj.capacity[d] = cap;
  }
  g_pj.ndevices = n;
}

static pj_t* pj_of(void* ctx) {
  pj_t* p = ctx;
  pthread_once(&p->once, pj_open);
  return p;
}

static tpu_status_t copy_status(tpu_status_t st) {
  return tpu_status_make(tpu_status_code(st), "%s", tpu_status_message(st));
}

static tpu_status_t pj_device_count(void* ctx, int* out_count) {
  pj_t* p = pj_of(ctx);
  *out_count = 0;
  if (p->status) return copy_status(p->status);
  *out_count = p->ndevices;
  return TPU_OK;
}

static tpu_status_t pj_device_props(void* ctx, int device, tpu_target_device_props_t* out) {
  pj_t* p = pj_of(ctx);
  memset(out, 0, sizeof *out);
  if (p->status || device < 0 || device >= p->ndevices)
    return TPU_ERR(INVALID_ARGUMENT, "pjrt target: no device %d", device);
  out->name = tpu_pjrt_device_kind(p->client, device);
  out->memory_bytes = p->capacity[device];
  out->alignment = 64;
  out->host_addressable = false;
  return TPU_OK;
}

/* ---- buffers ---- */
static tpu_status_t pj_buffer_alloc(void* ctx, int device, size_t bytes, void** out_ptr) {
  pj_t* p = pj_of(ctx);
  *out_ptr = NULL;
  if (device < 0 || device >= p->ndevices)
    return TPU_ERR(INVALID_ARGUMENT, "pjrt target: no device %d", device);
  TPU_RETURN_IF_ERROR(pj_storage_alloc(p->client, device, bytes, out_ptr));
  int64_t now = atomic_fetch_add(&p->in_use[device], (int64_t)bytes) + (int64_t)bytes;
  int64_t peak = atomic_load(&p->peak[device]);
  while (now > peak && !atomic_compare_exchange_weak(&p->peak[device], &peak, now)) {
  }
  atomic_fetch_add(&p->allocs[device], 1);
  return TPU_OK;
}

static void pj_buffer_free(void* ctx, int device, void* ptr, size_t bytes) {
  pj_t* p = ctx;
  if (!ptr) return;
  pj_storage_free(p->client, ptr);
  if (device < 0 || device >= PJ_MAX_DEVICES) return;
  atomic_fetch_sub(&p->in_use[device], (int64_t)bytes);
  atomic_fetch_add(&p->frees[device], 1);
}

static void pj_memory_stats(void* ctx, int device, tpu_target_memory_stats_t* out) {
  pj_t* p = pj_of(ctx);
  memset(out, 0, sizeof *out);
  if (device < 0 || device >= p->ndevices) return;
  out->bytes_in_use = atomic_load(&p->in_use[device]);
  out->peak_bytes_in_use = atomic_load(&p->peak[device]);
  out->num_allocs = atomic_load(&p->allocs[device]);
  out->num_frees = atomic_load(&p->frees[device]);
  out->bytes_limit = p->capacity[device];
}

/* ---- copies ---- */
static tpu_status_t pj_copy_h2d(void* ctx, int device, void* dst, const void* src, size_t bytes) {
  return pj_storage_write(((pj_t*)ctx)->client, dst, src, bytes);
}

static tpu_status_t pj_copy_d2h(void* ctx, int device, void* dst, const void* src, size_t bytes) {
  return pj_storage_read(((pj_t*)ctx)->client, dst, src, bytes);
}

static tpu_status_t pj_copy_d2d(void* ctx, int dst_device, void* dst, int src_device, const void* src,
                                size_t bytes) {
  if (bytes == 0) return TPU_OK;
  pj_t* p = ctx;
  unsigned char* tmp = malloc(bytes);
  if (!tmp) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: cannot stage %zu bytes on the host", bytes);
  tpu_status_t st = pj_storage_read(p->client, tmp, src, bytes);
  if (!st) st = pj_storage_write(p->client, dst, tmp, bytes);
  free(tmp);
  return st;
}

/* A queued copy; h2d snapshots its source into `data`. */
typedef struct {
  int kind; /* 0 h2d, 1 d2h, 2 d2d */
  void* dst;
  const void* src;
  size_t bytes;
  unsigned char data[];
} pj_copy_t;

static tpu_status_t pj_copy_fn(void* ctx) {
  pj_copy_t* c = ctx;
  if (c->kind == 0) return pj_copy_h2d(&g_pj, 0, c->dst, c->data, c->bytes);
  if (c->kind == 1) return pj_copy_d2h(&g_pj, 0, c->dst, c->src, c->bytes);
  return pj_copy_d2d(&g_pj, 0, c->dst, 0, c->src, c->bytes);
}

static tpu_status_t pj_enqueue_copy(tpu_stream_t* s, int kind, void* dst, const void* src, size_t bytes) {
  static const char* const what[] = {"copy_h2d", "copy_d2h", "copy_d2d"};
  if (bytes == 0) return TPU_OK;
  pj_copy_t* c = malloc(sizeof(pj_copy_t) + (kind == 0 ? bytes : 0));
  if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: cannot stage %zu bytes", what[kind], bytes);
  c->kind = kind;
  c->dst = dst;
  c->src = src;
  c->bytes = bytes;
  if (kind == 0) memcpy(c->data, src, bytes);
  return tpu_stream_enqueue_raw(s, what[kind], pj_copy_fn, c, free);
}

static tpu_status_t pj_copy_h2d_async(void* ctx, tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  return pj_enqueue_copy(s, 0, dst, src, bytes);
}
static tpu_status_t pj_copy_d2h_async(void* ctx, tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  return pj_enqueue_copy(s, 1, dst, src, bytes);
}
static tpu_status_t pj_copy_d2d_async(void* ctx, tpu_stream_t* s, void* dst, const void* src, size_t bytes) {
  return pj_enqueue_copy(s, 2, dst, src, bytes);
}

/* ---- programs ---- */
/* The program's executable: from the text table, else from the cache's
 * tiers 2 and 3, else compiled (execache.h); the text table owns it. */
static tpu_status_t program_exe(pj_t* p, pj_program_t* prog, tpu_pjrt_exe_t** out) {
  uint64_t h = pj_hash(prog->text, prog->len);
  pthread_mutex_lock(&p->cache_mu);
  tpu_pjrt_exe_t* e = pj_table_find(&p->texts, h, prog->text, prog->len);
  pthread_mutex_unlock(&p->cache_mu);
  if (e) {
    atomic_fetch_add(&p->hits, 1);
    *out = e;
    return TPU_OK;
  }
  if (tpu_env_int("TORCH_TPU_PJRT_DUMP", 0)) fprintf(stderr, "%s", prog->text);
  bool compiled = false;
  const int64_t t0 = tpu_now_ns();
  TPU_RETURN_IF_ERROR(pj_exe_load_or_compile(p->client, prog->text, prog->len, &e, &compiled));
  atomic_fetch_add(compiled ? &p->compiles : &p->loads, 1);
  atomic_fetch_add(compiled ? &p->compile_ns : &p->load_ns, tpu_now_ns() - t0);
  pthread_mutex_lock(&p->cache_mu);
  tpu_pjrt_exe_t* other = pj_table_find(&p->texts, h, prog->text, prog->len);
  if (other) { /* another thread compiled it meanwhile */
    pthread_mutex_unlock(&p->cache_mu);
    tpu_pjrt_exe_free(p->client, e);
    *out = other;
    return TPU_OK;
  }
  if (pj_table_put(&p->texts, h, (unsigned char*)prog->text, prog->len, e)) {
    prog->text = NULL; /* the table's now */
    pthread_mutex_unlock(&p->cache_mu);
  } else { /* not kept: the executable lives on, unnamed, for the process */
    pthread_mutex_unlock(&p->cache_mu);
  }
  *out = e;
  return TPU_OK;
}

/* The error of a program whose device-side check `code` (1 + the check)
 * failed, naming the op as the host kernel does; CPU's exception type. */
static tpu_status_t check_failed(const tpu_graph_t* g, const pj_check_t* checks, int nchecks, int32_t code) {
  if (code < 1 || code > nchecks) return TPU_ERR(INTERNAL, "pjrt target: a program reported check %d of %d",
                                                 (int)code, nchecks);
  const pj_check_t* k = &checks[code - 1];
  const char* name = k->node >= 0 && k->node < g->n && g->nodes[k->node]->op ? g->nodes[k->node]->op->name : "?";
  char base[96];
  snprintf(base, sizeof base, "%s", name);
  char* dot = strchr(base, '.');
  if (dot) *dot = 0;
  const tpu_status_code_t sc = k->kind == TPU_CHECK_INDEX ? TPU_CODE_OUT_OF_RANGE : TPU_CODE_INVALID_ARGUMENT;
  if (k->kind == TPU_CHECK_PROB)
    return tpu_status_make(sc, "%s(): expected all probabilities to be in [0, 1] (checked on the device)", base);
  if (k->dim < 0)
    return tpu_status_make(sc, "%s(): out of range: an index is outside a tensor of %lld elements "
                           "(checked on the device)", base, (long long)k->size);
  return tpu_status_make(sc, "%s(): an index is out of bounds for dimension %d with size %lld "
                         "(checked on the device)", base, k->dim, (long long)k->size);
}

/* Runs exe over the storages and host values `args`; result i replaces the
 * buffer of the storage at out_bases[i] (while that is still the buffer of
 * argument out_arg[i], when that is not -1). With `checked`, the executable's
 * last result (after the nouts) is its checks' code, read into *code. */
static tpu_status_t execute(pj_t* p, int device, tpu_pjrt_exe_t* exe, const pj_arg_t* a, int nargs,
                            const uintptr_t* out_bases, const int* out_arg, const int* out_donor,
                            int nouts, bool checked, int32_t* code) {
  *code = 0;
  if (nouts == 0 && !checked) return TPU_OK; /* writes nothing */
  const int nres = nouts + checked;
  enum { SMALL = 16 };
  tpu_pjrt_buffer_t* args_s[SMALL];
  pj_buf_t* held_s[SMALL];
  bool uploaded_s[SMALL];
  tpu_pjrt_buffer_t* outs_s[SMALL];
  const bool small = nargs <= SMALL && nres <= SMALL;
  tpu_pjrt_buffer_t** args = small ? args_s : calloc((size_t)nargs + 1, sizeof(*args));
  pj_buf_t** held = small ? held_s : calloc((size_t)nargs + 1, sizeof(*held));
  bool* uploaded = small ? uploaded_s : calloc((size_t)nargs + 1, sizeof(bool));
  tpu_pjrt_buffer_t** outs = small ? outs_s : calloc((size_t)nres, sizeof(*outs));
  tpu_status_t st = TPU_OK;
  if (!args || !held || !uploaded || !outs) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory running a program");
    goto done;
  }
  memset(held, 0, sizeof(*held) * (size_t)nargs);
  memset(uploaded, 0, sizeof(bool) * (size_t)nargs);
  memset(outs, 0, sizeof(*outs) * (size_t)nres);
  for (int i = 0; i < nargs && !st; i++) {
    if (a[i].host) {
      st = tpu_pjrt_buffer_from_host(p->client, device, a[i].data, a[i].dtype, 0, NULL, &args[i]);
      uploaded[i] = !st;
      continue;
    }
    pj_block_t b;
    if (!pj_storage_find((const void*)a[i].base, a[i].bytes, true, &b) || !b.buf) {
      st = TPU_ERR(INTERNAL, "pjrt target: a storage of the program lost its buffer");
      break;
    }
    held[i] = b.buf;
    args[i] = b.buf->b;
  }
  /* a storage updated in place gives its buffer to the result unless another
   * reader (a program or copy of another stream) holds it too */
  int64_t keep_s[SMALL];
  int64_t* keep = nouts <= SMALL ? keep_s : calloc((size_t)nouts, sizeof(*keep));
  size_t nkeep = 0;
  int ndonated = 0;
  if (!st && !keep) st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory running a program");
  for (int i = 0; i < nouts && !st; i++) {
    const int j = out_donor ? out_donor[i] : -1;
    if (j < 0 || !held[j]) continue;
    if (atomic_load(&held[j]->refs) > 2) keep[nkeep++] = j; /* the block's and ours, else shared */
    else ndonated++;
  }
  if (!st) st = tpu_pjrt_execute_keep(p->client, exe, device, args, nargs, outs, nres, keep, nkeep);
  if (!st && checked) st = tpu_pjrt_buffer_to_host(p->client, outs[nouts], code, sizeof *code);
  if (keep && keep != keep_s) free(keep);
  if (!st) atomic_fetch_add(&p->donated, ndonated);
  if (!st) {
    atomic_fetch_add(&p->runs, 1);
    for (int i = 0; i < nouts; i++) {
      pj_buf_t* w = pj_buf_wrap(p->client, outs[i], tpu_pjrt_buffer_dtype(p->client, outs[i]));
      outs[i] = NULL;
      if (!w) {
        st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory");
        continue;
      }
      if (out_arg[i] >= 0) pj_storage_replace_if(p->client, out_bases[i], held[out_arg[i]], w);
      else pj_storage_replace(p->client, out_bases[i], w);
    }
  }
  for (int i = 0; i < nargs; i++) {
    if (uploaded[i]) tpu_pjrt_buffer_free(p->client, args[i]);
    pj_buf_release(p->client, held[i]);
  }
  for (int i = 0; i < nres; i++)
    if (outs[i]) tpu_pjrt_buffer_free(p->client, outs[i]);
done:
  if (!small) {
    free(args);
    free(held);
    free(uploaded);
    free(outs);
  }
  return st;
}

/* A keyed graph whose plan is known: bind its slots and run. */
static tpu_status_t run_plan(pj_t* p, const tpu_graph_t* g, const pj_call_plan_t* plan, const pj_call_key_t* k) {
  const int device = g->device;
  enum { SMALL = 16 };
  pj_arg_t args_s[SMALL];
  uintptr_t outs_s[SMALL];
  const bool small = plan->nargs <= SMALL && plan->nouts <= SMALL;
  pj_arg_t* args = small ? args_s : calloc((size_t)plan->nargs + 1, sizeof(*args));
  uintptr_t* outs = small ? outs_s : calloc((size_t)plan->nouts + 1, sizeof(*outs));
  tpu_status_t st = TPU_OK;
  if (!args || !outs) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt target: out of host memory running a program");
  } else {
    pj_call_plan_bind(plan, k, args, outs);
    int32_t code = 0;
    st = execute(p, device, plan->exe, args, plan->nargs, outs, plan->out_arg, plan->out_donor, plan->nouts,
                 plan->nchecks > 0, &code);
    if (!st && code) st = check_failed(g, plan->checks, plan->nchecks, code);
  }
  if (!small) {
    free(args);
    free(outs);
  }
  return st;
}

/* At most this many call plans are kept (a key that never repeats, such as
 * one holding a changing scalar, must not grow the table without bound). */
#define PJ_MAX_CALL_PLANS 16384
/* and this many per key (a number held as a constant that changes every call
 * must not grow a chain without bound either) */
#define PJ_MAX_PLANS_PER_KEY 8

static tpu_status_t run_graph(pj_t* p, const tpu_graph_t* g) {
  pj_call_key_t key = {0};
  const bool keyed = pj_call_key_build(g, &key);
  if (keyed) {
    pthread_mutex_lock(&p->cache_mu);
    const pj_call_plan_t* plan = pj_table_find(&p->calls, key.hash, key.bytes, key.len);
    pthread_mutex_unlock(&p->cache_mu);
    /* plans live for the process and a chain only grows: no lock needed to use one */
    while (plan && !pj_call_plan_matches(plan, &key)) plan = atomic_load_explicit(&plan->next, memory_order_acquire);
    if (plan) {
      atomic_fetch_add(&p->call_hits, 1);
      tpu_status_t st = run_plan(p, g, plan, &key);
      pj_call_key_free(&key);
      return st;
    }
  }
  pj_program_t prog;
  tpu_status_t st = pj_compose(g, &prog);
  tpu_pjrt_exe_t* exe = NULL;
  if (!st && (prog.nouts > 0 || prog.nchecks > 0)) st = program_exe(p, &prog, &exe);
  if (!st && keyed) {
    pthread_mutex_lock(&p->cache_mu);
    bool room = pj_table_size(&p->calls) < PJ_MAX_CALL_PLANS;
    pthread_mutex_unlock(&p->cache_mu);
    pj_call_plan_t* plan = room ? pj_call_plan_make(&key, &prog, exe) : NULL;
    if (plan) {
      pthread_mutex_lock(&p->cache_mu);
      pj_call_plan_t* head = pj_table_find(&p->calls, key.hash, key.bytes, key.len);
      if (!head) {
        if (pj_table_put(&p->calls, key.hash, key.bytes, key.len, plan)) {
          key.bytes = NULL; /* the table's now */
          plan = NULL;
        }
      } else { /* the same key with other baked values: at the end of its chain */
        int len = 1;
        bool known = pj_call_plan_matches(head, &key); /* another thread added it meanwhile */
        pj_call_plan_t* last = head;
        for (pj_call_plan_t* x; (x = atomic_load_explicit(&last->next, memory_order_relaxed)); last = x) {
          len++;
          known |= pj_call_plan_matches(x, &key);
        }
        if (len < PJ_MAX_PLANS_PER_KEY && !known) {
          atomic_store_explicit(&last->next, plan, memory_order_release);
          plan = NULL;
        }
      }
      pthread_mutex_unlock(&p->cache_mu);
      pj_call_plan_free(plan);
    }
  }
  int32_t code = 0;
  if (!st) st = execute(p, g->device, exe, prog.args, prog.nargs, prog.outs, prog.out_arg, prog.out_donor,
                        prog.nouts, prog.nchecks > 0, &code);
  if (!st && code) st = check_failed(g, prog.checks, prog.nchecks, code);
  pj_program_free(&prog);
  pj_call_key_free(&key);
  return st;
}

/* The kernel of every op: the call as a one-node graph. */
static tpu_status_t pj_kernel(const tpu_call_t* call) {
  tpu_call_t* node = (tpu_call_t*)call;
  tpu_graph_t g = {.nodes = &node, .n = 1, .device = call->device};
  return run_graph(&g_pj, &g);
}

static const tpu_op_t* pj_ops(void* ctx, int* out_count) {
  *out_count = 0;
  return NULL;
}

/* An op this target can run: one with a lowering (a lowering may still
 * decline a call, a dtype it does not map: that call fails when it runs). */
static bool pj_supports_op(void* ctx, const char* name) { return tpu_lower_supports(name); }

/* Every op takes the generic kernel, lowered or not: view ops (which the
 * bridge answers without running a kernel) must be in the table, composite
 * kernels decompose as on the host, and a call without a lowering fails with
 * UNIMPLEMENTED naming the op when its program is composed. */
static tpu_kernel_fn_t pj_kernel_for(void* ctx, const char* name, uint32_t* out_flags) {
  *out_flags = tpu_lower_is_random(name) ? TPU_OP_RANDOM : 0; /* the call gets a seed and an offset */
  return name ? pj_kernel : NULL;
}

/* ---- graphs: composed and compiled when they run (addresses are real by
 * then); the prepared object only marks the graph as the target's ---- */
static char g_graph_marker;

static tpu_status_t pj_graph_prepare(void* ctx, struct tpu_graph* g, void** out_exe) {
  *out_exe = &g_graph_marker;
  return TPU_OK;
}

static tpu_status_t pj_graph_run(void* ctx, void* exe, const struct tpu_graph* g, const char** out_failed_op) {
  *out_failed_op = NULL;
  tpu_status_t st = TPU_OK;
  if (tpu_lower_graph_is_exact(g)) { /* else overlapping views: node by node */
    st = run_graph(ctx, g);
    if (!st || tpu_status_code(st) != TPU_CODE_UNIMPLEMENTED) return st;
    tpu_status_free(st); /* part of it has no lowering: node by node, to name the op */
  }
  for (int i = 0; i < g->n; i++) {
    st = pj_kernel(g->nodes[i]);
    if (st) {
      *out_failed_op = g->nodes[i]->op ? g->nodes[i]->op->name : NULL;
      return st;
    }
  }
  return TPU_OK;
}

static void pj_graph_release(void* ctx, void* exe) {}

static const tpu_target_iface_t g_pj_iface = {
    .name = "pjrt",
    .device_count = pj_device_count,
    .device_props = pj_device_props,
    .buffer_alloc = pj_buffer_alloc,
    .buffer_free = pj_buffer_free,
    .copy_h2d = pj_copy_h2d,
    .copy_d2h = pj_copy_d2h,
    .copy_d2d = pj_copy_d2d,
    .copy_h2d_async = pj_copy_h2d_async,
    .copy_d2h_async = pj_copy_d2h_async,
    .copy_d2d_async = pj_copy_d2d_async,
    .ops = pj_ops,
    .supports_op = pj_supports_op,
    .kernel_for = pj_kernel_for,
    .graph_prepare = pj_graph_prepare,
    .graph_run = pj_graph_run,
    .graph_release = pj_graph_release,
    .memory_stats = pj_memory_stats,
};

static const tpu_target_t g_pj_target = {&g_pj_iface, &g_pj};

const tpu_target_t* tpu_pjrt_target(void) { return &g_pj_target; }

void tpu_pjrt_target_stats(tpu_pjrt_target_stats_t* out) {
  out->compiles = atomic_load(&g_pj.compiles);
  out->loads = atomic_load(&g_pj.loads);
  out->hits = atomic_load(&g_pj.hits);
  out->call_hits = atomic_load(&g_pj.call_hits);
  out->runs = atomic_load(&g_pj.runs);
  out->donated = atomic_load(&g_pj.donated);
  out->compile_seconds = 1e-9 * (double)atomic_load(&g_pj.compile_ns);
  out->load_seconds = 1e-9 * (double)atomic_load(&g_pj.load_ns);
}

tpu_status_t tpu_pjrt_target_cache_key(const char* text, size_t len, const char* platform,
                                       const char* version, char key[33]) {
  key[0] = 0;
  pj_t* p = pj_of(&g_pj);
  if (p->status) return copy_status(p->status);
  pj_exe_ident_t id;
  pj_exe_ident_of(p->client, &id);
  if (platform) id.platform = platform;
  if (version) id.version = version;
  pj_exe_cache_key(&id, text, len, key);
  return TPU_OK;
}
