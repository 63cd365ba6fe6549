// The JSON documents of DESIGN.md ("Plan and run report"): `planning` (the
// CLI's --format json, every strategy side by side) and `plan` (one chosen
// configuration, self-contained, for the executor). schema_version 1.
#pragma once

#include "dlplan/planner.hpp"

#include <nlohmann/json.hpp>

namespace dlplan {

using OrderedJson = nlohmann::ordered_json;

OrderedJson memory_json(const StrategyResult& r);
OrderedJson planning_json(const Planning& p);
// The plan for `r` (one row of p). Throws when p has no chosen row and r is null.
OrderedJson plan_json(const Planning& p, const StrategyResult& r);

}  // namespace dlplan
