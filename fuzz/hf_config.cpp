// Hugging Face config.json: imported as `dlplan plan --model config.json`
// does (the family builders, then the IR loader).
#include "common.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dlplan::fuzz::expect_answer([&] {
    const nlohmann::json j = dlplan::parse_json_text(dlplan::fuzz::bytes(data, size), "config.json");
    if (!dlplan::is_hf_config(j)) return;
    dlplan::parse_model(nlohmann::json(dlplan::hf_config_to_ir(j, "config.json")), "config.json");
  });
  return 0;
}
