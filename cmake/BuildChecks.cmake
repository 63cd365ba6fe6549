# ctest checks of the build itself (included from the top-level CMakeLists):
#   build.require_parts  configure refuses, naming the part and the package,
#                        when a DLPLAN_REQUIRE_<PART> part cannot be built
#                        (CI's guarantee), and builds without them otherwise
#   build.install        `cmake --install` lays out the executables, the zoo,
#                        the docs, the completions and the man page, and they work
add_test(NAME build.require_parts
  COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DWORK=${CMAKE_BINARY_DIR}/build-checks
          -DGENERATOR=${CMAKE_GENERATOR} -P ${PROJECT_SOURCE_DIR}/cmake/check_require.cmake)
set_tests_properties(build.require_parts PROPERTIES TIMEOUT 600)

add_test(NAME build.install
  COMMAND ${CMAKE_COMMAND} -DBUILD=${CMAKE_BINARY_DIR} -DPREFIX=${CMAKE_BINARY_DIR}/install-check
          -DGUI=$<TARGET_EXISTS:dlplan-gui> -P ${PROJECT_SOURCE_DIR}/cmake/check_install.cmake)
set_tests_properties(build.install PROPERTIES TIMEOUT 300)
