// Device integration: errors, current device/stream, allocator, device guard,
// PrivateUse1 hooks and the per-device Philox generator.
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bridge.h"

namespace torch_tpu {

void throw_status(tpu_status_t st) {
  std::string msg = tpu_status_message(st);
  tpu_status_code_t code = tpu_status_code(st);
  tpu_status_free(st);
  switch (code) {
    case TPU_CODE_OUT_OF_RANGE:
      TORCH_CHECK_INDEX(false, msg);
    case TPU_CODE_RESOURCE_EXHAUSTED:
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    case TPU_CODE_UNIMPLEMENTED:
      TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case TPU_CODE_LINALG:
      TORCH_CHECK_WITH(LinAlgError, false, msg);
    default:
      TORCH_CHECK(false, msg);
  }
}

void ensure_runtime() {
  ensure_target();
  // A child forked after the runtime started: refuse, as CUDA does. Checked
  // on every call, since the child inherits the parent's "started" state.
  if (tpu_runtime_in_bad_fork()) check(tpu_runtime_init());
  static std::once_flag once;
  static tpu_status_t err = TPU_OK;
  std::call_once(once, [] { err = tpu_runtime_init(); });
  if (err) TORCH_CHECK(false, tpu_status_message(err));
}

namespace {
thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<int64_t, 64> t_stream{};  // current stream id per device
}  // namespace

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex d) {
  ensure_runtime();
  TORCH_CHECK(d >= 0 && d < tpu_device_count(), "Invalid device index tpu:", (int)d,
              ": there are ", tpu_device_count(), " tpu device(s) (TORCH_TPU_HOST_DEVICES)");
  t_device = d;
}

int64_t current_stream_id(c10::DeviceIndex d) { return t_stream[d]; }
void set_current_stream_id(c10::DeviceIndex d, int64_t id) { t_stream[d] = id; }

tpu_stream_t* stream_or_throw(c10::DeviceIndex d, int64_t id) {
  ensure_runtime();
  tpu_stream_t* s = tpu_stream_get(d, id);
  TORCH_CHECK(s, "tpu: no stream ", id, " on device tpu:", (int)d);
  return s;
}

tpu_stream_t* current_stream(c10::DeviceIndex d) { return stream_or_throw(d, t_stream[d]); }

void synchronize_device(c10::DeviceIndex d) {
  ensure_runtime();
  tpu_status_t st = tpu_device_synchronize(d);
  swap_placeholders(d);
  check(st);
}

// ---------------------------------------------------------------------------
// Placeholders (DeferAndFuse): storages made while deferring point at
// placeholder addresses until a flush backs them; then their DataPtr is
// swapped for the real memory so that the placeholder can be reused.

namespace {
constexpr int kMaxLazyDevices = 64;
struct LazyDevice {
  std::mutex mu;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> pending;
  std::unordered_set<const void*> seen;
  std::atomic<uint64_t> epoch{0};  // trace epoch the pending list was last swapped at
};
LazyDevice g_lazy[kMaxLazyDevices];

void note_pending(const at::Tensor& t) {
  const int d = t.device().index();
  if (d < 0 || d >= kMaxLazyDevices) return;
  const c10::Storage& st = t.storage();
  LazyDevice& L = g_lazy[d];
  std::lock_guard<std::mutex> g(L.mu);
  if (L.seen.insert(st.unsafeGetStorageImpl()).second) L.pending.push_back(st.getWeakStorageImpl());
}

void lazy_deleter(void* p) { tpu_lazy_free(p); }
c10::DeleterFnPtr raw_device_deleter();

// Readers (PlaceholderUse scopes) share it; a swap takes it alone, without
// waiting: a thread that waited here could hold the GIL that a reader needs.
std::shared_mutex g_swap_mu;
thread_local int t_use_depth = 0;
}  // namespace

PlaceholderUse::PlaceholderUse() {
  if (t_use_depth++ == 0) g_swap_mu.lock_shared();
}

PlaceholderUse::~PlaceholderUse() {
  if (--t_use_depth == 0) g_swap_mu.unlock_shared();
}

void swap_placeholders(c10::DeviceIndex d, bool force) {
  if (d < 0 || d >= kMaxLazyDevices) return;
  LazyDevice& L = g_lazy[d];
  const uint64_t epoch = tpu_trace_epoch(d);
  if (!force && epoch == L.epoch.load(std::memory_order_relaxed)) return;  // the common case
  // Another thread (or this one, in an outer scope) may be building a call
  // from placeholder addresses: swapping now would release them under it.
  // The storages stay pending and a later call swaps them.
  if (t_use_depth > 0) return;
  std::unique_lock<std::shared_mutex> excl(g_swap_mu, std::try_to_lock);
  if (!excl.owns_lock()) return;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> list;
  {
    std::lock_guard<std::mutex> g(L.mu);
    if (!force && epoch == L.epoch.load()) return;
    L.epoch.store(epoch);
    list.swap(L.pending);
    L.seen.clear();
  }
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> keep;
  for (auto& w : list) {
    auto sp = w.lock();
    if (!sp) continue;
    void* ph = sp->data_ptr().get();
    if (!tpu_is_lazy(ph)) continue;
    void* real = tpu_lazy_detach(ph);
    if (!real) {  // not backed yet (still in a trace, or never used)
      keep.push_back(std::move(w));
      continue;
    }
    // destroys the placeholder DataPtr, whose deleter releases the slot
    sp->set_data_ptr_noswap(c10::DataPtr(real, real, raw_device_deleter(), sp->device()));
  }
  if (!keep.empty()) {
    std::lock_guard<std::mutex> g(L.mu);
    for (auto& w : keep) {
      auto sp = w.lock();
      if (sp && L.seen.insert(sp.get()).second) L.pending.push_back(std::move(w));
    }
  }
}

void materialize_device(c10::DeviceIndex d) {
  ensure_runtime();
  tpu_status_t st = tpu_trace_flush(d);
  swap_placeholders(d, true);
  check(st);
}

void to_desc(const at::Tensor& t, tpu_tensor_t* out) {
  const int64_t nd = t.dim();
  TORCH_CHECK(nd <= TPU_MAX_DIMS, "tpu supports tensors of at most ", TPU_MAX_DIMS,
              " dimensions, got ", nd);
  const auto st = t.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(tpu_dtype_is_supported((int)st), "tpu does not support dtype ",
                              st);
  out->dtype = (tpu_dtype_t)st;
  out->ndim = (int32_t)nd;
  out->flags = 0;
  out->device = t.device().index();
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (int64_t i = 0; i < nd; i++) {
    out->sizes[i] = sizes[i];
    out->strides[i] = strides[i];
  }
  if (t.is_cpu()) {  // a 0-d CPU operand: copied into the call by the runtime
    out->flags |= TPU_TENSOR_CPU_SCALAR;
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) out->flags |= TPU_TENSOR_WRAPPED_NUMBER;
  }
  void* p = t.numel() ? const_cast<void*>(t.const_data_ptr()) : nullptr;
  if (p && tpu_is_lazy(p)) {
    note_pending(t);
    if (void* real = tpu_lazy_resolve(p)) p = real;
  }
  out->data = p;
}

void copy_device_bytes(c10::DeviceIndex d, void* dest, const void* src, size_t count) {
  if (!count) return;
  const tpu_op_t* op = tpu_op_lookup("copy");
  TORCH_CHECK(op, "tpu runtime has no copy kernel");
  tpu_tensor_t dt, st;
  std::memset(&dt, 0, sizeof dt);
  dt.dtype = TPU_U8;
  dt.ndim = 1;
  dt.sizes[0] = (int64_t)count;
  dt.strides[0] = 1;
  dt.device = d;
  st = dt;
  dt.data = dest;
  st.data = const_cast<void*>(src);
  tpu_arg_t a[2];
  std::memset(a, 0, sizeof a);
  a[0].kind = a[1].kind = TPU_ARG_TENSOR;
  a[0].v.t = &dt;
  a[1].v.t = &st;
  tpu_call_t call;
  std::memset(&call, 0, sizeof call);
  call.op = op;
  call.nargs = 2;
  call.args = a;
  call.nouts = 1;
  call.outs = &dt;
  call.device = d;
  check(tpu_stream_submit(current_stream(d), &call));
}

// ---------------------------------------------------------------------------
// Allocator

struct StackCapture {  // memory.cpp
  StackCapture();
  ~StackCapture();
};

namespace {

using c10::CachingDeviceAllocator::DeviceStats;

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    ensure_runtime();
    const c10::DeviceIndex d = current_device();
    if (nbytes && tpu_get_eager_mode() == TPU_MODE_DEFER) {
      if (void* ph = tpu_lazy_alloc(d, nbytes)) return {ph, ph, &lazy_deleter, c10::Device(kTpu, d)};
    }
    return allocate_real(nbytes);
  }

  c10::DataPtr allocate_real(size_t nbytes) {
    ensure_runtime();
    const c10::DeviceIndex d = current_device();
    StackCapture capture;  // memory snapshots may record the Python stack (memory.cpp)
    void* p = nullptr;
    // for the thread's current stream: the block may be reused while that
    // stream still has queued work on its previous life (stream order)
    check(tpu_device_malloc_on(current_stream(d), nbytes, &p));
    return {p, p, &TpuAllocator::deleter, c10::Device(kTpu, d)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &TpuAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    // Device-to-device copy of raw bytes, queued after earlier work.
    PlaceholderUse use;
    copy_device_bytes(current_device(), dest, src, count);
  }

  bool initialized() override { return tpu_runtime_is_initialized(); }

  void emptyCache(c10::MempoolId_t) override {
    ensure_runtime();
    for (int d = 0; d < tpu_device_count(); d++) tpu_device_empty_cache(d);
  }

  // Nothing to record: the runtime fences a freed block on every stream that
  // still has queued work (stream-ordered lifetime, tpu/device.h), which is
  // what record_stream asks for, for every stream at once.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    ensure_runtime();
    tpu_memory_stats_t s;
    tpu_device_memory_stats(d, &s);
    DeviceStats out;
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out.allocated_bytes[agg].current = s.allocated_bytes;
    out.allocated_bytes[agg].peak = s.peak_allocated_bytes;
    out.allocated_bytes[agg].allocated = s.total_allocated_bytes;
    out.allocated_bytes[agg].freed = s.total_freed_bytes;
    out.reserved_bytes[agg].current = s.reserved_bytes;
    out.reserved_bytes[agg].peak = s.peak_reserved_bytes;
    out.active_bytes[agg] = out.allocated_bytes[agg];
    out.requested_bytes[agg] = out.allocated_bytes[agg];
    out.allocation[agg].current = s.active_allocations;
    out.allocation[agg].peak = s.peak_active_allocations;
    out.allocation[agg].allocated = s.num_allocs;
    out.allocation[agg].freed = s.num_frees;
    out.num_alloc_retries = 0;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex d) override {
    ensure_runtime();
    tpu_device_reset_accumulated_stats(d);
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    ensure_runtime();
    tpu_device_reset_peak_stats(d);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    ensure_runtime();
    tpu_memory_stats_t s;
    tpu_device_memory_stats(d, &s);
    const int64_t used = s.reserved_bytes + s.promised_bytes;
    return {(size_t)(used < s.capacity_bytes ? s.capacity_bytes - used : 0),
            (size_t)s.capacity_bytes};
  }

  static void deleter(void* p) {
    if (p) tpu_device_free(-1, p);
  }
};

TpuAllocator g_allocator;

}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

namespace {
c10::DeleterFnPtr raw_device_deleter() { return g_allocator.raw_deleter(); }
}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// ---------------------------------------------------------------------------
// Device guard: devices, streams, events

namespace {

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(kTpu, current_device());
    if (d.index() >= 0) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kTpu, current_device()); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    auto idx = d.index() >= 0 ? d.index() : current_device();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, idx), current_stream_id(idx));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    auto idx = d.index() >= 0 ? d.index() : current_device();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, idx), 0);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    ensure_runtime();
    auto idx = d.index() >= 0 ? d.index() : current_device();
    int64_t id = 0;
    check(tpu_stream_create(idx, &id));
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, idx), id);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return getNewStream(d, high ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto idx = s.device_index();
    c10::Stream old(c10::Stream::UNSAFE, c10::Device(kTpu, idx), current_stream_id(idx));
    set_current_stream_id(idx, s.id());
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    tpu_status_t st = tpu_runtime_init();
    if (st) {
      tpu_status_free(st);
      return 0;
    }
    return (c10::DeviceIndex)tpu_device_count();
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    ensure_runtime();
    if (!*event) {
      tpu_event_t* e = nullptr;
      check(tpu_event_create(&e));
      *event = e;
    }
    check(tpu_event_record((tpu_event_t*)*event,
                           stream_or_throw(stream.device_index(), stream.id())));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    check(tpu_stream_wait_event(stream_or_throw(stream.device_index(), stream.id()),
                                (tpu_event_t*)event));
  }
  bool queryEvent(void* event) const override {
    return !event || tpu_event_query((tpu_event_t*)event);
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    tpu_event_destroy((tpu_event_t*)event);
  }
  void synchronizeEvent(void* event) const override {
    if (event) tpu_event_synchronize((tpu_event_t*)event);
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    TORCH_CHECK(a && b, "elapsed_time: both events must have been recorded");
    return 1000.0 * tpu_event_elapsed_seconds((tpu_event_t*)a, (tpu_event_t*)b);
  }
  bool queryStream(const c10::Stream& s) const override {
    return tpu_stream_query(stream_or_throw(s.device_index(), s.id()));
  }
  void synchronizeStream(const c10::Stream& s) const override {
    check(tpu_stream_synchronize(stream_or_throw(s.device_index(), s.id())));
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override { synchronize_device(d); }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    g_allocator.recordStream(p, s);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ---------------------------------------------------------------------------
// Generator: Philox seed + counter offset, one per device.

struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex d)
      : c10::GeneratorImpl(c10::Device(kTpu, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t s) override {
    seed_ = s;
    offset_ = 0;
  }
  void set_offset(uint64_t o) override { offset_ = o; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom(false);
    set_current_seed(s);
    return s;
  }
  // State: 16 bytes, seed then offset (little endian), as a CPU uint8 tensor.
  void set_state(const c10::TensorImpl& st) override {
    TORCH_CHECK(st.dtype() == caffe2::TypeMeta::Make<uint8_t>() && st.numel() == 16,
                "tpu RNG state must be a uint8 tensor of 16 bytes, got ", st.numel(), " elements");
    const auto* p = static_cast<const uint8_t*>(st.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* p = t.data_ptr<uint8_t>();
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kTpu; }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = 67280421310721ull;  // c10's default seed
  uint64_t offset_ = 0;
};

at::Generator make_generator(c10::DeviceIndex d) {
  return at::make_generator<TpuGenerator>(d < 0 ? current_device() : d);
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex d) {
  static std::once_flag once;
  static std::vector<at::Generator> gens;
  std::call_once(once, [] {
    ensure_runtime();
    for (int i = 0; i < tpu_device_count(); i++) gens.push_back(make_generator(i));
  });
  if (d < 0) d = current_device();
  TORCH_CHECK(d < (int)gens.size(), "no tpu device ", (int)d);
  return gens[d];
}

void reserve_random(const std::optional<at::Generator>& gen, c10::DeviceIndex d,
                    uint64_t counters, uint64_t* seed, uint64_t* offset) {
  at::Generator g = (gen.has_value() && gen->defined()) ? *gen : default_generator(d);
  TORCH_CHECK(g.device().type() == kTpu, "Expected a 'tpu' device type for generator but found '",
              g.device().type(), "'");
  std::lock_guard<std::mutex> lock(g.mutex());
  auto* impl = g.get<TpuGenerator>();
  *seed = impl->current_seed();
  *offset = impl->get_offset();
  impl->set_offset(*offset + counters);
}

namespace {

// Pinned host memory (Tensor.pin_memory(), DataLoader(pin_memory=True)). On
// the host target device memory is host memory, so any host buffer is as
// good as pinned; the blocks are ordinary CPU memory, remembered so that
// is_pinned() answers true for them, as it does for CUDA's pinned memory.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> g(mu_);
      blocks_[reinterpret_cast<uintptr_t>(p)] = nbytes;
    }
    return {p, p, &PinnedAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
  bool contains(const void* ptr) {
    const auto a = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> g(mu_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }
  static void deleter(void* p);

 private:
  std::mutex mu_;
  std::map<uintptr_t, size_t> blocks_;
};

PinnedAllocator g_pinned;

void PinnedAllocator::deleter(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> g(g_pinned.mu_);
    g_pinned.blocks_.erase(reinterpret_cast<uintptr_t>(p));
  }
  c10::free_cpu(p);
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return tpu_device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return make_generator(d); }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = tpu_device_of_ptr(data);
    return at::Device(kTpu, d >= 0 ? d : current_device());
  }
  bool isPinnedPtr(const void* p) const override { return p && g_pinned.contains(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override { ensure_runtime(); }
  c10::DeviceIndex deviceCount() const override { return (c10::DeviceIndex)tpu_device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    if (d >= 0) set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // Reallocate and carry over the old bytes (a copy queued after earlier work).
    PlaceholderUse use;
    auto* impl = storage.unsafeGetStorageImpl();
    const size_t old = impl->nbytes();
    c10::DeviceGuard guard(impl->device());
    c10::DataPtr fresh = g_allocator.allocate_real(newsize);
    if (old && newsize && impl->data())
      copy_device_bytes(impl->device().index(), fresh.get(), impl->data(), std::min(old, newsize));
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct HooksRegistrar {
  HooksRegistrar() { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); }
} g_hooks_registrar;

}  // namespace
}  // namespace torch_tpu
