#!/usr/bin/env bash
# The multi-host test: 2 namespace hosts x 2 ranks, running topology_check and collectives_test
# across them; the hosts are removed at the end whatever happens. Skips (77) where namespaces
# cannot be made.
#   run_multihost.sh MPIRUN TOPOLOGY_CHECK COLLECTIVES_TEST WORK_DIR
set -euo pipefail
mpirun=$1 topology=$2 collectives=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
"$here/namespace_hosts.sh" down 2
trap '"$here/namespace_hosts.sh" down 2' EXIT
set +e
flags=$("$here/namespace_hosts.sh" up 2 "$work")
status=$?
set -e
[ "$status" -eq 0 ] || exit "$status"
mca=${flags% --hosts *}
for program in "$topology" "$collectives"; do
  # shellcheck disable=SC2086
  "$mpirun" $mca -H 10.77.0.1:2,10.77.0.2:2 -np 4 -x OMPI_ALLOW_RUN_AS_ROOT \
    -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x GRADSYNC_STALL_WARNING_SECONDS \
    -x GRADSYNC_STALL_SHUTDOWN_SECONDS "$program"
done
