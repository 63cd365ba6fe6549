// A rank that dies ends the whole job with a message naming the rank, never a
// hang (DESIGN.md, Conventions). Runs a 2-rank job of comm_failure_child under
// mpiexec (from this single, non-MPI process) and watches it with a deadline.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

struct JobResult {
  bool finished = false;
  int exit_code = -1;  // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

#if defined(DLPLAN_COMM_FAILURE_CHILD) && defined(DLPLAN_MPIEXEC)

// The child's environment: ours, without the variables of an enclosing MPI
// job, plus what OpenMPI needs to run as root in a container.
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    const bool enclosing_job = (v.rfind("OMPI_", 0) == 0 && v.rfind("OMPI_MCA_", 0) != 0) ||
                               v.rfind("PMIX_", 0) == 0 || v.rfind("PMI_", 0) == 0;
    if (!enclosing_job) env.push_back(v);
  }
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  env.push_back("OMPI_MCA_rmaps_base_oversubscribe=1");
  env.push_back("OPENBLAS_NUM_THREADS=1");
  return env;
}

JobResult run_job(const std::string& mode, std::chrono::seconds deadline) {
  JobResult res;
  char log_template[] = "/tmp/dlplan_comm_failure_XXXXXX";
  const int log_fd = mkstemp(log_template);
  EXPECT_GE(log_fd, 0) << "mkstemp: " << std::strerror(errno);
  if (log_fd < 0) return res;

  std::vector<std::string> args = {DLPLAN_MPIEXEC, "-n", "2", "--oversubscribe", DLPLAN_COMM_FAILURE_CHILD, mode};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env_strings = child_environment();
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own process group, to kill on deadline
  posix_spawnattr_setpgroup(&attr, 0);

  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  EXPECT_EQ(rc, 0) << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
  if (rc == 0) {
    int status = 0;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        res.finished = true;
        break;
      }
      if (std::chrono::steady_clock::now() - t0 > deadline) {
        // mpiexec forwards SIGTERM to the ranks (which it may have put in
        // groups of their own); SIGKILL its group if it does not go.
        kill(pid, SIGTERM);
        const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while (waitpid(pid, &status, WNOHANG) != pid) {
          if (std::chrono::steady_clock::now() > grace) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(log_fd);
  std::ifstream in(log_template);
  std::stringstream ss;
  ss << in.rdbuf();
  res.output = ss.str();
  unlink(log_template);
  return res;
}

#define SKIP_WITHOUT_MPIEXEC()                                                     \
  do {                                                                             \
    if (access(DLPLAN_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no mpiexec at " DLPLAN_MPIEXEC; \
  } while (0)

#else
JobResult run_job(const std::string&, std::chrono::seconds) { return {}; }
#define SKIP_WITHOUT_MPIEXEC() GTEST_SKIP() << "built without MPI (no mpiexec, no child program)"
#endif

constexpr auto kDeadline = std::chrono::seconds(30);

}  // namespace

TEST(CommFailure, ControlJobSucceeds) {
  SKIP_WITHOUT_MPIEXEC();
  const auto r = run_job("ok", kDeadline);
  ASSERT_TRUE(r.finished) << "the job hung past " << kDeadline.count() << " s:\n" << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1: done, all_reduce = 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("dlplan: rank"), std::string::npos) << r.output;
}

TEST(CommFailure, KilledRankEndsTheJobNamingIt) {
  SKIP_WITHOUT_MPIEXEC();
  const auto r = run_job("kill", kDeadline);
  ASSERT_TRUE(r.finished) << "the job hung past " << kDeadline.count() << " s:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0: done"), std::string::npos) << "rank 0 went past the dead peer:\n" << r.output;
  std::printf("[ info ] killed-rank job ended in %.1f s, exit %d\n", r.seconds, r.exit_code);
}

TEST(CommFailure, AbortEndsTheJobWithTheMessage) {
  SKIP_WITHOUT_MPIEXEC();
  const auto r = run_job("error", kDeadline);
  ASSERT_TRUE(r.finished) << "the job hung past " << kDeadline.count() << " s:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dlplan: rank 1: simulated failure at step 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0: done"), std::string::npos) << r.output;
  std::printf("[ info ] aborting-rank job ended in %.1f s, exit %d\n", r.seconds, r.exit_code);
}
