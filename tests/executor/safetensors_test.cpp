// safetensors written and read back by dlplan (checkpoint.hpp), and files
// that are not what they claim refused with a message naming the file. The
// format (https://github.com/huggingface/safetensors#format): an 8-byte
// little-endian header length N, N bytes of JSON, then the data; each tensor's
// data_offsets are relative to the data's start.
#include "dlplan/exec/checkpoint.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

using dlplan::exec::NamedTensor;

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "dlplan_st_" + std::to_string(::getpid()) + "_" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

std::string error_of(const std::string& path) {
  try {
    dlplan::exec::read_safetensors(path);
  } catch (const dlplan::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, WrittenFileHasTheFormatsLayoutAndReadsBack) {
  const std::vector<NamedTensor> in = {{"a.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b.bias", {1}, {-0.5f}}};
  const std::string path = temp("rt.safetensors");
  dlplan::exec::write_safetensors(path, in, {{"step", "7"}});
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data 8-byte aligned";
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["step"], "7");
  EXPECT_EQ(header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["b.bias"]["data_offsets"], nlohmann::json({24, 28}));
  EXPECT_EQ(bytes.size(), 8 + n + 28);
  float v = 0;
  std::memcpy(&v, bytes.data() + 8 + n + 24, 4);
  EXPECT_EQ(v, -0.5f);
  const auto out = dlplan::exec::read_safetensors(path);
  ASSERT_EQ(out.size(), 2u);
  for (const auto& t : out) {
    const auto& want = t.name == "a.weight" ? in[0] : in[1];
    EXPECT_EQ(t.shape, want.shape);
    EXPECT_EQ(t.values, want.values);
  }
  std::remove(path.c_str());
}

TEST(Safetensors, HalfPrecisionTensorsReadAsFloat) {
  // bf16 1.5 = 0x3FC0; fp16 -2.0 = 0xC000, fp16 2^-24 (the least subnormal) = 0x0001.
  const std::string data = std::string("\xC0\x3F", 2) + std::string("\x00\xC0", 2) + std::string("\x01\x00", 2);
  const std::string path = temp("half.safetensors");
  spit(path, with_header(R"({"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                         R"("y":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}})",
                         data));
  const auto out = dlplan::exec::read_safetensors(path);
  ASSERT_EQ(out.size(), 2u);
  for (const auto& t : out) {
    if (t.name == "x") EXPECT_EQ(t.values, std::vector<float>{1.5f});
    else EXPECT_EQ(t.values, (std::vector<float>{-2.0f, 5.9604644775390625e-08f}));
  }
  std::remove(path.c_str());
}

TEST(Safetensors, BadFilesAreRefusedNamingTheFile) {
  const std::string path = temp("bad.safetensors");
  const std::string ok_data(8, '\0');
  struct Bad {
    std::string bytes, expect;
  };
  for (const Bad& b : {Bad{"abc", "shorter than its 8-byte header length"},
                       Bad{std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "beyond the file"},
                       Bad{with_header("{not json", ""), "header is not JSON"},
                       Bad{with_header("[1,2]", ""), "not a JSON object"},
                       Bad{with_header(R"({"x":3e3333})", ""), "header is not JSON"},  // fuzz finding: number overflow
                       Bad{with_header(R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", ok_data), "is I64"},
                       Bad{with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", ok_data),
                           "data_offsets do not match its shape"},
                       Bad{with_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", ok_data),
                           "outside the file"},
                       Bad{with_header(R"({"x":{"dtype":"F32","shape":"four","data_offsets":[0,16]}})", ok_data),
                           "tensor 'x'"},
                       Bad{with_header(R"({"x":{"dtype":"F32","shape":[1e300],"data_offsets":[0,4]}})", ok_data),
                           "tensor 'x': 1e+300 is not an integer"},
                       Bad{with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0.5,4]}})", ok_data),
                           "tensor 'x': 0.5 is not an integer"}}) {
    spit(path, b.bytes);
    const std::string e = error_of(path);
    EXPECT_NE(e.find(path + ": not a safetensors file"), std::string::npos) << e;
    EXPECT_NE(e.find(b.expect), std::string::npos) << e;
  }
  std::remove(path.c_str());
  EXPECT_NE(error_of(temp("missing.safetensors")).find("cannot open"), std::string::npos);
}

// Fuzz finding (fuzz/checkpoint.cpp): a manifest whose number overflows a
// double was nlohmann's out_of_range, escaping as an internal error.
TEST(CheckpointManifest, UnreadableNumbersAreAnErrorNamingTheManifest) {
  const std::string dir = temp("manifest_dir");
  std::filesystem::create_directories(dir + "/step-00000001");
  spit(dir + "/latest", "step-00000001\n");
  // Fuzz findings: a number past a double; a float where an int belongs
  // (nlohmann's get<int>() casts it, undefined past int's range).
  for (const std::string text : {R"({"buffers":3e333333333313333333333333333})", R"({"kind":"checkpoint")", "[]",
                                 R"({"kind":"checkpoint","schema_version":1,"step":3.3e65,"world_size":1,"states":["params"]})",
                                 R"({"kind":"checkpoint","schema_version":1,"step":1,"world_size":1,"states":["params"],)"
                                 R"("units":[{"unit":0,"size":1e30,"params":[]}],"buffers":[],"shards":[{}]})"}) {
    spit(dir + "/step-00000001/manifest.json", text);
    try {
      dlplan::exec::read_checkpoint_tensors(dir);
      ADD_FAILURE() << "accepted " << text;
    } catch (const dlplan::Error& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/step-00000001/manifest.json: "), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
