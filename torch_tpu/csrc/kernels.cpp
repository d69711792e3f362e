// User kernels (torch_tpu.kernels): defining one (runtime/targets/kernels.c
// compiles it and registers its op) and calling it. The Python side turns a
// kernel into a torch.library custom op whose tpu implementation allocates
// the outputs and calls _kernel_call; the call is then an ordinary runtime
// call: queued on the current stream, traced in DeferAndFuse, checked in
// Debug mode.
#include <torch/extension.h>

#include <cstring>
#include <vector>

#include "bridge.h"
#include "ops_internal.h"

extern "C" {
#include "tpu/kernels.h"
}

namespace torch_tpu {
namespace {

py::dict kernel_define(const std::string& name, int lang, const std::string& source,
                       const std::string& entry, const std::string& cflags) {
  ensure_runtime();
  tpu_kernel_desc_t d = {};
  d.name = name.c_str();
  d.lang = (tpu_kernel_lang_t)lang;
  d.source = source.c_str();
  d.entry = entry.c_str();
  d.cflags = cflags.empty() ? nullptr : cflags.c_str();
  const tpu_op_t* op = nullptr;
  tpu_kernel_info_t info = {};
  tpu_status_t st;
  {
    py::gil_scoped_release nogil;  // a compile takes seconds
    st = tpu_kernel_define(&d, &op, &info);
  }
  check(st);
  py::dict r;
  r["op"] = (uintptr_t)op;
  r["cache_tier"] = info.cache_tier;
  r["compile_seconds"] = info.compile_seconds;
  r["key"] = std::string(info.key);
  return r;
}

// One argument of the call: a tensor, a list of tensors, a number or None.
void add_tensor(const at::Tensor& t, c10::DeviceIndex* dev, const std::string& op) {
  if (t.device().type() == kTpu) {
    TORCH_CHECK(*dev < 0 || *dev == t.device().index(), op,
                ": the tensors of a custom kernel call must be on one tpu device, got tpu:", *dev,
                " and tpu:", t.device().index());
    *dev = t.device().index();
  } else {
    TORCH_CHECK(t.is_cpu() && t.dim() == 0, op,
                ": a custom kernel takes tpu tensors (and 0-d CPU tensors), got a tensor on ",
                t.device());
  }
}

void kernel_call(uintptr_t op_handle, const py::list& args, const std::vector<at::Tensor>& outs,
                 uint64_t mutated) {
  const tpu_op_t* op = reinterpret_cast<const tpu_op_t*>(op_handle);
  TORCH_CHECK(op && tpu_op_custom(op), "_kernel_call: not a custom kernel");
  const std::string name = op->name;
  const size_t n = args.size();
  TORCH_CHECK(n <= 64, name, ": a custom kernel takes at most 64 arguments");
  // the arguments as C++ values first (the GIL is held; nothing is submitted yet)
  std::vector<c10::IValue> vals(n);
  c10::DeviceIndex dev = -1;
  for (size_t i = 0; i < n; i++) {
    py::handle h = args[i];
    if (h.is_none()) continue;
    if (THPVariable_Check(h.ptr())) {
      at::Tensor t = THPVariable_Unpack(h.ptr());
      add_tensor(t, &dev, name);
      vals[i] = t;
    } else if (py::isinstance<py::bool_>(h)) {
      vals[i] = h.cast<bool>();
    } else if (py::isinstance<py::int_>(h)) {
      vals[i] = h.cast<int64_t>();
    } else if (py::isinstance<py::float_>(h)) {
      vals[i] = h.cast<double>();
    } else if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
      std::vector<at::Tensor> ts;
      for (py::handle e : h) {
        TORCH_CHECK(THPVariable_Check(e.ptr()), name, ": argument ", i,
                    " is a list holding a non-tensor");
        ts.push_back(THPVariable_Unpack(e.ptr()));
        add_tensor(ts.back(), &dev, name);
      }
      vals[i] = ts;
    } else {
      TORCH_CHECK(false, name, ": argument ", i, " has a type a custom kernel cannot take (",
                  std::string(py::str(py::type::of(h))), ")");
    }
  }
  for (const at::Tensor& t : outs) {
    TORCH_CHECK(t.device().type() == kTpu, name, ": outputs must be tpu tensors");
    add_tensor(t, &dev, name);
  }
  TORCH_CHECK(dev >= 0, name, ": a custom kernel call needs at least one tpu tensor");
  ensure_runtime();
  c10::DeviceGuard guard(c10::Device(kTpu, dev));
  for (size_t i = 0; i < n; i++)
    if ((mutated >> i) & 1) {
      if (vals[i].isTensor()) materialize_cow(vals[i].toTensor());
      else if (vals[i].isTensorList())
        for (const at::Tensor& t : vals[i].toTensorList()) materialize_cow(t);
    }
  for (const at::Tensor& t : outs) materialize_cow(t);
  py::gil_scoped_release nogil;
  swap_placeholders(dev);
  PlaceholderUse use;  // to_desc reads storages' pointers, which may be placeholders
  std::vector<tpu_arg_t> a(n);
  std::vector<tpu_tensor_t> single(n);
  std::vector<std::vector<tpu_tensor_t>> lists(n);
  for (size_t i = 0; i < n; i++) {
    std::memset(&a[i], 0, sizeof a[i]);
    const c10::IValue& v = vals[i];
    if (v.isTensor()) {
      to_desc(v.toTensor(), &single[i]);
      a[i].kind = TPU_ARG_TENSOR;
      a[i].v.t = &single[i];
    } else if (v.isTensorList()) {
      auto ts = v.toTensorList();
      lists[i].resize(ts.size());
      for (size_t k = 0; k < ts.size(); k++) to_desc(ts[k], &lists[i][k]);
      a[i].kind = TPU_ARG_TENSORLIST;
      a[i].n = (int32_t)ts.size();
      a[i].v.tlist = lists[i].data();
    } else if (v.isBool()) {
      a[i].kind = TPU_ARG_BOOL;
      a[i].v.b = v.toBool();
    } else if (v.isInt()) {
      a[i].kind = TPU_ARG_INT;
      a[i].v.i = v.toInt();
    } else if (v.isDouble()) {
      a[i].kind = TPU_ARG_DOUBLE;
      a[i].v.d = v.toDouble();
    } else {
      a[i].kind = TPU_ARG_NONE;
    }
  }
  std::vector<tpu_tensor_t> od(outs.size());
  for (size_t k = 0; k < outs.size(); k++) to_desc(outs[k], &od[k]);
  tpu_call_t call;
  std::memset(&call, 0, sizeof call);
  call.op = op;
  call.nargs = (int32_t)n;
  call.args = a.data();
  call.nouts = (int32_t)od.size();
  call.outs = od.data();
  call.device = dev;
  call.precision = tpu_get_matmul_precision();
  call.mutated_args = mutated;
  check(tpu_stream_submit(current_stream(dev), &call));
}

}  // namespace

void add_kernel_bindings(py::module& m) {
  m.def("_kernel_define", &kernel_define, py::arg("name"), py::arg("lang"), py::arg("source"),
        py::arg("entry"), py::arg("cflags") = std::string());
  m.def("_kernel_call", &kernel_call, py::arg("op"), py::arg("args"), py::arg("outs"),
        py::arg("mutated") = 0);
  m.def("_kernel_header", [] {
    size_t len = 0;
    const char* name = nullptr;
    const char* text = tpu_kernel_abi_header(&len, &name);
    return py::make_tuple(std::string(name), std::string(text, len));
  });
}

}  // namespace torch_tpu
