#!/usr/bin/env bash
# GRADSYNC_AUTOTUNE end to end: the demo trainer at 2 ranks tunes during its first steps and must
# still train to identical replicas that match one process; rank 0's trajectory must start from
# the calibrated settings, take at most 10 windows, and end in a "settled" line of the log, before
# the schedule locks (a plan locked meanwhile would keep the candidate it locked under).
#   autotune_demo.sh MPIRUN DEMO_TRAINER WORK_DIR
set -euo pipefail
mpirun=$1 demo=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
export GRADSYNC_AUTOTUNE=1 GRADSYNC_AUTOTUNE_LOG="$work/trajectory.csv" GRADSYNC_LOG_LEVEL=info
output=$(timeout 240 "$mpirun" -np 2 --oversubscribe --bind-to none -x GRADSYNC_AUTOTUNE \
  -x GRADSYNC_AUTOTUNE_LOG -x GRADSYNC_LOG_LEVEL "$demo" --steps 60 2>&1)
echo "$output" | grep -v placement
cat "$work/trajectory.csv"
fail() { echo "FAIL: $*" >&2; exit 1; }
grep -q "^replicas identical: yes" <<<"$output" || fail "replicas differ"
grep -q "^matches single-process run: yes" <<<"$output" || fail "training changed"
grep -q "rank 0 info\] process set 0: autotuning settled: " <<<"$output" || fail "never settled"
# The first line of rank 0's log with "process set 0$1", or nothing (no match is no failure here).
first_of() {
  { grep -n "rank 0 info\] process set 0$1" <<<"$output" || true; } | head -1 | cut -d: -f1
}
settled_at=$(first_of ": autotuning settled") locked_at=$(first_of " locked its schedule")
[ -z "$locked_at" ] || [ "$locked_at" -gt "$settled_at" ] || fail "locked before tuning settled"
head -1 "$work/trajectory.csv" | grep -q "^window,parameter,inplace_threshold_bytes," ||
  fail "no header"
sed -n 2p "$work/trajectory.csv" | grep -q "^0,start," || fail "the first window is not the start"
windows=$(($(wc -l < "$work/trajectory.csv") - 1))
[ "$windows" -ge 2 ] && [ "$windows" -le 10 ] || fail "$windows windows"
echo "autotune: settled after $windows windows"
