/* Host kernels: staging, argument and threading helpers shared by the
 * spatial families (see spatial.h). */
#include "spatial.h"

#define SP_GRAIN 32768 /* elements of work per parallel item */

tpu_dtype_t sp_compute_dtype(tpu_dtype_t dt) {
  if (dt == TPU_F64) return TPU_F64;
  return tpu_dtype_is_float(dt) ? TPU_F32 : TPU_I64;
}

/* t's data used in place, or a fresh host buffer described like t but
 * contiguous in dt. */
static tpu_status_t stage_alloc(const char* op, const tpu_tensor_t* t, tpu_dtype_t dt,
                                sp_stage_t* s, tpu_tensor_t* buf) {
  s->t = t;
  s->dt = dt;
  s->copy = NULL;
  s->data = t->data;
  if (t->dtype == dt && tpu_tensor_is_contiguous(t)) return TPU_OK;
  int64_t n = tpu_tensor_numel(t);
  s->copy = sp_alloc(n, tpu_dtype_size(dt));
  if (!s->copy) return sp_oom(op);
  s->data = s->copy;
  tpu_tensor_make_contig(buf, s->copy, dt, t->ndim, t->sizes);
  return TPU_OK;
}

tpu_status_t sp_stage_in(const char* op, const tpu_tensor_t* t, tpu_dtype_t dt, sp_stage_t* s) {
  tpu_tensor_t buf;
  TPU_RETURN_IF_ERROR(stage_alloc(op, t, dt, s, &buf));
  if (!s->copy) return TPU_OK;
  tpu_status_t st = tpu_copy_strided(&buf, t);
  if (st) sp_stage_free(s);
  return st;
}

tpu_status_t sp_stage_out(const char* op, const tpu_tensor_t* t, tpu_dtype_t dt, bool zero,
                          sp_stage_t* s) {
  tpu_tensor_t buf;
  TPU_RETURN_IF_ERROR(stage_alloc(op, t, dt, s, &buf));
  int64_t n = tpu_tensor_numel(t);
  /* all-zero bits are 0 in every compute type */
  if (zero && n > 0) memset(s->data, 0, (size_t)n * tpu_dtype_size(dt));
  return TPU_OK;
}

tpu_status_t sp_stage_finish(sp_stage_t* s, tpu_status_t st) {
  if (s->copy && st == TPU_OK) {
    tpu_tensor_t buf;
    tpu_tensor_make_contig(&buf, s->copy, s->dt, s->t->ndim, s->t->sizes);
    st = tpu_copy_strided(s->t, &buf);
  }
  sp_stage_free(s);
  return st;
}

void sp_stage_free(sp_stage_t* s) {
  free(s->copy);
  s->copy = NULL;
}

tpu_status_t sp_int_list(const char* op, const char* what, const tpu_call_t* call, int i, int nsp,
                         const int64_t* empty, int64_t fill, int64_t out[3]) {
  const tpu_arg_t* a = i < call->nargs ? &call->args[i] : NULL;
  int n = a && a->kind == TPU_ARG_INTLIST ? a->n : 0;
  for (int d = 0; d < 3; d++) out[d] = fill;
  if (n == 0 && empty) {
    for (int d = 3 - nsp; d < 3; d++) out[d] = empty[d];
    return TPU_OK;
  }
  if (n != 1 && n != nsp)
    return TPU_ERR(INVALID_ARGUMENT, "%s: %s must be a single int or a list of %d ints, got %d",
                   op, what, nsp, n);
  for (int d = 0; d < nsp; d++) out[3 - nsp + d] = a->v.ilist[n == 1 ? 0 : d];
  return TPU_OK;
}

void sp_split(const tpu_tensor_t* t, int nsp, int64_t* lanes, int64_t sizes[3]) {
  int lead = t->ndim - nsp;
  *lanes = 1;
  for (int d = 0; d < lead; d++) *lanes *= t->sizes[d];
  for (int d = 0; d < 3; d++) sizes[d] = 1;
  for (int d = 0; d < nsp; d++) sizes[3 - nsp + d] = t->sizes[lead + d];
}

void sp_parallel(int64_t n, int64_t work, void (*fn)(void* ctx, int64_t begin, int64_t end),
                 void* ctx) {
  if (n <= 0) return;
  int64_t grain = work > 0 ? SP_GRAIN / work : SP_GRAIN;
  tpu_parallel_for(n, grain > 1 ? grain : 1, fn, ctx);
}
