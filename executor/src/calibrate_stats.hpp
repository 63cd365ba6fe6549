// The statistics calibration's measurements share (calibrate.cpp,
// calibrate_ops.cpp, calibrate_held_back.cpp).
#pragma once

#include "dlplan/exec/communicator.hpp"

#include <algorithm>
#include <vector>

namespace dlplan::exec::detail {

// The upper median (the middle of an odd count): robust to one slow repeat.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The slowest rank's figure: what a synchronous step waits for. Collective.
inline double slowest(Communicator& comm, double seconds) {
  std::vector<double> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&seconds, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

}  // namespace dlplan::exec::detail
