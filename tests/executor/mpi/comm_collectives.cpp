// The MPI communicator's collectives against closed forms, at any world size
// (ctest runs it at 2 and 4 ranks). Every check is made on every rank; the
// failure count is summed over the world and rank 0 prints the summary; the
// exit status is non-zero on every rank if any rank failed a check.
#include "dlplan/error.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/communicator.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace dlplan::exec;
using namespace std::chrono_literals;

namespace {

int g_rank = 0;
int g_pass = 0;
int g_fail = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    std::fprintf(stderr, "FAIL rank %d: %s\n", g_rank, what.c_str());
  }
}

// Expects the call to throw dlplan::Error (before any MPI traffic, so every
// rank throws alike and none is left waiting).
void check_throws(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    check(false, what + " did not throw");
  } catch (const dlplan::Error&) {
    check(true, what);
  }
}

std::string at(const char* what, int64_t i, double got, double want) {
  return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(got) +
         ", expected " + std::to_string(want);
}

// Sum over ranks r' of (r' + 1) for ranks [first, first + n).
double sum_plus_one(int first, int n) {
  double s = 0;
  for (int r = first; r < first + n; ++r) s += r + 1;
  return s;
}

void test_all_reduce(Communicator& c) {
  const int r = c.rank(), n = c.size();
  float x = static_cast<float>(r);
  c.all_reduce(&x, 1)->wait();
  check(x == static_cast<float>(n * (n - 1) / 2), at("all_reduce(rank)", 0, x, n * (n - 1) / 2));

  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
  c.all_reduce(v.data(), static_cast<int64_t>(v.size()))->wait();
  const double s = sum_plus_one(0, n);
  int bad = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<float>(s * static_cast<double>(i % 7 + 1))) ++bad;
  check(bad == 0, "all_reduce(1000 floats): " + std::to_string(bad) + " wrong");
}

void test_reduce_scatter(Communicator& c, int group, int grank, int gsize, int gfirst) {
  const int k = 5;
  std::vector<float> v(static_cast<size_t>(gsize * k));
  const int r = c.rank();
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((r + 1) * static_cast<int>(i + 1));
  c.reduce_scatter(v.data(), static_cast<int64_t>(v.size()), group)->wait();
  const double s = sum_plus_one(gfirst, gsize);
  bool ok = true;
  for (int j = 0; j < k; ++j) {
    const int64_t i = static_cast<int64_t>(grank) * k + j;
    const double want = s * static_cast<double>(i + 1);
    if (v[static_cast<size_t>(i)] != static_cast<float>(want)) {
      check(false, at(("reduce_scatter group " + std::to_string(group)).c_str(), i,
                      v[static_cast<size_t>(i)], want));
      ok = false;
      break;
    }
  }
  if (ok) check(true, "reduce_scatter");
}

void test_all_gather(Communicator& c, int group, int grank, int gsize) {
  const int k = 3;
  std::vector<float> v(static_cast<size_t>(gsize * k), -1.0f);
  for (int j = 0; j < k; ++j) v[static_cast<size_t>(grank * k + j)] = static_cast<float>(1000 * grank + j);
  c.all_gather(v.data(), static_cast<int64_t>(v.size()), group)->wait();
  int bad = 0;
  for (int q = 0; q < gsize; ++q)
    for (int j = 0; j < k; ++j)
      if (v[static_cast<size_t>(q * k + j)] != static_cast<float>(1000 * q + j)) ++bad;
  check(bad == 0, "all_gather group " + std::to_string(group) + ": " + std::to_string(bad) + " wrong");
}

void test_broadcast(Communicator& c, int group, int grank, int gsize) {
  for (int root : {0, gsize - 1}) {
    std::vector<float> v(10);
    for (int i = 0; i < 10; ++i) v[static_cast<size_t>(i)] = static_cast<float>(grank * 10 + i);
    c.broadcast(v.data(), 10, root, group)->wait();
    int bad = 0;
    for (int i = 0; i < 10; ++i)
      if (v[static_cast<size_t>(i)] != static_cast<float>(root * 10 + i)) ++bad;
    check(bad == 0, "broadcast root " + std::to_string(root) + " group " + std::to_string(group));
  }
}

void test_groups(Communicator& c) {
  const int r = c.rank(), n = c.size();
  // The whole world as one group behaves as group 0.
  const int whole = c.make_groups(n);
  check(c.group_size(whole) == n && c.group_rank(whole) == r, "make_groups(size) is the world");
  check(c.make_groups(n) == whole, "make_groups(size) again returns the same handle");
  check_throws([&] { c.make_groups(n + 1); }, "make_groups(size + 1)");
  check_throws([&] { c.make_groups(0); }, "make_groups(0)");
  if (n % 3 != 0) check_throws([&] { c.make_groups(3); }, "make_groups(3) at size " + std::to_string(n));
  check_throws([&] { c.group_size(99); }, "group_size(unknown)");

  if (n < 2 || n % 2 != 0) return;
  const int g = c.make_groups(2);
  check(g != 0, "make_groups(2) is not the world handle");
  check(c.group_size(g) == 2, "group_size(pairs) == 2");
  check(c.group_rank(g) == r % 2, "group_rank(pairs) == rank % 2");

  float x = static_cast<float>(r);
  c.all_reduce(&x, 1, g)->wait();
  const float pair_sum = static_cast<float>(4 * (r / 2) + 1);  // 2p + (2p + 1)
  check(x == pair_sum, at("pair all_reduce(rank)", 0, x, pair_sum));
  // Control that must differ: beyond two ranks, a pair's sum is not the world's.
  if (n >= 4) {
    float w = static_cast<float>(r);
    c.all_reduce(&w, 1)->wait();
    check(w != x, "control: pair all_reduce differs from world all_reduce at size " + std::to_string(n));
  }
  test_reduce_scatter(c, g, r % 2, 2, r - r % 2);
  test_all_gather(c, g, r % 2, 2);
  test_broadcast(c, g, r % 2, 2);

  // Strided groups (hybrid sharding's replicas): ranks equal modulo 2, so
  // {0, 2, ...} and {1, 3, ...}; rank r is member r / 2 of group r % 2.
  check_throws([&] { c.make_strided_groups(0); }, "make_strided_groups(0)");
  if (n % 3 != 0) check_throws([&] { c.make_strided_groups(3); }, "make_strided_groups(3) at size " + std::to_string(n));
  const int s = c.make_strided_groups(2);
  check(s != g && s != 0, "make_strided_groups(2) is neither the pairs nor the world");
  check(c.make_strided_groups(2) == s, "make_strided_groups(2) again returns the same handle");
  check(c.group_size(s) == n / 2 && c.group_rank(s) == r / 2, "strided group size n/2 and rank r/2");
  float y = static_cast<float>(r);
  c.all_reduce(&y, 1, s)->wait();
  float want = 0;  // sum of the ranks of parity r % 2
  for (int q = r % 2; q < n; q += 2) want += static_cast<float>(q);
  check(y == want, at("strided all_reduce(rank)", 0, y, want));
  if (n >= 4) check(y != x, "control: the strided sum differs from the pair sum at size " + std::to_string(n));
}

void test_bytes_and_doubles(Communicator& c) {
  const int r = c.rank(), n = c.size();
  struct Rec {
    int rank;
    char tag[16];
  };
  Rec mine{r, {}};
  std::snprintf(mine.tag, sizeof mine.tag, "r%d", r);
  std::vector<Rec> all(static_cast<size_t>(n));
  c.all_gather_bytes(&mine, all.data(), sizeof(Rec));
  int bad = 0;
  for (int q = 0; q < n; ++q) {
    char want[16];
    std::snprintf(want, sizeof want, "r%d", q);
    if (all[static_cast<size_t>(q)].rank != q || std::strcmp(all[static_cast<size_t>(q)].tag, want) != 0) ++bad;
  }
  check(bad == 0, "all_gather_bytes");
  // In place: this rank's slot already filled.
  std::vector<int> slots(static_cast<size_t>(n), -1);
  slots[static_cast<size_t>(r)] = 7 * r;
  c.all_gather_bytes(&slots[static_cast<size_t>(r)], slots.data(), sizeof(int));
  bad = 0;
  for (int q = 0; q < n; ++q) bad += slots[static_cast<size_t>(q)] != 7 * q;
  check(bad == 0, "all_gather_bytes in place");

  std::vector<double> d = {static_cast<double>(r), 1.0, 0.25 * r, 1e300 / n};
  c.all_reduce_doubles(d.data(), 4);
  check(d[0] == n * (n - 1) / 2.0, "all_reduce_doubles(rank)");
  check(d[1] == n, "all_reduce_doubles(1) == size");
  check(d[2] == 0.25 * n * (n - 1) / 2.0, "all_reduce_doubles(0.25 rank)");
  check(d[3] > 0.99e300 && d[3] < 1.01e300, "all_reduce_doubles keeps double range (1e300)");
}

void test_local(Communicator& c) {
  // Independent reference: the ranks that report this host's name.
  const int n = c.size();
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> all(static_cast<size_t>(64 * n));
  c.all_gather_bytes(host, all.data(), 64);
  int same = 0, before = 0;
  for (int q = 0; q < n; ++q)
    if (std::strncmp(&all[static_cast<size_t>(64 * q)], host, 64) == 0) {
      ++same;
      if (q < c.rank()) ++before;
    }
  check(c.local_size() == same, "local_size == ranks on this host (" + std::to_string(same) + ")");
  check(c.local_rank() == before, "local_rank == ranks before this one on this host");
}

void test_async(Communicator& c) {
  const int r = c.rank(), n = c.size();
  // Several collectives in flight, then waited in order.
  std::vector<float> a(64, static_cast<float>(r + 1));
  std::vector<float> b(static_cast<size_t>(n * 4));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((r + 1) * static_cast<int>(i + 1));
  std::vector<float> g(static_cast<size_t>(n * 2), -1.0f);
  g[static_cast<size_t>(2 * r)] = static_cast<float>(r);
  g[static_cast<size_t>(2 * r + 1)] = static_cast<float>(-r);
  std::vector<float> bc(5, static_cast<float>(r));
  auto h1 = c.all_reduce(a.data(), 64);
  auto h2 = c.reduce_scatter(b.data(), static_cast<int64_t>(b.size()));
  auto h3 = c.all_gather(g.data(), static_cast<int64_t>(g.size()));
  auto h4 = c.broadcast(bc.data(), 5, n - 1);
  // Two all-reduces of one buffer back to back: order matters (s, then n * s).
  float twice = 1.0f;
  auto h5 = c.all_reduce(&twice, 1);
  auto h6 = c.all_reduce(&twice, 1);
  h1->wait();
  h2->wait();
  h3->wait();
  h4->wait();
  h5->wait();
  h6->wait();
  const double s = sum_plus_one(0, n);
  int bad = 0;
  for (float x : a) bad += x != static_cast<float>(s);
  for (int j = 0; j < 4; ++j)
    bad += b[static_cast<size_t>(r * 4 + j)] != static_cast<float>(s * (r * 4 + j + 1));
  for (int q = 0; q < n; ++q)
    bad += g[static_cast<size_t>(2 * q)] != static_cast<float>(q) || g[static_cast<size_t>(2 * q + 1)] != static_cast<float>(-q);
  for (float x : bc) bad += x != static_cast<float>(n - 1);
  check(bad == 0, "async: six collectives in flight, waited in order (" + std::to_string(bad) + " wrong)");
  check(twice == static_cast<float>(n * n), at("async: all_reduce twice", 0, twice, n * n));

  // Overlap: rank 0 joins late; the others' call returns at once, before it can complete.
  c.barrier();
  float late = 1.0f;
  if (r == 0) std::this_thread::sleep_for(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = c.all_reduce(&late, 1);
  const auto issue = std::chrono::steady_clock::now() - t0;
  check(issue < 100ms, "all_reduce returns before the collective completes (" +
                           std::to_string(std::chrono::duration<double, std::milli>(issue).count()) + " ms)");
  h->wait();
  check(late == static_cast<float>(n), "late all_reduce");

  // Barrier: nobody leaves before rank 0 arrives.
  c.barrier();
  const auto b0 = std::chrono::steady_clock::now();
  if (r == 0) std::this_thread::sleep_for(300ms);
  c.barrier();
  const auto waited = std::chrono::steady_clock::now() - b0;
  check(waited > 100ms, "barrier waits for the last rank (" +
                            std::to_string(std::chrono::duration<double, std::milli>(waited).count()) + " ms)");
}

void test_errors(Communicator& c) {
  const int n = c.size();
  std::vector<float> v(static_cast<size_t>(n + 1));
  if (n > 1) {  // n + 1 is a multiple of 1
    check_throws([&] { c.reduce_scatter(v.data(), n + 1); }, "reduce_scatter of size + 1 elements");
    check_throws([&] { c.all_gather(v.data(), n + 1); }, "all_gather of size + 1 elements");
  }
  check_throws([&] { c.broadcast(v.data(), 1, n); }, "broadcast from root == size");
  check_throws([&] { c.all_reduce(v.data(), 1, 1234); }, "all_reduce on an unknown group");
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<Communicator> c;
  try {
    c = make_communicator(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_collectives: %s\n", e.what());
    return 2;
  }
  g_rank = c->rank();
  check(c->name() == "mpi", "launched under mpiexec, the communicator is MPI (got " + c->name() + ")");
  if (const char* ws = std::getenv("OMPI_COMM_WORLD_SIZE"))
    check(c->size() == std::atoi(ws), "size == OMPI_COMM_WORLD_SIZE");
  check(c->group_size(0) == c->size() && c->group_rank(0) == c->rank(), "group 0 is the world");

  try {
    test_all_reduce(*c);
    test_reduce_scatter(*c, 0, c->rank(), c->size(), 0);
    test_all_gather(*c, 0, c->rank(), c->size());
    test_broadcast(*c, 0, c->rank(), c->size());
    test_groups(*c);
    test_bytes_and_doubles(*c);
    test_local(*c);
    test_async(*c);
    test_errors(*c);
  } catch (const std::exception& e) {
    c->abort(std::string("comm_collectives: unexpected exception: ") + e.what());
  }

  double counts[2] = {static_cast<double>(g_pass), static_cast<double>(g_fail)};
  c->all_reduce_doubles(counts, 2);
  if (c->rank() == 0)
    std::printf("comm_collectives at %d ranks: %.0f passed, %.0f failed (checks summed over ranks)\n",
                c->size(), counts[0], counts[1]);
  const bool ok = counts[1] == 0;
  c.reset();  // finalizes MPI
  return ok ? 0 : 1;
}
