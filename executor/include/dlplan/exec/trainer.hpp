// The trainer runs a plan: the step program (planner/step_program.hpp) with
// real tensors, the backend's ops, the communicator's collectives and the
// optimizer, and measures what it did.
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/optimizer.hpp"
#include "dlplan/exec/param_store.hpp"
#include "dlplan/exec/plan_file.hpp"
#include "dlplan/step_program.hpp"

#include <functional>
#include <memory>
#include <vector>

namespace dlplan::exec {

struct StepStats {
  int step = 0;
  double loss = 0;          // mean over every label position of the global batch
  double seconds = 0;       // wall time of the step (rank 0)
  double wait_seconds = 0;  // compute waiting for collectives (exposed communication)
  double comm_bytes = 0;    // sent by this rank (ring accounting)
  double grad_norm = 0;
  int64_t peak_bytes = 0;   // allocator peak so far (after the first step: steady state)
};

struct TrainOptions {
  int steps = 10;
  uint64_t seed = 1;
  std::string data = "synthetic";
};

class Trainer {
 public:
  Trainer(const LoadedPlan& plan, Communicator& comm, Backend& backend, const TrainOptions& opt);
  ~Trainer();

  StepStats step();  // one optimizer step (grad_accum micro-batches)
  int steps_done() const { return step_; }
  Allocator& allocator() { return alloc_; }
  const ParamStore& params() const { return *store_; }
  // Every parameter, full (gathered from shards when sharded), in Model::params order.
  std::vector<float> full_parameters();
  std::vector<float> buffers() const;  // BN running statistics, concatenated
  double comm_busy_seconds() const { return comm_busy_; }
  int64_t samples_per_step() const;
  int64_t tokens_per_sample() const;

 private:
  void run_micro_batch(int micro, bool first, bool last, StepStats& stats);

  const LoadedPlan& plan_;
  Communicator& comm_;
  Backend& backend_;
  TrainOptions opt_;
  Allocator alloc_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataSource> data_;
  StepProgram program_;
  int syncbn_group_ = 0;
  std::unique_ptr<SyncBnHooks> syncbn_;
  int step_ = 0;
  double comm_busy_ = 0;
  std::vector<WorkHandle> pending_param_gathers_;
};

}  // namespace dlplan::exec
