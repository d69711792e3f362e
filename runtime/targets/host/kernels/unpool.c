/* Max unpooling (max_unpool2d/3d) and the matrix trace.
 *
 * max_unpool scatters each input element to the position its index names
 * within its (batch, channel) plane of the output and zeroes the rest; an
 * index outside the plane is an error that names it. Elements move as raw
 * bytes (self and out share the dtype). */
#include "kernels.h"

/* max_unpool2d(self, indices, output_size) /
 * max_unpool3d(self, indices, output_size, stride, padding) */
static tpu_status_t max_unpool(const char* op, const tpu_call_t* c, int sd) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* idx = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* out = &c->outs[0];
  if (!self || !idx) return TPU_ERR(INVALID_ARGUMENT, "%s: expected tensor arguments", op);
  if (self->dtype != out->dtype)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected out of dtype %s, got %s", op,
                   tpu_dtype_name(self->dtype), tpu_dtype_name(out->dtype));
  if (tpu_dtype_is_float(idx->dtype) || idx->dtype == TPU_BOOL)
    return TPU_ERR(INVALID_ARGUMENT, "%s: elements in indices should be type int64 but got: %s", op,
                   tpu_dtype_name(idx->dtype));
  int64_t n = tpu_tensor_numel(self);
  if (tpu_tensor_numel(idx) != n || idx->ndim != self->ndim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected shape of indices to be same as that of the input",
                   op);
  if (self->ndim != sd + 1 && self->ndim != sd + 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a %dd or %dd input, got %dd", op, sd + 1, sd + 2,
                   self->ndim);
  int64_t in_plane = 1, out_plane = 1;
  for (int d = 0; d < sd; d++) {
    in_plane *= self->sizes[self->ndim - sd + d];
    out_plane *= out->sizes[out->ndim - sd + d];
  }
  size_t esz = tpu_dtype_size(out->dtype);
  int64_t no = tpu_tensor_numel(out);
  /* indices first: a bad one leaves the output untouched */
  for (int64_t i = 0; i < n; i++) {
    int64_t k = tpu_tensor_get_i64(idx, i);
    if (k < 0 || k >= out_plane)
      return TPU_ERR(OUT_OF_RANGE, "%s: Found an invalid max index: %lld (output volumes are of size %lld)",
                     op, (long long)k, (long long)out_plane);
  }
  for (int64_t i = 0; i < no; i++) memset(tpu_tensor_elem_ptr(out, i), 0, esz);
  for (int64_t i = 0; i < n; i++) {
    int64_t plane = in_plane ? i / in_plane : 0;
    int64_t k = tpu_tensor_get_i64(idx, i);
    memcpy(tpu_tensor_elem_ptr(out, plane * out_plane + k), tpu_tensor_elem_ptr(self, i), esz);
  }
  return TPU_OK;
}

tpu_status_t tpu_k_max_unpool2d(const tpu_call_t* c) { return max_unpool("max_unpool2d", c, 2); }
tpu_status_t tpu_k_max_unpool3d(const tpu_call_t* c) { return max_unpool("max_unpool3d", c, 3); }

/* trace(self): the sum of the main diagonal of a matrix, accumulated in
 * double (int64 for integers) */
tpu_status_t tpu_k_trace(const tpu_call_t* c) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (!self || self->ndim != 2)
    return TPU_ERR(INVALID_ARGUMENT, "trace: expected a matrix, but got tensor with dim %d",
                   self ? self->ndim : -1);
  int64_t n = self->sizes[0] < self->sizes[1] ? self->sizes[0] : self->sizes[1];
  const char* base = self->data;
  size_t esz = tpu_dtype_size(self->dtype);
  int64_t step = (self->strides[0] + self->strides[1]) * (int64_t)esz;
  void* o = tpu_tensor_elem_ptr(out, 0);
  if (tpu_dtype_is_float(self->dtype)) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += tpu_load_f64(base + i * step, self->dtype);
    tpu_store_f64(o, out->dtype, s);
  } else {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint64_t)tpu_load_i64(base + i * step, self->dtype);
    tpu_store_i64(o, out->dtype, (int64_t)s);
  }
  return TPU_OK;
}
