// The MPI communicator (CPU backend). The communication thread makes every
// collective call: the collectives are queued on it in call order (so they
// overlap the caller's compute) and the blocking calls are queued and waited.
// Two exceptions: abort(), which must end the job even while the thread is
// stuck in a collective with a dead peer, and the watchdog.
//
// The watchdog (--comm-timeout, comm_timeout_seconds()): a thread that
// notices a collective older than the timeout. It then tells every other rank
// "I am waiting" on a communicator of its own, listens for a grace period for
// theirs, and ends the job naming the ranks of the collective's group that did
// not say so: stopped (SIGSTOP), stuck in compute, or lost. The lowest waiting
// rank prints the message; the others end the job a grace period later if it
// has not. Talking while the communication thread is inside MPI needs
// MPI_THREAD_MULTIPLE; an MPI without it gets the timeout without the names.
//
// Every communicator uses MPI_ERRORS_RETURN; a failing call becomes a
// dlplan::Error naming the call and the rank.
#include "dlplan/exec/comm_thread.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/bf16.hpp"
#include "dlplan/exec/communicator.hpp"

// The C API only (the deprecated C++ bindings do not compile warning-free).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <sched.h>

namespace dlplan::exec {
namespace {

struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int size = 1;
  int rank = 0;
  int first = 0;   // world rank of the group's rank 0
  int stride = 1;  // world ranks first, first + stride, ... (1: contiguous)
};

using Clock = std::chrono::steady_clock;
constexpr int kWaitingTag = 7;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      // A rank waiting in a collective yields its core instead of spinning:
      // ranks often share cores with the other ranks' compute (a CPU
      // rehearsal of a plan), where a busy-polling wait steals their time.
      // OpenMPI reads this before MPI_Init; a value the user set wins.
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
      if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw Error("MPI_Init_thread failed");
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      if (owns_mpi_) MPI_Finalize();
      throw Error("MPI provides thread level " + std::to_string(provided) +
                  ", the communication thread needs MPI_THREAD_SERIALIZED");
    }
    multiple_ = provided >= MPI_THREAD_MULTIPLE;
    thread_ = std::make_unique<comm::CommThread>();
    thread_->run_sync([this] { setup(); });
    watchdog_ = std::thread([this] { watch(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (thread_) {
      try {
        thread_->run_sync([this] {
          for (auto& g : groups_)
            if (g.comm != MPI_COMM_NULL && g.comm != world_) MPI_Comm_free(&g.comm);
          if (world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
          if (waiting_ != MPI_COMM_NULL) MPI_Comm_free(&waiting_);
          if (bf16_sum_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_);
          if (f16_sum_ != MPI_OP_NULL) MPI_Op_free(&f16_sum_);
        });
      } catch (...) {
      }
      thread_.reset();  // drain, then join
    }
    // MPI_Finalize belongs on the thread that initialised MPI (this one).
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "mpi"; }

  void barrier() override {
    thread_->run_sync([this] {
      Watch w(*this, "MPI_Barrier", groups_.front());
      check_mpi(MPI_Barrier(world_), "MPI_Barrier");
    });
  }

  void all_gather_bytes(const void* in, void* out, int64_t bytes) override {
    if (bytes < 0 || bytes > INT_MAX)
      throw Error("all_gather_bytes: " + std::to_string(bytes) + " bytes per rank is out of range");
    if (bytes == 0) return;
    if (in == nullptr || out == nullptr) throw Error("all_gather_bytes: null buffer");
    thread_->run_sync([this, in, out, bytes] {
      const auto* src = static_cast<const char*>(in);
      auto* dst = static_cast<char*>(out);
      const int n = static_cast<int>(bytes);
      std::vector<char> copy;
      const void* send = in;
      if (src == dst + static_cast<int64_t>(rank_) * bytes) {
        send = MPI_IN_PLACE;  // already in its slot
      } else if (src < dst + static_cast<int64_t>(size_) * bytes && dst < src + bytes) {
        copy.assign(src, src + bytes);  // MPI forbids aliased send and receive buffers
        send = copy.data();
      }
      Watch w(*this, "MPI_Allgather", world_group());
      if (send == MPI_IN_PLACE)
        check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dst, n, MPI_BYTE, world_),
                  "MPI_Allgather");
      else
        check_mpi(MPI_Allgather(send, n, MPI_BYTE, dst, n, MPI_BYTE, world_), "MPI_Allgather");
    });
  }

  void all_reduce_doubles(double* data, int64_t count) override {
    check_buffer(data, count, "all_reduce_doubles");
    if (count == 0) return;
    thread_->run_sync([this, data, count] {
      Watch w(*this, "MPI_Allreduce", world_group());
      for (int64_t off = 0; off < count; off += INT_MAX) {
        const int n = static_cast<int>(std::min<int64_t>(INT_MAX, count - off));
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_DOUBLE, MPI_SUM, world_),
                  "MPI_Allreduce");
      }
    });
  }

  double busy_seconds() const override { return thread_->busy_seconds(); }

  int make_groups(int group_size) override {
    // Checked before any MPI call, so every rank throws the same error and
    // none is left waiting in MPI_Comm_split.
    if (group_size < 1 || size_ % group_size != 0)
      throw Error("make_groups: a group size of " + std::to_string(group_size) +
                  " does not divide the world size " + std::to_string(size_));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_size_.find(group_size);
      if (it != by_size_.end()) return it->second;  // every rank caches alike
    }
    Group g;
    thread_->run_sync([this, group_size, &g] {
      Watch w(*this, "MPI_Comm_split", world_group());
      check_mpi(MPI_Comm_split(world_, rank_ / group_size, rank_, &g.comm), "MPI_Comm_split");
      check_mpi(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      check_mpi(MPI_Comm_size(g.comm, &g.size), "MPI_Comm_size");
      check_mpi(MPI_Comm_rank(g.comm, &g.rank), "MPI_Comm_rank");
      g.first = rank_ - g.rank;
    });
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(g);
    const int handle = static_cast<int>(groups_.size()) - 1;
    by_size_[group_size] = handle;
    return handle;
  }

  int make_strided_groups(int stride) override {
    if (stride < 1 || size_ % stride != 0)
      throw Error("make_strided_groups: a stride of " + std::to_string(stride) + " does not divide the world size " +
                  std::to_string(size_));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_stride_.find(stride);
      if (it != by_stride_.end()) return it->second;
    }
    Group g;
    thread_->run_sync([this, stride, &g] {
      Watch w(*this, "MPI_Comm_split", world_group());
      check_mpi(MPI_Comm_split(world_, rank_ % stride, rank_, &g.comm), "MPI_Comm_split");
      check_mpi(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      check_mpi(MPI_Comm_size(g.comm, &g.size), "MPI_Comm_size");
      check_mpi(MPI_Comm_rank(g.comm, &g.rank), "MPI_Comm_rank");
      g.first = rank_ % stride;
      g.stride = stride;
    });
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(g);
    const int handle = static_cast<int>(groups_.size()) - 1;
    by_stride_[stride] = handle;
    return handle;
  }

  int group_size(int group) const override { return lookup(group).size; }
  int group_rank(int group) const override { return lookup(group).rank; }

  [[noreturn]] void abort(const std::string& message) override {
    std::fflush(stdout);
    std::fprintf(stderr, "dlplan: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    // Called directly, not through the thread: the thread may be blocked in a
    // collective that will never complete (a dead or diverged peer).
    // MPI_Abort itself can block when mpiexec is already ending the job (a
    // peer died and it is waiting out its sigkill timeout): this rank then
    // leaves on its own a few seconds later, with the same exit status.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      std::_Exit(1);
    }).detach();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 protected:
  WorkHandle run_all_reduce(Span data, int group) override {
    const Group g = lookup(group);
    if (data.n == 0) return comm::completed_work();
    const Type t = type_of(data.dtype);
    return thread_->submit([this, data, g, t] {
      Watch w(*this, "MPI_Allreduce", g);
      // MPI counts are int: large buffers go in chunks.
      for (int64_t off = 0; off < data.n; off += INT_MAX) {
        const Span part = data.sub(off, std::min<int64_t>(INT_MAX, data.n - off));
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, part.data, static_cast<int>(part.n), t.type, t.sum, g.comm),
                  "MPI_Allreduce");
      }
    });
  }

  WorkHandle run_reduce_scatter(Span data, int group) override {
    const Group g = lookup(group);
    const int shard = shard_count(data, g, "reduce_scatter");
    if (data.n == 0) return comm::completed_work();
    const Type t = type_of(data.dtype);
    return thread_->submit([this, data, shard, g, t] {
      Watch w(*this, "MPI_Reduce_scatter_block", g);
      // In place, MPI leaves the reduced block at the start of the buffer;
      // this rank's shard belongs at rank * shard.
      check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, data.data, shard, t.type, t.sum, g.comm),
                "MPI_Reduce_scatter_block");
      if (g.rank != 0)
        std::memmove(data.sub(static_cast<int64_t>(g.rank) * shard, shard).data, data.data,
                     static_cast<size_t>(data.sub(0, shard).bytes()));
    });
  }

  WorkHandle run_all_gather(Span data, int group) override {
    const Group g = lookup(group);
    const int shard = shard_count(data, g, "all_gather");
    if (data.n == 0) return comm::completed_work();
    const Type t = type_of(data.dtype);
    return thread_->submit([this, data, shard, g, t] {
      Watch w(*this, "MPI_Allgather", g);
      check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data, shard, t.type, g.comm), "MPI_Allgather");
    });
  }

  WorkHandle run_broadcast(Span data, int root, int group) override {
    const Group g = lookup(group);
    if (data.n == 0) return comm::completed_work();
    const Type t = type_of(data.dtype);
    return thread_->submit([this, data, root, g, t] {
      Watch w(*this, "MPI_Bcast", g);
      for (int64_t off = 0; off < data.n; off += INT_MAX) {
        const Span part = data.sub(off, std::min<int64_t>(INT_MAX, data.n - off));
        check_mpi(MPI_Bcast(part.data, static_cast<int>(part.n), t.type, root, g.comm), "MPI_Bcast");
      }
    });
  }

 private:
  // On the communication thread.
  void setup() {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(world_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(world_, &size_), "MPI_Comm_size");
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    check_mpi(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(node, &local_size_), "MPI_Comm_size");
    check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
    groups_.push_back(Group{world_, size_, rank_, 0});  // handle 0: the world
    check_mpi(MPI_Comm_dup(world_, &waiting_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(waiting_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_), "MPI_Op_create");
    check_mpi(MPI_Op_create(&f16_sum, /*commute=*/1, &f16_sum_), "MPI_Op_create");
  }

  static void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int e = 0; e < *len; ++e) b[e] = to_bf16(from_bf16(a[e]) + from_bf16(b[e]));
  }
  // fp16 likewise; a sum beyond 65504 becomes inf, which fp16-mixed's
  // overflow check then finds (as NCCL's fp16 sum would).
  static void f16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int e = 0; e < *len; ++e) b[e] = to_f16(from_f16(a[e]) + from_f16(b[e]));
  }

  void check_mpi(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", rc);
    throw Error(std::string(call) + " failed on rank " + std::to_string(rank_) + ": " + text);
  }

  Group lookup(int group) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (group < 0 || group >= static_cast<int>(groups_.size()))
      throw Error("unknown communicator group " + std::to_string(group) + " (rank " +
                  std::to_string(rank_) + ")");
    return groups_[static_cast<size_t>(group)];
  }

  void check_buffer(const void* data, int64_t count, const char* what) const {
    if (count < 0 || (count > 0 && data == nullptr))
      throw Error(std::string(what) + ": bad buffer (count " + std::to_string(count) + ", rank " +
                  std::to_string(rank_) + ")");
  }

  // MPI's element type and sum for a buffer: bf16 and f16 travel as 16-bit
  // words and are summed by bf16_sum / f16_sum (fp32 arithmetic, rounded
  // once per combine).
  struct Type {
    MPI_Datatype type;
    MPI_Op sum;
  };
  Type type_of(DType d) const {
    if (d == DType::bf16) return Type{MPI_UINT16_T, bf16_sum_};
    if (d == DType::f16) return Type{MPI_UINT16_T, f16_sum_};
    return Type{MPI_FLOAT, MPI_SUM};
  }

  // The per-rank count of a sharded collective (the front checked divisibility).
  int shard_count(const Span& data, const Group& g, const char* what) const {
    const int64_t shard = data.n / g.size;
    if (shard > INT_MAX)
      throw Error(std::string(what) + ": a shard of " + std::to_string(shard) +
                  " elements exceeds MPI's int count");
    return static_cast<int>(shard);
  }

  Group world_group() const { return Group{world_, size_, rank_, 0}; }

  // The collective the communication thread is in, for the watchdog.
  class Watch {
   public:
    Watch(MpiCommunicator& c, const char* call, const Group& g) : c_(c) {
      std::lock_guard<std::mutex> lock(c_.watch_mu_);
      c_.in_flight_ = InFlight{call, ++c_.sequence_, g.first, g.size, g.stride, Clock::now(), true};
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(c_.watch_mu_);
      c_.in_flight_.active = false;
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    MpiCommunicator& c_;
  };
  struct InFlight {
    const char* call = "";
    int64_t sequence = 0;
    int group_first = 0, group_size = 1, group_stride = 1;
    Clock::time_point since;
    bool active = false;
  };

  void watch() {
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_ || !in_flight_.active) continue;
      const double timeout = comm_timeout_seconds();
      const double age = std::chrono::duration<double>(Clock::now() - in_flight_.since).count();
      if (age <= timeout) continue;
      const InFlight f = in_flight_;
      lock.unlock();
      name_the_absent_and_abort(f, timeout);  // does not return
    }
  }

  // On the watchdog thread: see the top of this file.
  [[noreturn]] void name_the_absent_and_abort(const InFlight& f, double timeout) {
    const std::string what = fmt::format("{} (collective #{}, {}) did not complete within {:g} s (--comm-timeout)", f.call,
                                         f.sequence, comm_context(), timeout);
    if (!multiple_) abort(what + ": a rank is stopped, stuck or lost (this MPI cannot tell which: no MPI_THREAD_MULTIPLE)");
    const double grace = std::clamp(timeout / 2, 1.0, 30.0);
    std::vector<char> waiting(static_cast<size_t>(size_), 0);
    waiting[static_cast<size_t>(rank_)] = 1;
    int me = rank_;
    std::vector<MPI_Request> sends;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request q = MPI_REQUEST_NULL;
      if (MPI_Isend(&me, 1, MPI_INT, r, kWaitingTag, waiting_, &q) == MPI_SUCCESS) sends.push_back(q);
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(grace);
    while (Clock::now() < deadline) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kWaitingTag, waiting_, &flag, &st) == MPI_SUCCESS && flag) {
        int who = -1;
        if (MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, kWaitingTag, waiting_, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
            who >= 0 && who < size_)
          waiting[static_cast<size_t>(who)] = 1;
        continue;
      }
      int done = 0;
      if (!sends.empty()) MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::vector<int> absent;
    for (int k = 0; k < f.group_size; ++k) {
      const int r = f.group_first + k * f.group_stride;
      if (!waiting[static_cast<size_t>(r)]) absent.push_back(r);
    }
    std::string message = what;
    if (absent.empty()) {
      message += ": every rank of its group is waiting too (they issued different collectives)";
    } else {
      message += fmt::format(": rank{} {} did not arrive (stopped, stuck or lost)", absent.size() == 1 ? "" : "s",
                             fmt::join(absent, ", "));
    }
    const int lowest = static_cast<int>(std::find(waiting.begin(), waiting.end(), 1) - waiting.begin());
    if (rank_ != lowest) std::this_thread::sleep_for(std::chrono::duration<double>(grace));  // the lowest speaks
    abort(message);
  }

  bool owns_mpi_ = false;
  bool multiple_ = false;  // MPI_THREAD_MULTIPLE: the watchdog may talk
  std::thread watchdog_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  InFlight in_flight_;
  int64_t sequence_ = 0;
  MPI_Comm waiting_ = MPI_COMM_NULL;  // the watchdog's "I am waiting" messages
  std::unique_ptr<comm::CommThread> thread_;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  mutable std::mutex mutex_;
  std::vector<Group> groups_;
  std::map<int, int> by_size_, by_stride_;
};


}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace dlplan::exec
