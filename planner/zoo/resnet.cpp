// ResNet as torchvision's resnet18 (BasicBlock, layers [2, 2, 2, 2]) and
// resnet50 (Bottleneck, layers [3, 4, 6, 3], expansion 4, stride on the 3x3
// conv: torchvision's "ResNet V1.5"). Convolutions have no bias;
// every block with a stride or a channel change has a 1x1 conv + BN downsample.
// Node names follow torchvision's module names.
#include "dlplan/zoo.hpp"
#include "ir_builder.hpp"

namespace dlplan::zoo {
namespace {

using detail::IrBuilder;

struct Conv {
  int out;
  int kernel;
  int stride;
};

// conv (no bias) followed by batchnorm; returns the batchnorm's name.
std::string conv_bn(IrBuilder& b, const std::string& conv_name, const std::string& bn_name,
                    const std::string& x, Conv conv) {
  Json attrs{{"out", conv.out}, {"kernel", conv.kernel}};
  if (conv.stride != 1) attrs["stride"] = conv.stride;
  if (conv.kernel / 2 != 0) attrs["padding"] = conv.kernel / 2;
  attrs["bias"] = false;
  const auto h = b.add(conv_name, "conv2d", {x}, attrs);
  return b.add(bn_name, "batchnorm", {h});
}

// One residual block; `in_ch` is the block's input channels.
std::string resnet_block(IrBuilder& b, const std::string& p, const std::string& x, int in_ch,
                         int width, int stride, bool bottleneck) {
  b.unit(p);
  std::string h;
  int out_ch = width;
  if (bottleneck) {
    out_ch = 4 * width;
    h = conv_bn(b, p + ".conv1", p + ".bn1", x, {width, 1, 1});
    h = b.add(p + ".relu_1", "relu", {h});
    h = conv_bn(b, p + ".conv2", p + ".bn2", h, {width, 3, stride});
    h = b.add(p + ".relu_2", "relu", {h});
    h = conv_bn(b, p + ".conv3", p + ".bn3", h, {out_ch, 1, 1});
  } else {
    h = conv_bn(b, p + ".conv1", p + ".bn1", x, {width, 3, stride});
    h = b.add(p + ".relu_1", "relu", {h});
    h = conv_bn(b, p + ".conv2", p + ".bn2", h, {width, 3, 1});
  }
  std::string identity = x;
  if (stride != 1 || in_ch != out_ch)
    identity = conv_bn(b, p + ".downsample.0", p + ".downsample.1", x, {out_ch, 1, stride});
  h = b.add(p + ".add", "add", {h, identity});
  return b.add(p + ".relu", "relu", {h});
}

}  // namespace

Json build_resnet(const ResnetConfig& c) {
  detail::require(!c.blocks.empty() && c.width > 0 && c.classes > 0 && c.image > 0 &&
                      c.channels > 0,
                  "resnet: sizes must be positive");
  IrBuilder b(c.name);
  b.input("image", {c.channels, c.image, c.image}, "f32");
  b.input("label", {}, "i32");

  auto x = b.add("conv1", "conv2d", {"image"},
                 Json{{"out", c.width}, {"kernel", 7}, {"stride", 2}, {"padding", 3}, {"bias", false}});
  x = b.add("bn1", "batchnorm", {x});
  x = b.add("relu", "relu", {x});
  x = b.add("maxpool", "maxpool2d", {x}, Json{{"kernel", 3}, {"stride", 2}, {"padding", 1}});
  int channels = c.width;
  for (std::size_t s = 0; s < c.blocks.size(); ++s) {
    detail::require(c.blocks[s] > 0, "resnet: every stage needs a block");
    const int width = c.width << s;
    for (int i = 0; i < c.blocks[s]; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(i);
      x = resnet_block(b, p, x, channels, width, stride, c.bottleneck);
      channels = c.bottleneck ? 4 * width : width;
    }
  }
  b.unit("");
  x = b.add("avgpool", "global_avgpool", {x});
  x = b.add("fc", "linear", {x}, Json{{"out", c.classes}});
  b.add("loss", "cross_entropy", {x, "label"});
  return b.finish();
}

}  // namespace dlplan::zoo
