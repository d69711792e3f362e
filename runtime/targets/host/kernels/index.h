/* Host indexing kernels: entry points used outside the op table.
 *
 * The bridge sizes nonzero's output with tpu_count_nonzero_all (after
 * synchronizing the tensor's stream), then calls the `nonzero` kernel.
 */
#ifndef TPU_HOST_INDEX_H_
#define TPU_HOST_INDEX_H_

#include "tpu/status.h"
#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of nonzero elements of t (any strides; a 0-d tensor counts as one
 * element). NaN is nonzero, -0.0 is zero. */
int64_t tpu_count_nonzero_all(const tpu_tensor_t* t);

/* Wraps a possibly negative `dim` of a tensor with `ndim` dims (0-d tensors
 * accept dims 0 and -1) into *out; OUT_OF_RANGE naming `op` otherwise.
 * Shared by the index and shape kernels. */
tpu_status_t tpu_index_wrap_dim(const char* op, int64_t dim, int ndim, int* out);

#ifdef __cplusplus
}
#endif
#endif /* TPU_HOST_INDEX_H_ */
