// Embedding, pos_embedding, cls_token, select and tokens (executor/cpu/ops_dense.cpp).
#include "common.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <cstddef>

namespace dlplan::exec::cuda {
namespace {

// A bad id lowers *err (read as unsigned, all ones = none) to its row: the
// lowest bad row wins whatever the schedule, the row the CPU reports.
__global__ void embedding_fwd_k(const int32_t* ids, const float* w, float* y, int64_t rows, int64_t dim, int64_t num,
                                int* err) {
  DLPLAN_GRID_LOOP(i, rows * dim) {
    const int64_t r = i / dim, j = i - r * dim;
    const int32_t id = ids[r];
    if (id < 0 || id >= num) {
      if (j == 0) atomicMin(reinterpret_cast<unsigned*>(err), static_cast<unsigned>(r));
      y[i] = 0.0f;
      continue;
    }
    y[i] = w[int64_t{id} * dim + j];
  }
}

__global__ void iota_k(int32_t* p, int64_t n) { DLPLAN_GRID_LOOP(i, n) p[i] = static_cast<int32_t>(i); }

// Backward after a stable sort of (id, position) by id: block x = sorted index k,
// threads over columns. The block at the first k of each run of equal ids adds
// that run's dy rows, positions ascending, onto dw[id]: dw[id] + dy[r1] + dy[r2]
// + ..., the CPU's order, so bit-identical to it and run to run. Each dw row is
// written by one block (no atomics).
__global__ void embedding_bwd_k(const uint32_t* keys, const int32_t* pos, const float* dy, float* dw, int64_t rows,
                                int64_t dim) {
  const int64_t k = blockIdx.x;
  const uint32_t id = keys[k];
  if (k > 0 && keys[k - 1] == id) return;  // not the first of its run (block-uniform)
  const int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  float* out = dw + int64_t{id} * dim + j;
  float acc = *out;
  for (int64_t m = k; m < rows && keys[m] == id; ++m) acc += dy[int64_t{pos[m]} * dim + j];
  *out = acc;
}

// Scratch layout of embedding_backward: sorted ids [rows] u32, positions [rows]
// i32, sorted positions [rows] i32 (each 256-byte aligned), then CUB's storage.
size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }
int id_bits(int64_t num) {  // radix-sort only the bits an id below num can have
  int b = 1;
  while (b < 32 && (int64_t{1} << b) < num) ++b;
  return b;
}
size_t sort_bytes(int64_t rows, int64_t num) {
  size_t t = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, t, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows, 0,
                                  id_bits(num));
  return t;
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
size_t embedding_backward_scratch(int64_t rows, int64_t num) {
  if (rows <= 0) return 0;
  return 3 * align256(static_cast<size_t>(rows) * 4) + align256(sort_bytes(rows, num));
}
cudaError_t embedding_backward(const int32_t* ids, const float* dy, float* dw, int64_t rows, int64_t dim, int64_t num,
                               void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  if (rows > INT32_MAX || scratch_bytes < embedding_backward_scratch(rows, num)) return cudaErrorInvalidValue;
  const size_t part = align256(static_cast<size_t>(rows) * 4);
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<uint32_t*>(base);
  auto* pos = reinterpret_cast<int32_t*>(base + part);
  auto* sorted_pos = reinterpret_cast<int32_t*>(base + 2 * part);
  size_t temp_bytes = scratch_bytes - 3 * part;
  iota_k<<<blocks_for(rows), kThreads, 0, s>>>(pos, rows);
  // Ids were validated in [0, num) by the forward, so as u32 they sort as ids;
  // LSD radix sort is stable: positions stay ascending within an id.
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(base + 3 * part, temp_bytes,
                                                        reinterpret_cast<const uint32_t*>(ids), keys, pos, sorted_pos,
                                                        rows, 0, id_bits(num), s);
  if (e != cudaSuccess) return e;
  const int threads = dim >= kThreads ? kThreads : static_cast<int>((dim + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((dim + threads - 1) / threads));
  embedding_bwd_k<<<grid, threads, 0, s>>>(keys, sorted_pos, dy, dw, rows, dim);
  return cudaSuccess;
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
