// Device selection, the `runtime` measurement (DESIGN.md, "Memory
// categories") and small CUDA helpers.
#include "device.hpp"

#include "dlplan/error.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

namespace dlplan::exec {
namespace cudart {

std::string error_text(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return {};
  (void)cudaGetLastError();  // a non-sticky error would otherwise resurface in the next call
  int dev = -1;
  (void)cudaGetDevice(&dev);
  return std::string(what) + " failed on device " + std::to_string(dev) + ": " + cudaGetErrorName(rc) + " (" +
         cudaGetErrorString(rc) + ")";
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(error_text(rc, what));
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_ && previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace cudart

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: no CUDA device";
  return n;
}

int select_cuda_device(int local_rank) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) throw Error("no CUDA device for node-local rank " + std::to_string(local_rank) + ": " + why);
  const int d = std::max(local_rank, 0) % n;
  cudart::check(cudaSetDevice(d), "cudaSetDevice");
  cudart::check(cudaFree(nullptr), "creating the CUDA context (cudaFree(0))");  // the context exists from here
  return d;
}

int select_cuda_device(const Communicator& comm) {
  try {
    return select_cuda_device(comm.local_rank());
  } catch (const Error& e) {
    throw Error("rank " + std::to_string(comm.rank()) + ": " + e.what());
  }
}

CudaDeviceInfo cuda_device_info() {
  CudaDeviceInfo info;
  info.device = cudart::current_device();
  cudaDeviceProp prop{};
  cudart::check(cudaGetDeviceProperties(&prop, info.device), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  size_t free_b = 0, total_b = 0;
  cudart::check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  info.total_bytes = static_cast<int64_t>(total_b);
  info.free_bytes = static_cast<int64_t>(free_b);
  return info;
}

int64_t measure_runtime_bytes(const Allocator& alloc) { return alloc.memory().runtime_bytes(); }

void cuda_copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  cudart::check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault), "cudaMemcpy");
}

void cuda_device_synchronize() { cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void* cuda_create_stream() {
  cudaStream_t s = nullptr;
  cudart::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void cuda_destroy_stream(void* stream) {
  if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

}  // namespace dlplan::exec
