// Shared by the sharding tests (hybrid_test.cpp, offload_test.cpp): a
// catalog cluster counted in bytes, and a small GPT whose units divide
// evenly (no padding at the group sizes they use).
#pragma once

#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

namespace sharding_fixtures {

inline dlplan::Cluster nodes_of(int nodes, int per_node, const char* kind = "h100-80g") {
  dlplan::Cluster c;
  c.device = dlplan::find_device(kind);
  c.device.alloc_granularity_bytes = 1;  // the formulas count bytes, not 512 B blocks
  c.nodes = nodes;
  c.gpus_per_node = per_node;
  return c;
}

inline dlplan::Model small_gpt(int layers = 3) {
  dlplan::zoo::GptConfig c;
  c.name = "gpt-test";
  c.layers = layers;
  c.hidden = 64;
  c.heads = 4;
  c.context = 32;
  c.vocab = 64;
  c.dropout = 0;
  return dlplan::parse_model(nlohmann::json(dlplan::zoo::build_gpt(c)), "gpt-test");
}

}  // namespace sharding_fixtures
