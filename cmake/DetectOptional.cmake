# Detects the optional parts' dependencies: CUDA (nvcc), NCCL, MPI and Qt 6.
# Nothing in planner/ uses them; the executor and GUI targets do, and a
# machine without any of them still builds and tests everything else.
#
# DLPLAN_WITH_<PART>=OFF leaves a part out even when its dependencies are
# there; DLPLAN_REQUIRE_<PART>=ON makes a part that cannot be built a
# configure error (CI turns every one on, .ci/run). cmake/Summary.cmake
# prints what is built and why not, and enforces the REQUIRE options.
# (ONNX import is detected in planner/CMakeLists.txt: DLPLAN_WITH_ONNX.)
include(CheckLanguage)

option(DLPLAN_WITH_CUDA "Build the CUDA backend when the CUDA toolkit is found" ON)
option(DLPLAN_WITH_MPI "Build the MPI communicator when MPI is found" ON)
option(DLPLAN_WITH_GUI "Build dlplan-gui when Qt 6 is found" ON)
option(DLPLAN_REQUIRE_CUDA "Fail configure when the CUDA backend cannot be built" OFF)
option(DLPLAN_REQUIRE_MPI "Fail configure when the MPI communicator cannot be built" OFF)
option(DLPLAN_REQUIRE_GUI "Fail configure when dlplan-gui or its tests cannot be built" OFF)
option(DLPLAN_REQUIRE_ONNX "Fail configure when ONNX import cannot be built" OFF)
option(DLPLAN_REQUIRE_ONEDNN "Fail configure when the CPU engine cannot use oneDNN for convolutions" OFF)

# ---- CUDA -------------------------------------------------------------------
set(DLPLAN_HAVE_CUDA OFF)
set(DLPLAN_CUDA_WHY "")
if(DLPLAN_WITH_CUDA)
  # The toolkit's default place, for machines where it is not on PATH (CI's:
  # nvcc in /usr/local/cuda/bin). CUDACXX or -DCMAKE_CUDA_COMPILER still win.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_dlplan_nvcc_on_path nvcc)
    if(NOT _dlplan_nvcc_on_path)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(DLPLAN_HAVE_CUDA ON)
  else()
    set(DLPLAN_CUDA_WHY "no CUDA compiler: nvcc is neither on PATH nor in /usr/local/cuda/bin (install the CUDA toolkit or set CUDACXX)")
  endif()
else()
  set(DLPLAN_CUDA_WHY "DLPLAN_WITH_CUDA=OFF")
endif()
if(DLPLAN_HAVE_CUDA)
  find_package(NCCL QUIET)
endif()

# ---- MPI --------------------------------------------------------------------
set(DLPLAN_MPI_WHY "")
if(DLPLAN_WITH_MPI)
  find_package(MPI QUIET COMPONENTS CXX)
  if(NOT MPI_CXX_FOUND)
    set(DLPLAN_MPI_WHY "MPI (C++) not found (Debian: libopenmpi-dev openmpi-bin)")
  endif()
else()
  set(MPI_CXX_FOUND FALSE)
  set(DLPLAN_MPI_WHY "DLPLAN_WITH_MPI=OFF")
endif()

# ---- Qt 6 -------------------------------------------------------------------
# The GUI (gui/) needs Widgets, Charts, Svg (chart export) and Concurrent (the
# recompute worker); its QTest suites need Test. Each missing component is
# named with the Debian package that provides it.
set(DLPLAN_HAVE_GUI OFF)
set(DLPLAN_GUI_WHY "")
if(DLPLAN_WITH_GUI)
  find_package(Qt6 QUIET COMPONENTS Widgets Charts Svg Concurrent OPTIONAL_COMPONENTS Test)
  set(_dlplan_qt_packages
    Widgets "qt6-base-dev" Charts "qt6-charts-dev and libqt6opengl6-dev (Qt6Charts' CMake package needs Qt6OpenGL)"
    Svg "qt6-svg-dev" Concurrent "qt6-base-dev" Test "qt6-base-dev")
  set(_dlplan_qt_missing "")
  foreach(_comp Widgets Charts Svg Concurrent)
    if(NOT Qt6${_comp}_FOUND)
      list(FIND _dlplan_qt_packages ${_comp} _i)
      math(EXPR _i "${_i} + 1")
      list(GET _dlplan_qt_packages ${_i} _pkg)
      list(APPEND _dlplan_qt_missing "Qt6${_comp} (Debian: ${_pkg})")
    endif()
  endforeach()
  if(_dlplan_qt_missing)
    list(JOIN _dlplan_qt_missing ", " _dlplan_qt_missing)
    set(DLPLAN_GUI_WHY "missing ${_dlplan_qt_missing}")
  else()
    set(DLPLAN_HAVE_GUI ON)
    if(NOT TARGET Qt6::Test)
      set(DLPLAN_GUI_WHY "its QTest suites are not built: Qt6Test not found (Debian: qt6-base-dev)")
    endif()
  endif()
else()
  set(DLPLAN_GUI_WHY "DLPLAN_WITH_GUI=OFF")
endif()

# One line per dependency as it is detected (scripts/gpu-check looks for
# "dlplan: CUDA toolkit: found"); the summary at the end says what is built.
function(dlplan_report what found where why)
  if(found)
    message(STATUS "dlplan: ${what}: found ${where}")
  else()
    message(STATUS "dlplan: ${what}: not found (${why})")
  endif()
endfunction()

dlplan_report("CUDA toolkit" "${DLPLAN_HAVE_CUDA}" "${CMAKE_CUDA_COMPILER}" "${DLPLAN_CUDA_WHY}")
if(DLPLAN_HAVE_CUDA)
  dlplan_report("NCCL" "${NCCL_FOUND}" "${NCCL_LIBRARY}" "no nccl.h / libnccl")
endif()
dlplan_report("MPI" "${MPI_CXX_FOUND}" "${MPI_CXX_LIBRARIES}" "${DLPLAN_MPI_WHY}")
dlplan_report("Qt 6 Widgets+Charts+Svg" "${DLPLAN_HAVE_GUI}" "${Qt6_DIR}" "${DLPLAN_GUI_WHY}")
