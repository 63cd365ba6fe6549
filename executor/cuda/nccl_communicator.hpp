// The GPU communicators behind make_gpu_communicator()
// (dlplan/exec/cuda_runtime.hpp): NCCL (when built with it, DLPLAN_HAVE_NCCL)
// and the host-staged MPI adapter.
#pragma once

#include "dlplan/exec/cuda_runtime.hpp"

#include <memory>

namespace dlplan::exec::cudart {

// Takes over `host`; the current device is the one used.
std::unique_ptr<GpuCommunicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                          void* compute_stream);
#if defined(DLPLAN_HAVE_NCCL)
std::unique_ptr<GpuCommunicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                        void* compute_stream);
#endif

}  // namespace dlplan::exec::cudart
