// The optimizer's fused update over a flat shard, and the gradient
// sum-of-squares for the global-norm clip. Per element in double, exactly as
// executor/src/optimizer.cpp: kind 0 AdamW (decoupled decay, then Adam with
// bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t), 1 SGD, 2 SGD with
// momentum. `clip` scales the gradient, `wd` is 0 for a no-decay segment.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void step_k(int kind, float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1,
                       double beta2, double eps, double bc1, double bc2, double wd, double momentum, double clip) {
  DLPLAN_GRID_LOOP(e, n) {
    const double grad = g[e] * clip;
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
  }
}

__global__ void sumsq_k(const float* x, int64_t n, double* out) {
  __shared__ double scratch[32];
  double acc = 0;
  DLPLAN_GRID_LOOP(i, n) acc += static_cast<double>(x[i]) * x[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

}  // namespace

void optimizer_step(int kind, float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1,
                    double beta2, double eps, double bc1, double bc2, double wd, double momentum, double clip,
                    cudaStream_t s) {
  if (n > 0)
    step_k<<<blocks_for(n), kThreads, 0, s>>>(kind, p, g, m, v, n, lr, beta1, beta2, eps, bc1, bc2, wd, momentum, clip);
}

void sum_of_squares(const float* x, int64_t n, double* out, cudaStream_t s) {
  if (n <= 0) return;
  unsigned blocks = blocks_for(n);
  if (blocks > 1024) blocks = 1024;
  sumsq_k<<<blocks, kThreads, 0, s>>>(x, n, out);
}

}  // namespace dlplan::exec::cuda
