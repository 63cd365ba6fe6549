// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy
// as 1, 2, 3", SC'11; constants as Random123's philox.h) and dropout's uniform.
//
// Dropout, identically on every backend (DESIGN.md, "Determinism"):
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (element index low 32 bits, global sample index, node index,
//              element index high 32 bits)
//   u       = float(out[0]) * 2^-32   (round-to-nearest conversion, in float)
// An element is dropped where u < float(p); kept ones are multiplied by
// float(1 / (1 - p)). The element index is the position inside one sample's
// tensor (attention: inside its [heads, T, T] probabilities).
#include "dlplan/exec/backend.hpp"

namespace dlplan::exec {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
}  // namespace

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * c0, p1 = uint64_t{kM1} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

float dropout_uniform(uint64_t seed, int node_index, int64_t sample, int64_t element) {
  const uint64_t e = static_cast<uint64_t>(element);
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t counter[4] = {static_cast<uint32_t>(e), static_cast<uint32_t>(sample),
                               static_cast<uint32_t>(node_index), static_cast<uint32_t>(e >> 32)};
  uint32_t out[4];
  philox4x32_10(counter, key, out);
  return static_cast<float>(out[0]) * 0x1p-32f;
}

}  // namespace dlplan::exec
