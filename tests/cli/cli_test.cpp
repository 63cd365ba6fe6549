// The dlplan executable end to end: the happy path's outputs (table, JSON,
// CSV, plan file) and, for every class of bad input, a non-zero exit with one
// line on stderr, "dlplan: error: ...", naming the culprit: 1 for a user's
// error (a bad file), 2 for a usage error (a bad value or combination).
#include "cli_helpers.hpp"

#include <algorithm>
#include <filesystem>

namespace {

namespace fs = std::filesystem;
using namespace cli_test;

// ---- the happy path ------------------------------------------------------------

TEST(CliPlan, TableHasEveryStrategyAndARecommendation) {
  Result r = run("--model models/vit-b16.json --gpus 8");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"ddp", "zero1", "zero2", "zero3"}) {
    bool row = false;
    for (const auto& l : lines(r.out)) row |= l.rfind(s, 0) == 0;
    EXPECT_TRUE(row) << "no row for " << s << " in:\n" << r.out;
  }
  EXPECT_NE(r.out.find("Recommendation"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vit-b16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(CliPlan, PlanSubcommandIsTheSame) {
  EXPECT_EQ(run("plan --model vit-b16 --gpus 8").out, run("--model vit-b16 --gpus 8").out);
}

TEST(CliPlan, JsonSchema) {
  auto j = planning("--model models/vit-b16.json --gpus 8");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["kind"], "planning");
  ASSERT_TRUE(j["strategies"].is_array());
  ASSERT_EQ(j["strategies"].size(), 4u);
  std::vector<std::string> names;
  for (const auto& s : j["strategies"]) {
    names.push_back(s.value("strategy", ""));
    SCOPED_TRACE(names.back());
    const auto& mem = s["memory"];
    for (const char* k : {"params", "grads", "optimizer", "activations", "gathered", "comm", "workspace", "runtime", "peak"}) {
      ASSERT_TRUE(mem.contains(k)) << k;
      EXPECT_TRUE(mem[k].is_number_integer()) << k << " = " << mem[k];
      EXPECT_GE(mem[k].get<int64_t>(), 0) << k;
    }
    // The peak is the sum of the first seven categories at that moment.
    int64_t sum = 0;
    for (const char* k : {"params", "grads", "optimizer", "activations", "gathered", "comm", "workspace"})
      sum += mem[k].get<int64_t>();
    EXPECT_EQ(sum, mem["peak"].get<int64_t>());
    EXPECT_TRUE(s["fits"].is_boolean());
    EXPECT_TRUE(s["compute_seconds"].is_number());
    for (const char* k : {"bytes", "seconds", "exposed_seconds"}) EXPECT_TRUE(s["comm"][k].is_number()) << k;
    EXPECT_TRUE(s["step_seconds"].is_number());
    EXPECT_TRUE(s["mfu"].is_number());
    EXPECT_GT(s["step_seconds"].get<double>(), 0);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ddp", "zero1", "zero2", "zero3"}));
  ASSERT_TRUE(j["recommendation"].is_object());
  EXPECT_TRUE(j["recommendation"]["syncbn"].is_boolean());
  EXPECT_TRUE(j["recommendation"]["strategy"].is_string());
}

TEST(CliPlan, CsvHeaderAndFourRows) {
  Result r = run("--model models/vit-b16.json --gpus 8 --format csv");
  ASSERT_EQ(r.status, 0) << r.err;
  auto l = lines(r.out);
  ASSERT_EQ(l.size(), 5u) << r.out;
  EXPECT_EQ(l[0].rfind("strategy,", 0), 0u) << l[0];
  const auto columns = std::count(l[0].begin(), l[0].end(), ',');
  const char* strategies[] = {"ddp", "zero1", "zero2", "zero3"};
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(l[i].rfind(std::string(strategies[i - 1]) + ",", 0), 0u) << l[i];
    EXPECT_EQ(std::count(l[i].begin(), l[i].end(), ','), columns) << l[i];
  }
}

TEST(CliPlan, OutWritesAPlan) {
  const std::string path = temp_path("plan.json");
  std::remove(path.c_str());
  Result r = run("--model models/vit-b16.json --gpus 8 --out '" + path + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  auto plan = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(plan["schema_version"], 1);
  EXPECT_EQ(plan["kind"], "plan");
  EXPECT_EQ(plan["model"]["name"], "vit-b16");
  ASSERT_TRUE(plan["model"]["ir"].is_object());
  EXPECT_TRUE(plan["model"]["ir"]["nodes"].is_array());
  EXPECT_FALSE(plan["model"]["ir"]["nodes"].empty());
  EXPECT_TRUE(plan["predicted"]["memory"].contains("peak"));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(CliPlan, ZooNameEqualsFilePath) {
  auto by_file = planning("--model models/vit-b16.json --gpus 8");
  auto by_name = planning("--model vit-b16 --gpus 8");
  EXPECT_EQ(by_file, by_name);
  // Control: a different model gives a different document.
  auto other = planning("--model tiny-vit --gpus 8");
  EXPECT_NE(other, by_name);
}

TEST(CliLists, ModelsListsTheWholeZoo) {
  Result r = run("models");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::pair<std::string, std::string>> zoo = {
      {"vit-b16", "86,567,656"},     {"resnet18", "11,689,512"},  {"resnet50", "25,557,032"},
      {"gpt2", "124,439,808"},       {"gpt2-medium", "354,823,168"}, {"bert-base", "109,483,778"},
      {"llama2-7b", "6,738,415,616"}, {"llama2-70b", "68,976,648,192"}, {"qwen2-7b", "7,615,616,512"},
      {"mixtral-8x7b", "46,702,792,704"}, {"gemma-7b", "8,537,680,896"},  {"phi-2", "2,779,683,840"},       {"tiny-mlp", "26,122"}, {"tiny-cnn", "5,466"},
      {"tiny-vit", "72,010"},        {"tiny-gpt", "120,576"}, {"t5-v1_1-small", "76,961,152"}, {"tiny-t5", "181,120"}};
  auto l = lines(r.out);
  EXPECT_EQ(l.size(), zoo.size() + 1) << r.out;  // header + one row each
  for (const auto& [name, count] : zoo) {
    bool found = false;
    for (const auto& line : l)
      if (line.rfind(name + " ", 0) == 0) {
        found = true;
        EXPECT_NE(line.find(" " + count + " "), std::string::npos) << line;
      }
    EXPECT_TRUE(found) << name;
  }
}

TEST(CliLists, GpusListsTheCatalog) {
  Result r = run("gpus");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("h100-80g"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v100-32g"), std::string::npos) << r.out;
}

// ---- bad input -----------------------------------------------------------------

TEST(CliError, MissingModelFile) {
  expect_user_error("--model models/no-such-model.json --gpus 8", {"models/no-such-model.json", "zoo"});
}

TEST(CliError, ModelIsAFolder) { expect_user_error("--model models --gpus 8", {"models", "not a model file"}); }

TEST(CliError, MalformedModelFile) {
  const std::string path = temp_path("malformed.json");
  std::ofstream(path) << "{\"name\": \"m\", \"inputs\": ";
  expect_user_error("--model '" + path + "' --gpus 8", {path, "malformed JSON"});
  std::remove(path.c_str());
}

TEST(CliError, ModelFileWithBadNode) {
  const std::string path = temp_path("badnode.json");
  std::ofstream(path) << R"({"inputs": {"x": {"shape": [8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [{"name": "fc", "op": "linear", "in": ["x"], "out": 4, "colour": "red"},
              {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}]})";
  expect_user_error("--model '" + path + "'", {path, "node 'fc'", "unknown attribute 'colour'"});
  std::remove(path.c_str());
}

TEST(CliError, UnknownGpuKindListsKnown) {
  expect_usage_error("--model vit-b16 --gpus 8 --gpu k80", {"--gpu", "'k80'", "h100-80g", "v100-32g"});
}

TEST(CliError, Bf16OnV100) {
  expect_usage_error("--model vit-b16 --gpus 8 --gpu v100-32g --precision bf16-mixed", {"V100", "no bf16"});
  // Control: fp32 on the same device plans.
  EXPECT_EQ(run("--model vit-b16 --gpus 8 --gpu v100-32g --precision fp32").status, 0);
}

TEST(CliError, GpusNotDivisibleByNodes) {
  expect_usage_error("--model vit-b16 --gpus 8 --nodes 3", {"--gpus 8", "--nodes 3"});
  EXPECT_EQ(run("--model vit-b16 --gpus 8 --nodes 2").status, 0);  // control
}

TEST(CliError, GlobalBatchNotAMultiple) {
  expect_usage_error("--model vit-b16 --gpus 8 --global-batch 100", {"--global-batch 100", "not a multiple"});
  EXPECT_EQ(run("--model vit-b16 --gpus 8 --global-batch 96").status, 0);  // control
}

TEST(CliError, UnknownStrategy) {
  expect_usage_error("--model vit-b16 --gpus 8 --strategy zero9", {"strategy", "'zero9'", "zero3"});
}

TEST(CliError, SeqLenOnVisionModel) {
  expect_usage_error("--model vit-b16 --gpus 8 --seq-len 128", {"vit-b16", "--seq-len", "no token inputs"});
}

TEST(CliError, SeqLenBeyondPositionTable) {
  expect_usage_error("--model tiny-gpt --seq-len 10000", {"tiny-gpt", "node 'wpe'", "max_len"});
  EXPECT_EQ(run("--model tiny-gpt --seq-len 32").status, 0);  // control
}

TEST(CliError, SyncBnOnWithoutBatchnorm) {
  expect_usage_error("--model vit-b16 --gpus 8 --syncbn on", {"vit-b16", "--syncbn on", "no batchnorm"});
  EXPECT_EQ(run("--model resnet18 --gpus 8 --syncbn on").status, 0);  // control
}

TEST(CliError, ClusterFileMissing) {
  const std::string path = temp_path("no-such-cluster.json");
  std::remove(path.c_str());
  expect_user_error("--model vit-b16 --cluster '" + path + "'", {path, "cannot open"});
}

TEST(CliError, ClusterFileUnknownField) {
  const std::string path = temp_path("cluster-extra.json");
  std::ofstream(path) << R"({"gpu": "h100-80g", "nodes": 1, "gpus_per_node": 8, "interconnect": "ib"})";
  expect_user_error("--model vit-b16 --cluster '" + path + "'", {path, "unknown field 'interconnect'"});
  std::ofstream(path, std::ios::trunc) << R"({"gpu": "h100-80g", "nodes": 1, "gpus_per_node": 8})";
  EXPECT_EQ(run("--model vit-b16 --cluster '" + path + "'").status, 0);  // control
  std::remove(path.c_str());
}

TEST(CliError, OutIntoMissingDirectory) {
  const std::string path = temp_path("no-such-dir/plan.json");
  expect_user_error("--model vit-b16 --gpus 8 --out '" + path + "'", {path, "cannot write"});
  EXPECT_FALSE(fs::exists(path));
}

TEST(CliError, FailedPlanningLeavesOutFileIntact) {
  const std::string path = temp_path("keep.json");
  std::ofstream(path, std::ios::trunc) << "KEEP";
  expect_usage_error("--model vit-b16 --gpus 8 --gpu k80 --out '" + path + "'", {"k80"});
  EXPECT_EQ(slurp(path), "KEEP");
  expect_usage_error("--model vit-b16 --gpus 8 --strategy zero9 --out '" + path + "'", {"zero9"});
  EXPECT_EQ(slurp(path), "KEEP");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::remove(path.c_str());
}

}  // namespace

// Fine-tuning (docs/fine-tuning.md): the flags reach the table and the JSON,
// the plan file carries them, and what cannot run says so.
TEST(CliFineTuning, LoraInTableJsonAndPlanFile) {
  Result t = run("--model gpt2 --gpus 8 --lora 8 --lora-targets q,v");
  ASSERT_EQ(t.status, 0) << t.err;
  // 12 layers x 2 targets x r (768 + 768) adapters train.
  EXPECT_TRUE(contains(t.out, "fine-tuning: LoRA r=8 (alpha 8) on q, v; 294,912 of 124,734,720 parameters train")) << t.out;
  Result j = run("--model gpt2 --gpus 8 --lora 8 --format json");
  ASSERT_EQ(j.status, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["model"]["params"], 124439808);
  EXPECT_EQ(doc["model"]["trainable_params"], 294912);
  EXPECT_EQ(doc["training"]["fine_tuning"]["lora"]["rank"], 8);

  const std::string path = temp_path("lora_plan.json");
  Result p = run("--model tiny-gpt --gpus 1 --gpu cpu --lora 4 --out '" + path + "'");
  ASSERT_EQ(p.status, 0) << p.err;
  auto plan = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(plan["fine_tuning"]["lora"]["targets"], nlohmann::json({"q", "v"}));
  // The CPU engine trains it; the FSDP export cannot express it.
  Result train = run("train --plan '" + path + "' --steps 2 --progress json");
  EXPECT_EQ(train.status, 0) << train.err;
  expect_user_error("export --plan '" + path + "' --to fsdp", {"fine-tunes", "LoRA r=4"});
  std::remove(path.c_str());
}

TEST(CliFineTuning, FrozenPlanTrainsOnTheCpuEngine) {
  const std::string path = temp_path("freeze_plan.json");
  Result p = run("--model tiny-gpt --gpus 1 --gpu cpu --freeze 'wte,wpe,h.0.*' --out '" + path + "'");
  ASSERT_EQ(p.status, 0) << p.err;
  Result t = run("train --plan '" + path + "' --steps 2 --progress json");
  EXPECT_EQ(t.status, 0) << t.err;
  std::remove(path.c_str());
}

TEST(CliFineTuning, BadFlagsAreUsageErrors) {
  expect_usage_error("--model gpt2 --gpus 8 --freeze 'nope*'", {"--freeze", "'nope*' matches no node"});
  expect_usage_error("--model gpt2 --gpus 8 --freeze '*'", {"nothing would train"});
  expect_usage_error("--model resnet50 --gpus 8 --lora 4", {"--lora-targets", "no attention node"});
  expect_usage_error("--model gpt2 --gpus 8 --lora-alpha 16", {"need --lora R"});
  expect_usage_error("--model gpt2 --gpus 8 --lora 0", {"--lora"});
}

TEST(CliFineTuning, LoraStartsFromBaseWeightsAndResumesOnlyFromThem) {
  // --init with a base model's weights (no adapters in the file), a
  // checkpoint of the adapters, and a resume that needs the same base.
  const std::string base = temp_path("ft_base.json"), lora = temp_path("ft_lora.json");
  const std::string bck = temp_path("ft_bck"), lck = temp_path("ft_lck"), weights = temp_path("ft_base.safetensors");
  ASSERT_EQ(run("--model tiny-gpt --gpus 1 --gpu cpu --out '" + base + "'").status, 0);
  ASSERT_EQ(run("--model tiny-gpt --gpus 1 --gpu cpu --lora 4 --out '" + lora + "'").status, 0);
  ASSERT_EQ(run("train --plan '" + base + "' --steps 1 --checkpoint-dir '" + bck + "'").status, 0);
  ASSERT_EQ(run("export --checkpoint '" + bck + "' --to safetensors --out '" + weights + "'").status, 0);
  Result t = run("train --plan '" + lora + "' --steps 2 --checkpoint-dir '" + lck + "' --init '" + weights + "'");
  EXPECT_EQ(t.status, 0) << t.err;
  expect_user_error("train --plan '" + lora + "' --steps 2 --checkpoint-dir '" + lck + "' --resume",
                    {"frozen base", "--init"});
  std::filesystem::remove_all(bck);
  std::filesystem::remove_all(lck);
  for (const std::string& f : {base, lora, weights}) std::remove(f.c_str());
}
