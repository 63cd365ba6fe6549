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

  // RMSNorm of x [.., dim]: x rsqrt(mean(x^2) + eps) (w + offset). Fused, one
  // rmsnorm node; eager, the ops PyTorch's eager mode runs for Hugging Face's
  // LlamaRMSNorm / T5LayerNorm (pow, mean, + eps, rsqrt as x^-1/2, mul, and
  // the weight as a scale node named `name`, so that it is `name.weight`
  // either way). Returns the output's name.
  std::string rmsnorm(const std::string& name, const std::string& x, int dim, double eps, double offset, bool eager) {
    if (!eager) {
      Json a{{"eps", eps}};
      if (offset != 0.0) a["offset"] = offset;
      return add(name, "rmsnorm", {x}, a);
    }
    auto h = add(name + ".pow", "pow", {x}, Json{{"exponent", 2.0}});
    h = add(name + ".mean", "reduce_mean", {h}, Json{{"keepdims", true}});
    h = add(name + ".add_eps", "affine", {h}, Json{{"shift", eps}});
    h = add(name + ".rsqrt", "pow", {h}, Json{{"exponent", -0.5}});
    h = add(name + ".mul", "mul", {x, h});
    Json w{{"shape", Json::array({dim})}};
    if (offset != 0.0) w["offset"] = offset;
    return add(name, "scale", {h}, w);
  }

  // GELU's tanh form. Fused, one gelu node; eager, Hugging Face's
  // NewGELUActivation as PyTorch runs it: 0.5 x (1 + tanh(sqrt(2/pi) (x +
  // 0.044715 x^3))), 8 ops, the last named `name`.
  std::string gelu_new(const std::string& name, const std::string& x, bool eager) {
    if (!eager) return add(name, "gelu", {x}, Json{{"approximate", "tanh"}});
    const auto half = add(name + ".half", "affine", {x}, Json{{"scale", 0.5}});
    auto h = add(name + ".cube", "pow", {x}, Json{{"exponent", 3.0}});
    h = add(name + ".cube_scaled", "affine", {h}, Json{{"scale", 0.044715}});
    h = add(name + ".inner", "add", {x, h});
    h = add(name + ".inner_scaled", "affine", {h}, Json{{"scale", 0.7978845608028654}});  // sqrt(2 / pi)
    h = add(name + ".tanh", "tanh", {h});
    h = add(name + ".one_plus", "affine", {h}, Json{{"shift", 1.0}});
    return add(name, "mul", {half, h});
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
