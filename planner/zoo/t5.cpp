// T5 as Hugging Face's T5ForConditionalGeneration (transformers 4.38,
// modeling_t5.py; Raffel et al. 2020). Node names follow the module names,
// so that parameter names read as transformers' do:
//   shared                              the token embedding; decoder.embed_tokens reads its table
//   encoder.block.N.layer.0             T5LayerSelfAttention: layer_norm, SelfAttention
//   encoder.block.N.layer.1             T5LayerFF: layer_norm, DenseReluDense
//   decoder.block.N.layer.1             T5LayerCrossAttention: layer_norm, EncDecAttention
//   {en,de}coder.block.0.layer.0.SelfAttention.relative_attention_bias
//                                       the stack's bias table [buckets, heads]
//   {en,de}coder.final_layer_norm, lm_head
// Each residual branch is x + dropout(sublayer(layer_norm(x))); the stacks
// begin and end with a dropout. T5LayerNorm is RMSNorm without a bias.
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

#include <cmath>

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

// One stack's attention attributes: no biases, scale 1, T5's dropout.
Json attention_attrs(const T5Config& c) {
  Json a{{"heads", c.heads}, {"head_dim", c.d_kv}, {"bias", false}, {"scale", 1.0}};
  if (c.dropout > 0.0) a["dropout"] = c.dropout;
  return a;
}

// The feed-forward's activation node.
std::string activation(IrBuilder& b, const T5Config& c, const std::string& name, const std::string& x) {
  if (c.act == "relu" || c.act == "silu") return b.add(name, c.act, {x});
  if (c.act == "gelu_tanh") return b.gelu_new(name, x, c.eager);  // HF's gelu_new
  return b.add(name, "gelu", {x});
}

// T5LayerFF: x + dropout(wo(dropout(act(wi(h))))) (T5DenseActDense), or
// gated, x + dropout(wo(dropout(act(wi_0 h) * wi_1 h))) (T5DenseGatedActDense).
std::string feed_forward(IrBuilder& b, const T5Config& c, const std::string& p, const std::string& x) {
  const auto h = b.rmsnorm(p + ".layer_norm", x, c.d_model, c.eps, 0.0, c.eager);
  const std::string d = p + ".DenseReluDense";
  std::string f;
  if (c.gated) {
    const auto g = b.add(d + ".wi_0", "linear", {h}, Json{{"out", c.d_ff}, {"bias", false}});
    const auto act = activation(b, c, d + ".act", g);
    const auto up = b.add(d + ".wi_1", "linear", {h}, Json{{"out", c.d_ff}, {"bias", false}});
    f = b.add(d + ".mul", "mul", {act, up});
  } else {
    f = b.add(d + ".wi", "linear", {h}, Json{{"out", c.d_ff}, {"bias", false}});
    f = activation(b, c, d + ".act", f);
  }
  f = b.dropout(d + ".dropout", f, c.dropout);
  f = b.add(d + ".wo", "linear", {f}, Json{{"out", c.d_model}, {"bias", false}});
  f = b.dropout(p + ".dropout", f, c.dropout);
  return b.add(p + ".add", "add", {x, f});
}

// A pre-norm attention sublayer: x + dropout(attention(layer_norm(x), extra...)).
std::string attention_layer(IrBuilder& b, const T5Config& c, const std::string& p, const std::string& module,
                            const std::string& x, std::vector<std::string> extra, Json attrs) {
  const auto h = b.rmsnorm(p + ".layer_norm", x, c.d_model, c.eps, 0.0, c.eager);
  std::vector<std::string> in{h};
  in.insert(in.end(), extra.begin(), extra.end());
  auto a = b.add(p + "." + module, "attention", in, attrs);
  a = b.dropout(p + ".dropout", a, c.dropout);
  return b.add(p + ".add", "add", {x, a});
}

}  // namespace

Json build_t5(const T5Config& c) {
  detail::require(c.layers > 0 && c.decoder_layers > 0 && c.d_model > 0 && c.d_kv > 0 && c.heads > 0 && c.d_ff > 0 &&
                      c.vocab > 0 && c.enc_len > 0 && c.dec_len > 0 && c.buckets > 0 && c.max_distance > 0,
                  "t5: sizes must be positive");
  detail::require(c.act == "relu" || c.act == "gelu" || c.act == "gelu_tanh" || c.act == "silu",
                  "t5: act must be relu, gelu, gelu_tanh or silu");
  IrBuilder b(c.name);
  b.input("input_ids", {c.enc_len}, "i32");
  b.input(kDecoderInputIds, {c.dec_len}, "i32");
  b.input("labels", {c.dec_len}, "i32");
  const Json bias_table{{"heads", c.heads}, {"buckets", c.buckets}, {"max_distance", c.max_distance}};

  // Encoder.
  auto x = b.add("shared", "embedding", {"input_ids"}, Json{{"num", c.vocab}, {"dim", c.d_model}});
  x = b.dropout("encoder.dropout", x, c.dropout);
  std::string enc_bias;
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "encoder.block." + std::to_string(i);
    b.unit(p);
    if (i == 0) {
      Json t = bias_table;
      t["bidirectional"] = true;
      enc_bias = b.add(p + ".layer.0.SelfAttention.relative_attention_bias", "relative_position_bias", {"input_ids"}, t);
    }
    Json attrs = attention_attrs(c);
    attrs["position_bias"] = true;
    x = attention_layer(b, c, p + ".layer.0", "SelfAttention", x, {enc_bias}, attrs);
    x = feed_forward(b, c, p + ".layer.1", x);
  }
  b.unit("");
  x = b.rmsnorm("encoder.final_layer_norm", x, c.d_model, c.eps, 0.0, c.eager);
  const std::string memory = b.dropout("encoder.final_dropout", x, c.dropout);

  // Decoder: the shared table again (one parameter, as transformers' shared
  // embedding is both stacks' embed_tokens).
  auto y = b.add("decoder.embed_tokens", "embedding", {kDecoderInputIds},
                 Json{{"num", c.vocab}, {"dim", c.d_model}, {"tie", "shared"}});
  y = b.dropout("decoder.dropout", y, c.dropout);
  std::string dec_bias;
  for (int i = 0; i < c.decoder_layers; ++i) {
    const std::string p = "decoder.block." + std::to_string(i);
    b.unit(p);
    if (i == 0) {
      Json t = bias_table;
      t["bidirectional"] = false;
      dec_bias = b.add(p + ".layer.0.SelfAttention.relative_attention_bias", "relative_position_bias",
                       {kDecoderInputIds}, t);
    }
    Json self_attrs = attention_attrs(c);
    self_attrs["position_bias"] = true;
    self_attrs["causal"] = true;
    y = attention_layer(b, c, p + ".layer.0", "SelfAttention", y, {dec_bias}, self_attrs);
    Json cross_attrs = attention_attrs(c);
    cross_attrs["cross"] = true;
    y = attention_layer(b, c, p + ".layer.1", "EncDecAttention", y, {memory}, cross_attrs);
    y = feed_forward(b, c, p + ".layer.2", y);
  }
  b.unit("");
  y = b.rmsnorm("decoder.final_layer_norm", y, c.d_model, c.eps, 0.0, c.eager);
  y = b.dropout("decoder.final_dropout", y, c.dropout);
  Json head{{"out", c.vocab}, {"bias", false}};
  if (c.tie_head) {  // T5ForConditionalGeneration: sequence_output * model_dim**-0.5 before the tied lm_head
    head["tie"] = "shared";
    head["scale"] = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  }
  y = b.add("lm_head", "linear", {y}, head);
  b.add("loss", "cross_entropy", {y, "labels"});
  return b.finish();
}

}  // namespace dlplan::zoo
