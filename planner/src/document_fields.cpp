#include "document_fields.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dlplan::doc {

bool Range::contains(double v) const {
  if (std::isnan(v)) return false;
  const bool above = lo_open ? v > lo : v >= lo;
  const bool below = hi_open ? v < hi : v <= hi;
  return above && below;
}

std::string Range::text() const {
  if (std::isinf(hi)) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  return fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
}

Object::Object(const Json& j, const std::string& source, std::string path)
    : j_(j), source_(source), path_(std::move(path)) {
  if (!j_.is_object()) {
    if (path_.empty()) fail(fmt::format("the document must be a JSON object, not {}", j_.type_name()));
    fail(fmt::format("{} must be an object, not {}", path_, j_.dump()));
  }
}

std::string Object::field(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

void Object::fail(const std::string& message) const { throw Error(fmt::format("{}: {}", source_, message)); }

const Json& Object::raw(const char* key) const {
  const auto it = j_.find(key);
  if (it == j_.end()) fail(fmt::format("missing field '{}'", field(key)));
  return *it;
}

Object Object::object(const char* key) const { return Object(raw(key), source_, field(key)); }

std::string Object::text(const char* key) const {
  const Json& v = raw(key);
  if (!v.is_string()) fail(fmt::format("{} = {} must be a string", field(key), v.dump()));
  return v.get<std::string>();
}

bool Object::flag(const char* key) const {
  const Json& v = raw(key);
  if (!v.is_boolean()) fail(fmt::format("{} = {} must be true or false", field(key), v.dump()));
  return v.get<bool>();
}

int64_t Object::integer(const char* key, int64_t lo, int64_t hi) const {
  const Json& v = raw(key);
  bool ok = false;
  if (v.is_number_unsigned()) {  // before is_number_integer, which holds for both
    const uint64_t u = v.get<uint64_t>();
    ok = hi >= 0 && u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo;
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    ok = i >= lo && i <= hi;
  }
  if (!ok) fail(fmt::format("{} = {} must be an integer in [{}, {}]", field(key), v.dump(), lo, hi));
  return v.get<int64_t>();
}

uint64_t Object::unsigned_integer(const char* key) const {
  const Json& v = raw(key);
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    fail(fmt::format("{} = {} must be an integer >= 0", field(key), v.dump()));
  return v.get<uint64_t>();
}

double number_value(const Json& v, const std::string& source, const std::string& field, Range r) {
  if (!v.is_number()) throw Error(fmt::format("{}: {} = {} must be a number", source, field, v.dump()));
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw Error(fmt::format("{}: {} = {} must be a finite number", source, field, v.dump()));
  if (!r.contains(x)) {
    if (std::isinf(r.hi)) throw Error(fmt::format("{}: {} = {} must be {}", source, field, v.dump(), r.text()));
    throw Error(fmt::format("{}: {} = {} is outside {}", source, field, v.dump(), r.text()));
  }
  return x;
}

double Object::number(const char* key, Range r) const { return number_value(raw(key), source_, field(key), r); }

std::vector<double> Object::numbers(const char* key, size_t count, Range r) const {
  const Json& v = raw(key);
  if (!v.is_array() || v.size() != count)
    fail(fmt::format("{} = {} must be an array of {} numbers", field(key), v.dump(), count));
  std::vector<double> out;
  for (size_t i = 0; i < count; ++i) out.push_back(number_value(v[i], source_, fmt::format("{}[{}]", field(key), i), r));
  return out;
}

void check_kind(const Json& doc, const std::string& source, const char* kind, const char* hint) {
  if (!doc.is_object()) throw Error(fmt::format("{}: not a {} (a JSON object with \"kind\": \"{}\"); {}", source, kind, kind, hint));
  const auto k = doc.find("kind");
  if (k == doc.end() || !k->is_string() || k->get<std::string>() != kind)
    throw Error(fmt::format("{}: not a {} (\"kind\" is {}, expected \"{}\"); {}", source, kind,
                            k == doc.end() ? "missing" : k->dump(), kind, hint));
  const auto v = doc.find("schema_version");
  if (v == doc.end() || !v->is_number_integer() || v->get<int64_t>() < 1)
    throw Error(fmt::format("{}: schema_version {} must be a positive integer (this dlplan reads 1)", source,
                            v == doc.end() ? "missing" : v->dump()));
  if (v->get<int64_t>() > 1)
    throw Error(fmt::format("{}: schema_version {} was written by a newer dlplan; this one reads schema_version 1", source,
                            v->dump()));
}

}  // namespace dlplan::doc
