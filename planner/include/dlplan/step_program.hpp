// The step program: one training step (one micro-batch, then the optimizer)
// as a list of instructions — allocate, free, run an op forward / backward /
// recomputed, issue a collective, wait for one. The planner's walk counts its
// allocations (step_walk.cpp, a dry run in the manner of ggml's gallocr); the
// executor runs the very same program with real tensors, so both agree on
// when every tensor lives and dies, and the executor's allocator measures the
// bytes that really are allocated (by the ops themselves, for what they keep).
//
// The rules the program encodes (DESIGN.md, "Memory categories", "Strategies"):
//  - Persistent: params (+ BN buffers, fp32), grads, optimizer state, as the
//    strategy keeps them (model_states), the GEMM library workspace, and the
//    micro-batch (workspace) until the end of its backward.
//  - Forward: an op's output lives until its last consumer ran, or, if some op
//    keeps it for backward, until that op's backward ran (then it counts as
//    activations, else workspace). Own saved tensors (statistics,
//    probabilities, masks) live until the op's backward; temporaries while it runs.
//  - Checkpointing `units`: ops inside a unit keep nothing; the unit's inputs
//    are kept instead. Backward recomputes the unit first.
//  - Backward: a tensor's gradient is allocated by the first op whose backward
//    produces it and freed once its producer's backward ran.
//  - Gradient collectives go through staging buffers in `comm`: DDP buckets of
//    bucket_mb (a flat copy, as PyTorch DDP without gradient_as_bucket_view);
//    ZeRO-1 stages one unit's padded gradient after backward; ZeRO-2 / ZeRO-3
//    stage one unit's full gradient from its first contribution (FSDP's flat
//    parameter). At most two gradient collectives are in flight: compute waits
//    for the oldest before issuing a third, and for all before the optimizer.
//    A staging buffer is freed where compute waits for it.
//  - ZeRO-3 gathers a unit's parameters (gathered) before its forward and its
//    backward, `prefetch` units ahead, and frees them after; the root unit is
//    gathered once per step and kept until the last backward.
//  - ZeRO-1 / ZeRO-2 all-gather the updated parameters after the optimizer, in
//    place; the next step's forward waits for them.
//  - CPU offload: the device keeps no optimizer state, no gradient shard
//    (each reduce-scattered shard goes down to the host, which accumulates
//    it in fp32; ZeRO-1 sends its shard of the full gradients down at the
//    optimizer) and, under --offload params, no parameter shard (uploaded
//    into the gathered buffer before each gather). The optimizer runs on the
//    host and uploads the updated parameters.
#pragma once

#include "dlplan/comm_model.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/training.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dlplan {

enum class Category { params, grads, optimizer, activations, gathered, comm, workspace };
inline constexpr int kCategories = 7;
inline constexpr std::array<Category, kCategories> kAllCategories = {
    Category::params,   Category::grads, Category::optimizer, Category::activations,
    Category::gathered, Category::comm,  Category::workspace};
const char* to_string(Category c);

using CategoryBytes = std::array<int64_t, kCategories>;
int64_t total(const CategoryBytes& b);

enum class Phase { forward, backward, recompute, optimizer };
const char* to_string(Phase p);

// The kernel work of one op, for the GPU time model (simulator.cpp,
// docs/gpu-time-model.md): its forward GEMMs (a backward runs, for each, the
// input-gradient and the weight-gradient GEMM) and, for attention, the T x T
// core. Recorded by the step program from the op's shapes; an op without
// GEMMs is costed by its bytes.
struct GemmShape {
  double m = 0, n = 0, k = 0;  // C[m, n] = A[m, k] B[k, n]
  double batch = 1;            // independent products of that shape (grouped convolution, attention heads)
  // Backward runs the input-gradient GEMM (dX = dY W^T) when the input needs
  // its gradient, and the weight-gradient GEMM (dW = X^T dY) when W trains.
  bool input_grad = true, weight_grad = true;
};
struct AttentionCore {
  double batch = 0;            // micro-batch x query heads (0: not attention)
  double seq = 0, head_dim = 0;
  bool causal = false, flash = false, dropout = false;
  double keys = 0;             // key length (cross attention); 0: seq
  double key_len() const { return keys > 0 ? keys : seq; }
};
struct ComputeEvent {
  std::string name;     // node name, or "optimizer"
  Phase phase = Phase::forward;
  int node = -1;
  double flops = 0;     // for the whole micro-batch
  double bytes = 0;     // memory traffic estimate
  std::vector<GemmShape> gemms;  // the op's forward GEMMs, for the whole micro-batch
  AttentionCore attention;       // attention ops: the core between the projections
  // CPU offload's optimizer runs on the host: `bytes` is host memory traffic,
  // and `link_bytes` cross between host and device (gradients down, the
  // updated parameters up) before and after it.
  bool on_host = false;
  double link_bytes = 0;
  // The op as a calibrated cost table knows it (op_costs.hpp): kind, per-sample
  // input shapes, attributes, precision, the gradients its backward computes
  // and how the engine runs it; empty for the optimizer.
  std::string signature;
  // The samples the op computes over: the micro-batch, or 1 for an op
  // computed once per step (TensorInfo::batched); what a cost table's row
  // scales by.
  int64_t samples = 0;
};

// What a collective is for, so that the executor knows its buffers.
enum class CommPurpose {
  bucket_all_reduce,
  unit_reduce_scatter,
  unit_gather,
  root_gather,
  param_all_gather,
  syncbn,
  shard_all_reduce,  // hsdp: a unit's gradient shard, across the shard groups
  overflow_flag,     // fp16-mixed: did any rank's gradients overflow? (inside the optimizer's step)
};

struct CommEvent {
  std::string name;       // "bucket 3 all-reduce", "h.2 all-gather (forward)", ...
  Collective op = Collective::AllReduce;
  CommPurpose purpose = CommPurpose::bucket_all_reduce;
  double bytes = 0;       // the collective's buffer size S (padding included)
  int group = 1;          // ranks taking part
  int stride = 1;         // 1: contiguous ranks; G: ranks equal modulo G (hsdp's replicas of one shard)
  int unit = -1;          // unit_* / param_all_gather
  int bucket = -1;        // bucket_all_reduce
  int slot = -1;          // the staging / gathered buffer's slot
  int issue_after = -1;   // compute event index after which it is issued (-1: step start)
  int wait_before = -1;   // compute event index that waits for it (-1: end of step)
  bool blocking = false;  // compute waits at once (SyncBN)
  int per_step = 1;       // how often it happens per step (grad accumulation)
  // CPU offload: bytes copied between host and device with it, on the same
  // stream (a reduce-scatter's shard down to the host after it; a gather's
  // shard up from the host before it).
  double host_copy_bytes = 0;
};

// Why a slot is allocated; the executor acts on it, the dry run only counts.
enum class Role {
  model_states,    // params / grads / optimizer (the executor's parameter store holds them)
  gemm_workspace,  // the GEMM library's (cuBLAS) cached workspace
  batch_input,     // tensor: a model input for this micro-batch
  node_output,     // tensor: a node's output
  op_saved,        // node, index: the node's own saved tensor `index` (the op allocates it)
  op_temp,         // node: a temporary the op allocates and frees itself
  grad,            // tensor: gradient of a tensor
  gathered,        // unit: ZeRO-3 gathered parameters
  staging,         // comm: a gradient collective's staging buffer
};

// When, with gradient accumulation, an instruction runs: every micro-batch,
// only the first (ZeRO-3's root gather) or only the last (DDP / ZeRO-1
// gradient collectives, the optimizer, parameter all-gathers).
enum class When { every, first_micro, last_micro };

struct Instr {
  enum class Kind { alloc, free, forward, recompute, backward, issue, wait, optimizer, mark };
  Kind kind = Kind::mark;
  When when = When::every;
  int slot = -1;           // alloc / free
  Role role = Role::node_output;
  Category category = Category::workspace;
  int64_t bytes = 0;
  int node = -1;           // forward / recompute / backward; op_saved / op_temp
  int tensor = -1;         // batch_input / node_output / grad
  int unit = -1;           // gathered
  int index = -1;          // op_saved: which own saved tensor
  int comm = -1;           // issue / wait / staging
  int event = -1;          // forward / recompute / backward / optimizer: compute event index
};

// What a slot holds and who keeps it (for --explain; built on request).
struct SlotName {
  std::string what, holder;
};

struct Bucket {
  std::vector<int> params;  // Model::params indices, in the order they complete
  int64_t elements = 0;
  int ready_node = -1;      // the node whose backward completes it
};

struct StepProgram {
  std::vector<Instr> instrs;
  std::vector<ComputeEvent> compute;   // one micro-batch, then the optimizer
  std::vector<CommEvent> comm;
  std::vector<Bucket> buckets;         // DDP
  std::vector<OpDecl> decls;           // per node, as declared for this plan
  std::vector<SlotName> names;         // per slot, only when built with names
  int slot_count = 0;  // (not "slots": a Qt keyword, and the GUI includes this)
  int backward_start = -1;             // index of the first backward compute event
  // Per node: does it run a backward? Empty when every node does (no
  // fine-tuning); a node without one keeps nothing (has_backward_at).
  std::vector<bool> has_backward;
  bool has_backward_at(int node) const {
    return has_backward.empty() || has_backward[static_cast<size_t>(node)];
  }
};

// Does activation checkpointing recompute this node in backward? (Every node
// of a non-root unit under Checkpointing::units.) Its first forward then runs
// without keeping anything: its own saved tensors are temporaries.
bool checkpointed(const Node& n, const TrainingConfig& cfg);

StepProgram build_step_program(const Model& m, const Cluster& cluster, const TrainingConfig& cfg,
                               bool with_names = false);

// Persistent model states per device (params incl. buffers, grads, optimizer)
// as the strategy keeps them: the ZeRO paper's accounting plus padding.
CategoryBytes model_states(const Model& m, int world, const TrainingConfig& cfg);

// The same states as the executor allocates them, tensor by tensor and in its
// order (per unit: parameters, gradients; then each buffer; then per unit the
// optimizer's fp32 master copy under bf16-mixed, m, v), so that an allocator
// rounding each request (a GPU's 512 B blocks) is predicted exactly. Their
// sum per category is model_states().
struct StateTensor {
  Category category = Category::params;
  int64_t bytes = 0;
  std::string what;
};
std::vector<StateTensor> model_state_tensors(const Model& m, int world, const TrainingConfig& cfg);

// CPU offload (DESIGN.md, "Strategies"): what one rank keeps in host memory,
// in the executor's order (per unit: the parameter shard under --offload
// params, the fp32 gradient shard the host accumulates; then per unit the
// optimizer's fp32 master copy, m, v). The master copy is there under fp32
// too: the host updates it, and the device's parameters are copied from it.
// Empty without offload. host_states() sums it by category (params, grads,
// optimizer; the other categories 0).
std::vector<StateTensor> host_state_tensors(const Model& m, int world, const TrainingConfig& cfg);
CategoryBytes host_states(const Model& m, int world, const TrainingConfig& cfg);

// Flat per-unit layout shared by planner and executor: unit u's parameters in
// node order, padded to a multiple of the world size for the sharded strategies.
int64_t pad_to(int64_t n, int64_t multiple);
std::vector<int64_t> unit_parameter_counts(const Model& m);
// Under fine-tuning (fine_tuning.hpp) a unit's parameters form two runs, the
// trainable ones, then the frozen ones, each padded alike when sharded:
// gradients, optimizer state and the gradient collectives cover only the
// first; the parameters (and ZeRO-3's gathers) both.
std::vector<int64_t> unit_trainable_counts(const Model& m);
std::vector<int64_t> unit_frozen_counts(const Model& m);

}  // namespace dlplan
