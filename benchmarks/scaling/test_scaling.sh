#!/usr/bin/env bash
# The scaling run end to end on a tiny committed set: 1 and 2 ranks through gradsyncrun, then the
# table and the PNG plot. Its times mean nothing; it checks that the tool works.
#   test_scaling.sh PYTHON BENCH DATA_DIR WORK_DIR
set -euo pipefail
python=$1 bench=$2 data=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$python" "$here/scaling.py" run --bench "$bench" --ranks 1,2 --sets smoke_set \
  --data-dir "$data" --iters 2 --warmup 1 --results "$work/results.json" -- --oversubscribe
"$python" "$here/scaling.py" report --results "$work/results.json" --compute-ms smoke_set=50 \
  --markdown "$work/table.md" --plot "$work/scaling.png"
cat "$work/table.md"
grep -q "^| smoke_set | 1 host | 1 |.*| 100.0% |$" "$work/table.md"
grep -q "^| smoke_set | 1 host | 2 |" "$work/table.md"
grep -q "^| 1000x1KB | 1 host | 2 |" "$work/table.md"
# A PNG starts with its eight-byte signature.
[ "$(head -c 8 "$work/scaling.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
echo "scaling: table and plot written"
