/* User kernels as ops (tpu/kernels.h): C kernels are compiled by the host
 * target (targets/host/custom.c), StableHLO kernels are lowered into the
 * programs of a lowering target (lower/custom.c calls them); either way the
 * result is an op of the op table. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "targets/host/custom.h"
#include "targets/host/fuse_headers.h"
#include "tpu/kernels.h"
#include "tpu/targets.h"

extern const tpu_fuse_header_t tpu_kernel_headers[];
extern const int tpu_kernel_nheaders;

const char* tpu_kernel_abi_header(size_t* out_len, const char** out_name) {
  if (out_len) *out_len = tpu_kernel_nheaders ? tpu_kernel_headers[0].len : 0;
  if (out_name) *out_name = tpu_kernel_nheaders ? tpu_kernel_headers[0].name : "";
  return tpu_kernel_nheaders ? tpu_kernel_headers[0].text : "";
}

/* A process-lifetime copy (the op's strings live as long as the op). */
static char* keep(const char* s) { return s ? strdup(s) : NULL; }

static tpu_status_t define_c(const tpu_kernel_desc_t* d, const tpu_target_t* t,
                             const tpu_op_t** out_op, tpu_kernel_info_t* info) {
  if (t != tpu_host_target())
    return TPU_ERR(UNIMPLEMENTED,
                   "custom kernel %s: C kernels run on the host target, and this process runs "
                   "the %s target (define a StableHLO kernel for it)",
                   d->name, t->iface->name);
  /* messages name the user's file after the op: mylib::scaled_add -> mylib_scaled_add.c */
  char file[160];
  size_t n = 0;
  for (const char* p = d->name; *p && n + 3 < sizeof file; p++) {
    const char ch = *p;
    if (isalnum((unsigned char)ch) || ch == '_') file[n++] = ch;
    else if (n && file[n - 1] != '_') file[n++] = '_';
  }
  memcpy(file + n, ".c", 3);
  tpu_host_kernel_t* k = NULL;
  TPU_RETURN_IF_ERROR(tpu_host_kernel_compile(d->name, file, d->source, d->entry, d->cflags, &k,
                                              &info->cache_tier, &info->compile_seconds,
                                              info->key));
  const tpu_op_custom_t cu = {.target_data = k};
  return tpu_op_register(d->name, tpu_host_kernel_run, 0, &cu, out_op);
}

static tpu_status_t define_stablehlo(const tpu_kernel_desc_t* d, const tpu_target_t* t,
                                     const tpu_op_t** out_op) {
  if (!t->iface->kernel_for)
    return TPU_ERR(UNIMPLEMENTED,
                   "custom kernel %s: StableHLO kernels run on a target that lowers to StableHLO "
                   "(TORCH_TPU_TARGET=pjrt), and this process runs the %s target (define a C "
                   "kernel for it)",
                   d->name, t->iface->name);
  if (!d->entry || !d->entry[0])
    return TPU_ERR(INVALID_ARGUMENT, "custom kernel %s: no function symbol", d->name);
  if (!strstr(d->source, "func.func"))
    return TPU_ERR(INVALID_ARGUMENT, "custom kernel %s: the StableHLO text has no func.func",
                   d->name);
  uint32_t flags = 0;
  tpu_kernel_fn_t fn = t->iface->kernel_for(t->ctx, d->name, &flags);
  if (!fn)
    return TPU_ERR(UNIMPLEMENTED, "custom kernel %s: the %s target gives it no kernel", d->name,
                   t->iface->name);
  const tpu_op_custom_t cu = {.stablehlo = keep(d->source), .symbol = keep(d->entry)};
  if (!cu.stablehlo || !cu.symbol) {
    free((void*)cu.stablehlo);
    free((void*)cu.symbol);
    return TPU_ERR(RESOURCE_EXHAUSTED, "custom kernel %s: out of host memory", d->name);
  }
  tpu_status_t st = tpu_op_register(d->name, fn, flags & ~(uint32_t)TPU_OP_RANDOM, &cu, out_op);
  if (st) {
    free((void*)cu.stablehlo);
    free((void*)cu.symbol);
  }
  return st;
}

tpu_status_t tpu_kernel_define(const tpu_kernel_desc_t* d, const tpu_op_t** out_op,
                               tpu_kernel_info_t* out_info) {
  *out_op = NULL;
  tpu_kernel_info_t info = {.cache_tier = -1};
  if (!d || !d->name || !d->name[0] || !d->source)
    return TPU_ERR(INVALID_ARGUMENT, "custom kernel: a name and a source are required");
  const tpu_target_t* t = tpu_target_get();
  if (!t) return TPU_ERR(INTERNAL, "custom kernel %s: no target is registered", d->name);
  tpu_status_t st;
  switch (d->lang) {
    case TPU_KERNEL_C: st = define_c(d, t, out_op, &info); break;
    case TPU_KERNEL_STABLEHLO: st = define_stablehlo(d, t, out_op); break;
    default: st = TPU_ERR(INVALID_ARGUMENT, "custom kernel %s: unknown language %d", d->name, (int)d->lang);
  }
  if (out_info) *out_info = info;
  return st;
}
