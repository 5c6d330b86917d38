#!/usr/bin/env bash
# Runs COMMAND inside a single-node Slurm made for this machine in WORK_DIR/cluster (SLURM_CONF
# exported to it), then stops the daemons. Skips (77) only where the daemons cannot start.
#   run_slurm.sh WORK_DIR COMMAND [ARGS...]
set -euo pipefail
work=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
trap '"$here/slurm_cluster.sh" stop "$work/cluster"' EXIT
set +e
conf=$("$here/slurm_cluster.sh" start "$work/cluster")
status=$?
set -e
[ "$status" -eq 0 ] || exit "$status"
eval "$conf"
# This machine may have fewer CPUs than a job asks tasks: overcommit, as mpirun's --oversubscribe
# does; and a job that hangs is cut short.
export SBATCH_OVERCOMMIT=1 SBATCH_TIMELIMIT=5
"$@"
