// scaled_dot_product_attention on tpu: the fused (flash-style) host kernel.
//
// at::scaled_dot_product_attention asks the device's `_fused_sdp_choice_stub`
// which backend to run. For tpu the answer is SDPBackend::overrideable when
// the runtime's kernel takes the inputs (runtime/targets/host/kernels/
// attention.c: dense 3-d or 4-d tensors of one float dtype, GQA, masks, any
// strides) on the host target and the user left that backend enabled; otherwise the math path
// (`sdpa_kernel(SDPBackend.MATH)`, or TORCH_TPU_SDPA_MATH=1, choose it).
// SDPBackend::overrideable calls _scaled_dot_product_fused_attention_overrideable
// and autograd its _backward; both are registered here (through ops.cpp's
// direct registrations) and queue one runtime call each. The forward passes
// output and logsumexp, reserves B * H * Tq * Tk Philox counters when dropout
// is on, and returns the seed and offset as 0-d CPU tensors, from which the
// backward draws the same mask.
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>

#include <atomic>

#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "ops_internal.h"

namespace torch_tpu {
namespace {

using at::Tensor;

constexpr const char* kFwd = "_scaled_dot_product_fused_attention_overrideable";
constexpr const char* kBwd = "_scaled_dot_product_fused_attention_overrideable_backward";

bool env_forces_math() {
  const char* e = std::getenv("TORCH_TPU_SDPA_MATH");
  return e && e[0] && std::strcmp(e, "0") != 0;
}

bool is_dense_tpu(const Tensor& t) {
  return t.defined() && t.device().type() == kTpu && t.layout() == at::kStrided &&
         !t.is_nested();
}

// Set on a thread while the torch.compile backend traces a graph (set_sdpa_traced).
thread_local bool traced_fused = false;

// A tensor the fused kernel may be chosen for: a real one, or (while the compile backend
// traces, traced_fused) the fake and functional tensors of AOTAutograd, whose graph then
// holds the fused forward and backward ops. Other traces (tensor subclasses, dispatch modes)
// and symbolic sizes keep the math path's ops: dynamic.py pads those graphs and masks the
// padded keys through the softmax of the math path.
bool is_real(const Tensor& t) {
  if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
  return traced_fused || !at::isTensorSubclassLike(t);
}

// Whether the fused kernel takes these inputs (else the math path runs, and
// raises where the inputs are invalid).
bool fused_takes(const Tensor& q, const Tensor& k, const Tensor& v,
                 const std::optional<Tensor>& mask, bool enable_gqa) {
  if (!is_dense_tpu(q) || !is_dense_tpu(k) || !is_dense_tpu(v)) return false;
  if (!is_real(q) || !is_real(k) || !is_real(v)) return false;
  // the host target's kernel (the pjrt target lowers the math path's ops)
  if (tpu_target_get() != tpu_host_target() || !tpu_op_lookup(kFwd) || !tpu_op_lookup(kBwd))
    return false;
  const auto dt = q.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return false;
  if (k.scalar_type() != dt || v.scalar_type() != dt) return false;
  const int64_t nd = q.dim();
  if ((nd != 3 && nd != 4) || k.dim() != nd || v.dim() != nd) return false;
  const int64_t o = nd - 3;
  if (o && (k.size(0) != q.size(0) || v.size(0) != q.size(0))) return false;
  const int64_t H = q.size(o), Hk = k.size(o);
  if (v.size(o) != Hk || v.size(o + 1) != k.size(o + 1) || k.size(o + 2) != q.size(o + 2))
    return false;
  if (Hk == 0 || H % Hk != 0 || (H != Hk && !enable_gqa)) return false;
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return false;
  if (mask.has_value() && mask->defined()) {
    const Tensor& m = *mask;
    if (!is_dense_tpu(m) || !is_real(m) || m.dim() > 4) return false;
    if (m.scalar_type() != at::kBool && m.scalar_type() != dt) return false;
    const int64_t want[4] = {o ? q.size(0) : 1, H, q.size(o + 1), k.size(o + 1)};
    for (int64_t d = 0; d < m.dim(); d++) {
      const int64_t sz = m.size(d), w = want[4 - m.dim() + d];
      if (sz != w && sz != 1) return false;
    }
  }
  return true;
}

}  // namespace

// The fewest scores (queries x keys) for which the fused kernel is the default
// choice when the math path is enabled too: 512 x 512. The kernel reads its
// computed operands where the score products leave them (no packing inside the
// block loops) and skips the causal mask's zeros; bench/attention.py (6 heads of
// 64, two threads, medians against the math path): float32 causal 0.90x at
// T = 128 (batch 8), 1.07x at 256 (batch 8), 1.85x at 512, 1.96x at 2048;
// without the causal mask 0.8-0.95x at 128, 1.0-1.2x at 256; bfloat16 causal
// 0.8x at 128 and 256. In the width-768 GPT (12 heads, context 256) the
// compiled step with attention fused from 256 x 256 ran 0.83x Strict (hand-written
// attention) and 0.97x with 512 x 512, so the default stays at 512 x 512.
// TORCH_TPU_SDPA_FUSED_MIN_SCORES overrides it (0: fused whenever it takes the inputs).
std::atomic<int64_t>& fused_min_scores() {
  static std::atomic<int64_t> v{[] {
    const char* e = std::getenv("TORCH_TPU_SDPA_FUSED_MIN_SCORES");
    return e && e[0] ? std::strtoll(e, nullptr, 10) : int64_t{512 * 512};
  }()};
  return v;
}

int64_t sdpa_fused_min_scores() { return fused_min_scores().load(); }

int64_t set_sdpa_fused_min_scores(int64_t n) { return fused_min_scores().exchange(n); }

namespace {

int64_t tpu_fused_sdp_choice(const Tensor& q, const Tensor& k, const Tensor& v,
                             const std::optional<Tensor>& mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  // short sequences take the math path when the user left it enabled (no dropout: the
  // fused kernel's dropout mask is the one every mode draws)
  bool short_seq = false;
  if (dropout_p == 0.0 && q.dim() >= 2 && k.dim() >= 2) {
    const auto tq = q.sym_size(-2).maybe_as_int(), tk = k.sym_size(-2).maybe_as_int();
    short_seq = tq && tk && *tq * *tk < sdpa_fused_min_scores();
  }
  if (ctx.userEnabledOverrideableSDP() && !env_forces_math() &&
      !(short_seq && ctx.userEnabledMathSDP()) && fused_takes(q, k, v, mask, enable_gqa))
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  if (ctx.userEnabledMathSDP()) return static_cast<int64_t>(at::SDPBackend::math);
  return static_cast<int64_t>(at::SDPBackend::error);
}

// A tensor of `sizes` whose dims are laid out in the order of ref's strides
// (the meta kernel's alloc_with_matching_layout): the output follows the
// query's layout.
Tensor empty_like_layout(const Tensor& ref, c10::IntArrayRef sizes) {
  const int64_t nd = ref.dim();
  std::vector<int64_t> order(nd);
  for (int64_t d = 0; d < nd; d++) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ref.stride(a) > ref.stride(b);
  });
  std::vector<int64_t> strides(nd);
  int64_t s = 1;
  for (int64_t i = nd - 1; i >= 0; i--) {
    strides[order[i]] = s;
    s *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return at::detail::empty_strided_generic(sizes, strides, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           ref.scalar_type());
}

// A tensor of ref's sizes and dtype whose dims are laid out in memory in `order`
// (outermost first).
Tensor empty_in_order(const Tensor& ref, std::initializer_list<int64_t> order) {
  const int64_t nd = ref.dim();
  std::vector<int64_t> o(order), strides(nd);
  int64_t s = 1;
  for (int64_t i = nd - 1; i >= 0; i--) {
    strides[o[i]] = s;
    s *= std::max<int64_t>(ref.size(o[i]), 1);
  }
  return at::detail::empty_strided_generic(ref.sizes(), strides, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           ref.scalar_type());
}

// Call arguments in schema order.
struct CallArgs {
  std::vector<tpu_arg_t> args;
  std::vector<tpu_tensor_t> descs;  // reserved up front: args point into it
  explicit CallArgs(size_t n) { descs.reserve(n); }
  void tensor(const Tensor& t) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    if (t.defined()) {
      descs.emplace_back();
      to_desc(t, &descs.back());
      a.kind = TPU_ARG_TENSOR;
      a.v.t = &descs.back();
    }
    args.push_back(a);
  }
  void f64(std::optional<double> d) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    if (d) {
      a.kind = TPU_ARG_DOUBLE;
      a.v.d = *d;
    }
    args.push_back(a);
  }
  void i64(int64_t i) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    a.kind = TPU_ARG_INT;
    a.v.i = i;
    args.push_back(a);
  }
  void boolean(bool b) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    a.kind = TPU_ARG_BOOL;
    a.v.b = b;
    args.push_back(a);
  }
  void bools(const bool* b, int n) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    a.kind = TPU_ARG_BOOLLIST;
    a.n = n;
    a.v.blist = b;
    args.push_back(a);
  }
};

void submit(const char* name, CallArgs& ca, std::initializer_list<Tensor> outs, int dev,
            uint64_t seed, uint64_t offset) {
  const tpu_op_t* rt = tpu_op_lookup(name);
  TORCH_CHECK(rt, "tpu runtime has no ", name, " kernel");
  std::vector<tpu_tensor_t> od(outs.size());
  size_t i = 0;
  for (const Tensor& t : outs) to_desc(t, &od[i++]);
  tpu_call_t call;
  std::memset(&call, 0, sizeof call);
  call.op = rt;
  call.nargs = (int32_t)ca.args.size();
  call.args = ca.args.data();
  call.nouts = (int32_t)od.size();
  call.outs = od.data();
  call.device = dev;
  call.precision = tpu_get_matmul_precision();
  call.rng_seed = seed;
  call.rng_offset = offset;
  check(tpu_stream_submit(current_stream(dev), &call));
}

Tensor cpu_i64(uint64_t v) {
  return at::scalar_tensor(static_cast<int64_t>(v), at::TensorOptions().dtype(at::kLong));
}

void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                  const std::optional<Tensor>& bias) {
  TORCH_CHECK(is_dense_tpu(q) && is_dense_tpu(k) && is_dense_tpu(v), op,
              ": query, key and value must be dense tpu tensors");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), op,
              ": query, key and value must be on one device");
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4, op, ": query must be 3-d or 4-d, got ", q.dim(),
              "-d");
  if (bias.has_value() && bias->defined())
    TORCH_CHECK(is_dense_tpu(*bias) && bias->device() == q.device(), op,
                ": attn_bias must be a dense tensor on ", q.device());
}

std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>
sdpa_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
         double dropout_p, bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  check_inputs(kFwd, q, k, v, bias);
  TORCH_CHECK(!return_debug_mask, kFwd, ": return_debug_mask is not supported on tpu");
  const int64_t o = q.dim() - 3;
  const int64_t B = o ? q.size(0) : 1, H = q.size(o), Tq = q.size(o + 1), Tk = k.size(o + 1);
  std::vector<int64_t> osz(q.sizes().begin(), q.sizes().end());
  osz.back() = v.size(-1);
  Tensor out = empty_like_layout(q, osz);
  Tensor lse = at::detail::empty_generic({B, H, Tq}, allocator(),
                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                         at::kFloat, std::nullopt);
  const int dev = q.device().index();
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0) reserve_random(std::nullopt, dev, (uint64_t)(B * H * Tq * Tk), &seed, &offset);
  {
    PlaceholderUse use;
    CallArgs ca(4);
    ca.tensor(q);
    ca.tensor(k);
    ca.tensor(v);
    ca.tensor(bias.has_value() ? *bias : Tensor());
    ca.f64(dropout_p);
    ca.boolean(is_causal);
    ca.boolean(return_debug_mask);
    ca.f64(scale);
    submit(kFwd, ca, {out, lse}, dev, seed, offset);
  }
  return {out,          lse,          Tensor(),       Tensor(), c10::SymInt(Tq), c10::SymInt(Tk),
          cpu_i64(seed), cpu_i64(offset), Tensor()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sdpa_bwd(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
    const Tensor& bias, std::array<bool, 4> grad_input_mask, const Tensor& out,
    const Tensor& lse, const Tensor& cum_seq_q, const Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const Tensor& philox_seed,
    const Tensor& philox_offset, std::optional<double> scale) {
  check_inputs(kBwd, q, k, v, bias.defined() ? std::optional<Tensor>(bias) : std::nullopt);
  const bool want_gb = grad_input_mask[3] && bias.defined();
  TORCH_CHECK(!want_gb || bias.scalar_type() == q.scalar_type(), kBwd,
              ": the gradient of attn_bias needs an additive mask of the query's dtype ",
              q.scalar_type(), ", got ", bias.scalar_type());
  // Gradients laid out as CPU's default backend lays them out: its flash kernel ((B, T, H,
  // E) memory order) where CPU would choose it, else its math path (key's gradient
  // transposed, from the product that makes it, unless GQA's sum over the group makes it).
  Tensor gq, gk, gv;
  const bool gqa = q.size(-3) != k.size(-3);
  int64_t cpu_choice = static_cast<int64_t>(at::SDPBackend::math);
  try {  // reads metadata only; raises when the user's sdpa_kernel leaves CPU nothing
    cpu_choice = at::native::_fused_sdp_choice_cpp(
        q, k, v, bias.defined() ? std::optional<Tensor>(bias) : std::nullopt, dropout_p,
        is_causal, scale, gqa);
  } catch (const c10::Error&) {
  }
  if (q.dim() == 4 && cpu_choice == static_cast<int64_t>(at::SDPBackend::flash_attention)) {
    gq = empty_in_order(q, {0, 2, 1, 3});
    gk = empty_in_order(k, {0, 2, 1, 3});
    gv = empty_in_order(v, {0, 2, 1, 3});
  } else if (q.dim() == 4) {
    gq = empty_in_order(q, {0, 1, 2, 3});
    gk = gqa ? empty_in_order(k, {0, 1, 2, 3}) : empty_in_order(k, {0, 1, 3, 2});
    gv = empty_in_order(v, {0, 1, 2, 3});
  } else {
    gq = empty_in_order(q, {0, 1, 2});
    gk = gqa ? empty_in_order(k, {0, 1, 2}) : empty_in_order(k, {0, 2, 1});
    gv = empty_in_order(v, {0, 1, 2});
  }
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0) {
    TORCH_CHECK(philox_seed.defined() && philox_offset.defined(), kBwd,
                ": dropout needs the forward's philox_seed and philox_offset");
    seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
    offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  }
  // the additive mask's gradient: dS over (B, H, Tq, Tk) in float32, summed to the mask's
  // shape and rounded to its dtype once
  Tensor gb_full;
  if (want_gb) {
    const int64_t o = q.dim() - 3;
    gb_full = at::detail::empty_generic({o ? q.size(0) : 1, q.size(o), q.size(o + 1),
                                         k.size(o + 1)},
                                        allocator(),
                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                        at::kFloat, std::nullopt);
  }
  Tensor go = grad_out;
  if (!go.defined()) go = at::zeros_like(out);
  const int dev = q.device().index();
  {
    PlaceholderUse use;
    CallArgs ca(8);
    ca.tensor(go);
    ca.tensor(q);
    ca.tensor(k);
    ca.tensor(v);
    ca.tensor(bias);
    ca.bools(grad_input_mask.data(), 4);
    ca.tensor(out);
    ca.tensor(lse);
    ca.tensor(Tensor());
    ca.tensor(Tensor());
    ca.i64(max_q.guard_int(__FILE__, __LINE__));
    ca.i64(max_k.guard_int(__FILE__, __LINE__));
    ca.f64(dropout_p);
    ca.boolean(is_causal);
    ca.tensor(Tensor());  // philox_seed / philox_offset travel in the call's rng fields
    ca.tensor(Tensor());
    ca.f64(scale);
    if (want_gb) submit(kBwd, ca, {gq, gk, gv, gb_full}, dev, seed, offset);
    else submit(kBwd, ca, {gq, gk, gv}, dev, seed, offset);
  }
  Tensor gb;
  if (want_gb) gb = gb_full.sum_to_size(bias.sizes()).to(bias.scalar_type());
  return {gq, gk, gv, gb};
}

}  // namespace

bool set_sdpa_traced(bool on) {
  const bool prev = traced_fused;
  traced_fused = on;
  return prev;
}

void add_attention_ops(DirectOps& ops) {
  ops.add("_fused_sdp_choice", tpu_fused_sdp_choice);
  ops.add(kFwd, sdpa_fwd);
  ops.add(kBwd, sdpa_bwd);
}

}  // namespace torch_tpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::tpu_fused_sdp_choice)
}  // namespace at::native
