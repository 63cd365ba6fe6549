// The full knob grid (tests/executor/knob_grid.hpp): every feasible
// combination of model x strategy x precision x checkpointing x attention x
// grad-accum x prefetch x bucket size x SyncBN, each trained a few steps on
// the CPU engine in this one process (many plans per mpirun):
//   mpirun -np 2 build/bin/knob_grid_bench [--limit K]
// Prints one line per configuration whose measured memory differs from the
// plan, then a table: per category, the worst |measured - predicted| at the
// peak over the grid, and how many configurations differ. Asserts nothing.
#include "knob_grid.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

using namespace dlplan;
using namespace dlplan::exec;

int main(int argc, char** argv) {
  auto comm = make_communicator(&argc, &argv);
  size_t limit = SIZE_MAX;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--limit") == 0) limit = static_cast<size_t>(std::atol(argv[i + 1]));
  auto backend = make_cpu_backend();
  const auto grid = knobs::full_grid();
  CategoryBytes worst{};
  std::array<int, kAllCategories.size()> differ{};
  int64_t worst_peak = 0, worst_ledger = 0;
  int configs = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < grid.size() && i < limit; ++i) {
    const auto& k = grid[i];
    ++configs;
    try {
      const knobs::Outcome o = knobs::run_config(k, *comm, *backend, 2);
      for (size_t c = 0; c < worst.size(); ++c) {
        const int64_t d = std::abs(o.measured[c] - o.predicted[c]);
        worst[c] = std::max(worst[c], d);
        differ[c] += d != 0;
      }
      worst_peak = std::max(worst_peak, std::abs(o.peak_measured - o.peak_predicted));
      worst_ledger = std::max(worst_ledger, o.ledger_worst);
      if (!o.equal() && comm->rank() == 0) fmt::print("differs: {}: {}\n", knobs::describe(k), knobs::mismatch(o));
    } catch (const std::exception& e) {
      ++failed;
      if (comm->rank() == 0) fmt::print("failed: {}: {}\n", knobs::describe(k), e.what());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm->rank() != 0) return 0;
  fmt::print("\nknob grid: {} configurations on {} rank(s), {} failed to run, {:.1f} s (rank 0's view)\n\n", configs,
             comm->size(), failed, seconds);
  fmt::print("{:<12} {:>22} {:>22}\n", "category", "worst |diff| at peak", "configurations differ");
  for (Category c : kAllCategories)
    fmt::print("{:<12} {:>20} B {:>22}\n", to_string(c), worst[static_cast<size_t>(c)], differ[static_cast<size_t>(c)]);
  fmt::print("{:<12} {:>20} B\n", "peak", worst_peak);
  fmt::print("{:<12} {:>20} B   (largest |measured - program| after any op)\n", "after ops", worst_ledger);
  return 0;
}
