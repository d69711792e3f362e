/* Core kernels the bridge relies on beyond the op families: identity
 * matrices. (copy lives in elementwise.c with the other converting loops.) */
#include "kernels.h"

/* eye.out(n, out) / eye.m_out(n, m, out): out is preallocated [n, m]. */
/* tril_indices / triu_indices(row, col, offset, ...): the (i, j) of the
 * lower (j - i <= offset) or upper (j - i >= offset) triangle of a row x col
 * matrix in row-major order, as a 2 x N tensor of rows then columns. */
static tpu_status_t tri_indices(const tpu_call_t* c, bool lower) {
  const char* op = lower ? "tril_indices" : "triu_indices";
  const int64_t rows = tpu_arg_i64(c, 0, 0), cols = tpu_arg_i64(c, 1, 0);
  const int64_t offset = tpu_arg_i64(c, 2, 0);
  const tpu_tensor_t* out = &c->outs[0];
  if (rows < 0 || cols < 0)
    return TPU_ERR(INVALID_ARGUMENT, "%s: row must be non-negative, got %lld; col %lld", op,
                   (long long)rows, (long long)cols);
  if (out->ndim != 2 || out->sizes[0] != 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a 2 x N output, got %d dims", op,
                   (int)out->ndim);
  const size_t isz = tpu_dtype_size(out->dtype);
  int64_t k = 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      if (lower ? j - i > offset : j - i < offset) continue;
      if (k >= out->sizes[1])
        return TPU_ERR(INVALID_ARGUMENT, "%s: output holds %lld indices, more are needed", op,
                       (long long)out->sizes[1]);
      char* p = (char*)out->data + k * out->strides[1] * (int64_t)isz;
      tpu_store_i64(p, out->dtype, i);
      tpu_store_i64(p + out->strides[0] * (int64_t)isz, out->dtype, j);
      k++;
    }
  return TPU_OK;
}

tpu_status_t tpu_k_tril_indices(const tpu_call_t* c) { return tri_indices(c, true); }
tpu_status_t tpu_k_triu_indices(const tpu_call_t* c) { return tri_indices(c, false); }

tpu_status_t tpu_k_eye(const tpu_call_t* c) {
  const tpu_tensor_t* out = &c->outs[0];
  int64_t n = out->sizes[0], m = out->ndim > 1 ? out->sizes[1] : 1;
  size_t isz = tpu_dtype_size(out->dtype);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) {
      char* p = (char*)out->data + (i * out->strides[0] + j * out->strides[1]) * (int64_t)isz;
      tpu_store_f64(p, out->dtype, i == j ? 1.0 : 0.0);
    }
  return TPU_OK;
}
