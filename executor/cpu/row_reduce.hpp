// Reductions over one row, written so that their loops vectorize and their
// order of addition depends on the row's length only: a kernel that calls
// them gives the same bits with any number of threads. Batch norm's sums,
// softmax rows (attention's probabilities, cross-entropy) and attention's
// backward dot product use them.
#pragma once

#include <cstdint>

namespace dlplan::exec::cpu {

// sum over i < n of term(i), in double, over 8 lanes: lane j takes the terms
// j, j + 8, j + 16, ..., and the lanes are added in a fixed tree at the end.
// One running sum is a chain of dependent additions that no compiler may
// reorder; 8 independent ones vectorize.
template <class Term>
double lane_sum(int64_t n, const Term& term) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += term(i + j);
  for (int j = 0; i < n; ++i, ++j) lane[j] += term(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The largest of x[0..n), n >= 1 (a NaN may be skipped: the exp of the row
// then carries it into the sum).
float row_max(const float* x, int64_t n);

// out[j] = e^(x[j] - shift) for j < n (out may be x). The exp is
// vec_math.hpp's (within 2 ulp of libm's); arguments below -87 give 0, as
// e^-inf does, where libm would give a subnormal below 1.7e-38.
void exp_shifted(const float* x, float shift, float* out, int64_t n);

// exp_shifted, returning the sum of the out[j] (lane_sum): a softmax row's
// denominator.
double exp_shifted_sum(const float* x, float shift, float* out, int64_t n);

}  // namespace dlplan::exec::cpu
