// torch.profiler support: a Kineto activity profiler for the PrivateUse1
// device. PyTorch forwards the factory registered here to Kineto; when a
// profile asks for ProfilerActivity.PrivateUse1, Kineto opens a session that
// turns the runtime's kernel timeline (tpu/observe.h) on, and at the end
// hands Kineto one device activity per kernel run, linked to the CPU op that
// issued it through the correlation id PyTorch pushes around every op.
//
// Compiled with USE_KINETO and the kineto headers (see the Makefile); only
// kineto's public headers and PyTorch's PrivateUse1 profiler registry are
// used.
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/util/ApproximateClock.h>

#include <libkineto.h>
#include <output_base.h>

#include <pybind11/pybind11.h>

#include <time.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tpu/device.h"
#include "tpu/observe.h"
#include "tpu/op.h"
#include "tpu/trace.h"
#include "bridge.h"

namespace py = pybind11;

namespace torch_tpu {
namespace {

int64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The correlation ids PyTorch has pushed on this thread (ops nest).
thread_local std::vector<uint64_t> t_corr;

class TpuProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    // kernel times are CLOCK_MONOTONIC; Kineto's are Unix-epoch nanoseconds
    offset_ns_ = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
    start_ns_ = clock_ns(CLOCK_REALTIME);
    tpu_kernel_events_record(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    // Work queued inside the window runs to its end first (deferred traces
    // are flushed), so that its kernels are part of the profile; errors stay
    // for the program's next synchronization.
    if (tpu_runtime_is_initialized()) {
      for (int d = 0; d < tpu_device_count(); d++) {
        tpu_status_free(tpu_trace_flush(d));
        tpu_device_wait_idle(d);
      }
    }
    end_ns_ = clock_ns(CLOCK_REALTIME);
    std::vector<tpu_kernel_event_t> chunk(1 << 14);
    for (size_t n; (n = tpu_kernel_events_take(chunk.data(), chunk.size())) > 0;)
      events_.insert(events_.end(), chunk.begin(), chunk.begin() + (long)n);
    tpu_kernel_events_record(false);
    dropped_ = tpu_kernel_events_dropped();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    if (!dropped_) return {};
    return {"tpu: " + std::to_string(dropped_) + " kernel events dropped (buffer full)"};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_of, int64_t, int64_t) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "tpu");
    buffer_->gpuOpCount = (int)events_.size();
    for (const tpu_kernel_event_t& e : events_) {
      const char* name = nullptr;
      int64_t calls = 0, ns = 0;
      if (!tpu_profile_entry(e.entry, &name, &calls, &ns) || !name) name = "tpu_kernel";
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL,
                                std::string(name));
      libkineto::GenericTraceActivity& a = *buffer_->activities.back();
      a.startTime = e.start_ns + offset_ns_;
      a.endTime = e.end_ns + offset_ns_;
      a.device = e.device < 0 ? 0 : e.device;
      a.resource = (int32_t)(e.stream < 0 ? 0 : e.stream);
      a.id = (int32_t)e.tag;
      a.linked = e.tag ? linked_of((int32_t)e.tag) : nullptr;
      // (quoted metadata only: the numeric form formats with fmt, which torch does not export)
      a.addMetadataQuoted("device", std::to_string(a.device));
      a.addMetadataQuoted("stream", std::to_string(e.stream));
      if (e.tag) a.addMetadataQuoted("correlation", std::to_string(e.tag));
      a.addMetadataQuoted("ran", e.stream < 0 ? "inline" : "on its stream's worker");
      streams_.insert({a.device, e.stream < 0 ? 0 : e.stream});
      logger.handleActivity(a);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{0, 1 << 20, "tpu", "TPU 0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [dev, stream] : streams_)
      out.push_back(libkineto::ResourceInfo{stream, stream, dev,
                                            "tpu:" + std::to_string(dev) + " stream " +
                                                std::to_string(stream)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  void pushCorrelationId(uint64_t id) override {
    t_corr.push_back(id);
    tpu_profile_set_tag(id);
  }
  void popCorrelationId() override {
    if (!t_corr.empty()) t_corr.pop_back();
    tpu_profile_set_tag(t_corr.empty() ? 0 : t_corr.back());
  }

 private:
  int64_t offset_ns_ = 0, start_ns_ = 0, end_ns_ = 0;
  uint64_t dropped_ = 0;
  std::vector<tpu_kernel_event_t> events_;
  std::set<std::pair<int64_t, int64_t>> streams_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<TpuProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"tpu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

// The legacy profiler's device timing (torch.autograd.profiler.profile(use_device="tpu"),
// use_kineto=False): an event on the current stream at each op's start and end; the op's
// device time is the time between the stream reaching the two.
struct TpuProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex d = current_device();
    if (device) *device = d;
    tpu_event_t* e = nullptr;
    check(tpu_event_create(&e));
    *event = std::shared_ptr<void>(e, [](void* p) { tpu_event_destroy((tpu_event_t*)p); });
    if (cpu_ns) *cpu_ns = c10::getTime();
    check(tpu_event_record(e, current_stream(d)));
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    auto* ea = static_cast<tpu_event_t*>(a->get());
    auto* eb = static_cast<tpu_event_t*>(b->get());
    tpu_event_synchronize(ea);
    tpu_event_synchronize(eb);
    return (float)(tpu_event_elapsed_seconds(ea, eb) * 1e6);  // microseconds
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < tpu_device_count(); d++) op(d);
  }
  void synchronize() const override {
    for (int d = 0; d < tpu_device_count(); d++) {
      tpu_status_free(tpu_trace_flush(d));
      tpu_device_wait_idle(d);
    }
  }
};

struct StubsRegistrar {
  StubsRegistrar() {
    static TpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_stubs_registrar;

}  // namespace

void add_profiler_bindings(py::module& m) {
  m.def("_profiler_registered", [] {
    return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
  });
}

}  // namespace torch_tpu
