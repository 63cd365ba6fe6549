// Private helper for the zoo builders: appends IR nodes (DESIGN.md, "Model IR")
// in order, stamping each with the current unit.
#pragma once

#include "dlplan/zoo.hpp"

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlplan::zoo::detail {

class IrBuilder {
 public:
  explicit IrBuilder(std::string name) { ir_["name"] = std::move(name); }

  void input(const std::string& name, std::vector<int> shape, std::string_view dtype) {
    ir_["inputs"][name] = Json{{"shape", std::move(shape)}, {"dtype", dtype}};
  }

  // Nodes added after this belong to `unit`; "" means the root unit.
  void unit(std::string unit) { unit_ = std::move(unit); }

  // Appends a node and returns its name (the name of its output).
  std::string add(const std::string& name, std::string_view op, std::vector<std::string> in,
                  const Json& attrs = Json::object()) {
    Json node{{"name", name}, {"op", op}, {"in", std::move(in)}};
    for (const auto& [key, value] : attrs.items()) node[key] = value;
    if (!unit_.empty()) node["unit"] = unit_;
    ir_["nodes"].push_back(std::move(node));
    return name;
  }

  // A dropout node, or nothing (returns x) when p is zero.
  std::string dropout(const std::string& name, const std::string& x, double p) {
    return p > 0.0 ? add(name, "dropout", {x}, Json{{"p", p}}) : x;
  }

  Json finish() { return std::move(ir_); }

 private:
  Json ir_ = Json{{"name", ""}, {"inputs", Json::object()}, {"nodes", Json::array()}};
  std::string unit_;
};

inline void require(bool ok, std::string_view what) {
  if (!ok) throw std::invalid_argument(std::string("zoo: ") + std::string(what));
}

}  // namespace dlplan::zoo::detail
