# CMake script (cmake -P): install a built xquant tree and build + run a tiny project against it.
#
#   cmake -DSOURCE_DIR=<xquant source> -DBINARY_DIR=<xquant build dir> -DWORK_DIR=<scratch dir>
#         -P tests/consumer/run_consumer_test.cmake
#
# Steps: remove WORK_DIR; cmake --install BINARY_DIR into WORK_DIR/prefix; configure
# SOURCE_DIR/tests/consumer into WORK_DIR/build with CMAKE_PREFIX_PATH=WORK_DIR/prefix, the generator,
# compiler, build type and flags of BINARY_DIR (so that a sanitizer build links its consumer with the same
# runtime); build it; run it. Any failing step stops with FATAL_ERROR and that step's output.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS SOURCE_DIR BINARY_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer: pass -D${var}=...")
  endif()
endforeach()
if(NOT EXISTS "${BINARY_DIR}/CMakeCache.txt")
  message(FATAL_ERROR "install_consumer: ${BINARY_DIR} is not a configured build tree")
endif()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")

# run_step(<name> <command...>): run, echo the command, stop with its output if it fails.
function(run_step name)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "install_consumer: ${name}: ${shown}")
  execute_process(COMMAND ${ARGN}
                  RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)  # same variable: stdout and stderr merged in order
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "install_consumer: step '${name}' failed (${rc}):\n${shown}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Settings of the library's build tree that the consumer must share.
load_cache("${BINARY_DIR}" READ_WITH_PREFIX XQ_
           CMAKE_GENERATOR CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE
           CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS)

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# 1. Install.
run_step(install "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${prefix}")

# 2. Configure the consumer against the installed tree only.
set(configure_args
    -S "${SOURCE_DIR}/tests/consumer" -B "${consumer_build}"
    "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(XQ_CMAKE_GENERATOR)
  list(APPEND configure_args -G "${XQ_CMAKE_GENERATOR}")
else()
  list(APPEND configure_args -G Ninja)
endif()
foreach(var IN ITEMS CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS)
  if(NOT "${XQ_${var}}" STREQUAL "")
    list(APPEND configure_args "-D${var}=${XQ_${var}}")
  endif()
endforeach()
run_step(configure "${CMAKE_COMMAND}" ${configure_args})

# The package must come from the prefix just installed, not from somewhere else on the system.
load_cache("${consumer_build}" READ_WITH_PREFIX CONSUMER_ xquant_DIR)
file(REAL_PATH "${prefix}" real_prefix)
file(REAL_PATH "${CONSUMER_xquant_DIR}" real_xquant_dir)
string(FIND "${real_xquant_dir}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "install_consumer: find_package(xquant) used ${CONSUMER_xquant_DIR}, not the "
                      "installed prefix ${prefix}")
endif()

# 3. Build.
run_step(build "${CMAKE_COMMAND}" --build "${consumer_build}")

# 4. Run.
run_step(run "${consumer_build}/app")
message(STATUS "install_consumer: ${step_output}")
