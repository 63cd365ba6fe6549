// A plan (`dlplan plan --out`): read as `dlplan train` and `dlplan sim` read
// it (every field validated; the content hash is not required here, so that
// the fuzzer reaches past it), then evaluated as the run report does.
#include "common.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/plan_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dlplan::fuzz::expect_answer([&] {
    const auto doc = dlplan::parse_ordered_json_text(dlplan::fuzz::bytes(data, size), "plan.json");
    const dlplan::PlanDocument p = dlplan::plan_from_json(doc, "plan.json", {.allow_edited = true});
    dlplan::evaluate(p.model, p.cluster, p.training);
  });
  return 0;
}
