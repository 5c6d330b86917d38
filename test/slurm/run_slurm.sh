#!/usr/bin/env bash
# The Slurm test: a single-node Slurm made for this machine in WORK_DIR, launch/slurm/cpu.sbatch
# submitted with 2 and with 4 tasks running the demo trainer, each job's output checked, the
# daemons stopped at the end. Skips (77) only where the daemons cannot start.
#   run_slurm.sh DEMO_TRAINER WORK_DIR
set -euo pipefail
demo=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
launch=$(cd "$here/../../launch/slurm" && pwd)
trap '"$here/slurm_cluster.sh" stop "$work/cluster"' EXIT
set +e
conf=$("$here/slurm_cluster.sh" start "$work/cluster")
status=$?
set -e
[ "$status" -eq 0 ] || exit "$status"
eval "$conf"
for tasks in 2 4; do
  out=$work/demo-$tasks.out
  rm -f "$out"
  # --overcommit: more tasks than the node has CPUs, as mpirun --oversubscribe.
  GRADSYNC_LAUNCH_DIR=$launch timeout 240 sbatch --wait --overcommit --ntasks "$tasks" \
    --time 5 --output "$out" \
    --export=ALL "$launch/cpu.sbatch" "$demo"
  cat "$out"
  grep -q "replicas identical: yes" "$out"
  grep -q "matches single-process run: yes" "$out"
  echo "slurm: the demo on $tasks tasks: ok"
done
