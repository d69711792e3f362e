// torch._scaled_mm on tpu, registered directly: the meta kernel enforces
// cuBLAS's layout rules (mat2 column-major, sizes divisible by 16), while the
// configurations accepted here are CPU's (per-tensor and per-row float32
// scales, any layout) plus the block-scaled formats cuBLAS takes, in its
// swizzled scale layout: MXFP8 and MXFP4 (float8_e8m0fnu scales, blocks of 32
// along K) and NVFP4 (float8_e4m3fn scales, blocks of 16). Messages follow
// CPU's (aten/src/ATen/native/Blas.cpp). The product runs in the runtime's
// _scaled_mm kernel (runtime/targets/host/kernels/scaled_mm.c).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>

#include "ops_internal.h"

namespace torch_tpu {
namespace {

bool is_f8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz ||
         t == at::kFloat8_e5m2fnuz;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CPU's rowwise test: scale [rows, 1], float32, contiguous
bool rowwise(const at::Tensor& t, const at::Tensor& s) {
  return is_f8(t.scalar_type()) && s.scalar_type() == at::kFloat && s.dim() == 2 &&
         s.size(0) == t.size(0) && s.size(1) == 1 && s.is_contiguous();
}

bool tensorwise(const at::Tensor& t, const at::Tensor& s) {
  return is_f8(t.scalar_type()) && s.scalar_type() == at::kFloat && s.numel() == 1;
}

// Block-scaled: (format, scale dtype, block) and the swizzled scale sizes.
bool blockwise(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
               const at::Tensor& sb) {
  const bool fp4 = a.scalar_type() == at::kFloat4_e2m1fn_x2 &&
                   b.scalar_type() == at::kFloat4_e2m1fn_x2;
  const bool fp8 = is_f8(a.scalar_type()) && is_f8(b.scalar_type());
  int64_t block = 0;
  if (sa.scalar_type() == at::kFloat8_e8m0fnu && sb.scalar_type() == at::kFloat8_e8m0fnu &&
      (fp4 || fp8))
    block = 32;
  else if (sa.scalar_type() == at::kFloat8_e4m3fn && sb.scalar_type() == at::kFloat8_e4m3fn && fp4)
    block = 16;
  if (!block) return false;
  const int64_t k = a.size(1) * (fp4 ? 2 : 1);
  const int64_t kb = ceil_div(ceil_div(k, block), 4) * 4;
  const int64_t want_a = 128 * ceil_div(a.size(0), 128) * kb;
  const int64_t want_b = 128 * ceil_div(b.size(1), 128) * kb;
  TORCH_CHECK_VALUE(sa.numel() == want_a && sb.numel() == want_b,
                    "Invalid blockwise scaling configuration. For blockwise scaling, scale_a "
                    "should have ", want_a, " elements, got ", sa.numel(), ", scale_b should have ",
                    want_b, " elements, got ", sb.numel(), ".");
  TORCH_CHECK_VALUE(sa.is_contiguous() && sb.is_contiguous(),
                    "scale_a and scale_b must be contiguous");
  return true;
}

// CPU raises a RuntimeError for _scaled_mm, a ValueError for _scaled_mm_v2.
[[noreturn]] void invalid_config(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                                 const at::Tensor& sb, bool value_error = false) {
  std::string msg = c10::str("Invalid scaling configuration.\n"
              "- For TensorWise scaling, a and b should be float8, scales should be float and "
              "singletons.\n"
              "- For RowWise scaling, a and b should be float8, scales should be float, scale_a "
              "should be (", a.size(0), ", 1) and scale_b should be (1, ", b.size(1),
              "), and both should be contiguous.\n"
              "- For block scaling (tpu, as cuBLAS): MXFP8 / MXFP4 with float8_e8m0fnu scales, "
              "NVFP4 with float8_e4m3fn scales, swizzled.\n"
              "Got a.dtype()=", a.scalar_type(), ", scale_a.dtype()=", sa.scalar_type(),
              ", scale_a.size()=", sa.sizes(), ", scale_a.stride()=", sa.strides(), ", b.dtype()=",
              b.scalar_type(), ", scale_b.dtype()=", sb.scalar_type(), ", scale_b.size()=",
              sb.sizes(), " and scale_b.stride()=", sb.strides());
  if (value_error) TORCH_CHECK_VALUE(false, msg);
  TORCH_CHECK(false, msg);
}

void check_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                     const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& scale_result) {
  TORCH_CHECK(a.dim() == 2, "mat_a must be a matrix");
  TORCH_CHECK(b.dim() == 2, "mat_b must be a matrix");
  TORCH_CHECK(a.size(1) == b.size(0), "mat_a and mat_b shapes cannot be multiplied (", a.size(0),
              "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  for (const at::Tensor* t : {&a, &b, &sa, &sb})
    TORCH_CHECK(t->device() == a.device(), "_scaled_mm: expected every tensor on ", a.device(),
                ", got one on ", t->device());
  const bool ok = (tensorwise(a, sa) && tensorwise(b, sb)) ||
                  (rowwise(a, sa) && rowwise(b.t(), sb.t())) || blockwise(a, b, sa, sb);
  if (!ok) invalid_config(a, b, sa, sb);
  TORCH_CHECK(!scale_result ||
                  (scale_result->numel() == 1 && scale_result->scalar_type() == at::kFloat),
              "scale_result must be a float scalar");
  TORCH_CHECK(!bias || bias->numel() == b.size(1), "Bias must be size ", b.size(1), " but got ",
              bias ? bias->numel() : 0);
  if (bias)
    TORCH_CHECK(bias->device() == a.device() && at::isFloatingType(bias->scalar_type()) &&
                    bias->scalar_type() != at::kDouble,
                "_scaled_mm: bias must be a float32, bfloat16 or float16 tensor on ", a.device());
}

at::Tensor& scaled_mm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                           const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                           const std::optional<at::Tensor>& scale_result, at::Tensor& out,
                           const at::Tensor* global_a = nullptr,
                           const at::Tensor* global_b = nullptr) {
  ensure_runtime();
  c10::DeviceGuard guard(a.device());
  const int64_t m = a.size(0), n = b.size(1);
  if (out.sizes() != c10::IntArrayRef({m, n})) resize_tensor(out, {m, n}, std::nullopt);
  if (m == 0 || n == 0) return out;
  materialize_cow(out);
  // a bias of N elements, as a row
  std::optional<at::Tensor> row;
  if (bias) row = bias->reshape({1, n});
  PlaceholderUse use;
  std::vector<tpu_tensor_t> descs(8);
  tpu_arg_t args[10];
  std::memset(args, 0, sizeof args);
  const at::Tensor* ts[8] = {&a, &b, &sa, &sb, row ? &*row : nullptr,
                             scale_result ? &*scale_result : nullptr, nullptr, nullptr};
  for (int i = 0; i < 6; i++) {
    if (!ts[i] || !ts[i]->defined()) continue;  // kind TPU_ARG_NONE
    to_desc(*ts[i], &descs[i]);
    args[i].kind = TPU_ARG_TENSOR;
    args[i].v.t = &descs[i];
  }
  args[6].kind = TPU_ARG_INT;
  args[6].v.i = (int64_t)out.scalar_type();
  args[7].kind = TPU_ARG_BOOL;
  int nargs = 8;
  if (global_a && global_b) {  // _scaled_mm_v2's two-level NVFP4: args 8 and 9
    const at::Tensor* gs[2] = {global_a, global_b};
    for (int i = 0; i < 2; i++) {
      to_desc(*gs[i], &descs[6 + i]);
      args[8 + i].kind = TPU_ARG_TENSOR;
      args[8 + i].v.t = &descs[6 + i];
    }
    nargs = 10;
  }
  tpu_tensor_t od;
  to_desc(out, &od);
  const tpu_op_t* rt = tpu_op_lookup("_scaled_mm");
  TORCH_CHECK(rt, "tpu runtime has no _scaled_mm kernel");
  tpu_call_t call;
  std::memset(&call, 0, sizeof call);
  call.op = rt;
  call.nargs = nargs;
  call.args = args;
  call.nouts = 1;
  call.outs = &od;
  call.device = a.device().index();
  call.precision = tpu_get_matmul_precision();
  check(tpu_stream_submit(current_stream(a.device().index()), &call));
  return out;
}

at::Tensor tpu_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                         const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& scale_result,
                         std::optional<at::ScalarType> out_dtype, bool use_fast_accum) {
  check_scaled_mm(a, b, sa, sb, bias, scale_result);
  // CPU's default: the dtype of mat_a
  at::Tensor out = at::empty({a.size(0), b.size(1)},
                             a.options().dtype(out_dtype.value_or(a.scalar_type())));
  return scaled_mm_into(a, b, sa, sb, bias, scale_result, out);
}

at::Tensor& tpu_scaled_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                              const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& scale_result,
                              std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                              at::Tensor& out) {
  TORCH_CHECK_VALUE(!out_dtype || *out_dtype == out.scalar_type(),
                    "out_dtype must match output matrix type");
  check_scaled_mm(a, b, sa, sb, bias, scale_result);
  TORCH_CHECK(out.device() == a.device(), "_scaled_mm: out must be on ", a.device());
  return scaled_mm_into(a, b, sa, sb, bias, scale_result, out);
}

// ---- torch._scaled_mm_v2 (torch.nn.functional.scaled_mm) -------------------
// Scales come as lists with a recipe (at::blas::ScalingType) and a swizzle
// (SwizzleType) per tensor. The accepted configurations: CPU's (TensorWise and
// RowWise; contraction dims are checked, as there, not applied) and the block-scaled ones cuBLAS takes, whose
// scales must be swizzled (SWIZZLE_32_4_4): BlockWise1x32 (MXFP8, MXFP4) and
// BlockWise1x16 (NVFP4), the latter optionally two-level with a TensorWise
// float32 global scale per operand (the product times both, then the bias).
enum : int64_t { kTensorWise = 0, kRowWise = 1, kBlock1x16 = 2, kBlock1x32 = 3 };
enum : int64_t { kNoSwizzle = 0, kSwizzle32_4_4 = 1 };

struct V2Operands {
  at::Tensor a, b, sa, sb;
  const at::Tensor* ga = nullptr;
  const at::Tensor* gb = nullptr;
};

V2Operands check_scaled_mm_v2(const at::Tensor& mat_a, const at::Tensor& mat_b,
                              at::TensorList scale_a, at::IntArrayRef recipe_a,
                              at::IntArrayRef swizzle_a, at::TensorList scale_b,
                              at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                              const std::optional<at::Tensor>& bias,
                              at::IntArrayRef contraction_dim) {
  TORCH_CHECK(mat_a.dim() == 2, "mat_a must be a matrix");
  TORCH_CHECK(mat_b.dim() == 2, "mat_b must be a matrix");
  V2Operands o;
  int64_t ca = 1, cb = 0;
  if (!contraction_dim.empty()) {
    TORCH_CHECK_VALUE(contraction_dim.size() == 2,
                      "contraction_dim must have 2 entries (one per matrix), got ",
                      contraction_dim.size());
    ca = c10::maybe_wrap_dim(contraction_dim[0], 2);
    cb = c10::maybe_wrap_dim(contraction_dim[1], 2);
  }
  // CPU (and CUDA) only check the contraction dims; the product is mat_a @ mat_b
  TORCH_CHECK_VALUE(mat_a.size(ca) == mat_b.size(cb), "mat_a and mat_b shapes cannot be multiplied (",
                    mat_a.size(0), "x", mat_a.size(1), " and ", mat_b.size(0), "x", mat_b.size(1),
                    ")", contraction_dim.empty() ? "" : c10::str(" with contraction dims mat_a: ", ca,
                    ", mat_b: ", cb));
  TORCH_CHECK(mat_a.size(1) == mat_b.size(0), "mat_a and mat_b shapes cannot be multiplied (",
              mat_a.size(0), "x", mat_a.size(1), " and ", mat_b.size(0), "x", mat_b.size(1), ")");
  o.a = mat_a;
  o.b = mat_b;
  TORCH_CHECK_VALUE(!scale_a.empty() && !scale_b.empty(), "_scaled_mm_v2: scale_a and scale_b must "
                    "each hold at least one tensor");
  TORCH_CHECK_VALUE(scale_a.size() == recipe_a.size() && scale_b.size() == recipe_b.size(),
                    "_scaled_mm_v2: one scale recipe per scale tensor expected, got ",
                    scale_a.size(), " scales and ", recipe_a.size(), " recipes for mat_a, ",
                    scale_b.size(), " scales and ", recipe_b.size(), " recipes for mat_b");
  o.sa = scale_a[0];
  o.sb = scale_b[0];
  for (const at::Tensor& t : {o.sa, o.sb})
    TORCH_CHECK(t.device() == mat_a.device(), "_scaled_mm_v2: expected every tensor on ",
                mat_a.device(), ", got one on ", t.device());
  const int64_t ra = recipe_a[0], rb = recipe_b[0];
  bool ok = false;
  if (scale_a.size() == 1 && scale_b.size() == 1 && ra == kTensorWise && rb == kTensorWise)
    ok = tensorwise(o.a, o.sa) && tensorwise(o.b, o.sb);
  else if (scale_a.size() == 1 && scale_b.size() == 1 && ra == kRowWise && rb == kRowWise)
    ok = rowwise(o.a, o.sa) && rowwise(o.b.t(), o.sb.t());
  else if ((ra == kBlock1x32 && rb == kBlock1x32 && scale_a.size() == 1 && scale_b.size() == 1) ||
           (ra == kBlock1x16 && rb == kBlock1x16)) {
    const bool nv = ra == kBlock1x16;
    const bool two_level = scale_a.size() == 2 || scale_b.size() == 2;
    if (nv && two_level) {
      TORCH_CHECK_VALUE(scale_a.size() == 2 && scale_b.size() == 2 && recipe_a[1] == kTensorWise &&
                            recipe_b[1] == kTensorWise,
                        "For two-level-scaled NVFP4, scale_a and scale_b must each be "
                        "[block scales (BlockWise1x16), global scale (TensorWise)]");
      for (const at::Tensor& g : {scale_a[1], scale_b[1]})
        TORCH_CHECK_VALUE(g.numel() == 1 && g.scalar_type() == at::kFloat &&
                              g.device() == mat_a.device(),
                          "_scaled_mm_v2: an NVFP4 global scale must be one float32 value on ",
                          mat_a.device(), ", got ", g.sizes(), " ", g.scalar_type(), " on ",
                          g.device());
      o.ga = &scale_a[1];
      o.gb = &scale_b[1];
    }
    TORCH_CHECK_VALUE(scale_a.size() <= 2 && scale_b.size() <= 2,
                      "_scaled_mm_v2: too many scales for block scaling");
    const bool want_sa = o.sa.scalar_type() == (nv ? at::kFloat8_e4m3fn : at::kFloat8_e8m0fnu);
    const bool want_sb = o.sb.scalar_type() == (nv ? at::kFloat8_e4m3fn : at::kFloat8_e8m0fnu);
    if (want_sa && want_sb && blockwise(o.a, o.b, o.sa, o.sb)) {
      TORCH_CHECK_VALUE(!swizzle_a.empty() && !swizzle_b.empty() &&
                            swizzle_a[0] == kSwizzle32_4_4,
                        "scale_a must be swizzled to SWIZZLE_32_4_4 format");
      TORCH_CHECK_VALUE(swizzle_b[0] == kSwizzle32_4_4,
                        "scale_b must be swizzled to SWIZZLE_32_4_4 format");
      ok = true;
    }
  }
  if (!ok) invalid_config(o.a, o.b, o.sa, o.sb, /*value_error=*/true);
  for (auto sw : {swizzle_a, swizzle_b})
    for (size_t i = 0; i < sw.size(); i++)
      TORCH_CHECK_VALUE(sw[i] == kNoSwizzle || sw[i] == kSwizzle32_4_4,
                        "_scaled_mm_v2: unknown swizzle ", sw[i]);
  TORCH_CHECK(!bias || bias->numel() == o.b.size(1), "Bias must be size ", o.b.size(1),
              " but got ", bias ? bias->numel() : 0);
  if (bias)
    TORCH_CHECK(bias->device() == mat_a.device() && at::isFloatingType(bias->scalar_type()) &&
                    bias->scalar_type() != at::kDouble,
                "_scaled_mm_v2: bias must be a float32, bfloat16 or float16 tensor on ",
                mat_a.device());
  return o;
}

at::Tensor tpu_scaled_mm_v2(const at::Tensor& mat_a, const at::Tensor& mat_b,
                            at::TensorList scale_a, at::IntArrayRef recipe_a,
                            at::IntArrayRef swizzle_a, at::TensorList scale_b,
                            at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                            const std::optional<at::Tensor>& bias,
                            std::optional<at::ScalarType> out_dtype,
                            at::IntArrayRef contraction_dim, bool use_fast_accum) {
  V2Operands o = check_scaled_mm_v2(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b,
                                    swizzle_b, bias, contraction_dim);
  // the v2 default (CPU's and the meta kernel's): bfloat16
  at::Tensor out = at::empty({o.a.size(0), o.b.size(1)},
                             mat_a.options().dtype(out_dtype.value_or(at::kBFloat16)));
  return scaled_mm_into(o.a, o.b, o.sa, o.sb, bias, std::nullopt, out, o.ga, o.gb);
}

at::Tensor& tpu_scaled_mm_v2_out(const at::Tensor& mat_a, const at::Tensor& mat_b,
                                 at::TensorList scale_a, at::IntArrayRef recipe_a,
                                 at::IntArrayRef swizzle_a, at::TensorList scale_b,
                                 at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                                 const std::optional<at::Tensor>& bias,
                                 std::optional<at::ScalarType> out_dtype,
                                 at::IntArrayRef contraction_dim, bool use_fast_accum,
                                 at::Tensor& out) {
  TORCH_CHECK_VALUE(!out_dtype || *out_dtype == out.scalar_type(),
                    "out_dtype must match output matrix type");
  V2Operands o = check_scaled_mm_v2(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b,
                                    swizzle_b, bias, contraction_dim);
  TORCH_CHECK(out.device() == mat_a.device(), "_scaled_mm_v2: out must be on ", mat_a.device());
  return scaled_mm_into(o.a, o.b, o.sa, o.sb, bias, std::nullopt, out, o.ga, o.gb);
}

}  // namespace

void add_float8_ops(DirectOps& ops) {
  ops.add("_scaled_mm", tpu_scaled_mm);
  ops.add("_scaled_mm.out", tpu_scaled_mm_out);
  ops.add("_scaled_mm_v2", tpu_scaled_mm_v2);
  ops.add("_scaled_mm_v2.out", tpu_scaled_mm_v2_out);
}

}  // namespace torch_tpu
