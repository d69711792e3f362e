// Copies: copy_from (declared in bridge.h), which moves data host -> device,
// device -> host and between chips on the streams, and the directly
// registered copy_, _copy_from and _copy_from_and_resize built on it.
// add_copy_ops hands those kernels to ops.cpp, which registers them.
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>

#include "ops_internal.h"

namespace torch_tpu {

// Host/device copies. On the host target device memory is host-addressable,
// so device->host copies read it directly after synchronizing; host->device
// copies go through the stream with a staging snapshot.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  if (dst.numel() == 0) return dst;
  ensure_runtime();
  PlaceholderUse use;
  const bool src_tpu = self.device().type() == kTpu, dst_tpu = dst.device().type() == kTpu;
  at::Tensor src = self;
  if (src.sizes() != dst.sizes()) src = src.expand(dst.sizes());
  // Between host and device the conjugate and negative bits are applied on
  // the values moved: dst's stored values are src's logical ones with dst's
  // bits undone. (On the device, tpu_copy_ fixes the bits after the copy.)
  if (src_tpu != dst_tpu && (src.is_conj() || src.is_neg() || dst.is_conj() || dst.is_neg())) {
    at::Tensor v = src.resolve_conj().resolve_neg();
    if (dst.is_conj()) v = v.conj().resolve_conj();
    if (dst.is_neg()) v = v.neg();
    if (dst_tpu) {
      at::Tensor raw = dst;
      if (dst.is_conj()) raw = raw.conj();
      if (raw.is_neg()) raw = raw._neg_view();
      return copy_from(v, raw, non_blocking), dst;
    }
    at::Tensor tmp = at::empty(v.sizes(), v.options().device(at::kCPU));
    copy_from(v, tmp, non_blocking);
    at::Tensor raw = dst;
    if (dst.is_conj()) raw = raw.conj();
    if (raw.is_neg()) raw = raw._neg_view();
    raw.copy_(tmp.resolve_conj().resolve_neg());
    return dst;
  }
  if (src_tpu && dst_tpu) {
    // float4_e2m1fn_x2 is a container: CPU copies it only into itself
    if (src.scalar_type() != dst.scalar_type())
      TORCH_CHECK_NOT_IMPLEMENTED(src.scalar_type() != at::kFloat4_e2m1fn_x2 &&
                                      dst.scalar_type() != at::kFloat4_e2m1fn_x2,
                                  "\"copy_\" not implemented for '",
                                  src.scalar_type() == at::kFloat4_e2m1fn_x2 ? src.scalar_type()
                                                                            : dst.scalar_type(),
                                  "'");
    const bool across = self.device() != dst.device();
    // Across chips: wait for the source chip, then copy on the target's stream.
    if (across) synchronize_device(self.device().index());
    c10::DeviceGuard guard(dst.device());
    submit_tensor_call("copy", {dst, src}, dst);  // copy(self, src) writes src into out
    if (across) {
      // ... and order later work of the source chip's current stream after
      // the copy (as CUDA does), so an in-place write to the source cannot
      // overtake the queued read. Freeing the source is covered by the
      // allocator's stream-ordered fences.
      const auto sd = self.device().index();
      check(tpu_stream_wait_stream(current_stream(sd), current_stream(dst.device().index())));
    }
    return dst;
  }
  if (dst_tpu) {  // host -> device
    TORCH_CHECK(src.is_cpu(), "copy_: cannot copy from ", src.device(), " to tpu");
    c10::DeviceGuard guard(dst.device());
    at::Tensor host = src.to(dst.scalar_type()).contiguous();
    const size_t bytes = (size_t)host.numel() * host.element_size();
    tpu_stream_t* s = current_stream(dst.device().index());
    if (dst.is_non_overlapping_and_dense() && dst.is_contiguous()) {
      check(tpu_stream_copy_h2d(s, dst.data_ptr(), host.const_data_ptr(), bytes));
    } else {
      at::Tensor tmp = at::empty(dst.sizes(), dst.options());
      check(tpu_stream_copy_h2d(s, tmp.data_ptr(), host.const_data_ptr(), bytes));
      copy_from(tmp, dst, false);
    }
    return dst;
  }
  // device -> host
  TORCH_CHECK(src_tpu && dst.is_cpu(), "copy_: cannot copy from ", src.device(), " to ",
              dst.device());
  // A dense copy on the device first when src is not contiguous, then the
  // runtime copies the bytes out (straight into dst when it has src's layout).
  const at::Tensor dense = src.is_contiguous() ? src : src.contiguous();
  const auto sd = src.device().index();
  synchronize_device(sd);
  const size_t bytes = (size_t)dense.numel() * dense.element_size();
  const bool direct = dst.is_contiguous() && dst.scalar_type() == dense.scalar_type() &&
                      dst.sizes() == dense.sizes();
  at::Tensor host = direct ? dst : at::empty(dense.sizes(), dense.options().device(at::kCPU));
  if (bytes) {
    PlaceholderUse use;
    check(tpu_stream_copy_d2h(current_stream(sd), host.data_ptr(), dense.const_data_ptr(), bytes));
  }
  if (!direct) dst.copy_(host);
  return dst;
}

namespace {

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  return copy_from(self, dst, non_blocking);
}

// copy_ as CPU's copy_impl: a copy onto itself or onto the same view does
// nothing; a destination that overlaps itself or partly overlaps the source
// raises; a source whose negative bit differs from the destination's is
// copied and then negated in place (neg_ acts on the memory as stored).
at::Tensor& tpu_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_same(src)) return self;
  if (self.is_alias_of(src) && self.storage_offset() == src.storage_offset() &&
      self.strides().equals(src.strides()) && self.sizes().equals(src.sizes()) &&
      self.scalar_type() == src.scalar_type() && self.is_neg() == src.is_neg() &&
      self.is_conj() == src.is_conj())
    return self;
  if (self.numel() > 0) {
    at::assert_no_internal_overlap(self);
    at::assert_no_partial_overlap(self, src);
  }
  // src must broadcast to self, also when self is empty (copy_from does
  // nothing then): CPU's TensorIterator checks the shapes first
  if (!src.sizes().equals(self.sizes())) {
    const auto shape = at::infer_size_dimvector(self.sizes(), src.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape).equals(self.sizes()), "output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (!self.is_complex() && src.is_complex()) {  // as CPU's copy_
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  }
  materialize_cow(self);
  copy_from(src, self, non_blocking);
  if (src.device().type() != kTpu || self.device().type() != kTpu) {
    return self;  // copy_from applied the bits
  }
  if (self.is_conj() != src.is_conj() && self.is_complex() && self.numel() > 0) {
    // conjugate the stored values: through a view without the bit
    at::Tensor raw = self.is_conj() ? self.conj() : self;
    if (raw.is_neg()) raw = raw._neg_view();
    at::conj_physical_(raw);
  }
  if (self.is_neg() != src.is_neg() && self.numel() > 0) {
    // negate the stored values: through a view without the bit
    at::Tensor raw = self.is_neg() ? self._neg_view() : self;
    raw.neg_();
  }
  return self;
}

at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) resize_tensor(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

}  // namespace

// Module._apply (.to("tpu"), .cuda()-style moves) keeps a parameter's
// identity -- `param.data = moved`, so tied weights stay one Parameter -- only
// where this says the parameter's TensorImpl can take the moved tensor's. It
// can between dense cpu and tpu tensors (the same TensorImpl class over a
// strided storage), as between cpu and cuda; anything else (wrappers, nested,
// sparse) keeps PyTorch's own rule.
bool tpu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto plain_dense = [](const at::Tensor& t) {
    const auto* impl = t.unsafeGetTensorImpl();
    return t.layout() == at::kStrided && typeid(*impl) == typeid(c10::TensorImpl) &&
           (t.device().is_cpu() || t.device().type() == kTpu);
  };
  if (plain_dense(self) && plain_dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

void add_copy_ops(DirectOps& ops) {
  ops.add("_has_compatible_shallow_copy_type", tpu_has_compatible_shallow_copy_type);
  ops.add("copy_", tpu_copy_);
  ops.add("_copy_from", tpu_copy_from);
  ops.add("_copy_from_and_resize", tpu_copy_from_and_resize);
}

}  // namespace torch_tpu
