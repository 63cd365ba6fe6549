// Hugging Face config.json -> IR, through the zoo's family builders, so an
// imported model and the zoo's own are the same code. Field names and
// defaults are those of transformers' (4.38) GPT2Config, LlamaConfig,
// MistralConfig, MixtralConfig, Qwen2Config, GemmaConfig, PhiConfig, BertConfig and
// ViTConfig. Parameter counts are module parameters only (rotary inv_freq and
// BERT's position_ids are buffers, not counted).
//
// Mapping decisions (each one is reported in the model's notes when it
// changes anything):
//   - bert: dlplan's BERT needs a loss, so it gets BertForSequenceClassification's
//     head with classes = len(id2label), else num_labels, else 2 (transformers'
//     default). Parameters = BertModel (with pooler) + hidden*classes + classes.
//   - vit: ViTForImageClassification (no pooler), classes as for bert.
//   - mistral, qwen2: the llama family; sliding_window attention is ignored
//     (memory is planned as full causal attention, an upper bound). Qwen2 has
//     biases on q, k and v, not on o.
//   - gemma: the llama family with a GeGLU MLP, embeddings scaled by
//     sqrt(hidden_size) and RMSNorm's (1 + w); head_dim is its own field.
//   - phi: parallel attention and MLP blocks, partial rotary.
//   - mixtral: the llama family with each MLP a mixture of
//     num_local_experts SwiGLU experts, num_experts_per_tok per token (the
//     moe_router, moe_expert and moe_combine ops). Mixtral trains dropless;
//     dlplan gives each expert a fixed capacity of 1.25 x tokens x top_k /
//     experts (GShard's, the ops' default) and drops the tokens over it, which the plan's notes say
//     (`dlplan plan --capacity-factor` changes it). The router's
//     load-balancing loss (output_router_logits) is not planned: its tensors
//     are [tokens, experts].
//   - t5: T5ForConditionalGeneration (T5Config): encoder and decoder of
//     num_layers and num_decoder_layers blocks; feed_forward_proj "ACT" or
//     "gated-ACT" ("gated-gelu" is gelu_new, as T5Config maps it); the tied
//     head (tie_word_embeddings, true by default) reads the shared table and
//     the decoder's output times d_model^-1/2. Sequences: n_positions (512)
//     for both, --seq-len and --decoder-seq-len after.
#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <stdexcept>

namespace dlplan {
namespace {

using Json = nlohmann::json;

// Products the family builders form in int: heads x head_dim, and a ViT's
// (image / patch)^2 patches (+1 for the class token).
constexpr int64_t kMaxLayerWidth = int64_t{1} << 24;
constexpr int kMaxGrid = 1 << 15;

class Fields {
 public:
  Fields(const Json& j, std::string src, std::string type) : j_(j), src_(std::move(src)), type_(std::move(type)) {}

  [[noreturn]] void fail(const std::string& msg) const { throw Error(fmt::format("{}: {}", src_, msg)); }

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool is_null(const char* key) const { return j_.contains(key) && j_[key].is_null(); }

  int integer(const char* key) const {
    if (!has(key)) fail(fmt::format("field '{}' is missing (required for model_type '{}')", key, type_));
    return checked_int(key);
  }
  int integer(const char* key, int def) const { return has(key) ? checked_int(key) : def; }
  // A token id in [0, bound), or -1 when absent or null (pad_token_id). A
  // negative id counts from the end, as nn.Embedding's padding_idx does
  // (converted LLaMA configs say -1).
  int index(const char* key, int bound) const {
    if (!has(key)) return -1;
    const Json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < -int64_t{bound} || v.get<int64_t>() >= bound)
      fail(fmt::format("field '{}' must be a token id in [-{}, {}), got {}", key, bound, bound, v.dump()));
    const auto id = v.get<int64_t>();
    return static_cast<int>(id < 0 ? id + bound : id);
  }
  // The number of blocks, bounded before anything is built for each of them.
  int layers(const char* key) const {
    const int n = integer(key);
    if (n > kMaxLayers) fail(fmt::format("field '{}' = {} is more than dlplan's limit of {} layers", key, n, kMaxLayers));
    return n;
  }
  // The first of several spellings that is present (GPT-2: n_positions / n_ctx).
  int integer_any(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return checked_int(k);
    fail(fmt::format("field '{}' is missing (required for model_type '{}')", *keys.begin(), type_));
  }
  double number(const char* key, double def) const {
    if (!has(key)) return def;
    if (!j_[key].is_number()) fail(fmt::format("field '{}' must be a number, got {}", key, j_[key].dump()));
    return j_[key].get<double>();
  }
  bool flag(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) fail(fmt::format("field '{}' must be true or false, got {}", key, j_[key].dump()));
    return j_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j_[key].is_string()) fail(fmt::format("field '{}' must be a string, got {}", key, j_[key].dump()));
    return j_[key].get<std::string>();
  }
  // Classifier classes: len(id2label), else num_labels, else transformers' default 2.
  int classes(std::vector<std::string>& notes) const {
    if (has("id2label")) {
      if (!j_["id2label"].is_object() || j_["id2label"].empty())
        fail("field 'id2label' must be a non-empty object of {index: label}");
      return static_cast<int>(j_["id2label"].size());
    }
    if (has("num_labels")) return integer("num_labels");
    notes.push_back("no id2label or num_labels: a 2-class classifier head (transformers' default) is planned");
    return 2;
  }

 private:
  // Sizes are at most 2^24 (16,777,216: past any published vocabulary, width
  // or context), so the family builders' int arithmetic cannot overflow.
  int checked_int(const char* key) const {
    const Json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > kMaxField)
      fail(fmt::format("field '{}' must be a positive integer up to {}, got {}", key, kMaxField, v.dump()));
    return static_cast<int>(v.get<int64_t>());
  }
  static constexpr int64_t kMaxField = int64_t{1} << 24;

  const Json& j_;
  std::string src_;
  std::string type_;
};

std::string model_name(const Json& j, const std::string& src, const std::string& type) {
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string() && !j["_name_or_path"].get<std::string>().empty())
    return j["_name_or_path"].get<std::string>();
  auto stem = std::filesystem::path(src).stem().string();
  return stem.empty() || stem == "config" ? type : stem;
}

// model_type, or one inferred from architectures[0] ("LlamaForCausalLM").
std::optional<std::string> detect_type(const Json& j) {
  if (j.contains("model_type") && j["model_type"].is_string()) return j["model_type"].get<std::string>();
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    const auto a = j["architectures"][0].get<std::string>();
    const std::pair<const char*, const char*> prefixes[] = {
        {"GPT2", "gpt2"},   {"Llama", "llama"}, {"Mistral", "mistral"}, {"Mixtral", "mixtral"}, {"Qwen2", "qwen2"},
        {"Gemma", "gemma"}, {"Phi", "phi"},     {"Bert", "bert"},       {"ViT", "vit"},       {"T5", "t5"}};
    for (const auto& [p, t] : prefixes)
      if (a.rfind(p, 0) == 0) return std::string(t);
    return a;
  }
  return std::nullopt;
}

zoo::Json gpt2(const Fields& f, const std::string& name, std::vector<std::string>& notes, bool eager) {
  zoo::GptConfig c;
  c.name = name;
  c.layers = f.layers("n_layer");
  c.hidden = f.integer("n_embd");
  c.heads = f.integer("n_head");
  c.vocab = f.integer("vocab_size");
  c.context = f.integer_any({"n_positions", "n_ctx"});
  c.mlp_hidden = f.integer("n_inner", 0);
  c.dropout = f.number("resid_pdrop", 0.1);
  const double embd = f.number("embd_pdrop", 0.1), attn = f.number("attn_pdrop", 0.1);
  if (embd != c.dropout || attn != c.dropout)
    notes.push_back(fmt::format("dropout: resid_pdrop {} planned for embeddings and attention too (embd_pdrop {}, attn_pdrop {})",
                                c.dropout, embd, attn));
  c.tie_head = f.flag("tie_word_embeddings", true);
  const auto act = f.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    notes.push_back(fmt::format("activation_function '{}' planned as GELU (tanh); cost is the same", act));
  if (f.number("layer_norm_epsilon", 1e-5) != 1e-5) notes.push_back("layer_norm_epsilon other than 1e-5 is not recorded (no effect on the plan)");
  if (c.hidden % c.heads != 0) f.fail(fmt::format("n_embd {} must divide by n_head {}", c.hidden, c.heads));
  c.eager = eager;
  return zoo::build_gpt(c);
}

zoo::Json llama(const Fields& f, const std::string& name, const std::string& type, std::vector<std::string>& notes, bool eager) {
  zoo::LlamaConfig c;
  c.name = name;
  c.layers = f.layers("num_hidden_layers");
  c.hidden = f.integer("hidden_size");
  c.heads = f.integer("num_attention_heads");
  c.kv_heads = f.integer("num_key_value_heads", c.heads);
  c.head_dim = f.integer("head_dim", 0);
  c.intermediate = f.integer("intermediate_size");
  c.vocab = f.integer("vocab_size");
  c.context = f.integer("max_position_embeddings");
  c.rms_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  // GemmaConfig ties the head by default; the others do not.
  c.tie_head = f.flag("tie_word_embeddings", type == "gemma");
  if (static_cast<int64_t>(c.heads) * std::max(c.head_dim, 1) > kMaxLayerWidth)
    f.fail(fmt::format("num_attention_heads {} x head_dim {} is more than {}", c.heads, c.head_dim, kMaxLayerWidth));
  if (c.heads % c.kv_heads != 0)
    f.fail(fmt::format("num_attention_heads {} must divide by num_key_value_heads {}", c.heads, c.kv_heads));
  if (c.head_dim == 0 && c.hidden % c.heads != 0)
    f.fail(fmt::format("hidden_size {} must divide by num_attention_heads {} (or give head_dim)", c.hidden, c.heads));
  if (f.flag("attention_bias", false)) f.fail("attention_bias true is not supported (dlplan's llama has no projection biases)");
  if (f.flag("mlp_bias", false)) f.fail("mlp_bias true is not supported (dlplan's llama has no MLP biases)");
  c.qkv_bias = type == "qwen2";  // Qwen2Attention: q, k, v with bias, o_proj without
  // LlamaModel and its relatives: nn.Embedding(vocab, hidden, padding_idx=pad_token_id).
  c.padding_idx = f.index("pad_token_id", c.vocab);
  if (type == "gemma") {
    // GemmaMLP: the gate's activation is hidden_activation where given
    // (transformers >= 4.40), else hidden_act. GemmaModel scales the
    // embeddings by sqrt(hidden_size); GemmaRMSNorm computes x (1 + w).
    const auto act = f.has("hidden_activation") ? f.text("hidden_activation", "") : f.text("hidden_act", "gelu_pytorch_tanh");
    if (act == "gelu") c.mlp_act = "gelu";
    else if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") c.mlp_act = "gelu_tanh";
    else f.fail(fmt::format("hidden_act '{}' is not supported for gemma (GeGLU with gelu or gelu_pytorch_tanh)", act));
    c.embed_scale = std::sqrt(static_cast<double>(c.hidden));
    c.norm_offset = 1.0;
  } else {
    const auto act = f.text("hidden_act", "silu");
    if (act != "silu") f.fail(fmt::format("hidden_act '{}' is not supported (SwiGLU with silu only)", act));
  }
  if (f.number("attention_dropout", 0.0) != 0.0)
    notes.push_back(fmt::format("attention_dropout {} ignored (dlplan's {} has no attention-probability dropout)",
                                f.number("attention_dropout", 0.0), type));
  if (type == "qwen2" && f.flag("use_sliding_window", false))
    notes.push_back("use_sliding_window ignored: attention memory and FLOPs are planned as full causal attention (an upper bound)");
  if (type == "mixtral") {
    c.experts = f.integer("num_local_experts", 8);
    c.top_k = f.integer("num_experts_per_tok", 2);
    if (c.top_k > c.experts)
      f.fail(fmt::format("num_experts_per_tok {} exceeds num_local_experts {}", c.top_k, c.experts));
    if (f.flag("output_router_logits", false))
      notes.push_back("output_router_logits: the router's load-balancing loss is not planned (its tensors are [tokens, experts])");
  }
  if ((type == "mistral" || type == "mixtral") && f.has("sliding_window"))
    notes.push_back(fmt::format("sliding_window {} ignored: attention memory and FLOPs are planned as full causal attention (an upper bound)",
                                f.integer("sliding_window")));
  if (f.has("rope_scaling")) notes.push_back("rope_scaling ignored (no effect on memory or FLOPs)");
  c.eager = eager;
  return zoo::build_llama(c);
}

zoo::Json phi(const Fields& f, const std::string& name, std::vector<std::string>& notes, bool eager) {
  zoo::PhiConfig c;
  c.name = name;
  c.layers = f.layers("num_hidden_layers");
  c.hidden = f.integer("hidden_size");
  c.heads = f.integer("num_attention_heads");
  c.kv_heads = f.integer("num_key_value_heads", c.heads);
  c.intermediate = f.integer("intermediate_size");
  c.vocab = f.integer("vocab_size");
  c.context = f.integer("max_position_embeddings");
  c.partial_rotary = f.number("partial_rotary_factor", 0.5);
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.ln_eps = f.number("layer_norm_eps", 1e-5);
  c.dropout = f.number("resid_pdrop", 0.0);
  c.embd_dropout = f.number("embd_pdrop", 0.0);
  c.attn_dropout = f.number("attention_dropout", 0.0);
  c.tie_head = f.flag("tie_word_embeddings", false);
  if (f.flag("qk_layernorm", false)) f.fail("qk_layernorm true is not supported (dlplan's attention has no q/k LayerNorm)");
  const auto act = f.text("hidden_act", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    notes.push_back(fmt::format("hidden_act '{}' planned as GELU (tanh); cost is the same", act));
  if (f.has("rope_scaling")) notes.push_back("rope_scaling ignored (no effect on memory or FLOPs)");
  if (c.hidden % c.heads != 0)
    f.fail(fmt::format("hidden_size {} must divide by num_attention_heads {}", c.hidden, c.heads));
  if (c.heads % c.kv_heads != 0)
    f.fail(fmt::format("num_attention_heads {} must divide by num_key_value_heads {}", c.heads, c.kv_heads));
  // HF: rotary dims = int(partial_rotary_factor x head_dim); the factor is
  // checked first, so that the conversion cannot overflow.
  const bool in_range = c.partial_rotary > 0 && c.partial_rotary <= 1;
  const int rot = in_range ? static_cast<int>(c.partial_rotary * (c.hidden / c.heads)) : 0;
  if (!in_range || rot < 2 || rot % 2 != 0)
    f.fail(fmt::format("partial_rotary_factor {} x head_dim {} must give an even number of rotary dims, at least 2",
                       c.partial_rotary, c.hidden / c.heads));
  c.eager = eager;
  return zoo::build_phi(c);
}

zoo::Json bert(const Fields& f, const std::string& name, std::vector<std::string>& notes) {
  zoo::BertConfig c;
  c.name = name;
  c.layers = f.layers("num_hidden_layers");
  c.hidden = f.integer("hidden_size");
  c.heads = f.integer("num_attention_heads");
  c.intermediate = f.integer("intermediate_size");
  c.vocab = f.integer("vocab_size");
  c.max_positions = f.integer("max_position_embeddings");
  c.type_vocab = f.integer("type_vocab_size", 2);
  c.context = c.max_positions;
  c.ln_eps = f.number("layer_norm_eps", 1e-12);
  // BertEmbeddings: nn.Embedding(vocab, hidden, padding_idx=pad_token_id),
  // BertConfig's default 0; null means none.
  c.padding_idx = f.has("pad_token_id") ? f.index("pad_token_id", c.vocab) : f.is_null("pad_token_id") ? -1 : 0;
  c.dropout = f.number("hidden_dropout_prob", 0.1);
  const double attn = f.number("attention_probs_dropout_prob", 0.1);
  if (attn != c.dropout)
    notes.push_back(fmt::format("attention_probs_dropout_prob {} planned as hidden_dropout_prob {}", attn, c.dropout));
  if (f.has("classifier_dropout") && f.number("classifier_dropout", c.dropout) != c.dropout)
    notes.push_back("classifier_dropout planned as hidden_dropout_prob");
  const auto act = f.text("hidden_act", "gelu");
  if (act != "gelu") notes.push_back(fmt::format("hidden_act '{}' planned as GELU", act));
  const auto pos = f.text("position_embedding_type", "absolute");
  if (pos != "absolute") f.fail(fmt::format("position_embedding_type '{}' is not supported (absolute only)", pos));
  c.classes = f.classes(notes);
  notes.push_back(fmt::format("BertForSequenceClassification: BertModel with pooler plus a {}-class head ({} parameters)",
                              c.classes, static_cast<int64_t>(c.hidden) * c.classes + c.classes));
  if (c.hidden % c.heads != 0) f.fail(fmt::format("hidden_size {} must divide by num_attention_heads {}", c.hidden, c.heads));
  return zoo::build_bert(c);
}

zoo::Json t5(const Fields& f, const std::string& name, std::vector<std::string>& notes, bool eager) {
  zoo::T5Config c;
  c.name = name;
  c.layers = f.layers("num_layers");
  c.decoder_layers = f.has("num_decoder_layers") ? f.layers("num_decoder_layers") : c.layers;
  c.d_model = f.integer("d_model");
  c.d_kv = f.integer("d_kv");
  c.heads = f.integer("num_heads");
  c.d_ff = f.integer("d_ff");
  c.vocab = f.integer("vocab_size");
  c.enc_len = c.dec_len = f.integer("n_positions", 512);
  c.buckets = f.integer("relative_attention_num_buckets", 32);
  c.max_distance = f.integer("relative_attention_max_distance", 128);
  c.dropout = f.number("dropout_rate", 0.1);
  c.eps = f.number("layer_norm_epsilon", 1e-6);
  c.tie_head = f.flag("tie_word_embeddings", true);
  if (static_cast<int64_t>(c.heads) * c.d_kv > kMaxLayerWidth)
    f.fail(fmt::format("num_heads {} x d_kv {} is more than {}", c.heads, c.d_kv, kMaxLayerWidth));
  // T5Config: "ACT" or "gated-ACT", ACT one of transformers' activations.
  const auto proj = f.text("feed_forward_proj", "relu");
  c.gated = proj.rfind("gated-", 0) == 0;
  const std::string act = c.gated ? proj.substr(6) : proj;
  if (proj == "gated-gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh") c.act = "gelu_tanh";
  else if (act == "relu" || act == "gelu" || act == "silu") c.act = act;
  else f.fail(fmt::format("feed_forward_proj '{}' is not supported (relu, gelu, gelu_new, silu, each optionally gated-)", proj));
  if ((c.buckets / 2) / 2 < 1 || c.max_distance <= (c.buckets / 2) / 2)
    f.fail(fmt::format("relative_attention_num_buckets {} and relative_attention_max_distance {} leave no bucketed offsets",
                       c.buckets, c.max_distance));
  notes.push_back(fmt::format("T5ForConditionalGeneration: encoder and decoder of {} tokens (n_positions; --seq-len and "
                              "--decoder-seq-len set them)", c.enc_len));
  c.eager = eager;
  return zoo::build_t5(c);
}

zoo::Json vit(const Fields& f, const std::string& name, std::vector<std::string>& notes) {
  zoo::VitConfig c;
  c.name = name;
  c.layers = f.layers("num_hidden_layers");
  c.hidden = f.integer("hidden_size");
  c.heads = f.integer("num_attention_heads");
  c.mlp_hidden = f.integer("intermediate_size");
  c.image = f.integer("image_size");
  c.patch = f.integer("patch_size");
  c.channels = f.integer("num_channels", 3);
  c.ln_eps = f.number("layer_norm_eps", 1e-12);
  c.dropout = f.number("hidden_dropout_prob", 0.0);
  if (f.number("attention_probs_dropout_prob", 0.0) != 0.0)
    notes.push_back("attention_probs_dropout_prob ignored (dlplan's ViT has no attention-probability dropout)");
  if (!f.flag("qkv_bias", true)) f.fail("qkv_bias false is not supported");
  const auto act = f.text("hidden_act", "gelu");
  if (act != "gelu") notes.push_back(fmt::format("hidden_act '{}' planned as GELU", act));
  if (c.image / c.patch > kMaxGrid)
    f.fail(fmt::format("image_size {} / patch_size {} is more than {} patches a side", c.image, c.patch, kMaxGrid));
  if (c.image % c.patch != 0) f.fail(fmt::format("image_size {} must divide by patch_size {}", c.image, c.patch));
  if (c.hidden % c.heads != 0) f.fail(fmt::format("hidden_size {} must divide by num_attention_heads {}", c.hidden, c.heads));
  c.classes = f.classes(notes);
  notes.push_back(fmt::format("ViTForImageClassification: ViTModel without pooler plus a {}-class head", c.classes));
  return zoo::build_vit(c);
}

}  // namespace

std::vector<std::string> hf_supported_model_types() {
  return {"gpt2", "llama", "mistral", "mixtral", "qwen2", "gemma", "phi", "bert", "vit", "t5"};
}

bool is_hf_config(const nlohmann::json& doc) {
  return doc.is_object() && (doc.contains("model_type") || doc.contains("architectures")) && !doc.contains("nodes");
}

nlohmann::ordered_json hf_config_to_ir(const nlohmann::json& j, const std::string& src, std::vector<std::string>* notes_out,
                                       const ImportOptions& opt) {
  if (!j.is_object()) throw Error(fmt::format("{}: a Hugging Face config must be a JSON object", src));
  auto type = detect_type(j);
  const auto supported = hf_supported_model_types();
  if (!type)
    throw Error(fmt::format("{}: field 'model_type' is missing or not a string (supported: {})", src, fmt::join(supported, ", ")));
  if (std::find(supported.begin(), supported.end(), *type) == supported.end())
    throw Error(fmt::format("{}: model_type '{}' is not supported (supported: {})", src, *type, fmt::join(supported, ", ")));
  std::vector<std::string> notes;
  Fields f(j, src, *type);
  const auto name = model_name(j, src, *type);
  zoo::Json ir;
  try {
    // --fusion eager: the math transformers writes in Python (RMSNorm,
    // gelu_new) op by op, as PyTorch's eager mode runs it.
    const bool eager = opt.fusion == FusionMode::eager;
    if (eager)
      notes.push_back(*type == "bert" || *type == "vit"
                          ? "--fusion eager: nothing to unfuse (this family's GELU and LayerNorm are one PyTorch op each)"
                          : "--fusion eager: RMSNorm and gelu_new planned op by op, as PyTorch's eager autograd runs "
                            "transformers' Python");
    if (*type == "gpt2") ir = gpt2(f, name, notes, eager);
    else if (*type == "llama" || *type == "mistral" || *type == "mixtral" || *type == "qwen2" || *type == "gemma") ir = llama(f, name, *type, notes, eager);
    else if (*type == "phi") ir = phi(f, name, notes, eager);
    else if (*type == "bert") ir = bert(f, name, notes);
    else if (*type == "t5") ir = t5(f, name, notes, eager);
    else ir = vit(f, name, notes);
  } catch (const std::invalid_argument& e) {  // a zoo builder's own check
    throw Error(fmt::format("{}: {}", src, e.what()));
  }
  if (notes_out) *notes_out = std::move(notes);
  return ir;
}

Model import_hf_config(const std::string& path, const ImportOptions& opt) {
  const Json j = read_json_file(path, "config file");
  std::vector<std::string> notes;
  Model m = parse_model(Json(hf_config_to_ir(j, path, &notes, opt)), path);
  m.notes = std::move(notes);
  return m;
}

}  // namespace dlplan
