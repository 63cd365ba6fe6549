// A run report (`dlplan train --report`) and a progress line (`--progress
// json`, read by dlplan-gui).
#include "common.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/plan_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = dlplan::fuzz::bytes(data, size);
  dlplan::progress_line_from_json(text);  // never throws: a line is a progress line or not
  dlplan::fuzz::expect_answer([&] {
    dlplan::report_from_json(dlplan::parse_ordered_json_text(text, "report.json"), "report.json");
  });
  return 0;
}
