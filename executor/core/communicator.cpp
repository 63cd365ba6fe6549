// The Communicator's public front (communicator.hpp): every collective's
// arguments are checked here, once, for every implementation.
#include "dlplan/exec/communicator.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <atomic>
#include <mutex>

namespace dlplan::exec {
namespace {
std::atomic<double> g_timeout{kDefaultCommTimeoutSeconds};
std::mutex g_context_mu;
std::string g_context = "setting up";
}  // namespace

double comm_timeout_seconds() { return g_timeout.load(); }
void set_comm_timeout_seconds(double seconds) {
  if (!(seconds > 0)) throw Error("the communication timeout must be a positive number of seconds");
  g_timeout.store(seconds);
}
std::string comm_context() {
  std::lock_guard<std::mutex> lock(g_context_mu);
  return g_context;
}
void set_comm_context(const std::string& context) {
  std::lock_guard<std::mutex> lock(g_context_mu);
  g_context = context;
}

void Communicator::check_collective(const Span& data, int group, const char* what, bool sharded) const {
  if (data.n < 0 || (data.n > 0 && data.data == nullptr))
    throw Error(fmt::format("{}: bad buffer ({} elements at {}, rank {})", what, data.n, data.data, rank()));
  if (data.dtype != DType::f32 && data.dtype != DType::bf16 && data.dtype != DType::f16)
    throw Error(fmt::format("{}: {} buffers are not reduced (rank {})", what, to_string(data.dtype), rank()));
  const int g = group_size(group);  // throws for an unknown group
  if (sharded && data.n % g != 0)
    throw Error(fmt::format("{}: {} elements are not a multiple of the group size {} (rank {})", what, data.n, g,
                            rank()));
}

WorkHandle Communicator::all_reduce(Span data, int group) {
  check_collective(data, group, "all_reduce", false);
  return run_all_reduce(data, group);
}

WorkHandle Communicator::reduce_scatter(Span data, int group) {
  check_collective(data, group, "reduce_scatter", true);
  return run_reduce_scatter(data, group);
}

WorkHandle Communicator::all_gather(Span data, int group) {
  check_collective(data, group, "all_gather", true);
  return run_all_gather(data, group);
}

WorkHandle Communicator::broadcast(Span data, int root, int group) {
  check_collective(data, group, "broadcast", false);
  const int g = group_size(group);
  if (root < 0 || root >= g)
    throw Error(fmt::format("broadcast: root {} is not a rank of a group of {} (rank {})", root, g, rank()));
  return run_broadcast(data, root, group);
}

}  // namespace dlplan::exec
