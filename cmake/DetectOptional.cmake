# Detects the optional back ends: CUDA (nvcc), NCCL, MPI and Qt 6.
# Nothing in planner/ uses them; the executor and GUI targets will, and a
# machine without any of them still builds and tests everything else.
include(CheckLanguage)

check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(DLPLAN_HAVE_CUDA ON)
else()
  set(DLPLAN_HAVE_CUDA OFF)
endif()

find_package(NCCL QUIET)
find_package(MPI QUIET COMPONENTS CXX)
# The GUI (gui/) needs Widgets, Charts, Svg (chart export) and Concurrent (the
# recompute worker); its QTest suites need Test.
find_package(Qt6 QUIET COMPONENTS Widgets Charts Svg Concurrent OPTIONAL_COMPONENTS Test)

function(dlplan_report what found detail)
  if(found)
    message(STATUS "dlplan: ${what}: found ${detail}")
  else()
    message(STATUS "dlplan: ${what}: not found (${detail})")
  endif()
endfunction()

dlplan_report("CUDA toolkit" "${DLPLAN_HAVE_CUDA}" "${CMAKE_CUDA_COMPILER}")
dlplan_report("NCCL" "${NCCL_FOUND}" "${NCCL_LIBRARY}")
dlplan_report("MPI" "${MPI_CXX_FOUND}" "${MPI_CXX_LIBRARIES}")
dlplan_report("Qt 6 Widgets+Charts+Svg" "${Qt6_FOUND}" "${Qt6_DIR}")
