// conv2d's window over its per-sample input: [C, H, W], or [C, L] taken as
// [C, 1, L], a 1-D convolution (PyTorch's Conv1d, whose weight is then
// [out, C/groups, k]). Over [C, L] the kernel, stride, padding and dilation
// are the width's: integers, or pairs whose height part is 1, 1, 0 and 1
// (ops_schema.cpp refuses any other). Dilation d spaces the kernel's taps d
// apart (nn.Conv2d's dilation): a window of extent d (k - 1) + 1.
#pragma once

#include "dlplan/ir.hpp"

#include <array>
#include <cstdint>

namespace dlplan {

struct ConvWindow {
  int64_t C = 0, H = 1, W = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool one_d = false;  // the input is [C, L]
  int64_t extent_h() const { return dh * (kh - 1) + 1; }  // the input rows one output reads
  int64_t extent_w() const { return dw * (kw - 1) + 1; }
};

inline ConvWindow conv_window(const Shape& x, const Attrs& a) {
  ConvWindow w;
  w.one_d = x.size() == 2;
  w.C = x[0];
  w.H = w.one_d ? 1 : x[1];
  w.W = x.back();
  // A 1-D window's integer is the width's; its height is 1 (padding 0).
  auto window = [&](const char* key, int64_t height_of_1d, int64_t& h, int64_t& wd) {
    const auto p = a.pair(key);
    const bool scalar = a.values.contains(key) && a.values[key].is_number_integer();
    h = w.one_d && scalar ? height_of_1d : p[0];
    wd = p[1];
  };
  window("kernel", 1, w.kh, w.kw);
  window("stride", 1, w.sh, w.sw);
  window("padding", 0, w.ph, w.pw);
  if (a.values.contains("dilation")) window("dilation", 1, w.dh, w.dw);  // conv2d's only
  return w;
}

// A conv2d whose taps are spaced apart (dilation other than 1 on either axis).
inline bool dilated(const Attrs& a) {
  return a.values.contains("dilation") && a.pair("dilation") != std::array<int64_t, 2>{1, 1};
}

// conv_transpose2d's output_padding [a_h, a_w]: over [C, L] an integer is
// the length's (height 0), as a 1-D window's padding.
inline std::array<int64_t, 2> transposed_output_padding(const Shape& x, const Attrs& a) {
  auto p = a.pair("output_padding");
  if (x.size() == 2 && a.values.contains("output_padding") && a.values["output_padding"].is_number_integer()) p[0] = 0;
  return p;
}

// upsample's factors [s_h, s_w] over its input: [C, H, W], or [C, L], whose
// integer factor is the length's (height 1), as a 1-D window's.
inline std::array<int64_t, 2> upsample_factors(const Shape& x, const Attrs& a) {
  auto s = a.pair("scale");
  if (x.size() == 2 && a.values.contains("scale") && a.values["scale"].is_number_integer()) s[0] = 1;
  return s;
}

}  // namespace dlplan
