// Swin's window attention as torchvision 0.14 exports it: the constants
// behind its relative position bias and its shifted-window mask, recognised
// by their values (the IR's window_position_bias and window_mask carry the
// geometry instead of the numbers).
//
// relative_position_index is a buffer [T T] (T = Wh Ww) read by a Gather of
// the learned table, then viewed [T, T, H], permuted to [H, T, T] and
// unsqueezed before it is added to the scores. The shifted blocks' mask is
// built in the graph (zeros, nine regions written by ScatterND, differences,
// Where), folded at import to constants [1, nW, 1, T, T] added to the scores
// viewed [b, nW, H, T, T].
#include "import_onnx_graph.hpp"

#include "dlplan/ir.hpp"
#include "dlplan/ops.hpp"

#include <cmath>

namespace dlplan::onnx_import {
namespace {

// The factor pairs (a, n / a) of n, with `first` (when one) tried first.
std::vector<std::array<int64_t, 2>> factor_pairs(int64_t n, std::optional<std::array<int64_t, 2>> first) {
  std::vector<std::array<int64_t, 2>> v;
  if (first && (*first)[0] * (*first)[1] == n) v.push_back(*first);
  for (int64_t a = 1; a <= n; ++a)
    if (n % a == 0 && !(first && (*first)[0] == a && (*first)[1] == n / a)) v.push_back({a, n / a});
  return v;
}

}  // namespace

std::optional<std::array<int64_t, 2>> window_of_relative_index(const std::vector<double>& index, int64_t rows) {
  const auto n = static_cast<int64_t>(index.size());
  const auto T = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  if (T < 2 || T * T != n) return std::nullopt;
  for (const auto& [wh, ww] : factor_pairs(T, std::nullopt)) {
    if ((2 * wh - 1) * (2 * ww - 1) != rows) continue;
    bool same = true;
    for (int64_t e = 0; e < n && same; ++e)
      same = index[static_cast<size_t>(e)] == static_cast<double>(window_relative_index(e / T, e % T, wh, ww));
    if (same) return std::array<int64_t, 2>{wh, ww};
  }
  return std::nullopt;
}

std::optional<std::array<int64_t, 2>> window_of_relative_index_with_cls(const std::vector<double>& index,
                                                                        int64_t rows) {
  const auto n = static_cast<int64_t>(index.size());
  const auto T = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  if (T < 3 || T * T != n) return std::nullopt;
  for (const auto& [wh, ww] : factor_pairs(T - 1, std::nullopt)) {
    if ((2 * wh - 1) * (2 * ww - 1) + 3 != rows) continue;
    bool same = true;
    for (int64_t e = 0; e < n && same; ++e)
      same = index[static_cast<size_t>(e)] == static_cast<double>(window_relative_index_with_cls(e / T, e % T, wh, ww));
    if (same) return std::array<int64_t, 2>{wh, ww};
  }
  return std::nullopt;
}

std::optional<RelativeBuckets> relative_buckets_of_index(const std::vector<double>& index, int64_t rows) {
  const auto n = static_cast<int64_t>(index.size());
  const auto T = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  if (T < 2 || T * T != n || rows < 2) return std::nullopt;
  // The bucket depends on the offset j - i alone: one value a diagonal.
  // (Offset j >= 0 is row 0's, -i column 0's.)
  std::vector<double> at(static_cast<size_t>(2 * T - 1));
  for (int64_t k = 0; k < T; ++k) {
    at[static_cast<size_t>(T - 1 + k)] = index[static_cast<size_t>(k)];
    at[static_cast<size_t>(T - 1 - k)] = index[static_cast<size_t>(k * T)];
  }
  for (int64_t e = 0; e < n; ++e)
    if (index[static_cast<size_t>(e)] != at[static_cast<size_t>(e % T - e / T + T - 1)]) return std::nullopt;
  // Each offset's bucket falls as max_distance grows (the log it divides by
  // grows), so the max_distances whose buckets are all at most the index's
  // are those from some lo up, and those whose buckets are all at least the
  // index's those up to some hi: [lo, hi] reads the index, when not empty.
  auto all = [&](int64_t max_distance, bool bidirectional, bool at_most) {
    for (int64_t off = 1 - T; off < T; ++off) {
      const auto b = static_cast<double>(relative_position_bucket(off, rows, max_distance, bidirectional));
      const double want = at[static_cast<size_t>(off + T - 1)];
      if (at_most ? b > want : b < want) return false;
    }
    return true;
  };
  constexpr int64_t kLargest = int64_t{1} << 20;
  for (const bool bidirectional : {true, false}) {
    const int64_t exact = (bidirectional ? rows / 2 : rows) / 2;
    if (exact < 1 || !all(kLargest, bidirectional, true)) continue;
    int64_t lo = exact + 1, top = kLargest;  // the first max_distance with every bucket at most the index's
    while (lo < top) {
      const int64_t mid = lo + (top - lo) / 2;
      if (all(mid, bidirectional, true)) top = mid;
      else lo = mid + 1;
    }
    if (!all(lo, bidirectional, false)) continue;
    int64_t hi = lo;  // the last with every bucket at least the index's
    for (int64_t bottom = kLargest; hi < bottom;) {
      const int64_t mid = hi + (bottom - hi + 1) / 2;
      if (all(mid, bidirectional, false)) hi = mid;
      else bottom = mid - 1;
    }
    const int64_t chosen = lo <= kT5MaxDistance && kT5MaxDistance <= hi ? kT5MaxDistance : lo;
    return RelativeBuckets{rows, chosen, bidirectional, lo, hi};
  }
  return std::nullopt;
}

std::optional<WindowMask> match_window_mask(const std::vector<double>& values, const Dims& mask, const Dims& scores,
                                            std::optional<std::array<int64_t, 2>> prefer) {
  Dims m = mask;
  while (m.size() > 4 && m.front() == 1) m.erase(m.begin());
  if (scores.size() != 4 || m.size() != 4) return std::nullopt;
  const int64_t W = scores[0], T = scores[2];
  if (m != Dims{W, 1, T, T} || scores[3] != T || W < 2 || T < 2) return std::nullopt;
  if (values.size() != static_cast<size_t>(W * T * T)) return std::nullopt;
  double value = 0;
  for (double v : values) {
    if (v == 0) continue;
    if (value != 0 && v != value) return std::nullopt;  // one masking value
    value = v;
  }
  if (value == 0 || !std::isfinite(value)) return std::nullopt;  // hides nothing: not a shifted window
  for (const auto& window : factor_pairs(T, prefer))
    for (const auto& windows : factor_pairs(W, std::nullopt))
      for (int64_t sh = 0; sh < window[0]; ++sh)
        for (int64_t sw = 0; sw < window[1]; ++sw) {
          const std::array<int64_t, 2> shift{sh, sw};
          bool same = true;
          for (int64_t e = 0; e < W * T * T && same; ++e) {
            const bool hides = window_mask_hides(e / (T * T), e / T % T, e % T, windows, window, shift);
            same = values[static_cast<size_t>(e)] == (hides ? value : 0.0);
          }
          if (same) return WindowMask{windows, window, shift, value};
        }
  return std::nullopt;
}

}  // namespace dlplan::onnx_import
