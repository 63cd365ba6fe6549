// The GPU communicators' collectives against closed forms, at any world size
// (ctest runs it at 2 and 4 ranks): the host-staged MPI path with at least
// one GPU per node (ranks may share it), NCCL with one GPU per rank. Without
// a GPU, a CUDA build or NCCL, the parts that cannot run are skipped, named,
// and the program exits 0. Every check is made on every rank; the failures
// are summed over the world, rank 0 prints the summary and every rank exits
// non-zero if any rank failed a check.
#include "dlplan/error.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/communicator.hpp"
#if defined(DLPLAN_HAVE_CUDA)
#include "dlplan/exec/cuda_runtime.hpp"
#endif

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace dlplan::exec;

namespace {

int g_rank = 0;
int g_pass = 0;
int g_fail = 0;
std::vector<std::string> g_notes;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    std::fprintf(stderr, "FAIL rank %d: %s\n", g_rank, what.c_str());
  }
}

#if defined(DLPLAN_HAVE_CUDA)

// A device buffer (from the caching resource) with host mirrors.
struct DeviceBuffer {
  CudaMemory* mem = nullptr;
  float* d = nullptr;
  int64_t n = 0, granted = 0;
  DeviceBuffer(CudaMemory& m, int64_t count) : mem(&m), n(count) {
    d = static_cast<float*>(m.allocate(count * 4, granted));
    if (d == nullptr) throw dlplan::Error("out of device memory in the test");
  }
  ~DeviceBuffer() { mem->release(d, granted); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void put(const std::vector<float>& h) { cuda_copy(d, h.data(), n * 4); }
  std::vector<float> get() const {
    std::vector<float> h(static_cast<size_t>(n));
    cuda_copy(h.data(), d, n * 4);
    return h;
  }
};

// Compares [first, last) of got with want(i); reports the first mismatch only.
void expect_range(const std::string& label, const std::vector<float>& got, int64_t first, int64_t last,
                  const std::function<double(int64_t)>& want) {
  for (int64_t i = first; i < last; ++i) {
    const double w = want(i), g = got[static_cast<size_t>(i)];
    if (g != w) {
      check(false, label + "[" + std::to_string(i) + "] = " + std::to_string(g) + ", expected " + std::to_string(w));
      return;
    }
  }
  check(true, label);
}

double sum_plus_one(int first, int n) {
  double s = 0;
  for (int r = first; r < first + n; ++r) s += r + 1;
  return s;
}

// Waits either way: the device-side wait (then a copy on the legacy default
// stream, the compute stream here) or the host-blocking one.
void finish(const WorkHandle& w, bool host_wait) {
  if (host_wait) wait_host(w);
  else w->wait();
}

void run_suite(GpuCommunicator& c, const std::string& tag) {
  const int r = c.rank(), n = c.size();
  auto mem = make_cuda_memory(c.device());
  const double S = sum_plus_one(0, n);
  for (bool host_wait : {false, true}) {
    const std::string t = tag + (host_wait ? " (wait_host) " : " (wait) ");
    {  // all_reduce, an odd length and a large one
      DeviceBuffer b(*mem, 1003);
      std::vector<float> h(1003);
      for (int64_t i = 0; i < b.n; ++i) h[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 7 + 1));
      b.put(h);
      finish(c.all_reduce(b.d, b.n), host_wait);
      expect_range(t + "all_reduce", b.get(), 0, b.n, [&](int64_t i) { return S * static_cast<double>(i % 7 + 1); });
      DeviceBuffer big(*mem, int64_t{1} << 22);
      big.put(std::vector<float>(size_t{1} << 22, static_cast<float>(r + 1)));
      finish(c.all_reduce(big.d, big.n), host_wait);
      expect_range(t + "all_reduce 4M", big.get(), 0, big.n, [&](int64_t) { return S; });
    }
    {  // reduce_scatter in place: this rank's shard at r * shard
      const int64_t shard = 257;
      DeviceBuffer b(*mem, shard * n);
      std::vector<float> h(static_cast<size_t>(b.n));
      for (int64_t i = 0; i < b.n; ++i) h[static_cast<size_t>(i)] = static_cast<float>(r + 1 + i);
      b.put(h);
      finish(c.reduce_scatter(b.d, b.n), host_wait);
      expect_range(t + "reduce_scatter", b.get(), r * shard, (r + 1) * shard,
                   [&](int64_t i) { return S + static_cast<double>(n) * static_cast<double>(i); });
    }
    {  // all_gather in place: rank q's shard from q * shard
      const int64_t shard = 129;
      DeviceBuffer b(*mem, shard * n);
      std::vector<float> h(static_cast<size_t>(b.n), -1.0f);
      for (int64_t j = 0; j < shard; ++j) h[static_cast<size_t>(r * shard + j)] = static_cast<float>(1000 * r + j);
      b.put(h);
      finish(c.all_gather(b.d, b.n), host_wait);
      expect_range(t + "all_gather", b.get(), 0, b.n,
                   [&](int64_t i) { return 1000.0 * static_cast<double>(i / shard) + static_cast<double>(i % shard); });
    }
    {  // broadcast from the last rank
      DeviceBuffer b(*mem, 777);
      std::vector<float> h(777, -1.0f);
      if (r == n - 1)
        for (int64_t i = 0; i < b.n; ++i) h[static_cast<size_t>(i)] = 7.0f + 0.5f * static_cast<float>(i);
      b.put(h);
      finish(c.broadcast(b.d, b.n, n - 1), host_wait);
      expect_range(t + "broadcast", b.get(), 0, b.n, [&](int64_t i) { return 7.0 + 0.5 * static_cast<double>(i); });
    }
    {  // grouped: three buffers in one launch each way
      std::vector<int64_t> counts = {64L * n, 3L * n, 1000L * n};
      std::vector<std::unique_ptr<DeviceBuffer>> bs;
      std::vector<GpuCommunicator::Buffer> views;
      for (int64_t cnt : counts) {
        bs.push_back(std::make_unique<DeviceBuffer>(*mem, cnt));
        bs.back()->put(std::vector<float>(static_cast<size_t>(cnt), static_cast<float>(r + 1)));
        views.push_back({bs.back()->d, cnt});
      }
      finish(c.all_reduce_many(views), host_wait);
      for (size_t k = 0; k < bs.size(); ++k)
        expect_range(t + "all_reduce_many #" + std::to_string(k), bs[k]->get(), 0, bs[k]->n, [&](int64_t) { return S; });
      finish(c.reduce_scatter_many(views), host_wait);  // every element is S: the shard holds n * S
      for (size_t k = 0; k < bs.size(); ++k) {
        const int64_t shard = bs[k]->n / n;
        expect_range(t + "reduce_scatter_many #" + std::to_string(k), bs[k]->get(), r * shard, (r + 1) * shard,
                     [&](int64_t) { return S * n; });
      }
      for (size_t k = 0; k < bs.size(); ++k) {
        const int64_t shard = bs[k]->n / n;
        std::vector<float> h(static_cast<size_t>(bs[k]->n), -1.0f);
        for (int64_t j = 0; j < shard; ++j) h[static_cast<size_t>(r * shard + j)] = static_cast<float>(r * 10 + k);
        bs[k]->put(h);
      }
      finish(c.all_gather_many(views), host_wait);
      for (size_t k = 0; k < bs.size(); ++k) {
        const int64_t shard = bs[k]->n / n;
        expect_range(t + "all_gather_many #" + std::to_string(k), bs[k]->get(), 0, bs[k]->n,
                     [&](int64_t i) { return static_cast<double>(i / shard * 10 + static_cast<int64_t>(k)); });
      }
    }
  }
  // Groups of 2 contiguous ranks (SyncBN's), when the world splits so.
  if (n % 2 == 0) {
    const int g = c.make_groups(2);
    check(c.make_groups(2) == g, tag + " make_groups caches the handle");
    check(c.group_size(g) == 2 && c.group_rank(g) == r % 2, tag + " group size and rank");
    const int first = r / 2 * 2;
    DeviceBuffer b(*mem, 2 * 50);
    b.put(std::vector<float>(100, static_cast<float>(r + 1)));
    c.all_reduce(b.d, 50, g)->wait();
    c.reduce_scatter(b.d + 50, 50, g)->wait();
    const auto h = b.get();
    const double gs = sum_plus_one(first, 2);
    expect_range(tag + " group all_reduce", h, 0, 50, [&](int64_t) { return gs; });
    expect_range(tag + " group reduce_scatter", h, 50 + (r % 2) * 25, 50 + (r % 2 + 1) * 25,
                 [&](int64_t) { return gs; });
    // Control: the world sum differs from the group's when there are more than 2 ranks.
    if (n > 2) check(gs != S, tag + " control: group sum differs from the world sum");
    // Strided groups (hybrid sharding's replicas): the ranks of one parity.
    const int s = c.make_strided_groups(2);
    check(c.make_strided_groups(2) == s && s != g, tag + " make_strided_groups caches its own handle");
    check(c.group_size(s) == n / 2 && c.group_rank(s) == r / 2, tag + " strided group size and rank");
    DeviceBuffer e(*mem, 10);
    e.put(std::vector<float>(10, static_cast<float>(r + 1)));
    c.all_reduce(e.d, 10, s)->wait();
    double want = 0;
    for (int q = r % 2; q < n; q += 2) want += q + 1;
    expect_range(tag + " strided all_reduce", e.get(), 0, 10, [&](int64_t) { return want; });
  }
  // Bad calls throw on every rank before any traffic.
  {
    DeviceBuffer b(*mem, 2L * n + 1);
    bool threw = false;
    try {
      c.reduce_scatter(b.d, b.n);
    } catch (const dlplan::Error&) {
      threw = true;
    }
    check(threw, tag + " reduce_scatter of a non-multiple throws");
  }
  c.synchronize();
  if (c.name() == "nccl") check(c.busy_seconds() > 0, tag + " busy_seconds counts the communication stream");
  c.barrier();
}

#endif  // DLPLAN_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  // The first communicator owns MPI (initialises and finalises it); the GPU
  // communicators each take over one of their own (a duplicate of the world).
  auto world = make_communicator(&argc, &argv);
  g_rank = world->rank();
  try {
#if !defined(DLPLAN_HAVE_CUDA)
    g_notes.push_back("skipped: built without CUDA");
#else
    std::string why;
    const int mine = cuda_device_count(&why);
    // What every rank sees: the fewest devices, and whether each node has one per rank.
    struct Seen {
      int devices;
      int enough;
    } me{mine, mine >= world->local_size() ? 1 : 0};
    std::vector<Seen> all(static_cast<size_t>(world->size()));
    world->all_gather_bytes(&me, all.data(), sizeof(Seen));
    int fewest = mine, enough = 1;
    for (const auto& s : all) {
      fewest = std::min(fewest, s.devices);
      enough = std::min(enough, s.enough);
    }
    if (fewest == 0) {
      g_notes.push_back("skipped: no GPU on some rank (" + (mine == 0 ? why : std::string("another rank")) + ")");
    } else {
      select_cuda_device(*world);
      {
        auto staged = make_gpu_communicator(GpuCommKind::mpi, make_communicator(&argc, &argv));
        run_suite(*staged, "mpi-staged");
      }
      g_notes.push_back("mpi-staged: ran");
#if defined(DLPLAN_HAVE_NCCL)
      if (enough == 1) {
        auto nccl = make_gpu_communicator(GpuCommKind::nccl, make_communicator(&argc, &argv));
        run_suite(*nccl, "nccl");
        g_notes.push_back("nccl: ran");
      } else {
        g_notes.push_back("nccl: skipped (" + std::to_string(world->local_size()) + " ranks on a node with " +
                          std::to_string(mine) + " GPU(s): NCCL needs one GPU per rank)");
      }
#else
      g_notes.push_back("nccl: skipped (built without NCCL)");
#endif
    }
#endif
  } catch (const std::exception& e) {
    check(false, std::string("exception: ") + e.what());
  }
  double counts[2] = {static_cast<double>(g_pass), static_cast<double>(g_fail)};
  world->all_reduce_doubles(counts, 2);
  if (g_rank == 0) {
    std::string notes;
    for (const auto& s : g_notes) notes += (notes.empty() ? "" : "; ") + s;
    std::printf("nccl_collectives (%d ranks): %.0f passed, %.0f failed%s%s\n", world->size(), counts[0], counts[1],
                notes.empty() ? "" : " — ", notes.c_str());
  }
  return counts[1] > 0 ? 1 : 0;
}
