// Collectives for the strategies and SyncBN (flashlight-style: one interface,
// implementations chosen by the build and the launch). Collectives are issued
// on a communication thread in the order they are called, so they overlap
// compute; wait() blocks until one is done. All buffers are float32 and the
// operations work in place:
//   all_reduce(p, n):      p[0..n) = sum over the group
//   reduce_scatter(p, n):  n = the full buffer (a multiple of the group size);
//                          rank r's reduced shard lands at p + r * n / size
//   all_gather(p, n):      n = the full buffer; rank r contributes p + r * n / size
//   broadcast(p, n, root)
// A group is a set of contiguous ranks: make_groups(g) splits the world into
// world/g groups of g and returns the handle of this rank's; 0 is the world.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dlplan::exec {

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;       // rank within this node
  virtual int local_size() const = 0;       // ranks on this node
  virtual std::string name() const = 0;     // "mpi", "single"

  virtual WorkHandle all_reduce(float* data, int64_t count, int group = 0) = 0;
  virtual WorkHandle reduce_scatter(float* data, int64_t count, int group = 0) = 0;
  virtual WorkHandle all_gather(float* data, int64_t count, int group = 0) = 0;
  virtual WorkHandle broadcast(float* data, int64_t count, int root, int group = 0) = 0;
  virtual void barrier() = 0;

  // Blocking: gathers `bytes` from every rank of the world into out (size x bytes).
  virtual void all_gather_bytes(const void* in, void* out, int64_t bytes) = 0;
  // Blocking all-reduce of doubles (loss sums, norms) over the world.
  virtual void all_reduce_doubles(double* data, int64_t count) = 0;

  // Seconds the communication thread spent running collectives so far.
  virtual double busy_seconds() const { return 0; }

  virtual int make_groups(int group_size) = 0;  // collective over the world
  virtual int group_size(int group) const = 0;
  virtual int group_rank(int group) const = 0;

  // Ends the whole job now, every rank, after printing `message` (naming this rank).
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// The MPI communicator when launched under mpirun/srun (and built with MPI),
// else a single-process world of size 1.
std::unique_ptr<Communicator> make_communicator(int* argc, char*** argv);
std::unique_ptr<Communicator> make_single_communicator();

}  // namespace dlplan::exec
