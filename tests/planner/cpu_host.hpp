// The catalog's cpu device on one node of `ranks` ranks: the cluster the
// measured-cost tests (op_costs_test, collective_costs_test) plan on.
#pragma once

#include "dlplan/hardware.hpp"

namespace dlplan::testing {

inline Cluster cpu_host(int ranks) {
  Cluster c;
  c.device = find_device("cpu");
  c.gpus_per_node = ranks;
  return c;
}

}  // namespace dlplan::testing
