// Python module torch_tpu._C: what the torch.tpu module and torch_tpu need
// from the runtime (device queries, memory statistics, modes, generators).
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include "bridge.h"

namespace torch_tpu {
std::vector<std::string> supported_ops();
void add_dist_bindings(py::module& m);  // dist.cpp
void add_everyday_bindings(py::module& m);  // memory.cpp (snapshots), profiler.cpp
void add_kernel_bindings(py::module& m);  // kernels.cpp
}

namespace {
using namespace torch_tpu;

py::dict memory_stats(int device) {
  ensure_runtime();
  tpu_memory_stats_t s;
  tpu_device_memory_stats(device, &s);
  py::dict d;
  d["allocated_bytes.all.current"] = s.allocated_bytes;
  d["allocated_bytes.all.peak"] = s.peak_allocated_bytes;
  d["allocated_bytes.all.allocated"] = s.total_allocated_bytes;
  d["allocated_bytes.all.freed"] = s.total_freed_bytes;
  d["reserved_bytes.all.current"] = s.reserved_bytes;
  d["reserved_bytes.all.peak"] = s.peak_reserved_bytes;
  d["active.all.current"] = s.active_allocations;
  d["active.all.peak"] = s.peak_active_allocations;
  d["allocation.all.allocated"] = s.num_allocs;
  d["allocation.all.freed"] = s.num_frees;
  d["num_ooms"] = s.num_ooms;
  d["num_cache_hits"] = s.num_cache_hits;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["capacity_bytes"] = s.capacity_bytes;
  d["promised_bytes.all.current"] = s.promised_bytes;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "TorchTPU native bridge";
  ensure_target();  // an unknown TORCH_TPU_TARGET fails the import, naming it
  torch_tpu::add_dist_bindings(m);
  torch_tpu::add_everyday_bindings(m);
  torch_tpu::add_kernel_bindings(m);
  m.def("target", [] { return std::string(tpu_target_name()); });
  // the target's name for device i ("host", "cpu", "TPU v5 lite", "NVIDIA H200")
  m.def("device_kind", [](int i) {
    const tpu_target_t* t = tpu_target_get();
    tpu_target_device_props_t props;
    if (!t || i < 0 || i >= tpu_device_count()) throw py::index_error("no tpu device " + std::to_string(i));
    tpu_status_t st = t->iface->device_props(t->ctx, i, &props);
    if (st) {
      std::string msg = tpu_status_message(st);
      tpu_status_free(st);
      throw std::runtime_error(msg);
    }
    return std::string(props.name ? props.name : "unknown");
  });
  // the pjrt target's programs: compiled, loaded from the cache's tiers 2/3, found by text,
  // found by call key, runs (zeros elsewhere)
  m.def("pjrt_stats", [] {
    tpu_pjrt_target_stats_t s = {};
    if (tpu_target_get() == tpu_pjrt_target()) tpu_pjrt_target_stats(&s);
    py::dict d;
    d["compiles"] = s.compiles;
    d["cache_loads"] = s.loads;
    d["cache_hits"] = s.hits;
    d["call_hits"] = s.call_hits;
    d["runs"] = s.runs;
    d["donated"] = s.donated;
    d["compile_seconds"] = s.compile_seconds;
    d["load_seconds"] = s.load_seconds;
    return d;
  });
  // the compilation-cache key of a pjrt module text (tests: under another platform/version)
  m.def(
      "_pjrt_cache_key",
      [](const std::string& text, std::optional<std::string> platform,
         std::optional<std::string> version) {
        if (tpu_target_get() != tpu_pjrt_target())
          throw std::runtime_error("_pjrt_cache_key: the target is not pjrt");
        char key[33];
        tpu_status_t st = tpu_pjrt_target_cache_key(text.data(), text.size(),
                                                    platform ? platform->c_str() : nullptr,
                                                    version ? version->c_str() : nullptr, key);
        if (st) {
          std::string msg = tpu_status_message(st);
          tpu_status_free(st);
          throw std::runtime_error(msg);
        }
        return std::string(key);
      },
      py::arg("text"), py::arg("platform") = py::none(), py::arg("version") = py::none());
  m.def("_init", &ensure_runtime);
  m.def("is_initialized",
        [] { return tpu_runtime_is_initialized() && !tpu_runtime_in_bad_fork(); });
  m.def("_is_in_bad_fork", [] { return tpu_runtime_in_bad_fork(); });
  m.def("device_count", [] { return tpu_device_count(); });
  m.def("current_device", [] { return (int)current_device(); });
  m.def("set_device", [](int d) { set_current_device((c10::DeviceIndex)d); });
  m.def("synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    synchronize_device((c10::DeviceIndex)d);
  });
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [](int d) {
    ensure_runtime();
    tpu_device_reset_peak_stats(d);
  });
  m.def("reset_accumulated_memory_stats", [](int d) {
    ensure_runtime();
    tpu_device_reset_accumulated_stats(d);
  });
  m.def("empty_cache", [] {
    py::gil_scoped_release no_gil;
    ensure_runtime();
    for (int d = 0; d < tpu_device_count(); d++) tpu_device_empty_cache(d);
  });
  m.def("default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator((c10::DeviceIndex)d)));
  });
  m.def("supported_ops", &supported_ops);
  m.def("get_eager_mode", [] {
    ensure_runtime();
    switch (tpu_get_eager_mode()) {
      case TPU_MODE_DEBUG: return std::string("debug");
      case TPU_MODE_DEFER: return std::string("defer_and_fuse");
      default: return std::string("strict");
    }
  });
  m.def("materialize", [] {
    ensure_runtime();
    for (int d = 0; d < tpu_device_count(); d++) materialize_device(d);
  });
  m.def("set_sdpa_traced", &set_sdpa_traced);
  m.def("sdpa_fused_min_scores", &sdpa_fused_min_scores);
  m.def("set_sdpa_fused_min_scores", &set_sdpa_fused_min_scores);
  m.def("set_whole_graph", [](bool on) { tpu_trace_set_whole_graph(on); });
  m.def("trace_length", [](int d) { return tpu_trace_length(d); });
  m.def("lazy_buffers", [] { return tpu_lazy_count(); });
  m.def("trace_stats", [] {
    tpu_trace_stats_t s;
    tpu_trace_get_stats(&s);
    py::dict r;
    r["flushes"] = s.flushes;
    r["nodes"] = s.nodes;
    r["nodes_dropped"] = s.nodes_dropped;
    r["nodes_fused"] = s.nodes_fused;
    r["temps"] = s.temps;
    r["temp_bytes"] = s.temp_bytes;
    r["elided_bytes"] = s.elided_bytes;
    r["repeat_cuts"] = s.repeat_cuts;
    r["reduction_groups"] = s.reduction_groups;
    r["epilogue_groups"] = s.epilogue_groups;
    r["recipes"] = s.recipes;
    r["recipe_bytes"] = s.recipe_bytes;
    r["recomputed"] = s.recomputed;
    return r;
  });
  m.def("reset_trace_stats", [] { tpu_trace_reset_stats(); });
  m.def("compilation_cache_stats", [] {
    tpu_cache_stats_t s;
    tpu_cache_get_stats(&s);
    py::dict r;
    r["tier1_hits"] = s.tier1_hits;
    r["tier2_hits"] = s.tier2_hits;
    r["tier3_hits"] = s.tier3_hits;
    r["misses"] = s.misses;
    r["compiles"] = s.compiles;
    r["compile_seconds"] = s.compile_seconds;
    r["corrupt_entries"] = s.corrupt_entries;
    r["store_failures"] = s.store_failures;
    const char* d2 = tpu_cache_dir(2);
    const char* d3 = tpu_cache_dir(3);
    r["tier2_dir"] = d2 ? py::object(py::str(d2)) : py::object(py::none());
    r["tier3_dir"] = d3 ? py::object(py::str(d3)) : py::object(py::none());
    return r;
  });
  m.def("reset_compilation_cache_stats", [] { tpu_cache_reset_stats(); });
  m.def("clear_compilation_cache", [](int tier) { check(tpu_cache_clear(tier)); });
  m.def("reload_cache_config", [] { tpu_cache_reload_config(); });
  m.def("wait_compiles", [] {
    py::gil_scoped_release no_gil;
    tpu_target_wait_compiles();
  });
  m.def("pop_warnings", [] {
    py::list out;
    for (const char* w; (w = tpu_target_pop_warning());) out.append(py::str(w));
    for (const char* w; (w = tpu_cache_pop_warning());) out.append(py::str(w));
    return out;
  });
  m.def("profile_enable", [](bool on) { tpu_profile_enable(on); });
  m.def("profile_reset", [] { tpu_profile_reset(); });
  m.def("profile_entries", [] {
    py::dict out;
    const char* name;
    int64_t calls, ns;
    for (int i = 0; tpu_profile_entry(i, &name, &calls, &ns); i++)
      if (calls) out[py::str(name)] = py::make_tuple(calls, (double)ns * 1e-9);
    return out;
  });
  m.def("set_dump_dir", [](std::optional<std::string> dir) {
    check(tpu_trace_set_dump_dir(dir ? dir->c_str() : nullptr));
  });
  m.def("set_eager_mode", [](const std::string& mode) {
    ensure_runtime();
    if (mode == "strict") {
      check(tpu_set_eager_mode(TPU_MODE_STRICT));
    } else if (mode == "debug") {
      for (int d = 0; d < tpu_device_count(); d++) synchronize_device(d);
      check(tpu_set_eager_mode(TPU_MODE_DEBUG));
    } else if (mode == "defer_and_fuse") {
      check(tpu_set_eager_mode(TPU_MODE_DEFER));
    } else {
      throw py::value_error("unknown eager mode '" + mode +
                            "': expected 'strict', 'debug' or 'defer_and_fuse'");
    }
    for (int d = 0; d < tpu_device_count(); d++) swap_placeholders(d, true);
  });
  // The calling thread's override (None: follow the process-wide mode);
  // returns the previous override.
  m.def("set_thread_eager_mode", [](std::optional<std::string> mode) -> std::optional<std::string> {
    ensure_runtime();
    static const char* names[] = {"strict", "debug", "defer_and_fuse"};
    int m = -1;
    if (mode) {
      for (int i = 0; i < 3; i++)
        if (*mode == names[i]) m = i;
      if (m < 0)
        throw py::value_error("unknown eager mode '" + *mode +
                              "': expected 'strict', 'debug' or 'defer_and_fuse'");
      if (m == TPU_MODE_DEBUG)
        for (int d = 0; d < tpu_device_count(); d++) synchronize_device(d);
    }
    int prev = -1;
    check(tpu_set_thread_eager_mode(m, &prev));
    for (int d = 0; d < tpu_device_count(); d++) swap_placeholders(d, true);
    if (prev < 0) return std::nullopt;
    return std::string(names[prev]);
  });
  m.def("set_matmul_precision", [](const std::string& p) {
    if (p == "medium") tpu_set_matmul_precision(TPU_PRECISION_MEDIUM);
    else if (p == "high") tpu_set_matmul_precision(TPU_PRECISION_HIGH);
    else if (p == "highest") tpu_set_matmul_precision(TPU_PRECISION_HIGHEST);
    else throw py::value_error("unknown matmul precision '" + p +
                               "': expected 'medium', 'high' or 'highest'");
  });
  m.def("num_threads", [] {
    ensure_runtime();
    return tpu_num_threads();
  });
}
