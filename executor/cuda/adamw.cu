// The optimizer's fused update over a flat shard, and the gradient
// sum-of-squares for the global-norm clip (in a fixed order: deterministic).
// Per element in double, exactly as executor/src/optimizer.cpp: kind 0 AdamW
// (decoupled decay, then Adam with bias corrections bc1 = 1 - beta1^t,
// bc2 = 1 - beta2^t), 1 SGD, 2 SGD with momentum. `clip` scales the gradient,
// `wd` is 0 for a no-decay segment.
#include "common.cuh"

#include <map>
#include <mutex>
#include <utility>

namespace dlplan::exec::cuda {
namespace {

// p: the fp32 weights updated (the parameters, or their master copy); out:
// where the model reads them (null when p is the parameters; else the 16-bit
// parameters, stored as the gradients are).
template <typename G>
__global__ void step_k(int kind, float* p, const G* g, float* m, float* v, G* out, int64_t n, double lr,
                       double beta1, double beta2, double eps, double bc1, double bc2, double wd, double momentum,
                       double clip) {
  DLPLAN_GRID_LOOP(e, n) {
    const double grad = static_cast<double>(ld(g, e)) * clip;
    if (kind == 0) {
      double w = p[e] * (1.0 - lr * wd);
      const float me = static_cast<float>(beta1 * m[e] + (1 - beta1) * grad);
      const float ve = static_cast<float>(beta2 * v[e] + (1 - beta2) * grad * grad);
      m[e] = me;
      v[e] = ve;
      w -= lr * (me / bc1) / (sqrt(ve / bc2) + eps);
      p[e] = static_cast<float>(w);
    } else if (kind == 1) {
      p[e] = static_cast<float>(p[e] - lr * (grad + wd * p[e]));
    } else {
      const float me = static_cast<float>(momentum * m[e] + grad + wd * p[e]);
      m[e] = me;
      p[e] = static_cast<float>(p[e] - lr * me);
    }
    if (out) st(out, e, p[e]);
  }
}

// Sum of squares in a fixed order (no atomics): block b writes its partial
// (each thread's grid-stride elements in order, then block_sum's fixed tree) to
// partials[b]; one block then adds the partials (thread t: t, t + 256, ...; a
// fixed tree) onto *out. The order depends on n only.
constexpr unsigned kMaxPartials = 1024;

template <typename T>
__global__ void sumsq_partial_k(const T* x, int64_t n, double* partials) {
  __shared__ double scratch[32];
  double acc = 0;
  DLPLAN_GRID_LOOP(i, n) {
    const double xi = ld(x, i);
    acc += xi * xi;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sumsq_final_k(const double* partials, unsigned count, double* out) {
  __shared__ double scratch[32];
  double acc = 0;
  for (unsigned b = threadIdx.x; b < count; b += blockDim.x) acc += partials[b];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out += acc;
}

// The partials buffer: kMaxPartials doubles (8 KiB) per (device, stream), so that
// streams running at once never share one. Runtime memory: cudaMalloc'd once,
// lazily, never freed (outside the Allocator's accounting, as cuBLAS's workspace).
// Null (with cudaGetLastError holding the error) if the allocation fails.
double* partials_buffer(cudaStream_t s) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, double*> buffers;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  const std::lock_guard<std::mutex> lock(mu);
  double*& p = buffers[{dev, s}];
  if (!p && cudaMalloc(reinterpret_cast<void**>(&p), kMaxPartials * sizeof(double)) != cudaSuccess) p = nullptr;
  return p;
}

}  // namespace

void optimizer_step(int kind, float* p, const void* g, Store store, void* half_params, float* m, float* v,
                    int64_t n, double lr, double beta1, double beta2, double eps, double bc1, double bc2, double wd,
                    double momentum, double clip, cudaStream_t s) {
  if (n <= 0) return;
  with_store(store, [&](auto tag) {
    using T = typename decltype(tag)::type;
    step_k<<<blocks_for(n), kThreads, 0, s>>>(kind, p, static_cast<const T*>(g), m, v, static_cast<T*>(half_params), n,
                                              lr, beta1, beta2, eps, bc1, bc2, wd, momentum, clip);
  });
}

void sum_of_squares(const void* x, Store store, int64_t n, double* out, cudaStream_t s) {
  if (n <= 0) return;
  double* partials = partials_buffer(s);
  if (!partials) return;  // the caller's cudaGetLastError() reports it
  unsigned blocks = blocks_for(n);
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  with_store(store, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sumsq_partial_k<<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), n, partials);
  });
  sumsq_final_k<<<1, kThreads, 0, s>>>(partials, blocks, out);
}

}  // namespace dlplan::exec::cuda
