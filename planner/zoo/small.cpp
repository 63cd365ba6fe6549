// Small models for fast CPU training tests (dlplan's own, not from a
// framework): a fully connected classifier and a conv + batchnorm classifier.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {

// Hidden layer i is unit "layers.i" (linear + relu); the head is root.
Json build_mlp(const MlpConfig& c) {
  detail::require(c.features > 0 && c.classes > 0, "mlp: sizes must be positive");
  detail::IrBuilder b(c.name);
  b.input("x", {c.features}, "f32");
  b.input("label", {}, "i32");

  std::string x = "x";
  for (std::size_t i = 0; i < c.hidden.size(); ++i) {
    detail::require(c.hidden[i] > 0, "mlp: hidden widths must be positive");
    const std::string p = "layers." + std::to_string(i);
    b.unit(p);
    x = b.add(p + ".linear", "linear", {x}, Json{{"out", c.hidden[i]}});
    x = b.add(p + ".relu", "relu", {x});
  }
  b.unit("");
  x = b.add("head", "linear", {x}, Json{{"out", c.classes}});
  b.add("loss", "cross_entropy", {x, "label"});
  return b.finish();
}

// Block i is unit "blocks.i": conv 3x3 (padding 1, no bias) -> batchnorm ->
// relu, then a 2x2 max pool between blocks; global average pool and a linear
// head close it. With `depthwise`, blocks after the first open with
// MobileNetV2's separable pair: depthwise kxk -> batchnorm -> ReLU6 (clip to
// [0, 6]) -> pointwise 1x1, with k = 3, 5, 7 in turn (MobileNet's window to
// ConvNeXt's), so that a depthwise curve sees FLOPs and bytes vary apart; the
// first pair has stride 2 (MobileNet downsamples so) in place of the pooling
// before it.
Json build_cnn(const CnnConfig& c) {
  detail::require(c.image > 0 && c.channels > 0 && c.classes > 0 && !c.widths.empty(),
                  "cnn: sizes must be positive");
  detail::IrBuilder b(c.name);
  b.input("image", {c.channels, c.image, c.image}, "f32");
  b.input("label", {}, "i32");

  std::string x = "image";
  for (std::size_t i = 0; i < c.widths.size(); ++i) {
    detail::require(c.widths[i] > 0, "cnn: widths must be positive");
    const std::string p = "blocks." + std::to_string(i);
    b.unit(p);
    if (c.depthwise && i > 0) {
      const int w = c.widths[i - 1];
      const int k = 3 + 2 * static_cast<int>((i - 1) % 3);  // 3, 5, 7: MobileNet's window to ConvNeXt's
      const int stride = i == 1 ? 2 : 1;  // the first pair downsamples, in place of a pooling
      x = b.add(p + ".dw", "conv2d", {x},
                Json{{"out", w}, {"kernel", k}, {"stride", stride}, {"padding", k / 2}, {"groups", w}, {"bias", false}});
      x = b.add(p + ".dw_bn", "batchnorm", {x});
      x = b.add(p + ".relu6", "clip", {x}, Json{{"min", 0.0}, {"max", 6.0}});
      x = b.add(p + ".pw", "conv2d", {x}, Json{{"out", w}, {"kernel", 1}, {"bias", false}});
    }
    x = b.add(p + ".conv", "conv2d", {x},
              Json{{"out", c.widths[i]}, {"kernel", 3}, {"padding", 1}, {"bias", false}});
    x = b.add(p + ".bn", "batchnorm", {x});
    x = b.add(p + ".relu", "relu", {x});
    const bool next_downsamples = c.depthwise && i == 0;
    if (i + 1 < c.widths.size() && !next_downsamples) x = b.add(p + ".pool", "maxpool2d", {x}, Json{{"kernel", 2}});
  }
  b.unit("");
  x = b.add("avgpool", "global_avgpool", {x});
  x = b.add("head", "linear", {x}, Json{{"out", c.classes}});
  b.add("loss", "cross_entropy", {x, "label"});
  return b.finish();
}

}  // namespace dlplan::zoo
