// A training data file (`dlplan train --data FILE`, docs/data.md): the first
// byte picks the file's extension (.u16, .i32 or .bin; a DLPI image file is
// recognised by its magic whatever the name), the rest is the file. Read for
// tiny-gpt (tokens) or tiny-cnn (images), then two samples filled.
#include "common.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/tensor.hpp"
#include "dlplan/loader.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const dlplan::Model gpt = dlplan::load_model("tiny-gpt");
  static const dlplan::Model cnn = dlplan::load_model("tiny-cnn");
  static const char* const ext[] = {".u16", ".i32", ".bin"};
  const auto text = dlplan::fuzz::bytes(data + 1, size - 1);
  const std::string path = dlplan::fuzz::scratch_file(text, ext[data[0] % 3]);
  const bool image = text.size() >= 4 && std::memcmp(text.data(), "DLPI", 4) == 0;
  const dlplan::Model& m = image ? cnn : gpt;
  dlplan::fuzz::expect_answer([&] {
    auto source = dlplan::exec::make_data_source(path, m, 1);
    dlplan::exec::Allocator alloc;
    for (size_t k = 0; k < m.inputs.size(); ++k) {
      const dlplan::TensorInfo& t = m.tensor(m.inputs[k]);
      dlplan::Shape shape{2};
      shape.insert(shape.end(), t.shape.begin(), t.shape.end());
      dlplan::exec::Tensor dst = alloc.empty(shape, t.dtype, dlplan::Category::workspace, "batch");
      source->fill(static_cast<int>(k), dst, 1000003, 2);
    }
  });
  return 0;
}
