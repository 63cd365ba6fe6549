// Data files a user hands `dlplan train --data` (issue 16): a DLPI header may
// claim any size, and it is checked against the model and the file before
// anything is allocated; token windows are found for any sample index without
// overflow. The readers' ordinary behaviour: train_test.cpp (Data.*).
#include "dlplan/error.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/tensor.hpp"
#include "dlplan/loader.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

std::string error_of(const std::string& path, const Model& m) {
  try {
    make_data_source(path, m, 1);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " was accepted";
  return "";
}

void write_header(const std::string& path, std::vector<uint32_t> header) {
  std::ofstream f(path, std::ios::binary);
  f.write("DLPI", 4);
  f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
}

// A 24-byte file whose header claims 1 x 512 x 1024 x 1024 images allocated
// 2.2 GB before noticing it was 24 bytes long.
TEST(DataLimits, HeaderClaimingGigabytesIsCheckedBeforeAllocating) {
  const Model m = load_model("tiny-cnn");  // image [3, 16, 16], 10 classes
  const std::string path = ::testing::TempDir() + "dlplan_huge_header.dlpi";
  write_header(path, {1, 512, 1024, 1024, 10});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of(path, m), path + ": images are [512, 1024, 1024] but the model's image input is 'image' [3, 16, 16]");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  // The model's own size, but a count the file does not hold.
  write_header(path, {4000000000u, 3, 16, 16, 10});
  EXPECT_EQ(error_of(path, m), path + ": the header promises 4000000000 records of 3076 bytes, but the file holds 0 bytes "
                                      "after it (truncated, or not a DLPI file)");
  // Channels x height x width past 2^64: no overflow, the same refusal.
  write_header(path, {1, 4294967295u, 4294967295u, 4294967295u, 10});
  EXPECT_NE(error_of(path, m).find("images are [4294967295, 4294967295, 4294967295]"), std::string::npos);
  // Control: one whole record is read.
  write_image_file(path, 3, 16, 16, 10, {4}, std::vector<float>(3 * 16 * 16, 0.5f));
  EXPECT_NO_THROW(make_data_source(path, m, 1));
}

TEST(DataLimits, TokenWindowsForAnySampleIndex) {
  const Model m = load_model("tiny-gpt");  // tokens, targets: [64] i32, vocab 256
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 256);
  const std::string path = ::testing::TempDir() + "dlplan_tokens_far.u16";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  auto src = make_data_source(path, m, 1);
  Allocator a;
  Tensor t = a.empty({1, 64}, DType::i32, Category::workspace, "t");
  const int64_t first = (int64_t{1} << 62) - 1;  // (first * 64) overflowed int64 (UBSan in data.cpp)
  int tokens_input = -1;  // the inputs' order is the file's (tiny-gpt lists targets first)
  for (size_t k = 0; k < m.inputs.size(); ++k)
    if (m.tensor(m.inputs[k]).name == "tokens") tokens_input = static_cast<int>(k);
  ASSERT_GE(tokens_input, 0);
  src->fill(tokens_input, t, first, 1);
  const int64_t windows = 1000 - 64 - 1;
  const int64_t at = (first % windows) * 64 % windows;  // the same residue, without the overflow
  EXPECT_EQ(t.i()[0], tokens[static_cast<size_t>(at)]);
}

TEST(DataLimits, AFolderIsNotADataFile) {
  const Model m = load_model("tiny-gpt");
  EXPECT_NE(error_of(::testing::TempDir(), m).find("not a regular file"), std::string::npos);
}

}  // namespace
