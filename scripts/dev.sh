#!/usr/bin/env bash
# Installs what is missing, builds, and then runs the demo or the test suite.
#   scripts/dev.sh demo [ranks]   build, then train the demo MLP on N ranks (default 4)
#   scripts/dev.sh test           build, then run the whole test suite, then build it again with
#                                 sanitizers and run it there too
#   scripts/dev.sh build          build only
# BUILD_DIR (default: build) and JOBS (default: number of cores) are honoured. PYTHON (default:
# Debian's /usr/bin/python3, the interpreter python3-torch installs into) is the interpreter the
# Python package is built and tested for. SANITIZE (default
# address,undefined) names the sanitizers of the test command's second build, in
# BUILD_DIR-sanitize; SANITIZE= (empty) skips that build.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo_root/build}
sanitized_dir=$build_dir-sanitize
sanitizers=${SANITIZE-address,undefined}
python=${PYTHON:-/usr/bin/python3}
jobs=${JOBS:-$(nproc)}

# Debian packages the build, tests and demo need.
packages=(build-essential cmake pkg-config openmpi-bin libopenmpi-dev libspdlog-dev
          libgtest-dev libgmock-dev python3-dev pybind11-dev python3-torch python3-pytest
          python3-venv python3-mpi4py libtorch-dev libhwloc-dev iproute2 slurm-wlm munge
          python3-matplotlib)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "dev.sh: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

build() {
  cmake -S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
    -DPython_EXECUTABLE="$python"
  cmake --build "$build_dir" -j "$jobs"
}

# The library and every test under sanitizers (docs/sanitizers.md). Benchmarks and the demo are
# left out: their timings mean nothing there, and the tests drive the same code.
sanitized_build() {
  cmake -S "$repo_root" -B "$sanitized_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_SANITIZE="$sanitizers" -DGRADSYNC_BUILD_BENCHMARKS=OFF \
    -DGRADSYNC_BUILD_EXAMPLES=OFF
  cmake --build "$sanitized_dir" -j "$jobs"
}

# CMAKE_BUILD_PARALLEL_LEVEL: the jobs of the builds that tests run (python_pip_install's).
run_tests() {
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs} \
    ctest --test-dir "$1" --output-on-failure --timeout 600 -j "${CTEST_JOBS:-1}"
}

# Open MPI refuses to run as root unless told it is intended (containers, CI).
mpi_env() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

cmd=${1:-demo}
case "$cmd" in
  demo)
    install_missing && build && mpi_env
    "$repo_root/launch/gradsyncrun" -np "${2:-4}" "$build_dir/examples/demo_trainer/gradsync_demo_trainer"
    ;;
  test)
    install_missing && build && mpi_env
    run_tests "$build_dir"
    if [ -n "$sanitizers" ]; then
      echo "dev.sh: the suite again, built with -fsanitize=$sanitizers"
      sanitized_build && run_tests "$sanitized_dir"
    fi
    ;;
  build)
    install_missing && build
    ;;
  *)
    echo "usage: scripts/dev.sh {demo [ranks]|test|build}" >&2
    exit 2
    ;;
esac
