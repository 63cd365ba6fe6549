// The statistics calibration's measurements share (calibrate.cpp,
// calibrate_ops.cpp, calibrate_held_back.cpp).
#pragma once

#include "dlplan/exec/calibrate.hpp"
#include "dlplan/exec/communicator.hpp"

#include <algorithm>
#include <cmath>
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

// How many steps to time: at least `min_steps`, and as many as last
// `min_seconds` at the pace of `one_step` (the ranks' mean, so that every rank
// runs the same count), at most kMaxCalibrationSteps. A short step is timed for
// longer: tiny-mlp's 0.2 ms step, timed over 5 steps on a shared 2-core host,
// gave op tables whose held-back check was 49 % off (docs/time.md). Collective.
inline int steps_lasting(Communicator& comm, double one_step, int min_steps, double min_seconds) {
  double pace = one_step;
  comm.all_reduce_doubles(&pace, 1);
  pace /= comm.size();
  if (pace <= 0 || min_seconds <= 0) return min_steps;
  const double wanted = std::ceil(min_seconds / pace);
  return std::max(min_steps, static_cast<int>(std::min<double>(wanted, kMaxCalibrationSteps)));
}

}  // namespace dlplan::exec::detail
