/* hash_tensor (mode 0): the XOR of the 64-bit patterns of the elements over
 * the reduced dims, as PyTorch's CPU kernel computes it. Each element is first
 * widened to 64 bits: floating dtypes to a double (its IEEE bits, so float32
 * 1.5 and float64 1.5 hash alike; NaN payloads as the widening gives them),
 * integers and bool sign-extended to int64. The result is uint64; XOR is
 * associative and commutative, so the order of the elements does not matter
 * and an empty reduction gives 0. */
#include "kernels.h"

static bool hash_dtype_ok(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F32: case TPU_F64: case TPU_F16: case TPU_BF16:
    case TPU_U8: case TPU_I8: case TPU_I16: case TPU_I32: case TPU_I64: case TPU_BOOL:
      return true;
    default:
      return false;
  }
}

static uint64_t elem_bits(const void* p, tpu_dtype_t dt) {
  if (tpu_dtype_is_float(dt)) {
    double v = tpu_load_f64(p, dt);
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
  return (uint64_t)tpu_load_i64(p, dt);
}

/* hash_tensor(self, dim=[], *, keepdim, mode) -> uint64 out */
tpu_status_t tpu_k_hash_tensor(const tpu_call_t* call) {
  const char* op = "hash_tensor";
  const tpu_tensor_t *in = tpu_arg_tensor(call, 0), *out = &call->outs[0];
  int64_t mode = tpu_arg_i64(call, 3, 0);
  if (mode != 0) return TPU_ERR(INVALID_ARGUMENT, "%s: Unknown hash_tensor mode: %lld", op, (long long)mode);
  if (!hash_dtype_ok(in->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: \"xor_sum_cpu\" not implemented for '%s'", op,
                   tpu_dtype_name(in->dtype));
  if (out->dtype != TPU_U64)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a uint64 output, got %s", op,
                   tpu_dtype_name(out->dtype));
  /* Reduced dims: the listed ones, or all for an empty list / None. */
  bool red[TPU_MAX_DIMS];
  int nd = in->ndim;
  const tpu_arg_t* da = tpu_arg_is_none(call, 1) ? NULL : &call->args[1];
  bool all = !da || da->kind != TPU_ARG_INTLIST || da->n == 0;
  for (int d = 0; d < nd; d++) red[d] = all;
  for (int k = 0; !all && k < da->n; k++) {
    int64_t d = da->v.ilist[k];
    int wrap = nd > 0 ? nd : 1;
    if (d < -wrap || d >= wrap)
      return TPU_ERR(OUT_OF_RANGE, "%s: Dimension out of range (expected to be in range of [%d, %d], but got %lld)",
                     op, -wrap, wrap - 1, (long long)d);
    if (d < 0) d += wrap;
    if (nd > 0) red[d] = true;
  }
  /* Output stride of each input dim (0 when reduced); keepdim keeps size-1
   * dims in place, otherwise the kept dims are out's dims in order. */
  int64_t ostride[TPU_MAX_DIMS];
  bool keep = out->ndim == nd && nd > 0;
  for (int d = 0, o = 0; d < nd; d++) {
    if (red[d]) {
      ostride[d] = 0;
      if (keep) o++;
    } else {
      ostride[d] = out->strides[o++];
    }
  }
  int64_t nout = tpu_tensor_numel(out);
  for (int64_t i = 0; i < nout; i++) *(uint64_t*)tpu_tensor_elem_ptr(out, i) = 0;
  int64_t n = tpu_tensor_numel(in);
  if (n == 0) return NULL;
  size_t isz = tpu_dtype_size(in->dtype);
  int64_t idx[TPU_MAX_DIMS] = {0};
  int64_t ioff = 0, ooff = 0;
  for (int64_t e = 0; e < n; e++) {
    uint64_t* o = (uint64_t*)out->data + ooff;
    *o ^= elem_bits((const char*)in->data + ioff * (int64_t)isz, in->dtype);
    for (int d = nd - 1; d >= 0; d--) { /* next row-major index */
      ioff += in->strides[d];
      ooff += ostride[d];
      if (++idx[d] < in->sizes[d]) break;
      ioff -= in->strides[d] * in->sizes[d];
      ooff -= ostride[d] * in->sizes[d];
      idx[d] = 0;
    }
  }
  return NULL;
}
