#include "cpu/parallel.hpp"

#include <sched.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

int env_count(const char* name, long most = 1024) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n <= most) ? static_cast<int>(n) : 0;
}

int detect_threads() {
  for (const char* name : {"DLPLAN_CPU_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const int n = env_count(name)) return n;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (allowed < cores) return std::max(1, allowed);  // bound by the launcher: its cores are ours
  int local_ranks = 1;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const int n = env_count(name)) local_ranks = n;
  return std::max(1, allowed / local_ranks);
}

// Workers sleep on a condition variable between loops: no spinning, so a
// worker never takes a core from OpenBLAS's threads between GEMMs.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~Pool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    std::lock_guard one_loop_at_a_time(run_m_);  // two threads of a rank may both run kernels
    std::unique_lock lock(m_);
    body_ = &body;
    n_ = n;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    const auto [begin, end] = range(0);
    std::exception_ptr error;
    try {
      in_parallel = true;
      body(begin, end);
    } catch (...) {
      error = std::current_exception();  // rethrown once the workers are done with `body`
    }
    in_parallel = false;
    lock.lock();
    done_.wait(lock, [this] { return pending_ == 0; });
    body_ = nullptr;
    if (error) std::rethrow_exception(error);
  }

  // True on a thread inside a body: a nested parallel_for runs inline.
  static thread_local bool in_parallel;

 private:
  std::pair<int64_t, int64_t> range(int t) const {
    const int64_t T = threads();
    return {n_ * t / T, n_ * (t + 1) / T};
  }

  void work(int t) {
    uint64_t seen = 0;
    std::unique_lock lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const auto [begin, end] = range(t);
      const auto* body = body_;
      lock.unlock();
      in_parallel = true;
      (*body)(begin, end);  // the bodies are kernels' loops, which do not throw
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_m_, m_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

thread_local bool Pool::in_parallel = false;

Pool& pool() {
  static Pool p(cpu_threads());
  return p;
}

}  // namespace

int64_t grain_elements() {
  static const int64_t g = [] {
    const int n = env_count("DLPLAN_CPU_GRAIN", 1 << 30);
    return n > 0 ? int64_t{n} : int64_t{1} << 16;
  }();
  return g;
}

int cpu_threads() {
  static const int n = detect_threads();
  return n;
}

namespace {

std::atomic<bool> loops_on_openmp{false};

}  // namespace

void run_loops_on_openmp(bool on) { loops_on_openmp = on; }

// Where oneDNN runs most of a step (a convolutional network), the loops
// between its kernels run on its OpenMP team, whose threads are still
// spinning from the last kernel, rather than on the pool, whose workers would
// wait for those cores. Elsewhere the pool, whose workers sleep: an OpenMP
// team spinning between OpenBLAS's GEMMs slowed a small GPT threefold. The
// ranges are the same either way.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int T = cpu_threads();
  if (T == 1 || n < 2 * std::max<int64_t>(grain, 1) || Pool::in_parallel) return body(0, n);
#ifdef _OPENMP
  if (omp_in_parallel()) return body(0, n);  // nested: inline, as in the pool
  if (loops_on_openmp) {
    std::exception_ptr error;
    std::mutex error_m;
#pragma omp parallel num_threads(T)
    {
      const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
      try {
        body(n * t / threads, n * (t + 1) / threads);
      } catch (...) {
        std::lock_guard lock(error_m);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  pool().run(n, body);
}

void parallel_zero(void* p, int64_t bytes) {
  if (bytes <= 0) return;
  parallel_for(bytes, grain_elements() * 16, [p](int64_t begin, int64_t end) {
    std::memset(static_cast<char*>(p) + begin, 0, static_cast<size_t>(end - begin));
  });
}

}  // namespace dlplan::exec::cpu
