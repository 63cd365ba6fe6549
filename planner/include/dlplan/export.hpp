// `dlplan export`: a plan handed to the tools people already run (issue 19).
//
//   deepspeed_config  a DeepSpeed config JSON (https://www.deepspeed.ai/docs/config-json/):
//                     ZeRO stage, bucket sizes, precision, batch, clipping,
//                     optimizer, WarmupCosineLR schedule, activation
//                     checkpointing, and a `_comment` listing what the plan
//                     decided and what stays at DeepSpeed's defaults.
//   fsdp_script       a Python file for PyTorch >= 2.1: `wrap(model)` applying
//                     the strategy (DDP, DDP + ZeroRedundancyOptimizer, FSDP
//                     SHARD_GRAD_OP or FULL_SHARD), `make_optimizer`,
//                     `make_scheduler`, `train_step`, and a `main()` that runs
//                     them on a tiny placeholder transformer; the torchrun
//                     command line is its first comment.
//
// docs/export.md has the mapping table (plan field -> DeepSpeed key -> FSDP
// argument). What a target cannot express is a dlplan::Error (exit 1).
#pragma once

#include "dlplan/plan_io.hpp"

#include <cstdint>
#include <string>

namespace dlplan {

struct ExportOptions {
  // The run's optimizer steps: the schedule's total (DeepSpeed's
  // total_num_steps, the cosine's end in the FSDP file). A plan does not
  // store it; `dlplan export --steps N`, 1000 when not given (said in the
  // output's comments).
  int64_t steps = 1000;
  bool steps_given = false;
  std::string plan_path;                   // named in the comments
  std::string script_name = "train_fsdp.py";  // the FSDP file's name, for its torchrun line
};

// DeepSpeed's gradient buckets count elements; the plan's bucket_mb counts
// MiB of gradients. The elements of bucket_mb MiB of the plan's gradient
// type (bf16 under bf16-mixed: 2 bytes; fp32: 4).
int64_t bucket_elements(const TrainingConfig& t);

OrderedJson deepspeed_config(const PlanDocument& p, const ExportOptions& opt);
std::string fsdp_script(const PlanDocument& p, const ExportOptions& opt);

// The torchrun command that starts `script` as the plan's cluster:
// "torchrun --nproc_per_node G --nnodes K ... script".
std::string torchrun_command(const PlanDocument& p, const std::string& script);

}  // namespace dlplan
