#include "dlplan/ir.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dlplan {

std::string node_label(const Node& n) { return "node '" + n.name + "' (" + to_string(n.op) + ")"; }

void node_error(const std::string& source, const Node& n, const std::string& message) {
  throw Error(source + ": " + node_label(n) + ": " + message);
}

const char* to_string(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string to_string(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::optional<Shape> broadcast_shape(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t k = 0; k < out.size(); ++k) {  // k counts from the last dimension
    const int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1, db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[out.size() - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> strided_offsets(const Shape& extent, const std::vector<int64_t>& stride) {
  const size_t rank = extent.size();
  std::vector<int64_t> offsets(static_cast<size_t>(numel(extent)));
  std::vector<int64_t> index(rank, 0);
  int64_t at = 0;
  for (auto& o : offsets) {
    o = at;
    for (size_t k = rank; k-- > 0;) {  // an odometer over the axes, the last fastest
      at += stride[k];
      if (++index[k] < extent[k]) break;
      at -= stride[k] * extent[k];
      index[k] = 0;
    }
  }
  return offsets;
}

std::vector<int64_t> broadcast_offsets(const Shape& out, const Shape& in) {
  const size_t rank = out.size(), lead = rank - in.size();
  std::vector<int64_t> stride(rank, 0);  // 0 on the dimensions `in` repeats
  for (size_t k = rank, s = 1; k-- > lead;) {
    const int64_t d = in[k - lead];
    if (d != 1) stride[k] = static_cast<int64_t>(s);
    s *= static_cast<size_t>(d);
  }
  return strided_offsets(out, stride);
}

int64_t Attrs::integer(const char* key) const { return values.at(key).get<int64_t>(); }
double Attrs::number(const char* key) const { return values.at(key).get<double>(); }
bool Attrs::flag(const char* key) const { return values.at(key).get<bool>(); }
std::string Attrs::text(const char* key) const { return values.at(key).get<std::string>(); }
std::vector<int64_t> Attrs::ints(const char* key) const { return values.at(key).get<std::vector<int64_t>>(); }

std::array<int64_t, 2> Attrs::pair(const char* key) const {
  const auto& v = values.at(key);
  if (v.is_array()) return {v[0].get<int64_t>(), v[1].get<int64_t>()};
  return {v.get<int64_t>(), v.get<int64_t>()};
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

int64_t Model::trainable_parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params)
    if (p.trainable) n += p.numel;
  return n;
}

int64_t Model::base_parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params)
    if (!p.adapter) n += p.numel;
  return n;
}

int64_t Model::buffer_count() const {
  int64_t n = 0;
  for (const auto& b : buffers) n += b.numel;
  return n;
}

int Model::node_index(const std::string& name) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

// For a power of two n: 2^(-8/n), its square, ..., its n-th power. Otherwise
// those of the closest power of two below, cp, then the odd powers of
// 2^(-4/cp) for the rest (interleaving the slopes of 2 cp heads).
int64_t causal_query_axis(const Node& n, size_t rank) {
  return n.attrs.has("query_axis") ? n.attrs.integer("query_axis") : static_cast<int64_t>(rank) - 2;
}

std::vector<double> alibi_slopes(int64_t heads) {
  std::vector<double> s;
  if (heads <= 0) return s;
  int64_t cp = 1;
  while (cp * 2 <= heads) cp *= 2;
  const double base = std::pow(2.0, -8.0 / static_cast<double>(cp));
  for (int64_t k = 1; k <= cp; ++k) s.push_back(std::pow(base, static_cast<double>(k)));
  const double extra = std::pow(2.0, -4.0 / static_cast<double>(cp));
  for (int64_t k = 0; k < std::min(cp, heads - cp); ++k) s.push_back(std::pow(extra, static_cast<double>(2 * k + 1)));
  return s;
}

int64_t window_relative_index(int64_t p, int64_t q, int64_t window_h, int64_t window_w) {
  const int64_t dy = p / window_w - q / window_w, dx = p % window_w - q % window_w;
  return (dy + window_h - 1) * (2 * window_w - 1) + (dx + window_w - 1);
}

int64_t window_relative_index_with_cls(int64_t p, int64_t q, int64_t window_h, int64_t window_w) {
  const int64_t patches = (2 * window_h - 1) * (2 * window_w - 1);
  if (p == 0 && q == 0) return patches + 2;
  if (p == 0) return patches;
  if (q == 0) return patches + 1;
  return window_relative_index(p - 1, q - 1, window_h, window_w);
}

bool window_mask_hides(int64_t w, int64_t p, int64_t q, const std::array<int64_t, 2>& windows,
                       const std::array<int64_t, 2>& window, const std::array<int64_t, 2>& shift) {
  // Along one axis of the rolled map (extent = windows * window): the last
  // `window` positions split where the roll brought the first `shift` ones
  // (torchvision's slices (0, -window), (-window, -shift), (-shift, None)).
  auto region = [](int64_t at, int64_t extent, int64_t win, int64_t sh) -> int64_t {
    return at < extent - win ? 0 : at < extent - sh ? 1 : 2;
  };
  auto label = [&](int64_t pos) {
    const int64_t y = (w / windows[1]) * window[0] + pos / window[1];
    const int64_t x = (w % windows[1]) * window[1] + pos % window[1];
    return region(y, windows[0] * window[0], window[0], shift[0]) * 3 +
           region(x, windows[1] * window[1], window[1], shift[1]);
  };
  return label(p) != label(q);
}

}  // namespace dlplan
