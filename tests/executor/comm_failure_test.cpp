// A rank that dies ends the whole job with a message naming the rank, never a
// hang (DESIGN.md, Conventions). Runs a 2-rank job of comm_failure_child under
// mpiexec (from this single, non-MPI process) and watches it with a deadline.
#include "child_process.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct JobResult {
  bool finished = false;
  int exit_code = -1;  // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

#if defined(DLPLAN_COMM_FAILURE_CHILD) && defined(DLPLAN_MPIEXEC)

JobResult run_job(const std::string& mode, std::chrono::seconds deadline) {
  const auto r = dlplan::testing::run_child({DLPLAN_MPIEXEC, "-n", "2", "--oversubscribe", DLPLAN_COMM_FAILURE_CHILD, mode},
                                            {}, deadline);
  return {r.finished, r.exit_code, r.all(), r.seconds};
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
