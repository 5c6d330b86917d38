#!/usr/bin/env python3
"""torch.distributed's collectives over the gradsync backend against the same calls over gloo.

One process per rank, launched by mpirun. The default group is gloo's (it meets at 127.0.0.1 on
a port rank 0 picks and gradsync broadcasts); a second group over every rank is gradsync's
(``dist.new_group(backend="gradsync")``). For each size, the same call (``dist.all_reduce`` of a
float32 tensor, waited on; or ``--op broadcast``, ``all_gather``) alternates between the two
groups in rounds, after a warm-up, so that a drift of the machine's speed reaches both alike.
Reported per size: each group's median time per call (the slowest rank's) and gradsync's over
gloo's.

  mpirun -np 2 python3 torch_distributed_benchmark.py --sizes 4,1024,65536,1048576
"""

import argparse
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import gradsync.torch as hvd
from gradsync.torch import process_group  # noqa: F401  (registers the backend)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4,256,4096,65536,1048576,16777216",
                        help="bytes per call, comma-separated")
    parser.add_argument("--op", default="all_reduce",
                        choices=("all_reduce", "broadcast", "all_gather"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50, help="calls per group and round")
    parser.add_argument("--warmup", type=int, default=20)
    return parser.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(op, group, tensor, gathered):
    if op == "all_reduce":
        dist.all_reduce(tensor, group=group)
    elif op == "broadcast":
        dist.broadcast(tensor, src=0, group=group)
    else:
        dist.all_gather(gathered, tensor, group=group)


def check(op, name, group, tensor, gathered):
    """One call on each rank's own values must give the right result on every rank: the timed
    calls that follow reduce whatever the buffer holds by then and are never checked."""
    rank, size = hvd.rank(), hvd.size()
    tensor.fill_(rank + 1)
    call(op, group, tensor, gathered)
    if op == "all_reduce":
        ok = bool((tensor == size * (size + 1) / 2).all())
    elif op == "broadcast":
        ok = bool((tensor == 1).all())
    else:
        ok = all(bool((g == r + 1).all()) for r, g in enumerate(gathered))
    if not ok:
        sys.exit("torch_distributed_benchmark: %s over %s gave a wrong result on rank %d"
                 % (op, name, rank))
    tensor.fill_(1)


def timed(op, group, tensor, gathered, iters):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call(op, group, tensor, gathered)
    return (time.perf_counter() - start) / iters


def main():
    args = parse_args()
    hvd.init()
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0,
                                name="bench.port")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=hvd.rank(), world_size=hvd.size())
    groups = {"gloo": dist.group.WORLD, "gradsync": dist.new_group(backend="gradsync")}
    if hvd.rank() == 0:
        print("# %s, %d rank(s), torch %s; median seconds per call, slowest rank"
              % (args.op, hvd.size(), torch.__version__))
        print("%10s %12s %12s %14s" % ("bytes", "gloo_us", "gradsync_us", "gradsync/gloo"))
    for size in [int(s) for s in args.sizes.split(",") if s]:
        tensor = torch.ones(max(1, size // 4))
        gathered = [torch.empty_like(tensor) for _ in range(hvd.size())]
        times = {name: [] for name in groups}
        for name, group in groups.items():
            check(args.op, name, group, tensor, gathered)
            for _ in range(args.warmup):
                call(args.op, group, tensor, gathered)
        for r in range(args.rounds):
            order = list(groups.items()) if r % 2 == 0 else list(reversed(groups.items()))
            for name, group in order:
                times[name].append(timed(args.op, group, tensor, gathered, args.iters))
        slowest = {name: hvd.allreduce(torch.tensor(t, dtype=torch.float64), op=hvd.Max,
                                       name="bench.%s.%d" % (name, size)).tolist()
                   for name, t in times.items()}
        gloo = statistics.median(slowest["gloo"])
        ours = statistics.median(slowest["gradsync"])
        if hvd.rank() == 0:
            print("%10d %12.1f %12.1f %14.2f" % (size, gloo * 1e6, ours * 1e6, ours / gloo))
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
