// Phi as Hugging Face's PhiForCausalLM (transformers 4.38, "microsoft/phi-2":
// num_hidden_layers 32, hidden_size 2560, num_attention_heads 32,
// intermediate_size 10240, vocab_size 51200, partial_rotary_factor 0.4,
// layer_norm_eps 1e-5, hidden_act gelu_new). Each block is parallel:
//   h = LN(x);  x' = x + dropout(attn(h)) + dropout(fc2(gelu(fc1(h))))
// with biases on q, k, v, dense, fc1, fc2 and lm_head; a final LayerNorm.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

std::string phi_block(IrBuilder& b, const PhiConfig& c, int i, const std::string& x) {
  const std::string p = "layers." + std::to_string(i);
  b.unit(p);
  const int head_dim = c.hidden / c.heads;
  Json attn{{"heads", c.heads}, {"causal", true}, {"rope", true}, {"rope_theta", c.rope_theta}};
  if (c.kv_heads > 0 && c.kv_heads != c.heads) attn["kv_heads"] = c.kv_heads;
  // HF: rotary_emb dim = int(partial_rotary_factor * head_dim).
  const int rot = static_cast<int>(c.partial_rotary * head_dim);
  if (rot != head_dim) attn["rotary_dim"] = rot;
  if (c.attn_dropout > 0.0) attn["dropout"] = c.attn_dropout;

  const auto h = b.add(p + ".input_layernorm", "layernorm", {x}, Json{{"eps", c.ln_eps}});
  auto a = b.add(p + ".self_attn", "attention", {h}, attn);
  a = b.dropout(p + ".resid_dropout_attn", a, c.dropout);
  auto f = b.add(p + ".mlp.fc1", "linear", {h}, Json{{"out", c.intermediate}});
  f = b.gelu_new(p + ".mlp.act", f, c.eager);
  f = b.add(p + ".mlp.fc2", "linear", {f}, Json{{"out", c.hidden}});
  f = b.dropout(p + ".resid_dropout_mlp", f, c.dropout);
  const auto both = b.add(p + ".add_branches", "add", {a, f});
  return b.add(p + ".add_residual", "add", {both, x});
}

}  // namespace

Json build_phi(const PhiConfig& c) {
  detail::require(c.layers > 0 && c.hidden > 0 && c.heads > 0 && c.intermediate > 0 && c.vocab > 0 &&
                      c.context > 0 && c.kv_heads >= 0,
                  "phi: sizes must be positive");
  detail::require(c.hidden % c.heads == 0, "phi: hidden must divide by heads");
  detail::require(c.kv_heads == 0 || c.heads % c.kv_heads == 0, "phi: heads must divide by kv_heads");
  detail::require(c.partial_rotary > 0 && c.partial_rotary <= 1, "phi: partial_rotary must be in (0, 1]");
  const int rot = static_cast<int>(c.partial_rotary * (c.hidden / c.heads));
  detail::require(rot >= 2 && rot % 2 == 0,
                  "phi: partial_rotary x head_dim must be an even number of dims, at least 2");
  IrBuilder b(c.name);
  b.input("tokens", {c.context}, "i32");
  b.input("targets", {c.context}, "i32");

  auto x = b.add("embed_tokens", "embedding", {"tokens"}, Json{{"num", c.vocab}, {"dim", c.hidden}});
  x = b.dropout("embed_dropout", x, c.embd_dropout);
  for (int i = 0; i < c.layers; ++i) x = phi_block(b, c, i, x);
  b.unit("");
  x = b.add("final_layernorm", "layernorm", {x}, Json{{"eps", c.ln_eps}});
  Json head{{"out", c.vocab}, {"bias", true}};
  if (c.tie_head) head["tie"] = "embed_tokens";
  x = b.add("lm_head", "linear", {x}, head);
  b.add("loss", "cross_entropy", {x, "targets"});
  return b.finish();
}

}  // namespace dlplan::zoo
