// tpu_dist: the c10d Backend of device tpu. Each collective is queued on a
// communication stream of the tensors' chip (after the current stream's work,
// as NCCL's streams are ordered), where the runtime's transport
// (runtime/dist/, tpu/dist.h) runs it on the chip's memory. Work::wait()
// blocks until the collective has run, raises its error (naming the
// collective and the ranks), and makes the current stream wait for it; the
// Work's future is complete at once with events on the communication stream,
// so consumers order on it like CUDA's futures.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/exception.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <ATen/core/ivalue.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>

#include "bridge.h"

extern "C" {
#include "tpu/dist.h"
}

namespace torch_tpu {
namespace {

using c10d::OpType;

tpu_dist_redop_t to_redop(const c10d::ReduceOp& op, double* factor) {
  *factor = 1.0;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return TPU_DIST_SUM;
    case c10d::ReduceOp::AVG: return TPU_DIST_AVG;
    case c10d::ReduceOp::PRODUCT: return TPU_DIST_PRODUCT;
    case c10d::ReduceOp::MIN: return TPU_DIST_MIN;
    case c10d::ReduceOp::MAX: return TPU_DIST_MAX;
    case c10d::ReduceOp::BAND: return TPU_DIST_BAND;
    case c10d::ReduceOp::BOR: return TPU_DIST_BOR;
    case c10d::ReduceOp::BXOR: return TPU_DIST_BXOR;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s, "tpu_dist: PREMUL_SUM without its factor");
      *factor = s->tensor_factor.defined() ? s->tensor_factor.cpu().item<double>() : s->double_factor;
      return TPU_DIST_PREMUL_SUM;
    }
    default: break;
  }
  TORCH_CHECK(false, "tpu_dist: unknown reduce op ", (int)op.op_);
}

// What a queued collective and its Work share.
struct CollState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
};

// One tensor of a collective, as the caller names it.
struct Buf {
  at::Tensor t;
  bool read = true, write = true;
};

// What the queued work knows of a tensor: its chip address (resolved at
// launch), its size and, on a target whose memory the host cannot address, a
// host copy to run on. No at::Tensor reaches the worker thread: releasing one
// there may need the GIL (a tensor with a Python object), which a worker must
// never wait for. The allocator's stream-ordered frees keep the memory of a
// tensor freed meanwhile until the collective has run.
struct Staged {
  void* dev = nullptr;
  size_t nbytes = 0;
  bool read = true, write = true;
  std::vector<unsigned char> host;
  size_t bytes() const { return nbytes; }
};

// A tensor's element count and dtype, for the queued work.
struct Meta {
  int64_t n;
  tpu_dtype_t dt;
  size_t es;
};
Meta meta(const at::Tensor& t) {
  return {t.numel(), (tpu_dtype_t)t.scalar_type(), (size_t)t.element_size()};
}

struct DistStats {
  std::atomic<int64_t> shm_collectives{0}, hierarchical_all_reduces{0}, gloo_calls{0},
      direct_collectives{0}, hierarchical_all_gathers{0}, hierarchical_reduce_scatters{0};
} g_stats;

struct Job {
  std::shared_ptr<CollState> st;
  std::vector<Staged> bufs;
  bool staged = false;
  bool collective = false;  // on lane 0 (not a send or receive)
  int device = 0;
  tpu_dist_comm_t* comm = nullptr;
  // runs the collective on the buffers' addresses (bufs order)
  std::function<tpu_status_t(tpu_dist_comm_t*, const std::vector<void*>&)> body;
};

tpu_status_t run_job(void* p) {
  Job* j = static_cast<Job*>(p);
  const tpu_target_t* tg = tpu_target_get();
  std::vector<void*> ptrs(j->bufs.size());
  tpu_status_t s = TPU_OK;
  for (size_t i = 0; i < j->bufs.size() && !s; i++) {
    Staged& b = j->bufs[i];
    if (!j->staged) {
      ptrs[i] = b.dev;
      continue;
    }
    b.host.resize(b.bytes());
    ptrs[i] = b.host.data();
    if (b.read && b.bytes())
      s = tg->iface->copy_d2h(tg->ctx, j->device, b.host.data(), b.dev, b.bytes());
  }
  // collectives (lane 0) and their direct copies, counted on their own thread
  const uint64_t direct0 = j->collective ? tpu_dist_comm_direct_count(j->comm) : 0;
  if (!s) s = j->body(j->comm, ptrs);
  if (j->collective)
    g_stats.direct_collectives += (int64_t)(tpu_dist_comm_direct_count(j->comm) - direct0);
  for (size_t i = 0; i < j->bufs.size() && !s && j->staged; i++) {
    Staged& b = j->bufs[i];
    if (b.write && b.bytes())
      s = tg->iface->copy_h2d(tg->ctx, j->device, b.dev, b.host.data(), b.bytes());
  }
  {
    std::lock_guard<std::mutex> g(j->st->mu);
    j->st->done = true;
    if (s) j->st->error = tpu_status_message(s);
  }
  j->st->cv.notify_all();
  return s;  // also the stream's error: a collective nobody waits for still raises at a sync
}

void destroy_job(void* p) { delete static_cast<Job*>(p); }
tpu_status_t run_job_here(const void* p) { return run_job(const_cast<void*>(p)); }

// A collective of at most TORCH_TPU_DIST_INLINE_MAX_BYTES (default 2 MiB, its
// buffers' bytes together) whose current and communication streams are both
// idle runs on the calling thread: nothing is queued before it, so the order
// is the same, and it takes less than handing it to the stream's worker and
// back (the caller would wait for it in wait() anyway). On an idle 2-core
// machine the hand-off was most of a 1-2 MiB collective's time: inline, 1 MiB
// all_reduce went from 6x to 10x Gloo's bus bandwidth (bench/collectives.py).
// Larger ones stay on the worker: back to back, the caller then queues the
// next while the workers run this one (with every size inline, 1 MiB
// all_gathers back to back took about 3x longer on a loaded machine).
size_t inline_max_bytes() {
  static const size_t v = [] {
    const char* e = std::getenv("TORCH_TPU_DIST_INLINE_MAX_BYTES");
    return e && *e ? (size_t)std::strtoull(e, nullptr, 10) : (size_t)2 << 20;
  }();
  return v;
}

class TpuWork final : public c10d::Work {
 public:
  TpuWork(int rank, OpType type, const char* title, std::shared_ptr<CollState> st,
          c10::DeviceIndex device, int64_t comm_stream, tpu_event_t* ev,
          std::vector<at::Tensor> outputs)
      : Work(rank, type, title),
        st_(std::move(st)),
        device_(device),
        comm_stream_(comm_stream),
        ev_(ev),
        outputs_(std::move(outputs)) {
    std::vector<c10::Device> devs{c10::Device(kTpu, device)};
    fut_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                   devs);
    // complete now, with the events on the communication stream
    c10::StreamGuard guard(
        c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, device), comm_stream));
    fut_->markCompleted(c10::IValue(outputs_));
  }
  ~TpuWork() override { tpu_event_destroy(ev_); }

  bool isCompleted() override {
    std::lock_guard<std::mutex> g(st_->mu);
    return st_->done;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(st_->mu);
    return st_->done && st_->error.empty();
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(st_->mu);
    if (st_->error.empty()) return nullptr;
    return std::make_exception_ptr(std::runtime_error(st_->error));
  }
  std::vector<at::Tensor> result() override { return outputs_; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::string err;
    {
      std::unique_lock<std::mutex> lk(st_->mu);
      auto ready = [&] { return st_->done; };
      if (timeout == kNoTimeout || timeout.count() <= 0) {
        st_->cv.wait(lk, ready);
      } else if (!st_->cv.wait_for(lk, timeout, ready)) {
        C10_THROW_ERROR(DistBackendError, "tpu_dist: Work::wait timed out after " +
                                              std::to_string(timeout.count()) + " ms");
      }
      err = st_->error;
    }
    if (!err.empty()) {
      // the stream holds the same error: take it, so that it is raised once
      tpu_status_t s = tpu_stream_synchronize(tpu_stream_get(device_, comm_stream_));
      if (s) tpu_status_free(s);
      C10_THROW_ERROR(DistBackendError, err);
    }
    check(tpu_stream_wait_event(current_stream(device_), ev_));
    return true;
  }
  void synchronize() override { wait(kNoTimeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }

 private:
  std::shared_ptr<CollState> st_;
  c10::DeviceIndex device_;
  int64_t comm_stream_;
  tpu_event_t* ev_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

// What ran where, for tests and benchmarks (torch_tpu._C._tpu_dist_stats()).


class TpuDistBackend final : public c10d::Backend {
 public:
  // local_ranks: empty when every rank is on this host; otherwise the global
  // ranks on this host (the first is its leader), with `gloo_all` a Gloo group
  // of all ranks and `gloo_leaders` one of the hosts' leaders (this rank's when
  // it leads, else null). `host_order`: when every host has the same number
  // of ranks, all ranks host by host (host h's ranks, ascending, are entries
  // h * L .. h * L + L - 1; hosts in the order of their first rank), else
  // empty. Hierarchical gathers need it; when it is 0, 1, ..., W - 1 (as
  // torchrun numbers ranks) host h's pieces of a gathered or scattered tensor
  // are its block h and need no reordering.
  TpuDistBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout, std::vector<int64_t> local_ranks,
                 c10::intrusive_ptr<c10d::Backend> gloo_all,
                 c10::intrusive_ptr<c10d::Backend> gloo_leaders, std::vector<int64_t> host_order)
      : Backend(rank, size),
        gloo_all_(std::move(gloo_all)),
        gloo_leaders_(std::move(gloo_leaders)) {
    ensure_runtime();
    multi_ = !local_ranks.empty();
    int local_rank = rank, local_size = size;
    std::string key = "tpu_dist/segment";
    if (multi_) {
      TORCH_CHECK(gloo_all_, "tpu_dist: ranks on several hosts need a Gloo group");
      local_size = (int)local_ranks.size();
      local_rank = (int)(std::find(local_ranks.begin(), local_ranks.end(), rank) -
                         local_ranks.begin());
      TORCH_CHECK(local_rank < local_size, "tpu_dist: rank ", rank, " is not among its host's");
      key += "/" + std::to_string(local_ranks[0]);
      local_size_ = local_size;
      local_rank_ = local_rank;
      if ((int)host_order.size() == size && size % local_size == 0) {
        auto at = std::find(host_order.begin(), host_order.end(), local_ranks[0]);
        const int64_t first = at - host_order.begin();
        TORCH_CHECK(at != host_order.end() && first % local_size == 0 &&
                        std::equal(local_ranks.begin(), local_ranks.end(), at),
                    "tpu_dist: this host's ranks are not one block of the host order");
        hier_gathers_ = true;
        host_ = (int)(first / local_size);
        for (int64_t i = 0; i < size; i++)
          if (host_order[i] != i) {  // not host by host: gathers reorder the blocks
            order_.assign(host_order.begin(), host_order.end());
            break;
          }
      }
    }
    std::string name;
    if (local_rank == 0) {
      char buf[96];
      tpu_dist_make_name(buf, sizeof buf);
      name = buf;
      store->set(key, name);
    } else {
      auto v = store->get(key);
      name.assign(v.begin(), v.end());
    }
    tpu_dist_options_t o = {};
    o.timeout_ms = timeout.count() > 0 ? timeout.count() : 0;
    check(tpu_dist_comm_create(name.c_str(), local_rank, local_size, &o, &comm_));
  }
  ~TpuDistBackend() override {
    // queued collectives hold the communicator: let them finish first
    for (auto& kv : streams_) {
      tpu_stream_t* s = tpu_stream_get(kv.first.first, kv.second);
      if (s) {
        tpu_status_t st = tpu_stream_synchronize(s);
        if (st) tpu_status_free(st);
      }
    }
    tpu_dist_comm_destroy(comm_);
  }

  const std::string getBackendName() const override { return "tpu_dist"; }
  bool supportsCoalescing() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    if (timeout.count() > 0) tpu_dist_comm_set_timeout(comm_, timeout.count());
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                          const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = one(tensors, "broadcast");
    const int root = (int)opts.rootRank;
    return launch("broadcast", OpType::BROADCAST, {{t, getRank() == root, true}}, {t},
                  [m = meta(t), root](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_broadcast(c, p[0], m.n, m.dt, root);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g.broadcast(v, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = one(tensors, "all_reduce");
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    if (!multi_)
      return launch("all_reduce", OpType::ALLREDUCE, {{t}}, {t},
                    [m = meta(t), op, f](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                      return tpu_dist_all_reduce(c, p[0], m.n, m.dt, op, f);
                    });
    // Across hosts, hierarchically: reduce to the host's leader over shared memory,
    // all_reduce between the leaders with Gloo, broadcast back over shared memory.
    // AVG: each input scaled by 1 / size first (floats), then sums.
    TORCH_CHECK(op != TPU_DIST_AVG || t.is_floating_point(),
                "tpu_dist all_reduce: AVG across hosts needs a floating-point tensor, got ",
                t.scalar_type());
    tpu_dist_redop_t intra = op;
    double fi = f;
    if (op == TPU_DIST_AVG) {
      intra = TPU_DIST_PREMUL_SUM;
      fi = 1.0 / getSize();
    }
    c10d::AllreduceOptions lo;
    lo.reduceOp = (op == TPU_DIST_AVG || op == TPU_DIST_PREMUL_SUM)
                      ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                      : opts.reduceOp;
    return launch(
        "all_reduce", OpType::ALLREDUCE, {{t}}, {t},
        [m = meta(t), intra, fi, lo, shape = t.sizes().vec(), type = t.scalar_type(),
         leaders = gloo_leaders_](tpu_dist_comm_t* c, const std::vector<void*>& p) -> tpu_status_t {
          g_stats.hierarchical_all_reduces++;
          TPU_RETURN_IF_ERROR(tpu_dist_reduce(c, p[0], m.n, m.dt, intra, fi, 0));
          if (leaders) {  // this rank leads its host
            try {
              std::vector<at::Tensor> v{
                  at::from_blob(p[0], shape, at::TensorOptions().dtype(type))};
              leaders->allreduce(v, lo)->wait();
            } catch (const std::exception& e) {
              std::string why = std::string("all_reduce between hosts (Gloo): ") + e.what();
              tpu_dist_comm_abort(c, why.c_str());  // this host's ranks wait in the broadcast
              return TPU_ERR(INTERNAL, "tpu_dist %s", why.c_str());
            }
          }
          return tpu_dist_broadcast(c, p[0], m.n, m.dt, 0);
        });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "tpu_dist all_reduce_coalesced: no tensors");
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    std::vector<Buf> bufs;
    for (auto& t : tensors) bufs.push_back({checked(t, "all_reduce_coalesced")});
    std::vector<at::Tensor> ts = tensors;
    return launch("all_reduce_coalesced", OpType::COALESCED, std::move(bufs), ts,
                  [ms = metas(ts), op, f](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    for (size_t i = 0; i < ms.size(); i++)
                      TPU_RETURN_IF_ERROR(
                          tpu_dist_all_reduce(c, p[i], ms[i].n, ms[i].dt, op, f));
                    return TPU_OK;
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g.allreduce_coalesced(v, opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                       const c10d::ReduceOptions& opts) override {
    const at::Tensor t = one(tensors, "reduce");
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    const int root = (int)opts.rootRank;
    return launch("reduce", OpType::REDUCE, {{t, true, getRank() == root}}, {t},
                  [m = meta(t), op, f, root](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_reduce(c, p[0], m.n, m.dt, op, f, root);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g.reduce(v, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    const at::Tensor in = one(inputs, "all_gather");
    TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(),
                "tpu_dist all_gather: expected one list of ", getSize(), " output tensors");
    std::vector<Buf> bufs{{in, true, false}};
    for (auto& o : outputs[0]) bufs.push_back({same_as(o, in, "all_gather"), false, true});
    const int W = getSize();
    return launch("all_gather", OpType::ALLGATHER, std::move(bufs), outputs[0],
                  [m = meta(in), W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_all_gather(c, p[0], &p[1], m.n, m.dt);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    std::vector<at::Tensor> in{v[0]};
                    std::vector<std::vector<at::Tensor>> out{
                        std::vector<at::Tensor>(v.begin() + 1, v.end())};
                    return g.allgather(out, in, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                const c10d::AllgatherOptions& opts) override {
    checked(in, "all_gather_into_tensor");
    checked(out, "all_gather_into_tensor");
    check_split(out, in, "all_gather_into_tensor");
    const int W = getSize();
    if (multi_ && hier_gathers_)
      return launch("all_gather_into_tensor", OpType::_ALLGATHER_BASE,
                    {{in, true, false}, {out, false, true}}, {out},
                    [m = meta(in), hi = hier(), type = in.scalar_type()](
                        tpu_dist_comm_t* c, const std::vector<void*>& p) {
                      return hier_all_gather(c, hi, p[0], p[1], m, type);
                    });
    return launch("all_gather_into_tensor", OpType::_ALLGATHER_BASE,
                  {{in, true, false}, {out, false, true}}, {out},
                  [m = meta(in), W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    const size_t piece = (size_t)m.n * m.es;
                    std::vector<void*> outs(W);
                    for (int i = 0; i < W; i++) outs[i] = (unsigned char*)p[1] + i * piece;
                    return tpu_dist_all_gather(c, p[0], outs.data(), m.n, m.dt);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g._allgather_base(v[1], v[0], opts); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(),
                "tpu_dist all_gather_into_tensor_coalesced: ", inputs.size(), " inputs and ",
                outputs.size(), " outputs");
    std::vector<Buf> bufs;
    for (size_t i = 0; i < inputs.size(); i++) {
      checked(inputs[i], "all_gather_into_tensor_coalesced");
      checked(outputs[i], "all_gather_into_tensor_coalesced");
      check_split(outputs[i], inputs[i], "all_gather_into_tensor_coalesced");
      bufs.push_back({inputs[i], true, false});
      bufs.push_back({outputs[i], false, true});
    }
    std::vector<at::Tensor> ins = inputs;
    const int W = getSize();
    if (multi_ && hier_gathers_)
      return launch("all_gather_into_tensor_coalesced", OpType::COALESCED, std::move(bufs),
                    outputs,
                    [ms = metas(ins), hi = hier(), types = types_of(ins)](
                        tpu_dist_comm_t* c, const std::vector<void*>& p) {
                      for (size_t k = 0; k < ms.size(); k++)
                        TPU_RETURN_IF_ERROR(
                            hier_all_gather(c, hi, p[2 * k], p[2 * k + 1], ms[k], types[k]));
                      return TPU_OK;
                    });
    return launch("all_gather_into_tensor_coalesced", OpType::COALESCED, std::move(bufs), outputs,
                  [ms = metas(ins), W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    for (size_t k = 0; k < ms.size(); k++) {
                      const size_t piece = (size_t)ms[k].n * ms[k].es;
                      std::vector<void*> outs(W);
                      for (int i = 0; i < W; i++) outs[i] = (unsigned char*)p[2 * k + 1] + i * piece;
                      TPU_RETURN_IF_ERROR(tpu_dist_all_gather(c, p[2 * k], outs.data(),
                                                              ms[k].n, ms[k].dt));
                    }
                    return TPU_OK;
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    c10::intrusive_ptr<c10d::Work> w;
                    for (size_t k = 0; k + 1 < v.size(); k += 2) {
                      if (w) w->wait();
                      w = g._allgather_base(v[k + 1], v[k], opts);
                    }
                    return w;
                  });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(),
                "tpu_dist all_gather_coalesced: ", inputs.size(), " inputs and ", outputs.size(),
                " output lists");
    std::vector<Buf> bufs;
    std::vector<at::Tensor> ins = inputs, flat;
    const int W = getSize();
    for (size_t k = 0; k < inputs.size(); k++) {
      checked(inputs[k], "all_gather_coalesced");
      TORCH_CHECK((int)outputs[k].size() == W, "tpu_dist all_gather_coalesced: output list ", k,
                  " has ", outputs[k].size(), " tensors, expected ", W);
      bufs.push_back({inputs[k], true, false});
      for (auto& o : outputs[k]) {
        bufs.push_back({same_as(o, inputs[k], "all_gather_coalesced"), false, true});
        flat.push_back(o);
      }
    }
    return launch("all_gather_coalesced", OpType::COALESCED, std::move(bufs), flat,
                  [ms = metas(ins), W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    for (size_t k = 0; k < ms.size(); k++) {
                      const size_t at = k * (W + 1);
                      TPU_RETURN_IF_ERROR(tpu_dist_all_gather(c, p[at], &p[at + 1],
                                                              ms[k].n, ms[k].dt));
                    }
                    return TPU_OK;
                  },
                  [opts, W = getSize()](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    c10::intrusive_ptr<c10d::Work> w;
                    for (size_t k = 0; k < v.size(); k += W + 1) {
                      if (w) w->wait();
                      std::vector<at::Tensor> in{v[k]};
                      std::vector<std::vector<at::Tensor>> out{
                          std::vector<at::Tensor>(v.begin() + k + 1, v.begin() + k + 1 + W)};
                      w = g.allgather(out, in, opts);
                    }
                    return w;
                  });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::GatherOptions& opts) override {
    const at::Tensor in = one(inputs, "gather");
    const int root = (int)opts.rootRank, W = getSize();
    const bool is_root = getRank() == root;
    std::vector<Buf> bufs{{in, true, false}};
    std::vector<at::Tensor> outs;
    if (is_root) {
      TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == W,
                  "tpu_dist gather: the root expects one list of ", W, " output tensors");
      for (auto& o : outputs[0]) bufs.push_back({same_as(o, in, "gather"), false, true});
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                  "tpu_dist gather: only the root takes output tensors");
    }
    return launch("gather", OpType::GATHER, std::move(bufs), outs,
                  [m = meta(in), root, is_root](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_gather(c, p[0], is_root ? &p[1] : nullptr, m.n,
                                           m.dt, root);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    std::vector<at::Tensor> in{v[0]};
                    std::vector<std::vector<at::Tensor>> outs;
                    if (v.size() > 1) outs.emplace_back(v.begin() + 1, v.end());
                    return g.gather(outs, in, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                        std::vector<std::vector<at::Tensor>>& inputs,
                                        const c10d::ScatterOptions& opts) override {
    const at::Tensor out = one(outputs, "scatter");
    const int root = (int)opts.rootRank, W = getSize();
    const bool is_root = getRank() == root;
    std::vector<Buf> bufs{{out, false, true}};
    if (is_root) {
      TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == W,
                  "tpu_dist scatter: the root expects one list of ", W, " input tensors");
      for (auto& i : inputs[0]) bufs.push_back({same_as(i, out, "scatter"), true, false});
    } else {
      TORCH_CHECK(inputs.empty() || inputs[0].empty(),
                  "tpu_dist scatter: only the root takes input tensors");
    }
    return launch("scatter", OpType::SCATTER, std::move(bufs), {out},
                  [m = meta(out), root, is_root](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_scatter(c, is_root ? (const void* const*)&p[1] : nullptr,
                                            p[0], m.n, m.dt, root);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    std::vector<at::Tensor> out{v[0]};
                    std::vector<std::vector<at::Tensor>> ins;
                    if (v.size() > 1) ins.emplace_back(v.begin() + 1, v.end());
                    return g.scatter(out, ins, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                               std::vector<std::vector<at::Tensor>>& inputs,
                                               const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = one(outputs, "reduce_scatter");
    const int W = getSize();
    TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == W,
                "tpu_dist reduce_scatter: expected one list of ", W, " input tensors");
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    std::vector<Buf> bufs{{out, false, true}};
    for (auto& i : inputs[0]) bufs.push_back({same_as(i, out, "reduce_scatter"), true, false});
    return launch("reduce_scatter", OpType::REDUCE_SCATTER, std::move(bufs), {out},
                  [m = meta(out), op, f](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_reduce_scatter(c, (const void* const*)&p[1], p[0],
                                                   m.n, m.dt, op, f);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    std::vector<at::Tensor> out{v[0]};
                    std::vector<std::vector<at::Tensor>> ins{
                        std::vector<at::Tensor>(v.begin() + 1, v.end())};
                    return g.reduce_scatter(out, ins, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    checked(in, "reduce_scatter_tensor");
    checked(out, "reduce_scatter_tensor");
    check_split(in, out, "reduce_scatter_tensor");
    if (multi_ && hier_gathers_) {
      tpu_dist_redop_t intra;
      double fi;
      c10d::ReduceScatterOptions lo = opts;
      hier_ops("reduce_scatter_tensor", out, opts.reduceOp, &intra, &fi, &lo.reduceOp);
      return launch("reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE,
                    {{out, false, true}, {in, true, false}}, {out},
                    [m = meta(out), hi = hier(), type = out.scalar_type(), intra, fi, lo](
                        tpu_dist_comm_t* c, const std::vector<void*>& p) {
                      return hier_reduce_scatter(c, hi, p[0], p[1], m, type, intra, fi, lo);
                    });
    }
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    const int W = getSize();
    return launch("reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE,
                  {{out, false, true}, {in, true, false}}, {out},
                  [m = meta(out), op, f, W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return reduce_scatter_flat(c, p[0], p[1], m, W, op, f);
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g._reduce_scatter_base(v[0], v[1], opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(),
                "tpu_dist reduce_scatter_tensor_coalesced: ", inputs.size(), " inputs and ",
                outputs.size(), " outputs");
    double f;
    const tpu_dist_redop_t op = to_redop(opts.reduceOp, &f);
    std::vector<Buf> bufs;
    for (size_t i = 0; i < inputs.size(); i++) {
      checked(inputs[i], "reduce_scatter_tensor_coalesced");
      checked(outputs[i], "reduce_scatter_tensor_coalesced");
      check_split(inputs[i], outputs[i], "reduce_scatter_tensor_coalesced");
      bufs.push_back({outputs[i], false, true});
      bufs.push_back({inputs[i], true, false});
    }
    std::vector<at::Tensor> outs = outputs;
    const int W = getSize();
    if (multi_ && hier_gathers_) {
      tpu_dist_redop_t intra;
      double fi;
      c10d::ReduceScatterOptions lo = opts;
      hier_ops("reduce_scatter_tensor_coalesced", outs[0], opts.reduceOp, &intra, &fi,
               &lo.reduceOp);
      for (auto& t : outs)
        TORCH_CHECK(opts.reduceOp.op_ != c10d::ReduceOp::AVG || t.is_floating_point(),
                    "tpu_dist reduce_scatter_tensor_coalesced: AVG across hosts needs "
                    "floating-point tensors, got ", t.scalar_type());
      return launch("reduce_scatter_tensor_coalesced", OpType::COALESCED, std::move(bufs),
                    outputs,
                    [ms = metas(outs), hi = hier(), types = types_of(outs), intra, fi, lo](
                        tpu_dist_comm_t* c, const std::vector<void*>& p) {
                      for (size_t k = 0; k < ms.size(); k++)
                        TPU_RETURN_IF_ERROR(hier_reduce_scatter(c, hi, p[2 * k], p[2 * k + 1],
                                                                ms[k], types[k], intra, fi, lo));
                      return TPU_OK;
                    });
    }
    return launch("reduce_scatter_tensor_coalesced", OpType::COALESCED, std::move(bufs), outputs,
                  [ms = metas(outs), op, f, W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    for (size_t k = 0; k < ms.size(); k++)
                      TPU_RETURN_IF_ERROR(
                          reduce_scatter_flat(c, p[2 * k], p[2 * k + 1], ms[k], W, op, f));
                    return TPU_OK;
                  },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    c10::intrusive_ptr<c10d::Work> w;
                    for (size_t k = 0; k + 1 < v.size(); k += 2) {
                      if (w) w->wait();
                      w = g._reduce_scatter_base(v[k], v[k + 1], opts);
                    }
                    return w;
                  });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                              std::vector<int64_t>& out_splits,
                                              std::vector<int64_t>& in_splits,
                                              const c10d::AllToAllOptions& opts) override {
    checked(in, "all_to_all_single");
    checked(out, "all_to_all_single");
    TORCH_CHECK(in.scalar_type() == out.scalar_type(), "tpu_dist all_to_all_single: input is ",
                in.scalar_type(), ", output ", out.scalar_type());
    const int W = getSize();
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      std::vector<int64_t> c(W);
      const int64_t rows = t.dim() ? t.size(0) : 1;
      const int64_t per_row = rows ? t.numel() / rows : 0;
      if (splits.empty()) {
        TORCH_CHECK(rows % W == 0, "tpu_dist all_to_all_single: the ", which, "'s ", rows,
                    " rows do not split evenly over ", W, " ranks");
        for (int i = 0; i < W; i++) c[i] = rows / W * per_row;
      } else {
        TORCH_CHECK((int)splits.size() == W, "tpu_dist all_to_all_single: ", splits.size(), " ",
                    which, " split sizes for ", W, " ranks");
        int64_t sum = 0;
        for (int i = 0; i < W; i++) {
          c[i] = splits[i] * per_row;
          sum += splits[i];
        }
        TORCH_CHECK(sum == rows, "tpu_dist all_to_all_single: the ", which,
                    " split sizes add up to ", sum, ", the tensor has ", rows, " rows");
      }
      return c;
    };
    const std::vector<int64_t> inc = counts(in, in_splits, "input");
    const std::vector<int64_t> outc = counts(out, out_splits, "output");
    return launch("all_to_all_single", OpType::ALLTOALL_BASE,
                  {{in, true, false}, {out, false, true}}, {out},
                  [m = meta(in), inc, outc, W](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    std::vector<const void*> ins(W);
                    std::vector<void*> outs(W);
                    const size_t es = m.es;
                    int64_t io = 0, oo = 0;
                    for (int i = 0; i < W; i++) {
                      ins[i] = (const unsigned char*)p[0] + io * es;
                      outs[i] = (unsigned char*)p[1] + oo * es;
                      io += inc[i];
                      oo += outc[i];
                    }
                    return tpu_dist_all_to_all(c, ins.data(), inc.data(), outs.data(),
                                               outc.data(), m.dt);
                  },
                  [opts, out_splits, in_splits](c10d::Backend& g, std::vector<at::Tensor>& v) mutable {
                    return g.alltoall_base(v[1], v[0], out_splits, in_splits, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                         std::vector<at::Tensor>& inputs,
                                         const c10d::AllToAllOptions& opts) override {
    const int W = getSize();
    TORCH_CHECK((int)inputs.size() == W && (int)outputs.size() == W, "tpu_dist all_to_all: ",
                inputs.size(), " inputs and ", outputs.size(), " outputs for ", W, " ranks");
    std::vector<Buf> bufs;
    std::vector<int64_t> inc(W), outc(W);
    for (int i = 0; i < W; i++) {
      checked(inputs[i], "all_to_all");
      TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type(),
                  "tpu_dist all_to_all: inputs of several dtypes");
      bufs.push_back({inputs[i], true, false});
      inc[i] = inputs[i].numel();
    }
    for (int i = 0; i < W; i++) {
      checked(outputs[i], "all_to_all");
      TORCH_CHECK(outputs[i].scalar_type() == inputs[0].scalar_type(),
                  "tpu_dist all_to_all: output ", i, " is ", outputs[i].scalar_type(),
                  ", the inputs are ", inputs[0].scalar_type());
      bufs.push_back({outputs[i], false, true});
      outc[i] = outputs[i].numel();
    }
    const tpu_dtype_t d = dt(inputs[0]);
    return launch("all_to_all", OpType::ALLTOALL, std::move(bufs), outputs,
                  [inc, outc, W, d](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_all_to_all(c, (const void* const*)&p[0], inc.data(), &p[W],
                                               outc.data(), d);
                  },
                  [opts, W](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    std::vector<at::Tensor> ins(v.begin(), v.begin() + W);
                    std::vector<at::Tensor> outs(v.begin() + W, v.end());
                    return g.alltoall(outs, ins, opts);
                  });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    ensure_runtime();
    c10::DeviceIndex d = current_device();
    if (opts.device && opts.device->type() == kTpu && opts.device->index() >= 0)
      d = opts.device->index();
    else if (!opts.device_ids.empty())
      d = (c10::DeviceIndex)opts.device_ids[0];
    return launch_on(d, "barrier", OpType::BARRIER, {}, {},
                     [](tpu_dist_comm_t* c, const std::vector<void*>&) {
                       return tpu_dist_barrier(c);
                     },
                  [opts](c10d::Backend& g, std::vector<at::Tensor>& v) { return g.barrier(opts); });
  }

  // Point-to-point: each peer and direction has its own stream, so that a send
  // waiting for its receiver never holds up a receive (a ring exchange) or the
  // collectives; the order of the calls is kept per peer and direction.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                     int tag) override {
    const at::Tensor t = one(tensors, "send");
    TORCH_CHECK(t.is_contiguous(), "tpu_dist send: the tensor must be contiguous");
    return launch("send", OpType::SEND, {{t, true, false}}, {t},
                  [m = meta(t), dst, tag](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_send(c, p[0], m.n * (int64_t)m.es, dst, tag);
                  },
                  [dst, tag](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    return g.send(v, dst, tag);
                  },
                  1 + 2 * dst);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                     int tag) override {
    const at::Tensor t = one(tensors, "recv");
    TORCH_CHECK(t.is_contiguous(), "tpu_dist recv: the tensor must be contiguous");
    return launch("recv", OpType::RECV, {{t, false, true}}, {t},
                  [m = meta(t), src, tag](tpu_dist_comm_t* c, const std::vector<void*>& p) {
                    return tpu_dist_recv(c, p[0], m.n * (int64_t)m.es, src, tag);
                  },
                  [src, tag](c10d::Backend& g, std::vector<at::Tensor>& v) {
                    return g.recv(v, src, tag);
                  },
                  2 + 2 * src);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    // as NCCL's: every receive names its source (the transport's channels are
    // per pair, and a wildcard would race the named receives of that pair)
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "tpu_dist recv: a receive from any source is not supported (as "
                                "with nccl); pass src=");
  }

 private:
  static constexpr int kMaxDevices = 64;
  using Body = std::function<tpu_status_t(tpu_dist_comm_t*, const std::vector<void*>&)>;
  using GlooCall =
      std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, std::vector<at::Tensor>&)>;

  // The body that runs `call` on the Gloo group of all ranks: CPU tensors over
  // the addresses (no Python object: safe to release on the worker).
  Body via_gloo(const char* what, const std::vector<Buf>& bufs, GlooCall call) {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<c10::ScalarType> types;
    for (auto& b : bufs) {
      shapes.push_back(b.t.sizes().vec());
      types.push_back(b.t.scalar_type());
    }
    return [what, shapes, types, call = std::move(call), g = gloo_all_](
               tpu_dist_comm_t* c, const std::vector<void*>& p) -> tpu_status_t {
      g_stats.gloo_calls++;
      try {
        std::vector<at::Tensor> v;
        for (size_t i = 0; i < shapes.size(); i++)
          v.push_back(at::from_blob(p[i], shapes[i], at::TensorOptions().dtype(types[i])));
        auto w = call(*g, v);
        if (w) w->wait();
      } catch (const std::exception& e) {
        return TPU_ERR(INTERNAL, "tpu_dist %s (Gloo, between hosts): %s", what, e.what());
      }
      return TPU_OK;
    };
  }

  // ---- across hosts: hierarchical gathers and reductions -------------------
  // What a queued hierarchical collective needs to know of the layout: L ranks
  // per host, this rank's place among them (lr), its host h of H, and the
  // leaders' Gloo group (this rank's when it leads, else null).
  // `order`: the ranks host by host when that is not 0 .. W - 1, else empty.
  struct Hier {
    int L, lr, h, H;
    c10::intrusive_ptr<c10d::Backend> leaders;
    std::vector<int64_t> order;
  };
  Hier hier() const {
    return {local_size_, local_rank_, host_, getSize() / local_size_, gloo_leaders_, order_};
  }

  // A leader's Gloo call failed: its host's ranks wait for it in the next step
  // over shared memory, so the segment is aborted and they fail too.
  static tpu_status_t leaders_failed(tpu_dist_comm_t* c, const char* what, const std::exception& e) {
    std::string why = std::string(what) + " between hosts (Gloo): " + e.what();
    tpu_dist_comm_abort(c, why.c_str());
    return TPU_ERR(INTERNAL, "tpu_dist %s", why.c_str());
  }

  // The op within a host and the one between the leaders of a hierarchical
  // reduction. Gloo has no AVG: each input is scaled by 1 / size and summed
  // (floats only); PREMUL_SUM scales within the host and sums between hosts.
  void hier_ops(const char* what, const at::Tensor& t, const c10d::ReduceOp& rop,
                tpu_dist_redop_t* intra, double* fi, c10d::ReduceOp* between) const {
    const tpu_dist_redop_t op = to_redop(rop, fi);
    TORCH_CHECK(op != TPU_DIST_AVG || t.is_floating_point(), "tpu_dist ", what,
                ": AVG across hosts needs a floating-point tensor, got ", t.scalar_type());
    *intra = op;
    if (op == TPU_DIST_AVG) {
      *intra = TPU_DIST_PREMUL_SUM;
      *fi = 1.0 / getSize();
    }
    *between = (op == TPU_DIST_AVG || op == TPU_DIST_PREMUL_SUM)
                   ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                   : rop;
  }

  // all_gather_into_tensor across hosts: the host's pieces gathered into its
  // leader's output, where they form block h (shared memory); the blocks
  // exchanged between the leaders (Gloo, on CPU views); the whole result
  // broadcast to the host's ranks (shared memory). When ranks are not numbered
  // host by host, the leader gathers in host order into a staging tensor and
  // then puts each piece at its rank's place.
  static tpu_status_t hier_all_gather(tpu_dist_comm_t* c, const Hier& hi, const void* in,
                                      void* out, const Meta& m, c10::ScalarType type) {
    g_stats.hierarchical_all_gathers++;
    if (m.n == 0) return TPU_OK;
    const size_t piece = (size_t)m.n * m.es;
    const int64_t total = (int64_t)hi.H * hi.L * m.n;
    auto opt = at::TensorOptions().dtype(type);
    at::Tensor staged;
    unsigned char* host_major = (unsigned char*)out;
    if (!hi.order.empty() && hi.lr == 0) {
      staged = at::empty({total}, opt);
      host_major = (unsigned char*)staged.data_ptr();
    }
    unsigned char* block = host_major + (size_t)hi.h * hi.L * piece;
    std::vector<void*> outs(hi.L);
    for (int l = 0; l < hi.L; l++) outs[l] = block + l * piece;
    TPU_RETURN_IF_ERROR(tpu_dist_gather(c, in, hi.lr == 0 ? outs.data() : nullptr, m.n, m.dt, 0));
    if (hi.leaders) {
      try {
        at::Tensor all = at::from_blob(host_major, {total}, opt);
        at::Tensor mine = at::from_blob(block, {(int64_t)hi.L * m.n}, opt);
        hi.leaders->_allgather_base(all, mine)->wait();
      } catch (const std::exception& e) {
        return leaders_failed(c, "all_gather_into_tensor", e);
      }
    }
    if (staged.defined())
      for (size_t j = 0; j < hi.order.size(); j++)
        memcpy((unsigned char*)out + (size_t)hi.order[j] * piece, host_major + j * piece, piece);
    return tpu_dist_broadcast(c, out, total, m.dt, 0);
  }

  // reduce_scatter_tensor across hosts: the whole input reduced to the host's
  // leader (shared memory, into a copy: the input stays as it was), reduced
  // and scattered between the leaders (Gloo: leader h gets block h, the
  // outputs of its host's ranks), then scattered to the host's ranks (shared
  // memory).
  static tpu_status_t hier_reduce_scatter(tpu_dist_comm_t* c, const Hier& hi, void* out,
                                          const void* in, const Meta& o, c10::ScalarType type,
                                          tpu_dist_redop_t intra, double fi,
                                          const c10d::ReduceScatterOptions& between) {
    g_stats.hierarchical_reduce_scatters++;
    if (o.n == 0) return TPU_OK;
    const int64_t total = (int64_t)hi.H * hi.L * o.n;
    const size_t piece = (size_t)o.n * o.es;
    auto opt = at::TensorOptions().dtype(type);
    at::Tensor acc, part;
    void* buf = const_cast<void*>(in);  // a non-leader's input is only read
    if (hi.lr == 0) {
      acc = at::empty({total}, opt);
      memcpy(acc.data_ptr(), in, (size_t)total * o.es);
      buf = acc.data_ptr();
    }
    TPU_RETURN_IF_ERROR(tpu_dist_reduce(c, buf, total, o.dt, intra, fi, 0));
    std::vector<const void*> ins;
    if (hi.leaders) {
      if (!hi.order.empty()) {  // host h's ranks' pieces made block h, in host order
        at::Tensor reordered = at::empty({total}, opt);
        for (size_t j = 0; j < hi.order.size(); j++)
          memcpy((unsigned char*)reordered.data_ptr() + j * piece,
                 (const unsigned char*)acc.data_ptr() + (size_t)hi.order[j] * piece, piece);
        acc = reordered;
      }
      try {
        part = at::empty({(int64_t)hi.L * o.n}, opt);
        c10d::ReduceScatterOptions lo = between;
        hi.leaders->_reduce_scatter_base(part, acc, lo)->wait();
      } catch (const std::exception& e) {
        return leaders_failed(c, "reduce_scatter_tensor", e);
      }
      for (int l = 0; l < hi.L; l++) ins.push_back((const unsigned char*)part.data_ptr() + l * piece);
    }
    return tpu_dist_scatter(c, hi.lr == 0 ? ins.data() : nullptr, out, o.n, o.dt, 0);
  }

  static tpu_dtype_t dt(const at::Tensor& t) { return (tpu_dtype_t)t.scalar_type(); }

  static tpu_status_t reduce_scatter_flat(tpu_dist_comm_t* c, void* out, const void* in,
                                          const Meta& o, int W, tpu_dist_redop_t op, double f) {
    const size_t piece = (size_t)o.n * o.es;
    std::vector<const void*> ins(W);
    for (int i = 0; i < W; i++) ins[i] = (const unsigned char*)in + i * piece;
    return tpu_dist_reduce_scatter(c, ins.data(), out, o.n, o.dt, op, f);
  }
  static std::vector<c10::ScalarType> types_of(const std::vector<at::Tensor>& ts) {
    std::vector<c10::ScalarType> out;
    for (auto& t : ts) out.push_back(t.scalar_type());
    return out;
  }
  static std::vector<Meta> metas(const std::vector<at::Tensor>& ts) {
    std::vector<Meta> out;
    for (auto& t : ts) out.push_back(meta(t));
    return out;
  }

  const at::Tensor& checked(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.defined(), "tpu_dist ", what, ": undefined tensor");
    TORCH_CHECK(t.device().type() == kTpu, "tpu_dist ", what, ": tensors must be on tpu, got a ",
                t.device(), " tensor (use the gloo backend for cpu tensors: "
                "init_process_group(\"cpu:gloo,tpu:tpu_dist\"))");
    TORCH_CHECK(t.is_non_overlapping_and_dense(), "tpu_dist ", what,
                ": tensors must be dense (non-overlapping), got sizes ", t.sizes(), " strides ",
                t.strides());
    // (complex: the transport's reductions have no complex arithmetic yet)
    TORCH_CHECK(tpu_dtype_is_supported((int)t.scalar_type()) && !t.is_complex(), "tpu_dist ", what,
                ": dtype ", t.scalar_type(), " is not supported");
    return t;
  }
  const at::Tensor& one(const std::vector<at::Tensor>& ts, const char* what) const {
    TORCH_CHECK(ts.size() == 1, "tpu_dist ", what, ": expected one tensor per process, got ",
                ts.size());
    return checked(ts[0], what);
  }
  // a tensor that must match `ref` in dtype, size and layout
  const at::Tensor& same_as(const at::Tensor& t, const at::Tensor& ref, const char* what) const {
    checked(t, what);
    TORCH_CHECK(t.scalar_type() == ref.scalar_type() && t.numel() == ref.numel() &&
                    t.strides() == ref.strides(),
                "tpu_dist ", what, ": tensor of ", t.scalar_type(), " ", t.sizes(), " strides ",
                t.strides(), " does not match the ", ref.scalar_type(), " ", ref.sizes(),
                " strides ", ref.strides(), " it pairs with");
    TORCH_CHECK(t.device() == ref.device(), "tpu_dist ", what, ": tensors on ", t.device(),
                " and ", ref.device());
    return t;
  }
  // `big` holds size x `small` (same dtype and device)
  void check_split(const at::Tensor& big, const at::Tensor& small, const char* what) const {
    TORCH_CHECK(big.scalar_type() == small.scalar_type(), "tpu_dist ", what, ": ",
                big.scalar_type(), " and ", small.scalar_type(), " tensors");
    TORCH_CHECK(big.numel() == small.numel() * getSize(), "tpu_dist ", what, ": the tensor of ",
                big.numel(), " elements must hold ", getSize(), " x ", small.numel());
    TORCH_CHECK(big.device() == small.device(), "tpu_dist ", what, ": tensors on ", big.device(),
                " and ", small.device());
  }

  // whether the host can address device d's memory (else the work stages
  // through host copies); asked of the target once per device
  bool host_addressable(c10::DeviceIndex d) {
    auto it = addressable_.find((int)d);
    if (it != addressable_.end()) return it->second;
    const tpu_target_t* tg = tpu_target_get();
    tpu_target_device_props_t props = {};
    check(tg->iface->device_props(tg->ctx, d, &props));
    return addressable_[(int)d] = props.host_addressable;
  }

  int64_t comm_stream(c10::DeviceIndex d, int lane) {
    TORCH_CHECK(d >= 0 && d < kMaxDevices, "tpu_dist: device index ", d);
    auto key = std::make_pair((int)d, lane);
    auto it = streams_.find(key);
    if (it != streams_.end()) return it->second;
    int64_t id = 0;
    check(tpu_stream_create(d, &id));
    streams_[key] = id;
    return id;
  }

  c10::intrusive_ptr<c10d::Work> launch(const char* what, OpType type, std::vector<Buf> bufs,
                                        std::vector<at::Tensor> outputs, Body body,
                                        GlooCall gloo = nullptr, int lane = 0) {
    TORCH_CHECK(!bufs.empty(), "tpu_dist ", what, ": no tensors");
    const c10::DeviceIndex d = bufs[0].t.device().index();
    for (auto& b : bufs)
      TORCH_CHECK(b.t.device() == bufs[0].t.device(), "tpu_dist ", what, ": tensors on ",
                  bufs[0].t.device(), " and ", b.t.device());
    return launch_on(d, what, type, std::move(bufs), std::move(outputs), std::move(body),
                     std::move(gloo), lane);
  }

  // lane 0: the collectives' stream; 1 + 2 * peer: sends to peer; 2 + 2 * peer:
  // receives from it. With ranks on several hosts, `gloo` runs the operation on
  // the Gloo group of all ranks instead, on CPU views of the buffers (the host
  // copies on a target whose memory the host cannot address).
  c10::intrusive_ptr<c10d::Work> launch_on(c10::DeviceIndex d, const char* what, OpType type,
                                           std::vector<Buf> bufs, std::vector<at::Tensor> outputs,
                                           Body body, GlooCall gloo = nullptr, int lane = 0) {
    if (multi_ && gloo) {
      body = via_gloo(what, bufs, std::move(gloo));
    } else if (!multi_) {
      body = [b = std::move(body)](tpu_dist_comm_t* c, const std::vector<void*>& p) {
        g_stats.shm_collectives++;
        return b(c, p);
      };
    }
    ensure_runtime();
    std::lock_guard<std::mutex> g(mu_);  // one order of collectives per process
    if (tpu_get_eager_mode() == TPU_MODE_DEFER) materialize_device(d);
    const int64_t sid = comm_stream(d, lane);
    tpu_stream_t* comm = tpu_stream_get(d, sid);
    tpu_stream_t* cur = current_stream(d);
    auto job = std::make_unique<Job>();
    job->st = std::make_shared<CollState>();
    job->staged = !host_addressable(d);
    job->collective = lane == 0;
    job->device = d;
    job->comm = comm_;
    job->body = std::move(body);
    {
      PlaceholderUse use;
      for (auto& b : bufs) {
        Staged sb;
        sb.read = b.read;
        sb.write = b.write;
        sb.nbytes = (size_t)b.t.numel() * b.t.element_size();
        if (b.t.numel()) {
          void* p = b.t.data_ptr();
          if (tpu_is_lazy(p)) check(tpu_lazy_realize_on(p, comm, &p));
          sb.dev = p;
        }
        job->bufs.push_back(std::move(sb));
      }
    }
    bufs.clear();
    size_t bytes = 0;
    for (auto& b : job->bufs) bytes += b.nbytes;
    // the collective reads what the current stream has queued so far
    check(tpu_stream_wait_stream(comm, cur));
    auto st = job->st;
    if (lane == 0 && !multi_ && !job->staged && bytes <= inline_max_bytes() && tpu_stream_query(cur) &&
        tpu_stream_run_if_idle(comm, what, run_job_here, job.get())) {
      job.reset();  // ran here; its error (if any) is in st and on the stream
    } else {
    // `what` is a literal: it outlives the queued work. In Debug mode a queued
    // item is waited for at once; a send or receive must not be (its peer
    // operation may be this process's next call, or come after the peer's own
    // send: a ring).
    check((lane == 0 ? tpu_stream_enqueue : tpu_stream_enqueue_nowait)(comm, what, run_job,
                                                                      job.release(),
                                                                      destroy_job));
    }
    tpu_event_t* ev = nullptr;
    check(tpu_event_create(&ev));
    tpu_status_t rs = tpu_event_record(ev, comm);
    if (rs) {
      tpu_event_destroy(ev);
      check(rs);
    }
    return c10::make_intrusive<TpuWork>(getRank(), type, what, st, d, sid, ev,
                                        std::move(outputs));
  }

  tpu_dist_comm_t* comm_ = nullptr;
  std::mutex mu_;
  std::map<std::pair<int, int>, int64_t> streams_;  // (device, lane) -> stream id
  std::map<int, bool> addressable_;                 // device -> host-addressable memory
  bool multi_ = false;                              // ranks on several hosts
  bool hier_gathers_ = false;  // hosts of equal size: hierarchical gathers
  std::vector<int64_t> order_;  // ranks host by host, when that is not 0 .. W - 1
  int local_size_ = 0, local_rank_ = 0, host_ = 0;  // this host's ranks, this rank among them
  c10::intrusive_ptr<c10d::Backend> gloo_all_, gloo_leaders_;
};

}  // namespace

void add_dist_bindings(py::module& m) {
  m.def(
      "_create_tpu_dist_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, std::vector<int64_t> local_ranks,
         std::optional<c10::intrusive_ptr<c10d::Backend>> gloo_all,
         std::optional<c10::intrusive_ptr<c10d::Backend>> gloo_leaders,
         std::vector<int64_t> host_order)
          -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<TpuDistBackend>(
            store, rank, size, timeout, std::move(local_ranks),
            gloo_all ? *gloo_all : c10::intrusive_ptr<c10d::Backend>(),
            gloo_leaders ? *gloo_leaders : c10::intrusive_ptr<c10d::Backend>(),
            std::move(host_order));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("local_ranks") = std::vector<int64_t>{}, py::arg("gloo_all") = py::none(),
      py::arg("gloo_leaders") = py::none(), py::arg("host_order") = std::vector<int64_t>{},
      py::call_guard<py::gil_scoped_release>());
  // what ran where in this process: collectives over shared memory only (of
  // which direct_collectives copied straight between the ranks' buffers),
  // hierarchical all_reduces (shared memory + Gloo between hosts), Gloo calls
  m.def("_tpu_dist_stats", [] {
    py::dict d;
    d["shm_collectives"] = g_stats.shm_collectives.load();
    d["hierarchical_all_reduces"] = g_stats.hierarchical_all_reduces.load();
    d["gloo_calls"] = g_stats.gloo_calls.load();
    d["direct_collectives"] = g_stats.direct_collectives.load();
    d["hierarchical_all_gathers"] = g_stats.hierarchical_all_gathers.load();
    d["hierarchical_reduce_scatters"] = g_stats.hierarchical_reduce_scatters.load();
    return d;
  });
}

}  // namespace torch_tpu
