// The caching device memory resource (PyTorch CUDACachingAllocator manner).
// Its interface and the size-class rules are public, in
// dlplan/exec/cuda_runtime.hpp (CudaMemory, make_cuda_memory, cuda_round_size,
// cuda_segment_size, cuda_should_split); this header only gathers them for
// the files of this folder.
#pragma once

#include "dlplan/exec/cuda_runtime.hpp"
