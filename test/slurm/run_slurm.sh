#!/usr/bin/env bash
# The Slurm test: a single-node Slurm made for this machine in WORK_DIR, then every `slurm` example
# of docs/launching.md run in it (launch/slurm/cpu.sbatch and gpu.sbatch submitted with the demo
# trainer on 2 and 4 tasks, each job waited for and its output checked), the daemons stopped at
# the end. Skips (77) only where the daemons cannot start.
#   run_slurm.sh PYTHON DEMO_TRAINER WORK_DIR
set -euo pipefail
python=$1 demo=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
trap '"$here/slurm_cluster.sh" stop "$work/cluster"' EXIT
set +e
conf=$("$here/slurm_cluster.sh" start "$work/cluster")
status=$?
set -e
[ "$status" -eq 0 ] || exit "$status"
eval "$conf"
# This machine may have fewer CPUs than an example asks tasks: overcommit, as mpirun's
# --oversubscribe does; and a job that hangs is cut short.
export SBATCH_OVERCOMMIT=1 SBATCH_TIMELIMIT=5
timeout 500 "$python" "$repo/test/launch/guide_examples.py" run "$repo/docs/launching.md" slurm \
  --workdir "$work/guide" --link "launch=$repo/launch" --link "gradsync_demo_trainer=$demo"
