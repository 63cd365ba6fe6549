// GPT-2 as Hugging Face's GPT2LMHeadModel (configs "gpt2": n_layer 12,
// n_embd 768, n_head 12, vocab_size 50257, n_positions 1024; "gpt2-medium":
// n_layer 24, n_embd 1024, n_head 16). Pre-LN blocks, GELU(tanh) MLP of 4 x
// n_embd, lm_head tied to wte. Node names follow the HF module names.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

std::string gpt_block(IrBuilder& b, const GptConfig& c, int i, const std::string& x) {
  const std::string p = "h." + std::to_string(i);
  b.unit(p);
  Json attn{{"heads", c.heads}, {"causal", true}};
  if (c.dropout > 0.0) attn["dropout"] = c.dropout;
  const int mlp = c.mlp_hidden > 0 ? c.mlp_hidden : 4 * c.hidden;

  auto h = b.add(p + ".ln_1", "layernorm", {x});
  h = b.add(p + ".attn", "attention", {h}, attn);
  h = b.dropout(p + ".attn.resid_dropout", h, c.dropout);
  const auto mid = b.add(p + ".add_1", "add", {x, h});
  h = b.add(p + ".ln_2", "layernorm", {mid});
  h = b.add(p + ".mlp.c_fc", "linear", {h}, Json{{"out", mlp}});
  h = b.gelu_new(p + ".mlp.act", h, c.eager);
  h = b.add(p + ".mlp.c_proj", "linear", {h}, Json{{"out", c.hidden}});
  h = b.dropout(p + ".mlp.dropout", h, c.dropout);
  return b.add(p + ".add_2", "add", {mid, h});
}

}  // namespace

Json build_gpt(const GptConfig& c) {
  detail::require(c.layers > 0 && c.hidden > 0 && c.heads > 0 && c.vocab > 0 && c.context > 0,
                  "gpt: sizes must be positive");
  detail::require(c.hidden % c.heads == 0, "gpt: hidden must divide by heads");
  IrBuilder b(c.name);
  b.input("tokens", {c.context}, "i32");
  b.input("targets", {c.context}, "i32");

  auto x = b.add("wte", "embedding", {"tokens"}, Json{{"num", c.vocab}, {"dim", c.hidden}});
  x = b.add("wpe", "pos_embedding", {x}, Json{{"max_len", c.context}});
  x = b.dropout("drop", x, c.dropout);
  for (int i = 0; i < c.layers; ++i) x = gpt_block(b, c, i, x);
  b.unit("");
  x = b.add("ln_f", "layernorm", {x});
  Json head{{"out", c.vocab}, {"bias", false}};
  if (c.tie_head) head["tie"] = "wte";
  x = b.add("lm_head", "linear", {x}, head);
  b.add("loss", "cross_entropy", {x, "targets"}, c.fused_loss ? Json{{"fused", true}} : Json::object());
  return b.finish();
}

}  // namespace dlplan::zoo
