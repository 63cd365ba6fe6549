// The recommendation's tie rule follows the band the predicted times are
// good to (planner.cpp, time_band): the simpler strategy wins unless a more
// complex one is faster by more than the band.
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using namespace dlplan;

namespace {

PlanRequest vit_on_8_h100(double band) {
  PlanRequest r;
  r.model = load_model("vit-b16");
  r.cluster.device = find_device("h100-80g");
  r.cluster.gpus_per_node = 8;
  r.cluster.device.time_uncertainty = band;
  r.cluster.device.sources["time_uncertainty"] = "this test";
  return r;
}

const StrategyResult& row(const Planning& p, Strategy s) {
  return *std::find_if(p.results.begin(), p.results.end(), [&](const StrategyResult& r) { return r.strategy == s; });
}

TEST(TieRule, DdpWinsExactlyWhenTheFastestIsNotFasterByMoreThanTheBand) {
  // How much slower DDP is predicted than the fastest strategy: the bands
  // just below and just above that gap must give opposite answers.
  const Planning probe = plan(vit_on_8_h100(0.1));
  double fastest = row(probe, Strategy::ddp).step_seconds;
  for (const auto& r : probe.results)
    if (r.fits) fastest = std::min(fastest, r.step_seconds);
  const double gap = row(probe, Strategy::ddp).step_seconds / fastest - 1;
  ASSERT_GT(gap, 0.02) << "the case needs a strategy predicted faster than DDP";

  const Planning wide = plan(vit_on_8_h100(gap + 0.01));
  EXPECT_EQ(wide.recommendation.strategy, Strategy::ddp);
  const Planning narrow = plan(vit_on_8_h100(gap - 0.01));
  ASSERT_TRUE(narrow.recommendation.strategy);
  EXPECT_NE(*narrow.recommendation.strategy, Strategy::ddp);
  // The more complex choice says it beat DDP by more than the band.
  const auto& reasons = narrow.recommendation.reasons;
  const bool says = std::any_of(reasons.begin(), reasons.end(), [](const std::string& s) {
    return s.rfind("ddp is simpler and fits", 0) == 0 && s.find("more than the") != std::string::npos;
  });
  EXPECT_TRUE(says);
}

TEST(TieRule, TheBandAndItsSourceAreStated) {
  const Planning p = plan(vit_on_8_h100(0.12));
  EXPECT_DOUBLE_EQ(p.recommendation.time_band.relative, 0.12);
  EXPECT_EQ(p.recommendation.time_band.source, "this test");
  const auto lines = recommendation_lines(p);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& s) {
    return s.find("good to +-12%: this test") != std::string::npos;
  }));
}

TEST(TimeBand, ADeviceWithoutOneTakesTheDocumentedDefault) {
  Cluster c;
  c.device = find_device("b200");  // no published runs to validate on
  EXPECT_EQ(c.device.time_uncertainty, 0);
  EXPECT_DOUBLE_EQ(time_band(c).relative, kDefaultTimeUncertainty);
  EXPECT_NE(time_band(c).source.find("default"), std::string::npos);
  // The host before calibration: its nominal rates' measured miss.
  c.device = find_device("cpu");
  EXPECT_GE(time_band(c).relative, 0.7);
}

}  // namespace
