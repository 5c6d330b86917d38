#!/usr/bin/env bash
# The transport table of docs/benchmarks.md in one sitting: gradsync_bench_models (gradsync beside
# raw per-tensor, flat+copy, bucketed and flat MPI, interleaved in one run) and the PyTorch step
# benchmark (gradsync.torch against Horovod, the same script: a training step, and the
# synchronization alone per tensor and grouped) at 1 host x 2 and x 4 ranks and at
# 2 hosts x 1 and x 2 ranks, the hosts being network namespaces joined by a bridge
# (test/multihost/namespace_hosts.sh; root needed, Open MPI over TCP between them). Then the
# markdown table and the plot (transport_table.py).
#
#   transport_table.sh BUILD_DIR OUT_DIR [ITERS] [REPS]
#
# ITERS (default 10): timed steps per strategy and per PyTorch run. REPS (default 2): repetitions
# of the PyTorch runs, frameworks in rotating order. The 1000 x 1 KB set, whose step takes a
# millisecond where the models' take hundreds, is run again with TINY_ITERS (default 1000) steps
# of every strategy but per-tensor (seconds a step across hosts); its row then takes those. Its
# PyTorch runs take TINY_PY_ITERS (default 100) steps.
# HOROVOD_PYTHON names an interpreter with horovod.torch (../shared/ANCHORS.md says how to build
# one); without it only gradsync runs on the PyTorch side. PYTHON (default /usr/bin/python3,
# Debian's, which has torch) runs gradsync.torch. DATA_DIR (default $GRADSYNC_DATA_DIR, else
# ../shared/data) holds the gradient sets. LAYOUTS (default "1x2 1x4 2x1 2x2") picks the layouts
# to run; the table shows the others as not run. GRADSYNC_LOG_LEVEL (default info) goes to every
# rank, so that each run's calibrated policy (rank 0's "allreduce costs" line) is on stderr beside
# its results.
set -euo pipefail
build=$(cd "$1" && pwd) out=$(mkdir -p "$2" && cd "$2" && pwd)
iters=${3:-10} reps=${4:-2} tiny_iters=${TINY_ITERS:-1000} tiny_py_iters=${TINY_PY_ITERS:-100}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-/usr/bin/python3}
data=${DATA_DIR:-${GRADSYNC_DATA_DIR:-$repo/../shared/data}}
sets=resnet50,bert_base
hosts=$repo/test/multihost/namespace_hosts.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export GRADSYNC_LOG_LEVEL=${GRADSYNC_LOG_LEVEL:-info}

"$hosts" down 2
trap '"$hosts" down 2' EXIT
flags=$("$hosts" up 2 "$out/hosts")
mca=${flags% --hosts *}
# Ranks on namespace hosts share this machine's cores: each host's launcher would bind its first
# rank to the same core, so nothing is bound.
env_flags="-x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x PYTHONPATH -x GRADSYNC_LOG_LEVEL"
declare -A layout_np=([1x2]=2 [1x4]=4 [2x1]=2 [2x2]=4)
declare -A layout_args=(
  [1x2]=""
  [1x4]=""
  [2x1]="$mca -H 10.77.0.1:1,10.77.0.2:1 $env_flags"
  [2x2]="$mca -H 10.77.0.1:2,10.77.0.2:2 $env_flags"
)
frameworks=gradsync
[ -n "${HOROVOD_PYTHON:-}" ] && frameworks=gradsync,horovod
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"

cpu_pair() {
  if [[ -x $build/benchmarks/gradsync_cpu_pair_round_trip ]]; then
    "$build/benchmarks/gradsync_cpu_pair_round_trip" --samples 3 >&2 || true
  fi
}

for layout in ${LAYOUTS:-1x2 1x4 2x1 2x2}; do
  np=${layout_np[$layout]}
  echo "=== $layout: gradsync_bench_models" >&2
  cpu_pair
  # shellcheck disable=SC2086
  timeout --kill-after=30 1200 mpirun -np "$np" --oversubscribe --bind-to none ${layout_args[$layout]} \
    "$build/benchmarks/gradsync_bench_models" --data-dir "$data" --sets "$sets" \
    --iters "$iters" | tee "$out/models_$layout.txt"
  # shellcheck disable=SC2086
  timeout --kill-after=30 600 mpirun -np "$np" --oversubscribe --bind-to none ${layout_args[$layout]} \
    "$build/benchmarks/gradsync_bench_models" --data-dir "$data" --sets "" \
    --strategies gradsync,flat+copy,bucketed,flat,chunk-1M,chunk-4M,chunk-16M,chunk-64M,pipe-1M,pipe-4M,pipe-16M \
    --iters "$tiny_iters" | tee -a "$out/models_$layout.txt"
  cpu_pair
  echo "=== $layout: PyTorch step, $frameworks" >&2
  rm -f "$out/pytorch_$layout.jsonl"
  # The models at ITERS steps a run; 1000 x 1 KB, whose steps take milliseconds and swing with
  # the machine, at TINY_PY_ITERS.
  for group in "$sets $iters" "1000x1KB $tiny_py_iters"; do
    read -r group_sets group_iters <<<"$group"
    "$repo/benchmarks/python/run_pytorch_sync_benchmark.sh" --python "$python" \
      --horovod-python "${HOROVOD_PYTHON:-$python}" --build-dir "$build" --data-dir "$data" \
      --frameworks "$frameworks" --sets "$group_sets" --ranks "$np" --reps "$reps" \
      --modes step,tensor,grouped --iters "$group_iters" --mpirun-args "${layout_args[$layout]}" \
      --out "$out/pytorch_$layout.jsonl" >/dev/null || echo "some PyTorch runs failed at $layout" >&2
  done
done
"$python" "$repo/benchmarks/transports/transport_table.py" "$out" --markdown "$out/table.md" \
  --plot "$out/transports.png"
cat "$out/table.md"
