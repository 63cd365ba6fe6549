// Running the dlplan executable from the CLI tests: its exit status, stdout
// and stderr, and the checks every failure shares (one "dlplan: error: ..."
// line on stderr, the right exit code: 1 a user's error, 2 a usage error).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cli_test {

struct Result {
  int status = -1;  // exit status; -1 if it did not exit normally
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Per process: ctest runs each test in its own process, two at a time, and
// two tests writing the same fixture name must not remove each other's file.
inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dlplan_cli_" + std::to_string(::getpid()) + "_" + name;
}

// Runs `dlplan <args>` in the source folder (so models/... paths resolve).
inline Result run(const std::string& args, const std::string& env = "") {
  static int counter = 0;
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string out = temp_path("out_" + tag), err = temp_path("err_" + tag);
  const std::string cmd = std::string("cd '") + DLPLAN_SOURCE_DIR + "' && " + env + " '" + DLPLAN_EXE + "' " + args +
                          " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(cmd.c_str());
  Result r;
  if (raw != -1 && WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream s(text);
  for (std::string l; std::getline(s, l);) v.push_back(l);
  return v;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A failed run: a clean exit with `status` (not a crash or an internal error)
// and exactly one stderr line "dlplan: error: ..." holding every part.
inline void expect_failure(int status, const std::string& args, std::initializer_list<std::string> parts) {
  SCOPED_TRACE("dlplan " + args);
  Result r = run(args);
  EXPECT_EQ(r.status, status) << "stderr: " << r.err;
  auto l = lines(r.err);
  ASSERT_EQ(l.size(), 1u) << "stderr: " << r.err;
  EXPECT_EQ(l[0].rfind("dlplan: error: ", 0), 0u) << l[0];
  for (const auto& p : parts) EXPECT_TRUE(contains(l[0], p)) << "missing '" << p << "' in: " << l[0];
}

// A user's error (a bad file, ...): exit 1.
inline void expect_user_error(const std::string& args, std::initializer_list<std::string> parts) {
  expect_failure(1, args, parts);
}

// A usage error (an unknown flag, a bad value or combination): exit 2.
inline void expect_usage_error(const std::string& args, std::initializer_list<std::string> parts) {
  expect_failure(2, args, parts);
}

inline nlohmann::json parse_json(const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << e.what() << "\n" << text;
    return {};
  }
}

inline nlohmann::json planning(const std::string& args) {
  Result r = run(args + " --format json");
  EXPECT_EQ(r.status, 0) << r.err;
  return parse_json(r.out);
}

}  // namespace cli_test
