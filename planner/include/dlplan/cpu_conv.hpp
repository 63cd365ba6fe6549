// Convolutions on the cpu device through oneDNN (Debian's libdnnl-dev, the
// library PyTorch's CPU convolutions use), and the buffers they need beside the
// op's own tensors, so that the planner declares exactly what the CPU engine
// allocates (docs/cpu-engine.md, "Convolutions").
//
// oneDNN's fast kernels want blocked layouts (nChw8c on AVX2) where dlplan's
// tensors are plain NCHW: a layer's input, output and weights are reordered
// into blocked copies around the convolution, and some kernels ask for a
// scratchpad whose size depends on the thread count. All of these are the
// buffers listed here; oneDNN is run in user-scratchpad mode, so it allocates
// nothing of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlplan {

struct Model;

// One conv2d as the CPU engine runs it: the whole micro-batch at once.
struct ConvGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0, O = 0, OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, groups = 1;
  bool bias = false;
  int64_t dh = 1, dw = 1;  // dilation
};

struct ConvBuffer {
  std::string what;   // "onednn.src", "onednn.scratchpad", ... (the temporary's name)
  int64_t bytes = 0;
};

// Built with oneDNN, and not turned off by DLPLAN_CPU_CONV=im2col (which keeps
// the im2col + OpenBLAS lowering, for comparison).
bool onednn_conv_enabled();

// A model of four or more conv2d nodes (a convolutional network), with
// oneDNN enabled: its fp32 cpu convolutions run through oneDNN, and the
// engine's loops between them on oneDNN's OpenMP team. A model with fewer
// (a ViT's patch embedding) keeps im2col + OpenBLAS, so that it never starts
// an OpenMP team: after each region libgomp's workers spin for a while
// before they sleep, and one spinning on a core the pool and OpenBLAS need
// slowed tiny-vit on one rank with two threads from 1.8 ms a step to 9 ms in
// 6 of 16 runs (docs/cpu-engine.md, "Threads inside a rank").
bool onednn_runs_convolutions(const Model& m);

// The threads one rank's kernels use: DLPLAN_CPU_THREADS, else
// OPENBLAS_NUM_THREADS or OMP_NUM_THREADS, else the cores in the affinity mask
// shared among `local_ranks` ranks. The CPU engine uses the same rule (and
// also honours a launcher's binding, which a plan cannot see).
int cpu_threads_per_rank(int local_ranks);

// The buffers forward (prop: training) and backward need, in allocation order;
// backward lists only what the gradients asked for need (dx: the input's,
// dw: the weight's). Nothing when oneDNN is not built or has no kernel for
// this convolution: it then keeps the im2col lowering.
std::optional<std::vector<ConvBuffer>> onednn_conv_forward_buffers(const ConvGeometry& g, int threads);
std::optional<std::vector<ConvBuffer>> onednn_conv_backward_buffers(const ConvGeometry& g, int threads, bool dx,
                                                                   bool dw);

}  // namespace dlplan
