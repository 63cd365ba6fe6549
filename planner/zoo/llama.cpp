// Llama as Hugging Face's LlamaForCausalLM ("meta-llama/Llama-2-7b-hf":
// num_hidden_layers 32, hidden_size 4096, num_attention_heads 32,
// num_key_value_heads 32, intermediate_size 11008, vocab_size 32000,
// rms_norm_eps 1e-5, rope_theta 10000, tie_word_embeddings false).
// RMSNorm pre-norm blocks, rotary attention without biases, SwiGLU MLP.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

Json attention_attrs(const LlamaConfig& c) {
  Json a{{"heads", c.heads}};
  if (c.kv_heads > 0 && c.kv_heads != c.heads) a["kv_heads"] = c.kv_heads;
  if (c.head_dim > 0 && c.head_dim * c.heads != c.hidden) a["head_dim"] = c.head_dim;
  a["causal"] = true;
  a["bias"] = false;
  if (c.qkv_bias) a["qkv_bias"] = true;
  a["rope"] = true;
  a["rope_theta"] = c.rope_theta;
  return a;
}

std::string llama_block(IrBuilder& b, const LlamaConfig& c, int i, const std::string& x) {
  const std::string p = "layers." + std::to_string(i);
  b.unit(p);
  const Json up{{"out", c.intermediate}, {"bias", false}};

  auto h = b.rmsnorm(p + ".input_layernorm", x, c.hidden, c.rms_eps, c.norm_offset, c.eager);
  h = b.add(p + ".self_attn", "attention", {h}, attention_attrs(c));
  const auto mid = b.add(p + ".add_1", "add", {x, h});
  h = b.rmsnorm(p + ".post_attention_layernorm", mid, c.hidden, c.rms_eps, c.norm_offset, c.eager);
  if (c.experts > 0) {  // MixtralSparseMoeBlock
    // Dropless: a factor of experts / top_k gives every expert room for
    // every token of a sample, whatever the sequence length.
    const double cf = c.capacity_factor > 0 ? c.capacity_factor : static_cast<double>(c.experts) / c.top_k;
    // The router (Mixtral's `gate`), each expert (`experts.e`, w1 / w2 / w3)
    // and the weighted sum, under transformers' module names.
    const std::string moe = p + ".block_sparse_moe";
    const auto probs = b.add(moe + ".gate", "moe_router", {h}, Json{{"experts", c.experts}});
    const Json routing{{"top_k", c.top_k}, {"capacity_factor", cf}};
    std::vector<std::string> combined{probs};
    for (int e = 0; e < c.experts; ++e) {
      Json expert = routing;
      expert["expert"] = e;
      expert["hidden"] = c.intermediate;
      combined.push_back(b.add(moe + ".experts." + std::to_string(e), "moe_expert", {h, probs}, expert));
    }
    h = b.add(moe, "moe_combine", combined, routing);
    return b.add(p + ".add_2", "add", {mid, h});
  }
  const auto gate = b.add(p + ".mlp.gate_proj", "linear", {h}, up);
  const auto upv = b.add(p + ".mlp.up_proj", "linear", {h}, up);
  const auto act = c.mlp_act == "silu"   ? b.add(p + ".mlp.act_fn", "silu", {gate})
                   : c.mlp_act == "gelu" ? b.add(p + ".mlp.act_fn", "gelu", {gate})
                                         : b.add(p + ".mlp.act_fn", "gelu", {gate}, Json{{"approximate", "tanh"}});
  h = b.add(p + ".mlp.mul", "mul", {act, upv});
  h = b.add(p + ".mlp.down_proj", "linear", {h}, Json{{"out", c.hidden}, {"bias", false}});
  return b.add(p + ".add_2", "add", {mid, h});
}

}  // namespace

Json build_llama(const LlamaConfig& c) {
  detail::require(c.layers > 0 && c.hidden > 0 && c.heads > 0 && c.intermediate > 0 &&
                      c.vocab > 0 && c.context > 0 && c.kv_heads >= 0 && c.head_dim >= 0,
                  "llama: sizes must be positive");
  detail::require(c.head_dim > 0 || c.hidden % c.heads == 0,
                  "llama: hidden must divide by heads unless head_dim is given");
  detail::require(c.kv_heads == 0 || c.heads % c.kv_heads == 0,
                  "llama: heads must divide by kv_heads");
  detail::require(c.mlp_act == "silu" || c.mlp_act == "gelu" || c.mlp_act == "gelu_tanh",
                  "llama: mlp_act must be silu, gelu or gelu_tanh");
  detail::require(c.experts == 0 || (c.top_k > 0 && c.top_k <= c.experts),
                  "llama: top_k must be between 1 and experts");
  IrBuilder b(c.name);
  b.input("tokens", {c.context}, "i32");
  b.input("targets", {c.context}, "i32");

  Json embed{{"num", c.vocab}, {"dim", c.hidden}};
  if (c.embed_scale != 1.0) embed["scale"] = c.embed_scale;
  if (c.padding_idx >= 0) embed["padding_idx"] = c.padding_idx;
  auto x = b.add("embed_tokens", "embedding", {"tokens"}, embed);
  for (int i = 0; i < c.layers; ++i) x = llama_block(b, c, i, x);
  b.unit("");
  x = b.rmsnorm("norm", x, c.hidden, c.rms_eps, c.norm_offset, c.eager);
  Json head{{"out", c.vocab}, {"bias", false}};
  if (c.tie_head) head["tie"] = "embed_tokens";
  x = b.add("lm_head", "linear", {x}, head);
  b.add("loss", "cross_entropy", {x, "targets"});
  return b.finish();
}

}  // namespace dlplan::zoo
