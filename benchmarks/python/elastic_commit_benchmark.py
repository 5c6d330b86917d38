#!/usr/bin/env python3
"""What an elastic commit costs against a training step, with a gradient set's model (ResNet-50's
by default: 25.6 M float32 parameters, and as much SGD momentum).

  mpirun -np 2 python3 elastic_commit_benchmark.py --set resnet50 --dir /tmp/commits

Times, medians over --iters, the slowest rank's each time: a plain step of pytorch_sync_benchmark's
synthetic model (zero_grad, forward, backward, DistributedOptimizer step); ``state.commit()``, which
copies the state in memory and hands it to the writer thread; and the same commit waited until it
is on disk (``commit()`` then ``flush()``), which training pays only when a world ends. One JSON
line on stdout (rank 0).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gradient_sets import parse_gradient_set, resolve_set  # noqa: E402
from pytorch_sync_benchmark import build_model  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="resnet50")
    p.add_argument("--data-dir", default=os.environ.get("GRADSYNC_DATA_DIR") or "../shared/data")
    p.add_argument("--dir", required=True, help="the checkpoint directory (emptied first)")
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    os.environ["GRADSYNC_ELASTIC_CHECKPOINT_DIR"] = args.dir

    import torch
    import gradsync.torch as hvd
    from gradsync.torch.elastic import store

    torch.set_num_threads(1)
    hvd.init()
    if hvd.rank() == 0:
        for number in store.commits(args.dir):
            os.unlink(os.path.join(args.dir, "commit-%010d.pt" % number))
    hvd.barrier()
    _, path = resolve_set(args.set, args.data_dir)
    model = build_model(torch, parse_gradient_set(path), 1.0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    def step():
        optimizer.zero_grad()
        model().backward()
        optimizer.step()

    def durable_commit():
        state.commit()
        state.flush()

    def timed(fn):
        times = []
        for _ in range(args.iters + 1):
            hvd.barrier()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            times.append(hvd.allreduce(torch.tensor(elapsed), op=hvd.Max, name="bench.time").item())
        return statistics.median(times[1:]) * 1e3

    step_ms = timed(step)
    commit_ms = timed(state.commit)
    state.flush()
    durable_ms = timed(durable_commit)
    state_mb = sum(p.numel() * p.element_size() for p in model.parameters()) * 2 / 1e6
    if hvd.rank() == 0:
        print(json.dumps({"benchmark": "elastic_commit", "set": args.set, "ranks": hvd.size(),
                          "state_mb": round(state_mb, 1), "step_ms": round(step_ms, 2),
                          "commit_ms": round(commit_ms, 2),
                          "durable_commit_ms": round(durable_ms, 2)}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
