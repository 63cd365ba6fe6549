// The limits on what dlplan reads, stated once and enforced where the values
// enter (readers, the loader, the training knobs), before anything is
// allocated or multiplied: within them no byte count, FLOP count or batch size
// can overflow 64 bits, and no reader can exhaust the stack or the memory.
// Each is far beyond any real model or cluster; past one, the reader says
// which value and which limit.
#pragma once

#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/training.hpp"

#include <cstdint>
#include <string>

namespace dlplan {

// Files.
inline constexpr int64_t kMaxJsonFileBytes = int64_t{256} << 20;  // a plan with a large model's IR is a few MB
inline constexpr int kMaxJsonDepth = 64;                          // dlplan's documents nest at most ~8 deep

// Models.
inline constexpr int64_t kMaxNodes = int64_t{1} << 20;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 48;   // one tensor, per sample (ops_schema.cpp)
inline constexpr int64_t kMaxSampleElements = int64_t{1} << 48;   // every tensor of one sample together
inline constexpr int64_t kMaxParameters = int64_t{1} << 44;       // 17.6 trillion
inline constexpr int64_t kMaxLayers = 4096;                       // Hugging Face num_hidden_layers / n_layer
inline constexpr int64_t kMaxBytes = int64_t{1} << 60;            // any byte count a document states (an exbibyte)

// Training knobs: the global batch micro_batch x grad_accum x world, and one
// micro-batch's elements (kMaxSampleElements x micro-batch) at 8 bytes each,
// stay far below 2^63.
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 16;
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 40;
inline constexpr int64_t kMaxBatchElements = int64_t{1} << 56;    // one micro-batch, every tensor
inline constexpr int64_t kMaxSampleIndex = int64_t{1} << 62;     // steps x global batch (data is keyed by it)
inline constexpr int kMaxPrefetch = 1024;
inline constexpr double kMaxBucketMb = 1 << 20;                   // a terabyte

// Elements of every tensor of one sample together: inputs, node outputs, and
// what each op declares it saves or uses as a temporary (ops.hpp). Summed in
// double, so it never overflows.
double sample_elements(const Model& m);

// The training knobs against the limits above and against the model and
// cluster: micro-batch, accumulation, global batch, the elements of one
// micro-batch, prefetch, bucket size. Throws dlplan::Error "<where>: <knob>
// ..." where `where` names the plan file, or is empty for command-line flags.
void check_training_limits(const Model& m, const Cluster& c, const TrainingConfig& t, const std::string& where);

}  // namespace dlplan
