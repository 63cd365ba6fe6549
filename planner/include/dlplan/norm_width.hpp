// layernorm's row: the trailing `dims` per-sample axes normalised together
// (nn.LayerNorm's normalized_shape; ONNX LayerNormalization from its `axis`
// on). The weight and bias have those axes' shape; the rows are the rest.
#pragma once

#include "dlplan/ir.hpp"

#include <cstdint>

namespace dlplan {

inline int64_t layernorm_dims(const Attrs& a) { return a.has("dims") ? a.integer("dims") : 1; }

// The normalised axes' shape (x's trailing `dims` axes; rank checked by the loader).
inline Shape layernorm_shape(const Shape& x, const Attrs& a) {
  const auto d = static_cast<std::ptrdiff_t>(layernorm_dims(a));
  return Shape(x.end() - d, x.end());
}

// Elements a row normalises: the product of those axes.
inline int64_t layernorm_width(const Shape& x, const Attrs& a) { return numel(layernorm_shape(x, a)); }

}  // namespace dlplan
