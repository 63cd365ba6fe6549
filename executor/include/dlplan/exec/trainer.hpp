// The trainer runs a plan: the step program (planner/step_program.hpp) with
// real tensors, the backend's ops, the communicator's collectives and the
// optimizer, and measures what it did.
//
// The device: the caller hands over the allocator's memory resource and the
// DeviceOps that touch it (both default to the host: the CPU executor). For
// CUDA (cli/train_command.cpp): the CUDA backend, make_cuda_memory(device,
// compute stream), make_cuda_device_ops(backend) and, as `comm`, a
// GpuCommunicator (make_gpu_communicator over the host MPI communicator,
// ordered after the compute stream). Collectives then take device pointers;
// the trainer waits on the host (wait_host) only where the host needs the
// result (SyncBN's hooks), and otherwise lets the compute stream wait.
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/device_ops.hpp"
#include "dlplan/exec/optimizer.hpp"
#include "dlplan/exec/param_store.hpp"
#include "dlplan/exec/plan_file.hpp"
#include "dlplan/ledger.hpp"
#include "dlplan/step_program.hpp"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlplan::exec {

struct StepStats {
  int step = 0;
  double loss = 0;          // mean over every label position of the global batch
  double seconds = 0;       // wall time of the step (rank 0)
  double wait_seconds = 0;  // compute waiting for collectives (exposed communication)
  double comm_bytes = 0;    // sent by this rank (ring accounting)
  double grad_norm = 0;     // NaN on a skipped step
  int64_t peak_bytes = 0;   // allocator peak so far (after the first step: steady state)
  // fp16-mixed: the loss scale this step ran with (0 otherwise), and whether
  // its update was skipped because a gradient overflowed (GradScaler).
  double loss_scale = 0;
  bool skipped = false;
};

// The allocator against the program after every op (Trainer::check_ledger):
// the largest sum over categories of |measured - predicted| seen, and where.
struct LedgerCheck {
  int64_t worst_bytes = 0;
  CategoryBytes measured{}, predicted{};
  int step = -1;
  std::string where;
};

struct TrainOptions {
  int steps = 10;
  uint64_t seed = 1;
  std::string data = "synthetic";
  // Time every compute instruction of the program (dlplan calibrate's per-op
  // costs): the device is synchronized around each, so a step takes longer.
  bool time_ops = false;
};

// What a plan's model needs that the CUDA kernels do not implement yet (the
// CPU engine's do): Phi's partial rotary, Gemma's scaled embedding and its
// RMSNorm with a unit offset. The first found, naming the node; the Trainer
// refuses such a plan on a GPU engine with it.
std::optional<std::string> gpu_engine_lacks(const Model& m);
// Why no engine trains the model (an opaque op of an import), or nothing.
std::optional<std::string> engine_cannot_train(const Model& m);

class Trainer {
 public:
  // Throws dlplan::Error when the plan cannot run here: another world size,
  // a plan for another kind of device, a precision the backend lacks, or a
  // predicted peak (+5%) over the memory there is (the host's share per rank,
  // or the free memory of the GPU shared by this node's ranks).
  Trainer(const LoadedPlan& plan, Communicator& comm, Backend& backend, const TrainOptions& opt,
          std::unique_ptr<MemoryResource> memory = make_host_memory(),
          std::unique_ptr<DeviceOps> ops = make_cpu_device_ops());
  ~Trainer();

  StepStats step();  // one optimizer step (grad_accum micro-batches)
  int steps_done() const { return step_; }
  Allocator& allocator() { return alloc_; }
  // CPU offload's host pool (empty without offload): measured apart from the device's.
  Allocator& host_allocator() { return host_alloc_; }
  DeviceOps& device_ops() { return *ops_; }
  // DESIGN.md's `runtime` (the CUDA context, cuBLAS, NCCL: device memory in use
  // outside the allocator; 0 on the CPU) and the allocator's cached, unused bytes.
  int64_t runtime_bytes() const { return alloc_.memory().runtime_bytes(); }
  int64_t reserved_bytes() { return alloc_.memory().reserved_bytes(); }
  const ParamStore& params() const { return *store_; }
  // For checkpoints (checkpoint.hpp): the state a resumed step needs.
  ParamStore& store() { return *store_; }
  Optimizer& optimizer() { return *optimizer_; }
  const LoadedPlan& plan() const { return plan_; }
  // Continue as if `steps` steps had run: data, dropout and the learning rate
  // are keyed by the step, Adam's bias correction by the optimizer's count.
  void resume_at(int steps) {
    step_ = started_at_ = steps;
    optimizer_->set_steps_taken(steps);
  }
  // fp16-mixed's dynamic loss scale, between steps (checkpoints carry it).
  LossScaleState loss_scale() const { return scale_; }
  void set_loss_scale(const LossScaleState& s) { scale_ = s; }
  const LedgerCheck& ledger_check() const { return ledger_check_; }
  // Every parameter, full (gathered from shards when sharded), in Model::params order.
  std::vector<float> full_parameters();
  std::vector<float> buffers() const;  // BN running statistics, concatenated (on the host)
  int64_t samples_per_step() const;
  // With TrainOptions::time_ops: the last step's seconds per compute event of
  // program() (summed over its micro-batches); empty otherwise.
  const std::vector<double>& op_seconds() const { return op_seconds_; }
  const StepProgram& program() const { return program_; }
  int64_t tokens_per_sample() const;

 private:
  void run_micro_batch(int micro, bool first, bool last, StepStats& stats);
  void check_ledger(const Instr& mark);

  const LoadedPlan& plan_;
  Communicator& comm_;
  Backend& backend_;
  TrainOptions opt_;
  std::unique_ptr<DeviceOps> ops_;  // outlives the store and optimizer that use it
  Allocator alloc_;
  Allocator host_alloc_;  // CPU offload (step_program.hpp's host_state_tensors); outlives the store
  std::unique_ptr<DeviceOps> host_ops_;  // loops over host_alloc_'s tensors
  std::vector<float> transfer_;          // offload: a reduced gradient shard on its way down (pinned, on a GPU)
  Tensor one_;  // d(loss)/d(loss) = 1, outside the accounting (released before alloc_ goes)
  Tensor gemm_workspace_;  // the plan's GEMM workspace, handed to the backend (CUDA: cuBLAS)
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataSource> data_;
  StepProgram program_;
  std::vector<double> op_seconds_;  // TrainOptions::time_ops
  std::unique_ptr<ProgramRunner> runner_;  // slot liveness and the program's bytes (ledger.hpp)
  std::vector<Tensor> slots_;              // what each live slot holds, for the step
  std::vector<WorkHandle> work_;           // per collective of the program
  LedgerCheck ledger_check_;
  int syncbn_group_ = 0;
  // Hybrid sharding: the shard group's handle (0, the world, otherwise), the
  // replicas' (strided) group, and the shard group's on the host communicator.
  int shard_group_ = 0, replica_group_ = 0, host_shard_group_ = 0;
  int host_replica_group_ = 0;  // offload: the replicas' group on the host communicator
  std::unique_ptr<SyncBnHooks> syncbn_;
  int step_ = 0;
  int started_at_ = 0;    // the step this process began at (resume_at)
  LossScaleState scale_;  // fp16-mixed (training.hpp, LossScaling)
  double syncbn_bytes_ = 0;  // sent by SyncBN's collectives this step
  std::vector<WorkHandle> pending_param_gathers_;
  std::map<int, WorkHandle> frozen_gathers_;  // fine-tuning, ZeRO-3: a gather's frozen run (by comm event)
};

}  // namespace dlplan::exec
