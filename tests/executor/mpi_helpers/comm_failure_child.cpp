// The job comm_failure_test.cpp launches with mpiexec -n 2. Modes:
//   kill   rank 1 raises SIGKILL on itself while rank 0 waits in an all_reduce
//   error  rank 1 calls abort("simulated failure at step 3") while rank 0 waits
//   ok     the control: both ranks finish the all_reduce and exit 0
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/communicator.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "kill" && mode != "error" && mode != "ok") {
    std::fprintf(stderr, "usage: comm_failure_child kill|error|ok\n");
    return 2;
  }
  auto c = dlplan::exec::make_communicator(&argc, &argv);
  if (c->name() != "mpi" || c->size() < 2) {
    std::fprintf(stderr, "comm_failure_child: needs an MPI job of 2+ ranks (got %s, %d)\n",
                 c->name().c_str(), c->size());
    return 2;
  }
  // One collective that works, so the failure below happens mid-training.
  float x = 1.0f;
  c->all_reduce(&x, 1)->wait();
  std::printf("rank %d: warm-up all_reduce = %g\n", c->rank(), static_cast<double>(x));
  std::fflush(stdout);

  if (c->rank() == 1 && mode != "ok") {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is in the all_reduce by now
    if (mode == "kill") std::raise(SIGKILL);
    c->abort("simulated failure at step 3");
  }
  float y = 1.0f;
  c->all_reduce(&y, 1)->wait();  // never completes on rank 0 unless mode == ok
  std::printf("rank %d: done, all_reduce = %g\n", c->rank(), static_cast<double>(y));
  return 0;
}
