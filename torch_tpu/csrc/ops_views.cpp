// Views and storage: the directly registered ops that allocate, reinterpret
// or rebind a tensor's storage without running a runtime kernel (empty,
// as_strided, view, _reshape_alias, resize_, the set_ overloads,
// record_stream), and resize_tensor, which the boxed fallback also uses to
// grow out= arguments. add_view_ops hands the kernels to ops.cpp, which
// registers them.
#include <ATen/CPUFunctions.h>
#include <ATen/EmptyTensor.h>
#include <ATen/NativeFunctions.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/CachingDeviceAllocator.h>

#include "ops_internal.h"

namespace torch_tpu {
namespace {

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default): new
// memory is filled with NaN / the largest integer, as CPU and CUDA do.
bool fill_uninitialized() {
  auto& ctx = at::globalContext();
  return C10_UNLIKELY(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory());
}

}  // namespace

// Resizes like at::native::resize_, but grows the storage through the hooks
// (ordered after queued work) instead of an unordered host memcpy.
const at::Tensor& resize_tensor(const at::Tensor& self, c10::IntArrayRef size,
                                std::optional<c10::MemoryFormat> fmt) {
  int64_t numel = 1;
  for (int64_t s : size) {
    TORCH_CHECK(s >= 0, "resize_: negative size ", s, " in ", size);
    numel *= s;
  }
  const size_t old_nbytes = self.storage().nbytes();
  const size_t need = (size_t)(numel + self.storage_offset()) * self.element_size();
  if (numel > 0 && need > old_nbytes)
    at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(self.storage(), need);
  const at::Tensor& r = at::native::resize_(self, size, fmt);
  if (fill_uninitialized()) at::native::fill_resize_deterministic_(r, (int64_t)old_nbytes);
  return r;
}

namespace {

at::Tensor tpu_empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                   std::optional<c10::Layout> layout,
                                   std::optional<c10::Device> device, std::optional<bool> pin,
                                   std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "tpu supports only strided tensors");
  ensure_runtime();
  const auto d = c10::device_or_default(device);
  c10::DeviceGuard guard(d.has_index() ? d : c10::Device(kTpu, current_device()));
  at::Tensor t = at::detail::empty_generic(size, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype), memory_format);
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                             std::optional<c10::Device> device, std::optional<bool> pin) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "tpu supports only strided tensors");
  ensure_runtime();
  const auto d = c10::device_or_default(device);
  c10::DeviceGuard guard(d.has_index() ? d : c10::Device(kTpu, current_device()));
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor tpu_as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                          c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

at::Tensor tpu_view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor tpu_reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                             c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& tpu_resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                              std::optional<c10::MemoryFormat> fmt) {
  return resize_tensor(self, C10_AS_INTARRAYREF_SLOW(size), fmt);
}

at::Tensor& tpu_set_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

at::Tensor& tpu_set_storage(at::Tensor& self, at::Storage storage) {
  const int64_t n = (int64_t)(storage.nbytes() / self.dtype().itemsize());
  return at::cpu::set_(self, storage, 0, {n}, {});
}

at::Tensor& tpu_set_tensor(at::Tensor& self, const at::Tensor& src) {
  return at::native::set_tensor_(self, src);
}

at::Tensor& tpu_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(), true);
  return at::cpu::set_(self, storage, 0, {0}, {});
}

void tpu_record_stream(at::Tensor& self, c10::Stream s) {
  allocator();  // the allocator tracks side-stream use of the block
  static_cast<c10::DeviceAllocator*>(allocator())->recordStream(self.storage().data_ptr(), s);
}

}  // namespace

namespace {

// view_as_real / view_as_complex have per-device kernels only; PyTorch's
// native ones build a view over the same storage, which serves tpu tensors.
at::Tensor tpu_view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }
at::Tensor tpu_view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }

}  // namespace

void add_view_ops(DirectOps& ops) {
  ops.add("view_as_complex", tpu_view_as_complex);
  ops.add("view_as_real", tpu_view_as_real);
  ops.add("empty.memory_format", tpu_empty_memory_format);
  ops.add("empty_strided", tpu_empty_strided);
  ops.add("as_strided", tpu_as_strided);
  ops.add("view", tpu_view);
  ops.add("_reshape_alias", tpu_reshape_alias);
  ops.add("resize_", tpu_resize_);
  ops.add("set_.source_Storage_storage_offset", tpu_set_storage_offset);
  ops.add("set_.source_Storage", tpu_set_storage);
  ops.add("set_.source_Tensor", tpu_set_tensor);
  ops.add("set_", tpu_set_empty);
  ops.add("record_stream", tpu_record_stream);
}

}  // namespace torch_tpu
