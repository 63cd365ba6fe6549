// The communication thread (DESIGN.md, "Strategies, as the executor runs
// them"): one thread per communicator runs the collectives in the order they
// were submitted, so a strategy can issue a bucket's all-reduce and go on
// computing. The MPI communicator makes this thread the only one that calls
// MPI after initialisation (MPI_THREAD_SERIALIZED).
#pragma once

#include "dlplan/exec/communicator.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace dlplan::exec::comm {

// A Work backed by a shared future: wait() blocks until the task ran and
// rethrows the exception it ended with (every time wait() is called).
class FutureWork final : public Work {
 public:
  explicit FutureWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }
  // True once the task has finished (without blocking).
  bool ready() const;

 private:
  std::shared_future<void> done_;
};

// A Work that is already complete (world of size 1, empty buffers).
WorkHandle completed_work();

class CommThread {
 public:
  CommThread();
  // Drains the queue (every submitted task runs), then joins the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues a task; tasks run one at a time, in submission order. Thread-safe.
  // Throws dlplan::Error once the thread is shutting down.
  WorkHandle submit(std::function<void()> task);

  // Runs a task on the thread and waits for it (rethrowing its exception);
  // runs it inline when called from the thread itself, which would otherwise
  // wait on itself.
  void run_sync(std::function<void()> task);

  // True when the caller is the communication thread.
  bool on_thread() const;

  // Seconds the thread spent running tasks (the communication stream's busy time).
  double busy_seconds() const { return static_cast<double>(busy_ns_.load()) * 1e-9; }

  // Stops accepting tasks, drains the queue and joins (idempotent; the
  // destructor calls it).
  void shutdown();

 private:
  struct Task {
    std::function<void()> fn;
    std::promise<void> done;
  };
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;
  std::thread::id thread_id_;
  std::atomic<int64_t> busy_ns_{0};
};

}  // namespace dlplan::exec::comm
