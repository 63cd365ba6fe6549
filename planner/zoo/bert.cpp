// BERT as Hugging Face's BertForSequenceClassification ("bert-base-uncased":
// num_hidden_layers 12, hidden_size 768, num_attention_heads 12,
// intermediate_size 3072, vocab_size 30522, max_position_embeddings 512,
// type_vocab_size 2, layer_norm_eps 1e-12, hidden_dropout_prob 0.1,
// attention_probs_dropout_prob 0.1, hidden_act "gelu"). Post-LN encoder,
// tanh pooler on the first token, dropout, linear classifier.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

std::string bert_embeddings(IrBuilder& b, const BertConfig& c) {
  const Json ln{{"eps", c.ln_eps}};
  Json word{{"num", c.vocab}, {"dim", c.hidden}};
  if (c.padding_idx >= 0) word["padding_idx"] = c.padding_idx;
  const auto words = b.add("embeddings.word_embeddings", "embedding", {"tokens"}, word);
  const auto types = b.add("embeddings.token_type_embeddings", "embedding", {"token_types"},
                           Json{{"num", c.type_vocab}, {"dim", c.hidden}});
  auto x = b.add("embeddings.add", "add", {words, types});
  x = b.add("embeddings.position_embeddings", "pos_embedding", {x},
            Json{{"max_len", c.max_positions}});
  x = b.add("embeddings.LayerNorm", "layernorm", {x}, ln);
  return b.dropout("embeddings.dropout", x, c.dropout);
}

std::string bert_layer(IrBuilder& b, const BertConfig& c, int i, const std::string& x) {
  const std::string p = "encoder.layer." + std::to_string(i);
  b.unit(p);
  const Json ln{{"eps", c.ln_eps}};
  Json attn{{"heads", c.heads}};
  if (c.dropout > 0.0) attn["dropout"] = c.dropout;

  auto h = b.add(p + ".attention", "attention", {x}, attn);
  h = b.dropout(p + ".attention.output.dropout", h, c.dropout);
  h = b.add(p + ".attention.output.add", "add", {h, x});
  const auto mid = b.add(p + ".attention.output.LayerNorm", "layernorm", {h}, ln);
  h = b.add(p + ".intermediate.dense", "linear", {mid}, Json{{"out", c.intermediate}});
  h = b.add(p + ".intermediate.act", "gelu", {h});
  h = b.add(p + ".output.dense", "linear", {h}, Json{{"out", c.hidden}});
  h = b.dropout(p + ".output.dropout", h, c.dropout);
  h = b.add(p + ".output.add", "add", {h, mid});
  return b.add(p + ".output.LayerNorm", "layernorm", {h}, ln);
}

}  // namespace

Json build_bert(const BertConfig& c) {
  detail::require(c.layers > 0 && c.hidden > 0 && c.heads > 0 && c.intermediate > 0 &&
                      c.vocab > 0 && c.type_vocab > 0 && c.context > 0,
                  "bert: sizes must be positive");
  detail::require(c.hidden % c.heads == 0, "bert: hidden must divide by heads");
  detail::require(c.context <= c.max_positions, "bert: context exceeds max_positions");
  detail::require(c.classes > 0, "bert: a classifier head (classes > 0) is needed for a loss");
  IrBuilder b(c.name);
  b.input("tokens", {c.context}, "i32");
  b.input("token_types", {c.context}, "i32");
  b.input("labels", {}, "i32");

  auto x = bert_embeddings(b, c);
  for (int i = 0; i < c.layers; ++i) x = bert_layer(b, c, i, x);
  b.unit("");
  x = b.add("pooler.first_token", "select", {x}, Json{{"index", 0}});
  x = b.add("pooler.dense", "linear", {x}, Json{{"out", c.hidden}});
  x = b.add("pooler.activation", "tanh", {x});
  x = b.dropout("dropout", x, c.dropout);
  x = b.add("classifier", "linear", {x}, Json{{"out", c.classes}});
  b.add("loss", "cross_entropy", {x, "labels"});
  return b.finish();
}

}  // namespace dlplan::zoo
