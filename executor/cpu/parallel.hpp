// Threads inside one rank, for the CPU kernels' loops between GEMMs (OpenBLAS
// threads the GEMMs itself). A loop is split into contiguous ranges, one per
// thread, the caller running the first; each index is computed exactly as in a
// single-threaded loop, and no reduction is split across threads, so results
// keep their bits whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace dlplan::exec::cpu {

// The threads a rank uses: DLPLAN_CPU_THREADS, else OPENBLAS_NUM_THREADS or
// OMP_NUM_THREADS (what the BLAS was told), else the cores this process may
// run on (its affinity mask; a rank that mpirun bound to one core gets 1)
// divided among the node's ranks when they all share the mask.
int cpu_threads();

// The fewest elements of simple work worth a second thread (waking one costs
// more than it saves below): 65536, or DLPLAN_CPU_GRAIN (the tests set 1, so
// that their tiny models take every parallel path).
int64_t grain_elements();

// Run the loops on OpenMP's team (oneDNN's) rather than the pool: the CPU
// backend turns it on for a model whose convolutions oneDNN runs
// (parallel.cpp says why). Without OpenMP in the build it changes nothing.
void run_loops_on_openmp(bool on);

// body(begin, end) over [0, n) in contiguous ranges; single-threaded when
// there is one thread or fewer than 2 * grain indices.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// memset(p, 0, bytes), its contiguous ranges on the rank's threads (one core
// alone does not reach the memory's bandwidth).
void parallel_zero(void* p, int64_t bytes);

}  // namespace dlplan::exec::cpu
