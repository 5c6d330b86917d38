"""Whole-model helpers: broadcast parameters, optimizer state and Python objects; gather objects."""

import collections
import io
import pickle

import torch

from gradsync.torch import mpi_ops
from gradsync.torch.process_sets import global_process_set


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every parameter and buffer with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()`` or an iterable of ``(name, tensor)`` such as
    ``named_parameters()``. The broadcasts are enqueued together, so they fuse.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or isinstance(params, collections.abc.Iterable):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("params must be a dict or an iterable of (name, tensor) pairs")
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in items:
        if p is None:
            continue
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(mpi_ops.broadcast_async_(tensor, root_rank, name=name,
                                                process_set=process_set))
    for h in handles:
        mpi_ops.synchronize(h)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, so any picklable object)."""
    name = name or type(obj).__name__
    if process_set.rank() == root_rank:
        payload = io.BytesIO()
        pickle.dump(obj, payload)
        data = torch.frombuffer(bytearray(payload.getvalue()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        data = None
        length = torch.tensor([0], dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, name=name + ".length", process_set=process_set)
    if data is None:
        data = torch.empty(int(length.item()), dtype=torch.uint8)
    mpi_ops.broadcast_(data, root_rank, name=name + ".data", process_set=process_set)
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns a list of every rank's ``obj`` in rank order (pickled)."""
    name = name or type(obj).__name__
    payload = pickle.dumps(obj)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
        torch.empty(0, dtype=torch.uint8)
    lengths = mpi_ops.allgather(torch.tensor([data.numel()], dtype=torch.int64),
                                name=name + ".lengths", process_set=process_set)
    gathered = mpi_ops.allgather(data, name=name + ".data", process_set=process_set)
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(pickle.loads(gathered[offset:offset + length].numpy().tobytes()))
        offset += length
    return objects


def _take_empty_step(optimizer):
    """One step with zero gradients that moves no parameter: it only creates the state."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    saved = [dict(g) for g in optimizer.param_groups]
    for group in optimizer.param_groups:
        for key in ("lr", "weight_decay"):
            if key in group:
                group[key] = 0.0
    # A DistributedOptimizer's step would synchronize, which only some ranks reach here.
    step = getattr(optimizer, "_gradsync_local_step", optimizer.step)
    step()
    for group, old in zip(optimizer.param_groups, saved):
        for key in ("lr", "weight_decay"):
            if key in old:
                group[key] = old[key]


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Overwrites the optimizer's state and hyperparameters with ``root_rank``'s.

    Tensors of the state are broadcast in place; everything else (step counts, learning rates,
    betas) travels as one pickled object. When no rank has state yet (before the first step),
    only the hyperparameters are sent, so a fresh optimizer stays fresh: unlike Horovod, Adam's
    step count is not advanced by a zero-gradient step. When some ranks have state and others do
    not, those without take one zero-gradient step (learning rate and weight decay at zero) so
    that every rank holds the same entries before the root's overwrite them.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    has_state = torch.tensor([1 if optimizer.state_dict()["state"] else 0], dtype=torch.int32)
    anyone_has_state = mpi_ops.allreduce(has_state, op=mpi_ops.Max, name="optimizer_state.any",
                                         process_set=process_set).item()
    if anyone_has_state and not has_state.item():
        _take_empty_step(optimizer)

    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, entries in state_dict["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors["%s.%s" % (pid, key)] = value
            else:
                scalars[(pid, key)] = value
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    scalars, groups = broadcast_object((scalars, groups), root_rank,
                                       name="optimizer_state.scalars", process_set=process_set)
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    for (pid, key), value in scalars.items():
        state_dict["state"][pid][key] = value
    for group, received in zip(state_dict["param_groups"], groups):
        group.update(received)
    optimizer.load_state_dict(state_dict)
