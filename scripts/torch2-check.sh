#!/usr/bin/env bash
# The Python package's tests under PyTorch 2, on a machine without a GPU.
#
# Debian 12's PyTorch, which the build and CI test against, is 1.13; users and the GPU machines
# run PyTorch 2, whose defaults differ where gradsync.torch meets them (zero_grad() sets
# gradients to None, Optimizer.load_state_dict keeps the tensors it is given, gradients have
# post-accumulate hooks). This puts PyPI's PyTorch into a virtual environment of Debian's
# python3, beside the build's package (whose extension does not link PyTorch), and runs
# test/python at 1, 2 and 4 ranks. PyPI's Linux wheel is a CUDA build: the CUDA toolkit's
# libraries must be on the loader's path (as the toolkit's package puts them), and the few it
# needs beyond them come from PyPI at the versions the wheel names. About 1 GB of downloads.
#
#   scripts/torch2-check.sh [VERSION]   a build of scripts/dev.sh (BUILD_DIR, default build)
#                                       must exist; VERSION defaults to PyPI's newest
# WORK (default /tmp/gradsync-torch2) holds the environment; it is reused when it has the version.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo_root/build}
work=${WORK:-/tmp/gradsync-torch2}
version=${1:-}
venv=$work/venv
python=$venv/bin/python

fail() {
  echo "torch2-check: $*" >&2
  exit 1
}

[ -d "$build_dir/python/gradsync" ] || fail "no package in $build_dir/python: run scripts/dev.sh build"

installed() {
  [ -x "$python" ] && "$python" -c 'import torch' 2>/dev/null &&
    { [ -z "$version" ] || [ "$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')" = "$version" ]; }
}

if ! installed; then
  rm -rf "$venv" "$work/wheels"
  /usr/bin/python3 -m venv "$venv"
  pip=("$python" -m pip install -q --disable-pip-version-check)
  "$python" -m pip download -q --no-deps -d "$work/wheels" "torch${version:+==$version}" ||
    fail "could not download torch${version:+ $version} from PyPI"
  wheel=$(ls "$work"/wheels/torch-*.whl)
  "${pip[@]}" --no-deps "$wheel"
  # The native libraries the wheel links beyond the CUDA toolkit's own, pinned as it pins them.
  mapfile -t native < <("$python" - "$wheel" <<'EOF'
import re, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
for line in wheel.read(metadata).decode().splitlines():
    m = re.match(r"Requires-Dist: (nvidia-(?:cusparselt|nvshmem|nccl)-cu\d+==[^ ;]+)", line)
    if m:
        print(m.group(1))
    m = re.match(r"Requires-Dist: cuda-toolkit\[[^]]*cufile[^]]*\]==([^ ;]+)", line)
    if m:
        print("cuda-toolkit[cufile]==" + m.group(1))
EOF
  )
  for requirement in "${native[@]}"; do
    # The toolkit's extra brings its one wheel; the others are wheels of their own.
    case $requirement in
      cuda-toolkit*) "${pip[@]}" "$requirement" ;;
      *) "${pip[@]}" --no-deps "$requirement" ;;
    esac
  done
  "${pip[@]}" numpy pytest filelock typing-extensions sympy networkx jinja2 fsspec
  "$python" -c 'import torch' || fail "PyTorch does not import (are the CUDA toolkit's libraries on the loader's path?)"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$build_dir/python GRADSYNC_STALL_WARNING_SECONDS=5 GRADSYNC_STALL_SHUTDOWN_SECONDS=20
echo "torch2-check: PyTorch $("$python" -c 'import torch; print(torch.__version__)')"
status=0
for np in 1 2 4; do
  echo "torch2-check: $np rank(s)"
  timeout 600 mpirun -np "$np" --oversubscribe --bind-to none -x PYTHONPATH \
    -x GRADSYNC_STALL_WARNING_SECONDS -x GRADSYNC_STALL_SHUTDOWN_SECONDS \
    "$python" -m pytest -q -p no:cacheprovider --color=no "$repo_root/test/python" || status=1
done
exit "$status"
