#!/usr/bin/env bash
# Runs one fault scenario of fault_program under mpirun and checks how the job ended: with a
# non-zero status, within BOUND seconds of the victim's death (or of its last submission), and
# with output matching every PATTERN (an extended regular expression; "=N:REGEX" asks for exactly
# N matching lines). Prints the job's output, the measured times and the verdict.
#
#   run_fault.sh MPIEXEC PROGRAM NP BOUND SCENARIO VICTIM ON_ERROR [PATTERN...]
set -u

if [ $# -lt 7 ]; then
  echo "usage: $0 MPIEXEC PROGRAM NP BOUND SCENARIO VICTIM ON_ERROR [PATTERN...]" >&2
  exit 2
fi
mpiexec=$1 program=$2 np=$3 bound=$4 scenario=$5 victim=$6 on_error=$7
shift 7

# Arithmetic on decimal seconds: calc EXPR prints the value, holds EXPR succeeds when true.
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }
holds() { awk "BEGIN { exit !($1) }"; }

# Past this, the job is not going to end by itself; the margin lets a slow start still count.
limit=$(calc "$bound + 30")
log=$(mktemp)
trap 'rm -f "$log"' EXIT

now() { date +%s.%N; }

start=$(now)
timeout -k 5 "$limit" "$mpiexec" -np "$np" --oversubscribe --bind-to none \
  "$program" "$scenario" "$victim" "$on_error" >"$log" 2>&1
status=$?
end=$(now)
cat "$log"
echo "----"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

total=$(calc "$end - $start")
echo "exit status $status after $total s in all"
if [ "$status" -eq 0 ]; then
  fail "the job exited with status 0"
fi
if holds "$total >= $limit"; then
  fail "the job did not end by itself within $limit s (timeout killed it)"
fi

# The victim stamps the moment it dies or stops submitting (CLOCK_REALTIME, as date prints it).
event=$(grep -E -m1 "^fault: rank $victim (dies|stops submitting).* at [0-9.]+$" "$log")
if [ -z "$event" ]; then
  fail "rank $victim never reported its fault"
else
  at=${event##* at }
  after=$(calc "$end - $at")
  echo "the job ended $after s after: ${event%% at *}"
  if holds "$after > $bound"; then
    fail "the job took $after s to end, more than the bound of $bound s"
  fi
fi

if grep -q "still waiting after" "$log"; then
  fail "a rank's wait ran out instead of the job ending"
fi

for pattern in "$@"; do
  if [[ $pattern =~ ^=([0-9]+):(.*)$ ]]; then
    want=${BASH_REMATCH[1]}
    regex=${BASH_REMATCH[2]}
    got=$(grep -c -E -- "$regex" "$log")
    if [ "$got" -ne "$want" ]; then
      fail "$got lines match '$regex', wanted $want"
    fi
  elif ! grep -q -E -- "$pattern" "$log"; then
    fail "no line matches '$pattern'"
  fi
done

if [ "$failures" -ne 0 ]; then
  echo "$scenario with rank $victim of $np failing: $failures check(s) failed"
  exit 1
fi
echo "$scenario with rank $victim of $np failing: passed"
