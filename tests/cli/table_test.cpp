// The table a person reads: the memory unit chosen per table (a tiny model
// does not read 0.00), columns with distinct names, SyncBN's cost only when
// it is on, the changes ranked by cost with the cost shown, and
// --micro-batch max per strategy.
#include "cli_helpers.hpp"

#include <algorithm>
#include <cstdlib>

namespace {

using namespace cli_test;

// The data rows of the table: strategy name first.
std::vector<std::string> rows(const std::string& out) {
  std::vector<std::string> r;
  for (const auto& l : lines(out))
    for (const char* s : {"ddp ", "zero1 ", "zero2 ", "zero3 "})
      if (l.rfind(s, 0) == 0) r.push_back(l);
  return r;
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> w;
  std::istringstream s(line);
  for (std::string x; s >> x;) w.push_back(x);
  return w;
}

TEST(CliTable, TinyModelsReadInAUnitThatShowsThem) {
  Result r = run("--model tiny-gpt --gpu cpu --gpus 2 --micro-batch 8");
  ASSERT_EQ(r.status, 0) << r.err;
  std::string units;  // the table's second header line: "strategy  MiB  MiB ..."
  for (const auto& l : lines(r.out))
    if (l.rfind("strategy", 0) == 0) units = l;
  EXPECT_FALSE(contains(units, "GiB")) << r.out;  // the peak is far below 1 GiB
  EXPECT_TRUE(contains(units, "MiB") || contains(units, "KiB")) << r.out;
  auto data = rows(r.out);
  ASSERT_EQ(data.size(), 4u) << r.out;
  for (const auto& row : data) {
    const auto w = words(row);
    const double peak = std::atof(w[8].c_str());  // params grads optim activ gathered comm-buf wkspace peak
    EXPECT_GE(peak, 1.0) << row;                  // in a unit where it reads at least 1
  }
  // A large model keeps GiB.
  EXPECT_TRUE(contains(run("--model llama2-7b --gpus 8").out, "GiB"));
}

TEST(CliTable, ColumnsHaveDistinctNames) {
  Result r = run("--model gpt2 --gpus 8");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto l = lines(r.out);
  std::string header;
  for (size_t i = 0; i + 1 < l.size(); ++i)
    if (l[i + 1].rfind("strategy", 0) == 0) header = l[i];
  ASSERT_FALSE(header.empty()) << r.out;
  auto names = words(header);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << header;
  EXPECT_TRUE(contains(header, "comm-buf") && contains(header, "traffic")) << header;
}

TEST(CliSyncBn, NoCostLineWhenItIsNotUsed) {
  Result r = run("--model resnet50 --gpus 8 --micro-batch 32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "SyncBatchNorm: Not needed")) << r.out;
  EXPECT_FALSE(contains(r.out, "over 1 GPU")) << r.out;
  EXPECT_FALSE(contains(r.out, "Cost: 53 BN layers")) << r.out;
  // Control: below the threshold it is on, and its cost is shown.
  Result on = run("--model resnet50 --gpus 8 --micro-batch 4");
  EXPECT_TRUE(contains(on.out, "Cost: 53 BN layers")) << on.out;
  EXPECT_TRUE(contains(on.out, "over groups of 4 GPUs")) << on.out;
}

TEST(CliSyncBn, AcrossNodesOnlyWhenNoNodeSufficesAndSaysWhy) {
  auto two = planning("--model resnet50 --gpus 16 --nodes 2 --micro-batch 2");
  EXPECT_EQ(two["syncbn"]["group_size"], 8);  // 16 samples inside a node
  EXPECT_FALSE(two["syncbn"]["crosses_nodes"].get<bool>());
  auto one = planning("--model resnet50 --gpus 16 --nodes 2 --micro-batch 1");
  EXPECT_EQ(one["syncbn"]["group_size"], 16);
  EXPECT_TRUE(one["syncbn"]["crosses_nodes"].get<bool>());
  const std::string why = one["syncbn"]["reason"];
  EXPECT_TRUE(contains(why, "no group inside a node reaches it")) << why;
  EXPECT_TRUE(contains(why, "--syncbn-group 8")) << why;
}

TEST(CliAdvice, ChangesAreRankedByCostAndShowIt) {
  // GPT-2 at micro-batch 64 x 1024 tokens on 8 x H100: nothing fits.
  auto j = planning("--model gpt2 --gpus 8 --micro-batch 64");
  EXPECT_TRUE(j["recommendation"]["strategy"].is_null());
  const auto& changes = j["recommendation"]["changes"];
  ASSERT_GE(changes.size(), 2u) << j["recommendation"].dump(1);
  double last = -1e9;
  for (const auto& c : changes) {
    if (c["gpus"].get<int>() > 8) break;  // more GPUs come last
    EXPECT_GE(c["cost"].get<double>(), last) << c.dump();
    last = c["cost"].get<double>();
  }
  Result r = run("--model gpt2 --gpus 8 --micro-batch 64");
  EXPECT_TRUE(contains(r.out, "Cheapest change that fits")) << r.out;
  EXPECT_TRUE(contains(r.out, "GPU time per sample")) << r.out;
}

TEST(CliMicroBatchMax, PerStrategyInTheTableAndTheJson) {
  auto j = planning("--model gpt2 --gpus 8 --micro-batch max");
  EXPECT_TRUE(j["training"]["micro_batch_max"].get<bool>());
  int64_t ddp = 0, zero3 = 0;
  for (const auto& s : j["strategies"]) {
    EXPECT_TRUE(s["fits"].get<bool>()) << s.dump();
    if (s["strategy"] == "ddp") ddp = s["micro_batch"];
    if (s["strategy"] == "zero3") zero3 = s["micro_batch"];
  }
  EXPECT_GT(ddp, 1);
  EXPECT_GE(zero3, ddp);  // less model state leaves more room for activations
  // With a global batch: micro-batch x accumulation x GPUs = it.
  auto g = planning("--model gpt2 --gpus 8 --micro-batch max --global-batch 512");
  for (const auto& s : g["strategies"])
    EXPECT_EQ(s["micro_batch"].get<int64_t>() * s["grad_accum"].get<int64_t>() * 8, 512) << s.dump();
  Result r = run("--model gpt2 --gpus 8 --micro-batch max");
  EXPECT_TRUE(contains(r.out, "micro-batch max")) << r.out;
  EXPECT_TRUE(contains(r.out, "micro")) << r.out;
  expect_usage_error("--model gpt2 --gpus 8 --micro-batch max --global-batch 100", {"--global-batch 100"});
}

TEST(CliExplain, ComparesWithDeepSpeedsEstimator) {
  Result r = run("--model llama2-7b --gpus 8 --strategy zero2 --explain");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "estimate_zero2_model_states_mem_needs")) << r.out;
  EXPECT_TRUE(contains(r.out, "4Ψ + 16Ψ/N")) << r.out;
  EXPECT_TRUE(contains(r.out, "docs/deepspeed.md")) << r.out;
}

}  // namespace

TEST(CliTable, OffloadShowsHostMemoryPerNodeAndOnlyTheStrategiesItGoesWith) {
  Result r = run("--model gpt2 --gpus 8 --offload optimizer");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Host memory per node under --offload optimizer")) << r.out;
  const auto data = rows(r.out);
  for (const auto& row : data) EXPECT_NE(row.rfind("ddp ", 0), 0u) << "ddp cannot offload its optimizer:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "CPU offload of the gradients and optimizer")) << r.out;
  // Usage errors name the flag and what it needs.
  Result bad = run("--model tiny-gpt --gpus 4 --strategy zero2 --offload params");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, "--offload params needs a strategy that shards parameters")) << bad.err;
  // JSON: each strategy's host memory per node.
  Result j = run("--model gpt2 --gpus 8 --offload params --format json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  ASSERT_GE(doc.at("strategies").size(), 1u);
  for (const auto& s : doc.at("strategies")) EXPECT_GT(s.at("host").at("per_node").get<double>(), 0) << s.dump();
}
