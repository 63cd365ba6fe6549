// OpenBLAS's kernel set, and the restart with a better one (blas_core.hpp).
#include "dlplan/exec/blas_core.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <strings.h>

// OpenBLAS's own queries (openblas_config.h). Weak: another BLAS lacks them.
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" char* openblas_get_config(void) __attribute__((weak));

namespace dlplan::exec {
namespace {

// Set in the restarted program: what OpenBLAS chose before dlplan asked.
constexpr const char* kFellBackVariable = "DLPLAN_BLAS_FELL_BACK";

// OpenBLAS's kernel sets that use no AVX (its dynamic.c names), which it
// also falls back to for a CPU it does not know.
bool is_sse_only(const std::string& core) {
  constexpr std::array kSseOnly{"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                "Katmai",   "Coppermine", "Northwood", "Banias"};
  for (const char* name : kSseOnly)
    if (strcasecmp(core.c_str(), name) == 0) return true;
  return false;
}

// The widest of OpenBLAS's x86 kernel sets this CPU runs.
std::string widest_core_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return {};
}

}  // namespace

BlasCore blas_core() {
  BlasCore b;
  if (!openblas_get_corename || !openblas_get_config) return b;
  b.library = openblas_get_config();
  b.core = openblas_get_corename();
  const char* before = std::getenv(kFellBackVariable);
  if (before && std::getenv("OPENBLAS_CORETYPE")) b.fell_back = before;
  return b;
}

std::string describe(const BlasCore& b) {
  if (b.library.empty()) return {};
  if (b.fell_back.empty()) return fmt::format("OpenBLAS {} kernels", b.core);
  return fmt::format("OpenBLAS {} kernels (OpenBLAS took this CPU for {}; dlplan set OPENBLAS_CORETYPE)", b.core,
                     b.fell_back);
}

void restart_with_better_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv(kFellBackVariable)) return;  // the user's choice, or done
  const BlasCore now = blas_core();
  if (now.library.empty() || !is_sse_only(now.core)) return;
  const std::string better = widest_core_for_this_cpu();
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv(kFellBackVariable, now.core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // The restart failed: go on with OpenBLAS's own choice, and say nothing of ours.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kFellBackVariable);
}

}  // namespace dlplan::exec
