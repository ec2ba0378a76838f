# CMake toolchain for an aarch64 (arm64) Linux build on an x86-64 Debian 12
# host: the Debian cross compiler (g++-aarch64-linux-gnu) and the arm64
# multiarch -dev packages (dpkg --add-architecture arm64; libfoo-dev:arm64),
# whose libraries live in /usr/lib/aarch64-linux-gnu. scripts/cross-arm64.sh
# installs both and builds with this file; the binaries run under
# qemu-aarch64 (scripts/test-arm64.sh). CMake documents the variables at
# https://cmake.org/cmake/help/latest/manual/cmake-toolchains.7.html.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and pkg-config files of the target: the :arm64 packages. Header-
# only packages (Architecture: all, e.g. nlohmann-json, CLI11) keep their
# CMake configs under /usr/share, which the search below also reaches.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Tests registered with ctest run through the emulator (qemu-user). It
# loads the arm64 libraries of the multiarch packages (libc6:arm64,
# libstdc++6:arm64 in /lib/aarch64-linux-gnu), not the cross toolchain's
# copies in /usr/aarch64-linux-gnu: `-L /usr/aarch64-linux-gnu` would mix
# that loader (glibc 2.36-8) with the multiarch libc.so.6 (2.36-9+deb12uN),
# and then pthread_create never returns.
find_program(BONSAI_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(BONSAI_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${BONSAI_QEMU_AARCH64})
endif()
