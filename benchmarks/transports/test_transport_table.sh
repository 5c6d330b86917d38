#!/usr/bin/env bash
# The transport table's tools end to end at 1 host x 2 ranks on tiny data: gradsync_bench_models
# (every strategy, the bucketed one included), the PyTorch benchmark on the synthetic 1000 x 1 KB
# set, then the table and the plot. Its times mean nothing; it checks that the tools work.
#   test_transport_table.sh PYTHON BENCH DATA_DIR WORK_DIR
set -euo pipefail
python=$1 bench=$2 data=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
mpirun -np 2 --oversubscribe --bind-to none "$bench" --data-dir "$data" --sets smoke_set \
  --iters 2 --warmup 1 | tee "$work/models_1x2.txt"
# As the driver reruns the tiny set: its row must keep the per-tensor time of the first table.
mpirun -np 2 --oversubscribe --bind-to none "$bench" --data-dir "$data" --sets "" \
  --strategies gradsync,bucketed --iters 2 --warmup 1 | tee -a "$work/models_1x2.txt"
mpirun -np 2 --oversubscribe --bind-to none "$python" "$here/../python/pytorch_sync_benchmark.py" \
  --framework gradsync --set 1000x1KB --warmup 1 --iters 2 | tee "$work/pytorch_1x2.jsonl"
mpirun -np 2 --oversubscribe --bind-to none "$python" "$here/../python/pytorch_sync_benchmark.py" \
  --framework gradsync --set 1000x1KB --mode grouped --warmup 1 --iters 2 |
  tee -a "$work/pytorch_1x2.jsonl"
"$python" "$here/transport_table.py" "$work" --markdown "$work/table.md" --plot "$work/plot.png"
cat "$work/table.md"
# gradsync, per tensor, flat+copy, bucketed, the best chunked strategy (with its name), gs/best and
# torch gs are numbers; Horovod did not run.
# torch gs is a step's time less its compute's, which two loaded steps can leave below zero.
number='[0-9]+\.[0-9]+'
grep -Eq "^\| 1000x1KB \| 1 host x 2 \| $number \| $number \| $number \| $number \| $number \((chunk|pipe)-[0-9]+M\) \| (\*\*)?$number(\*\*)? \| -?$number \| — \| — \|$" "$work/table.md"
grep -q "^| resnet50 | 2 hosts x 2 | — |" "$work/table.md"
# The synchronization-only table has the grouped run (and no per-tensor one: it did not run).
grep -Eq "^\| 1000x1KB \| 1 host x 2 \| grouped \| $number \| — \| — \|$" "$work/table.md"
if grep -q "^| 1000x1KB | 1 host x 2 | per tensor |" "$work/table.md"; then exit 1; fi
[ "$(head -c 8 "$work/plot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
echo "transport table: table and plot written"
