#!/usr/bin/env bash
# The multi-host test: 2 namespace hosts x 2 ranks. topology_check runs flat and hierarchical, and
# each run's timeline shows which path its allreduces took: node shared memory never spans the
# hosts, and the hierarchical run reduces within each host first. host_allreduce_test and
# collectives_test run across the hosts too, and so do the `multihost` examples of
# docs/launching.md (node1 and node2 there are the two hosts here). The hosts are removed at the
# end whatever happens. Skips (77) where namespaces cannot be made.
#   run_multihost.sh MPIRUN TOPOLOGY_CHECK HOST_ALLREDUCE_TEST COLLECTIVES_TEST DEMO_TRAINER PYTHON
#                    WORK_DIR
# DEMO_TRAINER "-" (a build without the examples) leaves the guide's examples out.
set -euo pipefail
mpirun=$1 topology=$2 host_allreduce=$3 collectives=$4 demo=$5 python=$6 work=$7
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# The namespaces' names and addresses are the machine's, not this build's: another build folder's
# run of this test waits here rather than have its hosts torn down under it.
lock_dir=/run/lock
[ -d "$lock_dir" ] && [ -w "$lock_dir" ] || lock_dir=${TMPDIR:-/tmp}
exec 9>"$lock_dir/gradsync-multihost.lock"
flock 9
"$here/namespace_hosts.sh" down 2
trap '"$here/namespace_hosts.sh" down 2' EXIT
set +e
flags=$("$here/namespace_hosts.sh" up 2 "$work")
status=$?
set -e
[ "$status" -eq 0 ] || exit "$status"
mca=${flags% --hosts *}

# Runs a program on 2 hosts x 2 ranks, passing on the variables named after it.
run() {
  local program=$1; shift
  local exports=(-x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
                 -x GRADSYNC_STALL_WARNING_SECONDS -x GRADSYNC_STALL_SHUTDOWN_SECONDS)
  for setting in "$@"; do exports+=(-x "$setting"); done
  echo "== $(basename "$program") $*"
  # shellcheck disable=SC2086
  "$mpirun" $mca -H 10.77.0.1:2,10.77.0.2:2 -np 4 "${exports[@]}" "$program"
}

# The timeline must name `present` and must not name `absent`.
expect_paths() {
  local trace=$1 present=$2 absent=$3
  grep -q "\"$present\"" "$trace" || { echo "FAIL: $trace has no $present" >&2; exit 1; }
  if grep -q "\"$absent\"" "$trace"; then echo "FAIL: $trace has $absent" >&2; exit 1; fi
}

# An earlier run's timelines must not stand in for this run's.
rm -f "$work/flat.json" "$work/hierarchical.json"
run "$topology" GRADSYNC_HIERARCHICAL_ALLREDUCE=0 GRADSYNC_TIMELINE="$work/flat.json"
expect_paths "$work/flat.json" MPI_ALLREDUCE SHM_ALLREDUCE
run "$topology" GRADSYNC_HIERARCHICAL_ALLREDUCE=1 GRADSYNC_TIMELINE="$work/hierarchical.json"
expect_paths "$work/hierarchical.json" HIERARCHICAL_ALLREDUCE SHM_ALLREDUCE
run "$host_allreduce"
run "$collectives"
# Calibration's piece probe at each init ran in the run above; here allreduces go whole.
run "$collectives" GRADSYNC_HIERARCHICAL_ALLREDUCE=1 GRADSYNC_ALLREDUCE_PIECE_BYTES=0
if [ "$demo" = - ]; then
  echo "multihost: every run passed (the guide's examples left out: no demo trainer built)"
  exit 0
fi
echo "== the launching guide's multihost examples"
"$python" "$repo/test/launch/guide_examples.py" run "$repo/docs/launching.md" multihost \
  --workdir "$work/guide" --path "$repo/launch" --link "gradsync_demo_trainer=$demo" \
  --replace "node1:=10.77.0.1:" --replace "node2:=10.77.0.2:" \
  --replace "gradsyncrun =gradsyncrun --mpi-args '$mca' "
echo "multihost: every run passed"
