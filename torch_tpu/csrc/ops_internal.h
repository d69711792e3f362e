// Private to the op bridge: what one of ops.cpp, ops_views.cpp, ops_copy.cpp
// and ops_dynamic.cpp defines and another uses. The kernels declared here are
// the direct registrations, which ops.cpp lists (TPU_DIRECT_OPS) and
// registers in one TORCH_LIBRARY_IMPL block; everything else the files keep
// to themselves.
#pragma once

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

#include "bridge.h"

namespace torch_tpu {

// --- ops.cpp: the boxed fallback -------------------------------------------

// Queues the runtime kernel `name` with up to 4 tensor arguments and the one
// output `out`, on the output's device and its current stream.
void submit_tensor_call(const char* name, std::initializer_list<at::Tensor> args,
                        const at::Tensor& out);
// Gives a copy-on-write storage its own memory before the tensor is written.
void materialize_cow(const at::Tensor& t);
// The broadcast shape of two shapes, raising like at::infer_size.
c10::DimVector broadcast_shape(c10::IntArrayRef a, c10::IntArrayRef b);
// CPU's IndexError for indexing an empty dim with a non-empty broadcast index.
void check_empty_indexed_dims(const at::Tensor& self, const c10::List<c10::IValue>& list,
                              c10::IntArrayRef bshape);

// --- ops_views.cpp: views and storage --------------------------------------

// resize_ that grows the storage through the device hooks (stream-ordered).
const at::Tensor& resize_tensor(const at::Tensor& self, c10::IntArrayRef size,
                                std::optional<c10::MemoryFormat> fmt);

at::Tensor tpu_empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                   std::optional<c10::Layout> layout,
                                   std::optional<c10::Device> device, std::optional<bool> pin,
                                   std::optional<c10::MemoryFormat> memory_format);
at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                             std::optional<c10::Device> device, std::optional<bool> pin);
at::Tensor tpu_as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                          c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset);
at::Tensor tpu_view(const at::Tensor& self, c10::SymIntArrayRef size);
at::Tensor tpu_reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                             c10::SymIntArrayRef stride);
const at::Tensor& tpu_resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                              std::optional<c10::MemoryFormat> fmt);
at::Tensor& tpu_set_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride);
at::Tensor& tpu_set_storage(at::Tensor& self, at::Storage storage);
at::Tensor& tpu_set_tensor(at::Tensor& self, const at::Tensor& src);
at::Tensor& tpu_set_empty(at::Tensor& self);
void tpu_record_stream(at::Tensor& self, c10::Stream s);

// --- ops_copy.cpp: copies (copy_from itself is in bridge.h) ----------------

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
at::Tensor& tpu_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking);
at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);

// --- ops_dynamic.cpp: data-dependent ops -----------------------------------

// The number of non-zero elements, read back from the device (synchronizes).
int64_t count_nonzero_host(const at::Tensor& self);
// index / index_put: boolean masks become long indices, CPU indices move to
// device `dev`, after CPU's checks; `put` for index_put.
void prepare_indices(c10::IValue* args, c10::DeviceIndex dev, bool put);

at::Tensor& tpu_nonzero_out(const at::Tensor& self, at::Tensor& out);
at::Tensor tpu_nonzero(const at::Tensor& self);
at::Tensor tpu_masked_select(const at::Tensor& self, const at::Tensor& mask);
at::Tensor& tpu_masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique2(const at::Tensor& self, bool sorted,
                                                           bool return_inverse,
                                                           bool return_counts);
std::tuple<at::Tensor, at::Tensor> tpu_unique(const at::Tensor& self, bool sorted,
                                              bool return_inverse);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_consecutive(
    const at::Tensor& self, bool return_inverse, bool return_counts, std::optional<int64_t> dim);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_dim(const at::Tensor& self, int64_t dim,
                                                              bool sorted, bool return_inverse,
                                                              bool return_counts);
bool tpu_equal(const at::Tensor& self, const at::Tensor& other);
at::Tensor tpu_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights,
                        int64_t minlength);
std::tuple<at::Tensor, at::Tensor> tpu_ctc_loss_tensor(const at::Tensor& log_probs,
                                                       const at::Tensor& targets,
                                                       const at::Tensor& input_lengths,
                                                       const at::Tensor& target_lengths,
                                                       int64_t blank, bool zero_infinity);
at::Tensor tpu_ctc_loss_backward_tensor(const at::Tensor& grad, const at::Tensor& log_probs,
                                        const at::Tensor& targets,
                                        const at::Tensor& input_lengths,
                                        const at::Tensor& target_lengths,
                                        const at::Tensor& neg_log_likelihood,
                                        const at::Tensor& log_alpha, int64_t blank,
                                        bool zero_infinity);
at::Scalar tpu_local_scalar_dense(const at::Tensor& self);

}  // namespace torch_tpu
