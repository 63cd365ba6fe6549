// The one request builder. `dlplan plan`'s flags and dlplan-gui's controls
// both become a PlanRequest here, with the same defaults, the same rules
// (the cpu device plans fp32; a --cluster file's topology is kept) and the
// same checks: every value is honoured or refused, never silently changed.
#pragma once

#include "dlplan/importers.hpp"
#include "dlplan/planner.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace dlplan {

inline constexpr const char* kDefaultGpu = "h100-80g";
inline constexpr double kDefaultLr = 3e-4;

// What the user asked for, named as `dlplan plan`'s flags. An unset optional
// takes the default, which the planning then shows (table header, JSON).
struct RequestFlags {
  std::string model;                     // zoo name or file (IR JSON, ONNX, HF config.json)
  std::string gpu;                       // "" : kDefaultGpu, or the --cluster file's device
  std::string cluster_file;
  std::optional<int64_t> gpus, nodes;
  std::optional<int64_t> micro_batch;    // default 1
  bool micro_batch_max = false;          // --micro-batch max
  std::optional<int64_t> global_batch, grad_accum, seq_len;
  std::optional<int64_t> decoder_seq_len;  // an encoder-decoder model's decoder tokens (with_decoder_seq_len)
  std::optional<double> capacity_factor;  // every mixture of experts' (with_capacity_factor)
  bool expert_units = false;             // each expert a unit of its own (with_expert_units)
  std::string fusion;                    // ONNX files: "engine" (default) or "eager" (ImportOptions::fusion)
  std::string precision;                 // "" : bf16-mixed where the device has bf16, else fp16-mixed (cpu: fp32)
  std::string optimizer = "adamw", checkpointing = "none", attention = "math", syncbn = "auto";
  std::string strategy;                  // "" : recommend
  std::optional<int64_t> syncbn_group, prefetch, warmup_steps;
  std::optional<int64_t> shard_group;    // hsdp2 / hsdp3: ranks per shard group (default: one node)
  std::string offload = "none";          // CPU offload: none, optimizer or params
  std::optional<double> bucket_mb, lr, min_lr, clip_norm, weight_decay, eps, momentum;
  std::optional<std::pair<double, double>> betas;
  // Fine-tuning (fine_tuning.hpp): --freeze GLOBS, --lora R, --lora-targets LIST, --lora-alpha A.
  std::string freeze, lora_targets;
  std::optional<int64_t> lora;
  std::optional<double> lora_alpha;
  bool explain = false;
};

// Flags -> request: loads the model and the cluster, applies the defaults and
// checks every value. Throws UsageError for a bad value or combination, and
// dlplan::Error for a bad file (a missing model, a malformed cluster file).
// `load` replaces load_model (the GUI's cache); it gets the model name and
// the values of ONNX symbolic dimensions.
using ModelLoader = std::function<Model(const std::string& name, const ImportOptions& opt)>;
PlanRequest build_request(const RequestFlags& f, const ModelLoader& load = {});

// The nodes and GPUs per node a --cluster file states, or nullopt when it
// describes only the device (then --gpus / --nodes shape the cluster).
std::optional<std::pair<int, int>> cluster_file_topology(const std::string& path);

// A model file dlplan imports: an ONNX file, or a Hugging Face config.json
// (false for a zoo name, an IR JSON, a file that does not exist). Throws
// Error for a .json file that cannot be read or parsed.
bool imports_model(const std::string& model);

// "--fusion": "engine" or "eager" for a model dlplan imports (an ONNX file, a
// Hugging Face config.json); "" is the default, engine. Throws UsageError for
// another value, or for a model that is not imported (a zoo name, IR JSON).
FusionMode parse_fusion(const std::string& fusion, const std::string& model);

// "--micro-batch": a positive integer or "max". Throws UsageError.
void parse_micro_batch(const std::string& text, RequestFlags& f);

}  // namespace dlplan
