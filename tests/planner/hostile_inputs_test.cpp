// Issue 16's classes of hostile input, one regression test each with the
// message a user gets: JSON nested too deep for any reader, a Hugging Face
// config of ten million layers, ONNX graphs that crashed libonnx's shape
// inference, outputs that must not replace device nodes, and the limits on
// training knobs. (The IR loader's own: loader_test.cpp; plans and reports:
// documents_test.cpp; data files: tests/executor/data_limits_test.cpp.)
#include "error_of.hpp"
#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

namespace dlplan {
namespace {

using J = nlohmann::json;

using testing::error_of;

std::string error_of_or_none(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string temp(const std::string& name) { return ::testing::TempDir() + "dlplan_hostile_" + name; }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// ---- JSON ---------------------------------------------------------------------

TEST(JsonLimits, DeepNestingIsRefusedBeforeParsing) {
  for (const std::string& open : {std::string(100000, '['), std::string(100000, '{')}) {
    const std::string msg = error_of([&] { parse_json_text(open, "deep.json"); });
    EXPECT_EQ(msg, "deep.json: JSON nested deeper than 64 levels at byte 65");
  }
  // Depth 64 is fine; brackets in strings (escaped quotes too) do not count.
  EXPECT_NO_THROW(parse_json_text(std::string(64, '[') + std::string(64, ']'), "ok.json"));
  EXPECT_NO_THROW(parse_json_text("[\"\\\"" + std::string(1000, '[') + "\"]", "ok.json"));
}

TEST(JsonLimits, ParseErrorsAreMessages) {
  EXPECT_NE(error_of([] { parse_json_text("[1e400]", "big.json"); }).find("big.json: malformed JSON"), std::string::npos);
  EXPECT_NE(error_of([] { parse_json_text("{\"a\": }", "bad.json"); }).find("bad.json: malformed JSON at byte"), std::string::npos);
  EXPECT_NE(error_of([] { read_json_file(temp("absent.json"), "plan file"); }).find("cannot open plan file"), std::string::npos);
}

// ---- Hugging Face configs ------------------------------------------------------

J llama_config(int64_t layers) {
  return {{"model_type", "llama"}, {"num_hidden_layers", layers}, {"hidden_size", 64}, {"num_attention_heads", 4},
          {"intermediate_size", 128}, {"vocab_size", 100}, {"max_position_embeddings", 32}};
}

// num_hidden_layers of 10^4-10^7 took minutes, then std::bad_alloc.
TEST(HfLimits, TenMillionLayersIsRefusedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of([] { hf_config_to_ir(llama_config(10000000), "config.json"); });
  EXPECT_EQ(msg, "config.json: field 'num_hidden_layers' = 10000000 is more than dlplan's limit of 4096 layers");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_NO_THROW(parse_model(J(hf_config_to_ir(llama_config(2), "config.json")), "config.json"));  // control
}

TEST(HfLimits, SizesPastTwoToThe24AreRefused) {
  J c = llama_config(2);
  c["hidden_size"] = int64_t{1} << 40;
  EXPECT_NE(error_of([&] { hf_config_to_ir(c, "config.json"); })
                .find("config.json: field 'hidden_size' must be a positive integer up to 16777216"),
            std::string::npos);
  J v = {{"model_type", "vit"}, {"num_hidden_layers", 1}, {"hidden_size", 8}, {"num_attention_heads", 2},
         {"intermediate_size", 8}, {"image_size", 16777216}, {"patch_size", 1}};
  EXPECT_NE(error_of([&] { hf_config_to_ir(v, "vit.json"); }).find("patches a side"), std::string::npos);
}

// ---- ONNX ---------------------------------------------------------------------

std::string hostile_onnx(const char* name) { return std::string(DLPLAN_SOURCE_DIR) + "/tests/fixtures/hostile/" + name; }

// A zero stride: SIGFPE in libonnx's convPoolShapeInference.
TEST(OnnxStructure, ZeroStrideIsRefusedBeforeShapeInference) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg = error_of([] { import_onnx(hostile_onnx("conv_stride_zero.onnx"), ImportOptions{2, 0}); });
  EXPECT_NE(msg.find("conv_stride_zero.onnx: node '/conv/Conv' (Conv): attribute 'strides' holds 0, outside [1, 2^31]"),
            std::string::npos)
      << msg;
}

// Found by fuzz_onnx (UBSan: signed overflow multiplying an unmapped op's
// initializer dims): shape products are checked against the tensor limit --
// since the second finding below, for every initializer before anything
// else reads it.
TEST(OnnxStructure, HugeShapeOfAnUnmappedOpIsRefusedNotOverflowed) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg =
      error_of([] { import_onnx(hostile_onnx("unmapped_op_huge_shape.onnx"), ImportOptions{2, 16}); });
  EXPECT_NE(msg.find("unmapped_op_huge_shape.onnx: initializer 'head.weight' has more than 2^48 elements"),
            std::string::npos)
      << msg;
}

// Found by fuzz_onnx in CI's run (UBSan: signed overflow in the bias-Add
// absorption, which multiplies the bias initializer's dims): the fuzzer's
// input itself (tests/fixtures/hostile/bias_add_huge_initializer.onnx, also
// in the onnx seed corpus), refused before any product is taken.
TEST(OnnxStructure, HugeBiasInitializerIsRefusedNotOverflowed) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg =
      error_of([] { import_onnx(hostile_onnx("bias_add_huge_initializer.onnx"), ImportOptions{2, 0}); });
  EXPECT_NE(msg.find("bias_add_huge_initializer.onnx: initializer 'layers.1.linear.bias' has more than 2^48 elements"),
            std::string::npos)
      << msg;
}

// Found by fuzz_onnx (ASan: reading a MatMul's second input that is not
// there): a file that declares no opset is not verified against the schemas,
// so the importer counts the inputs it reads itself.
TEST(OnnxStructure, MatMulWithOneInputIsRefusedNamingTheNode) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg = error_of([] { import_onnx(hostile_onnx("matmul_one_input.onnx"), ImportOptions{2, 0}); });
  EXPECT_NE(msg.find("matmul_one_input.onnx: node '/layers.1.linear/MatMul' (MatMul): has 1 input; MatMul takes 2"),
            std::string::npos)
      << msg;
}

// Found by fuzz_onnx (UBSan: the attention matcher reading a Softmax's first
// input that is not there, in a file without an opset; the file is the
// fuzzer's input itself, also in the onnx seed corpus): every node's inputs
// and outputs are counted before any fusion looks at them.
TEST(OnnxStructure, SoftmaxWithoutInputsIsRefusedBeforeFusionsNamingTheNode) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg = error_of([] { import_onnx(hostile_onnx("softmax_no_input.onnx"), ImportOptions{2, 0}); });
  EXPECT_NE(msg.find("softmax_no_input.onnx: node "), std::string::npos) << msg;
  EXPECT_NE(msg.find("(Softmax): has 0 inputs; Softmax takes at least 1"), std::string::npos) << msg;
}

TEST(OnnxStructure, NodeNotMatchingItsSchemaIsRefused) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg = error_of([] { import_onnx(hostile_onnx("reshape_one_input.onnx"), ImportOptions{2, 0}); });
  EXPECT_NE(msg.find("reshape_one_input.onnx: node '/reshape/Reshape' (Reshape) does not match the ONNX schema of Reshape"),
            std::string::npos)
      << msg;
}

// Control flow (Scan, Loop, If) never reaches libonnx's inference: the import
// goes on from the shapes in the file and ends in a message, not a crash.
TEST(OnnxStructure, SubgraphsSkipShapeInference) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  try {
    const Model m = import_onnx(hostile_onnx("scan_bad_body.onnx"), ImportOptions{2, 4});
    bool noted = false;
    for (const auto& n : m.notes) noted = noted || n.find("ONNX shape inference not run") != std::string::npos;
    EXPECT_TRUE(noted) << "the model's notes do not say that shape inference was skipped";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scan_bad_body.onnx: "), std::string::npos) << e.what();
  }
}

// ---- outputs ------------------------------------------------------------------

TEST(OutputFile, ReplacesARegularFileAtomically) {
  const std::string path = temp("out.json");
  write_output_file(path, "one\n");
  write_output_file(path, "two\n");
  EXPECT_EQ(slurp(path), "two\n");
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0) << "the temporary file is left behind";
  std::remove(path.c_str());
}

// As root, --report /dev/null replaced the device node with a regular file.
TEST(OutputFile, WritesThroughACharacterDevice) {
  write_output_file("/dev/null", "discarded\n");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null is no longer a character device";
  EXPECT_NE(::access("/dev/null.tmp", F_OK), 0);
}

TEST(OutputFile, FollowsASymbolicLink) {
  const std::string target = temp("target.json"), link = temp("link.json");
  std::remove(link.c_str());
  write_output_file(target, "old\n");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  write_output_file(link, "new\n");
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced by a file";
  EXPECT_EQ(slurp(target), "new\n");
  std::remove(link.c_str());
  std::remove(target.c_str());
}

TEST(OutputFile, RefusesAFolder) {
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(error_of([&] { write_output_file(dir, "x"); }).find("is a folder"), std::string::npos);
  EXPECT_NE(error_of([] { write_output_file("/no/such/folder/out.json", "x"); }).find("/no/such/folder/out.json: cannot write"),
            std::string::npos);
}

// ---- training knobs -------------------------------------------------------------

// --micro-batch 4611686018427387904 --gpus 2 printed "global batch
// -9223372036854775808", fits yes.
TEST(TrainingLimits, MicroBatchAndGlobalBatch) {
  const Model m = load_model("tiny-mlp");
  Cluster c;
  c.device = find_device("h100-80g");
  c.gpus_per_node = 32;
  TrainingConfig t;
  t.micro_batch = int64_t{1} << 62;
  EXPECT_EQ(error_of([&] { check_training_limits(m, c, t, ""); }), "--micro-batch = 4611686018427387904 is outside [1, 1048576]");
  EXPECT_EQ(error_of([&] { check_training_limits(m, c, t, "plan.json"); }),
            "plan.json: micro_batch = 4611686018427387904 is outside [1, 1048576]");
  t.micro_batch = kMaxMicroBatch;
  t.grad_accum = kMaxGradAccum;
  EXPECT_NE(error_of([&] { check_training_limits(m, c, t, ""); }).find("more than 2^40 samples"), std::string::npos);
  t.grad_accum = 1;
  EXPECT_EQ(error_of_or_none([&] { check_training_limits(m, c, t, ""); }), "");  // control
  // 2^38 elements a sample x 2^20 samples: past 2^56 elements in one micro-batch.
  const Model wide = parse_model(J::parse(R"({
    "inputs": {"x": {"shape": [137438953472, 2], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [{"name": "first", "op": "select", "in": ["x"]},
              {"name": "head", "op": "linear", "in": ["first"], "out": 2},
              {"name": "loss", "op": "cross_entropy", "in": ["head", "label"]}]})"),
                                 "wide.json");
  EXPECT_NE(error_of([&] { check_training_limits(wide, c, t, ""); }).find("more than 2^56"), std::string::npos);
}

}  // namespace
}  // namespace dlplan
