// Importers: a user's own model from an ONNX file or a Hugging Face
// config.json, turned into IR JSON and then validated by parse_model like any
// IR file. What an importer could not map or had to assume is recorded in
// Model::notes (and Model::unaccounted_bytes), never dropped silently.
#pragma once

#include "dlplan/ir.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlplan {

// Values for an ONNX graph's symbolic dimensions: the leading (batch)
// dimension of every input takes micro_batch, any other symbolic dimension
// takes seq_len (0: unset, and a symbolic non-batch dimension is an error).
// A Hugging Face config keeps its own context length (max_position_embeddings);
// the CLI's --seq-len then applies through with_seq_len like for any model.
//
// fusion (ONNX): which written-out patterns become one fused op.
//  - engine: every pattern dlplan's engines have a fused op for; the plan is
//    what dlplan's engine keeps for backward.
//  - eager: only patterns that PyTorch's eager mode runs as one op too (torch's
//    exporter decomposed them: attention's pieces, LayerNorm below opset 17,
//    erf-GELU, Hardswish). Math written out in Python (Hugging Face's
//    NewGELUActivation, LlamaRMSNorm) stays op by op, so that the plan keeps
//    what PyTorch's eager autograd keeps for such a model (docs/onnx.md).
enum class FusionMode { engine, eager };
const char* to_string(FusionMode f);
// "engine" or "eager"; nullopt for anything else.
std::optional<FusionMode> fusion_from_string(const std::string& s);

struct ImportOptions {
  int64_t micro_batch = 1;
  int64_t seq_len = 0;
  FusionMode fusion = FusionMode::engine;
};

// True when dlplan was built with ONNX (libonnx-dev); otherwise import_onnx
// throws "built without ONNX support".
bool onnx_supported();

// An .onnx file -> Model (with notes). Throws dlplan::Error naming the file.
Model import_onnx(const std::string& path, const ImportOptions& opt = {});

// One parameter's values read from a model file: dlplan's parameter name,
// PyTorch's shape (ParamInfo::shape), and where it came from
// ("h.0.attn.c_attn.weight^T[0:64]": that initializer, transposed, rows 0..63).
struct ImportedWeight {
  std::string name;
  Shape shape;
  std::vector<float> values;
  std::string source;
};

// The weights of an ONNX file exported with its data (torch.onnx.export's
// default export_params=True): every parameter of import_onnx(path, opt)'s
// model, in Model::params order, read from the initializer the importer
// mapped it from. Throws dlplan::Error naming the file and the parameter when
// the data is absent (stripped, external) or a parameter was not traced.
// Without values: only names, shapes and sources (what a file without its
// weights maps, checked against the initializers' dims).
std::vector<ImportedWeight> import_onnx_weights(const std::string& path, const ImportOptions& opt = {},
                                                bool with_values = true);

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
