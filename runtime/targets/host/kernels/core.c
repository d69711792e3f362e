/* Core kernels the bridge relies on beyond the op families: identity
 * matrices. (copy lives in elementwise.c with the other converting loops.) */
#include "kernels.h"

/* eye.out(n, out) / eye.m_out(n, m, out): out is preallocated [n, m]. */
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
