// The CUDA runtime pieces of the executor (DESIGN.md, "Memory categories",
// `runtime`; "Strategies, as the executor runs them"): the caching device
// memory resource, device selection and the `runtime` measurement, and the
// GPU communicators (NCCL, or MPI through pinned host staging).
//
// This header needs no CUDA include: streams are passed as void* (a
// cudaStream_t, as in cuda_backend.hpp: cuda_compute_stream(backend)). The functions that touch a device are defined in the
// dlplan_cuda library (built when the CUDA toolkit is found; the NCCL
// communicator when NCCL is too, DLPLAN_HAVE_NCCL). The inline functions below
// are pure host logic, usable and tested on any machine.
#pragma once

#include "dlplan/error.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include "dlplan/caching_allocator.hpp"

#include <string>
#include <vector>

namespace dlplan::exec {

// The caching allocator's size classes (PyTorch CUDACachingAllocator) are in
// dlplan/caching_allocator.hpp (the planner predicts with the same rules).

// ---- the caching device memory resource -------------------------------------
struct CudaMemoryStats {
  int64_t segment_bytes = 0;  // cudaMalloc'd and cached (in use + free)
  int64_t in_use_bytes = 0;   // granted blocks not yet released
  int64_t cached_bytes = 0;   // free blocks kept for reuse (= reserved_bytes())
  int64_t segments = 0;
  int64_t cuda_mallocs = 0;   // cudaMalloc calls so far (a reuse makes none)
  int64_t cuda_frees = 0;
};

// Size-class free lists of blocks carved from cudaMalloc'd segments; a freed
// block merges with its free neighbours and is reused by later requests.
// `granted` is the block size (what the Allocator counts); reserved_bytes()
// is the cached bytes not in use. zero() is cudaMemsetAsync on the stream
// given (the compute stream; the legacy default stream when null), without
// waiting: every consumer is ordered after it by that stream or by an event
// recorded on it (the GPU communicators wait for the compute stream before a
// collective). When cudaMalloc fails, the unused cached segments are freed and
// the request retried once; then allocate() returns null (the Allocator
// reports out of memory naming the tensor). Thread-safe.
class CudaMemory : public MemoryResource {
 public:
  virtual CudaMemoryStats stats() const = 0;
  virtual void empty_cache() = 0;  // cudaFree every segment with no block in use
  virtual int device() const = 0;
};
std::unique_ptr<CudaMemory> make_cuda_memory(int device, void* stream = nullptr);

// ---- devices ------------------------------------------------------------------
// Devices visible to this process; 0 with the reason (cudaGetDeviceCount's
// error string, or "no CUDA device") in *why when there is none.
int cuda_device_count(std::string* why = nullptr);

// The node-local rank from the launcher's environment (OpenMPI
// OMPI_COMM_WORLD_LOCAL_RANK, Slurm SLURM_LOCALID, MPICH/PMI MPI_LOCALRANKID,
// PMI_LOCAL_RANK), or -1: lets a device be chosen before MPI starts.
inline int local_rank_from_env() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return -1;
}

// Chooses device local_rank % count, makes it current (cudaSetDevice) and
// returns it. Throws dlplan::Error naming the rank when there is no device.
int select_cuda_device(int local_rank);
// The same from the communicator's node-local rank (MPI_Comm_split_type shared).
int select_cuda_device(const Communicator& comm);

struct CudaDeviceInfo {
  int device = 0;
  std::string name;
  int64_t total_bytes = 0;  // as the device reports it (cudaMemGetInfo)
  int64_t free_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
};
CudaDeviceInfo cuda_device_info();  // of the current device

// DESIGN.md's `runtime`: device memory in use (cudaMemGetInfo total - free)
// minus what the allocator holds (its segments: in use + cached), as
// MemoryResource::runtime_bytes() of make_cuda_memory's resource (0 for any
// other resource). Measure it
// after the context, cuBLAS and NCCL are set up (and after the first step,
// when NCCL has made its channels). Other processes on the same device are
// counted too: one rank per GPU for a meaningful number.
int64_t measure_runtime_bytes(const Allocator& alloc);

// Blocking copies between host and device memory (cudaMemcpy, kind inferred),
// and a synchronisation of the whole device. For set-up, tests and reports.
void cuda_copy(void* dst, const void* src, int64_t bytes);
void cuda_device_synchronize();
// A non-blocking stream (does not synchronise with the legacy default stream).
void* cuda_create_stream();
void cuda_destroy_stream(void* stream);

// ---- GPU communicators --------------------------------------------------------
// A Work whose wait() is device-side: the compute stream waits for the
// collective (an event recorded after it on the communication stream); the
// host goes on. wait_host() blocks the host until it is done (errors and the
// timeout end the job).
class GpuWork : public Work {
 public:
  void wait_host() override = 0;
};

// The Communicator interface over device buffers (float32, in place, exactly
// as communicator.hpp documents), with grouped variants that fuse several
// buffers into one launch (ncclGroupStart/End). Collectives are ordered after
// the work issued so far on the compute stream (an event recorded there at
// issue, waited on by the communication stream). all_gather_bytes,
// all_reduce_doubles and barrier take host buffers and go to the host
// communicator (MPI).
class GpuCommunicator : public Communicator {
 public:
  using Buffer = Span;
  virtual WorkHandle all_reduce_many(const std::vector<Buffer>& buffers, int group = 0) = 0;
  virtual WorkHandle reduce_scatter_many(const std::vector<Buffer>& buffers, int group = 0) = 0;
  virtual WorkHandle all_gather_many(const std::vector<Buffer>& buffers, int group = 0) = 0;
  // The host waits for every collective issued so far.
  virtual void synchronize() = 0;
  Communicator& host() override = 0;  // the bootstrap communicator (MPI or single)
  virtual int device() const = 0;
  virtual void* compute_stream() const = 0;
};

// A GPU communicator over `host`, which it takes over (the MPI communicator
// from make_communicator, constructed first: it bootstraps NCCL and serves
// the host-buffer calls), on the current device (select_cuda_device first),
// ordered after `compute_stream` (null: the legacy default stream).
//   nccl: NCCL on its own communication stream; the ncclUniqueId made on rank
//         0 reaches every rank through the host communicator; groups are
//         ncclCommSplit of contiguous ranks; a watchdog thread polls
//         ncclCommGetAsyncError and the pending collectives, and on an error
//         or a collective unfinished after comm_timeout_seconds() calls
//         ncclCommAbort and ends the job through host.abort(), naming the
//         rank and the collective. Needs one device per rank.
//   mpi:  each collective copies the device buffer to pinned host memory,
//         runs the host communicator's collective and copies back, on a
//         staging thread; wait() blocks the host. Several ranks may share one
//         device (tests; NCCL before 2.30 refuses that).
// Throws dlplan::Error for `nccl` in a build without NCCL.
std::unique_ptr<GpuCommunicator> make_gpu_communicator(GpuCommKind kind, std::unique_ptr<Communicator> host,
                                                       void* compute_stream = nullptr);

}  // namespace dlplan::exec
