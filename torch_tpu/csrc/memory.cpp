// Memory snapshots (torch.tpu.memory._record_memory_history / _snapshot):
// the runtime's allocator reports every alloc, free and block obtained from
// or returned to the target (tpu/observe.h); while recording, this file
// keeps the last max_entries of them per device with the Python stack of
// the thread that caused them, and the stack that allocated each live block.
// _snapshot() lists the allocator's blocks (each block is its own segment:
// the allocator does not split blocks) and the recorded events; Python
// (torch_tpu/memory.py) arranges them in the dict format of
// torch.cuda.memory._snapshot() that PyTorch's memory visualizer reads.
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "bridge.h"
#include "tpu/observe.h"

namespace torch {
// libtorch_python's (torch/csrc/profiler/python/combined_traceback.h, whose
// includes are not shipped): frames as lists of {filename, line, name}.
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace torch_tpu {
void add_profiler_bindings(py::module& m);  // profiler.cpp

// Marks the bridge allocator's allocate (device.cpp) on this thread.
struct StackCapture {
  StackCapture();
  ~StackCapture();
};

namespace {

using Traceback = std::shared_ptr<torch::CapturedTraceback>;

struct Entry {
  int device;
  int action;  // tpu_mem_action_t
  uintptr_t addr;
  size_t size;
  size_t requested;
  int64_t stream;
  int64_t time_us;
  Traceback frames;
};

struct LiveInfo {
  size_t requested;
  Traceback frames;
};

std::mutex g_mu;
bool g_recording = false;
bool g_stacks = true;
size_t g_max_entries = 0;
std::deque<Entry> g_trace;
std::unordered_map<uintptr_t, LiveInfo> g_live;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

thread_local int t_capture = 0;  // inside the bridge allocator's allocate (StackCapture)

// Python frames where taking them cannot deadlock: on a thread that holds
// the GIL already, or inside the bridge allocator's allocate on a thread
// Python knows (an op called from Python releases the GIL; gathering takes
// it back, as CUDA's allocator does). Never on a stream worker or in the
// runtime's own allocations (a DeferAndFuse flush): the thread holding the
// GIL may be waiting for them.
Traceback gather_frames() {
  if (!g_stacks || !Py_IsInitialized()) return nullptr;
  if (!PyGILState_Check() && !(t_capture > 0 && PyGILState_GetThisThreadState() != nullptr))
    return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
}

void observer(int device, tpu_mem_action_t action, const void* ptr, size_t size,
              size_t requested, int64_t stream) {
  Traceback tb = gather_frames();  // outside g_mu (it may take the GIL)
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_recording) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (action == TPU_MEM_ALLOC) g_live[a] = LiveInfo{requested, tb};
  else if (action == TPU_MEM_FREE) g_live.erase(a);
  if (!g_max_entries) return;
  g_trace.push_back(Entry{device, (int)action, a, size, requested, stream, now_us(), tb});
  while (g_trace.size() > g_max_entries) g_trace.pop_front();
}

void record(bool enabled, bool stacks, size_t max_entries) {
  ensure_runtime();
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (enabled && !g_recording) {  // a fresh history
      g_trace.clear();
      g_live.clear();
    }
    g_recording = enabled;
    g_stacks = stacks;
    g_max_entries = max_entries;
    if (!enabled) {
      g_trace.clear();
      g_live.clear();
    }
  }
  tpu_device_set_memory_observer(enabled ? &observer : nullptr);
}

struct Block {
  uintptr_t addr;
  size_t size;
  bool live;
};

void collect_block(void* ctx, const void* ptr, size_t size, bool live) {
  static_cast<std::vector<Block>*>(ctx)->push_back(
      Block{reinterpret_cast<uintptr_t>(ptr), size, live});
}

const char* action_name(int a) {
  switch (a) {
    case TPU_MEM_ALLOC: return "alloc";
    case TPU_MEM_FREE: return "free";
    case TPU_MEM_SEGMENT_ALLOC: return "segment_alloc";
    case TPU_MEM_SEGMENT_FREE: return "segment_free";
    default: return "oom";
  }
}

// (blocks per device, trace entries per device). Blocks: (device, address,
// size, live, requested, frames); trace: (action, address, size, requested,
// stream, time_us, frames). Frames are lists of {filename, line, name}.
py::tuple raw_snapshot() {
  ensure_runtime();
  const int n = tpu_device_count();
  std::vector<std::vector<Block>> blocks(n);
  for (int d = 0; d < n; d++) tpu_device_memory_blocks(d, &collect_block, &blocks[d]);
  std::vector<Entry> trace;
  std::vector<std::pair<Block, LiveInfo>> described;
  std::vector<int> block_device;
  {
    std::lock_guard<std::mutex> g(g_mu);
    trace.assign(g_trace.begin(), g_trace.end());
    for (int d = 0; d < n; d++)
      for (const Block& b : blocks[d]) {
        auto it = b.live ? g_live.find(b.addr) : g_live.end();
        described.emplace_back(b, it != g_live.end() ? it->second : LiveInfo{b.size, nullptr});
        block_device.push_back(d);
      }
  }
  // symbolize every traceback at once (dedupes frames)
  std::vector<torch::CapturedTraceback*> tbs;
  for (const auto& [b, info] : described)
    if (info.frames) tbs.push_back(info.frames.get());
  for (const Entry& e : trace)
    if (e.frames) tbs.push_back(e.frames.get());
  std::vector<py::object> sym = torch::py_symbolize(tbs);
  size_t k = 0;
  auto frames_of = [&](const Traceback& t) -> py::object {
    return t ? sym.at(k++) : py::object(py::list());
  };
  py::list out_blocks;
  for (size_t i = 0; i < described.size(); i++) {
    const auto& [b, info] = described[i];
    out_blocks.append(py::make_tuple(block_device[i], b.addr, b.size, b.live,
                                     b.live ? info.requested : 0, frames_of(info.frames)));
  }
  py::list out_trace;
  for (int d = 0; d < n; d++) out_trace.append(py::list());
  for (const Entry& e : trace) {
    py::list dev = out_trace[e.device];
    dev.append(py::make_tuple(action_name(e.action), e.addr, e.size, e.requested, e.stream,
                              e.time_us, frames_of(e.frames)));
  }
  return py::make_tuple(out_blocks, out_trace);
}

}  // namespace

StackCapture::StackCapture() { t_capture++; }
StackCapture::~StackCapture() { t_capture--; }

void add_everyday_bindings(py::module& m) {
  add_profiler_bindings(m);
  m.def("_memory_record", &record, py::arg("enabled"), py::arg("stacks"),
        py::arg("max_entries"));
  m.def("_memory_recording", [] {
    std::lock_guard<std::mutex> g(g_mu);
    return g_recording;
  });
  m.def("_memory_raw_snapshot", &raw_snapshot);
}

}  // namespace torch_tpu
