#include "dlplan/training.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

namespace dlplan {
namespace {

template <typename E>
E parse_enum(std::string_view s, const char* what, const std::vector<std::pair<std::string, E>>& names) {
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::vector<std::string> known;
  for (const auto& [name, value] : names) {
    if (lower == name) return value;
    known.push_back(name);
  }
  throw Error(fmt::format("unknown {} '{}' (choose one of: {})", what, s, fmt::join(known, ", ")));
}

}  // namespace

std::string to_string(Strategy s) {
  switch (s) {
    case Strategy::ddp: return "ddp";
    case Strategy::zero1: return "zero1";
    case Strategy::zero2: return "zero2";
    case Strategy::zero3: return "zero3";
    case Strategy::hsdp2: return "hsdp2";
    case Strategy::hsdp3: return "hsdp3";
  }
  return "?";
}
std::string to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16_mixed: return "bf16-mixed";
    case Precision::fp16_mixed: return "fp16-mixed";
  }
  return "?";
}
std::string to_string(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::sgd_momentum: return "sgd-momentum";
  }
  return "?";
}
std::string to_string(Checkpointing c) { return c == Checkpointing::none ? "none" : "units"; }
std::string to_string(AttentionImpl a) { return a == AttentionImpl::math ? "math" : "flash"; }
std::string to_string(Offload o) { return o == Offload::none ? "none" : o == Offload::optimizer ? "optimizer" : "params"; }

Strategy parse_strategy(std::string_view s) {
  return parse_enum<Strategy>(s, "strategy", {{"ddp", Strategy::ddp}, {"zero1", Strategy::zero1},
                                              {"zero2", Strategy::zero2}, {"zero3", Strategy::zero3},
                                              {"hsdp2", Strategy::hsdp2}, {"hsdp3", Strategy::hsdp3}});
}
Precision parse_precision(std::string_view s) {
  return parse_enum<Precision>(s, "precision", {{"fp32", Precision::fp32}, {"bf16-mixed", Precision::bf16_mixed},
                                                            {"fp16-mixed", Precision::fp16_mixed}});
}
OptimizerKind parse_optimizer(std::string_view s) {
  return parse_enum<OptimizerKind>(s, "optimizer", {{"adamw", OptimizerKind::adamw}, {"sgd", OptimizerKind::sgd},
                                                    {"sgd-momentum", OptimizerKind::sgd_momentum}});
}
Checkpointing parse_checkpointing(std::string_view s) {
  return parse_enum<Checkpointing>(s, "checkpointing", {{"none", Checkpointing::none}, {"units", Checkpointing::units}});
}
Offload parse_offload(std::string_view s) {
  return parse_enum<Offload>(s, "offload", {{"none", Offload::none}, {"optimizer", Offload::optimizer}, {"params", Offload::params}});
}
AttentionImpl parse_attention(std::string_view s) {
  return parse_enum<AttentionImpl>(s, "attention implementation", {{"math", AttentionImpl::math}, {"flash", AttentionImpl::flash}});
}

int param_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }
int grad_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }
int activation_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }
DType storage_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16_mixed: return DType::bf16;
    case Precision::fp16_mixed: return DType::f16;
  }
  return DType::f32;
}
bool mixed(Precision p) { return p != Precision::fp32; }

LossScaleState next_loss_scale(const LossScaling& cfg, LossScaleState s, bool found_inf) {
  // As ATen's _amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu):
  // on overflow back off and restart the count; otherwise count, and once the
  // count reaches the interval grow (unless that would overflow) and restart.
  if (found_inf) {
    s.scale *= cfg.backoff;
    s.good_steps = 0;
  } else if (++s.good_steps >= cfg.growth_interval) {
    if (std::isfinite(s.scale * cfg.growth)) s.scale *= cfg.growth;
    s.good_steps = 0;
  }
  return s;
}

std::string offload_conflict(const TrainingConfig& t) {
  if (t.offload == Offload::none) return "";
  if (t.strategy == Strategy::ddp)
    return "--offload needs a ZeRO strategy (zero1, zero2, zero3, hsdp2, hsdp3): the optimizer runs on a shard";
  if (t.offload == Offload::params && within_group(t.strategy) != Strategy::zero3)
    return fmt::format("--offload params needs a strategy that shards parameters (zero3, hsdp3), not {}", to_string(t.strategy));
  return "";
}

bool offload_streams_grads(const TrainingConfig& t, int64_t world) {
  (void)world;  // one rank streams as many do
  const Strategy s = within_group(t.strategy);
  return t.offload != Offload::none && (s == Strategy::zero2 || s == Strategy::zero3);
}

bool stages_grads(const TrainingConfig& t, int64_t world) {
  return sharding(t.strategy, shard_world(t, world)).grads || offload_streams_grads(t, world);
}

bool hybrid(Strategy s) { return s == Strategy::hsdp2 || s == Strategy::hsdp3; }

Strategy within_group(Strategy s) {
  if (s == Strategy::hsdp2) return Strategy::zero2;
  if (s == Strategy::hsdp3) return Strategy::zero3;
  return s;
}

int64_t shard_world(const TrainingConfig& t, int64_t world) {
  return hybrid(t.strategy) && t.shard_group > 0 ? std::min<int64_t>(t.shard_group, world) : world;
}

Sharding sharding(Strategy s, int64_t world) {
  Sharding sh;
  if (world <= 1) return sh;
  s = within_group(s);
  sh.optimizer = s != Strategy::ddp;
  sh.grads = s == Strategy::zero2 || s == Strategy::zero3;
  sh.params = s == Strategy::zero3;
  return sh;
}

int optimizer_bytes_per_param(Precision p, OptimizerKind o) {
  int master = mixed(p) ? 4 : 0;  // fp32 master copy
  switch (o) {
    case OptimizerKind::adamw: return master + 8;     // m and v in fp32
    case OptimizerKind::sgd: return master;
    case OptimizerKind::sgd_momentum: return master + 4;
  }
  return master;
}

}  // namespace dlplan
