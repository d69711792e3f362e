/* Custom C kernels on the host target: compile, cache, load, run.
 *
 * A kernel's source is compiled as one translation unit that first includes
 * the embedded ABI header (tpu/kernel_abi.h, written into the compile
 * directory as torch_tpu_kernel.h) and then, after a #line directive, the
 * user's text, so the compiler's messages carry the user's line numbers. The
 * executable goes through the three-tier cache under a key of the source, the
 * entry name, the header text, the compiler command and flags, the ISA and
 * the runtime version: a second definition with the same source (in this
 * process, another one, or a later run) loads instead of compiling. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/subprocess.h"
#include "targets/host/cc.h"
#include "targets/host/custom.h"
#include "targets/host/fuse_headers.h"
#include "targets/host/kernels/vecmath.h"
#include "tpu/cache.h"
#include "tpu/kernel_abi.h"
#include "tpu/parallel.h"

/* The ABI's dtype numbers are the runtime's (both are c10::ScalarType's). */
_Static_assert(TPUK_F32 == (int)TPU_F32 && TPUK_BF16 == (int)TPU_BF16 &&
                   TPUK_F16 == (int)TPU_F16 && TPUK_BOOL == (int)TPU_BOOL &&
                   TPUK_I64 == (int)TPU_I64 && TPUK_U8 == (int)TPU_U8 &&
                   TPUK_F8E5M2 == (int)TPU_F8E5M2 && TPUK_F8E4M3FN == (int)TPU_F8E4M3FN &&
                   TPUK_F8E5M2FNUZ == (int)TPU_F8E5M2FNUZ &&
                   TPUK_F8E4M3FNUZ == (int)TPU_F8E4M3FNUZ && TPUK_U16 == (int)TPU_U16 &&
                   TPUK_U32 == (int)TPU_U32 && TPUK_U64 == (int)TPU_U64 &&
                   TPUK_F8E8M0FNU == (int)TPU_F8E8M0FNU &&
                   TPUK_F4E2M1FNX2 == (int)TPU_F4E2M1FNX2,
               "kernel ABI dtypes must equal tpu_dtype_t");

/* the embedded ABI header (build/gen/kernel_headers.c, tools/embed_headers.py) */
extern const tpu_fuse_header_t tpu_kernel_headers[];
extern const int tpu_kernel_nheaders;

struct tpu_host_kernel {
  tpuk_entry_fn fn;
};

/* ---- compiling ---- */
/* The fused kernels' optimization and ISA flags, without their
 * floating-point contraction: a user kernel's arithmetic is what it says. */
static const char* cc_flags(void) {
  return tpu_host_isa() == TPU_ISA_AVX2
             ? "-O3 -fPIC -shared -std=gnu11 -mavx2 -mfma -ffp-contract=off -fno-math-errno"
             : "-O3 -fPIC -shared -std=gnu11 -ffp-contract=off -fno-math-errno";
}

static uint64_t headers_hash(void) {
  uint64_t h = 0x6b65726e656c6162ull;
  for (int i = 0; i < tpu_kernel_nheaders; i++) {
    const tpu_fuse_header_t* e = &tpu_kernel_headers[i];
    h = tpu_cache_hash64(e->name, strlen(e->name) + 1, h);
    h = tpu_cache_hash64(e->text, e->len, h);
  }
  return h;
}

/* A loaded library's entry as a kernel (kept in tier 1 under key). */
static tpu_status_t load_kernel(const char* op_name, const char* key, const char* path,
                                const char* entry, tpu_host_kernel_t** out) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return TPU_ERR(INTERNAL, "custom kernel %s: the compiled library does not load: %s", op_name,
                   e ? e : "dlopen failed");
  }
  tpuk_entry_fn fn = (tpuk_entry_fn)dlsym(h, entry);
  if (!fn) {
    dlclose(h);
    return TPU_ERR(INVALID_ARGUMENT,
                   "custom kernel %s: the source defines no exported function '%s' (the entry "
                   "must be a non-static function: int %s(const tpuk_call_t* call))",
                   op_name, entry, entry);
  }
  tpu_host_kernel_t* k = malloc(sizeof *k);
  if (!k) {
    dlclose(h);
    return TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", op_name);
  }
  k->fn = fn;
  tpu_cache_tier1_put(key, k);
  *out = k;
  return TPU_OK;
}

static pthread_mutex_t g_compile_mu = PTHREAD_MUTEX_INITIALIZER; /* one definition at a time */

/* Compiles src under key; on success the library is published into the
 * cache tiers and loaded. */
static tpu_status_t compile_into_cache(const char* op_name, const char* file_name,
                                       const char* src, const char* entry, const char* cflags,
                                       const char* key, tpu_host_kernel_t** out) {
  const tpu_cc_job_t job = {.headers = tpu_kernel_headers, .nheaders = 1,
                            .source_name = file_name, .source = src, .flags = cc_flags(),
                            .extra_flags = cflags};
  tpu_cc_run_t run;
  tpu_cc_run(&job, &run);
  tpu_status_t st = TPU_OK;
  char log[8192];
  switch (run.outcome) {
    case TPU_CC_SETUP:
      st = TPU_ERR(INTERNAL, "custom kernel %s: %s", op_name, run.why);
      break;
    case TPU_CC_NOT_RUN:
      st = tpu_status_make(TPU_CODE_UNIMPLEMENTED,
                           "custom kernel %s: the C compiler cannot be run (%s); set TORCH_TPU_CC",
                           op_name, run.why);
      break;
    case TPU_CC_TIMEOUT:
      st = TPU_ERR(INVALID_ARGUMENT,
                   "custom kernel %s: the C compiler '%s' timed out after %.1f s "
                   "(TORCH_TPU_COMPILE_TIMEOUT_S)",
                   op_name, run.compiler, 1e-3 * (double)run.timeout_ms);
      break;
    case TPU_CC_FAILED:
      tpu_cc_log(&run, log, sizeof log);
      st = TPU_ERR(INVALID_ARGUMENT, "custom kernel %s: compilation failed (%s %s %d):\n%s",
                   op_name, run.compiler, run.exited ? "exit status" : "signal", run.code, log);
      break;
    case TPU_CC_OK: {
      char pub[4096];
      st = tpu_cache_publish(key, run.so_path, pub, sizeof pub);
      if (!st) st = load_kernel(op_name, key, pub, entry, out);
      break;
    }
  }
  tpu_cc_done(&run);
  return st;
}

tpu_status_t tpu_host_kernel_compile(const char* op_name, const char* file_name,
                                     const char* source, const char* entry,
                                     const char* cflags, tpu_host_kernel_t** out_kernel,
                                     int* out_tier, double* out_seconds, char out_key[33]) {
  *out_kernel = NULL;
  *out_tier = 0;
  *out_seconds = 0;
  out_key[0] = 0;
  if (tpu_kernel_nheaders < 1)
    return TPU_ERR(INTERNAL, "custom kernel %s: the library has no kernel ABI header", op_name);
  if (!entry || !entry[0] || strspn(entry, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789_") != strlen(entry))
    return TPU_ERR(INVALID_ARGUMENT, "custom kernel %s: entry '%s' is not a C identifier", op_name,
                   entry ? entry : "");
  /* the translation unit: the ABI header, then the user's lines numbered from 1 */
  const size_t len = strlen(source) + strlen(file_name) + 128;
  char* src = malloc(len);
  if (!src) return TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", op_name);
  snprintf(src, len, "#include \"%s\"\n#line 1 \"%s\"\n%s\n", tpu_kernel_headers[0].name, file_name,
           source);
  /* the key: the unit and everything else the library depends on (the file
   * name only shapes messages and debug info) */
  char how[8192];
  snprintf(how, sizeof how, "custom-c|%s|%.4000s|%s|%.2000s|%s|%s|%016" PRIx64 "|", entry,
           tpu_cc_command(), cc_flags(), cflags ? cflags : "", tpu_isa_name(tpu_host_isa()),
           TPU_RUNTIME_VERSION, headers_hash());
  char key[33];
  tpu_cache_make_key(source, strlen(source), how, key); /* the file name is left out */
  memcpy(out_key, key, 33);
  const int64_t t0 = tpu_now_ns();
  tpu_status_t st = TPU_OK;
  pthread_mutex_lock(&g_compile_mu);
  tpu_host_kernel_t* k = tpu_cache_tier1_get(key);
  if (k) {
    *out_tier = 1;
    goto done;
  }
  char path[4096];
  int tier = 0;
  if (tpu_cache_find(key, path, sizeof path, &tier)) {
    st = load_kernel(op_name, key, path, entry, &k);
    if (!st) {
      *out_tier = tier;
      goto done;
    }
    if (tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT) goto done; /* no such entry */
    tpu_status_free(st);
    st = TPU_OK;
    tpu_cache_drop(key); /* a broken entry: compile it again */
  }
  tpu_cache_note_miss();
  const int64_t timeout = tpu_cc_timeout_ms();
  int lock = tpu_cache_lock_wait(key, timeout > 0 ? timeout + 1000 : -1);
  if (tpu_cache_find(key, path, sizeof path, &tier)) { /* another process made it meanwhile */
    st = load_kernel(op_name, key, path, entry, &k);
    if (!st) *out_tier = tier;
  } else {
    st = compile_into_cache(op_name, file_name, src, entry, cflags, key, &k);
  }
  if (lock >= 0) tpu_cache_unlock(lock);
done:
  pthread_mutex_unlock(&g_compile_mu);
  free(src);
  *out_seconds = 1e-9 * (double)(tpu_now_ns() - t0);
  if (!st) *out_kernel = k;
  return st;
}

/* ---- running ---- */
/* Debug mode's guard regions: each tensor the kernel sees is a copy of its
 * memory span between two runs of canary bytes. */
#define GUARD_BYTES 4096
#define GUARD_BYTE(i) ((unsigned char)(0xa5u ^ ((unsigned)(i) * 29u)))

typedef struct {
  const tpu_tensor_t* src; /* the call's tensor */
  bool written;            /* an output or a mutated argument */
  unsigned char* block;    /* guard + span + guard */
  int64_t lo;              /* the span's first element offset (<= 0) */
  size_t bytes;            /* the span's bytes */
} staged_t;

/* The span of elements a view covers: offsets [lo, hi] from its data. */
static void view_span(const tpu_tensor_t* t, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) {
      *hi = -1;
      return;
    }
    const int64_t ext = (t->sizes[d] - 1) * t->strides[d];
    if (ext < 0) *lo += ext;
    else *hi += ext;
  }
}

static bool stage(staged_t* s) {
  const size_t es = tpu_dtype_size(s->src->dtype);
  int64_t lo, hi;
  view_span(s->src, &lo, &hi);
  s->lo = lo;
  s->bytes = hi >= lo ? (size_t)(hi - lo + 1) * es : 0;
  s->block = malloc(2 * GUARD_BYTES + s->bytes + 1);
  if (!s->block) return false;
  for (size_t i = 0; i < GUARD_BYTES; i++) {
    s->block[i] = GUARD_BYTE(i);
    s->block[GUARD_BYTES + s->bytes + i] = GUARD_BYTE(i + 7);
  }
  if (s->bytes)
    memcpy(s->block + GUARD_BYTES, (const char*)s->src->data + lo * (int64_t)es, s->bytes);
  return true;
}

static void* staged_data(const staged_t* s) {
  return s->block + GUARD_BYTES - s->lo * (int64_t)tpu_dtype_size(s->src->dtype);
}

/* The guards' verdict: bytes written before the span (*before, counted from
 * its start) and after it (*after, counted from its end); 0 when intact. */
static void check_guards(const staged_t* s, size_t* before, size_t* after) {
  *before = *after = 0;
  for (size_t i = 0; i < GUARD_BYTES; i++)
    if (s->block[i] != GUARD_BYTE(i)) {
      *before = GUARD_BYTES - i;
      break;
    }
  const unsigned char* tail = s->block + GUARD_BYTES + s->bytes;
  for (size_t i = GUARD_BYTES; i-- > 0;)
    if (tail[i] != GUARD_BYTE(i + 7)) {
      *after = i + 1;
      break;
    }
}

typedef struct {
  tpuk_tensor_t* in;
  tpuk_tensor_t* out;
  double* num;
  int64_t* inum;
  staged_t* staged; /* Debug: one per entry of in, then of out */
  int n_in, n_out, n_num;
} abi_args_t;

static void to_abi(const tpu_tensor_t* t, tpuk_tensor_t* k) {
  k->data = t->data;
  k->dtype = t->dtype;
  k->ndim = t->ndim;
  k->sizes = t->sizes;
  k->strides = t->strides;
  k->numel = tpu_tensor_numel(t);
}

static tpu_status_t run_checked(const tpu_call_t* call, const tpu_host_kernel_t* k,
                                tpuk_call_t* kc, abi_args_t* a);

tpu_status_t tpu_host_kernel_run(const tpu_call_t* call) {
  const tpu_op_custom_t* cu = tpu_op_custom(call->op);
  const tpu_host_kernel_t* k = cu ? cu->target_data : NULL;
  if (!k) return TPU_ERR(INTERNAL, "%s: not a custom C kernel", call->op ? call->op->name : "?");
  /* count the ABI's arrays */
  int n_in = 0, n_num = 0;
  for (int i = 0; i < call->nargs; i++) {
    const tpu_arg_t* x = &call->args[i];
    if (x->kind == TPU_ARG_TENSOR) n_in++;
    else if (x->kind == TPU_ARG_TENSORLIST)
      for (int j = 0; j < x->n; j++) n_in += x->v.tlist[j].dtype != TPU_DTYPE_NONE;
    else if (x->kind == TPU_ARG_INT || x->kind == TPU_ARG_DOUBLE || x->kind == TPU_ARG_BOOL) n_num++;
  }
  const int n_out = call->nouts;
  abi_args_t a = {0};
  a.n_in = n_in;
  a.n_out = n_out;
  a.n_num = n_num;
  a.in = calloc((size_t)n_in + 1, sizeof(tpuk_tensor_t));
  a.out = calloc((size_t)n_out + 1, sizeof(tpuk_tensor_t));
  a.num = calloc((size_t)n_num + 1, sizeof(double));
  a.inum = calloc((size_t)n_num + 1, sizeof(int64_t));
  bool* written = calloc((size_t)n_in + 1, sizeof(bool));
  tpu_status_t st = TPU_OK;
  if (!a.in || !a.out || !a.num || !a.inum || !written) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", call->op->name);
    goto done;
  }
  const tpu_tensor_t** in_src = (const tpu_tensor_t**)calloc((size_t)n_in + 1, sizeof(void*));
  if (!in_src) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", call->op->name);
    goto done;
  }
  int ti = 0, ni = 0;
  for (int i = 0; i < call->nargs; i++) {
    const tpu_arg_t* x = &call->args[i];
    const bool w = i < 64 && ((call->mutated_args >> i) & 1);
    switch (x->kind) {
      case TPU_ARG_TENSOR:
        in_src[ti] = x->v.t;
        written[ti] = w;
        to_abi(x->v.t, &a.in[ti++]);
        break;
      case TPU_ARG_TENSORLIST:
        for (int j = 0; j < x->n; j++)
          if (x->v.tlist[j].dtype != TPU_DTYPE_NONE) {
            in_src[ti] = &x->v.tlist[j];
            written[ti] = w;
            to_abi(&x->v.tlist[j], &a.in[ti++]);
          }
        break;
      case TPU_ARG_INT:
        a.num[ni] = (double)x->v.i;
        a.inum[ni++] = x->v.i;
        break;
      case TPU_ARG_DOUBLE:
        a.num[ni] = x->v.d;
        a.inum[ni++] = (int64_t)x->v.d;
        break;
      case TPU_ARG_BOOL:
        a.num[ni] = x->v.b ? 1.0 : 0.0;
        a.inum[ni++] = x->v.b ? 1 : 0;
        break;
      default: break;
    }
  }
  for (int o = 0; o < n_out; o++) to_abi(&call->outs[o], &a.out[o]);
  char err[1024] = "";
  tpuk_call_t kc = {
      .abi_version = TPUK_ABI_VERSION,
      .n_in = n_in,
      .n_out = n_out,
      .n_num = n_num,
      .in = a.in,
      .out = a.out,
      .num = a.num,
      .inum = a.inum,
      .parallel_for = tpu_parallel_for,
      .num_threads = tpu_num_threads(),
      .name = call->op->name,
      .error = err,
      .error_cap = sizeof err,
  };
  if (call->debug_checks) {
    a.staged = calloc((size_t)(n_in + n_out) + 1, sizeof(staged_t));
    if (!a.staged) {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", call->op->name);
    } else {
      for (int i = 0; i < n_in; i++) {
        a.staged[i].src = in_src[i];
        a.staged[i].written = written[i];
      }
      for (int o = 0; o < n_out; o++) {
        a.staged[n_in + o].src = &call->outs[o];
        a.staged[n_in + o].written = true;
      }
      st = run_checked(call, k, &kc, &a);
    }
  } else if (k->fn(&kc) != 0) {
    st = TPU_ERR(INVALID_ARGUMENT, "custom kernel %s failed: %s", call->op->name,
                 err[0] ? err : "it returned an error without a message");
  }
  free(in_src);
done:
  if (a.staged)
    for (int i = 0; i < n_in + n_out; i++) free(a.staged[i].block);
  free(a.staged);
  free(a.in);
  free(a.out);
  free(a.num);
  free(a.inum);
  free(written);
  return st;
}

/* Debug mode: the kernel runs on guarded copies; its writes reach the real
 * memory only when every guard and every read-only input is intact. */
static tpu_status_t run_checked(const tpu_call_t* call, const tpu_host_kernel_t* k,
                                tpuk_call_t* kc, abi_args_t* a) {
  const int n = a->n_in + a->n_out;
  for (int i = 0; i < n; i++) {
    if (!stage(&a->staged[i]))
      return TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory for guard regions",
                     call->op->name);
    if (i < a->n_in) a->in[i].data = staged_data(&a->staged[i]);
    else a->out[i - a->n_in].data = staged_data(&a->staged[i]);
  }
  if (k->fn(kc) != 0)
    return TPU_ERR(INVALID_ARGUMENT, "custom kernel %s failed: %s", call->op->name,
                   kc->error[0] ? kc->error : "it returned an error without a message");
  for (int i = 0; i < n; i++) {
    const staged_t* s = &a->staged[i];
    const bool is_out = i >= a->n_in;
    const int idx = is_out ? i - a->n_in : i;
    size_t before, after;
    check_guards(s, &before, &after);
    if (before || after)
      return TPU_ERR(INTERNAL,
                     "custom kernel %s wrote out of bounds of %s %d (%s, %zu bytes): up to %zu "
                     "bytes %s (Debug mode guard regions; nothing was written back)",
                     call->op->name, is_out ? "output" : "input", idx,
                     tpu_dtype_name(s->src->dtype), s->bytes, before ? before : after,
                     before ? "before its first element" : "past its last element");
    if (!s->written && s->bytes &&
        memcmp(s->block + GUARD_BYTES,
               (const char*)s->src->data + s->lo * (int64_t)tpu_dtype_size(s->src->dtype),
               s->bytes) != 0)
      return TPU_ERR(INVALID_ARGUMENT,
                     "custom kernel %s wrote into input %d, which the op does not declare in "
                     "mutates_args (Debug mode check; nothing was written back)",
                     call->op->name, idx);
  }
  for (int i = 0; i < n; i++) {
    const staged_t* s = &a->staged[i];
    if (s->written && s->bytes)
      memcpy((char*)s->src->data + s->lo * (int64_t)tpu_dtype_size(s->src->dtype),
             s->block + GUARD_BYTES, s->bytes);
  }
  return TPU_OK;
}
