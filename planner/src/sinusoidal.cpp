// Fixed sinusoidal positions (ops.hpp): the table pos_embedding's
// `sinusoidal` adds, and its inverse, which recognises such a table by its
// values (Hugging Face XGLM's, a buffer the ONNX exporter writes as a
// constant the import folds).
#include "dlplan/ops.hpp"

#include <cmath>
#include <vector>

namespace dlplan {

double sinusoidal_position(bool interleaved, double step, int64_t position, int64_t column, int64_t dim) {
  const int64_t half = dim / 2;
  const int64_t pair = interleaved ? column / 2 : column % half;
  const bool cosine = interleaved ? column % 2 == 1 : column >= half;
  const double angle = static_cast<double>(position) * std::exp(-static_cast<double>(pair) * step);
  return cosine ? std::cos(angle) : std::sin(angle);
}

namespace {

constexpr int64_t kMaxOffset = 64;  // the first rows a table may skip (XGLM's: 2)

// fp32 tables: sin and cos of an fp32 angle, whose rounding grows with it.
bool close(double got, double want, int64_t position) {
  return std::fabs(got - want) <= 1e-4 + 2e-7 * static_cast<double>(position);
}

// Frequency step of pair 1 from its angle at `position` (>= 1, small enough
// that the angle has not wrapped), snapped to the two published conventions
// with base 10000 when within rounding of one: Vaswani's ln(10000) / (D/2) and
// fairseq's ln(10000) / (D/2 - 1).
std::optional<double> step_of(double sin1, double cos1, int64_t position, int64_t half) {
  const double angle = std::atan2(sin1, cos1);
  if (!(angle > 0)) return std::nullopt;
  const double step = -std::log(angle / static_cast<double>(position));
  if (!std::isfinite(step) || step < 0) return std::nullopt;
  for (const double denominator : {static_cast<double>(half), static_cast<double>(half - 1)}) {
    const double published = std::log(10000.0) / denominator;
    if (denominator > 0 && std::fabs(step - published) <= 1e-3 * published) return published;
  }
  return step;
}

}  // namespace

std::optional<SinusoidalPositions> match_sinusoidal_positions(const std::vector<double>& values, int64_t T, int64_t D) {
  if (D < 4 || D % 2 != 0 || T < 1 || static_cast<int64_t>(values.size()) != T * D) return std::nullopt;
  auto at = [&](int64_t t, int64_t col) { return values[static_cast<size_t>(t * D + col)]; };
  const int64_t half = D / 2;
  for (const bool interleaved : {false, true}) {
    const int64_t sin0 = 0, cos0 = interleaved ? 1 : half, sin1 = interleaved ? 2 : 1, cos1 = interleaved ? 3 : half + 1;
    for (int64_t offset = 0; offset <= kMaxOffset; ++offset) {
      // Pair 0's frequency is 1: row 0 holds sin and cos of the offset itself.
      if (!close(at(0, sin0), std::sin(static_cast<double>(offset)), offset) ||
          !close(at(0, cos0), std::cos(static_cast<double>(offset)), offset))
        continue;
      // Pair 1 at the first position past 0, where its angle is below 1
      // radian per position and so has not wrapped for positions up to 3.
      // Past that (a fairseq table read from its padding id + 1, 61 where
      // the padding id is 60) the angle may have wrapped: the two published
      // steps are tried.
      const int64_t row = offset == 0 ? 1 : 0;
      if (row >= T) continue;
      std::vector<double> steps;
      if (offset + row <= 3) {
        if (const auto step = step_of(at(row, sin1), at(row, cos1), offset + row, half)) steps.push_back(*step);
      } else {
        steps = {std::log(10000.0) / static_cast<double>(half), std::log(10000.0) / static_cast<double>(half - 1)};
      }
      for (const double step : steps) {
        const SinusoidalPositions sp{interleaved, offset, step};
        if (holds_sinusoidal_positions(values, 0, D, sp)) return sp;
      }
    }
  }
  return std::nullopt;
}

bool holds_sinusoidal_positions(const std::vector<double>& rows, int64_t first, int64_t D,
                                const SinusoidalPositions& sp) {
  if (D <= 0 || rows.size() % static_cast<size_t>(D) != 0) return false;
  const auto R = static_cast<int64_t>(rows.size()) / D;
  for (int64_t t = 0; t < R; ++t) {
    const int64_t position = sp.offset + first + t;
    for (int64_t col = 0; col < D; ++col)
      if (!close(rows[static_cast<size_t>(t * D + col)], sinusoidal_position(sp.interleaved, sp.step, position, col, D),
                 position))
        return false;
  }
  return true;
}

}  // namespace dlplan
