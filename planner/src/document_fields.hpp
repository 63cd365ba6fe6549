// Private to the document readers (plan_read.cpp, report_io.cpp): one JSON
// object of a document, read field by field. Every accessor checks that the
// field is there, its type and its range, and fails with a dlplan::Error
// naming the file and the field's path:
//   plan.json: optimizer.betas[0] = 2 is outside [0, 1)
// Fields the reader does not ask for are ignored (DESIGN.md, "Conventions").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan::doc {

using Json = nlohmann::json;

// An interval of allowed numbers; `hi` may be infinite.
struct Range {
  double lo = 0, hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool contains(double v) const;
  std::string text() const;  // "[0, 1)", ">= 0", "> 0"
};
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr Range kNonNegative{0, kInf};
inline constexpr Range kPositive{0, kInf, true};
inline constexpr Range kUnitOpen{0, 1, false, true};  // [0, 1)

class Object {
 public:
  // Fails unless `j` is an object; `path` is the object's own path ("optimizer").
  Object(const Json& j, const std::string& source, std::string path = "");

  bool has(const char* key) const { return j_.contains(key); }
  const Json& raw(const char* key) const;  // present, any type
  Object object(const char* key) const;
  std::string text(const char* key) const;
  bool flag(const char* key) const;
  int64_t integer(const char* key, int64_t lo, int64_t hi) const;
  uint64_t unsigned_integer(const char* key) const;
  double number(const char* key, Range r = kNonNegative) const;
  std::vector<double> numbers(const char* key, size_t count, Range r) const;
  // A string parsed by one of training.hpp's parsers (which name the choices).
  template <typename E>
  E choice(const char* key, E (*parse)(std::string_view)) const;

  std::string field(const char* key) const;  // "optimizer.lr"
  [[noreturn]] void fail(const std::string& message) const;  // "<source>: <message>"
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }

 private:
  const Json& j_;
  std::string source_;
  std::string path_;
};

// Checks an element of an array (numbers(), report loss) with the same words.
double number_value(const Json& v, const std::string& source, const std::string& field, Range r);

template <typename E>
E Object::choice(const char* key, E (*parse)(std::string_view)) const {
  const std::string s = text(key);
  try {
    return parse(s);
  } catch (const std::exception& e) {
    fail(field(key) + ": " + e.what());
  }
}

// schema_version 1 and the expected kind, or an error saying what it is.
void check_kind(const Json& doc, const std::string& source, const char* kind, const char* hint);

}  // namespace dlplan::doc
