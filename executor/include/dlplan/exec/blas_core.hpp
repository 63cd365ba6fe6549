// Which of OpenBLAS's kernel sets the CPU engine's GEMMs run on, and a better
// one where OpenBLAS fell back to a generic set.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels by the CPU's
// model number when it is loaded. A CPU newer than the library falls back to
// "Prescott", SSE3 kernels: OpenBLAS 0.3.21 (Debian 12) on an Emerald Rapids
// Xeon (family 6, model 207) ran a 512^3 SGEMM at 27 GFLOP/s on one core,
// 103 GFLOP/s with OPENBLAS_CORETYPE=SkylakeX (docs/cpu-engine.md, "OpenBLAS's
// kernels"). The choice is made before main, so dlplan restarts itself with
// the variable set.
#pragma once

#include <string>

namespace dlplan::exec {

struct BlasCore {
  std::string library;   // "OpenBLAS 0.3.21 ...", empty when the BLAS is not OpenBLAS
  std::string core;      // the kernel set in use ("SkylakeX")
  std::string fell_back; // what OpenBLAS chose alone, when dlplan asked for `core` instead ("Prescott")
};

BlasCore blas_core();

// One line for people: "OpenBLAS SkylakeX kernels (OpenBLAS took this CPU
// for Prescott; dlplan set OPENBLAS_CORETYPE)"; empty without OpenBLAS.
std::string describe(const BlasCore& b);

// When OpenBLAS runs a generic SSE kernel set on a CPU with AVX2/FMA or
// AVX-512 and nobody set OPENBLAS_CORETYPE: set it to the set those vectors
// allow and restart this program (execv of /proc/self/exe with `argv`).
// Returns when there is nothing to do or the restart failed. Call it first in
// main, before MPI or any thread starts; a user's OPENBLAS_CORETYPE (even
// "Prescott") is kept.
void restart_with_better_blas_core(char** argv);

}  // namespace dlplan::exec
