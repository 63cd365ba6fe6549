// `dlplan train` end to end (DESIGN.md, "Plan and run report"): a plan made by
// `dlplan plan --gpu cpu` runs under mpiexec (or alone, for one rank), writes
// DESIGN.md's progress lines and run report, and every failure a user can
// cause (a plan for another number of ranks, one that does not fit, a bad plan
// file, a rank dying or failing mid-run) ends in a clear message and a
// non-zero exit, never a hang. Rank failures are injected with the test-only
// DLPLAN_FAULT="RANK:STEP:kill|error" (cli/train_command.cpp).
//
// Every child runs in its own process group under a deadline (as in
// comm_failure_test.cpp): past it the group is killed and the test fails.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Json = nlohmann::json;

constexpr auto kDeadline = std::chrono::seconds(30);

struct Job {
  bool finished = false;  // false: killed at the deadline
  int exit_code = -1;     // exit status, or 128 + signal
  std::string out, err;
  double seconds = 0;
  std::string all() const { return out + err; }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream s(text);
  for (std::string l; std::getline(s, l);) v.push_back(l);
  return v;
}

// The program's own stderr lines ("dlplan: ..."), without mpiexec's banners.
std::vector<std::string> dlplan_lines(const std::string& text) {
  std::vector<std::string> v;
  for (auto& l : lines(text))
    if (l.rfind("dlplan:", 0) == 0) v.push_back(l);
  return v;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dlplan_train_cli_" + std::to_string(::getpid()) + "_" + name;
}

// Our environment without an enclosing MPI job's variables (so a plain child
// is a single process) or a stray DLPLAN_FAULT, plus what OpenMPI needs to run
// as root in a container, one BLAS thread per rank, and `extra`.
std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    const bool enclosing_job = (v.rfind("OMPI_", 0) == 0 && v.rfind("OMPI_MCA_", 0) != 0) || v.rfind("PMIX_", 0) == 0 ||
                               v.rfind("PMI_", 0) == 0 || v.rfind("SLURM_PROCID=", 0) == 0;
    const bool ours = v.rfind("DLPLAN_FAULT=", 0) == 0 || v.rfind("OPENBLAS_NUM_THREADS=", 0) == 0;
    if (!enclosing_job && !ours) env.push_back(v);
  }
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  env.push_back("OPENBLAS_NUM_THREADS=1");
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Runs args[0] (an absolute path) with args, stdout and stderr to files, in a
// process group of its own; past `deadline` it is killed (SIGTERM to mpiexec,
// then SIGKILL to the group) and `finished` stays false.
Job spawn(std::vector<std::string> args, const std::vector<std::string>& extra_env = {},
          std::chrono::seconds deadline = kDeadline) {
  Job res;
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  const std::string out_path = temp_path("stdout_" + tag), err_path = temp_path("stderr_" + tag);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env_strings = child_environment(extra_env);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);

  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  EXPECT_EQ(rc, 0) << "posix_spawn " << args[0] << ": " << std::strerror(rc);
  if (rc == 0) {
    int status = 0;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        res.finished = true;
        break;
      }
      if (std::chrono::steady_clock::now() - t0 > deadline) {
        kill(pid, SIGTERM);
        const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while (waitpid(pid, &status, WNOHANG) != pid) {
          if (std::chrono::steady_clock::now() > grace) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        kill(-pid, SIGKILL);  // ranks left behind in the group
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.out = slurp(out_path);
  res.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return res;
}

std::vector<std::string> dlplan_args(std::initializer_list<std::string> a) {
  std::vector<std::string> v{DLPLAN_EXE};
  v.insert(v.end(), a);
  return v;
}

// `dlplan plan --gpu cpu` for `model` on `ranks`; returns the plan's path.
std::string make_plan(const std::string& model, int ranks, int micro_batch, const std::string& name) {
  const std::string path = temp_path(name);
  const Job j = spawn(dlplan_args({"plan", "--model", model, "--gpu", "cpu", "--gpus", std::to_string(ranks),
                                   "--micro-batch", std::to_string(micro_batch), "--out", path}));
  EXPECT_TRUE(j.finished && j.exit_code == 0) << "dlplan plan failed:\n" << j.all();
  return path;
}

Json read_json(const std::string& path) {
  try {
    return Json::parse(slurp(path));
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << " is not JSON: " << e.what();
    return Json::object();
  }
}

#if defined(DLPLAN_MPIEXEC)
#define SKIP_WITHOUT_MPIEXEC()                                                                \
  do {                                                                                        \
    if (access(DLPLAN_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no mpiexec at " DLPLAN_MPIEXEC; \
  } while (0)
// `mpiexec -n ranks --oversubscribe dlplan train args...`
Job mpi_train(int ranks, std::initializer_list<std::string> args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> v{DLPLAN_MPIEXEC, "-n", std::to_string(ranks), "--oversubscribe", DLPLAN_EXE, "train"};
  v.insert(v.end(), args);
  return spawn(v, env);
}
#else
#define SKIP_WITHOUT_MPIEXEC() GTEST_SKIP() << "built without MPI (no mpiexec): multi-rank runs are not tested"
Job mpi_train(int, std::initializer_list<std::string>, const std::vector<std::string>& = {}) { return {}; }
#endif

Job train(std::initializer_list<std::string> args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> v{DLPLAN_EXE, "train"};
  v.insert(v.end(), args);
  return spawn(v, env);
}

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
  std::remove(plan.c_str());
  std::remove(report.c_str());
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
  doc["predicted"]["memory"]["peak"] = 1e15;
  spit(plan, doc.dump(1));
  const Job j = train({"--plan", plan, "--steps", "1"});
  expect_one_error_line(j, {plan, "GiB", "host"}, false);
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

}  // namespace
