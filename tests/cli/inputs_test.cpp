// Every input is honoured or refused, never silently changed: the --cluster
// file's topology, every numeric flag's range, the sequence length (shown,
// bounded by learned position tables, noted beyond a RoPE model's context),
// and the optimizer's knobs as flags that reach the plan file.
#include "cli_helpers.hpp"

#include <cmath>
#include <filesystem>

namespace {

using namespace cli_test;

// A cluster file of 2 nodes x 8 H100s.
struct TwoByEight {
  std::string path = temp_path("2x8.json");
  TwoByEight() { std::ofstream(path) << R"({"gpu": "h100-80g", "nodes": 2, "gpus_per_node": 8})"; }
  ~TwoByEight() { std::remove(path.c_str()); }
};

double zero3_comm_seconds(const nlohmann::json& j) {
  for (const auto& s : j["strategies"])
    if (s["strategy"] == "zero3") return s["comm"]["seconds"].get<double>();
  ADD_FAILURE() << "no zero3 row";
  return 0;
}

TEST(CliCluster, TheFilesTopologyIsKept) {
  TwoByEight f;
  auto from_file = planning("--model llama2-7b --cluster '" + f.path + "' --gpus 16");
  EXPECT_EQ(from_file["cluster"]["nodes"], 2);
  EXPECT_EQ(from_file["cluster"]["gpus_per_node"], 8);
  EXPECT_EQ(from_file["cluster"]["source"], f.path);
  // The same cluster from the catalog: the same communication time.
  auto from_flags = planning("--model llama2-7b --gpu h100-80g --gpus 16 --nodes 2");
  EXPECT_DOUBLE_EQ(zero3_comm_seconds(from_file), zero3_comm_seconds(from_flags));
  // Control: 4 nodes of 4 is another cluster, with another communication
  // time: a flat ring across nodes runs at the slower of NVLink and a node's
  // NICs together (comm_model.cpp), 4 NICs instead of 8. (1 x 16 would not
  // do: with 8 rail-aligned NICs of 50 GB/s a 2 x 8 ring is NVLink-bound too.)
  auto four_nodes = planning("--model llama2-7b --gpu h100-80g --gpus 16 --nodes 4");
  EXPECT_GT(zero3_comm_seconds(four_nodes) / zero3_comm_seconds(from_file), 1.5);
  // Without --gpus the file says all of it.
  EXPECT_EQ(planning("--model tiny-gpt --cluster '" + f.path + "'")["cluster"]["nodes"], 2);
  // A part of it: one node, or part of one node.
  EXPECT_EQ(planning("--model tiny-gpt --cluster '" + f.path + "' --gpus 8")["cluster"]["nodes"], 1);
  EXPECT_EQ(planning("--model tiny-gpt --cluster '" + f.path + "' --gpus 4")["cluster"]["gpus_per_node"], 4);
}

TEST(CliCluster, FlagsThatContradictTheFileAreRefused) {
  TwoByEight f;
  expect_usage_error("--model tiny-gpt --cluster '" + f.path + "' --gpus 32", {"--gpus 32", f.path, "2 nodes x 8"});
  expect_usage_error("--model tiny-gpt --cluster '" + f.path + "' --gpus 12", {"--gpus 12", "whole nodes"});
  expect_usage_error("--model tiny-gpt --cluster '" + f.path + "' --gpus 16 --nodes 1", {"--nodes 1", "16 GPUs"});
  expect_usage_error("--model tiny-gpt --cluster '" + f.path + "' --gpu a100-80g", {"--gpu", "--cluster"});
}

// Every numeric flag: out of range is a usage error naming the flag.
TEST(CliValidation, EveryNumericFlagIsChecked) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--gpus 0", "--gpus"},           {"--gpus -1", "--gpus"},
      {"--nodes 0", "--nodes"},         {"--micro-batch 0", "--micro-batch"},
      {"--micro-batch lots", "--micro-batch"}, {"--global-batch 0", "--global-batch"},
      {"--grad-accum 0", "--grad-accum"}, {"--seq-len 0", "--seq-len"},
      {"--lr -1", "--lr"},              {"--lr 0", "--lr"},
      {"--lr nan", "--lr"},             {"--min-lr -1", "--min-lr"},
      {"--min-lr 0.1", "--min-lr"},     {"--warmup-steps -1", "--warmup-steps"},
      {"--clip-norm -1", "--clip-norm"}, {"--weight-decay -0.1", "--weight-decay"},
      {"--betas 1.5,0.9", "--betas"},   {"--betas 0.9", "--betas"},
      {"--eps 0", "--eps"},             {"--bucket-mb 0", "--bucket-mb"},
      {"--prefetch -1", "--prefetch"},  {"--syncbn-group 0", "--syncbn-group"},
      {"--micro-batch 2000000", "--micro-batch"}};
  for (const auto& [flags, name] : bad) expect_usage_error("--model tiny-gpt --gpus 2 " + flags, {name});
  // The value given is the value named, not a default substituted for it.
  expect_usage_error("--model tiny-gpt --gpus 0 --nodes 2", {"--gpus", "got 0"});
  // Knobs of another optimizer are refused rather than ignored.
  expect_usage_error("--model tiny-gpt --optimizer sgd --betas 0.9,0.99", {"--betas", "sgd"});
  expect_usage_error("--model tiny-gpt --optimizer adamw --momentum 0.8", {"--momentum", "adamw"});
  // Control: the same flags in range plan.
  EXPECT_EQ(run("--model tiny-gpt --gpus 2 --lr 1e-3 --min-lr 1e-5 --warmup-steps 10 --clip-norm 0 --weight-decay 0 "
                "--betas 0.9,0.99 --eps 1e-6 --bucket-mb 4 --prefetch 0 --grad-accum 2 --seq-len 16")
                .status,
            0);
}

TEST(CliSeqLen, ShownInTheHeaderAndTheJson) {
  Result r = run("--model gpt2 --gpus 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "seq-len 1024 (the model's context)")) << r.out;
  auto j = planning("--model gpt2 --gpus 8");
  EXPECT_EQ(j["training"]["seq_len"], 1024);
  EXPECT_EQ(j["model"]["context"], 1024);
  EXPECT_EQ(planning("--model gpt2 --gpus 8 --seq-len 256")["training"]["seq_len"], 256);
  // A Hugging Face config plans at its own context, and says so.
  Result m = run("--model tests/fixtures/hf/mistral-7b.json --gpus 8");
  EXPECT_TRUE(contains(m.out, "seq-len 32768 (the model's context)")) << m.out;
  // A model without token inputs has no sequence length.
  EXPECT_EQ(planning("--model vit-b16 --gpus 8")["training"]["seq_len"], 0);
}

// Mixtral's experts take ceil(1.25 x 4096 x 2 / 8) = 1280 tokens of a sample
// by default, and the note says so; --capacity-factor 4 (experts / top_k)
// drops none, needs no note and plans larger expert buffers.
TEST(CliDecoderSeqLen, CalibrateTakesItAsPlanDoes) {
  // The same check as plan's: a model without a decoder is refused, naming
  // the flag, before any measuring.
  const std::string path = temp_path("decoder.cluster.json");
  expect_user_error("calibrate --model tiny-mlp --decoder-seq-len 8 --out '" + path + "'",
                    {"--decoder-seq-len does not apply", "decoder_input_ids"});
  expect_user_error("plan --model tiny-mlp --gpu cpu --decoder-seq-len 8", {"--decoder-seq-len does not apply"});
}

TEST(CliCapacityFactor, SetsTheExpertsPlacesAndTheNoteSaysWhatIsDropped) {
  Result r = run("--model mixtral-8x7b --gpus 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "note     mixture of experts: in node 'layers.0.block_sparse_moe' and 31 more, each of 8 "
                              "experts takes at most 1280 of a sample's 4096 tokens (capacity factor 1.25)"))
      << r.out;
  Result dropless = run("--model mixtral-8x7b --gpus 8 --capacity-factor 4");
  ASSERT_EQ(dropless.status, 0) << dropless.err;
  EXPECT_FALSE(contains(dropless.out, "mixture of experts")) << dropless.out;
  EXPECT_NE(planning("--model mixtral-8x7b --gpus 8 --capacity-factor 4"), planning("--model mixtral-8x7b --gpus 8"));
  expect_usage_error("--model mixtral-8x7b --capacity-factor 0", {"--capacity-factor"});
  expect_usage_error("--model tiny-gpt --capacity-factor 2", {"tiny-gpt", "no mixture of experts", "--capacity-factor"});
}

// --expert-units makes each expert a unit of its own: under ZeRO-3 the plan
// gathers less at once; a model without experts is refused, naming the flag.
TEST(CliExpertUnits, EachExpertIsAUnitAndAModelWithoutExpertsIsRefused) {
  auto gathered = [](const nlohmann::json& j) {
    for (const auto& s : j["strategies"])
      if (s["strategy"] == "zero3") return s["memory_max"]["gathered"].get<double>();
    ADD_FAILURE() << "no zero3 row";
    return 0.0;
  };
  const std::string base = "--model mixtral-8x7b --gpus 8 --strategy zero3";
  EXPECT_LT(gathered(planning(base + " --expert-units")), gathered(planning(base)));
  const Result table = run(base + " --expert-units");
  EXPECT_TRUE(contains(table.out, "note     each of the 256 experts is a unit of its own (--expert-units)")) << table.out;
  expect_usage_error("--model tiny-gpt --expert-units", {"tiny-gpt", "no mixture of experts", "--expert-units"});
}

TEST(CliSeqLen, LearnedPositionsRefuseRopeExtrapolatesWithANote) {
  expect_usage_error("--model gpt2 --seq-len 2048", {"gpt2", "--seq-len 2048", "'wpe'", "max_len 1024"});
  Result r = run("--model llama2-7b --gpus 8 --seq-len 8192");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "note     --seq-len 8192 is beyond the model's context of 4096 tokens")) << r.out;
  EXPECT_TRUE(contains(r.out, "rotary")) << r.out;
  auto j = planning("--model llama2-7b --gpus 8 --seq-len 8192");
  EXPECT_EQ(j["training"]["seq_len"], 8192);
  ASSERT_TRUE(j["model"].contains("notes"));
  // Control: within the context, no note.
  EXPECT_FALSE(contains(run("--model llama2-7b --gpus 8 --seq-len 2048").out, "beyond"));
}

TEST(CliDefaults, EveryDefaultThatShapesTheAnswerIsShown) {
  Result r = run("--model gpt2 --gpus 8");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"bf16-mixed", "adamw lr 0.0003", "betas 0.9,0.95", "weight-decay 0.1", "clip-norm 1",
                        "attention math", "checkpointing none", "bucket 25 MiB", "prefetch 1 unit", "5% margin"})
    EXPECT_TRUE(contains(r.out, s)) << s << " missing from:\n" << r.out;
  auto t = planning("--model gpt2 --gpus 8")["training"];
  EXPECT_EQ(t["bucket_mb"], 25.0);
  EXPECT_EQ(t["prefetch"], 1);
  EXPECT_EQ(t["fragmentation_margin"], 0.05);
  EXPECT_EQ(t["lr"], 3e-4);
  // The device decides the default precision, and says which.
  EXPECT_EQ(planning("--model gpt2 --gpu v100-32g --gpus 8")["training"]["precision"], "fp16-mixed");  // no bf16
  EXPECT_EQ(planning("--model tiny-gpt --gpu cpu --gpus 2")["training"]["precision"], "fp32");
}

TEST(CliOptimizer, TrainingKnobsAreFlagsThatReachThePlan) {
  const std::string path = temp_path("knobs-plan.json");
  Result r = run("--model tiny-gpt --gpu cpu --gpus 2 --lr 1e-3 --warmup-steps 20 --min-lr 1e-5 --clip-norm 0.5 "
                 "--weight-decay 0.05 --betas 0.8,0.99 --eps 1e-6 --out '" + path + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"lr 0.001 after 20 warm-up steps", "min-lr 1e-05", "betas 0.8,0.99", "eps 1e-06",
                        "weight-decay 0.05", "clip-norm 0.5"})
    EXPECT_TRUE(contains(r.out, s)) << s << " missing from:\n" << r.out;
  auto o = nlohmann::json::parse(slurp(path))["optimizer"];
  EXPECT_EQ(o["lr"], 1e-3);
  EXPECT_EQ(o["warmup_steps"], 20);
  EXPECT_EQ(o["min_lr"], 1e-5);
  EXPECT_EQ(o["clip_norm"], 0.5);
  EXPECT_EQ(o["weight_decay"], 0.05);
  EXPECT_EQ(o["betas"], nlohmann::json({0.8, 0.99}));
  EXPECT_EQ(o["eps"], 1e-6);
  std::remove(path.c_str());
  // sgd-momentum's momentum too.
  Result m = run("--model tiny-gpt --gpu cpu --gpus 2 --optimizer sgd-momentum --momentum 0.8 --out '" + path + "'");
  ASSERT_EQ(m.status, 0) << m.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(path))["optimizer"]["momentum"], 0.8);
  std::remove(path.c_str());
}

}  // namespace

// --fusion eager plans GPT-2's gelu_new op by op (docs/onnx.md): more
// activations than the fused default, the same parameters. The flag names
// its values, and a model that is not imported is refused.
TEST(CliFusion, EagerPlansWrittenOutMathAndOnlyForOnnxFiles) {
  const std::string gpt2 = DLPLAN_SOURCE_DIR "/tests/fixtures/exports/tiny-gpt2-opset17.onnx";
  Result probe = run("--model '" + gpt2 + "' --gpu cpu --seq-len 64");
  if (probe.status != 0 && contains(probe.err, "without ONNX support")) GTEST_SKIP() << "built without ONNX support";
  const auto engine = planning("--model '" + gpt2 + "' --gpu cpu --seq-len 64 --precision fp32");
  const auto eager = planning("--model '" + gpt2 + "' --gpu cpu --seq-len 64 --precision fp32 --fusion eager");
  ASSERT_FALSE(engine["strategies"].empty());
  ASSERT_FALSE(eager["strategies"].empty());
  EXPECT_GT(eager["strategies"][0]["memory_max"]["activations"].get<int64_t>(),
            engine["strategies"][0]["memory_max"]["activations"].get<int64_t>());
  EXPECT_EQ(eager["model"]["params"], 541184);
  EXPECT_EQ(engine["model"]["params"], 541184);  // PyTorch's count (reference.json)
  expect_usage_error("--model '" + gpt2 + "' --gpu cpu --fusion none", {"--fusion must be engine or eager", "'none'"});
  expect_usage_error("--model gpt2 --fusion eager", {"--fusion applies to the files dlplan imports", "'gpt2'"});
  const std::string ir = DLPLAN_SOURCE_DIR "/tests/fixtures/tiny-se.json";
  expect_usage_error("--model '" + ir + "' --gpu cpu --fusion eager", {"--fusion applies", "tiny-se.json"});
  // A Hugging Face config is imported too: Phi's gelu_new op by op.
  const std::string phi = DLPLAN_SOURCE_DIR "/tests/fixtures/hf/tiny-phi.json";
  const auto fused = planning("--model '" + phi + "' --gpu cpu --precision fp32");
  const auto unfused = planning("--model '" + phi + "' --gpu cpu --precision fp32 --fusion eager");
  EXPECT_GT(unfused["strategies"][0]["memory_max"]["activations"].get<int64_t>(),
            fused["strategies"][0]["memory_max"]["activations"].get<int64_t>());
  EXPECT_EQ(unfused["model"]["params"], fused["model"]["params"]);
  // calibrate imports the model as plan does, and refuses the same values.
  const std::string out = temp_path("fusion.cluster.json");
  expect_usage_error("calibrate --model gpt2 --fusion eager --out '" + out + "'", {"--fusion applies", "'gpt2'"});
  expect_usage_error("calibrate --model '" + phi + "' --fusion fused --out '" + out + "'",
                     {"--fusion must be engine or eager"});
}
