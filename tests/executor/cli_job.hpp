// Running `dlplan` from the executor's tests: plans made by `dlplan plan --gpu
// cpu`, training jobs alone or under mpiexec (child_process.hpp: own process
// group, a deadline), and what their output says. Shared by train_cli_test.cpp
// and checkpoint_cli_test.cpp.
#pragma once

#include "child_process.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace dlplan::testing::cli_job {

using Json = nlohmann::json;

constexpr auto kDeadline = std::chrono::seconds(30);

using Job = dlplan::testing::ChildResult;
using dlplan::testing::slurp;

inline void spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream s(text);
  for (std::string l; std::getline(s, l);) v.push_back(l);
  return v;
}

// The program's own stderr lines ("dlplan: ..."), without mpiexec's banners.
inline std::vector<std::string> dlplan_lines(const std::string& text) {
  std::vector<std::string> v;
  for (auto& l : lines(text))
    if (l.rfind("dlplan:", 0) == 0) v.push_back(l);
  return v;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dlplan_train_cli_" + std::to_string(::getpid()) + "_" + name;
}

inline Job spawn(std::vector<std::string> args, const std::vector<std::string>& extra_env = {},
          std::chrono::seconds deadline = kDeadline, const dlplan::testing::SignalWhen& send = {}) {
  return dlplan::testing::run_child(std::move(args), extra_env, deadline, send);
}

inline std::vector<std::string> dlplan_args(std::initializer_list<std::string> a) {
  std::vector<std::string> v{DLPLAN_EXE};
  v.insert(v.end(), a);
  return v;
}

// `dlplan plan --gpu cpu` for `model` on `ranks`; returns the plan's path.
inline std::string make_plan(const std::string& model, int ranks, int micro_batch, const std::string& name,
                             const std::vector<std::string>& more = {}, const std::vector<std::string>& env = {}) {
  const std::string path = temp_path(name);
  std::vector<std::string> args = dlplan_args({"plan", "--model", model, "--gpu", "cpu", "--gpus", std::to_string(ranks),
                                               "--micro-batch", std::to_string(micro_batch), "--out", path});
  args.insert(args.end(), more.begin(), more.end());
  const Job j = spawn(args, env);
  EXPECT_TRUE(j.finished && j.exit_code == 0) << "dlplan plan failed:\n" << j.all();
  return path;
}

inline Json read_json(const std::string& path) {
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
inline Job mpi_train(int ranks, const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                     std::chrono::seconds deadline = kDeadline, const SignalWhen& send = {}) {
  std::vector<std::string> v{DLPLAN_MPIEXEC, "-n", std::to_string(ranks), "--oversubscribe", DLPLAN_EXE, "train"};
  v.insert(v.end(), args.begin(), args.end());
  return spawn(v, env, deadline, send);
}
#else
#define SKIP_WITHOUT_MPIEXEC() GTEST_SKIP() << "built without MPI (no mpiexec): multi-rank runs are not tested"
inline Job mpi_train(int, const std::vector<std::string>&, const std::vector<std::string>& = {},
                     std::chrono::seconds = kDeadline, const SignalWhen& = {}) {
  return {};
}
#endif

inline Job train(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                 std::chrono::seconds deadline = kDeadline, const SignalWhen& send = {}) {
  std::vector<std::string> v{DLPLAN_EXE, "train"};
  v.insert(v.end(), args.begin(), args.end());
  return spawn(v, env, deadline, send);
}

}  // namespace dlplan::testing::cli_job
