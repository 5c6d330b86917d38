#!/usr/bin/env bash
# A single-node Slurm (munge, slurmctld, slurmd) configured for this host in a scratch folder,
# for the suite's Slurm tests. Nothing outside DIR is written; the daemons listen on their own
# ports and are stopped by `stop`.
#   slurm_cluster.sh start DIR    prints `export SLURM_CONF=...` on success; exit 77 when the
#                                 daemons cannot start on this machine
#   slurm_cluster.sh stop DIR
set -euo pipefail

dir=${2:?usage: slurm_cluster.sh start|stop DIR}

start() {
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "slurm_cluster: $tool is not installed" >&2; exit 77; }
  done
  rm -rf "$dir"
  mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/seed" -f || { echo "slurm_cluster: munged did not start" >&2; exit 77; }
  local host cpus
  host=$(hostname)
  cpus=$(nproc)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=gradsynctest
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Completed jobs are purged after 3 s, not 300. `sbatch --wait` polls its job 2 s after submitting
# it and, where MinJobAge is above 4, stretches the polls to 8 and then 32 s: a 12-second job took
# 42. Here it polls every 2 s, which still sees the job before its record goes.
MinJobAge=3
MpiDefault=none
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF" ||
    { echo "slurm_cluster: the Slurm daemons did not start (logs in $dir/log)" >&2; exit 77; }
  for _ in $(seq 1 30); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 1
  done
  echo "slurm_cluster: the node never became idle: $(sinfo -R 2>&1 | tail -1)" >&2
  exit 77
}

stop() {
  for pid in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
