// Inference fast path of nn.MultiheadAttention / nn.TransformerEncoderLayer
// on device tpu. PyTorch takes this path for PrivateUse1 devices as for cpu
// and cuda (eval or no_grad, batch_first, ...), calling fused ATen ops that
// have only CPU/CUDA kernels. Each kernel here follows the order of
// operations of CPU's kernel (aten/src/ATen/native/transformers/attention.cpp,
// transformer.cpp, SoftMax.cpp), written with ordinary ATen ops that run on
// tpu in every eager mode; the matmuls follow the tpu precision mode.
//
// The sparsity path of nn.TransformerEncoder (a src_key_padding_mask with
// left-aligned padding) packs the batch into a nested tensor, runs each layer
// on it and pads the result with zeros. Nested tensors on tpu hold their
// values in a tpu buffer (NestedTensorImpl, dispatch key
// NestedTensorPrivateUse1); the encoder layer runs them as a padded batch with
// a key padding mask, which gives the values of the packed sequences.
#include <ATen/ATen.h>
#include <ATen/NestedTensorImpl.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

namespace torch_tpu {
namespace {

using at::Tensor;

// softmax over `dim` with the positions where `mask` is true left out; a row
// with every position masked gives NaN, as CPU's _masked_softmax (0 / 0).
// mask_type 0: (L, L) attention mask of a (B, H, L, L) input; 1: (B, L)
// padding mask of a (B, H, L, L) input; 2 (or any other shape): a mask of
// the input's shape.
Tensor tpu_masked_softmax(const Tensor& input, const Tensor& mask_in, std::optional<int64_t> dim_in,
                          std::optional<int64_t> mask_type_in) {
  TORCH_CHECK(mask_in.scalar_type() == at::kBool, "Mask should be a boolean tensor");
  std::optional<int64_t> mask_type = mask_type_in;
  if (mask_in.dim() != 2 || input.dim() != 4) mask_type = 2;
  Tensor mask = mask_in;
  if (mask_type == 2) {
    TORCH_CHECK(input.sizes() == mask.sizes(),
                "For mask_type == 2 mask shape should match input shape")
  } else if (mask_type == 1) {
    TORCH_CHECK(input.sizes()[0] == mask.sizes()[0] && input.sizes()[2] == mask.sizes()[1],
                "For mask_type == 1 mask shape should be (B, L)");
    mask = mask.view({input.size(0), 1, 1, input.size(2)});
  } else if (mask_type == 0) {
    TORCH_CHECK(mask.dim() == 2 && input.sizes()[2] == mask.sizes()[0] &&
                    input.sizes()[2] == mask.sizes()[1],
                "For mask_type == 0 mask shape should be (L, L)");
    mask = mask.view({1, 1, input.size(2), input.size(2)});
  } else {
    TORCH_CHECK(false, "Unsupported mask_type: ", *mask_type);
  }
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), "_masked_softmax: expected a floating input, got ",
              input.scalar_type());
  int64_t dim = at::maybe_wrap_dim(dim_in.value_or(input.dim() - 1), input.dim());
  Tensor x = input.dim() == 0 ? input.view(1) : input;
  Tensor m = mask.dim() == 0 ? mask.view(1) : mask;
  // Masked positions become -inf: they give exp(-inf) = 0 and add nothing to
  // the sum; a row with every position masked gives NaN (-inf - -inf).
  Tensor y = at::_softmax(x.masked_fill(m, -std::numeric_limits<double>::infinity()), dim, false);
  return input.dim() == 0 ? y.view({}) : y.contiguous();
}

// q = (q + q_bias) / sqrt(dim_per_head), k = k + k_bias, v = v + v_bias;
// [B, T, 3 * D] -> 3 x [B, num_head, T, dim_per_head], views of one
// contiguous [3, B, num_head, T, dim_per_head] tensor as on CPU.
std::tuple<Tensor, Tensor, Tensor> tpu_transform_bias_rescale_qkv(const Tensor& qkv,
                                                                  const Tensor& qkv_bias,
                                                                  int64_t num_head) {
  TORCH_CHECK(!qkv.is_nested(), "_transform_bias_rescale_qkv: nested qkv is not supported on tpu");
  TORCH_CHECK(qkv.dim() == 3, "_transform_bias_rescale_qkv: expected a 3-D qkv, got ", qkv.dim(), "-D");
  auto B = qkv.size(0);
  auto T = qkv.size(1);
  auto D3 = qkv.size(2);
  auto D = D3 / 3;
  TORCH_CHECK(num_head > 0 && D % num_head == 0);
  TORCH_CHECK(D3 % 3 == 0);
  const auto dh = D / num_head;
  // CPU: 1.0 / sqrt(float(dim_per_head)) in double, rounded to the element type.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<float>(dh)));
  Tensor x = (qkv + qkv_bias).view({B, T, 3, num_head, dh}).permute({2, 0, 3, 1, 4});
  Tensor out = at::empty({3, B, num_head, T, dh}, qkv.options());
  out.copy_(x);
  out.select(0, 0).mul_(scale);
  auto parts = out.view({3 * B, num_head, T, dh}).split(B, 0);
  return std::make_tuple(parts[0], parts[1], parts[2]);
}

Tensor gemm_nt(const Tensor& a, const Tensor& b) { return at::matmul(a, b.t()); }

Tensor qkv_projection(const Tensor& query, const Tensor& key, const Tensor& value, int64_t embed_dim,
                      const Tensor& qkv_weight) {
  if (key.is_same(value)) {
    if (query.is_same(key)) return gemm_nt(query, qkv_weight);
    auto w = qkv_weight.split_with_sizes({embed_dim, embed_dim * 2}, 0);
    return at::cat({gemm_nt(query, w[0]), gemm_nt(key, w[1])}, 2);
  }
  auto w = qkv_weight.chunk(3, 0);
  return at::cat({gemm_nt(query, w[0]), gemm_nt(key, w[1]), gemm_nt(value, w[2])}, 2);
}

std::tuple<Tensor, Tensor> tpu_native_multi_head_attention(
    const Tensor& query, const Tensor& key, const Tensor& value, int64_t embed_dim, int64_t num_head,
    const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& proj_weight,
    const Tensor& proj_bias, const std::optional<Tensor>& mask, bool need_weights,
    bool average_attn_weights, std::optional<int64_t> mask_type) {
  const auto D = embed_dim;
  TORCH_CHECK(!query.is_nested() && !key.is_nested() && !value.is_nested(),
              "_native_multi_head_attention: nested inputs are not supported on tpu");
  TORCH_CHECK(query.dim() == 3, "expected 3-D `query`, got ", query.dim(), "-D tensor");
  TORCH_CHECK(query.sizes()[2] == embed_dim, "passed-in embed_dim ", embed_dim,
              " didn't match last dim of query ", query.sizes()[2]);
  TORCH_CHECK(key.dim() == 3, "expected 3-D `key`, got ", key.dim(), "-D tensor");
  TORCH_CHECK(value.dim() == 3, "expected 3-D `value`, got ", value.dim(), "-D tensor");
  TORCH_CHECK(query.sizes() == key.sizes() && key.sizes() == value.sizes(),
              "expected `query`/`key`/`value` shapes to match");
  TORCH_CHECK(qkv_weight.dim() == 2, "expected 2-D `qkv_weight`, got ", qkv_weight.dim(), "-D tensor");
  TORCH_CHECK(D * 3 == qkv_weight.sizes()[0], "expected `qkv_weight` first dim to be 3x embed_dim");
  TORCH_CHECK(D == qkv_weight.sizes()[1], "expected `qkv_weight` second dim to be embed_Dim");
  TORCH_CHECK(qkv_bias.dim() == 1, "expected 1-D `qkv_bias`, got ", qkv_bias.dim(), "-D tensor");
  TORCH_CHECK(qkv_bias.sizes()[0] == 3 * D,
              "expected `qkv_bias` first dim and first dim of query to be equal");
  TORCH_CHECK(num_head > 0 && D % num_head == 0, "`embed_dim` must divide evenly by `num_heads`");

  Tensor qkv = qkv_projection(query, key, value, embed_dim, qkv_weight);
  if (qkv.numel() == 0) return std::make_tuple(at::empty_like(query), Tensor());

  auto q_k_v = at::_transform_bias_rescale_qkv(qkv, qkv_bias, num_head);
  qkv = Tensor();
  const Tensor& q = std::get<0>(q_k_v);
  const Tensor& k = std::get<1>(q_k_v);
  const Tensor& v = std::get<2>(q_k_v);
  const auto B = q.size(0), H = q.size(1), T = q.size(2), dh = q.size(3);

  // [B, H, T, T]
  Tensor qkt = at::bmm(q.reshape({B * H, T, dh}), k.reshape({B * H, T, dh}).transpose(2, 1))
                   .view({B, H, T, T});
  if (mask.has_value()) {
    Tensor m = mask->scalar_type() == at::kBool ? *mask : mask->to(at::kBool);
    qkt = at::_masked_softmax(qkt, m, qkt.dim() - 1, mask_type);
  } else {
    qkt = at::_softmax(qkt, qkt.dim() - 1, false);
  }
  // [B, H, T, dh]
  Tensor ctx = at::bmm(qkt.view({B * H, T, T}), v.reshape({B * H, T, dh})).view({B, H, T, dh});
  // [B, T, D]
  Tensor ctx_0213 = ctx.permute({0, 2, 1, 3}).contiguous().view({B * T, H * dh});
  Tensor proj = at::linear(ctx_0213, proj_weight, proj_bias).view({B, T, proj_weight.size(0)});
  if (!need_weights) return std::make_tuple(proj, Tensor());
  if (average_attn_weights) {
    qkt = qkt.sum(1);
    qkt.div_(num_head);
  }
  return std::make_tuple(proj, qkt);
}

Tensor encoder_layer_dense(const Tensor& src, int64_t embed_dim, int64_t num_heads,
                           const Tensor& qkv_weight, const Tensor& qkv_bias,
                           const Tensor& proj_weight, const Tensor& proj_bias, bool use_gelu,
                           bool norm_first, double eps, const Tensor& ln_w1, const Tensor& ln_b1,
                           const Tensor& ln_w2, const Tensor& ln_b2, const Tensor& ffn_w1,
                           const Tensor& ffn_b1, const Tensor& ffn_w2, const Tensor& ffn_b2,
                           const std::optional<Tensor>& mask, std::optional<int64_t> mask_type) {
  if (src.numel() == 0) return src.clone();
  auto norm = [&](const Tensor& t, const Tensor& w, const Tensor& b) {
    return at::layer_norm(t, {embed_dim}, w, b, eps, true);
  };
  Tensor x = src;
  if (norm_first) x = norm(x, ln_w1, ln_b1);
  x = std::get<0>(at::_native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight,
                                                   qkv_bias, proj_weight, proj_bias, mask, false,
                                                   true, mask_type));
  x.add_(src);
  if (!norm_first) x = norm(x, ln_w1, ln_b1);
  Tensor pre_ffn = x;
  if (norm_first) x = norm(x, ln_w2, ln_b2);
  TORCH_CHECK(x.dim() == 3, "batched input size should be 3");
  TORCH_CHECK(ffn_w1.dim() == 2, "2d weights expected");
  TORCH_CHECK(ffn_w2.dim() == 2, "2d weights expected");
  const auto B = x.size(0), T = x.size(1);
  // CPU: addmm, then gelu (exact) or relu in place (_addmm_activation).
  Tensor h = at::addmm(ffn_b1, x.reshape({B * T, x.size(2)}), ffn_w1.t());
  if (use_gelu) {
    h = at::gelu(h);
  } else {
    h.relu_();
  }
  x = at::addmm(ffn_b2, h, ffn_w2.t()).view({B, T, -1});
  x.add_(pre_ffn);
  if (!norm_first) x = norm(x, ln_w2, ln_b2);
  return x;
}

Tensor tpu_transformer_encoder_layer_fwd(
    const Tensor& src, int64_t embed_dim, int64_t num_heads, const Tensor& qkv_weight,
    const Tensor& qkv_bias, const Tensor& proj_weight, const Tensor& proj_bias, bool use_gelu,
    bool norm_first, double eps, const Tensor& ln_w1, const Tensor& ln_b1, const Tensor& ln_w2,
    const Tensor& ln_b2, const Tensor& ffn_w1, const Tensor& ffn_b1, const Tensor& ffn_w2,
    const Tensor& ffn_b2, const std::optional<Tensor>& mask, std::optional<int64_t> mask_type) {
  return encoder_layer_dense(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                             proj_bias, use_gelu, norm_first, eps, ln_w1, ln_b1, ln_w2, ln_b2,
                             ffn_w1, ffn_b1, ffn_w2, ffn_b2, mask, mask_type);
}

// ---- nested tensors (sparsity path of nn.TransformerEncoder) ----

// True where position t of sequence n is inside it: t < length[n]. lengths is
// a CPU int64 tensor [N]; the result is a [N, L] bool tensor on `device`.
Tensor valid_positions(const Tensor& lengths, int64_t L, c10::Device device) {
  Tensor t = at::arange(L, lengths.options()).view({1, L});
  return t.lt(lengths.view({-1, 1})).to(device);
}

// A nested tensor of N sequences [len_n, D] from a dense [N, L, D] batch.
Tensor nested_from_dense(const Tensor& dense, const Tensor& nested_sizes) {
  const auto N = dense.size(0), L = dense.size(1), D = dense.size(2);
  Tensor keep = valid_positions(nested_sizes.select(1, 0).contiguous(), L, dense.device());
  Tensor rows = dense.reshape({N * L, D}).index_select(
      0, keep.view({N * L}).nonzero().view({-1}));
  return at::detail::make_tensor<at::native::NestedTensorImpl>(rows.reshape({-1}), nested_sizes);
}

// Is each row of `mask` ([N, L], true = a token) some trues followed by falses?
bool tpu_nested_tensor_from_mask_left_aligned(const Tensor& t, const Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "Expected mask to be of type Bool");
  TORCH_CHECK(mask.dim() == 2, "Padding mask should be 2D");
  TORCH_CHECK(t.dim() == 3, "Input should be a 3D tensor, N * L * D");
  const auto N = t.size(0), L = t.size(1);
  TORCH_CHECK(N == mask.size(0) && L == mask.size(1), "Mask size should match input size");
  Tensor lengths = mask.to(at::kLong).sum(1).to(at::kCPU);
  return mask.equal(valid_positions(lengths, L, mask.device()));
}

Tensor tpu_nested_tensor_from_mask(const Tensor& t, const Tensor& mask, bool mask_check) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "Expected mask to be of type Bool");
  TORCH_CHECK(mask.dim() == 2, "Padding mask should be 2D");
  TORCH_CHECK(t.dim() == 3, "Input should be a 3D tensor, N * L * D");
  const auto N = t.size(0), L = t.size(1), D = t.size(2);
  TORCH_CHECK(N == mask.size(0) && L == mask.size(1), "Mask size should match input size");
  // CPU: a sequence's length is its number of trues (padding assumed at the end).
  Tensor lengths = mask.to(at::kLong).sum(1).to(at::kCPU);
  if (mask_check)
    TORCH_CHECK(mask.equal(valid_positions(lengths, L, mask.device())),
                "Mask must be left-aligned without gaps");
  Tensor sizes = at::stack({lengths, at::full_like(lengths, D)}, 1).contiguous();
  return nested_from_dense(t.contiguous(), sizes);
}

// The nested tensor's sequences [len_n, D] padded to [N, max(len), D] (or
// `output_size`) with `padding`.
Tensor nested_to_padded(const Tensor& self, double padding, at::OptionalIntArrayRef output_size) {
  auto* impl = at::native::get_nested_tensor_impl(self);
  const Tensor& sizes = impl->get_nested_sizes();
  TORCH_CHECK(sizes.dim() == 2 && sizes.size(1) == 2,
              "to_padded_tensor: only nested tensors of 2-D sequences are supported on tpu");
  Tensor buffer = impl->get_buffer();
  TORCH_CHECK(buffer.numel() > 0,
              "to_padded_tensor: at least one constituent tensor should have non-zero numel");
  const auto N = sizes.size(0);
  Tensor lengths = sizes.select(1, 0).contiguous();
  int64_t L = N ? lengths.max().item<int64_t>() : 0;
  int64_t D = N ? sizes.select(1, 1).max().item<int64_t>() : 0;
  TORCH_CHECK(!N || sizes.select(1, 1).min().item<int64_t>() == D,
              "to_padded_tensor: sequences of different widths are not supported on tpu");
  std::vector<int64_t> shape{N, L, D};
  if (output_size.has_value()) {
    TORCH_CHECK(output_size->size() == 3, "to_padded_tensor: output_size must have 3 dims, got ",
                output_size->size());
    for (int i = 0; i < 3; i++)
      TORCH_CHECK((*output_size)[i] >= shape[i],
                  "Value in output_size is less than NestedTensor padded size. Truncation is not supported.");
    shape.assign(output_size->begin(), output_size->end());
  }
  Tensor out = at::full(shape, padding, buffer.options());
  if (N == 0 || L == 0 || D == 0) return out;
  Tensor keep = valid_positions(lengths, shape[1], buffer.device());
  Tensor idx = keep.view({-1}).nonzero().view({-1});
  Tensor flat = out.narrow(2, 0, D).reshape({N * shape[1], D});
  flat.index_copy_(0, idx, buffer.view({-1, D}));
  out.narrow(2, 0, D).copy_(flat.view({N, shape[1], D}));
  return out;
}

Tensor tpu_nested_to_padded_tensor(const Tensor& self, double padding,
                                   at::OptionalSymIntArrayRef output_size) {
  if (!output_size.has_value()) return nested_to_padded(self, padding, std::nullopt);
  return nested_to_padded(self, padding, C10_AS_INTARRAYREF_SLOW(*output_size));
}

Tensor tpu_nested_transformer_encoder_layer_fwd(
    const Tensor& src, int64_t embed_dim, int64_t num_heads, const Tensor& qkv_weight,
    const Tensor& qkv_bias, const Tensor& proj_weight, const Tensor& proj_bias, bool use_gelu,
    bool norm_first, double eps, const Tensor& ln_w1, const Tensor& ln_b1, const Tensor& ln_w2,
    const Tensor& ln_b2, const Tensor& ffn_w1, const Tensor& ffn_b1, const Tensor& ffn_w2,
    const Tensor& ffn_b2, const std::optional<Tensor>& mask, std::optional<int64_t> mask_type) {
  TORCH_CHECK(!mask.has_value(), "NestedTensor with mask is not supported yet");
  auto* impl = at::native::get_nested_tensor_impl(src);
  Tensor sizes = impl->get_nested_sizes();
  if (impl->get_buffer_size() == 0) return at::detail::make_tensor<at::native::NestedTensorImpl>(
      impl->get_buffer(), sizes);
  Tensor dense = nested_to_padded(src, 0.0, std::nullopt);
  const auto L = dense.size(1);
  // Each packed sequence attends to its own tokens only: a padding mask
  // (true = left out) over the padded tail.
  Tensor pad = valid_positions(sizes.select(1, 0).contiguous(), L, dense.device()).logical_not();
  Tensor out = encoder_layer_dense(dense, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                   proj_bias, use_gelu, norm_first, eps, ln_w1, ln_b1, ln_w2,
                                   ln_b2, ffn_w1, ffn_b1, ffn_w2, ffn_b2, pad, 1);
  return nested_from_dense(out, sizes);
}

// Weight normalization (nn.utils.weight_norm / parametrizations.weight_norm,
// wav2vec2's positional convolution): at::_weight_norm calls this fused op
// for dim 0 or the last dim, which has only CPU/CUDA kernels. w = v * (g /
// ||v||), the norm over every dim but `dim`, as CPU's kernel; the backward is
// ATen's differentiable formula, which runs on tpu ops.
std::tuple<Tensor, Tensor> tpu_weight_norm_interface(const Tensor& v, const Tensor& g,
                                                    int64_t dim) {
  TORCH_CHECK(v.device() == g.device(), "_weight_norm_interface: v on ", v.device(), ", g on ",
              g.device());
  Tensor norm = at::norm_except_dim(v, 2, dim);
  return {v * (g / norm), norm};
}
std::tuple<Tensor, Tensor> tpu_weight_norm_interface_backward(const Tensor& grad_w,
                                                             const Tensor& saved_v,
                                                             const Tensor& saved_g,
                                                             const Tensor& saved_norms,
                                                             int64_t dim) {
  return at::_weight_norm_differentiable_backward(grad_w.contiguous(), saved_v, saved_g,
                                                  saved_norms, dim);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_weight_norm_interface", tpu_weight_norm_interface);
  m.impl("_weight_norm_interface_backward", tpu_weight_norm_interface_backward);
  m.impl("_masked_softmax", tpu_masked_softmax);
  m.impl("_transform_bias_rescale_qkv", tpu_transform_bias_rescale_qkv);
  m.impl("_native_multi_head_attention", tpu_native_multi_head_attention);
  m.impl("_transformer_encoder_layer_fwd", tpu_transformer_encoder_layer_fwd);
  m.impl("_nested_tensor_from_mask", tpu_nested_tensor_from_mask);
  m.impl("_nested_tensor_from_mask_left_aligned", tpu_nested_tensor_from_mask_left_aligned);
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_transformer_encoder_layer_fwd", tpu_nested_transformer_encoder_layer_fwd);
  m.impl("to_padded_tensor", tpu_nested_to_padded_tensor);
}

}  // namespace torch_tpu
