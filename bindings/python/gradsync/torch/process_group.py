"""gradsync as a ``torch.distributed`` backend: ``dist.init_process_group("gradsync")``.

Code written against ``torch.distributed`` (PyTorch's own DistributedDataParallel, its
communication hooks, ``ZeroRedundancyOptimizer``, ``dist.all_reduce`` of a metric) runs over
gradsync's runtime: MPI's or NCCL's data plane, the negotiation that names a mismatch between
ranks, the stall inspector. Under ``mpirun`` or Slurm, ``init_process_group()`` of this module
starts gradsync and makes it torch's default group; no address, port or rendezvous is needed.

The collectives are gradsync's own, unnamed, so every rank of a group must call them in the same
order, as ``torch.distributed`` requires. Each returns a ``Work`` whose future a thread of the
backend completes (``process_group_work``); callbacks chained with ``then`` run there and may
wait for later collectives. Point-to-point operations (``send``, ``recv``) are not supported:
gradsync has collectives only.

A group over some of the ranks (``dist.new_group(ranks)``) runs on the gradsync process set of
those ranks, which every rank must have added (``gradsync.torch.add_process_set``) first: torch
makes a group only on its members, and gradsync makes a set on every rank.

Thread safety: a group's collectives may be called from any thread, in the same order on every
rank of the group.
"""

import threading

import torch
import torch.distributed as dist

from gradsync import _core
from gradsync.torch.allgather import allgather_async
from gradsync.torch.allreduce import allreduce_, grouped_allreduce_async_
from gradsync.torch.alltoall import alltoall_async
from gradsync.torch.basics import init
from gradsync.torch.broadcast import broadcast_async_
from gradsync.torch.handles import _synchronize_all
from gradsync.torch.process_group_work import (PYTHON_WORK, caller_modes, complete, completer,
                                               future_of, work_of)
from gradsync.torch.process_sets import ProcessSet, global_process_set
from gradsync.torch.reducescatter import reducescatter_async
from gradsync.torch.wire import Average, Max, Min, Product, Sum

BACKEND = "gradsync"


def _reduce_op(reduce_op):
    """gradsync's op for a torch ``ReduceOp``."""
    for name, op in (("SUM", Sum), ("AVG", Average), ("MIN", Min), ("MAX", Max),
                     ("PRODUCT", Product)):
        theirs = getattr(dist.ReduceOp, name, None)
        if theirs is not None and reduce_op == theirs:
            return op
    raise ValueError("the gradsync backend reduces with SUM, AVG, MIN, MAX and PRODUCT, not %r"
                     % (reduce_op,))


def _rows(tensor):
    """``tensor`` as one row, the layout gradsync's allgather and reducescatter split by."""
    return tensor.reshape(1, -1).contiguous()


def _option(opts, name, default):
    return default if opts is None else getattr(opts, name)


class ProcessGroupGradsync(dist.ProcessGroup):
    """A ``torch.distributed`` group whose collectives are gradsync's, over ``process_set``."""

    def __init__(self, ranks, rank, size):
        super().__init__(rank, size)
        self._global_ranks = ranks
        self._found = _process_set_of(ranks)  # the set, or why there is none
        self._group_name = self._group_desc = ""
        self._lock = threading.Lock()
        self._failure = None  # under PyTorch 1.13: an operation's error not yet raised

    def getBackendName(self):  # noqa: N802 (torch's name)
        return BACKEND

    def name(self):
        return BACKEND

    # PyTorch 2 keeps a group's name and description on its C++ backends, which a group made
    # in Python has none of.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return self._group_desc

    def _work(self, handles, finish, tensors, opts, wait=None):
        """A torch ``Work`` whose future holds ``finish(results)`` once ``handles`` are done (or
        ``wait()`` returns). CUDA results are ordered after the operations on a stream of the
        backend's, which the future's consumers wait for when they wait, as they wait for
        NCCL's. A call that torch waits for as soon as it returns (``opts.asyncOp`` false,
        PyTorch 2's synchronous calls) is completed here instead, on the caller's thread and
        streams, with no hand-off to the backend's threads."""
        devices = sorted({t.device for t in tensors if t.is_cuda}, key=str)
        source = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        on_error = None if PYTHON_WORK else self._note_failure
        if wait is None:
            # Every handle waited for or ordered before a failure is raised: the others' tensors
            # stay in use until then.
            wait = lambda: _synchronize_all(handles)  # noqa: E731
        if opts is not None and getattr(opts, "asyncOp", True) is False:
            complete(wait, finish, source, on_error)
        else:
            # A process set's operations complete in the order they start.
            completer.submit(wait, finish, source, on_error, devices,
                             order=self.process_set.process_set_id, modes=caller_modes())
        return work_of(future_of(source))

    def _note_failure(self, error):
        with self._lock:
            if self._failure is None:
                self._failure = error

    @property
    def _target(self):
        """The process set a collective starts on. Under PyTorch 1.13, whose ``Work.wait()``
        cannot raise, it raises a failed operation's error first, once."""
        if self._failure is not None:
            with self._lock:
                error, self._failure = self._failure, None
            if error is not None:
                raise RuntimeError("an earlier operation of this gradsync group failed: %s"
                                   % (error,)) from error
        return self.process_set

    @property
    def process_set(self):
        """The gradsync process set the group's collectives run on."""
        if isinstance(self._found, str):
            # Raised here, by the members' first collective, not where torch makes the group:
            # members failing there would leave the others in torch's barrier after it.
            raise ValueError(self._found)
        return self._found

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(_option(opts, "reduceOp", dist.ReduceOp.SUM))
        handle = grouped_allreduce_async_(list(tensors), op=op, process_set=self._target)
        return self._work([handle], lambda _: list(tensors), tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        """Every rank gets the reduction, the root among them (torch leaves the others' tensors
        unspecified)."""
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = self._global_ranks[_option(opts, "rootRank", 0)]
        handles = [broadcast_async_(t, root, process_set=self._target) for t in tensors]
        return self._work(handles, lambda _: list(tensors), tensors, opts)

    def _each_rank(self, lists, what):
        """Refuses lists that do not hold one tensor for each rank of the group, as gloo does,
        before anything starts."""
        for tensors in lists:
            if len(tensors) != self.size():
                raise ValueError("%s takes one tensor for each of the group's %d ranks, not %d"
                                 % (what, self.size(), len(tensors)))

    @staticmethod
    def _fits(outputs, elements, what):
        """Refuses an output that cannot hold the ``elements`` that arrive in it before anything
        starts, as gloo does: the copy into it would fail on the backend's thread, where
        PyTorch 1.13's ``wait()`` does not raise."""
        for output in outputs:
            if output.numel() != elements:
                raise ValueError("%s: an output of %d elements for %d" % (what, output.numel(),
                                                                          elements))

    def _allgathers(self, inputs):
        """An allgather of each input's elements as one row."""
        return [allgather_async(_rows(t), process_set=self._target) for t in inputs]

    def allgather(self, output_lists, inputs, opts=None):
        self._each_rank(output_lists, "all_gather's output list")
        return self._gather(output_lists, inputs, opts)

    def _gather(self, output_lists, inputs, opts):
        for outputs, t in zip(output_lists, inputs):
            self._fits(outputs, t.numel(), "all_gather")
        handles = self._allgathers(inputs)

        def finish(gathered):
            for outputs, rows in zip(output_lists, gathered):
                for output, row in zip(outputs, rows):
                    output.copy_(row.reshape(output.shape))
            return output_lists

        return self._work(handles, finish, list(inputs), opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, t in zip(outputs, inputs):
            self._fits([output], self.size() * t.numel(), "all_gather_into_tensor")
        handles = self._allgathers(inputs)

        def finish(gathered):
            for output, rows in zip(outputs, gathered):
                output.copy_(rows.reshape(output.shape))
            return list(outputs)

        return self._work(handles, finish, list(outputs), opts)

    def _allgather_base(self, output, tensor, opts=None):
        return self.allgather_into_tensor_coalesced([output], [tensor], opts)

    all_gather_single = _allgather_base  # its name in PyTorch 2

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """``output_lists[r][i]`` gets rank r's ``inputs[i]``."""
        if len(output_lists) != self.size():
            raise ValueError("all_gather_coalesced takes an output list for each of the group's "
                             "%d ranks, not %d" % (self.size(), len(output_lists)))
        for i, t in enumerate(inputs):
            self._fits([outputs[i] for outputs in output_lists], t.numel(), "all_gather_coalesced")
        handles = self._allgathers(inputs)

        def finish(gathered):
            for i, rows in enumerate(gathered):
                for outputs, row in zip(output_lists, rows):
                    outputs[i].copy_(row.reshape(outputs[i].shape))
            return output_lists

        return self._work(handles, finish, list(inputs), opts)

    def gather(self, output_lists, inputs, opts=None):
        """An allgather of which only the root keeps the rows (only it passes outputs)."""
        return self._gather(output_lists, inputs, opts)

    def gather_single(self, output, tensor, opts=None):
        """PyTorch 2's gather into one tensor, which only the root passes with elements: an
        allgather into it there, one that keeps nothing elsewhere."""
        if output is not None and output.numel() > 0:
            return self._allgather_base(output, tensor, opts)
        return self._gather([], [tensor], opts)

    def _reduce_scatter_rows(self, outputs, row_tensors, opts):
        op = _reduce_op(_option(opts, "reduceOp", dist.ReduceOp.SUM))
        for output, rows in zip(outputs, row_tensors):
            self._fits([output], rows[0].numel(), "reduce_scatter")
        handles = [reducescatter_async(rows, op=op, process_set=self._target)
                   for rows in row_tensors]

        def finish(scattered):
            for output, row in zip(outputs, scattered):
                output.copy_(row.reshape(output.shape))
            return list(outputs)

        return self._work(handles, finish, list(outputs), opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        self._each_rank(input_lists, "reduce_scatter's input list")
        rows = [torch.stack([t.reshape(-1) for t in inputs]) for inputs in input_lists]
        return self._reduce_scatter_rows(outputs, rows, opts)

    def _reduce_scatter_base(self, output, tensor, opts=None):
        return self._reduce_scatter_rows([output], [tensor.reshape(self.size(), -1)], opts)

    reduce_scatter_single = _reduce_scatter_base  # its name in PyTorch 2

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        rows = [t.reshape(self.size(), -1) for t in inputs]
        return self._reduce_scatter_rows(outputs, rows, opts)

    def alltoall_base(self, output, tensor, output_split_sizes, input_split_sizes, opts=None):
        if not output_split_sizes and not input_split_sizes:
            self._fits([output], tensor.numel(), "all_to_all_single")
        del output_split_sizes  # what each rank sends says it
        splits = list(input_split_sizes) or None
        handle = alltoall_async(tensor, splits=splits, process_set=self._target)

        def finish(received):
            output.copy_(received[0][0].reshape(output.shape))
            return [output]

        return self._work([handle], finish, [output], opts)

    def alltoall(self, outputs, inputs, opts=None):
        flat = torch.cat([t.reshape(-1) for t in inputs])
        handle = alltoall_async(flat, splits=[t.numel() for t in inputs],
                                process_set=self._target)

        def finish(received):
            pieces = received[0][0].split([t.numel() for t in outputs])
            for output, piece in zip(outputs, pieces):
                output.copy_(piece.reshape(output.shape))
            return list(outputs)

        return self._work([handle], finish, list(outputs), opts)

    def scatter(self, outputs, input_lists, opts=None):
        """The root's i-th tensor to rank i: an alltoall in which only the root sends."""
        output = outputs[0]
        if input_lists:
            self._each_rank(input_lists, "scatter's input list")
            self._fits([output], input_lists[0][0].numel(), "scatter")
            rows = torch.stack([t.reshape(-1) for t in input_lists[0]])
            splits = [1] * self.size()
        else:
            rows = output.new_empty((0, output.numel()))
            splits = [0] * self.size()
        handle = alltoall_async(rows, splits=splits, process_set=self._target)

        def finish(received):
            output.copy_(received[0][0].reshape(output.shape))
            return [output]

        return self._work([handle], finish, [output], opts)

    def barrier(self, opts=None):
        pending = _core.barrier(self._target._require_id())
        return self._work([], lambda _: [], [], opts, wait=pending.wait)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier; the stall inspector, not ``timeout``, names a rank that never comes."""
        del timeout, wait_all_ranks
        self.barrier().wait()

    def _point_to_point(self, *args, **kwargs):
        raise RuntimeError("the gradsync backend has no point-to-point operations (send, recv): "
                           "its operations are collectives")

    send = recv = recv_anysource = _point_to_point


def process_set_of_group(group, what="process_group"):
    """The gradsync ProcessSet that ``group``, a ``torch.distributed`` group of the gradsync
    backend, runs on: what gradsync's own forms take where PyTorch's take a group."""
    if isinstance(group, ProcessGroupGradsync):
        return group.process_set
    raise ValueError("%s must be a gradsync ProcessSet or a torch.distributed group of the "
                     "gradsync backend, not %r" % (what, group))


def _process_set_of(ranks):
    """The gradsync process set of exactly ``ranks`` (global ranks), or why there is none."""
    if ranks == list(range(_core.size())):
        return global_process_set
    for set_id in _core.process_set_ids():
        if sorted(_core.process_set_ranks(set_id)) == ranks:
            found = ProcessSet(ranks)
            found.process_set_id = set_id
            return found
    return ("the gradsync backend runs a group over ranks %s on the gradsync process set of those "
            "ranks: call gradsync.torch.add_process_set(%s) on every rank before making the "
            "group" % (ranks, ranks))


def _create(options, backend_options=None):
    """torch's maker of a group (its extended form, which names the group's global ranks)."""
    del backend_options
    init()
    ranks = [int(r) for r in options.global_ranks_in_group] or list(range(_core.size()))
    group = ProcessGroupGradsync(sorted(ranks), options.group_rank, options.group_size)
    if ranks != sorted(ranks):
        group._found = ("the gradsync backend runs groups whose ranks are in ascending order, as "
                        "its process sets are, not %s (torch's order unless sort_ranks=False)"
                        % (ranks,))
    elif (options.group_size, options.group_rank) != (len(ranks), ranks.index(_core.rank())):
        group._found = ("torch numbers this rank %d of %d in the group, gradsync %d of %d: torch's "
                        "ranks must be MPI's (gradsync.torch.process_group.init_process_group "
                        "passes them)" % (options.group_rank, options.group_size,
                                          ranks.index(_core.rank()), len(ranks)))
    return group


class CollectiveStore(dist.Store):
    """The store ``init_process_group`` hands torch: no server, nothing to connect to.

    torch uses its store to count ranks into a barrier after making a group (``add``), which this
    store makes collective: ``add(key, n)`` returns the sum of what every rank has added under
    ``key``, so every rank must call it alike (torch does). Other keys (``set``, ``get``) are this
    rank's own."""

    def __init__(self):
        super().__init__()
        self._values = {}

    def add(self, key, amount):
        total = allreduce_(torch.tensor([int(amount)], dtype=torch.int64), op=Sum)
        value = int(self._values.get(key, 0)) + int(total.item())
        self._values[key] = value
        return value

    def set(self, key, value):
        self._values[key] = value

    def get(self, key):
        if key not in self._values:
            raise KeyError("the gradsync backend's store holds only this rank's keys: %r was "
                           "not set here" % (key,))
        value = self._values[key]
        return value if isinstance(value, bytes) else str(value).encode()

    def check(self, keys):
        return all(k in self._values for k in keys)

    def wait(self, keys, timeout=None):
        del timeout
        if not self.check(keys):
            raise KeyError("the gradsync backend's store holds only this rank's keys")

    def delete_key(self, key):
        return self._values.pop(key, None) is not None

    def num_keys(self):
        return len(self._values)


def init_process_group(**kwargs):
    """Starts gradsync (collective over MPI's ranks) and makes it torch's default process group;
    ``kwargs`` go to ``torch.distributed.init_process_group`` (``timeout``, ``group_name``)."""
    init()
    dist.init_process_group(BACKEND, store=CollectiveStore(), rank=_core.rank(),
                            world_size=_core.size(), **kwargs)


def _register():
    register = dist.Backend.register_backend
    try:
        register(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    except TypeError:  # PyTorch 1.13: no devices
        register(BACKEND, _create, extended_api=True)


if dist.is_available():
    _register()
