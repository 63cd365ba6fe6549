// Reading a plan document (DESIGN.md, "Plan and run report": kind "plan").
// A plan is self-contained: the IR as planned, the cluster, every knob.
#pragma once

#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/training.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace dlplan::exec {

struct LoadedPlan {
  std::string path;
  nlohmann::ordered_json document;  // as read, for the run report
  Model model;
  Cluster cluster;
  TrainingConfig training;
};

// Throws dlplan::Error naming the file and the field.
LoadedPlan load_plan_file(const std::string& path);
LoadedPlan plan_from_json(const nlohmann::json& doc, const std::string& source);

}  // namespace dlplan::exec
