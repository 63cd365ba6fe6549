// An ONNX file: imported as `dlplan plan --model FILE.onnx --seq-len 16` does.
#include "common.hpp"
#include "dlplan/importers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dlplan::fuzz::scratch_file(dlplan::fuzz::bytes(data, size), ".onnx");
  dlplan::fuzz::expect_answer([&] { dlplan::import_onnx(path, dlplan::ImportOptions{2, 16}); });
  return 0;
}
