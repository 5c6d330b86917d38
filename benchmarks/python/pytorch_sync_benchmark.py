#!/usr/bin/env python3
"""Synthetic PyTorch training step: how much gradient synchronization adds to a step.

One process per rank, launched by mpirun, for one framework:

  gradsync      gradsync.torch.DistributedOptimizer around torch.optim.SGD (Horovod's API)
  horovod       horovod.torch.DistributedOptimizer, the same code
  ddp           torch.nn.parallel.DistributedDataParallel over torch.distributed's gloo backend
  gradsync-ddp  gradsync.torch.DistributedDataParallel, where the installed gradsync has it

The model has one parameter per tensor of a gradient set (a shared data file: `index name dtype
shape` per line), with the set's shapes, names and registration order. Its loss reads every
parameter once and backward writes every gradient once, in reverse registration order as in real
training, so the step is dominated by synchronization rather than by compute.

Every step starts after an MPI barrier, and a step's time is the slowest rank's. Three phases run
in one process:

  1. the baseline: the same model's step with a plain optimizer, before the framework starts;
  2. the framework's steps, alternating with baseline steps that run while the framework is up but
     idle (its background threads, polling or not, share the cores with the compute);
  3. the baseline again, after the framework has shut down.

The step time is the median of phase 2's framework steps. The baseline time is the median over
phases 1 and 3 (half the iterations each), which bracket phase 2 in time, so that a slow drift of
the machine's speed cancels.
The synchronization time is step minus baseline: everything a step costs beyond its compute when
the gradients are synchronized, i.e. communication not hidden behind compute, plus what the
framework's threads take from the compute by sharing its cores. Phase 2's baseline steps are
reported beside it (busy_base_ms), to show how much of that is the framework's idle activity.

With --mode tensor or grouped (gradsync and horovod only) there is no model and no compute: the
set's tensors are synchronized alone, as a script written against Horovod's API does, each with
allreduce_async_ in reverse registration order (backward's) and then every handle synchronized
(tensor), or all as one grouped_allreduce_async_ (grouped), with --op (Average, or Adasum: every
rank's tensors are multiples of one another, which Adasum combines into their mean as well). The
step is then the synchronization itself: step_ms and sync_ms are the same median, and no baseline
runs.

Output: one JSON line on stdout (rank 0); progress and notes on stderr. Every rank uses mpi4py for
the barriers, the per-step maximum over ranks and DDP's rendezvous port, identically for every
framework and always outside the timed region.

  mpirun -np 2 python3 pytorch_sync_benchmark.py --framework gradsync --set resnet50
"""

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import time

from gradient_sets import SetError, parse_gradient_set, resolve_set, synthetic_tensors

FRAMEWORKS = ("gradsync", "horovod", "ddp", "gradsync-ddp")
MODES = ("step", "tensor", "grouped")


# ---------------------------------------------------------------------------------------------
# The model

def build_model(torch, tensors, scale):
    """A module with one zero-initialized float32 parameter per tensor of the set.

    Parameters sit in nested submodules named after the set's dotted names, so
    model.named_parameters() yields the real names (`layer1.0.conv1.weight`) in the file's order,
    as the model the set was taken from does; the names become the frameworks' tensor names.
    """
    nn = torch.nn

    class SyntheticModel(nn.Module):
        def forward(self):
            # Each p.sum() reads its parameter once. Backward turns the scalar's gradient into an
            # expanded (stride-0) view per parameter, so accumulating it into p.grad, which
            # zero_grad() zeroes in place (torch 1.x's default), touches each gradient once and
            # allocates nothing after the first step. Autograd runs the independent branches
            # latest-created first, so gradients become ready in reverse registration order.
            return torch.stack([p.sum() for p in self._ordered]).sum() * scale

    model = SyntheticModel()
    for name, shape in tensors:
        *path, leaf = name.split(".")
        owner = model
        try:
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]
            owner.register_parameter(leaf, nn.Parameter(torch.zeros(shape, dtype=torch.float32)))
        except (KeyError, TypeError) as e:  # a name clashes with another's module or attribute
            raise SetError("tensor %s cannot be placed in the module tree: %s" % (name, e))
    # A plain list (not registered again): forward visits the parameters in registration order.
    model._ordered = [p for _, p in model.named_parameters()]
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    if got != list(tensors):
        raise SetError("the set's names do not nest into modules in the file's order")
    return model


# ---------------------------------------------------------------------------------------------
# Frameworks: each returns (step function, how it was set up)

def make_step(model, optimizer):
    def step():
        optimizer.zero_grad()
        loss = model()
        loss.backward()
        optimizer.step()
    return step


def setup_horovod_api(hvd, torch, model, lr):
    """The Horovod recipe, identical for gradsync.torch and horovod.torch."""
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    return make_step(model, optimizer)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def register_comm_hook(ddp, args):
    """--comm-hook powersgd: PyTorch's PowerSGD hook and state, the same objects for either
    wrapper (gradsync's runs them as its own)."""
    if args.comm_hook == "none":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    state = powersgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=2)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)


def setup_ddp(torch, comm, model, args):
    import torch.distributed as dist
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", comm.Get_rank()))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", comm.Get_size()))
    # Rank 0 picks a free port and tells the others; the window in which another process could
    # take it is short, and a collision fails loudly in init_process_group.
    port = comm.bcast(free_port() if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=size)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    register_comm_hook(ddp, args)
    return make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=args.lr))


def setup_gradsync_ddp(torch, model, args):
    import gradsync.torch as gs
    gs.init()
    ddp = gs.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    register_comm_hook(ddp, args)
    return make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=args.lr))


def framework_module(framework):
    """Imports the framework; ImportError/AttributeError with the reason if it is not there."""
    if framework in ("gradsync", "gradsync-ddp"):
        import gradsync.torch as mod
        if framework == "gradsync-ddp" and not hasattr(mod, "DistributedDataParallel"):
            raise AttributeError("gradsync.torch has no DistributedDataParallel")
        return mod
    if framework == "horovod":
        import horovod.torch as mod
        return mod
    import torch.distributed as mod
    if not (mod.is_available() and mod.is_gloo_available()):
        raise ImportError("torch.distributed with gloo is not available")
    return mod


def framework_version(framework):
    try:
        if framework.startswith("gradsync"):
            import gradsync
            return getattr(gradsync, "__version__", "")
        if framework == "horovod":
            import horovod
            return horovod.__version__
        import torch
        return torch.__version__
    except Exception:  # a version string is informative only
        return ""


def setup_sync_only(hvd, torch, tensors, value, mode, op_name):
    """The set's tensors, each filled with `value`, and a step that reduces them in place with
    Horovod's op `op_name` (Average, Adasum) through Horovod's API: one allreduce_async_ each, or
    one grouped_allreduce_async_."""
    hvd.init()
    op = getattr(hvd, op_name)
    grads = [torch.full(shape, value, dtype=torch.float32) for _, shape in tensors]
    names = [name for name, _ in tensors]
    backward = list(range(len(grads)))[::-1]

    def per_tensor():
        handles = [hvd.allreduce_async_(grads[i], name=names[i], op=op)
                   for i in backward]
        for h in handles:
            hvd.synchronize(h)

    def grouped():
        hvd.synchronize(hvd.grouped_allreduce_async_([grads[i] for i in backward],
                                                     name="grouped", op=op))

    return grads, per_tensor if mode == "tensor" else grouped


def shutdown(framework, hvd):
    if framework == "ddp":
        import torch.distributed as dist
        dist.destroy_process_group()
    elif hvd is not None:
        # Before mpi4py finalizes MPI at exit: the background thread must be gone by then.
        hvd.shutdown()


# ---------------------------------------------------------------------------------------------
# Checking and timing

def check_gradients(torch, model, expected, what):
    """Every gradient element must equal `expected` (exact: the values are binary fractions)."""
    for name, p in model.named_parameters():
        if p.grad is None or not bool(torch.all(p.grad == expected)):
            bad = "missing" if p.grad is None else "e.g. %r" % p.grad.flatten()[0].item()
            raise RuntimeError("%s: gradient of %s is %s, expected %r" % (what, name, bad,
                                                                         expected))


def run_steps(comm, steps, warmup, iters, check_first):
    """Runs every step of `steps` once per iteration, each after a barrier; returns the timed
    iterations' step times per key, in seconds. check_first(), if given, runs after the first
    iteration.

    With two steps, their order alternates, so that neither always runs in the other's wake
    (its cache state, a background thread still finishing).
    """
    order = list(steps)
    times = {k: [] for k in steps}
    # Garbage collection stays on, as in training; collecting now keeps set-up garbage out.
    gc.collect()
    for it in range(warmup + iters):
        for key in (order if it % 2 == 0 else order[::-1]):
            comm.Barrier()
            start = time.perf_counter()
            steps[key]()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                times[key].append(elapsed)
        if it == 0 and check_first is not None:
            check_first()
    return times


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary_ms(seconds):
    return {"median": round(statistics.median(seconds) * 1e3, 3),
            "p90": round(percentile(seconds, 0.9) * 1e3, 3)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=FRAMEWORKS, required=True)
    p.add_argument("--mode", choices=MODES, default="step",
                   help="step: a training step with a model (default); tensor, grouped: the "
                        "set's tensors synchronized alone through Horovod's API, one "
                        "allreduce_async_ each or one grouped_allreduce_async_ (gradsync and "
                        "horovod only)")
    p.add_argument("--set", default="resnet50",
                   help="gradient-set stem in --data-dir (resnet50, bert_base, vgg16) or a path "
                        "to a set file (default: resnet50)")
    p.add_argument("--data-dir", default=os.environ.get("GRADSYNC_DATA_DIR") or "../shared/data",
                   help="folder with the gradient-set files (default: $GRADSYNC_DATA_DIR, else "
                        "../shared/data, relative to the working directory)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (default: 20)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed iterations first (default: 3): negotiation, caches, DDP's "
                        "bucket rebuild after its first step")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads per rank (default: 1, as Horovod's examples "
                        "recommend; the ranks share the node's cores)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default: 0.01)")
    p.add_argument("--op", choices=("Average", "Adasum"), default="Average",
                   help="Horovod's reduce op of --mode tensor and grouped (default: Average)")
    p.add_argument("--comm-hook", choices=("none", "powersgd"), default="none",
                   help="the DDP wrappers' communication hook: PyTorch's PowerSGD hook and state, "
                        "compressing from the third step (default: none)")
    p.add_argument("--bucket-cap-mb", type=float, default=25,
                   help="the DDP wrappers' bucket_cap_mb (default: 25, DDP's)")
    p.add_argument("--powersgd-rank", type=int, default=1,
                   help="PowerSGD's matrix_approximation_rank (default: 1)")
    p.add_argument("--tag", default="", help="copied into the JSON line (e.g. a repetition)")
    p.add_argument("--check", action="store_true",
                   help="only report whether the framework can be imported (exit 0 if so)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 1:
        p.error("--iters and --warmup must be at least 1 (the first warmup step checks results)")
    if args.op != "Average" and args.mode == "step":
        p.error("--op %s needs --mode tensor or grouped" % args.op)
    if args.comm_hook != "none" and args.framework not in ("ddp", "gradsync-ddp"):
        p.error("--comm-hook needs a DDP wrapper: --framework ddp or gradsync-ddp")
    if args.mode != "step" and args.framework not in ("gradsync", "horovod"):
        p.error("--mode %s needs Horovod's API: --framework gradsync or horovod" % args.mode)
    return args


def main(argv):
    args = parse_args(argv)
    if args.check:
        try:
            framework_module(args.framework)
        except (ImportError, AttributeError) as e:
            print("%s: not available: %s" % (args.framework, e), file=sys.stderr)
            return 1
        return 0

    # MPI first, with full thread support, so that gradsync and Horovod find it initialized and
    # share it (neither then finalizes it; mpi4py does at exit, after shutdown() below).
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def log(msg):
        if rank == 0:
            print("[%s] %s" % (args.framework, msg), file=sys.stderr, flush=True)

    set_name, set_path = resolve_set(args.set, args.data_dir)
    try:
        tensors = synthetic_tensors() if set_path is None else parse_gradient_set(set_path)
    except (OSError, SetError) as e:
        print("rank %d: %s" % (rank, e), file=sys.stderr)
        return 2

    import torch
    torch.set_num_threads(args.threads)
    mod = framework_module(args.framework)

    # Gradients are scale = rank+1 times 2^-10, so the average over ranks is known exactly and
    # differs from every rank's own value: a framework that skipped a tensor is caught.
    unit = 2.0 ** -10
    local_value = unit * (rank + 1)
    average_value = unit * (size + 1) / 2.0

    if args.mode != "step":
        return sync_only_main(args, comm, mod, torch, tensors, set_name, local_value,
                              average_value, log)

    baseline = build_model(torch, tensors, local_value)
    baseline_step = make_step(baseline, torch.optim.SGD(baseline.parameters(), lr=args.lr))
    numel = sum(p.numel() for p in baseline.parameters())
    log("set %s: %d tensors, %.1f MB float32, %d ranks, %d warmup + %d timed iterations"
        % (set_name, len(tensors), numel * 4 / 1e6, size, args.warmup, args.iters))

    def check_baseline():
        check_gradients(torch, baseline, local_value, "baseline (no communication)")

    # 1. The clean baseline, before the framework exists: no background threads, no sockets.
    #    Phases 1 and 3 time half the iterations each; together they give as many as phase 2.
    half = (args.iters + 1) // 2
    clean = run_steps(comm, {"base": baseline_step}, args.warmup, half, check_baseline)

    # 2. The framework's steps, alternating with baseline steps while the framework is up and
    #    idle between its own steps (which shows what its background activity costs compute).
    model = build_model(torch, tensors, local_value)
    hvd = None
    if args.framework in ("gradsync", "horovod"):
        hvd = mod
        sync_step = setup_horovod_api(mod, torch, model, args.lr)
    elif args.framework == "ddp":
        sync_step = setup_ddp(torch, comm, model, args)
    else:
        hvd = mod
        sync_step = setup_gradsync_ddp(torch, model, args)

    def check_both():
        check_baseline()
        check_gradients(torch, model, average_value, args.framework + " average")

    busy = run_steps(comm, {"sync": sync_step, "busy": baseline_step}, args.warmup, args.iters,
                     check_both)
    shutdown(args.framework, hvd)

    # 3. The clean baseline again, after shutdown, so that the baseline brackets the framework's
    #    steps in time and a slow drift of the machine's speed cancels out of the difference.
    #    Its one untimed iteration absorbs the shutdown; the model is warm already.
    clean_after = run_steps(comm, {"base": baseline_step}, 1, args.iters - half, None)

    # The slowest rank's time of every step, gathered after timing.
    times = {"base": clean["base"] + clean_after["base"], "sync": busy["sync"],
             "busy": busy["busy"]}
    per_rank = comm.gather(times, root=0)
    record = None
    if rank == 0:
        slowest = {k: [max(r[k][i] for r in per_rank) for i in range(len(v))]
                   for k, v in times.items()}
        step, base, idle = (summary_ms(slowest[k]) for k in ("sync", "base", "busy"))
        record = {
            "benchmark": "pytorch_sync", "framework": args.framework,
            "framework_version": framework_version(args.framework), "torch": torch.__version__,
            "set": set_name, "tensors": len(tensors), "mb": round(numel * 4 / 1e6, 1),
            "ranks": size, "threads": args.threads, "warmup": args.warmup, "iters": args.iters,
            "step_ms": step["median"], "step_ms_p90": step["p90"],
            "base_ms": base["median"], "base_ms_p90": base["p90"],
            "busy_base_ms": idle["median"], "busy_base_ms_p90": idle["p90"],
            "sync_ms": round(step["median"] - base["median"], 3),
            "sync_ms_p90": round(step["p90"] - base["median"], 3),
            "tag": args.tag, "mode": "step", "comm_hook": args.comm_hook,
            "bucket_cap_mb": args.bucket_cap_mb,
        }
        log("step %.1f ms, baseline %.1f ms (%.1f ms beside the framework), sync %.1f ms "
            "(medians)" % (step["median"], base["median"], idle["median"], record["sync_ms"]))
    if record is not None:
        print(json.dumps(record), flush=True)
    return 0


def sync_only_main(args, comm, hvd, torch, tensors, set_name, local_value, average_value, log):
    """--mode tensor or grouped: the synchronization alone, timed as the steps are."""
    grads, step = setup_sync_only(hvd, torch, tensors, local_value, args.mode, args.op)
    numel = sum(g.numel() for g in grads)
    log("set %s: %d tensors, %.1f MB float32, %d ranks, %s synchronization only, %d warmup + %d "
        "timed iterations" % (set_name, len(tensors), numel * 4 / 1e6, comm.Get_size(),
                              args.mode, args.warmup, args.iters))

    # Every rank's tensor is a multiple of the same one, and Adasum combines parallel vectors
    # into their mean too, up to rounding: its coefficients are not powers of two.
    tolerance = 0.0 if args.op == "Average" else 1e-5 * average_value

    def check():
        for (name, _), g in zip(tensors, grads):
            if not bool(torch.all((g - average_value).abs() <= tolerance)):
                raise RuntimeError("%s %s: %s is e.g. %r, expected %r" % (
                    args.framework, args.mode, name, g.flatten()[0].item(), average_value))

    times = run_steps(comm, {"sync": step}, args.warmup, args.iters, check)
    shutdown(args.framework, hvd)
    per_rank = comm.gather(times["sync"], root=0)
    if comm.Get_rank() != 0:
        return 0
    slowest = [max(r[i] for r in per_rank) for i in range(len(per_rank[0]))]
    sync = summary_ms(slowest)
    record = {
        "benchmark": "pytorch_sync", "framework": args.framework,
        "framework_version": framework_version(args.framework), "torch": torch.__version__,
        "set": set_name, "tensors": len(tensors), "mb": round(numel * 4 / 1e6, 1),
        "ranks": comm.Get_size(), "threads": args.threads, "warmup": args.warmup,
        "iters": args.iters, "step_ms": sync["median"], "step_ms_p90": sync["p90"],
        "base_ms": 0.0, "base_ms_p90": 0.0, "busy_base_ms": 0.0, "busy_base_ms_p90": 0.0,
        "sync_ms": sync["median"], "sync_ms_p90": sync["p90"], "tag": args.tag,
        "mode": args.mode, "op": args.op,
    }
    log("%s synchronization %.1f ms (median)" % (args.mode, sync["median"]))
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
