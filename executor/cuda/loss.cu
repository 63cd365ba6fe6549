// Softmax cross-entropy (executor/cpu/ops_loss.cpp): one block a row computes
// the probabilities (saved, fp32) or, fused, the row's log-sum-exp, and the
// row's loss in double; one block then sums the rows in a fixed order
// (deterministic) into the scalar mean.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void ce_fwd_k(const float* logits, const int32_t* targets, float* probs, float* lse, double* row_loss,
                         int64_t K, int* err) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * K;
  float* p = probs ? probs + r * K : nullptr;
  const int32_t t = targets[r];
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, fscratch);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    const float e = expf(z[j] - mx);
    if (p) p[j] = e;
    sum += e;
  }
  sum = block_sum(sum, dscratch);
  const float inv = static_cast<float>(1.0 / sum);
  if (p)
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) {
    if (lse) lse[r] = static_cast<float>(mx + log(sum));
    if (t < 0 || t >= K) {
      atomicMin(reinterpret_cast<unsigned*>(err), static_cast<unsigned>(r));  // lowest bad row wins, as the CPU
      row_loss[r] = 0;
    } else {
      row_loss[r] = log(sum) + mx - z[t];
    }
  }
}

__global__ void ce_mean_k(const double* row_loss, float* out, int64_t R) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) acc += row_loss[r];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / static_cast<double>(R));
}

__global__ void ce_bwd_k(const float* probs, const float* logits, const float* lse, const int32_t* targets,
                         const float* dout, double grad_scale, float* dz, int64_t R, int64_t K) {
  const float k = static_cast<float>(grad_scale * double{dout[0]} / static_cast<double>(R));
  DLPLAN_GRID_LOOP(i, R * K) {
    const int64_t r = i / K, j = i - r * K;
    const float p = probs ? probs[i] : expf(logits[i] - lse[r]);
    float v = dz[i] + k * p;
    if (j == targets[r]) v -= k;
    dz[i] = v;
  }
}

}  // namespace

void cross_entropy_forward(const float* logits, const int32_t* targets, float* probs, float* lse, double* row_loss,
                           float* out, int64_t R, int64_t K, int* err, cudaStream_t s) {
  if (R <= 0) return;
  ce_fwd_k<<<static_cast<unsigned>(R), kThreads, 0, s>>>(logits, targets, probs, lse, row_loss, K, err);
  ce_mean_k<<<1, 1024, 0, s>>>(row_loss, out, R);
}

void cross_entropy_backward(const float* probs, const float* logits, const float* lse, const int32_t* targets,
                            const float* dout, double grad_scale, float* dz, int64_t R, int64_t K, cudaStream_t s) {
  if (R * K > 0)
    ce_bwd_k<<<blocks_for(R * K), kThreads, 0, s>>>(probs, logits, lse, targets, dout, grad_scale, dz, R, K);
}

}  // namespace dlplan::exec::cuda
