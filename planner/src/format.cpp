#include "dlplan/format.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dlplan {

std::string format_bytes(double b) {
  const double a = std::fabs(b);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

std::string format_seconds(double s) {
  if (s >= 10.0) return fmt::format("{:.1f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  if (s > 0) return fmt::format("{:.1f} µs", s * 1e6);
  return "0 ms";
}


}  // namespace dlplan

namespace dlplan {

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace dlplan
