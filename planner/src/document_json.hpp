// Private to the document writers and readers: the JSON of the parts that
// several documents share (memory, comm, predicted).
#pragma once

#include "dlplan/plan_io.hpp"

namespace dlplan::doc {

OrderedJson categories_json(const CategoryBytes& c);
OrderedJson memory_json(const MemoryNumbers& m);
OrderedJson comm_json(const CommNumbers& c);
OrderedJson predicted_json(const Predicted& p);
OrderedJson host_json(const HostMemory& h);  // CPU offload, per node

}  // namespace dlplan::doc
