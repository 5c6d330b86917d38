"""Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", 2020) over gradsync,
with the arguments, state and results of PyTorch DDP's ``post_localSGD_hook`` and model averager.

Until ``start_localSGD_iter`` steps have run, each bucket is averaged over the wrapper's ranks as
usual; from then on only within ``subgroup`` (by default the ranks of this rank's node), or not at
all with ``post_local_gradient_allreduce=False``, so that the replicas drift apart. A
``PeriodicModelAverager`` brings them back together: after the optimizer's step, every ``period``
steps from ``warmup_steps`` on, it averages the parameters over its process set.

``register_comm_hook`` also takes PyTorch's own ``post_localSGD_hook`` and ``PostLocalSGDState``
(with ``process_group`` and ``subgroup`` None, gradsync process sets or ``torch.distributed``
groups of the gradsync backend) and runs them as these, and PyTorch's ``PostLocalSGDOptimizer``
takes this module's averager, or PyTorch's own where gradsync is the ``torch.distributed`` backend.

Thread safety: a state serves one wrapper, whose hooks run on the thread of its backward; an
averager is called by the training loop's thread.
"""

import torch

from gradsync.torch import basics
from gradsync.torch.allgather import allgather
from gradsync.torch.allreduce import grouped_allreduce_
from gradsync.torch.comm_hooks import allreduce_future, hook_process_set
from gradsync.torch.process_group import process_set_of_group
from gradsync.torch.process_sets import ProcessSet, add_process_set, global_process_set
from gradsync.torch.wire import Average


class PostLocalSGDState:
    """PyTorch's ``PostLocalSGDState``: ``process_group`` (None: the wrapper's ranks) averages the
    buckets of the first ``start_localSGD_iter`` steps, ``subgroup`` (None: this node's ranks)
    those after, unless ``post_local_gradient_allreduce`` is False. Both are gradsync
    ``ProcessSet``s or None. ``iter`` counts the steps so far."""

    __slots__ = ("process_group", "subgroup", "start_localSGD_iter",
                 "post_local_gradient_allreduce", "iter")

    def __init__(self, process_group, subgroup, start_localSGD_iter,
                 post_local_gradient_allreduce=True):
        self.process_group = process_group
        self.subgroup = subgroup
        self.start_localSGD_iter = start_localSGD_iter
        self.post_local_gradient_allreduce = post_local_gradient_allreduce
        self.iter = 0

    def maybe_increase_iter(self, bucket):
        if bucket.is_last():
            self.iter += 1


def _process_set(group, what):
    """``group`` as a gradsync ProcessSet: None, a set, or a torch.distributed group of the
    gradsync backend."""
    if group is None or isinstance(group, ProcessSet):
        return group
    return process_set_of_group(group, "post-local SGD's " + what)


def post_localSGD_hook(state, bucket):
    """Averages the bucket over ``state.process_group`` for the first ``start_localSGD_iter``
    steps, then over ``state.subgroup`` (made on first use: this node's ranks), or leaves it as
    this rank computed it. Every rank must run it at the same steps."""
    if state.iter < state.start_localSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_future(bucket.buffer(),
                                process_set=_process_set(state.process_group, "process_group"))
    if not state.post_local_gradient_allreduce:
        local = torch.futures.Future()
        local.set_result(bucket.buffer())
        return local
    if state.subgroup is None:
        if state.process_group is not None or hook_process_set().process_set_id != 0:
            raise ValueError("post-local SGD over a process set needs its subgroup given: the "
                             "default, this node's ranks, is for a wrapper over every rank")
        state.subgroup = node_process_set()
    return allreduce_future(bucket.buffer(), process_set=_process_set(state.subgroup, "subgroup"))


_node_sets = {}  # (start, rank, size) -> this rank's node's ProcessSet, made once per start


def node_process_set():
    """The process set of the ranks on this rank's node (the global set where that is every
    rank). The first call after each init is collective over every rank: each node's set is added
    everywhere."""
    key = (basics.starts(), basics.rank(), basics.size())
    if key not in _node_sets:
        nodes = allgather(torch.tensor([basics.cross_rank()]), name="local_sgd.nodes").tolist()
        mine = None
        for node in sorted(set(nodes)):
            ranks = [r for r, n in enumerate(nodes) if n == node]
            if len(ranks) == len(nodes):
                made = global_process_set
            else:
                made = add_process_set(ranks)
            if node == nodes[basics.rank()]:
                mine = made
        _node_sets[key] = mine
    return _node_sets[key]


def _parameters_to_average(params):
    """PyTorch's choice: the parameters, or parameter groups' parameters, that have a gradient."""
    chosen = []
    for item in params:
        if isinstance(item, dict):
            chosen.extend(p for p in item["params"] if p.grad is not None)
        elif isinstance(item, torch.Tensor):
            if item.grad is not None:
                chosen.append(item)
        else:
            raise NotImplementedError("cannot average parameters given as %r" % type(item))
    return chosen


def average_parameters(params, process_set=None, name="local_sgd.average"):
    """Averages the parameters (or parameter groups) that have a gradient over ``process_set``
    (None: every rank), in place, in one grouped allreduce."""
    chosen = _parameters_to_average(params)
    if process_set is None:
        process_set = global_process_set
    if chosen:
        with torch.no_grad():
            grouped_allreduce_([p.data for p in chosen], op=Average, name=name,
                               process_set=process_set)


class PeriodicModelAverager:
    """PyTorch's ``PeriodicModelAverager``: ``average_parameters(params)``, called after each
    optimizer step, averages the parameters over ``process_group`` (a gradsync ProcessSet; None:
    every rank) at steps ``warmup_steps``, ``warmup_steps + period``, ... ``step`` counts the
    calls (PyTorch's ``PostLocalSGDOptimizer`` saves and restores it)."""

    def __init__(self, period, warmup_steps=0, process_group=None):
        if warmup_steps < 0:
            raise ValueError("Arg ``warmup_steps`` must be a non-negative number.")
        if period < 1:
            raise ValueError("Arg ``period`` must be a positive value.")
        self.period = period
        self.warmup_steps = warmup_steps
        self.process_group = _process_set(process_group, "process_group")
        self.step = 0

    def average_parameters(self, params):
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            average_parameters(params, self.process_group)
        self.step += 1
