/* Host kernels: helpers shared by the spatial families, convolution
 * (conv.c), pooling and embedding bags (pool.c) and resampling
 * (resample.c).
 *
 * These kernels work on planes: a tensor of shape (lead..., spatial...) is
 * staged as a contiguous array of a compute type, so that plane p starts at
 * p * plane_len. Operands already contiguous in that type are used in
 * place; others are converted into a host buffer (inputs) or computed there
 * and copied back once (outputs, rounded once on store).
 *
 * Spatial geometry has up to three dims stored right-aligned in arrays of
 * three: a 2-d op uses entries 1 and 2, entry 0 then has size 1 (and kernel
 * 1, stride 1, no padding), so one 3-d loop nest serves every rank.
 */
#ifndef TPU_HOST_SPATIAL_H_
#define TPU_HOST_SPATIAL_H_

#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"

typedef struct {
  void* data;            /* contiguous array of dt */
  tpu_dtype_t dt;        /* TPU_F32, TPU_F64 or TPU_I64 */
  const tpu_tensor_t* t; /* the staged tensor */
  void* copy;            /* host buffer when t is not used in place */
} sp_stage_t;

/* Compute type of a storage dtype: TPU_F32 for float32, bfloat16 and
 * float16, TPU_F64 for float64, TPU_I64 for integers and bool. */
tpu_dtype_t sp_compute_dtype(tpu_dtype_t dt);

/* Stages an input for reading. */
tpu_status_t sp_stage_in(const char* op, const tpu_tensor_t* t, tpu_dtype_t dt, sp_stage_t* s);
/* Stages an output for writing; its contents start at zero when `zero`,
 * undefined otherwise. */
tpu_status_t sp_stage_out(const char* op, const tpu_tensor_t* t, tpu_dtype_t dt, bool zero,
                          sp_stage_t* s);
/* Finishes an output staged with sp_stage_out: copies the buffer back to the
 * tensor when st is OK, then releases it. Returns st, or the copy's error. */
tpu_status_t sp_stage_finish(sp_stage_t* s, tpu_status_t st);
void sp_stage_free(sp_stage_t* s);

/* Reads the int list args[i] into out[3 - nsp .. 3) (entries before get
 * `fill`). A list of one value applies to every dim; an empty list takes
 * `empty` (right-aligned, same layout as out) when it is not NULL. */
tpu_status_t sp_int_list(const char* op, const char* what, const tpu_call_t* call, int i, int nsp,
                         const int64_t* empty, int64_t fill, int64_t out[3]);

/* The spatial sizes of t's last nsp dims into sizes[3] (right-aligned, the
 * others 1) and the product of its leading dims into *lanes. */
void sp_split(const tpu_tensor_t* t, int nsp, int64_t* lanes, int64_t sizes[3]);

/* tpu_parallel_for over n items of about `work` elements each. */
void sp_parallel(int64_t n, int64_t work, void (*fn)(void* ctx, int64_t begin, int64_t end),
                 void* ctx);

static inline int64_t sp_prod3(const int64_t v[3]) { return v[0] * v[1] * v[2]; }

/* A host allocation of n elements of `size` bytes (at least one byte). */
static inline void* sp_alloc(int64_t n, size_t size) {
  return malloc(n > 0 ? (size_t)n * size : 1);
}

static inline tpu_status_t sp_oom(const char* op) {
  return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for scratch buffers", op);
}

/* Records the first out-of-range index a parallel worker meets. */
typedef struct {
  _Atomic int set;
  int64_t index, limit;
} sp_bad_index_t;

static inline void sp_bad_index_note(sp_bad_index_t* b, int64_t index, int64_t limit) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&b->set, &expected, 1)) {
    b->index = index;
    b->limit = limit;
  }
}

/* Whether output k of a backward is wanted: defined, and not masked off by
 * the bool list args[mask_arg]. */
static inline bool sp_out_wanted(const tpu_call_t* call, int mask_arg, int k) {
  if (k >= call->nouts || call->outs[k].dtype == TPU_DTYPE_NONE) return false;
  const tpu_arg_t* m = mask_arg < call->nargs ? &call->args[mask_arg] : NULL;
  return !(m && m->kind == TPU_ARG_BOOLLIST && k < m->n && !m->v.blist[k]);
}

#endif /* TPU_HOST_SPATIAL_H_ */
