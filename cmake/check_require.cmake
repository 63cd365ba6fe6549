# ctest build.require_parts: configures SOURCE into WORK/<case> three times.
#  1. every optional part left out, every DLPLAN_REQUIRE_* on: configure must
#     fail, and its message name each part (dlplan-gui, ONNX import, MPI
#     communicator, CUDA backend).
#  2. Qt6OpenGL hidden (the fresh-machine failure: Qt6Charts' CMake package
#     needs it) with DLPLAN_REQUIRE_GUI: must fail naming libqt6opengl6-dev.
#  3. control: every part left out, nothing required: configure succeeds and
#     the summary says NO for each part, with the reason.
function(configure name out_var rc_var)
  set(dir ${WORK}/${name})
  file(REMOVE_RECURSE ${dir})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${dir} -G ${GENERATOR}
                          -DDLPLAN_BUILD_TESTS=OFF -DDLPLAN_BUILD_BENCH=OFF ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  file(REMOVE_RECURSE ${dir})
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} ${rc} PARENT_SCOPE)
endfunction()

function(expect text what)
  string(FIND "${text}" "${what}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${what}' in:\n${text}")
  endif()
endfunction()

set(none -DDLPLAN_WITH_GUI=OFF -DDLPLAN_WITH_ONNX=OFF -DDLPLAN_WITH_MPI=OFF -DDLPLAN_WITH_CUDA=OFF)
configure(required out rc ${none} -DDLPLAN_REQUIRE_GUI=ON -DDLPLAN_REQUIRE_ONNX=ON -DDLPLAN_REQUIRE_MPI=ON
          -DDLPLAN_REQUIRE_CUDA=ON)
if(rc EQUAL 0)
  message(FATAL_ERROR "configure succeeded although required parts are missing:\n${out}")
endif()
expect("${out}" "required parts cannot be built")
foreach(part "dlplan-gui (Qt 6): DLPLAN_WITH_GUI=OFF" "ONNX import: DLPLAN_WITH_ONNX=OFF"
             "MPI communicator: DLPLAN_WITH_MPI=OFF" "CUDA backend: DLPLAN_WITH_CUDA=OFF")
  expect("${out}" "${part}")
endforeach()

configure(no-opengl out rc -DCMAKE_DISABLE_FIND_PACKAGE_Qt6OpenGL=ON -DDLPLAN_REQUIRE_GUI=ON
          -DDLPLAN_WITH_CUDA=OFF)
if(rc EQUAL 0)
  message(FATAL_ERROR "configure succeeded without Qt6OpenGL although the GUI is required:\n${out}")
endif()
expect("${out}" "libqt6opengl6-dev")
expect("${out}" "DLPLAN_REQUIRE_GUI=ON")

configure(optional out rc ${none})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure without the optional parts failed:\n${out}")
endif()
expect("${out}" "dlplan build summary")
foreach(part "dlplan-gui (Qt 6)             NO   DLPLAN_WITH_GUI=OFF" "ONNX import                   NO"
             "MPI communicator              NO" "CUDA backend                  NO"
             "dlplan (planner + CLI)        yes")
  expect("${out}" "${part}")
endforeach()
message(STATUS "required parts refused when missing; optional parts left out cleanly")
