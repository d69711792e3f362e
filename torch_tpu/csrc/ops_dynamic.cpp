// Data-dependent ops: those whose output shape, or host-side result, depends
// on the tensors' values, so the bridge reads something back from the device
// (a synchronization) before it can go on: boolean-mask indexing
// (prepare_indices, which the boxed fallback calls for index / index_put),
// nonzero, masked_select, the unique family, equal, bincount, _ctc_loss with
// tensor lengths and _local_scalar_dense (item). Most are composed from other
// device ops. add_dynamic_ops hands the kernels to ops.cpp, which registers
// them.
#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/IndexingUtils.h>

#include <algorithm>

#include "ops_internal.h"

namespace torch_tpu {

// Converts the arguments of an index / index_put op: boolean masks become
// long indices (via nonzero) after CPU's checks of their shapes, CPU indices
// move to the device.
void prepare_indices(c10::IValue* args, c10::DeviceIndex dev, bool put) {
  const at::Tensor& self = args[0].toTensor();
  auto list = args[1].toList();
  c10::List<std::optional<at::Tensor>> in;
  int64_t used = 0;  // dims of self the indices consume
  bool mask = false;
  for (size_t i = 0; i < list.size(); i++) {
    auto e = list.get(i);
    if (!e.isTensor() || !e.toTensor().defined()) {
      in.push_back(std::nullopt);
      used++;
      continue;
    }
    const at::Tensor& idx = e.toTensor();
    const auto st = idx.scalar_type();
    TORCH_CHECK_INDEX(st == at::kLong || st == at::kInt || st == at::kByte || st == at::kBool,
                      "tensors used as indices must be long, int, byte or bool tensors");
    const bool is_mask = st == at::kBool || st == at::kByte;
    mask = mask || is_mask;
    used += is_mask ? idx.dim() : 1;
    in.push_back(idx);
  }
  if (put) {
    TORCH_CHECK_INDEX(used <= self.dim(), "too many indices for tensor of dimension ", self.dim(),
                      " (got ", used, ")");
  } else {
    TORCH_CHECK_INDEX(used <= self.dim(), "too many indices for tensor of dimension ", self.dim());
  }
  if (mask) {
    // CPU's own conversion: checks each mask's shape against the dims it
    // covers (IndexError) and replaces it by its nonzero coordinates.
    std::vector<at::Tensor> ex = at::native::expandTensors(self, in, /*ensure_same_device=*/true);
    c10::List<std::optional<at::Tensor>> out;
    for (auto& t : ex) {
      if (!t.defined()) out.push_back(std::nullopt);
      else out.push_back(t.device().type() == kTpu ? t : t.to(c10::Device(kTpu, dev)));
    }
    args[1] = out;
  } else {
    c10::List<std::optional<at::Tensor>> out;
    for (size_t i = 0; i < in.size(); i++) {
      auto e = in.get(i);
      if (!e.has_value()) out.push_back(std::nullopt);
      else out.push_back(e->device().type() == kTpu ? *e : e->to(c10::Device(kTpu, dev)));
    }
    args[1] = out;
  }
  if (put) return;  // index_put: check_args, after its dtype and broadcast checks
  // index: the empty-dim rule, once the indices broadcast (else the meta raises)
  const auto converted = args[1].toList();
  c10::DimVector bshape;
  bool first = true;
  try {
    for (size_t i = 0; i < converted.size(); i++) {
      const auto e = converted.get(i);
      if (!e.isTensor() || !e.toTensor().defined()) continue;
      bshape = first ? c10::DimVector(e.toTensor().sizes()) : broadcast_shape(bshape, e.toTensor().sizes());
      first = false;
    }
  } catch (const std::exception&) {
    return;
  }
  if (!first) check_empty_indexed_dims(self, converted, bshape);
}

// nonzero's output size depends on the data: count on the device, read the
// count back (a synchronization), then queue the kernel that writes the indices.
int64_t count_nonzero_host(const at::Tensor& self) {
  if (self.numel() == 0) return 0;
  return at::count_nonzero(self).item<int64_t>();
}

namespace {

void submit_nonzero(const at::Tensor& self, const at::Tensor& out) {
  submit_tensor_call("nonzero", {self}, out);
}

// As CPU: the result is column-major ([n, ndim] with strides (1, n)), unless
// `out` already has the result's shape in another layout, which it keeps.
at::Tensor& tpu_nonzero_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong,
              "nonzero: Expected out tensor to have scalar type Long but got scalar type",
              out.scalar_type());
  TORCH_CHECK(out.device() == self.device(), "expected self and out to be on the same device, got ",
              self.device(), " and ", out.device());
  c10::DeviceGuard guard(self.device());
  const int64_t n = count_nonzero_host(self);
  const int64_t nd = self.dim();
  if (out.dim() == 2 && out.size(0) == n && out.size(1) == nd && !out.t().is_contiguous()) {
    at::Tensor tmp = at::empty({nd, n}, out.options()).t();
    submit_nonzero(self, tmp);
    out.copy_(tmp);
    return out;
  }
  resize_tensor(out, {nd, n}, std::nullopt);
  out.as_strided_({n, nd}, {1, n});
  submit_nonzero(self, out);
  return out;
}

at::Tensor tpu_nonzero(const at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  const int64_t n = count_nonzero_host(self);
  // CPU returns a column-major [n, ndim] result; keep that layout.
  at::Tensor out = at::empty_strided({n, self.dim()}, {1, n}, self.options().dtype(at::kLong));
  submit_nonzero(self, out);
  return out;
}

at::Tensor tpu_masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool,
              "masked_select: expected BoolTensor for mask, got ", mask.scalar_type());
  auto shapes = at::infer_size(self.sizes(), mask.sizes());
  return self.expand(shapes).index({mask.expand(shapes)});
}

at::Tensor& tpu_masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::assert_no_overlap(out, mask);
  at::Tensor r = tpu_masked_select(self, mask);
  resize_tensor(out, r.sizes(), std::nullopt);
  out.copy_(r);
  return out;
}

// unique: data-dependent sizes, composed from device ops (sort, compare,
// masked_select, cumsum, scatter). Groups of equal values are runs of the
// sorted (or, for unique_consecutive, original) order.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_runs(const at::Tensor& self, bool sort,
                                                           bool return_inverse,
                                                           bool return_counts) {
  at::Tensor flat = self.reshape({-1});
  const int64_t n = flat.numel();
  at::Tensor vals = flat, perm;
  if (sort) std::tie(vals, perm) = flat.sort(/*stable=*/true, 0, false);
  at::Tensor first = at::ones({n}, flat.options().dtype(at::kBool));
  if (n > 1) first.slice(0, 1).copy_(vals.slice(0, 1).ne(vals.slice(0, 0, n - 1)));
  at::Tensor uniq = vals.masked_select(first);
  at::Tensor inverse = at::empty({0}, flat.options().dtype(at::kLong));
  at::Tensor counts = at::empty({0}, flat.options().dtype(at::kLong));
  if (return_inverse) {
    at::Tensor group = first.cumsum(0, at::kLong).sub_(1);
    inverse = sort ? at::empty({n}, group.options()).scatter_(0, perm, group) : group;
    inverse = inverse.reshape(self.sizes());
  }
  if (return_counts) {
    at::Tensor starts = at::nonzero(first).reshape({-1});
    at::Tensor ends = at::cat({starts.slice(0, 1), at::full({1}, n, starts.options())});
    counts = ends.sub(starts);
  }
  return {uniq, inverse, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique2(const at::Tensor& self, bool sorted,
                                                           bool return_inverse,
                                                           bool return_counts) {
  (void)sorted;  // always sorted: a valid order for sorted=False too
  return unique_runs(self, true, return_inverse, return_counts);
}

// _unique (the older overload): _unique2 without counts
std::tuple<at::Tensor, at::Tensor> tpu_unique(const at::Tensor& self, bool sorted,
                                              bool return_inverse) {
  (void)sorted;
  auto r = unique_runs(self, true, return_inverse, false);
  return {std::get<0>(r), std::get<1>(r)};
}

// Slices along dim that equal their neighbour form a group: unique_dim
// (sorted: the distinct slices in lexicographic order, CPU's order) and
// unique_consecutive with a dim (runs in the original order). Each slice's
// group (inverse) and the group sizes (counts) are returned whatever the flags
// say, as CPU does. Slices become rows; for unique_dim, stable sorts by the
// last column first, then by each earlier one, give the lexicographic
// permutation; a row starts a group where it differs from the row before it.
// Rows of unsigned 16/32/64-bit integers are gathered as the signed integers
// of their size (CPU has no index_select for them, so tpu's gate refuses it
// too); the sort keys are viewed back, so they order as unsigned.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_slices(const at::Tensor& self, int64_t dim,
                                                             bool sort) {
  dim = c10::maybe_wrap_dim(dim, self.dim(), /*wrap_scalar=*/false);
  auto sizes = self.sizes().vec();
  const auto zero_dims = std::count(sizes.begin(), sizes.end(), 0);
  auto long_opts = self.options().dtype(at::kLong);
  if (self.size(dim) == 0) {
    TORCH_CHECK(zero_dims == 1,
                "Number of zero sized dimensions is more than one, so unique cannot be applied ");
    return {at::empty(sizes, self.options()), at::empty({0}, long_opts), at::empty({0}, long_opts)};
  }
  TORCH_CHECK(zero_dims == 0,
              "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
  const at::ScalarType dt = self.scalar_type();
  const at::ScalarType bits = dt == at::kUInt16   ? at::kShort
                              : dt == at::kUInt32 ? at::kInt
                              : dt == at::kUInt64 ? at::kLong
                                                  : dt;
  at::Tensor moved = self.moveaxis(dim, 0);
  auto moved_sizes = moved.sizes().vec();
  const int64_t n = moved.size(0);
  at::Tensor rows = moved.contiguous().view({n, -1}).view(bits);
  at::Tensor perm = at::arange(n, long_opts);
  for (int64_t k = sort ? rows.size(1) - 1 : -1; k >= 0; k--) {
    at::Tensor key = rows.select(1, k).index_select(0, perm).view(dt);
    perm = perm.index_select(0, std::get<1>(key.sort(/*stable=*/true, 0, false)));
  }
  at::Tensor ordered = sort ? rows.index_select(0, perm) : rows;
  at::Tensor first = at::ones({n}, self.options().dtype(at::kBool));
  if (n > 1)
    first.slice(0, 1).copy_(ordered.slice(0, 1).ne(ordered.slice(0, 0, n - 1)).any(1));
  at::Tensor starts = at::nonzero(first).reshape({-1});
  moved_sizes[0] = starts.numel();
  at::Tensor output =
      ordered.index_select(0, starts).view(dt).view(moved_sizes).moveaxis(0, dim);
  at::Tensor group = first.cumsum(0, at::kLong).sub_(1);
  at::Tensor inverse = sort ? at::empty({n}, long_opts).scatter_(0, perm, group) : group;
  at::Tensor ends = at::cat({starts.slice(0, 1), at::full({1}, n, long_opts)});
  return {output, inverse, ends.sub(starts)};
}

// Without a dim (or dim 0 of a 1-D tensor, written as 0), elements, as the
// flags ask; with any other dim, slices (always returning inverse and
// counts): CPU's split.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_consecutive(
    const at::Tensor& self, bool return_inverse, bool return_counts, std::optional<int64_t> dim) {
  if (!dim.has_value() || (*dim == 0 && self.dim() == 1))
    return unique_runs(self, false, return_inverse, return_counts);
  return unique_slices(self, *dim, /*sort=*/false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_dim(const at::Tensor& self, int64_t dim,
                                                              bool sorted, bool return_inverse,
                                                              bool return_counts) {
  (void)sorted;
  (void)return_inverse;
  (void)return_counts;
  return unique_slices(self, dim, /*sort=*/true);
}

// equal returns a Python bool, which the boxed path cannot produce.
bool tpu_equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (self.sizes() != other.sizes()) return false;
  if (self.numel() == 0) return true;
  return self.eq(other).all().item<bool>();
}

// bincount: the output length is max(self) + 1 (at least minlength), read
// from the device first; the counting itself is an index_add on the device.
// Weights keep float32, other weight dtypes count in float64, as on CPU.
at::Tensor tpu_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights,
                        int64_t minlength) {
  TORCH_CHECK(self.dim() == 1 && at::isIntegralType(self.scalar_type(), /*includeBool=*/false),
              "bincount only supports 1-d non-negative integral inputs.");
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  const bool has_w = weights.has_value() && weights->defined();
  TORCH_CHECK(!has_w || (weights->dim() == 1 && weights->numel() == self.numel()),
              "weights should be 1-d and have the same length as input");
  int64_t n = minlength;
  if (self.numel() > 0) {
    TORCH_CHECK(self.min().item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
    n = std::max(n, self.max().item<int64_t>() + 1);
  }
  const auto dt = !has_w ? at::kLong : weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  if (self.numel() == 0) return at::zeros({n}, self.options().dtype(dt));
  at::Tensor idx = self.to(at::kLong);
  if (!has_w) {
    return at::zeros({n}, self.options().dtype(at::kLong))
        .index_add_(0, idx, at::ones({self.numel()}, self.options().dtype(at::kLong)));
  }
  return at::zeros({n}, weights->options().dtype(dt)).index_add_(0, idx, weights->to(dt));
}

// _ctc_loss / _ctc_loss_backward with tensor lengths: the log_alpha shape
// depends on the largest target length, so the lengths are read to the host
// (synchronizing when they live on the device) and the int-list overloads,
// which run the native kernels, do the work. CPU's kernels do the same.
std::vector<int64_t> ctc_lengths(const at::Tensor& t, const char* what) {
  TORCH_CHECK(at::isIntegralType(t.scalar_type(), /*includeBool=*/false), what,
              " must be integral");
  at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.const_data_ptr<int64_t>(), h.const_data_ptr<int64_t>() + h.numel());
}

std::tuple<at::Tensor, at::Tensor> tpu_ctc_loss_tensor(const at::Tensor& log_probs,
                                                       const at::Tensor& targets,
                                                       const at::Tensor& input_lengths,
                                                       const at::Tensor& target_lengths,
                                                       int64_t blank, bool zero_infinity) {
  auto il = ctc_lengths(input_lengths, "input_lengths");
  auto tl = ctc_lengths(target_lengths, "target_lengths");
  return at::_ctc_loss(log_probs, targets, il, tl, blank, zero_infinity);
}

at::Tensor tpu_ctc_loss_backward_tensor(const at::Tensor& grad, const at::Tensor& log_probs,
                                        const at::Tensor& targets,
                                        const at::Tensor& input_lengths,
                                        const at::Tensor& target_lengths,
                                        const at::Tensor& neg_log_likelihood,
                                        const at::Tensor& log_alpha, int64_t blank,
                                        bool zero_infinity) {
  auto il = ctc_lengths(input_lengths, "input_lengths");
  auto tl = ctc_lengths(target_lengths, "target_lengths");
  return at::_ctc_loss_backward(grad, log_probs, targets, il, tl, neg_log_likelihood, log_alpha,
                                blank, zero_infinity);
}

at::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  copy_from(self, host, false);
  return host.item();
}

}  // namespace

void add_dynamic_ops(DirectOps& ops) {
  ops.add("_local_scalar_dense", tpu_local_scalar_dense);
  ops.add("nonzero", tpu_nonzero);
  ops.add("nonzero.out", tpu_nonzero_out);
  ops.add("masked_select", tpu_masked_select);
  ops.add("masked_select.out", tpu_masked_select_out);
  ops.add("_unique2", tpu_unique2);
  ops.add("_unique", tpu_unique);
  ops.add("equal", tpu_equal);
  ops.add("unique_consecutive", tpu_unique_consecutive);
  ops.add("unique_dim", tpu_unique_dim);
  ops.add("bincount", tpu_bincount);
  ops.add("_ctc_loss.Tensor", tpu_ctc_loss_tensor);
  ops.add("_ctc_loss_backward.Tensor", tpu_ctc_loss_backward_tensor);
}

}  // namespace torch_tpu
