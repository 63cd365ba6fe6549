// Model IR JSON (models/*.json): parsed and validated as `dlplan plan --model
// FILE` does, then planned (the step program and its walk, where byte counts
// are multiplied out).
#include "common.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dlplan::fuzz::expect_answer([&] {
    const dlplan::Model m = dlplan::parse_model(dlplan::parse_json_text(dlplan::fuzz::bytes(data, size), "fuzz.json"), "fuzz.json");
    dlplan::Cluster c;
    c.device = dlplan::find_device("h100-80g");
    c.gpus_per_node = 2;
    dlplan::TrainingConfig t;
    t.micro_batch = 2;
    for (dlplan::Strategy s : {dlplan::Strategy::ddp, dlplan::Strategy::zero3}) {
      t.strategy = s;
      dlplan::evaluate(m, c, t);
    }
  });
  return 0;
}
