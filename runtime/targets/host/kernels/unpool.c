/* Max unpooling (max_unpool2d/3d), the matrix trace and index_reduce.
 *
 * max_unpool scatters each input element to the position its index names
 * within its (batch, channel) plane of the output and zeroes the rest; an
 * index outside the plane is an error that names it. Elements move as raw
 * bytes (self and out share the dtype). */
#include <stdlib.h>

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
  TPU_ROUTE_COMPLEX(c);
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

/* index_reduce(self, dim, index, source, reduce, *, include_self): out =
 * self, then out.select(dim, index[i]) combined with source.select(dim, i)
 * by prod, mean, amax or amin. Without include_self, indexed positions start
 * from the reduction's identity. Like PyTorch's CPU kernel, which combines
 * in the tensor's dtype, each product or sum is rounded to the dtype (the
 * double accumulator only holds it), and mean divides by the count held in
 * the dtype in the dtype's compute type (float for float32 and the 16-bit
 * dtypes). Integer dtypes accumulate in int64 and their mean rounds down;
 * amax/amin propagate nan. */
tpu_status_t tpu_k_index_reduce(const tpu_call_t* c) {
  const char* op = "index_reduce";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* index = tpu_arg_tensor(c, 2);
  const tpu_tensor_t* src = tpu_arg_tensor(c, 3);
  const char* red = tpu_arg_str(c, 4, "");
  bool incl = tpu_arg_bool(c, 5, true);
  const tpu_tensor_t* out = &c->outs[0];
  int mode = !strcmp(red, "prod") ? 0 : !strcmp(red, "mean") ? 1 : !strcmp(red, "amax") ? 2
           : !strcmp(red, "amin") ? 3 : -1;
  if (mode < 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: reduce argument must be either prod, mean, amax or amin, got %s", op, red);
  int nd = self->ndim;
  int64_t dim = tpu_arg_i64(c, 1, 0);
  if (dim < -(nd ? nd : 1) || dim >= (nd ? nd : 1))
    return TPU_ERR(OUT_OF_RANGE, "%s: dimension %lld out of range", op, (long long)dim);
  if (dim < 0) dim += nd ? nd : 1;
  if (index->ndim > 1 || (tpu_dtype_is_float(index->dtype) || index->dtype == TPU_BOOL))
    return TPU_ERR(INVALID_ARGUMENT, "%s: Index should be a 1-d tensor of int32 or int64", op);
  if (src->ndim != nd || src->dtype != self->dtype)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: source must have the same number of dimensions and dtype as self", op);
  int64_t dsz = nd ? self->sizes[dim] : 1, ssz = nd ? src->sizes[dim] : 1;
  if (tpu_tensor_numel(index) != ssz)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Index should have the same number of elements as dimension %lld of source",
                   op, (long long)dim);
  for (int d = 0; d < nd; d++)
    if (d != dim && src->sizes[d] != self->sizes[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s: source and self differ in size at dimension %d", op, d);
  int64_t ni = tpu_tensor_numel(index);
  for (int64_t i = 0; i < ni; i++) {
    int64_t k = tpu_tensor_get_i64(index, i);
    if (k < 0 || k >= dsz) /* CPU rejects negative indices here too */
      return TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for dimension %lld with size %lld",
                     op, (long long)k, (long long)dim, (long long)dsz);
  }
  bool fl = tpu_dtype_is_float(self->dtype);
  int64_t n = tpu_tensor_numel(self), ns = tpu_tensor_numel(src);
  void* buf = malloc(8 * (size_t)(n > 0 ? n : 1));
  int64_t* cnt = calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
  unsigned char* seen = calloc((size_t)(n > 0 ? n : 1), 1);
  tpu_status_t st = TPU_OK;
  if (!buf || !cnt || !seen) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op);
    goto done;
  }
  tpu_tensor_t acc;
  tpu_tensor_make_contig(&acc, buf, fl ? TPU_F64 : TPU_I64, nd, self->sizes);
  if ((st = tpu_copy_strided(&acc, self))) goto done;
  double* bd = buf;
  int64_t* bi = buf;
  int64_t inner = 1;
  for (int d = (int)dim + 1; d < nd; d++) inner *= self->sizes[d];
  for (int64_t j = 0; j < ns; j++) {
    int64_t outer = j / (inner * ssz), i = (j / inner) % ssz, in = j % inner;
    int64_t k = tpu_tensor_get_i64(index, i);
    int64_t t = (outer * dsz + k) * inner + in;
    if (!incl && !seen[t]) { /* start from the identity */
      if (fl) bd[t] = mode == 0 ? 1 : mode == 1 ? 0 : mode == 2 ? -INFINITY : INFINITY;
      else bi[t] = mode == 0 ? 1 : mode == 1 ? 0 : mode == 2 ? INT64_MIN : INT64_MAX;
    }
    seen[t] = 1;
    cnt[t]++;
    if (fl) {
      double v = tpu_tensor_get_f64(src, j), *a = &bd[t];
      if (mode == 0) *a = tpu_round_f64(self->dtype, *a * v);
      else if (mode == 1) *a = tpu_round_f64(self->dtype, *a + v);
      else if (v != v || (mode == 2 ? v > *a : v < *a)) *a = v;
    } else {
      int64_t v = tpu_tensor_get_i64(src, j), *a = &bi[t];
      if (mode == 0) *a = (int64_t)((uint64_t)*a * (uint64_t)v);
      else if (mode == 1) *a = (int64_t)((uint64_t)*a + (uint64_t)v);
      else if (mode == 2 ? v > *a : v < *a) *a = v;
    }
  }
  if (mode == 1) {
    for (int64_t t = 0; t < n; t++) {
      if (!seen[t]) continue;
      int64_t m = cnt[t] + (incl ? 1 : 0);
      if (fl) {
        double cm = tpu_round_f64(self->dtype, (double)m);
        bd[t] = self->dtype == TPU_F64 ? bd[t] / cm
                                       : tpu_round_f64(self->dtype, (float)bd[t] / (float)cm);
      } else {
        int64_t q = bi[t] / m;
        if ((bi[t] % m != 0) && ((bi[t] < 0) != (m < 0))) q--; /* floor */
        bi[t] = q;
      }
    }
  }
  st = tpu_copy_strided(out, &acc);
done:
  free(buf);
  free(cnt);
  free(seen);
  return st;
}
