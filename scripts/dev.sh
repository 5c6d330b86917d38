#!/usr/bin/env bash
# Installs what is missing, builds, and then runs the demo or the test suite.
#   scripts/dev.sh demo [ranks]   install what the demo needs, build the library and the demo
#                                 trainer only, then train the demo MLP on N ranks (default 4)
#   scripts/dev.sh test           install what the suite needs, build everything, run the whole
#                                 test suite, then build it again with sanitizers (with clang
#                                 where installed) and run it there too
#   scripts/dev.sh build          install what the suite needs, build everything
# BUILD_DIR (default: build) and JOBS (default: number of cores) are honoured. PYTHON (default:
# Debian's /usr/bin/python3, the interpreter python3-torch installs into) is the interpreter the
# Python package is built and tested for. SANITIZE (default
# address,undefined) names the sanitizers of the test command's second build, in
# BUILD_DIR-sanitize; SANITIZE= (empty) skips that build. GRADSYNC_WITH_CUDA (default AUTO: where
# the CUDA toolkit and NCCL are found) says whether the test build compiles the device kernels.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo_root/build}
sanitized_dir=$build_dir-sanitize
sanitizers=${SANITIZE-address,undefined}
python=${PYTHON:-/usr/bin/python3}
jobs=${JOBS:-$(nproc)}

# Debian packages the library and the demo need (python3 runs launch/gradsyncrun).
demo_packages=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libspdlog-dev
               libhwloc-dev python3)
# And what the whole tree and its tests need on top: GoogleTest, the Python package and its tests,
# libtorch, the cluster tests (Slurm, network namespaces), the scaling plot, and clang for the
# sanitized build.
test_packages=("${demo_packages[@]}" libgtest-dev libgmock-dev python3-dev pybind11-dev
               python3-torch python3-pytest python3-venv python3-mpi4py libtorch-dev iproute2
               slurm-wlm munge python3-matplotlib clang)

# install_missing [--no-install-recommends] PACKAGE...
install_missing() {
  local missing=() options=()
  if [ "$1" = --no-install-recommends ]; then
    options+=("$1")
    shift
  fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "dev.sh: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  # Through env: sudo drops the caller's environment.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${options[@]}" "${missing[@]}"
}

# Everything: the parts a demo build left out are turned back on (their defaults).
build() {
  cmake -S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
    -DPython_EXECUTABLE="$python" -DGRADSYNC_BUILD_TESTS=ON -DGRADSYNC_BUILD_BENCHMARKS=ON \
    -DGRADSYNC_BUILD_EXAMPLES=ON -DGRADSYNC_BUILD_PYTHON=AUTO \
    -DGRADSYNC_WITH_CUDA="${GRADSYNC_WITH_CUDA:-AUTO}" -DGRADSYNC_WERROR=ON
  cmake --build "$build_dir" -j "$jobs"
}

# The library and the demo trainer only. A new build folder is configured without what the demo
# does not use (tests, benchmarks, the Python package, and the CUDA kernels: the demo trains on
# the CPU, and nvcc would add minutes), so that it needs none of the test packages; a folder that
# `build` or `test` configured is kept as it is, and only the demo's targets are brought up to
# date in it.
demo_build() {
  local options=(-DGRADSYNC_BUILD_EXAMPLES=ON)
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    options+=(-DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DGRADSYNC_BUILD_TESTS=OFF
              -DGRADSYNC_BUILD_BENCHMARKS=OFF -DGRADSYNC_BUILD_PYTHON=OFF
              -DGRADSYNC_WITH_CUDA=OFF)
  fi
  cmake -S "$repo_root" -B "$build_dir" "${options[@]}"
  cmake --build "$build_dir" -j "$jobs" --target gradsync_demo_trainer
}

# The library and every test under sanitizers (docs/sanitizers.md), with clang where it is
# installed (the test command installs it): the ordinary build is the default compiler's (gcc on
# Debian), so the two builds check both compilers. Benchmarks and the demo are left out: their
# timings mean nothing there, and the tests drive the same code. It is a unity build (sources
# compiled in batches, 271 s against 349 s on 2 cores), which also keeps the tree buildable that
# way; the ordinary build compiles each source alone, which keeps every file's includes whole.
sanitized_build() {
  local cc cxx cached
  if command -v clang >/dev/null && command -v clang++ >/dev/null; then
    cc=$(command -v clang) cxx=$(command -v clang++)
  else
    cc=$(command -v "${CC:-cc}") cxx=$(command -v "${CXX:-c++}")
  fi
  # CMake answers another compiler in an existing folder by dropping its cache and configuring
  # again without the options given (an unsanitized build): start that folder afresh instead.
  cached=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$sanitized_dir/CMakeCache.txt" 2>/dev/null ||
           true)
  if [ -n "$cached" ] && [ "$cached" != "$cxx" ]; then
    echo "dev.sh: $sanitized_dir was built with $cached; building it again with $cxx"
    rm -rf "$sanitized_dir"
  fi
  cmake -S "$repo_root" -B "$sanitized_dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_SANITIZE="$sanitizers" -DGRADSYNC_BUILD_BENCHMARKS=OFF \
    -DGRADSYNC_BUILD_EXAMPLES=OFF -DCMAKE_UNITY_BUILD=ON
  cmake --build "$sanitized_dir" -j "$jobs"
}

# CMAKE_BUILD_PARALLEL_LEVEL: the jobs of the builds that tests run (python_pip_install's). The
# unit tests (one process each, no MPI) run on every core; the rest one at a time unless CTEST_JOBS
# says otherwise, since a multi-rank test keeps the cores busy by itself. Both parts always run.
# A folder without tests (a build that failed) is a failure, not an empty success.
run_tests() {
  local failed=0
  ctest --test-dir "$1" --output-on-failure --no-tests=error --timeout 600 -L '^unit$' \
    -j "$jobs" || failed=1
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs} \
    ctest --test-dir "$1" --output-on-failure --no-tests=error --timeout 600 -LE '^unit$' \
    -j "${CTEST_JOBS:-1}" || failed=1
  return "$failed"
}

# Open MPI refuses to run as root unless told it is intended (containers, CI).
mpi_env() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# One step a line: set -e does not apply inside a function called from an && list, so a failed
# build there would go on to the next step.
cmd=${1:-demo}
case "$cmd" in
  demo)
    # The demo's packages without the ones they recommend (a Fortran toolchain, manuals, image
    # libraries): a third fewer to install on a fresh machine.
    install_missing --no-install-recommends "${demo_packages[@]}"
    demo_build
    mpi_env
    "$repo_root/launch/gradsyncrun" -np "${2:-4}" "$build_dir/examples/demo_trainer/gradsync_demo_trainer"
    ;;
  test)
    install_missing "${test_packages[@]}"
    build
    mpi_env
    run_tests "$build_dir"
    if [ -n "$sanitizers" ]; then
      echo "dev.sh: the suite again, built with -fsanitize=$sanitizers"
      sanitized_build
      run_tests "$sanitized_dir"
    fi
    ;;
  build)
    install_missing "${test_packages[@]}"
    build
    ;;
  *)
    echo "usage: scripts/dev.sh {demo [ranks]|test|build}" >&2
    exit 2
    ;;
esac
