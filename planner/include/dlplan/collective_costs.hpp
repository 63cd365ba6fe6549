// Collective times measured by `dlplan calibrate` on the machine at hand: for
// each collective (all-reduce, reduce-scatter, all-gather), its time at sizes
// 4 B ... 16 MiB growing 4x a rung, over the ranks calibrate ran. A cluster
// profile carries them ("collective_costs"); comm_model.cpp takes a
// collective's time from its ladder when the group is the one measured (the
// same ranks, one node, contiguous) and from the alpha-beta model otherwise.
//
// Why a ladder and not only the fit: one latency and one bandwidth do not
// hold across sizes on a host. MPI switches protocols (eager, then
// single-copy) and buffers leave the caches, so the measured time bends:
// on a 2-core VM (December 2026) 64 KiB took 24 us and 1 MiB 116 us, where
// the best line through the ladder gives 16 us and 148 us. Between rungs
// the time is interpolated on log-log axes (a power law per segment, exact at
// every rung); below the smallest rung it is that rung's (latency-bound);
// above the largest it grows in proportion to the bytes (bandwidth-bound).
#pragma once

#include "dlplan/comm_model.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace dlplan {

struct CollectiveRung {
  double bytes = 0;    // the collective's buffer, as collective_cost's `bytes`
  double seconds = 0;  // median over the repetitions, the slowest rank's
};

struct CollectiveLadder {
  Collective op = Collective::AllReduce;
  std::vector<CollectiveRung> rungs;  // bytes strictly increasing, seconds > 0
};

struct CollectiveCostTable {
  std::string source;  // "dlplan calibrate on host with 2 rank(s)"
  int ranks = 0;       // the group the ladders were measured over (one node)
  std::vector<CollectiveLadder> ladders;

  // The time of `op` on `bytes` > 0 from its ladder; nullopt when the table
  // has no ladder for it.
  std::optional<double> seconds(Collective op, double bytes) const;
};

nlohmann::ordered_json collective_costs_to_json(const CollectiveCostTable& t);
// Errors name `source` and the field.
CollectiveCostTable collective_costs_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace dlplan
