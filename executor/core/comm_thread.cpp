#include "dlplan/exec/comm_thread.hpp"

#include "dlplan/error.hpp"

#include <chrono>
#include <exception>
#include <utility>

namespace dlplan::exec::comm {

bool FutureWork::ready() const {
  return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

WorkHandle completed_work() {
  std::promise<void> p;
  p.set_value();
  return std::make_shared<FutureWork>(p.get_future().share());
}

CommThread::CommThread() {
  // thread_id_ is written before the thread starts and never again, so
  // on_thread() may read it from any thread without a lock.
  std::promise<std::thread::id> started;
  auto id = started.get_future();
  thread_ = std::thread([this, &started] {
    started.set_value(std::this_thread::get_id());
    loop();
  });
  thread_id_ = id.get();
}

CommThread::~CommThread() { shutdown(); }

void CommThread::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    // Shut down from one of its own tasks, it would wait on itself forever.
    if (on_thread()) std::terminate();
    thread_.join();
  }
}

bool CommThread::on_thread() const { return std::this_thread::get_id() == thread_id_; }

WorkHandle CommThread::submit(std::function<void()> task) {
  Task t{std::move(task), std::promise<void>()};
  auto done = t.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Error("communication thread: task submitted after shutdown");
    queue_.push_back(std::move(t));
  }
  cv_.notify_one();
  return std::make_shared<FutureWork>(std::move(done));
}

void CommThread::run_sync(std::function<void()> task) {
  if (on_thread()) {
    task();
    return;
  }
  submit(std::move(task))->wait();
}

void CommThread::loop() {
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      t.fn();
      busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      t.done.set_value();
    } catch (...) {
      t.done.set_exception(std::current_exception());
    }
  }
}

}  // namespace dlplan::exec::comm
