#!/usr/bin/env bash
# `pip install <source>` into a virtual environment, then the installed package alone on 2 ranks.
#   pip_install_test.sh PYTHON SOURCE_DIR WORK_DIR MPIEXEC
# The venv (WORK_DIR/venv, with the system site-packages so that Debian's torch is seen) and the
# CMake build folder (WORK_DIR/skbuild) are kept between runs, so a rerun rebuilds incrementally.
# Network: none once scikit-build-core is in the venv (or in PYTHON's site-packages). Debian 12 does
# not package it, so the first run installs it from PyPI; the package itself is built with
# --no-build-isolation --no-index (pybind11 from pybind11-dev, through CMake).
# CMAKE_BUILD_PARALLEL_LEVEL (default: the number of cores) sets the build's parallelism.
set -euo pipefail

python=$1 source_dir=$2 work_dir=$3 mpiexec=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$work_dir/venv
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# Nothing of the source or build tree may reach the interpreter but through the installed package.
unset PYTHONPATH PYTHONHOME
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
  echo "pip_install_test: $*" >&2
  exit 1
}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv" ||
    fail "'$python -m venv' failed (on Debian, install python3-venv)"
fi
if ! "$venv/bin/python" -c "import scikit_build_core" 2>/dev/null; then
  echo "pip_install_test: installing scikit-build-core from PyPI (Debian 12 has no package of it)"
  "$venv/bin/python" -m pip install -q "scikit-build-core>=0.10" ||
    fail "could not install scikit-build-core into $venv from PyPI (network needed on the first" \
         "run; offline, install it there by hand: $venv/bin/pip install <scikit_build_core wheel>)"
fi

start=$(date +%s)
"$venv/bin/python" -m pip install -q --no-build-isolation --no-index --no-deps --force-reinstall \
  --config-settings=build-dir="$work_dir/skbuild" "$source_dir" ||
  fail "pip install $source_dir failed"
echo "pip_install_test: pip install took $(($(date +%s) - start)) s"

# From a folder outside the source tree, so that only the installed package can be imported.
mkdir -p "$work_dir/run"
cd "$work_dir/run"
"$mpiexec" -np 2 --oversubscribe --bind-to none \
  "$venv/bin/python" "$here/check_installed.py" "$source_dir"
