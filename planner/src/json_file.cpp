#include "dlplan/json_file.hpp"

#include "dlplan/error.hpp"
#include "dlplan/limits.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace dlplan {
namespace {

// Refuses nesting deeper than kMaxJsonDepth, counting brackets outside
// strings; what is malformed otherwise is left to the parser.
void check_depth(std::string_view text, const std::string& source) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(fmt::format("{}: JSON nested deeper than {} levels at byte {}", source, kMaxJsonDepth, i + 1));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

template <typename Json>
Json parse_text(std::string_view text, const std::string& source) {
  check_depth(text, source);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{}: malformed JSON at byte {}: {}", source, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {  // 1e400: out_of_range, not a parse_error
    throw Error(fmt::format("{}: malformed JSON: {}", source, e.what()));
  }
}

std::string read_text(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(fmt::format("{}: is a folder, not a {}", path, what));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open {} ({})", path, what, std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {  // a pipe has no size to check up front
    text.append(buf, static_cast<size_t>(f.gcount()));
    if (static_cast<int64_t>(text.size()) > kMaxJsonFileBytes)
      throw Error(fmt::format("{}: larger than {} MiB, too large for a {}", path, kMaxJsonFileBytes >> 20, what));
  }
  if (f.bad()) throw Error(fmt::format("{}: read error", path));
  return text;
}

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  return parse_text<nlohmann::json>(text, source);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source) {
  return parse_text<nlohmann::ordered_json>(text, source);
}

nlohmann::json read_json_file(const std::string& path, std::string_view what) {
  return parse_json_text(read_text(path, what), path);
}

nlohmann::ordered_json read_ordered_json_file(const std::string& path, std::string_view what) {
  return parse_ordered_json_text(read_text(path, what), path);
}

void bad_json_field(const std::string& source, const std::string& field, const std::string& what,
                    const nlohmann::json& got) {
  std::string shown = got.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw Error(source + ": " + field + " must be " + what + " (got " + shown + ")");
}

}  // namespace dlplan
