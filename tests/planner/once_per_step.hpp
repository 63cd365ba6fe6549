// A model with a tensor computed once per step (TensorInfo::batched false):
// y = x W for x [8, 4] a sample and W a `parameter` [4, 16], then the loss
// against targets [8]. Shared by the memory and cost-table tests.
#pragma once

#include "dlplan/loader.hpp"

#include <nlohmann/json.hpp>

namespace dlplan::testing {

inline Model once_per_step_model() {
  const nlohmann::json ir = {
      {"name", "once"},
      {"inputs", {{"x", {{"shape", {8, 4}}, {"dtype", "f32"}}}, {"t", {{"shape", {8}}, {"dtype", "i32"}}}}},
      {"nodes",
       {{{"name", "w"}, {"op", "parameter"}, {"in", nlohmann::json::array()}, {"shape", {4, 16}}},
        {{"name", "y"}, {"op", "matmul"}, {"in", {"x", "w"}}},
        {{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"y", "t"}}}}}};
  return parse_model(ir, "once");
}

}  // namespace dlplan::testing
