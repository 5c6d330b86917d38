#!/usr/bin/env bash
# Runs pytorch_sync_benchmark.py for every framework, set and rank count, in round-robin
# repetitions, and prints a markdown table (summarize_pytorch_sync.py).
#
# Within a repetition, the frameworks run back to back for each (set, ranks), and the order of
# the frameworks rotates from one repetition to the next, so a noisy stretch of the machine hits
# every framework alike and no framework always runs first or last.
#
# Run from the repository root (the defaults below are relative to it):
#
#   benchmarks/python/run_pytorch_sync_benchmark.sh [options]
#
# Options, with their defaults (several can also be set in the environment, as shown):
#   --python PY          interpreter with torch, for gradsync and DDP ($PYTHON, else python3)
#   --horovod-python PY  interpreter with horovod.torch ($HOROVOD_PYTHON, else --python)
#   --build-dir DIR      gradsync build tree, whose DIR/python goes first on PYTHONPATH
#                        ($GRADSYNC_BUILD_DIR, else build)
#   --data-dir DIR       gradient-set folder ($GRADSYNC_DATA_DIR, else ../shared/data)
#   --frameworks LIST    comma list (gradsync,horovod,ddp,gradsync-ddp); those that do not
#                        import are skipped with a note
#   --sets LIST          comma list of set stems or set files (resnet50,bert_base)
#   --ranks LIST         comma list of rank counts (2,4)
#   --modes LIST         comma list of the benchmark's modes (step; tensor and grouped time the
#                        synchronization alone through Horovod's API, for gradsync and horovod)
#   --op OP              Horovod's reduce op of the tensor and grouped modes (Average; Adasum)
#   --comm-hook HOOK     the DDP wrappers' communication hook (none; powersgd: PyTorch's PowerSGD
#                        hook and state on both); with one, only ddp and gradsync-ddp run
#   --bucket-cap-mb MB   the DDP wrappers' bucket_cap_mb (25)
#   --reps N             repetitions (3)
#   --iters N            timed iterations per run, passed to the benchmark (20)
#   --warmup N           untimed iterations per run, passed to the benchmark (3)
#   --timeout S          limit for each mpirun, in seconds (600)
#   --out FILE           file the runs' JSON lines are appended to
#                        (${TMPDIR:-/tmp}/pytorch_sync_<date>_<time>.jsonl)
#   --mpirun-args ARGS   extra mpirun arguments, split on spaces ($MPIRUN_ARGS, else none)
#
# Where the build has gradsync_cpu_pair_round_trip (benchmarks/cpu_pair_round_trip.cc), each
# run is bracketed on stderr by the round trip of a cache line between CPUs 0 and 1 before and
# after it: on a virtual machine whose host moves its CPUs, transfers between ranks on the
# machine follow that placement (docs/benchmarks.md, "What the state is").
#
# mpirun gets --oversubscribe --bind-to none for every framework (more ranks than cores on a
# small machine; no pinning, so each rank's threads can use any core). As root, Open MPI also
# wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
horovod_python=${HOROVOD_PYTHON:-}
build_dir=${GRADSYNC_BUILD_DIR:-build}
data_dir=${GRADSYNC_DATA_DIR:-../shared/data}
frameworks=gradsync,horovod,ddp,gradsync-ddp
sets=resnet50,bert_base
ranks=2,4
modes=step
op=Average
comm_hook=none
bucket_cap_mb=25
reps=3
iters=20
warmup=3
timeout_s=600
out=${TMPDIR:-/tmp}/pytorch_sync_$(date +%Y%m%d_%H%M%S).jsonl
mpirun_args=${MPIRUN_ARGS:-}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) python=$2; shift 2 ;;
    --horovod-python) horovod_python=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --frameworks) frameworks=$2; shift 2 ;;
    --sets) sets=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --comm-hook) comm_hook=$2; shift 2 ;;
    --bucket-cap-mb) bucket_cap_mb=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --mpirun-args) mpirun_args=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "unknown option: $1" >&2; usage 2 ;;
  esac
done
horovod_python=${horovod_python:-$python}
export PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
bench=$here/pytorch_sync_benchmark.py
IFS=, read -r -a want <<<"$frameworks"
IFS=, read -r -a set_list <<<"$sets"
IFS=, read -r -a rank_list <<<"$ranks"
IFS=, read -r -a mode_list <<<"$modes"
read -r -a extra <<<"$mpirun_args"

cpu_pair() {
  local probe=$build_dir/benchmarks/gradsync_cpu_pair_round_trip
  if [[ -x $probe ]]; then "$probe" --samples 3 >&2 || true; fi
}

python_for() { if [[ $1 == horovod ]]; then echo "$horovod_python"; else echo "$python"; fi; }

# Keep only the frameworks that import here (gradsync-ddp only where gradsync has it).
fws=()
for fw in "${want[@]}"; do
  if "$(python_for "$fw")" "$bench" --framework "$fw" --check; then
    fws+=("$fw")
  else
    echo "skipping $fw" >&2
  fi
done
[[ ${#fws[@]} -gt 0 ]] || { echo "no framework available" >&2; exit 1; }

echo "frameworks: ${fws[*]}; sets: ${set_list[*]}; ranks: ${rank_list[*]}; modes:" \
     "${mode_list[*]}; $reps repetitions of $warmup+$iters steps; results: $out" >&2
failures=0
start=$SECONDS
for ((rep = 1; rep <= reps; rep++)); do
  # Rotate the framework order by one per repetition.
  shift_by=$(((rep - 1) % ${#fws[@]}))
  order=("${fws[@]:shift_by}" "${fws[@]:0:shift_by}")
  for set_name in "${set_list[@]}"; do
    for np in "${rank_list[@]}"; do
      for mode in "${mode_list[@]}"; do
        for fw in "${order[@]}"; do
          # The synchronization-only modes use Horovod's API, which DDP does not have.
          if [[ $mode != step && $fw != gradsync && $fw != horovod ]]; then continue; fi
          # A communication hook is the DDP wrappers' alone.
          if [[ $comm_hook != none && $fw != ddp && $fw != gradsync-ddp ]]; then continue; fi
          echo "--- rep $rep: $fw, $set_name, $np ranks, $mode ($((SECONDS - start)) s so far)" >&2
          cpu_pair
          # The JSON line goes to the results file; a failed or timed-out run is reported and
          # the sweep goes on (its group then has fewer runs in the table).
          if ! timeout --kill-after=30 "$timeout_s" \
              mpirun -np "$np" --oversubscribe --bind-to none "${extra[@]}" \
              "$(python_for "$fw")" "$bench" --framework "$fw" --set "$set_name" \
              --data-dir "$data_dir" --iters "$iters" --warmup "$warmup" --tag "rep$rep" \
              --mode "$mode" $([[ $mode != step ]] && echo --op "$op") \
              --bucket-cap-mb "$bucket_cap_mb" \
              $([[ $comm_hook != none ]] && echo --comm-hook "$comm_hook") | tee -a "$out"; then
            echo "FAILED (exit ${PIPESTATUS[0]}): $fw, $set_name, $np ranks, $mode, rep $rep" >&2
            failures=$((failures + 1))
          fi
          cpu_pair
        done
      done
    done
  done
done
echo "done in $((SECONDS - start)) s, $failures failed run(s); results in $out" >&2
echo
"$python" "$here/summarize_pytorch_sync.py" "$out"
[[ $failures -eq 0 ]]
