// DESIGN.md's conventions, end to end: help and usage name the program, a
// bare `dlplan` and `dlplan help` print help (exit 0), usage errors exit 2
// with the "dlplan:" prefix, stdout holds only the requested format (JSON
// and CSV stay machine-readable with --explain), and the lists have JSON.
#include "cli_helpers.hpp"

namespace {

using namespace cli_test;

TEST(CliHelp, BareDlplanPrintsHelpAndSucceeds) {
  Result r = run("");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Usage: dlplan")) << r.out;
  for (const char* c : {"plan", "train", "models", "gpus", "help", "completion"})
    EXPECT_TRUE(contains(r.out, c)) << c << " missing from:\n" << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(CliHelp, HelpCommand) {
  Result all = run("help");
  EXPECT_EQ(all.status, 0) << all.err;
  EXPECT_TRUE(contains(all.out, "Usage: dlplan")) << all.out;
  Result plan = run("help plan");
  EXPECT_EQ(plan.status, 0) << plan.err;
  EXPECT_TRUE(contains(plan.out, "--micro-batch")) << plan.out;
  // The same text as `dlplan plan --help`.
  EXPECT_EQ(plan.out, run("plan --help").out);
  expect_usage_error("help nosuchcommand", {"nosuchcommand"});
}

TEST(CliHelp, UsageLinesNameTheProgram) {
  for (const char* cmd : {"plan", "train", "sim", "models", "gpus", "model", "calibrate"}) {
    Result r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_TRUE(contains(r.out, std::string("Usage: dlplan ") + cmd)) << r.out;
  }
  EXPECT_TRUE(contains(run("--version").out, "dlplan 0.1.0"));
}

TEST(CliUsage, ParseErrorsExitTwoWithThePrefix) {
  expect_usage_error("--model gpt2 --no-such-flag", {"--no-such-flag", "dlplan plan --help"});
  expect_usage_error("plan --gpus 8", {"--model", "required"});
  expect_usage_error("--model gpt2 --gpus many", {"--gpus", "many"});
  expect_usage_error("--model gpt2 --format yaml", {"--format", "yaml"});
  expect_usage_error("nosuchcommand", {"nosuchcommand"});
  expect_usage_error("train", {"--plan"});
  // Control: a user's error (a missing file) stays 1.
  expect_user_error("--model models/missing.json", {"models/missing.json"});
}

TEST(CliOutput, JsonWithExplainIsOneDocument) {
  Result r = run("--model gpt2 --gpus 8 --micro-batch 8 --format json --explain");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = parse_json(r.out);  // the whole of stdout
  ASSERT_TRUE(j.contains("explain")) << r.out.substr(0, 400);
  const auto& e = j["explain"];
  EXPECT_EQ(e["strategy"], j["recommendation"]["strategy"]);
  ASSERT_FALSE(e["tensors"].empty());
  int64_t sum = 0;  // the tensors alive at the peak make up the peak
  for (const auto& t : e["tensors"]) sum += t["bytes"].get<int64_t>();
  EXPECT_EQ(sum, e["peak_bytes"].get<int64_t>());
  EXPECT_TRUE(e["model_states"]["estimates"].is_array());
  // Control: without --explain there is no "explain".
  EXPECT_FALSE(planning("--model gpt2 --gpus 8 --micro-batch 8").contains("explain"));
}

TEST(CliOutput, CsvWithExplainKeepsStdoutCsv) {
  Result r = run("--model gpt2 --gpus 8 --micro-batch 8 --format csv --explain");
  ASSERT_EQ(r.status, 0) << r.err;
  auto l = lines(r.out);
  ASSERT_EQ(l.size(), 5u) << r.out;
  for (const auto& line : l) EXPECT_NE(line.find(','), std::string::npos) << line;
  EXPECT_TRUE(contains(r.err, "Peak of")) << r.err;  // the explanation, on stderr
}

TEST(CliOutput, OutAndTimelineReportOnStderr) {
  const std::string plan = temp_path("conv-plan.json"), trace = temp_path("conv-trace.json");
  Result r = run("--model tiny-gpt --gpus 2 --format json --out '" + plan + "' --timeline '" + trace + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  parse_json(r.out);  // stdout is the planning only
  EXPECT_TRUE(contains(r.err, "wrote " + plan)) << r.err;
  EXPECT_TRUE(contains(r.err, "wrote " + trace)) << r.err;
  std::remove(plan.c_str());
  std::remove(trace.c_str());
}

TEST(CliLists, GpusAsJson) {
  Result r = run("gpus --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = parse_json(r.out);
  ASSERT_TRUE(j.is_array());
  bool h100 = false;
  for (const auto& d : j)
    if (d["kind"] == "h100-80g") {
      h100 = true;
      EXPECT_EQ(d["memory_bytes"].get<int64_t>(), int64_t{81559} << 20);  // nvidia-smi's 81,559 MiB
      EXPECT_TRUE(d["source"].is_string());
    }
  EXPECT_TRUE(h100) << r.out;
}

TEST(CliLists, ModelsAsJson) {
  Result r = run("models --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = parse_json(r.out);
  ASSERT_TRUE(j.is_array());
  bool gpt2 = false;
  for (const auto& m : j)
    if (m["name"] == "gpt2") {
      gpt2 = true;
      EXPECT_EQ(m["params"].get<int64_t>(), 124439808);
      EXPECT_EQ(m["seq_len"].get<int64_t>(), 1024);
    }
  EXPECT_TRUE(gpt2);
  // Control: the table lists as many models.
  EXPECT_EQ(lines(run("models").out).size(), j.size() + 1);
}

TEST(CliCompletion, ScriptsComeFromTheCli) {
  Result bash = run("completion bash");
  ASSERT_EQ(bash.status, 0) << bash.err;
  EXPECT_TRUE(contains(bash.out, "complete -F _dlplan dlplan"));
  EXPECT_TRUE(contains(bash.out, "--warmup-steps"));
  Result zsh = run("completion zsh");
  ASSERT_EQ(zsh.status, 0) << zsh.err;
  EXPECT_EQ(zsh.out.rfind("#compdef dlplan", 0), 0u);
  Result man = run("man");
  ASSERT_EQ(man.status, 0) << man.err;
  EXPECT_TRUE(contains(man.out, ".TH DLPLAN 1"));
  EXPECT_TRUE(contains(man.out, "\\-\\-global\\-batch"));
  expect_usage_error("completion fish", {"fish"});
}

}  // namespace
