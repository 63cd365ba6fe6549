// dlplan train runs OpenBLAS's kernels for the vectors this CPU has
// (exec/blas_core.hpp): where OpenBLAS falls back to an SSE-only set for a
// CPU it does not know (Debian's 0.3.21 on an Emerald Rapids Xeon chose
// Prescott), dlplan restarts with OPENBLAS_CORETYPE set. The CPU's vectors
// come from the compiler's cpuid query here, not from dlplan.
#include "cli_helpers.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <strings.h>

using namespace cli_test;

namespace {

bool is_sse_only(const std::string& core) {
  constexpr std::array kSseOnly{"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                "Katmai",   "Coppermine", "Northwood", "Banias"};
  for (const char* name : kSseOnly)
    if (strcasecmp(core.c_str(), name) == 0) return true;
  return false;
}

// The kernel set the train header names ("GEMMs on OpenBLAS SkylakeX
// kernels ..."), the whole line in `line`; empty when the BLAS is not OpenBLAS.
std::string kernels_of(const Result& r, std::string* line) {
  static const std::regex header(R"(^GEMMs on OpenBLAS (\S+) kernels.*$)");
  for (const std::string& l : lines(r.out)) {
    std::smatch m;
    if (std::regex_match(l, m, header)) {
      *line = l;
      return m[1];
    }
  }
  return {};
}

TEST(CliBlasKernels, TrainRunsTheKernelsThisCpusVectorsAllow) {
  const std::string plan = temp_path("blas_plan.json");
  ASSERT_EQ(run("--model tiny-mlp --gpus 1 --gpu cpu --out '" + plan + "'").status, 0);
  std::string line;
  const Result own = run("train --plan '" + plan + "' --steps 1", "env -u OPENBLAS_CORETYPE -u DLPLAN_BLAS_FELL_BACK");
  ASSERT_EQ(own.status, 0) << own.err;
  const std::string core = kernels_of(own, &line);
  if (core.empty()) {
    std::remove(plan.c_str());
    GTEST_SKIP() << "the BLAS is not OpenBLAS: " << own.out;
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_FALSE(is_sse_only(core)) << line;
  }
  if (contains(line, "dlplan set OPENBLAS_CORETYPE")) {
    EXPECT_TRUE(core == "SkylakeX" || core == "Haswell") << line;
  }

  // A user's choice stays, even an SSE-only one.
  const Result chosen = run("train --plan '" + plan + "' --steps 1", "OPENBLAS_CORETYPE=Prescott");
  ASSERT_EQ(chosen.status, 0) << chosen.err;
  EXPECT_EQ(kernels_of(chosen, &line), "Prescott");
  EXPECT_FALSE(contains(line, "dlplan set")) << line;
  std::remove(plan.c_str());
}

}  // namespace
