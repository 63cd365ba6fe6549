// Loading the model IR: JSON -> validated, shape-inferred Model.
// Every user error names the file and the node (dlplan::Error).
#pragma once

#include "dlplan/ir.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace dlplan {

// `source` names the document in messages (a file path or a zoo name).
Model parse_model(const nlohmann::json& ir, const std::string& source);
Model load_model_file(const std::string& path);

struct ImportOptions;  // dlplan/importers.hpp

// A zoo name ("gpt2"), a path to an IR JSON file, an ONNX file (.onnx) or a
// Hugging Face config.json (a JSON object with "model_type" or
// "architectures"). `opt` gives ONNX symbolic dimensions their values.
Model load_model(const std::string& name_or_path);
Model load_model(const std::string& name_or_path, const ImportOptions& opt);

// The same model with every token input ([T] i32) of length `seq_len`. Checked
// against position tables; a model without token inputs is an error. A
// mixture of experts' capacity is derived anew from its capacity_factor.
Model with_seq_len(const Model& m, int64_t seq_len);

// The same model with every mixture of experts' capacity_factor set (on its
// moe_expert and moe_combine nodes, their capacity derived anew). A model
// without one is an error.
Model with_capacity_factor(const Model& m, double capacity_factor);
// The same model with each moe_expert node a unit of its own, named as the
// node (--expert-units): ZeRO-3 gathers an expert just before it runs and
// frees it after, inside its layer's unit, as FSDP does when each Mixtral
// MixtralBlockSparseTop2MLP is wrapped on its own. A model without experts is
// an error.
Model with_expert_units(const Model& m);
// The input that makes a model encoder-decoder: its decoder's tokens (T5's
// name, as Hugging Face calls it).
inline constexpr const char* kDecoderInputIds = "decoder_input_ids";

// An encoder-decoder model (an input named kDecoderInputIds, T5's) with its
// decoder's token inputs -- decoder_input_ids and the loss's targets -- of
// `tokens` each (--decoder-seq-len); the encoder's keep theirs.
Model with_decoder_seq_len(const Model& m, int64_t tokens);

// Model::params and Model::buffers from each node's declaration (ops.hpp),
// in node order; run again after a node's attributes change (LoRA adapters).
void collect_params(Model& m);

// Tokens per sample (the length of the token inputs) or 0 for non-token models.
int64_t tokens_per_sample(const Model& m);

}  // namespace dlplan
