// Internal helpers of the CUDA runtime pieces (device.cpp, cuda_memory.cpp,
// nccl_communicator.cpp): error checks that name the call and the device, and
// a guard that makes a device current for a scope. The public API is
// dlplan/exec/cuda_runtime.hpp.
#pragma once

#include "dlplan/exec/cuda_runtime.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace dlplan::exec::cudart {

// Throws dlplan::Error "<what> failed on device D: <CUDA's message>" unless ok.
void check(cudaError_t rc, const char* what);
// The same, as text (for abort messages); "" when ok. Clears the sticky-less error.
std::string error_text(cudaError_t rc, const char* what);

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

int current_device();

}  // namespace dlplan::exec::cudart
