// A world of one process: every collective leaves the data as it is (the sum,
// gather or broadcast over one rank), groups have size 1. Also the home of
// make_single_communicator and launched_by_mpi (make_communicator in device.hpp picks).
#include "dlplan/exec/comm_thread.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace dlplan::exec {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string name() const override { return "single"; }

  void barrier() override {}

  void all_gather_bytes(const void* in, void* out, int64_t bytes) override {
    if (bytes < 0) throw Error("all_gather_bytes: negative size");
    if (bytes > 0 && in != out) std::memmove(out, in, static_cast<size_t>(bytes));
  }
  void all_reduce_doubles(double* data, int64_t count) override {
    if (count < 0 || (count > 0 && data == nullptr))
      throw Error("all_reduce_doubles: bad buffer");
  }

  int make_groups(int group_size) override {
    if (group_size != 1)
      throw Error("make_groups: a group size of " + std::to_string(group_size) +
                  " does not divide the world size 1");
    std::lock_guard<std::mutex> lock(mutex_);
    if (group_ == 0) group_ = 1;
    return group_;
  }
  int make_strided_groups(int stride) override {
    if (stride != 1)
      throw Error("make_strided_groups: a stride of " + std::to_string(stride) + " does not divide the world size 1");
    return make_groups(1);
  }
  int group_size(int group) const override {
    check_group(group);
    return 1;
  }
  int group_rank(int group) const override {
    check_group(group);
    return 0;
  }

  [[noreturn]] void abort(const std::string& message) override {
    std::fflush(stdout);
    std::fprintf(stderr, "dlplan: rank 0: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }

 protected:
  // Over one rank every collective leaves the data as it is.
  WorkHandle run_all_reduce(Span, int) override { return comm::completed_work(); }
  WorkHandle run_reduce_scatter(Span, int) override { return comm::completed_work(); }
  WorkHandle run_all_gather(Span, int) override { return comm::completed_work(); }
  WorkHandle run_broadcast(Span, int, int) override { return comm::completed_work(); }

 private:
  void check_group(int group) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (group != 0 && group != group_)
      throw Error("unknown communicator group " + std::to_string(group));
  }
  mutable std::mutex mutex_;
  int group_ = 0;  // the handle make_groups(1) returned, 0 before
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace dlplan::exec
