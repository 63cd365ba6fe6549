// The GPU communicators (DESIGN.md, "Strategies, as the executor runs them":
// the communicator works on its own stream so that collectives overlap
// compute).
//
// NcclCommunicator: NCCL on a dedicated, high-priority, non-blocking
// communication stream. Each collective is ordered after the compute stream
// (an event recorded there at issue, waited on by the communication stream),
// and its Work's wait() makes the compute stream wait for an event recorded
// after it; the host does not block (wait_host() does). The ncclUniqueId is
// made on rank 0 and reaches every rank through the host (MPI) communicator,
// which also serves the host-buffer calls. A watchdog thread polls
// ncclCommGetAsyncError and the oldest unfinished collective; on an error, or
// when that collective is older than comm_timeout_seconds(), it calls
// ncclCommAbort on every communicator and ends the job through the host
// communicator's abort(), naming the collective (the host communicator names
// the rank).
//
// StagedCommunicator ("CUDA with MPI"): a staging thread copies the device
// buffer to pinned host memory (after the compute stream's work so far), runs
// the host communicator's collective and copies the result back; wait()
// blocks the host until the copy back is done. Any number of ranks may share
// a device.
#include "nccl_communicator.hpp"

#include "dlplan/exec/comm_thread.hpp"
#include "device.hpp"

#include "dlplan/error.hpp"

#include <cuda_runtime_api.h>
#if defined(DLPLAN_HAVE_NCCL)
#include <nccl.h>
#endif
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dlplan::exec {
namespace cudart {
namespace {

using Buffers = std::vector<Span>;

enum class Op { all_reduce, reduce_scatter, all_gather, broadcast };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_reduce: return "all_reduce";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_gather: return "all_gather";
    case Op::broadcast: return "broadcast";
  }
  return "?";
}

// Checks the buffers on the caller (the same on every rank, before any
// traffic) and drops the empty ones.
Buffers validate(const Buffers& in, Op op, int group_size, int root, int rank) {
  Buffers out;
  for (const auto& b : in) {
    if (b.n < 0 || (b.n > 0 && b.data == nullptr))
      throw Error(std::string(op_name(op)) + ": bad buffer (count " + std::to_string(b.n) + ", rank " +
                  std::to_string(rank) + ")");
    if (b.dtype != DType::f32 && b.dtype != DType::bf16 && b.dtype != DType::f16)
      throw Error(std::string(op_name(op)) + ": " + to_string(b.dtype) + " buffers are not reduced (rank " +
                  std::to_string(rank) + ")");
    if ((op == Op::reduce_scatter || op == Op::all_gather) && b.n % group_size != 0)
      throw Error(std::string(op_name(op)) + ": " + std::to_string(b.n) +
                  " elements are not a multiple of the group size " + std::to_string(group_size) + " (rank " +
                  std::to_string(rank) + ")");
    if (b.n > 0) out.push_back(b);
  }
  if (op == Op::broadcast && (root < 0 || root >= group_size))
    throw Error("broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                std::to_string(group_size) + " (rank " + std::to_string(rank) + ")");
  return out;
}

int64_t total_bytes(const Buffers& b) {
  int64_t n = 0;
  for (const auto& x : b) n += x.bytes();
  return n;
}

// ---- CUDA with MPI: host staging ------------------------------------------------

class StagedCommunicator final : public GpuCommunicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, cudaStream_t compute)
      : host_(std::move(host)), device_(current_device()), compute_(compute) {
    DeviceGuard guard(device_);
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    thread_ = std::make_unique<comm::CommThread>();
  }

  ~StagedCommunicator() override {
    thread_.reset();  // runs what is queued, then joins
    (void)cudaSetDevice(device_);
    if (pinned_) (void)cudaFreeHost(pinned_);
    if (copy_) (void)cudaStreamDestroy(copy_);
    (void)cudaGetLastError();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }
  int local_size() const override { return host_->local_size(); }
  std::string name() const override { return host_->name() + "-staged"; }

  WorkHandle all_reduce_many(const Buffers& b, int group) override { return run(Op::all_reduce, b, group, 0); }
  WorkHandle reduce_scatter_many(const Buffers& b, int group) override {
    return run(Op::reduce_scatter, b, group, 0);
  }
  WorkHandle all_gather_many(const Buffers& b, int group) override { return run(Op::all_gather, b, group, 0); }

  void barrier() override {
    synchronize();
    host_->barrier();
  }
  void all_gather_bytes(const void* in, void* out, int64_t bytes) override { host_->all_gather_bytes(in, out, bytes); }
  void all_reduce_doubles(double* data, int64_t count) override { host_->all_reduce_doubles(data, count); }
  double busy_seconds() const override { return thread_->busy_seconds(); }
  int make_groups(int group_size) override { return host_->make_groups(group_size); }
  int make_strided_groups(int stride) override { return host_->make_strided_groups(stride); }
  int group_size(int group) const override { return host_->group_size(group); }
  int group_rank(int group) const override { return host_->group_rank(group); }
  [[noreturn]] void abort(const std::string& message) override {
    host_->abort(message);
    std::_Exit(1);  // not reached (GCC does not trust [[noreturn]] through a virtual call)
  }

  void synchronize() override {
    thread_->run_sync([] {});  // tasks run in order: every earlier one is done
  }
  Communicator& host() override { return *host_; }
  int device() const override { return device_; }
  void* compute_stream() const override { return compute_; }

 protected:
  WorkHandle run_all_reduce(Span data, int group) override { return run(Op::all_reduce, {data}, group, 0); }
  WorkHandle run_reduce_scatter(Span data, int group) override { return run(Op::reduce_scatter, {data}, group, 0); }
  WorkHandle run_all_gather(Span data, int group) override { return run(Op::all_gather, {data}, group, 0); }
  WorkHandle run_broadcast(Span data, int root, int group) override { return run(Op::broadcast, {data}, group, root); }

 private:
  WorkHandle run(Op op, const Buffers& in, int group, int root) {
    const int gsize = host_->group_size(group);
    const int grank = host_->group_rank(group);
    Buffers bufs = validate(in, op, gsize, root, host_->rank());
    if (bufs.empty()) return comm::completed_work();
    cudaEvent_t ready = nullptr;
    {
      DeviceGuard guard(device_);
      check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      const cudaError_t rc = cudaEventRecord(ready, compute_);
      if (rc != cudaSuccess) {
        (void)cudaEventDestroy(ready);
        check(rc, "cudaEventRecord (compute stream)");
      }
    }
    return thread_->submit([this, op, bufs = std::move(bufs), group, root, gsize, grank, ready] {
      struct EventGuard {
        cudaEvent_t e;
        ~EventGuard() { (void)cudaEventDestroy(e); }
      } event_guard{ready};
      DeviceGuard guard(device_);
      ensure_pinned(total_bytes(bufs));
      check(cudaStreamWaitEvent(copy_, ready, 0), "cudaStreamWaitEvent (copy stream)");
      // Each device buffer's twin in the pinned host buffer.
      std::vector<Span> host(bufs.size());
      int64_t off = 0;
      for (size_t i = 0; i < bufs.size(); ++i) {
        host[i] = Span{pinned_ + off, bufs[i].n, bufs[i].dtype};
        off += bufs[i].bytes();
      }
      auto copy = [this](Span dst, Span src, cudaMemcpyKind kind) {
        check(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()), kind, copy_), "cudaMemcpyAsync");
      };
      for (size_t i = 0; i < bufs.size(); ++i) {
        const int64_t shard = bufs[i].n / gsize, mine = int64_t{grank} * shard;
        if (op == Op::all_gather) copy(host[i].sub(mine, shard), bufs[i].sub(mine, shard), cudaMemcpyDeviceToHost);
        else if (op != Op::broadcast || grank == root) copy(host[i], bufs[i], cudaMemcpyDeviceToHost);
      }
      check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (device to host)");
      std::vector<WorkHandle> works;
      for (size_t i = 0; i < bufs.size(); ++i) {
        switch (op) {
          case Op::all_reduce: works.push_back(host_->all_reduce(host[i], group)); break;
          case Op::reduce_scatter: works.push_back(host_->reduce_scatter(host[i], group)); break;
          case Op::all_gather: works.push_back(host_->all_gather(host[i], group)); break;
          case Op::broadcast: works.push_back(host_->broadcast(host[i], root, group)); break;
        }
      }
      for (auto& w : works) w->wait();
      for (size_t i = 0; i < bufs.size(); ++i) {
        const int64_t shard = bufs[i].n / gsize, mine = int64_t{grank} * shard;
        if (op == Op::reduce_scatter) copy(bufs[i].sub(mine, shard), host[i].sub(mine, shard), cudaMemcpyHostToDevice);
        else if (op != Op::broadcast || grank != root) copy(bufs[i], host[i], cudaMemcpyHostToDevice);
      }
      check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (host to device)");
    });
  }

  // On the staging thread only.
  void ensure_pinned(int64_t bytes) {
    if (bytes <= pinned_bytes_) return;
    if (pinned_) check(cudaFreeHost(pinned_), "cudaFreeHost");
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    void* p = nullptr;
    check(cudaMallocHost(&p, static_cast<size_t>(bytes)), "cudaMallocHost (staging buffer)");
    pinned_ = static_cast<char*>(p);
    pinned_bytes_ = bytes;
  }

  std::unique_ptr<Communicator> host_;
  const int device_;
  const cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  char* pinned_ = nullptr;
  int64_t pinned_bytes_ = 0;
  std::unique_ptr<comm::CommThread> thread_;
};

#if defined(DLPLAN_HAVE_NCCL)

// ---- NCCL -------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

// A collective's events on the communication stream: start (after it waited
// for compute) and done; both time it (busy_seconds).
struct Events {
  cudaEvent_t start = nullptr, done = nullptr;
  Events() {
    check(cudaEventCreate(&start), "cudaEventCreate");
    const cudaError_t rc = cudaEventCreate(&done);
    if (rc != cudaSuccess) {
      (void)cudaEventDestroy(start);
      check(rc, "cudaEventCreate");
    }
  }
  ~Events() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(done);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

class NcclWork final : public GpuWork {
 public:
  NcclWork(std::shared_ptr<Events> ev, cudaStream_t compute, int device)
      : ev_(std::move(ev)), compute_(compute), device_(device) {}
  void wait() override {
    DeviceGuard guard(device_);
    check(cudaStreamWaitEvent(compute_, ev_->done, 0), "cudaStreamWaitEvent (compute waits for a collective)");
  }
  // A collective that never finishes is ended by the watchdog (the whole job).
  void wait_host() override {
    DeviceGuard guard(device_);
    check(cudaEventSynchronize(ev_->done), "cudaEventSynchronize (a collective)");
  }

 private:
  std::shared_ptr<Events> ev_;
  cudaStream_t compute_;
  int device_;
};

struct NcclGroup {
  ncclComm_t comm = nullptr;
  int size = 1;
  int rank = 0;
};

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(r));
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') s += " (" + std::string(last) + ")";
  }
  return s;
}

class NcclCommunicator final : public GpuCommunicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, cudaStream_t compute)
      : host_(std::move(host)), device_(current_device()), compute_(compute), timeout_s_(comm_timeout_seconds()) {
    check_one_device_per_rank();
    DeviceGuard guard(device_);
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");

    // The unique id, made on rank 0, with its status: every rank learns of a
    // failure there and throws alike (none is left waiting in the init).
    struct Boot {
      ncclUniqueId id;
      int ok;
      char error[124];
    };
    Boot mine{};
    if (host_->rank() == 0) {
      const ncclResult_t r = ncclGetUniqueId(&mine.id);
      mine.ok = r == ncclSuccess ? 1 : 0;
      if (r != ncclSuccess) std::snprintf(mine.error, sizeof mine.error, "%s", ncclGetErrorString(r));
    }
    std::vector<Boot> all(static_cast<size_t>(host_->size()));
    host_->all_gather_bytes(&mine, all.data(), sizeof(Boot));
    if (all[0].ok != 1) throw Error(std::string("ncclGetUniqueId failed on rank 0: ") + all[0].error);

    NcclGroup world;
    const ncclResult_t r = ncclCommInitRank(&world.comm, host_->size(), all[0].id, host_->rank());
    if (r != ncclSuccess)
      host_->abort("ncclCommInitRank on device " + std::to_string(device_) + " failed: " + nccl_text(r, nullptr));
    nccl_or_fail(ncclCommCount(world.comm, &world.size), "ncclCommCount", world.comm);
    nccl_or_fail(ncclCommUserRank(world.comm, &world.rank), "ncclCommUserRank", world.comm);
    groups_.push_back(world);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    // A hang here (a dead peer) is ended by the watchdog, still running.
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    pending_.clear();
    for (auto it = groups_.rbegin(); it != groups_.rend(); ++it)
      if (it->comm) (void)ncclCommDestroy(it->comm);
    (void)cudaEventDestroy(ready_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }
  int local_size() const override { return host_->local_size(); }
  std::string name() const override { return "nccl"; }

  WorkHandle all_reduce_many(const Buffers& b, int group) override { return issue(Op::all_reduce, b, group, 0); }
  WorkHandle reduce_scatter_many(const Buffers& b, int group) override {
    return issue(Op::reduce_scatter, b, group, 0);
  }
  WorkHandle all_gather_many(const Buffers& b, int group) override { return issue(Op::all_gather, b, group, 0); }

  void barrier() override {
    synchronize();
    host_->barrier();
  }
  void all_gather_bytes(const void* in, void* out, int64_t bytes) override { host_->all_gather_bytes(in, out, bytes); }
  void all_reduce_doubles(double* data, int64_t count) override { host_->all_reduce_doubles(data, count); }
  double busy_seconds() const override { return static_cast<double>(busy_ns_.load()) * 1e-9; }

  int make_groups(int group_size) override {
    const int n = size();
    if (group_size < 1 || n % group_size != 0)
      throw Error("make_groups: a group size of " + std::to_string(group_size) + " does not divide the world size " +
                  std::to_string(n));
    return split(by_size_, group_size, rank() / group_size);
  }
  // Hybrid sharding's replica groups: the ranks equal modulo `stride`.
  int make_strided_groups(int stride) override {
    const int n = size();
    if (stride < 1 || n % stride != 0)
      throw Error("make_strided_groups: a stride of " + std::to_string(stride) + " does not divide the world size " +
                  std::to_string(n));
    return split(by_stride_, stride, rank() % stride);
  }
  int group_size(int group) const override { return lookup(group).size; }
  int group_rank(int group) const override { return lookup(group).rank; }

  [[noreturn]] void abort(const std::string& message) override {
    abort_nccl();
    host_->abort(message);
    std::_Exit(1);  // not reached
  }

  void synchronize() override {
    {
      DeviceGuard guard(device_);
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (communication stream)");
    }
    std::lock_guard<std::mutex> lock(watch_mu_);
    harvest(Clock::now());
  }
  Communicator& host() override { return *host_; }
  int device() const override { return device_; }
  void* compute_stream() const override { return compute_; }

 protected:
  WorkHandle run_all_reduce(Span data, int group) override { return issue(Op::all_reduce, {data}, group, 0); }
  WorkHandle run_reduce_scatter(Span data, int group) override { return issue(Op::reduce_scatter, {data}, group, 0); }
  WorkHandle run_all_gather(Span data, int group) override { return issue(Op::all_gather, {data}, group, 0); }
  WorkHandle run_broadcast(Span data, int root, int group) override { return issue(Op::broadcast, {data}, group, root); }

 private:
  // NCCL before 2.30 refuses two ranks on one device (and would fail inside
  // ncclCommInitRank on some ranks only): checked on the gathered table of
  // (host, PCI bus id), the same on every rank, so all of them throw alike.
  void check_one_device_per_rank() {
    struct Where {
      char host[96];
      char bus[32];
    };
    Where mine{};
    (void)gethostname(mine.host, sizeof mine.host - 1);
    check(cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, device_), "cudaDeviceGetPCIBusId");
    std::vector<Where> all(static_cast<size_t>(size()));
    host_->all_gather_bytes(&mine, all.data(), sizeof(Where));
    for (size_t a = 0; a < all.size(); ++a)
      for (size_t b = a + 1; b < all.size(); ++b)
        if (std::strcmp(all[a].host, all[b].host) == 0 && std::strcmp(all[a].bus, all[b].bus) == 0)
          throw Error("ranks " + std::to_string(a) + " and " + std::to_string(b) + " share the GPU " + all[a].bus +
                      " on " + all[a].host +
                      ": NCCL needs one GPU per rank (start at most as many ranks per node as it has GPUs, "
                      "or use the MPI-staged GPU communicator)");
  }

  NcclGroup lookup(int group) const {
    std::lock_guard<std::mutex> lock(groups_mu_);
    if (group < 0 || group >= static_cast<int>(groups_.size()))
      throw Error("unknown communicator group " + std::to_string(group) + " (rank " + std::to_string(rank()) + ")");
    return groups_[static_cast<size_t>(group)];
  }

  void nccl_or_fail(ncclResult_t r, const std::string& what, ncclComm_t comm) {
    if (r != ncclSuccess) fail(what + " failed: " + nccl_text(r, comm));
  }

  WorkHandle issue(Op op, const Buffers& in, int group, int root) {
    const NcclGroup g = lookup(group);
    const Buffers bufs = validate(in, op, g.size, root, rank());
    if (bufs.empty()) return comm::completed_work();
    std::shared_ptr<Events> ev;
    std::string what;
    {
      std::lock_guard<std::mutex> lock(issue_mu_);
      DeviceGuard guard(device_);
      ev = std::make_shared<Events>();
      what = std::string(op_name(op)) + " #" + std::to_string(++seq_) + " (" + std::to_string(bufs.size()) +
             (bufs.size() == 1 ? " buffer, " : " buffers, ") + std::to_string(total_bytes(bufs)) + " bytes, group " +
             std::to_string(group) + " of " + std::to_string(g.size) + " ranks" +
             (op == Op::broadcast ? ", root " + std::to_string(root) : std::string()) + ")";
      check(cudaEventRecord(ready_, compute_), "cudaEventRecord (compute stream)");
      check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent (communication stream)");
      check(cudaEventRecord(ev->start, stream_), "cudaEventRecord (communication stream)");
      nccl_or_fail(ncclGroupStart(), "ncclGroupStart for " + what, g.comm);
      for (const auto& b : bufs) {
        const auto n = static_cast<size_t>(b.n);
        const size_t shard = n / static_cast<size_t>(g.size);
        void* mine = b.sub(static_cast<int64_t>(g.rank * shard), static_cast<int64_t>(shard)).data;
        const ncclDataType_t t = b.dtype == DType::bf16  ? ncclBfloat16
                                 : b.dtype == DType::f16 ? ncclFloat16
                                                         : ncclFloat;
        ncclResult_t r = ncclSuccess;
        switch (op) {
          case Op::all_reduce: r = ncclAllReduce(b.data, b.data, n, t, ncclSum, g.comm, stream_); break;
          // In place: the shard lands at data + rank * shard, the whole buffer is the input.
          case Op::reduce_scatter: r = ncclReduceScatter(b.data, mine, shard, t, ncclSum, g.comm, stream_); break;
          // In place: this rank's shard is read from data + rank * shard.
          case Op::all_gather: r = ncclAllGather(mine, b.data, shard, t, g.comm, stream_); break;
          case Op::broadcast: r = ncclBroadcast(b.data, b.data, n, t, root, g.comm, stream_); break;
        }
        nccl_or_fail(r, what, g.comm);
      }
      nccl_or_fail(ncclGroupEnd(), "ncclGroupEnd for " + what, g.comm);
      check(cudaEventRecord(ev->done, stream_), "cudaEventRecord (communication stream)");
    }
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      pending_.push_back(Pending{ev, what, Clock::now()});
    }
    return std::make_shared<NcclWork>(std::move(ev), compute_, device_);
  }

  struct Pending {
    std::shared_ptr<Events> ev;
    std::string what;
    Clock::time_point issued;
  };

  // Under watch_mu_: retires the finished collectives (adding their time to
  // busy_seconds) and fails on the oldest one past the timeout.
  void harvest(Clock::time_point now) {
    while (!pending_.empty()) {
      Pending& p = pending_.front();
      const cudaError_t q = cudaEventQuery(p.ev->done);
      if (q == cudaSuccess) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p.ev->start, p.ev->done) == cudaSuccess)
          busy_ns_ += static_cast<int64_t>(static_cast<double>(ms) * 1e6);
        (void)cudaGetLastError();
        pending_.pop_front();
        continue;
      }
      if (q != cudaErrorNotReady) fail(error_text(q, "cudaEventQuery") + " waiting for " + p.what);
      const double age = std::chrono::duration<double>(now - p.issued).count();
      if (age > timeout_s_)
        fail(p.what + " (" + comm_context() + ") has not completed after " + std::to_string(static_cast<int>(age)) +
             " s: a peer rank has died, is stuck or issued different collectives (--comm-timeout " +
             std::to_string(timeout_s_) + " s)");
      break;
    }
  }

  void watch() {
    if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) break;
      std::vector<std::pair<int, ncclComm_t>> comms;
      {
        std::lock_guard<std::mutex> g(groups_mu_);
        for (size_t i = 0; i < groups_.size(); ++i) comms.emplace_back(static_cast<int>(i), groups_[i].comm);
      }
      for (auto [handle, comm] : comms) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
        if (r != ncclSuccess) async = r;
        if (async != ncclSuccess && async != ncclInProgress)
          fail("asynchronous NCCL error on group " + std::to_string(handle) + " (" + nccl_text(async, comm) + ")" +
               (pending_.empty() ? std::string(" while idle") : " during " + pending_.front().what));
      }
      harvest(Clock::now());
    }
  }

  // ncclCommAbort on every communicator (NCCL's kernels stop), bounded: a
  // stuck abort does not keep the job from ending.
  void abort_nccl() {
    bool expected = false;
    if (!aborting_.compare_exchange_strong(expected, true)) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // another thread is ending the job
    }
    std::vector<ncclComm_t> comms;
    {
      std::unique_lock<std::mutex> g(groups_mu_, std::try_to_lock);
      for (auto& grp : groups_)
        if (grp.comm) comms.push_back(grp.comm);
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([comms, done] {
      for (auto it = comms.rbegin(); it != comms.rend(); ++it) (void)ncclCommAbort(*it);
      done->store(true);
    }).detach();
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!done->load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  [[noreturn]] void fail(const std::string& message) {
    abort_nccl();
    host_->abort("NCCL: " + message);
    std::_Exit(1);  // not reached
  }

  std::unique_ptr<Communicator> host_;
  const int device_;
  const cudaStream_t compute_;
  const double timeout_s_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // re-recorded per collective (under issue_mu_)

  std::mutex issue_mu_;  // NCCL launches in one order on this rank
  int64_t seq_ = 0;
  mutable std::mutex groups_mu_;
  std::vector<NcclGroup> groups_;  // 0: the world
  std::map<int, int> by_size_, by_stride_;

  // ncclCommSplit of the world by `color` (every rank calls it, with the same
  // `key` kind, in the same order), cached under `key` in `cache`.
  int split(std::map<int, int>& cache, int key, int color) {
    {
      std::lock_guard<std::mutex> lock(groups_mu_);
      if (auto it = cache.find(key); it != cache.end()) return it->second;
    }
    NcclGroup g;
    {
      std::lock_guard<std::mutex> lock(issue_mu_);
      DeviceGuard guard(device_);
      const ncclComm_t world = groups_[0].comm;
      nccl_or_fail(ncclCommSplit(world, color, rank(), &g.comm, nullptr), "ncclCommSplit", world);
      nccl_or_fail(ncclCommCount(g.comm, &g.size), "ncclCommCount", g.comm);
      nccl_or_fail(ncclCommUserRank(g.comm, &g.rank), "ncclCommUserRank", g.comm);
    }
    std::lock_guard<std::mutex> lock(groups_mu_);
    groups_.push_back(g);
    const int handle = static_cast<int>(groups_.size()) - 1;
    cache[key] = handle;
    return handle;
  }

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<bool> aborting_{false};
  std::thread watchdog_;
};

#endif  // DLPLAN_HAVE_NCCL

}  // namespace

std::unique_ptr<GpuCommunicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                          void* compute_stream) {
  return std::make_unique<StagedCommunicator>(std::move(host), static_cast<cudaStream_t>(compute_stream));
}

#if defined(DLPLAN_HAVE_NCCL)
std::unique_ptr<GpuCommunicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                        void* compute_stream) {
  return std::make_unique<NcclCommunicator>(std::move(host), static_cast<cudaStream_t>(compute_stream));
}
#endif

}  // namespace cudart

std::unique_ptr<GpuCommunicator> make_gpu_communicator(GpuCommKind kind, std::unique_ptr<Communicator> host,
                                                       void* compute_stream) {
  if (!host) throw Error("make_gpu_communicator: no host communicator");
  if (kind == GpuCommKind::mpi) return cudart::make_staged_communicator(std::move(host), compute_stream);
#if defined(DLPLAN_HAVE_NCCL)
  return cudart::make_nccl_communicator(std::move(host), compute_stream);
#else
  throw Error("this dlplan was built without NCCL: use the MPI-staged GPU communicator (mpi), "
              "or rebuild where CMake finds NCCL");
#endif
}

}  // namespace dlplan::exec
