// Op bridge: one boxed fallback routes every ATen op on device tpu into the
// runtime's op table; a few ops that only manipulate metadata, move data
// across devices or have data-dependent output shapes are registered directly
// (their kernels are in ops_views.cpp, ops_copy.cpp and ops_dynamic.cpp; the
// registrations are here, at the end).
//
// The fallback asks PyTorch's meta kernel for the outputs' shapes, strides and
// dtypes (so they match CPU exactly), allocates fresh outputs (or resizes out=
// arguments), converts the IValue stack into a tpu_call_t and submits it to
// the current stream.
#include <ATen/EmptyTensor.h>
#include <ATen/NativeFunctions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <c10/core/impl/COW.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "ops_internal.h"

extern "C" {
}

namespace torch_tpu {
namespace {

constexpr int kMaxArgs = 64;

bool cpu_fallback_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("TORCH_TPU_CPU_FALLBACK");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

// Per-operator facts, computed once.
struct OpInfo {
  const tpu_op_t* rt = nullptr;
  std::string name;  // "add.Tensor"
  bool random = false;
  int generator_arg = -1;
  bool is_index = false;      // index.Tensor: bool masks become long indices
  bool is_index_put = false;  // index_put(_) / _index_put_impl_
  bool is_repeat_interleave = false;  // output size from the data unless given
  // For each return: the argument it aliases (mutation), or -1 when fresh.
  std::vector<int> return_alias;
  std::vector<bool> return_is_view;
  bool has_view_return = false;
  bool all_views = false;  // every return is a view: no kernel to run
  uint64_t mutated_args = 0;  // bit i: argument i is written in place (Tensor(a!))
  size_t nargs = 0;
  // Argument checks done here because the meta kernel lacks them (see
  // check_args): the `int dim` argument to wrap against the first tensor's
  // rank, the op family with extra checks, and which overlap checks CPU does.
  int dim_arg = -1;
  int family = 0;
  bool internal_overlap_check = true;  // written tensors may not self-overlap
  bool partial_overlap_check = true;   // inputs may not partly overlap outputs
  bool full_overlap_check = false;     // ... nor be the output (at::assert_no_overlap)
  uint64_t overlap_unchecked = 0;      // bit i: argument i is read without an overlap check
  // Dtype support as CPU decides it (see probe_on_cpu): 0 none, 1 after the
  // meta kernel, 2 before the other checks (CPU checks the dtype first).
  int cpu_probe = 0;
  // Narrow floats (float8 / float4) and unsigned 16/32/64-bit integers, see
  // check_narrow: whether the runtime's kernels take them.
  bool narrow_f8 = false, narrow_f4 = false, narrow_u = false;
  // complex64 / complex128 operands or results: whether the kernels take them
  bool narrow_c = false;
};

const OpInfo& op_info_slow(const c10::OperatorHandle& op);
void classify_checks(const std::string& base, const c10::FunctionSchema& schema, OpInfo& info);

const OpInfo& op_info(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, const OpInfo*> local;
  auto it = local.find(&op.schema());
  if (it != local.end()) return *it->second;
  const OpInfo& info = op_info_slow(op);
  local.emplace(&op.schema(), &info);
  return info;
}

const OpInfo& op_info_slow(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::unique_ptr<OpInfo>> cache;
  const void* key = &op.schema();
  std::lock_guard<std::mutex> g(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto info = std::make_unique<OpInfo>();
  const auto& schema = op.schema();
  std::string base = schema.name();
  if (base.rfind("aten::", 0) == 0) base = base.substr(6);
  info->name = schema.overload_name().empty() ? base : base + "." + schema.overload_name();
  info->rt = tpu_op_lookup(info->name.c_str());
  info->random = info->rt && (info->rt->flags & TPU_OP_RANDOM);
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); i++)
    if (args[i].type()->kind() == c10::TypeKind::OptionalType &&
        args[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() ==
            c10::TypeKind::GeneratorType)
      info->generator_arg = (int)i;
  {
    char fam[128];
    tpu_op_base_name(info->name.c_str(), fam, sizeof fam);
    info->narrow_f8 = tpu_dtype_narrow_op_takes(fam, TPU_F8E4M3FN);
    info->narrow_f4 = tpu_dtype_narrow_op_takes(fam, TPU_F4E2M1FNX2);
    info->narrow_u = tpu_dtype_narrow_op_takes(fam, TPU_U16);
    info->narrow_c = tpu_dtype_narrow_op_takes(fam, TPU_C64);
  }
  info->is_index = base == "index";
  info->is_repeat_interleave = base == "repeat_interleave";
  info->is_index_put = base == "index_put_" || base == "index_put" || base == "_index_put_impl_";
  for (const auto& ret : schema.returns()) {
    int alias = -1;
    bool view = false;
    if (ret.alias_info()) {
      for (size_t i = 0; i < args.size(); i++) {
        if (args[i].alias_info() && args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets()) {
          alias = (int)i;
          view = !ret.alias_info()->isWrite();
          break;
        }
      }
    }
    info->return_alias.push_back(alias);
    info->return_is_view.push_back(view);
    info->has_view_return = info->has_view_return || view;
  }
  for (size_t i = 0; i < args.size() && i < 64; i++)
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) info->mutated_args |= 1ull << i;
  // native_batch_norm updates running_mean / running_var without saying so
  if (base == "native_batch_norm") info->mutated_args |= (1ull << 3) | (1ull << 4);
  info->nargs = args.size();
  classify_checks(base, schema, *info);
  info->all_views = !info->return_is_view.empty();
  for (bool v : info->return_is_view) info->all_views = info->all_views && v;
  auto& ref = *info;
  cache.emplace(key, std::move(info));
  return ref;
}

// A meta tensor with the same geometry and dtype as t (storage offset kept).
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.is_meta()) return t;
  if (t.is_cpu() && t.dim() == 0) return t;  // CPU scalars stay as they are
  auto opts = t.options().device(c10::kMeta);
  if (t.storage_offset() == 0) return at::empty_strided(t.sizes(), t.strides(), opts);
  const int64_t n = (int64_t)(t.storage().nbytes() / t.element_size());
  return at::empty({n}, opts).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

c10::IValue ivalue_to_meta(const c10::IValue& v) {
  if (v.isTensor()) return to_meta(v.toTensor());
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(to_meta(t));
    return out;
  }
  if (v.isList()) {  // Tensor?[]
    auto list = v.toList();
    if (list.size() && (list.get(0).isTensor() || list.get(0).isNone())) {
      c10::List<std::optional<at::Tensor>> out;
      for (size_t i = 0; i < list.size(); i++) {
        auto e = list.get(i);
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(to_meta(e.toTensor()))
                                   : std::nullopt);
      }
      return out;
    }
  }
  return v;
}

// Checks that tensor arguments live on one tpu device (0-d CPU tensors are
// allowed as scalars) and returns that device.
c10::DeviceIndex check_devices(const OpInfo& info, const c10::IValue* args, size_t n,
                               bool* any_neg) {
  c10::DeviceIndex dev = -1;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.is_neg() || t.is_conj()) *any_neg = true;
    if (t.device().type() == kTpu) {
      if (dev < 0) dev = t.device().index();
      TORCH_CHECK(t.device().index() == dev,
                  "Expected all tensors to be on the same device, but found at least two devices, "
                  "tpu:", (int)dev, " and tpu:", (int)t.device().index(), "! (when checking aten::",
                  info.name, ")");
    } else if (!(t.is_cpu() && t.dim() == 0)) {
      TORCH_CHECK(false,
                  "Expected all tensors to be on the same device, but found at least two devices, "
                  "tpu and ", t.device(), "! (when checking aten::", info.name, ")");
    }
  };
  for (size_t i = 0; i < n; i++) {
    const auto& v = args[i];
    if (v.isTensor()) visit(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    else if (v.isList()) {
      auto list = v.toList();
      for (size_t k = 0; k < list.size(); k++)
        if (list.get(k).isTensor()) visit(list.get(k).toTensor());
    }
  }
  return dev < 0 ? current_device() : dev;
}

// Tensors with the negative bit (x._neg_view()) reach the fallback only
// through ops PyTorch's math-bit fallback lets pass (utilities, copies); the
// runtime reads memory as it is, so inputs are resolved (negated copies)
// first. A written tensor with the bit would need the result negated back;
// that is refused rather than computed wrongly.
void resolve_neg_args(const OpInfo& info, c10::IValue* args, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const bool written = i < 64 && (info.mutated_args >> i & 1);
    auto& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined() || !(t.is_neg() || t.is_conj())) continue;
      TORCH_CHECK_NOT_IMPLEMENTED(!written, "TorchTPU: aten::", info.name,
                                  " cannot write into a tensor with the negative or conjugate "
                                  "bit; call resolve_neg() / resolve_conj() first");
      v = t.resolve_conj().resolve_neg();
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> l;
      bool changed = false;
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.defined() && (t.is_neg() || t.is_conj())) {
          TORCH_CHECK_NOT_IMPLEMENTED(!written, "TorchTPU: aten::", info.name,
                                      " cannot write into a tensor with the negative or "
                                      "conjugate bit");
          l.push_back(t.resolve_conj().resolve_neg());
          changed = true;
        } else {
          l.push_back(t);
        }
      }
      if (changed) v = l;
    } else if (v.isList()) {
      auto list = v.toList();
      c10::List<std::optional<at::Tensor>> out;
      bool changed = false;
      for (size_t k = 0; k < list.size(); k++) {
        auto e = list.get(k);
        if (e.isTensor() && (e.toTensor().is_neg() || e.toTensor().is_conj())) {
          out.push_back(e.toTensor().resolve_conj().resolve_neg());
          changed = true;
        } else {
          out.push_back(e.isTensor() ? std::optional<at::Tensor>(e.toTensor()) : std::nullopt);
        }
      }
      if (changed && list.size() && (list.get(0).isTensor() || list.get(0).isNone())) v = out;
    }
  }
}

// ---------------------------------------------------------------------------
// Argument checks the meta kernels lack.
//
// The fallback runs PyTorch's meta kernel synchronously, so every check a
// structured (C++) meta kernel makes raises at the op. Some ops have only a
// Python meta function or decomposition that computes the output shape but
// checks less than CPU's kernel (index_put, the masked ops, index_select,
// index_fill, put_, sort's dim, ...), and no meta tensor shares storage with
// another, so PyTorch's memory-overlap checks never fire. Without the checks
// below those errors would come from the runtime kernel, which in Strict and
// DeferAndFuse runs later, and surface at the next synchronization from an
// unrelated op. All of them read metadata only.

enum CheckFamily {
  kFamNone = 0,
  kFamIndexSelect,
  kFamIndexFill,
  kFamPut,
  kFamMaskedFill,
  kFamMaskedScatter,
  kFamBucketize,
  kFamIndexPut,
  kFamCpuScalars,  // scalar parameters checked by CPU's kernel on a 0-element stand-in
  kFamGelu,
  kFamMultinomial,
  kFamLayerNorm,
  kFamScanOut,  // logcumsumexp / cummax / cummin with out=: CPU checks the outputs' dtypes
  kFamGridSampler,  // grid_sampler_2d/3d: the Python meta function checks less than CPU
  kFamConvolution,  // convolution: the C++ meta kernel skips CPU's stride/dilation/padding checks
};

bool in_list(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

void classify_checks(const std::string& base, const c10::FunctionSchema& schema, OpInfo& info) {
  // foreach ops follow the per-tensor op they apply (CPU's slow path runs it)
  std::string b = base.rfind("_foreach_", 0) == 0 ? base.substr(9) : base;
  if (!b.empty() && b.back() == '_') b.pop_back();
  const auto& args = schema.arguments();
  const bool backward = b.size() > 9 && b.compare(b.size() - 9, 9, "_backward") == 0;
  if (!backward && !in_list(b, {"unsqueeze"}) && !args.empty() &&
      args[0].type()->kind() == c10::TypeKind::TensorType) {
    for (size_t i = 1; i < args.size(); i++)
      if (args[i].name() == "dim" && args[i].type()->kind() == c10::TypeKind::IntType)
        info.dim_arg = (int)i;
  }
  if (b == "index_select") info.family = kFamIndexSelect;
  else if (b == "index_fill") info.family = kFamIndexFill;
  else if (b == "put") info.family = kFamPut;
  else if (b == "masked_fill") info.family = kFamMaskedFill;
  else if (b == "masked_scatter") info.family = kFamMaskedScatter;
  else if (b == "bucketize") info.family = kFamBucketize;
  else if (b == "index_put" || b == "_index_put_impl") info.family = kFamIndexPut;
  else if (b == "gelu" || b == "gelu_backward") info.family = kFamGelu;
  else if (b == "multinomial") info.family = kFamMultinomial;
  else if (b == "native_layer_norm") info.family = kFamLayerNorm;
  else if (in_list(b, {"logcumsumexp", "cummax", "cummin"})) info.family = kFamScanOut;
  else if (in_list(b, {"grid_sampler_2d", "grid_sampler_3d"})) info.family = kFamGridSampler;
  else if (in_list(b, {"convolution", "_convolution"})) info.family = kFamConvolution;
  else if (in_list(b, {"cauchy", "exponential", "geometric", "log_normal", "normal", "uniform",
                       "random", "bernoulli"})) {
    // only overloads whose one tensor is self (the rest scalars / generator)
    bool scalars = true;
    for (size_t i = 1; i < args.size(); i++)
      if (args[i].type()->kind() == c10::TypeKind::TensorType) scalars = false;
    if (scalars && !args.empty() && args[0].type()->kind() == c10::TypeKind::TensorType)
      info.family = kFamCpuScalars;
  }
  // Ops whose dtype support CPU's kernel decides while the meta kernel
  // accepts every dtype: element-wise ops (PyTorch's pointwise tag, also on
  // the in-place form of a tagged op), softmax, matmuls and std/var. Every
  // tensor argument must be plain (no lists): the probe replaces each one.
  bool plain = !backward;
  for (const auto& a : args) {
    c10::TypePtr t = a.type();
    if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
    if (t->kind() != c10::TypeKind::ListType) continue;
    c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
    if (e->kind() == c10::TypeKind::OptionalType) e = e->castRaw<c10::OptionalType>()->getElementType();
    if (e->kind() == c10::TypeKind::TensorType) plain = false;
  }
  bool pointwise = false;
  // mvlgamma checks the values (all > (p - 1) / 2): stand-ins of ones would fail it
  if (plain && !info.random && !base.empty() && b != "mvlgamma") {
    auto has_tag = [&](const std::string& name) {
      auto h = c10::Dispatcher::singleton().findOp(
          c10::OperatorName("aten::" + name, schema.overload_name()));
      return h && h->hasTag(at::Tag::pointwise);
    };
    pointwise = has_tag(base) || (base.back() == '_' && has_tag(b));
  }
  if (plain && in_list(b, {"std", "var", "std_mean", "var_mean"})) info.cpu_probe = 2;
  else if (plain && !info.random && (pointwise ||
                     in_list(b, {"_softmax", "_log_softmax", "softmax", "log_softmax", "mm", "addmm",
                                 "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr",
                                 // CPU refuses an unsigned 16/32/64-bit result (dtype=, out=)
                                 "cumsum", "cumprod", "prod"})))
    info.cpu_probe = 1;
  if (info.cpu_probe) {  // the probe needs a kernel CPU can run
    auto h = c10::Dispatcher::singleton().findOp(schema.operator_name());
    if (!h || !h->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) info.cpu_probe = 0;
  }
  // CPU's at::assert_no_overlap: the output may not even be an input
  // (the scatter family, the index_* writes and put_ check self against the index and
  // the source this way)
  info.full_overlap_check = in_list(b, {"gather", "take", "index_select", "cat", "kthvalue",
                                        "scatter", "scatter_add", "scatter_reduce", "index_add",
                                        "index_copy", "index_reduce", "index_fill", "put",
                                        "index_put", "_index_put_impl"});
  // The fill value CPU reads with item(): index_fill_'s and masked_fill_'s value tensor.
  if (b == "index_fill") info.overlap_unchecked = uint64_t(1) << 3;
  if (b == "masked_fill") info.overlap_unchecked = uint64_t(1) << 2;
  // What CPU allows: reductions and matmuls do not check overlap; fill/zero,
  // triangular and threshold in place accept expanded outputs; masked_fill_,
  // index_put_ and index_fill_ on expanded tensors only warn; softmax accepts
  // inputs that partly overlap the output, masked_scatter_ a mask or source that does.
  static const std::initializer_list<const char*> reductions = {
      "sum", "nansum", "mean", "nanmean", "prod", "amax", "amin", "max", "min", "aminmax",
      "argmax", "argmin", "any", "all", "norm", "linalg_vector_norm", "var", "std", "var_mean",
      "std_mean", "logsumexp", "count_nonzero", "median", "nanmedian", "mode",
      "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
      "_int_mm", "addr", "linalg_norm"};
  if (in_list(b, reductions) ||
      in_list(b, {"fill", "zero", "masked_fill", "index_put", "_index_put_impl", "index_fill",
                  "tril", "triu", "threshold", "eye"}))
    info.internal_overlap_check = false;
  if (in_list(b, reductions) ||
      in_list(b, {"softmax", "_softmax", "log_softmax", "_log_softmax", "masked_scatter"}))
    info.partial_overlap_check = false;
}

}  // namespace

// CPU's overlap checks (at::assert_no_internal_overlap and
// assert_no_partial_overlap, as TensorIterator makes them) on the real
// tensors: every written tensor against itself and against every input.
// foreach ops pair the i-th written tensor with the i-th tensor of each other
// list, as their per-tensor loop does.
// A copy-on-write storage (Tensor._lazy_clone) gets its own copy before an op
// writes it, as a CPU kernel's mutable data access does; the bridge reads
// pointers without that access, so writes reached every lazy clone.
void materialize_cow(const at::Tensor& t) {
  if (t.defined() && t.has_storage() && c10::impl::cow::is_cow_data_ptr(t.storage().data_ptr()))
    (void)t.mutable_data_ptr();
}

namespace {

void materialize_cow_args(const OpInfo& info, const c10::IValue* args, size_t n) {
  for (size_t i = 0; i < n && i < 64; i++) {
    if (!(info.mutated_args >> i & 1)) continue;
    if (args[i].isTensor()) {
      materialize_cow(args[i].toTensor());
    } else if (args[i].isTensorList()) {
      for (const at::Tensor& t : args[i].toTensorList()) materialize_cow(t);
    }
  }
}

void check_overlaps(const OpInfo& info, const c10::IValue* args, size_t n) {
  auto check_one = [&](const at::Tensor& w, const c10::IValue& in, int64_t k) {
    auto vs = [&](const at::Tensor& t) {
      if (!t.defined() || (t.is_cpu() && t.dim() == 0)) return;
      if (info.full_overlap_check) at::assert_no_overlap(w, t);
      else if (!t.is_same(w)) at::assert_no_partial_overlap(w, t);
    };
    if (in.isTensor()) {
      vs(in.toTensor());
    } else if (in.isTensorList()) {
      auto l = in.toTensorList();
      if (k >= 0) {
        if (k < (int64_t)l.size()) vs(l.get(k));
      } else {
        for (const at::Tensor& t : l) vs(t);
      }
    } else if (in.isList()) {
      auto l = in.toList();
      for (size_t j = 0; j < l.size(); j++)
        if (l.get(j).isTensor()) vs(l.get(j).toTensor());
    }
  };
  auto check_written = [&](const at::Tensor& w, int64_t k) {
    if (!w.defined() || w.numel() == 0) return;
    if (info.internal_overlap_check) at::assert_no_internal_overlap(w);
    if (!info.partial_overlap_check) return;
    for (size_t j = 0; j < n && j < 64; j++)
      if (!((info.mutated_args | info.overlap_unchecked) >> j & 1)) check_one(w, args[j], k);
  };
  // The in-place masked_fill_, index_fill_ and index_put_ skip TensorIterator's
  // checks but make their own: the mask may not partly overlap self, an index
  // or index_put_'s values may not overlap it at all (fuzz seeds 20671, 33399).
  if (n >= 3 && args[0].isTensor() && (info.mutated_args & 1) &&
      !(info.mutated_args >> (n - 1) & 1) && args[0].toTensor().numel() > 0) {
    const at::Tensor& self = args[0].toTensor();
    auto on_device = [](const c10::IValue& v) {
      return v.isTensor() && v.toTensor().defined() && !v.toTensor().is_cpu();
    };
    if (info.family == kFamMaskedFill && on_device(args[1])) {
      if (!args[1].toTensor().is_same(self)) at::assert_no_partial_overlap(self, args[1].toTensor());
    } else if (info.family == kFamIndexFill && n >= 4 && on_device(args[2])) {
      at::assert_no_overlap(self, args[2].toTensor());
    } else if (info.family == kFamIndexPut) {
      if (on_device(args[2])) at::assert_no_overlap(self, args[2].toTensor());
      if (args[1].isList())
        for (const c10::IValue& e : args[1].toList())
          if (on_device(e)) at::assert_no_overlap(self, e.toTensor());
    }
  }
  for (size_t i = 0; i < n && i < 64; i++) {
    if (!(info.mutated_args >> i & 1)) continue;
    if (args[i].isTensor()) {
      check_written(args[i].toTensor(), -1);
    } else if (args[i].isTensorList()) {
      auto l = args[i].toTensorList();
      for (size_t k = 0; k < l.size(); k++) check_written(l.get(k), (int64_t)k);
    }
  }
}

// Dtype support as CPU decides it. The meta kernels accept every dtype; CPU
// refuses an unsupported one only when its kernel runs (AT_DISPATCH raises
// NotImplementedError, or a check such as relu's on bool or mm's on mixed
// dtypes raises RuntimeError), and the runtime's kernel would refuse it only
// when it runs, after the op returned in Strict and DeferAndFuse. For the ops
// marked in OpInfo::cpu_probe, CPU's kernel is run once on stand-ins: each
// tensor argument replaced by ones of its dtype and rank with every
// non-empty dim of size 1 (empty dims stay empty, so CPU's no-op on empty
// tensors is kept). Whatever it raises is raised here, at the op. A passing
// combination (op, dtypes, ranks, empty dims, scalar kinds, flags, strings,
// ints and int lists such as dims) is remembered, so a signature is probed
// once per thread.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

void probe_on_cpu(const c10::OperatorHandle& op, const OpInfo& info, const c10::IValue* args,
                  size_t n) {
  thread_local std::unordered_set<std::string> passed;
  thread_local std::string key;  // reused: no allocation once it has grown
  key.clear();
  auto put = [&](const void* p, size_t len) { key.append(static_cast<const char*>(p), len); };
  const void* sp = &op.schema();
  put(&sp, sizeof sp);
  // An int IValue is a Scalar argument (keyed by its kind) or an int one: a
  // dim, a ScalarType such as cumsum's dtype (keyed by its value)
  const auto& formals = op.schema().arguments();
  auto is_number = [&](size_t i) {
    if (i >= formals.size()) return false;
    c10::TypePtr t = formals[i].type();
    if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
    return t->kind() == c10::TypeKind::NumberType;
  };
  for (size_t i = 0; i < n; i++) {
    const c10::IValue& v = args[i];
    if (v.isInt() && !is_number(i)) {  // dims: CPU checks a list's duplicates before a later dim's range
      const int64_t x = v.toInt();
      key.push_back('n');
      put(&x, sizeof x);
    } else if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        key.push_back('u');
        continue;
      }
      int64_t empty = 0;
      for (int64_t d = 0; d < t.dim() && d < 63; d++)
        if (t.size(d) == 0) empty |= int64_t(1) << d;
      const int8_t f[3] = {(int8_t)t.scalar_type(), (int8_t)t.dim(), (int8_t)(t.is_cpu() ? 1 : 0)};
      key.push_back('t');
      put(f, sizeof f);
      put(&empty, sizeof empty);
    } else if (v.isScalar()) {
      const c10::Scalar sc = v.toScalar();
      key.push_back(sc.isBoolean() ? 'b' : sc.isIntegral(false) ? 'i' : sc.isComplex() ? 'c' : 'f');
    } else if (v.isBool()) {
      key.push_back(v.toBool() ? 'T' : 'F');
    } else if (v.isString()) {
      key.push_back('s');
      key.append(v.toStringRef());
      key.push_back('\0');
    } else if (v.isIntList()) {
      const auto l = v.toIntList();
      const int64_t len = (int64_t)l.size();
      key.push_back('L');
      put(&len, sizeof len);
      for (int64_t x : l) put(&x, sizeof x);
    } else {
      key.push_back('.');
    }
  }
  if (passed.count(key)) return;
  torch::jit::Stack st;
  st.reserve(n);
  for (size_t i = 0; i < n; i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      if (t.is_cpu() && t.dim() == 0) {
        st.emplace_back(t.clone());
        continue;
      }
      c10::DimVector sizes;
      for (int64_t d = 0; d < t.dim(); d++) sizes.push_back(t.size(d) == 0 ? 0 : 1);
      // (float4_e2m1fn_x2 has no fill on CPU: zeros, its only constant)
      if (t.scalar_type() == at::kFloat4_e2m1fn_x2)
        st.emplace_back(at::zeros(sizes, at::TensorOptions().dtype(t.scalar_type())));
      else
        st.emplace_back(at::ones(sizes, at::TensorOptions().dtype(t.scalar_type())));
    } else {
      st.push_back((int)i == info.generator_arg ? c10::IValue() : v);
    }
  }
  {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &st);  // raises CPU's error
  }
  if (passed.size() >= 8192) passed.clear();
  passed.insert(key);
}

}  // namespace

// Broadcasts the inputs' shapes: value (true) or a RuntimeError as from
// at::infer_size when they do not broadcast.
c10::DimVector broadcast_shape(c10::IntArrayRef a, c10::IntArrayRef b) {
  return at::infer_size_dimvector(a, b);
}

// CPU's AdvancedIndex (index, index_put): an indexed dim of size 0 admits no
// index, so when the broadcast index shape has no 0 some index is out of
// bounds whatever the data: IndexError at the op. `list` holds long indices
// (masks converted); `bshape` is their broadcast shape.
void check_empty_indexed_dims(const at::Tensor& self, const c10::List<c10::IValue>& list,
                              c10::IntArrayRef bshape) {
  bool empty_dim = false;
  for (size_t i = 0; i < list.size() && (int64_t)i < self.dim(); i++) {
    const auto e = list.get(i);
    if (e.isTensor() && e.toTensor().defined() && self.size((int64_t)i) == 0) empty_dim = true;
  }
  if (!empty_dim) return;
  for (int64_t s : bshape)
    if (s == 0) return;
  TORCH_CHECK_INDEX(false, "index is out of bounds for dimension with size 0");
}

namespace {

// A mask that must broadcast to `self`: in place (write into self) it must
// expand to self's shape, out of place self and mask broadcast together.
void check_mask_broadcast(const at::Tensor& self, const at::Tensor& mask, bool in_place) {
  if (in_place) {
    (void)mask.expand(self.sizes());  // raises like expand_inplace
  } else {
    (void)broadcast_shape(self.sizes(), mask.sizes());
  }
}

// Family checks, in CPU's order and with CPU's messages and exception types.
void check_args(const c10::OperatorHandle& op, const OpInfo& info, const c10::IValue* args,
                size_t n) {
  if (info.dim_arg >= 0 && args[0].isTensor() && args[info.dim_arg].isInt())
    (void)at::maybe_wrap_dim(args[info.dim_arg].toInt(), args[0].toTensor().dim());
  if (info.family == kFamNone || n < 1 || !args[0].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  const bool in_place = (info.mutated_args & 1) && !(info.mutated_args >> (n - 1) & 1);
  switch (info.family) {
    case kFamIndexSelect: {
      if (n < 3 || !args[2].isTensor()) return;
      const at::Tensor& idx = args[2].toTensor();
      TORCH_CHECK_INDEX(idx.dim() <= 1, "index_select(): Index is supposed to be a vector");
      TORCH_CHECK(idx.scalar_type() == at::kLong || idx.scalar_type() == at::kInt,
                  "index_select(): Expected dtype int32 or int64 for index");
      // CPU's shape check for an empty self (the index values are the kernel's)
      if (self.dim() > 1 && idx.numel() > 0 && self.numel() == 0 && args[1].isInt())
        TORCH_CHECK(self.size(at::maybe_wrap_dim(args[1].toInt(), self.dim())) > 0,
                    "index_select(): self indexing axis dim should be positive");
      break;
    }
    case kFamIndexFill: {
      if (n < 4 || !args[2].isTensor()) return;
      const at::Tensor& idx = args[2].toTensor();
      TORCH_CHECK_INDEX(idx.scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.");
      if (in_place && at::has_internal_overlap(self) == at::MemOverlap::Yes)
        TORCH_WARN("Use of index_fill_ on expanded tensors is deprecated. Please clone() the tensor "
                   "before performing this operation. This also applies to advanced indexing e.g. "
                   "tensor[mask] = scalar");
      TORCH_CHECK(!(args[3].isScalar() && args[3].toScalar().isComplex() && !self.is_complex()),
                  "index_fill_(): Converting complex Scalar to non-complex type is not supported");
      TORCH_CHECK(idx.dim() <= 1, "Index has to be a vector/scalar");
      if (args[3].isTensor())
        TORCH_CHECK(args[3].toTensor().dim() == 0,
                    "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
                    args[3].toTensor().dim(), " dimension(s).");
      if (self.numel() == 0 && idx.numel() > 0 && args[1].isInt()) {
        // CPU views self with index.numel() elements of stride 0 along dim
        // before its (then empty) loop; that view can fall outside the
        // storage of an empty self, and as_strided raises as on CPU.
        // (the functional index_fill fills a clone: a fresh storage of 0 bytes)
        const at::Tensor s0 = in_place ? self : at::empty(self.sizes(), self.options().device(at::kCPU));
        const at::Tensor s = s0.dim() == 0 ? s0.unsqueeze(-1) : s0;
        const int64_t d = at::maybe_wrap_dim(args[1].toInt(), s.dim());
        auto sizes = s.sizes().vec();
        auto strides = s.strides().vec();
        sizes[d] = idx.numel();
        strides[d] = 0;
        (void)s.as_strided(sizes, strides);
      }
      break;
    }
    case kFamPut: {
      // CPU's put_ first: without accumulate, duplicate indices make it nondeterministic
      if (!(n > 3 && args[3].isBool() && args[3].toBool()))
        at::globalContext().alertNotDeterministic("put_");
      if (n < 3 || !args[1].isTensor() || !args[2].isTensor()) return;
      const at::Tensor& idx = args[1].toTensor();
      const at::Tensor& src = args[2].toTensor();
      TORCH_CHECK(idx.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, but got ",
                  idx.scalar_type());
      TORCH_CHECK(self.scalar_type() == src.scalar_type(),
                  "put_(): self and source expected to have the same dtype, but got self.dtype = ",
                  self.scalar_type(), " and source.dtype = ", src.scalar_type());
      TORCH_CHECK_INDEX(src.numel() == idx.numel(),
                        "put_(): Expected source and index to have the same number of elements, "
                        "but got source.numel() = ", src.numel(), ", index.numel() = ", idx.numel());
      break;
    }
    case kFamMaskedFill: {
      if (n < 3 || !args[1].isTensor()) return;
      const at::Tensor& mask = args[1].toTensor();
      TORCH_CHECK(mask.scalar_type() == at::kBool,
                  "masked_fill_ only supports boolean masks, but got mask with dtype ", mask.dtype());
      if (args[2].isTensor())
        TORCH_CHECK(args[2].toTensor().dim() == 0,
                    "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
                    args[2].toTensor().dim(), " dimension(s).");
      check_mask_broadcast(self, mask, in_place);
      break;
    }
    case kFamMaskedScatter: {
      if (n < 3 || !args[1].isTensor() || !args[2].isTensor()) return;
      const at::Tensor& mask = args[1].toTensor();
      const at::Tensor& src = args[2].toTensor();
      TORCH_CHECK(self.scalar_type() == src.scalar_type(),
                  "masked_scatter: expected self and source to have same dtypes but got",
                  self.scalar_type(), " and ", src.scalar_type());
      TORCH_CHECK(mask.scalar_type() == at::kBool,
                  "masked_scatter_ only supports boolean masks, but got mask with dtype ",
                  mask.scalar_type());
      check_mask_broadcast(self, mask, in_place);
      const auto shape = in_place ? c10::DimVector(self.sizes()) : broadcast_shape(self.sizes(), mask.sizes());
      int64_t cells = 1;
      for (int64_t s : shape) cells *= s;
      // Only a source smaller than the mask can run out; then the count of
      // ones decides, which needs the mask's values (synchronizes).
      if (src.numel() < cells && mask.device().type() == kTpu) {
        const int64_t ones = count_nonzero_host(mask.expand(shape));
        TORCH_CHECK(src.numel() >= ones, "Number of elements of source < number of ones in mask");
      }
      break;
    }
    case kFamCpuScalars: {
      // CPU's kernel checks the parameters before looking at the data: run
      // it on an empty CPU tensor of self's dtype (no generator needed).
      torch::jit::Stack st;
      st.reserve(n);
      st.emplace_back(at::empty({0}, self.options().device(at::kCPU)));
      for (size_t i = 1; i < n; i++)
        st.push_back((int)i == info.generator_arg ? c10::IValue() : args[i]);
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &st);
      break;
    }
    case kFamGelu: {
      for (size_t i = 1; i < n; i++)
        if (args[i].isString()) {
          const std::string& a = args[i].toStringRef();
          TORCH_CHECK(a == "none" || a == "tanh", "approximate argument must be either none or tanh.");
        }
      break;
    }
    case kFamMultinomial: {
      if (n < 3 || !args[1].isInt()) return;
      const int64_t samples = args[1].toInt();
      const bool replacement = args[2].isBool() && args[2].toBool();
      TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
      TORCH_CHECK(at::isFloatingType(self.scalar_type()),
                  "multinomial only supports floating-point dtypes for input, got: ",
                  self.scalar_type());
      if (n > 4 && args[n - 1].isTensor())
        TORCH_CHECK(args[n - 1].toTensor().scalar_type() == at::kLong,
                    "multinomial expects Long tensor out, got: ", args[n - 1].toTensor().scalar_type());
      TORCH_CHECK(samples > 0, "cannot sample n_sample <= 0 samples");
      const int64_t categories = self.size(-1);
      TORCH_CHECK(replacement || samples <= categories,
                  "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
      TORCH_CHECK(categories <= (int64_t(1) << 24), "number of categories cannot exceed 2^24");
      break;
    }
    case kFamConvolution: {
      // (input, weight, bias, stride, padding, dilation, ...): ATen's checks
      // (check_input_shape_forward), raised here so that a deferred call
      // raises at the op too; the kernel checks again
      if (n < 6) return;
      auto each = [&](int i, auto ok, const char* msg) {
        if (!args[i].isIntList()) return;
        for (int64_t v : args[i].toDimVector()) TORCH_CHECK(ok(v), msg);
      };
      each(3, [](int64_t v) { return v > 0; }, "non-positive stride is not supported");
      each(4, [](int64_t v) { return v >= 0; }, "negative padding is not supported");
      each(5, [](int64_t v) { return v > 0; }, "dilation should be greater than zero");
      break;
    }
    case kFamLayerNorm: {
      // (input, normalized_shape, weight, bias, eps). The meta function
      // refuses a non-floating input from mean() (RuntimeError); CPU checks
      // the shapes, then its kernel refuses the dtype (NotImplementedError).
      // CPU's op on stand-ins: the input's normalized dims kept, the others
      // of size 1 (0 where empty); weight and bias as they are (small).
      if (at::isFloatingType(self.scalar_type()) || n < 5 || !args[1].isIntList()) return;
      const auto normalized = args[1].toDimVector();
      c10::DimVector sizes;
      const int64_t lead = self.dim() - (int64_t)normalized.size();
      for (int64_t d = 0; d < self.dim(); d++)
        sizes.push_back(d >= lead ? self.size(d) : std::min<int64_t>(self.size(d), 1));
      auto stand_in = [](const c10::IValue& v) -> std::optional<at::Tensor> {
        if (!v.isTensor() || !v.toTensor().defined()) return std::nullopt;
        return at::zeros(v.toTensor().sizes(), at::TensorOptions().dtype(v.toTensor().scalar_type()));
      };
      (void)at::native_layer_norm(at::zeros(sizes, at::TensorOptions().dtype(self.scalar_type())),
                                  normalized, stand_in(args[2]), stand_in(args[3]),
                                  args[4].toDouble());
      break;
    }
    case kFamScanOut: {
      // check_scalar_type_device_layout_equal: values like self, cummax/cummin's indices long
      if (in_place) return;
      for (size_t i = 1; i < n && i < 64; i++) {
        if (!(info.mutated_args >> i & 1) || !args[i].isTensor()) continue;
        const at::Tensor& o = args[i].toTensor();
        const bool indices = i == n - 1 && info.name.rfind("logcumsumexp") == std::string::npos;
        const at::ScalarType want = indices ? at::kLong : self.scalar_type();
        TORCH_CHECK(o.scalar_type() == want, "expected scalar_type ", want, " but found ",
                    o.scalar_type());
      }
      break;
    }
    case kFamGridSampler: {
      // CPU's check_grid_sampler_common, then check_grid_sampler_2d/3d
      if (n < 2 || !args[1].isTensor()) return;
      const at::Tensor& grid = args[1].toTensor();
      TORCH_CHECK(self.scalar_type() == grid.scalar_type(),
                  "grid_sampler(): expected input and grid to have same dtype, but input has ",
                  self.dtype(), " and grid has ", grid.dtype());
      TORCH_CHECK(self.dim() > 0 && grid.dim() > 0 && self.size(0) == grid.size(0),
                  "grid_sampler(): expected grid and input to have same batch size, but got "
                  "input with sizes ", self.sizes(), " and grid with sizes ", grid.sizes());
      TORCH_CHECK(grid.size(-1) == self.dim() - 2, "grid_sampler(): expected grid to have size ",
                  self.dim() - 2, " in last dimension, but got grid with sizes ", grid.sizes());
      for (int64_t i = 2; i < self.dim(); i++)
        TORCH_CHECK(self.size(i) > 0, "grid_sampler(): expected input to have non-empty spatial "
                    "dimensions, but input has sizes ", self.sizes(), " with dimension ", i,
                    " being empty");
      const int64_t want = info.name.rfind("grid_sampler_2d", 0) == 0 ? 4 : 5;
      TORCH_CHECK(self.dim() == want && self.dim() == grid.dim(), "grid_sampler(): expected ", want,
                  "D input and grid with same number of dimensions, but got input with sizes ",
                  self.sizes(), " and grid with sizes ", grid.sizes());
      break;
    }
    case kFamBucketize: {
      if (!args[1].isTensor()) return;
      const at::Tensor& bounds = args[1].toTensor();
      TORCH_CHECK(bounds.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(",
                  bounds.dim(), ")");
      break;
    }
    case kFamIndexPut: {
      // after prepare_indices: long indices, no masks
      if (n < 3 || !args[1].isList() || !args[2].isTensor()) return;
      if (in_place && at::has_internal_overlap(self) == at::MemOverlap::Yes)
        TORCH_WARN("Use of index_put_ on expanded tensors is deprecated. Please clone() the tensor "
                   "before performing this operation. This also applies to advanced indexing e.g. "
                   "tensor[indices] = tensor");
      const at::Tensor& value = args[2].toTensor();
      // CPU checks the value's shape first (make_index_put_iterator), then its dtype
      auto check_dtype = [&] {
        TORCH_CHECK(value.scalar_type() == self.scalar_type() || (value.is_cpu() && value.dim() == 0),
                    "Index put requires the source and destination dtypes match, got ",
                    self.scalar_type(), " for the destination and ", value.scalar_type(),
                    " for the source.");
      };
      auto list = args[1].toList();
      c10::DimVector bshape;
      bool any = false, adjacent = true, ended = false;
      std::vector<at::Tensor> defined;
      for (size_t i = 0; i < list.size(); i++) {
        auto e = list.get(i);
        if (e.isTensor() && e.toTensor().defined()) {
          if (ended) adjacent = false;
          defined.push_back(e.toTensor());
          any = true;
        } else if (any) {
          ended = true;
        }
      }
      if (defined.empty()) {
        // CPU's index iterator needs an index tensor: it refuses the call (a shape
        // mismatch, else an internal assert), a RuntimeError either way
        TORCH_CHECK(at::is_expandable_to(value.sizes(), self.sizes()), "shape mismatch: value tensor of shape ",
                    value.sizes(), " cannot be broadcast to indexing result of shape ", self.sizes());
        TORCH_CHECK(false, "index_put_: expected at least one index tensor, got none");
      }
      try {
        bshape = c10::DimVector(defined[0].sizes());
        for (size_t i = 1; i < defined.size(); i++) bshape = broadcast_shape(bshape, defined[i].sizes());
      } catch (const std::exception&) {
        std::ostringstream os;
        for (size_t i = 0; i < defined.size(); i++) os << (i ? ", " : "") << defined[i].sizes();
        TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together "
                          "with shapes ", os.str());
      }
      check_empty_indexed_dims(self, list, bshape);
      // the indexed result: the broadcast index shape replaces the indexed
      // dims in place when they are adjacent, else it comes first
      c10::DimVector result;
      size_t first = 0;
      while (first < list.size() && !(list.get(first).isTensor() && list.get(first).toTensor().defined()))
        first++;
      const size_t nidx = list.size();
      if (adjacent) {
        for (size_t d = 0; d < first; d++) result.push_back(self.size((int64_t)d));
        result.append(bshape.begin(), bshape.end());
        size_t last = first + defined.size();
        for (int64_t d = (int64_t)last; d < self.dim(); d++) result.push_back(self.size(d));
      } else {
        result = bshape;
        for (int64_t d = 0; d < self.dim(); d++) {
          const bool indexed = (size_t)d < nidx && list.get(d).isTensor() && list.get(d).toTensor().defined();
          if (!indexed) result.push_back(self.size(d));
        }
      }
      TORCH_CHECK(at::is_expandable_to(value.sizes(), result), "shape mismatch: value tensor of shape ",
                  value.sizes(), " cannot be broadcast to indexing result of shape ", c10::IntArrayRef(result));
      check_dtype();
      break;
    }
    default:
      break;
  }
}

// masked_fill_ into a tensor with broadcast dims (stride 0, size > 1), as
// from expand(): several elements of self are one memory location. CPU's
// kernel writes only where the mask is set, so a location takes the value
// when any of its elements is masked. The runtime's element-wise kernel
// writes every element (mask ? value : self), so an unmasked alias would
// write the old value back over a masked one. Here the broadcast dims are
// folded first: self narrowed to one element along them, the mask reduced
// over them with any(); the fill then runs on a self without repeats.
// Returns false (nothing done) when self has no broadcast dim.
bool masked_fill_expanded(const OpInfo& info, c10::IValue* args, size_t n,
                          torch::jit::Stack* stack) {
  if (info.family != kFamMaskedFill || n != 3 || !(info.mutated_args & 1) ||
      !args[0].isTensor() || !args[1].isTensor())
    return false;
  const at::Tensor self = args[0].toTensor();
  if (self.numel() == 0) return false;
  at::Tensor target = self;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < self.dim(); d++)
    if (self.stride(d) == 0 && self.size(d) > 1) {
      dims.push_back(d);
      target = target.narrow(d, 0, 1);
    }
  if (dims.empty()) return false;
  TORCH_WARN("Use of masked_fill_ on expanded tensors is deprecated. Please clone() the tensor "
             "before performing this operation. This also applies to advanced indexing e.g. "
             "tensor[mask] = scalar");
  at::Tensor mask = args[1].toTensor();
  if (mask.device() != self.device()) mask = mask.to(self.device());
  mask = at::any(mask.expand(self.sizes()), c10::IntArrayRef(dims), /*keepdim=*/true);
  if (args[2].isTensor()) target.masked_fill_(mask, args[2].toTensor());
  else target.masked_fill_(mask, args[2].toScalar());
  torch::jit::drop(*stack, n);
  stack->push_back(self);
  return true;
}

// Storage for one call's converted arguments. Tensors live in a fixed array
// (no allocation on the hot path); lists, which are rare, in node containers
// whose elements never move.
struct CallBuilder {
  static constexpr int kInline = 16;
  tpu_tensor_t inline_tensors[kInline];
  int ntensors = 0;
  std::list<tpu_tensor_t> more_tensors;
  std::list<std::vector<int64_t>> ilists;
  std::list<std::vector<double>> dlists;
  std::list<std::unique_ptr<bool[]>> blists;
  std::list<std::string> strings;
  std::list<std::vector<tpu_tensor_t>> tlists;
  tpu_arg_t args[kMaxArgs];
  int nargs = 0;
  tpu_tensor_t outs[kInline];
  int nouts = 0;

  tpu_tensor_t* next_tensor() {
    if (ntensors < kInline) return &inline_tensors[ntensors++];
    more_tensors.emplace_back();
    return &more_tensors.back();
  }

  tpu_tensor_t* new_out() {
    TORCH_CHECK(nouts < kInline, "tpu bridge: too many outputs");
    return &outs[nouts++];
  }

  tpu_tensor_t* tensor(const at::Tensor& t) {
    tpu_tensor_t* d = next_tensor();
    to_desc(t, d);
    return d;
  }

  tpu_tensor_t none_desc() {
    tpu_tensor_t d;
    std::memset(&d, 0, sizeof d);
    d.dtype = TPU_DTYPE_NONE;
    return d;
  }

  void add(const c10::IValue& v) {
    tpu_arg_t a;
    std::memset(&a, 0, sizeof a);
    if (v.isNone()) {
      a.kind = TPU_ARG_NONE;
    } else if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        a.kind = TPU_ARG_NONE;
      } else {
        a.kind = TPU_ARG_TENSOR;
        a.v.t = tensor(t);
      }
    } else if (v.isBool()) {
      a.kind = TPU_ARG_BOOL;
      a.v.b = v.toBool();
    } else if (v.isInt() || v.isSymInt()) {
      a.kind = TPU_ARG_INT;
      a.v.i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
    } else if (v.isDouble() || v.isSymFloat()) {
      a.kind = TPU_ARG_DOUBLE;
      a.v.d = v.isDouble() ? v.toDouble() : v.toSymFloat().guard_float(__FILE__, __LINE__);
    } else if (v.isScalar()) {
      auto s = v.toScalar();
      if (s.isBoolean()) {
        a.kind = TPU_ARG_BOOL;
        a.v.b = s.toBool();
      } else if (s.isIntegral(false)) {
        a.kind = TPU_ARG_INT;
        a.v.i = s.toLong();
      } else if (s.isComplex()) {
        const c10::complex<double> z = s.toComplexDouble();
        a.kind = TPU_ARG_COMPLEX;
        a.v.c[0] = z.real();
        a.v.c[1] = z.imag();
      } else {
        a.kind = TPU_ARG_DOUBLE;
        a.v.d = s.toDouble();
      }
    } else if (v.isString()) {
      strings.emplace_back(v.toStringRef());
      a.kind = TPU_ARG_STRING;
      a.v.s = strings.back().c_str();
    } else if (v.isIntList() || v.isSymIntList()) {
      ilists.emplace_back();
      if (v.isIntList()) {
        for (int64_t x : v.toIntList()) ilists.back().push_back(x);
      } else {
        for (const c10::SymInt& x : v.toSymIntList())
          ilists.back().push_back(x.guard_int(__FILE__, __LINE__));
      }
      a.kind = TPU_ARG_INTLIST;
      a.v.ilist = ilists.back().data();
      a.n = (int32_t)ilists.back().size();
    } else if (v.isDoubleList()) {
      dlists.emplace_back();
      for (double x : v.toDoubleList()) dlists.back().push_back(x);
      a.kind = TPU_ARG_DOUBLELIST;
      a.v.dlist = dlists.back().data();
      a.n = (int32_t)dlists.back().size();
    } else if (v.isBoolList()) {
      auto bl = v.toBoolList();
      blists.emplace_back(new bool[bl.size() + 1]);
      for (size_t i = 0; i < bl.size(); i++) blists.back()[i] = bl.get(i);
      a.kind = TPU_ARG_BOOLLIST;
      a.v.blist = blists.back().get();
      a.n = (int32_t)bl.size();
    } else if (v.isTensorList() || v.isList()) {
      tlists.emplace_back();
      auto& vec = tlists.back();
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) {
          vec.emplace_back();
          to_desc(t, &vec.back());
        }
      } else {
        auto list = v.toList();
        for (size_t i = 0; i < list.size(); i++) {
          auto e = list.get(i);
          if (e.isTensor() && e.toTensor().defined()) {
            vec.emplace_back();
            to_desc(e.toTensor(), &vec.back());
          } else {
            vec.push_back(none_desc());
          }
        }
      }
      a.kind = TPU_ARG_TENSORLIST;
      a.v.tlist = vec.data();
      a.n = (int32_t)vec.size();
    } else if (v.isGenerator() || v.isDevice() || v.isStream()) {
      a.kind = TPU_ARG_NONE;
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu bridge cannot pass an argument of type ",
                                  v.tagKind());
    }
    args[nargs++] = a;
  }
};

void warn_cpu_fallback(const std::string& name) {
  static std::mutex mu;
  static std::unordered_set<std::string> warned;
  std::lock_guard<std::mutex> g(mu);
  if (warned.insert(name).second)
    TORCH_WARN("TorchTPU: aten::", name,
               " is not implemented natively and runs on the CPU (TORCH_TPU_CPU_FALLBACK=1); "
               "it is slow and counted as not covered.");
}

// ---------------------------------------------------------------------------
// Output metadata. Meta kernels are deterministic functions of the inputs'
// dtypes, sizes, strides and non-tensor argument values, so their results are
// cached per thread under a key made of exactly those; a training loop calls
// the meta kernel once per distinct call site and shape.

struct OutMeta {
  bool defined = false;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 6> sizes, strides;
  int64_t storage_offset = 0;
};

struct MetaKey {
  const void* op = nullptr;
  c10::SmallVector<int64_t, 48> words;
  size_t hash = 0;
  bool operator==(const MetaKey& o) const { return op == o.op && words == o.words; }
};

struct MetaKeyHash {
  size_t operator()(const MetaKey& k) const { return k.hash; }
};

void key_tensor(MetaKey& k, const at::Tensor& t, bool with_offset) {
  if (!t.defined()) {
    k.words.push_back(-1);
    return;
  }
  const auto* impl = t.unsafeGetTensorImpl();
  k.words.push_back((int64_t)t.scalar_type() | ((int64_t)t.dim() << 8) |
                    ((int64_t)t.is_cpu() << 16) | ((int64_t)impl->is_wrapped_number() << 17));
  for (int64_t v : t.sizes()) k.words.push_back(v);
  for (int64_t v : t.strides()) k.words.push_back(v);
  if (with_offset) k.words.push_back(t.storage_offset());
}

// Builds the key; false when an argument kind is not cacheable.
bool make_meta_key(const OpInfo& info, const void* op, const c10::IValue* args, size_t n,
                   MetaKey& k) {
  k.op = op;
  /* the default dtype decides the result type of integer tensors with float
   * scalars (u8 + 5.5) and of factories: part of the key */
  k.words.push_back((int64_t)c10::typeMetaToScalarType(c10::get_default_dtype()));
  for (size_t i = 0; i < n; i++) {
    const auto& v = args[i];
    if (v.isTensor()) {
      key_tensor(k, v.toTensor(), info.has_view_return);
    } else if (v.isNone()) {
      k.words.push_back(-2);
    } else if (v.isInt()) {
      k.words.push_back(-3);
      k.words.push_back(v.toInt());
    } else if (v.isBool()) {
      k.words.push_back(-4);
      k.words.push_back(v.toBool());
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, 8);
      k.words.push_back(-5);
      k.words.push_back(bits);
    } else if (v.isScalar()) {
      const auto sc = v.toScalar();
      if (sc.isComplex() || sc.isSymbolic()) return false;
      k.words.push_back(-6 - (int64_t)sc.type());
      if (sc.isFloatingPoint()) {
        double d = sc.toDouble();
        int64_t bits;
        std::memcpy(&bits, &d, 8);
        k.words.push_back(bits);
      } else {
        k.words.push_back(sc.toLong());
      }
    } else if (v.isString()) {
      k.words.push_back(-20);
      k.words.push_back((int64_t)std::hash<std::string>()(v.toStringRef()));
    } else if (v.isIntList()) {
      k.words.push_back(-21);
      auto l = v.toIntList();
      k.words.push_back((int64_t)l.size());
      for (int64_t x : l) k.words.push_back(x);
    } else if (v.isBoolList()) {
      k.words.push_back(-22);
      auto l = v.toBoolList();
      k.words.push_back((int64_t)l.size());
      for (size_t j = 0; j < l.size(); j++) k.words.push_back(l.get(j));
    } else if (v.isTensorList()) {
      k.words.push_back(-23);
      auto l = v.toTensorList();
      k.words.push_back((int64_t)l.size());
      for (const at::Tensor& t : l) key_tensor(k, t, info.has_view_return);
    } else if (v.isList()) {
      k.words.push_back(-24);
      auto l = v.toList();
      k.words.push_back((int64_t)l.size());
      for (size_t j = 0; j < l.size(); j++) {
        auto e = l.get(j);
        if (e.isTensor()) key_tensor(k, e.toTensor(), info.has_view_return);
        else if (e.isNone()) k.words.push_back(-2);
        else return false;
      }
    } else if (v.isGenerator()) {
      k.words.push_back(-25);
    } else {
      return false;
    }
  }
  size_t h = std::hash<const void*>()(op);
  for (int64_t w : k.words) h = (h ^ (size_t)w) * 0x100000001b3ull;
  k.hash = h;
  return true;
}

// index_add and index_reduce share a meta function that, on the Meta device
// only, selects element 0 of self and of `source` along dim to check the
// slices' shapes: an empty index with a source of size 0 there, or a self of
// size 0 there (no-ops on CPU), then raise IndexError. For the meta run only,
// such a source becomes one of size 1 along dim with a one-element index, and
// such a self one of size 1 along dim: the same checks pass or fail. Returns
// self's real sizes when self was replaced (the output has them), else none.
std::optional<c10::DimVector> meta_avoid_empty_select(const c10::OperatorHandle& op,
                                                      torch::jit::Stack& meta) {
  const std::string& n = op.schema().name();
  if ((n != "aten::index_add" && n != "aten::index_add_" && n != "aten::index_reduce" &&
       n != "aten::index_reduce_") ||
      meta.size() < 4 || !meta[0].isTensor() || !meta[1].isInt() || !meta[2].isTensor() ||
      !meta[3].isTensor())
    return std::nullopt;
  const at::Tensor self = meta[0].toTensor(), index = meta[2].toTensor(), src = meta[3].toTensor();
  if (self.dim() == 0 || src.dim() == 0 || index.dim() > 1) return std::nullopt;
  const int64_t dim = c10::maybe_wrap_dim(meta[1].toInt(), self.dim());
  if (dim >= src.dim()) return std::nullopt;
  if (index.numel() == 0 && src.size(dim) == 0) {
    std::vector<int64_t> sizes(src.sizes().begin(), src.sizes().end());
    sizes[dim] = 1;
    meta[2] = at::empty({1}, index.options());
    meta[3] = at::empty(sizes, src.options());
  }
  if (self.size(dim) != 0) return std::nullopt;
  c10::DimVector real(self.sizes().begin(), self.sizes().end());
  c10::DimVector sizes = real;
  sizes[dim] = 1;
  meta[0] = at::empty(sizes, self.options());
  // an out= argument (the last) must keep matching self's stand-in
  const size_t last = meta.size() - 1;
  if (last > 4 && meta[last].isTensor() && meta[last].toTensor().defined())
    meta[last] = at::empty({0}, meta[last].toTensor().options());
  return real;
}

// roll: CPU checks that shifts and dims align (the meta kernel does not), and
// returns a clone of an empty self before any dim is looked at, where the
// meta kernel wraps every dim. For the meta run only, the dims of an empty
// self become 0s (fuzz seeds 15634, 19714).
void meta_roll_empty_dims(const c10::OperatorHandle& op, torch::jit::Stack& meta) {
  if (op.schema().name() != "aten::roll" || meta.size() < 3 || !meta[0].isTensor() ||
      !meta[1].isIntList() || !meta[2].isIntList())
    return;
  const at::Tensor self = meta[0].toTensor();
  const auto shifts = meta[1].toIntList();
  const auto dims = meta[2].toIntList();
  TORCH_CHECK(!shifts.empty(), "`shifts` required");
  TORCH_CHECK(shifts.size() == dims.size() || (dims.empty() && shifts.size() == 1),
              "shifts and dimensions must align. shifts: ", shifts.size(), ", dims:", dims.size());
  if (self.numel() != 0 || self.dim() == 0) return;
  meta[2] = c10::IValue(std::vector<int64_t>(dims.size(), 0));
}

void run_meta(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, size_t nret,
              std::vector<OutMeta>& out) {
  torch::jit::Stack meta;
  meta.reserve(nargs);
  for (size_t i = 0; i < nargs; i++) meta.push_back(ivalue_to_meta(args[i]));
  const auto real_self_sizes = meta_avoid_empty_select(op, meta);
  meta_roll_empty_dims(op, meta);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  if (real_self_sizes && nret >= 1 && meta[0].isTensor())
    meta[0] = at::empty(*real_self_sizes, meta[0].toTensor().options());  // self's geometry
  out.resize(nret);
  for (size_t r = 0; r < nret; r++) {
    const c10::IValue& mv = meta[r];
    TORCH_CHECK_NOT_IMPLEMENTED(mv.isTensor() || mv.isNone(), "TorchTPU: aten::",
                                op.schema().name(),
                                " returns a non-tensor value that the bridge cannot produce");
    if (!mv.isTensor() || !mv.toTensor().defined()) continue;
    const at::Tensor& m = mv.toTensor();
    OutMeta& o = out[r];
    o.defined = true;
    o.dtype = m.scalar_type();
    o.sizes.assign(m.sizes().begin(), m.sizes().end());
    o.strides.assign(m.strides().begin(), m.strides().end());
    o.storage_offset = m.storage_offset();
  }
}

// Where a meta kernel's outputs differ from the CPU kernel's, follow CPU:
// batch norm in evaluation mode returns empty save_mean/save_invstd, layer
// norm returns mean/rstd in the input's dtype, and the functional index_fill
// fills a clone in self's memory format (the meta function's result is
// contiguous).
// The layout of CPU's (MKL's) FFT results: the transformed dims, in the order
// given, innermost and row-major; the other dims outside them, ordered as the
// input's strides (largest outermost). The meta kernels give cuFFT's layout.
std::vector<int64_t> fft_cpu_strides(c10::IntArrayRef in_strides, std::vector<int64_t> dims,
                                     c10::IntArrayRef out_sizes, bool sort_all, bool sort_but_last) {
  const int64_t nd = (int64_t)out_sizes.size();
  for (auto& d : dims) d = c10::maybe_wrap_dim(d, nd);
  auto by_stride = [&](int64_t a, int64_t b) { return in_strides[a] > in_strides[b]; };
  if (sort_all) std::stable_sort(dims.begin(), dims.end(), by_stride);
  else if (sort_but_last && !dims.empty()) std::stable_sort(dims.begin(), dims.end() - 1, by_stride);
  std::vector<bool> sig(nd, false);
  for (int64_t d : dims) sig[d] = true;
  std::vector<int64_t> batch;
  for (int64_t d = 0; d < nd; d++)
    if (!sig[d]) batch.push_back(d);
  std::stable_sort(batch.begin(), batch.end(), by_stride);
  std::vector<int64_t> st(nd, 1);
  int64_t n = 1;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    st[*it] = n;
    n *= std::max<int64_t>(out_sizes[*it], 1);
  }
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    st[*it] = n;
    n *= std::max<int64_t>(out_sizes[*it], 1);
  }
  return st;
}

void match_cpu_outputs(const OpInfo& info, const c10::IValue* args, size_t nargs,
                       std::vector<OutMeta>& out) {
  const bool fft = info.name == "_fft_c2c" || info.name == "_fft_r2c" || info.name == "_fft_c2r";
  if (fft && nargs >= 2 && args[0].isTensor() && !out.empty() && out[0].defined) {
    const at::Tensor& self = args[0].toTensor();
    std::vector<int64_t> dims = args[1].isIntList() ? args[1].toIntVector() : std::vector<int64_t>();
    if (args[1].isSymIntList())
      for (const c10::SymInt& d : args[1].toSymIntList()) dims.push_back(d.guard_int(__FILE__, __LINE__));
    if (info.name == "_fft_c2r" && dims.size() > 1) {
      // CPU transforms the leading dims first (c2c), then the last from that layout
      std::vector<int64_t> lead(dims.begin(), dims.end() - 1);
      const auto mid = fft_cpu_strides(self.strides(), lead, self.sizes(), true, false);
      const auto st = fft_cpu_strides(mid, {dims.back()}, out[0].sizes, false, false);
      out[0].strides.assign(st.begin(), st.end());
    } else {
      const auto st = fft_cpu_strides(self.strides(), dims, out[0].sizes, info.name == "_fft_c2c",
                                      info.name == "_fft_r2c");
      out[0].strides.assign(st.begin(), st.end());
    }
    return;
  }
  const bool batch_norm = info.name == "native_batch_norm" || info.name == "_native_batch_norm_legit";
  if (batch_norm && nargs > 5 && args[5].isBool() && !args[5].toBool() && out.size() >= 3) {
    for (size_t r = 1; r < 3; r++) {
      out[r].sizes.assign({0});
      out[r].strides.assign({1});
    }
  } else if ((info.name == "index_fill.int_Tensor" || info.name == "index_fill.int_Scalar") &&
             !out.empty() && out[0].defined && args[0].isTensor()) {
    const at::Tensor like = at::empty_like(to_meta(args[0].toTensor()));
    out[0].strides.assign(like.strides().begin(), like.strides().end());
  } else if (info.name == "nonzero_static" && !out.empty() && out[0].defined &&
             out[0].sizes.size() == 2) {
    // CPU's kernel returns a row-major [size, ndim] result, the meta kernel nonzero's layout
    out[0].strides.assign({std::max<int64_t>(out[0].sizes[1], 1), 1});
  } else if (info.name == "linalg_eig" && out.size() >= 2 && out[1].sizes.size() >= 2) {
    // CPU returns the eigenvectors as batched column-major matrices (LAPACK's
    // layout); the meta kernel gives a meta input CUDA's row-major layout.
    auto& v = out[1];
    const size_t nd = v.sizes.size();
    int64_t mult = 1;
    for (size_t d : {nd - 2, nd - 1}) {
      v.strides[d] = mult;
      mult *= std::max<int64_t>(v.sizes[d], 1);
    }
    for (size_t d = nd - 2; d-- > 0;) {
      v.strides[d] = mult;
      mult *= std::max<int64_t>(v.sizes[d], 1);
    }
  } else if (info.name == "native_layer_norm" && out.size() >= 3 && args[0].isTensor()) {
    out[1].dtype = out[2].dtype = args[0].toTensor().scalar_type();
  } else if ((info.name == "multi_margin_loss" || info.name == "multilabel_margin_loss_forward") &&
             args[1].isTensor() && !out.empty()) {
    // The meta kernels (decompositions) give reduction='none' a [nframe]
    // result; CPU makes it 0-d when the target has no batch dim.
    const bool multilabel = info.name == "multilabel_margin_loss_forward";
    const size_t ri = multilabel ? 2 : 5;
    const c10::IValue& red = ri < nargs ? args[ri] : args[0];
    const int64_t reduction = red.isInt() ? red.toInt() : 1;
    if (reduction == 0 && args[1].toTensor().dim() <= (multilabel ? 1 : 0)) {
      out[0].sizes.clear();
      out[0].strides.clear();
    }
  }
}

const std::vector<OutMeta>& output_meta(const c10::OperatorHandle& op, const OpInfo& info,
                                        const c10::IValue* args, size_t nargs, size_t nret,
                                        std::vector<OutMeta>& scratch) {
  constexpr size_t kMaxEntries = 8192;
  thread_local std::unordered_map<MetaKey, std::vector<OutMeta>, MetaKeyHash> cache;
  MetaKey key;
  if (!make_meta_key(info, &op.schema(), args, nargs, key)) {
    run_meta(op, args, nargs, nret, scratch);
    match_cpu_outputs(info, args, nargs, scratch);
    return scratch;
  }
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  run_meta(op, args, nargs, nret, scratch);  // throws on invalid input: nothing cached
  match_cpu_outputs(info, args, nargs, scratch);
  if (cache.size() >= kMaxEntries) cache.clear();
  return cache.emplace(std::move(key), scratch).first->second;
}

bool is_uint_wide(c10::ScalarType t) {
  return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
}

// The first float8 / float4 / uint16-64 dtype among the tensor arguments, or Undefined.
c10::ScalarType narrow_dtype_of(const c10::IValue* args, size_t n) {
  auto narrow = [](const at::Tensor& t) {
    return t.defined() && (tpu_dtype_is_narrow((tpu_dtype_t)t.scalar_type()) ||
                           is_uint_wide(t.scalar_type()) || t.is_complex());
  };
  for (size_t i = 0; i < n; i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (narrow(v.toTensor())) return v.toTensor().scalar_type();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList())
        if (narrow(t)) return t.scalar_type();
    } else if (v.isList()) {
      auto l = v.toList();
      for (size_t j = 0; j < l.size(); j++) {
        auto e = l.get(j);
        if (e.isTensor() && narrow(e.toTensor())) return e.toTensor().scalar_type();
      }
    }
  }
  return c10::ScalarType::Undefined;
}

// Float8 / float4 arguments: CPU is asked first where the probe applies (its
// refusal, "\"abs_cpu\" not implemented for 'Float8_e8m0fnu'", is the user's
// error), then only the families the runtime lists (tpu_dtype_narrow_op_takes)
// run. Where CPU's support depends on the layout (flip, index_select of
// float4), tpu takes every layout.
void check_narrow(const c10::OperatorHandle& op, const OpInfo& info, const c10::IValue* args,
                  size_t nargs) {
  const c10::ScalarType st = narrow_dtype_of(args, nargs);
  if (st == c10::ScalarType::Undefined) return;
  if (info.cpu_probe) probe_on_cpu(op, info, args, nargs);
  const bool takes = st == at::kFloat4_e2m1fn_x2 ? info.narrow_f4
                     : is_uint_wide(st)            ? info.narrow_u
                     : c10::isComplexType(st)      ? info.narrow_c
                                                   : info.narrow_f8;
  // CPU's index_put has no float8_e8m0fnu kernel (a tensor-list op: not probed)
  const bool e8m0_put = st == at::kFloat8_e8m0fnu && info.is_index_put;
  TORCH_CHECK_NOT_IMPLEMENTED(takes && !e8m0_put, "TorchTPU: aten::", info.name,
                              " is not implemented for dtype ", st, " on the tpu device");
}

// whether the selected target runs op `name` (the pjrt target: it has a lowering)
bool target_supports(const std::string& name) {
  const tpu_target_t* t = tpu_target_get();
  return !t || t->iface->supports_op(t->ctx, name.c_str());
}

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  if (!info.rt || (cpu_fallback_enabled() && !target_supports(info.name))) {
    if (cpu_fallback_enabled()) {
      warn_cpu_fallback(info.name);
      at::native::cpu_fallback(op, stack);
      return;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(false, "TorchTPU: the operator 'aten::", info.name,
                                "' is not implemented for the tpu device (target ", tpu_target_name(), "). Set "
                                "TORCH_TPU_CPU_FALLBACK=1 to run unsupported ops on the CPU.");
  }
  ensure_runtime();
  const size_t nargs = info.nargs;
  TORCH_CHECK(nargs <= (size_t)kMaxArgs, "aten::", info.name, ": too many arguments");
  c10::IValue* args = &(*stack)[stack->size() - nargs];
  if ((info.is_index || info.is_index_put) && args[1].isList() && args[0].isTensor())
    prepare_indices(args, args[0].toTensor().device().index(), info.is_index_put);
  bool any_neg = false;
  const c10::DeviceIndex dev = check_devices(info, args, nargs, &any_neg);
  c10::DeviceGuard guard(c10::Device(kTpu, dev));
  if (C10_UNLIKELY(any_neg) && !info.all_views) resolve_neg_args(info, args, nargs);
  if (info.cpu_probe == 2) probe_on_cpu(op, info, args, nargs);
  if (!info.all_views) check_narrow(op, info, args, nargs);
  check_args(op, info, args, nargs);
  if (info.mutated_args) {
    check_overlaps(info, args, nargs);
    materialize_cow_args(info, args, nargs);
  }
  if (C10_UNLIKELY(info.family == kFamMaskedFill) && masked_fill_expanded(info, args, nargs, stack))
    return;
  swap_placeholders(dev);
  PlaceholderUse use;  // to_desc below may read placeholders
  if (info.is_repeat_interleave && nargs >= 2 && args[0].isTensor() && args[1].isNone())
    args[1] = args[0].toTensor().sum().item<int64_t>();  // data-dependent: synchronizes

  const size_t nret = info.return_alias.size();
  std::vector<OutMeta> scratch;
  const std::vector<OutMeta>& metas = output_meta(op, info, args, nargs, nret, scratch);
  if (info.cpu_probe == 1 && !info.all_views) probe_on_cpu(op, info, args, nargs);

  c10::SmallVector<c10::IValue, 4> results(nret);
  CallBuilder b;
  for (size_t r = 0; r < nret; r++) {
    const OutMeta& m = metas[r];
    const int alias = info.return_alias[r];
    tpu_tensor_t* od = b.new_out();
    if (!m.defined) {
      std::memset(od, 0, sizeof *od);
      od->dtype = TPU_DTYPE_NONE;
      results[r] = at::Tensor();
      continue;
    }
    // a complex result from real operands (complex(), polar, casts, FFTs)
    TORCH_CHECK_NOT_IMPLEMENTED(info.all_views || !c10::isComplexType(m.dtype) || info.narrow_c,
                                "TorchTPU: aten::", info.name, " is not implemented for dtype ",
                                m.dtype, " on the tpu device");
    at::Tensor real;
    if (alias >= 0 && !info.return_is_view[r]) {
      real = args[alias].toTensor();
      if (real.sizes() != c10::IntArrayRef(m.sizes)) {
        resize_tensor(real, m.sizes, std::nullopt);
        // a resized out= takes the meta function's strides, as structured kernels'
        // resize_out restrides it (TensorIterator's order: a permuted input's layout)
        if (real.strides() != c10::IntArrayRef(m.strides))
          at::native::as_strided__symint(real, c10::fromIntArrayRefSlow(m.sizes),
                                         c10::fromIntArrayRefSlow(m.strides));
      }
    } else if (alias >= 0) {
      // A view op reaching the backend: same geometry as the meta result.
      real = at::native::as_strided_tensorimpl(args[alias].toTensor(), m.sizes, m.strides,
                                               m.storage_offset);
    } else {
      real = at::detail::empty_strided_generic(m.sizes, m.strides, allocator(),
                                               c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                               m.dtype);
    }
    to_desc(real, od);
    results[r] = std::move(real);
  }

  if (!info.all_views) {
    for (size_t i = 0; i < nargs; i++) b.add(args[i]);
    tpu_call_t call;
    std::memset(&call, 0, sizeof call);
    call.op = info.rt;
    call.nargs = b.nargs;
    call.args = b.args;
    call.nouts = b.nouts;
    call.outs = b.outs;
    call.device = dev;
    call.precision = tpu_get_matmul_precision();
    call.mutated_args = info.mutated_args;
    if (info.random) {
      std::optional<at::Generator> gen;
      if (info.generator_arg >= 0 && args[info.generator_arg].isGenerator())
        gen = args[info.generator_arg].toGenerator();
      uint64_t counters = 0;
      for (int o = 0; o < b.nouts; o++)
        if (b.outs[o].dtype != TPU_DTYPE_NONE)  // a complex element draws two numbers
          counters = std::max<uint64_t>(counters, tpu_tensor_numel(&b.outs[o]) *
                                                      (tpu_dtype_is_complex(b.outs[o].dtype) ? 2 : 1));
      reserve_random(gen, dev, counters, &call.rng_seed, &call.rng_offset);
    }
    check(tpu_stream_submit(current_stream(dev), &call));
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace

// Submits the runtime kernel `name` with tensor arguments `args` and one
// output on the output's device and current stream.
void submit_tensor_call(const char* name, std::initializer_list<at::Tensor> args,
                        const at::Tensor& out) {
  const tpu_op_t* rt = tpu_op_lookup(name);
  TORCH_CHECK(rt, "tpu runtime has no ", name, " kernel");
  PlaceholderUse use;
  tpu_tensor_t descs[4], od;
  tpu_arg_t a[4];
  TORCH_CHECK(args.size() <= 4, "submit_tensor_call: too many arguments");
  std::memset(a, 0, sizeof a);
  int n = 0;
  for (const at::Tensor& t : args) {
    to_desc(t, &descs[n]);
    a[n].kind = TPU_ARG_TENSOR;
    a[n].v.t = &descs[n];
    n++;
  }
  to_desc(out, &od);
  tpu_call_t call;
  std::memset(&call, 0, sizeof call);
  call.op = rt;
  call.nargs = n;
  call.args = a;
  call.nouts = 1;
  call.outs = &od;
  call.device = out.device().index();
  call.precision = tpu_get_matmul_precision();
  check(tpu_stream_submit(current_stream(out.device().index()), &call));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}

namespace {
// The fallback only sees ops that have no kernel usable for PrivateUse1. Ops
// with a CompositeExplicitAutograd(NonFunctional) kernel (add.Tensor decomposes
// into add.out, whose meta kernel is Python) would never reach the runtime, so
// every overload in the runtime's table is registered to the boxed fallback
// explicitly. Composite-implicit overloads are left alone: they decompose
// above autograd and need no backend kernel. The exception is an overload
// that CPU runs with its own kernel and that has an autograd kernel
// (silu_backward, mish_backward): its decomposition would give other values
// than CPU's, and with a backend kernel registered, autograd still goes
// through the autograd kernel.
// The overloads the backend takes from the dispatcher: the target's op
// table, and for a target that lowers ops generically (tpu_target_iface_t's
// kernel_for), every overload of the host target's inventory that it takes
// too: the ATen surface is the same on every target, so that composite
// kernels do not decompose on one target what another runs whole.
std::vector<std::string> runtime_op_names() {
  std::vector<std::string> names;
  for (int i = 0; i < tpu_op_count(); i++) names.push_back(tpu_op_name(i));
  const tpu_target_t* t = tpu_target_get();
  if (t && t->iface->kernel_for && t != tpu_host_target()) {
    int n = 0;
    const tpu_op_t* host = tpu_host_target()->iface->ops(tpu_host_target()->ctx, &n);
    for (int i = 0; i < n; i++)
      if (tpu_op_lookup(host[i].name)) names.push_back(host[i].name);
  }
  return names;
}

struct RegisterRuntimeOps {
  RegisterRuntimeOps() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                           c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    auto& disp = c10::Dispatcher::singleton();
    for (const std::string& full : runtime_op_names()) {
      auto dot = full.find('.');
      std::string name = "aten::" + full.substr(0, dot);
      std::string ovl = dot == std::string::npos ? "" : full.substr(dot + 1);
      auto handle = disp.findOp(c10::OperatorName(name, ovl));
      if (!handle || handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
          !(handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
            handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd)))
        continue;
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
    }
  }
  std::unique_ptr<torch::Library> lib;
};
}  // namespace

namespace {
// The overloads registered directly instead of through the fallback: views
// and storage (ops_views.cpp), copies (ops_copy.cpp) and ops with
// data-dependent output shapes (ops_dynamic.cpp).
void add_direct_ops(DirectOps& ops) {
  add_view_ops(ops);
  add_copy_ops(ops);
  add_dynamic_ops(ops);
  add_attention_ops(ops);
  add_float8_ops(ops);
}
}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  DirectOps ops;
  ops.lib = &m;
  add_direct_ops(ops);
}

namespace {
// After the direct registrations above (same translation unit: in order).
RegisterRuntimeOps g_register_runtime_ops;
}  // namespace

// Names of the overloads that run natively on tpu: those of the runtime
// table and of the direct registrations above that have a PrivateUse1 kernel
// (runtime overloads that PyTorch decomposes before they reach a backend, or
// that this PyTorch does not have, are not counted).
std::vector<std::string> supported_ops() {
  std::vector<std::string> names = runtime_op_names();
  DirectOps direct;
  direct.names = &names;
  add_direct_ops(direct);
  auto& disp = c10::Dispatcher::singleton();
  std::vector<std::string> out;
  for (const std::string& full : names) {
    auto dot = full.find('.');
    auto handle = disp.findOp(c10::OperatorName(
        "aten::" + full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)));
    if (handle && handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      out.push_back("aten::" + full);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace torch_tpu
