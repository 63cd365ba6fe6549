// `dlplan train` end to end (DESIGN.md, "Plan and run report"): a plan made by
// `dlplan plan --gpu cpu` runs under mpiexec (or alone, for one rank), writes
// DESIGN.md's progress lines and run report, and every failure a user can
// cause (a plan for another number of ranks, one that does not fit, a bad plan
// file, a rank dying or failing mid-run) ends in a clear message and a
// non-zero exit, never a hang. Rank failures are injected with the test-only
// DLPLAN_FAULT="RANK:STEP:kill|error" (cli/train_command.cpp).
//
// Every child runs in its own process group under a deadline
// (child_process.hpp): past it the group is killed and the test fails.
#include "cli_job.hpp"
#include "dlplan/plan_io.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace {

using namespace dlplan::testing::cli_job;

// A failed set-up: a clean exit 1 and exactly one "dlplan: error: ..." line
// holding every part (mpiexec's own banners aside).
void expect_one_error_line(const Job& j, std::initializer_list<std::string> parts, bool under_mpiexec) {
  ASSERT_TRUE(j.finished) << "hung past the deadline:\n" << j.all();
  EXPECT_NE(j.exit_code, 0) << j.all();
  if (!under_mpiexec) {
    EXPECT_EQ(j.exit_code, 1) << j.all();
    EXPECT_EQ(lines(j.err).size(), 1u) << "stderr:\n" << j.err;
  }
  const auto l = dlplan_lines(j.err);
  ASSERT_EQ(l.size(), 1u) << "expected one dlplan line (rank 0 only); stderr:\n" << j.err;
  EXPECT_EQ(l[0].rfind("dlplan: error: ", 0), 0u) << l[0];
  for (const auto& p : parts) EXPECT_TRUE(contains(l[0], p)) << "missing '" << p << "' in: " << l[0];
  EXPECT_FALSE(contains(j.out, "step ")) << "training started:\n" << j.out;
}

// The report's keys, as DESIGN.md lists them.
// The report read back through the planner's document library (every field
// validated), agreeing with the raw JSON below.
void expect_typed_report(const std::string& path, int world, int steps, bool tokens) {
  dlplan::RunReport r;
  try {
    r = dlplan::read_report_file(path);
  } catch (const std::exception& e) {
    FAIL() << "the document library refuses the report: " << e.what();
  }
  EXPECT_EQ(r.world_size, world);
  EXPECT_EQ(static_cast<int>(r.loss.size()), steps);
  EXPECT_EQ(r.measured.tokens, tokens);
  EXPECT_GT(r.measured.memory.peak, 0);
  EXPECT_EQ(r.predicted.memory.peak, r.plan.predicted.memory.peak);
  EXPECT_FALSE(r.plan.edited);
}

void expect_report(const Json& r, const Json& plan, int world, int steps, bool tokens) {
  EXPECT_EQ(r.value("schema_version", 0), 1);
  EXPECT_EQ(r.value("kind", ""), "report");
  EXPECT_EQ(r["plan"], plan) << "the report's plan is not the plan file";
  EXPECT_EQ(r.value("world_size", 0), world);
  EXPECT_TRUE(r.contains("seed") && r["seed"].is_number_integer());
  EXPECT_EQ(r.value("steps", 0), steps);
  ASSERT_TRUE(r["loss"].is_array());
  ASSERT_EQ(r["loss"].size(), static_cast<size_t>(steps));
  for (const auto& l : r["loss"]) EXPECT_TRUE(l.is_number() && std::isfinite(l.get<double>()) && l.get<double>() > 0) << l;

  const Json& m = r["measured"];
  ASSERT_TRUE(m.is_object()) << r.dump(1);
  for (const char* c : {"params", "grads", "optimizer", "activations", "gathered", "comm", "workspace", "runtime", "peak"})
    EXPECT_TRUE(m["memory"].contains(c) && m["memory"][c].is_number()) << "measured.memory." << c << " missing";
  EXPECT_GT(m["memory"].value("peak", 0.0), 0.0);
  EXPECT_TRUE(m.contains("rank") && m["rank"].is_number_integer());
  EXPECT_GE(m.value("rank", -1), 0);
  EXPECT_LT(m.value("rank", world), world);
  for (const char* k : {"step_seconds", "compute_seconds", "mfu"})
    EXPECT_TRUE(m.contains(k) && m[k].is_number()) << "measured." << k << " missing";
  EXPECT_GT(m.value("step_seconds", 0.0), 0.0);
  EXPECT_GT(m.value("mfu", 0.0), 0.0);
  for (const char* k : {"bytes", "seconds", "exposed_seconds"})
    EXPECT_TRUE(m["comm"].contains(k) && m["comm"][k].is_number()) << "measured.comm." << k << " missing";
  const char* rate = tokens ? "tokens_per_second" : "samples_per_second";
  const char* other = tokens ? "samples_per_second" : "tokens_per_second";
  EXPECT_GT(m.value(rate, 0.0), 0.0) << "measured." << rate;
  EXPECT_FALSE(m.contains(other)) << "measured." << other << " for a " << (tokens ? "token" : "sample") << " model";
  EXPECT_GT(m.value("rss_bytes", 0.0), 0.0);
  EXPECT_EQ(r["predicted"], plan["predicted"]) << "predicted is not the plan's";

  // What the executor sent is what the planner's step program says it sends.
  const double sent = m["comm"].value("bytes", -1.0), planned = plan["predicted"]["comm"].value("bytes", -2.0);
  EXPECT_NEAR(sent, planned, 1e-9 * std::max(1.0, planned)) << "bytes sent per rank per step";
  if (world > 1) {
    EXPECT_GT(sent, 0.0);
  }

  // The executor allocates what the planner counted: peaks within 3%.
  const double meas = m["memory"].value("peak", 0.0), pred = plan["predicted"]["memory"].value("peak", 0.0);
  ASSERT_GT(pred, 0.0);
  EXPECT_NEAR(meas, pred, 0.03 * pred) << "measured peak " << meas << " vs predicted " << pred;
}

void expect_progress_json(const std::string& out, int steps, bool tokens) {
  const auto l = lines(out);
  ASSERT_EQ(l.size(), static_cast<size_t>(steps)) << "stdout must be exactly one JSON line per step:\n" << out;
  for (int i = 0; i < steps; ++i) {
    SCOPED_TRACE(l[static_cast<size_t>(i)]);
    Json j;
    ASSERT_NO_THROW(j = Json::parse(l[static_cast<size_t>(i)]));
    EXPECT_EQ(j.value("step", 0), i + 1);
    EXPECT_EQ(j.value("steps", 0), steps);
    EXPECT_TRUE(j.contains("loss") && j["loss"].is_number());
    EXPECT_GT(j.value("step_seconds", 0.0), 0.0);
    EXPECT_GT(j.value(tokens ? "tokens_per_second" : "samples_per_second", 0.0), 0.0);
    EXPECT_FALSE(j.contains(tokens ? "samples_per_second" : "tokens_per_second"));
    EXPECT_GT(j.value("peak_bytes", 0.0), 0.0);
    EXPECT_EQ(j.size(), 6u) << "DESIGN.md's six fields";
  }
}

class TrainCliTwoRanks : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainCliTwoRanks, JsonProgressAndReport) {
  SKIP_WITHOUT_MPIEXEC();
  const std::string model = GetParam();
  const bool tokens = model == "tiny-gpt";
  const std::string plan = make_plan(model, 2, 4, model + "_2.json"), report = temp_path(model + "_report.json");
  std::remove(report.c_str());
  const Job j = mpi_train(2, {"--plan", plan, "--steps", "3", "--report", report, "--progress", "json"});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  expect_progress_json(j.out, 3, tokens);
  expect_report(read_json(report), read_json(plan), 2, 3, tokens);
  expect_typed_report(report, 2, 3, tokens);
  std::remove(plan.c_str());
  std::remove(report.c_str());
}

INSTANTIATE_TEST_SUITE_P(TrainCli, TrainCliTwoRanks, ::testing::Values("tiny-mlp", "tiny-gpt"),
                         [](const auto& info) { return std::string(info.param) == "tiny-gpt" ? "TinyGpt" : "TinyMlp"; });

TEST(TrainCli, TextProgressPrintsEachStepAndTheTable) {
  SKIP_WITHOUT_MPIEXEC();
  const std::string plan = make_plan("tiny-mlp", 2, 4, "text_2.json");
  const Job j = mpi_train(2, {"--plan", plan, "--steps", "3"});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  int step_lines = 0;
  for (const auto& l : lines(j.out))
    if (l.rfind("step ", 0) == 0) {
      ++step_lines;
      EXPECT_TRUE(contains(l, "/3") && contains(l, "loss") && contains(l, "samples/s") && contains(l, "peak")) << l;
    }
  EXPECT_EQ(step_lines, 3) << j.out;  // rank 0 only: not 6
  EXPECT_TRUE(contains(j.out, "measured against predicted")) << j.out;
  for (const char* row : {"params", "grads", "optimizer", "activations", "comm", "workspace", "peak", "resident set"})
    EXPECT_TRUE(contains(j.out, std::string("  ") + row)) << "no '" << row << "' row:\n" << j.out;
  EXPECT_TRUE(dlplan_lines(j.err).empty()) << j.err;
  std::remove(plan.c_str());
}

TEST(TrainCli, OneRankWithoutMpiexecWritesTheReport) {  // also runs in builds without MPI
  const std::string plan = make_plan("tiny-mlp", 1, 4, "one.json"), report = temp_path("one_report.json");
  std::remove(report.c_str());
  const Job j = train({"--plan", plan, "--steps", "3", "--report", report, "--progress", "json"});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  expect_progress_json(j.out, 3, false);
  expect_report(read_json(report), read_json(plan), 1, 3, false);
  expect_typed_report(report, 1, 3, false);
  std::remove(plan.c_str());
  std::remove(report.c_str());
}

TEST(TrainCli, TextProgressLogsEveryNStepsWithAnEtaThenTimeAndMemoryTables) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "log_every.json");
  const Job j = train({"--plan", plan, "--steps", "7", "--log-every", "3"});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  // Step 1, every third step, and the last: 1, 3, 6, 7.
  std::vector<std::string> logged;
  std::istringstream in(j.out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) logged.push_back(line.substr(5, line.find('/') - 5));
  ASSERT_EQ(logged.size(), 4u) << j.out;
  EXPECT_EQ(std::stoi(logged[0]), 1);
  EXPECT_EQ(std::stoi(logged[1]), 3);
  EXPECT_EQ(std::stoi(logged[2]), 6);
  EXPECT_EQ(std::stoi(logged[3]), 7);
  // An ETA while steps remain (after the first), none on the last line.
  EXPECT_NE(j.out.find("  eta "), std::string::npos) << j.out;
  const size_t last = j.out.find("step    7/7");
  ASSERT_NE(last, std::string::npos) << j.out;
  const std::string last_line = j.out.substr(last, j.out.find('\n', last) - last);
  EXPECT_EQ(last_line.find("eta"), std::string::npos) << last_line;
  // Predicted beside measured: the step's times and rate, then memory.
  for (const char* want : {"Step (median", "step time", "communication (busy)", "samples/s", "MFU", "Memory at the peak"})
    EXPECT_NE(j.out.find(want), std::string::npos) << want << "\n" << j.out;
  // A bad value is a usage error.
  const Job bad = train({"--plan", plan, "--log-every", "0"});
  EXPECT_EQ(bad.exit_code, 2) << bad.all();
  std::remove(plan.c_str());
}

TEST(TrainCli, PlanForFourRanksLaunchedOnTwo) {
  SKIP_WITHOUT_MPIEXEC();
  const std::string plan = make_plan("tiny-mlp", 4, 4, "four_on_two.json");
  const Job j = mpi_train(2, {"--plan", plan, "--steps", "3"});
  expect_one_error_line(j, {plan, "4 ranks", "2 were launched"}, true);
  std::remove(plan.c_str());
}

TEST(TrainCli, PlanForFourRanksRunAlone) {
  const std::string plan = make_plan("tiny-mlp", 4, 4, "four_on_one.json");
  const Job j = train({"--plan", plan, "--steps", "3"});
  expect_one_error_line(j, {plan, "4 ranks", "1 was launched"}, false);
  std::remove(plan.c_str());
}

TEST(TrainCli, PlanThatDoesNotFitTheHost) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "too_big.json");
  Json doc = read_json(plan);
  ASSERT_TRUE(doc["predicted"]["memory"].contains("peak"));
  // Control: the unedited plan runs.
  const Job ok = train({"--plan", plan, "--steps", "1"});
  ASSERT_TRUE(ok.finished);
  EXPECT_EQ(ok.exit_code, 0) << ok.all();
  doc["predicted"]["memory"]["peak"] = int64_t{1} << 50;  // a pebibyte: an edited plan, run as it is
  spit(plan, doc.dump(1));
  const Job j = train({"--plan", plan, "--steps", "1", "--allow-edited-plan"});
  ASSERT_TRUE(j.finished) << j.all();
  EXPECT_EQ(j.exit_code, 1) << j.all();
  const auto l = dlplan_lines(j.err);
  ASSERT_EQ(l.size(), 2u) << j.err;  // the warning, then the error
  EXPECT_TRUE(contains(l[0], "dlplan: warning: " + plan + ": edited after planning")) << l[0];
  EXPECT_TRUE(contains(l[1], "dlplan: error: " + plan) && contains(l[1], "GiB") && contains(l[1], "host")) << l[1];
  std::remove(plan.c_str());
}

TEST(TrainCli, MalformedPlanFile) {
  const std::string plan = temp_path("malformed.json");
  spit(plan, "{\"kind\": \"plan\", \"schema_version\": 1,");
  expect_one_error_line(train({"--plan", plan}), {plan, "malformed JSON"}, false);
  std::remove(plan.c_str());
}

TEST(TrainCli, JsonThatIsNotAPlan) {
  const std::string plan = temp_path("not_a_plan.json");
  spit(plan, "{\"schema_version\": 1, \"kind\": \"report\", \"loss\": [1, 2]}");
  expect_one_error_line(train({"--plan", plan}), {plan, "not a plan"}, false);
  std::remove(plan.c_str());
}

TEST(TrainCli, MissingPlanFile) {
  const std::string plan = temp_path("no_such_plan.json");
  std::remove(plan.c_str());
  expect_one_error_line(train({"--plan", plan}), {plan}, false);
}

TEST(TrainCli, InvalidFaultVariableIsAnError) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "bad_fault.json");
  for (const char* v : {"1:2", "x:2:kill", "1:0:kill", "1:2:explode", "1:2:kill:extra", "-1:2:error"}) {
    SCOPED_TRACE(v);
    expect_one_error_line(train({"--plan", plan, "--steps", "2"}, {std::string("DLPLAN_FAULT=") + v}), {"DLPLAN_FAULT", v},
                          false);
  }
  std::remove(plan.c_str());
}

TEST(TrainCli, InjectedErrorOnOneRankNamesItAndKeepsTheOldReport) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "fault_one.json"), report = temp_path("fault_one_report.json");
  spit(report, "the previous report\n");
  const Job j = train({"--plan", plan, "--steps", "3", "--report", report}, {"DLPLAN_FAULT=0:2:error"});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  EXPECT_NE(j.exit_code, 0) << j.all();
  EXPECT_TRUE(contains(j.err, "dlplan: rank 0: error: injected failure at step 2")) << j.all();
  EXPECT_TRUE(contains(j.out, "step    1/3")) << "step 1 should have run:\n" << j.out;
  EXPECT_FALSE(contains(j.out, "step    2/3")) << j.out;
  EXPECT_EQ(slurp(report), "the previous report\n") << "a failed run touched the existing report";
  std::remove(plan.c_str());
  std::remove(report.c_str());
}

// ---- a rank dying or failing mid-run ------------------------------------------

class TrainCliRankFailure : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(DLPLAN_MPIEXEC)
    if (access(DLPLAN_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no mpiexec at " DLPLAN_MPIEXEC;
    plan_ = make_plan("tiny-mlp", 2, 4, "failure_2.json");
    report_ = temp_path("failure_report.json");
    spit(report_, "the previous report\n");
#else
    GTEST_SKIP() << "built without MPI (no mpiexec): multi-rank runs are not tested";
#endif
  }
  void TearDown() override {
    if (!plan_.empty()) std::remove(plan_.c_str());
    if (!report_.empty()) std::remove(report_.c_str());
  }
  Job run(const std::vector<std::string>& env) {
    return mpi_train(2, {"--plan", plan_, "--steps", "3", "--report", report_}, env);
  }
  std::string plan_, report_;
};

TEST_F(TrainCliRankFailure, ControlJobSucceeds) {
  const Job j = run({});
  ASSERT_TRUE(j.finished) << "the job hung past " << kDeadline.count() << " s:\n" << j.all();
  EXPECT_EQ(j.exit_code, 0) << j.all();
  EXPECT_TRUE(dlplan_lines(j.err).empty()) << j.all();
  EXPECT_TRUE(contains(j.out, "step    3/3")) << j.out;
  EXPECT_NE(slurp(report_), "the previous report\n") << "the control should replace the report";
  EXPECT_EQ(read_json(report_).value("kind", ""), "report");
}

TEST_F(TrainCliRankFailure, KilledRankEndsTheJobNamingIt) {
  const Job j = run({"DLPLAN_FAULT=1:2:kill"});
  ASSERT_TRUE(j.finished) << "the job hung past " << kDeadline.count() << " s:\n" << j.all();
  EXPECT_NE(j.exit_code, 0) << j.all();
  EXPECT_TRUE(contains(j.all(), "rank 1")) << j.all();
  EXPECT_FALSE(contains(j.out, "step    3/3")) << "rank 0 went past the dead peer:\n" << j.out;
  EXPECT_EQ(slurp(report_), "the previous report\n") << "a failed run touched the existing report";
  std::printf("[ info ] killed-rank train job ended in %.1f s, exit %d\n", j.seconds, j.exit_code);
}

TEST_F(TrainCliRankFailure, FailingRankEndsTheJobNamingIt) {
  const Job j = run({"DLPLAN_FAULT=1:2:error"});
  ASSERT_TRUE(j.finished) << "the job hung past " << kDeadline.count() << " s:\n" << j.all();
  EXPECT_NE(j.exit_code, 0) << j.all();
  EXPECT_TRUE(contains(j.all(), "rank 1")) << j.all();
  EXPECT_TRUE(contains(j.all(), "injected failure")) << j.all();
  EXPECT_TRUE(contains(j.err, "dlplan: rank 1: error: injected failure at step 2")) << j.all();
  EXPECT_FALSE(contains(j.out, "step    3/3")) << j.out;
  EXPECT_EQ(slurp(report_), "the previous report\n") << "a failed run touched the existing report";
  std::printf("[ info ] failing-rank train job ended in %.1f s, exit %d\n", j.seconds, j.exit_code);
}

// ---- issue 16: plans that were trusted, outputs that were replaced -------------

// An edited plan (here its micro-batch) trained and compared against its
// stale prediction with no warning; now it is refused, naming the flag.
TEST(TrainCli, EditedPlanIsRefused) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "edited.json");
  Json doc = read_json(plan);
  doc["micro_batch"] = 8;
  spit(plan, doc.dump(1));
  expect_one_error_line(train({"--plan", plan, "--steps", "1"}),
                        {plan, "the plan was edited after dlplan planned it", "--allow-edited-plan"}, false);
  std::remove(plan.c_str());
}

TEST(TrainCli, EditedPlanRunsWithTheFlagAndTheReportSaysSo) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "edited_ok.json"), report = temp_path("edited_report.json");
  Json doc = read_json(plan);
  doc["optimizer"]["lr"] = 0.002;
  spit(plan, doc.dump(1));
  const Job j = train({"--plan", plan, "--steps", "2", "--report", report, "--progress", "json", "--allow-edited-plan"});
  ASSERT_TRUE(j.finished) << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  EXPECT_TRUE(contains(j.err, "dlplan: warning: " + plan + ": edited after planning")) << j.err;
  EXPECT_EQ(read_json(report).value("plan_edited", false), true);
  EXPECT_TRUE(dlplan::read_report_file(report).plan.edited);
  std::remove(plan.c_str());
  std::remove(report.c_str());
}

// Each was "internal error" (exit 3) or ran on; now exit 1 and a message
// naming the file and the field. The plans are edited, so --allow-edited-plan
// lets the reader reach the field.
TEST(TrainCli, BadPlanFieldsAreMessages) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "fields.json");
  const Json good = read_json(plan);
  struct Case {
    std::function<void(Json&)> edit;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {[](Json& d) { d["kind"] = nullptr; }, "not a plan (\"kind\" is null"},
           {[](Json& d) { d.erase("predicted"); }, "missing field 'predicted'"},
           {[](Json& d) { d["optimizer"]["betas"] = {2, -1}; }, "optimizer.betas[0] = 2 is outside [0, 1)"},
           {[](Json& d) { d["bucket_mb"] = -1; }, "bucket_mb = -1 is outside (0, 1048576]"},
           {[](Json& d) { d["optimizer"]["lr"] = -1; }, "optimizer.lr = -1 must be >= 0"},
           {[](Json& d) { d["grad_accum"] = 1e10; }, "grad_accum = 10000000000.0 must be an integer in [1, 65536]"},
           {[](Json& d) { d["predicted"]["step_seconds"] = -1; }, "predicted.step_seconds = -1 must be >= 0"}}) {
    Json doc = good;
    c.edit(doc);
    spit(plan, doc.dump(1));
    SCOPED_TRACE(c.message);
    expect_one_error_line(train({"--plan", plan, "--allow-edited-plan"}), {plan + ": " + c.message}, false);
  }
  spit(plan, "{\"kind\": \"plan\", \"schema_version\": 1, \"micro_batch\": 1e400}");
  expect_one_error_line(train({"--plan", plan}), {plan, "malformed JSON"}, false);
  spit(plan, std::string(100000, '[') + std::string(100000, ']'));  // exit 139 before
  expect_one_error_line(train({"--plan", plan}), {plan, "JSON nested deeper than 64 levels"}, false);
  std::remove(plan.c_str());
}

// --steps x the global batch past 2^62 sample indices (data and dropout are
// keyed by them) is refused before training.
TEST(TrainCli, StepsPastTheSampleIndexLimit) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "far.json");
  Json doc = read_json(plan);
  doc["micro_batch"] = 1 << 20;
  doc["grad_accum"] = 1 << 16;
  spit(plan, doc.dump(1));
  expect_one_error_line(train({"--plan", plan, "--steps", "2147483647", "--allow-edited-plan"}),
                        {"--steps 2147483647 x a global batch of 68719476736 samples would index past 2^62 samples"}, false);
  std::remove(plan.c_str());
}

// As root, --report /dev/null replaced the device node with a regular file.
TEST(TrainCli, ReportToDevNullWritesThrough) {
  const std::string plan = make_plan("tiny-mlp", 1, 4, "devnull.json");
  const Job j = train({"--plan", plan, "--steps", "1", "--report", "/dev/null", "--progress", "json"});
  ASSERT_TRUE(j.finished) << j.all();
  EXPECT_EQ(j.exit_code, 0) << j.all();
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null is no longer a character device";
  std::remove(plan.c_str());
}

TEST(SimCli, EditedPlanIsRefusedUnlessAllowed) {
  const std::string plan = make_plan("tiny-mlp", 2, 4, "sim_edited.json");
  Json doc = read_json(plan);
  doc["strategy"] = doc["strategy"] == "ddp" ? "zero3" : "ddp";
  spit(plan, doc.dump(1));
  const Job refused = spawn(dlplan_args({"sim", "--plan", plan}));
  ASSERT_TRUE(refused.finished) << refused.all();
  EXPECT_EQ(refused.exit_code, 1) << refused.all();
  EXPECT_TRUE(contains(refused.err, "the plan was edited after dlplan planned it")) << refused.err;
  const Job allowed = spawn(dlplan_args({"sim", "--plan", plan, "--allow-edited-plan", "--timeline", "/dev/null"}));
  ASSERT_TRUE(allowed.finished) << allowed.all();
  EXPECT_EQ(allowed.exit_code, 0) << allowed.all();
  EXPECT_TRUE(contains(allowed.err, "dlplan: warning: " + plan + ": edited after planning")) << allowed.err;
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  std::remove(plan.c_str());
}

}  // namespace

// CPU offload end to end: the plan's host states, the run's host pool
// measured apart, and the same bytes in the report (and the table).
TEST(TrainCli, OffloadReportsHostMemoryMeasuredAndPredicted) {
  SKIP_WITHOUT_MPIEXEC();
  const std::string plan = make_plan("tiny-gpt", 2, 2, "offload_2.json", {"--strategy", "zero3", "--offload", "params"});
  const std::string report = temp_path("offload_report.json");
  std::remove(report.c_str());
  const Job j = mpi_train(2, {"--plan", plan, "--steps", "3", "--report", report});
  ASSERT_TRUE(j.finished) << "hung:\n" << j.all();
  ASSERT_EQ(j.exit_code, 0) << j.all();
  EXPECT_TRUE(contains(j.out, "Host memory (CPU offload), measured against predicted")) << j.out;
  const Json r = read_json(report), p = read_json(plan);
  ASSERT_TRUE(p["predicted"].contains("host")) << p.dump(1);
  ASSERT_TRUE(r["measured"].contains("host")) << r.dump(1);
  for (const char* c : {"params", "grads", "optimizer"}) {
    EXPECT_GT(p["predicted"]["host"].value(c, 0), 0) << c;
    EXPECT_EQ(r["measured"]["host"].value(c, -1), p["predicted"]["host"].value(c, -2)) << c;
    EXPECT_EQ(r["measured"]["memory"].value(c, -1), 0) << "the device keeps no " << c << " (tiny-gpt has no buffers)";
  }
  // --checkpoint-dir does not save offloaded state: refused, naming the plan.
  const Job k = mpi_train(2, {"--plan", plan, "--steps", "1", "--checkpoint-dir", temp_path("offload_ckpt")});
  ASSERT_TRUE(k.finished) << k.all();
  EXPECT_EQ(k.exit_code, 1) << k.all();
  EXPECT_TRUE(contains(k.err, "--checkpoint-dir does not save CPU-offloaded state")) << k.err;
  std::remove(plan.c_str());
  std::remove(report.c_str());
}
