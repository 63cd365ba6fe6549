// oneDNN's primitive descriptors for one conv2d (cpu_conv.hpp says why), made
// in one place for the planner, which sizes their buffers, and the CPU engine,
// which runs them. Only with oneDNN (DLPLAN_HAVE_ONEDNN).
#pragma once

#ifdef DLPLAN_HAVE_ONEDNN
#include "dlplan/cpu_conv.hpp"

#include <oneapi/dnnl/dnnl.hpp>

namespace dlplan::onednn {

dnnl::engine& cpu_engine();

struct ConvPrimitives {
  // dlplan's own layouts: NCHW activations, [O, C/g, kh, kw] weights.
  dnnl::memory::desc src, weights, bias, dst;
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;        // when dx was asked for
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;  // when dw was asked for
};

// Sets the calling thread's OpenMP thread count to `threads` and leaves it so:
// oneDNN sizes a kernel's scratchpad for the threads it will run on.
ConvPrimitives make_conv(const ConvGeometry& g, int threads, bool dx, bool dw);

}  // namespace dlplan::onednn
#endif
