// The run report (DESIGN.md, "Plan and run report", kind "report"): what a
// run measured beside what its plan predicted, and the progress lines. The
// documents themselves are the planner's (dlplan/plan_io.hpp: RunReport,
// report_json, ProgressLine); here they are filled from a trainer.
#pragma once

#include "dlplan/exec/trainer.hpp"
#include "dlplan/plan_io.hpp"

#include <string>
#include <vector>

namespace dlplan::exec {

// Memory of one rank at its peak, gathered so the report can show the rank
// whose peak is highest.
struct RankMemory {
  int rank = 0;
  CategoryBytes at_peak{};
  CategoryBytes max_each{};
  int64_t peak = 0;
  int64_t rss_bytes = 0;
  int64_t runtime_bytes = 0;   // device memory in use outside the allocator (CUDA; 0 on the CPU)
  int64_t reserved_bytes = 0;  // the allocator's cached, unused bytes (CUDA's caching allocator)
  CategoryBytes host{};        // CPU offload: the host pool's most per category
};

struct RunMeasurement {
  std::vector<StepStats> steps;
  RankMemory memory;            // the rank with the highest peak
  double comm_busy_seconds = 0; // per step, rank 0
};

RankMemory highest_peak_rank(Trainer& t, Communicator& comm);
RunReport run_report(const PlanDocument& plan, Trainer& t, const RunMeasurement& m, int world, uint64_t seed);

// One progress line: text for people, JSON (DESIGN.md's fields) for programs.
// eta_seconds: the time the remaining steps should take (negative: none shown).
std::string progress_text(const StepStats& s, int steps, const Trainer& t, double eta_seconds = -1);
std::string progress_json(const StepStats& s, int steps, const Trainer& t);
// The closing tables: measured against predicted, the step's times and
// throughput, then the bytes per category.
std::string time_table(const RunReport& report);
std::string memory_table(const RunReport& report);

}  // namespace dlplan::exec
