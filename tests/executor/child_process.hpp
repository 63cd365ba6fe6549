// Running a child program (mpiexec jobs, the dlplan executable) from a test:
// its own process group, stdout and stderr captured apart, and a deadline past
// which the group is killed, so a hanging job fails the test instead of
// hanging it. Shared by comm_failure_test.cpp and train_cli_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dlplan::testing {

struct ChildResult {
  bool finished = false;  // false: killed at the deadline
  int exit_code = -1;     // exit status, or 128 + signal
  std::string out, err;
  double seconds = 0;
  std::string all() const { return out + err; }
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Our environment without an enclosing MPI job's variables (so a plain child
// is a single process), a stray DLPLAN_FAULT or BLAS thread count, plus what
// OpenMPI needs to run as root in a container, one BLAS thread per rank, and
// `extra`.
inline std::vector<std::string> child_environment(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    const bool enclosing_job = (v.rfind("OMPI_", 0) == 0 && v.rfind("OMPI_MCA_", 0) != 0) || v.rfind("PMIX_", 0) == 0 ||
                               v.rfind("PMI_", 0) == 0 || v.rfind("SLURM_PROCID=", 0) == 0;
    const bool ours = v.rfind("DLPLAN_FAULT=", 0) == 0 || v.rfind("OPENBLAS_NUM_THREADS=", 0) == 0;
    if (!enclosing_job && !ours) env.push_back(v);
  }
  for (const char* v : {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                        "OMPI_MCA_rmaps_base_oversubscribe=1", "OPENBLAS_NUM_THREADS=1"})
    env.emplace_back(v);
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// A signal for the child (not its group: mpiexec forwards it to the ranks)
// once its stdout holds `when_stdout_has`.
struct SignalWhen {
  int signal = 0;
  std::string when_stdout_has;
};

// Runs args[0] (an absolute path) in a process group of its own; past
// `deadline` it gets SIGTERM (mpiexec forwards it to the ranks), then the
// group SIGKILL, and `finished` stays false.
inline ChildResult run_child(std::vector<std::string> args, const std::vector<std::string>& extra_env,
                             std::chrono::seconds deadline, const SignalWhen& send = {}) {
  ChildResult res;
  char out_path[] = "/tmp/dlplan_child_out_XXXXXX", err_path[] = "/tmp/dlplan_child_err_XXXXXX";
  const int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
  EXPECT_TRUE(out_fd >= 0 && err_fd >= 0) << "mkstemp: " << std::strerror(errno);
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
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
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
    bool sent = send.signal == 0;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        res.finished = true;
        break;
      }
      if (!sent && slurp(out_path).find(send.when_stdout_has) != std::string::npos) {
        kill(pid, send.signal);
        sent = true;
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
  close(out_fd);
  close(err_fd);
  res.out = slurp(out_path);
  res.err = slurp(err_path);
  std::remove(out_path);
  std::remove(err_path);
  return res;
}

}  // namespace dlplan::testing
