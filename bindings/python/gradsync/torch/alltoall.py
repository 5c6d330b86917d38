"""alltoall: slices of the first dimension exchanged between ranks, differentiable."""

import torch

from gradsync import _core
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import _args, _check, _name, _output_tensor, _ready_stream, _to_wire


def _splits_list(splits, tensor=None, process_set=None):
    """The splits as a list; without any, checks that the rows divide among the set's ranks."""
    if splits is None:
        if tensor is not None:
            rows = tensor.shape[0] if tensor.dim() > 0 else 0
            ranks = process_set.size()
            if rows % ranks != 0:
                raise ValueError(
                    "alltoall without splits needs a first dimension divisible by the %d ranks "
                    "of its process set, not %d: pass splits to send uneven pieces"
                    % (ranks, rows))
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError("splits must be an integer tensor")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending slices of ``tensor`` to every rank; returns a handle.

    ``synchronize`` returns ``(output, received_splits)``: the received tensor and the rows
    received from each rank, with or without ``splits``, as Horovod's does (only ``alltoall``
    leaves the splits out when none were given).
    """
    _check(tensor)
    split_list = _splits_list(splits, tensor, process_set)
    wire = _to_wire(tensor)
    h = _core.alltoall(*_args(wire), split_list, _name("alltoall", name),
                       _id_of(process_set), _ready_stream(wire), (tensor, wire))

    def finish():
        return (_output_tensor(h, tensor.dtype),
                torch.tensor(h.received_splits(), dtype=torch.int32))

    return _register([h], (tensor, wire), finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.mark_non_differentiable(received)
        ctx.received = received
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        # Each row goes back to where it came from.
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends slices of ``tensor`` along the first dimension to every rank; differentiable.

    Returns the received tensor, or ``(tensor, received_splits)`` when ``splits`` were given.
    """
    split_list = _splits_list(splits, tensor, process_set)
    if not split_list:
        # Passed on explicitly, so that the backward knows the rows each rank sent here.
        n = process_set.size()
        split_list = [(tensor.shape[0] if tensor.dim() > 0 else 0) // n] * n
    output, received = _Alltoall.apply(tensor, split_list, name, process_set)
    return output if splits is None else (output, received)
