// Vision Transformer as torchvision's vit_b_16 (image_size 224, patch_size 16,
// num_layers 12, num_heads 12, hidden_dim 768, mlp_dim 3072, dropout 0,
// LayerNorm eps 1e-6). Conv patchify, class token, learned positions, pre-LN
// encoder blocks, linear head on the class token. Node names follow
// torchvision's module names. `dropout` is torchvision's `dropout` argument
// (after positions, attention and MLP layers); its attention_dropout stays 0.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

std::string vit_block(IrBuilder& b, const VitConfig& c, int i, const std::string& x) {
  const std::string p = "encoder.layers.encoder_layer_" + std::to_string(i);
  b.unit(p);
  const Json ln{{"eps", c.ln_eps}};

  auto h = b.add(p + ".ln_1", "layernorm", {x}, ln);
  h = b.add(p + ".self_attention", "attention", {h}, Json{{"heads", c.heads}});
  h = b.dropout(p + ".dropout", h, c.dropout);
  const auto mid = b.add(p + ".add_1", "add", {h, x});
  h = b.add(p + ".ln_2", "layernorm", {mid}, ln);
  h = b.add(p + ".mlp.0", "linear", {h}, Json{{"out", c.mlp_hidden}});
  h = b.add(p + ".mlp.1", "gelu", {h});
  h = b.dropout(p + ".mlp.2", h, c.dropout);
  h = b.add(p + ".mlp.3", "linear", {h}, Json{{"out", c.hidden}});
  h = b.dropout(p + ".mlp.4", h, c.dropout);
  return b.add(p + ".add_2", "add", {mid, h});
}

}  // namespace

Json build_vit(const VitConfig& c) {
  detail::require(c.image > 0 && c.channels > 0 && c.patch > 0 && c.layers > 0 && c.hidden > 0 &&
                      c.heads > 0 && c.mlp_hidden > 0 && c.classes > 0,
                  "vit: sizes must be positive");
  detail::require(c.image % c.patch == 0, "vit: image must divide by patch");
  detail::require(c.hidden % c.heads == 0, "vit: hidden must divide by heads");
  const int grid = c.image / c.patch;
  IrBuilder b(c.name);
  b.input("image", {c.channels, c.image, c.image}, "f32");
  b.input("label", {}, "i32");

  auto x = b.add("conv_proj", "conv2d", {"image"},
                 Json{{"out", c.hidden}, {"kernel", c.patch}, {"stride", c.patch}});
  x = b.add("patch_tokens", "tokens", {x});
  x = b.add("class_token", "cls_token", {x});
  x = b.add("encoder.pos_embedding", "pos_embedding", {x}, Json{{"max_len", grid * grid + 1}});
  x = b.dropout("encoder.dropout", x, c.dropout);
  for (int i = 0; i < c.layers; ++i) x = vit_block(b, c, i, x);
  b.unit("");
  x = b.add("encoder.ln", "layernorm", {x}, Json{{"eps", c.ln_eps}});
  x = b.add("class_token_out", "select", {x}, Json{{"index", 0}});
  x = b.add("heads.head", "linear", {x}, Json{{"out", c.classes}});
  b.add("loss", "cross_entropy", {x, "label"});
  return b.finish();
}

}  // namespace dlplan::zoo
