// Embedding, pos_embedding, cls_token, select and tokens (executor/cpu/ops_dense.cpp).
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void embedding_fwd_k(const int32_t* ids, const float* w, float* y, int64_t rows, int64_t dim, int64_t num,
                                int* err) {
  DLPLAN_GRID_LOOP(i, rows * dim) {
    const int64_t r = i / dim, j = i - r * dim;
    const int32_t id = ids[r];
    if (id < 0 || id >= num) {
      if (j == 0) atomicCAS(err, 0, static_cast<int>(r) + 1);
      y[i] = 0.0f;
      continue;
    }
    y[i] = w[int64_t{id} * dim + j];
  }
}

__global__ void embedding_bwd_k(const int32_t* ids, const float* dy, float* dw, int64_t rows, int64_t dim) {
  DLPLAN_GRID_LOOP(i, rows * dim) {
    const int64_t r = i / dim, j = i - r * dim;
    atomicAdd(dw + int64_t{ids[r]} * dim + j, dy[i]);
  }
}

__global__ void pos_fwd_k(const float* x, const float* w, float* y, int64_t batch, int64_t per) {
  DLPLAN_GRID_LOOP(i, batch * per) y[i] = x[i] + w[i % per];
}

// dw[i] += sum_s dy[s, i] (thread per element, sum over the batch in order).
__global__ void batch_sum_k(const float* dy, float* dw, int64_t batch, int64_t per) {
  DLPLAN_GRID_LOOP(i, per) {
    float acc = dw[i];
    for (int64_t s = 0; s < batch; ++s) acc += dy[s * per + i];
    dw[i] = acc;
  }
}

__global__ void cls_fwd_k(const float* x, const float* w, float* y, int64_t batch, int64_t T, int64_t D) {
  DLPLAN_GRID_LOOP(i, batch * (T + 1) * D) {
    const int64_t s = i / ((T + 1) * D), rem = i - s * (T + 1) * D;
    y[i] = rem < D ? w[rem] : x[s * T * D + rem - D];
  }
}

__global__ void cls_dx_k(const float* dy, float* dx, int64_t batch, int64_t T, int64_t D) {
  DLPLAN_GRID_LOOP(i, batch * T * D) {
    const int64_t s = i / (T * D), rem = i - s * T * D;
    dx[i] += dy[s * (T + 1) * D + D + rem];
  }
}

__global__ void cls_dw_k(const float* dy, float* dw, int64_t batch, int64_t T, int64_t D) {
  DLPLAN_GRID_LOOP(j, D) {
    float acc = dw[j];
    for (int64_t s = 0; s < batch; ++s) acc += dy[s * (T + 1) * D + j];
    dw[j] = acc;
  }
}

__global__ void select_fwd_k(const float* x, float* y, int64_t batch, int64_t T, int64_t D, int64_t idx) {
  DLPLAN_GRID_LOOP(i, batch * D) {
    const int64_t s = i / D, j = i - s * D;
    y[i] = x[(s * T + idx) * D + j];
  }
}

__global__ void select_bwd_k(const float* dy, float* dx, int64_t batch, int64_t T, int64_t D, int64_t idx) {
  DLPLAN_GRID_LOOP(i, batch * D) {
    const int64_t s = i / D, j = i - s * D;
    dx[(s * T + idx) * D + j] += dy[i];
  }
}

// y[s, p, c] = x[s, c, p]; thread per output element.
__global__ void tokens_fwd_k(const float* x, float* y, int64_t batch, int64_t C, int64_t P) {
  DLPLAN_GRID_LOOP(i, batch * C * P) {
    const int64_t s = i / (C * P), rem = i - s * C * P, p = rem / C, c = rem - p * C;
    y[i] = x[s * C * P + c * P + p];
  }
}

// dx[s, c, p] += dy[s, p, c]; thread per input element.
__global__ void tokens_bwd_k(const float* dy, float* dx, int64_t batch, int64_t C, int64_t P) {
  DLPLAN_GRID_LOOP(i, batch * C * P) {
    const int64_t s = i / (C * P), rem = i - s * C * P, c = rem / P, p = rem - c * P;
    dx[i] += dy[s * C * P + p * C + c];
  }
}

}  // namespace

void embedding_forward(const int32_t* ids, const float* w, float* y, int64_t rows, int64_t dim, int64_t num, int* err,
                       cudaStream_t s) {
  if (rows * dim > 0) embedding_fwd_k<<<blocks_for(rows * dim), kThreads, 0, s>>>(ids, w, y, rows, dim, num, err);
}
void embedding_backward(const int32_t* ids, const float* dy, float* dw, int64_t rows, int64_t dim, cudaStream_t s) {
  if (rows * dim > 0) embedding_bwd_k<<<blocks_for(rows * dim), kThreads, 0, s>>>(ids, dy, dw, rows, dim);
}
void pos_embedding_forward(const float* x, const float* w, float* y, int64_t batch, int64_t per, cudaStream_t s) {
  if (batch * per > 0) pos_fwd_k<<<blocks_for(batch * per), kThreads, 0, s>>>(x, w, y, batch, per);
}
void batch_sum_add(const float* dy, float* dw, int64_t batch, int64_t per, cudaStream_t s) {
  if (per > 0) batch_sum_k<<<blocks_for(per), kThreads, 0, s>>>(dy, dw, batch, per);
}
void cls_token_forward(const float* x, const float* w, float* y, int64_t batch, int64_t T, int64_t D, cudaStream_t s) {
  if (D > 0) cls_fwd_k<<<blocks_for(batch * (T + 1) * D), kThreads, 0, s>>>(x, w, y, batch, T, D);
}
void cls_token_backward(const float* dy, float* dw, float* dx, int64_t batch, int64_t T, int64_t D, cudaStream_t s) {
  if (D <= 0) return;
  cls_dw_k<<<blocks_for(D), kThreads, 0, s>>>(dy, dw, batch, T, D);
  if (dx && T > 0) cls_dx_k<<<blocks_for(batch * T * D), kThreads, 0, s>>>(dy, dx, batch, T, D);
}
void select_forward(const float* x, float* y, int64_t batch, int64_t T, int64_t D, int64_t index, cudaStream_t s) {
  if (batch * D > 0) select_fwd_k<<<blocks_for(batch * D), kThreads, 0, s>>>(x, y, batch, T, D, index);
}
void select_backward(const float* dy, float* dx, int64_t batch, int64_t T, int64_t D, int64_t index, cudaStream_t s) {
  if (batch * D > 0) select_bwd_k<<<blocks_for(batch * D), kThreads, 0, s>>>(dy, dx, batch, T, D, index);
}
void tokens_forward(const float* x, float* y, int64_t batch, int64_t C, int64_t P, cudaStream_t s) {
  if (batch * C * P > 0) tokens_fwd_k<<<blocks_for(batch * C * P), kThreads, 0, s>>>(x, y, batch, C, P);
}
void tokens_backward(const float* dy, float* dx, int64_t batch, int64_t C, int64_t P, cudaStream_t s) {
  if (batch * C * P > 0) tokens_bwd_k<<<blocks_for(batch * C * P), kThreads, 0, s>>>(dy, dx, batch, C, P);
}

}  // namespace dlplan::exec::cuda
