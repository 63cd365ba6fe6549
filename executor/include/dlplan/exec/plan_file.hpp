// Transition only: a plan is read by the planner's document library
// (dlplan/plan_io.hpp: PlanDocument, read_plan_file, plan_from_json). These
// names keep older callers compiling; new code uses the planner's.
#pragma once

#include "dlplan/plan_io.hpp"

namespace dlplan::exec {

using LoadedPlan = dlplan::PlanDocument;
using dlplan::plan_from_json;

inline LoadedPlan load_plan_file(const std::string& path) { return dlplan::read_plan_file(path); }

}  // namespace dlplan::exec
