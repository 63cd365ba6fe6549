// The JSON documents of DESIGN.md ("Plan and run report"), read and written in
// one place through typed structs: `planning` (the CLI's --format json, every
// strategy side by side), `plan` (one chosen configuration, self-contained,
// for the executor and `dlplan sim`), `report` (a run's measurements beside
// the plan's prediction) and the progress lines of `train --progress json`.
// schema_version 1; readers ignore fields they do not know and refuse a newer
// version (DESIGN.md, "Conventions").
//
// Reading validates every field: its type, its range, and its consistency
// with the rest (model.params with the IR's parameter count, the SyncBN group
// with the world, the training knobs with dlplan/limits.hpp). Every error is a
// dlplan::Error naming the file and the field:
//   plan.json: optimizer.betas[0] = 2 is outside [0, 1)
//
// Integrity: a plan stores `content_hash`, a hash of every other field — the
// IR, the cluster, every knob, and the prediction made from them. A plan
// whose content no longer matches it was edited after planning; reading it
// is refused unless PlanReadOptions::allow_edited (`--allow-edited-plan`),
// and then PlanDocument::edited says so.
#pragma once

#include "dlplan/planner.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan {

using OrderedJson = nlohmann::ordered_json;

struct CommNumbers {
  double bytes = 0;            // sent per GPU per step
  double seconds = 0;          // the communication stream's busy time
  double exposed_seconds = 0;  // the part compute waits for
};

// Memory at the peak: the categories then, the fixed runtime, the peak.
struct MemoryNumbers {
  CategoryBytes at_peak{};
  int64_t runtime = 0;
  int64_t peak = 0;
};

// `predicted` of a plan (and of the report that copies it).
struct Predicted {
  MemoryNumbers memory;
  double step_seconds = 0;
  double compute_seconds = 0;
  CommNumbers comm;
  double mfu = 0;
  bool fits = false;
  CategoryBytes host{};  // CPU offload: host memory per rank (params, grads, optimizer); 0 without
};
Predicted predicted_of(const StrategyResult& r);

// A plan as read: what the executor and the simulator run.
struct PlanDocument {
  std::string path;         // the file (or name) it came from, for messages
  Model model;
  Cluster cluster;
  TrainingConfig training;
  Predicted predicted;
  bool edited = false;      // content_hash did not match (read with allow_edited)
  OrderedJson document;     // the document as read, for the run report
};

struct PlanReadOptions {
  bool allow_edited = false;  // --allow-edited-plan
};

// `measured` of a run report: the fields of `predicted` (but `fits`), plus
// the rank whose memory is shown, per-category maxima, the allocator's
// reserved bytes, the throughput and the process's resident set.
struct Measured {
  MemoryNumbers memory;
  CategoryBytes max_each{};
  int64_t reserved_bytes = 0;
  int rank = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  CommNumbers comm;
  double mfu = 0;
  bool tokens = false;      // the rate is tokens_per_second, else samples_per_second
  double rate = 0;
  int64_t rss_bytes = 0;
  CategoryBytes host{};  // CPU offload: the host pool's bytes per category (the highest rank's)
};

struct RunReport {
  PlanDocument plan;        // the plan that ran (written back as it was read)
  int world_size = 1;
  uint64_t seed = 0;
  std::vector<double> loss; // per step (a diverged step's loss is NaN, written null)
  // fp16-mixed: the loss scale each step ran with, and the steps (1-based)
  // whose update was skipped because a gradient overflowed. Empty otherwise.
  std::vector<double> loss_scale;
  std::vector<int64_t> skipped_steps;
  int first_step = 0;       // steps before these (a run resumed from a checkpoint)
  bool partial = false;     // stopped by a signal before its last step
  Measured measured;
  Predicted predicted;      // the plan's
};

// One line of `train --progress json`.
struct ProgressLine {
  int64_t step = 0;         // 1-based
  int64_t steps = 0;
  double loss = 0;
  double step_seconds = 0;
  bool tokens = false;      // the rate is tokens_per_second, else samples_per_second
  double rate = 0;
  int64_t peak_bytes = 0;
};

// ---- writing ----------------------------------------------------------------
OrderedJson planning_json(const Planning& p);
// The plan for `r` (one row of p), with its content_hash.
OrderedJson plan_json(const Planning& p, const StrategyResult& r);
OrderedJson report_json(const RunReport& r);
std::string progress_line_json(const ProgressLine& l);  // one line, no newline

// ---- reading (every error a dlplan::Error naming `source` and the field) -----
PlanDocument plan_from_json(const OrderedJson& doc, const std::string& source, const PlanReadOptions& opt = {});
PlanDocument plan_from_json(const nlohmann::json& doc, const std::string& source, const PlanReadOptions& opt = {});
PlanDocument read_plan_file(const std::string& path, const PlanReadOptions& opt = {});
RunReport report_from_json(const OrderedJson& doc, const std::string& source);
RunReport read_report_file(const std::string& path);
// The line as a progress line, or nothing when it is not one (other output).
std::optional<ProgressLine> progress_line_from_json(std::string_view line);

// The content hash a plan stores: FNV-1a (64 bits) of the document without
// `content_hash`, dumped with sorted keys. "fnv1a64:" and 16 hex digits.
std::string plan_content_hash(const nlohmann::json& plan);

}  // namespace dlplan
