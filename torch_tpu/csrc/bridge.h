// TorchTPU bridge: the only C++ in the project. It adapts PyTorch's
// PrivateUse1 interfaces to the C runtime (runtime/include/tpu).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <string>

extern "C" {
#include "tpu/device.h"
#include "tpu/op.h"
#include "tpu/trace.h"
#include "tpu/cache.h"
#include "tpu/target.h"
#include "tpu/targets.h"
}

namespace torch_tpu {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Throws the Python exception matching a runtime status and frees it:
// OUT_OF_RANGE -> IndexError, RESOURCE_EXHAUSTED -> torch.OutOfMemoryError,
// UNIMPLEMENTED -> NotImplementedError, INVALID_ARGUMENT -> RuntimeError (or
// ValueError when `value_error`), otherwise RuntimeError.
void throw_status(tpu_status_t st);
inline void check(tpu_status_t st) {
  if (st) throw_status(st);
}

// The target chosen when the library loaded (TORCH_TPU_TARGET, target.cpp);
// raises naming the value and the known targets when there is none.
void ensure_target();
// Runtime start-up (idempotent); raises if the environment is invalid.
void ensure_runtime();

// Thread-local current device and per-device current stream.
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex d);
int64_t current_stream_id(c10::DeviceIndex d);
void set_current_stream_id(c10::DeviceIndex d, int64_t id);
tpu_stream_t* current_stream(c10::DeviceIndex d);
tpu_stream_t* stream_or_throw(c10::DeviceIndex d, int64_t id);

// Fills a runtime descriptor for a tpu tensor (or a 0-d CPU tensor).
void to_desc(const at::Tensor& t, tpu_tensor_t* out);

// Synchronizes the device's streams (flushing its DeferAndFuse trace first),
// raising the first asynchronous error.
void synchronize_device(c10::DeviceIndex d);
// Queues a copy of `count` raw bytes between two buffers of device d (either
// may be a placeholder) on d's current stream: device memory is touched only
// by the runtime.
void copy_device_bytes(c10::DeviceIndex d, void* dest, const void* src, size_t count);

// DeferAndFuse: runs the device's trace now (without waiting for it) and
// gives live storages their real memory.
void materialize_device(c10::DeviceIndex d);
// After the runtime flushed a trace: swaps placeholders of live storages for
// their real memory (cheap when nothing was flushed since the last call).
void swap_placeholders(c10::DeviceIndex d, bool force = false);
// A scope in which the calling thread reads storages' data pointers, which
// may be placeholders, and hands them to the runtime (building and
// submitting a call). While any thread is inside one, swap_placeholders on
// other threads does nothing (it would release placeholders that thread may
// still name); nested scopes cost a thread-local counter.
class PlaceholderUse {
 public:
  PlaceholderUse();
  ~PlaceholderUse();
  PlaceholderUse(const PlaceholderUse&) = delete;
  PlaceholderUse& operator=(const PlaceholderUse&) = delete;
};

// The per-device default generator and its (seed, offset) reservation for a
// random op that consumes `counters` Philox blocks.
const at::Generator& default_generator(c10::DeviceIndex d);
void reserve_random(const std::optional<at::Generator>& gen, c10::DeviceIndex d, uint64_t counters,
                    uint64_t* seed, uint64_t* offset);

// Memory allocator (a c10::DeviceAllocator).
c10::Allocator* allocator();

// Copies between host and device and on the device (used by _copy_from).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

// attention.cpp: while on (this thread), sdpa on traced tpu tensors (AOTAutograd's fake and
// functional tensors, static sizes) chooses the fused ops, so a compiled graph keeps
// attention as one node per direction. Returns the previous setting.
bool set_sdpa_traced(bool on);
// The fewest queries x keys for which sdpa defaults to the fused kernel (attention.cpp).
int64_t sdpa_fused_min_scores();
// Sets it (tests); returns the previous value.
int64_t set_sdpa_fused_min_scores(int64_t n);

}  // namespace torch_tpu
