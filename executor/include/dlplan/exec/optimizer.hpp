// AdamW, SGD and SGD with momentum over this rank's slice of each unit, with
// weight decay on the weights of linear, conv and embedding only, gradient
// clipping by the global norm (every rank's shard counted once), and a linear
// warmup + cosine learning-rate schedule. Deterministic: the same elementwise
// arithmetic whatever the sharding, so every strategy trains the same model.
#pragma once

#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/param_store.hpp"

namespace dlplan::exec {

// lr at step `step` (0-based) of `total`: linear warmup from lr/warmup to lr,
// then cosine decay to min_lr (Loshchilov & Hutter, SGDR).
double learning_rate(const OptimizerConfig& o, int step, int total);

// What a step did: the global gradient norm before clipping (unscaled), and
// whether it was skipped (fp16-mixed: a gradient overflowed on some rank).
struct StepOutcome {
  double grad_norm = 0;
  bool skipped = false;
};

class Optimizer {
 public:
  // `host`: under CPU offload (store.offloaded()), the pool that holds the
  // state (an fp32 master copy whatever the precision, m, v), where the step
  // runs on the CPU; the updated parameters are then uploaded to the device
  // (or, under --offload params, narrowed into the host's parameter shard).
  Optimizer(const OptimizerConfig& cfg, ParamStore& store, Allocator& alloc, Allocator* host = nullptr);
  // One update. `comm` sums the shards' squares when the gradients are
  // sharded. `loss_scale` > 0 (fp16-mixed): the gradients hold loss_scale
  // times the true ones; every rank's overflow flag is summed over `comm`
  // (one double, the plan's "loss-scale overflow flag all-reduce") and, if
  // any rank found an inf or a NaN, no rank updates anything (GradScaler's
  // skipped step); otherwise the update unscales as it reads (with the clip).
  StepOutcome step(int step_index, int total_steps, Communicator& comm, double loss_scale = 0);

  // This rank's state of unit u for checkpoints, by name: "master" (the fp32
  // master weights; bf16 parameters only), "exp_avg" (m: AdamW, SGD with
  // momentum), "exp_avg_sq" (v: AdamW). Each holds shard_size(u) fp32 values
  // in the store's memory (the device's on a GPU).
  std::vector<std::pair<std::string, Tensor>> state(int u) const;
  int steps_taken() const { return t_; }      // Adam's bias-correction count
  void set_steps_taken(int t) { t_ = t; }     // a resumed run continues it

 private:
  OptimizerConfig cfg_;
  ParamStore& store_;
  std::vector<Tensor> m_, v_;  // per unit, this rank's shard
  std::vector<Tensor> master_;  // per unit, this rank's shard in fp32 (bf16 parameters, or offload)
  std::unique_ptr<DeviceOps> host_ops_;  // offload: the CPU's loops over the host pool
  int t_ = 0;
};

}  // namespace dlplan::exec
