#!/usr/bin/env bash
# The cluster figures of docs/benchmarks.md on one machine: hosts made of network namespaces
# (test/multihost/namespace_hosts.sh, root needed), Open MPI over TCP between them and shared
# memory within each. Runs gradsync_bench_host_paths (flat against hierarchical, same run) at
# 2 hosts x 2 ranks, and the scaling run at 2 hosts x 1 and x 2 ranks, adding to RESULTS.
#   namespace_hosts.sh BUILD_DIR RESULTS OUT_DIR [ITERS]
set -euo pipefail
build=$(cd "$1" && pwd) results=$(realpath "$2") out=$(mkdir -p "$3" && cd "$3" && pwd)
iters=${4:-20}
repo=$(cd "$(dirname "$0")/../.." && pwd)
hosts=$repo/test/multihost/namespace_hosts.sh
"$hosts" down 2
trap '"$hosts" down 2' EXIT
flags=$("$hosts" up 2 "$out/hosts")
mca=${flags% --hosts *}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2086
mpirun $mca -H 10.77.0.1:2,10.77.0.2:2 -np 4 -x OMPI_ALLOW_RUN_AS_ROOT \
  -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$build/benchmarks/gradsync_bench_host_paths" \
  --iters "$iters" | tee "$out/host_paths_2x2.txt"
for per_host in 1 2; do
  for hierarchical in 0 1; do
    series="2 hosts x $per_host"
    [ "$hierarchical" = 1 ] && series="$series, hierarchical"
    [ "$hierarchical" = 1 ] && [ "$per_host" = 1 ] && continue  # one rank per host: nothing to do
    GRADSYNC_HIERARCHICAL_ALLREDUCE=$hierarchical /usr/bin/python3 "$repo/benchmarks/scaling/scaling.py" run \
      --bench "$build/benchmarks/gradsync_bench_models" --ranks $((2 * per_host)) \
      --series "$series" --iters "$iters" --results "$results" \
      -- -H "10.77.0.1:$per_host,10.77.0.2:$per_host" --mpi-args "$mca"
  done
done
