// calibrate's all-reduce fit (fit_all_reduce) against ladders made from a
// known latency and bandwidth: exact data gives them back; with the few
// percent of noise real timings have, the latency still comes out near the
// truth (an unweighted least-squares fit, which calibrate used before, puts
// it at the mercy of the largest sizes' noise: shown as the control).
#include "dlplan/exec/calibrate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace dlplan::exec;

namespace {

constexpr double kLatency = 6.8e-6;  // what calibrate measured for small all-reduces on 2 ranks here
constexpr double kBus = 2.5e9;

// calibrate's ladder: 4 B to 16 MiB, 4x a step, on `ranks` ranks, each time
// scaled by a factor from noise().
template <class Noise>
std::vector<CollectiveSample> ladder(int ranks, Noise noise) {
  std::vector<CollectiveSample> out;
  for (int64_t elems = 1; elems <= (int64_t{1} << 22); elems *= 4) {
    const double S = 4.0 * static_cast<double>(elems);
    const double t = kLatency + 2.0 * (ranks - 1) / ranks * S / kBus;
    out.push_back({S, t * noise()});
  }
  return out;
}

// The fit calibrate used before: ordinary least squares, intercept clamped at 0.
double unweighted_latency(const std::vector<CollectiveSample>& s, int ranks) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& p : s) {
    const double x = 2.0 * (ranks - 1) / ranks * p.bytes;
    sx += x, sy += p.seconds, sxx += x * x, sxy += x * p.seconds;
  }
  const double n = static_cast<double>(s.size());
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  return std::max(0.0, (sy - slope * sx) / n);
}

}  // namespace

TEST(AllReduceFit, ExactLadderGivesLatencyAndBandwidthBack) {
  for (int ranks : {2, 4, 8}) {
    const AllReduceFit f = fit_all_reduce(ladder(ranks, [] { return 1.0; }), ranks);
    EXPECT_NEAR(f.latency_s, kLatency, 1e-3 * kLatency) << ranks;
    EXPECT_NEAR(f.bus_bytes_per_s, kBus, 1e-3 * kBus) << ranks;
  }
}

TEST(AllReduceFit, NoisyLadderKeepsTheLatency) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.95, 1.05);  // +-5 % per timing
  int unweighted_off = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const auto s = ladder(2, [&] { return u(rng); });
    const AllReduceFit f = fit_all_reduce(s, 2);
    EXPECT_NEAR(f.latency_s, kLatency, 0.1 * kLatency) << "trial " << trial;
    EXPECT_NEAR(f.bus_bytes_per_s, kBus, 0.1 * kBus) << "trial " << trial;
    if (std::abs(unweighted_latency(s, 2) - kLatency) > 0.5 * kLatency) ++unweighted_off;
  }
  // Control: the unweighted fit misses the latency by more than half in most trials.
  EXPECT_GT(unweighted_off, 25);
}

TEST(AllReduceFit, LatencyBoundLadderHasNoNegativeNumbers) {
  std::vector<CollectiveSample> flat;
  for (double S = 4; S <= 1 << 24; S *= 4) flat.push_back({S, 1e-5});
  const AllReduceFit f = fit_all_reduce(flat, 2);
  EXPECT_NEAR(f.latency_s, 1e-5, 1e-9);
  EXPECT_GT(f.bus_bytes_per_s, 0);
  EXPECT_TRUE(fit_all_reduce({}, 2).latency_s == 0);
}

// contention_from against the simulator's rule worked by hand
// (calibrate.hpp): GEMMs and a collective started together.
TEST(ContentionFrom, ACollectiveThatWaitsForTheComputeIsAStall) {
  // A 1 ms collective beside 1 ms of GEMMs that it did not slow, done 1.9 ms
  // after both started: 0.9 ms of it ran after the GEMMs, so it got 0.1 ms
  // done in their 1 ms: it ran at 0.1 of its speed, stall 0.9.
  const Contention c = contention_from(1e-3, 1e-3, 1e-3, 1.9e-3);
  EXPECT_NEAR(c.stall, 0.9, 1e-12);
  EXPECT_EQ(c.slowdown, 0);
  // Nothing left when the GEMMs ended: it kept pace (the control).
  EXPECT_EQ(contention_from(2e-3, 2e-3, 1e-3, 2e-3).stall, 0);
  // None of it ran beside them: stall 1.
  EXPECT_NEAR(contention_from(1e-3, 1e-3, 1e-3, 2e-3).stall, 1, 1e-12);
}

TEST(ContentionFrom, SlowedComputeGivesTheSlowdownTheSimulatorWouldUse) {
  // 2 ms of GEMMs beside a 1 ms collective that kept pace, taking 2.5 ms:
  // the simulator's rule gives 1 + 2 - 1 / (1 + s) = 2.5 for s = 1.
  Contention c = contention_from(2e-3, 2.5e-3, 1e-3, 2.5e-3);
  EXPECT_NEAR(c.slowdown, 1, 1e-9);
  EXPECT_EQ(c.stall, 0);
  // In flight through all of the compute (work left at its end): beside =
  // alone (1 + s), 1 ms -> 1.2 ms is s = 0.2, and the stall from what was left.
  c = contention_from(1e-3, 1.2e-3, 1e-3, 1.8e-3);
  EXPECT_NEAR(c.slowdown, 0.2, 1e-9);
  EXPECT_NEAR(c.stall, 1 - 0.4 / 1.2, 1e-12);
  // Compute that stood still for the collective and more: the field's bound.
  EXPECT_EQ(contention_from(2e-3, 3.5e-3, 1e-3, 3.5e-3).slowdown, kMaxCommSlowdown);
  // Faster beside than alone (noise): no slowdown; bad input: nothing.
  EXPECT_EQ(contention_from(2e-3, 1.9e-3, 1e-3, 1.9e-3).slowdown, 0);
  EXPECT_EQ(contention_from(0, 1e-3, 1e-3, 1e-3).slowdown, 0);
}
