#!/usr/bin/env python3
"""A real model's training step with and without gradient synchronization, as a user compares them.

One process per rank, launched by mpirun (gradsync initializes MPI; PyTorch's own process group
meets at MASTER_ADDR:MASTER_PORT, default 127.0.0.1:29531). Every mode trains its own copy of the
same model, from the same initial weights, with SGD and momentum, on the same synthetic batches:

  none      no communication: the plain step, the floor
  ddp       torch.nn.parallel.DistributedDataParallel (NCCL on a GPU with one rank per GPU, gloo
            when ranks share a GPU or run on the CPU)
  gs-opt    gradsync.torch.DistributedOptimizer around the optimizer (Horovod's API)
  gs-ddp    gradsync.torch.DistributedDataParallel around the module
  ddp-views, gs-ddp-views
            the two wrappers with gradient_as_bucket_view=True (not run unless named in --modes)
  ddp-fp16, gs-ddp-fp16
            the two wrappers with DDP's fp16_compress_hook (gradients travel in float16; not run
            unless named in --modes): read gs-ddp-fp16 against ddp-fp16
  ddp-powersgd, gs-ddp-powersgd
            the two wrappers with DDP's PowerSGD hook and state (rank 1, compressing from the
            third step; not run unless named in --modes): read one against the other
  ddp-localsgd, gs-ddp-localsgd
            the two wrappers with DDP's post_localSGD_hook (local from the third step, within this
            node's ranks: every rank, on one host) and PyTorch's PostLocalSGDOptimizer averaging
            the parameters every fourth step from the third (DDP: PyTorch's PeriodicModelAverager;
            gradsync: its own; not run unless named in --modes)
  ddp-gradsync
            torch.nn.parallel.DistributedDataParallel over gradsync as a torch.distributed backend
            (gradsync.torch.process_group; not run unless named in --modes): read against ddp
  gs-adasum gradsync.torch.DistributedOptimizer(op=Adasum), Horovod's Adasum optimizer: each
            rank steps alone and the steps are combined (not run unless named in --modes; its
            parameters are its own, not DDP's)

The modes are interleaved in rounds (each round runs --steps-per-round steps of every mode, in an
order shuffled anew each round from a fixed seed), after --warmup steps each, so that a drift of the
machine's speed reaches every mode alike. A step is forward, backward, the optimizer's step and a
device synchronization; its time is the slowest rank's. Reported: each mode's median step, its
overhead over none, and its ratio to ddp. At the end every mode's parameters are checked to be
identical on every rank, and each mode's checksum is printed with its relative difference from
ddp's: the synchronized modes agree to the rounding of the model's nondeterministic kernels (BERT's
embedding backward adds with atomics), far below what a gradient read before backward wrote it would
give.

Models: resnet50 (torchvision, 224x224 images, --batch default 32), bert (transformers'
BertForMaskedLM with BERT-base's configuration, sequence 128, --batch default 16), tiny (a small
convolutional network, for a smoke test without either package), and hooks (100 linear layers of
32 x 32, 200 gradients of 4 KiB or less with next to no compute: the step's overhead over no
communication divided by the gradients is what each mode's hooks and synchronization cost per
gradient, printed as us_per_grad).

  mpirun -np 1 python3 training_step_benchmark.py --model resnet50
  GRADSYNC_GPU_BACKEND=mpi mpirun -np 2 python3 training_step_benchmark.py --model resnet50 \\
      --batch 16

Output: a table on stdout (rank 0) and, with --json FILE, one JSON line per mode appended to it.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

import gradsync.torch as hvd

MODES = ("none", "ddp", "gs-opt", "gs-ddp")
MORE_MODES = ("ddp-views", "gs-ddp-views", "ddp-fp16", "gs-ddp-fp16", "ddp-powersgd",
              "gs-ddp-powersgd", "ddp-localsgd", "gs-ddp-localsgd", "gs-adasum",
              "ddp-gradsync")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("resnet50", "bert", "tiny", "hooks"),
                        default="resnet50")
    parser.add_argument("--batch", type=int, default=0, help="per rank (0: the model's default)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--zero-grad", choices=("default", "none", "zeros"), default="default",
                        help="how each step clears the gradients: zero_grad() with this "
                        "PyTorch's default (set_to_none=True from PyTorch 2), or set to None, "
                        "or zeroed in place")
    parser.add_argument("--json", help="append one JSON line per mode to this file")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in MODES + MORE_MODES]
    if unknown:
        parser.error("unknown modes: %s" % ", ".join(unknown))
    return args


class Workload:
    """A model factory and the batch every step trains on."""

    def __init__(self, name, batch, device):
        self.name = name
        gen = torch.Generator().manual_seed(1000 + hvd.rank())
        if name == "resnet50":
            import torchvision
            self.batch = batch or 32
            self._factory = lambda: torchvision.models.resnet50()
            self.inputs = torch.randn(self.batch, 3, 224, 224, generator=gen).to(device)
            self.targets = torch.randint(0, 1000, (self.batch,), generator=gen).to(device)
        elif name == "bert":
            import transformers
            self.batch = batch or 16
            config = transformers.BertConfig()  # BERT-base: 12 layers, hidden 768, vocab 30522
            self._factory = lambda: transformers.BertForMaskedLM(config)
            self.inputs = torch.randint(0, config.vocab_size, (self.batch, 128),
                                        generator=gen).to(device)
            self.targets = self.inputs.clone()
        elif name == "hooks":
            self.batch = batch or 8
            self._factory = lambda: torch.nn.Sequential(
                *[torch.nn.Linear(32, 32) for _ in range(100)])
            self.inputs = torch.randn(self.batch, 32, generator=gen).to(device)
            self.targets = torch.randint(0, 32, (self.batch,), generator=gen).to(device)
        else:
            self.batch = batch or 8
            self._factory = lambda: torch.nn.Sequential(
                torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(256, 10))
            self.inputs = torch.randn(self.batch, 3, 16, 16, generator=gen).to(device)
            self.targets = torch.randint(0, 10, (self.batch,), generator=gen).to(device)
        self.device = device

    def model(self):
        torch.manual_seed(1234)  # every mode and rank starts from the same weights
        return self._factory().to(self.device)

    def loss(self, model):
        if self.name == "bert":
            return model(input_ids=self.inputs, labels=self.targets).loss
        return torch.nn.functional.cross_entropy(model(self.inputs), self.targets)


def post_local_sgd(module, optimizer, gradsync):
    """Post-local SGD from the third step, the parameters averaged every fourth step from then."""
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
    from torch.distributed.optim import PostLocalSGDOptimizer
    if gradsync:
        from gradsync.torch.local_sgd import PeriodicModelAverager
    else:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    # The subgroup is the node's ranks: gradsync's default, and on one host DDP's whole world
    # (PyTorch's own default makes groups of as many ranks as the node has GPUs).
    import torch.distributed as dist
    subgroup = None if gradsync else dist.group.WORLD
    module.register_comm_hook(
        post_local.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2),
        post_local.post_localSGD_hook)
    return PostLocalSGDOptimizer(optim=optimizer,
                                 averager=PeriodicModelAverager(period=4, warmup_steps=2))


class Mode:
    """One way of training: its module (the one called) and its optimizer."""

    def __init__(self, name, workload, ddp_device_ids, zero_grad):
        self.name = name
        self.zero_grad_args = {"none": {"set_to_none": True},
                               "zeros": {"set_to_none": False}}.get(zero_grad, {})
        self.workload = workload
        model = workload.model()
        self.params = model  # the module whose parameters are checked
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        views = name.endswith("-views")
        if name.startswith("ddp"):
            group = gradsync_group() if name == "ddp-gradsync" else None
            self.module = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=ddp_device_ids, gradient_as_bucket_view=views,
                process_group=group)
        elif name.startswith("gs-ddp"):
            self.module = hvd.DistributedDataParallel(model, gradient_as_bucket_view=views)
        else:
            self.module = model
        if name.endswith("-fp16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            self.module.register_comm_hook(None, default_hooks.fp16_compress_hook)
        if name.endswith("-powersgd"):
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            self.module.register_comm_hook(
                powersgd.PowerSGDState(process_group=None, start_powerSGD_iter=2),
                powersgd.powerSGD_hook)
        if name.endswith("-localsgd"):
            optimizer = post_local_sgd(self.module, optimizer, name.startswith("gs-"))
        if name in ("gs-opt", "gs-adasum"):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters(),
                op=hvd.Adasum if name == "gs-adasum" else hvd.Average)
        self.optimizer = optimizer
        self.times = []

    def step(self, timed):
        synchronize_device(self.workload.device)
        start = time.perf_counter()
        self.optimizer.zero_grad(**self.zero_grad_args)
        self.workload.loss(self.module).backward()
        self.optimizer.step()
        synchronize_device(self.workload.device)
        if timed:
            self.times.append(time.perf_counter() - start)


def gradsync_group():
    """Every rank in a torch.distributed group of the gradsync backend."""
    import torch.distributed as dist
    return dist.new_group(backend="gradsync")


def synchronize_device(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest(times):
    """Each step's time on the slowest rank (outside every timed region)."""
    local = torch.tensor(times, dtype=torch.float64)
    return hvd.allreduce(local, op=hvd.Max, name="bench.times").tolist()


def parameters_agree(mode):
    """Whether every rank holds the same parameters, and this rank's checksum."""
    with torch.no_grad():
        flat = torch.cat([p.detach().double().reshape(-1).cpu()
                          for p in mode.params.parameters()])
    spread = (hvd.allreduce(flat, op=hvd.Max, name="bench.max." + mode.name) -
              hvd.allreduce(flat, op=hvd.Min, name="bench.min." + mode.name)).abs().max().item()
    return spread == 0.0, flat.sum().item()


def init_torch_distributed(device, ranks_per_gpu):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    backend = "nccl" if device.type == "cuda" and ranks_per_gpu == 1 else "gloo"
    dist.init_process_group(backend, rank=hvd.rank(), world_size=hvd.size())
    return backend


def main():
    args = parse_args()
    hvd.init()
    if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
        device = torch.device("cpu")
    else:
        index = hvd.gpu_device() if hvd.gpu_device() >= 0 else hvd.local_rank()
        index %= torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    ranks_per_gpu = max(1, hvd.local_size() // gpus) if gpus else 1
    torch_ddp = any(m.startswith("ddp") for m in args.modes)
    backend = init_torch_distributed(device, ranks_per_gpu) if torch_ddp else "-"
    workload = Workload(args.model, args.batch, device)
    ddp_device_ids = [device.index] if device.type == "cuda" else None
    modes = [Mode(name, workload, ddp_device_ids, args.zero_grad) for name in args.modes]

    for mode in modes:
        for _ in range(args.warmup):
            mode.step(timed=False)
    # A new order every round, the same on every rank (a fixed seed), so that no mode always
    # follows the same other one and inherits its leftovers (a rotation keeps the neighbours).
    # No barrier before a step: a gradsync barrier would leave the locked schedule; each mode's
    # own collectives keep the ranks together, and each step counts on its slowest rank.
    order = random.Random(1)
    for _ in range(args.rounds):
        for mode in order.sample(modes, len(modes)):
            for _ in range(args.steps_per_round):
                mode.step(timed=True)

    results = {}
    for mode in modes:
        times = slowest(mode.times)
        agree, checksum = parameters_agree(mode)
        if mode.name == "none" and hvd.size() > 1:
            agree = None  # each rank trained on its own batch alone
        results[mode.name] = (statistics.median(times) * 1e3, min(times) * 1e3, agree, checksum)
    if hvd.rank() == 0:
        report(args, workload, device, backend, results)
    ok = all(agree is not False for _, _, agree, _ in results.values())
    hvd.shutdown()
    return 0 if ok else 1


def report(args, workload, device, backend, results):
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    gpu_backend = os.environ.get("GRADSYNC_GPU_BACKEND", "nccl") if device.type == "cuda" else "-"
    # The run's own settings (GRADSYNC_CALLER_LAUNCH, ...), so that runs of one file compare.
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith("GRADSYNC_")}
    print("# %s, batch %d per rank, %d rank(s), %s; DDP on %s, gradsync's GPU backend %s; "
          "torch %s; zero_grad %s; %d timed steps per mode; %s" % (
              args.model, workload.batch, hvd.size(), gpu, backend, gpu_backend,
              torch.__version__, args.zero_grad, args.rounds * args.steps_per_round,
              " ".join("%s=%s" % kv for kv in settings.items()) or "no GRADSYNC_* set"))
    none = results.get("none", (None,))[0]
    ddp = results.get("ddp", (None,))[0]
    ddp_checksum = results["ddp"][3] if "ddp" in results else None
    gradients = sum(1 for p in workload.model().parameters() if p.requires_grad)
    print("%-12s %10s %10s %12s %10s %10s %22s %12s %12s" % (
        "mode", "median_ms", "min_ms", "over_none_ms", "vs_ddp", "replicas", "checksum",
        "sum_vs_ddp", "us_per_grad"))
    for name, (median, fastest, agree, checksum) in results.items():
        over = "%.2f" % (median - none) if none is not None else "-"
        per_grad = (median - none) * 1e3 / gradients if none is not None else None
        ratio = "%.3f" % (median / ddp) if ddp else "-"
        drift = (abs(checksum - ddp_checksum) / max(abs(ddp_checksum), 1e-30)
                 if ddp_checksum is not None else None)
        print("%-12s %10.2f %10.2f %12s %10s %10s %22.12g %12s %12s" % (
            name, median, fastest, over, ratio,
            {True: "identical", False: "DIFFER", None: "own"}[agree], checksum,
            "-" if drift is None else "%.1e" % drift,
            "-" if per_grad is None else "%.2f" % per_grad))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({
                    "model": args.model, "batch": workload.batch, "ranks": hvd.size(),
                    "device": gpu, "ddp_backend": backend, "gpu_backend": gpu_backend,
                    "zero_grad": args.zero_grad, "settings": settings,
                    "mode": name, "median_ms": round(median, 3), "min_ms": round(fastest, 3),
                    "over_none_ms": None if none is None else round(median - none, 3),
                    "vs_ddp": None if not ddp else round(median / ddp, 4),
                    "replicas_identical": agree, "checksum": checksum,
                    "checksum_vs_ddp": drift, "gradients": gradients,
                    "us_per_gradient": per_grad}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
