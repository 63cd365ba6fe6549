// Collectives for the strategies and SyncBN (flashlight-style: one interface,
// implementations chosen by the build and the launch). Collectives are issued
// on a communication thread in the order they are called, so they overlap
// compute; wait() blocks until one is done. Buffers are Spans of fp32 or bf16
// (bf16 sums in fp32 and rounds at each step of the reduction, as NCCL does)
// and the operations work in place:
//   all_reduce(p):      p = sum over the group
//   reduce_scatter(p):  p.n = the full buffer (a multiple of the group size);
//                       rank r's reduced shard lands at element r * n / size
//   all_gather(p):      p.n = the full buffer; rank r contributes element r * n / size on
//   broadcast(p, root)
// The public calls check their arguments once, here (a bad call fails on the
// caller, never on the communication thread mid-collective); each
// implementation provides the protected run_* calls.
// A group is a set of contiguous ranks: make_groups(g) splits the world into
// world/g groups of g and returns the handle of this rank's; 0 is the world.
// make_strided_groups(s) splits it into s groups of the ranks equal modulo s
// (r, r+s, r+2s, ...): hybrid sharding's replicas of one shard.
#pragma once

#include "dlplan/error.hpp"
#include "dlplan/exec/tensor.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dlplan::exec {

class Work {
 public:
  virtual ~Work() = default;
  // The caller's wait: the host blocks (CPU), or a GPU's compute stream waits
  // for the collective while the host goes on.
  virtual void wait() = 0;
  // The host blocks until the collective is done (its result readable).
  virtual void wait_host() { wait(); }
};
using WorkHandle = std::shared_ptr<Work>;
inline void wait_host(const WorkHandle& w) {
  if (w) w->wait_host();
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;       // rank within this node
  virtual int local_size() const = 0;       // ranks on this node
  virtual std::string name() const = 0;     // "mpi", "single"

  WorkHandle all_reduce(Span data, int group = 0);
  WorkHandle reduce_scatter(Span data, int group = 0);
  WorkHandle all_gather(Span data, int group = 0);
  WorkHandle broadcast(Span data, int root, int group = 0);
  // fp32 shorthands.
  WorkHandle all_reduce(float* data, int64_t count, int group = 0) { return all_reduce(span_of(data, count), group); }
  WorkHandle reduce_scatter(float* data, int64_t count, int group = 0) {
    return reduce_scatter(span_of(data, count), group);
  }
  WorkHandle all_gather(float* data, int64_t count, int group = 0) { return all_gather(span_of(data, count), group); }
  WorkHandle broadcast(float* data, int64_t count, int root, int group = 0) {
    return broadcast(span_of(data, count), root, group);
  }
  virtual void barrier() = 0;

  // Blocking: gathers `bytes` from every rank of the world into out (size x bytes).
  virtual void all_gather_bytes(const void* in, void* out, int64_t bytes) = 0;
  // Blocking all-reduce of doubles (loss sums, norms) over the world.
  virtual void all_reduce_doubles(double* data, int64_t count) = 0;

  // Seconds the communication thread spent running collectives so far.
  virtual double busy_seconds() const { return 0; }

  virtual int make_groups(int group_size) = 0;  // collective over the world
  virtual int make_strided_groups(int stride) = 0;  // collective over the world; stride divides the world
  virtual int group_size(int group) const = 0;
  virtual int group_rank(int group) const = 0;

  // Ends the whole job now, every rank, after printing `message` (naming this rank).
  [[noreturn]] virtual void abort(const std::string& message) = 0;

  // The communicator that takes HOST buffers: itself, or for a GPU
  // communicator the host communicator it was built over.
  virtual Communicator& host() { return *this; }

 protected:
  // Called with checked arguments: n >= 0, data set when n > 0, a known group,
  // n a multiple of the group size (reduce_scatter, all_gather), root a rank
  // of the group (broadcast), dtype f32 or bf16. n may be 0.
  virtual WorkHandle run_all_reduce(Span data, int group) = 0;
  virtual WorkHandle run_reduce_scatter(Span data, int group) = 0;
  virtual WorkHandle run_all_gather(Span data, int group) = 0;
  virtual WorkHandle run_broadcast(Span data, int root, int group) = 0;

 private:
  void check_collective(const Span& data, int group, const char* what, bool sharded) const;
};

// How a GPU device communicates (make_device_communicator, device.hpp): NCCL
// on device buffers, or MPI through pinned host memory (staged copies).
enum class GpuCommKind { nccl, mpi };
inline GpuCommKind parse_gpu_comm_kind(const std::string& s) {
  if (s == "nccl") return GpuCommKind::nccl;
  if (s == "mpi") return GpuCommKind::mpi;
  throw Error("unknown GPU communicator '" + s + "' (nccl or mpi)");
}

// Seconds a collective may wait for its peers before the job ends naming the
// ranks that did not arrive (`train --comm-timeout`; the MPI and the NCCL
// communicators read it at every wait). Default 300 s.
constexpr double kDefaultCommTimeoutSeconds = 300;
double comm_timeout_seconds();
void set_comm_timeout_seconds(double seconds);  // > 0
// Where the run is ("step 12", "saving the checkpoint of step 10"): timeout
// messages name it. Process-wide, set by the trainer and the train command.
std::string comm_context();
void set_comm_context(const std::string& context);

// A single-process world of size 1 (dlplan_exec_core).
std::unique_ptr<Communicator> make_single_communicator();
// The MPI world (dlplan_exec_mpi, built when MPI is found; MPI_Init_thread
// with MPI_THREAD_SERIALIZED). make_communicator (device.hpp) picks one.
std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv);
// True when mpirun, srun or another PMI launcher started this process.
bool launched_by_mpi();

}  // namespace dlplan::exec
