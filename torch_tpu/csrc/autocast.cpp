// Autocast for device "tpu": the same op policies as CUDA's autocast
// (matmul-class ops in the lower-precision dtype, precision-sensitive ops in
// float32, mixed-input ops promoted), from PyTorch's shared op lists.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define TPU_AUTOCAST_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define TPU_AUTOCAST_DIFFERENT_SIGNATURE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, \
                                         REDISPATCH_SIGNATURE, POLICY)                       \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME,        \
                                                      REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, \
                                                      POLICY)

// Ops without a policy run unchanged.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_AUTOCAST_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPU_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(TPU_AUTOCAST_DIFFERENT_SIGNATURE)
  AT_FORALL_PROMOTE(TPU_AUTOCAST_PROMOTE)
}

}  // namespace
