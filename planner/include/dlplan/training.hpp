// The training knobs a plan fixes: strategy, precision, optimizer,
// checkpointing, attention implementation, micro-batch and accumulation.
#pragma once

#include "dlplan/ir.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan {

// In DESIGN.md's order of simplicity (ties go to the earlier one).
enum class Strategy { ddp, zero1, zero2, zero3, hsdp2, hsdp3 };
enum class Precision { fp32, bf16_mixed, fp16_mixed };
enum class OptimizerKind { adamw, sgd, sgd_momentum };
enum class Checkpointing { none, units };
enum class AttentionImpl { math, flash };
// CPU offload (DESIGN.md, "Strategies"): `optimizer` keeps the optimizer
// state (fp32 master weights included) and the gradients on their way to it
// in host memory, where the optimizer steps (ZeRO-Offload); `params` (zero3,
// hsdp3) keeps the parameter shards there too, copied to the device for each
// gather (FSDP's CPUOffload(offload_params=True)).
enum class Offload { none, optimizer, params };

inline constexpr std::array<Strategy, 6> kAllStrategies = {Strategy::ddp,   Strategy::zero1, Strategy::zero2,
                                                           Strategy::zero3, Strategy::hsdp2, Strategy::hsdp3};

// Hybrid sharding (DESIGN.md, "Strategies"): ZeRO-2 (hsdp2) or ZeRO-3 (hsdp3)
// inside each group of `shard_group` contiguous ranks, replicas across groups.
bool hybrid(Strategy s);
// The ZeRO strategy a rank runs inside its shard group: hsdp2 -> zero2,
// hsdp3 -> zero3, any other strategy itself.
Strategy within_group(Strategy s);

std::string to_string(Strategy s);
std::string to_string(Precision p);
std::string to_string(OptimizerKind o);
std::string to_string(Checkpointing c);
std::string to_string(AttentionImpl a);
std::string to_string(Offload o);
// Parsers throw dlplan::Error listing the accepted names.
Strategy parse_strategy(std::string_view s);
Precision parse_precision(std::string_view s);
OptimizerKind parse_optimizer(std::string_view s);
Checkpointing parse_checkpointing(std::string_view s);
AttentionImpl parse_attention(std::string_view s);
Offload parse_offload(std::string_view s);

// Dynamic loss scaling under fp16-mixed, as PyTorch's torch.cuda.amp.GradScaler
// does it (its defaults): the loss's gradient is multiplied by `scale`; a step
// whose gradients hold an inf or a NaN on any rank is skipped and the scale
// multiplied by `backoff`; after `growth_interval` clean steps in a row it is
// multiplied by `growth`.
struct LossScaling {
  double init_scale = 65536.0;  // 2^16
  double growth = 2.0;
  double backoff = 0.5;
  int growth_interval = 2000;
};

// The scaler's state between steps (checkpoints carry it).
struct LossScaleState {
  double scale = 65536.0;
  int good_steps = 0;  // clean steps since the last change (GradScaler's growth tracker)
};
// GradScaler.update(): the state after a step that found (or not) an overflow.
LossScaleState next_loss_scale(const LossScaling& cfg, LossScaleState s, bool found_inf);

// Fine-tuning (docs/fine-tuning.md): which parameters
// train. `freeze`: globs over node names and unit names (fnmatch(3)); a
// node's parameters are frozen when its name or its unit's matches. `lora_rank`
// > 0 adds LoRA adapters (Hu et al. 2021) beside the weights `lora_targets`
// names -- globs over linear nodes, and q, k, v, o for attention's own
// projections -- and freezes every parameter that is not an adapter.
struct FineTuning {
  std::vector<std::string> freeze;
  int64_t lora_rank = 0;
  std::vector<std::string> lora_targets;  // empty with lora_rank > 0: kDefaultLoraTargets
  double lora_alpha = 0;                  // 0: alpha = rank (scale 1)
  bool active() const { return !freeze.empty() || lora_rank > 0; }
  double lora_scale() const { return lora_rank > 0 ? (lora_alpha > 0 ? lora_alpha : static_cast<double>(lora_rank)) / static_cast<double>(lora_rank) : 0; }
};
// The LoRA paper's choice (Hu et al. 2021, Sec. 7.1): the query and value projections.
inline const std::vector<std::string> kDefaultLoraTargets = {"q", "v"};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;       // sgd-momentum
  double clip_norm = 1.0;      // global-norm clipping; 0 disables
  int warmup_steps = 0;
  double min_lr = 0.0;         // cosine schedule floor
};

struct TrainingConfig {
  Strategy strategy = Strategy::ddp;
  Precision precision = Precision::bf16_mixed;
  OptimizerConfig optimizer;
  Checkpointing checkpointing = Checkpointing::none;
  AttentionImpl attention = AttentionImpl::math;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  double bucket_mb = 25.0;     // DDP / ZeRO-1 gradient bucket cap (PyTorch DDP's default)
  int prefetch = 1;            // ZeRO-3 units gathered ahead of the one computing
  bool syncbn = false;
  int syncbn_group = 0;        // ranks per SyncBN group; 0: all ranks
  int shard_group = 0;         // hsdp2 / hsdp3: ranks per shard group; 0: all ranks (the request sets one node)
  Offload offload = Offload::none;
  LossScaling loss_scaling;    // fp16-mixed only
  FineTuning fine_tuning;      // frozen parameters and LoRA (the model is adapted by apply_fine_tuning)
};

// Why `t.offload` cannot go with `t.strategy` ("" when it can): the
// optimizer offload needs a ZeRO stage (the optimizer runs on a shard), the
// parameter offload a stage that shards parameters (zero3, hsdp3).
std::string offload_conflict(const TrainingConfig& t);

// Does the device keep any gradient under offload? The host accumulates the
// gradient shards that ZeRO-2/3 (hsdp2/3) reduce-scatter in backward -- on one
// rank too, where each unit's gradient goes down whole as soon as backward
// completes it (ZeRO-Offload on a single GPU, Ren et al. 2021, Sec. 4.1);
// ZeRO-1 keeps its full gradients on the device until the step's end, and the
// optimizer's shard of them goes down then.
bool offload_streams_grads(const TrainingConfig& t, int64_t world);
// Are a unit's gradients accumulated in a per-unit staging buffer (comm) and
// sent off when backward completes them? Under ZeRO-2/3 over more than one
// rank (the reduce-scatter), and when they stream to the host.
bool stages_grads(const TrainingConfig& t, int64_t world);

// Ranks the model states are sharded over: the shard group under hsdp2 /
// hsdp3, else the whole data-parallel world.
int64_t shard_world(const TrainingConfig& t, int64_t world);

// bf16-mixed or fp16-mixed: half-precision storage, fp32 master weights.
bool mixed(Precision p);
// fp16-mixed scales the loss (LossScaling) and checks the gradients for overflow.
inline bool loss_scaled(Precision p) { return p == Precision::fp16_mixed; }

// Bytes per element of what the strategy keeps (DESIGN.md, "Strategies"):
// bf16-mixed and fp16-mixed keep half-precision params and grads, fp32 master
// + moments (ZeRO's K = 12 with Adam); fp32 keeps everything in fp32.
int param_bytes(Precision p);
int grad_bytes(Precision p);
int activation_bytes(Precision p);
// The storage type of parameters, gradients and activations (float tensors):
// f32, bf16 under bf16-mixed, f16 under fp16-mixed (DESIGN.md: fp32 master
// weights and moments).
DType storage_dtype(Precision p);

// What a strategy keeps sharded over `world` ranks, its shard world
// (DESIGN.md, "Strategies"): nothing under ddp or on one rank; ZeRO-1 the
// optimizer state, ZeRO-2 (hsdp2) the gradients too, ZeRO-3 (hsdp3) the
// parameters too.
struct Sharding {
  bool optimizer = false, grads = false, params = false;
};
Sharding sharding(Strategy s, int64_t world);
int optimizer_bytes_per_param(Precision p, OptimizerKind o);

}  // namespace dlplan
