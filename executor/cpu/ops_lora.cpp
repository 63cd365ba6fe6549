// LoRA adapters beside a projection (ops.hpp, LoraAdapter; Hu et al. 2021,
// Sec. 4.1), with x [R, in], A [r, in], B [out, r] and s = alpha / r:
//   forward:  xa = x A^T  [R, r] (kept for backward);  y += s xa B^T
//   backward: dB += s dy^T xa;  dxa = s dy B;  dA += dxa^T x;  dx += dxa A
// Used by linear (ops_dense.cpp) and attention's projections (ops_attention.cpp).
#include "cpu/ops.hpp"

namespace dlplan::exec::cpu {

void lora_forward(const float* x, const float* A, const float* B, float s, float* xa, float* y, int64_t R, int64_t in,
                  int64_t out, int64_t r) {
  gemm(false, true, R, r, in, 1.0f, x, in, A, in, 0.0f, xa, r);
  gemm(false, true, R, out, r, s, xa, r, B, r, 1.0f, y, out);
}

void lora_backward(const float* x, const float* A, const float* B, float s, const float* xa, const float* dy,
                   float* dxa, float* dA, float* dB, float* dx, int64_t R, int64_t in, int64_t out, int64_t r) {
  if (dB) gemm(true, false, out, r, R, s, dy, out, xa, r, 1.0f, dB, r);
  if (!dA && !dx) return;
  gemm(false, false, R, r, out, s, dy, out, B, r, 0.0f, dxa, r);
  if (dA) gemm(true, false, r, in, R, 1.0f, dxa, r, x, in, 1.0f, dA, in);
  if (dx) gemm(false, false, R, in, r, 1.0f, dxa, r, A, in, 1.0f, dx, in);
}

}  // namespace dlplan::exec::cpu
