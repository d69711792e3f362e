// Private to the op bridge: what one of ops.cpp, ops_views.cpp, ops_copy.cpp
// and ops_dynamic.cpp defines and another uses. Each of the last three keeps
// its kernels to itself and lists them in an add_*_ops function, which
// ops.cpp calls from its one TORCH_LIBRARY_IMPL block (and supported_ops).
#pragma once

#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bridge.h"

namespace torch_tpu {

// The direct registrations of one file, handed over one by one: each kernel
// goes into `lib` when it is set, its overload name into `names` when that is.
struct DirectOps {
  torch::Library* lib = nullptr;
  std::vector<std::string>* names = nullptr;

  template <typename Fn>
  void add(const char* name, Fn&& fn) {
    if (lib) lib->impl(name, std::forward<Fn>(fn));
    if (names) names->push_back(name);
  }
};

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
void add_view_ops(DirectOps& ops);

// --- ops_copy.cpp: copies (copy_from itself is declared in bridge.h) -------

void add_copy_ops(DirectOps& ops);

// --- ops_dynamic.cpp: data-dependent ops -----------------------------------

// The number of non-zero elements, read back from the device (synchronizes).
int64_t count_nonzero_host(const at::Tensor& self);
// index / index_put: boolean masks become long indices and CPU indices move
// to device `dev`, after CPU's checks; `put` for index_put.
void prepare_indices(c10::IValue* args, c10::DeviceIndex dev, bool put);
void add_dynamic_ops(DirectOps& ops);

// --- attention.cpp: scaled_dot_product_attention's fused kernel -------------

void add_attention_ops(DirectOps& ops);

// --- ops_float8.cpp: torch._scaled_mm ---------------------------------------

void add_float8_ops(DirectOps& ops);

}  // namespace torch_tpu
