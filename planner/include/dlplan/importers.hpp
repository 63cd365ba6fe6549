// Importers: a user's own model from an ONNX file or a Hugging Face
// config.json, turned into IR JSON and then validated by parse_model like any
// IR file. What an importer could not map or had to assume is recorded in
// Model::notes (and Model::unaccounted_bytes), never dropped silently.
#pragma once

#include "dlplan/ir.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dlplan {

// Values for an ONNX graph's symbolic dimensions: the leading (batch)
// dimension of every input takes micro_batch, any other symbolic dimension
// takes seq_len (0: unset, and a symbolic non-batch dimension is an error).
// A Hugging Face config keeps its own context length (max_position_embeddings);
// the CLI's --seq-len then applies through with_seq_len like for any model.
struct ImportOptions {
  int64_t micro_batch = 1;
  int64_t seq_len = 0;
};

// True when dlplan was built with ONNX (libonnx-dev); otherwise import_onnx
// throws "built without ONNX support".
bool onnx_supported();

// An .onnx file -> Model (with notes). Throws dlplan::Error naming the file.
Model import_onnx(const std::string& path, const ImportOptions& opt = {});

// A parsed Hugging Face config.json -> IR JSON built by the zoo's family
// builders (gpt2, llama, mistral, bert, vit). `notes` receives what was
// ignored or assumed. Throws dlplan::Error naming `source` and the field.
nlohmann::ordered_json hf_config_to_ir(const nlohmann::json& config, const std::string& source,
                                       std::vector<std::string>* notes = nullptr, const ImportOptions& opt = {});
Model import_hf_config(const std::string& path, const ImportOptions& opt = {});

// Whether a parsed JSON document is a Hugging Face config (has "model_type"
// or "architectures" at the top level) rather than dlplan IR.
bool is_hf_config(const nlohmann::json& doc);

// The model_type values import_hf_config understands.
std::vector<std::string> hf_supported_model_types();

}  // namespace dlplan
