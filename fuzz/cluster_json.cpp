// A cluster description (`--cluster FILE`), read through the catalog's own
// reader (planner/src/hardware.cpp), then a tiny model planned on it.
#include "common.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dlplan::Model model = dlplan::load_model("tiny-gpt");
  const std::string path = dlplan::fuzz::scratch_file(dlplan::fuzz::bytes(data, size), ".json");
  dlplan::fuzz::expect_answer([&] {
    const dlplan::Cluster c = dlplan::load_cluster_file(path);
    dlplan::TrainingConfig t;
    t.precision = c.device.has_bf16() ? dlplan::Precision::bf16_mixed : dlplan::Precision::fp32;
    t.micro_batch = 2;
    dlplan::evaluate(model, c, t);
  });
  return 0;
}
