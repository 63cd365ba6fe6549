// The single-process communicator and the communication thread.
#include "dlplan/exec/comm_thread.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/communicator.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace dlplan::exec;
using namespace std::chrono_literals;

namespace {

std::vector<float> iota_buffer(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
  return v;
}

}  // namespace

TEST(SingleCommunicator, IsAWorldOfOne) {
  auto c = make_single_communicator();
  EXPECT_EQ(c->name(), "single");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->local_rank(), 0);
  EXPECT_EQ(c->local_size(), 1);
  EXPECT_EQ(c->group_size(0), 1);
  EXPECT_EQ(c->group_rank(0), 0);
}

TEST(SingleCommunicator, CollectivesLeaveDataAsIs) {
  auto c = make_single_communicator();
  const auto ref = iota_buffer(12);
  auto a = ref;
  c->all_reduce(a.data(), 12)->wait();
  EXPECT_EQ(a, ref);
  c->reduce_scatter(a.data(), 12)->wait();
  EXPECT_EQ(a, ref);
  c->all_gather(a.data(), 12)->wait();
  EXPECT_EQ(a, ref);
  c->broadcast(a.data(), 12, 0)->wait();
  EXPECT_EQ(a, ref);
  c->barrier();
  std::vector<double> d = {1.5, -2.0};
  c->all_reduce_doubles(d.data(), 2);
  EXPECT_EQ(d, (std::vector<double>{1.5, -2.0}));
  // Empty buffers are fine.
  c->all_reduce(nullptr, 0)->wait();
  // Control: the buffer comparison can fail.
  a[3] += 1.0f;
  EXPECT_NE(a, ref);
}

TEST(SingleCommunicator, AllGatherBytesCopiesTheOneSlot) {
  auto c = make_single_communicator();
  const char in[6] = "hello";
  char out[6] = {};
  c->all_gather_bytes(in, out, 6);
  EXPECT_STREQ(out, "hello");
  c->all_gather_bytes(out, out, 6);  // in place
  EXPECT_STREQ(out, "hello");
}

TEST(SingleCommunicator, GroupsHaveSizeOne) {
  auto c = make_single_communicator();
  const int g = c->make_groups(1);
  EXPECT_NE(g, 0);
  EXPECT_EQ(c->group_size(g), 1);
  EXPECT_EQ(c->group_rank(g), 0);
  std::vector<float> a = {1.0f, 2.0f};
  c->all_reduce(a.data(), 2, g)->wait();
  EXPECT_EQ(a, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_THROW(c->make_groups(2), dlplan::Error);
  EXPECT_THROW(c->make_groups(0), dlplan::Error);
  EXPECT_THROW(c->group_size(g + 7), dlplan::Error);
  EXPECT_THROW(c->all_reduce(a.data(), 2, 42), dlplan::Error);
  EXPECT_THROW(c->broadcast(a.data(), 2, 1), dlplan::Error);
}

TEST(SingleCommunicator, MakeCommunicatorOutsideALauncherIsSingle) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(var) != nullptr) GTEST_SKIP() << "running under a launcher (" << var << ")";
  auto c = make_communicator(nullptr, nullptr);
  EXPECT_EQ(c->name(), "single");
  EXPECT_EQ(c->size(), 1);
}

TEST(SingleCommunicatorDeathTest, AbortPrintsTheRankAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto c = make_single_communicator();
  EXPECT_EXIT(c->abort("simulated failure"), testing::ExitedWithCode(1),
              "dlplan: rank 0: simulated failure");
}

TEST(CommThread, RunsTasksInSubmissionOrder) {
  comm::CommThread t;
  std::vector<int> order;
  std::vector<WorkHandle> h;
  for (int i = 0; i < 200; ++i)
    h.push_back(t.submit([&order, i] {
      if (i % 50 == 0) std::this_thread::sleep_for(1ms);  // a slow one does not let later ones pass
      order.push_back(i);
    }));
  h.back()->wait();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(CommThread, ConcurrentSubmittersEachKeepTheirOrder) {
  comm::CommThread t;
  std::mutex m;
  std::vector<std::pair<int, int>> seen;  // (submitter, index)
  std::vector<std::thread> submitters;
  for (int s = 0; s < 4; ++s)
    submitters.emplace_back([&, s] {
      for (int i = 0; i < 100; ++i)
        t.submit([&, s, i] {
          std::lock_guard<std::mutex> lock(m);
          seen.emplace_back(s, i);
        });
    });
  for (auto& th : submitters) th.join();
  t.submit([] {})->wait();
  ASSERT_EQ(seen.size(), 400u);
  std::vector<int> next(4, 0);
  for (auto [s, i] : seen) EXPECT_EQ(i, next[static_cast<size_t>(s)]++);
}

TEST(CommThread, ExceptionsReachWait) {
  comm::CommThread t;
  auto bad = t.submit([] { throw dlplan::Error("MPI_Allreduce failed on rank 1: boom"); });
  auto good = t.submit([] {});
  try {
    bad->wait();
    FAIL() << "wait() did not rethrow";
  } catch (const dlplan::Error& e) {
    EXPECT_STREQ(e.what(), "MPI_Allreduce failed on rank 1: boom");
  }
  EXPECT_THROW(bad->wait(), dlplan::Error);  // again, every time
  EXPECT_NO_THROW(good->wait());             // the thread goes on after a failure
  EXPECT_THROW(t.run_sync([] { throw std::runtime_error("x"); }), std::runtime_error);
}

TEST(CommThread, ASlowTaskDoesNotBlockTheSubmitter) {
  comm::CommThread t;
  std::atomic<bool> release{false};
  std::atomic<bool> finished{false};
  const auto t0 = std::chrono::steady_clock::now();
  auto slow = t.submit([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    finished = true;
  });
  auto after = t.submit([] {});
  const auto submit_time = std::chrono::steady_clock::now() - t0;
  // The submitter is back at once and can compute while the task runs.
  EXPECT_LT(submit_time, 200ms);
  EXPECT_FALSE(finished.load());
  auto* fw = dynamic_cast<comm::FutureWork*>(slow.get());
  ASSERT_NE(fw, nullptr);
  EXPECT_FALSE(fw->ready());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(dynamic_cast<comm::FutureWork*>(after.get())->ready());  // queued behind it
  release = true;
  slow->wait();
  EXPECT_TRUE(finished.load());
  after->wait();
}

TEST(CommThread, RunSyncFromTheThreadRunsInline) {
  comm::CommThread t;
  int x = 0;
  t.submit([&] {
    EXPECT_TRUE(t.on_thread());
    t.run_sync([&] { x = 7; });  // would deadlock if queued
  })->wait();
  EXPECT_EQ(x, 7);
  EXPECT_FALSE(t.on_thread());
}

TEST(CommThread, DestructorDrainsTheQueue) {
  std::atomic<int> ran{0};
  {
    comm::CommThread t;
    for (int i = 0; i < 50; ++i)
      t.submit([&] {
        std::this_thread::sleep_for(100us);
        ++ran;
      });
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(CommThread, SubmitAfterShutdownIsAnError) {
  comm::CommThread t;
  t.shutdown();
  EXPECT_THROW(t.submit([] {}), dlplan::Error);
  t.shutdown();  // idempotent
}
