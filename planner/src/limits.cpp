#include "dlplan/limits.hpp"

#include "dlplan/error.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dlplan {

double sample_elements(const Model& m) {
  double n = 0;
  for (const auto& t : m.tensors) n += static_cast<double>(numel(t.shape));
  for (const auto& node : m.nodes) {
    const OpDecl d = declare(m, node);  // math attention: the larger form
    for (const auto& s : d.saved)
      if (s.ref == SavedTensor::Ref::own) n += static_cast<double>(s.numel);
    for (const auto& t : d.fwd_temps) n += static_cast<double>(t.numel);
    for (const auto& t : d.bwd_temps) n += static_cast<double>(t.numel);
  }
  return n;
}

void check_training_limits(const Model& m, const Cluster& c, const TrainingConfig& t, const std::string& where) {
  const bool flags = where.empty();
  const std::string at = flags ? std::string() : where + ": ";
  auto name = [flags](const char* flag, const char* field) { return flags ? flag : field; };
  auto in_range = [&](const char* flag, const char* field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw Error(fmt::format("{}{} = {} is outside [{}, {}]", at, name(flag, field), v, lo, hi));
  };
  in_range("--micro-batch", "micro_batch", t.micro_batch, 1, kMaxMicroBatch);
  in_range("--grad-accum", "grad_accum", t.grad_accum, 1, kMaxGradAccum);
  in_range("--prefetch", "prefetch", t.prefetch, 0, kMaxPrefetch);
  in_range("--shard-group", "shard_group", t.shard_group, 0, c.world());
  if (t.shard_group > 0 && c.world() % t.shard_group != 0)
    throw Error(fmt::format("{}{} = {} does not divide the world of {} ranks", at, name("--shard-group", "shard_group"),
                            t.shard_group, c.world()));
  if (!(t.bucket_mb > 0 && t.bucket_mb <= kMaxBucketMb))  // NaN fails too
    throw Error(fmt::format("{}{} = {} is outside (0, {}]", at, name("--bucket-mb", "bucket_mb"), t.bucket_mb, kMaxBucketMb));
  const double global = static_cast<double>(t.micro_batch) * static_cast<double>(t.grad_accum) * c.world();
  if (global > static_cast<double>(kMaxGlobalBatch))
    throw Error(fmt::format("{}the global batch {} x {} x {} GPUs = {:.4g} is more than 2^40 samples", at,
                            name("--micro-batch", "micro_batch"), name("--grad-accum", "grad_accum"), c.world(), global));
  const double elements = sample_elements(m) * static_cast<double>(t.micro_batch);
  if (elements > static_cast<double>(kMaxBatchElements))
    throw Error(fmt::format("{}{} {}: one micro-batch would hold {:.4g} tensor elements, more than 2^56", at,
                            name("--micro-batch", "micro_batch"), t.micro_batch, elements));
}

}  // namespace dlplan
