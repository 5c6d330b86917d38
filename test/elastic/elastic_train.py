#!/usr/bin/env python3
"""An elastic training job for the tests, written as a Horovod elastic script is (only the import
differs), and its replay in one process.

  gradsyncrun --min-np 2 --max-np 3 ... python3 elastic_train.py --progress P --out O
      trains a small float64 regression with DistributedOptimizer, an ElasticSampler and a commit
      after every step; rank 0 appends a JSON line to P when a world starts (its size and the
      position it resumed from) and at every commit, and saves the final parameters to O.
  elastic_train.py --replay P --out R
      replays, in one process, the steps the job's worlds committed (each world from its logged
      start to where the next world resumed, with that world's number of ranks) and saves the
      parameters to R: the job must end with the same ones.
"""

import time

_STARTED = time.time()  # before torch's import, which a new world's ranks pay too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

EPOCHS = 3
SAMPLES = 96
BATCH = 2
FEATURES = 4
LR = 0.01


def dataset():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.5, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.25
    return x, y


def make_model():
    torch.manual_seed(5)
    return torch.nn.Linear(FEATURES, 1).double()


def loss_of(model, x, y, indices):
    idx = torch.tensor(indices, dtype=torch.long)
    return ((model(x[idx]).squeeze(1) - y[idx]) ** 2).mean()


def ballast(path):
    """A module with a gradient set's shapes (test/../benchmarks: the set's format), never trained:
    state of a real model's size for a commit to write, load and broadcast."""
    module = torch.nn.Module()
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 4 and not line.startswith("#"):
                shape = tuple(int(d) for d in fields[3].split("x"))
                module.register_buffer("t%s" % fields[0], torch.zeros(shape))
    return module


def train(args):
    import gradsync.torch as hvd

    hvd.init()
    initialized = time.time()
    x, y = dataset()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(SAMPLES)), shuffle=True, seed=3)

    def progress(**event):
        if hvd.rank() == 0:
            with open(args.progress, "a") as f:
                f.write(json.dumps(event) + "\n")

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    @hvd.elastic.run
    def run(state):
        progress(event="start", world=int(os.environ.get("GRADSYNC_ELASTIC_WORLD", "0")),
                 size=hvd.size(), epoch=state.epoch, batch=state.batch, time=time.time(),
                 process_start=_STARTED, initialized=initialized, resume=state.last_resume)
        while state.epoch < EPOCHS:
            for batch_idx in range(len(sampler) // BATCH + (len(sampler) % BATCH > 0)):
                optimizer.zero_grad()
                loss_of(model, x, y, sampler.get_indices(batch_idx, BATCH)).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, BATCH)
                state.batch += 1
                time.sleep(args.step_seconds)
                progress(event="commit", size=hvd.size(), epoch=state.epoch, batch=state.batch,
                         time=time.time())
                state.commit()
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    extra = {"ballast": ballast(args.ballast)} if args.ballast else {}
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, **extra)
    state.register_reset_callbacks([on_reset])
    run(state)
    if hvd.rank() == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        progress(event="done", size=hvd.size())
    hvd.shutdown()


def replay(args):
    from gradsync.torch.elastic.sampler import ElasticSampler

    with open(args.replay) as f:
        events = [json.loads(line) for line in f if line.strip()]
    starts = [e for e in events if e["event"] == "start"]
    x, y = dataset()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    # Every world's division is made by hand below, for each of its ranks.
    sampler = ElasticSampler.undivided(list(range(SAMPLES)), shuffle=True, seed=3)
    epoch, batch = 0, 0
    for k, start in enumerate(starts):
        assert (start["epoch"], start["batch"]) <= (epoch, batch), \
            "world %d resumed from %r, after the replay's %r" % (k, start, (epoch, batch))
        if (start["epoch"], start["batch"]) != (epoch, batch):
            raise SystemExit("replay cannot go back to %r from %r" % (start, (epoch, batch)))
        size = start["size"]
        for group in optimizer.param_groups:
            group["lr"] = LR * size
        stop = (starts[k + 1]["epoch"], starts[k + 1]["batch"]) if k + 1 < len(starts) else \
            (EPOCHS, 0)
        while (epoch, batch) < stop:
            shares = []
            for r in range(size):
                sampler.partition(size, r)
                shares.append(list(sampler.indices))
            batch_idx = 0
            while batch_idx * BATCH < len(shares[0]) and (epoch, batch) < stop:
                optimizer.zero_grad()
                grads = []
                for share in shares:
                    model.zero_grad()
                    loss_of(model, x, y, share[batch_idx * BATCH:(batch_idx + 1) * BATCH]).backward()
                    grads.append([p.grad.clone() for p in model.parameters()])
                for p, *per_rank in zip(model.parameters(), *grads):
                    p.grad = sum(per_rank) / size
                optimizer.step()
                sampler.record_batch(batch_idx, BATCH)
                batch_idx += 1
                batch += 1
            if batch_idx * BATCH >= len(shares[0]):
                epoch, batch = epoch + 1, 0
                sampler.epoch, sampler.processed_num, sampler.processed_indices = epoch, 0, set()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--progress", help="the job's progress log (training)")
    p.add_argument("--replay", help="a progress log to replay in one process")
    p.add_argument("--out", required=True, help="where the final parameters go")
    p.add_argument("--step-seconds", type=float, default=0.1,
                   help="a pause in every step, so that a test can act mid-epoch")
    p.add_argument("--ballast", help="a gradient-set file: a module of its shapes joins the state "
                                     "(the restart benchmark's real-sized state)")
    args = p.parse_args()
    replay(args) if args.replay else train(args)


if __name__ == "__main__":
    main()
