"""broadcast: the root rank's tensor on every rank, in place or not, differentiable."""

import torch

from gradsync import _core
from gradsync.torch.allreduce import allreduce
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import (Average, _args, _check, _check_in_place, _consumer, _name,
                                 _ready_stream, _to_wire)


def _broadcast_async(tensor, output, root_rank, name, process_set):
    _check(tensor)
    if output is not tensor:
        output.copy_(tensor)
    wire = _to_wire(output)
    producer = _ready_stream(wire)
    h = _core.broadcast(*_args(wire), root_rank, _name("broadcast", name), _id_of(process_set),
                        producer, (tensor, output, wire))

    # The handle records the copy on a consumer stream other than its producer's (handles.py).
    def finish():
        if wire is not output:
            output.copy_(wire)
        return output

    return _register([h], (tensor, output, wire), finish, _consumer(wire), producer)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying ``root_rank``'s ``tensor`` to a new tensor on every rank; returns a handle."""
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts overwriting ``tensor`` with ``root_rank``'s; returns a handle."""
    # A non-contiguous tensor receives into a contiguous copy, which is copied back.
    _check_in_place(tensor)
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with ``root_rank``'s and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Horovod's definition: the root gets every rank's gradient averaged, the others zero.
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if _core.rank() != ctx.root_rank:  # roots are global ranks
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``tensor`` on every rank; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)
