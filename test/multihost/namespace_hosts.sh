#!/usr/bin/env bash
# Hosts made of network namespaces on one machine, for the multi-host tests: N namespaces joined
# by a bridge, host i at 10.77.0.(i+1)/24, and mpirun's remote launch pointed at an agent that
# enters a host's namespace (with a hostname and a /dev/shm of its own, as a separate machine
# has) instead of using ssh. Traffic stays on the bridge; `down` removes everything.
#   namespace_hosts.sh up N DIR     writes DIR/agent and prints the mpirun flags to use;
#                                   exit 77 where namespaces cannot be made
#   namespace_hosts.sh down N
set -euo pipefail

prefix=gs-h
bridge=gs-br

up() {
  local n=$1 dir=$2
  ip netns add "${prefix}probe" 2>/dev/null || { echo "namespace_hosts: cannot create network namespaces here" >&2; exit 77; }
  ip netns del "${prefix}probe"
  ip link add "$bridge" type bridge
  ip addr add 10.77.0.254/24 dev "$bridge"
  ip link set "$bridge" up
  for ((i = 0; i < n; i++)); do
    ip netns add "$prefix$i"
    ip link add "gs-v$i" type veth peer name "gs-p$i"
    ip link set "gs-p$i" netns "$prefix$i"
    ip link set "gs-v$i" master "$bridge"
    ip link set "gs-v$i" up
    ip netns exec "$prefix$i" ip addr add "10.77.0.$((i + 1))/24" dev "gs-p$i"
    ip netns exec "$prefix$i" ip link set "gs-p$i" up
    ip netns exec "$prefix$i" ip link set lo up
  done
  mkdir -p "$dir"
  cat >"$dir/agent" <<AGENT
#!/bin/bash
# mpirun's launch agent for the namespace hosts: \$1 is a host's address.
host=\$1; shift
index=\$(( \${host##*.} - 1 ))
exec ip netns exec $prefix\$index unshare --uts --mount --propagation private /bin/sh -c \\
  "hostname $prefix\$index; mount -t tmpfs -o size=1g tmpfs /dev/shm; \$*"
AGENT
  chmod +x "$dir/agent"
  local hosts=""
  for ((i = 0; i < n; i++)); do hosts+="${hosts:+,}10.77.0.$((i + 1))"; done
  # The hosts share this machine's cores, which no launcher can see: each thinks its slots are its
  # own, so Open MPI polls without yielding, and a rank waiting on a message holds the core the
  # sender needs for a whole time slice (a 4-rank collective took 8-24 ms on 2 cores). Yielding
  # when idle, as Open MPI does by itself on a node it knows to be oversubscribed, gives it back.
  echo "--mca plm_rsh_agent $dir/agent --mca oob_tcp_if_include 10.77.0.0/24" \
       "--mca btl_tcp_if_include 10.77.0.0/24 --mca mpi_yield_when_idle 1 --hosts $hosts"
}

down() {
  local n=$1
  for ((i = 0; i < n; i++)); do
    ip netns del "$prefix$i" 2>/dev/null || true
    ip link del "gs-v$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

case "${1:-}" in
  up) up "${2:?N}" "${3:?DIR}" ;;
  down) down "${2:?N}" ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
