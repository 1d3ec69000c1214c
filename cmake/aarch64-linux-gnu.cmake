# Cross compilation for 64-bit ARM Linux (aarch64) with Debian's packages only (docs/testing.md, "aarch64
# under emulation"):
#   g++-aarch64-linux-gnu   the cross compiler (GCC 12) and its libstdc++ / libgomp
#   libhwy-dev:arm64, libgtest-dev:arm64, libgmock-dev:arm64, libgomp1:arm64
#                           the arm64 libraries through multiarch (dpkg --add-architecture arm64), which
#                           install into /usr/lib/aarch64-linux-gnu beside the host's x86-64 ones
#   qemu-user-static        runs the aarch64 programs on an x86-64 host (test discovery, ctest)
#
#   cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#
# scripts/test-aarch64 builds and tests with this file. Header-only dependencies (CLI11, nlohmann-json) are
# architecture-independent and come from the host's /usr/include.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(XQUANT_CROSS_TRIPLE aarch64-linux-gnu)
if(NOT CMAKE_CXX_COMPILER)
  find_program(XQUANT_CROSS_CXX NAMES ${XQUANT_CROSS_TRIPLE}-g++ ${XQUANT_CROSS_TRIPLE}-g++-12)
  if(NOT XQUANT_CROSS_CXX)
    message(FATAL_ERROR "aarch64 toolchain: ${XQUANT_CROSS_TRIPLE}-g++ not found (Debian: apt-get install g++-aarch64-linux-gnu)")
  endif()
  set(CMAKE_CXX_COMPILER ${XQUANT_CROSS_CXX})
endif()
if(NOT CMAKE_C_COMPILER)
  find_program(XQUANT_CROSS_CC NAMES ${XQUANT_CROSS_TRIPLE}-gcc ${XQUANT_CROSS_TRIPLE}-gcc-12)
  if(XQUANT_CROSS_CC)
    set(CMAKE_C_COMPILER ${XQUANT_CROSS_CC})
  endif()
endif()

# Only the arm64 libraries: never link the host's x86-64 copies of the same packages.
list(APPEND CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
                              /usr/lib/x86_64-linux-gnu/cmake /usr/lib/x86_64-linux-gnu/pkgconfig)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)

# Programs of the target run under qemu: gtest_discover_tests lists the tests at build time through this
# emulator, and ctest runs every test command through it. QEMU_CPU (e.g. "max,sve=off" or
# "max,sve256=on") chooses the emulated CPU; the arm64 dynamic loader and libraries are the multiarch ones.
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(XQUANT_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
  if(XQUANT_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${XQUANT_QEMU_AARCH64})
  else()
    message(WARNING "aarch64 toolchain: qemu-aarch64-static not found (Debian: qemu-user-static); the "
                    "tests build but cannot be discovered or run on this host")
  endif()
endif()
